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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admittest"
	"github.com/admitkit/admit/internal/mutate"
	"github.com/valkey-io/valkey-go"
)

// mutant is a named bug in script.lua: edits at the script's markers
// ("--@name" at the end of a line; see internal/mutate), so that a
// readability pass over the script leaves every mutant applicable, and an
// optional change to what the client sends.
type mutant struct {
	name  string
	edits []mutate.Edit
	wrap  func(valkey.Client) valkey.Client
}

func (m mutant) apply(src string) (string, error) {
	out, err := mutate.Apply(src, "--", m.edits...)
	if err != nil {
		return "", fmt.Errorf("mutant %s: %w; update the mutant to the script", m.name, err)
	}
	return out, nil
}

// at is one edit at a marker: see mutate.Edit.
func at(marker, old, new string) mutate.Edit { return mutate.Edit{At: marker, Old: old, New: new} }

// scriptMutants: a mutant of a line that bucket 2 repeats in lines of its
// own (marker name with a 2) has a twin, -bucket2, that breaks bucket 2's
// copy alone, so each copy is proven covered.
var scriptMutants = []mutant{
	{name: "second-charged-on-first-denial", // what a pipeline of two scripts does
		edits: []mutate.Edit{at("deny1", "", "if n == 2 then\n  if tk2 >= 1 then\n    tk2 = tk2 - 1\n  end\n  how2 = STORE\nend")}},
	{name: "second-refreshed-on-first-denial",
		edits: []mutate.Edit{at("deny1", "", "if n == 2 then\n  how2 = STORE\nend")}},
	{name: "first-written-before-second-read", // bucket 1's take is stored before bucket 2's HMGET, which may then fail
		edits: []mutate.Edit{at("hmget2", "v = ",
			"if mode ~= 'p' and mode ~= 'r' and tk1 >= c1 then\n"+
				"  redis.call('HSET', keys[1], 'tokens', tk1 - c1, 'ts', ts1)\n"+
				"  local at, ttl = math.max(ts1, now) / 1000, max1 * per1 / 1000\n"+
				"  redis.call('PEXPIREAT', keys[1], (at + (-at) % 1) + (ttl + (-ttl) % 1))\n"+
				"end\n"+
				"v = ")}},
	{name: "token-taken-on-first-denial", // the denied bucket is stored one token lower; the reply is unchanged
		edits: []mutate.Edit{at("deny1", "pulled1 and STORE or KEEP", "STORE"), at("deny1-reply", "", "tk1 = tk1 - 1")}},
	{name: "second-token-taken-on-second-denial",
		edits: []mutate.Edit{at("deny2", "pulled2 and STORE or KEEP", "STORE"), at("deny2-reply", "", "tk2 = tk2 - 1")}},
	{name: "first-not-charged-on-second-denial", // the reply still says charged
		edits: []mutate.Edit{at("deny2-charge", "tk1 = tk1 - c1", ""), at("deny2-reply", "now, tk1, tk2", "now, tk1 - c1, tk2")}},
	{name: "all-first-charged-on-second-denial", // AllowAll behaves as AllowOrdered; the reply still says uncharged
		edits: []mutate.Edit{at("all-deny2", "pulled1 and STORE or KEEP,", "STORE,"), at("all-deny2-reply", "", "tk1 = tk1 - c1")}},
	{name: "all-reply-reports-first-charged", // the state is right, the reply wrong
		edits: []mutate.Edit{at("all-deny2-reply", "now, tk1, tk2", "now, tk1 - c1, tk2")}},
	{name: "all-second-rewritten-on-second-denial",
		edits: []mutate.Edit{at("all-deny2", "pulled2 and STORE or KEEP", "STORE"), at("all-deny2-reply", "", "tk2 = math.max(tk2 - 1, 0)")}},
	{name: "all-mode-ignored", // mode a decides as a take
		edits: []mutate.Edit{at("all-deny2-test", "and mode == 'a'", "and mode == 'never'")}},
	{name: "expiry-dropped",
		edits: []mutate.Edit{at("store-expire", "redis.call('PEXPIREAT', keys[1], at)", "")}},
	{name: "expiry-dropped-bucket2",
		edits: []mutate.Edit{at("store-expire2", "redis.call('PEXPIREAT', keys[2], at)", "")}},
	{name: "expiry-shorter-than-refill",
		edits: []mutate.Edit{at("store-at", "(ttl + (-ttl) % 1)", "math.floor((ttl + (-ttl) % 1) / 2)")}},
	{name: "expiry-shorter-than-refill-bucket2",
		edits: []mutate.Edit{at("store-at2", "(ttl + (-ttl) % 1)", "math.floor((ttl + (-ttl) % 1) / 2)")}},
	{name: "expiry-from-now-not-ts", // a clock step back would let the key expire before the bucket refills
		edits: []mutate.Edit{at("store-later", "if now > ts1 then\nat = now / 1000\nend", "at = now / 1000")}},
	{name: "expiry-from-now-not-ts-bucket2",
		edits: []mutate.Edit{at("store-later2", "if now > ts2 then\nat = now / 1000\nend", "at = now / 1000")}},
	{name: "denial-rewrites-bucket", // what every denial did before: HSET + PEXPIRE
		edits: []mutate.Edit{at("write-store", "how1 == STORE", "how1")}},
	{name: "denial-rewrites-bucket-bucket2",
		edits: []mutate.Edit{at("write-store2", "how2 == STORE", "how2")}},
	{name: "denial-expiry-not-lengthened", // a Spec made slower lets a denied key expire early
		edits: []mutate.Edit{at("keep-expire", "'GT'", "'LT'")}},
	{name: "denial-expiry-not-lengthened-bucket2",
		edits: []mutate.Edit{at("keep-expire2", "'GT'", "'LT'")}},
	{name: "denial-expiry-always-set", // shortens a key's expiry: no GT
		edits: []mutate.Edit{at("keep-expire", ", 'GT')", ")")}},
	{name: "denial-expiry-always-set-bucket2",
		edits: []mutate.Edit{at("keep-expire2", ", 'GT')", ")")}},
	{name: "le-where-lt-is-meant",
		edits: []mutate.Edit{at("deny1-test", "<", "<=")}},
	{name: "field-validation-skipped",
		edits: []mutate.Edit{at("field-digits", "#tk1 > 16 or #ts1 > 16 or not (find(tk1, '^%d+$') and find(ts1, '^%d+$'))", "false"), at("field-range", "tk1 >= 2 ^ 53 or ts1 >= 2 ^ 53", "false")}},
	{name: "field-validation-skipped-bucket2",
		edits: []mutate.Edit{at("field-digits2", "#tk2 > 16 or #ts2 > 16 or not (find(tk2, '^%d+$') and find(ts2, '^%d+$'))", "false"), at("field-range2", "tk2 >= 2 ^ 53 or ts2 >= 2 ^ 53", "false")}},
	{name: "wrong-type-read-as-fresh",
		edits: []mutate.Edit{at("hmget-err", "ecmd, eerr, ei = 'HMGET', v.err, 1\nbreak", "v = {false, false}")}},
	{name: "wrong-type-read-as-fresh-bucket2",
		edits: []mutate.Edit{at("hmget-err2", "ecmd, eerr, ei = 'HMGET', v.err, 2\nbreak", "v = {false, false}")}},
	{name: "timestamp-moves-backwards",
		edits: []mutate.Edit{at("refill", "if now > ts1 then", "if now < ts1 then ts1 = now end if now > ts1 then")}},
	{name: "timestamp-moves-backwards-bucket2",
		edits: []mutate.Edit{at("refill2", "if now > ts2 then", "if now < ts2 then ts2 = now end if now > ts2 then")}},
	{name: "refill-drops-remainder",
		edits: []mutate.Edit{at("refill-partial", "ts1 + gained * per1", "now")}},
	{name: "refill-drops-remainder-bucket2",
		edits: []mutate.Edit{at("refill-partial2", "ts2 + gained * per2", "now")}},
	{name: "burst-not-capped",
		edits: []mutate.Edit{at("cap", "if tk1 > max1 then\ntk1 = max1\nend", "")}},
	{name: "burst-not-capped-bucket2",
		edits: []mutate.Edit{at("cap2", "if tk2 > max2 then\ntk2 = max2\nend", "")}},
	{name: "fresh-bucket-not-full",
		edits: []mutate.Edit{at("fresh", "max1, now, true", "max1 - 1, now, true")}},
	{name: "fresh-bucket-not-full-bucket2",
		edits: []mutate.Edit{at("fresh2", "max2, now, true", "max2 - 1, now, true")}},
	{name: "retry-rounded-down-to-ms",
		edits: []mutate.Edit{at("deny1-reply", "ts1 + (c1 - tk1) * per1 - now,", "math.floor((ts1 + (c1 - tk1) * per1 - now) / 1000) * 1000,")}},
	{name: "retry-returned-in-ms",
		edits: []mutate.Edit{at("deny2-reply", "ts2 + (c2 - tk2) * per2 - now,", "(ts2 + (c2 - tk2) * per2 - now) / 1000,")}},
	{name: "retry-from-the-wrong-bucket", // bucket 1's cost and interval with bucket 2's state
		edits: []mutate.Edit{at("deny2-reply", "ts2 + (c2 - tk2) * per2 - now", "ts2 + (c1 - tk2) * per1 - now")}},
	{name: "time-from-argument-not-TIME", // the host sends its clock, as the last ARGV, and the script trusts it
		edits: []mutate.Edit{at("nargs", "#argv", "#argv - 1"), at("now", "t[1] * 1000000 + t[2]", "argv[#argv] + 0")},
		wrap:  func(c valkey.Client) valkey.Client { return hostClockClient{c} }},
	{name: "remaining-before-the-charge",
		edits: []mutate.Edit{at("both-reply", "tk1, tk2", "tk1 + c1, tk2")}},
	{name: "foreign-hash-accepted", // a user's hash gains tokens, ts and an expiry
		edits: []mutate.Edit{at("foreign", "e == 1", "e == 2")}},
	{name: "foreign-hash-accepted-bucket2",
		edits: []mutate.Edit{at("foreign2", "e == 1", "e == 2")}},
	{name: "once-record-written-not-read", // every retry decides again
		edits: []mutate.Edit{at("record-found", "if r then", "if false then")}},
	{name: "once-record-read-but-charged", // the retry returns the old Decision and charges again
		edits: []mutate.Edit{
			at("nargs", "", "local replayed"),
			at("replay", "return 'R '", "replayed = 'R '"),
			at("reply-return", "return reply", "return replayed or reply"),
		}},
	{name: "once-record-never-expires",
		edits: []mutate.Edit{at("record-write", ", 'PX', argv[na])", ")")}},
	{name: "once-replay-unmarked", // a caller settles a replay again: the double refund of issue 17
		edits: []mutate.Edit{at("replay", "'R ' .. ", "")}},
	{name: "once-first-denial-recorded", // a stable id is denied for the whole window
		edits: []mutate.Edit{at("deny1-unrecorded", "record = nil", "")}},
	{name: "once-request-not-compared", // another Cost, Spec or second key gets the old decision
		edits: []mutate.Edit{at("record-reuse", "string.sub(r, bar + 1) ~= fp", "false")}},
	{name: "once-foreign-record-trusted",
		edits: []mutate.Edit{at("record-shape", "not bar or not find(r, '^[012] %d+ %d+ %-?%d+|%d+ %d+ %d+')", "false")}},
	{name: "undeclared-key-outside-prefix", // only a count of the node's keys shows it
		edits: []mutate.Edit{at("store-expire", "", "redis.call('SET', 'admit-mutant-stray', ts1)")}},
	{name: "undeclared-key-written",
		edits: []mutate.Edit{at("store-expire", "", "redis.call('SET', keys[1] .. ':last', ts1)")}},

	// The Budget API (issue 9).
	{name: "cost-ignored-on-second-bucket", // a take decides and charges bucket 2 at cost 1
		edits: []mutate.Edit{at("deny2-test", "tk2 < c2", "tk2 < 1"), at("both-charge", "tk2 - c2", "tk2 - 1")}},
	{name: "retry-until-one-token-not-cost",
		edits: []mutate.Edit{at("deny1-reply", "(c1 - tk1)", "(1 - tk1)"), at("deny2-reply", "(c2 - tk2)", "(1 - tk2)")}},
	{name: "refund-above-burst",
		edits: []mutate.Edit{at("refund1", "math.min(max1, tk1 + c1)", "tk1 + c1"), at("refund2", "math.min(max2, tk2 + c2)", "tk2 + c2")}},
	{name: "refund-creates-absent-key",
		edits: []mutate.Edit{at("refund1-how", "not new1 and STORE or nil", "STORE"), at("refund2-how", "not new2 and STORE or nil", "STORE")}},
	{name: "peek-writes",
		edits: []mutate.Edit{at("writes", "mode ~= 'p'", "true")}},
	{name: "remaining-off-by-cost",
		edits: []mutate.Edit{at("both-reply", "tk1, tk2", "tk1, tk2 + c2")}},
	{name: "remaining-off-by-cost-one-bucket",
		edits: []mutate.Edit{at("one-reply", "tk1", "tk1 + c1")}},
	{name: "remaining-packed-swapped", // an integer reply's two counts in each other's place
		edits: []mutate.Edit{at("both-pack", "r1 * 2 ^ 26 + r2", "r2 * 2 ^ 26 + r1")}},
	{name: "remaining-packed-overflows", // bucket 2's count spills into bucket 1's bits
		edits: []mutate.Edit{at("both-pack-bound", "r2 >= 2 ^ 26", "r2 >= 2 ^ 27")}},
	{name: "remaining-off-by-cost-on-second-denial",
		edits: []mutate.Edit{at("deny2-reply", "now, tk1, tk2", "now, tk1 + c1, tk2")}},

	// Concurrency leases (the lease-* rules).
	{name: "lease-limit-off-by-one",
		edits: []mutate.Edit{at("lease-full", "live >= llimit", "live > llimit")}},
	{name: "lease-expired-counted-live",
		edits: []mutate.Edit{at("lease-live", "now + 1", "'-inf'")}},
	{name: "lease-expired-not-pruned",
		edits: []mutate.Edit{at("lease-prune", "lcall('ZREMRANGEBYSCORE', '-inf', now)", "")}},
	{name: "lease-key-never-expires",
		edits: []mutate.Edit{at("lease-expire", "redis.call('PEXPIREAT', lkey, at + (-at) % 1)", "")}},
	{name: "lease-key-expires-with-the-new-lease", // an older, longer lease outlives its key
		edits: []mutate.Edit{at("lease-expire", "at + (-at) % 1", "math.ceil(exp / 1000)")}},
	{name: "lease-replay-takes-again",
		edits: []mutate.Edit{at("lease-replay", "own and own + 0 > now", "false")}},
	{name: "lease-buckets-not-all-or-nothing",
		edits: []mutate.Edit{at("lease-all", "leasing, mode = true, 'a'", "leasing, mode = true, 't'")}},
	{name: "lease-refusal-prunes",
		edits: []mutate.Edit{at("lease-full", "", "redis.call('ZREMRANGEBYSCORE', lkey, '-inf', now)")}},
	{name: "lease-retry-after-a-whole-lease",
		edits: []mutate.Edit{at("lease-full-reply", "oldest[2] - now", "llease")}},
	{name: "lease-release-of-expired-reported-held",
		edits: []mutate.Edit{at("lease-release-reply", "own + 0 > now and '1' or '2'", "'1'")}},
	{name: "lease-extend-after-expiry",
		edits: []mutate.Edit{at("lease-extend-dead", "not own or own + 0 <= now", "not own")}},
	{name: "lease-extend-shortens", // ZADD GT alone would keep the score: both go
		edits: []mutate.Edit{at("lease-extend-to", "math.max(own + 0, now + llease)", "now + llease"), at("lease-extend-add", "'GT', ", "")}},
	{name: "lease-corrupt-key-accepted",
		edits: []mutate.Edit{at("lease-corrupt", "card > 10000 or (own and not whole(own)) or (latest and not whole(latest))", "false")}},
	{name: "lease-acl-precheck-skipped",
		edits: []mutate.Edit{at("lease-acl", "redis.acl_check_cmd", "nil")}},
	{name: "lease-acl-precheck-skipped-with-buckets",
		edits: []mutate.Edit{at("lease-check", "lcheck(lexpired, false)", "nil")}},
	{name: "lease-acl-precheck-skipped-on-extend",
		edits: []mutate.Edit{at("lease-acl-extend", "acl and not acl('PEXPIREAT', lkey)", "false")}},
	{name: "lease-remaining-before-the-charge",
		edits: []mutate.Edit{at("lease-grant-reply", "'0 0 %d %d %d %d 0', tk1,", "'0 0 %d %d %d %d 0', tk1 + c1,")}},
	{name: "lease-refusal-names-the-first-part",
		edits: []mutate.Edit{at("lease-deny-reply", "ldenied, lretry", "1, lretry")}},
}

// hostClockClient appends the host's clock, in µs, to every script
// command: the design the script's TIME call replaces.
type hostClockClient struct{ valkey.Client }

func (h hostClockClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	args := cmd.Commands()
	if len(args) >= 3 && (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "EVAL") ||
		strings.EqualFold(args[0], "EVALSHA_RO") || strings.EqualFold(args[0], "EVAL_RO")) {
		n, _ := strconv.Atoi(args[2])
		rest := append(append([]string(nil), args[3+n:]...), strconv.FormatInt(time.Now().UnixMicro(), 10))
		cmd = h.B().Arbitrary(args[0]).Args(args[1], args[2]).Keys(args[3 : 3+n]...).Args(rest...).Build()
	}
	return h.Client.Do(ctx, cmd)
}

// specMutant is a named bug in spec.go: text edits, each old text
// occurring exactly once.
type specMutant struct {
	name  string
	edits [][2]string
}

func (m specMutant) apply(src string) (string, error) {
	for _, ed := range m.edits {
		if n := strings.Count(src, ed[0]); n != 1 {
			return "", fmt.Errorf("mutant %s: %q occurs %d times, want once; update the mutant to the source", m.name, ed[0], n)
		}
		src = strings.Replace(src, ed[0], ed[1], 1)
	}
	return src, nil
}

// specMutants move NewSpec's bounds; TestSpecBounds must catch each.
var specMutants = []specMutant{
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
	type row struct{ mutant, caught, evidence string }
	var table []row

	// A mutant "caught" by a rule that the shipped script fails too would
	// prove nothing.
	for _, r := range admittest.Rules(t, c, nil, opts...) {
		if err := runRule(r); err != nil {
			if _, skip := admittest.IsSkip(err); !skip {
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
			for _, r := range admittest.Rules(t, c, newLimiter, opts...) {
				err := runRule(r)
				if _, skip := admittest.IsSkip(err); err == nil || skip {
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
	b.WriteString("mutant → rules that caught it\n")
	for _, r := range table {
		caught := r.caught
		if caught == "" {
			caught = "NOT CAUGHT"
		}
		fmt.Fprintf(&b, "  %-46s %s\n", r.mutant, caught)
	}
	t.Log(b.String())
}

func runRule(r admittest.Rule) error {
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
// library's files, script.lua and spec_test.go) and runs
// TestSpecBounds there, which must pass unmutated and fail on every
// mutant. It returns rows of mutant name and catching check.
func specMutantRows(t *testing.T) [][2]string {
	// go test puts its own GOROOT/bin first on the test's PATH, so this
	// is the toolchain running the test (GOTOOLCHAIN=go1.25.0 included).
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Errorf("spec mutants need the go command: %v", err)
		return nil
	}
	dir := t.TempDir()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") || f == "spec_test.go" {
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
		cmd := exec.Command(goBin, "test", "-vet=off", "-count=1", "-run", "^TestSpecBounds$", ".") // vet runs once, in make lint
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
				if i := strings.Index(out, "spec_test.go"); i >= 0 {
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

// TestScriptMutantsApply: every script mutant still finds its markers and
// changes the shipped script, checked on every test run (TestMutants, which
// proves each is caught, runs only with ADMIT_MUTANTS=1).
func TestScriptMutantsApply(t *testing.T) {
	for _, m := range scriptMutants {
		src, err := m.apply(admit.ScriptSource)
		if err != nil {
			t.Error(err)
		} else if src == admit.ScriptSource {
			t.Errorf("mutant %s changes nothing", m.name)
		}
	}
}
