package admit

import (
	"context"
	"errors"
	"strings"
)

// Peek returns the Decision that AllowOrdered would return now for the same
// requests, Remaining included, and takes nothing: it writes no key and
// refreshes no expiry. It runs the same script read-only (EVALSHA_RO), so it
// works for an ACL user without write permissions and may be served by a
// replica (valkey-go's ClientOption.SendToReplicas), where the answer is as
// fresh as the replica.
//
// A Peek is advice, not a reservation: another caller may take the tokens
// before a following AllowOrdered. Since a Peek writes nothing, every error
// it returns is [ErrNotExecuted], even one whose reason is a lost reply or
// [ErrBadReply]: nothing was taken, and a retry is safe.
//
// On a server that refuses TIME in a read-only script (miniredis, the
// embedded server of unit tests), Peek runs the same script through
// EVALSHA instead, in the same read-only mode, which writes nothing; the
// Limiter remembers that and goes straight there afterwards.
func (l *Limiter) Peek(ctx context.Context, first Request, second *Request) (Decision, error) {
	start := l.observeStart()
	d, err := l.peekUnobserved(ctx, first, second)
	l.observed(OpPeek, first, start, false, d, err)
	return d, err
}

// peekUnobserved is Peek without its observation.
func (l *Limiter) peekUnobserved(ctx context.Context, first Request, second *Request) (Decision, error) {
	d, err := l.run(ctx, modePeek, first, second)
	if err == nil || !errors.Is(err, ErrOutcomeUnknown) {
		return d, err
	}
	e := &callError{msg: "admit: Peek failed; a Peek writes nothing, so nothing was taken and a retry is safe", class: ErrNotExecuted, cause: err}
	var ce *callError
	if errors.As(err, &ce) {
		e.reason, e.cause = ce.reason, ce.cause
		if e.cause == nil { // a bad reply: its message is the detail
			e.msg += ": " + strings.TrimPrefix(ce.msg, "admit: ")
		}
	}
	return Decision{}, e
}

// Refund gives each Request's Cost back to its bucket, capped at the
// Spec's burst: a refund never creates a token above it, and a bucket
// whose key has expired (a full bucket) is left alone. Refund with a nil
// second gives back to first only.
//
// It is meant for reserve-then-settle: take an estimate with AllowOrdered,
// do the work, then Refund the unused part with Cost set to it. Refund only
// what was charged: after a Decision with Denied 2 only the first bucket
// was charged, so refund first alone; after Denied 1 nothing was charged.
// After ErrOutcomeUnknown from AllowOrdered, the charge may or may not have
// happened: refunding could hand out tokens that were never taken, so do
// not refund (let the bucket refill on its own). Refund is not idempotent:
// after ErrOutcomeUnknown from Refund itself, do not repeat it.
//
// With [WithDenialCache], once the refund has returned, whatever its outcome
// (one whose outcome is unknown may have run), the Limiter holds no cached
// denial of either key, and does not cache the denial of a call sent before
// that: the next call on either key goes to the server.
func (l *Limiter) Refund(ctx context.Context, first Request, second *Request) error {
	start := l.observeStart()
	_, err := l.run(ctx, modeRefund, first, second)
	if l != nil && l.denials != nil {
		l.denials.refunded(first, second) // after the reply: a denial sent meanwhile may predate the refund
	}
	l.observed(OpRefund, first, start, false, Decision{}, err)
	return err
}
