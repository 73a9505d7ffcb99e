package admitotel_test

import (
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/admitotel"
)

const distinctKeys = 10000

// TestIntegrationCardinality: 10,000 distinct keys on a real server, and
// as many client keys at the HTTP edge, make one series per instrument:
// no key becomes an attribute.
func TestIntegrationCardinality(t *testing.T) {
	c, _ := server(t)
	ctx := ctx(t)
	mp, reader := meter()
	observe, err := admitotel.NewObserver(mp, admitotel.WithPolicy(policyOf))
	if err != nil {
		t.Fatal(err)
	}
	edge, err := admitotel.HTTPOutcome(mp)
	if err != nil {
		t.Fatal(err)
	}
	lim := admit.New(c, admit.WithObserver(observe))
	spec := admit.MustSpec(admit.Every(time.Hour), 1)
	for i := range distinctKeys {
		key := "user:" + strconv.Itoa(i)
		if d, err := lim.AllowOrdered(ctx, admit.Request{Key: key, Spec: spec}, nil); err != nil || !d.Allowed() {
			t.Fatalf("%s: %v, %v", key, d, err)
		}
		edge(admithttp.Event{Outcome: admithttp.Admitted, Rule: admithttp.Rule{First: admithttp.Bucket{Key: "ip:10.0." + strconv.Itoa(i), Spec: spec, Policy: "per-ip"}}})
	}
	w := want{}
	for range distinctKeys {
		w.call("take", "allowed", "user")
	}
	w.add("admit.edge.requests", distinctKeys, attribute.String("admit.edge", "http"),
		attribute.String("admit.edge.outcome", "admitted"), attribute.String("admit.policy", "per-ip"))
	got := collect(t, reader)
	diff(t, w, got)
	t.Logf("%d distinct keys: %d series", distinctKeys, len(got))
}

// TestPolicyOverflow: a policy function that returns the key, against
// its documentation, still makes at most MaxPolicies policy series, the
// rest counted under "_OTHER".
func TestPolicyOverflow(t *testing.T) {
	mp, reader := meter()
	observe, err := admitotel.NewObserver(mp, admitotel.WithPolicy(func(key string) string { return key }))
	if err != nil {
		t.Fatal(err)
	}
	edge, err := admitotel.HTTPOutcome(mp)
	if err != nil {
		t.Fatal(err)
	}
	for i := range distinctKeys {
		key := "k" + strconv.Itoa(i)
		observe(admit.Observation{Op: admit.OpRefund, Cost: 1, FirstKey: key})
		edge(admithttp.Event{Outcome: admithttp.Refused, Rule: admithttp.Rule{First: admithttp.Bucket{Key: key, Policy: key}}})
	}
	w := want{}
	for i := range distinctKeys {
		p := "k" + strconv.Itoa(i)
		if i >= admitotel.MaxPolicies {
			p = "_OTHER"
		}
		w.call("refund", "", p)
		w.add("admit.edge.requests", 1, attribute.String("admit.edge", "http"),
			attribute.String("admit.edge.outcome", "refused"), attribute.String("admit.policy", p))
	}
	diff(t, w, collect(t, reader))
}

// TestWithKeys: the key becomes an attribute only when asked.
func TestWithKeys(t *testing.T) {
	mp, reader := meter()
	observe, err := admitotel.NewObserver(mp, admitotel.WithKeys())
	if err != nil {
		t.Fatal(err)
	}
	edge, err := admitotel.HTTPOutcome(mp, admitotel.WithKeys())
	if err != nil {
		t.Fatal(err)
	}
	observe(admit.Observation{Op: admit.OpRefund, Cost: 5, FirstKey: "api:a"})
	edge(admithttp.Event{Outcome: admithttp.Unlimited, Rule: admithttp.Rule{First: admithttp.Bucket{Key: "ip:10.0.0.1"}}})
	w := want{}
	w.add("admit.client.refunds", 1, attribute.String("admit.key", "api:a"))
	w.add("admit.client.refunded_tokens", 5, attribute.String("admit.key", "api:a"))
	w.add("db.client.operation.duration", 1, attribute.String("db.system.name", "valkey"),
		attribute.String("db.operation.name", "refund"), attribute.String("admit.key", "api:a"))
	w.add("admit.edge.requests", 1, attribute.String("admit.edge", "http"),
		attribute.String("admit.edge.outcome", "unlimited"), attribute.String("admit.key", "ip:10.0.0.1"))
	diff(t, w, collect(t, reader))
}

// TestObserveAllocations: with metrics alone, a call whose attributes were
// seen before records without allocating.
func TestObserveAllocations(t *testing.T) {
	mp, _ := meter()
	observe, err := admitotel.NewObserver(mp, admitotel.WithPolicy(policyOf))
	if err != nil {
		t.Fatal(err)
	}
	edge, err := admitotel.HTTPOutcome(mp)
	if err != nil {
		t.Fatal(err)
	}
	obs := admit.Observation{Op: admit.OpTake, FirstKey: "api:a", Duration: time.Millisecond}
	ev := admithttp.Event{Outcome: admithttp.Admitted, Rule: admithttp.Rule{First: admithttp.Bucket{Key: "ip:1", Policy: "per-ip"}}}
	observe(obs)
	edge(ev)
	if n := testing.AllocsPerRun(1000, func() { observe(obs) }); n != 0 {
		t.Errorf("observe: %v allocations per call, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { edge(ev) }); n != 0 {
		t.Errorf("HTTP edge: %v allocations per call, want 0", n)
	}
}

// TestObserveConcurrent: goroutines that observe at once, first seeing
// their policies together, lose no count (run with -race).
func TestObserveConcurrent(t *testing.T) {
	mp, reader := meter()
	observe, err := admitotel.NewObserver(mp, admitotel.WithPolicy(policyOf))
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, calls, policies = 4, 1000, admitotel.MaxPolicies
	start, done := make(chan struct{}), make(chan struct{})
	for g := range goroutines {
		go func() {
			defer func() { done <- struct{}{} }()
			<-start
			for i := range calls {
				observe(admit.Observation{Op: admit.OpRefund, Cost: 1, FirstKey: "p" + strconv.Itoa((i*goroutines+g)%policies) + ":k"})
			}
		}()
	}
	close(start)
	for range goroutines {
		<-done
	}
	w := want{}
	for g := range goroutines {
		for i := range calls {
			w.call("refund", "", "p"+strconv.Itoa((i*goroutines+g)%policies))
		}
	}
	diff(t, w, collect(t, reader))
}
