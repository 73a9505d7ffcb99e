package admit

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNewSpecRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  Limit
		burst int
	}{
		{"NaN rate", Limit(math.NaN()), 1},
		{"+Inf rate", Limit(math.Inf(1)), 1},
		{"-Inf rate", Limit(math.Inf(-1)), 1},
		{"Every(0)", Every(0), 1},
		{"Every(-1s)", Every(-time.Second), 1},
		{"zero rate", 0, 1},
		{"negative rate", -1, 1},
		{"smallest positive rate", Limit(math.SmallestNonzeroFloat64), 1},
		{"rate above MaxLimit", MaxLimit * 1.5, 1},
		{"rate between two whole-µs intervals", 700_000, 1},
		{"zero burst", 1, 0},
		{"negative burst", 1, -5},
		{"refill longer than 2^50 µs", Every(time.Hour), 1 << 22},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSpec(tc.rate, tc.burst)
			if !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("NewSpec(%v, %d) = %v, %v; want ErrInvalidSpec", float64(tc.rate), tc.burst, s, err)
			}
			if !s.IsZero() {
				t.Errorf("NewSpec returned a non-zero Spec with an error: %v", s)
			}
		})
	}
}

func TestNewSpecValues(t *testing.T) {
	for _, tc := range []struct {
		rate     Limit
		burst    int
		interval time.Duration
		ttl      time.Duration
		args     [2]string
	}{
		{Every(1500 * time.Millisecond), 20, 1500 * time.Millisecond, 30 * time.Second, [2]string{"1500000", "20"}},
		{3, 4, 333334 * time.Microsecond, 1334 * time.Millisecond, [2]string{"333334", "4"}}, // 1333.336 ms, rounded up
		{MaxLimit, 1, time.Microsecond, time.Millisecond, [2]string{"1", "1"}},
		{Every(time.Hour), 1 << 18, time.Hour, time.Hour << 18, [2]string{"3600000000", "262144"}},
	} {
		s, err := NewSpec(tc.rate, tc.burst)
		if err != nil {
			t.Errorf("NewSpec(%v, %d): %v", float64(tc.rate), tc.burst, err)
			continue
		}
		if s.Limit() != Every(tc.interval) || s.Burst() != tc.burst || s.Interval() != tc.interval || s.TTL() != tc.ttl {
			t.Errorf("NewSpec(%v, %d) = limit %v burst %d interval %v ttl %v; want %v %d %v %v",
				float64(tc.rate), tc.burst, float64(s.Limit()), s.Burst(), s.Interval(), s.TTL(), float64(Every(tc.interval)), tc.burst, tc.interval, tc.ttl)
		}
		if got := [2]string{s.intervalArg, s.burstArg}; got != tc.args {
			t.Errorf("NewSpec(%v, %d) script args = %q, want %q", float64(tc.rate), tc.burst, got, tc.args)
		}
		if s.TTL() < time.Duration(s.Burst())*s.Interval() {
			t.Errorf("TTL %v shorter than the refill time %v", s.TTL(), time.Duration(s.Burst())*s.Interval())
		}
	}
}

func TestMustSpecPanicsOnBadInput(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Error("MustSpec(0, 1) did not panic")
		} else if err, ok := r.(error); !ok || !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("MustSpec panicked with %v, want an ErrInvalidSpec error", r)
		}
	}()
	MustSpec(0, 1)
}

func TestSpecString(t *testing.T) {
	for spec, want := range map[Spec]string{
		MustSpec(Every(1500*time.Millisecond), 20): "0.666667/s burst 20 (1.5s per token)",
		MustSpec(100, 10):                          "100/s burst 10 (10ms per token)",
		{}:                                         "invalid zero Spec",
	} {
		if got := spec.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

// TestNewSpecZeroIntervalNamesTheInterval: Every(0) is how a caller gets an
// infinite rate, so the error says that the interval was zero, not only
// that +Inf is not finite.
func TestNewSpecZeroIntervalNamesTheInterval(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := NewSpec(Every(d), 1)
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "interval between two tokens is zero or negative") {
			t.Errorf("NewSpec(Every(%v), 1): %v, want ErrInvalidSpec naming the zero interval", d, err)
		}
	}
}

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

// specBounds pins every bound of NewSpec at its edge: the last value
// accepted and the first refused, and the rounding of interval and TTL.
// TestMutants moves each bound in a copy of spec.go and requires
// TestSpecBounds to fail there.
var specBounds = []struct {
	name     string
	rate     Limit
	burst    int
	ok       bool
	interval time.Duration // when ok
	ttl      time.Duration // when ok
}{
	{"rate NaN", Limit(math.NaN()), 1, false, 0, 0},
	{"rate +Inf", Limit(math.Inf(1)), 1, false, 0, 0},
	{"rate -Inf", Limit(math.Inf(-1)), 1, false, 0, 0},
	{"rate zero", 0, 1, false, 0, 0},
	{"rate negative", -0.5, 1, false, 0, 0},
	{"rate MaxLimit", MaxLimit, 1, true, time.Microsecond, time.Millisecond},
	{"rate just above MaxLimit", Limit(math.Nextafter(float64(MaxLimit), math.Inf(1))), 1, false, 0, 0},
	{"rate 1.5 MaxLimit", 1.5 * MaxLimit, 1, false, 0, 0},
	{"burst 1", 1, 1, true, time.Second, time.Second},
	{"burst zero", 1, 0, false, 0, 0},
	{"burst negative", 1, -1, false, 0, 0},
	{"refill exactly 2^50 µs", MaxLimit, two50, true, time.Microsecond, time.Duration(two50+999) / 1000 * time.Millisecond},
	{"refill 2^50 + 1 µs", MaxLimit, two50 + 1, false, 0, 0},
	{"interval 2.5 µs refused: 3 µs is 16.7% slower", 400_000, 1, false, 0, 0},
	{"interval 1.98 µs: 2 µs is just within RateTolerance", 504_999, 1, true, 2 * time.Microsecond, time.Millisecond},
	{"interval 1.98 µs: 2 µs is just beyond RateTolerance", 505_001, 1, false, 0, 0},
	{"interval 333333.3 µs rounds up to 333334", 3, 1, true, 333_334 * time.Microsecond, 334 * time.Millisecond},
	{"Every(5 µs): 1e6/rate is 5.000000000000001, float noise, stays 5 µs", Every(5 * time.Microsecond), 1, true, 5 * time.Microsecond, time.Millisecond},
	{"TTL rounds up to the millisecond", Every(1001 * time.Microsecond), 1, true, 1001 * time.Microsecond, 2 * time.Millisecond},
	{"chat standard: 20 per 30 s", Every(1500 * time.Millisecond), 20, true, 1500 * time.Millisecond, 30 * time.Second},
	{"slow: one an hour, burst 1000", Every(time.Hour), 1000, true, time.Hour, 1000 * time.Hour},
}

// two50 is 2^50 where int has 64 bits. It is computed at run time so that
// this file compiles where int has 32 bits, and the rows that use it are
// skipped there.
var two50 = 1 << (50 * (strconv.IntSize / 64))

// specBoundReasons: rows whose refusal must name its own reason, so that a
// bound refused only by another check (a negative rate caught by the
// rounding tolerance) still counts as a broken bound.
var specBoundReasons = map[string]string{
	"rate NaN":           "finite",
	"rate zero":          "above zero",
	"rate negative":      "above zero",
	"rate 1.5 MaxLimit":  "MaxLimit",
	"burst zero":         "at least 1",
	"refill 2^50 + 1 µs": "to refill from empty",
}

func TestSpecBounds(t *testing.T) {
	for _, tc := range specBounds {
		if strconv.IntSize < 64 && strings.Contains(tc.name, "2^50") {
			continue
		}
		s, err := NewSpec(tc.rate, tc.burst)
		switch {
		case !tc.ok && (err == nil || !errors.Is(err, ErrInvalidSpec)):
			t.Errorf("%s: NewSpec(%v, %d) = %v, %v; want ErrInvalidSpec", tc.name, float64(tc.rate), tc.burst, s, err)
		case !tc.ok && !strings.Contains(err.Error(), specBoundReasons[tc.name]):
			t.Errorf("%s: NewSpec(%v, %d): %v; want the reason %q", tc.name, float64(tc.rate), tc.burst, err, specBoundReasons[tc.name])
		case tc.ok && err != nil:
			t.Errorf("%s: NewSpec(%v, %d): %v; want a Spec", tc.name, float64(tc.rate), tc.burst, err)
		case tc.ok && (s.Interval() != tc.interval || s.TTL() != tc.ttl || s.Burst() != tc.burst):
			t.Errorf("%s: NewSpec(%v, %d) = interval %v TTL %v burst %d; want %v, %v, %d",
				tc.name, float64(tc.rate), tc.burst, s.Interval(), s.TTL(), s.Burst(), tc.interval, tc.ttl, tc.burst)
		case tc.ok && s.TTL() < time.Duration(tc.burst)*s.Interval():
			t.Errorf("%s: TTL %v shorter than the refill time %v", tc.name, s.TTL(), time.Duration(tc.burst)*s.Interval())
		}
	}
}
