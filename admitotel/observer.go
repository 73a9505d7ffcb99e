package admitotel

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitkit/admit"
)

// scope is the instrumentation scope of every meter and tracer.
const scope = "github.com/admitkit/admit/admitotel"

// durationBuckets are db.client.operation.duration's bucket bounds, in
// seconds: from 100 µs, a round trip on one host, to 1 s, past any
// timeout a limiter should have.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// observer records Observations.
type observer struct {
	decisions metric.Int64Counter
	duration  metric.Float64Histogram
	leases    metric.Int64UpDownCounter
	refunds   metric.Int64Counter
	refunded  metric.Int64Counter
	tracer    trace.Tracer // nil without a TracerProvider
	policyOf  func(key string) string
	keys      bool
	calls     *cache[callKey, callOptions]
}

// callOptions are one callKey's instrument options, built once.
type callOptions struct {
	decision  []metric.AddOption    // admit.client.decisions
	duration  []metric.RecordOption // db.client.operation.duration
	policy    []metric.AddOption    // admit.client.active_leases
	refund    []metric.AddOption    // admit.client.refunds and admit.client.refunded_tokens
	span      []trace.SpanStartOption
	spanAttrs []attribute.KeyValue
	spanName  string
	errType   string
}

// NewObserver returns an observer for admit.WithObserver that records each
// call of the Limiter in mp's instruments (docs/observing.md lists them),
// and as a span with [WithTracerProvider], a child of the call's context's
// span. It allocates
// nothing per call with metrics alone, once a call's attributes have been
// seen. It returns an error when mp is nil or refuses an instrument.
func NewObserver(mp metric.MeterProvider, opts ...Option) (func(admit.Observation), error) {
	if mp == nil {
		return nil, fmt.Errorf("admitotel: NewObserver(nil): pass a MeterProvider, such as otel.GetMeterProvider()")
	}
	cfg := newConfig(opts)
	m := mp.Meter(scope)
	o := &observer{policyOf: cfg.policyOf, keys: cfg.keys}
	var err error
	if o.decisions, err = m.Int64Counter("admit.client.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Calls of an admit Limiter, refunds aside, by operation and outcome.")); err != nil {
		return nil, fmt.Errorf("admitotel: %w", err)
	}
	if o.duration, err = m.Float64Histogram("db.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of admit's calls to the server, round trip included."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, fmt.Errorf("admitotel: %w", err)
	}
	if o.leases, err = m.Int64UpDownCounter("admit.client.active_leases", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases granted and not yet released by this process's holders.")); err != nil {
		return nil, fmt.Errorf("admitotel: %w", err)
	}
	if o.refunds, err = m.Int64Counter("admit.client.refunds", metric.WithUnit("{refund}"),
		metric.WithDescription("Refund calls of an admit Limiter.")); err != nil {
		return nil, fmt.Errorf("admitotel: %w", err)
	}
	if o.refunded, err = m.Int64Counter("admit.client.refunded_tokens", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens that Refund calls gave back to their first bucket.")); err != nil {
		return nil, fmt.Errorf("admitotel: %w", err)
	}
	if cfg.tp != nil {
		o.tracer = cfg.tp.Tracer(scope)
	}
	o.calls = newCache(buildCall,
		func(k callKey) string { return k.policy },
		func(k callKey, p string) callKey { k.policy = p; return k })
	return o.observe, nil
}

// observe records one Observation.
func (o *observer) observe(obs admit.Observation) {
	k := classify(obs)
	if o.policyOf != nil {
		k.policy = o.policyOf(obs.FirstKey)
	}
	var c *callOptions
	if o.keys {
		k.key = obs.FirstKey
		c = buildCall(k) // a key is a series of its own: nothing to share
	} else {
		c = o.calls.get(k)
	}
	ctx := obs.Context // the call's: its span is the parent of ours
	if ctx == nil {
		ctx = context.Background()
	}
	switch obs.Op {
	case admit.OpRefund:
		o.refunds.Add(ctx, 1, c.refund...)
		if obs.Err == nil {
			o.refunded.Add(ctx, int64(obs.Cost), c.refund...)
		}
	default:
		o.decisions.Add(ctx, 1, c.decision...)
	}
	if !obs.Cached {
		o.duration.Record(ctx, obs.Duration.Seconds(), c.duration...)
	}
	switch {
	case obs.Op == admit.OpAcquire && obs.Err == nil && obs.Lease.Granted():
		o.leases.Add(ctx, 1, c.policy...)
	case obs.Op == admit.OpRelease && obs.Err == nil && obs.Lease.Granted():
		o.leases.Add(ctx, -1, c.policy...)
	}
	if o.tracer != nil {
		o.span(ctx, c, obs, time.Now())
	}
}

// span records obs as a span that ended at end. Its attributes are set
// after Start rather than passed to it, which saves the SDK a copy; span
// and End take the time of the call's end as now.
func (o *observer) span(ctx context.Context, c *callOptions, obs admit.Observation, end time.Time) {
	opts := append(c.span[:len(c.span):len(c.span)], trace.WithTimestamp(end.Add(-obs.Duration)))
	_, span := o.tracer.Start(ctx, c.spanName, opts...)
	span.SetAttributes(c.spanAttrs...)
	if obs.Err != nil {
		desc := c.errType
		if o.keys {
			desc = obs.Err.Error() // the message names the key
		}
		span.SetStatus(codes.Error, desc)
	}
	span.End()
}

// buildCall builds k's instrument options.
func buildCall(k callKey) *callOptions {
	op := k.op.String()
	policy := func(kv []attribute.KeyValue) []attribute.KeyValue {
		if k.policy != "" {
			kv = append(kv, keyPolicy.String(k.policy))
		}
		if k.key != "" {
			kv = append(kv, keyKey.String(k.key))
		}
		return kv
	}
	call := []attribute.KeyValue{keyDBOp.String(op), keyOutcome.String(k.outcome)}
	if k.deniedBy != "" {
		call = append(call, keyDeniedBy.String(k.deniedBy))
	}
	if k.errType != "" {
		call = append(call, keyErrorType.String(k.errType))
	}
	if k.cached {
		call = append(call, keyCached.Bool(true))
	}
	call = policy(call)
	dur := []attribute.KeyValue{keyDBSystem.String(dbSystem), keyDBOp.String(op)}
	if k.errType != "" {
		dur = append(dur, keyErrorType.String(k.errType))
	}
	dur = policy(dur)
	var refund []attribute.KeyValue
	if k.errType != "" {
		refund = append(refund, keyErrorType.String(k.errType))
	}
	refund = policy(refund)
	spanAttrs := append([]attribute.KeyValue{keyDBSystem.String(dbSystem)}, call...)
	return &callOptions{
		decision:  []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(call...))},
		duration:  []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(dur...))},
		policy:    []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(policy(nil)...))},
		refund:    []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(refund...))},
		span:      []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)},
		spanAttrs: spanAttrs,
		spanName:  op,
		errType:   k.errType,
	}
}
