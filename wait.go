package admit

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Wait blocks until AllowOrdered admits the requests, and returns that
// Decision. Between attempts it sleeps the denial's RetryAfter plus up to
// 10% of jitter, so that waiters in other processes do not wake in
// lockstep; with a deadline, the jitter takes at most a quarter of the time
// between the token and the deadline, so a token that comes before the
// deadline is tried for.
//
// The Waits of one Limiter on the same keys (first and second Key) form a
// line: only the Wait at its head sends attempts, and the others queue
// behind it, in about the order they came, each sending nothing until it
// is the head. So with any number of waiters on one bucket a Limiter sends
// about two scripts per admission (the new head's first attempt, denied,
// and the one after its sleep), three when the second bucket refuses (the
// refund too). Waits with different Specs or Costs on the same keys share
// the line. Waits of different Limiters, or of other processes, do not:
// only the jitter spreads them.
//
// It honours ctx: it returns ctx's error when ctx is done while it sleeps
// or is queued, and, like golang.org/x/time/rate, it returns at once,
// without sleeping, when the refusing bucket cannot hold the Cost before
// ctx's deadline. A queued Wait knows this from the last denial the head of
// its line got for the same requests, and returns at once, having sent
// nothing, when its deadline comes before that denial's token. Those errors
// wrap ErrNotExecuted and context.DeadlineExceeded (or ctx's error) and
// come with the denial: nothing was taken.
//
// An attempt that the second bucket refuses has charged the first bucket
// (the ordered transitions); Wait refunds that charge (one more round trip)
// before it sleeps or gives up, so only the admitted attempt costs
// anything. Should that refund fail, Wait returns ErrOutcomeUnknown with the
// refund's error: the first bucket may stay charged. When it succeeds and
// Wait then gives up (the deadline, ctx ended, or a later attempt did not
// run), the error is still ErrNotExecuted, because no token stays taken and
// a retry is safe, but it is not proof that nothing was written: each such
// attempt and its refund ran two scripts, which wrote the first bucket's
// key (its tokens back, capped at its burst, and its expiry), and the
// error's text says so. The Decision that comes with a deadline error is
// the last attempt's, whose Remaining for the first bucket is from before
// the refund.
//
// An attempt that fails is never repeated: Wait returns its error as
// AllowOrdered gave it (a not-executed one after refunded attempts says
// what those wrote, as above), so an attempt whose outcome is unknown
// (ErrOutcomeUnknown) is not sent twice. A Wait without a deadline waits as
// long as the buckets keep refusing.
func (l *Limiter) Wait(ctx context.Context, first Request, second *Request) (Decision, error) {
	// Bad input is refused before queuing, not after the Waits ahead.
	if err := l.check(ctx, first, second); err != nil {
		return Decision{}, err
	}
	key := waitKey{first: first.Key}
	if second != nil {
		key.second = second.Key
	}
	line := l.waits.join(key)
	defer l.waits.leave(key, line)
	if d, err := l.waits.queue(ctx, line, first, second); err != nil {
		return d, err
	}
	defer func() { <-line.head }()

	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	refunds := 0 // attempts the second bucket refused, each refunded
	for {
		sent := time.Now()
		d, err := l.take(ctx, OpWaitAttempt, modeTake, first, second)
		if err != nil || d.Allowed() {
			l.waits.forget(line)
			if err != nil && refunds > 0 && errors.Is(err, ErrNotExecuted) {
				// This attempt did not run, but earlier ones wrote.
				err = &callError{msg: "admit: Wait: an attempt did not run" + refunded(refunds, true), class: ErrNotExecuted, cause: err}
			}
			return d, err
		}
		if d.Denied == 2 {
			// The second bucket refused after the first was charged (the
			// ordered transitions): give the first its Cost back, so that
			// only the admitted attempt costs anything.
			if err := l.Refund(ctx, first, nil); err != nil {
				return d, refundFailed(err)
			}
			refunds++
		}
		l.waits.record(line, first, second, d, sent.Add(d.RetryAfter))
		left := untilDeadline(ctx)
		if left < d.RetryAfter {
			return d, &callError{
				msg: "admit: Wait: bucket " + strconv.Itoa(int(d.Denied)) + " holds the request's Cost only in " +
					d.RetryAfter.String() + ", after the context's deadline (in " + left.Round(time.Microsecond).String() + ")" + refunded(refunds, false),
				class: ErrNotExecuted, cause: context.DeadlineExceeded,
			}
		}
		sleep := waitSleep(d.RetryAfter, left, rand.N[time.Duration])
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			return Decision{}, &callError{msg: "admit: Wait: the context ended while waiting for a token" + refunded(refunds, false), class: ErrNotExecuted, cause: ctx.Err()}
		case <-timer.C:
		}
	}
}

// refunded is what Wait's error adds after n attempts that the second
// bucket refused, each of which charged the first bucket and was refunded:
// nothing when n is 0. earlier is set when the error is another attempt's,
// made after them.
func refunded(n int, earlier bool) string {
	const back = " gave it back, capped at the first bucket's burst; the first bucket's key was written, but no token stays taken, so a retry is safe"
	ran, the := "; 2 scripts ran", "the"
	if earlier {
		ran, the = "; before it, 2 scripts ran", "an"
	}
	switch n {
	case 0:
		return ""
	case 1:
		return ran + ": " + the + " attempt charged the first bucket its Cost before the second bucket refused, and a refund" + back
	}
	return ran + " for each of the " + strconv.Itoa(n) + " attempts the second bucket refused: each charged the first bucket its Cost, and a refund" + back
}

// noDeadline is untilDeadline's answer for a context without a deadline.
const noDeadline = time.Duration(math.MaxInt64)

// untilDeadline is the time left until ctx's deadline, or noDeadline.
func untilDeadline(ctx context.Context) time.Duration {
	if deadline, ok := ctx.Deadline(); ok {
		return time.Until(deadline)
	}
	return noDeadline
}

// waitSleep is how long Wait sleeps after a denial with retryAfter, with
// untilDeadline left until the context's deadline (noDeadline for none):
// retryAfter plus a jitter drawn with rnd, which returns a duration in
// [0, n) for n >= 1 (rand.N). The jitter is at most 10% of retryAfter, so
// that waiters in other processes do not wake in lockstep, and at most a
// quarter of the slack between the token and the deadline, so that a token
// that comes before the deadline is tried for with time to spare for the
// round trip. The sum never overflows.
func waitSleep(retryAfter, untilDeadline time.Duration, rnd func(n time.Duration) time.Duration) time.Duration {
	most := min(retryAfter/10, math.MaxInt64-retryAfter)
	if untilDeadline != noDeadline {
		most = min(most, (untilDeadline-retryAfter)/4)
	}
	if most <= 0 {
		return retryAfter
	}
	return retryAfter + rnd(most+1)
}

// waitLines are a Limiter's lines of Waits, one for each pair of keys that
// Waits are waiting on; a line is removed when its last Wait leaves. The
// zero waitLines is ready for use.
type waitLines struct {
	mu    sync.Mutex
	lines map[waitKey]*waitLine
}

// waitKey names a line: the first and second Key ("" for one bucket).
type waitKey struct{ first, second string }

// A waitLine is the Waits on one pair of keys. The Wait that holds head's
// one slot sends the attempts; the others block on sending to head, which
// Go's channels serve in the order the senders came.
type waitLine struct {
	head chan struct{}

	// Guarded by waitLines.mu.
	waiters int           // Waits in the line, the head included
	denial  lineDenial    // the head's last denial, if any
	changed chan struct{} // closed, and replaced, when denial is set
}

// lineDenial is the last denial the head of a line got.
type lineDenial struct {
	ok            bool
	first, second Request   // as denied, Cost 0 made 1; second.Key "" for one bucket
	d             Decision  // the denial
	until         time.Time // sent + RetryAfter, by the monotonic clock: never after the token
}

// sameRequests reports whether first and second are the requests the
// denial was given for, so that its token time holds for them too.
func (dn *lineDenial) sameRequests(first Request, second *Request) bool {
	first.Cost = first.cost()
	var s Request
	if second != nil {
		s = *second
		s.Cost = s.cost()
	}
	return dn.ok && dn.first == first && dn.second == s
}

// join puts a Wait in the line for key, making the line if needed.
func (w *waitLines) join(key waitKey) *waitLine {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lines == nil {
		w.lines = make(map[waitKey]*waitLine)
	}
	line := w.lines[key]
	if line == nil {
		line = &waitLine{head: make(chan struct{}, 1), changed: make(chan struct{})}
		w.lines[key] = line
	}
	line.waiters++
	return line
}

// leave takes a Wait out of the line, and removes the line when it was the
// last.
func (w *waitLines) leave(key waitKey, line *waitLine) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if line.waiters--; line.waiters == 0 {
		delete(w.lines, key)
	}
}

// queue returns once the Wait is the head of line. It returns an error,
// having sent nothing, when ctx ends first, or when ctx's deadline comes
// before the token of the head's last denial of the same requests.
func (w *waitLines) queue(ctx context.Context, line *waitLine, first Request, second *Request) (Decision, error) {
	select {
	case line.head <- struct{}{}:
		return Decision{}, nil
	default:
	}
	deadline, hasDeadline := ctx.Deadline()
	for {
		var changed chan struct{} // nil without a deadline: never ready
		if hasDeadline {
			w.mu.Lock()
			dn := line.denial
			changed = line.changed
			w.mu.Unlock()
			if dn.sameRequests(first, second) && deadline.Before(dn.until) {
				now := time.Now()
				d := dn.d
				d.RetryAfter = (dn.until.Sub(now) + time.Microsecond - 1).Truncate(time.Microsecond) // whole µs, never short
				return d, &callError{
					msg: "admit: Wait: bucket " + strconv.Itoa(int(d.Denied)) + " holds the request's Cost only in " +
						d.RetryAfter.String() + ", after the context's deadline (in " + deadline.Sub(now).Round(time.Microsecond).String() +
						"), as the last denial of the Wait ahead of this one in its Limiter's line for these keys says; this Wait sent nothing",
					class: ErrNotExecuted, cause: context.DeadlineExceeded,
				}
			}
		}
		select {
		case line.head <- struct{}{}:
			return Decision{}, nil
		case <-ctx.Done():
			return Decision{}, &callError{
				msg:   "admit: Wait: the context ended while queued behind another Wait of this Limiter on the same keys; this Wait sent nothing",
				class: ErrNotExecuted, cause: ctx.Err(),
			}
		case <-changed:
		}
	}
}

// record keeps the head's denial d of first and second, whose token comes
// at until at the earliest, for the Waits queued behind it, and wakes those
// with a deadline to check it.
func (w *waitLines) record(line *waitLine, first Request, second *Request, d Decision, until time.Time) {
	dn := lineDenial{ok: true, first: first, d: d, until: until}
	dn.first.Cost = first.cost()
	if second != nil {
		dn.second = *second
		dn.second.Cost = second.cost()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	line.denial = dn
	close(line.changed)
	line.changed = make(chan struct{})
}

// forget drops the head's last denial: its attempt was admitted, or failed.
func (w *waitLines) forget(line *waitLine) {
	w.mu.Lock()
	defer w.mu.Unlock()
	line.denial = lineDenial{}
}

// refundFailed is Wait's error when the refund of an attempt the second
// bucket refused failed: the attempt charged the first bucket, so a token
// was taken, and ErrOutcomeUnknown is the class, with the refund's own
// cause (a context or transport error) but not its class: a refund that
// did not run (its context ended first, say) leaves the charge for
// certain, which is no proof that nothing ran.
func refundFailed(err error) error {
	msg := "admit: Wait: the second bucket refused after the first bucket was charged its Cost, and the refund of that charge "
	cause, reason := err, error(nil)
	var ce *callError
	if errors.As(err, &ce) {
		cause, reason = ce.cause, ce.reason
	}
	if errors.Is(err, ErrNotExecuted) {
		msg += "did not run, so the first bucket stays charged: " + err.Error()
	} else {
		msg += "may not have run, so the first bucket may stay charged: " + err.Error()
	}
	if ce != nil && ce.cause != nil { // the cause is in the chain: say it once
		msg = strings.TrimSuffix(msg, ": "+ce.cause.Error())
	}
	return &callError{msg: msg, reason: reason, class: ErrOutcomeUnknown, cause: cause}
}
