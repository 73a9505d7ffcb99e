package admit

import (
	"strconv"
	"time"
)

// An Op is the kind of call an [Observation] reports.
type Op uint8

const (
	// OpTake is AllowOrdered.
	OpTake Op = iota + 1
	// OpOnce is AllowOrderedOnce.
	OpOnce
	// OpPeek is Peek.
	OpPeek
	// OpRefund is Refund, Wait's refunds included.
	OpRefund
	// OpWaitAttempt is one attempt of Wait: an AllowOrdered.
	OpWaitAttempt
	// OpAll is AllowAll.
	OpAll
	// OpAcquire is Acquire.
	OpAcquire
	// OpRelease is a Lease's Release.
	OpRelease
	// OpExtend is a Lease's Extend.
	OpExtend
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
	Op Op
	// FirstKey is the first Request's Key; with Decision.Denied it tells
	// which bucket refused. For a lease call (OpAcquire, OpRelease,
	// OpExtend) it is the lease key, the part decided first.
	FirstKey string
	// Decision is what the call returned: the zero Decision with an error,
	// and for OpRefund, which returns none, the zero Decision too. For
	// OpAcquire it is the Lease's [Lease.Decision], which is not Allowed
	// for a slot's refusal either: read Lease.Denied for the part that
	// refused. For OpRelease and OpExtend it is the zero Decision.
	Decision Decision
	// Err is the call's error, nil on success. Its class is
	// errors.Is(Err, ErrNotExecuted) or errors.Is(Err, ErrOutcomeUnknown).
	Err error
	// Duration is the call's time on the local clock, round trip
	// included; near zero for a Cached one.
	Duration time.Duration
	// Cached is set when the Limiter's denial cache ([WithDenialCache])
	// answered, and nothing was sent.
	Cached bool
	// Lease is the Lease of a lease call: the one Acquire returned (read
	// its Granted, Denied, Holders, Replayed), or the one released or
	// extended. Nil for the other Ops. It is the caller's: read it, but
	// neither keep it nor call its Release or Extend.
	Lease *Lease
	// Live is what Release or Extend reported: the lease was live on the
	// server (released, or renewed). False for the other Ops.
	Live bool
}

// WithObserver has the Limiter call observe once for every call it
// completes: AllowOrdered, AllowAll, AllowOrderedOnce, Peek, Refund, each
// attempt and refund of Wait, and Acquire with the Release and Extend of
// its Leases (those of [Limiter.Lease] too). observe runs on the caller's
// goroutine after the call, before it returns, so it must be quick and
// safe for concurrent use: count, or hand off to a metrics library
// (examples/outgress feeds Prometheus). A nil observe leaves the Limiter unobserved, the default,
// which costs nothing: no clock is read and nothing is allocated.
// Reporting an Observation allocates nothing either.
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

// observed reports the outcome, d and err, of a call of op on firstKey
// that started at start, when something observes, and returns them.
// cached is set when the denial cache answered.
func (l *Limiter) observed(op Op, firstKey string, start time.Time, d Decision, cached bool, err error) (Decision, error) {
	if l != nil && l.observe != nil {
		l.observe(Observation{Op: op, FirstKey: firstKey, Decision: d, Err: err, Duration: time.Since(start), Cached: cached})
	}
	return d, err
}

// observedLease reports a lease call of op on x that started at start,
// when something observes; live is what Release or Extend reported.
func (l *Limiter) observedLease(op Op, x *Lease, start time.Time, live bool, err error) {
	if l != nil && l.observe != nil {
		var d Decision
		if op == OpAcquire {
			d = x.Decision()
		}
		l.observe(Observation{Op: op, FirstKey: x.Key, Decision: d, Err: err, Duration: time.Since(start), Lease: x, Live: live})
	}
}
