package pause

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/internal/testenv"
)

// TestReconcileJitterBounds runs the reconciler on a clock of the test's
// own: each wait it asks for is recorded, and its timer fires only when
// the test says so (then one reconcile runs). With the jitter's draws
// forced to 0, ½, ¾ and the highest below 1, the waits are exactly
// 0.8 s, 1 s, 1.1 s and 1.2 s (the float product rounds up to it) of a
// 1 s ReconcileEvery; with the real random source, 300 waits all fall in
// [0.8 s, 1.2 s] and spread over most of it (the
// lowest under 0.85 s, the highest over 1.15 s: not a fixed interval).
func TestReconcileJitterBounds(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	const every = time.Second
	p := New(testenv.Client(t, srv.Addr), Config{Prefix: prefix, ReconcileEvery: every, NATS: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix)})
	type wait struct {
		d    time.Duration
		fire chan time.Time
	}
	waits := make(chan wait)
	p.timer = func(d time.Duration) (<-chan time.Time, func() bool) {
		w := wait{d, make(chan time.Time, 1)}
		waits <- w
		return w.fire, func() bool { return true }
	}
	forced := []float64{0, 0.5, 0.75, math.Nextafter(1, 0)}
	draws := 0
	p.draw = func() float64 { // the loop's goroutine alone calls it
		draws++
		if draws <= len(forced) {
			return forced[draws-1]
		}
		return rand.Float64()
	}
	t.Cleanup(func() {
		go func() { // Close's cancel may find the loop asking for its next wait
			for range waits {
			}
		}()
		p.Close()
		close(waits)
	})
	if err := p.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	next := func() time.Duration {
		t.Helper()
		select {
		case w := <-waits:
			before := p.Stats().Reconciles
			w.fire <- time.Time{}
			if !testenv.WaitFor(func() bool { return p.Stats().Reconciles == before+1 }) {
				t.Fatalf("the timer fired, yet no reconcile: %+v", p.Stats())
			}
			return w.d
		case <-time.After(10 * time.Second):
			t.Fatal("the reconciler asked for no wait")
			return 0
		}
	}
	for i, want := range []time.Duration{800 * time.Millisecond, time.Second, 1100 * time.Millisecond, 1200 * time.Millisecond} {
		if d := next(); d != want {
			t.Errorf("wait %d with draw %v: %v, want %v", i, forced[i], d, want)
		}
	}
	lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
	for range 300 {
		d := next()
		if d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("wait %v outside [0.8 s, 1.2 s]", d)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo >= 850*time.Millisecond || hi <= 1150*time.Millisecond {
		t.Errorf("300 waits between %v and %v; want them spread over [0.8 s, 1.2 s] (the lowest under 0.85 s, the highest over 1.15 s)", lo, hi)
	}
	if got := (Config{ReconcileEvery: every, Timeout: time.Second}).LongestGap(); got != 2200*time.Millisecond {
		t.Errorf("LongestGap %v, want 2.2 s: the longest wait (1.2 s) and the reconcile's timeout", got)
	}
}
