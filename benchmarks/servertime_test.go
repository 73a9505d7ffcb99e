package benchmarks

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// A contender is one script, or one library, whose server time per call
// serverTime measures: run drives the server with a run's calls, check
// makes one call and says whether it is still on its path, and prepare,
// if set, runs before each run, untimed.
type contender struct {
	name    string
	prepare func() error
	run     func() error
	check   func() error
}

// serverTime is the one driver of every server-time benchmark. Each
// iteration of b.Loop is one rep, in which every contender runs once, the
// reps rotating which goes first, so that whatever else the machine does
// weighs on all alike. Before each run CONFIG RESETSTAT, after it INFO
// commandstats: EVALSHA's usec over its calls, the script's own commands
// included, network and client excluded. A run must count exactly calls
// EVALSHAs, none failed and no EVAL, and leave its contender on its path.
// serverTime reports each contender's median µs per call over the reps,
// and returns every rep's, by contender, for reportRatio. With cg, a server
// under callgrind, it reads instructions per call instead of µs.
func serverTime(b *testing.B, c valkey.Client, calls int64, cs []contender, cg *callgrind) [][]float64 {
	b.Helper()
	ctx := context.Background()
	for _, x := range cs { // the first call drains a shut bucket
		if x.prepare != nil {
			if err := x.prepare(); err != nil {
				b.Fatalf("%s: %v", x.name, err)
			}
		}
		x.check()
		if err := x.check(); err != nil {
			b.Fatalf("%s: %v", x.name, err)
		}
	}
	per := make([][]float64, len(cs)) // by contender, a value a rep
	rep := 0
	for b.Loop() {
		for k := range cs {
			i := (k + rep) % len(cs)
			if cs[i].prepare != nil {
				if err := cs[i].prepare(); err != nil {
					b.Fatalf("%s: %v", cs[i].name, err)
				}
			}
			if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
				b.Fatal(err)
			}
			if cg != nil {
				cg.zero(b)
			}
			if err := cs[i].run(); err != nil {
				b.Fatalf("%s: %v", cs[i].name, err)
			}
			var perCall float64
			if cg != nil { // before INFO, which processCommand would count
				perCall = cg.perCall(b, calls)
			}
			st := testserver.CommandStats(b, c)
			ev := st["evalsha"]
			if ev.Calls != calls || ev.Failed != 0 || st["eval"].Calls != 0 {
				b.Fatalf("%s: %d EVALSHA counted (%d failed) and %d EVAL, want %d EVALSHA",
					cs[i].name, ev.Calls, ev.Failed, st["eval"].Calls, calls)
			}
			if cg == nil {
				perCall = float64(ev.Usec) / float64(ev.Calls)
			}
			per[i] = append(per[i], perCall)
			if err := cs[i].check(); err != nil {
				b.Fatalf("%s after its run: %v", cs[i].name, err)
			}
		}
		rep++
	}
	unit := "-server-µs/call"
	if cg != nil {
		unit = "-instructions/call"
	}
	for i, x := range cs {
		b.ReportMetric(median(per[i]), x.name+unit)
	}
	return per
}

// reportRatio reports, as name, the median over the reps of each rep's own
// ratio num/den (never a ratio of medians), and withMax the largest of
// them as name-max.
func reportRatio(b *testing.B, name string, num, den []float64, withMax bool) {
	ratios := make([]float64, len(num))
	for i := range num {
		ratios[i] = num[i] / den[i]
	}
	b.ReportMetric(median(ratios), name)
	if withMax {
		b.ReportMetric(slices.Max(ratios), name+"-max")
	}
}

// median is the middle value of xs (the mean of the two middle ones for
// an even count): a rep that the machine slowed does not move it.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// A load is how valkey-benchmark drives the server in one run.
type load struct {
	name                     string
	clients, pipeline, calls int
}

// loads are BenchmarkScriptServerTime's: one call at a time on one
// connection, so that calls never queue, and saturation, 50 connections
// with 16 calls in flight on each on one hot key (or pair of keys), where
// a hot key's ceiling is set. Under callgrind, callgrindCalls one at a
// time.
var loads = []load{
	{"serial", 1, 1, 5_000},
	{"saturation", 50, 16, 100_000},
}

// BenchmarkScriptServerTime measures the server's time per script call on
// every path, with valkey-benchmark under each of loads: the shipped
// script, the previous release's (5550b58, the same arguments), the
// shipped script as WithoutACLPrecheck runs it ("unchecked") and, on the
// admitted paths, the one they model, the floors (testdata/floor_one.lua,
// floor_two.lua), all loaded on one server and driven by serverTime, each
// with the shipped script's keys and arguments. It reports each script's
// median per call and the medians of each rep's ratios shipped/previous,
// shipped/floor (and its largest) and unchecked/floor. -benchtime Nx runs
// N reps a path and load (a saturation rep takes a few seconds).
//
// ADMIT_BENCH_VARIANT=path adds the script at path, which must take the
// shipped arguments, as "variant", with the ratio variant/shipped: a
// change to the script weighed before it is made.
// ADMIT_BENCH_CALLGRIND (see callgrindScope) counts instructions instead,
// each script loaded alone after SCRIPT FLUSH before its run (the
// collector's work grows with the Lua heap, so a script measured beside
// others would pay for them).
//
//	go test -run '^$' -bench 'ScriptServerTime/load=saturation' -benchtime 15x
//	VALKEY_SERVER=/path/to/redis-server go test -run '^$' -bench ScriptServerTime -benchtime 5x
//	ADMIT_BENCH_CALLGRIND=1 go test -run '^$' -bench ScriptServerTime -benchtime 3x
//
// It needs valkey-benchmark or redis-benchmark on PATH (or beside
// VALKEY_SERVER) and a server it can reach without TLS.
func BenchmarkScriptServerTime(b *testing.B) {
	tool := benchmarkTool()
	if tool == "" {
		testserver.SkipOrFail(b, "BenchmarkScriptServerTime needs valkey-benchmark or redis-benchmark on PATH")
	}
	var (
		c    valkey.Client
		addr string
		cg   *callgrind
	)
	loads := loads
	if scope := callgrindScope(); scope != "" {
		bin := testserver.Binary()
		if bin == "" {
			testserver.SkipOrFail(b, testserver.Help)
		}
		addr, cg = startCallgrind(b, bin, scope)
		var err error
		if c, err = valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		loads = []load{{"callgrind", 1, 1, callgrindCalls}}
	} else {
		srv := testserver.Own(b)
		if srv.TLS != nil {
			b.Skip("valkey-benchmark runs here without TLS")
		}
		addr, c = srv.Addr, testserver.NewClient(b, srv)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	confirmScripts(b, c, testserver.Prefix(b, c))
	src := map[string]string{
		"shipped": shippedScript, "previous-5550b58": previousScript, "unchecked": uncheckedScript,
		"floor-one": floorOneScript, "floor-two": floorTwoScript,
	}
	if path := os.Getenv("ADMIT_BENCH_VARIANT"); path != "" {
		v, err := os.ReadFile(path)
		if err != nil {
			b.Fatalf("ADMIT_BENCH_VARIANT: %v", err)
		}
		src["variant"] = string(v)
	}
	sha := map[string]string{}
	for name, s := range src {
		if sha[name], err = c.Do(ctx, c.B().ScriptLoad().Script(s).Build()).ToString(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
	}
	for _, l := range loads {
		for _, p := range scriptPaths() {
			b.Run("load="+l.name+"/path="+p.name, func(b *testing.B) {
				prefix := testserver.Prefix(b, c)
				if cg != nil {
					// Short keys, on the driver's own server: a key's
					// length costs instructions in every command that
					// names it, and the instruction counts have always
					// been taken with keys of this shape.
					prefix = "{" + p.name + "}:"
				}
				// The scripts of this path, shipped first: ratios are
				// taken against it.
				names := []string{"shipped", "previous-5550b58"}
				if p.all {
					// AllowAll beside AllowOrdered: the shipped script in
					// mode 'a' and as a take, the same buckets' shapes.
					names = []string{"shipped", "shipped-take"}
				}
				switch {
				case p.all:
				case p.want == 0 && p.second == nil:
					names = append(names, "floor-one")
				case p.want == 0:
					names = append(names, "floor-two")
				}
				if !p.all {
					names = append(names, "unchecked")
				}
				if src["variant"] != "" && !p.all {
					names = append(names, "variant")
				}
				cs := make([]contender, len(names))
				for i, name := range names {
					keys, args := []string{prefix + name + ":first"}, takeArgs(p.first)
					if p.second != nil {
						keys, args = append(keys, prefix+name+":second"), takeArgs(p.first, *p.second)
					}
					if p.all && name == "shipped" {
						args = append(args, "a")
					}
					script := name
					if name == "shipped-take" {
						script = "shipped"
					}
					cmd := []string{"-h", host, "-p", port, "-q",
						"-c", strconv.Itoa(l.clients), "-P", strconv.Itoa(l.pipeline), "-n", strconv.Itoa(l.calls),
						"EVALSHA", sha[script], strconv.Itoa(len(keys))}
					cmd = append(append(cmd, keys...), args...)
					cs[i] = contender{name: name,
						run: func() error {
							if out, err := exec.Command(tool, cmd...).CombinedOutput(); err != nil {
								return fmt.Errorf("%s: %v\n%s", tool, err, out)
							}
							return nil
						},
						check: func() error {
							call := c.B().Evalsha().Sha1(sha[script]).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
							denied, err := replyDenied(c.Do(ctx, call))
							if err == nil && denied != int64(p.want) {
								err = fmt.Errorf("denied %d, want %d", denied, p.want)
							}
							return err
						},
					}
					if cg != nil {
						// The script alone in a fresh Lua state, called
						// twice before the run.
						cs[i].prepare = func() error {
							if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
								return err
							}
							if err := c.Do(ctx, c.B().ScriptLoad().Script(src[script]).Build()).Error(); err != nil {
								return err
							}
							cs[i].check()
							return cs[i].check()
						}
					}
				}
				per := serverTime(b, c, int64(l.calls), cs, cg)
				if p.all {
					reportRatio(b, "all/take", per[0], per[1], false)
					return
				}
				reportRatio(b, "shipped/previous", per[0], per[1], false)
				if i := slices.Index(names, "unchecked"); i == 3 {
					reportRatio(b, "shipped/floor", per[0], per[2], true)
					reportRatio(b, "unchecked/floor", per[3], per[2], false)
				}
				if i := slices.Index(names, "variant"); i >= 0 {
					reportRatio(b, "variant/shipped", per[i], per[0], false)
				}
			})
		}
	}
}

// benchmarkTool finds valkey-benchmark (or redis-benchmark) beside the
// server binary the tests use, else on PATH.
func benchmarkTool() string {
	if bin := testserver.Binary(); bin != "" {
		dir, base := filepath.Split(bin)
		for _, name := range []string{strings.Replace(base, "-server", "-benchmark", 1), "valkey-benchmark", "redis-benchmark"} {
			if p, err := exec.LookPath(filepath.Join(dir, name)); err == nil {
				return p
			}
		}
	}
	for _, name := range []string{"valkey-benchmark", "redis-benchmark"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}
