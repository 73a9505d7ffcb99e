package admit

import (
	"context"
	_ "embed"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
)

// floorOneScript and floorTwoScript are the floors of issue 22: the
// commands a one- and a two-bucket admission must run (TIME, then HMGET,
// HSET and PEXPIREAT a bucket) with no logic around them.
var (
	//go:embed testdata/floor_one.lua
	floorOneScript string
	//go:embed testdata/floor_two.lua
	floorTwoScript string
)

// The load valkey-benchmark puts on the server in each run of
// BenchmarkScriptSaturation: 50 connections, 16 calls in flight on each,
// 100,000 calls on one hot key (or pair of keys).
const (
	saturationClients  = 50
	saturationPipeline = 16
	saturationCalls    = 100000
)

// BenchmarkScriptSaturation is issue 22's measure of a decision's server
// time at saturation, where a hot key's ceiling is set: one server with
// the shipped script, the previous release's (5550b58, the same
// arguments), WithoutACLPrecheck's script ("unchecked") and the floors
// (testdata/floor_one.lua, floor_two.lua) loaded side by side, each driven in turn by valkey-benchmark with
// `-c 50 -P 16 -n 100000` on one hot key (two for two buckets), on every
// path; the floors only on the admissions, the one path they model. Before
// each run CONFIG RESETSTAT, after it INFO commandstats: usec_per_call of
// EVALSHA (usec over calls), the script's own commands included, network
// and client excluded. Each loop iteration is one rep, and the reps rotate
// which script goes first, so that whatever else the machine does weighs
// on all alike. Each rep gives its own ratios, shipped/floor and
// shipped/previous; it reports their medians over the reps (never a ratio
// of medians), the largest shipped/floor, and each script's median µs per
// call. A rep takes a few seconds (3 or 4 runs of 100,000 calls), so
// -benchtime Nx runs N reps a path:
//
//	go test -run '^$' -bench ScriptSaturation -benchtime 5x .
//	VALKEY_SERVER=/opt/admit-servers/bin/valkey-server-9.1.2 go test -run '^$' -bench ScriptSaturation -benchtime 5x .
//
// It needs valkey-benchmark or redis-benchmark on PATH (or beside
// VALKEY_SERVER) and a server it can reach without TLS. The peer,
// go-redis/redis_rate, is measured the same way by internal/peerbench.
func BenchmarkScriptSaturation(b *testing.B) {
	tool := benchmarkTool()
	if tool == "" {
		testserver.SkipOrFail(b, "BenchmarkScriptSaturation needs valkey-benchmark or redis-benchmark on PATH")
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
	sha := map[string]string{}
	for name, src := range map[string]string{
		"shipped": scriptSource, "previous-5550b58": previousScript,
		"floor-one": floorOneScript, "floor-two": floorTwoScript,
		"unchecked": withoutACLPrecheck(scriptSource),
	} {
		if sha[name], err = c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).ToString(); err != nil {
			b.Fatal(err)
		}
	}
	for _, p := range scriptPaths() {
		b.Run("path="+p.name, func(b *testing.B) {
			prefix := testserver.Prefix(b, c)
			// The scripts of this path, shipped first: ratios are taken
			// against it. Every script gets the shipped arguments.
			names := []string{"shipped", "previous-5550b58"}
			switch {
			case p.want == 0 && p.second == nil:
				names = append(names, "floor-one")
			case p.want == 0:
				names = append(names, "floor-two")
			}
			names = append(names, "unchecked") // WithoutACLPrecheck's script, last
			type run struct {
				name, sha  string
				keys, args []string
				check      func() error
			}
			runs := make([]run, len(names))
			for i, name := range names {
				keys, args := []string{prefix + name + ":first"}, takeArgs(p.first)
				if p.second != nil {
					keys, args = append(keys, prefix+name+":second"), takeArgs(p.first, *p.second)
				}
				runs[i] = run{name: name, sha: sha[name], keys: keys, args: args}
				runs[i].check = func() error {
					cmd := c.B().Evalsha().Sha1(sha[name]).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
					denied, err := replyDenied(c.Do(ctx, cmd))
					if err == nil && denied != int64(p.want) {
						err = fmt.Errorf("%s: denied %d, want %d", name, denied, p.want)
					}
					return err
				}
				// Drain the shut buckets (the first call takes their one
				// token), then check the path, before timing.
				runs[i].check()
				if err := runs[i].check(); err != nil {
					b.Fatal(err)
				}
			}
			usec := make([][]float64, len(runs)) // by script, a value a rep
			var sinceFloor, sincePrevious, uncheckedSinceFloor []float64
			rep := 0
			for b.Loop() {
				for k := range runs {
					i := (k + rep) % len(runs)
					if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
						b.Fatal(err)
					}
					cmd := []string{"-h", host, "-p", port, "-q",
						"-c", strconv.Itoa(saturationClients), "-P", strconv.Itoa(saturationPipeline),
						"-n", strconv.Itoa(saturationCalls),
						"EVALSHA", runs[i].sha, strconv.Itoa(len(runs[i].keys))}
					cmd = append(append(cmd, runs[i].keys...), runs[i].args...)
					if out, err := exec.Command(tool, cmd...).CombinedOutput(); err != nil {
						b.Fatalf("%s: %v\n%s", tool, err, out)
					}
					st := testserver.CommandStats(b, c)["evalsha"]
					if st.Calls != saturationCalls || st.Failed != 0 {
						b.Fatalf("%s: %d EVALSHA counted (%d failed), want %d", runs[i].name, st.Calls, st.Failed, saturationCalls)
					}
					usec[i] = append(usec[i], float64(st.Usec)/float64(st.Calls))
					if err := runs[i].check(); err != nil { // still on its path
						b.Fatal(err)
					}
				}
				sincePrevious = append(sincePrevious, usec[0][rep]/usec[1][rep])
				if len(runs) > 3 {
					sinceFloor = append(sinceFloor, usec[0][rep]/usec[2][rep])
					uncheckedSinceFloor = append(uncheckedSinceFloor, usec[3][rep]/usec[2][rep])
				}
				rep++
			}
			for i, r := range runs {
				b.ReportMetric(median(usec[i]), r.name+"-server-µs/call")
			}
			b.ReportMetric(median(sincePrevious), "shipped/previous")
			if len(sinceFloor) > 0 {
				b.ReportMetric(median(sinceFloor), "shipped/floor")
				b.ReportMetric(slices.Max(sinceFloor), "shipped/floor-max")
				b.ReportMetric(median(uncheckedSinceFloor), "unchecked/floor")
			}
		})
	}
}
