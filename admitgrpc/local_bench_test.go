package admitgrpc_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"golang.org/x/time/rate"
)

// BenchmarkLocalVsRate sets admit.Local beside golang.org/x/time/rate's
// Limiter, the in-process limiter Go users know, per decision: one bucket
// (rate.Limiter.Allow against Local.AllowOrdered with a nil second), and
// the ordered pair (two rate.Limiters, the second asked only when the first
// allows, without all-or-nothing: rate has no way to undo the first; against
// Local.AllowAll). Buckets never run dry (a huge burst), so every decision
// is an admission. "keys" is how many distinct keys the calls spread over:
// rate needs a map of its own to find a key's Limiter, which the rows with
// keys > 1 include (a map lookup, as a server keyed by user would).
// This benchmark lives in a nested module so that the root module never
// requires golang.org/x/time.
func BenchmarkLocalVsRate(b *testing.B) {
	ctx := context.Background()
	spec := admit.MustSpec(admit.Every(time.Microsecond), 1<<30)
	for _, keys := range []int{1, 10000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = "rl:{u" + strconv.Itoa(i) + "}:standard"
		}
		b.Run("impl=local/buckets=1/keys="+strconv.Itoa(keys), func(b *testing.B) {
			l, _ := admit.NewLocal(2 * keys)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				d, err := l.AllowOrdered(ctx, admit.Request{Key: names[i%keys], Spec: spec}, nil)
				if err != nil || !d.Allowed() {
					b.Fatal(d, err)
				}
				i++
			}
		})
		b.Run("impl=rate/buckets=1/keys="+strconv.Itoa(keys), func(b *testing.B) {
			lims := map[string]*rate.Limiter{}
			for _, n := range names {
				lims[n] = rate.NewLimiter(1e6, 1<<30)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if !lims[names[i%keys]].Allow() {
					b.Fatal("denied")
				}
				i++
			}
		})
		b.Run("impl=local/buckets=2/keys="+strconv.Itoa(keys), func(b *testing.B) {
			l, _ := admit.NewLocal(2*keys + 1)
			shared := admit.Request{Key: "rl:shared", Spec: spec}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				d, err := l.AllowAll(ctx, admit.Request{Key: names[i%keys], Spec: spec}, &shared)
				if err != nil || !d.Allowed() {
					b.Fatal(d, err)
				}
				i++
			}
		})
		b.Run("impl=rate/buckets=2/keys="+strconv.Itoa(keys), func(b *testing.B) {
			lims := map[string]*rate.Limiter{}
			for _, n := range names {
				lims[n] = rate.NewLimiter(1e6, 1<<30)
			}
			shared := rate.NewLimiter(1e6, 1<<30)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if !lims[names[i%keys]].Allow() || !shared.Allow() {
					b.Fatal("denied")
				}
				i++
			}
		})
	}
	b.Run("impl=local/buckets=1/keys=1/parallel", func(b *testing.B) {
		l, _ := admit.NewLocal(2)
		r := admit.Request{Key: "k", Spec: spec}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if d, err := l.AllowOrdered(ctx, r, nil); err != nil || !d.Allowed() {
					b.Fatal(d, err)
				}
			}
		})
	})
	b.Run("impl=rate/buckets=1/keys=1/parallel", func(b *testing.B) {
		lim := rate.NewLimiter(1e6, 1<<30)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !lim.Allow() {
					b.Fatal("denied")
				}
			}
		})
	})
}
