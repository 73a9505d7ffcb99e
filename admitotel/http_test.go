package admitotel_test

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/admitotel"
)

// TestHTTPPolicy: a refusal is counted under the policy of the part that
// refused; the rest under the first part's (the concurrency part's when
// the Rule has no bucket). Outcome names are in snake case; one that is
// not an Outcome's is "_OTHER".
func TestHTTPPolicy(t *testing.T) {
	mp, reader := meter()
	hook, err := admitotel.HTTPOutcome(mp)
	if err != nil {
		t.Fatal(err)
	}
	rule := admithttp.Rule{
		First:      admithttp.Bucket{Key: "ip:1", Policy: "per-ip"},
		Second:     &admithttp.Bucket{Key: "org:1", Policy: "per-org"},
		Concurrent: &admithttp.Concurrent{Key: "conc:1", Policy: "in-flight"},
	}
	hook(admithttp.Event{Outcome: admithttp.Admitted, Rule: rule, Lease: &admit.Lease{}})
	hook(admithttp.Event{Outcome: admithttp.Refused, Rule: rule, Lease: &admit.Lease{Denied: admit.PartFirst}})
	hook(admithttp.Event{Outcome: admithttp.Refused, Rule: rule, Lease: &admit.Lease{Denied: admit.PartSecond}})
	hook(admithttp.Event{Outcome: admithttp.Refused, Rule: rule, Lease: &admit.Lease{Denied: admit.PartConcurrency}})
	hook(admithttp.Event{Outcome: admithttp.Refused, Rule: admithttp.Rule{First: rule.First, Second: rule.Second}, Decision: admit.Decision{Denied: 2}})
	hook(admithttp.Event{Outcome: admithttp.Admitted, Rule: admithttp.Rule{Concurrent: rule.Concurrent}})
	hook(admithttp.Event{Outcome: admithttp.Outcome(200), Rule: rule})
	hook(admithttp.Event{Outcome: admithttp.OutageRefused, Rule: rule})
	w := want{}
	edge := func(outcome, policy string, n int64) {
		w.add("admit.edge.requests", n, attribute.String("admit.edge", "http"),
			attribute.String("admit.edge.outcome", outcome), attribute.String("admit.policy", policy))
	}
	edge("admitted", "per-ip", 1)
	edge("refused", "per-ip", 1)
	edge("refused", "per-org", 2)
	edge("refused", "in-flight", 1)
	edge("admitted", "in-flight", 1)
	edge("_OTHER", "per-ip", 1)
	edge("outage_refused", "per-ip", 1)
	diff(t, w, collect(t, reader))
}
