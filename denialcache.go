package admit

import (
	"sync"
	"time"
)

// denialCache remembers first-bucket denials until the refusing bucket can
// hold the cost again, by the local monotonic clock.
//
// Every operation costs O(1): a map from key to slot, and a ring of slots
// in insertion order, under one mutex. An add into a full cache evicts the
// oldest slot; nothing is ever scanned. A lookup that meets an expired
// entry drops it, leaving its slot empty until the ring comes round to it.
type denialCache struct {
	mu    sync.Mutex
	size  int
	index map[string]int // key -> its slot in slots
	slots []denialSlot   // in insertion order: a ring from next once len(slots) == size
	next  int            // once the ring is full, the oldest slot, the next to be reused
	// dropped is when (local clock) an entry was last invalidated: the
	// denial of a request sent no later is not cached, since the server may
	// have answered it before the refund that invalidated.
	dropped time.Time
	now     func() time.Time // time.Now; tests move it
}

type denialSlot struct {
	key  string
	live bool // false: empty (never used, dropped or invalidated)
	denial
}

type denial struct {
	spec      Spec
	cost      int
	until     time.Time // monotonic: sent + RetryAfter
	remaining int
}

func newDenialCache(size int) *denialCache {
	return &denialCache{
		size:  size,
		index: make(map[string]int, min(size, 1024)),
		slots: make([]denialSlot, 0, min(size, 1024)),
		now:   time.Now,
	}
}

// A nil *denialCache is a Limiter without one: it holds nothing and reads
// no clock.

// clock reads the cache's clock: the zero Time without a cache.
func (c *denialCache) clock() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.now()
}

// lookup returns the cached denial of r, if one is still in force.
func (c *denialCache) lookup(r Request) (Decision, bool) {
	if c == nil {
		return Decision{}, false
	}
	now := c.now()
	c.mu.Lock()
	i, ok := c.index[r.Key]
	if !ok {
		c.mu.Unlock()
		return Decision{}, false
	}
	e := c.slots[i].denial
	left := e.until.Sub(now)
	if left <= 0 {
		c.drop(i)
		c.mu.Unlock()
		return Decision{}, false
	}
	c.mu.Unlock()
	if e.spec != r.Spec || e.cost != r.cost() {
		return Decision{}, false
	}
	left = (left + time.Microsecond - 1).Truncate(time.Microsecond) // whole µs, never short
	return Decision{Denied: 1, RetryAfter: left, Remaining: [2]int{e.remaining, -1}, decided: true}, true
}

// add records the server's first-bucket denial d of r, a request sent at
// sent (read before sending, so the entry never outlives the server's
// RetryAfter). A key already cached is replaced in its slot; a new key in
// a full cache takes the slot of the oldest entry. The denial of a request
// sent no later than the last invalidate is not recorded.
func (c *denialCache) add(r Request, sent time.Time, d Decision) {
	if c == nil {
		return
	}
	e := denial{spec: r.Spec, cost: r.cost(), until: sent.Add(d.RetryAfter), remaining: d.Remaining[0]}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !sent.After(c.dropped) {
		return
	}
	if i, ok := c.index[r.Key]; ok {
		c.slots[i].denial = e
		return
	}
	i := len(c.slots)
	if i < c.size {
		c.slots = append(c.slots, denialSlot{})
	} else {
		i = c.next
		c.next = (i + 1) % c.size
		if c.slots[i].live {
			delete(c.index, c.slots[i].key)
		}
	}
	c.slots[i] = denialSlot{key: r.Key, live: true, denial: e}
	c.index[r.Key] = i
}

// invalidate drops key's entry, if any, and keeps out the denials of
// requests sent until now: tokens may have come back to key's bucket (a
// Refund), so an earlier denial no longer holds.
func (c *denialCache) invalidate(key string) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.index[key]; ok {
		c.drop(i)
	}
	if now.After(c.dropped) {
		c.dropped = now
	}
}

// refunded invalidates the keys that a refund of first and second gives
// tokens back to. A denial is cached under the first key of its call,
// which may be either key of the refund.
func (c *denialCache) refunded(first Request, second *Request) {
	if c == nil {
		return
	}
	c.invalidate(first.Key)
	if second != nil {
		c.invalidate(second.Key)
	}
}

// drop empties slot i, which is live; c.mu is held.
func (c *denialCache) drop(i int) {
	delete(c.index, c.slots[i].key)
	c.slots[i] = denialSlot{}
}
