package admit

import (
	"context"
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
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
// anything. The error then says what happened: two scripts ran, the first
// bucket's charge was refunded (capped at its burst) and its key written,
// no token stays taken. Class ErrNotExecuted (a retry is safe). Checked
// exactly: the commands sent, the error's text and class, the first
// bucket's fields (as they were, the part-token kept in ts) and its new
// expiry, the second bucket untouched. (Before the fix, each refused
// attempt left the first bucket charged; then the error still read as if
// nothing had run: "admit: Wait: bucket 2 holds the request's Cost only in
// 1h0m0s, after the context's deadline (in 1s): context deadline
// exceeded".)
func TestWaitRefundsAfterSecondDenial(t *testing.T) {
	const wrote = "; 2 scripts ran: the attempt charged the first bucket its Cost before the second bucket refused, " +
		"and a refund gave it back, capped at the first bucket's burst; the first bucket's key was written, " +
		"but no token stays taken, so a retry is safe"
	setup := func(t *testing.T) (e *unitEnv, rec *lockedRecorder, l *Limiter, first, second Request, secondDump string) {
		e = newUnitEnv(t)
		first = Request{Key: "w:{x}:a", Spec: MustSpec(Every(time.Second), 5), Cost: 2}
		second = Request{Key: "w:{x}:b", Spec: MustSpec(Every(time.Hour), 1)}
		e.allow(t, second, nil) // the second bucket is empty for an hour; the script is loaded
		// The first bucket holds 3 tokens and half a token's refill, and
		// no expiry.
		e.srv.HSet(first.Key, "tokens", "3", "ts", strconv.FormatInt(e.micros()-500_000, 10))
		if ttl := e.srv.TTL(first.Key); ttl != 0 {
			t.Fatalf("first bucket TTL %v, want none", ttl)
		}
		rec = &lockedRecorder{Client: e.c}
		return e, rec, newLimiter(rec, e.l.script), first, second, bucketDump(e, second.Key)
	}
	check := func(t *testing.T, e *unitEnv, rec *lockedRecorder, first, second Request, secondDump string) {
		t.Helper()
		cmds := rec.sent()
		if len(cmds) != 2 || cmds[0][0] != "EVALSHA" || cmds[1][0] != "EVALSHA" || cmds[1][len(cmds[1])-1] != modeRefund {
			t.Errorf("commands sent: %q; want 2 scripts: the attempt, then the first bucket's refund", cmds)
		}
		wantTS := strconv.FormatInt(e.micros()-500_000, 10)
		if tk, ts := e.state(first.Key); tk != "3" || ts != wantTS {
			t.Errorf("first bucket: tokens %q ts %q; want its 3 tokens back and ts %s (the part-token kept)", tk, ts, wantTS)
		}
		if ttl := e.srv.TTL(first.Key); ttl != 5*time.Second { // PEXPIREAT now + burst × interval: the key was written
			t.Errorf("first bucket TTL %v, want 5s (written by the charge and the refund)", ttl)
		}
		if got := bucketDump(e, second.Key); got != secondDump {
			t.Errorf("second bucket changed:\nbefore %s\nafter  %s", secondDump, got)
		}
	}
	t.Run("deadline before the token", func(t *testing.T) {
		e, rec, l, first, second, secondDump := setup(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		d, err := l.Wait(ctx, first, &second)
		if want := (Decision{Denied: 2, RetryAfter: time.Hour, Remaining: [2]int{1, 0}, decided: true}); d != want {
			t.Errorf("Decision %+v, want %+v (the attempt's denial)", d, want)
		}
		if !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOutcomeUnknown) {
			t.Errorf("error %v; want ErrNotExecuted and DeadlineExceeded, not ErrOutcomeUnknown", err)
		}
		msg := ""
		if err != nil {
			msg = regexp.MustCompile(`\(in [^)]*\)`).ReplaceAllString(err.Error(), "(in …)")
		}
		if want := "admit: Wait: bucket 2 holds the request's Cost only in 1h0m0s, after the context's deadline (in …)" + wrote + ": context deadline exceeded"; msg != want {
			t.Errorf("error text\n%s\nwant\n%s", msg, want)
		}
		check(t, e, rec, first, second, secondDump)
	})
	t.Run("context ended while sleeping", func(t *testing.T) {
		e, rec, l, first, second, secondDump := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := l.Wait(ctx, first, &second); done <- err }()
		waitUntil(t, "the denial recorded", func() bool { _, denied := lineState(l, waitKey{first.Key, second.Key}); return denied })
		cancel()
		err := <-done
		if !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.Canceled) || errors.Is(err, ErrOutcomeUnknown) {
			t.Errorf("error %v; want ErrNotExecuted and context.Canceled, not ErrOutcomeUnknown", err)
		}
		if want := "admit: Wait: the context ended while waiting for a token" + wrote + ": context canceled"; err == nil || err.Error() != want {
			t.Errorf("error text\n%v\nwant\n%s", err, want)
		}
		check(t, e, rec, first, second, secondDump)
	})
	t.Run("several attempts refused", func(t *testing.T) {
		// A script that stands for the buckets: the second refuses with
		// the RetryAfter (µs) in key ra, and a refund counts itself. Set ra
		// to an hour once three refunds ran, and cancel once the Wait sleeps
		// on it, not while a script is in flight.
		e := newUnitEnvScript(t, "if ARGV[#ARGV] == 'r' then redis.call('INCR', 'refunds') return '0 0 3 -1' end "+
			"return '2 ' .. (redis.call('GET', 'ra') or '1000') .. ' 1 0'")
		first, second := Request{Key: "w:{x}:a", Spec: MustSpec(Every(time.Second), 5), Cost: 2}, Request{Key: "w:{x}:b", Spec: MustSpec(Every(time.Hour), 1)}
		e.allow(t, first, &second) // the script is loaded: EVALSHA only from here
		rec := &lockedRecorder{Client: e.c}
		l := newLimiter(rec, e.l.script)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := l.Wait(ctx, first, &second); done <- err }()
		waitUntil(t, "3 refunds run", func() bool { s, _ := e.srv.Get("refunds"); n, _ := strconv.Atoi(s); return n >= 3 })
		if err := e.srv.Set("ra", "3600000000"); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the Wait asleep for an hour", func() bool { return lineRetryAfter(l, waitKey{first.Key, second.Key}) == time.Hour })
		cancel()
		err := <-done
		cmds := rec.sent()
		attempts := len(cmds) / 2
		want := "admit: Wait: the context ended while waiting for a token; 2 scripts ran for each of the " + strconv.Itoa(attempts) +
			" attempts the second bucket refused: each charged the first bucket its Cost, and a refund gave it back, capped at " +
			"the first bucket's burst; the first bucket's key was written, but no token stays taken, so a retry is safe: context canceled"
		if !errors.Is(err, ErrNotExecuted) || err.Error() != want {
			t.Errorf("error\n%v\nwant ErrNotExecuted and\n%s", err, want)
		}
		for i, cmd := range cmds {
			if refund := cmd[len(cmd)-1] == modeRefund; cmd[0] != "EVALSHA" || refund != (i%2 == 1) || len(cmds)%2 != 0 || attempts < 4 {
				t.Errorf("scripts sent: %q; want at least 4 attempts, each followed by its refund", cmds)
				break
			}
		}
	})
	t.Run("an attempt that did not run, after a refund", func(t *testing.T) {
		// The second attempt fails with WRONGTYPE: ErrNotExecuted for that
		// attempt, but the first attempt and its refund wrote.
		e := newUnitEnvScript(t, "if ARGV[#ARGV] == 'r' then return '0 0 3 -1' end "+
			"if redis.call('INCR', 'takes') == 1 then return '2 1000 1 0' end "+
			"return redis.error_reply('WRONGTYPE admit: bucket 1 key holds a value that is not a hash')")
		first, second := Request{Key: "w:{x}:a", Spec: MustSpec(Every(time.Second), 5), Cost: 2}, Request{Key: "w:{x}:b", Spec: MustSpec(Every(time.Hour), 1)}
		d, err := e.l.Wait(context.Background(), first, &second)
		want := "admit: Wait: an attempt did not run; before it, 2 scripts ran: an attempt charged the first bucket its Cost before " +
			"the second bucket refused, and a refund gave it back, capped at the first bucket's burst; the first bucket's key was written, " +
			"but no token stays taken, so a retry is safe: admit: bucket 1 key holds a value that is not a hash"
		if d.Allowed() || !errors.Is(err, ErrNotExecuted) || !errors.Is(err, ErrWrongType) || errors.Is(err, ErrOutcomeUnknown) || err.Error() != want {
			t.Errorf("got %v,\n%v\nwant ErrNotExecuted, ErrWrongType and\n%s", d, err, want)
		}
	})
}

// lockedRecorder records the commands sent through it (Do), for a test
// that reads them while a Wait runs.
type lockedRecorder struct {
	valkey.Client
	mu   sync.Mutex
	cmds [][]string
}

func (r *lockedRecorder) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	r.mu.Lock()
	r.cmds = append(r.cmds, append([]string(nil), cmd.Commands()...))
	r.mu.Unlock()
	return r.Client.Do(ctx, cmd)
}

// sent returns the commands sent so far.
func (r *lockedRecorder) sent() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.cmds...)
}

// bucketDump is a bucket's fields and expiry, as text.
func bucketDump(e *unitEnv, key string) string {
	tk, ts := e.state(key)
	return "tokens=" + tk + " ts=" + ts + " ttl=" + e.srv.TTL(key).String()
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

// lineRetryAfter is the RetryAfter of the last denial the head of l's
// line for key recorded, 0 for none.
func lineRetryAfter(l *Limiter, key waitKey) time.Duration {
	l.waits.mu.Lock()
	defer l.waits.mu.Unlock()
	if line := l.waits.lines[key]; line != nil && line.denial.ok {
		return line.denial.d.RetryAfter
	}
	return 0
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
		wg.Go(func() {
			d, err := e.l.Wait(context.Background(), Request{Key: "w", Spec: spec, Cost: i + 1}, nil)
			if err == nil && !d.Allowed() {
				err = errors.New("not admitted: " + d.String())
			}
			errs[i] = err
		})
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

// cancelAfterFirstScript cancels a context once the first script's reply
// is back: the refund that follows is then refused before sending.
type cancelAfterFirstScript struct {
	valkey.Client
	cancel context.CancelFunc
	n      atomic.Int32
}

func (c *cancelAfterFirstScript) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	r := c.Client.Do(ctx, cmd)
	if c.n.Add(1) == 1 {
		c.cancel()
	}
	return r
}

// TestWaitRefundNotRunIsOutcomeUnknown: when the refund of an attempt the
// second bucket refused does not run (the context ended after the
// attempt), the first bucket stays charged: Wait's error is outcome
// unknown and only that, never also not executed. (Found by the property
// test: before the fix the error matched both classes.)
func TestWaitRefundNotRunIsOutcomeUnknown(t *testing.T) {
	e := newUnitEnv(t)
	std, shared := Request{Key: "wr:{c}:std", Spec: perSecond3}, Request{Key: "wr:{c}:shared", Spec: MustSpec(Every(time.Hour), 1)}
	if d := e.allow(t, shared, nil); !d.Allowed() {
		t.Fatal(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := newLimiter(&cancelAfterFirstScript{Client: e.c, cancel: cancel}, e.l.script)
	d, err := l.Wait(ctx, std, &shared)
	if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNotExecuted) || d.Allowed() {
		t.Fatalf("%v, %v; want ErrOutcomeUnknown alone", d, err)
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "did not run, so the first bucket stays charged") {
		t.Errorf("%v; want context.Canceled in the chain and the message to say the charge stays", err)
	}
	if tk, _ := e.state(std.Key); tk != "2" {
		t.Errorf("the first bucket holds %q tokens, want 2 (charged, not refunded)", tk)
	}
}
