package admit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/model"
)

func mustLocal(tb testing.TB, maxKeys int, opts ...admit.LocalOption) *admit.Local {
	tb.Helper()
	l, err := admit.NewLocal(maxKeys, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// localWorld is one random sequence's keys and Specs.
type localWorld struct {
	keys  []string
	specs []admit.Spec
}

func newLocalWorld(rng *rand.Rand, nkeys int) localWorld {
	w := localWorld{}
	hostile := []string{"{", "}", "}x", "{a}:b", ":", "\x00", "\xff\xfe", "rl:{chan:42}:standard", " ", "é", "|", "\n"}
	seen := map[string]bool{}
	for len(w.keys) < nkeys {
		var k string
		switch rng.IntN(3) {
		case 0:
			k = hostile[rng.IntN(len(hostile))]
		case 1:
			b := make([]byte, 1+rng.IntN(8))
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			k = string(b)
		default:
			k = fmt.Sprintf("rl:{t%d}:%d", rng.IntN(3), len(w.keys))
		}
		if !seen[k] {
			seen[k] = true
			w.keys = append(w.keys, k)
		}
	}
	for range 4 {
		per := []time.Duration{time.Microsecond, 7 * time.Microsecond, time.Millisecond, 1500 * time.Millisecond, 3 * time.Second}[rng.IntN(5)]
		burst := []int{1, 2, 3, 5, 20, 1000}[rng.IntN(6)]
		w.specs = append(w.specs, admit.MustSpec(admit.Every(per), burst))
	}
	return w
}

// localModel is the model's side of a sequence: the stored buckets, as
// internal/model decides them, and the Spec each key was last decided with.
type localModel struct {
	states map[string]model.State
	spec   map[string]admit.Spec
}

// apply stores the model's writes: a Keep leaves the bucket as it was.
func (m *localModel) apply(writes map[string]model.Write) {
	for k, w := range writes {
		if !w.Keep {
			m.states[k] = model.State{Tokens: w.Tokens, TS: w.TS}
		}
	}
}

func modelCost(r admit.Request) int64 {
	if r.Cost == 0 {
		return 1
	}
	return int64(r.Cost)
}

// TestLocalMatchesModel drives random sequences of every Local call, with
// hostile keys, costs, clock moves (steps back included), Spec changes,
// bad input and eviction pressure, and checks every Decision, every error
// and every eviction against internal/model.
func TestLocalMatchesModel(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 40
	}
	for seed := range seeds {
		if err := localSequence(uint64(seed), 400); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func localSequence(seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 29))
	w := newLocalWorld(rng, 4+rng.IntN(12))
	clock := minitest.NewClock()
	maxKeys := 2 + rng.IntN(len(w.keys)) // often fewer than the keys: eviction
	type eviction struct {
		key  string
		full bool
	}
	var evicted []eviction
	l, err := admit.NewLocal(maxKeys, admit.WithLocalClock(clock.Time), admit.WithEvictFunc(func(key string, full bool) {
		evicted = append(evicted, eviction{key, full})
	}))
	if err != nil {
		return err
	}
	m := localModel{states: map[string]model.State{}, spec: map[string]admit.Spec{}}
	keySpec := make([]admit.Spec, len(w.keys))
	for i := range keySpec {
		keySpec[i] = w.specs[rng.IntN(len(w.specs))]
	}
	ctx := context.Background()
	var log []string
	fail := func(format string, args ...any) error {
		tail := log[max(0, len(log)-8):]
		return fmt.Errorf("step %d: %s\nlast calls:\n  %s", len(log), fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
	}
	request := func() admit.Request {
		k := rng.IntN(len(w.keys))
		if rng.IntN(20) == 0 { // the key's Spec changes
			keySpec[k] = w.specs[rng.IntN(len(w.specs))]
		}
		r := admit.Request{Key: w.keys[k], Spec: keySpec[k]}
		switch rng.IntN(4) {
		case 0:
			r.Cost = 1 + rng.IntN(r.Spec.Burst())
		case 1:
			r.Cost = 1
		}
		return r
	}
	for range steps {
		now := clock.Time().UnixMicro()
		switch op := rng.IntN(12); {
		case op == 0: // the clock moves, sometimes far, sometimes back
			var d time.Duration
			switch rng.IntN(6) {
			case 0:
				d = -time.Duration(rng.IntN(5000)) * time.Millisecond
			case 1:
				d = time.Duration(rng.IntN(100)) * time.Second
			default:
				d = time.Duration(rng.IntN(3000)) * time.Microsecond * time.Duration(1+rng.IntN(1000))
			}
			clock.Advance(d)
			log = append(log, fmt.Sprintf("clock %+v", d))
		case op == 1: // bad input: the same error as a Limiter's
			first, second := request(), (*admit.Request)(nil)
			switch rng.IntN(5) {
			case 0:
				first.Key = ""
			case 1:
				first.Cost = -1 - rng.IntN(3)
			case 2:
				first.Cost = first.Spec.Burst() + 1 + rng.IntN(3)
			case 3:
				first.Spec = admit.Spec{}
			case 4:
				s := first
				second = &s
			}
			before := l.Len()
			d, err := l.AllowOrdered(ctx, first, second)
			log = append(log, fmt.Sprintf("invalid %q: %v", first.Key, err))
			if !errors.Is(err, admit.ErrInvalidRequest) || !errors.Is(err, admit.ErrNotExecuted) || d.Allowed() || d != (admit.Decision{}) {
				return fail("bad input: got %v, %v; want ErrInvalidRequest and the zero Decision", d, err)
			}
			if merr := model.Validate(first, second); !errors.Is(merr, admit.ErrInvalidRequest) {
				return fail("the model accepts what the Local refused (%v): %v", err, merr)
			}
			if l.Len() != before {
				return fail("bad input changed the Local: %d keys, was %d", l.Len(), before)
			}
		default:
			first := request()
			var second *admit.Request
			if rng.IntN(2) == 0 {
				s := request()
				if s.Key != first.Key {
					second = &s
				}
			}
			mode := []string{"AllowOrdered", "AllowAll", "Peek", "Refund"}[rng.IntN(4)]
			before := l.Len()
			evicted = evicted[:0]
			var got admit.Decision
			var err error
			var want admit.Decision
			var writes map[string]model.Write
			switch mode {
			case "AllowOrdered":
				got, err = l.AllowOrdered(ctx, first, second)
				want, writes = model.Decide(now, m.states, first, second)
			case "AllowAll":
				got, err = l.AllowAll(ctx, first, second)
				want, writes = model.DecideAll(now, m.states, first, second)
			case "Peek":
				got, err = l.Peek(ctx, first, second)
				want, _ = model.Decide(now, m.states, first, second)
			case "Refund":
				reqs := []admit.Request{first}
				if second != nil {
					reqs = append(reqs, *second)
				}
				err = l.Refund(ctx, first, second)
				writes = model.Refund(now, m.states, reqs...)
			}
			desc := fmt.Sprintf("%s(%q cost %d %v", mode, first.Key, modelCost(first), first.Spec)
			if second != nil {
				desc += fmt.Sprintf(", %q cost %d %v", second.Key, modelCost(*second), second.Spec)
			}
			desc += fmt.Sprintf(") at %d: %v", now, got)
			log = append(log, desc)
			if err != nil {
				return fail("%s: %v", mode, err)
			}
			if mode != "Refund" {
				if got.Denied != want.Denied || got.RetryAfter != want.RetryAfter || got.Remaining != want.Remaining || got.Allowed() != (want.Denied == 0) {
					return fail("%s: got %v remaining %v, want denied %d retry %v remaining %v", mode, got, got.Remaining, want.Denied, want.RetryAfter, want.Remaining)
				}
			}
			// Evictions: only to insert a key into a full Local, never a key
			// of this call; a bucket reported full is full in the model.
			inserted := 0
			for k, wr := range writes {
				if _, held := m.states[k]; !held && !wr.Keep {
					inserted++
				}
			}
			if len(evicted) != max(0, before+inserted-maxKeys) {
				return fail("%d evictions for %d keys inserted into a Local of %d keys of %d", len(evicted), inserted, before, maxKeys)
			}
			m.apply(writes)
			for k := range writes {
				if !writes[k].Keep {
					m.spec[k] = specOf(k, first, second)
				}
			}
			for _, e := range evicted {
				if e.key == first.Key || (second != nil && e.key == second.Key) {
					return fail("evicted %q, a key of the call", e.key)
				}
				st, ok := m.states[e.key]
				if !ok {
					return fail("evicted %q, which the model does not hold", e.key)
				}
				s := m.spec[e.key]
				tk, ts := model.Refill(now, s, st, true)
				if full := tk == int64(s.Burst()) && ts == now; full != e.full {
					return fail("evicted %q reported full %v; the model's bucket %+v under %v is full %v", e.key, e.full, st, s, full)
				}
				delete(m.states, e.key) // it comes back full
				delete(m.spec, e.key)
			}
			if n := l.Len(); n != len(m.states) || n > maxKeys {
				return fail("the Local holds %d keys, the model %d, the bound %d", n, len(m.states), maxKeys)
			}
		}
	}
	return nil
}

// specOf is the Spec the call gave key.
func specOf(key string, first admit.Request, second *admit.Request) admit.Spec {
	if key == first.Key {
		return first.Spec
	}
	return second.Spec
}

// TestLocalEvictsFullFirst fills a Local with buckets of which one has
// refilled to full, and checks that inserting a key evicts that one, and
// then that a Local with none full evicts the one missing fewest tokens,
// which comes back full.
func TestLocalEvictsFullFirst(t *testing.T) {
	clock := minitest.NewClock()
	var evicted []string
	var full []bool
	l := mustLocal(t, 4, admit.WithLocalClock(clock.Time), admit.WithEvictFunc(func(k string, f bool) {
		evicted, full = append(evicted, k), append(full, f)
	}))
	ctx := context.Background()
	slow := admit.MustSpec(admit.Every(time.Hour), 5)
	fast := admit.MustSpec(admit.Every(time.Millisecond), 5)
	take := func(key string, spec admit.Spec, cost int) admit.Decision {
		t.Helper()
		d, err := l.AllowOrdered(ctx, admit.Request{Key: key, Spec: spec, Cost: cost}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	take("fast", fast, 5) // least recently used, and full again in 5 ms
	take("slow-a", slow, 1)
	take("slow-b", slow, 2)
	take("slow-c", slow, 3)
	clock.Advance(5 * time.Millisecond)
	take("new", slow, 1)
	if len(evicted) != 1 || evicted[0] != "fast" || !full[0] {
		t.Fatalf("evicted %q (full %v), want the full bucket \"fast\" alone", evicted, full)
	}
	// None full now: "slow-a" misses 1 token, fewer than the others.
	take("slow-c", slow, 1) // slow-c used again: slow-a, slow-b, new are older
	take("newer", slow, 1)
	if len(evicted) != 2 || evicted[1] != "slow-a" || full[1] {
		t.Fatalf("evicted %q (full %v), want \"slow-a\" (missing fewest tokens, not full)", evicted, full)
	}
	if d := take("slow-a", slow, 1); d.Remaining[0] != 4 {
		t.Fatalf("slow-a after its eviction: remaining %d, want 4 (it came back full: burst 5 less 1)", d.Remaining[0])
	}
	if n := l.Len(); n != 4 {
		t.Fatalf("Len %d, want the bound 4", n)
	}
}

// TestLocalEvictionNeverTakesTheCallsOtherKey fills a Local of 2 keys and
// decides a pair of new keys: the second's insertion must evict, but not
// the first's bucket.
func TestLocalEvictionNeverTakesTheCallsOtherKey(t *testing.T) {
	clock := minitest.NewClock()
	l := mustLocal(t, 2, admit.WithLocalClock(clock.Time))
	spec := admit.MustSpec(admit.Every(time.Hour), 3)
	ctx := context.Background()
	for i := range 10 {
		a := admit.Request{Key: fmt.Sprintf("a%d", i), Spec: spec}
		b := admit.Request{Key: fmt.Sprintf("b%d", i), Spec: spec}
		if _, err := l.AllowOrdered(ctx, a, &b); err != nil {
			t.Fatal(err)
		}
		d, _ := l.Peek(ctx, a, &b) // what a second take would leave
		if d.Remaining != [2]int{1, 1} {
			t.Fatalf("pair %d: Peek remaining %v, want [1 1]: a bucket of the call was evicted", i, d.Remaining)
		}
	}
}

// TestLocalErrorsAsLimiter checks that every bad input gets from a Local
// the error a Limiter gives it, word for word.
func TestLocalErrorsAsLimiter(t *testing.T) {
	_, c := minitest.Start(t)
	lim := admit.New(c)
	l := mustLocal(t, 10)
	spec := admit.MustSpec(admit.Every(time.Second), 3)
	ok := admit.Request{Key: "k", Spec: spec}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name          string
		ctx           context.Context
		first         admit.Request
		second        *admit.Request
		notExecutedOn error
	}{
		{"empty key", context.Background(), admit.Request{Spec: spec}, nil, admit.ErrInvalidRequest},
		{"zero spec", context.Background(), admit.Request{Key: "k"}, nil, admit.ErrInvalidRequest},
		{"negative cost", context.Background(), admit.Request{Key: "k", Spec: spec, Cost: -1}, nil, admit.ErrInvalidRequest},
		{"cost above burst", context.Background(), admit.Request{Key: "k", Spec: spec, Cost: 4}, nil, admit.ErrInvalidRequest},
		{"second empty key", context.Background(), ok, &admit.Request{Spec: spec}, admit.ErrInvalidRequest},
		{"same key", context.Background(), ok, &ok, admit.ErrInvalidRequest},
		{"nil context", nil, ok, nil, admit.ErrInvalidRequest},
		{"key over MaxKeyLen", context.Background(), admit.Request{Key: strings.Repeat("k", admit.MaxKeyLen+1), Spec: spec}, nil, admit.ErrInvalidRequest},
		{"context done", done, ok, nil, context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]error, 0, 4)
			got := make([]error, 0, 4)
			for _, call := range []func(admit.Decider) (admit.Decision, error){
				func(d admit.Decider) (admit.Decision, error) { return d.AllowOrdered(tc.ctx, tc.first, tc.second) },
				func(d admit.Decider) (admit.Decision, error) { return d.AllowAll(tc.ctx, tc.first, tc.second) },
				func(d admit.Decider) (admit.Decision, error) { return d.Peek(tc.ctx, tc.first, tc.second) },
				func(d admit.Decider) (admit.Decision, error) {
					return admit.Decision{}, d.Refund(tc.ctx, tc.first, tc.second)
				},
			} {
				dl, errL := call(l)
				_, errLim := callLimiter(lim, len(got), tc.ctx, tc.first, tc.second)
				if dl.Allowed() || dl != (admit.Decision{}) {
					t.Errorf("call %d: Decision %v with error %v; want the zero Decision", len(got), dl, errL)
				}
				want, got = append(want, errLim), append(got, errL)
			}
			for i := range got {
				if !errors.Is(got[i], tc.notExecutedOn) || !errors.Is(got[i], admit.ErrNotExecuted) {
					t.Errorf("call %d: %v; want %v and ErrNotExecuted", i, got[i], tc.notExecutedOn)
				}
				if tc.name != "context done" && got[i].Error() != want[i].Error() {
					t.Errorf("call %d:\n Local:   %v\n Limiter: %v", i, got[i], want[i])
				}
			}
		})
	}
}

// callLimiter makes call i of TestLocalErrorsAsLimiter's four on a
// Limiter: AllowOrdered, AllowAll, Peek, Refund.
func callLimiter(lim *admit.Limiter, i int, ctx context.Context, first admit.Request, second *admit.Request) (admit.Decision, error) {
	switch i {
	case 0:
		return lim.AllowOrdered(ctx, first, second)
	case 1:
		return lim.AllowAll(ctx, first, second)
	case 2:
		return lim.Peek(ctx, first, second)
	}
	return admit.Decision{}, lim.Refund(ctx, first, second)
}

// TestLocalConcurrent has goroutines race for one bucket on a clock that
// stands still: exactly burst are admitted, and the pairs that race for a
// shared bucket charge it exactly once per admission.
func TestLocalConcurrent(t *testing.T) {
	clock := minitest.NewClock()
	l := mustLocal(t, 1000, admit.WithLocalClock(clock.Time))
	shared := admit.MustSpec(admit.Every(time.Hour), 50)
	own := admit.MustSpec(admit.Every(time.Hour), 10)
	var admitted, denied2 atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			first := admit.Request{Key: fmt.Sprintf("own:%d", g), Spec: own}
			second := admit.Request{Key: "shared", Spec: shared}
			for range 20 {
				d, err := l.AllowAll(context.Background(), first, &second)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed() {
					admitted.Add(1)
				} else if d.Denied == 2 {
					denied2.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 50 {
		t.Fatalf("admitted %d, want exactly the shared burst 50", admitted.Load())
	}
	// All or nothing: every own bucket holds 10 less what it was admitted.
	var sum int
	for g := range 16 {
		d, _ := l.Peek(context.Background(), admit.Request{Key: fmt.Sprintf("own:%d", g), Spec: own}, nil)
		held := d.Remaining[0] // a denial: what the bucket holds
		if d.Allowed() {
			held++ // what a take would leave, plus its cost
		}
		sum += 10 - held
	}
	if sum != 50 {
		t.Fatalf("the own buckets were charged %d tokens for 50 admissions (%d second-bucket denials)", sum, denied2.Load())
	}
}

// TestLocalConcurrentEviction has goroutines decide pairs of many keys on
// a Local of few, on a clock that moves (and steps back) under them:
// under the race detector, every call succeeds, the Local never holds
// more than its bound, and every bucket it holds decides within its Spec.
func TestLocalConcurrentEviction(t *testing.T) {
	clock := minitest.NewClock()
	var evictions atomic.Int64
	l := mustLocal(t, 5, admit.WithLocalClock(clock.Time), admit.WithEvictFunc(func(string, bool) { evictions.Add(1) }))
	specs := []admit.Spec{admit.MustSpec(admit.Every(time.Millisecond), 3), admit.MustSpec(admit.Every(time.Second), 1)}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 5))
			for range 500 {
				if g == 0 && rng.IntN(10) == 0 {
					clock.Advance(time.Duration(rng.IntN(3000)-500) * time.Microsecond)
				}
				a := admit.Request{Key: fmt.Sprintf("k%d", rng.IntN(20)), Spec: specs[rng.IntN(2)]}
				b := admit.Request{Key: fmt.Sprintf("k%d", rng.IntN(20)), Spec: specs[rng.IntN(2)]}
				var d admit.Decision
				var err error
				switch {
				case a.Key == b.Key:
					d, err = l.AllowOrdered(context.Background(), a, nil)
				case rng.IntN(3) == 0:
					err = l.Refund(context.Background(), a, &b)
				case rng.IntN(2) == 0:
					d, err = l.AllowAll(context.Background(), a, &b)
				default:
					d, err = l.Peek(context.Background(), a, &b)
				}
				if err != nil || d.Remaining[0] > a.Spec.Burst() || d.Remaining[1] > b.Spec.Burst() {
					t.Errorf("%v, %v: %v", a, b, err)
					return
				}
				if n := l.Len(); n > 5 {
					t.Errorf("the Local holds %d keys, over its bound 5", n)
					return
				}
			}
		})
	}
	wg.Wait()
	if evictions.Load() == 0 {
		t.Fatal("no eviction: the test did not press on the bound")
	}
}

// TestSpecScale checks Scale against its promises on random Specs and
// fractions: never faster than fraction × rate, and no slower than one
// microsecond per token more; burst fraction × burst rounded down, at
// least 1.
func TestSpecScale(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		per := time.Duration(1+rng.Int64N(1e7)) * time.Microsecond
		burst := 1 + rng.IntN(5000)
		s := admit.MustSpec(admit.Every(per), burst)
		f := rng.Float64()
		if i%10 == 0 {
			f = []float64{1, 0.5, 0.25, 1.0 / 3, 0.1, 1e-3}[i/10%6]
		}
		if f == 0 {
			continue
		}
		g, err := s.Scale(f)
		if err != nil {
			t.Fatalf("%v.Scale(%v): %v", s, f, err)
		}
		// exact: g's interval × f >= s's interval > (g's interval - 1µs) × f
		rf := new(big.Rat).SetFloat64(f)
		gi := new(big.Rat).SetInt64(g.Interval().Microseconds())
		si := new(big.Rat).SetInt64(s.Interval().Microseconds())
		lo := new(big.Rat).Mul(new(big.Rat).Sub(gi, big.NewRat(1, 1)), rf)
		if new(big.Rat).Mul(gi, rf).Cmp(si) < 0 || lo.Cmp(si) >= 0 {
			t.Fatalf("%v.Scale(%v) = %v: interval not the smallest whole µs at or above %v / %v", s, f, g, s.Interval(), f)
		}
		bf := new(big.Rat).Mul(new(big.Rat).SetInt64(int64(burst)), rf)
		gb := new(big.Rat).SetInt64(int64(g.Burst()))
		if g.Burst() < 1 || (g.Burst() > 1 && gb.Cmp(bf) > 0) || new(big.Rat).Add(gb, big.NewRat(1, 1)).Cmp(bf) <= 0 {
			t.Fatalf("%v.Scale(%v) = %v: burst not %d × %v rounded down (at least 1)", s, f, g, burst, f)
		}
	}
	for _, f := range []float64{0, -0.5, 1.5, 2} {
		if _, err := admit.MustSpec(1, 1).Scale(f); !errors.Is(err, admit.ErrInvalidSpec) {
			t.Errorf("Scale(%v): %v, want ErrInvalidSpec", f, err)
		}
	}
	if _, err := (admit.Spec{}).Scale(0.5); !errors.Is(err, admit.ErrInvalidSpec) {
		t.Errorf("zero Spec's Scale: %v, want ErrInvalidSpec", err)
	}
	if _, err := admit.MustSpec(admit.Every(1000*time.Hour), 1).Scale(1e-9); !errors.Is(err, admit.ErrInvalidSpec) {
		t.Errorf("a scale beyond 35 years of refill: %v, want ErrInvalidSpec", err)
	}
}

// TestDegradedFleetBound runs N Degraded processes at fraction f on one
// key, each taking as fast as it can for a while on a shared clock, and
// checks the fleet's admissions against N × (scaled burst + scaled rate ×
// t), exactly, and against N × f × (burst + rate × t), the bound the docs
// give (plus N for the burst floor of 1).
func TestDegradedFleetBound(t *testing.T) {
	for _, tc := range []struct {
		n     int
		f     float64
		spec  admit.Spec
		every time.Duration // how often each process tries
		span  time.Duration
	}{
		{4, 0.25, admit.MustSpec(admit.Every(10*time.Millisecond), 20), time.Millisecond, 10 * time.Second},
		{3, 1.0 / 3, admit.MustSpec(admit.Every(time.Second), 10), 7 * time.Millisecond, 60 * time.Second},
		{10, 0.1, admit.MustSpec(admit.Every(time.Second), 5), 50 * time.Millisecond, 30 * time.Second}, // burst floor: 5 × 0.1 < 1
	} {
		t.Run(fmt.Sprintf("N=%d,f=%.3g", tc.n, tc.f), func(t *testing.T) {
			clock := minitest.NewClock()
			fleet := make([]*admit.Degraded, tc.n)
			for i := range fleet {
				g, err := admit.NewDegraded(tc.f, 100, admit.WithLocalClock(clock.Time))
				if err != nil {
					t.Fatal(err)
				}
				fleet[i] = g
			}
			r := admit.Request{Key: "rl:{api}:shared", Spec: tc.spec}
			admitted := 0
			for elapsed := time.Duration(0); elapsed <= tc.span; elapsed += tc.every {
				for _, g := range fleet {
					d, err := g.AllowAll(context.Background(), r, nil)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed() {
						admitted++
					}
				}
				clock.Advance(tc.every)
			}
			scaled, _ := fleet[0].Scale(tc.spec)
			exact := tc.n * (scaled.Burst() + int(tc.span/scaled.Interval()))
			if admitted != exact {
				t.Fatalf("admitted %d, want %d: N × (scaled burst %d + span / scaled interval %v)", admitted, exact, scaled.Burst(), scaled.Interval())
			}
			bound := float64(tc.n)*tc.f*(float64(tc.spec.Burst())+tc.span.Seconds()*float64(tc.spec.Limit())) + float64(tc.n)
			if float64(admitted) > bound {
				t.Fatalf("admitted %d above the fleet bound N × f × (burst + rate × t) + N = %.1f", admitted, bound)
			}
			t.Logf("admitted %d, fleet bound %.1f, whole limit %.1f", admitted, bound, float64(tc.spec.Burst())+tc.span.Seconds()*float64(tc.spec.Limit()))
		})
	}
}

// TestDegradedRefusesACostAboveItsBurst: a Cost that fits the Spec but not
// its scaled burst is bad input while degraded, named as such.
func TestDegradedRefusesACostAboveItsBurst(t *testing.T) {
	g, err := admit.NewDegraded(0.25, 10)
	if err != nil {
		t.Fatal(err)
	}
	d, err := g.AllowOrdered(context.Background(), admit.Request{Key: "k", Spec: admit.MustSpec(1, 20), Cost: 10}, nil)
	if !errors.Is(err, admit.ErrInvalidRequest) || d.Allowed() || !strings.Contains(err.Error(), "degraded burst 5") {
		t.Fatalf("got %v, %v; want ErrInvalidRequest naming the degraded burst 5", d, err)
	}
	for _, f := range []float64{0, 1.01, -1} {
		if _, err := admit.NewDegraded(f, 10); err == nil {
			t.Errorf("NewDegraded(%v) accepted", f)
		}
	}
	sizes := []int{-1, 0, 1}
	if over := int64(math.MaxInt32) + 1; int64(int(over)) == over { // 64-bit int
		sizes = append(sizes, int(over))
	}
	for _, n := range sizes {
		if _, err := admit.NewLocal(n); err == nil {
			t.Errorf("NewLocal(%d) accepted", n)
		}
	}
}

func BenchmarkLocal(b *testing.B) {
	spec := admit.MustSpec(admit.Every(time.Nanosecond*1000), 1000000)
	ctx := context.Background()
	b.Run("one-bucket", func(b *testing.B) {
		l := mustLocal(b, 1000)
		r := admit.Request{Key: "k", Spec: spec}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.AllowOrdered(ctx, r, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("two-bucket", func(b *testing.B) {
		l := mustLocal(b, 1000)
		r, s := admit.Request{Key: "k", Spec: spec}, admit.Request{Key: "s", Spec: spec}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.AllowAll(ctx, r, &s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("degraded", func(b *testing.B) {
		g, _ := admit.NewDegraded(0.25, 1000)
		r, s := admit.Request{Key: "k", Spec: spec}, admit.Request{Key: "s", Spec: spec}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := g.AllowAll(ctx, r, &s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
