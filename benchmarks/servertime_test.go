package benchmarks

import (
	"context"
	"fmt"
	"net"
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
// makes one call and says whether it is still on its path.
type contender struct {
	name  string
	run   func() error
	check func() error
}

// serverTime is the one driver of every server-time benchmark. Each
// iteration of b.Loop is one rep, in which every contender runs once, the
// reps rotating which goes first, so that whatever else the machine does
// weighs on all alike. Before each run CONFIG RESETSTAT, after it INFO
// commandstats: EVALSHA's usec over its calls, the script's own commands
// included, network and client excluded. A run must count exactly calls
// EVALSHAs, none failed and no EVAL, and leave its contender on its path.
// serverTime reports each contender's median µs per call over the reps,
// and returns every rep's, by contender, for reportRatio.
func serverTime(b *testing.B, c valkey.Client, calls int64, cs []contender) [][]float64 {
	b.Helper()
	ctx := context.Background()
	for _, x := range cs { // the first call drains a shut bucket
		x.check()
		if err := x.check(); err != nil {
			b.Fatalf("%s: %v", x.name, err)
		}
	}
	usec := make([][]float64, len(cs)) // by contender, a value a rep
	rep := 0
	for b.Loop() {
		for k := range cs {
			i := (k + rep) % len(cs)
			if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
				b.Fatal(err)
			}
			if err := cs[i].run(); err != nil {
				b.Fatalf("%s: %v", cs[i].name, err)
			}
			st := testserver.CommandStats(b, c)
			ev := st["evalsha"]
			if ev.Calls != calls || ev.Failed != 0 || st["eval"].Calls != 0 {
				b.Fatalf("%s: %d EVALSHA counted (%d failed) and %d EVAL, want %d EVALSHA",
					cs[i].name, ev.Calls, ev.Failed, st["eval"].Calls, calls)
			}
			usec[i] = append(usec[i], float64(ev.Usec)/float64(ev.Calls))
			if err := cs[i].check(); err != nil {
				b.Fatalf("%s after its run: %v", cs[i].name, err)
			}
		}
		rep++
	}
	for i, x := range cs {
		b.ReportMetric(median(usec[i]), x.name+"-server-µs/call")
	}
	return usec
}

// reportRatio reports, as name, the median over the reps of each rep's own
// ratio num/den (never a ratio of medians), and with max the largest of
// them as name-max.
func reportRatio(b *testing.B, name string, num, den []float64, max bool) {
	ratios := make([]float64, len(num))
	for i := range num {
		ratios[i] = num[i] / den[i]
	}
	b.ReportMetric(median(ratios), name)
	if max {
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
// a hot key's ceiling is set.
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
// median µs per call and the medians of each rep's ratios shipped/previous,
// shipped/floor (and its largest) and unchecked/floor. -benchtime Nx runs
// N reps a path and load (a saturation rep takes a few seconds):
//
//	go test -run '^$' -bench 'ScriptServerTime/load=saturation' -benchtime 15x
//	VALKEY_SERVER=/path/to/redis-server go test -run '^$' -bench ScriptServerTime -benchtime 5x
//
// It needs valkey-benchmark or redis-benchmark on PATH (or beside
// VALKEY_SERVER) and a server it can reach without TLS.
func BenchmarkScriptServerTime(b *testing.B) {
	tool := benchmarkTool()
	if tool == "" {
		testserver.SkipOrFail(b, "BenchmarkScriptServerTime needs valkey-benchmark or redis-benchmark on PATH")
	}
	srv := testserver.Own(b)
	if srv.TLS != nil {
		b.Skip("valkey-benchmark runs here without TLS")
	}
	host, port, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	c := testserver.NewClient(b, srv)
	ctx := context.Background()
	confirmScripts(b, c, testserver.Prefix(b, c))
	sha := map[string]string{}
	for name, src := range map[string]string{
		"shipped": shippedScript, "previous-5550b58": previousScript, "unchecked": uncheckedScript,
		"floor-one": floorOneScript, "floor-two": floorTwoScript,
	} {
		if sha[name], err = c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).ToString(); err != nil {
			b.Fatal(err)
		}
	}
	for _, l := range loads {
		for _, p := range scriptPaths() {
			b.Run("load="+l.name+"/path="+p.name, func(b *testing.B) {
				prefix := testserver.Prefix(b, c)
				// The scripts of this path, shipped first: ratios are
				// taken against it.
				names := []string{"shipped", "previous-5550b58"}
				switch {
				case p.want == 0 && p.second == nil:
					names = append(names, "floor-one")
				case p.want == 0:
					names = append(names, "floor-two")
				}
				names = append(names, "unchecked")
				cs := make([]contender, len(names))
				for i, name := range names {
					keys, args := []string{prefix + name + ":first"}, takeArgs(p.first)
					if p.second != nil {
						keys, args = append(keys, prefix+name+":second"), takeArgs(p.first, *p.second)
					}
					cmd := []string{"-h", host, "-p", port, "-q",
						"-c", strconv.Itoa(l.clients), "-P", strconv.Itoa(l.pipeline), "-n", strconv.Itoa(l.calls),
						"EVALSHA", sha[name], strconv.Itoa(len(keys))}
					cmd = append(append(cmd, keys...), args...)
					cs[i] = contender{name: name,
						run: func() error {
							if out, err := exec.Command(tool, cmd...).CombinedOutput(); err != nil {
								return fmt.Errorf("%s: %v\n%s", tool, err, out)
							}
							return nil
						},
						check: func() error {
							call := c.B().Evalsha().Sha1(sha[name]).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
							denied, err := replyDenied(c.Do(ctx, call))
							if err == nil && denied != int64(p.want) {
								err = fmt.Errorf("denied %d, want %d", denied, p.want)
							}
							return err
						},
					}
				}
				usec := serverTime(b, c, int64(l.calls), cs)
				reportRatio(b, "shipped/previous", usec[0], usec[1], false)
				if len(cs) > 3 {
					reportRatio(b, "shipped/floor", usec[0], usec[2], true)
					reportRatio(b, "unchecked/floor", usec[3], usec[2], false)
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
