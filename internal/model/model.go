// Package model is a pure-Go reference model of admit's script: the token
// bucket as documented (DESIGN.md, the key schema, the Spec and Decision
// docs), in integer arithmetic, so tests can predict every decision and
// every stored field.
package model

import (
	"time"

	"github.com/admitkit/admit"
)

// State is a stored bucket: the hash fields of the key schema.
type State struct{ Tokens, TS int64 }

// Write is what one decision does to a bucket: it stores the fields and
// sets the key's expiry to ExpireAtMs (PEXPIREAT, ms since the epoch) or,
// with Keep (a denied bucket), leaves the fields as stored (Tokens and TS
// are then the refilled values, for information) and only lengthens the
// expiry to at least ExpireAtMs (PEXPIREAT GT).
type Write struct {
	Tokens, TS, ExpireAtMs int64
	Keep                   bool
}

// Decide decides first (and second) at server time now, in µs since the
// epoch, given the stored buckets (a key absent from states is absent on the
// server), as AllowOrdered does. It returns the decision and the buckets it
// writes; a key it does not write must be left byte for byte as it was. The
// Decision it returns is built outside package admit, so its Allowed is
// false: compare Denied, RetryAfter and Remaining.
func Decide(now int64, states map[string]State, first admit.Request, second *admit.Request) (admit.Decision, map[string]Write) {
	return decide(now, states, first, second, false)
}

// DecideAll is Decide as AllowAll decides, all or nothing: when the second
// bucket refuses, the first is not charged either, and both are left as a
// denial leaves a bucket.
func DecideAll(now int64, states map[string]State, first admit.Request, second *admit.Request) (admit.Decision, map[string]Write) {
	return decide(now, states, first, second, true)
}

func decide(now int64, states map[string]State, first admit.Request, second *admit.Request, all bool) (admit.Decision, map[string]Write) {
	writes := map[string]Write{}
	refill := func(r admit.Request) (tk, ts int64) {
		st, ok := states[r.Key]
		return Refill(now, r.Spec, st, ok)
	}
	store := func(r admit.Request, tk, ts int64) {
		// the later of now and ts (refill resumes only once the clock passes
		// ts again), rounded up to a ms, plus the time to refill from empty
		writes[r.Key] = Write{Tokens: tk, TS: ts, ExpireAtMs: (max(ts, now)+999)/1000 + r.Spec.TTL().Milliseconds()}
	}
	// keep is a denial: nothing stored unless ts was pulled back from the
	// future; the key lives at least until the bucket is full again.
	keep := func(r admit.Request, tk, ts int64) {
		if st := states[r.Key]; st.TS > now+(int64(r.Spec.Burst())-1)*r.Spec.Interval().Microseconds() {
			store(r, tk, ts)
			return
		}
		full := ts + (int64(r.Spec.Burst())-tk)*r.Spec.Interval().Microseconds() // the moment it is full again
		writes[r.Key] = Write{Tokens: tk, TS: ts, ExpireAtMs: (full + 999) / 1000, Keep: true}
	}
	cost := func(r admit.Request) int64 {
		if r.Cost == 0 {
			return 1
		}
		return int64(r.Cost)
	}
	wait := func(r admit.Request, tk, ts int64) time.Duration {
		return micros(ts + (cost(r)-tk)*r.Spec.Interval().Microseconds() - now)
	}
	c1 := cost(first)
	tk1, ts1 := refill(first)
	if tk1 < c1 {
		keep(first, tk1, ts1)
		return admit.Decision{Denied: 1, RetryAfter: wait(first, tk1, ts1), Remaining: [2]int{int(tk1), -1}}, writes
	}
	rem2 := int64(-1)
	if second != nil {
		c2 := cost(*second)
		tk2, ts2 := refill(*second)
		if tk2 < c2 && all {
			keep(first, tk1, ts1)
			keep(*second, tk2, ts2)
			return admit.Decision{Denied: 2, RetryAfter: wait(*second, tk2, ts2), Remaining: [2]int{int(tk1), int(tk2)}}, writes
		}
		if tk2 < c2 {
			store(first, tk1-c1, ts1)
			keep(*second, tk2, ts2)
			return admit.Decision{Denied: 2, RetryAfter: wait(*second, tk2, ts2), Remaining: [2]int{int(tk1 - c1), int(tk2)}}, writes
		}
		store(*second, tk2-c2, ts2)
		rem2 = tk2 - c2
	}
	store(first, tk1-c1, ts1)
	return admit.Decision{Remaining: [2]int{int(tk1 - c1), int(rem2)}}, writes
}

// Refill returns a bucket's tokens and ts after crediting the refill earned
// up to now.
func Refill(now int64, spec admit.Spec, st State, exists bool) (tk, ts int64) {
	interval, burst := spec.Interval().Microseconds(), int64(spec.Burst())
	if !exists {
		return burst, now // a fresh bucket is full
	}
	tk, ts = min(st.Tokens, burst), st.TS // a smaller burst caps old state
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
