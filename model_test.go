package admit

import "time"

// A pure-Go reference model of the script: the token bucket as documented
// (DESIGN.md, the key schema, the Spec and Decision docs), in integer
// arithmetic, so the conformance checks can predict every decision and
// every stored field.

// mstate is a stored bucket: the hash fields of the key schema.
type mstate struct{ tokens, ts int64 }

// mwrite is what one decision stores for a bucket: its fields and the
// PEXPIRE it gives the key, in milliseconds.
type mwrite struct{ tokens, ts, ttlMs int64 }

// modelDecide decides first (and second) at server time now, in µs since
// the epoch, given the stored buckets (a key absent from states is absent
// on the server). It returns the decision and the buckets it writes; a key
// it does not write must be left byte for byte as it was.
func modelDecide(now int64, states map[string]mstate, first Request, second *Request) (Decision, map[string]mwrite) {
	writes := map[string]mwrite{}
	refill := func(r Request) (tk, ts int64) {
		st, ok := states[r.Key]
		return modelRefill(now, r.Spec, st, ok)
	}
	store := func(r Request, tk, ts int64) {
		ttl := r.Spec.TTL().Milliseconds()
		if ts > now { // refill resumes only once the clock passes ts again
			ttl += (ts - now + 999) / 1000
		}
		writes[r.Key] = mwrite{tk, ts, ttl}
	}
	wait := func(r Request, tk, ts int64) time.Duration {
		return micros(ts + (int64(r.cost())-tk)*r.Spec.Interval().Microseconds() - now)
	}
	c1 := int64(first.cost())
	tk1, ts1 := refill(first)
	if tk1 < c1 {
		store(first, tk1, ts1)
		return Decision{Denied: 1, RetryAfter: wait(first, tk1, ts1), Remaining: [2]int{int(tk1), -1}, decided: true}, writes
	}
	rem2 := int64(-1)
	if second != nil {
		c2 := int64(second.cost())
		tk2, ts2 := refill(*second)
		if tk2 < c2 {
			store(first, tk1-c1, ts1)
			store(*second, tk2, ts2)
			return Decision{Denied: 2, RetryAfter: wait(*second, tk2, ts2), Remaining: [2]int{int(tk1 - c1), int(tk2)}, decided: true}, writes
		}
		store(*second, tk2-c2, ts2)
		rem2 = tk2 - c2
	}
	store(first, tk1-c1, ts1)
	return Decision{Remaining: [2]int{int(tk1 - c1), int(rem2)}, decided: true}, writes
}

// modelRefill returns a bucket's tokens and ts after crediting the refill
// earned up to now.
func modelRefill(now int64, spec Spec, st mstate, exists bool) (tk, ts int64) {
	interval, burst := spec.Interval().Microseconds(), int64(spec.Burst())
	if !exists {
		return burst, now // a fresh bucket is full
	}
	tk, ts = min(st.tokens, burst), st.ts // a smaller burst caps old state
	ts = min(ts, now+(burst-1)*interval)  // a clock behind ts freezes at most one full refill
	if now > ts {                         // a clock behind ts earns nothing
		gained := (now - ts) / interval
		if tk+gained >= burst {
			return burst, now
		}
		tk, ts = tk+gained, ts+gained*interval // the partial token stays in ts
	}
	return tk, ts
}

func micros(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
