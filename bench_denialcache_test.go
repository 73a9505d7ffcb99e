package admit

import (
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
// It stays in package admit, apart from the benchmarks module, because it
// measures the unexported cache itself, without a server round trip around
// each call. BenchmarkOverload (in benchmarks/) measures the cache through
// the public API, WithDenialCache, under a flood on a real server.
//
//	go test -run '^$' -bench DenialCacheFlood -benchtime 3x -count 3 -timeout 30m .
func BenchmarkDenialCacheFlood(b *testing.B) {
	const floodKeys = 1_000_000
	spec := MustSpec(Every(time.Second), 1)
	keys := make([]string, floodKeys)
	for i := range keys {
		keys[i] = "admit:flood:{user:" + strconv.Itoa(i) + "}"
	}
	denied := Decision{Denied: 1, RetryAfter: time.Hour, Remaining: [2]int{0, -1}, decided: true}
	for _, size := range []int{10_000, 100_000} {
		for _, goroutines := range []int{64, 1} {
			name := "size=" + strconv.Itoa(size) + "/goroutines=" + strconv.Itoa(goroutines)
			b.Run(name, func(b *testing.B) {
				// The prefill's keys are none of the flood's.
				fill := make([]string, size)
				for i := range fill {
					fill[i] = "admit:fill:{user:" + strconv.Itoa(i) + "}"
				}
				flood := keys // every one distinct
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
					c := newDenialCache(size)
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
