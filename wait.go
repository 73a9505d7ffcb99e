package admit

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Wait blocks until AllowOrdered admits the requests, and returns that
// Decision. Between attempts it sleeps the denial's RetryAfter plus up to
// 10% of jitter, so that waiters do not wake in lockstep; with a deadline,
// the jitter takes at most a quarter of the time between the token and the
// deadline, so a token that comes before the deadline is tried for.
//
// It honours ctx: it returns ctx's error when ctx is done while sleeping,
// and, like golang.org/x/time/rate, it returns at once, without sleeping,
// when the refusing bucket cannot hold the Cost before ctx's deadline. That
// error wraps ErrNotExecuted and context.DeadlineExceeded and comes with the
// denial: nothing was taken.
//
// An attempt that the second bucket refuses has charged the first bucket
// (the ordered transitions); Wait refunds that charge (one more round trip)
// before it sleeps or gives up, so only the admitted attempt costs
// anything. Should that refund fail, Wait returns ErrOutcomeUnknown with the
// refund's error: the first bucket may stay charged.
//
// An attempt that fails is never repeated: Wait returns its error as
// AllowOrdered gave it, so an attempt whose outcome is unknown
// (ErrOutcomeUnknown) is not sent twice. A Wait without a deadline waits as
// long as the buckets keep refusing.
func (l *Limiter) Wait(ctx context.Context, first Request, second *Request) (Decision, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		d, err := l.AllowOrdered(ctx, first, second)
		if err != nil || d.Allowed() {
			return d, err
		}
		if d.Denied == 2 {
			// The second bucket refused after the first was charged (the
			// ordered transitions): give the first its Cost back, so that
			// only the admitted attempt costs anything.
			if err := l.Refund(ctx, first, nil); err != nil {
				return d, &callError{
					msg:   "admit: Wait: the second bucket refused and the first bucket's charge could not be refunded, so it may stay charged",
					class: ErrOutcomeUnknown, cause: err,
				}
			}
		}
		left := untilDeadline(ctx)
		if left < d.RetryAfter {
			return d, &callError{
				msg: "admit: Wait: bucket " + strconv.Itoa(int(d.Denied)) + " holds the request's Cost only in " +
					d.RetryAfter.String() + ", after the context's deadline (in " + left.Round(time.Microsecond).String() + ")",
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
			return Decision{}, &callError{msg: "admit: Wait: the context ended while waiting for a token", class: ErrNotExecuted, cause: ctx.Err()}
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
