package admitotel

import (
	"strings"

	"go.opentelemetry.io/otel/metric"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
)

// HTTPOutcome returns a hook for admithttp.WithOutcome that counts each
// request's Outcome in mp's admit.edge.requests, with admit.edge "http",
// the Outcome's name in snake case ("outage_served") as
// admit.edge.outcome, and the deciding part's policy name. It returns an
// error when mp refuses the instrument.
func HTTPOutcome(mp metric.MeterProvider, opts ...Option) (func(admithttp.Event), error) {
	e, err := NewEdge(mp, "http", opts...)
	if err != nil {
		return nil, err
	}
	var names [256]string // every Outcome's, those added later too
	for o := range names {
		names[o] = OutcomeName(admithttp.Outcome(o).String())
	}
	return func(ev admithttp.Event) {
		r := EdgeRequest{Outcome: names[ev.Outcome], Err: ev.Err}
		r.Policy, r.Key = httpPart(ev)
		e.Record(r)
	}, nil
}

// httpPart returns the policy and key of ev's Rule that decided: the
// refusing part of a refusal, else the first part.
func httpPart(ev admithttp.Event) (policy, key string) {
	rule := ev.Rule
	if ev.Outcome == admithttp.Refused || ev.Outcome == admithttp.ShadowWouldRefuse {
		denied := admit.Part(ev.Decision.Denied)
		if ev.Lease != nil {
			denied = ev.Lease.Denied
		}
		switch {
		case denied == admit.PartConcurrency && rule.Concurrent != nil:
			return rule.Concurrent.Policy, rule.Concurrent.Key
		case denied == admit.PartSecond && rule.Second != nil:
			return rule.Second.Policy, rule.Second.Key
		}
	}
	if rule.First.Key == "" && rule.Concurrent != nil {
		return rule.Concurrent.Policy, rule.Concurrent.Key
	}
	return rule.First.Policy, rule.First.Key
}

// OutcomeName returns an edge Outcome's name as admit.edge.outcome writes
// it: in snake case, "outage_served" for "outage-served", and "_OTHER"
// for a name that is not one ("Outcome(12)").
func OutcomeName(s string) string {
	if s == "" || strings.ContainsAny(s, "() ") {
		return other
	}
	return strings.ReplaceAll(s, "-", "_")
}
