package admit

import (
	"hash/maphash"
	"sync"
	"time"
)

// denialCache remembers first-bucket denials until the refusing bucket can
// hold the cost again, by the local monotonic clock.
//
// Every operation costs O(1): the cache is split into shards, each a
// mutex, a map from key to slot, and a ring of slots in insertion order.
// An add into a full shard evicts the shard's oldest slot; nothing is ever
// scanned. A lookup that meets an expired entry drops it, leaving its slot
// empty until the ring comes round to it.
type denialCache struct {
	shards []denialShard
	seed   maphash.Seed     // picks a key's shard, when there are several
	now    func() time.Time // time.Now; tests move it
}

// denialShard is one part of a denialCache, holding at most size keys.
type denialShard struct {
	mu    sync.Mutex
	size  int
	index map[string]int // key -> its slot in slots
	slots []denialSlot   // in insertion order: a ring from next once len(slots) == size
	next  int            // once the ring is full, the oldest slot, the next to be reused
	// dropped is when (local clock) an entry was last invalidated: the
	// denial of a request sent no later is not cached, since the server may
	// have answered it before the refund that invalidated.
	dropped time.Time
	_       [64]byte // keeps neighbouring shards' mutexes off one cache line
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

// Shards: at most maxDenialShards, and at least minDenialShardSize keys a
// shard, so a small cache is one shard, evicting in exact insertion order.
const (
	maxDenialShards    = 16
	minDenialShardSize = 256
)

func newDenialCache(size int) *denialCache {
	n := 1
	for n*2 <= maxDenialShards && n*2*minDenialShardSize <= size {
		n *= 2
	}
	return newShardedDenialCache(size, n)
}

// newShardedDenialCache returns a cache of at most size keys in n shards
// (n a power of two, at most size), whose sizes add up to size.
func newShardedDenialCache(size, n int) *denialCache {
	c := &denialCache{shards: make([]denialShard, n), seed: maphash.MakeSeed(), now: time.Now}
	for i := range c.shards {
		s := &c.shards[i]
		s.size = size / n
		if i < size%n {
			s.size++
		}
		s.index = make(map[string]int, min(s.size, 1024))
		s.slots = make([]denialSlot, 0, min(s.size, 1024))
	}
	return c
}

// shard returns the shard that holds key.
func (c *denialCache) shard(key string) *denialShard {
	if len(c.shards) == 1 {
		return &c.shards[0]
	}
	return &c.shards[maphash.String(c.seed, key)&uint64(len(c.shards)-1)]
}

// lookup returns the cached denial of r, if one is still in force.
func (c *denialCache) lookup(r Request) (Decision, bool) {
	now := c.now()
	s := c.shard(r.Key)
	s.mu.Lock()
	i, ok := s.index[r.Key]
	if !ok {
		s.mu.Unlock()
		return Decision{}, false
	}
	e := s.slots[i].denial
	left := e.until.Sub(now)
	if left <= 0 {
		s.drop(i)
		s.mu.Unlock()
		return Decision{}, false
	}
	s.mu.Unlock()
	if e.spec != r.Spec || e.cost != r.cost() {
		return Decision{}, false
	}
	left = (left + time.Microsecond - 1).Truncate(time.Microsecond) // whole µs, never short
	return Decision{Denied: 1, RetryAfter: left, Remaining: [2]int{e.remaining, -1}, decided: true}, true
}

// add records the server's first-bucket denial d of r, a request sent at
// sent (read before sending, so the entry never outlives the server's
// RetryAfter). A key already cached is replaced in its slot; a new key in
// a full shard takes the slot of the shard's oldest entry. The denial of a
// request sent no later than the shard's last invalidate is not recorded.
func (c *denialCache) add(r Request, sent time.Time, d Decision) {
	e := denial{spec: r.Spec, cost: r.cost(), until: sent.Add(d.RetryAfter), remaining: d.Remaining[0]}
	s := c.shard(r.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sent.After(s.dropped) {
		return
	}
	if i, ok := s.index[r.Key]; ok {
		s.slots[i].denial = e
		return
	}
	i := len(s.slots)
	if i < s.size {
		s.slots = append(s.slots, denialSlot{})
	} else {
		i = s.next
		s.next = (i + 1) % s.size
		if s.slots[i].live {
			delete(s.index, s.slots[i].key)
		}
	}
	s.slots[i] = denialSlot{key: r.Key, live: true, denial: e}
	s.index[r.Key] = i
}

// invalidate drops key's entry, if any, and keeps out the denials of
// requests sent until now: tokens may have come back to key's bucket (a
// Refund), so an earlier denial no longer holds.
func (c *denialCache) invalidate(key string) {
	now := c.now()
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[key]; ok {
		s.drop(i)
	}
	if now.After(s.dropped) {
		s.dropped = now
	}
}

// refunded invalidates the keys that a refund of first and second gives
// tokens back to. A denial is cached under the first key of its call,
// which may be either key of the refund.
func (c *denialCache) refunded(first Request, second *Request) {
	c.invalidate(first.Key)
	if second != nil {
		c.invalidate(second.Key)
	}
}

// drop empties slot i, which is live; s.mu is held.
func (s *denialShard) drop(i int) {
	delete(s.index, s.slots[i].key)
	s.slots[i] = denialSlot{}
}
