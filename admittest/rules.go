package admittest

import "context"

// rule is one conformance rule: its name, which Run gives its subtest and
// users' CI may filter on (so it never changes); its check, which returns
// nil when the deployment and the Limiter obey the rule, a skipError (see
// skipf) when the rule cannot be checked there, and otherwise an error
// that says what was seen; and its explanation, one line that says what
// the rule holds the Limiter to, which a failure repeats.
type rule struct {
	name        string
	run         func(ctx context.Context, e *env) error
	explanation string
}

// rules are every conformance rule, in the order Run and Rules give them:
// from the design table's decisions outwards. Each check lives in the file
// of its topic (rules_<topic>.go).
var rules = []rule{
	// Decisions: the design table, on the server's clock (rules_decisions.go).
	{"transitions", checkTransitions, "the design table's three rows, on the server's own clock"},
	{"bucket-states", checkBucketStates, "fresh, partly full, empty and just-refilled buckets decide and store what the model says, in either position"},
	{"first-denial-leaves-second-untouched", checkFirstDenial, "when the first bucket denies, the second key is left byte for byte as it was"},
	{"second-denial-charges-first", checkSecondDenial, "when the second bucket denies, the first is charged and the second keeps its fields"},
	{"both-allow-consume-once", checkBothAllow, "when both buckets allow, each loses exactly its Cost"},
	{"all-or-nothing-second-denial-charges-nothing", checkAllOrNothing, "AllowAll: when the second bucket denies, the first is not charged either"},
	{"one-state-for-both-paths", checkSharedState, "one-bucket and two-bucket calls on a key share one bucket state"},
	{"key-schema", checkKeySchema, "a bucket is a hash of tokens and ts, decimal integers in server µs, expiring at burst × interval"},

	// Budget: Cost, Remaining, Peek, Refund and Wait (rules_budget.go).
	{"cost-transitions", checkCostTransitions, "a bucket admits when it holds the Request's Cost and is charged exactly that"},
	{"remaining-reported", checkRemainingReported, "Remaining is what each evaluated bucket holds after the call, -1 for one not evaluated"},
	{"peek-writes-nothing", checkPeekWritesNothing, "Peek returns AllowOrdered's Decision and changes no key, expiry included"},
	{"peek-read-only-user", checkPeekReadOnlyUser, "a read-only ACL user may Peek; its takes and refunds are refused as not executed, writing nothing"},
	{"refund-capped-at-burst", checkRefundCapped, "Refund gives back exactly the Cost, never above the burst, and leaves an absent key absent"},
	{"wait-honours-deadline", checkWaitDeadline, "Wait returns at once when the token comes after the deadline, and is admitted when it comes before"},

	// Once: AllowOrderedOnce decides once per id (rules_once.go).
	{"once-survives-a-lost-reply", checkOnceLostReply, "after a lost reply, the same id replays the Decision made and charges nothing again"},
	{"once-replay-is-marked", checkOnceReplayMarked, "a replayed Decision says so, so that a caller settles a reservation once"},
	{"once-first-denial-writes-nothing", checkOnceFirstDenial, "a first-bucket denial records nothing, and the same id decides again later"},
	{"once-id-reuse-refused", checkOnceReuse, "the same id with another request is refused with ErrOnceIDReused, writing nothing"},
	{"once-records-never-collide", checkOnceNoCollision, "distinct (first key, id) pairs never share a record"},

	// Errors: refusals write nothing; each error's class is true
	// (rules_errors.go).
	{"wrong-type-writes-nothing", checkWrongType, "a key of another type fails the call with ErrWrongType, not executed, no key changed"},
	{"corrupt-state-writes-nothing", checkCorruptState, "a bucket whose fields are not the schema's fails with ErrCorruptState, no key changed"},
	{"lost-reply-is-outcome-unknown", checkLostReply, "a reply lost after the script ran is ErrOutcomeUnknown, and admit does not retry"},
	{"cancel-in-flight-is-outcome-unknown", checkCancelInFlight, "a context that ends while the reply is on its way is ErrOutcomeUnknown, not retried"},
	{"refused-connection-is-not-executed", checkRefused, "an unreachable server is ErrNotExecuted, and nothing reaches it"},
	{"acl-precheck-arity", checkACLPrecheckArity, "every ACL precheck in the script runs under pcall with the argument count the server's COMMAND INFO gives"},
	{"acl-precheck-paths", checkACLPrecheckPaths, "as the least-privilege user, every path that runs an ACL precheck is decided without error"},

	// Wire: what a decision sends and touches (rules_wire.go).
	{"host-clock-plays-no-part", checkHostClock, "the command carries no time: the refill follows the server's TIME alone"},
	{"only-declared-keys", checkDeclaredKeys, "the script writes only the keys it is given"},
	{"one-evalsha-per-decision", checkOneEvalsha, "each decision is exactly one EVALSHA, on the wire and on the server"},
	{"script-flush-falls-back-once", checkScriptFlush, "after SCRIPT FLUSH a call falls back to EVAL once, then EVALSHA again"},

	// Concurrency: exact counts under 64 racing goroutines
	// (rules_concurrency.go).
	{"concurrency-exact-count", checkConcurrency, "64 racing goroutines are admitted exactly burst plus the refill, no more"},
	{"premium-reservation", checkPremiumReservation, "standard traffic never takes the share of the shared bucket kept for premium"},

	// Trust: a bucket's edges, a live Spec change and a hash that is not
	// a bucket (rules_trust.go).
	{"live-spec-change", checkLiveSpecChange, "a new Spec takes effect on a live bucket without resetting it"},
	{"foreign-hash-refused", checkForeignHash, "a hash that is not a bucket fails with ErrCorruptState, and neither key changes"},

	// Leases: concurrency limits, alone and with the buckets
	// (rules_lease.go).
	{"lease-never-more-than-limit", checkLeaseLimit, "racing Acquires are granted exactly the limit, all or nothing with a bucket beside"},
	{"lease-dead-holder-freed-at-expiry", checkLeaseDeadHolder, "a holder that never releases keeps its slot until its lease expires, not a moment longer"},
	{"lease-all-or-nothing", checkLeaseAllOrNothing, "an Acquire takes nothing when any part refuses, and one slot and each Cost once when none does"},
	{"lease-refusal-writes-nothing", checkLeaseRefusalWritesNothing, "a refused Acquire or Extend and a Release of an unknown name write nothing"},
	{"lease-release-idempotent", checkLeaseReleaseIdempotent, "Release frees the slot once; an expired lease cannot be extended; Extend never shortens"},
	{"lease-retry-safe-by-name", checkLeaseRetrySafe, "after a lost reply, the same name returns the granted lease and takes nothing more"},
	{"lease-least-privilege-user", checkLeaseLeastPrivilege, "a user allowed only the documented commands can acquire, extend and release"},

	// Cluster: slots and shards; skipped on a standalone server
	// (rules_cluster.go).
	{"cluster-hash-tag", checkClusterHashTag, "on a cluster, keys with a common hash tag decide as on one server"},
	{"cluster-cross-slot-refused", checkClusterCrossSlot, "on a cluster, keys in different slots are refused with ErrCrossSlot before sending"},
	{"cluster-shards-independent", checkClusterShards, "on a cluster, buckets on different primaries decide independently"},
}
