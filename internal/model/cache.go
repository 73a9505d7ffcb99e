package model

import (
	"fmt"
	"time"

	"github.com/admitkit/admit"
)

// Cache is the promise of one Limiter's denial cache (admit.WithDenialCache),
// on the Limiter's local clock:
//
//   - a call it answers without the server is a first-bucket denial;
//   - it answers so only within RetryAfter of a first-bucket denial the
//     server gave this Limiter for the same key, Spec and Cost, with that
//     denial's Remaining and no more than the RetryAfter left;
//   - never after the Limiter's own Refund of the key (Wait's refund of
//     the first bucket included), until the server denies it again.
//
// Any call may go to the server instead: a cache may forget, and it may
// answer from any denial in force, not only the latest. A Cache is not
// safe for simultaneous use.
type Cache struct {
	entries map[cacheKey][]cacheEntry
}

type cacheKey struct {
	key  string
	spec admit.Spec
	cost int
}

type cacheEntry struct {
	until     time.Time // the latest moment the entry may answer
	remaining int
}

// NewCache returns the promise of an empty denial cache.
func NewCache() *Cache { return &Cache{entries: map[cacheKey][]cacheEntry{}} }

// Denied notes the server's first-bucket denial o of r, given to this
// Limiter by a call that returned at by (local clock): the cache may
// answer for r until by + o.RetryAfter at the latest.
func (c *Cache) Denied(r admit.Request, by time.Time, o Outcome) {
	if o.Denied != 1 || o.Replayed {
		return
	}
	k := cacheKey{r.Key, r.Spec, cost(r)}
	live := c.entries[k][:0]
	for _, e := range c.entries[k] {
		if e.until.After(by) {
			live = append(live, e)
		}
	}
	c.entries[k] = append(live, cacheEntry{until: by.Add(o.RetryAfter), remaining: o.Remaining[0]})
}

// Refunded notes the Limiter's own Refund of keys: nothing cached for them
// may answer any more.
func (c *Cache) Refunded(keys ...string) {
	for k := range c.entries {
		for _, key := range keys {
			if k.key == key {
				delete(c.entries, k)
			}
		}
	}
}

// Check returns nil when got, a decision for first that the Limiter made
// without the server in a call that started at at (local clock), keeps the
// promise, and otherwise an error that says how it breaks it.
func (c *Cache) Check(first admit.Request, at time.Time, got Outcome) error {
	if got.Allowed || got.Denied != 1 || got.Replayed {
		return fmt.Errorf("the denial cache answered %v without the server: it may only deny at the first bucket", got)
	}
	entries := c.entries[cacheKey{first.Key, first.Spec, cost(first)}]
	var latest time.Time
	for _, e := range entries {
		if at.Before(e.until) && got.RetryAfter > 0 && got.RetryAfter <= e.until.Sub(at)+time.Microsecond && got.Remaining == [2]int{e.remaining, -1} {
			return nil
		}
		if e.until.After(latest) {
			latest = e.until
		}
	}
	switch {
	case len(entries) == 0:
		return fmt.Errorf("the denial cache denied %q with no server denial of that key, Spec and Cost before it (or only before the Limiter's own Refund of it)", first.Key)
	case !at.Before(latest):
		return fmt.Errorf("the denial cache denied %q %v after the server's last denial of it ran out", first.Key, at.Sub(latest))
	}
	return fmt.Errorf("the denial cache denied %q with RetryAfter %v and Remaining %v: no server denial in force had them (%d denials, the last in force for %v more)",
		first.Key, got.RetryAfter, got.Remaining, len(entries), latest.Sub(at))
}

// Holds reports whether the cache may deny r without the server at at: a
// denial of r is in force.
func (c *Cache) Holds(r admit.Request, at time.Time) bool {
	for _, e := range c.entries[cacheKey{r.Key, r.Spec, cost(r)}] {
		if at.Before(e.until) {
			return true
		}
	}
	return false
}
