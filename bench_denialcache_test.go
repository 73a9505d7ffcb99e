package admit

import (
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkDenialCacheFlood: an abusive client's flood of distinct keys,
// each denied once by the server, so each one a lookup that misses and then
// an add, as AllowOrdered does them. 64 goroutines (and, for the cost of
// one call without contention, 1) share one cache, filled to its size
// before the timer starts, so every add of the flood evicts. One op is one
// whole flood. It reports:
//
//	add-ns        mean time of one add call, waiting for the mutex included
//	lookup-p50-ns, lookup-p99-ns, lookup-max-ns
//	              latency of the lookups (every one recorded), which wait
//	              for the mutex that adds hold; with more goroutines than
//	              CPUs, also for a CPU
//	ns/key        the flood's wall time per key (all goroutines): a flood
//	              of 1e6 keys takes 1e6 × ns/key
//
// impl=fifo is the cache as shipped, one mutex; impl=fifo-16shards is 16 of
// them split by a hash of the key (shardedDenialCache below), to see what
// sharding would buy; impl=legacy is the cache it replaces
// (legacyDenialCache below), side by side in one run. The legacy add scans
// the whole map, so its flood is bounded to legacyFloodKeys keys, not 1e6:
// a 1e6-key flood into a size-10,000 legacy cache took 5 min 41 s.
//
//	go test -run '^$' -bench DenialCacheFlood -benchtime 3x -count 3 .
func BenchmarkDenialCacheFlood(b *testing.B) {
	const floodKeys = 1_000_000
	spec := MustSpec(Every(time.Second), 1)
	keys := make([]string, floodKeys)
	for i := range keys {
		keys[i] = "admit:flood:{user:" + strconv.Itoa(i) + "}"
	}
	denied := Decision{Denied: 1, RetryAfter: time.Hour, Remaining: [2]int{0, -1}, decided: true}
	type cache interface {
		lookup(Request) (Decision, bool)
		add(Request, time.Time, Decision)
	}
	legacyFloodKeys := map[int]int{10_000: 10_000, 100_000: 1_000}
	for _, size := range []int{10_000, 100_000} {
		for _, goroutines := range []int{64, 1} {
			for _, impl := range []struct {
				name  string
				keys  int
				build func() cache
			}{
				{"fifo", floodKeys, func() cache { return newDenialCache(size) }},
				{"fifo-16shards", floodKeys, func() cache { return newShardedDenialCache(size, 16) }},
				{"legacy", legacyFloodKeys[size], func() cache { return newLegacyDenialCache(size) }},
			} {
				name := "impl=" + impl.name + "/size=" + strconv.Itoa(size) + "/goroutines=" + strconv.Itoa(goroutines) + "/keys=" + strconv.Itoa(impl.keys)
				b.Run(name, func(b *testing.B) {
					// The prefill's keys are none of the flood's.
					fill := make([]string, size)
					for i := range fill {
						fill[i] = "admit:fill:{user:" + strconv.Itoa(i) + "}"
					}
					flood := keys[:impl.keys]
					lookups := make([][]time.Duration, goroutines)
					for g := range lookups {
						lookups[g] = make([]time.Duration, 0, len(flood)/goroutines+1)
					}
					adds := make([]time.Duration, goroutines)
					var all []time.Duration
					var addTotal, wall time.Duration
					floods := 0
					for b.Loop() {
						b.StopTimer()
						c := impl.build()
						now := time.Now()
						for _, k := range fill {
							c.add(Request{Key: k, Spec: spec}, now, denied)
						}
						for g := range lookups {
							lookups[g], adds[g] = lookups[g][:0], 0
						}
						var wg sync.WaitGroup
						b.StartTimer()
						start := time.Now()
						for g := range goroutines {
							wg.Add(1)
							go func() {
								defer wg.Done()
								var addSum time.Duration
								lat := lookups[g]
								for i := g; i < len(flood); i += goroutines {
									r := Request{Key: flood[i], Spec: spec}
									t0 := time.Now()
									if _, ok := c.lookup(r); ok {
										panic("a key of the flood was cached before its denial")
									}
									t1 := time.Now()
									c.add(r, t1, denied)
									t2 := time.Now()
									lat = append(lat, t1.Sub(t0))
									addSum += t2.Sub(t1)
								}
								lookups[g], adds[g] = lat, addSum
							}()
						}
						wg.Wait()
						wall += time.Since(start)
						b.StopTimer()
						for g := range goroutines {
							all = append(all, lookups[g]...)
							addTotal += adds[g]
						}
						floods++
						b.StartTimer()
					}
					b.StopTimer()
					slices.Sort(all)
					n := floods * len(flood)
					b.ReportMetric(float64(addTotal.Nanoseconds())/float64(n), "add-ns")
					b.ReportMetric(float64(wall.Nanoseconds())/float64(n), "ns/key")
					b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "lookup-p50-ns")
					b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "lookup-p99-ns")
					b.ReportMetric(float64(all[len(all)-1].Nanoseconds()), "lookup-max-ns")
				})
			}
		}
	}
}

// shardedDenialCache is n denialCaches of size/n keys each, a key's picked
// by maphash: what sharding the shipped cache's mutex would buy. On 2 CPUs
// it bought nothing measurable (BENCHMARKS.md), so the library does not
// shard; this is here to measure it again on a larger machine.
type shardedDenialCache struct {
	seed   maphash.Seed
	shards []*denialCache
}

func newShardedDenialCache(size, n int) *shardedDenialCache {
	c := &shardedDenialCache{seed: maphash.MakeSeed(), shards: make([]*denialCache, n)}
	for i := range c.shards {
		c.shards[i] = newDenialCache(size / n)
	}
	return c
}

func (c *shardedDenialCache) shard(key string) *denialCache {
	return c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

func (c *shardedDenialCache) lookup(r Request) (Decision, bool) { return c.shard(r.Key).lookup(r) }

func (c *shardedDenialCache) add(r Request, sent time.Time, d Decision) {
	c.shard(r.Key).add(r, sent, d)
}

// legacyDenialCache is the denial cache before issue 17 item 6, copied
// verbatim but for its name: the baseline that BenchmarkDenialCacheFlood
// measures the shipped cache against. Once full, each add of a new key
// scans the whole map under the mutex every lookup takes: O(size).
type legacyDenialCache struct {
	mu      sync.Mutex
	size    int
	entries map[string]denial
	now     func() time.Time // time.Now; tests move it
}

func newLegacyDenialCache(size int) *legacyDenialCache {
	return &legacyDenialCache{size: size, entries: make(map[string]denial, min(size, 1024)), now: time.Now}
}

// lookup returns the cached denial of r, if one is still in force.
func (c *legacyDenialCache) lookup(r Request) (Decision, bool) {
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
func (c *legacyDenialCache) add(r Request, sent time.Time, d Decision) {
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
