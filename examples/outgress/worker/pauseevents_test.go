package worker

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/nats-io/nats.go"
)

// TestPauseEventsOnNATS: a worker's pause change travels as one event on
// the fleet's NATS subject, and every replica applies it. Three workers
// share a Valkey (a server of the test's own) and a subject; the first
// pauses, then resumes. A subscriber of the test's own counts the subject's
// messages: exactly "1:1" and "0:2" (then the test's marker). Each other
// replica applies both events (it reconciles once an hour, so only the
// events can tell it) and its worker's next message is a paused nack,
// then, after the resume, admitted. Valkey carries no pub/sub at all: its
// INFO commandstats counts no PUBLISH and no SUBSCRIBE.
func TestPauseEventsOnNATS(t *testing.T) {
	srv := testenv.Own(t)
	first := newEnv(t, srv)
	replicas := []*env{first, newEnv(t, srv, withPrefix(first.prefix)), newEnv(t, srv, withPrefix(first.prefix))}
	first.seed(t, "42", false)
	subject := testenv.PauseSubject(first.prefix)

	var mu sync.Mutex
	var seen []string
	counter := testenv.NATSConn(t)
	if _, err := counter.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, string(m.Data))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := counter.FlushWithContext(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	messages := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}

	for i, paused := range []bool{true, false} {
		version, err := first.pause.SetPaused(testenv.Ctx(t), paused, int64(i))
		if err != nil || version != int64(i+1) {
			t.Fatalf("SetPaused(%v): version %d, %v; want version %d", paused, version, err, i+1)
		}
		for r, e := range replicas {
			if !testenv.WaitFor(func() bool { s, _ := e.pause.Snapshot(); return s.Version == version }) {
				t.Fatalf("replica %d never applied version %d: %+v", r, version, e.pause.Stats())
			}
			path, err := e.process(t, limits.LanePremium, chat("42"))
			var nack *bus.ExpectedNack
			switch {
			case paused && (!path.Paused || !errors.As(err, &nack) || nack.Reason != bus.NackPaused):
				t.Errorf("replica %d while paused: path %+v, err %v; want a paused nack", r, path, err)
			case !paused && (path.Paused || !path.Admitted || err != nil):
				t.Errorf("replica %d after the resume: path %+v, err %v; want admitted and sent", r, path, err)
			}
		}
	}

	// A marker published after both changes arrives after both events;
	// once every receiver has it, the counts are final.
	marker := testenv.NATSConn(t)
	if err := marker.Publish(subject, []byte("marker")); err != nil {
		t.Fatal(err)
	}
	if err := marker.FlushWithContext(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(func() bool { m := messages(); return len(m) > 0 && m[len(m)-1] == "marker" }) {
		t.Fatalf("the marker never arrived; messages on %s: %q", subject, messages())
	}
	if got := messages(); !slices.Equal(got, []string{"1:1", "0:2", "marker"}) {
		t.Errorf("messages on %s: %q; want exactly \"1:1\", \"0:2\" (then the test's marker)", subject, got)
	}
	for r, e := range replicas {
		if !testenv.WaitFor(func() bool { return e.pause.Stats().EventsMalformed == 1 }) {
			t.Fatalf("replica %d never received the marker: %+v", r, e.pause.Stats())
		}
		applied, ignored := int64(2), int64(0)
		if r == 0 { // the writer applied each change when its transaction returned; its own events come back to it, ignored
			applied, ignored = 0, 2
		}
		if st := e.pause.Stats(); st.EventsApplied != applied || st.EventsIgnored != ignored || st.Reconciles != 1 {
			t.Errorf("replica %d: %d events applied, %d ignored, %d reconciles; want %d, %d and 1 (the initial load)",
				r, st.EventsApplied, st.EventsIgnored, st.Reconciles, applied, ignored)
		}
	}
	stats := testenv.CommandStats(t, first.raw)
	for _, name := range []string{"publish", "spublish", "subscribe", "ssubscribe", "psubscribe"} {
		if n := stats[name].Calls; n != 0 {
			t.Errorf("Valkey ran %s %d times; want 0 (the pause events are on NATS)", name, n)
		}
	}
}
