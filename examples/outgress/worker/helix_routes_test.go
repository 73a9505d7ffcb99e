package worker

import (
	"errors"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/limits"
	"testing"
	"time"

	"github.com/admitkit/admit"
)

// TestHelixRoutesShareOneHelper: the three Helix routes are charged through
// the same per-lane plan, so spending the standard share through one route
// denies the others, while premium (the general budget alone) and system
// (its own share) still pass.
func TestHelixRoutesShareOneHelper(t *testing.T) {
	l := limits.DefaultLimits
	l.HelixStandard = admit.MustSpec(admit.Every(time.Hour), 2)
	l.HelixSystem = admit.MustSpec(admit.Every(time.Hour), 1)
	e := newEnv(t, nil, withLimits(l), withDelayUntilToken())
	e.seed(t, "1", true)
	e.seed(t, "2", false)
	api := `{"kind":"api","method":"GET","path":"/helix/users?id=1"}`
	announce := `{"kind":"announce","channel":"1","text":"hi","color":"blue"}`
	shoutout := `{"kind":"shoutout","channel":"1","to":"2"}`

	for _, kind := range []command.Kind{command.KindAPI, command.KindAnnounce, command.KindShoutout} {
		for _, lane := range []limits.Lane{limits.LaneStandard, limits.LanePremium, limits.LaneSystem} {
			if got, want := e.worker.plan(lane, kind, nil), &e.worker.helixBy[lane]; got != want {
				t.Errorf("%v on %v: a plan of its own, want the lane's shared Helix plan", kind, lane)
			}
		}
	}

	steps := []struct {
		lane    limits.Lane
		body    string
		allowed bool
		denied  limits.BucketClass
	}{
		{limits.LaneStandard, api, true, 0},
		{limits.LaneStandard, announce, true, 0},
		{limits.LaneStandard, shoutout, false, limits.ClassStandard}, // the share (2) is spent
		{limits.LaneStandard, api, false, limits.ClassStandard},
		{limits.LaneStandard, announce, false, limits.ClassStandard},
		{limits.LanePremium, shoutout, true, 0}, // the general budget alone
		{limits.LaneSystem, announce, true, 0},
		{limits.LaneSystem, api, false, limits.ClassSystem},
		{limits.LaneSystem, shoutout, false, limits.ClassSystem},
	}
	var denied [limits.NumLanes][limits.NumClasses]int64
	for i, s := range steps {
		path, err := e.process(t, s.lane, s.body)
		// The shares refill hourly: a denial's delay outlives the message,
		// so it is dropped rather than nacked.
		var drop *bus.Dropped
		switch {
		case s.allowed && (err != nil || !path.Admitted):
			t.Errorf("step %d (%v %s): %+v, %v; want admitted and sent", i, s.lane, s.body, path, err)
		case !s.allowed && (!errors.As(err, &drop) || drop.Reason != bus.DropNoTimeLimited || !path.Decided || path.Admitted):
			t.Errorf("step %d (%v %s): %+v, %v; want denied", i, s.lane, s.body, path, err)
		}
		if !s.allowed {
			denied[s.lane][s.denied]++
		}
	}
	for lane := range limits.NumLanes {
		for class := range limits.NumClasses {
			if got := e.metrics.Denied(lane, class); got != denied[lane][class] {
				t.Errorf("%v lane denied by %v: %d, want %d", lane, class, got, denied[lane][class])
			}
		}
	}
}
