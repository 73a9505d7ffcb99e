package admit

import (
	"strconv"
	"testing"
	"time"
)

// TestServerClockFarFromHost: on a server whose clock is decades from the
// host's, before and after it, refill follows the server clock to the
// microsecond and the stored ts is in server µs. (admittest's
// host-clock-plays-no-part checks on a real server that no time goes on the
// wire.)
func TestServerClockFarFromHost(t *testing.T) {
	for _, epoch := range []time.Time{unitEpoch, time.Date(1999, 12, 31, 23, 59, 59, 999_999_000, time.UTC)} {
		e := newUnitEnv(t)
		e.now = epoch
		e.srv.SetTime(epoch)
		r := Request{Key: "clock", Spec: MustSpec(Every(time.Second), 2)}
		for i, st := range []struct {
			advance time.Duration
			want    Decision
		}{
			{0, Decision{Remaining: [2]int{1, -1}, decided: true}},
			{0, Decision{Remaining: [2]int{0, -1}, decided: true}},
			{0, Decision{Denied: 1, RetryAfter: time.Second, Remaining: [2]int{0, -1}, decided: true}},
			{999_999 * time.Microsecond, Decision{Denied: 1, RetryAfter: time.Microsecond, Remaining: [2]int{0, -1}, decided: true}},
			{time.Microsecond, Decision{Remaining: [2]int{0, -1}, decided: true}},
		} {
			e.advance(st.advance)
			if d := e.allow(t, r, nil); d != st.want {
				t.Errorf("server clock at %v, step %d: got %v, want %v", epoch, i, d, st.want)
			}
		}
		if tk, ts := e.state(r.Key); tk != "0" || ts != strconv.FormatInt(epoch.Add(time.Second).UnixMicro(), 10) {
			t.Errorf("server clock at %v: stored tokens %q ts %q, want 0 and %d (server µs)", epoch, tk, ts, epoch.Add(time.Second).UnixMicro())
		}
	}
}
