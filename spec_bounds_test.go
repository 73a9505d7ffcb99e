package admit

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
