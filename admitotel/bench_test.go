package admitotel_test

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitotel"
)

// BenchmarkAdmission: one AllowOrdered on a real server, with no observer,
// with admitotel's metrics, and with its metrics and spans (recorded by
// the SDK, sampled always, exported nowhere), in one run: the ns/op and
// allocs/op differences are admitotel's cost per admission.
func BenchmarkAdmission(b *testing.B) {
	c, _ := server(b)
	ctx := ctx(b)
	mp, _ := meter()
	metrics, err := admitotel.NewObserver(mp, admitotel.WithPolicy(policyOf))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	spans, err := admitotel.NewObserver(mp, admitotel.WithPolicy(policyOf), admitotel.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	req := admit.Request{Key: "api:bench", Spec: admit.MustSpec(admit.Every(time.Microsecond), 1000)}
	for _, bc := range []struct {
		name string
		opts []admit.Option
	}{
		{"observer=off", nil},
		{"observer=metrics", []admit.Option{admit.WithObserver(metrics)}},
		{"observer=metrics+spans", []admit.Option{admit.WithObserver(spans)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lim := admit.New(c, bc.opts...)
			if _, err := lim.AllowOrdered(ctx, req, nil); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := lim.AllowOrdered(ctx, req, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkObserve: admitotel's own cost per observed call, no server:
// metrics alone, and metrics with a span (the SDK, sampled always,
// exported nowhere).
func BenchmarkObserve(b *testing.B) {
	mp, _ := meter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	obs := admit.Observation{Op: admit.OpTake, FirstKey: "api:a", Duration: time.Millisecond}
	for _, bc := range []struct {
		name string
		opts []admitotel.Option
	}{
		{"metrics", []admitotel.Option{admitotel.WithPolicy(policyOf)}},
		{"metrics+spans", []admitotel.Option{admitotel.WithPolicy(policyOf), admitotel.WithTracerProvider(tp)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			observe, err := admitotel.NewObserver(mp, bc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				observe(obs)
			}
		})
	}
}
