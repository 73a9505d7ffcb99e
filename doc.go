// Package admit decides, in one Valkey round trip, whether a unit of work may
// proceed against one or two token buckets, checked in order.
//
// Standard traffic passes its own bucket and then a shared bucket; premium
// traffic uses only the shared bucket. The shared bucket is charged only when
// the first bucket admits, so standard traffic never eats into the share kept
// for premium:
//
//	first   second   Decision.Denied   state
//	deny    (any)    1                 nothing written; second untouched
//	allow   deny     2                 first charged its Cost; second not written
//	allow   allow    0                 both charged their Cost
//
// Each decision is one Lua script run on the server's clock
// (docs/semantics.md). [Limiter.AllowOrdered] decides as above; [Limiter.AllowAll] charges nothing
// unless both buckets admit. A [Request] may cost several tokens;
// [Limiter.Peek], [Limiter.Refund] and [Limiter.Wait] complete a budget
// (docs/budgets.md). [Limiter.AllowOrderedOnce] decides once per id, so that
// a retry after a lost reply is safe (docs/errors.md). [Limiter.Acquire]
// takes a concurrency lease, alone or with the buckets (docs/leases.md).
//
// A failed call is [ErrNotExecuted] (nothing ran) or [ErrOutcomeUnknown]
// (tokens may have been taken); admit never retries on its own
// (docs/errors.md).
//
// [Local] decides in process memory, and [Degraded] is a Local sized for a
// fleet while the store is down; a [Decider] is any of the three
// (docs/outages.md). The admithttp and admitgrpc packages put a Decider in
// front of an HTTP handler or a gRPC server, on one core, package edge
// (docs/http.md); admittest checks a deployment against every invariant
// admit relies on (docs/conformance.md); the admitotel module exports
// metrics and traces (docs/observing.md).
//
// On a cluster, both keys of a call must hash to one slot: give them a common
// hash tag, as in "rl:{chan:42}:standard" and "rl:{chan:42}:shared"
// (docs/cluster.md).
package admit
