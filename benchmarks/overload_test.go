package benchmarks

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// BenchmarkOverload: 64 goroutines flood one channel (standard lane: its
// own bucket, 10/s, then the shared one, 1,000/s) at 20 times its shared
// limit (20,000 requests/s, paced), while one goroutine sends normal
// traffic over 100 other channels.
// Side by side on one server the benchmark owns: AllowOrdered, and
// AllowOrdered with WithDenialCache. It reports the flood's decisions/s, the server's
// CPU per script run, and p50/p99 of the normal traffic (b.N calls).
//
//	go test -run '^$' -bench Overload -count 6 .
func BenchmarkOverload(b *testing.B) {
	srv := testserver.Own(b)
	c := testserver.NewClient(b, srv)
	ctx := context.Background()
	// The flood's standard lane (10/s) refuses most of it at the first
	// bucket, with RetryAfter up to 100 ms: the case the cache is for.
	floodStd, floodShared := admit.MustSpec(admit.Every(100*time.Millisecond), 10), admit.MustSpec(admit.Every(time.Millisecond), 20)
	const floodRate, flooders = 20 * 1000, 64 // 20 × the shared limit
	period := time.Second * flooders / floodRate
	normal := admit.MustSpec(admit.Every(time.Millisecond), 1000)
	type decideFunc func(first admit.Request, second *admit.Request) (uint8, error)
	for _, impl := range []struct {
		name string
		make func() decideFunc
	}{
		{"current", func() decideFunc {
			l := admit.New(c)
			return func(first admit.Request, second *admit.Request) (uint8, error) {
				d, err := l.AllowOrdered(ctx, first, second)
				return d.Denied, err
			}
		}},
		{"current+denial-cache", func() decideFunc {
			l := admit.New(c, admit.WithDenialCache(1024))
			return func(first admit.Request, second *admit.Request) (uint8, error) {
				d, err := l.AllowOrdered(ctx, first, second)
				return d.Denied, err
			}
		}},
	} {
		b.Run("impl="+impl.name, func(b *testing.B) {
			decide := impl.make()
			p := testserver.Prefix(b, c)
			fStd, fShared := admit.Request{Key: p + "{flood}:std", Spec: floodStd}, admit.Request{Key: p + "{flood}:shared", Spec: floodShared}
			var channels [100][2]admit.Request
			for i := range channels {
				tag := "{chan:" + strconv.Itoa(i) + "}"
				channels[i] = [2]admit.Request{{Key: p + tag + ":std", Spec: normal}, {Key: p + tag + ":shared", Spec: normal}}
			}
			cpu0, stats0 := serverCPU(b, c), testserver.CommandStats(b, c)
			var flood atomic.Int64
			var failure atomic.Pointer[string]
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 64 {
				wg.Go(func() {
					next := time.Now()
					for {
						next = next.Add(period)
						select {
						case <-stop:
							return
						case <-time.After(time.Until(next)):
						}
						if _, err := decide(fStd, &fShared); err != nil {
							msg := err.Error()
							failure.CompareAndSwap(nil, &msg)
							return
						}
						flood.Add(1)
					}
				})
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				ch := channels[i%len(channels)]
				t0 := time.Now()
				if _, err := decide(ch[0], &ch[1]); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			elapsed := time.Since(start)
			b.StopTimer()
			close(stop)
			wg.Wait()
			if msg := failure.Load(); msg != nil {
				b.Fatal(*msg)
			}
			cpu1, stats1 := serverCPU(b, c), testserver.CommandStats(b, c)
			runs := stats1.ScriptCalls(stats0)
			slices.Sort(lat)
			b.ReportMetric(float64(flood.Load())/elapsed.Seconds(), "flood-decisions/s")
			b.ReportMetric(float64(runs)/elapsed.Seconds(), "server-scripts/s")
			if runs > 0 {
				b.ReportMetric((cpu1-cpu0)*1e6/float64(runs), "server-cpu-µs/script")
			}
			b.ReportMetric((cpu1-cpu0)*1e6/float64(flood.Load()+int64(len(lat))), "server-cpu-µs/decision")
			b.ReportMetric(quantile(lat, 0.50), "normal-p50-µs")
			b.ReportMetric(quantile(lat, 0.99), "normal-p99-µs")
		})
	}
}

// serverCPU is the server's used_cpu_sys + used_cpu_user, in seconds.
func serverCPU(tb testing.TB, c valkey.Client) float64 {
	tb.Helper()
	s, err := c.Do(context.Background(), c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		tb.Fatal(err)
	}
	f := testserver.InfoFields(s)
	sys, err1 := strconv.ParseFloat(f["used_cpu_sys"], 64)
	user, err2 := strconv.ParseFloat(f["used_cpu_user"], 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("INFO cpu: %v %v", err1, err2)
	}
	return sys + user
}
