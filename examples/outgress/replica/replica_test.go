package replica

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/mgmt"
	"github.com/admitkit/admit/examples/outgress/pause"
)

// TestWorkerReplicasServeMgmt runs two replicas of `outgress worker` on one
// Valkey and one NATS, as the subcommand starts them (Start), and
// sends one set_paused request: exactly one replica executed it (its
// counter 1, the other's 0, as the reply says), and both applied it (the
// other by its event: each reconciles once an hour here). Then the pause
// state is changed in Valkey directly, with no event: both snapshots still
// say paused at version 1, and the status request answers from Valkey,
// resumed at version 2, with the answering replica's stale snapshot beside
// it.
func TestWorkerReplicasServeMgmt(t *testing.T) {
	srv := testenv.Shared(t)
	dial := fleetenv.DialAddr(srv.Addr)
	raw := testenv.Client(t, srv.Addr)
	run := fmt.Sprintf("%x", rand.Uint64())
	cfg := Config{Dial: dial, NATSURL: testenv.NATSURL(t), Prefix: testenv.Prefix(t),
		Subjects: "outgress-wtest-" + run, Stream: "OUTGRESS_WTEST_" + run,
		Pause: pause.Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Hour}}
	replicas := map[string]*Replica{}
	for _, name := range []string{"A", "B"} {
		cfg.Name = name
		r, err := Start(testenv.Ctx(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		replicas[name] = r
	}
	defer func() { // the stream the replicas set up
		replicas["A"].bus.JetStream().DeleteStream(context.Background(), cfg.Stream)
	}()
	operator := testenv.NATSConn(t)
	mcfg := mgmt.Config{Prefix: cfg.Subjects + ".mgmt"}

	reply, err := mgmt.SetPaused(testenv.Ctx(t), operator, mcfg, true, 0)
	if err != nil || reply.Version != 1 {
		t.Fatalf("set_paused: %+v, %v; want version 1", reply, err)
	}
	for name, r := range replicas {
		want := int64(0)
		if name == reply.Replica {
			want = 1
		}
		if st := r.mgmt.Stats(); st.SetPaused != want || st.SetPausedFailed != 0 {
			t.Errorf("replica %s executed %d set_paused requests (%d failed); want %d (the reply names %s)", name, st.SetPaused, st.SetPausedFailed, want, reply.Replica)
		}
		if !testenv.WaitFor(func() bool { s, _ := r.pause.Snapshot(); return s.Version == 1 && s.Paused }) {
			s, _ := r.pause.Snapshot()
			t.Errorf("replica %s: snapshot %+v, want paused at version 1", name, s)
		}
		if name != reply.Replica {
			if st := r.pause.Stats(); st.EventsApplied != 1 || st.Reconciles != 1 {
				t.Errorf("replica %s: %d events applied, %d reconciles; want the change applied by its 1 event (1 reconcile: the initial load)", name, st.EventsApplied, st.Reconciles)
			}
		}
	}

	// Resume in Valkey directly, as SetPaused would but with no event.
	b := raw.B()
	res := raw.DoMulti(testenv.Ctx(t), b.Multi().Build(), b.Del().Key(cfg.Prefix+"pause:{pause}:flag").Build(),
		b.Incr().Key(cfg.Prefix+"pause:{pause}:version").Build(), b.Exec().Build())
	if err := res[3].Error(); err != nil {
		t.Fatal(err)
	}
	s, err := mgmt.SystemStatus(testenv.Ctx(t), operator, mcfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Paused || s.Version != 2 || !s.Snapshot.Paused || s.Snapshot.Version != 1 || replicas[s.Replica] == nil {
		t.Errorf("status %+v; want resumed at version 2 from Valkey, answered by A or B, its snapshot still paused at version 1", s)
	}
	if n := replicas["A"].mgmt.Stats().Status + replicas["B"].mgmt.Stats().Status; n != 1 {
		t.Errorf("status answered %d times, want 1", n)
	}
	for name, r := range replicas {
		if snap, _ := r.pause.Snapshot(); !snap.Paused || snap.Version != 1 {
			t.Errorf("replica %s: snapshot %+v; want still paused at version 1 (no event, no reconcile)", name, snap)
		}
	}
}

// TestMain stops the shared test server and the embedded NATS server after
// the last test.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Stop()
	os.Exit(code)
}

// heldEvents holds the pause events' subscription until release closes.
type heldEvents struct {
	pause.Events
	release chan struct{}
}

func (h heldEvents) Listen(ctx context.Context, subscribed func(), deliver func(string)) {
	select {
	case <-h.release:
	case <-ctx.Done():
		return
	}
	h.Events.Listen(ctx, subscribed, deliver)
}

// TestReadinessAfterSubscribeAndLoad starts a replica as `outgress worker`
// does, with its pause events' subscription held: /readyz answers 503,
// naming the pause state, and Start has not returned; once the
// subscription goes through, the state is loaded, every lane consumed,
// Start returns and /readyz answers 200.
func TestReadinessAfterSubscribeAndLoad(t *testing.T) {
	srv := testenv.Shared(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprintf("%x", rand.Uint64())
	release := make(chan struct{})
	cfg := Config{Name: "R", Dial: fleetenv.DialAddr(srv.Addr), NATSURL: testenv.NATSURL(t), Prefix: testenv.Prefix(t),
		Subjects: "outgress-rtest-" + run, Stream: "OUTGRESS_RTEST_" + run, MetricsAddr: fmt.Sprintf("127.0.0.1:%d", port),
		Pause: pause.Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Hour,
			Events: heldEvents{&pause.NATSEvents{Conn: testenv.NATSConn(t), Subject: "outgress-rtest-" + run + ".pause"}, release}}}
	type started struct {
		r   *Replica
		err error
	}
	done := make(chan started, 1)
	go func() {
		r, err := Start(testenv.Ctx(t), cfg)
		done <- started{r, err}
	}()
	probe := func() (int, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var code int
	var body string
	if !testenv.WaitFor(func() bool {
		code, body = probe()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "pause state is not loaded")
	}) {
		t.Fatalf("/readyz while the subscription is held: %d %q; want 503 naming the pause state", code, body)
	}
	select {
	case s := <-done:
		t.Fatalf("Start returned (%v) before the pause events' subscription", s.err)
	default:
	}
	close(release)
	s := <-done
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.r.Close()
	defer s.r.bus.JetStream().DeleteStream(context.Background(), cfg.Stream)
	if code, body := probe(); code != http.StatusOK || body != "ready\n" || !s.r.pause.Ready() {
		t.Errorf("/readyz after Start: %d %q, pause ready %v; want 200 ready", code, body, s.r.pause.Ready())
	}
}
