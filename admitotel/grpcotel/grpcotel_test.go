package grpcotel_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"github.com/admitkit/admit/admitotel/grpcotel"
	"github.com/admitkit/admit/admittest"
)

// TestIntegrationOutcomes: on a real server, the gRPC edge's admissions,
// refusal and outage (the server killed) are counted exactly, by outcome,
// policy and error class, with no key.
func TestIntegrationOutcomes(t *testing.T) {
	addr, kill, err := admittest.StartServer()
	if errors.Is(err, admittest.ErrNoServer) && os.Getenv("ADMIT_REQUIRE_SERVER") != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kill)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	reader := sdkmetric.NewManualReader()
	hook, err := grpcotel.Outcome(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	reports := map[admitgrpc.Outcome]int{}
	spec := admit.MustSpec(admit.Every(time.Hour), 1)
	ic, err := admitgrpc.New(admit.New(c), func(call *admitgrpc.Call) admitgrpc.Rule {
		return admitgrpc.Rule{First: admitgrpc.Bucket{Key: "peer:" + call.Metadata.Get("x-client")[0], Spec: spec, Policy: "per-peer"}}
	}, admitgrpc.Outage{NotExecuted: admitgrpc.Serve(), OutcomeUnknown: admitgrpc.Unavailable(time.Second)},
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
			reports[r.Outcome]++
			hook(r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	unary := ic.Unary()
	call := func(client string) {
		ctx := metadata.NewIncomingContext(ctx, metadata.Pairs("x-client", client))
		unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/svc/Method"}, func(context.Context, any) (any, error) { return nil, nil })
	}
	call("a")
	call("a")
	call("b")
	if reports[admitgrpc.Admitted] != 2 || reports[admitgrpc.Refused] != 1 {
		t.Fatalf("before the outage: %v", reports)
	}
	kill()
	for range 3 {
		call("c")
	}
	if n := reports[admitgrpc.OutageServed] + reports[admitgrpc.OutageRefused]; n != 3 {
		t.Fatalf("outages: %v, want 3", reports)
	}
	if reports[admitgrpc.OutageServed] == 0 {
		t.Errorf("no call after the kill was refused before sending: %v", reports)
	}

	want := map[string]int64{}
	add := func(outcome string, n int, kv ...attribute.KeyValue) {
		if n == 0 {
			return
		}
		kv = append(kv, attribute.String("admit.edge", "grpc"), attribute.String("admit.edge.outcome", outcome),
			attribute.String("admit.policy", "per-peer"))
		want[series(attribute.NewSet(kv...))] += int64(n)
	}
	add("admitted", 2)
	add("refused", 1)
	add("outage_served", reports[admitgrpc.OutageServed], attribute.String("error.type", "not_executed"))
	add("outage_refused", reports[admitgrpc.OutageRefused], attribute.String("error.type", "outcome_unknown"))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "admit.edge.requests" {
				t.Errorf("unexpected instrument %s", m.Name)
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				got[series(p.Attributes)] += p.Value
			}
		}
	}
	for s, n := range want {
		if got[s] != n {
			t.Errorf("%s = %d, want %d", s, got[s], n)
		}
	}
	for s, n := range got {
		if _, ok := want[s]; !ok {
			t.Errorf("%s = %d, want none", s, n)
		}
	}
	t.Logf("gRPC edge: %v", reports)
}

func series(set attribute.Set) string {
	s := ""
	for _, kv := range set.ToSlice() {
		s += string(kv.Key) + "=" + kv.Value.String() + ","
	}
	return s
}
