package worker

import (
	"sync"

	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/limits"
)

// Row groups messages by the way they went, for the demo's table of Valkey
// commands per message.
type Row uint8

const (
	RowStdWarm Row = iota // the plan's four rows first
	RowStdCold
	RowPremWarm
	RowPremCold
	RowHelixAPI
	RowHelixWarm
	RowHelixCold
	RowJoined
	RowPaused
	RowOther
	NumRows
)

// RowNames describe the rows.
var RowNames = [NumRows]string{
	"standard chat, warm channel cache",
	"standard chat, cold channel cache",
	"premium chat, warm channel cache",
	"premium chat, cold channel cache",
	"Helix API call (no channel)",
	"Helix announce/shoutout, warm cache",
	"Helix announce/shoutout, cold cache",
	"any, cold cache, joined another's load",
	"stopped by the pause (any lane)",
	"dropped before the limiter",
}

// PlanBefore and PlanTarget are the plan's table, for the four chat rows.
var (
	PlanBefore = [NumRows]int{3, 4, 2, 3}
	PlanTarget = [NumRows]int{1, 2, 1, 2}
)

// RowOf is the row of a message that took path p.
func RowOf(p Path) Row {
	switch {
	case !p.Decoded:
		return RowOther
	case p.Paused:
		return RowPaused
	case !p.Decided:
		return RowOther
	case p.Cache == channels.CacheJoined:
		return RowJoined
	case p.Kind == command.KindAPI:
		return RowHelixAPI
	case p.Kind != command.KindChat:
		if p.Cache == channels.CacheHit {
			return RowHelixWarm
		}
		return RowHelixCold
	case p.Lane == limits.LanePremium && p.Cache == channels.CacheHit:
		return RowPremWarm
	case p.Lane == limits.LanePremium:
		return RowPremCold
	case p.Cache == channels.CacheHit:
		return RowStdWarm
	}
	return RowStdCold
}

// RowStats are a row's messages and their Valkey commands: in total, in
// round trips, and the fewest and most of one message.
type RowStats struct {
	N, Commands, RoundTrips, Min, Max int64
}

// PathTable accumulates Valkey commands per message by path.
type PathTable struct {
	mu   sync.Mutex
	rows [NumRows]RowStats
}

// NewPathTable returns an empty table.
func NewPathTable() *PathTable { return &PathTable{} }

// Add counts one message that took path p with its commands.
func (t *PathTable) Add(p Path, commands, roundTrips int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &t.rows[RowOf(p)]
	if r.N == 0 || commands < r.Min {
		r.Min = commands
	}
	if r.N == 0 || commands > r.Max {
		r.Max = commands
	}
	r.N++
	r.Commands += commands
	r.RoundTrips += roundTrips
}

// Row returns row r's counts.
func (t *PathTable) Row(r Row) RowStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rows[r]
}
