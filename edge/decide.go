package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/admitkit/admit"
)

// An Acquirer decides concurrency limits: *admit.Limiter.
type Acquirer interface {
	Acquire(ctx context.Context, req admit.LeaseRequest, first, second *admit.Request) (*admit.Lease, error)
}

// A Result is one decided Rule: the Decision, whose Remaining is what each
// bucket holds after the call, and with a concurrency part the Lease.
type Result struct {
	Decision admit.Decision
	// Lease is nil without a concurrency part.
	Lease *admit.Lease
}

// Allowed reports whether the decision admitted the request.
func (res Result) Allowed() bool {
	if res.Lease != nil {
		return res.Lease.Granted()
	}
	return res.Decision.Allowed()
}

// Denied is the part that refused: 0 when admitted.
func (res Result) Denied() admit.Part {
	if res.Lease != nil {
		return res.Lease.Denied
	}
	return admit.Part(res.Decision.Denied)
}

// Decide decides rule, all or nothing, within timeout when it is above
// zero: on dec's AllowAll for buckets alone, on dec's Acquire (dec must
// be an [Acquirer]) with a concurrency part. With a concurrency part the
// Lease is never nil, error or not, and the Decision of a decided Acquire
// is the Lease's decision of the buckets (Allowed when granted), or, for
// a refusal by the concurrency limit, a RetryAfter of the smaller of the
// Concurrent's RetryAfter (or DefaultConcurrencyRetryAfter) and the
// Lease's, with the buckets' Remaining. A concurrency part on a decider
// that cannot Acquire is an error wrapping [admit.ErrInvalidRequest].
//
// A decision that failed with another call's context error, sending
// nothing (valkey-go gives every call waiting for a new connection the
// error of the call whose context ended during the attempt), is neither
// this caller's going nor an outage: Decide tries it again, up to 16 more
// times, while ctx is live. A dial that timed out is not retried.
func Decide(ctx context.Context, dec admit.Decider, rule Rule, timeout time.Duration) (Result, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	for i := 0; ; i++ {
		res, err := decide(ctx, dec, rule)
		if i == foreignRetries || !foreignContext(ctx, err) {
			return res, err
		}
	}
}

// foreignRetries bounds Decide's retries of a decision failed by another
// call's context.
const foreignRetries = 16

// foreignContext reports whether err is a context error that is not ctx's
// own, on a call that sent nothing. A dial that timed out is not one: the
// store is not answering, and trying again would only wait again.
func foreignContext(ctx context.Context, err error) bool {
	var dial *net.OpError
	return err != nil && ctx.Err() == nil && !IsGone(ctx) &&
		errors.Is(err, admit.ErrNotExecuted) && !errors.Is(err, admit.ErrOutcomeUnknown) &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) &&
		!errors.As(err, &dial)
}

// decide is one attempt of Decide.
func decide(ctx context.Context, dec admit.Decider, rule Rule) (Result, error) {
	first, second := rule.Requests()
	c := rule.Concurrent
	if c == nil {
		d, err := dec.AllowAll(ctx, first, second)
		return Result{Decision: d}, err
	}
	acq, ok := dec.(Acquirer)
	if !ok {
		return Result{}, fmt.Errorf("the Rule has a concurrency part (policy %q), and the decider (%T) cannot Acquire; "+
			"decide concurrency limits on an *admit.Limiter: %w", c.Policy, dec, admit.ErrInvalidRequest)
	}
	var fp *admit.Request
	if rule.HasBuckets() {
		fp = &first
	}
	x, err := acq.Acquire(ctx, admit.LeaseRequest{Key: c.Key, Spec: c.Spec}, fp, second)
	switch {
	case err != nil:
		return Result{Lease: x}, err
	case x.Denied == admit.PartConcurrency:
		hint := c.RetryAfter
		if hint == 0 {
			hint = DefaultConcurrencyRetryAfter
		}
		return Result{Decision: admit.Decision{RetryAfter: min(hint, x.RetryAfter), Remaining: x.Remaining}, Lease: x}, nil
	}
	return Result{Decision: x.Decision(), Lease: x}, nil
}

// A Verdict is what an edge does with one decided Rule.
type Verdict uint8

// The verdicts, as [Judge] gives them.
const (
	// Admit: the decider admitted the request; its handler runs.
	Admit Verdict = iota + 1
	// Refuse: the decider refused it (429, ResourceExhausted).
	Refuse
	// Gone: the caller's context ended (the client went away, or its
	// deadline passed) before the decision came: nobody reads an answer,
	// and the store is not known to be failing.
	Gone
	// Invalid: the Rule could not be decided (admit.ErrInvalidRequest):
	// the server's error.
	Invalid
	// NotExecuted: the decision failed and took nothing; the outage
	// policy answers.
	NotExecuted
	// OutcomeUnknown: the decision failed and may have taken tokens, or
	// the error is in neither of admit's classes; the outage policy
	// answers.
	OutcomeUnknown
)

// Judge returns the verdict on a decision that returned err, made for a
// caller whose context is ctx (the request's, without the decision
// timeout). Client gone versus outage is one rule at both edges: see
// [IsGone].
func Judge(ctx context.Context, res Result, err error) Verdict {
	switch {
	case err == nil && res.Allowed():
		return Admit
	case err == nil:
		return Refuse
	case errors.Is(err, admit.ErrInvalidRequest):
		return Invalid
	case IsGone(ctx):
		return Gone
	case errors.Is(err, admit.ErrNotExecuted) && !errors.Is(err, admit.ErrOutcomeUnknown):
		return NotExecuted
	}
	return OutcomeUnknown
}

// IsGone reports whether the caller whose context is ctx is gone: ctx is
// done, or its deadline has passed (admit may see a deadline pass before
// the context's timer fires). Whatever the store's error, a decision
// that failed for such a caller is the caller's going, not an outage; a
// decision timeout of the edge's own that fires first is an outage.
func IsGone(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// releaseTimeout bounds a release when the edge has no decision timeout.
const releaseTimeout = time.Second

// Release frees the place of x, on a context that outlives ctx's
// cancellation (a client that went away must not keep the place), bounded
// by timeout, or one second when it is zero. It returns the release's
// failure, or for a granted lease found expired, an error that says the
// handler outlived it and the limit stopped counting it for a while.
func Release(ctx context.Context, x *admit.Lease, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = releaseTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	live, err := x.Release(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("releasing the lease of %q: %w", x.Key, err)
	case x.Granted() && !live:
		return fmt.Errorf("the lease on %q had expired when the handler returned: the handler ran longer than the lease (%v), "+
			"and the concurrency limit stopped counting it; give a longer lease, or extend it from the handler (Admission.Lease)", x.Key, x.TTL)
	}
	return nil
}
