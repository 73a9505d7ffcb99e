package admit

import (
	"sync"
	"time"
)

// denialCache remembers first-bucket denials until the refusing bucket can
// hold the cost again, by the local monotonic clock.
type denialCache struct {
	mu      sync.Mutex
	size    int
	entries map[string]denial
	now     func() time.Time // time.Now; tests move it
}

type denial struct {
	spec      Spec
	cost      int
	until     time.Time // monotonic: sent + RetryAfter
	remaining int
}

func newDenialCache(size int) *denialCache {
	return &denialCache{size: size, entries: make(map[string]denial, min(size, 1024)), now: time.Now}
}

// lookup returns the cached denial of r, if one is still in force.
func (c *denialCache) lookup(r Request) (Decision, bool) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[r.Key]
	c.mu.Unlock()
	if !ok || e.spec != r.Spec || e.cost != r.cost() {
		return Decision{}, false
	}
	left := e.until.Sub(now)
	if left <= 0 {
		return Decision{}, false
	}
	left = (left + time.Microsecond - 1).Truncate(time.Microsecond) // whole µs, never short
	return Decision{Denied: 1, RetryAfter: left, Remaining: [2]int{e.remaining, -1}, decided: true}, true
}

// add records the server's first-bucket denial d of r, a request sent at
// sent (read before sending, so the entry never outlives the server's
// RetryAfter).
func (c *denialCache) add(r Request, sent time.Time, d Decision) {
	e := denial{spec: r.Spec, cost: r.cost(), until: sent.Add(d.RetryAfter), remaining: d.Remaining[0]}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[r.Key]; !ok && len(c.entries) >= c.size {
		now := c.now()
		for k, old := range c.entries {
			if !old.until.After(now) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.size {
				break
			}
			delete(c.entries, k) // arbitrary: map order
		}
	}
	c.entries[r.Key] = e
}

// len is the number of entries, for tests.
func (c *denialCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
