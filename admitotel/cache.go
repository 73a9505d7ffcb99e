package admitotel

import "sync"

// A cache keeps the instrument options built for each distinct K, so
// that a call seen before records without allocating. It keeps at most
// MaxPolicies policy names apart: a K with a further one is built under
// "_OTHER" and not kept, so that the cache's size and the series count
// stay bounded.
type cache[K comparable, V any] struct {
	build     func(K) *V
	policyOf  func(K) string
	setPolicy func(K, string) K

	mu       sync.RWMutex
	m        map[K]*V
	policies map[string]struct{}
}

func newCache[K comparable, V any](build func(K) *V, policyOf func(K) string, setPolicy func(K, string) K) *cache[K, V] {
	return &cache[K, V]{build: build, policyOf: policyOf, setPolicy: setPolicy, m: map[K]*V{}, policies: map[string]struct{}{}}
}

// get returns k's options, built on first use.
func (c *cache[K, V]) get(k K) *V {
	c.mu.RLock()
	v := c.m[k]
	c.mu.RUnlock()
	if v != nil {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := c.m[k]; v != nil {
		return v
	}
	if p := c.policyOf(k); p != "" {
		if _, seen := c.policies[p]; !seen {
			if len(c.policies) >= MaxPolicies {
				k = c.setPolicy(k, other)
				if v := c.m[k]; v != nil {
					return v
				}
			} else {
				c.policies[p] = struct{}{}
			}
		}
	}
	v = c.build(k)
	c.m[k] = v
	return v
}
