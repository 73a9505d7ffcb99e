package defaults

import (
	"testing"
	"time"
)

func TestPositive(t *testing.T) {
	for _, c := range []struct{ v, want time.Duration }{
		{0, time.Second}, {-1, time.Second}, {1, 1}, {time.Hour, time.Hour},
	} {
		if got := Positive(c.v, time.Second); got != c.want {
			t.Errorf("Positive(%v, 1s) = %v, want %v", c.v, got, c.want)
		}
	}
	if got := Positive(0, 3); got != 3 {
		t.Errorf("Positive(0, 3) = %d, want 3", got)
	}
}

func TestClock(t *testing.T) {
	fixed := time.Unix(42, 0)
	if got := Clock(func() time.Time { return fixed })(); !got.Equal(fixed) {
		t.Errorf("Clock(fixed)() = %v, want %v", got, fixed)
	}
	if got := Clock(nil)(); time.Since(got) > time.Minute || time.Since(got) < 0 {
		t.Errorf("Clock(nil)() = %v, want about now", got)
	}
}
