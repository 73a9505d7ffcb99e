package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/canary"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/demo"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
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
	events   *nats.Conn   // the pause events' connection
	drop     atomic.Bool  // pause events dropped
	off      worker.Steps // the steps its worker runs with switched off
	deploys  int          // workers deployed, the first at its start
}

// fleet is a baseline replica and the replicas a roll deploys to (the
// canary first, then the rest) on one Valkey and one bus.
type fleet struct {
	cfg       fleetConfig
	baseline  *fleetReplica
	canary    *fleetReplica   // rolled[0]
	rolled    []*fleetReplica // the canary, then the rest of the fleet
	publisher *bus.Bus
	busCfg    bus.Config
	operator  *pause.Pause // the operator's pause writer
	opClient  valkey.Client
	opEvents  *nats.Conn
	subject   string // the pause events' NATS subject
	admin     valkey.Client
	finals    atomic.Int64 // final outcomes: messages finished
	seen      sync.Map     // of stream sequences with a settled delivery
	taken     atomic.Int64 // messages with a settled delivery: taken off the stream once
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
	// Replicas is how many replicas a roll deploys to, the canary first:
	// beside the baseline, which stays on the old version. Default 1.
	Replicas int
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
			// Whichever delivery settles first (a first delivery the
			// client dropped comes back after AckWait).
			if _, dup := f.seen.LoadOrStore(m.Seq, true); !dup {
				f.taken.Add(1)
			}
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
	names := []string{"baseline", "canary"}
	for i := 2; i <= cfg.Replicas; i++ {
		names = append(names, fmt.Sprintf("replica-%d", i))
	}
	for _, name := range names {
		r, err := f.startReplica(ctx, name)
		if r != nil && name != "baseline" {
			f.rolled = append(f.rolled, r) // closed with the fleet, started or not
		}
		if err != nil {
			return nil, err
		}
		if name == "baseline" {
			f.baseline = r
		}
	}
	f.canary = f.rolled[0]
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
	pcfg.Events = pause.LossyEvents{Events: &pause.NATSEvents{Conn: r.events, Subject: f.subject}, Drop: &r.drop}
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
		if err := r.bus.Consume(ctx, f.busCfg.Subjects[lane], fleetenv.LaneWorkers[lane], func(ctx context.Context, m *bus.Message) error {
			_, err := r.worker.Load().Process(ctx, lane, m)
			return err
		}); err != nil {
			return r, err
		}
	}
	return r, nil
}

// deploy gives r a worker with the steps in off switched off, and the
// faults in faults (its DoubleChargeShared and ExtraPauseLookup).
func (f *fleet) deploy(r *fleetReplica, off worker.Steps, faults worker.Config) error {
	hx, err := helix.New(helix.Config{BaseURL: r.fake.URL, ClientID: "demo", Token: "demo", BotID: demo.BotID,
		Concurrency: fleetenv.Workers(), TraceEvery: 1, LegacyTransport: (worker.AllSteps &^ off).HelixLegacy()}, r.met)
	if err != nil {
		return err
	}
	r.helixes = append(r.helixes, hx)
	lim := admit.New(r.client, admit.WithObserver(r.met.ObserveLimiter))
	w := worker.New(lim, r.pause, r.channels, hx, r.met, worker.Config{Prefix: f.cfg.Prefix, Off: off,
		DoubleChargeShared: faults.DoubleChargeShared, ExtraPauseLookup: faults.ExtraPauseLookup})
	r.worker.Store(w)
	r.off = off
	r.deploys++
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
	for _, r := range f.rolled {
		r.close()
	}
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
		demo.Forget(f.admin, f.cfg.Prefix, f.cfg.Channels)
		f.admin.Close()
	}
}

// windowConfig shapes one canary window. A window is sized by message
// counts, not by time: a loaded machine takes longer over it, and its gates
// judge as many messages.
type windowConfig struct {
	Rate     int // messages a second, at most
	Messages int // published in the window, at least
	// MinWarm: publishing goes on past Messages, Messages/2 at a time,
	// until each replica has admitted at least MinWarm messages with a
	// warm channel cache on the standard lane and on the premium lane in
	// the window (the commands-per-warm-message gates' samples, and the
	// Helix responses of the 429 gate's), 10 x Messages at most.
	MinWarm int
	Seed    uint64
	// PauseAfter, when > 0, pauses sending (the operator's writer) once
	// that many messages were published, and resumes 100 ms later: the
	// pause gates' change.
	PauseAfter int
	// BeforePause, if set, runs before the pause (a test waits there for a
	// canary reconcile).
	BeforePause func()
	Bounds      canary.Bounds
	Server      canary.Server
	// Canary is the replica the window judges against the baseline.
	// Default the fleet's canary.
	Canary *fleetReplica
}

// windowLimit bounds a window: publishing, every message taken, and both
// replicas' measure of its pause change. Past it the window fails, saying
// what it was waiting for. Each replica measures a change's propagation at
// its first reconcile after it, within 1.2 s with the default reconcile
// interval (2.4 s for the tests' slow canary); a first delivery that the
// client dropped comes back after AckWait (6 s); the rest is the machine's
// load.
const windowLimit = time.Minute

// window publishes the demo's mix, by count, while canary.Begin and Until
// observe both replicas, and returns the gates' report. The window starts
// once both are scraped, and ends once every message published in it has
// been taken off the stream (its first delivery settled), and, with a
// pause change (PauseAfter), once both replicas have measured the
// propagation of its last change, so that the propagation gate judges it.
// A message's redeliveries may finish in the next window (the rate gates
// count what each replica finished; the commands and script-run gates
// allow for calls at the edges). Publishing waits while the replicas hold
// two messages per worker, untaken: no queue builds up on a slow machine,
// where messages would wait out their lifetime.
// windowResult is a window's report, with how many messages it published
// and how long it took from its start to its end.
type windowResult struct {
	*canary.Report
	Messages int64
	Took     time.Duration
}

func (f *fleet) window(ctx context.Context, wc windowConfig) (*windowResult, error) {
	ctx, cancel := context.WithTimeout(ctx, windowLimit)
	defer cancel()
	can := wc.Canary
	if can == nil {
		can = f.canary
	}
	var others []string // the fleet's other replicas: their script runs are the server's too
	for _, r := range f.rolled {
		if r != can {
			others = append(others, r.url)
		}
	}
	watching, err := canary.Begin(ctx, f.baseline.url, can.url, wc.Server, others...)
	if err != nil {
		return nil, err
	}
	taken0 := f.taken.Load()
	type warm struct{ base, can [limits.NumLanes]int64 }
	warmNow := func() (w warm) {
		for lane := range limits.NumLanes {
			w.base[lane], _ = f.baseline.met.WarmCalls(lane)
			w.can[lane], _ = can.met.WarmCalls(lane)
		}
		return w
	}
	warm0 := warmNow()
	var published atomic.Int64
	var publishing atomic.Bool
	publishing.Store(true)
	taken := func() int64 { return f.taken.Load() - taken0 }
	var last atomic.Int64 // the version of the window's last pause change
	measured := func() bool {
		v := last.Load()
		return wc.PauseAfter <= 0 ||
			v > 0 && f.baseline.pause.Stats().PropagatedVersion >= v && can.pause.Stats().PropagatedVersion >= v
	}
	done := func() bool { return !publishing.Load() && taken() >= published.Load() && measured() }

	var wg sync.WaitGroup
	var win *canary.Window
	var werr, opErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		win, werr = watching.Until(ctx, 0, 100*time.Millisecond, done, windowLimit)
	}()
	pauseNow := make(chan struct{})
	if wc.PauseAfter > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-pauseNow:
			}
			if wc.BeforePause != nil {
				wc.BeforePause()
			}
			// A change stored but not published (ErrNotPublished) still
			// reaches the replicas, by their reconcile; another error is
			// the window's.
			for _, paused := range []bool{true, false} {
				_, against, err := f.operator.Stored(ctx) // the operator reads, then edits against what it read
				if err != nil {
					opErr = fmt.Errorf("the operator's read before SetPaused(%v): %w", paused, err)
					return
				}
				v, err := f.operator.SetPaused(ctx, paused, against)
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

	wc.Canary = can
	pubErr := f.publishWindow(ctx, wc, &published, pauseNow, func() error {
		// Every message published so far taken: its first decision made.
		for ctx.Err() == nil && taken() < published.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if ctx.Err() != nil {
			return f.stuck(ctx, "its messages to be taken", published.Load(), taken0)
		}
		return nil
	}, func() bool {
		w := warmNow()
		for _, lane := range []limits.Lane{limits.LaneStandard, limits.LanePremium} {
			if w.base[lane]-warm0.base[lane] < int64(wc.MinWarm) || w.can[lane]-warm0.can[lane] < int64(wc.MinWarm) {
				return false
			}
		}
		return true
	}, taken0)
	publishing.Store(false)
	if pubErr != nil {
		cancel()
	}
	wg.Wait()
	switch {
	case pubErr != nil:
		return nil, pubErr
	case opErr != nil:
		return nil, opErr
	case werr != nil && ctx.Err() == nil:
		return nil, werr
	case !done():
		return nil, f.stuck(ctx, fmt.Sprintf("the propagation of pause version %d (measured by baseline: %v, canary: %v) and its messages",
			last.Load(), f.baseline.pause.Stats().PropagatedVersion >= last.Load(), can.pause.Stats().PropagatedVersion >= last.Load()),
			published.Load(), taken0)
	case werr != nil:
		return nil, werr
	}
	return &windowResult{Report: canary.Evaluate(win, wc.Bounds), Messages: published.Load(), Took: win.Duration}, nil
}

// publishWindow publishes a window's messages: wc.Messages (closing
// pauseNow after wc.PauseAfter of them), then, while enough reports
// false once settle has returned (every message taken), wc.Messages/2
// more at a time, 10 x wc.Messages in all at most. published counts them
// as they go.
func (f *fleet) publishWindow(ctx context.Context, wc windowConfig, published *atomic.Int64, pauseNow chan struct{}, settle func() error, enough func() bool, taken0 int64) error {
	mix := demo.NewMix(wc.Seed, f.cfg.Channels)
	room := func() bool { return published.Load()-(f.taken.Load()-taken0) < int64(4*fleetenv.Workers()) }
	publish := func(n int) error {
		p, refused := demo.PublishMix(ctx, f.publisher, f.busCfg.Subjects, mix, n, wc.Rate, room)
		published.Add(int64(p))
		switch {
		case refused > 0:
			return fmt.Errorf("the stream refused %d of %d messages", refused, n)
		case ctx.Err() != nil:
			return f.stuck(ctx, "room to publish", published.Load(), taken0)
		}
		return nil
	}
	first := wc.Messages
	if wc.PauseAfter > 0 {
		if err := publish(min(wc.PauseAfter, wc.Messages)); err != nil {
			return err
		}
		close(pauseNow)
		first -= min(wc.PauseAfter, wc.Messages)
	}
	if err := publish(first); err != nil {
		return err
	}
	for {
		if err := settle(); err != nil {
			return err
		}
		if enough() {
			return nil
		}
		if published.Load() >= int64(10*wc.Messages) {
			w := func(r *fleetReplica, lane limits.Lane) int64 { n, _ := r.met.WarmCalls(lane); return n }
			return fmt.Errorf("after %d messages, a replica has admitted fewer than %d warm messages on the standard or premium lane "+
				"in the window (baseline standard %d, premium %d; canary standard %d, premium %d, since the process started): "+
				"one replica is taking almost nothing off the stream", published.Load(), wc.MinWarm,
				w(f.baseline, limits.LaneStandard), w(f.baseline, limits.LanePremium), w(wc.Canary, limits.LaneStandard), w(wc.Canary, limits.LanePremium))
		}
		if err := publish(max(wc.Messages/2, 1)); err != nil {
			return err
		}
	}
}

// stuck is the error of a window that ran out of time (or was cancelled)
// while waiting for what.
func (f *fleet) stuck(ctx context.Context, what string, published, taken0 int64) error {
	return fmt.Errorf("rollout window: %v while waiting for %s (%d of %d messages taken off the stream); "+
		"a window is bounded by %v", context.Cause(ctx), what, f.taken.Load()-taken0, published, windowLimit)
}

// DemoBounds are the demo's gate bounds: production's (canary.Bounds'
// zero value: the latency rank test at 99%, no tolerance), but for the
// calls in flight at a window's edges (its replicas' workers) and a
// latency tolerance of DemoLatencyTolerance buckets, set here explicitly:
// the demo's replicas share one loaded machine.
func DemoBounds() canary.Bounds {
	return canary.Bounds{InFlight: 2 * fleetenv.Workers(), LatencyTolerance: DemoLatencyTolerance}
}

// DemoLatencyTolerance is the demo's latency tolerance, in histogram
// buckets (each about 41%): two buckets, about 2x. Production's is 0.
const DemoLatencyTolerance = 2

// rolloutResult is what the rollout printed, window by window, and where
// its roll ended.
type rolloutResult struct {
	steps   []string // each window's: the replica, and what it turned on
	reports []*canary.Report
	roll    *canary.RollResult
	where   string
}

// rollConfig shapes a roll of the fleet (fleet.roll).
type rollConfig struct {
	// Window is every window's configuration; its Seed is the first
	// window's, and each window after takes the next.
	Window windowConfig
	// OneStepAtATime has the canary (the roll's first replica) turn the six
	// rollout steps on one at a time, a window and its gates each;
	// otherwise it takes the new version (every step on) at once, as the
	// rest of the fleet does.
	OneStepAtATime bool
	// Faults are deployed with the new version on the rolled replica of
	// that index (0 the canary): the tests' failing gates.
	Faults map[int]worker.Config
}

// roll rolls the new version (every step on) over the fleet's rolled
// replicas, the canary first, with canary.Roll: a window and its gates
// (the replica against the baseline, which stays on the old version) after
// each replica's deploy; the first failing gate stops the roll, rolls that
// replica back to the old version (every step off) and leaves the rest on
// it. Each window's table and the roll's lines are written to out (which
// may be nil).
func (f *fleet) roll(ctx context.Context, rc rollConfig, out io.Writer, res *rolloutResult) error {
	seed := rc.Window.Seed
	steps := make([]canary.Step, len(f.rolled))
	for i, r := range f.rolled {
		stages, names := []worker.Steps{worker.AllSteps}, []string{"every step"}
		if i == 0 && rc.OneStepAtATime {
			stages, names = nil, nil
			on := worker.Steps(0)
			for _, step := range worker.StepList {
				on |= step
				stages, names = append(stages, on), append(names, step.String())
			}
		}
		steps[i] = canary.Step{Replica: r.name,
			Run: func(ctx context.Context) (*canary.Report, error) {
				var rep *canary.Report
				for k, on := range stages {
					if err := f.deploy(r, worker.AllSteps&^on, rc.Faults[i]); err != nil {
						return nil, err
					}
					wc := rc.Window
					wc.Canary, wc.Seed = r, seed
					seed++
					win, err := f.window(ctx, wc)
					if err != nil {
						return nil, err
					}
					rep = win.Report
					res.steps = append(res.steps, r.name+": "+names[k])
					res.reports = append(res.reports, rep)
					if out != nil {
						turns := "turns on " + names[k]
						if len(stages) > 1 {
							turns = fmt.Sprintf("rollout step %d of %d: turns on %s", k+1, len(stages), names[k])
						}
						fmt.Fprintf(out, "\n   %s %s (baseline and replicas not yet rolled: every step off); %d messages in %v\n",
							r.name, turns, win.Messages, win.Took.Round(10*time.Millisecond))
						rep.Print(out)
					}
					if !rep.Pass {
						break
					}
				}
				return rep, nil
			},
			Rollback: func(context.Context) error { return f.deploy(r, worker.AllSteps, worker.Config{}) },
		}
	}
	var err error
	res.roll, err = canary.Roll(ctx, steps, out)
	return err
}

// DemoReplicas is how many replicas the demo's roll deploys to, the
// canary first.
const DemoReplicas = 3

// Run runs the rollout: a baseline with every step off and a fleet of
// DemoReplicas replicas, every step off, side by side on one Valkey and
// one bus; then a roll of the new version over the fleet: the canary
// turns the six steps on one at a time, then each other replica takes
// every step at once, with the gate table after each window, stopping at
// the first failing gate. Each window is messages messages at most rate a
// second, and more until the baseline and the replica judged have each
// admitted 20 warm messages on each of the standard and premium lanes.
func Run(ctx context.Context, rate, messages int, out io.Writer) (*rolloutResult, error) {
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
	f, err := startFleet(ctx, fleetConfig{Dial: dial, NATSURL: natsURL, Prefix: fmt.Sprintf("outgress-rollout:%x:", time.Now().UnixNano()),
		Channels: 40, Replicas: DemoReplicas})
	if err != nil {
		return nil, err
	}
	defer f.close()
	res := &rolloutResult{where: where}
	err = f.roll(ctx, rollConfig{OneStepAtATime: true, Window: windowConfig{Rate: rate, Messages: messages, MinWarm: 20, Seed: 10,
		PauseAfter: messages / 2, Server: canary.ValkeyScriptRuns(f.admin), Bounds: DemoBounds()}}, out, res)
	if err != nil {
		return res, err
	}
	return res, ctx.Err()
}
