package admitgrpc

import (
	"fmt"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
)

// ShadowPrefix starts every key a shadow rule decides on: a Shadow named
// n decides a bucket with key k on the key ShadowPrefix + n + ":" + k, as
// admithttp's shadow rules do. The prefix holds no brace, so the key keeps
// k's hash tag, and the interceptors refuse enforced keys that start with
// it, so a shadow rule never reads or writes an enforced bucket.
const ShadowPrefix = "admit-shadow:"

// A Shadow is a candidate rule: decided on every call, on keys of its own,
// reported, and never enforced. Use it to try a new Spec on production
// traffic before enforcing it.
//
// A shadow decision is one more decision per call (one round trip on a
// Limiter), made after the enforced one and before the handler runs, all
// or nothing as the enforced one. A failed shadow decision only goes to
// its Report.
type Shadow struct {
	// Name tells shadows apart in reports and in their keys. It must be
	// printable ASCII without '{' or '}', not empty, and unique among the
	// interceptors' shadows.
	Name string
	// Rule returns the candidate Rule for c, given the Rule enforced (a
	// copy that Rule may change). NoLimit (or the zero Rule) skips the
	// shadow for c. A shadow decides buckets only: its Rule's concurrency
	// part, if any, is dropped, and a Rule with no bucket skips it.
	Rule func(c *Call, enforced Rule) Rule
	// Report receives every shadow decision, on the call's goroutine.
	Report func(ShadowReport)
}

// A ShadowReport is one shadow decision.
type ShadowReport struct {
	// Name is the Shadow's name.
	Name string
	// Call is the call decided.
	Call *Call
	// Rule is the candidate Rule as decided: its keys start with
	// ShadowPrefix + Name + ":".
	Rule Rule
	// Decision is the candidate's Decision: !Decision.Allowed() with a nil
	// Err is a call the candidate would have refused.
	Decision admit.Decision
	// Err is the shadow decision's error, if any.
	Err error
	// Enforced is the enforced Rule's Decision: the zero Decision when
	// there was none (NoLimit, an invalid Rule, a failed decision).
	Enforced admit.Decision
}

// WithShadow adds a shadow rule; give it once per Shadow.
func WithShadow(s Shadow) Option {
	return optionFunc(func(c *config) error {
		if err := edge.CheckShadow(s.Name, c.shadowNames, s.Rule != nil, s.Report != nil, "call"); err != nil {
			return fmt.Errorf("admitgrpc: WithShadow: %w", err)
		}
		c.shadows, c.shadowNames = append(c.shadows, s), append(c.shadowNames, s.Name)
		return nil
	})
}

// runShadows decides and reports every shadow rule for c.
func (ic *Interceptors) runShadows(c *Call, enforced Rule, d admit.Decision) {
	for _, s := range ic.shadows {
		rule := s.Rule(c, enforced.Clone()).Clone()
		rule.Concurrent = nil // buckets only: a shadow takes no lease
		if rule.IsZero() || (rule.First.Key == "" && rule.Second == nil && rule.First.Spec.IsZero()) {
			continue
		}
		_, invalid := checkRule(rule) // as given, before the prefix
		prefix := ShadowPrefix + s.Name + ":"
		for _, b := range []*Bucket{&rule.First, rule.Second} {
			if b != nil && b.Key != "" { // an empty key stays empty: refused
				b.Key = prefix + b.Key
			}
		}
		rep := ShadowReport{Name: s.Name, Call: c, Rule: rule, Enforced: d}
		if invalid != nil {
			rep.Err = invalid
		} else {
			var res edge.Result
			res, rep.Err = edge.Decide(c.Context, ic.dec, rule, ic.timeout)
			rep.Decision = res.Decision
		}
		s.Report(rep)
	}
}
