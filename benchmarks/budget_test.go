package benchmarks

// The Budget API's calls and AllowOrderedOnce side by side with
// AllowOrdered, on the same server, nets and bucket shapes as
// designs_test.go's benchmarks, with the same metrics (B/op, allocs/op,
// cmds/op, srv-µs/op, latency quantiles):
//
//	BenchmarkAllowOrderedCost/path=both-allow/net=...   AllowOrdered with Cost 50 on both buckets
//	BenchmarkPeek/path=.../net=...                      Peek (EVALSHA_RO) on the three two-bucket paths
//	BenchmarkPeekOneBucket/path=.../net=...             Peek on one bucket
//	BenchmarkRefund/path=both-allow/net=...             Refund of 50 tokens to two buckets
//	BenchmarkRefundOneBucket/path=allow/net=...         Refund of 50 tokens to one bucket
//	BenchmarkAllowOrderedOnce/path=.../net=...          AllowOrderedOnce with a fresh id
//
// Compare them with BenchmarkAllowOrdered and BenchmarkAllowOrderedOneBucket:
//
//	go test -run '^$' -bench 'AllowOrdered|Peek|Refund' -count 3
//
// TestBudgetAllocations holds the calls to their allocation budgets.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// budgetCost is a Cost above 1 that strconv.Itoa encodes without
// allocating (below 100), as most small costs are.
const budgetCost = 50

// costPaths are the paths on which a Cost of budgetCost is met: roomy
// buckets only (a tight bucket's burst is 1).
var costPaths = []benchPath{{"both-allow", roomy, roomy, 0}}

// orderedCost is AllowOrdered with budgetCost on both buckets.
func orderedCost(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
	return n.l.AllowOrdered(ctx, admit.Request{Key: k1, Spec: p.first, Cost: budgetCost}, &admit.Request{Key: k2, Spec: p.second, Cost: budgetCost})
}

// peek is Peek on two buckets: what AllowOrdered would decide, taking
// nothing, so a path's buckets stay as prepare left them.
func peek(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
	return n.l.Peek(ctx, admit.Request{Key: k1, Spec: p.first}, &admit.Request{Key: k2, Spec: p.second})
}

// peekOne is Peek on one bucket.
func peekOne(ctx context.Context, n *benchNet, k1, _ string, p benchPath) (admit.Decision, error) {
	return n.l.Peek(ctx, admit.Request{Key: k1, Spec: p.first}, nil)
}

// refund gives budgetCost back to two buckets (capped at their burst).
// Refund returns no Decision: a success reads as the allowed path.
func refund(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
	err := n.l.Refund(ctx, admit.Request{Key: k1, Spec: p.first, Cost: budgetCost}, &admit.Request{Key: k2, Spec: p.second, Cost: budgetCost})
	return admit.Decision{}, err
}

// refundOne gives budgetCost back to one bucket.
func refundOne(ctx context.Context, n *benchNet, k1, _ string, p benchPath) (admit.Decision, error) {
	err := n.l.Refund(ctx, admit.Request{Key: k1, Spec: p.first, Cost: budgetCost}, nil)
	return admit.Decision{}, err
}

// BenchmarkAllowOrderedCost is AllowOrdered taking budgetCost tokens from
// each bucket.
func BenchmarkAllowOrderedCost(b *testing.B) { runSerial(b, "ordered-cost", costPaths, orderedCost) }

// BenchmarkPeek is Peek on every two-bucket path.
func BenchmarkPeek(b *testing.B) { runSerial(b, "peek", twoBucketPaths, peek) }

// BenchmarkPeekOneBucket is Peek on every one-bucket path.
func BenchmarkPeekOneBucket(b *testing.B) { runSerial(b, "peek-one", oneBucketPaths, peekOne) }

// BenchmarkRefund is Refund to two buckets that exist, so every timed
// refund writes both.
func BenchmarkRefund(b *testing.B) { runSerial(b, "refund", costPaths, refundWithKeys(refund)) }

// BenchmarkRefundOneBucket is Refund to one bucket.
func BenchmarkRefundOneBucket(b *testing.B) {
	runSerial(b, "refund-one", []benchPath{{"allow", roomy, admit.Spec{}, 0}}, refundWithKeys(refundOne))
}

// refundWithKeys makes sure the buckets exist before refunding (a refund
// to an absent key writes nothing, which would measure another path): it
// charges them once, on the first call for each pair of keys.
func refundWithKeys(d decider) decider {
	seen := map[string]bool{}
	return func(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
		if !seen[k1] {
			seen[k1] = true
			var second *admit.Request
			if !p.second.IsZero() {
				second = &admit.Request{Key: k2, Spec: p.second}
			}
			if _, err := n.l.AllowOrdered(ctx, admit.Request{Key: k1, Spec: p.first}, second); err != nil {
				return admit.Decision{}, err
			}
		}
		return d(ctx, n, k1, k2, p)
	}
}

// TestBudgetAllocations holds the Budget API to its allocation budgets on
// a real server, with the benchmarks' client, exactly as measured: an
// admission (AllowOrdered, Peek) allocates nothing, a denial and a Refund
// once (valkey-go's string reply), AllowOrderedOnce twice (the record's
// name and its argument), on two buckets and on one; an Acquire and its
// Release five times; WithObserver adds nothing. With the one-bucket
// admission's reply made a string again, "AllowOrdered one bucket" and
// "Peek one bucket" fail at 1 alloc. (B/op is the
// benchmarks' to report: AllocsPerRun counts allocations only.)
func TestBudgetAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes what allocates; run without -race")
	}
	srv := testserver.Shared(t)
	// newBenchClient's options: pipelined from the first call, one node,
	// no background PINGs.
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{srv.Addr}, DisableCache: true, AlwaysPipelining: true,
		ForceSingleClient: true, Dialer: net.Dialer{KeepAlive: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := admit.New(c)
	var calls [256]int // by Op, a uint8
	observed := admit.New(c, admit.WithObserver(func(o admit.Observation) { calls[o.Op]++ }))
	ctx := context.Background()
	p := testserver.Prefix(t, testserver.NewClient(t, srv))
	first, second := admit.Request{Key: p + "a", Spec: roomy, Cost: budgetCost}, admit.Request{Key: p + "b", Spec: roomy, Cost: budgetCost}
	shut := admit.Request{Key: p + "shut", Spec: tight} // drained by the warm-up's first call
	slot := admit.LeaseRequest{Key: p + "conc", Spec: admit.MustConcurrency(1, time.Hour), Name: "job-1"}
	onceID := 0
	for _, tc := range []struct {
		name string
		max  float64
		call func() error
	}{
		// An admission's reply is an integer (decode): nothing to allocate.
		{"AllowOrdered", 0, func() error { _, err := l.AllowOrdered(ctx, first, &second); return err }},
		{"AllowOrdered one bucket", 0, func() error { _, err := l.AllowOrdered(ctx, first, nil); return err }},
		// A denial's is a string: valkey-go's one small allocation.
		{"AllowOrdered denied", 1, func() error { _, err := l.AllowOrdered(ctx, shut, nil); return err }},
		{"Peek", 0, func() error { _, err := l.Peek(ctx, first, &second); return err }},
		{"Peek one bucket", 0, func() error { _, err := l.Peek(ctx, first, nil); return err }},
		{"Refund", 1, func() error { return l.Refund(ctx, first, &second) }},
		{"Refund one bucket", 1, func() error { return l.Refund(ctx, first, nil) }},
		// The record's name is built for each call (a replay here, after
		// the warm-up's first call).
		{"AllowOrderedOnce", 2, func() error { _, err := l.AllowOrderedOnce(ctx, "job-1", first, &second); return err }},
		// A new id each call, refused by the second bucket: the record's
		// name and window, the id, the reply.
		{"AllowOrderedOnce second denied", 4, func() error {
			onceID++
			d, err := l.AllowOrderedOnce(ctx, strconv.Itoa(onceID), first, &shut)
			if err == nil && d.Denied != 2 {
				err = fmt.Errorf("got %v, want a second-bucket denial", d)
			}
			return err
		}},
		// WithObserver: reporting each call allocates nothing more.
		{"AllowOrdered observed", 0, func() error { _, err := observed.AllowOrdered(ctx, first, &second); return err }},
		{"Peek observed", 0, func() error { _, err := observed.Peek(ctx, first, &second); return err }},
		{"Refund observed", 1, func() error { return observed.Refund(ctx, first, &second) }},
		// A lease's pair of calls: the Lease and its two replies among
		// them, and no more observed.
		{"Acquire and Release", 5, func() error { return acquireRelease(ctx, l, slot, &first) }},
		{"Acquire and Release observed", 5, func() error { return acquireRelease(ctx, observed, slot, &first) }},
	} {
		var err error
		for range 3 { // warm up: connection, pipeline, script cache
			if err = tc.call(); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		// The least of three runs: a background allocation of valkey-go's
		// (a buffer growing once) must not fail the budget; a call over
		// budget is over it in every run.
		allocs := -1.0
		for range 3 {
			a := testing.AllocsPerRun(200, func() {
				if e := tc.call(); e != nil {
					err = e
				}
			})
			if allocs < 0 || a < allocs {
				allocs = a
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if allocs > tc.max {
			t.Errorf("%s: %v allocs a call, want at most %v", tc.name, allocs, tc.max)
		}
		t.Logf("%s: %v allocs a call", tc.name, allocs)
	}
	for _, op := range []admit.Op{admit.OpTake, admit.OpPeek, admit.OpRefund, admit.OpAcquire, admit.OpRelease} {
		if calls[op] == 0 {
			t.Errorf("the observer saw no %v call", op)
		}
	}
}

// acquireRelease takes slot's one lease with first's Cost, and releases it.
func acquireRelease(ctx context.Context, l *admit.Limiter, slot admit.LeaseRequest, first *admit.Request) error {
	x, err := l.Acquire(ctx, slot, first, nil)
	if err != nil {
		return err
	}
	if !x.Granted() {
		return fmt.Errorf("%v: want granted", x)
	}
	if live, err := x.Release(ctx); !live || err != nil {
		return fmt.Errorf("release of a granted lease: %v, %v; want true", live, err)
	}
	return nil
}

// onceSeq makes every AllowOrderedOnce of the benchmark a first call with
// its id, the path a service takes on every decision (a retry is rare).
var onceSeq atomic.Int64

// orderedOnce is AllowOrderedOnce with a fresh id: it decides as
// AllowOrdered does and records the reply under the id.
func orderedOnce(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (admit.Decision, error) {
	id := strconv.FormatInt(onceSeq.Add(1), 10)
	return n.l.AllowOrderedOnce(ctx, id, admit.Request{Key: k1, Spec: p.first}, &admit.Request{Key: k2, Spec: p.second})
}

// BenchmarkAllowOrderedOnce is AllowOrdered made retry-safe by an id, side
// by side with BenchmarkAllowOrdered (same paths, same nets): its cost is
// the record's GET and SET in the script, and the id's and record key's
// allocations on the client.
func BenchmarkAllowOrderedOnce(b *testing.B) {
	runSerial(b, "ordered-once", twoBucketPaths, orderedOnce)
}
