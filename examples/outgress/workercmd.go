package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/demo"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/mgmt"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/examples/outgress/worker"
	"github.com/nats-io/nats.go"
	"github.com/valkey-io/valkey-go"
)

// workerConfig shapes one replica of `outgress worker`.
type workerConfig struct {
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
	// Pause configures the pause snapshot; its Prefix, NATS and Subject
	// are set from the fields above.
	Pause pause.Config
	// OnError receives the errors the bus reports. Default: none.
	OnError func(subject string, err error)
}

// laneSubjects are the lanes' subjects under prefix.
func laneSubjects(prefix string) []string {
	s := make([]string, limits.NumLanes)
	for lane := range limits.NumLanes {
		s[lane] = prefix + "." + lane.String()
	}
	return s
}

// workerReplica is one running replica of `outgress worker`: its Valkey
// client, bus (whose NATS connection also carries its pause events and its
// management requests), pause snapshot, management server, Helix client,
// worker and /metrics.
type workerReplica struct {
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

// startWorker starts one replica: it checks the timing rules, connects to
// Valkey and NATS, sets the stream up (idempotent: every replica does),
// loads the pause state with its events on the bus's connection, serves
// the management requests in their queue group and /metrics, and consumes
// every lane. Close it with close.
func startWorker(ctx context.Context, cfg workerConfig) (_ *workerReplica, err error) {
	r := &workerReplica{name: cfg.Name, metrics: metrics.New(), mgmtCfg: mgmt.Config{Prefix: cfg.Subjects + ".mgmt"}}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	busCfg := bus.Config{Stream: cfg.Stream, Subjects: laneSubjects(cfg.Subjects), Observe: r.metrics.Delivery, OnError: cfg.OnError}
	pcfg := cfg.Pause
	pcfg.Prefix, pcfg.Subject = cfg.Prefix, cfg.Subjects+".pause"
	if err := worker.CheckTiming(worker.Config{Prefix: cfg.Prefix}, busCfg, pcfg); err != nil {
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
	concurrency := 0
	for _, n := range laneWorkers {
		concurrency += n
	}
	r.helix, err = helix.New(helix.Config{BaseURL: helixURL, ClientID: clientID, Token: token, BotID: botID, Concurrency: concurrency,
		LegacyTransport: (worker.AllSteps &^ cfg.Off).HelixLegacy()}, r.metrics)
	if err != nil {
		return nil, err
	}
	w := worker.New(admit.New(r.client, admit.WithObserver(r.metrics.ObserveLimiter)), r.pause,
		channels.New(r.client, channels.Config{Prefix: cfg.Prefix}), r.helix, r.metrics, worker.Config{Prefix: cfg.Prefix, Off: cfg.Off})
	if r.metricsURL, r.stopMetrics, err = r.metrics.Serve(cfg.MetricsAddr); err != nil {
		return nil, err
	}
	for lane := range limits.NumLanes {
		if err := r.bus.Consume(ctx, busCfg.Subjects[lane], laneWorkers[lane], w.Handler(lane)); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// close stops the replica: it leaves the management queue group, stops
// consuming (running handlers finish), then stops the rest.
func (r *workerReplica) close() {
	if r.mgmt != nil {
		r.mgmt.Stop()
	}
	if r.bus != nil {
		r.bus.Close()
	}
	if r.pause != nil {
		r.pause.Close()
	}
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

// fleetFlags are the flags every fleet subcommand shares: where the fleet's
// keys, subjects and stream are.
type fleetFlags struct{ prefix, subjects, stream *string }

func addFleetFlags(fs *flag.FlagSet) fleetFlags {
	return fleetFlags{
		prefix:   fs.String("prefix", "outgress:", "the fleet's Valkey key `prefix`"),
		subjects: fs.String("subjects", "outgress", "the fleet's NATS subject `prefix` (lanes, pause events, management requests)"),
		stream:   fs.String("stream", "OUTGRESS", "the fleet's JetStream `stream`"),
	}
}

// fleetEnv reads VALKEY_ADDR and NATS_URL, which a fleet's processes
// share, so both must be set.
func fleetEnv(needValkey bool) (valkeyAddr, natsURL string, err error) {
	valkeyAddr, natsURL = os.Getenv("VALKEY_ADDR"), os.Getenv("NATS_URL")
	if natsURL == "" || needValkey && valkeyAddr == "" {
		return "", "", errors.New("set VALKEY_ADDR (host:port of the Valkey every replica shares) and NATS_URL (the NATS server with JetStream)")
	}
	return valkeyAddr, natsURL, nil
}

// workerMain is `outgress worker`: one replica, until interrupted.
func workerMain(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	host, _ := os.Hostname()
	name := fs.String("name", host, "the replica's `name` (metrics, management replies)")
	ff := addFleetFlags(fs)
	metricsAddr := fs.String("metrics", "127.0.0.1:0", "serve Prometheus metrics on http://`addr`/metrics")
	off := fs.String("off", "none", "rollout `steps` switched off (as go run . -off)")
	helixURL := fs.String("helix", "", "the Helix API's base `URL`; empty starts an in-process fake (HELIX_CLIENT_ID, HELIX_TOKEN and -bot for a real one)")
	bot := fs.String("bot", "", "the bot's Helix user `id`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	valkeyAddr, natsURL, err := fleetEnv(true)
	steps, perr := worker.ParseSteps(*off)
	if err == nil {
		err = perr
	}
	if err == nil && *helixURL != "" && (os.Getenv("HELIX_CLIENT_ID") == "" || os.Getenv("HELIX_TOKEN") == "" || *bot == "") {
		err = errors.New("-helix needs HELIX_CLIENT_ID, HELIX_TOKEN and -bot")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress worker:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r, err := startWorker(ctx, workerConfig{
		Name: *name, Dial: dialValkey(valkeyAddr), NATSURL: natsURL,
		Prefix: *ff.prefix, Subjects: *ff.subjects, Stream: *ff.stream,
		HelixURL: *helixURL, ClientID: os.Getenv("HELIX_CLIENT_ID"), Token: os.Getenv("HELIX_TOKEN"), BotID: *bot,
		MetricsAddr: *metricsAddr, Off: steps,
		OnError: func(subject string, err error) {
			fmt.Fprintf(os.Stderr, "outgress worker %s: %s: %v\n", *name, subject, err)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress worker:", err)
		return 1
	}
	defer r.close()
	fmt.Printf("outgress worker %s: steps %s; metrics on %s; lanes on %s.*; pause events on %s.pause; management on %s.*\n",
		*name, worker.AllSteps&^steps, r.metricsURL, *ff.subjects, *ff.subjects, r.mgmtCfg.Prefix)
	<-ctx.Done()
	return 0
}

// mgmtMain is `outgress mgmt pause|resume|status`: one management request
// to the fleet, answered by one replica.
func mgmtMain(args []string) int {
	fs := flag.NewFlagSet("mgmt", flag.ContinueOnError)
	ff := addFleetFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	_, natsURL, err := fleetEnv(false)
	if err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: NATS_URL=... outgress mgmt [-subjects outgress] pause|resume|status")
		return 2
	}
	nc, err := nats.Connect(natsURL, nats.Name("outgress-mgmt"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress mgmt:", err)
		return 1
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := mgmt.Config{Prefix: *ff.subjects + ".mgmt"}
	switch cmd := fs.Arg(0); cmd {
	case "pause", "resume":
		r, err := mgmt.SetPaused(ctx, nc, cfg, cmd == "pause")
		if err != nil {
			fmt.Fprintln(os.Stderr, "outgress mgmt:", err)
			return 1
		}
		fmt.Printf("%sd by replica %s: version %d\n", cmd, r.Replica, r.Version)
	case "status":
		s, err := mgmt.SystemStatus(ctx, nc, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "outgress mgmt:", err)
			return 1
		}
		fmt.Printf("Valkey: paused %v, version %d (read for this request by replica %s); its snapshot: paused %v, version %d, %.1f s old\n",
			s.Paused, s.Version, s.Replica, s.Snapshot.Paused, s.Snapshot.Version, s.Snapshot.AgeSec)
	default:
		fmt.Fprintf(os.Stderr, "outgress mgmt: unknown request %q; want pause, resume or status\n", cmd)
		return 2
	}
	return 0
}

// publishMain is `outgress publish`: it seeds the demo's channels under
// the fleet's prefix and publishes the demo's mix on the fleet's lanes,
// traffic for running workers.
func publishMain(args []string) int {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	ff := addFleetFlags(fs)
	rate := fs.Int("rate", 300, "messages a `second`")
	d := fs.Duration("for", 10*time.Second, "how long to publish")
	nchan := fs.Int("channels", 40, "channels in the mix (seeded first)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	valkeyAddr, natsURL, err := fleetEnv(true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress publish:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	c, err := dialValkey(valkeyAddr)()
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress publish:", err)
		return 1
	}
	defer c.Close()
	if err := demo.SeedChannels(ctx, c, *ff.prefix, *nchan); err != nil {
		fmt.Fprintln(os.Stderr, "outgress publish: seeding channels:", err)
		return 1
	}
	busCfg := bus.Config{Stream: *ff.stream, Subjects: laneSubjects(*ff.subjects)}
	pub, err := bus.Connect(ctx, natsURL, "outgress-publisher", busCfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress publish:", err)
		return 1
	}
	defer pub.Close()
	if err := bus.Setup(ctx, pub.JetStream(), busCfg); err != nil {
		fmt.Fprintln(os.Stderr, "outgress publish:", err)
		return 1
	}
	published, refused := demo.Publish(ctx, pub, busCfg.Subjects, *rate, *d, *nchan, uint64(time.Now().UnixNano()))
	fmt.Printf("published %d messages (%d refused by the stream)\n", published, refused)
	return 0
}

// dialValkey dials addr, a standalone Valkey.
func dialValkey(addr string) func() (valkey.Client, error) {
	return func() (valkey.Client, error) {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			return nil, fmt.Errorf("connecting to Valkey at %s: %w", addr, err)
		}
		return c, nil
	}
}
