package limits

import (
	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/channels"
	"strings"
	"testing"
	"time"
)

// TestChatPlans: standard checks its share then the channel's limit, with
// both keys under one hash tag; premium the limit alone; the moderator flag
// changes the Specs, not the keys.
func TestChatPlans(t *testing.T) {
	std, shared := channels.ChatKeys("p:", "42")
	for _, c := range []struct {
		lane          Lane
		mod           bool
		first, second admit.Spec
		two           bool
	}{
		{LaneStandard, false, DefaultLimits.ChatStandard, DefaultLimits.ChatShared, true},
		{LaneStandard, true, DefaultLimits.ChatModStandard, DefaultLimits.ChatModShared, true},
		{LanePremium, false, DefaultLimits.ChatShared, admit.Spec{}, false},
		{LanePremium, true, DefaultLimits.ChatModShared, admit.Spec{}, false},
	} {
		ch := &channels.Channel{ID: "42", BotIsMod: c.mod, StandardKey: std, SharedKey: shared}
		p := ChatPlan(&DefaultLimits, c.lane, ch)
		wantFirst := std
		if !c.two {
			wantFirst = shared
		}
		if p.First.Key != wantFirst || p.First.Spec != c.first || p.HasSecond != c.two {
			t.Errorf("%v mod=%v: first %q %v, second %v; want %q %v, %v", c.lane, c.mod, p.First.Key, p.First.Spec, p.HasSecond, wantFirst, c.first, c.two)
		}
		if c.two && (p.Second.Key != shared || p.Second.Spec != c.second) {
			t.Errorf("%v mod=%v: second %q %v, want %q %v", c.lane, c.mod, p.Second.Key, p.Second.Spec, shared, c.second)
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
		{"chat shared", DefaultLimits.ChatShared, 30 * time.Second, 20, 20},
		{"chat standard", DefaultLimits.ChatStandard, 30 * time.Second, 10, 10},
		{"chat mod shared", DefaultLimits.ChatModShared, 30 * time.Second, 100, 100},
		{"chat mod standard", DefaultLimits.ChatModStandard, 30 * time.Second, 75, 75},
		{"helix general", DefaultLimits.HelixGeneral, time.Minute, 800, 800},
		{"helix standard", DefaultLimits.HelixStandard, time.Minute, 480, 480},
		{"helix system", DefaultLimits.HelixSystem, time.Minute, 160, 160},
	} {
		if got := per(c.spec, c.win); got != c.rate || c.spec.Burst() != c.burst {
			t.Errorf("%s: %v per %v, burst %d; want %v, %d", c.name, got, c.win, c.spec.Burst(), c.rate, c.burst)
		}
	}
}
