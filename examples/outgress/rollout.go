package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/canary"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/demo"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/examples/outgress/worker"
	"github.com/nats-io/nats.go"
	"github.com/valkey-io/valkey-go"
)

// A fleetReplica is one replica of the rollout: its own client, metrics
// registry served on /metrics, pause snapshot, channel cache, fake Helix
// server and worker. Its worker can be replaced between windows (a deploy
// of other switches) without stopping its bus consumers.
type fleetReplica struct {
	name     string
	raw      valkey.Client
	client   *counting.Client
	met      *metrics.Metrics
	url      string
	stop     func()
	pause    *pause.Pause
	channels *channels.Cache
	fake     *helix.Fake
	helixes  []*helix.Helix
	worker   atomic.Pointer[worker.Worker]
	bus      *bus.Bus
	events   *nats.Conn  // the pause events' connection
	drop     atomic.Bool // pause events dropped
}

// droppingEvents passes pause events through unless drop is set: a replica
// that loses its events (the canary of the propagation gate's test).
type droppingEvents struct {
	pause.Events
	drop *atomic.Bool
}

func (d droppingEvents) Listen(ctx context.Context, subscribed func(), deliver func(string)) {
	d.Events.Listen(ctx, subscribed, func(m string) {
		if !d.drop.Load() {
			deliver(m)
		}
	})
}

// fleet is a baseline and a canary replica on one Valkey and one bus.
type fleet struct {
	cfg       fleetConfig
	baseline  *fleetReplica
	canary    *fleetReplica
	publisher *bus.Bus
	busCfg    bus.Config
	operator  *pause.Pause // the operator's pause writer
	opClient  valkey.Client
	opEvents  *nats.Conn
	subject   string // the pause events' NATS subject
	admin     valkey.Client
	finals    atomic.Int64
}

// fleetConfig shapes a fleet.
type fleetConfig struct {
	Dial     func() (valkey.Client, error)
	NATSURL  string
	Prefix   string
	Channels int
	// CanaryPause configures the canary's pause snapshot (the baseline's
	// takes the defaults); Prefix and OnPropagation are set by the fleet.
	CanaryPause pause.Config
	// CanaryLosesEvents drops every pause event the canary receives.
	CanaryLosesEvents bool
}

// startFleet starts both replicas (every step off) and the stream.
func startFleet(ctx context.Context, cfg fleetConfig) (_ *fleet, err error) {
	f := &fleet{cfg: cfg}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if f.admin, err = cfg.Dial(); err != nil {
		return nil, err
	}
	if err := demo.SeedChannels(ctx, f.admin, cfg.Prefix, cfg.Channels); err != nil {
		return nil, fmt.Errorf("seeding channels: %w", err)
	}
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	f.busCfg = bus.Config{
		Stream:   "OUTGRESS_ROLLOUT_" + run,
		Subjects: []string{"outgress-rollout-" + run + ".standard", "outgress-rollout-" + run + ".premium", "outgress-rollout-" + run + ".system"},
		Observe: func(m *bus.Message, o bus.Outcome, reason uint8) {
			if o.Final() {
				f.finals.Add(1)
			}
		},
	}
	for _, p := range []pause.Config{{}, cfg.CanaryPause} {
		if err := worker.CheckTiming(worker.Config{}, f.busCfg, p); err != nil {
			return nil, err
		}
	}
	if f.publisher, err = bus.Connect(ctx, cfg.NATSURL, "outgress-rollout-publisher", f.busCfg); err != nil {
		return nil, err
	}
	if err := bus.Setup(ctx, f.publisher.JetStream(), f.busCfg); err != nil {
		return nil, err
	}
	if f.opClient, err = cfg.Dial(); err != nil {
		return nil, err
	}
	f.subject = "outgress-rollout-" + run + ".pause"
	if f.opEvents, err = nats.Connect(cfg.NATSURL, nats.Name("outgress-rollout-operator")); err != nil {
		return nil, err
	}
	f.operator = pause.New(f.opClient, pause.Config{Prefix: cfg.Prefix, NATS: f.opEvents, Subject: f.subject})
	if err := f.operator.Start(ctx); err != nil {
		return nil, err
	}
	for _, name := range []string{"baseline", "canary"} {
		r, err := f.startReplica(ctx, name)
		if err != nil {
			return nil, err
		}
		if name == "baseline" {
			f.baseline = r
		} else {
			f.canary = r
		}
	}
	return f, nil
}

func (f *fleet) startReplica(ctx context.Context, name string) (*fleetReplica, error) {
	raw, err := f.cfg.Dial()
	if err != nil {
		return nil, err
	}
	r := &fleetReplica{name: name, raw: raw, client: &counting.Client{Client: raw}, met: metrics.New(), fake: helix.StartFake()}
	if r.events, err = nats.Connect(f.cfg.NATSURL, nats.Name("outgress-rollout-"+name+"-pause")); err != nil {
		return r, err
	}
	pcfg := pause.Config{}
	if name == "canary" {
		pcfg = f.cfg.CanaryPause
		r.drop.Store(f.cfg.CanaryLosesEvents)
	}
	pcfg.Prefix, pcfg.OnPropagation = f.cfg.Prefix, r.met.PausePropagation
	pcfg.Events = droppingEvents{Events: &pause.NATSEvents{Conn: r.events, Subject: f.subject}, drop: &r.drop}
	r.pause = pause.New(r.client, pcfg)
	if err := r.met.RegisterPause(name, r.pause); err != nil {
		return r, err
	}
	if err := r.pause.Start(ctx); err != nil {
		return r, fmt.Errorf("replica %s: %w", name, err)
	}
	r.channels = channels.New(r.client, channels.Config{Prefix: f.cfg.Prefix})
	if r.url, r.stop, err = r.met.Serve(""); err != nil {
		return r, err
	}
	if err := f.deploy(r, worker.AllSteps, worker.Config{}); err != nil {
		return r, err
	}
	bcfg := f.busCfg
	bcfg.Observe = func(m *bus.Message, o bus.Outcome, reason uint8) {
		r.met.Delivery(m, o, reason)
		f.busCfg.Observe(m, o, reason)
	}
	if r.bus, err = bus.Connect(ctx, f.cfg.NATSURL, "outgress-rollout-"+name, bcfg); err != nil {
		return r, err
	}
	for lane := range limits.NumLanes {
		if err := r.bus.Consume(ctx, f.busCfg.Subjects[lane], laneWorkers[lane], func(ctx context.Context, m *bus.Message) error {
			_, err := r.worker.Load().Process(ctx, lane, m)
			return err
		}); err != nil {
			return r, err
		}
	}
	return r, nil
}

// fleetWorkers is the workers of one replica, the most limiter calls it can
// have in flight.
func fleetWorkers() int {
	n := 0
	for _, w := range laneWorkers {
		n += w
	}
	return n
}

// deploy gives r a worker with the steps in off switched off, and the
// faults in faults (its DoubleChargeShared and ExtraPauseLookup).
func (f *fleet) deploy(r *fleetReplica, off worker.Steps, faults worker.Config) error {
	concurrency := 0
	for _, n := range laneWorkers {
		concurrency += n
	}
	hx, err := helix.New(helix.Config{BaseURL: r.fake.URL, ClientID: "demo", Token: "demo", BotID: botID,
		Concurrency: concurrency, TraceEvery: 1, LegacyTransport: (worker.AllSteps &^ off).HelixLegacy()}, r.met)
	if err != nil {
		return err
	}
	r.helixes = append(r.helixes, hx)
	lim := admit.New(r.client, admit.WithObserver(r.met.ObserveLimiter))
	w := worker.New(lim, r.pause, r.channels, hx, r.met, worker.Config{Prefix: f.cfg.Prefix, Off: off,
		DoubleChargeShared: faults.DoubleChargeShared, ExtraPauseLookup: faults.ExtraPauseLookup})
	r.worker.Store(w)
	return nil
}

func (r *fleetReplica) close() {
	if r == nil {
		return
	}
	if r.bus != nil {
		r.bus.Close()
	}
	if r.stop != nil {
		r.stop()
	}
	if r.pause != nil {
		r.pause.Close()
	}
	for _, h := range r.helixes {
		h.Close()
	}
	if r.events != nil {
		r.events.Close()
	}
	r.fake.Close()
	r.raw.Close()
}

func (f *fleet) close() {
	f.baseline.close()
	f.canary.close()
	if f.operator != nil {
		f.operator.Close()
	}
	if f.opClient != nil {
		f.opClient.Close()
	}
	if f.opEvents != nil {
		f.opEvents.Close()
	}
	if f.publisher != nil {
		f.publisher.JetStream().DeleteStream(context.Background(), f.busCfg.Stream)
		f.publisher.Close()
	}
	if f.admin != nil {
		demo.DeletePrefix(f.admin, f.cfg.Prefix)
		f.admin.Close()
	}
}

// windowConfig shapes one canary window.
type windowConfig struct {
	Rate     int           // messages a second
	Duration time.Duration // of publishing; the window runs Tail longer
	Tail     time.Duration
	Seed     uint64
	// PauseAt, when > 0, pauses sending that long into the window (from the
	// operator's writer) and resumes 100 ms later: the pause gates' change.
	PauseAt time.Duration
	// BeforePause, if set, runs before the pause (a test waits there for a
	// canary reconcile).
	BeforePause func()
	Bounds      canary.Bounds
	Server      canary.Server
}

// propagationWait is how long a window may go on past its publishing and
// tail for both replicas to measure its last pause change: each measures a
// change's propagation at its first reconcile after it, within 1.2 s with
// the default reconcile interval (2.4 s for the tests' slow canary).
const propagationWait = 3 * time.Second

// window publishes the demo's mix while canary.WatchUntil observes both
// replicas, and returns the gates' report. With a pause change (PauseAt),
// the window goes on until both replicas have measured the propagation of
// its last change (propagationWait at most), so that the propagation gate
// judges it.
func (f *fleet) window(ctx context.Context, wc windowConfig) (*canary.Report, error) {
	var wg sync.WaitGroup
	var win *canary.Window
	var werr, opErr error
	var last atomic.Int64 // the version of the window's last pause change
	measured := func() bool {
		v := last.Load()
		return wc.PauseAt <= 0 ||
			v > 0 && f.baseline.pause.Stats().PropagatedVersion >= v && f.canary.pause.Stats().PropagatedVersion >= v
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		win, werr = canary.WatchUntil(ctx, f.baseline.url, f.canary.url, wc.Duration+wc.Tail, 100*time.Millisecond, wc.Server, measured, propagationWait)
	}()
	if wc.PauseAt > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-time.After(wc.PauseAt):
			}
			if wc.BeforePause != nil {
				wc.BeforePause()
			}
			// A change stored but not published (ErrNotPublished) still
			// reaches the replicas, by their reconcile; another error is
			// the window's.
			for _, paused := range []bool{true, false} {
				v, err := f.operator.SetPaused(ctx, paused)
				if err != nil && !errors.Is(err, pause.ErrNotPublished) {
					opErr = fmt.Errorf("the operator's SetPaused(%v): %w", paused, err)
					return
				}
				if paused {
					time.Sleep(100 * time.Millisecond)
				} else {
					last.Store(v)
				}
			}
		}()
	}
	demo.Publish(ctx, f.publisher, f.busCfg.Subjects, wc.Rate, wc.Duration, f.cfg.Channels, wc.Seed)
	wg.Wait()
	if werr == nil {
		werr = opErr
	}
	if werr != nil {
		return nil, werr
	}
	return canary.Evaluate(win, wc.Bounds), nil
}

// valkeyServer counts script runs from INFO commandstats of c's server.
func valkeyServer(c valkey.Client) canary.Server {
	return canary.CommandStats(func(ctx context.Context) (string, error) {
		info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
		if err != nil || !strings.Contains(info, "cmdstat_") {
			return "", fmt.Errorf("no INFO commandstats (miniredis)")
		}
		return info, nil
	})
}

// rolloutResult is what the rollout demo printed, step by step.
type rolloutResult struct {
	steps   []string
	reports []*canary.Report
	where   string
}

// runRollout runs the rollout: a baseline with every step off and a canary
// that turns the six steps on one at a time, side by side on one Valkey and
// one bus, with the gate table after each step.
func runRollout(ctx context.Context, rate int, d time.Duration, out io.Writer) (*rolloutResult, error) {
	dial, where, stopServer, err := demo.Valkey()
	if err != nil {
		return nil, err
	}
	defer stopServer()
	natsURL, _, stopNATS, err := demo.NATS()
	if err != nil {
		return nil, err
	}
	defer stopNATS()
	f, err := startFleet(ctx, fleetConfig{Dial: dial, NATSURL: natsURL, Prefix: fmt.Sprintf("outgress-rollout:%x:", time.Now().UnixNano()), Channels: 40})
	if err != nil {
		return nil, err
	}
	defer f.close()
	res := &rolloutResult{where: where}
	if err := f.deploy(f.baseline, worker.AllSteps, worker.Config{}); err != nil {
		return nil, err
	}
	srv := valkeyServer(f.admin)
	on := worker.Steps(0)
	for i, step := range worker.StepList {
		on |= step
		if err := f.deploy(f.canary, worker.AllSteps&^on, worker.Config{}); err != nil {
			return nil, err
		}
		rep, err := f.window(ctx, windowConfig{Rate: rate, Duration: d, Tail: 300 * time.Millisecond, Seed: uint64(10 + i),
			PauseAt: d / 2, Server: srv, Bounds: canary.Bounds{InFlight: 2 * fleetWorkers()}})
		if err != nil {
			return nil, err
		}
		res.steps = append(res.steps, step.String())
		res.reports = append(res.reports, rep)
		if out != nil {
			fmt.Fprintf(out, "\nStep %d of 6: canary turns on %s (baseline: every step off)\n", i+1, step)
			rep.Print(out)
		}
	}
	return res, ctx.Err()
}
