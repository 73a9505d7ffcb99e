package admit

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
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

// waitUntil polls cond every millisecond, for 10 s at most.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 10 s", what)
		}
	}
}

// lineState is the number of Waits in l's line for key and whether its
// head has recorded a denial.
func lineState(l *Limiter, key waitKey) (waiters int, denied bool) {
	l.waits.mu.Lock()
	defer l.waits.mu.Unlock()
	if line := l.waits.lines[key]; line != nil {
		return line.waiters, line.denial.ok
	}
	return 0, false
}

// TestWaitLine: the Waits of one Limiter on the same keys poll the server
// one at a time: a script that denies every other call (1 ms) and logs
// each call's Cost sees each Wait's two attempts side by side, 16 calls for
// 8 Waits, and the line is gone once they return. (Without the line the
// Waits raced and their attempts interleaved.)
func TestWaitLine(t *testing.T) {
	e := newUnitEnvScript(t, "redis.call('RPUSH', 'log', ARGV[3]) if redis.call('INCR', 'calls') % 2 == 1 then return '1 1000 0 -1' end return '0 0 0 -1'")
	spec := MustSpec(Every(time.Second), 8)
	const waiters = 8
	var wg sync.WaitGroup
	errs := make([]error, waiters)
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := e.l.Wait(context.Background(), Request{Key: "w", Spec: spec, Cost: i + 1}, nil)
			if err == nil && !d.Allowed() {
				err = errors.New("not admitted: " + d.String())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Wait %d: %v", i, err)
		}
	}
	log, err := e.srv.List("log")
	if err != nil {
		t.Fatal(err)
	}
	paired := len(log) == 2*waiters
	for i := 0; paired && i < len(log); i += 2 {
		paired = log[i] == log[i+1]
	}
	if !paired {
		t.Errorf("the costs of the calls, in order: %q; want %d calls, each Wait's two side by side", log, 2*waiters)
	}
	if n := e.l.waits.len(); n != 0 {
		t.Errorf("%d lines left after every Wait returned, want 0", n)
	}
}

// TestWaitQueued: a Wait queued behind the head of its line sends nothing.
// When its deadline comes before the token of the head's last denial of
// the same requests, it returns at once with that denial, ErrNotExecuted
// and DeadlineExceeded, whether that denial came before or after it
// queued; otherwise it returns its context's error when the context ends.
// Bad input is refused at once, not after the line. The line is gone once
// every Wait has returned.
func TestWaitQueued(t *testing.T) {
	// Every call is denied by bucket 1 with the RetryAfter (µs) in key ra.
	e := newUnitEnvScript(t, "redis.call('INCR', 'calls') return '1 ' .. (redis.call('GET', 'ra') or '1000') .. ' 0 -1'")
	spec := MustSpec(Every(time.Second), 8)
	r := Request{Key: "w", Spec: spec}
	key := waitKey{first: "w"}
	calls := func() string { s, _ := e.srv.Get("calls"); return s }
	// The head: no deadline, cancelled at the end.
	startHead := func(ra string) (cancel func()) {
		t.Helper()
		if err := e.srv.Set("ra", ra); err != nil {
			t.Fatal(err)
		}
		ctx, cancelCtx := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := e.l.Wait(ctx, r, nil); done <- err }()
		waitUntil(t, "the head's denial recorded", func() bool { _, denied := lineState(e.l, key); return denied })
		return func() {
			cancelCtx()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("the head: %v, want context.Canceled", err)
			}
		}
	}

	t.Run("deadline before the head's token: at once", func(t *testing.T) {
		stop := startHead("3600000000") // 1 h
		before := calls()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := e.l.Wait(ctx, r, nil)
		if !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil ||
			d.Denied != 1 || d.RetryAfter <= time.Hour-10*time.Second || d.RetryAfter > time.Hour || !strings.Contains(err.Error(), "this Wait sent nothing") {
			t.Errorf("got %v, %v (ctx %v); want the head's 1 h denial, ErrNotExecuted and DeadlineExceeded before the deadline, saying it sent nothing", d, err, ctx.Err())
		}
		if got := calls(); got != before {
			t.Errorf("calls %s, then %s: the queued Wait sent something", before, got)
		}
		stop()
	})
	t.Run("another Cost: queued until its context ends", func(t *testing.T) {
		stop := startHead("3600000000")
		before := calls()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		d, err := e.l.Wait(ctx, Request{Key: "w", Spec: spec, Cost: 2}, nil)
		if !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() == nil || d.Allowed() ||
			!strings.Contains(err.Error(), "queued") {
			t.Errorf("got %v, %v (ctx %v); want ErrNotExecuted and the context's DeadlineExceeded, once it ended, saying it was queued", d, err, ctx.Err())
		}
		if got := calls(); got != before {
			t.Errorf("calls %s, then %s: the queued Wait sent something", before, got)
		}
		stop()
	})
	t.Run("cancelled while queued", func(t *testing.T) {
		stop := startHead("3600000000")
		before := calls()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := e.l.Wait(ctx, r, nil); done <- err }()
		waitUntil(t, "two Waits in the line", func() bool { n, _ := lineState(e.l, key); return n == 2 })
		cancel()
		if err := <-done; !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "queued") {
			t.Errorf("got %v; want ErrNotExecuted and context.Canceled, saying it was queued", err)
		}
		if got := calls(); got != before {
			t.Errorf("calls %s, then %s: the queued Wait sent something", before, got)
		}
		stop()
	})
	t.Run("the head's next denial moves the token past the deadline", func(t *testing.T) {
		stop := startHead("1000") // the head polls every millisecond or so
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := e.l.Wait(ctx, r, nil); done <- err }()
		waitUntil(t, "two Waits in the line", func() bool { n, _ := lineState(e.l, key); return n == 2 })
		if err := e.srv.Set("ra", "3600000000"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || !strings.Contains(err.Error(), "this Wait sent nothing") {
			t.Errorf("got %v (ctx %v); want ErrNotExecuted and DeadlineExceeded before the deadline, saying it sent nothing", err, ctx.Err())
		}
		stop()
	})
	t.Run("bad input: refused at once", func(t *testing.T) {
		stop := startHead("3600000000")
		before := calls()
		_, err := e.l.Wait(context.Background(), Request{Key: "w", Spec: spec, Cost: 9}, nil)
		if !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Cost above burst behind a head: %v, want ErrInvalidRequest at once", err)
		}
		if got := calls(); got != before {
			t.Errorf("calls %s, then %s", before, got)
		}
		stop()
	})
	if n := e.l.waits.len(); n != 0 {
		t.Errorf("%d lines left after every Wait returned, want 0", n)
	}
}
