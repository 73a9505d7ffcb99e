package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestMain stops the shared test server after the last test.
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}

// env is one worker replica on a real server, with a fake Helix server.
type env struct {
	srv      *testserver.Server
	raw      valkey.Client
	c        *CountingClient
	prefix   string
	fake     *FakeHelix
	metrics  *Metrics
	pause    *Pause
	channels *ChannelCache
	helix    *Helix
	worker   *Worker
}

type envOption func(*envConfig)

type envConfig struct {
	limits *Limits
	pause  PauseConfig
	prefix string
}

func withLimits(l Limits) envOption { return func(c *envConfig) { c.limits = &l } }

// withPrefix sets a fixed key prefix with no cleanup: for a server of the
// test's own that it stops.
func withPrefix(p string) envOption { return func(c *envConfig) { c.prefix = p } }

// newEnv starts a replica on srv (testserver.Shared when nil). Its pause
// snapshot reconciles once an hour, so that no background command runs
// during a test unless the test asks for it.
func newEnv(t *testing.T, srv *testserver.Server, opts ...envOption) *env {
	t.Helper()
	if srv == nil {
		srv = testserver.Shared(t)
	}
	cfg := envConfig{pause: PauseConfig{ReconcileEvery: time.Hour}}
	for _, o := range opts {
		o(&cfg)
	}
	e := &env{srv: srv, raw: testserver.NewClient(t, srv), fake: StartFakeHelix(), metrics: &Metrics{}}
	t.Cleanup(e.fake.Close)
	e.c = &CountingClient{Client: e.raw}
	e.prefix = cfg.prefix
	if e.prefix == "" {
		e.prefix = testserver.Prefix(t, e.raw)
	}
	cfg.pause.Prefix = e.prefix
	e.pause = NewPause(e.c, cfg.pause)
	t.Cleanup(e.pause.Close)
	if err := e.pause.Start(ctxT(t)); err != nil {
		t.Fatalf("pause: %v", err)
	}
	e.channels = NewChannelCache(e.c, ChannelCacheConfig{Prefix: e.prefix})
	var err error
	e.helix, err = NewHelix(HelixConfig{BaseURL: e.fake.URL, ClientID: "test", Token: "test", BotID: botID, Concurrency: 4, TraceEvery: 1}, e.metrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.helix.Close)
	e.worker = NewWorker(admit.New(e.c), e.pause, e.channels, e.helix, e.metrics, WorkerConfig{Prefix: e.prefix, Limits: cfg.limits})
	return e
}

// seed stores a channel's metadata.
func (e *env) seed(t *testing.T, id string, mod bool) {
	t.Helper()
	flag := "0"
	if mod {
		flag = "1"
	}
	err := e.raw.Do(ctxT(t), e.raw.B().Hset().Key(channelKey(e.prefix, id)).FieldValue().
		FieldValue("login", "channel"+id).FieldValue("bot_mod", flag).Build()).Error()
	if err != nil {
		t.Fatal(err)
	}
}

// process runs one fresh message through the worker.
func (e *env) process(t *testing.T, lane Lane, body string) (Path, error) {
	t.Helper()
	return e.worker.Process(ctxT(t), lane, &Message{Data: []byte(body), Published: time.Now()})
}

// ctxT is a context that ends with the test, bounded at 30 s.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// chat returns a chat command body.
func chat(channel string) string {
	return `{"kind":"chat","channel":"` + channel + `","text":"hello"}`
}

// waitFor polls cond every millisecond for at most 5 s and reports whether
// it became true.
func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// scriptCommands are the commands admit's script runs inside the server.
// INFO commandstats counts them too, but they are not round trips.
var scriptCommands = map[string]bool{"time": true, "hmget": true, "hset": true, "pexpire": true, "exists": true}

// commandDelta returns the commands sent by clients between two INFO
// commandstats readings, leaving out the readings' own INFO, the client's
// keep-alive PINGs and the commands run inside scripts. It fails the test
// unless each script run (EVALSHA or EVAL that ran) called TIME exactly once,
// which ties the left-out script commands to the counted scripts.
func commandDelta(t *testing.T, before, after map[string]testserver.CmdStat) map[string]int64 {
	t.Helper()
	d := map[string]int64{}
	var times int64
	for name, s := range after {
		n := s.Calls - before[name].Calls
		switch {
		case n == 0, name == "info", name == "ping":
		case name == "time":
			times = n
		case scriptCommands[name]:
		default:
			d[name] = n
		}
	}
	// An EVALSHA that answered NOSCRIPT ran nothing; it is a failed call.
	noscript := after["evalsha"].Failed - before["evalsha"].Failed
	if runs := d["evalsha"] - noscript + d["eval"]; times != runs {
		t.Errorf("TIME ran %d times for %d script runs; want one each", times, runs)
	}
	return d
}

// isCommand reports whether cmd's name is name (case-insensitive).
func isCommand(cmd valkey.Completed, name string) bool {
	parts := cmd.Commands()
	return len(parts) > 0 && strings.EqualFold(parts[0], name)
}
