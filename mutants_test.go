package admit_test

// Mutation testing of the conformance suite itself: each mutant is a
// deliberate, named bug in script.lua (or in spec.go's bounds), and
// TestMutants fails unless some check catches every one of them.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/suitehook"
	"github.com/valkey-io/valkey-go"
)

// mutant is a named bug: text edits to a source file (each old text must
// occur exactly once), and for script mutants an optional change to what
// the client sends.
type mutant struct {
	name  string
	edits [][2]string
	wrap  func(valkey.Client) valkey.Client
}

func (m mutant) apply(src string) (string, error) {
	for _, ed := range m.edits {
		if n := strings.Count(src, ed[0]); n != 1 {
			return "", fmt.Errorf("mutant %s: %q occurs %d times, want once; update the mutant to the source", m.name, ed[0], n)
		}
		src = strings.Replace(src, ed[0], ed[1], 1)
	}
	return src, nil
}

var scriptMutants = []mutant{
	{name: "second-charged-on-first-denial", // what a pipeline of two scripts does
		edits: [][2]string{{"if tk1 < c1 then\n  if write then\n    local e = denyFirst(tk1, ts1)\n",
			"if tk1 < c1 then\n  if n == 2 then\n    local tk2, ts2 = refill(2)\n    if tk2 >= 1 then\n      tk2 = tk2 - 1\n    end\n    store(2, tk2, ts2)\n  end\n  if write then\n    local e = denyFirst(tk1, ts1)\n"}}},
	{name: "second-refreshed-on-first-denial",
		edits: [][2]string{{"if tk1 < c1 then\n  if write then\n    local e = denyFirst(tk1, ts1)\n",
			"if tk1 < c1 then\n  if n == 2 then\n    store(2, refill(2))\n  end\n  if write then\n    local e = denyFirst(tk1, ts1)\n"}}},
	{name: "first-written-before-second-read",
		edits: [][2]string{
			{"for i = 1, n do\n  local v = redis.pcall", "local function load(i)\n  local v = redis.pcall"},
			{"it is not a bucket')\n    end\n  end\nend\n",
				"it is not a bucket')\n    end\n  end\nend\nlocal e1 = load(1)\nif e1 then\n  return e1\nend\n"},
			{"if n == 2 then\n  local c2 = tonumber(ARGV[9])",
				"if n == 2 then\n  store(1, tk1 - c1, ts1)\n  local e2 = load(2)\n  if e2 then\n    return e2\n  end\n  local c2 = tonumber(ARGV[9])"},
		}},
	{name: "token-taken-on-first-denial",
		edits: [][2]string{{"    local e = denyFirst(tk1, ts1)\n", "    store(1, tk1 - 1, ts1)\n    local e = nil\n"}}},
	{name: "second-token-taken-on-second-denial",
		edits: [][2]string{{"store(1, tk1 - c1, ts1, true) or keep(2, tk2, ts2)", "store(1, tk1 - c1, ts1, true) or store(2, tk2 - 1, ts2)"}}},
	{name: "first-not-charged-on-second-denial",
		edits: [][2]string{{"store(1, tk1 - c1, ts1, true) or keep(2, tk2, ts2)", "store(1, tk1, ts1, true) or keep(2, tk2, ts2)"}}},
	{name: "expiry-dropped",
		edits: [][2]string{{"  redis.call('PEXPIREAT', KEYS[i], string.format('%d', math.ceil(math.max(ts, now) / 1000) + tonumber(ARGV[4 * i])))\n", ""}}},
	{name: "expiry-shorter-than-refill",
		edits: [][2]string{{"+ tonumber(ARGV[4 * i])))", "+ math.floor(tonumber(ARGV[4 * i]) / 2)))"}}},
	{name: "expiry-from-now-not-ts", // a clock step back would let the key expire before the bucket refills
		edits: [][2]string{{"math.ceil(math.max(ts, now) / 1000)", "math.ceil(now / 1000)"}}},
	{name: "denial-rewrites-bucket", // what every denial did before: HSET + PEXPIRE
		edits: [][2]string{{"  if pulled[i] then\n    store(i, tk, ts)", "  if true then\n    store(i, tk, ts)"}}},
	{name: "denial-expiry-not-lengthened", // a Spec made slower lets a denied key expire early
		edits: [][2]string{{"string.format('%d', math.ceil(full / 1000)), 'GT')", "string.format('%d', math.ceil(full / 1000)), 'LT')"}}},
	{name: "denial-expiry-always-set", // shortens a key's expiry: no GT
		edits: [][2]string{{"string.format('%d', math.ceil(full / 1000)), 'GT')", "string.format('%d', math.ceil(full / 1000)))"}}},
	{name: "le-where-lt-is-meant",
		edits: [][2]string{{"if tk1 < c1 then", "if tk1 <= c1 then"}}},
	{name: "field-validation-skipped",
		edits: [][2]string{{"  return #v <= 16 and string.find(v, '^%d+$') ~= nil and tonumber(v) < 9007199254740992", "  return true"}}},
	{name: "wrong-type-read-as-fresh",
		edits: [][2]string{{"  if v.err then\n    return readErr(v.err, 'HMGET', i)\n  end\n", "  if v.err then\n    v = {false, false}\n  end\n"}}},
	{name: "timestamp-moves-backwards",
		edits: [][2]string{{"  if now > ts then\n", "  if now < ts then\n    ts = now\n  end\n  if now > ts then\n"}}},
	{name: "refill-drops-remainder",
		edits: [][2]string{{"tk, ts = tk + gained, ts + gained * interval", "tk, ts = tk + gained, now"}}},
	{name: "burst-not-capped",
		edits: [][2]string{{"  if tk > burst then\n    tk = burst\n  end\n", ""}}},
	{name: "fresh-bucket-not-full",
		edits: [][2]string{{"    return burst, now\n", "    return burst - 1, now\n"}}},
	{name: "retry-rounded-down-to-ms",
		edits: [][2]string{{"return reply(1, wait(1, tk1, ts1), tk1, -1)", "return reply(1, math.floor(wait(1, tk1, ts1) / 1000) * 1000, tk1, -1)"}}},
	{name: "retry-returned-in-ms",
		edits: [][2]string{{"return reply(2, wait(2, tk2, ts2)", "return reply(2, wait(2, tk2, ts2) / 1000"}}},
	{name: "retry-from-the-wrong-bucket",
		edits: [][2]string{{"return reply(2, wait(2, tk2, ts2)", "return reply(2, wait(1, tk2, ts2)"}}},
	{name: "time-from-argument-not-TIME", // the host sends its clock and the script trusts it
		edits: [][2]string{{"local now = tonumber(t[1]) * 1000000 + tonumber(t[2])", "local now = tonumber(ARGV[#ARGV])"}},
		wrap:  func(c valkey.Client) valkey.Client { return hostClockClient{c} }},
	{name: "remaining-before-the-charge",
		edits: [][2]string{{"return reply(0, 0, tk1 - c1, tk2 - c2)", "return reply(0, 0, tk1, tk2 - c2)"}}},
	{name: "foreign-hash-accepted", // a user's hash gains tokens, ts and an expiry
		edits: [][2]string{{"if e == 1 then", "if e == 2 then"}}},
	{name: "once-record-written-not-read", // every retry decides again
		edits: [][2]string{{"  if r then\n    return r\n  end\n", "  if false then\n    return r\n  end\n"}}},
	{name: "once-record-read-but-charged", // the retry returns the old Decision and charges again
		edits: [][2]string{
			{"if record then\n  local r = redis.pcall('GET', record)", "local replayed\nif record then\n  local r = redis.pcall('GET', record)"},
			{"  if r then\n    return r\n  end\n", "  if r then\n    replayed = r\n  end\n"},
			{"    redis.call('SET', record, r, 'PX', ARGV[4 * n + 2])\n  end\n  return r\n", "    redis.call('SET', record, r, 'PX', ARGV[4 * n + 2])\n  end\n  return replayed or r\n"},
		}},
	{name: "once-record-never-expires",
		edits: [][2]string{{"redis.call('SET', record, r, 'PX', ARGV[4 * n + 2])", "redis.call('SET', record, r)"}}},
	{name: "undeclared-key-outside-prefix", // only a count of the node's keys shows it
		edits: [][2]string{{"  redis.call('PEXPIREAT', KEYS[i], string.format('%d', math.ceil(math.max(ts, now) / 1000) + tonumber(ARGV[4 * i])))\n", "  redis.call('PEXPIREAT', KEYS[i], string.format('%d', math.ceil(math.max(ts, now) / 1000) + tonumber(ARGV[4 * i])))\n  redis.call('SET', 'admit-mutant-stray', ts)\n"}}},
	{name: "undeclared-key-written",
		edits: [][2]string{{"  redis.call('PEXPIREAT', KEYS[i], string.format('%d', math.ceil(math.max(ts, now) / 1000) + tonumber(ARGV[4 * i])))\n", "  redis.call('PEXPIREAT', KEYS[i], string.format('%d', math.ceil(math.max(ts, now) / 1000) + tonumber(ARGV[4 * i])))\n  redis.call('SET', KEYS[i] .. ':last', ts)\n"}}},
}

// hostClockClient appends the host's clock, in µs, to every script
// command: the design the script's TIME call replaces.
type hostClockClient struct{ valkey.Client }

func (h hostClockClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	args := cmd.Commands()
	if len(args) >= 3 && (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "EVAL")) {
		n, _ := strconv.Atoi(args[2])
		rest := append(append([]string(nil), args[3+n:]...), strconv.FormatInt(time.Now().UnixMicro(), 10))
		cmd = h.B().Arbitrary(args[0]).Args(args[1], args[2]).Keys(args[3 : 3+n]...).Args(rest...).Build()
	}
	return h.Client.Do(ctx, cmd)
}

// specMutants move NewSpec's bounds; TestSpecBounds must catch each.
var specMutants = []mutant{
	{name: "NaN-accepted", edits: [][2]string{{"case math.IsNaN(r) || math.IsInf(r, 0):", "case math.IsInf(r, 0):"}}},
	{name: "negative-rate-accepted", edits: [][2]string{{"case r <= 0:", "case r == 0:"}}},
	{name: "MaxLimit-doubled", edits: [][2]string{{"case rate > MaxLimit:", "case rate > 2*MaxLimit:"}}},
	{name: "burst-zero-accepted", edits: [][2]string{{"case burst < 1:", "case burst < 0:"}}},
	{name: "refill-bound-raised", edits: [][2]string{{"maxRefillMicros = 1 << 50", "maxRefillMicros = 1 << 51"}}},
	{name: "refill-bound-exclusive", edits: [][2]string{{"if micros*float64(burst) > maxRefillMicros {", "if micros*float64(burst) >= maxRefillMicros {"}}},
	{name: "interval-truncated", edits: [][2]string{{"micros := math.Ceil(exact)", "micros := math.Floor(exact)"}}},
	{name: "interval-rounded-to-nearest", edits: [][2]string{{"micros := math.Ceil(exact)", "micros := math.Round(exact)"}}},
	{name: "interval-in-ms", edits: [][2]string{{"exact := 1e6 / r", "exact := 1e3 / r"}}},
	{name: "tolerance-ignored", edits: [][2]string{{"if micros > exact*(1+RateTolerance) {", "if false {"}}},
	{name: "float-noise-rounded-up", edits: [][2]string{{"math.Abs(exact-near) <= exact*snapTolerance", "false"}}},
	{name: "TTL-rounded-down", edits: [][2]string{{"ttlMillis := (refill + 999) / 1000", "ttlMillis := refill / 1000"}}},
}

// TestMutants runs every conformance rule of admittest against Limiters
// built around each script mutant and requires each mutant to be caught by
// at least one rule; then it builds
// each Spec mutant in a copy of the package and requires TestSpecBounds to
// fail there. It prints the table mutant → catching checks. It needs a
// real server, and ADMIT_MUTANTS=1, since it tests the suite rather than a
// server (CI runs it once).
func TestMutants(t *testing.T) {
	if os.Getenv("ADMIT_MUTANTS") != "1" {
		t.Skip("tests the conformance suite itself; set ADMIT_MUTANTS=1 to run it")
	}
	c, opts := openTarget(t)
	var anyOpts []any
	for _, o := range opts {
		anyOpts = append(anyOpts, o)
	}
	suite := suitehook.Open(t, c, anyOpts...)
	type row struct{ mutant, caught, evidence string }
	var table []row

	// A mutant "caught" by a rule that the shipped script fails too would
	// prove nothing.
	for _, r := range suite.Rules(func(c valkey.Client) *admit.Limiter { return admit.New(c) }) {
		if err := runRule(r); err != nil {
			if _, skip := suitehook.IsSkip(err); !skip {
				t.Fatalf("the shipped script fails %s; fix that first:\n%v", r.Name, err)
			}
		}
	}
	for _, m := range scriptMutants {
		t.Run("script/"+m.name, func(t *testing.T) {
			src, err := m.apply(admit.ScriptSource)
			if err != nil {
				t.Fatal(err)
			}
			newLimiter := func(c valkey.Client) *admit.Limiter {
				if m.wrap != nil {
					c = m.wrap(c)
				}
				return admit.NewLimiterWithScript(c, src)
			}
			var caught []string
			evidence := ""
			for _, r := range suite.Rules(newLimiter) {
				err := runRule(r)
				if _, skip := suitehook.IsSkip(err); err == nil || skip {
					continue
				}
				caught = append(caught, r.Name)
				if evidence == "" {
					evidence = r.Name + ": " + firstLine(err.Error())
				}
			}
			if len(caught) == 0 {
				t.Errorf("mutant %s survived every rule", m.name)
			}
			t.Logf("evidence: %s", evidence)
			table = append(table, row{"script: " + m.name, strings.Join(caught, ", "), evidence})
		})
	}
	for _, r := range specMutantRows(t) {
		table = append(table, row{"spec: " + r[0], r[1], ""})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "mutant → rules that caught it (%s)\n", suite.Target())
	for _, r := range table {
		caught := r.caught
		if caught == "" {
			caught = "NOT CAUGHT"
		}
		fmt.Fprintf(&b, "  %-46s %s\n", r.mutant, caught)
	}
	t.Log(b.String())
}

func runRule(r suitehook.Rule) error {
	ctx, cancel := context.WithTimeout(context.Background(), ruleTimeout)
	defer cancel()
	return r.Run(ctx)
}

// ruleTimeout bounds every rule, whatever a broken script does.
const ruleTimeout = 60 * time.Second

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// specMutantRows builds each Spec mutant in a copy of the package (the
// library's files, script.lua and spec_bounds_test.go) and runs
// TestSpecBounds there, which must pass unmutated and fail on every
// mutant. It returns rows of mutant name and catching check.
func specMutantRows(t *testing.T) [][2]string {
	goBin, err := exec.LookPath(filepath.Join(runtime.GOROOT(), "bin", "go"))
	if err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Errorf("spec mutants need the go command: %v", err)
			return nil
		}
	}
	dir := t.TempDir()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") || f == "spec_bounds_test.go" {
			copyFile(t, f, filepath.Join(dir, f))
		}
	}
	for _, f := range []string{"go.mod", "go.sum", "script.lua"} {
		copyFile(t, f, filepath.Join(dir, f))
	}
	spec, err := os.ReadFile("spec.go")
	if err != nil {
		t.Fatal(err)
	}
	run := func(src string) (failed bool, out string) {
		if err := os.WriteFile(filepath.Join(dir, "spec.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(goBin, "test", "-count=1", "-run", "^TestSpecBounds$", ".")
		cmd.Dir = dir
		// Offline: everything needed is in the module cache already.
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly", "GOWORK=off", "GOTOOLCHAIN=local")
		b, err := cmd.CombinedOutput()
		return err != nil, string(b)
	}
	if failed, out := run(string(spec)); failed {
		t.Fatalf("TestSpecBounds fails on an unmutated copy of the package:\n%s", out)
	}
	var rows [][2]string
	for _, m := range specMutants {
		t.Run("spec/"+m.name, func(t *testing.T) {
			src, err := m.apply(string(spec))
			if err != nil {
				t.Fatal(err)
			}
			failed, out := run(src)
			switch {
			case !failed:
				t.Errorf("spec mutant %s survived TestSpecBounds", m.name)
				rows = append(rows, [2]string{m.name, ""})
			case !strings.Contains(out, "--- FAIL: TestSpecBounds"):
				t.Errorf("spec mutant %s did not build or run:\n%s", m.name, out)
				rows = append(rows, [2]string{m.name, ""})
			default:
				rows = append(rows, [2]string{m.name, "spec-bounds"})
				if i := strings.Index(out, "spec_bounds_test.go"); i >= 0 {
					t.Logf("evidence: %s", firstLine(out[i:]))
				}
			}
		})
	}
	return rows
}

func copyFile(t *testing.T, from, to string) {
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
