package admitotel

import (
	"errors"

	"go.opentelemetry.io/otel/attribute"

	"github.com/admitkit/admit"
)

// Attribute keys: OpenTelemetry's database-client conventions where one
// fits, admit.* for the rest.
const (
	keyDBSystem   = attribute.Key("db.system.name")
	keyDBOp       = attribute.Key("db.operation.name")
	keyErrorType  = attribute.Key("error.type")
	keyOutcome    = attribute.Key("admit.outcome")
	keyDeniedBy   = attribute.Key("admit.denied_by")
	keyCached     = attribute.Key("admit.cached")
	keyPolicy     = attribute.Key("admit.policy")
	keyKey        = attribute.Key("admit.key")
	keyEdge       = attribute.Key("admit.edge")
	keyEdgeResult = attribute.Key("admit.edge.outcome")
)

// dbSystem is db.system.name: admit's server, as valkey-go's own
// instrumentation names it.
const dbSystem = "valkey"

// other is OpenTelemetry's value for whatever a bounded attribute cannot
// name.
const other = "_OTHER"

// The values of admit.outcome.
const (
	outcomeAllowed  = "allowed"
	outcomeDenied   = "denied"
	outcomeReplayed = "replayed"
	outcomeError    = "error"
	outcomeRefunded = "refunded"
	outcomeReleased = "released"
	outcomeExtended = "extended"
	outcomeExpired  = "expired"
	outcomeNotHeld  = "not_held"
)

// errorType is error.type: err's class, as docs/errors.md defines them.
// A key of the wrong type and a corrupt state are named apart from the
// not-executed class they belong to: they are a configuration fault, not
// an outage.
func errorType(err error) string {
	switch {
	case errors.Is(err, admit.ErrInvalidRequest), errors.Is(err, admit.ErrInvalidSpec):
		return "invalid"
	case errors.Is(err, admit.ErrWrongType):
		return "wrong_type"
	case errors.Is(err, admit.ErrCorruptState):
		return "corrupt_state"
	case errors.Is(err, admit.ErrOutcomeUnknown):
		return "outcome_unknown"
	case errors.Is(err, admit.ErrNotExecuted):
		return "not_executed"
	}
	return other
}

// deniedBy names the part that refused: "first", "second" or
// "concurrency".
func deniedBy(p admit.Part) string {
	switch p {
	case admit.PartFirst:
		return "first"
	case admit.PartSecond:
		return "second"
	case admit.PartConcurrency:
		return "concurrency"
	}
	return other
}

// A callKey is an observed call's attributes: the key of its cached
// instrument options.
type callKey struct {
	op       admit.Op
	outcome  string
	deniedBy string
	errType  string
	policy   string
	key      string // with WithKeys only
	cached   bool
}

// classify returns o's attributes, but for its policy and key.
func classify(o admit.Observation) callKey {
	k := callKey{op: o.Op, cached: o.Cached}
	switch {
	case o.Err != nil:
		k.outcome, k.errType = outcomeError, errorType(o.Err)
	case o.Op == admit.OpRefund:
		k.outcome = outcomeRefunded
	case o.Op == admit.OpRelease:
		switch {
		case o.Live:
			k.outcome = outcomeReleased
		case o.Lease.Granted():
			k.outcome = outcomeExpired
		default:
			k.outcome = outcomeNotHeld
		}
	case o.Op == admit.OpExtend:
		k.outcome = outcomeExpired
		if o.Live {
			k.outcome = outcomeExtended
		}
	case o.Op == admit.OpAcquire:
		switch x := o.Lease; {
		case x.Replayed():
			k.outcome = outcomeReplayed
		case x.Granted():
			k.outcome = outcomeAllowed
		case x != nil:
			k.outcome, k.deniedBy = outcomeDenied, deniedBy(x.Denied)
		default: // Acquire always returns a Lease; an observer fed by hand may not
			k.outcome, k.deniedBy = outcomeDenied, other
		}
	case o.Decision.Replayed():
		k.outcome = outcomeReplayed
	case o.Decision.Allowed():
		k.outcome = outcomeAllowed
	default:
		k.outcome, k.deniedBy = outcomeDenied, deniedBy(admit.Part(o.Decision.Denied))
	}
	return k
}
