package mgmt

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/nats-io/nats.go"
)

// TestMain stops the shared test servers after the last test.
func TestMain(m *testing.M) { testenv.Main(m) }

// subjects is a subject prefix of the test's own.
func subjects() string { return fmt.Sprintf("mgmt-test.%x", rand.Uint64()) }

type replica struct {
	name  string
	pause *pause.Pause
	nc    *nats.Conn
	srv   *Server
	drop  atomic.Bool
}

// startReplica starts a replica's pause snapshot and management server on
// one NATS connection of its own, as a worker does (its pause events on the
// subject of prefix's replicas; lost when dropEvents is set).
func startReplica(t *testing.T, srv *testenv.Server, prefix, name string, cfg Config, reconcile time.Duration, dropEvents bool) *replica {
	t.Helper()
	r := &replica{name: name, nc: testenv.NATSConn(t)}
	r.drop.Store(dropEvents)
	events := pause.LossyEvents{Events: &pause.NATSEvents{Conn: r.nc, Subject: testenv.PauseSubject(prefix)}, Drop: &r.drop}
	r.pause = pause.New(testenv.Client(t, srv.Addr), pause.Config{Prefix: prefix, ReconcileEvery: reconcile, MaxAge: time.Hour, Events: events})
	t.Cleanup(r.pause.Close)
	if err := r.pause.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.srv, err = Serve(r.nc, cfg, name, r.pause); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.srv.Stop)
	return r
}

// TestSetPausedQueueGrouped: each set_paused request is executed by exactly
// one of the two replicas (10 requests: the version is exactly 10, the
// replicas' counters add up to 10, and the replies name who executed each,
// matching the counters), and every replica applies every change (both
// snapshots reach version 10, resumed).
func TestSetPausedQueueGrouped(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	cfg := Config{Prefix: subjects()}
	a := startReplica(t, srv, prefix, "A", cfg, time.Hour, false)
	b := startReplica(t, srv, prefix, "B", cfg, time.Hour, false)
	operator := testenv.NATSConn(t)
	by := map[string]int64{}
	for i := range 10 {
		r, err := SetPaused(testenv.Ctx(t), operator, cfg, i%2 == 0, int64(i))
		if err != nil {
			t.Fatal(err)
		}
		if r.Version != int64(i+1) {
			t.Errorf("request %d: version %d, want %d (each request executed once)", i, r.Version, i+1)
		}
		by[r.Replica]++
	}
	sa, sb := a.srv.Stats(), b.srv.Stats()
	if sa.SetPaused+sb.SetPaused != 10 || sa.SetPaused != by["A"] || sb.SetPaused != by["B"] || sa.SetPausedFailed+sb.SetPausedFailed != 0 {
		t.Errorf("executed: A %+v, B %+v; replies named A %d, B %d times; want 10 executions in all, as the replies say, none failed",
			sa, sb, by["A"], by["B"])
	}
	for _, r := range []*replica{a, b} {
		if !testenv.WaitFor(func() bool { s, _ := r.pause.Snapshot(); return s.Version == 10 && !s.Paused }) {
			s, _ := r.pause.Snapshot()
			t.Errorf("replica %s: snapshot %+v, want resumed at version 10", r.name, s)
		}
	}
	if _, err := SetPaused(testenv.Ctx(t), operator, cfg, true, 10); err != nil {
		t.Fatal(err)
	}
	if s, err := SystemStatus(testenv.Ctx(t), operator, cfg); err != nil || !s.Paused || s.Version != 11 {
		t.Errorf("status %+v, %v; want paused at version 11", s, err)
	}
	if n := a.srv.Stats().Status + b.srv.Stats().Status; n != 1 {
		t.Errorf("status answered %d times, want 1", n)
	}
}

// oneReplica starts replica A on subjects of the test's own, its pause
// reconciling every reconcile.
func oneReplica(t *testing.T, reconcile time.Duration) (*replica, Config) {
	cfg := Config{Prefix: subjects()}
	return startReplica(t, testenv.Shared(t), testenv.Prefix(t), "A", cfg, reconcile, false), cfg
}

// TestSetPausedMalformed: a request that is not "1:N", "0:N" or "1:N:D"
// (N a version, D a duration in ms) is refused by the one replica that takes it, and changes
// nothing.
func TestSetPausedMalformed(t *testing.T) {
	a, cfg := oneReplica(t, time.Hour)
	bad := []string{"yes", "1", "0:", "1:-1", "2:0", "1:x", ":0", "0:0:1000", "1:0:0", "1:0:-5", "1:0:x", "1:0:"}
	for _, data := range bad {
		m, err := testenv.NATSConn(t).RequestWithContext(testenv.Ctx(t), cfg.Prefix+".set_paused", []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		want := `{"replica":"A","version":0,"error":"set_paused wants \"1:N\" (pause) or \"0:N\" (resume), N the version the edit was made against, or \"1:N:D\" (pause for D ms, D at least 1), got ` +
			strconv.Quote(strconv.Quote(data))[1:len(strconv.Quote(strconv.Quote(data)))-1] + `"}`
		if string(m.Data) != want {
			t.Errorf("reply %s, want %s", m.Data, want)
		}
	}
	if st := a.srv.Stats(); st.SetPaused != int64(len(bad)) || st.SetPausedFailed != int64(len(bad)) {
		t.Errorf("stats %+v, want %d requests, all failed", st, len(bad))
	}
	if s, _ := a.pause.Snapshot(); s.Version != 0 {
		t.Errorf("snapshot %+v, want version 0: nothing changed", s)
	}
}

// TestStatusIsStrong: a replica whose snapshot is stale (its events are
// lost and it never reconciles) answers status with what Valkey holds,
// and reports its stale snapshot beside it.
func TestStatusIsStrong(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	writer := startReplica(t, srv, prefix, "writer", Config{Prefix: subjects()}, time.Hour, false)
	cfg := Config{Prefix: subjects()}
	stale := startReplica(t, srv, prefix, "stale", cfg, time.Hour, true)
	if _, err := writer.pause.SetPaused(testenv.Ctx(t), true, 0); err != nil {
		t.Fatal(err)
	}
	s, err := SystemStatus(testenv.Ctx(t), stale.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Replica != "stale" || !s.Paused || s.Version != 1 || s.Snapshot.Paused || s.Snapshot.Version != 0 {
		t.Errorf("status %+v; want the stale replica answering paused at version 1 from Valkey, its snapshot still resumed at 0", s)
	}
}

// TestSetPausedConflict: two operators read status (version 0); the
// first's pause is executed; the second's resume, made against version 0,
// is refused with pause.ErrVersionConflict naming both versions, and
// nothing changes: the fleet stays paused at version 1.
func TestSetPausedConflict(t *testing.T) {
	a, cfg := oneReplica(t, time.Hour)
	operator := testenv.NATSConn(t)
	s, err := SystemStatus(testenv.Ctx(t), operator, cfg)
	if err != nil || s.Version != 0 {
		t.Fatalf("status %+v, %v; want version 0", s, err)
	}
	if r, err := SetPaused(testenv.Ctx(t), operator, cfg, true, s.Version); err != nil || r.Version != 1 {
		t.Fatalf("first operator: %+v, %v; want version 1", r, err)
	}
	r, err := SetPaused(testenv.Ctx(t), operator, cfg, false, s.Version)
	if !errors.Is(err, pause.ErrVersionConflict) || !r.Conflict || !strings.Contains(err.Error(), "made against version 0, Valkey holds version 1 (paused)") {
		t.Fatalf("second operator: %+v, %v; want ErrVersionConflict naming versions 0 and 1", r, err)
	}
	if paused, v, err := a.pause.Stored(testenv.Ctx(t)); err != nil || !paused || v != 1 {
		t.Errorf("stored: paused %v at version %d, %v; want paused at version 1", paused, v, err)
	}
}

// TestPauseForThroughMgmt: a timed pause requested through mgmt ends on
// its own; status shows its end, from Valkey and from the snapshot.
func TestPauseForThroughMgmt(t *testing.T) {
	a, cfg := oneReplica(t, 20*time.Millisecond)
	operator := testenv.NATSConn(t)
	before := time.Now()
	if r, err := PauseFor(testenv.Ctx(t), operator, cfg, time.Hour, 0); err != nil || r.Version != 1 {
		t.Fatalf("PauseFor: %+v, %v; want version 1", r, err)
	}
	s, err := SystemStatus(testenv.Ctx(t), operator, cfg)
	if err != nil || !s.Paused || s.Version != 1 || s.Until.Before(before.Add(59*time.Minute)) || !s.Snapshot.Until.Equal(s.Until) {
		t.Fatalf("status %+v, %v; want paused at version 1 until an hour from now, in Valkey and in the snapshot", s, err)
	}
	if a.pause.Check() != pause.ErrPaused {
		t.Errorf("replica: %v, want paused", a.pause.Check())
	}
	if r, err := PauseFor(testenv.Ctx(t), operator, cfg, 100*time.Millisecond, 1); err != nil || r.Version != 2 {
		t.Fatalf("PauseFor(100ms): %+v, %v; want version 2", r, err)
	}
	if !testenv.WaitFor(func() bool { return a.pause.Check() == nil }) {
		t.Fatalf("the 100 ms pause never ended: %v", a.pause.Check())
	}
	// Valkey's expiry and the replica's clock may be a few ms apart.
	var s2 Status
	if !testenv.WaitFor(func() bool { s2, err = SystemStatus(testenv.Ctx(t), operator, cfg); return err == nil && !s2.Paused }) ||
		s2.Version != 2 || !s2.Until.IsZero() {
		t.Errorf("status after the end %+v, %v; want running at version 2, no end", s2, err)
	}
}
