package admittest

import "context"

// rule is one conformance rule: its name, which Run gives its subtest and
// users' CI may filter on (so it never changes), and its check, which
// returns nil when the deployment and the Limiter obey the rule, a
// skipError (see skipf) when the rule cannot be checked there, and
// otherwise an error that says what was seen.
type rule struct {
	name string
	run  func(ctx context.Context, e *env) error
}

// rules are every conformance rule, in the order Run and Rules give them:
// from the design table's decisions outwards. Each check lives in the file
// of its topic (rules_<topic>.go).
var rules = []rule{
	// Decisions: the design table, on the server's clock (rules_decisions.go).
	{"transitions", checkTransitions},
	{"bucket-states", checkBucketStates},
	{"first-denial-leaves-second-untouched", checkFirstDenial},
	{"second-denial-charges-first", checkSecondDenial},
	{"both-allow-consume-once", checkBothAllow},
	{"all-or-nothing-second-denial-charges-nothing", checkAllOrNothing},
	{"one-state-for-both-paths", checkSharedState},
	{"key-schema", checkKeySchema},

	// Budget: Cost, Remaining, Peek, Refund and Wait (rules_budget.go).
	{"cost-transitions", checkCostTransitions},
	{"remaining-reported", checkRemainingReported},
	{"peek-writes-nothing", checkPeekWritesNothing},
	{"peek-read-only-user", checkPeekReadOnlyUser},
	{"refund-capped-at-burst", checkRefundCapped},
	{"wait-honours-deadline", checkWaitDeadline},

	// Once: AllowOrderedOnce decides once per id (rules_once.go).
	{"once-survives-a-lost-reply", checkOnceLostReply},
	{"once-replay-is-marked", checkOnceReplayMarked},
	{"once-first-denial-writes-nothing", checkOnceFirstDenial},
	{"once-id-reuse-refused", checkOnceReuse},
	{"once-records-never-collide", checkOnceNoCollision},

	// Errors: refusals write nothing; each error's class is true
	// (rules_errors.go).
	{"wrong-type-writes-nothing", checkWrongType},
	{"corrupt-state-writes-nothing", checkCorruptState},
	{"lost-reply-is-outcome-unknown", checkLostReply},
	{"cancel-in-flight-is-outcome-unknown", checkCancelInFlight},
	{"refused-connection-is-not-executed", checkRefused},

	// Wire: what a decision sends and touches (rules_wire.go).
	{"host-clock-plays-no-part", checkHostClock},
	{"only-declared-keys", checkDeclaredKeys},
	{"one-evalsha-per-decision", checkOneEvalsha},
	{"script-flush-falls-back-once", checkScriptFlush},

	// Concurrency: exact counts under 64 racing goroutines
	// (rules_concurrency.go).
	{"concurrency-exact-count", checkConcurrency},
	{"premium-reservation", checkPremiumReservation},

	// Trust: a bucket's edges, a live Spec change and a hash that is not
	// a bucket (rules_trust.go).
	{"live-spec-change", checkLiveSpecChange},
	{"foreign-hash-refused", checkForeignHash},

	// Leases: concurrency limits, alone and with the buckets
	// (rules_lease.go).
	{"lease-never-more-than-limit", checkLeaseLimit},
	{"lease-dead-holder-freed-at-expiry", checkLeaseDeadHolder},
	{"lease-all-or-nothing", checkLeaseAllOrNothing},
	{"lease-refusal-writes-nothing", checkLeaseRefusalWritesNothing},
	{"lease-release-idempotent", checkLeaseReleaseIdempotent},
	{"lease-retry-safe-by-name", checkLeaseRetrySafe},
	{"lease-least-privilege-user", checkLeaseLeastPrivilege},

	// Cluster: slots and shards; skipped on a standalone server
	// (rules_cluster.go).
	{"cluster-hash-tag", checkClusterHashTag},
	{"cluster-cross-slot-refused", checkClusterCrossSlot},
	{"cluster-shards-independent", checkClusterShards},
}
