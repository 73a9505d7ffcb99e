package worker

import (
	"context"
	"fmt"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/pause"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

// TestMain stops the shared test servers after the last test.
func TestMain(m *testing.M) { testenv.Main(m) }

// testBus is a bus on a stream of the test's own, deleted at the end.
type testBus struct {
	*bus.Bus
	cfg bus.Config
}

// newTestBus sets up a stream and consumers for the test's own subjects
// (one per lane) and connects to it.
func newTestBus(t *testing.T, cfg bus.Config) *testBus {
	t.Helper()
	url := testenv.NATSURL(t)
	id := fmt.Sprintf("t%x", rand.Uint64())
	cfg.Stream = strings.ToUpper(id)
	cfg.Subjects = nil
	for lane := range limits.NumLanes {
		cfg.Subjects = append(cfg.Subjects, id+"."+lane.String())
	}
	b, err := bus.Connect(testenv.Ctx(t), url, t.Name(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Setup(testenv.Ctx(t), b.JetStream(), cfg); err != nil {
		b.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		// A connection of its own: b's is closed.
		if c, err := bus.Connect(context.Background(), url, "cleanup", cfg); err == nil {
			c.JetStream().DeleteStream(context.Background(), cfg.Stream)
			c.Close()
		}
	})
	return &testBus{Bus: b, cfg: cfg}
}

// env is one worker replica on a real server, with a fake Helix server.
type env struct {
	srv      *testenv.Server
	raw      valkey.Client
	c        *counting.Client
	prefix   string
	fake     *helix.Fake
	metrics  *metrics.Metrics
	pause    *pause.Pause
	channels *channels.Cache
	helix    *helix.Helix
	worker   *Worker
}

type envOption func(*envConfig)

type envConfig struct {
	limits       *limits.Limits
	pause        pause.Config
	prefix       string
	off          Steps
	retryUnknown bool
	delayToken   bool
}

// withDelayUntilToken redelivers a refusal by a limit after its RetryAfter
// and drops it when that is past its lifetime (Config.DelayUntilToken).
func withDelayUntilToken() envOption { return func(c *envConfig) { c.delayToken = true } }

// withRetryUnknown decides under the message's id and repeats an
// ErrOutcomeUnknown once (Config.RetryOutcomeUnknown).
func withRetryUnknown() envOption { return func(c *envConfig) { c.retryUnknown = true } }

// withOff switches rollout steps off (Config.Off, and the Helix client's
// legacy transport when the transport step is off).
func withOff(s Steps) envOption { return func(c *envConfig) { c.off = s } }

func withLimits(l limits.Limits) envOption { return func(c *envConfig) { c.limits = &l } }

// withPrefix sets a fixed key prefix with no cleanup: for a server of the
// test's own that it stops.
func withPrefix(p string) envOption { return func(c *envConfig) { c.prefix = p } }

// newEnv starts a replica on srv (testenv.Shared when nil). Its pause
// snapshot reconciles once an hour, so that no background command runs
// during a test unless the test asks for it.
func newEnv(t *testing.T, srv *testenv.Server, opts ...envOption) *env {
	t.Helper()
	if srv == nil {
		srv = testenv.Shared(t)
	}
	cfg := envConfig{pause: pause.Config{ReconcileEvery: time.Hour}}
	for _, o := range opts {
		o(&cfg)
	}
	e := &env{srv: srv, raw: testenv.Client(t, srv.Addr), fake: helix.StartFake(), metrics: metrics.New()}
	t.Cleanup(e.fake.Close)
	e.c = &counting.Client{Client: e.raw}
	e.prefix = cfg.prefix
	if e.prefix == "" {
		e.prefix = testenv.Prefix(t)
	}
	cfg.pause.Prefix = e.prefix
	// Its pause events on the NATS subject of the replicas that share its
	// prefix, on a connection of its own.
	cfg.pause.NATS, cfg.pause.Subject = testenv.NATSConn(t), testenv.PauseSubject(e.prefix)
	e.pause = pause.New(e.c, cfg.pause)
	t.Cleanup(e.pause.Close)
	if err := e.pause.Start(testenv.Ctx(t)); err != nil {
		t.Fatalf("pause: %v", err)
	}
	e.channels = channels.New(e.c, channels.Config{Prefix: e.prefix})
	var err error
	e.helix, err = helix.New(helix.Config{BaseURL: e.fake.URL, ClientID: "test", Token: "test", BotID: botID, Concurrency: 4, TraceEvery: 1,
		LegacyTransport: (AllSteps &^ cfg.off).HelixLegacy()}, e.metrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.helix.Close)
	e.worker = New(admit.New(e.c, admit.WithObserver(e.metrics.ObserveLimiter)), e.pause, e.channels, e.helix, e.metrics, Config{Prefix: e.prefix, Limits: cfg.limits, Off: cfg.off, RetryOutcomeUnknown: cfg.retryUnknown, DelayUntilToken: cfg.delayToken})
	return e
}

// seed stores a channel's metadata.
func (e *env) seed(t *testing.T, id string, mod bool) {
	t.Helper()
	flag := "0"
	if mod {
		flag = "1"
	}
	err := e.raw.Do(testenv.Ctx(t), e.raw.B().Hset().Key(channels.Key(e.prefix, id)).FieldValue().
		FieldValue("login", "channel"+id).FieldValue("bot_mod", flag).Build()).Error()
	if err != nil {
		t.Fatal(err)
	}
}

// process runs one fresh message through the worker.
func (e *env) process(t *testing.T, lane limits.Lane, body string) (Path, error) {
	t.Helper()
	return e.worker.Process(testenv.Ctx(t), lane, e.message(body))
}

// seq numbers the test messages, as a stream would.
var seq atomic.Uint64

// message is a first delivery of body, published now, with a stream
// sequence of its own.
func (e *env) message(body string) *bus.Message {
	return &bus.Message{Data: []byte(body), Stream: "TEST", Seq: seq.Add(1), Published: time.Now(), Attempt: 1}
}

// chat returns a chat command body.
func chat(channel string) string {
	return `{"kind":"chat","channel":"` + channel + `","text":"hello"}`
}

// scriptCommands are the commands admit's script runs inside the server.
// INFO commandstats counts them too, but they are not round trips. The
// script of AllowOrderedOnce also runs GET (the id's record) and SET (the
// new record); clients send those names too, so commandDelta accounts for
// them by count instead.
var scriptCommands = map[string]bool{"time": true, "hmget": true, "hset": true, "pexpire": true, "pexpireat": true, "exists": true}

// commandDelta returns the commands sent by clients between two INFO
// commandstats readings, leaving out the readings' own INFO, the client's
// keep-alive PINGs, the handshake of a connection opened meanwhile, and the
// commands run inside scripts. It fails the test
// unless each script run (EVALSHA or EVAL that ran) called TIME exactly once,
// which ties the left-out script commands to the counted scripts.
//
// With once, every script run was an AllowOrderedOnce that decided under a
// new id: each read its record with one GET and wrote it with one SET,
// inside the script. Exactly that many GETs and SETs are left out (the test
// fails if there are fewer); any beyond them were sent by a client and are
// counted.
func commandDelta(t *testing.T, before, after map[string]testenv.CmdStat, once bool) map[string]int64 {
	t.Helper()
	d := map[string]int64{}
	var times int64
	for name, s := range after {
		n := s.Calls - before[name].Calls
		switch {
		case n == 0, name == "info", name == "ping":
		case name == "hello", name == "client|setinfo", name == "auth": // a connection valkey-go (re)opened meanwhile, not a message's command
		case name == "time":
			times = n
		case scriptCommands[name]:
		default:
			d[name] = n
		}
	}
	// An EVALSHA that answered NOSCRIPT ran nothing; it is a failed call.
	noscript := after["evalsha"].Failed - before["evalsha"].Failed
	runs := d["evalsha"] - noscript + d["eval"]
	if times != runs {
		t.Errorf("TIME ran %d times for %d script runs; want one each", times, runs)
	}
	if once {
		for _, name := range []string{"get", "set"} {
			if d[name] < runs {
				t.Errorf("%d %s for %d AllowOrderedOnce script runs; want at least one each (its record)", d[name], name, runs)
			}
			if d[name] -= runs; d[name] <= 0 {
				delete(d, name)
			}
		}
	}
	return d
}

// botID is the bot's user id in the tests' Helix requests.
const botID = "777"
