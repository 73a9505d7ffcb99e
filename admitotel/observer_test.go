package admitotel_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/admitotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// want is the expected count of each series.
type want map[series]int64

func (w want) add(instrument string, n int64, kv ...attribute.KeyValue) {
	w[name(instrument, attribute.NewSet(kv...))] += n
}

// call expects one observed call of op with outcome, on policy (none if
// empty): its decision (or refund) and its duration.
func (w want) call(op, outcome, policy string, kv ...attribute.KeyValue) {
	var pol []attribute.KeyValue
	if policy != "" {
		pol = append(pol, attribute.String("admit.policy", policy))
	}
	var errType []attribute.KeyValue
	for _, a := range kv {
		if a.Key == "error.type" {
			errType = append(errType, a)
		}
	}
	if op == "refund" {
		w.add("admit.client.refunds", 1, slices.Concat(errType, pol)...)
		if len(errType) == 0 { // the scenario refunds one token
			w.add("admit.client.refunded_tokens", 1, pol...)
		}
	} else {
		w.add("admit.client.decisions", 1, slices.Concat([]attribute.KeyValue{
			attribute.String("db.operation.name", op), attribute.String("admit.outcome", outcome)}, kv, pol)...)
	}
	w.add("db.client.operation.duration", 1, slices.Concat([]attribute.KeyValue{
		attribute.String("db.system.name", "valkey"), attribute.String("db.operation.name", op)}, errType, pol)...)
}

// diff reports every series whose count is not the expected one.
func diff(t *testing.T, w want, got map[series]int64) {
	t.Helper()
	for s, n := range w {
		if got[s] != n {
			t.Errorf("%s = %d, want %d", s, got[s], n)
		}
	}
	for s, n := range got {
		if _, ok := w[s]; !ok && n != 0 {
			t.Errorf("%s = %d, want none", s, n)
		}
	}
}

func denied(part string) attribute.KeyValue   { return attribute.String("admit.denied_by", part) }
func errType(class string) attribute.KeyValue { return attribute.String("error.type", class) }

// policyOf names a key's policy by its prefix, as "api" for "api:a".
func policyOf(key string) string {
	p, _, _ := strings.Cut(key, ":")
	return p
}

// errClass is a call error's class as the test sees it, independently of
// admitotel's own.
func errClass(err error) string {
	switch {
	case errors.Is(err, admit.ErrOutcomeUnknown):
		return "outcome_unknown"
	case errors.Is(err, admit.ErrNotExecuted):
		return "not_executed"
	}
	return fmt.Sprintf("unexpected error %v", err)
}

// TestIntegrationScenario: a scripted run on a real server gives the exact
// count of every outcome: admissions, both denials, a concurrency refusal,
// replays of a once id and of a lease, a lease's extension, release,
// expiry, a refund, an invalid request, a wrong-type key, a killed server,
// and the HTTP edge's admissions, refusal and outage. Every call is also a
// span, with no key in it.
func TestIntegrationScenario(t *testing.T) {
	c, kill := server(t)
	mp, reader := meter()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	// The Limiter's calls run under the caller's span; the edge's under
	// their requests' contexts, which hold none.
	ctx, parent := tp.Tracer("scenario").Start(ctx(t), "scenario")
	observe, err := admitotel.NewObserver(mp, admitotel.WithTracerProvider(tp), admitotel.WithPolicy(policyOf))
	if err != nil {
		t.Fatal(err)
	}
	lim := admit.New(c, admit.WithObserver(observe))
	w := want{}
	calls := 0
	hour := admit.Every(time.Hour)
	api := func(k string) admit.Request { return admit.Request{Key: "api:" + k, Spec: admit.MustSpec(hour, 2)} }
	org := admit.Request{Key: "org:1", Spec: admit.MustSpec(hour, 3)}
	check := func(step string, d admit.Decision, err error, wantDenied uint8) {
		t.Helper()
		calls++
		if err != nil || d.Allowed() != (wantDenied == 0) || d.Denied != wantDenied {
			t.Fatalf("%s: %v, %v; want denied %d", step, d, err, wantDenied)
		}
	}

	// Buckets: api:a holds 2, org:1 holds 3.
	for range 2 {
		d, err := lim.AllowOrdered(ctx, api("a"), &org)
		check("take a", d, err, 0)
		w.call("take", "allowed", "api")
	}
	d, err := lim.AllowOrdered(ctx, api("a"), &org)
	check("take a, a empty", d, err, 1)
	w.call("take", "denied", "api", denied("first"))
	d, err = lim.AllowOrdered(ctx, api("b"), &org)
	check("take b", d, err, 0)
	w.call("take", "allowed", "api")
	d, err = lim.AllowOrdered(ctx, api("b"), &org)
	check("take b, org empty", d, err, 2)
	w.call("take", "denied", "api", denied("second"))
	d, err = lim.Peek(ctx, api("a"), nil)
	check("peek a", d, err, 1)
	w.call("peek", "denied", "api", denied("first"))

	once := admit.Request{Key: "once:1", Spec: admit.MustSpec(hour, 5)}
	d, err = lim.AllowOrderedOnce(ctx, "job-1", once, nil)
	check("once", d, err, 0)
	w.call("once", "allowed", "once")
	d, err = lim.AllowOrderedOnce(ctx, "job-1", once, nil)
	check("once again", d, err, 0)
	if !d.Replayed() {
		t.Fatalf("once again: %v not replayed", d)
	}
	w.call("once", "replayed", "once")

	if err := lim.Refund(ctx, api("a"), nil); err != nil {
		t.Fatal(err)
	}
	calls++
	w.call("refund", "", "api")

	// A concurrency of 1: h1 holds it, h2 is refused, h1 again is a replay.
	conc := admit.LeaseRequest{Key: "conc:1", Spec: admit.MustConcurrency(1, time.Minute), Name: "h1"}
	x1, err := lim.Acquire(ctx, conc, nil, nil)
	if err != nil || !x1.Granted() {
		t.Fatalf("acquire h1: %v, %v", x1, err)
	}
	w.call("acquire", "allowed", "conc")
	other := conc
	other.Name = "h2"
	x2, err := lim.Acquire(ctx, other, nil, nil)
	if err != nil || x2.Denied != admit.PartConcurrency {
		t.Fatalf("acquire h2: %v, %v", x2, err)
	}
	w.call("acquire", "denied", "conc", denied("concurrency"))
	x3, err := lim.Acquire(ctx, conc, nil, nil)
	if err != nil || !x3.Replayed() {
		t.Fatalf("acquire h1 again: %v, %v", x3, err)
	}
	w.call("acquire", "replayed", "conc")
	calls += 3
	// Two Leases of h1 are held: the grant and its replay.
	if got := collect(t, reader)[name("admit.client.active_leases", attribute.NewSet(attribute.String("admit.policy", "conc")))]; got != 2 {
		t.Errorf("active leases after the acquires = %d, want 2", got)
	}
	if live, err := x1.Extend(ctx); !live || err != nil {
		t.Fatalf("extend h1: %v, %v", live, err)
	}
	w.call("extend", "extended", "conc")
	if live, err := x1.Release(ctx); !live || err != nil {
		t.Fatalf("release h1: %v, %v", live, err)
	}
	w.call("release", "released", "conc")
	if live, err := x3.Release(ctx); live || err != nil {
		t.Fatalf("release h1's replay: %v, %v", live, err)
	}
	w.call("release", "expired", "conc")
	if live, err := x2.Release(ctx); live || err != nil {
		t.Fatalf("release the refused h2: %v, %v", live, err)
	}
	w.call("release", "not_held", "conc")
	calls += 4
	w.add("admit.client.active_leases", 0, attribute.String("admit.policy", "conc"))

	_, err = lim.AllowOrdered(ctx, admit.Request{Spec: admit.MustSpec(hour, 1)}, nil)
	if !errors.Is(err, admit.ErrInvalidRequest) {
		t.Fatalf("empty key: %v", err)
	}
	calls++
	w.call("take", "error", "", errType("invalid"))
	if err := c.Do(ctx, c.B().Set().Key("api:wrong").Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err = lim.AllowOrdered(ctx, api("wrong"), nil)
	if !errors.Is(err, admit.ErrWrongType) {
		t.Fatalf("wrong type: %v", err)
	}
	calls++
	w.call("take", "error", "api", errType("wrong_type"))

	// The HTTP edge: one request per client allowed; on an outage, the
	// not-executed are served and the outcome-unknown refused.
	edgeHook, err := admitotel.HTTPOutcome(mp)
	if err != nil {
		t.Fatal(err)
	}
	events := map[admithttp.Outcome]int{}
	edgeErrs := map[string]int{}
	mw, err := admithttp.New(lim, func(r *http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Key: "ip:" + r.Header.Get("X-Client"), Spec: admit.MustSpec(hour, 1), Policy: "per-client"}}
	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse}, admithttp.WithOutcome(func(ev admithttp.Event) {
		events[ev.Outcome]++
		if ev.Err != nil {
			edgeErrs[errClass(ev.Err)]++
		}
		edgeHook(ev)
	}))
	if err != nil {
		t.Fatal(err)
	}
	// New sends nothing (it tells a Limiter without a client from
	// package admit's own hook): no call to count.
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	serve := func(client string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Client", client)
		h.ServeHTTP(httptest.NewRecorder(), r)
		calls++
	}
	serve("10.0.0.1")
	serve("10.0.0.1")
	serve("10.0.0.2")
	if events[admithttp.Admitted] != 2 || events[admithttp.Refused] != 1 {
		t.Fatalf("edge before the outage: %v", events)
	}
	w.call("all", "allowed", "ip")
	w.call("all", "allowed", "ip")
	w.call("all", "denied", "ip", denied("first"))
	edge := func(outcome string, n int64, kv ...attribute.KeyValue) {
		w.add("admit.edge.requests", n, slices.Concat([]attribute.KeyValue{attribute.String("admit.edge", "http"),
			attribute.String("admit.edge.outcome", outcome), attribute.String("admit.policy", "per-client")}, kv)...)
	}
	edge("admitted", 2)
	edge("refused", 1)

	// The killed server: the call in flight on a dead connection is of
	// unknown outcome, the ones after it not executed; the test counts
	// each class as the errors say it.
	kill()
	takeErrs := map[string]int{}
	for range 3 {
		_, err := lim.AllowOrdered(ctx, api("c"), nil)
		takeErrs[errClass(err)]++
		calls++
	}
	for range 3 {
		serve("10.0.0.3")
	}
	for class, n := range takeErrs {
		for range n {
			w.call("take", "error", "api", errType(class))
		}
	}
	for class, n := range edgeErrs {
		for range n {
			w.call("all", "error", "ip", errType(class))
		}
	}
	edge("outage_served", int64(events[admithttp.OutageServed]), errType("not_executed"))
	edge("outage_refused", int64(events[admithttp.OutageRefused]), errType("outcome_unknown"))
	if n := events[admithttp.OutageServed] + events[admithttp.OutageRefused]; n != 3 {
		t.Errorf("edge outages = %d (%v), want 3", n, events)
	}
	if events[admithttp.OutageServed] != edgeErrs["not_executed"] || events[admithttp.OutageRefused] != edgeErrs["outcome_unknown"] {
		t.Errorf("edge outages %v, errors %v: the Outage handler did not follow the class", events, edgeErrs)
	}
	if takeErrs["not_executed"] == 0 {
		t.Errorf("no call after the kill was refused before sending: %v", takeErrs)
	}
	diff(t, w, collect(t, reader))
	t.Logf("scenario counts: take %v after the kill, edge %v", takeErrs, events)

	parent.End()
	ended := spans.Ended()
	if len(ended) != calls+1 {
		t.Errorf("%d spans, want one per call and the caller's: %d", len(ended), calls+1)
	}
	for _, s := range ended {
		if s.SpanContext().SpanID() == parent.SpanContext().SpanID() {
			continue
		}
		switch fromEdge := s.Name() == "all"; {
		case fromEdge && s.Parent().IsValid():
			t.Errorf("span %s, from the edge, has a parent; its request's context holds none", s.Name())
		case !fromEdge && s.Parent().SpanID() != parent.SpanContext().SpanID():
			t.Errorf("span %s: parent %v, want the caller's span %v", s.Name(), s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		kv := attribute.NewSet(s.Attributes()...)
		if v, _ := kv.Value("db.system.name"); v.AsString() != "valkey" {
			t.Errorf("span %s: db.system.name %q", s.Name(), v.AsString())
		}
		if v, _ := kv.Value("db.operation.name"); v.AsString() != s.Name() {
			t.Errorf("span %s: db.operation.name %q", s.Name(), v.AsString())
		}
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), ":") || a.Key == "admit.key" {
				t.Errorf("span %s carries a key: %s=%s", s.Name(), a.Key, a.Value.String())
			}
		}
		if e, _ := kv.Value("error.type"); (s.Status().Code == codes.Error) != (e.AsString() != "") || s.Status().Description != e.AsString() {
			t.Errorf("span %s: status %v with error.type %q", s.Name(), s.Status(), e.AsString())
		}
	}
}

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
