package admitotel

import (
	"go.opentelemetry.io/otel/trace"
)

// MaxPolicies is the most distinct policy names an instrument set keeps
// apart; the names seen after it are counted under "_OTHER", so that a
// policy function that returns keys cannot grow the series without bound.
const MaxPolicies = 100

// An Option configures [NewObserver], [HTTPOutcome] and [NewEdge].
type Option interface{ apply(*config) }

type config struct {
	tp       trace.TracerProvider
	policyOf func(key string) string
	keys     bool
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTracerProvider has [NewObserver] record each call as a span of tp's.
// Default: no spans. Edges ignore it.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithPolicy names the policy of each observed call from its first key, as
// the admit.policy attribute of [NewObserver]'s instruments: return a fixed
// name (a key prefix, say), never the key. The first [MaxPolicies] names are
// kept apart, the rest counted as "_OTHER". Default: no policy attribute,
// since an Observation carries no policy name. Edges take theirs from the
// Rule and ignore it.
func WithPolicy(policyOf func(key string) string) Option {
	return optionFunc(func(c *config) { c.policyOf = policyOf })
}

// WithKeys adds each call's key as the admit.key attribute of every metric
// and span (an edge's Rule key, which is often the client's address). It
// is dangerous: each distinct key is a new series, which a scraper and
// its storage pay for in memory without bound, and keys are often user or
// client identities (personal data) that then leave the process. Use it
// on a test bed or with a handful of keys, never on open traffic.
// Default: off. It also costs allocations on every call.
func WithKeys() Option {
	return optionFunc(func(c *config) { c.keys = true })
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}
