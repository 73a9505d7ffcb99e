package admit

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"
)

// TestWait: Wait sleeps until admitted; returns at once, having sent one
// attempt, when the token cannot come before the deadline; and never
// repeats an attempt whose outcome is unknown.
func TestWait(t *testing.T) {
	t.Run("deadline before the token: at once, one attempt", func(t *testing.T) {
		e := newUnitEnv(t)
		r := Request{Key: "w", Spec: MustSpec(Every(time.Hour), 1)}
		e.allow(t, r, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rec := &recordingClient{Client: e.c}
		d, err := New(rec).Wait(ctx, r, nil)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotExecuted) || d.Denied != 1 || d.RetryAfter != time.Hour || ctx.Err() != nil {
			t.Errorf("got %v, %v (ctx %v); want the 1h denial, DeadlineExceeded and ErrNotExecuted before the deadline", d, err, ctx.Err())
		}
		if len(rec.cmds) != 1 {
			t.Errorf("%d commands sent, want 1 attempt: %q", len(rec.cmds), rec.cmds)
		}
	})
	t.Run("cancelled while sleeping", func(t *testing.T) {
		e := newUnitEnv(t)
		r := Request{Key: "w", Spec: MustSpec(Every(time.Hour), 1)}
		e.allow(t, r, nil)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(20 * time.Millisecond); cancel() }()
		d, err := e.l.Wait(ctx, r, nil)
		if !errors.Is(err, context.Canceled) || d.Allowed() {
			t.Errorf("got %v, %v; want context.Canceled", d, err)
		}
	})
	t.Run("outcome unknown is not repeated", func(t *testing.T) {
		e := newUnitEnvScript(t, "return 'garbage'")
		rec := &recordingClient{Client: e.c}
		d, err := newLimiter(rec, e.l.script).Wait(context.Background(), Request{Key: "w", Spec: perSecond3}, nil)
		if !errors.Is(err, ErrOutcomeUnknown) || d.Allowed() {
			t.Errorf("got %v, %v; want ErrOutcomeUnknown", d, err)
		}
		if len(rec.cmds) != 2 || rec.cmds[0][0] != "EVALSHA" || rec.cmds[1][0] != "EVAL" { // EVAL after NOSCRIPT
			t.Errorf("commands sent: %q; want one attempt (EVALSHA, then EVAL after NOSCRIPT)", rec.cmds)
		}
	})
	t.Run("admitted after sleeping", func(t *testing.T) {
		// miniredis's clock does not move by itself: a script that denies
		// once with a 1 ms wait, then admits.
		e := newUnitEnvScript(t, "if redis.call('INCR', 'calls') == 1 then return '1 1000 0 -1' end return '0 0 0 -1'")
		d, err := e.l.Wait(context.Background(), Request{Key: "w", Spec: perSecond3}, nil)
		if calls, _ := e.srv.Get("calls"); err != nil || !d.Allowed() || calls != "2" {
			t.Errorf("got %v, %v after %s attempts; want allowed at the second", d, err, calls)
		}
	})
}

// TestWaitRefundsAfterSecondDenial: an attempt the second bucket refuses
// charges the first bucket (the ordered transitions); Wait gives that charge
// back before it sleeps or gives up, so only the admitted attempt costs
// anything. (Before the fix, each refused attempt left the first bucket
// charged, and the deadline error still said nothing was taken.)
func TestWaitRefundsAfterSecondDenial(t *testing.T) {
	e := newUnitEnv(t)
	spec := MustSpec(Every(time.Hour), 1)
	first, second := Request{Key: "w:{x}:a", Spec: spec}, Request{Key: "w:{x}:b", Spec: spec}
	e.allow(t, second, nil) // the second bucket is empty for an hour
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := e.l.Wait(ctx, first, &second)
	if d.Denied != 2 || !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, %v; want the second bucket's denial, ErrNotExecuted and DeadlineExceeded", d, err)
	}
	if tk, _ := e.state(first.Key); tk != "1" {
		t.Errorf("first bucket holds %q tokens after Wait gave up, want 1: its charge must be refunded", tk)
	}
}

// TestWaitSleep: the sleep after a denial is never shorter than
// RetryAfter, its jitter is at most 10% of RetryAfter, and when the token
// comes before the deadline the jitter takes at most a quarter of the slack
// between them, so that the attempt is made before the deadline. Every
// RetryAfter and time to the deadline up to 1,000 and 1,200 (in ns; the
// function has no unit), and the extremes, with the lowest and the highest
// draw. (Before the fix the jitter ignored the deadline: with a token 8 ms
// before the deadline and RetryAfter 200 ms, it slept up to 12 ms past it.)
func TestWaitSleep(t *testing.T) {
	type draw struct {
		name string
		pick func(n time.Duration) time.Duration
	}
	draws := []draw{{"lowest", func(time.Duration) time.Duration { return 0 }}, {"highest", func(n time.Duration) time.Duration { return n - 1 }}}
	var failures int
	check := func(ra, ud time.Duration) {
		for _, dr := range draws {
			calls, badN := 0, time.Duration(0)
			got := waitSleep(ra, ud, func(n time.Duration) time.Duration {
				calls++
				if n < 1 {
					badN = n
					return 0
				}
				return dr.pick(n)
			})
			var problem string
			jitter := got - ra
			switch {
			case calls > 1 || badN != 0:
				problem = "rnd called " + strconv.Itoa(calls) + " times, with n " + badN.String() + " (rand.N panics for n < 1)"
			case got < ra:
				problem = "sleeps less than RetryAfter"
			case jitter > ra/10:
				problem = "jitter above 10% of RetryAfter"
			case ud != noDeadline && ud >= ra && jitter > (ud-ra)/4:
				problem = "jitter above a quarter of the slack between the token and the deadline"
			case dr.name == "highest" && (ud == noDeadline || (ud-ra)/4 >= ra/10) && ra <= math.MaxInt64-ra/10 && jitter != ra/10:
				problem = "the highest draw, far from the deadline, is not 10% of RetryAfter"
			}
			if problem != "" {
				if failures++; failures <= 10 {
					t.Errorf("waitSleep(%d, %d, %s) = %d: %s", ra, ud, dr.name, got, problem)
				}
			}
		}
	}
	for ra := time.Duration(0); ra <= 1000; ra++ {
		for ud := time.Duration(0); ud <= 1200; ud++ {
			check(ra, ud)
		}
		check(ra, noDeadline)
	}
	for _, ra := range []time.Duration{time.Second, 200 * time.Millisecond, time.Hour, math.MaxInt64 / 11 * 10, math.MaxInt64 - 1, math.MaxInt64} {
		for _, ud := range []time.Duration{0, ra - 1, ra, ra + 1, ra + 8*time.Millisecond, 2 * ra, math.MaxInt64 - 1, noDeadline} {
			if ud >= 0 {
				check(ra, ud)
			}
		}
	}
	if failures > 10 {
		t.Errorf("... and %d more", failures-10)
	}
}
