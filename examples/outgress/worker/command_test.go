package worker

import (
	"errors"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/limits"
	"testing"
)

// TestMalformedDroppedWithoutValkey: a body that can never be valid is
// dropped before any Valkey command; so is chat on the system lane.
func TestMalformedDroppedWithoutValkey(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct {
		lane limits.Lane
		body string
	}{
		{limits.LaneStandard, `{"kind":"chat","channel":"4}2","text":"hi"}`},
		{limits.LaneSystem, chat("42")},
	} {
		before, _ := e.c.Totals()
		_, err := e.process(t, c.lane, c.body)
		after, _ := e.c.Totals()
		var drop *bus.Dropped
		if !errors.As(err, &drop) || drop.Reason != bus.DropMalformed || after != before {
			t.Errorf("%v %s: %v after %d commands; want dropped as malformed after 0", c.lane, c.body, err, after-before)
		}
	}
}
