package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/valkey-io/valkey-go"
)

// The load of each run of BenchmarkRedisRateSaturation: 50 goroutines, as
// valkey-benchmark's 50 connections in BenchmarkScriptServerTime's
// saturation load, each making peerCalls/peerGoroutines calls one after
// another.
const (
	peerGoroutines = 50
	peerCalls      = 50000
)

// BenchmarkRedisRateSaturation compares admit with the most-used peer: a
// one-bucket decision of admit beside go-redis/redis_rate v10's AllowN
// (GCRA, one key), each on one hot key of one server, the same rate and
// burst, driven by 50 goroutines through its own client, and measured by
// serverTime as BenchmarkScriptServerTime's scripts are (both libraries
// send EVALSHA once the script is loaded). It reports each one's median µs
// per call and the median over the reps of each rep's own ratio
// admit/redis_rate.
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
//	go test -run '^$' -bench RedisRateSaturation -benchtime 5x
//	VALKEY_SERVER=/path/to/valkey-server go test -run '^$' -bench RedisRateSaturation -benchtime 5x
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
			// Each contender's check is one decision; its run, peerCalls
			// of them.
			cs := []contender{
				{name: "redis_rate", check: func() error {
					res, err := peer.AllowN(ctx, prefix+"redis_rate", p.limit, 1)
					if err == nil && (res.Allowed == 1) != p.allow {
						err = fmt.Errorf("redis_rate: allowed %d, want allowed %v", res.Allowed, p.allow)
					}
					return err
				}},
				{name: "admit", check: decide(admit.New(c), prefix+"admit")},
				{name: "admit-pooled", check: decide(admit.New(pooled), prefix+"admit-pooled")},
			}
			for i := range cs {
				call := cs[i].check
				cs[i].run = func() error { return drive(call) }
			}
			usec := serverTime(b, c, peerCalls, cs, nil)
			reportRatio(b, "admit/redis_rate", usec[1], usec[0], true)
			reportRatio(b, "admit-pooled/redis_rate", usec[2], usec[0], false)
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
