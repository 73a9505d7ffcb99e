package admit_test

// Benchmarks of the public calls against a real server (internal/testserver's
// switch: VALKEY_SERVER, VALKEY_ADDR or valkey-server on PATH), with
// allocations and latency percentiles, beside a PING: the round trip every
// call pays, measured in the same run. Peer comparisons and server-time
// measurements live in the benchmarks module (BENCHMARKS.md).
//
//	VALKEY_SERVER=$(command -v valkey-server) go test -run '^$' -bench . -benchmem .

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// benchSpecs returns open, which never refuses within a run (its counts
// stay below 2^26, so a two-bucket admission replies with one integer),
// and shut, which refuses all but the first call. Built per benchmark, not
// at package level: a Spec that cannot be built fails the benchmark, not
// every test of the package.
func benchSpecs(b *testing.B) (open, shut admit.Spec) {
	b.Helper()
	open, err := admit.NewSpec(admit.Every(10*time.Microsecond), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	return open, admit.MustSpec(admit.Every(time.Hour), 1)
}

func BenchmarkPing(b *testing.B) {
	c, _ := benchClient(b)
	ctx := context.Background()
	cmd := c.B().Ping().Build().Pin()
	measure(b, func() error { return c.Do(ctx, cmd).Error() })
}

func BenchmarkAllowOrdered(b *testing.B) {
	benchOpen, benchShut := benchSpecs(b)
	for _, bc := range []struct {
		name          string
		first, second admit.Spec
		two           bool
	}{
		{"one-bucket/allowed", benchOpen, admit.Spec{}, false},
		{"one-bucket/denied", benchShut, admit.Spec{}, false},
		{"two-buckets/allowed", benchOpen, benchOpen, true},
		{"two-buckets/second-denied", benchOpen, benchShut, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, p := benchClient(b)
			l, ctx := admit.New(c), context.Background()
			first := admit.Request{Key: p + "{b}1", Spec: bc.first}
			var second *admit.Request
			if bc.two {
				second = &admit.Request{Key: p + "{b}2", Spec: bc.second}
			}
			measure(b, func() error { _, err := l.AllowOrdered(ctx, first, second); return err })
		})
	}
}

func BenchmarkAllowAll(b *testing.B) {
	benchOpen, benchShut := benchSpecs(b)
	for _, bc := range []struct {
		name   string
		second admit.Spec
	}{
		{"two-buckets/allowed", benchOpen},
		{"two-buckets/second-denied", benchShut},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, p := benchClient(b)
			l, ctx := admit.New(c), context.Background()
			first := admit.Request{Key: p + "{b}1", Spec: benchOpen}
			second := &admit.Request{Key: p + "{b}2", Spec: bc.second}
			measure(b, func() error { _, err := l.AllowAll(ctx, first, second); return err })
		})
	}
}

// BenchmarkAcquire: an Acquire and its Release, two round trips, with
// and without a bucket; refused: the one lease is held by another.
func BenchmarkAcquire(b *testing.B) {
	benchOpen, _ := benchSpecs(b)
	for _, bc := range []struct {
		name   string
		bucket bool
		held   bool
	}{
		{"lease-alone/granted+release", false, false},
		{"with-bucket/granted+release", true, false},
		{"lease-alone/refused", false, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, p := benchClient(b)
			l, ctx := admit.New(c), context.Background()
			req := admit.LeaseRequest{Key: p + "{l}conc", Spec: admit.MustConcurrency(1, time.Hour), Name: "job"}
			var first *admit.Request
			if bc.bucket {
				first = &admit.Request{Key: p + "{l}bucket", Spec: benchOpen}
			}
			if bc.held {
				if x, err := l.Acquire(ctx, admit.LeaseRequest{Key: req.Key, Spec: req.Spec, Name: "holder"}, nil, nil); err != nil || !x.Granted() {
					b.Fatalf("holder: %v, %v", x, err)
				}
			}
			measure(b, func() error {
				x, err := l.Acquire(ctx, req, first, nil)
				if err != nil || bc.held {
					return err
				}
				_, err = x.Release(ctx)
				return err
			})
		})
	}
}

// benchClient returns a client on the shared test server (skipped, or
// failed under ADMIT_REQUIRE_SERVER=1, without one) and a key prefix of
// the benchmark's own.
func benchClient(b *testing.B) (valkey.Client, string) {
	b.Helper()
	srv := testserver.Shared(b)
	c := testserver.NewClient(b, srv)
	return c, testserver.Prefix(b, c)
}

// measure runs op b.N times, failing on its first error, and reports the
// 50th, 99th and 99.9th latency percentiles in µs beside ns/op and the
// allocations (the latency record is allocated before the timer starts).
func measure(b *testing.B, op func() error) {
	b.Helper()
	b.ReportAllocs()
	if err := op(); err != nil { // warm: the script loaded, the keys made
		b.Fatal(err)
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range lat {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatalf("op %d: %v", i, err)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(lat)
	for _, q := range []float64{50, 99, 99.9} {
		i := min(len(lat)-1, int(float64(len(lat))*q/100))
		b.ReportMetric(float64(lat[i].Nanoseconds())/1e3, "p"+strconv.FormatFloat(q, 'f', -1, 64)+"-µs")
	}
}
