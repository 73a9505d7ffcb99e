// Package grpcotel counts admitgrpc's outcomes in OpenTelemetry metrics: a
// module of its own, so that admitotel's users who serve no gRPC do not
// depend on it.
package grpcotel

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"github.com/admitkit/admit/admitotel"
	"github.com/admitkit/admit/edge"
)

// Outcome returns a hook for admitgrpc.WithOutcomeFunc that counts each
// call's Outcome in mp's admit.edge.requests, with admit.edge "grpc", the
// Outcome's name in snake case ("degraded_admitted") as
// admit.edge.outcome, and the deciding part's policy name. It takes
// admitotel's Options (WithKeys) and returns an error when mp refuses the
// instrument.
func Outcome(mp metric.MeterProvider, opts ...admitotel.Option) (func(admitgrpc.Report), error) {
	e, err := admitotel.NewEdge(mp, "grpc", opts...)
	if err != nil {
		return nil, err
	}
	var names [256]string // every Outcome's, those added later too
	for o := range names {
		names[o] = admitotel.OutcomeName(admitgrpc.Outcome(o).String())
	}
	return func(r admitgrpc.Report) {
		req := admitotel.EdgeRequest{Outcome: names[r.Outcome], Err: r.Err}
		req.Policy, req.Key = part(r)
		e.Record(req)
	}, nil
}

// part returns the policy and key of r's Rule that decided: the refusing
// part of a refusal, else the first part.
func part(r admitgrpc.Report) (policy, key string) {
	var refused admit.Part
	if r.Outcome == admitgrpc.Refused {
		refused = edge.Result{Decision: r.Decision, Lease: r.Lease}.Denied()
	}
	return r.Rule.PolicyOf(refused)
}
