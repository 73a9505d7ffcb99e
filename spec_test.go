package admit

import (
	"errors"
	"math"
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
