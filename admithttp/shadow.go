package admithttp

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
)

// ShadowPrefix starts every key a shadow rule decides on: a Shadow named
// n decides a bucket with key k on the key ShadowPrefix + n + ":" + k. The
// prefix holds no brace, so the key keeps k's hash tag (both keys of a
// shadow Rule stay in one cluster slot), and the middleware refuses
// enforced keys that start with it, so a shadow rule never reads or writes
// an enforced bucket.
const ShadowPrefix = "admit-shadow:"

// A Shadow is a candidate rule: decided on every request, on keys of its
// own, reported, and never enforced. The intended use is trying a new Spec
// on production traffic before enforcing it: return the enforced Rule with
// the candidate Spec, and count in Report what the candidate would have
// refused.
//
// A shadow decision is one more round trip per request, made after the
// enforced one and before the response. It charges its buckets as the rule
// would if enforced (all or nothing), but nothing else: refunds a handler
// makes with [Admission] go to the enforced buckets only. A shadow decides
// buckets only: the concurrency part of a candidate Rule is left out (a
// shadow lease would have to be held while the handler runs), and a
// candidate with no bucket is skipped.
type Shadow struct {
	// Name tells shadows apart in reports and in their keys. It must be
	// printable ASCII without '{' or '}', not empty, and unique among the
	// middleware's shadows.
	Name string
	// Rule returns the candidate Rule for r, given the Rule the middleware
	// enforces (the zero Rule when none applies; a copy that Rule may
	// change). The zero Rule skips the shadow for r. Keys are used under
	// ShadowPrefix + Name + ":"; give them as you would enforce them.
	Rule func(r *http.Request, enforced Rule) Rule
	// Report receives every shadow decision, on the request's goroutine,
	// before the response is written.
	Report func(ShadowReport)
}

// A ShadowReport is one shadow decision.
type ShadowReport struct {
	// Name is the Shadow's name.
	Name string
	// Request is the request decided.
	Request *http.Request
	// Rule is the candidate Rule as decided: its keys start with
	// ShadowPrefix + Name + ":".
	Rule Rule
	// Decision is the candidate's Decision: !Decision.Allowed() with a nil
	// Err is a request the candidate would have refused.
	Decision admit.Decision
	// Err is the shadow decision's error, if any (the request was
	// answered as the enforced rule and the Outage say, regardless).
	Err error
	// Enforced is the enforced Rule's Decision. Its Allowed is false when
	// the enforced rule refused (a concurrency refusal included: see
	// EnforcedLease), and also when no Rule applied or its decision
	// failed. EnforcedAdmitted tells for every Rule.
	Enforced admit.Decision
	// EnforcedLease is the enforced Acquire's outcome when the enforced
	// Rule had a concurrency part (Granted when it admitted the
	// request), nil otherwise.
	EnforcedLease *admit.Lease
}

// EnforcedAdmitted reports whether the enforced Rule admitted the request:
// its Decision was Allowed, or, with a concurrency part, its Lease was
// Granted.
func (r ShadowReport) EnforcedAdmitted() bool {
	if r.EnforcedLease != nil {
		return r.EnforcedLease.Granted()
	}
	return r.Enforced.Allowed()
}

// WithShadow adds a shadow rule; give it once per Shadow.
func WithShadow(s Shadow) Option {
	return optionFunc(func(c *config) error {
		if err := edge.CheckShadow(s.Name, c.shadowNames, s.Rule != nil, s.Report != nil, "request"); err != nil {
			return fmt.Errorf("admithttp: WithShadow: %w", err)
		}
		c.shadows, c.shadowNames = append(c.shadows, s), append(c.shadowNames, s.Name)
		return nil
	})
}

// runShadows decides and reports every shadow rule for r.
func (m *middleware) runShadows(r *http.Request, enforced Rule, res edge.Result) {
	for _, s := range m.shadows {
		rule := s.Rule(r, enforced.Clone())
		rule = rule.Clone()
		rule.Concurrent = nil // buckets only
		if rule.IsZero() {
			continue
		}
		prefix := ShadowPrefix + s.Name + ":"
		for _, b := range []*Bucket{&rule.First, rule.Second} {
			if b != nil && b.Key != "" { // an empty key stays empty: checkRule refuses it
				b.Key = prefix + b.Key
			}
		}
		rep := ShadowReport{Name: s.Name, Request: r, Rule: rule, Enforced: res.Decision, EnforcedLease: res.Lease}
		if rep.Err = checkShadowRule(rule); rep.Err == nil {
			var res edge.Result
			res, rep.Err = edge.Decide(r.Context(), m.dec, rule, m.timeout)
			rep.Decision = res.Decision
		}
		s.Report(rep)
		if rep.Err == nil && !rep.Decision.Allowed() && m.outcome != nil {
			m.outcome(Event{Request: r, Outcome: ShadowWouldRefuse, Rule: rule, Decision: rep.Decision, Shadow: s.Name})
		}
	}
}

// checkShadowRule is checkRule for a candidate, whose keys are in the
// shadow namespace by construction.
func checkShadowRule(rule Rule) error {
	return checkRule(shadowless(rule))
}

// shadowless returns rule with ShadowPrefix taken off its keys, for
// checkRule.
func shadowless(rule Rule) Rule {
	rule = rule.Clone()
	for _, b := range []*Bucket{&rule.First, rule.Second} {
		if b != nil {
			b.Key = strings.TrimPrefix(b.Key, ShadowPrefix)
		}
	}
	return rule
}
