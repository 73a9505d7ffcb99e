package admit

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

// scriptTimeCalls is how many EVALSHAs valkey-benchmark sends per script,
// path and round.
const scriptTimeCalls = 5000

// BenchmarkScriptServerTime is issue 12's measure of what a decision costs
// the server: one server with three scripts loaded, the 0b7bc55 baseline,
// the previous release's (5550b58, before issue 17's argument checks) and
// the shipped script, each driven in turn by valkey-benchmark (one
// connection, so calls never queue) with the arguments its version takes,
// on every path. Before each run CONFIG RESETSTAT, after it INFO
// commandstats: usec_per_call of EVALSHA, the script's own commands
// included, network and client excluded. Each loop iteration is one round,
// and the rounds alternate which script goes first, so that whatever else
// the machine does weighs on both alike. It reports each script's median
// µs per call over the rounds, the median of the rounds' ratios
// current/baseline, and the largest of them, and the median of the rounds'
// ratios current/previous.
//
//	go test -run '^$' -bench ScriptServerTime -benchtime 40x .
//	VALKEY_SERVER=$(command -v redis-server) go test -run '^$' -bench ScriptServerTime -benchtime 40x .
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
	type variant struct {
		name string
		sha  string
		args func(...Spec) []string
		// denied reads Decision.Denied from the script's reply.
		denied func(valkey.ValkeyResult) (int64, error)
	}
	deniedOfReply := replyDenied
	variants := []*variant{
		{name: "baseline-0b7bc55", args: baselineArgs, denied: func(r valkey.ValkeyResult) (int64, error) {
			arr, err := r.AsIntSlice() // {denied, retry}
			if err != nil {
				return 0, err
			}
			return arr[0], nil
		}},
		{name: "previous-5550b58", args: takeArgs, denied: deniedOfReply},
		{name: "current", args: takeArgs, denied: deniedOfReply},
	}
	for i, src := range []string{baselineScript, previousScript, scriptSource} {
		if variants[i].sha, err = c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).ToString(); err != nil {
			b.Fatal(err)
		}
	}
	for _, p := range scriptPaths() {
		b.Run("path="+p.name, func(b *testing.B) {
			prefix := testserver.Prefix(b, c)
			type run struct {
				keys, args []string
				check      func() error
			}
			runs := make([]run, len(variants))
			for i, s := range variants {
				keys, args := []string{prefix + s.name + ":first"}, s.args(p.first)
				if p.second != nil {
					keys, args = append(keys, prefix+s.name+":second"), s.args(p.first, *p.second)
				}
				runs[i] = run{keys: keys, args: args, check: func() error {
					cmd := c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
					denied, err := s.denied(c.Do(ctx, cmd))
					if err == nil && denied != int64(p.want) {
						err = fmt.Errorf("%s: denied %d, want %d", s.name, denied, p.want)
					}
					return err
				}}
				// Drain the shut buckets (the first call takes their one
				// token), then check the path, before timing.
				runs[i].check()
				if err := runs[i].check(); err != nil {
					b.Fatal(err)
				}
			}
			usec := make([][]float64, len(variants)) // by script, a value a round
			var ratios, sincePrevious []float64      // current/baseline, current/previous, a value a round
			round := 0
			for b.Loop() {
				for k := range variants {
					i := (k + round) % len(variants)
					if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
						b.Fatal(err)
					}
					cmd := []string{"-h", host, "-p", port, "-c", "1", "-n", strconv.Itoa(scriptTimeCalls), "-q",
						"EVALSHA", variants[i].sha, strconv.Itoa(len(runs[i].keys))}
					cmd = append(append(cmd, runs[i].keys...), runs[i].args...)
					if out, err := exec.Command(tool, cmd...).CombinedOutput(); err != nil {
						b.Fatalf("%s: %v\n%s", tool, err, out)
					}
					st := testserver.CommandStats(b, c)["evalsha"]
					if st.Calls != scriptTimeCalls || st.Failed != 0 {
						b.Fatalf("%s: %d EVALSHA counted (%d failed), want %d", variants[i].name, st.Calls, st.Failed, scriptTimeCalls)
					}
					usec[i] = append(usec[i], float64(st.Usec)/float64(st.Calls))
					if err := runs[i].check(); err != nil { // still on its path
						b.Fatal(err)
					}
				}
				ratios = append(ratios, usec[2][round]/usec[0][round])
				sincePrevious = append(sincePrevious, usec[2][round]/usec[1][round])
				round++
			}
			for i, s := range variants {
				b.ReportMetric(median(usec[i]), s.name+"-server-µs/call")
			}
			b.ReportMetric(median(ratios), "current/baseline")
			b.ReportMetric(slices.Max(ratios), "current/baseline-max")
			b.ReportMetric(median(sincePrevious), "current/previous")
		})
	}
}

// median is the middle value of xs (the mean of the two middle ones for
// an even count): a round that the machine slowed does not move it.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
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
