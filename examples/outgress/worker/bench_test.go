package worker

import (
	"context"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/pause"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

// benchDelay is the one-way delay the proxy adds: ADMIT_BENCH_DELAY (a Go
// duration), else 500µs, a 1ms round trip.
func benchDelay(b *testing.B) time.Duration {
	b.Helper()
	s := os.Getenv("ADMIT_BENCH_DELAY")
	if s == "" {
		return 500 * time.Microsecond
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		b.Fatalf("ADMIT_BENCH_DELAY=%q: want a duration such as 500us", s)
	}
	return d
}

// benchLimits admit every request, so both shapes always pay all their
// round trips (a denial would skip the old shape's second script).
var benchLimits = func() limits.Limits {
	huge := admit.MustSpec(admit.MaxLimit, 1<<30)
	return limits.Limits{ChatShared: huge, ChatStandard: huge, ChatModShared: huge, ChatModStandard: huge,
		HelixGeneral: huge, HelixStandard: huge, HelixSystem: huge}
}()

// BenchmarkPreHTTP times the worker's path before the third-party call
// against a real server behind a delay proxy, with a warm channel cache
// (cache=warm) and with one that loads the channel for every message
// (cache=cold, one HGETALL more):
//
//	shape=old  pause GET + one script per bucket, in sequence (Worker.LegacyPrepare)
//	shape=new  atomic pause snapshot + one script (Worker.Prepare)
//
// It reports the p50, p95 and p99 of one call, the Valkey round trips per call
// and the server's time per script run (INFO commandstats: the new shape's
// script is AllowOrderedOnce's, which also reads and writes the id's
// record). Run it with:
//
//	cd examples/outgress && go test -run '^$' -bench PreHTTP -benchtime 2000x -benchmem -memprofile prehttp.mem.pprof ./worker
//
// and read the allocation profile with go tool pprof -sample_index=alloc_space.
func BenchmarkPreHTTP(b *testing.B) {
	srv := testenv.Shared(b)
	delay := benchDelay(b)
	proxy, err := testenv.StartDelayProxy(srv.Addr, delay)
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.Close()
	direct := testenv.Client(b, srv.Addr)
	prefix := testenv.Prefix(b)
	ctx := context.Background()
	if err := direct.Do(ctx, direct.B().Hset().Key(channels.Key(prefix, "1001")).FieldValue().FieldValue("login", "c").FieldValue("bot_mod", "0").Build()).Error(); err != nil {
		b.Fatal(err)
	}
	raw, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{proxy.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	c := &counting.Client{Client: raw}
	// No reconcile during the run, and no failing closed however long it is.
	p := pause.New(c, pause.Config{Prefix: prefix, ReconcileEvery: time.Hour, MaxAge: 24 * time.Hour,
		NATS: testenv.NATSConn(b), Subject: testenv.PauseSubject(prefix)})
	defer p.Close()
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	fake := helix.StartFake()
	defer fake.Close()
	m := metrics.New()
	hx, err := helix.New(helix.Config{BaseURL: fake.URL, ClientID: "bench", Token: "bench", BotID: botID}, m)
	if err != nil {
		b.Fatal(err)
	}
	newWorker := func(ttl time.Duration, retryUnknown bool) *Worker {
		return New(admit.New(c), p, channels.New(c, channels.Config{Prefix: prefix, TTL: ttl}), hx, m,
			Config{Prefix: prefix, Limits: &benchLimits, RetryOutcomeUnknown: retryUnknown})
	}
	data := []byte(chat("1001"))

	for _, cache := range []string{"warm", "cold"} {
		// Cold: a channel cache whose entries expire at once, so every
		// message loads its channel (one HGETALL more).
		ttl := time.Duration(0)
		if cache == "cold" {
			ttl = time.Nanosecond
		}
		w, once := newWorker(ttl, false), newWorker(ttl, true)
		legacy := func(ctx context.Context, lane limits.Lane, m *bus.Message) (*http.Request, Path, error) {
			return w.LegacyPrepare(ctx, lane, m)
		}
		for _, lane := range []limits.Lane{limits.LaneStandard, limits.LanePremium} {
			for _, shape := range []struct {
				name    string
				prepare func(context.Context, limits.Lane, *bus.Message) (*http.Request, Path, error)
			}{{"old", legacy}, {"new", w.Prepare}, {"new-id-record", once.Prepare}} {
				warm := cache == "warm"
				b.Run("cache="+cache+"/lane="+lane.String()+"/shape="+shape.name, func(b *testing.B) {
					m := &bus.Message{Data: data, Stream: "BENCH", Attempt: 1}
					call := func(warm bool) time.Duration {
						m.Seq++ // a new message: a decision under a new id
						m.Published = time.Now()
						t0 := time.Now()
						_, path, err := shape.prepare(ctx, lane, m)
						d := time.Since(t0)
						if err != nil || !path.Admitted || (warm && path.Cache != channels.CacheHit) {
							b.Fatalf("path %+v, err %v: want admitted (on a warm cache: %v)", path, err, warm)
						}
						return d
					}
					call(false) // warms the channel cache (when it keeps entries), script cache and connection
					lat := make([]time.Duration, 0, b.N)
					_, rt0 := c.Totals()
					st0 := testenv.CommandStats(b, direct)
					b.ReportAllocs()
					b.ResetTimer()
					for range b.N {
						lat = append(lat, call(warm))
					}
					b.StopTimer()
					_, rt1 := c.Totals()
					st1 := testenv.CommandStats(b, direct)
					if calls := st1["evalsha"].Calls - st0["evalsha"].Calls; calls > 0 {
						// The server's own time per script run, TIME to reply.
						b.ReportMetric(float64(st1["evalsha"].Usec-st0["evalsha"].Usec)/float64(calls), "server-µs/script")
					}
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
					b.ReportMetric(float64(lat[(len(lat)*95)/100].Microseconds()), "p95-µs")
					b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds()), "p99-µs")
					b.ReportMetric(float64(rt1-rt0)/float64(b.N), "valkey-rtt/op")
				})
			}
		}
	}
}
