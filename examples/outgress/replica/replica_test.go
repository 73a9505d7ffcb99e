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

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/mgmt"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/nats-io/nats.go/jetstream"
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

// readyz probes a replica's /readyz on port.
func readyz(port int) (int, string) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestReadinessWaitsForConsumingAndNATS starts a replica on a NATS server
// of the test's own and holds it after its pause state is loaded, before
// it consumes its lanes: /readyz answers 503, "not consuming every lane
// yet", though the pause state is ready. Once it consumes, 200 "ready".
// Then the NATS server goes away (the pause events' subscription with
// it): 503, "NATS is not connected".
func TestReadinessWaitsForConsumingAndNATS(t *testing.T) {
	srv := testenv.Shared(t)
	nats, err := bus.StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	natsUp := true
	defer func() {
		if natsUp {
			nats.Close()
		}
	}()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprintf("%x", rand.Uint64())
	reached, release := make(chan struct{}), make(chan struct{})
	cfg := Config{Name: "R", Dial: fleetenv.DialAddr(srv.Addr), NATSURL: nats.URL(), Prefix: testenv.Prefix(t),
		Subjects: "outgress-ctest-" + run, Stream: "OUTGRESS_CTEST_" + run, MetricsAddr: fmt.Sprintf("127.0.0.1:%d", port),
		Pause:         pause.Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Hour},
		beforeConsume: func() { close(reached); <-release }}
	type started struct {
		r   *Replica
		err error
	}
	done := make(chan started, 1)
	go func() {
		r, err := Start(testenv.Ctx(t), cfg)
		done <- started{r, err}
	}()
	select {
	case <-reached:
	case s := <-done:
		t.Fatalf("Start returned (%v) without reaching its lanes", s.err)
	}
	if code, body := readyz(port); code != http.StatusServiceUnavailable || !strings.Contains(body, "not consuming every lane yet") {
		t.Errorf("/readyz with the pause state loaded, the lanes not consumed yet: %d %q; want 503 naming the lanes", code, body)
	}
	close(release)
	s := <-done
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.r.Close()
	if code, body := readyz(port); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/readyz consuming: %d %q; want 200 ready", code, body)
	}
	nats.Close()
	natsUp = false
	var code int
	var body string
	if !testenv.WaitFor(func() bool {
		code, body = readyz(port)
		return code == http.StatusServiceUnavailable
	}) || !strings.Contains(body, "NATS is not connected") {
		t.Errorf("/readyz with NATS down: %d %q; want 503 naming NATS", code, body)
	}
}

// TestNoConsumingBeforeSubscription starts a replica with its pause
// events' subscription held, and publishes a message on its standard
// lane. For as long as the subscription is held (1 s here) the lane's
// consumer shows no pull request and no delivery: nothing is consumed
// before the subscription. Once the subscription goes through, the
// replica consumes and the message is delivered (which shows the
// consumer's counts do see a replica that consumes).
func TestNoConsumingBeforeSubscription(t *testing.T) {
	srv := testenv.Shared(t)
	run := fmt.Sprintf("%x", rand.Uint64())
	release := make(chan struct{})
	subjects := "outgress-stest-" + run
	cfg := Config{Name: "R", Dial: fleetenv.DialAddr(srv.Addr), NATSURL: testenv.NATSURL(t), Prefix: testenv.Prefix(t),
		Subjects: subjects, Stream: "OUTGRESS_STEST_" + run,
		Pause: pause.Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Hour,
			Events: heldEvents{&pause.NATSEvents{Conn: testenv.NATSConn(t), Subject: subjects + ".pause"}, release}}}
	type started struct {
		r   *Replica
		err error
	}
	done := make(chan started, 1)
	go func() {
		r, err := Start(testenv.Ctx(t), cfg)
		done <- started{r, err}
	}()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	lane := fleetenv.LaneSubjects(subjects)[limits.LaneStandard]
	var consumer jetstream.Consumer
	if !testenv.WaitFor(func() bool { // Start has set the stream and its consumers up
		consumer, err = js.Consumer(testenv.Ctx(t), cfg.Stream, strings.ReplaceAll(lane, ".", "-"))
		return err == nil
	}) {
		t.Fatalf("the lane's consumer never appeared: %v", err)
	}
	defer js.DeleteStream(context.Background(), cfg.Stream)
	if _, err := js.Publish(testenv.Ctx(t), lane, []byte(`{"kind":"chat","channel":"1","text":"held"}`)); err != nil {
		t.Fatal(err)
	}
	info := func() *jetstream.ConsumerInfo {
		t.Helper()
		ci, err := consumer.Info(testenv.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return ci
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ci := info(); ci.NumWaiting != 0 || ci.Delivered.Consumer != 0 {
			t.Fatalf("with the pause subscription held: %d pull requests waiting, %d deliveries; want none (consumed before subscribing)",
				ci.NumWaiting, ci.Delivered.Consumer)
		}
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
	if !testenv.WaitFor(func() bool { return info().Delivered.Consumer >= 1 }) {
		t.Errorf("the message was never delivered once the replica consumed: %+v", info())
	}
}

// TestFlagDefaults: `outgress worker` given no flags keeps the plan's
// behaviour: -delay-until-token (a refusal's redelivery after the
// limit's RetryAfter) and -retry-unknown (the id-record retry, a
// departure) are off, and each is on when given.
func TestFlagDefaults(t *testing.T) {
	parse := func(args ...string) commandFlags {
		t.Helper()
		fs := fleetenv.NewFleetCommand("worker")
		f := defineFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := parse(); *f.delayToken || *f.retryUnknown || *f.off != "none" || *f.grace != 30*time.Second {
		t.Errorf("no flags: -delay-until-token %v, -retry-unknown %v, -off %q, -kill-grace %v; want false, false, none, 30s",
			*f.delayToken, *f.retryUnknown, *f.off, *f.grace)
	}
	if f := parse("-delay-until-token", "-retry-unknown"); !*f.delayToken || !*f.retryUnknown {
		t.Errorf("both flags given: -delay-until-token %v, -retry-unknown %v; want true, true", *f.delayToken, *f.retryUnknown)
	}
}
