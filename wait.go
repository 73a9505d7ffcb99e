package admit

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// wait is Wait: it queues in the line of its keys, then, at the head of
// the line, sends attempts (take, observed as OpWaitAttempt) until one is
// admitted, refunding each charge that the second bucket's refusal left.
func (l *Limiter) wait(ctx context.Context, first Request, second *Request) (Decision, error) {
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
				err = waitGaveUp("an attempt did not run", refunds, true, err)
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
			return d, waitGaveUp("bucket "+strconv.Itoa(int(d.Denied))+" holds the request's Cost only in "+
				d.RetryAfter.String()+", after the context's deadline (in "+left.Round(time.Microsecond).String()+")",
				refunds, false, context.DeadlineExceeded)
		}
		sleep := waitSleep(d.RetryAfter, left, rand.N[time.Duration])
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			return Decision{}, waitGaveUp("the context ended while waiting for a token", refunds, false, ctx.Err())
		case <-timer.C:
		}
	}
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
				return d, waitGaveUp("bucket "+strconv.Itoa(int(d.Denied))+" holds the request's Cost only in "+
					d.RetryAfter.String()+", after the context's deadline (in "+deadline.Sub(now).Round(time.Microsecond).String()+
					"), as the last denial of the Wait ahead of this one in its Limiter's line for these keys says; this Wait sent nothing",
					0, false, context.DeadlineExceeded)
			}
		}
		select {
		case line.head <- struct{}{}:
			return Decision{}, nil
		case <-ctx.Done():
			return Decision{}, waitGaveUp("the context ended while queued behind another Wait of this Limiter on the same keys; this Wait sent nothing",
				0, false, ctx.Err())
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
