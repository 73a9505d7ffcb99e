package mgmt

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/nats-io/nats.go"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopShared()
	testenv.StopNATS()
	os.Exit(code)
}

// subjects is a subject prefix of the test's own.
func subjects() string { return fmt.Sprintf("mgmt-test.%x", rand.Uint64()) }

type replica struct {
	name  string
	pause *pause.Pause
	nc    *nats.Conn
	drop  atomic.Bool
}

func startReplica(t *testing.T, srv *testserver.Server, prefix, name string, cfg Config, reconcile time.Duration, dropEvents bool) *replica {
	t.Helper()
	r := &replica{name: name}
	c := &counting.Client{Client: testserver.NewClient(t, srv), DropMessages: &r.drop}
	r.drop.Store(dropEvents)
	r.pause = pause.New(c, pause.Config{Prefix: prefix, ReconcileEvery: reconcile, MaxAge: time.Hour})
	t.Cleanup(r.pause.Close)
	if err := r.pause.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r.nc = nc
	stop, err := Serve(nc, cfg, name, r.pause)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return r
}

// TestSetPausedQueueGrouped: each set_paused request is executed by exactly
// one of the two replicas (10 requests: the version is exactly 10, and
// the replies name who executed each), and every replica applies every
// change (both snapshots reach version 10, resumed).
func TestSetPausedQueueGrouped(t *testing.T) {
	srv := testserver.Shared(t)
	raw := testserver.NewClient(t, srv)
	prefix := testserver.Prefix(t, raw)
	cfg := Config{Prefix: subjects()}
	a := startReplica(t, srv, prefix, "A", cfg, time.Hour, false)
	b := startReplica(t, srv, prefix, "B", cfg, time.Hour, false)
	by := map[string]int{}
	for i := range 10 {
		r, err := SetPaused(testenv.Ctx(t), a.nc, cfg, i%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.Version != int64(i+1) {
			t.Errorf("request %d: version %d, want %d (each request executed once)", i, r.Version, i+1)
		}
		by[r.Replica]++
	}
	if by["A"]+by["B"] != 10 {
		t.Errorf("executions by replica %v, want 10 in all", by)
	}
	for _, r := range []*replica{a, b} {
		if !testenv.WaitFor(func() bool { s, _ := r.pause.Snapshot(); return s.Version == 10 && !s.Paused }) {
			s, _ := r.pause.Snapshot()
			t.Errorf("replica %s: snapshot %+v, want resumed at version 10", r.name, s)
		}
	}
	if _, err := SetPaused(testenv.Ctx(t), a.nc, cfg, true); err != nil {
		t.Fatal(err)
	}
	if s, err := SystemStatus(testenv.Ctx(t), a.nc, cfg); err != nil || !s.Paused || s.Version != 11 {
		t.Errorf("status %+v, %v; want paused at version 11", s, err)
	}
}

// TestStatusIsStrong: a replica whose snapshot is stale (its events are
// lost and it never reconciles) answers status with what Valkey holds,
// and reports its stale snapshot beside it.
func TestStatusIsStrong(t *testing.T) {
	srv := testserver.Shared(t)
	raw := testserver.NewClient(t, srv)
	prefix := testserver.Prefix(t, raw)
	writer := startReplica(t, srv, prefix, "writer", Config{Prefix: subjects()}, time.Hour, false)
	cfg := Config{Prefix: subjects()}
	stale := startReplica(t, srv, prefix, "stale", cfg, time.Hour, true)
	if _, err := writer.pause.SetPaused(testenv.Ctx(t), true); err != nil {
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
