package pause

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/valkey-io/valkey-go"
)

// replicaPause starts one replica's Pause on its own Valkey client and its
// own NATS connection, its events on the subject of the replicas that share
// prefix (unless cfg.Events is set).
func replicaPause(t *testing.T, srv *testenv.Server, prefix string, cfg Config) (*Pause, *counting.Client) {
	t.Helper()
	c := &counting.Client{Client: testenv.Client(t, srv.Addr)}
	cfg.Prefix = prefix
	if cfg.Events == nil {
		cfg.NATS, cfg.Subject = testenv.NATSConn(t), testenv.PauseSubject(prefix)
	}
	p := New(c, cfg)
	t.Cleanup(p.Close)
	if err := p.Start(testenv.Ctx(t)); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return p, c
}

// writeWithoutEvent changes the stored state as SetPaused does, but
// publishes nothing: an event that was lost.
func writeWithoutEvent(t *testing.T, c valkey.Client, prefix string, paused bool) int64 {
	t.Helper()
	b := c.B()
	write := b.Del().Key(prefix + "pause:{pause}:flag").Build()
	if paused {
		write = b.Set().Key(prefix + "pause:{pause}:flag").Value("1").Build()
	}
	res := c.DoMulti(testenv.Ctx(t), b.Multi().Build(), write, b.Incr().Key(prefix+"pause:{pause}:version").Build(), b.Exec().Build())
	arr, err := res[3].ToArray()
	if err != nil {
		t.Fatal(err)
	}
	v, err := arr[1].AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// publisher returns a function that publishes an event on the pause
// subject of prefix's replicas, as another writer would: one connection,
// so its events arrive in order, each flushed before it returns.
func publisher(t *testing.T, prefix string) func(msg string) {
	t.Helper()
	nc := testenv.NATSConn(t)
	subject := testenv.PauseSubject(prefix)
	return func(msg string) {
		t.Helper()
		if err := nc.Publish(subject, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if err := nc.FlushWithContext(testenv.Ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// subjectCounter counts the messages on the pause subject of prefix's
// replicas, as a replica receives them: the events the replicas publish.
type subjectCounter struct {
	mu   sync.Mutex
	msgs []string
}

func countSubject(t *testing.T, prefix string) *subjectCounter {
	t.Helper()
	nc := testenv.NATSConn(t)
	sc := &subjectCounter{}
	if _, err := nc.Subscribe(testenv.PauseSubject(prefix), func(m *nats.Msg) {
		sc.mu.Lock()
		sc.msgs = append(sc.msgs, string(m.Data))
		sc.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushWithContext(testenv.Ctx(t)); err != nil { // subscribed
		t.Fatal(err)
	}
	return sc
}

func (sc *subjectCounter) got() []string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return slices.Clone(sc.msgs)
}

func snapshotOf(t *testing.T, p *Pause) Snapshot {
	t.Helper()
	s, ok := p.Snapshot()
	if !ok {
		t.Fatal("no snapshot")
	}
	return s
}

// TestPauseNotReadyBeforeFirstSnapshot holds the initial MGET and checks
// that the replica is subscribed, yet not ready and failing closed, until
// the state is loaded.
func TestPauseNotReadyBeforeFirstSnapshot(t *testing.T) {
	srv := testenv.Shared(t)
	raw := testenv.Client(t, srv.Addr)
	prefix := testenv.Prefix(t)
	writeWithoutEvent(t, raw, prefix, true)

	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c := &counting.Client{Client: raw, Gate: func(cmd valkey.Completed) {
		if testenv.IsCommand(cmd, "MGET") {
			once.Do(func() { close(arrived); <-release })
		}
	}}
	p := New(c, Config{Prefix: prefix, ReconcileEvery: time.Hour, NATS: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix)})
	t.Cleanup(p.Close)
	started := make(chan error, 1)
	go func() { started <- p.Start(testenv.Ctx(t)) }()

	select {
	case <-arrived:
	case err := <-started:
		t.Fatalf("Start returned %v before loading the state", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the initial MGET was never sent")
	}
	if n := p.Stats().Subscriptions; n != 1 {
		t.Errorf("subscriptions when loading: %d, want 1 (subscribe before load)", n)
	}
	if p.Ready() {
		t.Error("ready before the initial state was loaded")
	}
	if err := p.Check(); !errors.Is(err, ErrPauseNotReady) {
		t.Errorf("Check before load: %v, want ErrPauseNotReady", err)
	}
	if _, ok := p.Snapshot(); ok {
		t.Error("a snapshot exists before load")
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatalf("Start: %v", err)
	}
	if !p.Ready() {
		t.Error("not ready after Start")
	}
	if err := p.Check(); !errors.Is(err, ErrPaused) {
		t.Errorf("Check after load: %v, want ErrPaused (the stored state)", err)
	}
}

// TestPauseEveryReplicaSeesPause has one of three replicas pause and
// resume; the others learn by the events alone (they reconcile once an
// hour). Each change is exactly one message on the replicas' NATS subject,
// and each replica other than the writer applies each one.
func TestPauseEveryReplicaSeesPause(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	on := countSubject(t, prefix)
	var replicas []*Pause
	for range 3 {
		p, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
		replicas = append(replicas, p)
	}
	for i, paused := range []bool{true, false} {
		ctx := testenv.Ctx(t)
		if !paused {
			// A context without a deadline, as a command's: the event's
			// flush is bounded all the same (nats.go's FlushWithContext
			// refuses such a context, and SetPaused failed with
			// ErrNotPublished).
			ctx = context.Background()
		}
		version, err := replicas[0].SetPaused(ctx, paused, int64(i))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range replicas {
			if !testenv.WaitFor(func() bool { return snapshotOf(t, p).Version == version }) {
				t.Fatalf("replica %d: version %d, want %d", i, snapshotOf(t, p).Version, version)
			}
			if s := snapshotOf(t, p); s.Paused != paused {
				t.Errorf("replica %d: paused %v at version %d, want %v", i, s.Paused, s.Version, paused)
			}
			want := error(nil)
			if paused {
				want = ErrPaused
			}
			if err := p.Check(); err != want {
				t.Errorf("replica %d: Check %v, want %v", i, err, want)
			}
		}
	}
	// A marker published after SetPaused returned (its event flushed to
	// the server) arrives after anything SetPaused published; once every
	// receiver has it, the counts below are final.
	publisher(t, prefix)("marker")
	if !testenv.WaitFor(func() bool { g := on.got(); return len(g) > 0 && g[len(g)-1] == "marker" }) {
		t.Fatalf("the marker never arrived; messages %q", on.got())
	}
	for i, p := range replicas {
		if !testenv.WaitFor(func() bool { return p.Stats().EventsMalformed == 1 }) {
			t.Fatalf("replica %d never received the marker: %+v", i, p.Stats())
		}
	}
	for i, p := range replicas[1:] {
		if s := p.Stats(); s.EventsApplied != 2 || s.Reconciles != 1 {
			t.Errorf("replica %d: %d events applied, %d reconciles; want 2 and 1 (the initial load)", i+1, s.EventsApplied, s.Reconciles)
		}
	}
	// The writer receives its own events too, and ignores them: it
	// applied each change when its transaction returned.
	if s := replicas[0].Stats(); s.EventsApplied != 0 || s.EventsIgnored != 2 {
		t.Errorf("writer: %d events applied, %d ignored; want 0 and 2 (its own)", s.EventsApplied, s.EventsIgnored)
	}
	if got := on.got(); !slices.Equal(got, []string{"1:1", "0:2", "marker"}) {
		t.Errorf("messages on %s: %q, want exactly \"1:1\", \"0:2\" (then the test's marker)", testenv.PauseSubject(prefix), got)
	}
}

// TestPauseLostEventRepairedByReconcile stores a pause without publishing
// it. The replica that reconciles every 20 ms converges; the one that
// reconciles hourly, which got no event either, does not: the repair is the
// reconciliation's.
func TestPauseLostEventRepairedByReconcile(t *testing.T) {
	srv := testenv.Shared(t)
	raw := testenv.Client(t, srv.Addr)
	prefix := testenv.Prefix(t)
	fast, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: 20 * time.Millisecond})
	slow, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})

	version := writeWithoutEvent(t, raw, prefix, true)
	if !testenv.WaitFor(func() bool { return snapshotOf(t, fast).Version == version }) {
		t.Fatalf("fast replica never reconciled to version %d: %+v", version, fast.Stats())
	}
	if s := snapshotOf(t, fast); !s.Paused {
		t.Error("fast replica: reconciled the version but not the flag")
	}
	if err := fast.Check(); !errors.Is(err, ErrPaused) {
		t.Errorf("fast replica: Check %v, want ErrPaused", err)
	}
	if st := fast.Stats(); st.EventsApplied != 0 {
		t.Errorf("fast replica applied %d events; none was published", st.EventsApplied)
	}
	if s := snapshotOf(t, slow); s.Paused || s.Version != 0 {
		t.Errorf("slow replica: %+v; with no event and no reconcile it must still hold version 0", s)
	}
}

// TestPauseOlderVersionNeverReverts delivers events out of order and a
// reconcile read older than the snapshot: none moves the state back.
func TestPauseOlderVersionNeverReverts(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	p, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	publish := publisher(t, prefix)

	publish("1:7")
	if !testenv.WaitFor(func() bool { return snapshotOf(t, p).Version == 7 }) {
		t.Fatal("event 1:7 never applied")
	}
	publish("0:5") // older
	publish("0:7") // same version, other state
	if !testenv.WaitFor(func() bool { return p.Stats().EventsIgnored == 2 }) {
		t.Fatalf("stats %+v: want 2 events ignored", p.Stats())
	}
	if s := snapshotOf(t, p); !s.Paused || s.Version != 7 {
		t.Errorf("after older events: %+v, want paused at version 7", s)
	}

	// Valkey holds version 0 (nothing stored): a reconcile read is older,
	// and a failure, not a confirmation.
	if err := p.reconcile(testenv.Ctx(t)); !errors.Is(err, ErrVersionBehind) {
		t.Fatalf("reconcile reading version 0 under 7: %v, want ErrVersionBehind", err)
	}
	if s := snapshotOf(t, p); !s.Paused || s.Version != 7 {
		t.Errorf("after an older reconcile read: %+v, want paused at version 7", s)
	}
	if n := p.Stats().ServerBehind; n != 1 {
		t.Errorf("ServerBehind %d, want 1", n)
	}

	publish("0:8") // newer: applied, so ignoring is not a broken apply
	if !testenv.WaitFor(func() bool { return snapshotOf(t, p).Version == 8 }) {
		t.Fatal("event 0:8 never applied")
	}
	if s := snapshotOf(t, p); s.Paused {
		t.Errorf("after 0:8: %+v, want running", s)
	}
	if st := p.Stats(); st.EventsApplied != 2 || st.EventsIgnored != 2 {
		t.Errorf("stats %+v: want 2 applied, 2 ignored", st)
	}
}

// TestPauseHotReadsSendNothing reads the snapshot from many goroutines
// while events change it (run with -race): no Valkey command is sent and
// Check allocates nothing.
func TestPauseHotReadsSendNothing(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	p, c := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	publish := publisher(t, prefix)
	before, _ := c.Totals()

	const readers, reads = 8, 20000
	var wg sync.WaitGroup
	var paused atomic.Int64
	for range readers {
		wg.Go(func() {
			for range reads {
				if errors.Is(p.Check(), ErrPaused) {
					paused.Add(1)
				}
			}
		})
	}
	for v := 1; v <= 20; v++ { // writers race the readers
		publish(encodePauseEvent(v%2 == 1, 0, int64(v)))
	}
	wg.Wait()
	if !testenv.WaitFor(func() bool { return p.Stats().EventsApplied == 20 }) {
		t.Errorf("stats %+v: want 20 events applied", p.Stats())
	}
	if after, _ := c.Totals(); after != before {
		t.Errorf("%d Valkey commands during %d hot reads, want 0", after-before, readers*reads)
	}
	if allocs := testing.AllocsPerRun(1000, func() { p.Check() }); allocs != 0 {
		t.Errorf("Check allocates %v times, want 0", allocs)
	}
}

// fakeClocks are a Pause's two clocks under a test's control: the
// monotonic one that ages confirmations and the wall clock that only
// labels them.
type fakeClocks struct{ mono, wall atomic.Int64 }

func (c *fakeClocks) elapsed() time.Duration { return time.Duration(c.mono.Load()) }
func (c *fakeClocks) now() time.Time         { return time.Unix(0, c.wall.Load()) }

// step moves the monotonic clock forward by d and the wall clock by wall
// (which may be negative: an NTP step back).
func (c *fakeClocks) step(d, wall time.Duration) {
	c.mono.Add(int64(d))
	c.wall.Add(int64(wall))
}

// TestPauseStaleFailsClosed moves the replica's monotonic clock past the
// maximum age of the last confirmation: Check fails closed, paused or not,
// until a reconcile succeeds again; failed reconciles are counted.
func TestPauseStaleFailsClosed(t *testing.T) {
	srv := testenv.Own(t)
	prefix := "stale:" // a server of its own, stopped below: no cleanup needed
	clk := &fakeClocks{}
	clk.wall.Store(time.Now().UnixNano())
	p, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Second, Elapsed: clk.elapsed, Now: clk.now})

	steps := []struct {
		by   time.Duration
		want error
	}{
		{0, nil},
		{2 * time.Second, nil}, // exactly MaxAge: still fresh
		{1, ErrPauseStale},
	}
	for i, s := range steps {
		clk.step(s.by, s.by)
		if err := p.Check(); err != s.want {
			t.Errorf("step %d: Check at +%v: %v, want %v", i, clk.elapsed(), err, s.want)
		}
	}

	clk.step(time.Second-1, time.Second-1) // +3s
	if err := p.reconcile(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(); err != nil {
		t.Errorf("after a reconcile: %v, want nil", err)
	}
	clk.step(time.Second, time.Second)
	if age := p.Age(); age != time.Second {
		t.Errorf("Age %v, want 1s", age)
	}

	// Valkey goes away: reconciles fail and are counted, and the snapshot
	// ages into failing closed, paused or not.
	if _, err := p.SetPaused(testenv.Ctx(t), true, 0); err != nil { // confirmed at +4s
		t.Fatal(err)
	}
	srv.Stop()
	ctx, cancel := context.WithTimeout(testenv.Ctx(t), 2*time.Second)
	defer cancel()
	if err := p.reconcile(ctx); err == nil {
		t.Fatal("reconcile succeeded with the server stopped")
	}
	st := p.Stats()
	if st.ReconcileFailures != 1 || st.LastReconcileError == "" {
		t.Errorf("stats %+v: want 1 reconcile failure with its error", st)
	}
	clk.step(2*time.Second, 2*time.Second)
	if err := p.Check(); err != ErrPaused {
		t.Errorf("within MaxAge of the last confirmation: %v, want ErrPaused", err)
	}
	clk.step(1, 1)
	if err := p.Check(); err != ErrPauseStale {
		t.Errorf("past MaxAge: %v, want ErrPauseStale", err)
	}
}

// TestPauseStalenessIgnoresWallClock steps the wall clock back an hour
// while the monotonic clock moves past MaxAge (an NTP correction after a
// confirmation): the snapshot is stale, and Check fails closed. Measured
// on the wall clock it would look fresh for another hour.
func TestPauseStalenessIgnoresWallClock(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	clk := &fakeClocks{}
	clk.wall.Store(time.Now().UnixNano())
	p, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Second, Elapsed: clk.elapsed, Now: clk.now})
	if err := p.Check(); err != nil {
		t.Fatalf("fresh: %v", err)
	}
	clk.step(3*time.Second, -time.Hour)
	if err := p.Check(); err != ErrPauseStale {
		t.Errorf("3s after the confirmation, wall clock stepped back 1h: Check %v, want ErrPauseStale", err)
	}
	if age := p.Age(); age != 3*time.Second {
		t.Errorf("Age %v, want 3s", age)
	}

	// And forward: a wall clock stepped ahead an hour ages nothing.
	if err := p.reconcile(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	clk.step(time.Second, time.Hour)
	if err := p.Check(); err != nil {
		t.Errorf("1s after a reconcile, wall clock stepped ahead 1h: Check %v, want nil", err)
	}
}

// TestPauseFailedWriteNeitherPublishedNorApplied makes the server refuse
// writes (maxmemory 1): SetPaused fails, the writer keeps its state, no
// event reaches another replica, and nothing is stored.
func TestPauseFailedWriteNeitherPublishedNorApplied(t *testing.T) {
	srv := testenv.Own(t)
	raw := testenv.Client(t, srv.Addr)
	prefix := testenv.Prefix(t)
	writer, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	observer, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	config := func(v string) {
		t.Helper()
		if err := raw.Do(testenv.Ctx(t), raw.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	orig, err := raw.Do(testenv.Ctx(t), raw.B().ConfigGet().Parameter("maxmemory").Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}

	config("1")
	if v, err := writer.SetPaused(testenv.Ctx(t), true, 0); err == nil {
		config(orig["maxmemory"])
		t.Fatalf("SetPaused succeeded (version %d) on a server refusing writes", v)
	}
	config(orig["maxmemory"])
	if s := snapshotOf(t, writer); s.Paused || s.Version != 0 {
		t.Errorf("writer after the failed write: %+v, want running at version 0", s)
	}
	// A marker published after SetPaused returned arrives after anything
	// SetPaused published; once the observer has it, it has seen all.
	publisher(t, prefix)("marker")
	for name, p := range map[string]*Pause{"writer": writer, "observer": observer} {
		if !testenv.WaitFor(func() bool { return p.Stats().EventsMalformed == 1 }) {
			t.Fatalf("%s never received the marker", name)
		}
		if st := p.Stats(); st.EventsApplied != 0 || st.EventsIgnored != 0 {
			t.Errorf("%s received a pause event from the failed write: %+v", name, st)
		}
	}
	vals, err := raw.Do(testenv.Ctx(t), raw.B().Mget().Key(prefix+"pause:{pause}:flag", prefix+"pause:{pause}:version").Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	if !vals[0].IsNil() || !vals[1].IsNil() {
		t.Errorf("the failed write stored something: %v", vals)
	}
}

// TestPauseCloseStopsAndJoins checks that after Close returns, the
// reconciler sends nothing more, and that Close may be called twice.
func TestPauseCloseStopsAndJoins(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	p, c := replicaPause(t, srv, prefix, Config{ReconcileEvery: 5 * time.Millisecond})
	if !testenv.WaitFor(func() bool { return p.Stats().Reconciles >= 3 }) {
		t.Fatalf("stats %+v: the reconciler is not running", p.Stats())
	}
	p.Close()
	before, _ := c.Totals()
	reconciles := p.Stats().Reconciles
	time.Sleep(50 * time.Millisecond) // ten reconcile intervals
	if after, _ := c.Totals(); after != before || p.Stats().Reconciles != reconciles {
		t.Errorf("%d commands after Close, want 0", after-before)
	}
	p.Close()
}

// TestPauseEventEncoding freezes the event format and refuses bad ones.
func TestPauseEventEncoding(t *testing.T) {
	for _, c := range []struct {
		paused         bool
		until, version int64
		want           string
	}{{true, 0, 42, "1:42"}, {false, 0, 0, "0:0"}, {true, 1764640000000, 43, "1:43:1764640000000"}} {
		if got := encodePauseEvent(c.paused, c.until, c.version); got != c.want {
			t.Errorf("encode(%v, %d, %d) = %q, want %q", c.paused, c.until, c.version, got, c.want)
		}
		if p, u, v, ok := decodePauseEvent(c.want); !ok || p != c.paused || u != c.until || v != c.version {
			t.Errorf("decode(%q) = %v, %d, %d, %v", c.want, p, u, v, ok)
		}
	}
	for _, bad := range []string{"", "1", "2:3", "1:-1", "1:x", "true:3", ":3", "0:3:4", "1:3:0", "1:3:-4", "1:3:x", "1:3:4:5"} {
		if _, _, _, ok := decodePauseEvent(bad); ok {
			t.Errorf("decode(%q) accepted", bad)
		}
	}
}

// TestPauseLostKeysFailLoudly deletes both pause keys behind three
// replicas' backs (Valkey lost them) and pauses. The write cannot take
// effect: its version is older than the one every replica holds. SetPaused
// must say so, and the reconciles that now read an older version must not
// count as confirmations, so that every replica fails closed once MaxAge
// passes instead of sending on.
func TestPauseLostKeysFailLoudly(t *testing.T) {
	srv := testenv.Shared(t)
	raw := testenv.Client(t, srv.Addr)
	prefix := testenv.Prefix(t)
	cfg := Config{ReconcileEvery: 20 * time.Millisecond, MaxAge: 300 * time.Millisecond}
	var replicas []*Pause
	for range 3 {
		p, _ := replicaPause(t, srv, prefix, cfg)
		replicas = append(replicas, p)
	}
	for i, paused := range []bool{true, false} {
		if _, err := replicas[0].SetPaused(testenv.Ctx(t), paused, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range replicas {
		if !testenv.WaitFor(func() bool { return snapshotOf(t, p).Version == 2 }) {
			t.Fatalf("replica %d never reached version 2", i)
		}
	}

	if err := raw.Do(testenv.Ctx(t), raw.B().Del().Key(prefix+"pause:{pause}:flag", prefix+"pause:{pause}:version").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// An edit against the version Valkey holds now (0: the keys are gone).
	v, err := replicas[0].SetPaused(testenv.Ctx(t), true, 0)
	if !errors.Is(err, ErrVersionBehind) {
		t.Errorf("SetPaused(true) after the keys were lost: version %d, %v; want ErrVersionBehind", v, err)
	}
	for i, p := range replicas {
		if !testenv.WaitFor(func() bool { return errors.Is(p.Check(), ErrPauseStale) }) {
			t.Errorf("replica %d: Check %v, stats %+v; want ErrPauseStale once reconciles read only an older version",
				i, p.Check(), p.Stats())
		}
		if st := p.Stats(); st.ServerBehind == 0 || st.ReconcileFailures == 0 || !strings.Contains(st.LastReconcileError, "not a confirmation") {
			t.Errorf("replica %d: stats %+v; want the older reads counted as behind and as failed reconciles", i, st)
		}
	}
}

// TestMain stops the shared test servers after the last test.
func TestMain(m *testing.M) { testenv.Main(m) }

// TestPausePropagationMeasured: each change is measured once per replica,
// from the time its writer stored to when the replica acted on it: by the
// event, or, when the event was lost, by the reconcile that read it. The
// version a replica loads at start is not a propagation. The writer's and
// the reader's wall clocks are the test's (each stands still), so the
// figures are exact: the reader's clock minus the writer's stamp.
func TestPausePropagationMeasured(t *testing.T) {
	srv := testenv.Shared(t)
	raw := testenv.Client(t, srv.Addr)
	prefix := testenv.Prefix(t)
	t0 := time.UnixMilli(time.Now().UnixMilli()) // the stamp has millisecond resolution
	writerClock, readerClock := &fakeClocks{}, &fakeClocks{}
	writerClock.wall.Store(t0.UnixNano())
	readerClock.wall.Store(t0.Add(250 * time.Millisecond).UnixNano()) // the reader's clock is 250 ms ahead of the writer's
	writer, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour, Now: writerClock.now})
	if _, err := writer.SetPaused(testenv.Ctx(t), false, 0); err != nil { // a change before the reader starts
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []time.Duration
	reader, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: 20 * time.Millisecond, Now: readerClock.now, OnPropagation: func(d time.Duration) {
		mu.Lock()
		seen = append(seen, d)
		mu.Unlock()
	}})
	got := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	v, err := writer.SetPaused(testenv.Ctx(t), true, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(func() bool { return len(got()) == 1 }) {
		t.Fatalf("no propagation measured for version %d; stats %+v", v, reader.Stats())
	}
	if d, st := got()[0], reader.Stats(); d != 250*time.Millisecond || st.EventsApplied != 1 {
		t.Errorf("propagation by event: %v with %d events applied; want 250ms (the reader's clock at the event less the writer's stamp), by 1 event", d, st.EventsApplied)
	}

	// A lost event, stamped 2 s before the writer's clock: measured by the
	// reconcile that reads it.
	b := raw.B()
	res := raw.DoMulti(testenv.Ctx(t), b.Multi().Build(), b.Del().Key(prefix+"pause:{pause}:flag").Build(),
		b.Incr().Key(prefix+"pause:{pause}:version").Build(),
		b.Set().Key(prefix+"pause:{pause}:changed").Value(strconv.FormatInt(t0.Add(-2*time.Second).UnixMilli(), 10)).Build(),
		b.Exec().Build())
	if err := res[4].Error(); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(func() bool { return len(got()) == 2 }) {
		t.Fatalf("no propagation measured for the lost event; stats %+v", reader.Stats())
	}
	if d := got()[1]; d != 2250*time.Millisecond {
		t.Errorf("propagation by reconcile %v, want 2.25s (stamped 2 s before the writer's clock, read at the reader's)", d)
	}
	n := reader.Stats().Reconciles
	if !testenv.WaitFor(func() bool { return reader.Stats().Reconciles >= n+3 }) { // more reconciles: no second measurement of either change
		t.Fatalf("the reader stopped reconciling: %+v", reader.Stats())
	}
	if n := len(got()); n != 2 {
		t.Errorf("%d measurements, want 2 (one per change)", n)
	}
	if st := reader.Stats(); st.Propagations != 2 || st.PropagatedVersion != 3 {
		t.Errorf("stats: %d propagations, the newest version %d; want 2 and 3 (version 1 was loaded at start)", st.Propagations, st.PropagatedVersion)
	}
}

// afterExec runs a hook after each SetPaused write (its transaction, on
// a dedicated connection) has its reply, before SetPaused goes on.
type afterExec struct {
	valkey.Client
	hook func()
}

func (c *afterExec) Dedicated(fn func(valkey.DedicatedClient) error) error {
	err := c.Client.Dedicated(fn)
	if c.hook != nil && err == nil {
		c.hook()
	}
	return err
}

// TestPauseWriteReadBackByOwnReconcile: the writer's own reconcile runs
// between its write and the rest of SetPaused, and reads the version
// just written (on a loaded machine, a reconcile that was due does). The
// snapshot then holds that version already; it is this write, not a lost
// version key: SetPaused succeeds, returns the version and publishes the
// event, so that the other replicas learn it at once.
func TestPauseWriteReadBackByOwnReconcile(t *testing.T) {
	srv := testenv.Shared(t)
	raw := testenv.Client(t, srv.Addr)
	prefix := testenv.Prefix(t)
	c := &afterExec{Client: raw}
	writer := New(c, Config{Prefix: prefix, ReconcileEvery: time.Hour, NATS: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix)})
	t.Cleanup(writer.Close)
	if err := writer.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	observer, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	events := countSubject(t, prefix)
	c.hook = func() {
		if err := writer.reconcile(testenv.Ctx(t)); err != nil {
			t.Errorf("the interleaved reconcile: %v", err)
		}
	}
	for i, paused := range []bool{true, false} {
		v, err := writer.SetPaused(testenv.Ctx(t), paused, int64(i))
		if err != nil || v != int64(i+1) {
			t.Fatalf("SetPaused(%v) with its write read back first: version %d, %v; want version %d, nil", paused, v, err, i+1)
		}
		if s := snapshotOf(t, writer); s.Paused != paused || s.Version != v {
			t.Errorf("writer: %+v, want paused %v at version %d", s, paused, v)
		}
		if !testenv.WaitFor(func() bool { s := snapshotOf(t, observer); return s.Version == v && s.Paused == paused }) {
			t.Errorf("observer: %+v, stats %+v; want paused %v at version %d, by the event", snapshotOf(t, observer), observer.Stats(), paused, v)
		}
	}
	testenv.WaitFor(func() bool { return len(events.got()) >= 2 })
	if got := events.got(); !slices.Equal(got, []string{"1:1", "0:2"}) {
		t.Errorf("events published %q, want [1:1 0:2]", got)
	}
	if st := writer.Stats(); st.ServerBehind != 0 {
		t.Errorf("writer stats %+v: its own write counted as behind", st)
	}
}

// TestPauseRacingWritersOneWins: two writers, on clients of their own,
// edit from one view (the same version) at once, 50 times: each time
// exactly one writes, the other is refused with ErrVersionConflict naming
// the version it was made against and the one Valkey holds, and writes
// nothing (the version counts only the winners' edits).
func TestPauseRacingWritersOneWins(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	a, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	b, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	const rounds = 50
	for i := range int64(rounds) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		var versions [2]int64
		var errs [2]error
		for w, p := range []*Pause{a, b} {
			wg.Go(func() {
				<-start
				versions[w], errs[w] = p.SetPaused(testenv.Ctx(t), w == 0, i) // a pauses, b resumes
			})
		}
		close(start)
		wg.Wait()
		won, lost := 0, 1
		if errs[0] != nil {
			won, lost = 1, 0
		}
		want := fmt.Sprintf("made against version %d, Valkey holds version %d", i, i+1)
		if errs[won] != nil || versions[won] != i+1 || !errors.Is(errs[lost], ErrVersionConflict) || versions[lost] != 0 ||
			!strings.Contains(errs[lost].Error(), want) {
			t.Fatalf("round %d: writer a: version %d, %v; writer b: version %d, %v; want one at version %d, the other ErrVersionConflict %q",
				i, versions[0], errs[0], versions[1], errs[1], i+1, want)
		}
		if paused, v, err := a.Stored(testenv.Ctx(t)); err != nil || v != i+1 || paused != (won == 0) {
			t.Fatalf("round %d: stored paused %v at version %d, %v; want the winner's state at version %d", i, paused, v, err, i+1)
		}
	}
}

// TestPauseStartWithoutEvents: a Pause with no event transport refuses to
// start with ErrNoEvents, and stays not ready.
func TestPauseStartWithoutEvents(t *testing.T) {
	p := New(testenv.Client(t, testenv.Shared(t).Addr), Config{Prefix: testenv.Prefix(t)})
	t.Cleanup(p.Close)
	if err := p.Start(testenv.Ctx(t)); !errors.Is(err, ErrNoEvents) {
		t.Errorf("Start without NATS or Events: %v, want ErrNoEvents", err)
	}
	if err := p.Check(); err != ErrPauseNotReady {
		t.Errorf("Check: %v, want ErrPauseNotReady", err)
	}
}

// failingPublish is an Events whose Publish fails; Listen works.
type failingPublish struct{ Events }

func (failingPublish) Publish(context.Context, string) error { return errors.New("NATS is away") }

// TestPauseStoredNotPublished: when the event cannot be published,
// SetPaused returns the version it stored with an error wrapping
// ErrNotPublished; the writer holds it, and another replica, which got no
// event, learns it at its next reconcile.
func TestPauseStoredNotPublished(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	writer, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour,
		Events: failingPublish{&NATSEvents{Conn: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix)}}})
	other, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: 20 * time.Millisecond})
	v, err := writer.SetPaused(testenv.Ctx(t), true, 0)
	if !errors.Is(err, ErrNotPublished) || v != 1 {
		t.Fatalf("SetPaused: version %d, %v; want version 1 with ErrNotPublished", v, err)
	}
	if s := snapshotOf(t, writer); !s.Paused || s.Version != 1 {
		t.Errorf("writer: %+v, want paused at version 1", s)
	}
	if !testenv.WaitFor(func() bool { return other.Check() == ErrPaused }) {
		t.Errorf("other replica: %v, %+v; want paused by its reconcile", other.Check(), other.Stats())
	}
	if st := other.Stats(); st.EventsApplied != 0 {
		t.Errorf("other replica applied %d events; none was published", st.EventsApplied)
	}
}

// TestPauseOvertakenByLaterWrite: between writer a's write (version 1)
// and the rest of its SetPaused, writer b writes version 2 against it, and
// a applies b's event: a's own version is behind what it holds. a's
// SetPaused then fails with ErrOvertaken naming both versions, publishes
// nothing, and every replica follows b.
func TestPauseOvertakenByLaterWrite(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	c := &afterExec{Client: testenv.Client(t, srv.Addr)}
	a := New(c, Config{Prefix: prefix, ReconcileEvery: time.Hour, NATS: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix)})
	t.Cleanup(a.Close)
	if err := a.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	b, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	events := countSubject(t, prefix)
	c.hook = func() {
		c.hook = nil
		if v, err := b.SetPaused(testenv.Ctx(t), false, 1); err != nil || v != 2 {
			t.Errorf("b's write: version %d, %v; want 2", v, err)
		}
		if !testenv.WaitFor(func() bool { return snapshotOf(t, a).Version == 2 }) {
			t.Errorf("a never applied b's event: %+v", snapshotOf(t, a))
		}
	}
	v, err := a.SetPaused(testenv.Ctx(t), true, 0)
	if !errors.Is(err, ErrOvertaken) || v != 1 || !strings.Contains(err.Error(), "this call wrote version 1, another writer then wrote version 2 (resumed)") {
		t.Fatalf("a's SetPaused: version %d, %v; want version 1 with ErrOvertaken naming versions 1 and 2", v, err)
	}
	publisher(t, prefix)("marker") // after anything a published
	if !testenv.WaitFor(func() bool { return slices.Contains(events.got(), "marker") }) {
		t.Fatal("the marker never arrived")
	}
	if got := events.got(); !slices.Equal(got, []string{"0:2", "marker"}) {
		t.Errorf("events %q, want only b's (0:2), then the marker", got)
	}
	for name, p := range map[string]*Pause{"a": a, "b": b} {
		if s := snapshotOf(t, p); s.Paused || s.Version != 2 {
			t.Errorf("%s: %+v, want resumed at version 2 (b's)", name, s)
		}
	}
}

// TestPauseForEndsOnItsOwn: a pause made with PauseFor(1h) stops every
// replica, one started after it too, and each shows when it ends; once the
// replicas' clocks pass the end, each runs again with no write and no event
// (the version stays 1), and a late event of the pause, even one naming a
// later end, cannot revive it. Ending it sooner is an edit against its
// version, as any other.
func TestPauseForEndsOnItsOwn(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	clk := &fakeClocks{}
	clk.wall.Store(time.Now().UnixNano())
	cfg := Config{ReconcileEvery: 20 * time.Millisecond, Now: clk.now, Elapsed: clk.elapsed}
	a, _ := replicaPause(t, srv, prefix, cfg)
	b, _ := replicaPause(t, srv, prefix, cfg)
	if _, err := a.PauseFor(testenv.Ctx(t), 0, 0); err == nil {
		t.Error("PauseFor(0) accepted")
	}
	v, err := a.PauseFor(testenv.Ctx(t), time.Hour, 0)
	if err != nil || v != 1 {
		t.Fatalf("PauseFor: version %d, %v; want 1", v, err)
	}
	stored, err := a.StoredState(testenv.Ctx(t))
	if err != nil || !stored.Paused || stored.Version != 1 || time.Until(stored.Until) < 59*time.Minute || time.Until(stored.Until) > time.Hour {
		t.Fatalf("stored %+v, %v; want paused at version 1 until an hour from now", stored, err)
	}
	c, _ := replicaPause(t, srv, prefix, cfg) // started after the write: a restarted replica
	replicas := map[string]*Pause{"a": a, "b": b, "c": c}
	for name, p := range replicas {
		if !testenv.WaitFor(func() bool { return p.Check() == ErrPaused }) {
			t.Fatalf("%s: %v, want ErrPaused", name, p.Check())
		}
		if s := snapshotOf(t, p); !s.Paused || s.Version != 1 || !s.Until.Equal(stored.Until) {
			t.Errorf("%s: %+v, want paused at version 1 until %v", name, s, stored.Until)
		}
	}
	events := countSubject(t, prefix)
	clk.step(0, time.Hour+time.Minute) // the replicas' wall clocks pass the end
	for name, p := range replicas {
		if err := p.Check(); err != nil {
			t.Errorf("%s past the end: %v, want running", name, err)
		}
		if s := snapshotOf(t, p); s.Paused || s.Version != 1 || !s.Until.Equal(stored.Until) {
			t.Errorf("%s past the end: %+v, want not paused, version 1, the end shown", name, s)
		}
	}
	// Late events of the pause, the second naming a later end: the
	// version is not newer, so neither revives it.
	late := publisher(t, prefix)
	late(encodePauseEvent(true, stored.Until.UnixMilli(), 1))
	late(encodePauseEvent(true, stored.Until.Add(24*time.Hour).UnixMilli(), 1))
	late("marker")
	if !testenv.WaitFor(func() bool { return b.Stats().EventsIgnored >= 2 && slices.Contains(events.got(), "marker") }) {
		t.Fatalf("the late events never arrived: %+v", b.Stats())
	}
	for name, p := range replicas {
		if err := p.Check(); err != nil {
			t.Errorf("%s after the late events: %v, want running", name, err)
		}
	}
	if _, v, _ := a.Stored(testenv.Ctx(t)); v != 1 {
		t.Errorf("version %d after the end, want 1: the end is no write", v)
	}
	if got := events.got(); !slices.Equal(got[len(got)-1:], []string{"marker"}) || len(got) != 3 {
		t.Errorf("events after the end: %q, want only the test's own", got)
	}
	// Ending it is an edit against version 1, as any other.
	if v, err := b.SetPaused(testenv.Ctx(t), false, 1); err != nil || v != 2 {
		t.Errorf("resume after the end: %d, %v; want version 2", v, err)
	}
}

// TestPauseForExpiresInValkey: a short timed pause ends in Valkey too: its
// flag expires, so the strong lookups (Stored, Lookup) and a replica
// started after the end read it as running, at the same version.
func TestPauseForExpiresInValkey(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	a, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: 20 * time.Millisecond})
	if v, err := a.PauseFor(testenv.Ctx(t), 200*time.Millisecond, 0); err != nil || v != 1 {
		t.Fatalf("PauseFor: %d, %v", v, err)
	}
	if !testenv.WaitFor(func() bool { paused, _, _ := a.Stored(testenv.Ctx(t)); return !paused && a.Check() == nil }) {
		t.Fatalf("the pause never ended: check %v", a.Check())
	}
	if paused, err := a.Lookup(testenv.Ctx(t)); err != nil || paused {
		t.Errorf("Lookup: %v, %v; want not paused", paused, err)
	}
	later, _ := replicaPause(t, srv, prefix, Config{ReconcileEvery: time.Hour})
	if s := snapshotOf(t, later); s.Paused || s.Version != 1 || later.Check() != nil {
		t.Errorf("a replica started after the end: %+v, %v; want running at version 1", s, later.Check())
	}
}

// TestPauseReconcilesOnReconnect cuts NATS (its server stops) while a
// pause is written: the writer stores it but cannot publish
// (ErrNotPublished), and the reader, which reconciles only once an hour,
// hears nothing. When the server is back, the reader reconnects, confirms
// its subscription again and reconciles at once: paused, without an
// event. Events after the reconnect reach it as before.
func TestPauseReconcilesOnReconnect(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	startNATS := func() *server.Server {
		t.Helper()
		ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("NATS not ready")
		}
		return ns
	}
	ns := startNATS()
	t.Cleanup(func() { ns.Shutdown() })
	conn := func() *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	cfg := Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Hour, Subject: "pause-reconnect"}
	wcfg, rcfg := cfg, cfg
	// The writer's publishes fail while NATS is cut (nats.go would
	// otherwise buffer them for the reconnect): its event is lost.
	var cut atomic.Bool
	wcfg.NATS, rcfg.NATS = conn(), conn()
	wcfg.Events = cutEvents{&NATSEvents{Conn: wcfg.NATS, Subject: cfg.Subject}, &cut}
	rcfg.Events = &NATSEvents{Conn: rcfg.NATS, Subject: cfg.Subject}
	writer, _ := replicaPause(t, srv, prefix, wcfg)
	reader, _ := replicaPause(t, srv, prefix, rcfg)
	before := reader.Stats()

	ns.Shutdown() // NATS is cut
	ns.WaitForShutdown()
	cut.Store(true)
	if !testenv.WaitFor(func() bool { return !rcfg.NATS.IsConnected() && !wcfg.NATS.IsConnected() }) {
		t.Fatal("the connections never noticed the cut")
	}
	if v, err := writer.SetPaused(testenv.Ctx(t), true, 0); !errors.Is(err, ErrNotPublished) || v != 1 {
		t.Fatalf("SetPaused with NATS cut: version %d, %v; want version 1 with ErrNotPublished", v, err)
	}
	time.Sleep(100 * time.Millisecond) // a reconnect attempt or more, against no server
	if err := reader.Check(); err != nil {
		t.Fatalf("reader before NATS is back: %v, want running (it heard nothing)", err)
	}

	ns = startNATS() // NATS is back, on the same port
	cut.Store(false)
	if !testenv.WaitFor(func() bool { return reader.Check() == ErrPaused }) {
		t.Fatalf("reader after the reconnect: %v, stats %+v; want paused by a reconcile at once", reader.Check(), reader.Stats())
	}
	st := reader.Stats()
	if st.Subscriptions != before.Subscriptions+1 || st.Reconciles != before.Reconciles+1 || st.EventsApplied != before.EventsApplied {
		t.Errorf("reader stats %+v (before %+v); want one more subscription and one more reconcile, no event", st, before)
	}
	if !testenv.WaitFor(func() bool { return wcfg.NATS.IsConnected() }) {
		t.Fatal("the writer never reconnected")
	}
	if v, err := writer.SetPaused(testenv.Ctx(t), false, 1); err != nil || v != 2 {
		t.Fatalf("SetPaused after the reconnect: %d, %v", v, err)
	}
	if !testenv.WaitFor(func() bool { return reader.Check() == nil }) || reader.Stats().EventsApplied != before.EventsApplied+1 {
		t.Errorf("reader: %v, stats %+v; want resumed by the event", reader.Check(), reader.Stats())
	}
}

// cutEvents fails every publish while cut is set.
type cutEvents struct {
	Events
	cut *atomic.Bool
}

func (c cutEvents) Publish(ctx context.Context, msg string) error {
	if c.cut.Load() {
		return errors.New("NATS is cut")
	}
	return c.Events.Publish(ctx, msg)
}

// TestPauseLastKnownGood: with Config.LastKnownGood, a snapshot past
// MaxAge without a confirmation (Valkey gone) still answers, paused or
// not, where the default fails closed (TestPauseStaleFailsClosed); its age
// still shows the staleness.
func TestPauseLastKnownGood(t *testing.T) {
	srv := testenv.Own(t)
	clk := &fakeClocks{}
	clk.wall.Store(time.Now().UnixNano())
	p, _ := replicaPause(t, srv, "lkg:", Config{ReconcileEvery: time.Hour, MaxAge: 2 * time.Second, Elapsed: clk.elapsed, Now: clk.now, LastKnownGood: true})
	if _, err := p.SetPaused(testenv.Ctx(t), true, 0); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	clk.step(time.Hour, time.Hour)
	if err := p.Check(); err != ErrPaused {
		t.Errorf("an hour without Valkey, paused: %v, want ErrPaused (last known good)", err)
	}
	if age := p.Age(); age != time.Hour {
		t.Errorf("Age %v, want 1h", age)
	}
}

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

// TestReconcileJitterBounds runs the reconciler on a clock of the test's
// own: each wait it asks for is recorded, and its timer fires only when
// the test says so (then one reconcile runs). With the jitter's draws
// forced to 0, ½, ¾ and the highest below 1, the waits are exactly
// 0.8 s, 1 s, 1.1 s and 1.2 s (the float product rounds up to it) of a
// 1 s ReconcileEvery; with the real random source, 300 waits all fall in
// [0.8 s, 1.2 s] and spread over most of it (the
// lowest under 0.85 s, the highest over 1.15 s: not a fixed interval).
func TestReconcileJitterBounds(t *testing.T) {
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	const every = time.Second
	p := New(testenv.Client(t, srv.Addr), Config{Prefix: prefix, ReconcileEvery: every, NATS: testenv.NATSConn(t), Subject: testenv.PauseSubject(prefix)})
	type wait struct {
		d    time.Duration
		fire chan time.Time
	}
	waits := make(chan wait)
	p.timer = func(d time.Duration) (<-chan time.Time, func() bool) {
		w := wait{d, make(chan time.Time, 1)}
		waits <- w
		return w.fire, func() bool { return true }
	}
	forced := []float64{0, 0.5, 0.75, math.Nextafter(1, 0)}
	draws := 0
	p.draw = func() float64 { // the loop's goroutine alone calls it
		draws++
		if draws <= len(forced) {
			return forced[draws-1]
		}
		return rand.Float64()
	}
	t.Cleanup(func() {
		go func() { // Close's cancel may find the loop asking for its next wait
			for range waits {
			}
		}()
		p.Close()
		close(waits)
	})
	if err := p.Start(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	next := func() time.Duration {
		t.Helper()
		select {
		case w := <-waits:
			before := p.Stats().Reconciles
			w.fire <- time.Time{}
			if !testenv.WaitFor(func() bool { return p.Stats().Reconciles == before+1 }) {
				t.Fatalf("the timer fired, yet no reconcile: %+v", p.Stats())
			}
			return w.d
		case <-time.After(10 * time.Second):
			t.Fatal("the reconciler asked for no wait")
			return 0
		}
	}
	for i, want := range []time.Duration{800 * time.Millisecond, time.Second, 1100 * time.Millisecond, 1200 * time.Millisecond} {
		if d := next(); d != want {
			t.Errorf("wait %d with draw %v: %v, want %v", i, forced[i], d, want)
		}
	}
	lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
	for range 300 {
		d := next()
		if d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("wait %v outside [0.8 s, 1.2 s]", d)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo >= 850*time.Millisecond || hi <= 1150*time.Millisecond {
		t.Errorf("300 waits between %v and %v; want them spread over [0.8 s, 1.2 s] (the lowest under 0.85 s, the highest over 1.15 s)", lo, hi)
	}
	if got := (Config{ReconcileEvery: every, Timeout: time.Second}).LongestGap(); got != 2200*time.Millisecond {
		t.Errorf("LongestGap %v, want 2.2 s: the longest wait (1.2 s) and the reconcile's timeout", got)
	}
}
