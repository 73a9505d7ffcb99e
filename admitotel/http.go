package admitotel

import (
	"strings"

	"go.opentelemetry.io/otel/metric"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/edge"
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
// refusing part of a refusal (a shadow's too), else the first part.
func httpPart(ev admithttp.Event) (policy, key string) {
	var refused admit.Part
	if ev.Outcome == admithttp.Refused || ev.Outcome == admithttp.ShadowWouldRefuse {
		refused = edge.Result{Decision: ev.Decision, Lease: ev.Lease}.Denied()
	}
	return ev.Rule.PolicyOf(refused)
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
