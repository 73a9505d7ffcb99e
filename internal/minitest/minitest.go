// Package minitest starts the in-process miniredis that admit's unit tests
// run on: one setup for every unit test, so that they all see the same
// server, the same clock and the same client.
package minitest

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/valkey-io/valkey-go"
)

// Epoch is the server clock at the start of every test: years away from
// the host clock, so that a test that used the host clock fails loudly.
var Epoch = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// Start starts a miniredis whose clock stands at Epoch and moves only when
// the test moves it (SetTime), with TTLs counting down as it moves, and
// returns it with a client to it; both close when the test ends.
func Start(tb testing.TB) (*miniredis.Miniredis, valkey.Client) {
	tb.Helper()
	srv := miniredis.RunT(tb)
	srv.SetTime(Epoch)
	srv.ClockTTL(true)
	return srv, Client(tb, srv.Addr())
}

// Client is a client to the miniredis at addr, closed when the test ends.
// miniredis answers CLUSTER SLOTS, so without ForceSingleClient valkey-go
// would build a cluster client for it.
func Client(tb testing.TB, addr string) valkey.Client {
	tb.Helper()
	c, err := valkey.NewClient(Option(addr))
	if err != nil {
		tb.Fatalf("dial miniredis: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Option is the client option Client dials addr with.
func Option(addr string) valkey.ClientOption {
	return valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true}
}

// Run gives srv a clock that starts at Epoch and runs at the host's rate,
// set before each command a client sends: every command, a script with its
// TIME included, sees one instant, as on a real server, and TTLs count
// down with it. Left alone, miniredis reads the host's clock anew at each
// step of a command, so the PEXPIRETIME of an untouched key would drift by
// a millisecond now and then.
func Run(srv *miniredis.Miniredis) {
	start := time.Now()
	var (
		mu      sync.Mutex // guards clients
		clients = map[*server.Peer]bool{}
		setting sync.Mutex // keeps the clock monotonic
	)
	srv.SetTime(Epoch)
	srv.ClockTTL(true)
	srv.Server().SetPreHook(func(c *server.Peer, _ string, _ ...string) bool {
		// A client's connection has no context before its first command; a
		// command that a script calls has one, and runs while the script
		// holds the server's lock, which SetTime takes.
		mu.Lock()
		if c.Ctx == nil {
			clients[c] = true
		}
		client := clients[c]
		mu.Unlock()
		if client {
			setting.Lock()
			srv.SetTime(Epoch.Add(time.Since(start)))
			setting.Unlock()
		}
		return false
	})
}

// Clock is a clock a test moves by hand, in µs since the epoch, safe to
// read while the test moves it (a Local's or a Degraded's clock function,
// say: WithLocalClock(clock.Time)).
type Clock struct{ now atomic.Int64 }

// NewClock returns a Clock that reads 2026-12-01 12:00 UTC.
func NewClock() *Clock {
	c := &Clock{}
	c.now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMicro())
	return c
}

// Time is the clock's time.
func (c *Clock) Time() time.Time { return time.UnixMicro(c.now.Load()) }

// Advance moves the clock by d (back, when d is negative).
func (c *Clock) Advance(d time.Duration) { c.now.Add(d.Microseconds()) }
