package admitotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// An EdgeRequest is what an edge (a middleware, an interceptor) did with
// one request, for [Edge.Record].
type EdgeRequest struct {
	// Outcome names what was done: "admitted", "refused",
	// "outage_served", and so on; one of a fixed few.
	Outcome string
	// Policy is the policy name of the Rule's part that decided, or of
	// its first part; empty for none.
	Policy string
	// Key is the Rule's key, recorded only with [WithKeys].
	Key string
	// Err is the decision's error, classed as error.type; nil for none.
	Err error
}

// An Edge counts the requests of one edge in the admit.edge.requests
// counter. It is safe for concurrent use.
type Edge struct {
	requests metric.Int64Counter
	keys     bool
	edge     string
	sets     *cache[edgeKey, []metric.AddOption]
}

type edgeKey struct {
	outcome, policy, errType, key string
}

// NewEdge returns an Edge that counts the requests of the edge named edge
// ("http", "grpc": the admit.edge attribute) in mp's admit.edge.requests.
// HTTPOutcome and grpcotel.Outcome are built on it; use it for an edge of
// your own. It returns an error when mp refuses the instrument.
func NewEdge(mp metric.MeterProvider, edge string, opts ...Option) (*Edge, error) {
	if mp == nil {
		return nil, fmt.Errorf("admitotel: NewEdge(nil, %q): pass a MeterProvider, such as otel.GetMeterProvider()", edge)
	}
	cfg := newConfig(opts)
	requests, err := mp.Meter(scope).Int64Counter("admit.edge.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests seen by an admit edge, by what it did with them."))
	if err != nil {
		return nil, fmt.Errorf("admitotel: %w", err)
	}
	e := &Edge{requests: requests, keys: cfg.keys, edge: edge}
	e.sets = newCache(e.build,
		func(k edgeKey) string { return k.policy },
		func(k edgeKey, p string) edgeKey { k.policy = p; return k })
	return e, nil
}

// Record counts r. It allocates nothing once r's attributes have been
// seen, unless keys are on.
func (e *Edge) Record(r EdgeRequest) {
	k := edgeKey{outcome: r.Outcome, policy: r.Policy}
	if r.Err != nil {
		k.errType = errorType(r.Err)
	}
	var opts []metric.AddOption
	if e.keys {
		k.key = r.Key
		opts = *e.build(k)
	} else {
		opts = *e.sets.get(k)
	}
	e.requests.Add(context.Background(), 1, opts...)
}

// build builds k's options.
func (e *Edge) build(k edgeKey) *[]metric.AddOption {
	kv := []attribute.KeyValue{keyEdge.String(e.edge), keyEdgeResult.String(k.outcome)}
	if k.policy != "" {
		kv = append(kv, keyPolicy.String(k.policy))
	}
	if k.errType != "" {
		kv = append(kv, keyErrorType.String(k.errType))
	}
	if k.key != "" {
		kv = append(kv, keyKey.String(k.key))
	}
	opts := []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
	return &opts
}
