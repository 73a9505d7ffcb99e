package metrics

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/pause"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestPauseUntilGauge: outgress_pause_until_seconds is the end of the
// timed pause the replica acts on (Unix seconds), and 0 with no timed
// pause in force: an open pause, running, and past the end on the
// replica's own clock.
func TestPauseUntilGauge(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	var wall atomic.Int64
	wall.Store(time.Now().UnixNano())
	p := pause.New(testenv.Client(t, srv.Addr), pause.Config{Prefix: prefix, ReconcileEvery: time.Hour,
		NATS: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix), Now: func() time.Time { return time.Unix(0, wall.Load()) }})
	t.Cleanup(p.Close)
	if err := p.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	m := New()
	if err := m.RegisterPause("a", p); err != nil {
		t.Fatal(err)
	}
	gauge := func() float64 {
		t.Helper()
		mfs, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "outgress_pause_until_seconds" && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no outgress_pause_until_seconds series")
		return 0
	}
	if g := gauge(); g != 0 {
		t.Errorf("running: %v, want 0", g)
	}
	if _, err := p.SetPaused(testenv.Ctx(t), true, 0); err != nil {
		t.Fatal(err)
	}
	if g := gauge(); g != 0 {
		t.Errorf("an open pause: %v, want 0", g)
	}
	if _, err := p.PauseFor(testenv.Ctx(t), time.Hour, 1); err != nil {
		t.Fatal(err)
	}
	s, _ := p.Snapshot()
	if want := float64(s.Until.UnixMilli()) / 1000; s.Until.IsZero() || gauge() != want {
		t.Errorf("a timed pause: %v, want its end %v (%v)", gauge(), want, s.Until)
	}
	wall.Add(int64(time.Hour + time.Minute)) // the replica's clock passes the end
	if g := gauge(); g != 0 {
		t.Errorf("past the end: %v, want 0", g)
	}
}
