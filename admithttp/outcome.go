package admithttp

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
)

// An Outcome is what the middleware did with one request.
type Outcome uint8

// The outcomes, one per request, and ShadowWouldRefuse, one per shadow rule
// that would have refused the request.
const (
	// Admitted: the limiter admitted the request; the handler ran.
	Admitted Outcome = iota + 1
	// Refused: the limiter refused the request; the refusal was written
	// (429 by default).
	Refused
	// OutageServed: the decision failed and the Outage handler ran the
	// handler ([Serve] does).
	OutageServed
	// OutageRefused: the decision failed and the Outage handler answered
	// without running the handler ([Refuse] does).
	OutageRefused
	// ClientGone: the request's own context ended (its client went away,
	// or a deadline set above passed) before the decision came back,
	// whatever the store's error; no Outage handler ran, and only
	// the status StatusClientClosedRequest was written. Tokens may have
	// been taken if the command was in flight (Event.Err says which
	// class).
	ClientGone
	// ShadowWouldRefuse: a shadow rule would have refused the request
	// (Event.Shadow names it). It comes besides the request's own
	// Outcome, never instead.
	ShadowWouldRefuse
	// Unlimited: classify returned the zero Rule; the handler ran.
	Unlimited
	// RuleError: the Rule was invalid (Event.Err says why); the middleware
	// answered 500.
	RuleError
)

var outcomeNames = [...]string{"", "admitted", "refused", "outage-served", "outage-refused", "client-gone",
	"shadow-would-refuse", "unlimited", "rule-error"}

// String returns the Outcome's name, as "outage-served", for logs and
// metric labels.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o != 0 {
		return outcomeNames[o]
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// An Event is one [Outcome] of one request.
type Event struct {
	// Request is the request.
	Request *http.Request
	// Outcome is what happened to it.
	Outcome Outcome
	// Rule is the Rule classify returned; for ShadowWouldRefuse, the
	// shadow's candidate Rule, its keys under ShadowPrefix.
	Rule Rule
	// Decision is the limiter's Decision for Admitted, Refused and
	// ShadowWouldRefuse; the zero Decision otherwise. With a concurrency
	// part it is the Acquire's decision of the buckets
	// (admit.Lease.Decision; Allowed when granted), and for a concurrency
	// refusal, which a Decision cannot name, it holds the concurrency limit's
	// RetryAfter and the Remaining with Denied 0: read Lease.
	Decision admit.Decision
	// Lease is the Acquire's outcome for Admitted and Refused when the
	// Rule has a concurrency part, nil otherwise: Lease.Denied names the
	// part that refused (admit.PartConcurrency when every lease was held), and
	// Lease.Holders the requests of the key in flight.
	Lease *admit.Lease
	// Shadow is the shadow rule's Name for ShadowWouldRefuse; empty
	// otherwise.
	Shadow string
	// Err is the decision's error for OutageServed, OutageRefused and
	// ClientGone, and the Rule's for RuleError; nil otherwise.
	Err error
}

// WithOutcome calls f with one Event per request, as soon as its Outcome
// is known (before the handler runs for Admitted), and one per shadow rule
// that would have refused it. f runs on the request's goroutine; it must
// not keep Event.Request past its return if it does not own it. Without
// the option, the middleware builds no Event and allocates nothing for
// it. Default: none.
func WithOutcome(f func(Event)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("admithttp: WithOutcome(nil): pass a function, or leave the option out")
		}
		c.outcome = f
		return nil
	})
}

// emit reports an Outcome to the hook, if there is one.
func (m *middleware) emit(r *http.Request, o Outcome, rule Rule, res edge.Result, err error) {
	if m.outcome != nil {
		m.outcome(Event{Request: r, Outcome: o, Rule: rule, Decision: res.Decision, Lease: res.Lease, Err: err})
	}
}
