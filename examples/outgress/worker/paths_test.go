package worker

import (
	"testing"

	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/limits"
)

// TestRowOf: each way through the worker lands in its own row of the
// demo's commands table, and a row keeps its messages' fewest and most.
func TestRowOf(t *testing.T) {
	chat := Path{Decoded: true, Kind: command.KindChat, Decided: true}
	with := func(p Path, f func(*Path)) Path { f(&p); return p }
	for _, c := range []struct {
		p    Path
		want Row
	}{
		{chat, RowStdCold}, // Cache zero: not a hit
		{with(chat, func(p *Path) { p.Cache = channels.CacheHit }), RowStdWarm},
		{with(chat, func(p *Path) { p.Lane, p.Cache = limits.LanePremium, channels.CacheHit }), RowPremWarm},
		{with(chat, func(p *Path) { p.Lane, p.Cache = limits.LanePremium, channels.CacheMiss }), RowPremCold},
		{with(chat, func(p *Path) { p.Cache = channels.CacheJoined }), RowJoined},
		{with(chat, func(p *Path) { p.Kind = command.KindAPI }), RowHelixAPI},
		{with(chat, func(p *Path) { p.Kind, p.Cache = command.KindShoutout, channels.CacheHit }), RowHelixWarm},
		{with(chat, func(p *Path) { p.Kind, p.Cache = command.KindAnnounce, channels.CacheMiss }), RowHelixCold},
		{with(chat, func(p *Path) { p.Paused, p.Decided = true, false }), RowPaused},
		{with(chat, func(p *Path) { p.Decided = false }), RowOther},
		{Path{}, RowOther},
	} {
		if got := RowOf(c.p); got != c.want {
			t.Errorf("%+v: %s, want %s", c.p, RowNames[got], RowNames[c.want])
		}
	}
	tab := NewPathTable()
	for _, n := range []int64{2, 1, 3} {
		tab.Add(chat, n, n)
	}
	if s := tab.Row(RowStdCold); s.N != 3 || s.Commands != 6 || s.Min != 1 || s.Max != 3 {
		t.Errorf("row %+v, want 3 messages, 6 commands, 1-3", s)
	}
}
