// Package pause is the outgress fleet's kill switch as one replica sees
// it: a versioned snapshot behind an atomic pointer (the message path's
// check is one atomic load, no I/O), written with MULTI/EXEC, spread by
// events on a dedicated NATS subject, repaired by a jittered reconcile,
// aged on the monotonic clock, failing closed when stale, and failing
// loudly when a write cannot take effect.
package pause

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/valkey-io/valkey-go"
)

// Errors of Pause.Check. The message path treats ErrPaused as expected
// backpressure and the other two as failures: without a trustworthy pause
// state the worker fails closed and sends nothing.
var (
	ErrPaused        = errors.New("outgress: sending is paused")
	ErrPauseNotReady = errors.New("outgress: pause state not loaded yet")
	ErrPauseStale    = errors.New("outgress: pause state not confirmed by Valkey within the maximum age; failing closed")
	// ErrNotPublished is returned (wrapped) by SetPaused when the new state
	// is stored in Valkey but the event could not be published: other
	// replicas learn it at their next reconcile instead of at once.
	ErrNotPublished = errors.New("outgress: pause stored but not published")
	// ErrVersionBehind is returned (wrapped) by SetPaused when the version
	// it wrote is not newer than the one this replica holds: Valkey lost the
	// version key, and no replica will apply the write.
	ErrVersionBehind = errors.New("outgress: pause version in Valkey is behind the replicas'")
	// ErrNoEvents is returned by Start when the Config names no transport
	// for pause events (neither NATS nor Events).
	ErrNoEvents = errors.New("outgress: pause events have no transport: set pause.Config.NATS to the worker's NATS connection (the bus's), or Config.Events")
	// ErrVersionConflict is returned (wrapped) by SetPaused when the edit
	// was made against a version that Valkey no longer holds: another
	// writer changed the state since the caller read it. Nothing is
	// written; the error names both versions.
	ErrVersionConflict = errors.New("outgress: pause edit made against an old version")
	// ErrOvertaken is returned (wrapped) by SetPaused when another writer's
	// change landed after this one, before this replica could apply its
	// own: the fleet follows the other writer's state, which the error
	// names. Nothing of this call is applied or published.
	ErrOvertaken = errors.New("outgress: another SetPaused won")
)

// Config configures a Pause. Zero fields take the defaults named.
type Config struct {
	// Prefix starts every key. Default "".
	Prefix string
	// ReconcileEvery is the mean interval between MGETs of the stored state,
	// jittered by ±20% so replicas do not reconcile in step. Default 1s.
	ReconcileEvery time.Duration
	// MaxAge bounds how old the last confirmation from Valkey may be before
	// Check fails closed. Default 5s.
	MaxAge time.Duration
	// LastKnownGood keeps Check answering from the last snapshot, however
	// old, when Valkey cannot confirm it (the etcd write-up's
	// last-known-good state), instead of failing closed past MaxAge (the
	// plan's rule, and the default). The trade-off: with it, a Valkey
	// outage stops nothing, but a pause set during the outage (or whose
	// event was lost) is not seen until Valkey answers again; failing
	// closed sends nothing while the state cannot be trusted, so an outage
	// of the store stops the fleet. Age and the reconcile failures still
	// show the staleness.
	LastKnownGood bool
	// Timeout bounds each reconcile MGET. Default 1s.
	Timeout time.Duration
	// Elapsed is the monotonic clock that ages confirmations: the time
	// since a fixed point, which a step of the wall clock (NTP, an
	// operator) does not move. Default: time.Since of a time.Now taken by
	// NewPause, which Go measures on the monotonic clock.
	Elapsed func() time.Duration
	// Now is the wall clock, used to report when a confirmation happened
	// (Snapshot.Confirmed) and to time propagation. Default time.Now.
	Now func() time.Time
	// OnPropagation, when set, receives each change's propagation to this
	// replica: from the wall-clock time its writer stored with it (SetPaused
	// writes it in the same transaction) to when this replica acted on it,
	// by event or by reconcile. It is measured at the first reconcile that
	// reads the change, so at most one ReconcileEvery late; a change written
	// by a replica that stores no time is not measured. Writer and reader
	// clocks differ by their skew.
	OnPropagation func(time.Duration)
	// NATS is the connection the pause events travel on: core NATS (not
	// the stream), on Subject, the plan's dedicated invalidation subject.
	// A worker passes the NATS connection it already has for its bus.
	// Required unless Events is set: Start fails with ErrNoEvents.
	NATS *nats.Conn
	// Subject is the pause events' NATS subject. Default DefaultSubject.
	// Every replica of a fleet uses the same one.
	Subject string
	// Events, when set, carries the events instead of NATS on Subject: a
	// wrapper of NATSEvents that loses events, in the tests and the
	// rollout's propagation gate.
	Events Events
}

// DefaultSubject is the pause events' NATS subject when Config.Subject is
// empty.
const DefaultSubject = "outgress.pause"

// Events carries pause events ("<0|1>:<version>") between replicas.
type Events interface {
	// Publish sends one event to every replica.
	Publish(ctx context.Context, msg string) error
	// Listen delivers every event received to deliver until ctx ends.
	// It calls subscribed once the subscription is in place (the server
	// will deliver every event published after that), and again after
	// each resubscription, when events may have been missed meanwhile.
	Listen(ctx context.Context, subscribed func(), deliver func(msg string))
}

// WithDefaults returns cfg with ReconcileEvery, MaxAge, Timeout and
// Subject set to their defaults where zero, and Events to NATSEvents on
// NATS and Subject when NATS is set: the values a Pause runs with.
func (cfg Config) WithDefaults() Config {
	if cfg.Subject == "" {
		cfg.Subject = DefaultSubject
	}
	if cfg.Events == nil && cfg.NATS != nil {
		cfg.Events = &NATSEvents{Conn: cfg.NATS, Subject: cfg.Subject}
	}
	if cfg.ReconcileEvery <= 0 {
		cfg.ReconcileEvery = time.Second
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	return cfg
}

// Snapshot is the state a replica acts on.
type Snapshot struct {
	Paused bool
	// Until is when a pause made with PauseFor ends on its own (on the
	// server's clock when it was written; each replica compares it with
	// its own); zero for a pause without an end, and when running.
	Until   time.Time
	Version int64 // the Valkey counter, incremented by every SetPaused
	// Confirmed is when Valkey last confirmed the replica's state: the
	// initial load, a reconcile or this replica's own SetPaused. Events do
	// not count: they cannot prove that none was missed.
	Confirmed time.Time
}

// Stats are a Pause's counters, for metrics.
type Stats struct {
	EventsApplied   int64 // events newer than the snapshot
	EventsIgnored   int64 // events not newer: late or duplicate
	EventsMalformed int64
	Reconciles      int64 // successful MGETs, including the initial load
	// ReconcileFailures counts failed MGETs, and reads of a version older
	// than the snapshot's (ErrVersionBehind), which confirm nothing.
	// LastReconcileError is the latest one's message, "" if none.
	ReconcileFailures  int64
	LastReconcileError string
	// ServerBehind counts reads older than the snapshot and writes not
	// newer than it: a read racing a newer event, or a version key that
	// went backwards (data loss). Neither moves the snapshot back nor
	// counts as a confirmation; see Pause and SetPaused.
	ServerBehind int64
	// Subscriptions counts subscriptions confirmed by the server: 1 plus
	// the resubscriptions.
	Subscriptions int64
	// Propagations counts the changes whose propagation was reported to
	// Config.OnPropagation; PropagatedVersion is the newest such change's
	// version (0 before any).
	Propagations, PropagatedVersion int64
}

// snapshot is immutable once stored; Check reads it with one atomic load.
type snapshot struct {
	paused    bool
	until     int64 // Unix ms when a paused state ends on its own; 0: never
	version   int64
	confirmed time.Duration // on the Elapsed clock; staleness is measured on it alone
	wall      time.Time     // the same moment on the wall clock, for reports
	applied   time.Time     // when this version was first acted on, on the wall clock
}

// Pause is the fleet-wide kill switch as seen by one replica: an immutable,
// versioned snapshot behind an atomic pointer, kept current by events on
// a NATS subject and repaired by periodic reconciliation from Valkey.
//
// Valkey holds the state under two keys that share the hash tag {pause}: a
// flag (present with value "1" when paused) and a version counter. SetPaused
// changes both in one MULTI/EXEC, then publishes "<0|1>:<version>".
//
// A snapshot only moves to a newer version. The version key must therefore
// never go backwards. Should Valkey lose it, SetPaused fails with
// ErrVersionBehind, and the replicas, whose reconciles now read only older
// versions (counted in Stats.ServerBehind, confirming nothing), fail
// closed once MaxAge passes, until an operator sets the version above
// theirs or restarts them. A write that cannot be applied fails loudly.
//
// Check, the message path's call, is safe for concurrent use and does one
// atomic load: no lock, no allocation, no Valkey command.
type Pause struct {
	c                      valkey.Client
	flagKey, versionKey    string
	events                 Events
	changedKey             string // the writer's wall time of the last change, Unix ms
	untilKey               string // when a timed pause ends, Unix ms on the server's clock
	onPropagation          func(time.Duration)
	measured               atomic.Int64 // the last version whose propagation was measured
	propagations           atomic.Int64 // reported to onPropagation
	propagated             atomic.Int64 // the newest version reported to onPropagation
	every, maxAge, timeout time.Duration
	lastKnownGood          bool
	elapsed                func() time.Duration
	now                    func() time.Time
	// timer and draw are the reconciler's clock and its jitter's random
	// source (realTimer and rand.Float64; a test's own in the tests).
	timer func(time.Duration) (<-chan time.Time, func() bool)
	draw  func() float64

	snap atomic.Pointer[snapshot]

	mu      sync.Mutex // serialises writers of snap; Check never takes it
	pending *snapshot  // newest event seen before the initial load

	subscribed chan struct{} // closed at the first confirmed subscription
	subOnce    sync.Once
	kick       chan struct{} // asks the reconciler to run now (after a resubscribe)
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	started    atomic.Bool
	closeOnce  sync.Once

	loaded                                                                atomic.Int64 // the version the initial load read
	loadedSet                                                             atomic.Bool
	applied, ignored, malformedEvents, reconciles, failures, behind, subs atomic.Int64
	lastErr                                                               atomic.Pointer[string]
}

// LossyEvents passes Events' events through unless Drop is set: a replica
// that loses its pause events, for tests and fault drills (it learns of a
// change only at its next reconcile).
type LossyEvents struct {
	Events
	Drop *atomic.Bool
}

// Listen implements Events.
func (d LossyEvents) Listen(ctx context.Context, subscribed func(), deliver func(string)) {
	d.Events.Listen(ctx, subscribed, func(m string) {
		if !d.Drop.Load() {
			deliver(m)
		}
	})
}

// Keys is the pause state's keys under prefix: the flag, the version and
// the time of the last change, in one cluster slot.
func Keys(prefix string) []string {
	return []string{prefix + "pause:{pause}:flag", prefix + "pause:{pause}:version", prefix + "pause:{pause}:changed", prefix + "pause:{pause}:until"}
}

// New returns a Pause on c. It is not ready, and Check fails, until
// Start has loaded the state.
func New(c valkey.Client, cfg Config) *Pause {
	cfg = cfg.WithDefaults()
	if cfg.Elapsed == nil {
		origin := time.Now()
		cfg.Elapsed = func() time.Duration { return time.Since(origin) }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Pause{
		c:             c,
		flagKey:       Keys(cfg.Prefix)[0],
		versionKey:    Keys(cfg.Prefix)[1],
		changedKey:    Keys(cfg.Prefix)[2],
		untilKey:      Keys(cfg.Prefix)[3],
		onPropagation: cfg.OnPropagation,
		events:        cfg.Events,
		lastKnownGood: cfg.LastKnownGood,
		every:         cfg.ReconcileEvery, maxAge: cfg.MaxAge, timeout: cfg.Timeout, elapsed: cfg.Elapsed, now: cfg.Now,
		timer:      realTimer,
		draw:       rand.Float64,
		subscribed: make(chan struct{}),
		kick:       make(chan struct{}, 1),
		ctx:        ctx, cancel: cancel,
	}
}

// Start subscribes to pause events, then loads the stored state, then starts
// the reconciler, in that order: an event published between the load and the
// subscription cannot be missed. It returns once the replica is ready (Check
// answers from a snapshot), or with an error; call Close either way.
func (p *Pause) Start(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("outgress: Pause started twice")
	}
	if p.events == nil {
		return ErrNoEvents
	}
	p.wg.Add(1)
	go p.listen()
	select {
	case <-p.subscribed:
	case <-ctx.Done():
		return fmt.Errorf("outgress: subscribing to pause events: %w", ctx.Err())
	case <-p.ctx.Done():
		return errors.New("outgress: Pause closed while starting")
	}
	if err := p.reconcile(ctx); err != nil {
		return fmt.Errorf("outgress: loading the pause state: %w", err)
	}
	if cur := p.snap.Load(); cur != nil {
		p.loaded.Store(cur.version)
		p.measured.Store(cur.version)
	}
	p.loadedSet.Store(true)
	p.wg.Add(1)
	go p.reconcileLoop()
	return nil
}

// SetPaused's write is the plan's native transaction: on one dedicated
// connection, WATCH the version key and read the state (MGET of the flag
// and the version, and TIME for a timed pause), then, if Valkey holds the
// edit's expected version, MULTI, INCR the version, SET or DEL the flag,
// DEL the old end (and SET the new one), SET the change's time, EXEC. The
// WATCH makes the version check hold until EXEC: a write of the version
// between the read and EXEC aborts the transaction (EXEC answers nil), and
// nothing is written. INCR comes first so that a server refusing writes
// (OOM) refuses it while queueing, and EXEC then discards the whole
// transaction (EXECABORT). A timed pause ends on the server's clock: its
// flag and its end expire at the end (PXAT, from the TIME read under the
// WATCH), so a lookup, a reconcile and a replica that starts later all
// read it as ended, with no write.

// writeResult is what the transaction did: written, the new version and
// the end (Unix ms, 0 for none); not written, the version Valkey holds
// and whether it is paused.
type writeResult struct {
	written      bool
	version, end int64
	heldPaused   bool
}

func (p *Pause) write(ctx context.Context, paused bool, ms, expected int64) (res writeResult, err error) {
	err = p.c.Dedicated(func(d valkey.DedicatedClient) error {
		b := d.B()
		read := valkey.Commands{b.Watch().Key(p.versionKey).Build(), b.Mget().Key(p.flagKey, p.versionKey).Build()}
		if ms > 0 {
			read = append(read, b.Time().Build())
		}
		replies := d.DoMulti(ctx, read...)
		for _, r := range replies {
			if err := r.Error(); err != nil {
				return err
			}
		}
		held, heldPaused, err := storedVersion(replies[1])
		if err != nil {
			return err
		}
		if held != expected {
			res = writeResult{version: held, heldPaused: heldPaused}
			return d.Do(ctx, b.Unwatch().Build()).Error()
		}
		tx := valkey.Commands{b.Multi().Build(), b.Incr().Key(p.versionKey).Build(), b.Del().Key(p.untilKey).Build()}
		switch {
		case paused && ms > 0:
			now, err := replies[2].AsIntSlice() // seconds, microseconds
			if err != nil || len(now) != 2 {
				return fmt.Errorf("outgress: TIME: %v %v", now, err)
			}
			res.end = now[0]*1000 + now[1]/1000 + ms
			at := strconv.FormatInt(res.end, 10)
			tx = append(tx, b.Set().Key(p.flagKey).Value("1").Pxat(time.UnixMilli(res.end)).Build(), b.Set().Key(p.untilKey).Value(at).Pxat(time.UnixMilli(res.end)).Build())
		case paused:
			tx = append(tx, b.Set().Key(p.flagKey).Value("1").Build())
		default:
			tx = append(tx, b.Del().Key(p.flagKey).Build())
		}
		tx = append(tx, b.Set().Key(p.changedKey).Value(strconv.FormatInt(p.now().UnixMilli(), 10)).Build(), b.Exec().Build())
		out := d.DoMulti(ctx, tx...)
		exec := out[len(out)-1]
		if valkey.IsValkeyNil(exec.Error()) || exec.Error() == nil && isNilArray(exec) {
			// The WATCH fired: another writer changed the version after
			// the read. Nothing was written; report what it holds now.
			vals := d.Do(ctx, b.Mget().Key(p.flagKey, p.versionKey).Build())
			if res.version, res.heldPaused, err = storedVersion(vals); err != nil {
				return err
			}
			return nil
		}
		for _, r := range out { // a refused command (OOM) fails its queueing and EXEC (EXECABORT)
			if err := r.Error(); err != nil {
				return err
			}
		}
		results, err := exec.ToArray()
		if err != nil {
			return err
		}
		if res.version, err = results[0].AsInt64(); err != nil {
			return fmt.Errorf("outgress: pause version not incremented: %w", err)
		}
		res.written = true
		return nil
	})
	return res, err
}

func isNilArray(r valkey.ValkeyResult) bool {
	a, err := r.ToArray()
	return err == nil && a == nil
}

// storedVersion parses an MGET of the flag and the version.
func storedVersion(r valkey.ValkeyResult) (version int64, paused bool, err error) {
	vals, err := r.ToArray()
	if err != nil {
		return 0, false, err
	}
	if len(vals) != 2 {
		return 0, false, fmt.Errorf("outgress: pause read: MGET returned %d values, want 2", len(vals))
	}
	if !vals[1].IsNil() {
		s, _ := vals[1].ToString()
		if version, err = strconv.ParseInt(s, 10, 64); err != nil || version < 0 {
			return 0, false, fmt.Errorf("outgress: pause version %q is not a counter", s)
		}
	}
	return version, !vals[0].IsNil(), nil
}

// FlagKey is the key of the stored pause flag ("1" when paused).
func (p *Pause) FlagKey() string { return p.flagKey }

// Stored reads the stored state from Valkey (one MGET of the flag and the
// version): the strong answer, whatever this replica's snapshot holds. A
// timed pause past its end reads as running: its flag has expired.
func (p *Pause) Stored(ctx context.Context) (paused bool, version int64, err error) {
	s, err := p.StoredState(ctx)
	return s.Paused, s.Version, err
}

// StoredState is Stored with a timed pause's end (Snapshot.Until); its
// Confirmed is zero.
func (p *Pause) StoredState(ctx context.Context) (Snapshot, error) {
	vals, err := p.c.Do(ctx, p.c.B().Mget().Key(p.flagKey, p.versionKey, p.untilKey).Build()).ToArray()
	if err != nil {
		return Snapshot{}, fmt.Errorf("outgress: pause lookup: %w", err)
	}
	if len(vals) != 3 {
		return Snapshot{}, fmt.Errorf("outgress: pause lookup: MGET returned %d values, want 3", len(vals))
	}
	var s Snapshot
	if !vals[1].IsNil() {
		if s.Version, err = vals[1].AsInt64(); err != nil {
			return Snapshot{}, fmt.Errorf("outgress: pause version is not a counter: %w", err)
		}
	}
	s.Paused = !vals[0].IsNil()
	if ms, err := vals[2].AsInt64(); s.Paused && err == nil {
		s.Until = time.UnixMilli(ms)
	}
	return s, nil
}

// Lookup reads the stored flag from Valkey (one GET): the strong answer,
// not the snapshot's. It is the message path of a worker whose versioned
// snapshot step is off (worker.StepPauseSnapshot), and what a status
// request should answer from.
func (p *Pause) Lookup(ctx context.Context) (paused bool, err error) {
	flag, err := p.c.Do(ctx, p.c.B().Get().Key(p.flagKey).Build()).ToString()
	switch {
	case valkey.IsValkeyNil(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("outgress: pause lookup: %w", err)
	}
	return flag == "1", nil
}

// Ready reports whether the initial state is loaded.
func (p *Pause) Ready() bool { return p.snap.Load() != nil }

// Check is the message path's question: may I send now? It returns nil,
// ErrPaused, ErrPauseNotReady, or ErrPauseStale once Valkey last confirmed
// the state more than MaxAge ago on the monotonic clock (never with
// Config.LastKnownGood).
func (p *Pause) Check() error {
	s := p.snap.Load()
	switch {
	case s == nil:
		return ErrPauseNotReady
	case !p.lastKnownGood && p.elapsed()-s.confirmed > p.maxAge:
		return ErrPauseStale
	case s.paused && (s.until == 0 || p.now().UnixMilli() < s.until):
		return ErrPaused
	}
	return nil
}

// Snapshot returns the current state; ok is false before the initial load.
func (p *Pause) Snapshot() (s Snapshot, ok bool) {
	cur := p.snap.Load()
	if cur == nil {
		return Snapshot{}, false
	}
	snap := Snapshot{Paused: cur.paused, Version: cur.version, Confirmed: cur.wall}
	if cur.paused && cur.until != 0 {
		snap.Until = time.UnixMilli(cur.until)
		snap.Paused = p.now().UnixMilli() < cur.until
	}
	return snap, true
}

// Age is how long ago, on the monotonic clock, Valkey last confirmed the
// state; 0 before the load.
func (p *Pause) Age() time.Duration {
	if cur := p.snap.Load(); cur != nil {
		return p.elapsed() - cur.confirmed
	}
	return 0
}

// Stats returns the counters.
func (p *Pause) Stats() Stats {
	s := Stats{
		EventsApplied: p.applied.Load(), EventsIgnored: p.ignored.Load(), EventsMalformed: p.malformedEvents.Load(),
		Reconciles: p.reconciles.Load(), ReconcileFailures: p.failures.Load(),
		ServerBehind: p.behind.Load(), Subscriptions: p.subs.Load(),
		Propagations: p.propagations.Load(), PropagatedVersion: p.propagated.Load(),
	}
	if e := p.lastErr.Load(); e != nil {
		s.LastReconcileError = *e
	}
	return s
}

// SetPaused stores the new state and a new version, if Valkey still holds
// version expected (the version the caller's view was read at: Snapshot,
// Stored, or a status request; 0 before the first write), in one
// WATCH/MULTI/EXEC transaction (see write); then it updates this replica
// and publishes the event. It returns the
// new version. An edit against any other version writes nothing and
// returns an error wrapping ErrVersionConflict that names both versions:
// of two writers racing from one view, one wins and the other fails loudly.
//
// If the write fails, nothing is applied or published. If ctx ends with the
// EXEC in flight, it may or may not have run: SetPaused reports the
// error, applies and publishes nothing, and reconciliation converges every
// replica on whatever Valkey holds. If only the publish fails, the error
// wraps ErrNotPublished, and the version is returned.
//
// This replica's own reconcile may read the write back between the
// EXEC and the rest of SetPaused (a loaded machine delays the caller): a
// snapshot of the version written, in the state written, confirmed after
// the transaction was sent, is this write, and SetPaused goes on to publish it.
// Otherwise, if the version written is not newer than the one this replica
// holds, Valkey has lost the version key (or a later write overtook this
// one): no replica would apply it. SetPaused then applies and publishes
// nothing and returns an error wrapping ErrOvertaken when Valkey's version
// has moved past this write's since (another writer won the race: the
// fleet follows it), or ErrVersionBehind when it has not. In that second
// case the replicas' reconciles read an older version, which confirms
// nothing, so the whole fleet fails closed (ErrPauseStale) once MaxAge
// passes, until an operator sets the version key above the replicas' (the
// error names the key and the version) or restarts them.
func (p *Pause) SetPaused(ctx context.Context, paused bool, expected int64) (int64, error) {
	return p.set(ctx, paused, 0, expected)
}

// PauseFor pauses for d, an edit made against version expected, as
// SetPaused(ctx, true, expected) does, except that the pause ends on its
// own d later (on the server's clock): every replica stops acting on it
// then (Snapshot.Until says when), and so does one started later, with no
// write and no event. It is ended once, by the clock: a late event of its
// version cannot revive it, and an operator who ends it sooner makes an
// edit of its own (SetPaused(false) against its version). d is rounded up
// to the millisecond. A d longer than MaxPauseFor is refused with an
// error wrapping ErrPauseTooLong, writing nothing.
func (p *Pause) PauseFor(ctx context.Context, d time.Duration, expected int64) (int64, error) {
	if err := CheckPauseFor(d); err != nil {
		return 0, err
	}
	return p.set(ctx, true, int64((d+time.Millisecond-1)/time.Millisecond), expected)
}

// MaxPauseFor is the longest timed pause PauseFor accepts: a pause meant
// to last longer is an open pause (SetPaused), ended by an edit, so that
// nobody is surprised by a fleet that resumes on its own days later.
const MaxPauseFor = 24 * time.Hour

// ErrPauseTooLong is returned (wrapped) by PauseFor and CheckPauseFor for a
// duration past MaxPauseFor.
var ErrPauseTooLong = errors.New("outgress: timed pause longer than the maximum")

// CheckPauseFor returns nil if d is a timed pause's duration PauseFor
// accepts (positive, at most MaxPauseFor), otherwise an error saying why.
func CheckPauseFor(d time.Duration) error {
	switch {
	case d <= 0:
		return fmt.Errorf("outgress: PauseFor(%v): the duration must be positive; use SetPaused for a pause without an end", d)
	case d > MaxPauseFor:
		return fmt.Errorf("%w: PauseFor(%v) is past the %v limit; pause without an end (SetPaused) and resume by an edit instead", ErrPauseTooLong, d, MaxPauseFor)
	}
	return nil
}

func (p *Pause) set(ctx context.Context, paused bool, ms, expected int64) (int64, error) {
	sent := p.elapsed()
	res, err := p.write(ctx, paused, ms, expected)
	if err != nil {
		return 0, fmt.Errorf("outgress: pause not changed: %w", err)
	}
	version, ends := res.version, res.end
	if !res.written {
		state := "resumed"
		if res.heldPaused {
			state = "paused"
		}
		return 0, fmt.Errorf("%w: this edit was made against version %d, Valkey holds version %d (%s); nothing written: "+
			"read the state again (mgmt status) and repeat the edit against version %d if it still stands", ErrVersionConflict, expected, version, state, version)
	}
	b := p.c.B()
	if held, ok := p.confirm(paused, ends, version, &sent); !ok {
		// Either another writer's change overtook this one (Valkey's
		// version has moved past ours), or Valkey lost the keys (it has not).
		vals, err := p.c.Do(ctx, b.Mget().Key(p.flagKey, p.versionKey).Build()).ToArray()
		if err == nil && len(vals) == 2 {
			if stored, err := vals[1].AsInt64(); err == nil && stored > version {
				state := "resumed"
				if !vals[0].IsNil() {
					state = "paused"
				}
				return version, fmt.Errorf("%w: this call wrote version %d, another writer then wrote version %d (%s), which this replica "+
					"already holds (%d) and the fleet follows; to make this call's state stick, call SetPaused again", ErrOvertaken, version, stored, state, held)
			}
		}
		return version, fmt.Errorf("%w: wrote version %d but this replica holds %d, so no replica applies it; "+
			"replicas fail closed within %v unless %s is set above %d", ErrVersionBehind, version, held, p.maxAge, p.versionKey, held)
	}
	msg := encodePauseEvent(paused, ends, version)
	if err := p.events.Publish(ctx, msg); err != nil {
		return version, fmt.Errorf("%w (version %d; other replicas reconcile within %v): %w", ErrNotPublished, version, p.every, err)
	}
	return version, nil
}

// Close stops the subscriber and the reconciler and waits for both. The last
// snapshot stays readable; it fails closed once older than MaxAge.
func (p *Pause) Close() {
	p.closeOnce.Do(func() {
		p.cancel()
		p.wg.Wait()
	})
}

// listen runs the event subscription until Close. After every
// resubscription it asks for a reconcile, because events published while
// it was away are lost.
func (p *Pause) listen() {
	defer p.wg.Done()
	p.events.Listen(p.ctx, func() {
		if p.subs.Add(1) == 1 {
			p.subOnce.Do(func() { close(p.subscribed) })
			return
		}
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}, p.onEvent)
}

func (p *Pause) onEvent(msg string) {
	paused, until, version, ok := decodePauseEvent(msg)
	if !ok {
		p.malformedEvents.Add(1)
		return
	}
	p.applyEvent(paused, until, version)
}

func (p *Pause) reconcileLoop() {
	defer p.wg.Done()
	for {
		fired, stop := p.timer(p.jittered())
		select {
		case <-p.ctx.Done():
			stop()
			return
		case <-fired:
		case <-p.kick:
			stop()
		}
		p.reconcile(p.ctx) // failures are counted and exposed; Check fails closed once too old
	}
}

// jittered is the wait before the next reconcile: ReconcileEvery, moved
// by up to ±jitter of it, uniformly (draw is in [0, 1)).
func (p *Pause) jittered() time.Duration {
	return time.Duration(float64(p.every) * (1 - jitter + 2*jitter*p.draw()))
}

// realTimer is the reconciler's timer: a channel that fires after d, and
// its stop.
func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// jitter is the reconcile interval's spread either side of ReconcileEvery.
const jitter = 0.2

// LongestGap is the longest a replica can go between a change stored in
// Valkey and its reconcile's reading of it when the change's event is
// lost: the longest reconcile interval (ReconcileEvery + 20%) and the
// reconcile's Timeout. The defaults apply where cfg's fields are zero.
func (cfg Config) LongestGap() time.Duration {
	cfg = cfg.WithDefaults()
	return time.Duration(float64(cfg.ReconcileEvery)*(1+jitter)) + cfg.Timeout
}

// reconcile reads the stored state with one MGET and applies it.
func (p *Pause) reconcile(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	vals, err := p.c.Do(ctx, p.c.B().Mget().Key(p.flagKey, p.versionKey, p.changedKey, p.untilKey).Build()).ToArray()
	if err == nil {
		err = p.confirmFrom(vals)
	}
	if err != nil {
		p.failures.Add(1)
		msg := err.Error()
		p.lastErr.Store(&msg)
		return err
	}
	p.reconciles.Add(1)
	return nil
}

func (p *Pause) confirmFrom(vals []valkey.ValkeyMessage) error {
	if len(vals) != 4 {
		return fmt.Errorf("outgress: MGET returned %d values, want 4", len(vals))
	}
	paused := false
	if !vals[0].IsNil() {
		flag, err := vals[0].ToString()
		if err != nil || flag != "1" {
			return fmt.Errorf("outgress: pause flag %q is not \"1\"", flag)
		}
		paused = true
	}
	var version int64
	if !vals[1].IsNil() {
		s, err := vals[1].ToString()
		if err == nil {
			version, err = strconv.ParseInt(s, 10, 64)
		}
		if err != nil || version < 0 {
			return fmt.Errorf("outgress: pause version %q is not a counter", s)
		}
	}
	var ends int64
	if paused && !vals[3].IsNil() {
		var err error
		if ends, err = vals[3].AsInt64(); err != nil || ends <= 0 {
			return fmt.Errorf("outgress: pause end %v is not a time in Unix ms", vals[3])
		}
	}
	if held, ok := p.confirm(paused, ends, version, nil); !ok {
		return fmt.Errorf("%w: read version %d, this replica holds %d; not a confirmation", ErrVersionBehind, version, held)
	}
	p.measure(version, vals[2])
	return nil
}

// measure reports the propagation of version, which this replica holds
// now, once: from the time its writer stored (changed, nil when it stored
// none) to when this replica first acted on it.
func (p *Pause) measure(version int64, changed valkey.ValkeyMessage) {
	if p.onPropagation == nil || !p.loadedSet.Load() || changed.IsNil() || p.measured.Load() >= version {
		return
	}
	cur := p.snap.Load()
	ms, err := changed.AsInt64()
	if cur == nil || cur.version != version || err != nil {
		return
	}
	p.measured.Store(version)
	if p.snapshotsSinceStart(version) {
		p.onPropagation(max(cur.applied.Sub(time.UnixMilli(ms)), 0))
		p.propagations.Add(1)
		p.propagated.Store(version)
	}
}

// snapshotsSinceStart reports whether version changed while this replica
// ran: the version it loaded at start is not a propagation.
func (p *Pause) snapshotsSinceStart(version int64) bool { return version > p.loaded.Load() }

// confirm applies a state read from (or written to) Valkey just now. A
// read (written nil) may equal the snapshot's version; a write, sent at
// *written on the Elapsed clock, must exceed it, unless the snapshot holds
// this very write: the same version and state, confirmed by a read since
// the write was sent. ok is false when the snapshot already holds a
// version at least that new (held): the read raced a newer event, or the
// version key went backwards (data loss). That is counted in ServerBehind
// and is no confirmation: the snapshot keeps its state and its
// confirmation time, so a replica whose Valkey lost the version ages into
// failing closed instead of sending on. (A read that merely raced an event is followed by a
// current one at the next reconcile.)
func (p *Pause) confirm(paused bool, until, version int64, written *time.Duration) (held int64, ok bool) {
	at, wall := p.elapsed(), p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.snap.Load()
	if cur == nil && p.pending != nil {
		// The initial load, with an event that arrived between subscribe
		// and load: the newer of the two wins, and the load confirms it
		// (the subscription was live before the read was sent).
		pend := p.pending
		p.pending = nil
		if pend.version > version {
			p.behind.Add(1)
			paused, until, version = pend.paused, pend.until, pend.version
		}
	}
	readBack := cur != nil && written != nil && cur.version == version && cur.paused == paused && cur.confirmed >= *written
	if cur != nil && (cur.version > version || written != nil && cur.version == version && !readBack) {
		p.behind.Add(1)
		return cur.version, false
	}
	applied := wall
	if cur != nil && cur.version == version {
		applied = cur.applied
	}
	p.snap.Store(&snapshot{paused: paused, until: until, version: version, confirmed: at, wall: wall, applied: applied})
	return version, true
}

// applyEvent applies an event if it is newer than the snapshot.
func (p *Pause) applyEvent(paused bool, until, version int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.snap.Load()
	if cur == nil {
		if p.pending == nil || version > p.pending.version {
			p.pending = &snapshot{paused: paused, until: until, version: version}
			p.applied.Add(1)
		} else {
			p.ignored.Add(1)
		}
		return
	}
	if version <= cur.version {
		p.ignored.Add(1)
		return
	}
	p.applied.Add(1)
	p.snap.Store(&snapshot{paused: paused, until: until, version: version, confirmed: cur.confirmed, wall: cur.wall, applied: p.now()})
}

// The event format is "<0|1>:<version>", for example "1:42", and
// "1:<version>:<end>" for a timed pause, its end in Unix ms, for example
// "1:43:1764640000000".
func encodePauseEvent(paused bool, until, version int64) string {
	flag := "0:"
	if paused {
		flag = "1:"
	}
	msg := flag + strconv.FormatInt(version, 10)
	if paused && until > 0 {
		msg += ":" + strconv.FormatInt(until, 10)
	}
	return msg
}

func decodePauseEvent(s string) (paused bool, until, version int64, ok bool) {
	flag, rest, found := strings.Cut(s, ":")
	if !found || (flag != "0" && flag != "1") {
		return false, 0, 0, false
	}
	v, end, timed := strings.Cut(rest, ":")
	version, err := strconv.ParseInt(v, 10, 64)
	if err != nil || version < 0 {
		return false, 0, 0, false
	}
	if timed {
		if until, err = strconv.ParseInt(end, 10, 64); err != nil || until <= 0 || flag != "1" {
			return false, 0, 0, false
		}
	}
	return flag == "1", until, version, true
}

// ReconnectPoll is how often NATSEvents.Listen looks for a reconnect of its
// connection.
const ReconnectPoll = 20 * time.Millisecond

// watchReconnects calls subscribed after each reconnect of e.Conn, once a
// flush has confirmed that the server has the subscription again, until
// ctx ends.
func (e *NATSEvents) watchReconnects(ctx context.Context, subscribed func()) {
	seen := e.Conn.Stats().Reconnects
	tick := time.NewTicker(ReconnectPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n := e.Conn.Stats().Reconnects
		if n == seen || !e.Conn.IsConnected() {
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := e.Conn.FlushWithContext(fctx)
		cancel()
		if err == nil {
			seen = n
			subscribed()
		}
	}
}

// NATSEvents are pause events on a dedicated NATS subject (core NATS, not
// the stream): the plan's invalidation channel. A NATS connection keeps its
// subscriptions across reconnects, but events published while it was away
// are lost: on every reconnect Listen confirms the subscription again and
// reports it, and the Pause reconciles at once.
type NATSEvents struct {
	Conn    *nats.Conn
	Subject string // for example "outgress.pause"
}

// Publish sends one event and flushes it to the server, within ctx's
// deadline, or 5 s when ctx has none.
func (e *NATSEvents) Publish(ctx context.Context, msg string) error {
	if err := e.Conn.Publish(e.Subject, []byte(msg)); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok { // FlushWithContext refuses a context without one
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	return e.Conn.FlushWithContext(ctx)
}

// Listen subscribes, confirms the subscription with the server (a flush),
// reports it, and delivers events until ctx ends. After each reconnect of
// the connection (seen within ReconnectPoll), it confirms the
// subscription again and reports it again.
func (e *NATSEvents) Listen(ctx context.Context, subscribed func(), deliver func(string)) {
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := minBackoff
	for ctx.Err() == nil {
		sub, err := e.Conn.Subscribe(e.Subject, func(m *nats.Msg) { deliver(string(m.Data)) })
		if err == nil {
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = e.Conn.FlushWithContext(fctx)
			cancel()
			if err == nil {
				subscribed()
				e.watchReconnects(ctx, subscribed)
				sub.Unsubscribe()
				return
			}
			sub.Unsubscribe()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}
