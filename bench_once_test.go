package admit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
)

// onceSeq makes every AllowOrderedOnce of the benchmark a first call with
// its id, the path a service takes on every decision (a retry is rare).
var onceSeq atomic.Int64

// orderedOnce is AllowOrderedOnce with a fresh id: it decides as
// AllowOrdered does and records the reply under the id.
func orderedOnce(ctx context.Context, n *benchNet, k1, k2 string, p benchPath) (Decision, error) {
	id := strconv.FormatInt(onceSeq.Add(1), 10)
	return n.l.AllowOrderedOnce(ctx, id, Request{Key: k1, Spec: p.first}, &Request{Key: k2, Spec: p.second})
}

// BenchmarkAllowOrderedOnce is AllowOrdered made retry-safe by an id, side
// by side with BenchmarkAllowOrdered (same paths, same nets): its cost is
// the record's GET and SET in the script, and the id's and record key's
// allocations on the client.
func BenchmarkAllowOrderedOnce(b *testing.B) {
	runSerial(b, "ordered-once", twoBucketPaths, orderedOnce)
}
