package benchmarks

// Benchmarks against a real server, found as the tests find one (see
// internal/testserver) and skipped cleanly without one. They measure
// AllowOrdered side by side with the designs it replaces, on plain loopback
// and through a delay proxy that adds a network's round trip. BENCHMARKS.md
// says how to run and compare them, and holds the figures of one run.
//
// Names are key=value so that benchstat can compare them:
//
//	BenchmarkAllowOrdered/path=both-allow/net=delay1ms            two buckets, one script call
//	BenchmarkAllowOrderedOneBucket/path=allow/net=loopback         one bucket (the premium lane)
//	BenchmarkSequential/path=..., BenchmarkExecMulti/path=...      the baselines, same buckets
//	BenchmarkPing/net=...                                          the floor: one PING
//	BenchmarkParallel/impl=ordered/net=loopback/goroutines=64      throughput on one shared client
//	BenchmarkRatios/net=delay1ms                                   the headline ratios, interleaved
//
// Besides ns/op, B/op and allocs/op, each reports:
//
//	p50-µs p95-µs p99-µs  latency of single calls (every call is recorded)
//	cmds/op               commands the server ran per decision, by INFO commandstats
//	                      (commands the script itself runs are left out)
//	srv-µs/op             server time per decision, by INFO commandstats
//	decisions/s           throughput of the parallel benchmarks
//
// Every decision is checked against the path's expected Decision.Denied, and
// a mismatch stops the benchmark, so a benchmark cannot silently measure the
// wrong path.

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/delayproxy"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// defaultBenchDelay is the proxy's one-way delay: +1ms on every round trip.
// ADMIT_BENCH_DELAY overrides it (a Go duration; 0 leaves the proxy out).
const defaultBenchDelay = 500 * time.Microsecond

// Bucket shapes. roomy never denies at benchmark speed: it regains a token
// every microsecond and holds a million (below 2^26, so an admission gets
// the integer reply). tight, once drained, denies for an hour.
var (
	roomy = admit.MustSpec(admit.MaxLimit, 1_000_000)
	tight = admit.MustSpec(admit.Every(time.Hour), 1)
)

// A benchPath is one row of the decision table: the buckets' shapes and the
// Decision.Denied every call must return.
type benchPath struct {
	name          string
	first, second admit.Spec
	want          uint8
}

// twoBucketPaths are the paths of a two-bucket decision.
var twoBucketPaths = []benchPath{
	{"both-allow", roomy, roomy, 0},
	{"first-denies", tight, roomy, 1},
	{"second-denies", roomy, tight, 2},
}

// oneBucketPaths are the paths of a single-bucket decision; second is unused.
var oneBucketPaths = []benchPath{
	{"allow", roomy, admit.Spec{}, 0},
	{"denies", tight, admit.Spec{}, 1},
}

// A benchNet is one client, on plain loopback or through the delay proxy,
// with a Limiter on it. All goroutines of a benchmark share it.
type benchNet struct {
	name string // the net= value
	c    valkey.Client
	l    *admit.Limiter
}

// benchEnv is the server's networks and a direct client for INFO and setup,
// which are never timed.
type benchEnv struct {
	admin  valkey.Client
	adminL *admit.Limiter
	nets   []*benchNet
	prefix string
}

// benchConfig prints the run's conditions once, as "key: value" lines that
// benchstat keeps with the results.
var benchConfig sync.Once

// newBenchEnv connects to the shared server, directly and through a delay
// proxy; everything is closed when b ends. Call it from a top-level
// benchmark, so that sub-benchmarks share it.
func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	srv := testserver.Shared(b)
	delay := benchDelay(b)
	env := &benchEnv{admin: newBenchClient(b, srv.Addr)}
	env.adminL = admit.New(env.admin)
	env.prefix = testserver.Prefix(b, env.admin)
	direct := newBenchClient(b, srv.Addr)
	env.nets = append(env.nets, &benchNet{name: "loopback", c: direct, l: admit.New(direct)})
	if delay > 0 {
		proxy, err := delayproxy.Start(srv.Addr, delay)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { proxy.Close() }) // registered first, so it runs after the client closes
		delayed := newBenchClient(b, proxy.Addr())
		env.nets = append(env.nets, &benchNet{name: delayNetName(delay), c: delayed, l: admit.New(delayed)})
	}
	benchConfig.Do(func() {
		fmt.Printf("server: %s\n", srv.Version)
		fmt.Printf("proxy-one-way-delay: %v\n", delay)
		fmt.Printf("gomaxprocs: %d\n", runtime.GOMAXPROCS(0))
	})
	return env
}

// newBenchClient returns a client for addr, closed when b ends, in
// valkey-go's pipelined mode from its first call. A client shared by
// concurrent goroutines, as a service's is, runs in that mode anyway; one
// used by a single goroutine would start in a synchronous mode and switch
// for good the first time two calls overlap. Fixing the mode puts every
// figure, serial or parallel, in the same one.
func newBenchClient(b *testing.B, addr string) valkey.Client {
	b.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:      []string{addr},
		DisableCache:     true,
		AlwaysPipelining: true,
		// One node, behind the proxy or not. Left to detect the server's
		// mode, valkey-go first builds a cluster client whose delayed
		// refresh allocates 256kB in the middle of a later benchmark.
		ForceSingleClient: true,
		Dialer:            net.Dialer{KeepAlive: -1}, // no background PINGs for INFO to count
	})
	if err != nil {
		b.Fatalf("dial %s: %v", addr, err)
	}
	b.Cleanup(c.Close)
	return c
}

// benchDelay returns ADMIT_BENCH_DELAY, or defaultBenchDelay when unset.
func benchDelay(b *testing.B) time.Duration {
	b.Helper()
	s := os.Getenv("ADMIT_BENCH_DELAY")
	if s == "" {
		return defaultBenchDelay
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		b.Fatalf("ADMIT_BENCH_DELAY=%q: want a duration such as 500us, or 0 for no proxy", s)
	}
	return d
}

// delayNetName names a proxied net by the round-trip time it adds:
// "delay1ms" for 500µs each way.
func delayNetName(oneWay time.Duration) string {
	if rtt := 2 * oneWay; rtt%time.Millisecond == 0 {
		return fmt.Sprintf("delay%dms", rtt/time.Millisecond)
	}
	return fmt.Sprintf("delay%dus", 2*oneWay/time.Microsecond)
}

// A decider makes one decision against the buckets first and second (keys
// k1 and k2) the way one design does, and returns the Decision it reached.
type decider func(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error)

// ordered is the design under test: one script call decides both buckets.
// Requests are built per call, as a caller does.
func ordered(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
	return n.l.AllowOrdered(ctx, admit.Request{Key: k1, Spec: p.first}, &admit.Request{Key: k2, Spec: p.second})
}

// orderedOne is the single-bucket (premium) lane: one script call, one key.
func orderedOne(ctx context.Context, n *benchNet, k1, _ string, p benchPath) (admit.Decision, error) {
	return n.l.AllowOrdered(ctx, admit.Request{Key: k1, Spec: p.first}, nil)
}

// sequential is the design AllowOrdered replaces: two single-bucket script
// calls, the second only when the first admits. Same script, same keys,
// same state transitions, one more round trip when the first admits.
func sequential(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
	d, err := n.l.AllowOrdered(ctx, admit.Request{Key: k1, Spec: p.first}, nil)
	if err != nil || !d.Allowed() {
		return d, err
	}
	d, err = n.l.AllowOrdered(ctx, admit.Request{Key: k2, Spec: p.second}, nil)
	if err == nil && !d.Allowed() {
		d.Denied = 2
	}
	return d, err
}

// execMulti is the rejected design: valkey.Lua.ExecMulti of the two
// single-bucket calls of the shipped script, with the arguments
// AllowOrdered sends for one bucket. It sends SCRIPT LOAD first, then both
// EVALSHAs in one pipeline, and bucket two runs (and is charged) even when
// bucket one denies.
func execMulti(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
	rs := execMultiScript.ExecMulti(ctx, n.c,
		valkey.LuaExec{Keys: []string{k1}, Args: takeArgs(p.first)},
		valkey.LuaExec{Keys: []string{k2}, Args: takeArgs(p.second)})
	denied, err := replyDenied(rs[0])
	if err != nil || denied != 0 {
		return admit.Decision{Denied: uint8(denied)}, err
	}
	if denied, err = replyDenied(rs[1]); err == nil && denied != 0 {
		denied = 2
	}
	return admit.Decision{Denied: uint8(denied)}, err
}

// execMultiScript is the shipped script, as execMulti sends it.
var execMultiScript = valkey.NewLuaScript(shippedScript)

// ping is the floor: one PING, one round trip, no script.
func ping(ctx context.Context, n *benchNet, _, _ string, _ benchPath) (admit.Decision, error) {
	return admit.Decision{}, n.c.Do(ctx, n.c.B().Ping().Build()).Error()
}

// pingPath is the path PING "takes": it never denies.
var pingPath = benchPath{name: "none"}

// keys returns the two bucket keys of one benchmark case, its own so that
// cases do not share state. They share the prefix's hash tag.
func (env *benchEnv) keys(impl string, n *benchNet, p benchPath) (k1, k2 string) {
	base := env.prefix + impl + ":" + p.name + ":" + n.name + ":"
	return base + "standard", base + "shared"
}

// prepare puts the buckets of p in the state its path needs (a tight bucket
// drained) and warms the client up: valkey-go sets up its pipeline on first
// use, which is not what a benchmark should time.
func (env *benchEnv) prepare(b *testing.B, n *benchNet, k1, k2 string, p benchPath, decide decider) {
	b.Helper()
	ctx := context.Background()
	for _, r := range []admit.Request{{Key: k1, Spec: p.first}, {Key: k2, Spec: p.second}} {
		if r.Spec != tight {
			continue
		}
		for i := 0; ; i++ {
			d, err := env.adminL.AllowOrdered(ctx, r, nil)
			if err != nil {
				b.Fatal(err)
			}
			if !d.Allowed() {
				break
			}
			if i > tight.Burst() {
				b.Fatalf("bucket %s still admits after %d calls", r.Key, i+1)
			}
		}
	}
	for range 3 {
		d, err := decide(ctx, n, k1, k2, p)
		checkDecision(b, p, d, err)
	}
}

// checkDecision stops the benchmark when a call failed or took another path
// than the one being measured.
func checkDecision(b *testing.B, p benchPath, d admit.Decision, err error) {
	if err != nil {
		b.Fatalf("path %s: %v", p.name, err)
	}
	if d.Denied != p.want {
		b.Fatalf("path %s: got %v, want Denied=%d: the benchmark would measure another path", p.name, d, p.want)
	}
}

// scriptCommands are the commands the script runs inside a call. INFO
// commandstats counts them too, but they are not round trips.
var scriptCommands = func() map[string]bool {
	m := map[string]bool{}
	for _, sub := range regexp.MustCompile(`redis\.p?call\('(\w+)'`).FindAllStringSubmatch(shippedScript, -1) {
		m[strings.ToLower(sub[1])] = true
	}
	return m
}()

// serverCost returns the commands the clients sent and the server time they
// took between two INFO commandstats snapshots: everything except INFO
// itself and the commands run from inside the script.
func serverCost(before, after map[string]testserver.CmdStat) (cmds, usec int64) {
	for name, a := range after {
		if name == "info" || scriptCommands[name] {
			continue
		}
		cmds += a.Calls - before[name].Calls
		usec += a.Usec - before[name].Usec
	}
	return cmds, usec
}

// reportServerCost reports cmds/op and srv-µs/op for decisions decisions.
func reportServerCost(b *testing.B, before, after map[string]testserver.CmdStat, decisions int) {
	cmds, usec := serverCost(before, after)
	b.ReportMetric(float64(cmds)/float64(decisions), "cmds/op")
	b.ReportMetric(float64(usec)/float64(decisions), "srv-µs/op")
}

// quantile returns the q-quantile of sorted samples, in microseconds.
func quantile(sorted []time.Duration, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i]) / float64(time.Microsecond)
}

// reportLatency reports the p50, p95 and p99 of samples, which it sorts.
func reportLatency(b *testing.B, samples []time.Duration) {
	slices.Sort(samples)
	b.ReportMetric(quantile(samples, 0.50), "p50-µs")
	b.ReportMetric(quantile(samples, 0.95), "p95-µs")
	b.ReportMetric(quantile(samples, 0.99), "p99-µs")
}

// benchSerial times b.N single decisions on one goroutine, recording each.
func (env *benchEnv) benchSerial(b *testing.B, impl string, n *benchNet, p benchPath, decide decider) {
	k1, k2 := env.keys(impl, n, p)
	env.prepare(b, n, k1, k2, p, decide)
	ctx := context.Background()
	samples := make([]time.Duration, b.N)
	before := testserver.CommandStats(b, env.admin)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range samples {
		start := time.Now()
		d, err := decide(ctx, n, k1, k2, p)
		samples[i] = time.Since(start)
		if err != nil || d.Denied != p.want {
			checkDecision(b, p, d, err)
		}
	}
	b.StopTimer()
	reportServerCost(b, before, testserver.CommandStats(b, env.admin), b.N)
	reportLatency(b, samples)
}

// runSerial runs decide on every path and net as sub-benchmarks.
func runSerial(b *testing.B, impl string, paths []benchPath, decide decider) {
	env := newBenchEnv(b)
	for _, p := range paths {
		for _, n := range env.nets {
			b.Run("path="+p.name+"/net="+n.name, func(b *testing.B) { env.benchSerial(b, impl, n, p, decide) })
		}
	}
}

// BenchmarkAllowOrdered is the design under test: both buckets decided in
// one script call, one round trip.
func BenchmarkAllowOrdered(b *testing.B) { runSerial(b, "ordered", twoBucketPaths, ordered) }

// BenchmarkAllowOrderedOneBucket is the premium lane: a nil second bucket.
func BenchmarkAllowOrderedOneBucket(b *testing.B) {
	runSerial(b, "one", oneBucketPaths, orderedOne)
}

// BenchmarkSequential is the design AllowOrdered replaces: two single-bucket
// calls, the second only when the first admits.
func BenchmarkSequential(b *testing.B) { runSerial(b, "sequential", twoBucketPaths, sequential) }

// BenchmarkExecMulti is the rejected design: Lua.ExecMulti of the two
// single-bucket calls (SCRIPT LOAD, then a pipeline of two EVALSHAs).
func BenchmarkExecMulti(b *testing.B) { runSerial(b, "execmulti", twoBucketPaths, execMulti) }

// BenchmarkPing is the floor: one PING on the same client.
func BenchmarkPing(b *testing.B) {
	env := newBenchEnv(b)
	for _, n := range env.nets {
		b.Run("net="+n.name, func(b *testing.B) { env.benchSerial(b, "ping", n, pingPath, ping) })
	}
}

// parallelImpls are the designs compared for throughput, on the both-allow
// path.
var parallelImpls = []struct {
	name   string
	decide decider
}{
	{"ordered", ordered},
	{"sequential", sequential},
	{"execmulti", execMulti},
	{"ping", ping},
}

// parallelGoroutines are the requested goroutine counts; RunParallel runs a
// multiple of GOMAXPROCS, so the names carry the count actually run.
var parallelGoroutines = []int{2, 8, 64}

// BenchmarkParallel measures throughput with many goroutines sharing one
// client, which valkey-go pipelines onto one connection. ns/op is wall time
// per decision; decisions/s is its inverse.
func BenchmarkParallel(b *testing.B) {
	env := newBenchEnv(b)
	procs := runtime.GOMAXPROCS(0)
	for _, impl := range parallelImpls {
		p := twoBucketPaths[0]
		if impl.name == "ping" {
			p = pingPath
		}
		for _, n := range env.nets {
			for _, g := range parallelGoroutines {
				per := (g + procs - 1) / procs
				name := fmt.Sprintf("impl=%s/net=%s/goroutines=%d", impl.name, n.name, per*procs)
				b.Run(name, func(b *testing.B) { env.benchParallel(b, impl.name, n, p, per, impl.decide) })
			}
		}
	}
}

// benchParallel runs b.N decisions on per×GOMAXPROCS goroutines.
func (env *benchEnv) benchParallel(b *testing.B, impl string, n *benchNet, p benchPath, per int, decide decider) {
	k1, k2 := env.keys(impl, n, p)
	env.prepare(b, n, k1, k2, p, decide)
	ctx := context.Background()
	var failure atomic.Pointer[string]
	before := testserver.CommandStats(b, env.admin)
	b.SetParallelism(per)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, err := decide(ctx, n, k1, k2, p)
			if err != nil || d.Denied != p.want {
				msg := fmt.Sprintf("path %s: got %v, %v; want Denied=%d", p.name, d, err, p.want)
				failure.CompareAndSwap(nil, &msg)
				return
			}
		}
	})
	b.StopTimer()
	if msg := failure.Load(); msg != nil {
		b.Fatal(*msg)
	}
	reportServerCost(b, before, testserver.CommandStats(b, env.admin), b.N)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// ratioBlock is how many decisions of one design BenchmarkRatios makes
// before switching to the next.
const ratioBlock = 25

// BenchmarkRatios measures the headline ratios with the designs interleaved
// in blocks of ratioBlock decisions, rotating their order, so that drift on
// a noisy machine hits them alike. One op is one decision of each design on
// the both-allow path. It reports
//
//	ordered/ping-p50, sequential/ping-p50, execmulti/ping-p50   p50 latency over PING's
//	ordered/sequential-srv                                     server time per decision over sequential's
//
// and, with goroutines=64, ordered/sequential-throughput: sequential's wall
// time for the same number of decisions over AllowOrdered's.
func BenchmarkRatios(b *testing.B) {
	env := newBenchEnv(b)
	for _, n := range env.nets {
		b.Run("net="+n.name, func(b *testing.B) { env.benchRatios(b, n) })
	}
	for _, n := range env.nets {
		b.Run("net="+n.name+"/goroutines=64", func(b *testing.B) { env.benchThroughputRatio(b, n, 64) })
	}
}

// ratioImpls are the designs BenchmarkRatios interleaves.
var ratioImpls = []struct {
	name   string
	decide decider
	path   benchPath
}{
	{"ordered", ordered, twoBucketPaths[0]},
	{"sequential", sequential, twoBucketPaths[0]},
	{"execmulti", execMulti, twoBucketPaths[0]},
	{"ping", ping, pingPath},
}

func (env *benchEnv) benchRatios(b *testing.B, n *benchNet) {
	ctx := context.Background()
	type state struct {
		k1, k2  string
		samples []time.Duration
		usec    int64
	}
	st := make([]state, len(ratioImpls))
	for i, impl := range ratioImpls {
		st[i].k1, st[i].k2 = env.keys("ratios-"+impl.name, n, impl.path)
		env.prepare(b, n, st[i].k1, st[i].k2, impl.path, impl.decide)
		st[i].samples = make([]time.Duration, 0, b.N)
	}
	b.ResetTimer()
	for block := 0; block*ratioBlock < b.N; block++ {
		calls := min(ratioBlock, b.N-block*ratioBlock)
		for j := range ratioImpls {
			i := (block + j) % len(ratioImpls) // rotate which design goes first
			impl, s := ratioImpls[i], &st[i]
			b.StopTimer()
			before := testserver.CommandStats(b, env.admin)
			b.StartTimer()
			for range calls {
				start := time.Now()
				d, err := impl.decide(ctx, n, s.k1, s.k2, impl.path)
				s.samples = append(s.samples, time.Since(start))
				if err != nil || d.Denied != impl.path.want {
					checkDecision(b, impl.path, d, err)
				}
			}
			b.StopTimer()
			_, usec := serverCost(before, testserver.CommandStats(b, env.admin))
			s.usec += usec
			b.StartTimer()
		}
	}
	b.StopTimer()
	p50 := make([]float64, len(st))
	for i := range st {
		slices.Sort(st[i].samples)
		p50[i] = quantile(st[i].samples, 0.5)
	}
	b.ReportMetric(p50[0]/p50[3], "ordered/ping-p50")
	b.ReportMetric(p50[1]/p50[3], "sequential/ping-p50")
	b.ReportMetric(p50[2]/p50[3], "execmulti/ping-p50")
	if st[1].usec > 0 {
		b.ReportMetric(float64(st[0].usec)/float64(st[1].usec), "ordered/sequential-srv")
	}
}

// benchThroughputRatio alternates AllowOrdered and the sequential baseline,
// each making ratioBlock×goroutines decisions on goroutines goroutines that
// share the client, and reports sequential's total wall time over
// AllowOrdered's. One op is one decision of each.
func (env *benchEnv) benchThroughputRatio(b *testing.B, n *benchNet, goroutines int) {
	ctx := context.Background()
	p := twoBucketPaths[0]
	impls := []decider{ordered, sequential}
	var k1, k2 [2]string
	for i, impl := range impls {
		k1[i], k2[i] = env.keys(fmt.Sprintf("ratios-tput-%d", i), n, p)
		env.prepare(b, n, k1[i], k2[i], p, impl)
	}
	var elapsed [2]time.Duration
	var failure atomic.Pointer[string]
	perBlock := ratioBlock * goroutines
	b.ResetTimer()
	for block := 0; block*perBlock < b.N; block++ {
		calls := int64(min(perBlock, b.N-block*perBlock))
		for j := range impls {
			i := (block + j) % len(impls)
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range goroutines {
				wg.Go(func() {
					for next.Add(1) <= calls {
						d, err := impls[i](ctx, n, k1[i], k2[i], p)
						if err != nil || d.Denied != p.want {
							msg := fmt.Sprintf("got %v, %v; want Denied=%d", d, err, p.want)
							failure.CompareAndSwap(nil, &msg)
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed[i] += time.Since(start)
			if msg := failure.Load(); msg != nil {
				b.Fatal(*msg)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(elapsed[1].Seconds()/elapsed[0].Seconds(), "ordered/sequential-throughput")
}

// TestBenchAccounting checks the benchmarks' bookkeeping without a server:
// which commands count as round trips, quantiles and net names.
func TestBenchAccounting(t *testing.T) {
	for _, cmd := range []string{"time", "hmget", "hset", "pexpireat", "exists"} {
		if !scriptCommands[cmd] {
			t.Errorf("scriptCommands lacks %q, which the script calls: cmds/op would count it", cmd)
		}
	}
	before := map[string]testserver.CmdStat{"evalsha": {Calls: 10, Usec: 100}, "info": {Calls: 1, Usec: 50}}
	after := map[string]testserver.CmdStat{
		"evalsha": {Calls: 13, Usec: 190}, "info": {Calls: 2, Usec: 99},
		"hset": {Calls: 6, Usec: 9}, "script|load": {Calls: 1, Usec: 4},
	}
	if cmds, usec := serverCost(before, after); cmds != 4 || usec != 94 {
		t.Errorf("serverCost = %d commands, %dµs; want 4 (3 EVALSHA + 1 SCRIPT LOAD), 94µs", cmds, usec)
	}
	samples := make([]time.Duration, 100)
	for i := range samples {
		samples[i] = time.Duration(i+1) * time.Microsecond
	}
	for _, tc := range []struct{ q, want float64 }{{0.5, 50}, {0.95, 95}, {0.99, 99}, {1, 100}, {0, 1}} {
		if got := quantile(samples, tc.q); got != tc.want {
			t.Errorf("quantile(1..100µs, %v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	for oneWay, want := range map[time.Duration]string{500 * time.Microsecond: "delay1ms", 5 * time.Millisecond: "delay10ms", 100 * time.Microsecond: "delay200us"} {
		if got := delayNetName(oneWay); got != want {
			t.Errorf("delayNetName(%v) = %q, want %q", oneWay, got, want)
		}
	}
}
