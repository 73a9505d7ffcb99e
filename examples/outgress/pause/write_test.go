package pause

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/valkey-io/valkey-go"
)

// TestPauseWriteIsMultiExec counts, from the server's INFO commandstats
// on a server of its own, the commands of three edits (a pause, a timed
// pause, a resume): the plan's native transaction, WATCH of the version
// and its read, then MULTI, INCR, SET/DEL, EXEC, and no script.
func TestPauseWriteIsMultiExec(t *testing.T) {
	srv := testenv.Own(t)
	raw := testenv.Client(t, srv.Addr)
	prefix := testenv.Prefix(t)
	p, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	names := []string{"watch", "unwatch", "mget", "time", "multi", "incr", "set", "del", "exec", "get", "eval", "evalsha"}
	before := testenv.CommandStats(t, raw)
	if v, err := p.SetPaused(testenv.Ctx(t), true, 0); err != nil || v != 1 {
		t.Fatalf("SetPaused(true, 0): %d, %v", v, err)
	}
	if v, err := p.PauseFor(testenv.Ctx(t), time.Hour, 1); err != nil || v != 2 {
		t.Fatalf("PauseFor(1h, 1): %d, %v", v, err)
	}
	if v, err := p.SetPaused(testenv.Ctx(t), false, 2); err != nil || v != 3 {
		t.Fatalf("SetPaused(false, 2): %d, %v", v, err)
	}
	after := testenv.CommandStats(t, raw)
	got := map[string]int64{}
	for _, n := range names {
		got[n] = after[n].Calls - before[n].Calls
	}
	// Each edit: WATCH, MGET, MULTI, INCR, DEL of the end, SET of the
	// change's time, EXEC; the pause a SET of the flag, the timed pause
	// TIME and two SETs (flag and end), the resume a DEL of the flag.
	want := map[string]int64{"watch": 3, "unwatch": 0, "mget": 3, "time": 1, "multi": 3, "incr": 3, "set": 6, "del": 4, "exec": 3, "get": 0, "eval": 0, "evalsha": 0}
	for _, n := range names {
		if got[n] != want[n] {
			t.Errorf("commands of three edits: %v; want %v", got, want)
			break
		}
	}
}

// lateWriter is a client whose SetPaused transaction is preceded, after
// its WATCHed read and before its MULTI, by another writer's edit.
type lateWriter struct {
	valkey.Client
	late func()
}

func (c *lateWriter) Dedicated(fn func(valkey.DedicatedClient) error) error {
	return c.Client.Dedicated(func(d valkey.DedicatedClient) error { return fn(lateDedicated{d, c.late}) })
}

type lateDedicated struct {
	valkey.DedicatedClient
	late func()
}

func (d lateDedicated) DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
	if len(multi) > 0 && testenv.IsCommand(multi[0], "MULTI") && d.late != nil {
		d.late()
	}
	return d.DedicatedClient.DoMulti(ctx, multi...)
}

// TestPauseWatchStopsALateWrite: another writer pauses (version 0 to 1)
// after this edit read version 0 and before its EXEC. The WATCH aborts
// the transaction: the edit fails with ErrVersionConflict naming version
// 1, and Valkey keeps the other writer's state (version 1, paused), not
// this edit's resume at version 2.
func TestPauseWatchStopsALateWrite(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	c := &lateWriter{Client: testenv.Client(t, srv.Addr)}
	p := New(c, Config{Prefix: prefix, ReconcileEvery: time.Hour, NATS: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix)})
	t.Cleanup(p.Close)
	if err := p.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	other, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	c.late = func() {
		c.late = nil
		if v, err := other.SetPaused(testenv.Ctx(t), true, 0); err != nil || v != 1 {
			t.Errorf("the other writer's pause: %d, %v", v, err)
		}
	}
	v, err := p.SetPaused(testenv.Ctx(t), false, 0)
	if !errors.Is(err, ErrVersionConflict) || v != 0 || !strings.Contains(err.Error(), "made against version 0, Valkey holds version 1 (paused)") {
		t.Errorf("the edit overtaken between its read and its EXEC: version %d, %v; want ErrVersionConflict, Valkey holding version 1 (paused)", v, err)
	}
	if paused, version, err := p.Stored(testenv.Ctx(t)); err != nil || !paused || version != 1 {
		t.Errorf("stored: paused %v, version %d, %v; want the other writer's pause at version 1", paused, version, err)
	}
}

// TestPauseForRefusedPastMax: a timed pause up to MaxPauseFor is accepted;
// a millisecond more is refused with ErrPauseTooLong and writes nothing.
func TestPauseForRefusedPastMax(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	p, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	if v, err := p.PauseFor(testenv.Ctx(t), MaxPauseFor+time.Millisecond, 0); !errors.Is(err, ErrPauseTooLong) || v != 0 {
		t.Errorf("PauseFor(%v): %d, %v; want ErrPauseTooLong", MaxPauseFor+time.Millisecond, v, err)
	}
	if _, version, err := p.Stored(testenv.Ctx(t)); err != nil || version != 0 {
		t.Errorf("after the refused pause: version %d, %v; want 0, nothing written", version, err)
	}
	if v, err := p.PauseFor(testenv.Ctx(t), MaxPauseFor, 0); err != nil || v != 1 {
		t.Errorf("PauseFor(%v): %d, %v; want version 1", MaxPauseFor, v, err)
	}
}
