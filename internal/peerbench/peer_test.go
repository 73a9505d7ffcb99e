package peerbench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
)

// The load of each run of BenchmarkRedisRateSaturation: 50 goroutines, as
// valkey-benchmark's 50 connections in the root's BenchmarkScriptSaturation,
// each making peerCalls/peerGoroutines calls one after another.
const (
	peerGoroutines = 50
	peerCalls      = 50000
)

// BenchmarkRedisRateSaturation is issue 22's comparison with the peer: a
// one-bucket decision of admit beside go-redis/redis_rate v10's AllowN
// (GCRA, one key), each on one hot key of one server, the same rate and
// burst, driven by 50 goroutines through its own client. Before each run
// CONFIG RESETSTAT, after it INFO commandstats: usec_per_call of EVALSHA
// (both libraries send EVALSHA once the script is loaded), the script's
// own commands included, network and client excluded. Each loop iteration
// is one rep and the reps rotate which goes first; it reports each one's
// median µs per call and the median over the reps of each rep's own
// ratio admit/redis_rate.
//
// Neither client pipelines as valkey-benchmark -P 16 does: redis_rate has
// no batch call, and each goroutine waits for its decision. Each library
// runs with its client's defaults, as its users run it: go-redis keeps a
// pool of 10 connections per GOMAXPROCS, one command in flight on each;
// valkey-go pipelines concurrent commands on one connection. So that this
// difference can be told from the scripts', admit also runs on a second
// valkey-go client with DisableAutoPipelining (a connection per command in
// flight, as go-redis), reported as admit-pooled.
//
//	go test -run '^$' -bench . -benchtime 5x
//	VALKEY_SERVER=/opt/admit-servers/bin/valkey-server-9.1.2 go test -run '^$' -bench . -benchtime 5x
func BenchmarkRedisRateSaturation(b *testing.B) {
	srv := testserver.Own(b)
	if srv.TLS != nil {
		b.Skip("the go-redis client here dials without TLS")
	}
	b.Logf("server: %s", srv.Version)
	c := testserver.NewClient(b, srv)
	pooled, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, DisableAutoPipelining: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pooled.Close)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	peer := redis_rate.NewLimiter(rdb)

	paths := []struct {
		name  string
		spec  admit.Spec
		limit redis_rate.Limit
		allow bool
	}{
		// a million a second: never runs dry at the rates reached here,
		// and redis_rate's GCRA step (1µs) is well above its float
		// resolution, so it writes its key on every call
		{"allowed", admit.MustSpec(admit.MaxLimit, 1_000_000), redis_rate.PerSecond(1_000_000), true},
		{"denied", admit.MustSpec(admit.Every(time.Hour), 1), redis_rate.PerHour(1), false},
	}
	for _, p := range paths {
		b.Run("path="+p.name, func(b *testing.B) {
			prefix := testserver.Prefix(b, c)
			decide := func(lim *admit.Limiter, key string) func() error {
				return func() error {
					d, err := lim.AllowOrdered(ctx, admit.Request{Key: key, Spec: p.spec}, nil)
					if err == nil && d.Allowed() != p.allow {
						err = fmt.Errorf("admit: %v, want allowed %v", d, p.allow)
					}
					return err
				}
			}
			type run struct {
				name string
				call func() error
			}
			runs := []run{
				{"redis_rate", func() error {
					res, err := peer.AllowN(ctx, prefix+"redis_rate", p.limit, 1)
					if err == nil && (res.Allowed == 1) != p.allow {
						err = fmt.Errorf("redis_rate: allowed %d, want allowed %v", res.Allowed, p.allow)
					}
					return err
				}},
				{"admit", decide(admit.New(c), prefix+"admit")},
				{"admit-pooled", decide(admit.New(pooled), prefix+"admit-pooled")},
			}
			// Load the scripts and drain the shut buckets (the first call
			// takes their one token), then check the path, before timing.
			for _, r := range runs {
				r.call()
				if err := r.call(); err != nil {
					b.Fatal(err)
				}
			}
			usec := make([][]float64, len(runs)) // by library, a value a rep
			var ratio, pooledRatio []float64     // admit/redis_rate, a value a rep
			rep := 0
			for b.Loop() {
				for k := range runs {
					i := (k + rep) % len(runs)
					if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
						b.Fatal(err)
					}
					if err := drive(runs[i].call); err != nil {
						b.Fatalf("%s: %v", runs[i].name, err)
					}
					st := testserver.CommandStats(b, c)
					ev := st["evalsha"]
					if ev.Calls != peerCalls || ev.Failed != 0 || st["eval"].Calls != 0 {
						b.Fatalf("%s: %d EVALSHA counted (%d failed) and %d EVAL, want %d EVALSHA",
							runs[i].name, ev.Calls, ev.Failed, st["eval"].Calls, peerCalls)
					}
					usec[i] = append(usec[i], float64(ev.Usec)/float64(ev.Calls))
				}
				ratio = append(ratio, usec[1][rep]/usec[0][rep])
				pooledRatio = append(pooledRatio, usec[2][rep]/usec[0][rep])
				rep++
			}
			for i, r := range runs {
				b.ReportMetric(median(usec[i]), r.name+"-server-µs/call")
			}
			b.ReportMetric(median(ratio), "admit/redis_rate")
			b.ReportMetric(slices.Max(ratio), "admit/redis_rate-max")
			b.ReportMetric(median(pooledRatio), "admit-pooled/redis_rate")
		})
	}
}

// drive makes peerCalls calls of call from peerGoroutines goroutines, each
// making its share one after another, and returns the first error. A run
// stops at the first error, and after two minutes at most.
func drive(call func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, peerGoroutines)
	for g := range peerGoroutines {
		wg.Go(func() {
			for range peerCalls / peerGoroutines {
				if err := ctx.Err(); err != nil {
					if errors.Is(err, context.DeadlineExceeded) {
						errs[g] = fmt.Errorf("a run of %d calls took over two minutes", peerCalls)
					}
					return // or another goroutine failed: its error is the run's
				}
				if err := call(); err != nil {
					errs[g] = err
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
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
