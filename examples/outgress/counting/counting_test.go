package counting

import (
	"context"
	"errors"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// newClient is a Client on an in-process miniredis: counting is the
// client's business, not the server's.
func newClient(t *testing.T) (*Client, *miniredis.Miniredis) {
	t.Helper()
	srv := miniredis.RunT(t)
	raw, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)
	return &Client{Client: raw}, srv
}

// TestCounts: Do is one command in one round trip, DoMulti n commands in
// one, and a context's Tally gets its own calls only.
func TestCounts(t *testing.T) {
	c, _ := newClient(t)
	ctx := context.Background()
	var tally Tally
	tctx := WithTally(ctx, &tally)
	c.Do(tctx, c.B().Set().Key("k").Value("v").Build())
	c.DoMulti(tctx, c.B().Get().Key("k").Build(), c.B().Get().Key("k").Build(), c.B().Get().Key("k").Build())
	c.Do(ctx, c.B().Get().Key("k").Build()) // not in the tally
	if cmds, rts := c.Totals(); cmds != 5 || rts != 3 {
		t.Errorf("totals %d commands, %d round trips; want 5 and 3", cmds, rts)
	}
	if cmds, rts := tally.Commands.Load(), tally.RoundTrips.Load(); cmds != 4 || rts != 2 {
		t.Errorf("tally %d commands, %d round trips; want 4 and 2", cmds, rts)
	}
}

// TestFaultSendsNothing: a command the Fault hook fails returns its error
// and reaches neither the server nor the counts.
func TestFaultSendsNothing(t *testing.T) {
	c, srv := newClient(t)
	boom := errors.New("injected")
	var gated int
	c.Gate = func(valkey.Completed) { gated++ }
	c.Fault = func(cmd valkey.Completed) error {
		if cmd.Commands()[0] == "SET" {
			return boom
		}
		return nil
	}
	before := srv.CommandCount()
	if err := c.Do(context.Background(), c.B().Set().Key("k").Value("v").Build()).Error(); !errors.Is(err, boom) {
		t.Errorf("Do: %v, want the injected error", err)
	}
	if srv.CommandCount() != before || srv.Exists("k") {
		t.Error("the failed command reached the server")
	}
	if cmds, _ := c.Totals(); cmds != 0 || gated != 1 {
		t.Errorf("%d commands counted, gate ran %d times; want 0 and 1", cmds, gated)
	}
}

// TestLoseRunsThenFails: a command the Lose hook fails reaches the server
// and runs; the caller gets the injected error instead of its reply.
func TestLoseRunsThenFails(t *testing.T) {
	c, srv := newClient(t)
	boom := errors.New("reply lost")
	c.Lose = func(cmd valkey.Completed) error {
		if cmd.Commands()[0] == "SET" {
			return boom
		}
		return nil
	}
	if err := c.Do(context.Background(), c.B().Set().Key("k").Value("v").Build()).Error(); !errors.Is(err, boom) {
		t.Errorf("Do: %v, want the injected error", err)
	}
	if v, err := srv.Get("k"); err != nil || v != "v" {
		t.Errorf("k = %q, %v: want the SET run on the server", v, err)
	}
	if v, err := c.Do(context.Background(), c.B().Get().Key("k").Build()).ToString(); err != nil || v != "v" {
		t.Errorf("GET: %q, %v; want the reply (Lose returned nil)", v, err)
	}
	if cmds, _ := c.Totals(); cmds != 2 {
		t.Errorf("%d commands counted, want 2 (both were sent)", cmds)
	}
}
