package admit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationClockStepBounded steps a real server's clock (an
// LD_PRELOAD shim shifts its TIME): a step back freezes a bucket for at
// most one full refill, and the test counts what a clock flapping back and
// forth over-admits with that bound. (Before the fix, the wait after a
// 24 h step back was 24 h.)
func TestIntegrationClockStepBounded(t *testing.T) {
	srv, clock := testserver.StartClockShifted(t)
	c := testserver.NewClient(t, srv)
	l := New(c)
	ctx := context.Background()
	spec := MustSpec(Every(time.Hour), 3) // full refill 3 h; real time in this test earns nothing
	p := testserver.Prefix(t, c)

	drain := func(r Request) (admitted int, last Decision) {
		t.Helper()
		for range spec.Burst() + 1 { // bounded: a bucket holds at most Burst
			d, err := l.AllowOrdered(ctx, r, nil)
			if err != nil {
				t.Fatalf("%s: %v", r.Key, err)
			}
			if !d.Allowed() {
				return admitted, d
			}
			admitted++
		}
		t.Fatalf("%s admitted more than its burst at one clock reading", r.Key)
		return
	}

	r := Request{Key: p + "step", Spec: spec}
	clock.Set(t, 24*time.Hour)
	drain(r)
	clock.Set(t, 0)
	if n, d := drain(r); n != 0 || d.Denied != 1 || d.RetryAfter != 3*time.Hour {
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
		r := Request{Key: p + "flap:" + tc.delta.String(), Spec: spec}
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
