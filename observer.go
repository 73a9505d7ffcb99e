package admit

import (
	"context"
	"strconv"
	"time"
)

// An Op is the kind of call an [Observation] reports.
type Op uint8

const (
	OpTake        Op = iota + 1 // AllowOrdered
	OpOnce                      // AllowOrderedOnce
	OpPeek                      // Peek
	OpRefund                    // Refund, Wait's refunds included
	OpWaitAttempt               // one attempt of Wait: an AllowOrdered
	OpAll                       // AllowAll
	OpAcquire                   // Acquire
	OpRelease                   // a Lease's Release
	OpExtend                    // a Lease's Extend
)

var opNames = [...]string{OpTake: "take", OpOnce: "once", OpPeek: "peek", OpRefund: "refund", OpWaitAttempt: "wait-attempt", OpAll: "all",
	OpAcquire: "acquire", OpRelease: "release", OpExtend: "extend"}

// String returns the Op's name: "take", "once", "peek", "refund",
// "wait-attempt", "all", "acquire", "release" or "extend".
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// An Observation is one call of a Limiter, as [WithObserver] reports it.
type Observation struct {
	Op       Op
	Context  context.Context // the call's context (a span's parent); do not keep it
	FirstKey string          // the first Request's Key; a lease call's lease key
	Cost     int             // the first Request's Cost, 0 read as 1 (a Refund's tokens); 0 for lease calls
	Decision Decision        // what the call returned (OpAcquire: the Lease's); zero for the others
	Err      error           // the call's error, nil on success
	Duration time.Duration   // the call's time on the local clock
	Cached   bool            // the denial cache answered; nothing was sent
	Lease    *Lease          // a lease call's Lease, to read only; nil for the others
	Live     bool            // what Release or Extend reported; false for the other Ops
}

// WithObserver has the Limiter call observe, on the caller's goroutine, after
// each call; observe must be quick and concurrency-safe (docs/observing.md).
func WithObserver(observe func(Observation)) Option {
	return optionFunc(func(l *Limiter) { l.observe = observe })
}

// observeStart reads the clock for an observed call: the zero Time, read
// from no clock, when nothing observes.
func (l *Limiter) observeStart() time.Time {
	if l == nil || l.observe == nil {
		return time.Time{}
	}
	return time.Now()
}

// observed reports the outcome, d and err, of the call c made with ctx,
// when something observes, and returns them. cached is set when the
// denial cache answered.
func (l *Limiter) observed(ctx context.Context, c *call, d Decision, cached bool, err error) (Decision, error) {
	if l != nil && l.observe != nil {
		l.observe(Observation{Op: c.op, Context: ctx, FirstKey: c.first.Key, Cost: c.first.cost(), Decision: d, Err: err,
			Duration: time.Since(c.start), Cached: cached})
	}
	return d, err
}

// observedLease reports a lease call of op on x that started at start,
// when something observes: d is an Acquire's Decision (zero for the
// others), live what Release or Extend reported.
func (l *Limiter) observedLease(ctx context.Context, op Op, x *Lease, d Decision, start time.Time, live bool, err error) {
	if l != nil && l.observe != nil {
		l.observe(Observation{Op: op, Context: ctx, FirstKey: x.Key, Decision: d, Err: err, Duration: time.Since(start), Lease: x, Live: live})
	}
}
