package main

import (
	"errors"
	"github.com/admitkit/admit/examples/outgress/bus"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
)

// TestHelixRoutesShareOneHelper: the three Helix routes are charged through
// the same per-lane plan, so spending the standard share through one route
// denies the others, while premium (the general budget alone) and system
// (its own share) still pass.
func TestHelixRoutesShareOneHelper(t *testing.T) {
	limits := DefaultLimits
	limits.HelixStandard = admit.MustSpec(admit.Every(time.Hour), 2)
	limits.HelixSystem = admit.MustSpec(admit.Every(time.Hour), 1)
	e := newEnv(t, nil, withLimits(limits))
	e.seed(t, "1", true)
	e.seed(t, "2", false)
	api := `{"kind":"api","method":"GET","path":"/helix/users?id=1"}`
	announce := `{"kind":"announce","channel":"1","text":"hi","color":"blue"}`
	shoutout := `{"kind":"shoutout","channel":"1","to":"2"}`

	for _, kind := range []Kind{KindAPI, KindAnnounce, KindShoutout} {
		for _, lane := range []Lane{LaneStandard, LanePremium, LaneSystem} {
			if got, want := e.worker.plan(lane, kind, nil), &e.worker.helixBy[lane]; got != want {
				t.Errorf("%v on %v: a plan of its own, want the lane's shared Helix plan", kind, lane)
			}
		}
	}

	steps := []struct {
		lane    Lane
		body    string
		allowed bool
		denied  BucketClass
	}{
		{LaneStandard, api, true, 0},
		{LaneStandard, announce, true, 0},
		{LaneStandard, shoutout, false, ClassStandard}, // the share (2) is spent
		{LaneStandard, api, false, ClassStandard},
		{LaneStandard, announce, false, ClassStandard},
		{LanePremium, shoutout, true, 0}, // the general budget alone
		{LaneSystem, announce, true, 0},
		{LaneSystem, api, false, ClassSystem},
		{LaneSystem, shoutout, false, ClassSystem},
	}
	var denied [numLanes][numClasses]int64
	for i, s := range steps {
		path, err := e.process(t, s.lane, s.body)
		// The shares refill hourly: a denial's delay outlives the message,
		// so it is dropped rather than nacked.
		var drop *bus.Dropped
		switch {
		case s.allowed && (err != nil || !path.Admitted):
			t.Errorf("step %d (%v %s): %+v, %v; want admitted and sent", i, s.lane, s.body, path, err)
		case !s.allowed && (!errors.As(err, &drop) || drop.Reason != bus.DropNoTimeToRetry || !path.Decided || path.Admitted):
			t.Errorf("step %d (%v %s): %+v, %v; want denied", i, s.lane, s.body, path, err)
		}
		if !s.allowed {
			denied[s.lane][s.denied]++
		}
	}
	for lane := range numLanes {
		for class := range numClasses {
			if got := e.metrics.Denied(lane, class); got != denied[lane][class] {
				t.Errorf("%v lane denied by %v: %d, want %d", lane, class, got, denied[lane][class])
			}
		}
	}
}

// TestChatPlans: standard checks its share then the channel's limit, with
// both keys under one hash tag; premium the limit alone; the moderator flag
// changes the Specs, not the keys.
func TestChatPlans(t *testing.T) {
	std, shared := chatKeys("p:", "42")
	for _, c := range []struct {
		lane          Lane
		mod           bool
		first, second admit.Spec
		two           bool
	}{
		{LaneStandard, false, chatStandard, chatShared, true},
		{LaneStandard, true, chatModStandard, chatModShared, true},
		{LanePremium, false, chatShared, admit.Spec{}, false},
		{LanePremium, true, chatModShared, admit.Spec{}, false},
	} {
		ch := &Channel{ID: "42", BotIsMod: c.mod, standardKey: std, sharedKey: shared}
		p := chatPlan(&DefaultLimits, c.lane, ch)
		wantFirst := std
		if !c.two {
			wantFirst = shared
		}
		if p.first.Key != wantFirst || p.first.Spec != c.first || p.hasSecond != c.two {
			t.Errorf("%v mod=%v: first %q %v, second %v; want %q %v, %v", c.lane, c.mod, p.first.Key, p.first.Spec, p.hasSecond, wantFirst, c.first, c.two)
		}
		if c.two && (p.second.Key != shared || p.second.Spec != c.second) {
			t.Errorf("%v mod=%v: second %q %v, want %q %v", c.lane, c.mod, p.second.Key, p.second.Spec, shared, c.second)
		}
	}
	for _, k := range []string{std, shared} {
		if !strings.Contains(k, "{chan:42}") || strings.Count(k, "{") != 1 {
			t.Errorf("key %q: want exactly the hash tag {chan:42}", k)
		}
	}
}

// TestLimitsShares freezes the documented limits and shares: a change to a
// third-party limit or a share must be deliberate.
func TestLimitsShares(t *testing.T) {
	per := func(s admit.Spec, window time.Duration) float64 { return float64(window) / float64(s.Interval()) }
	for _, c := range []struct {
		name  string
		spec  admit.Spec
		win   time.Duration
		rate  float64
		burst int
	}{
		{"chat shared", chatShared, 30 * time.Second, 20, 20},
		{"chat standard", chatStandard, 30 * time.Second, 10, 10},
		{"chat mod shared", chatModShared, 30 * time.Second, 100, 100},
		{"chat mod standard", chatModStandard, 30 * time.Second, 75, 75},
		{"helix general", helixGeneral, time.Minute, 800, 800},
		{"helix standard", helixStandard, time.Minute, 480, 480},
		{"helix system", helixSystem, time.Minute, 160, 160},
	} {
		if got := per(c.spec, c.win); got != c.rate || c.spec.Burst() != c.burst {
			t.Errorf("%s: %v per %v, burst %d; want %v, %d", c.name, got, c.win, c.spec.Burst(), c.rate, c.burst)
		}
	}
}
