package integration

import (
	"context"
	"fmt"
	"github.com/admitkit/admit"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationClockStepBounded steps a real server's clock (an
// LD_PRELOAD shim shifts its TIME): a step back freezes a bucket for at
// most one full refill, and the test counts what a clock flapping back and
// forth over-admits with that bound; for a bucket alone and for the second
// bucket of a call (whose first never runs dry), since the script reads
// each bucket in lines of its own. (Before the fix, the wait after a 24 h
// step back was 24 h.)
func TestIntegrationClockStepBounded(t *testing.T) {
	srv, clock := testserver.StartClockShifted(t)
	c := testserver.NewClient(t, srv)
	l := admit.New(c)
	ctx := context.Background()
	spec := admit.MustSpec(admit.Every(time.Hour), 3) // full refill 3 h; real time in this test earns nothing
	p := testserver.Prefix(t, c)
	for _, bucket := range []int{1, 2} {
		t.Run(fmt.Sprintf("bucket %d", bucket), func(t *testing.T) {
			// The first bucket of a bucket-2 call: a burst no test here drains.
			open := admit.Request{Key: p + "open", Spec: admit.MustSpec(admit.Every(time.Second), 1_000_000)}
			drain := func(r admit.Request) (admitted int, last admit.Decision) {
				t.Helper()
				for range spec.Burst() + 1 { // bounded: a bucket holds at most Burst
					var d admit.Decision
					var err error
					if bucket == 1 {
						d, err = l.AllowOrdered(ctx, r, nil)
					} else {
						d, err = l.AllowOrdered(ctx, open, &r)
					}
					if err != nil {
						t.Fatalf("%s: %v", r.Key, err)
					}
					if !d.Allowed() {
						if int(d.Denied) != bucket {
							t.Fatalf("%s: %v, want denied by bucket %d", r.Key, d, bucket)
						}
						return admitted, d
					}
					admitted++
				}
				t.Fatalf("%s admitted more than its burst at one clock reading", r.Key)
				return
			}

			r := admit.Request{Key: fmt.Sprintf("%sstep:%d", p, bucket), Spec: spec}
			clock.Set(t, 24*time.Hour)
			drain(r)
			clock.Set(t, 0)
			if n, d := drain(r); n != 0 || d.RetryAfter != 3*time.Hour {
				t.Errorf("after a 24 h step back: admitted %d, then %v; want 0, then denied with RetryAfter exactly one full refill (3h)", n, d)
			}

			// Flapping: K back-and-forth cycles of delta. With the bound, each cycle
			// whose step back exceeds (burst-1) intervals admits one more burst on
			// the way forward; a smaller flap admits nothing extra.
			const cycles = 5
			for _, tc := range []struct {
				delta time.Duration
				want  int // admitted over the whole flapping, first reading included
			}{
				{24 * time.Hour, 3 + cycles*3}, // unbounded freeze: 3 + 3 (the first forward step only)
				{2 * time.Hour, 3 + 2},         // (burst-1) intervals: the same as an unbounded freeze
			} {
				clock.Set(t, 0)
				r := admit.Request{Key: fmt.Sprintf("%sflap:%d:%v", p, bucket, tc.delta), Spec: spec}
				total, _ := drain(r)
				for range cycles {
					clock.Set(t, tc.delta)
					n, _ := drain(r)
					total += n
					clock.Set(t, 0)
					n, _ = drain(r)
					total += n
				}
				if total != tc.want {
					t.Errorf("flapping by %v, %d cycles: admitted %d, want %d", tc.delta, cycles, total, tc.want)
				}
				t.Logf("flapping by %v, %d cycles, burst 3, interval 1h: %d admitted (%d over one burst)", tc.delta, cycles, total, total-3)
			}
			clock.Set(t, 0)
		})
	}
}

// keysState is every key's DUMP and PTTL, to compare byte for byte.
func keysState(t *testing.T, c valkey.Client, keys ...string) string {
	t.Helper()
	var b strings.Builder
	for _, k := range keys {
		dump, err := c.Do(context.Background(), c.B().Dump().Key(k).Build()).ToString()
		if err != nil && !valkey.IsValkeyNil(err) {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		pttl, err := c.Do(context.Background(), c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		if pttl > 0 {
			pttl = 1 // present with an expiry; the exact ms left moves with time
		}
		b.WriteString(k + "=" + strings.ToValidUTF8(dump, "?") + " pttl=" + time.Duration(pttl).String() + "; ")
	}
	return b.String()
}
