package main

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/examples/outgress/worker"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/admitkit/admit"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// demoConfig shapes a demo run.
type demoConfig struct {
	Duration time.Duration // how long messages are published
	Rate     int           // messages published per second
	Channels int           // channels in the mix; the first three are hot
	PauseAt  time.Duration // when replica A pauses sending, from the start
	PauseFor time.Duration // how long sending stays paused
	Drain    time.Duration // the most to wait for redeliveries after publishing: past a message's 5 s lifetime, all are finished
	Seed     uint64        // the mix's random seed
	// RestartAt is when replica B's bus connection restarts (Close, then
	// Connect and Consume), from the start.
	RestartAt time.Duration

	MetricsAddr string // where /metrics is served; "" is 127.0.0.1 on a free port
	Hold        bool   // after the report, keep serving /metrics until ctx ends
}

func defaultDemo() demoConfig {
	return demoConfig{
		Duration: 2 * time.Second, Rate: 600, Channels: 40,
		PauseAt: 800 * time.Millisecond, PauseFor: 400 * time.Millisecond,
		Drain: 6 * time.Second, Seed: 1, RestartAt: 1500 * time.Millisecond,
	}
}

// Workers per lane in each replica; the Helix transport keeps as many idle
// connections as a replica has workers.
var laneWorkers = [limits.NumLanes]int{limits.LaneStandard: 6, limits.LanePremium: 3, limits.LaneSystem: 2}

// The demo's bus subjects, one per lane.
var laneSubjects = [limits.NumLanes]string{"outgress.standard", "outgress.premium", "outgress.system"}

const (
	firstChannel   = 1001 // the mix uses 1001 .. 1000+Channels
	measureStd     = 2001 // the old-shape measurement's channels, outside the mix
	measurePremium = 2002
	unknownChannel = 9999 // never seeded: its messages are dropped
	botID          = "777"
)

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
}

// startBus connects the replica to the stream and starts its workers on
// every lane.
func (r *replica) startBus(ctx context.Context, res *demoResult, url string, cfg bus.Config) error {
	b, err := bus.Connect(ctx, url, "outgress-"+r.name, cfg)
	if err != nil {
		return err
	}
	r.bus, r.buses = b, append(r.buses, b)
	for lane := range limits.NumLanes {
		if err := b.Consume(ctx, cfg.Subjects[lane], laneWorkers[lane], res.handler(r.worker, lane)); err != nil {
			return err
		}
	}
	return nil
}

func (r *replica) close() {
	if r.bus != nil {
		r.bus.Close()
	}
	if r.pause != nil {
		r.pause.Close()
	}
	if r.helix != nil {
		r.helix.Close()
	}
	r.raw.Close()
}

// runDemo runs the whole demo and returns what it measured.
func runDemo(ctx context.Context, cfg demoConfig) (*demoResult, error) {
	res := &demoResult{cfg: cfg, rows: newPathTable()}
	dial, where, stopServer, err := valkeyServer()
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
	defer deletePrefix(admin, prefix)
	if err := seedChannels(ctx, admin, prefix, cfg.Channels); err != nil {
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

	natsURL, natsWhere, stopNATS, err := natsServer()
	if err != nil {
		return nil, err
	}
	defer stopNATS()
	res.natsWhere = natsWhere
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	var reported atomic.Int64
	var firstErr atomic.Pointer[string]
	busCfg := bus.Config{
		Stream:   "OUTGRESS_DEMO_" + run,
		Subjects: []string{"outgress-demo-" + run + ".standard", "outgress-demo-" + run + ".premium", "outgress-demo-" + run + ".system"},
		Observe: func(m *bus.Message, o bus.Outcome, reason uint8) {
			met.Delivery(m, o, reason)
			if o.Final() {
				res.finals.Add(1)
			}
		},
		OnError: func(_ string, err error) {
			reported.Add(1)
			msg := err.Error()
			firstErr.CompareAndSwap(nil, &msg)
		},
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

	concurrency := 0
	for _, n := range laneWorkers {
		concurrency += n
	}
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
		r.pause = pause.New(r.client, pause.Config{Prefix: prefix})
		if err := met.RegisterPause(name, r.pause); err != nil {
			return nil, err
		}
		// Subscribe, then load, before consuming anything.
		if err := r.pause.Start(ctx); err != nil {
			return nil, fmt.Errorf("replica %s: %w", name, err)
		}
		r.channels = channels.New(r.client, channels.Config{Prefix: prefix})
		r.helix, err = helix.New(helix.Config{BaseURL: fake.URL, ClientID: "demo", Token: "demo", BotID: botID, Concurrency: concurrency}, met)
		if err != nil {
			return nil, err
		}
		r.worker = worker.New(admit.New(r.client), r.pause, r.channels, r.helix, met, worker.Config{Prefix: prefix})
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

	if err := measureOldShape(ctx, res, a, prefix, fake.URL, concurrency); err != nil {
		return nil, err
	}
	res.contract = showErrorContract(ctx, a, met, prefix)

	for _, r := range replicas {
		if err := r.startBus(ctx, res, natsURL, busCfg); err != nil {
			return nil, err
		}
	}

	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		res.pauseLog = pauseMidRun(ctx, start, cfg, a, b)
	}()
	go func() { // replica B's bus restarts: Close, then Connect and Consume again
		defer wg.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(cfg.RestartAt))):
		}
		b.bus.Close()
		if err := b.startBus(ctx, res, natsURL, busCfg); err != nil {
			res.restartErr = err
		}
	}()
	res.published, res.refused = publishMix(ctx, publisher, busCfg.Subjects, cfg)
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
	res.reported = reported.Load()
	if p := firstErr.Load(); p != nil {
		res.firstError = *p
	}
	for _, r := range replicas {
		snap, _ := r.pause.Snapshot()
		res.replicas = append(res.replicas, replicaReport{name: r.name, snap: snap, age: r.pause.Age(), stats: r.pause.Stats()})
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
func (res *demoResult) handler(w *worker.Worker, lane limits.Lane) bus.Handler {
	return func(ctx context.Context, m *bus.Message) error {
		var t counting.Tally
		path, err := w.Process(counting.WithTally(ctx, &t), lane, m)
		res.rows.add(path, t.Commands.Load(), t.RoundTrips.Load())
		return err
	}
}

// measureOldShape sends two chat messages per lane, on channels of their
// own, through the old shape (LegacyPrepare): the first finds the channel
// cache cold, the second warm.
func measureOldShape(ctx context.Context, res *demoResult, a *replica, prefix, helixURL string, concurrency int) error {
	hx, err := helix.New(helix.Config{BaseURL: helixURL, Concurrency: concurrency}, metrics.New())
	if err != nil {
		return err
	}
	defer hx.Close()
	old := worker.New(admit.New(a.client), a.pause, channels.New(a.client, channels.Config{Prefix: prefix}), hx, metrics.New(), worker.Config{Prefix: prefix})
	for _, c := range []struct {
		lane    limits.Lane
		channel int
	}{{limits.LaneStandard, measureStd}, {limits.LanePremium, measurePremium}} {
		data := chatBody(c.channel, "measuring the old shape")
		for range 2 {
			var t counting.Tally
			_, path, err := old.LegacyPrepare(counting.WithTally(ctx, &t), a.client, c.lane, &bus.Message{Data: data, Published: time.Now()})
			if err != nil {
				return fmt.Errorf("old shape, %v lane: %w", c.lane, err)
			}
			res.oldShape.add(path, t.Commands.Load(), t.RoundTrips.Load())
		}
	}
	return nil
}

// contractCase is one message run with an injected fault.
type contractCase struct {
	fault        string
	limiterCalls int
	admitted     bool
	err          error
}

// showErrorContract runs two chat messages through a worker on replica A's
// connection whose first script call fails, once in each of admit's error
// classes: refused before it was sent (no connection: ErrNotExecuted, so
// the worker retries), and lost with the command in flight
// (ErrOutcomeUnknown: the worker does not repeat it; the error nacks the
// message).
func showErrorContract(ctx context.Context, a *replica, m *metrics.Metrics, prefix string) []contractCase {
	faults := []struct {
		name string
		err  error
	}{
		{"connection refused before sending", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}},
		{"connection lost with the script in flight", io.ErrUnexpectedEOF},
	}
	var out []contractCase
	for _, f := range faults {
		var calls atomic.Int64
		c := &counting.Client{Client: a.raw, Fault: func(cmd valkey.Completed) error {
			if isScript(cmd) && calls.Add(1) == 1 {
				return f.err
			}
			return nil
		}}
		w := worker.New(admit.New(c), a.pause, channels.New(c, channels.Config{Prefix: prefix}), a.helix, m, worker.Config{Prefix: prefix})
		_, path, err := w.Prepare(ctx, limits.LanePremium, &bus.Message{Data: chatBody(measurePremium, "error contract"), Published: time.Now()})
		out = append(out, contractCase{fault: f.name, limiterCalls: path.LimiterCalls, admitted: path.Admitted, err: err})
	}
	return out
}

func isScript(cmd valkey.Completed) bool {
	c := cmd.Commands()
	return len(c) > 0 && (strings.EqualFold(c[0], "EVALSHA") || strings.EqualFold(c[0], "EVAL"))
}

// pauseMidRun has replica A pause sending at PauseAt and resume PauseFor
// later, and records when each replica saw each change.
func pauseMidRun(ctx context.Context, start time.Time, cfg demoConfig, replicas ...*replica) []pauseEvent {
	var log []pauseEvent
	for _, step := range []struct {
		at     time.Duration
		paused bool
	}{{cfg.PauseAt, true}, {cfg.PauseAt + cfg.PauseFor, false}} {
		select {
		case <-ctx.Done():
			return log
		case <-time.After(time.Until(start.Add(step.at))):
		}
		// Every replica watches its own snapshot from before the write, so
		// each time is when that replica started acting on the change: the
		// writer once its transaction returned, the others on the event.
		before := make([]int64, len(replicas))
		for i, r := range replicas {
			s, _ := r.pause.Snapshot()
			before[i] = s.Version
		}
		ev := pauseEvent{paused: step.paused, seen: make([]time.Duration, len(replicas))}
		var wg sync.WaitGroup
		t0 := time.Now()
		for i, r := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ev.seen[i] = -1
				for deadline := t0.Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Microsecond) {
					if s, ok := r.pause.Snapshot(); ok && s.Version > before[i] && s.Paused == step.paused {
						ev.seen[i] = time.Since(t0)
						return
					}
				}
			}()
		}
		ev.at = t0.Sub(start)
		ev.version, ev.err = replicas[0].pause.SetPaused(ctx, step.paused)
		wg.Wait()
		log = append(log, ev)
	}
	return log
}

// publishMix publishes cfg.Rate messages a second for cfg.Duration, in
// 10 ms ticks, on the lanes' subjects. The mix: 60% standard chat, 15%
// premium chat, 10% Helix API calls (any lane), 8% announcements, 7%
// shoutouts; 30% of chat goes to three hot channels, enough to exhaust
// their standard share. A few messages are malformed, name an unknown
// channel, or shout a channel out to itself (which Helix refuses).
func publishMix(ctx context.Context, pub *bus.Bus, subjects []string, cfg demoConfig) (published, refused int) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 2))
	perTick := max(cfg.Rate/100, 1)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(cfg.Duration); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for range perTick {
			lane, data := mixMessage(rng, cfg.Channels)
			if _, err := pub.Publish(ctx, subjects[lane], data); err != nil {
				refused++
				continue
			}
			published++
		}
	}
	return
}

func mixMessage(rng *rand.Rand, channels int) (limits.Lane, []byte) {
	channel := func() int {
		if rng.IntN(10) < 3 {
			return firstChannel + rng.IntN(3)
		}
		return firstChannel + rng.IntN(channels)
	}
	helixLane := []limits.Lane{limits.LaneStandard, limits.LaneStandard, limits.LanePremium, limits.LaneSystem}[rng.IntN(4)]
	switch r := rng.IntN(1000); {
	case r < 5:
		return limits.LaneStandard, []byte(`{"kind":"chat","channel":"12}x","text":"hi"}`)
	case r < 10:
		return limits.LaneStandard, chatBody(unknownChannel, "hello?")
	case r < 600:
		return limits.LaneStandard, chatBody(channel(), "hello from the standard lane")
	case r < 750:
		return limits.LanePremium, chatBody(channel(), "hello from the premium lane")
	case r < 850:
		return helixLane, mustJSON(map[string]string{"kind": "api", "method": "GET", "path": "/helix/users?id=" + strconv.Itoa(channel())})
	case r < 930:
		return helixLane, mustJSON(map[string]string{"kind": "announce", "channel": strconv.Itoa(channel()), "text": "stream starts soon", "color": "blue"})
	default:
		from, to := channel(), channel()
		if rng.IntN(10) == 0 {
			to = from
		}
		return helixLane, mustJSON(map[string]string{"kind": "shoutout", "channel": strconv.Itoa(from), "to": strconv.Itoa(to)})
	}
}

func chatBody(channel int, text string) []byte {
	return mustJSON(map[string]string{"kind": "chat", "channel": strconv.Itoa(channel), "text": text})
}

// mustJSON encodes a map of strings, which cannot fail.
func mustJSON(v map[string]string) []byte {
	b, _ := json.Marshal(v)
	return b
}

// seedChannels stores the metadata of the mix's channels and the two
// measurement channels. Every fifth channel has the bot as a moderator.
func seedChannels(ctx context.Context, c valkey.Client, prefix string, n int) error {
	cmds := make(valkey.Commands, 0, n+2)
	add := func(id int) {
		mod := "0"
		if id%5 == 0 {
			mod = "1"
		}
		cmds = append(cmds, c.B().Hset().Key(channels.Key(prefix, strconv.Itoa(id))).FieldValue().
			FieldValue("login", "channel"+strconv.Itoa(id)).FieldValue("bot_mod", mod).Build())
	}
	for id := firstChannel; id < firstChannel+n; id++ {
		add(id)
	}
	add(measureStd)
	add(measurePremium)
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// natsServer returns NATS_URL, or the URL of an embedded nats-server with
// JetStream that it starts.
func natsServer() (url, where string, stop func(), err error) {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u, "NATS at " + u, func() {}, nil
	}
	e, err := bus.StartEmbedded()
	if err != nil {
		return "", "", nil, err
	}
	return e.URL(), "embedded nats-server with JetStream at " + e.URL() + " (set NATS_URL to use another)", e.Close, nil
}

// valkeyServer returns a dialer for VALKEY_ADDR, or for an in-process
// miniredis it starts.
func valkeyServer() (dial func() (valkey.Client, error), where string, stop func(), err error) {
	opt := valkey.ClientOption{DisableCache: true}
	stop = func() {}
	if addr := os.Getenv("VALKEY_ADDR"); addr != "" {
		opt.InitAddress = []string{addr}
		where = "Valkey at " + addr
	} else {
		srv, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, err
		}
		// miniredis answers CLUSTER SLOTS; without ForceSingleClient
		// valkey-go would treat it as a cluster. Over RESP3, valkey-go runs a
		// subscription on the connection it shares with other commands, which
		// miniredis refuses in subscribed mode; RESP2 gives the subscription
		// a connection of its own.
		opt.InitAddress, opt.ForceSingleClient, opt.AlwaysRESP2 = []string{srv.Addr()}, true, true
		where = "in-process miniredis (set VALKEY_ADDR=host:port to use a real Valkey)"
		stop = srv.Close
	}
	dial = func() (valkey.Client, error) {
		c, err := valkey.NewClient(opt)
		if err != nil {
			return nil, fmt.Errorf("connecting to %s: %w", where, err)
		}
		return c, nil
	}
	return dial, where, stop, nil
}

// deletePrefix deletes the demo's keys (and only those), within 10 s, one
// key per DEL so that it works on a cluster too.
func deletePrefix(c valkey.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, node := range c.Nodes() {
		var cursor uint64
		for range 10000 {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				break
			}
			for _, k := range e.Elements {
				node.Do(ctx, node.B().Del().Key(k).Build())
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
}
