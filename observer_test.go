package admit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestObserver: every call is reported once, after it, with its Op, first
// key, Decision, error and class; a denial the cache answers is Cached;
// Wait reports each attempt and each refund; a lease call carries its Lease
// and, for Release and Extend, what they reported.
func TestObserver(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	var seen []Observation
	l := New(e.c, WithDenialCache(8), WithObserver(func(o Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, o)
	}))
	hourly := MustSpec(Every(time.Hour), 1)
	std, shared := Request{Key: "ob:{c}:std", Spec: perSecond3}, Request{Key: "ob:{c}:shared", Spec: hourly}

	type want struct {
		op     Op
		denied uint8
		err    error // a class, or nil
		cached bool
		part   Part // a lease call's Lease.Denied
		live   bool // Release's or Extend's report
	}
	var wants []want
	expect := func(w ...want) { wants = append(wants, w...) }

	l.AllowOrdered(ctx, shared, nil) // drains shared
	expect(want{op: OpTake})
	l.AllowOrdered(ctx, shared, nil) // denied by the server
	expect(want{op: OpTake, denied: 1})
	l.AllowOrdered(ctx, shared, nil) // denied by the cache
	expect(want{op: OpTake, denied: 1, cached: true})
	l.Peek(ctx, std, &shared)
	expect(want{op: OpPeek, denied: 2})
	l.AllowOrderedOnce(ctx, "m", std, &shared)
	expect(want{op: OpOnce, denied: 2})
	l.Refund(ctx, std, nil)
	expect(want{op: OpRefund})
	l.AllowOrderedOnce(ctx, "", std, nil) // refused before sending
	expect(want{op: OpOnce, err: ErrNotExecuted})
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	l.Wait(wctx, std, &shared) // one attempt, refused by shared, refunded, then the deadline
	cancel()
	expect(want{op: OpWaitAttempt, denied: 2}, want{op: OpRefund})
	slot := LeaseRequest{Key: "ob:{c}:conc", Spec: MustConcurrency(1, time.Hour), Name: "a"}
	held, _ := l.Acquire(ctx, slot, &std, nil)
	expect(want{op: OpAcquire})
	other := slot
	other.Name = "b"
	refused, _ := l.Acquire(ctx, other, nil, nil) // the one slot is held
	expect(want{op: OpAcquire, part: PartConcurrency})
	l.Acquire(ctx, LeaseRequest{Key: "ob:{c}:conc"}, nil, nil) // refused before sending
	expect(want{op: OpAcquire, err: ErrNotExecuted})
	held.Extend(ctx)
	expect(want{op: OpExtend, live: true})
	held.Release(ctx)
	expect(want{op: OpRelease, live: true})
	l.Lease(slot).Release(ctx) // released already
	expect(want{op: OpRelease})
	refused.Release(ctx) // sends nothing
	expect(want{op: OpRelease, part: PartConcurrency})

	mu.Lock()
	defer mu.Unlock()
	if len(seen) != len(wants) {
		t.Fatalf("observed %d calls, want %d: %+v", len(seen), len(wants), seen)
	}
	for i, w := range wants {
		o := seen[i]
		errOK := (w.err == nil) == (o.Err == nil) && (w.err == nil || errors.Is(o.Err, w.err))
		if o.Op != w.op || o.Decision.Denied != w.denied || o.Cached != w.cached || !errOK || o.Duration < 0 {
			t.Errorf("observation %d: %v %q %v cached %v err %v; want %v denied %d cached %v class %v", i, o.Op, o.FirstKey, o.Decision, o.Cached, o.Err, w.op, w.denied, w.cached, w.err)
		}
		if isLease := w.op >= OpAcquire; isLease != (o.Lease != nil) || isLease && (o.Lease.Denied != w.part || o.FirstKey != slot.Key) || o.Live != w.live {
			t.Errorf("observation %d, %v: Lease %v, first key %q, Live %v; want a Lease %v denied by %v on %q, Live %v", i, o.Op, o.Lease, o.FirstKey, o.Live, isLease, w.part, slot.Key, w.live)
		}
	}
	if a := seen[len(seen)-7]; !a.Decision.Allowed() || a.Lease != held || !held.Granted() {
		t.Errorf("a granted Acquire observed as %v, Lease %v; want Allowed, the Lease Acquire returned", a.Decision, a.Lease)
	}
	if seen[0].FirstKey != shared.Key || seen[3].FirstKey != std.Key {
		t.Errorf("first keys %q, %q; want %q, %q", seen[0].FirstKey, seen[3].FirstKey, shared.Key, std.Key)
	}
	if got := OpWaitAttempt.String() + " " + OpExtend.String() + " " + Op(0).String(); got != "wait-attempt extend op(0)" {
		t.Errorf("Op names: %q", got)
	}
}

// TestObserverCarriesContextAndCost: each Observation carries the call's
// own context (an OpenTelemetry observer parents its span on it) and the
// first Request's Cost, 0 read as 1: a Refund's tokens.
func TestObserverCarriesContextAndCost(t *testing.T) {
	e := newUnitEnv(t)
	type key struct{}
	var seen []Observation
	l := New(e.c, WithObserver(func(o Observation) { seen = append(seen, o) }))
	ctx := context.WithValue(context.Background(), key{}, "caller")
	r := Request{Key: "oc:{a}", Spec: perSecond3, Cost: 2}
	l.AllowOrdered(ctx, r, nil)
	l.Refund(ctx, r, nil)
	l.Peek(ctx, Request{Key: "oc:{a}", Spec: perSecond3}, nil)
	x, _ := l.Acquire(ctx, LeaseRequest{Key: "oc:{a}conc", Spec: MustConcurrency(1, time.Hour)}, nil, nil)
	x.Release(ctx)
	wantOps, wantCost := []Op{OpTake, OpRefund, OpPeek, OpAcquire, OpRelease}, []int{2, 2, 1, 0, 0}
	if len(seen) != len(wantOps) {
		t.Fatalf("%d observations, want %d", len(seen), len(wantOps))
	}
	for i, o := range seen {
		if o.Op != wantOps[i] || o.Cost != wantCost[i] || o.Context == nil || o.Context.Value(key{}) != "caller" {
			t.Errorf("observation %d: op %v cost %d context %v; want %v, %d and the caller's context", i, o.Op, o.Cost, o.Context, wantOps[i], wantCost[i])
		}
	}
}
