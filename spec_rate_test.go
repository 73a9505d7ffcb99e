package admit

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestNeverFasterThanAsked: the rate the server enforces (one token per
// whole microsecond Interval) is never faster than the rate asked, at most
// RateTolerance slower, and it is what Limit reports. (Before the fix,
// NewSpec rounded to the nearest microsecond: 700000/s was enforced as
// 1,000,000/s and 3/s as 3.000003/s, while Limit reported the rate asked.)
func TestNeverFasterThanAsked(t *testing.T) {
	check := func(rate Limit, burst int) {
		t.Helper()
		s, err := NewSpec(rate, burst)
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("NewSpec(%v, %d): %v, not ErrInvalidSpec", float64(rate), burst, err)
			}
			return
		}
		us := s.Interval().Microseconds()
		if time.Duration(us)*time.Microsecond != s.Interval() || us < 1 {
			t.Fatalf("NewSpec(%v): interval %v is not a whole number of µs", float64(rate), s.Interval())
		}
		enforced := float64(Every(s.Interval())) // one token per whole-µs Interval
		if enforced > float64(rate)*(1+snapTolerance) {
			t.Errorf("NewSpec(%v): the server enforces %v/s (%d µs per token), faster than asked", float64(rate), enforced, us)
		}
		if enforced < float64(rate)*(1-RateTolerance) {
			t.Errorf("NewSpec(%v): the server enforces %v/s, more than RateTolerance slower", float64(rate), enforced)
		}
		if float64(s.Limit()) != enforced {
			t.Errorf("NewSpec(%v): Limit() = %v, want the enforced %v", float64(rate), float64(s.Limit()), enforced)
		}
	}
	for _, r := range []Limit{700_000, 3, 7, 1.0 / 3, 999_999, 505_001, 504_999, 9_999, 10_000, 10_001, 123_456.789} {
		check(r, 1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20_000 {
		check(Limit(math.Pow(10, rng.Float64()*9-3)), 1) // 0.001/s to 1e6/s
	}

	// Every(d) with whole microseconds is exact, and round-trips.
	for _, d := range []time.Duration{time.Microsecond, 3 * time.Microsecond, 1500 * time.Millisecond, 333_333 * time.Microsecond, time.Hour, 7 * 24 * time.Hour} {
		s, err := NewSpec(Every(d), 1)
		if err != nil || s.Interval() != d || s.Limit() != Every(d) {
			t.Errorf("NewSpec(Every(%v)) = interval %v limit %v, %v; want interval %v limit %v", d, s.Interval(), float64(s.Limit()), err, d, float64(Every(d)))
		}
	}
	for range 20_000 {
		d := time.Duration(1+rng.Int64N(int64(time.Hour/time.Microsecond))) * time.Microsecond
		if s, err := NewSpec(Every(d), 1); err != nil || s.Interval() != d {
			t.Fatalf("NewSpec(Every(%v)) = interval %v, %v; want %v", d, s.Interval(), err, d)
		}
	}

	// The two rates the trust review found.
	if _, err := NewSpec(700_000, 1); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("NewSpec(700000/s) = %v; want ErrInvalidSpec (2 µs per token would be 29%% slower, 1 µs faster)", err)
	}
	if s := MustSpec(3, 1); s.Interval() != 333_334*time.Microsecond || s.String() != "2.99999/s burst 1 (333.334ms per token)" {
		t.Errorf("MustSpec(3, 1) = %v, interval %v; want 333.334ms per token, reported as 2.99999/s", s, s.Interval())
	}
}
