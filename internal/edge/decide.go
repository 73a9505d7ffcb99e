package edge

import (
	"context"
	"fmt"
	"time"

	"github.com/admitkit/admit"
)

// An Acquirer decides concurrency limits: *admit.Limiter.
type Acquirer interface {
	Acquire(ctx context.Context, slot admit.Slot, first, second *admit.Request) (*admit.Lease, error)
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
// zero: on dec's AllowAll for buckets alone, on acq's Acquire with a
// concurrency part. With a concurrency part the Lease is never nil, error
// or not, and the Decision of a decided Acquire is the Lease's decision of
// the buckets (Allowed when granted), or, for a refusal by the slot, the
// slot's RetryAfter with the buckets' Remaining. acq may be nil only when
// rule has no concurrency part.
func Decide(ctx context.Context, dec admit.Decider, acq Acquirer, rule Rule, timeout time.Duration) (Result, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	first, second := rule.Requests()
	c := rule.Concurrent
	if c == nil {
		d, err := dec.AllowAll(ctx, first, second)
		return Result{Decision: d}, err
	}
	var fp *admit.Request
	if rule.HasBuckets() {
		fp = &first
	}
	x, err := acq.Acquire(ctx, admit.Slot{Key: c.Key, Spec: c.Spec}, fp, second)
	switch {
	case err != nil:
		return Result{Lease: x}, err
	case x.Denied == admit.PartSlot:
		return Result{Decision: admit.Decision{RetryAfter: x.RetryAfter, Remaining: x.Remaining}, Lease: x}, nil
	}
	return Result{Decision: x.Decision(), Lease: x}, nil
}

// ReleaseTimeout bounds a release when the edge has no decision timeout.
const ReleaseTimeout = time.Second

// Release frees the slot of x, on a context that outlives ctx's
// cancellation (a client that went away must not keep the slot), bounded
// by timeout, or ReleaseTimeout when it is zero. It returns the release's
// failure, or for a granted lease found expired, an error that says the
// handler outlived it and the limit stopped counting it for a while.
func Release(ctx context.Context, x *admit.Lease, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = ReleaseTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	live, err := x.Release(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("releasing the slot of %q: %w", x.Key, err)
	case x.Granted() && !live:
		return fmt.Errorf("the lease on %q had expired when the handler returned: the handler ran longer than the lease (%v), "+
			"and the concurrency limit stopped counting it; give a longer lease, or extend it from the handler (Admission.Lease)", x.Key, x.TTL)
	}
	return nil
}
