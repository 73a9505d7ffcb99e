package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/mgmt"
	"github.com/admitkit/admit/examples/outgress/pause"
	fleetreplica "github.com/admitkit/admit/examples/outgress/replica"
	"github.com/admitkit/admit/examples/outgress/worker"
	"github.com/nats-io/nats.go"
	"github.com/valkey-io/valkey-go"
)

// Config shapes a demo run.
type Config struct {
	Duration time.Duration // the mix is Duration×Rate messages (the schedule is by count: see PauseAt)
	Rate     int           // messages published per second, at most
	Channels int           // channels in the mix; the first three are hot
	// PauseAt is when an operator's request pauses sending: after the
	// messages of PauseAt at Rate, once published. The messages of PauseFor
	// are published once every replica acts on the pause, and sending
	// resumes once the pause has stopped one of them and PauseFor has
	// passed.
	PauseAt  time.Duration
	PauseFor time.Duration
	Drain    time.Duration // the most to wait for redeliveries after publishing: past a message's 5 s lifetime, all are finished
	Seed     uint64        // the mix's random seed
	// RestartAt is when replica B's bus connection restarts (Close, then
	// Connect and Consume): after the messages of RestartAt at Rate.
	RestartAt time.Duration

	Off worker.Steps // rollout steps switched off in both replicas

	MetricsAddr string // where /metrics is served; "" is 127.0.0.1 on a free port
	Hold        bool   // after the report, keep serving /metrics until ctx ends
}

func Default() Config {
	return Config{
		Duration: 2 * time.Second, Rate: 600, Channels: 40,
		PauseAt: 800 * time.Millisecond, PauseFor: 400 * time.Millisecond,
		Drain: 6 * time.Second, Seed: 1, RestartAt: 1500 * time.Millisecond,
	}
}

const BotID = "777" // the bot's user id in the demo's Helix requests

// replica is one outgress process: its own client, pause snapshot, channel
// cache, Helix transport and worker.
type replica struct {
	name     string
	client   *counting.Client
	raw      valkey.Client
	pause    *pause.Pause
	channels *channels.Cache
	helix    *helix.Helix
	worker   *worker.Worker
	bus      *bus.Bus   // the current connection
	buses    []*bus.Bus // every connection it had, for the counters
	events   *nats.Conn // the pause events' and management requests' connection (B's bus restarts; this does not)
	mgmt     *mgmt.Server
}

// startBus connects the replica to the stream and starts its workers on
// every lane.
func (r *replica) startBus(ctx context.Context, res *Result, url string, cfg bus.Config) error {
	b, err := bus.Connect(ctx, url, "outgress-"+r.name, cfg)
	if err != nil {
		return err
	}
	r.bus, r.buses = b, append(r.buses, b)
	for lane := range limits.NumLanes {
		if err := b.Consume(ctx, cfg.Subjects[lane], fleetenv.LaneWorkers[lane], res.handler(r.worker, lane)); err != nil {
			return err
		}
	}
	return nil
}

func (r *replica) close() {
	fleetreplica.Stop(r.mgmt, r.bus, r.pause)
	if r.events != nil {
		r.events.Close()
	}
	if r.helix != nil {
		r.helix.Close()
	}
	r.raw.Close()
}

// Run runs the whole demo and returns what it measured.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	res := &Result{cfg: cfg, rows: worker.NewPathTable()}
	dial, where, stopServer, err := Valkey()
	if err != nil {
		return nil, err
	}
	defer stopServer()
	res.where = where

	admin, err := dial()
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	prefix := fmt.Sprintf("outgress-demo:%x:", time.Now().UnixNano())
	defer Forget(admin, prefix, cfg.Channels)
	if err := SeedChannels(ctx, admin, prefix, cfg.Channels); err != nil {
		return nil, fmt.Errorf("seeding channels: %w", err)
	}

	fake := helix.StartFake()
	defer fake.Close()
	res.helixURL = fake.URL
	met := metrics.New()
	res.metrics = met
	url, stopMetrics, err := met.Serve(cfg.MetricsAddr)
	if err != nil {
		return nil, err
	}
	defer stopMetrics()
	res.metricsURL = url

	natsURL, natsWhere, stopNATS, err := NATS()
	if err != nil {
		return nil, err
	}
	defer stopNATS()
	res.natsWhere = natsWhere
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	var reported, expired atomic.Int64
	var firstErr atomic.Pointer[string]
	var taken atomic.Int64 // messages with a settled delivery: taken off the stream once
	var seen sync.Map      // of their stream sequences
	busCfg := bus.Config{
		Stream:   "OUTGRESS_DEMO_" + run,
		Subjects: []string{"outgress-demo-" + run + ".standard", "outgress-demo-" + run + ".premium", "outgress-demo-" + run + ".system"},
		Observe: func(m *bus.Message, o bus.Outcome, reason uint8) {
			met.Delivery(m, o, reason)
			// Whichever delivery settles first (a first delivery the
			// client dropped comes back after AckWait).
			if _, dup := seen.LoadOrStore(m.Seq, true); !dup {
				taken.Add(1)
			}
			if o.Final() {
				res.finals.Add(1)
			}
		},
		OnError: func(_ string, err error) {
			reported.Add(1)
			// The handler's only deadline is the message's lifetime
			// (worker.Process): a call it cut short is the message
			// expiring mid-call, on a slow machine or a slow Valkey,
			// not a fault of the path.
			if errors.Is(err, context.DeadlineExceeded) {
				expired.Add(1)
				return
			}
			msg := err.Error()
			firstErr.CompareAndSwap(nil, &msg)
		},
	}
	// Refuse a timing configuration that breaks the delivery contract.
	if err := worker.CheckTiming(worker.Config{Prefix: prefix}, busCfg, pause.Config{Prefix: prefix}); err != nil {
		return nil, err
	}
	publisher, err := bus.Connect(ctx, natsURL, "outgress-demo-publisher", busCfg)
	if err != nil {
		return nil, err
	}
	defer publisher.Close()
	if err := bus.Setup(ctx, publisher.JetStream(), busCfg); err != nil {
		return nil, err
	}
	defer publisher.JetStream().DeleteStream(context.Background(), busCfg.Stream)

	// The operator's management requests: SetPaused executed by one
	// replica of the queue group, status answered from Valkey.
	mgmtCfg := mgmt.Config{Prefix: "outgress-demo-" + run + ".mgmt"}
	operator, err := nats.Connect(natsURL, nats.Name("outgress-demo-operator"))
	if err != nil {
		return nil, err
	}
	defer operator.Close()

	concurrency := fleetenv.Workers()
	var replicas []*replica
	defer func() {
		for _, r := range replicas {
			r.close() // its bus first: no handler may run on a closed replica
		}
	}()
	for _, name := range []string{"A", "B"} {
		raw, err := dial()
		if err != nil {
			return nil, err
		}
		r := &replica{name: name, raw: raw, client: &counting.Client{Client: raw}}
		replicas = append(replicas, r)
		if r.events, err = nats.Connect(natsURL, nats.Name("outgress-"+name+"-pause")); err != nil {
			return nil, err
		}
		// Pause events on a dedicated NATS subject, as the plan asks.
		r.pause = pause.New(r.client, pause.Config{Prefix: prefix, NATS: r.events, Subject: "outgress-demo-" + run + ".pause"})
		if err := met.RegisterPause(name, r.pause); err != nil {
			return nil, err
		}
		// Subscribe, then load, before consuming anything.
		if err := r.pause.Start(ctx); err != nil {
			return nil, fmt.Errorf("replica %s: %w", name, err)
		}
		if r.mgmt, err = mgmt.Serve(r.events, mgmtCfg, name, r.pause); err != nil {
			return nil, fmt.Errorf("replica %s: %w", name, err)
		}
		r.channels = channels.New(r.client, channels.Config{Prefix: prefix})
		r.helix, err = helix.New(helix.Config{BaseURL: fake.URL, ClientID: "demo", Token: "demo", BotID: BotID, Concurrency: concurrency,
			LegacyTransport: (worker.AllSteps &^ cfg.Off).HelixLegacy()}, met)
		if err != nil {
			return nil, err
		}
		r.worker = worker.New(admit.New(r.client, admit.WithObserver(met.ObserveLimiter)), r.pause, r.channels, r.helix, met, worker.Config{Prefix: prefix, Off: cfg.Off})
	}
	a, b := replicas[0], replicas[1]

	// The first script call after a start (or a SCRIPT FLUSH) finds no
	// cached script: EVALSHA answers NOSCRIPT and valkey-go sends EVAL.
	// Pay that once here, so the tables show the steady state.
	var warm counting.Tally
	if _, err := admit.New(a.client).AllowOrdered(counting.WithTally(ctx, &warm), admit.Request{Key: prefix + "rl:{warmup}:x", Spec: limits.DefaultLimits.ChatShared}, nil); err != nil {
		return nil, fmt.Errorf("warm-up decision: %w", err)
	}
	res.warmupCommands = warm.Commands.Load()

	if err := MeasureOldShape(ctx, a.client, a.pause, prefix, fake.URL, &res.oldShape); err != nil {
		return nil, err
	}
	res.contract = ErrorContract(ctx, a.raw, a.pause, a.helix, met, prefix)

	for _, r := range replicas {
		if err := r.startBus(ctx, res, natsURL, busCfg); err != nil {
			return nil, err
		}
	}

	// The schedule is by message count, at Rate: the pause after the
	// messages of PauseAt, the paused batch (the messages of PauseFor)
	// published once every replica acts on the pause, the resume once the
	// pause has stopped a message and PauseFor has passed, B's restart after
	// the messages of RestartAt. A loaded machine publishes the same
	// messages in the same order relative to each event, only more slowly.
	start := time.Now()
	mix := NewMix(cfg.Seed, cfg.Channels)
	count := func(d time.Duration) int { return int(d.Seconds() * float64(cfg.Rate)) }
	restartAt := count(cfg.RestartAt)
	var wg sync.WaitGroup
	defer wg.Wait()
	restart := func() { // replica B's bus restarts: Close, then Connect and Consume again
		res.restartedAt = time.Since(start)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.bus.Close()
			if err := b.startBus(ctx, res, natsURL, busCfg); err != nil {
				res.restartErr = err
			}
		}()
	}
	// publishTo publishes until target messages were sent, restarting B on
	// the way.
	sent := func() int { return res.published + res.refused }
	// Publishing waits while the fleet holds a message for each of its
	// workers and one fetched beside it, untaken: no queue builds up
	// behind them on a slow machine, where messages would wait out their
	// lifetime.
	room := func() bool { return int64(res.published)-taken.Load() < int64(2*len(replicas)*concurrency) }
	publishTo := func(target int) {
		for _, to := range []int{min(restartAt, target), target} {
			p, r := PublishMix(ctx, publisher, busCfg.Subjects, mix, to-sent(), cfg.Rate, room)
			res.published, res.refused = res.published+p, res.refused+r
			if to == restartAt && sent() == restartAt && res.restartedAt == 0 {
				restart()
			}
		}
	}
	var version int64 // the operator's view: each edit is made against the version it last saw
	set := func(ctx context.Context, paused bool) (int64, string, error) {
		r, err := mgmt.SetPaused(ctx, operator, mgmtCfg, paused, version)
		if err == nil {
			version = r.Version
		}
		return r.Version, r.Replica, err
	}
	publishTo(count(cfg.PauseAt))
	res.pauseLog = append(res.pauseLog, ChangePause(ctx, start, true, set, a.pause, b.pause))
	pausedAt := time.Now()
	before := sent()
	publishTo(before + max(count(cfg.PauseFor), 1))
	res.pausedMsgs = sent() - before
	for deadline := time.Now().Add(SeenWithin); (res.rows.Row(worker.RowPaused).N == 0 || time.Since(pausedAt) < cfg.PauseFor) &&
		time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(5 * time.Millisecond)
	}
	res.pauseLog = append(res.pauseLog, ChangePause(ctx, start, false, set, a.pause, b.pause))
	publishTo(max(count(cfg.Duration), sent()))
	if res.restartedAt == 0 { // RestartAt past the mix: at its end
		restart()
	}
	for deadline := time.Now().Add(cfg.Drain); res.finals.Load() < int64(res.published) && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	for _, r := range replicas {
		r.bus.Close()
	}
	for _, r := range replicas {
		for _, bb := range r.buses {
			res.bus = addStats(res.bus, bb.Stats())
		}
	}
	if s, err := publisher.JetStream().Stream(ctx, busCfg.Stream); err == nil {
		if info, err := s.Info(ctx); err == nil {
			res.unfinished = int64(info.State.Msgs)
		}
	}
	res.reported, res.reportedExpired = reported.Load(), expired.Load()
	if p := firstErr.Load(); p != nil {
		res.firstError = *p
	}
	res.status, res.statusErr = mgmt.SystemStatus(ctx, operator, mgmtCfg)
	for _, r := range replicas {
		snap, _ := r.pause.Snapshot()
		res.replicas = append(res.replicas, replicaReport{name: r.name, snap: snap, age: r.pause.Age(), stats: r.pause.Stats(), mgmt: r.mgmt.Stats()})
	}
	res.helixConns = fake.Conns()
	res.helixRequests = fake.Requests()
	res.scrape = metrics.Excerpt(res.metricsURL)
	if cfg.Hold && ctx.Err() == nil {
		res.Print(os.Stdout)
		fmt.Printf("\nServing %s until interrupted (Ctrl-C).\n", res.metricsURL)
		<-ctx.Done()
		return nil, nil
	}
	return res, ctx.Err()
}

// handler wraps a worker's handler so that every message's Valkey commands
// are counted into its path's row.
func (res *Result) handler(w *worker.Worker, lane limits.Lane) bus.Handler {
	return func(ctx context.Context, m *bus.Message) error {
		var t counting.Tally
		path, err := w.Process(counting.WithTally(ctx, &t), lane, m)
		res.rows.Add(path, t.Commands.Load(), t.RoundTrips.Load())
		return err
	}
}
