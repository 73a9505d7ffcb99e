package admit

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Limit is the rate at which a bucket refills, in tokens per second, as in
// golang.org/x/time/rate: Every(100*time.Millisecond) is Limit(10).
type Limit float64

// Every converts the interval between two tokens into a Limit. A zero or
// negative interval gives an infinite Limit, which [NewSpec] refuses.
func Every(interval time.Duration) Limit {
	if interval <= 0 {
		return Limit(math.Inf(1))
	}
	return 1 / Limit(interval.Seconds())
}

// Bounds of a Spec.
const (
	// MaxLimit is the fastest refill a Spec accepts: one token per microsecond.
	MaxLimit Limit = 1e6
	// maxRefillMicros bounds burst × interval, the time to refill from
	// empty. The server computes in whole microseconds with Lua numbers,
	// which are exact integers up to 2^53; keeping a full refill under
	// 2^50 µs (about 35 years) leaves every intermediate value exact.
	maxRefillMicros = 1 << 50
)

// RateTolerance is how much slower than asked NewSpec may enforce a rate,
// once rounded to whole microseconds per token (docs/semantics.md).
const RateTolerance = 0.01

// snapTolerance absorbs float64 noise: 1e6/float64(Every(5*time.Microsecond))
// is 5.000000000000001, and a caller who wrote Every(5*time.Microsecond)
// asked for exactly 5 µs. An interval within one part in 10^12 of a whole
// microsecond is taken as that microsecond.
const snapTolerance = 1e-12

// A Spec describes one token bucket: it holds at most Burst tokens, starts
// full, and gains one token every Interval, a whole number of microseconds.
// A Spec is an immutable value; build it once with [NewSpec] or [MustSpec]
// and share it between goroutines. The zero Spec is invalid.
type Spec struct {
	limit    Limit
	burst    int
	interval time.Duration
	ttl      time.Duration

	// Pre-encoded ARGV for the script: microseconds per token and burst.
	// The script computes the expiry from them, which saves the server an
	// argument per bucket on every call.
	intervalArg, burstArg string
}

// NewSpec returns a Spec that holds at most burst tokens and gains one every
// 1/rate, rounded up to a whole microsecond. It returns an error wrapping
// [ErrInvalidSpec] for a rate or burst it cannot honour (docs/errors.md).
func NewSpec(rate Limit, burst int) (Spec, error) {
	r := float64(rate)
	switch {
	case math.IsInf(r, 1):
		// Every(d) gives +Inf for d <= 0, the usual way to get here.
		return Spec{}, fmt.Errorf("%w: the interval between two tokens is zero or negative (Every(d) with d <= 0 gives an infinite rate); "+
			"use an interval of at least 1µs, such as Every(time.Second)", ErrInvalidSpec)
	case math.IsNaN(r) || math.IsInf(r, 0):
		return Spec{}, fmt.Errorf("%w: rate %v is not a finite number of tokens per second", ErrInvalidSpec, r)
	case r <= 0:
		return Spec{}, fmt.Errorf("%w: rate %v must be above zero (a bucket that never refills admits only its burst, once)", ErrInvalidSpec, r)
	case rate > MaxLimit:
		return Spec{}, fmt.Errorf("%w: rate %v exceeds MaxLimit (%v tokens per second)", ErrInvalidSpec, r, float64(MaxLimit))
	case burst < 1:
		return Spec{}, fmt.Errorf("%w: burst %d must be at least 1", ErrInvalidSpec, burst)
	}
	exact := 1e6 / r // µs per token as asked; >= 1, since rate <= MaxLimit
	micros := math.Ceil(exact)
	if near := math.Round(exact); math.Abs(exact-near) <= exact*snapTolerance {
		micros = near
	}
	if micros > exact*(1+RateTolerance) {
		return Spec{}, fmt.Errorf("%w: rate %.6g/s needs %.4g µs per token, and the server counts whole microseconds: "+
			"%.6g/s (%v µs) would be faster than asked and %.6g/s (%v µs) %.1f%% slower, beyond RateTolerance (%v%%)",
			ErrInvalidSpec, r, exact, 1e6/(micros-1), micros-1, 1e6/micros, micros, 100*(1-exact/micros), 100*RateTolerance)
	}
	if micros*float64(burst) > maxRefillMicros {
		return Spec{}, fmt.Errorf("%w: burst %d at rate %v takes longer than %v to refill from empty",
			ErrInvalidSpec, burst, r, time.Duration(maxRefillMicros)*time.Microsecond)
	}
	interval := int64(micros)
	refill := interval * int64(burst)  // µs; exact, bounded above
	ttlMillis := (refill + 999) / 1000 // rounded up: never shorter than the refill
	return Spec{
		limit:       Every(time.Duration(interval) * time.Microsecond), // as Every computes it: NewSpec(Every(d)).Limit() == Every(d)
		burst:       burst,
		interval:    time.Duration(interval) * time.Microsecond,
		ttl:         time.Duration(ttlMillis) * time.Millisecond,
		intervalArg: strconv.FormatInt(interval, 10),
		burstArg:    strconv.Itoa(burst),
	}, nil
}

// MustSpec is like [NewSpec] but panics if the arguments are invalid: for
// package-level Specs built from constants.
func MustSpec(rate Limit, burst int) Spec {
	s, err := NewSpec(rate, burst)
	if err != nil {
		panic(err)
	}
	return s
}

// Limit returns the rate the server enforces, one token per Interval: never
// above the rate given to NewSpec, at most [RateTolerance] below it.
func (s Spec) Limit() Limit { return s.limit }

// Burst returns the most tokens the bucket holds; a fresh bucket is full.
func (s Spec) Burst() int { return s.burst }

// Interval returns the time the server takes to add one token.
func (s Spec) Interval() time.Duration { return s.interval }

// TTL returns the expiry each write gives the bucket's key: Burst × Interval,
// rounded up to a millisecond (docs/key-schema.md).
func (s Spec) TTL() time.Duration { return s.ttl }

// IsZero reports whether s is the zero Spec, which is invalid.
func (s Spec) IsZero() bool { return s.burst == 0 }

// String describes s as enforced: "0.666667/s burst 20 (1.5s per token)".
func (s Spec) String() string {
	if s.IsZero() {
		return "invalid zero Spec"
	}
	return fmt.Sprintf("%.6g/s burst %d (%v per token)", float64(s.limit), s.burst, s.interval)
}
