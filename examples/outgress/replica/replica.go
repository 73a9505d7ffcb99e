// Package replica is one replica of `outgress worker`: it connects to
// Valkey and NATS, loads the pause state, serves the management requests
// and /metrics, and consumes every lane.
package replica

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/mgmt"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/examples/outgress/worker"
	"github.com/valkey-io/valkey-go"
)

// Config shapes one replica of `outgress worker`.
type Config struct {
	Name    string
	Dial    func() (valkey.Client, error)
	NATSURL string
	// Prefix starts every Valkey key; Subjects every NATS subject: the
	// lanes' <Subjects>.standard, .premium and .system (in Stream), the
	// pause events' <Subjects>.pause and the management requests'
	// <Subjects>.mgmt.*. Every replica of a fleet uses the same three.
	Prefix, Subjects, Stream string
	// HelixURL is the Helix API; "" starts an in-process fake.
	HelixURL, ClientID, Token, BotID string
	MetricsAddr                      string // "" is 127.0.0.1 on a free port
	Off                              worker.Steps
	// RetryOutcomeUnknown is worker.Config's: the id-record retry, a
	// departure from the plan (off by default).
	RetryOutcomeUnknown bool
	// DelayUntilToken is worker.Config's (off by default).
	DelayUntilToken bool
	// KillGrace is worker.Config's: the deployment's kill grace period,
	// which the timing rules check the message lifetime against.
	KillGrace time.Duration
	// Pause configures the pause snapshot; its Prefix, NATS and Subject
	// are set from the fields above.
	Pause pause.Config
	// OnError receives the errors the bus reports. Default: none.
	OnError func(subject string, err error)
	// beforeConsume, in tests, runs once the pause state is loaded and
	// the management requests are served, before the lanes are consumed.
	beforeConsume func()
}

// Replica is one running replica of `outgress worker`: its Valkey
// client, bus (whose NATS connection also carries its pause events and its
// management requests), pause snapshot, management server, Helix client,
// worker and /metrics.
type Replica struct {
	name        string
	client      valkey.Client
	bus         *bus.Bus
	pause       *pause.Pause
	mgmt        *mgmt.Server
	mgmtCfg     mgmt.Config
	fake        *helix.Fake
	helix       *helix.Helix
	metrics     *metrics.Metrics
	metricsURL  string
	stopMetrics func()
}

// Start starts one replica: it checks the timing rules, serves /metrics
// and /readyz, connects to Valkey and NATS, sets the stream up
// (idempotent: every replica does), subscribes to the pause events on the
// bus's connection and then loads the pause state, serves the management
// requests in their queue group, and consumes every lane. Close it with
// Close.
//
// /readyz answers 503 until the first snapshot is loaded (after the
// subscription is confirmed) and every lane is consumed, and again while
// the NATS connection that carries the pause events is down; 200 "ready"
// otherwise.
func Start(ctx context.Context, cfg Config) (_ *Replica, err error) {
	r := &Replica{name: cfg.Name, metrics: metrics.New(), mgmtCfg: mgmt.Config{Prefix: cfg.Subjects + ".mgmt"}}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	busCfg := bus.Config{Stream: cfg.Stream, Subjects: fleetenv.LaneSubjects(cfg.Subjects), Observe: r.metrics.Delivery, OnError: cfg.OnError}
	pcfg := cfg.Pause
	pcfg.Prefix, pcfg.Subject = cfg.Prefix, cfg.Subjects+".pause"
	wcfg := worker.Config{Prefix: cfg.Prefix, Off: cfg.Off, RetryOutcomeUnknown: cfg.RetryOutcomeUnknown, DelayUntilToken: cfg.DelayUntilToken, KillGrace: cfg.KillGrace}
	if err := worker.CheckTiming(wcfg, busCfg, pcfg); err != nil {
		return nil, err
	}
	if r.metricsURL, r.stopMetrics, err = r.metrics.Serve(cfg.MetricsAddr); err != nil { // /readyz: 503 until ready
		return nil, err
	}
	if r.client, err = cfg.Dial(); err != nil {
		return nil, err
	}
	if r.bus, err = bus.Connect(ctx, cfg.NATSURL, "outgress-"+cfg.Name, busCfg); err != nil {
		return nil, err
	}
	if err := bus.Setup(ctx, r.bus.JetStream(), busCfg); err != nil {
		return nil, err
	}
	pcfg.NATS = r.bus.Conn() // the pause events on the bus's connection, on their own subject
	pcfg.OnPropagation = r.metrics.PausePropagation
	r.pause = pause.New(r.client, pcfg)
	if err := r.metrics.RegisterPause(cfg.Name, r.pause); err != nil {
		return nil, err
	}
	p, nc := r.pause, r.bus.Conn()
	var consuming atomic.Bool
	r.metrics.SetReady(func() error {
		switch {
		case !p.Ready():
			return errors.New("the pause state is not loaded yet (its events' subscription first, then the load)")
		case !consuming.Load():
			return errors.New("not consuming every lane yet")
		case !nc.IsConnected():
			return errors.New("NATS is not connected: the pause events' subscription is not live")
		}
		return nil
	})
	if err := r.pause.Start(ctx); err != nil { // subscribe, then load, before serving or consuming anything
		return nil, fmt.Errorf("replica %s: %w", cfg.Name, err)
	}
	if r.mgmt, err = mgmt.Serve(r.bus.Conn(), r.mgmtCfg, cfg.Name, r.pause); err != nil {
		return nil, err
	}
	helixURL, clientID, token, botID := cfg.HelixURL, cfg.ClientID, cfg.Token, cfg.BotID
	if helixURL == "" {
		r.fake = helix.StartFake()
		helixURL, clientID, token, botID = r.fake.URL, "fake", "fake", "777"
	}
	r.helix, err = helix.New(helix.Config{BaseURL: helixURL, ClientID: clientID, Token: token, BotID: botID, Concurrency: fleetenv.Workers(),
		LegacyTransport: (worker.AllSteps &^ cfg.Off).HelixLegacy()}, r.metrics)
	if err != nil {
		return nil, err
	}
	w := worker.New(admit.New(r.client, admit.WithObserver(r.metrics.ObserveLimiter)), r.pause,
		channels.New(r.client, channels.Config{Prefix: cfg.Prefix}), r.helix, r.metrics, wcfg)
	if cfg.beforeConsume != nil {
		cfg.beforeConsume()
	}
	for lane := range limits.NumLanes {
		if err := r.bus.Consume(ctx, busCfg.Subjects[lane], fleetenv.LaneWorkers[lane], w.Handler(lane)); err != nil {
			return nil, err
		}
	}
	consuming.Store(true)
	return r, nil
}

// Stop stops a replica's parts in the order that lets its running work
// finish: it leaves the management queue group (m: no new request is
// taken), stops consuming (b: running handlers finish and settle their
// messages), then closes the pause snapshot (p), which nothing reads any
// more. Nil parts are skipped. What the handlers used (the Helix client,
// the Valkey client) is the caller's to close after it.
func Stop(m *mgmt.Server, b *bus.Bus, p *pause.Pause) {
	if m != nil {
		m.Stop()
	}
	if b != nil {
		b.Close()
	}
	if p != nil {
		p.Close()
	}
}

// Close stops the replica (Stop), then the Helix client, the fake Helix
// server, /metrics and the Valkey client.
func (r *Replica) Close() {
	Stop(r.mgmt, r.bus, r.pause)
	if r.helix != nil {
		r.helix.Close()
	}
	if r.fake != nil {
		r.fake.Close()
	}
	if r.stopMetrics != nil {
		r.stopMetrics()
	}
	if r.client != nil {
		r.client.Close()
	}
}

// commandFlags are `outgress worker`'s flags.
type commandFlags struct {
	name, metricsAddr, off, helixURL, bot *string
	delayToken, retryUnknown              *bool
	grace                                 *time.Duration
}

// defineFlags defines `outgress worker`'s flags on fs. The two departures
// from the plan's behaviour (-delay-until-token, -retry-unknown) are off
// unless given.
func defineFlags(fs fleetenv.Command) commandFlags {
	host, _ := os.Hostname()
	return commandFlags{
		name:        fs.String("name", host, "the replica's `name` (metrics, management replies)"),
		metricsAddr: fs.String("metrics", "127.0.0.1:0", "serve Prometheus metrics on http://`addr`/metrics"),
		off:         fs.String("off", "none", "rollout `steps` switched off (as go run . -off)"),
		delayToken: fs.Bool("delay-until-token", false, "redeliver a refusal by a limit no sooner than its RetryAfter, and drop it at once past its lifetime "+
			"(default: the error delay)"),
		retryUnknown: fs.Bool("retry-unknown", false, "decide under each message's id and repeat an outcome-unknown decision once "+
			"(a departure from the plan, which does not retry the script; costs a GET and a SET inside every admission's script)"),
		helixURL: fs.String("helix", "", "the Helix API's base `URL`; empty starts an in-process fake (HELIX_CLIENT_ID, HELIX_TOKEN and -bot for a real one)"),
		bot:      fs.String("bot", "", "the bot's Helix user `id`"),
		grace: fs.Duration("kill-grace", 30*time.Second, "the deployment's kill grace `period` (SIGTERM to SIGKILL); "+
			"refused if a message's lifetime and the last flush do not fit in it"),
	}
}

// Command is `outgress worker`: one replica, until interrupted.
func Command(args []string) int {
	fs := fleetenv.NewFleetCommand("worker")
	ff := fs.Fleet
	f := defineFlags(fs)
	name, metricsAddr, off, delayToken, retryUnknown, helixURL, bot, grace := f.name, f.metricsAddr, f.off, f.delayToken, f.retryUnknown, f.helixURL, f.bot, f.grace
	valkeyAddr, natsURL, err := fs.ParseEnv(args, true)
	steps, perr := worker.ParseSteps(*off)
	if err == nil {
		err = perr
	}
	if err == nil && *helixURL != "" && (os.Getenv("HELIX_CLIENT_ID") == "" || os.Getenv("HELIX_TOKEN") == "" || *bot == "") {
		err = errors.New("-helix needs HELIX_CLIENT_ID, HELIX_TOKEN and -bot")
	}
	if err != nil {
		return fs.Fail(2, err)
	}
	ctx, stop := fs.Context() // SIGTERM too: a deployment stopping the replica
	defer stop()
	r, err := Start(ctx, Config{
		Name: *name, Dial: fleetenv.DialAddr(valkeyAddr), NATSURL: natsURL,
		Prefix: *ff.Prefix, Subjects: *ff.Subjects, Stream: *ff.Stream,
		HelixURL: *helixURL, ClientID: os.Getenv("HELIX_CLIENT_ID"), Token: os.Getenv("HELIX_TOKEN"), BotID: *bot,
		MetricsAddr: *metricsAddr, Off: steps, RetryOutcomeUnknown: *retryUnknown, DelayUntilToken: *delayToken, KillGrace: *grace,
		OnError: func(subject string, err error) {
			fmt.Fprintf(os.Stderr, "outgress worker %s: %s: %v\n", *name, subject, err)
		},
	})
	if err != nil {
		return fs.Fail(1, err)
	}
	defer r.Close()
	fmt.Printf("outgress worker %s: steps %s; metrics on %s; lanes on %s.*; pause events on %s.pause; management on %s.*\n",
		*name, worker.AllSteps&^steps, r.metricsURL, *ff.Subjects, *ff.Subjects, r.mgmtCfg.Prefix)
	<-ctx.Done()
	return 0
}
