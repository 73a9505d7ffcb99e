package admit

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// cacheEpoch is the local clock of a cacheEnv's denial cache at the start.
var cacheEpoch = time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)

// cacheEnv is a unit server with a second Limiter on it, cached, whose
// denial cache reads local, a clock the test moves by hand, and whose
// commands rec records.
type cacheEnv struct {
	*unitEnv
	t      *testing.T
	cached *Limiter
	rec    *recordingClient
	local  time.Time
}

func newCacheEnv(t *testing.T, size int) *cacheEnv {
	t.Helper()
	e := &cacheEnv{unitEnv: newUnitEnv(t), t: t, local: cacheEpoch}
	e.rec = &recordingClient{Client: e.c}
	e.cached = New(e.rec, WithDenialCache(size))
	e.cached.denials.now = func() time.Time { return e.local }
	return e
}

// call runs the cached Limiter's AllowOrdered and returns its Decision and
// the number of commands it sent; an error fails the test.
func (e *cacheEnv) call(first Request, second *Request) (Decision, int) {
	e.t.Helper()
	before := len(e.rec.cmds)
	d, err := e.cached.AllowOrdered(context.Background(), first, second)
	if err != nil {
		e.t.Fatal(err)
	}
	return d, len(e.rec.cmds) - before
}

// TestDenialCache: with the cache on, a first-bucket denial is repeated
// locally, with no command sent, until its RetryAfter has passed on the
// local clock counted from before the request was sent; a different Spec
// or Cost, a second-bucket denial and bad input all go their usual way.
func TestDenialCache(t *testing.T) {
	e := newCacheEnv(t, 8)
	l, call := e.cached, e.call
	hourly := MustSpec(Every(time.Hour), 1)
	r := Request{Key: "dc:{x}:a", Spec: hourly}
	ctx := context.Background()

	if d, sent := call(r, nil); !d.Allowed() || sent == 0 { // EVALSHA, then EVAL: the script is not loaded yet
		t.Fatalf("first call: %v with %d commands; want allowed by the server", d, sent)
	}
	if d, sent := call(r, nil); d.Denied != 1 || d.RetryAfter != time.Hour || sent != 1 {
		t.Fatalf("second call: %v with %d commands; want the server's 1h denial", d, sent)
	}
	for i, advance := range []time.Duration{0, 10 * time.Minute, 49*time.Minute + 59*time.Second + 999_999*time.Microsecond} {
		e.local = e.local.Add(advance)
		e.advance(advance)
		d, sent := call(r, nil)
		want := time.Hour - e.local.Sub(cacheEpoch)
		if d.Denied != 1 || d.RetryAfter != want || d.Remaining != [2]int{0, -1} || !d.decided || sent != 0 {
			t.Errorf("local denial %d: %+v with %d commands; want Denied 1, RetryAfter %v, Remaining [0 -1], none sent", i, d, sent, want)
		}
	}
	if d, sent := call(Request{Key: r.Key, Spec: MustSpec(Every(2*time.Hour), 1)}, nil); sent != 1 || d.Denied != 1 {
		t.Errorf("another Spec: %v with %d commands; want the server's answer", d, sent)
	}
	if _, err := l.AllowOrdered(ctx, r, &r); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("bad input on a cached key: %v; want ErrInvalidRequest", err)
	}
	e.local = e.local.Add(time.Microsecond)
	e.advance(time.Microsecond)
	if d, sent := call(r, nil); !d.Allowed() || sent != 1 {
		t.Errorf("RetryAfter passed: %v with %d commands; want the server's admission", d, sent)
	}

	// The second bucket's denials are not cached.
	std, shared := Request{Key: "dc:{y}:std", Spec: MustSpec(Every(time.Second), 10)}, Request{Key: "dc:{y}:shared", Spec: hourly}
	call(shared, nil) // drain the shared bucket
	for range 3 {
		if d, sent := call(std, &shared); d.Denied != 2 || sent != 1 {
			t.Errorf("second-bucket denial: %v with %d commands; want each from the server", d, sent)
		}
	}
	// Cost is part of the entry.
	costly := Request{Key: "dc:{z}", Spec: MustSpec(Every(time.Hour), 5), Cost: 5}
	call(costly, nil)
	call(costly, nil) // denied, cached for cost 5
	if _, sent := call(Request{Key: costly.Key, Spec: costly.Spec, Cost: 4}, nil); sent != 1 {
		t.Errorf("another Cost: %d commands; want the server's answer", sent)
	}
	if _, sent := call(Request{Key: costly.Key, Spec: costly.Spec, Cost: 4}, nil); sent != 0 {
		t.Errorf("the Cost now cached (4, one entry a key): %d commands; want a local denial", sent)
	}
}

// TestDenialCacheBounded: the cache holds at most its size, and a key
// already cached is replaced, not added.
func TestDenialCacheBounded(t *testing.T) {
	c := newDenialCache(2)
	now := time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return now }
	spec := MustSpec(Every(time.Second), 1)
	deny := func(key string, after time.Duration) {
		c.add(Request{Key: key, Spec: spec}, now, Decision{Denied: 1, RetryAfter: after, Remaining: [2]int{0, -1}, decided: true})
	}
	deny("a", time.Second)
	deny("b", time.Minute)
	now = now.Add(2 * time.Second) // a has expired, b has not
	deny("c", time.Minute)
	if _, ok := c.lookup(Request{Key: "b", Spec: spec}); !ok || cacheLen(t, c) != 2 {
		t.Errorf("after adding c to a full cache holding expired a: b cached %v, %d entries; want b kept, 2 entries", ok, cacheLen(t, c))
	}
	deny("d", time.Minute) // all live: one goes
	if cacheLen(t, c) != 2 {
		t.Errorf("%d entries, want the size, 2", cacheLen(t, c))
	}
	if _, ok := c.lookup(Request{Key: "d", Spec: spec}); !ok {
		t.Error("the newest entry was evicted")
	}
	deny("d", time.Hour) // a key already cached is replaced, not added
	if cacheLen(t, c) != 2 {
		t.Errorf("%d entries after replacing d, want 2", cacheLen(t, c))
	}
	if New(nil, WithDenialCache(0)).denials != nil || New(nil).denials != nil {
		t.Error("the cache is on without WithDenialCache(size > 0)")
	}
}

// TestDenialCacheFIFO: an add into a full cache evicts exactly one entry,
// the oldest inserted, whatever the others hold, so an add touches O(1)
// entries however large the cache; an expired entry met by a lookup is
// dropped.
func TestDenialCacheFIFO(t *testing.T) {
	now := time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)
	spec := MustSpec(Every(time.Second), 1)
	deny := func(c *denialCache, key string, after time.Duration) {
		c.add(Request{Key: key, Spec: spec}, now, Decision{Denied: 1, RetryAfter: after, Remaining: [2]int{0, -1}, decided: true})
	}
	key := func(i int) string { return "k" + strconv.Itoa(i) }
	want := func(from, to int) []string { // keys from..to, sorted as cacheKeys sorts
		var ks []string
		for i := from; i <= to; i++ {
			ks = append(ks, key(i))
		}
		slices.Sort(ks)
		return ks
	}

	// Live entries: each add past the size evicts the oldest one.
	c := newDenialCache(4)
	c.now = func() time.Time { return now }
	for i := range 4 {
		deny(c, key(i), time.Hour)
	}
	for i := 4; i < 40; i++ {
		deny(c, key(i), time.Hour)
		if got := cacheKeys(t, c); !slices.Equal(got, want(i-3, i)) {
			t.Fatalf("after adding %s to a full cache of 4: holds %v; want %v (the oldest, %s, evicted)", key(i), got, want(i-3, i), key(i-4))
		}
	}

	// Expired entries: an add into a full cache still evicts one entry, the
	// oldest, and touches none of the others.
	const size = 1000
	c = newDenialCache(size)
	c.now = func() time.Time { return now }
	for i := range size {
		deny(c, key(i), time.Second)
	}
	now = now.Add(2 * time.Second) // every entry has expired
	deny(c, "new", time.Hour)
	if n := cacheLen(t, c); n != size {
		t.Fatalf("after one add into a full cache of %d expired entries: %d entries held; want %d (one evicted, none scanned)", size, n, size)
	}
	if ks := cacheKeys(t, c); slices.Contains(ks, key(0)) || !slices.Contains(ks, "new") {
		t.Errorf("after one add into a full cache: %s held %v, new held %v; want the oldest, %s, evicted, new held",
			key(0), slices.Contains(ks, key(0)), slices.Contains(ks, "new"), key(0))
	}
	// A lookup that meets an expired entry drops it.
	if _, ok := c.lookup(Request{Key: key(500), Spec: spec}); ok {
		t.Errorf("an expired entry denied")
	}
	if ks := cacheKeys(t, c); len(ks) != size-1 || slices.Contains(ks, key(500)) {
		t.Errorf("after a lookup of expired %s: %d entries, %s held %v; want %d, dropped", key(500), len(ks), key(500), slices.Contains(ks, key(500)), size-1)
	}
	// The dropped entry's place is reused in turn, never as a second entry.
	for i := range size {
		deny(c, "again"+strconv.Itoa(i), time.Hour)
	}
	if n := cacheLen(t, c); n != size {
		t.Errorf("after %d more adds: %d entries; want the size, %d", size, n, size)
	}
}

// cacheKeys returns the keys c holds, expired or not, sorted, after
// checking that its index and slots agree.
func cacheKeys(tb testing.TB, c *denialCache) []string {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	live := 0
	for _, slot := range c.slots {
		if slot.live {
			live++
		}
	}
	if live != len(c.index) || len(c.slots) > c.size {
		tb.Fatalf("%d live slots of %d (size %d), %d keys indexed; want one live slot a key, at most size slots", live, len(c.slots), c.size, len(c.index))
	}
	ks := make([]string, 0, len(c.index))
	for k, slot := range c.index {
		if c.slots[slot].key != k || !c.slots[slot].live {
			tb.Fatalf("key %s indexes slot %d, which holds %q (live %v)", k, slot, c.slots[slot].key, c.slots[slot].live)
		}
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// cacheLen is the number of entries c holds, expired or not.
func cacheLen(tb testing.TB, c *denialCache) int {
	tb.Helper()
	return len(cacheKeys(tb, c))
}

// TestDenialCacheRefund: a Limiter's own Refund drops its cached denials
// of the refunded keys, first and second, so the next call goes to the
// server, which holds the tokens again; and a denial of a request sent
// before a refund is not cached, since the server may have answered it
// before the refund ran.
func TestDenialCacheRefund(t *testing.T) {
	e := newCacheEnv(t, 16)
	l, call := e.cached, e.call
	ctx := context.Background()
	slow := MustSpec(Every(2*time.Second), 1) // 1 per 2 s
	// deny drains r's bucket and leaves its denial cached.
	deny := func(r Request) {
		t.Helper()
		call(r, nil)
		if d, sent := call(r, nil); d.Denied != 1 || sent != 1 {
			t.Fatalf("%s: %v with %d commands; want the server's denial", r.Key, d, sent)
		}
		if d, sent := call(r, nil); d.Denied != 1 || sent != 0 {
			t.Fatalf("%s: %v with %d commands; want a local denial", r.Key, d, sent)
		}
	}
	refund := func(first Request, second *Request) {
		t.Helper()
		if err := l.Refund(ctx, first, second); err != nil {
			t.Fatalf("Refund: %v", err)
		}
		e.local = e.local.Add(time.Millisecond) // denials sent from now on are cached again
	}

	// The refunded first key.
	a := Request{Key: "dcr:{t}:a", Spec: slow}
	deny(a)
	refund(a, nil)
	if d, sent := call(a, nil); !d.Allowed() || sent != 1 {
		t.Errorf("after a Refund of %s: %v with %d commands; want the server's admission", a.Key, d, sent)
	}

	// The refunded second key, cached as the first key of its own denial.
	b, c := Request{Key: "dcr:{t}:b", Spec: slow}, Request{Key: "dcr:{t}:c", Spec: slow}
	deny(b)
	deny(c)
	refund(c, &b)
	for _, r := range []Request{b, c} {
		if d, sent := call(r, nil); !d.Allowed() || sent != 1 {
			t.Errorf("after a Refund of %s and %s: %s %v with %d commands; want the server's admission", c.Key, b.Key, r.Key, d, sent)
		}
	}

	// A denial sent before a refund, answered after it, is not cached.
	d := Request{Key: "dcr:{t}:d", Spec: slow}
	call(d, nil)
	sent := l.denials.now()
	e.local = e.local.Add(time.Millisecond)
	refund(d, nil)
	l.denials.add(d, sent, Decision{Denied: 1, RetryAfter: 2 * time.Second, Remaining: [2]int{0, -1}, decided: true})
	if got, sent := call(d, nil); !got.Allowed() || sent != 1 {
		t.Errorf("a denial sent before a Refund, added after it: %v with %d commands; want the server's admission", got, sent)
	}
	deny(Request{Key: "dcr:{t}:e", Spec: slow}) // denials sent after the refund are cached again

	// A refund whose outcome is unknown may have run: the entry goes too.
	f := Request{Key: "dcr:{t}:f", Spec: slow}
	deny(f)
	e.srv.Close()
	if err := l.Refund(ctx, f, nil); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Refund with the server gone: %v; want ErrOutcomeUnknown", err)
	}
	if got, ok := l.denials.lookup(f); ok {
		t.Errorf("after a Refund of %s whose outcome is unknown: cached %v; want no entry", f.Key, got)
	}
}

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
						wg.Go(func() {
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
						})
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
