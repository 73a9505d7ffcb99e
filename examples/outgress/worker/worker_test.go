package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
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

// TestMalformedDroppedWithoutValkey: a body that can never be valid is
// dropped before any Valkey command; so is chat on the system lane.
func TestMalformedDroppedWithoutValkey(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct {
		lane limits.Lane
		body string
	}{
		{limits.LaneStandard, `{"kind":"chat","channel":"4}2","text":"hi"}`},
		{limits.LaneSystem, chat("42")},
	} {
		before, _ := e.c.Totals()
		_, err := e.process(t, c.lane, c.body)
		after, _ := e.c.Totals()
		var drop *bus.Dropped
		if !errors.As(err, &drop) || drop.Reason != bus.DropMalformed || after != before {
			t.Errorf("%v %s: %v after %d commands; want dropped as malformed after 0", c.lane, c.body, err, after-before)
		}
	}
}

// writes is what a server of the test's own has written: its dirty
// counter (rdb_changes_since_last_save, which counts every change to the
// dataset and nothing that changed none, such as a PEXPIREAT GT that kept
// an expiry) and its number of keys.
type writes struct{ dirty, keys int64 }

func (e *env) writes(t *testing.T) writes {
	t.Helper()
	info, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Info().Section("persistence").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	dirty, err := strconv.ParseInt(testenv.Info(info)["rdb_changes_since_last_save"], 10, 64)
	if err != nil {
		t.Fatalf("INFO persistence: rdb_changes_since_last_save: %v", err)
	}
	keys, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Dbsize().Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return writes{dirty, keys}
}

// TestDeniedMessageWritesNothing: a message refused by its first bucket
// (the standard lane's share, or the shared bucket on the premium lane)
// costs one script run and no Valkey write at all: no once-record (admit
// records only a decision that charged), no bucket change. Its
// redelivery, under the same message id, decides again and is admitted once
// the bucket has room (had the denial been recorded, the server would
// return it to every redelivery for admit.OnceWindow). Measured on a
// server of the test's own, from its dirty counter, its key count and INFO
// commandstats.
func TestDeniedMessageWritesNothing(t *testing.T) {
	srv := testenv.Own(t)
	l := slowChat()
	l.ChatStandard = admit.MustSpec(admit.Every(time.Hour), 1)
	l.ChatShared = admit.MustSpec(admit.Every(time.Hour), 2)
	e := newEnv(t, srv, withLimits(l), withRetryUnknown())
	e.worker.cfg.Lifetime = 2 * time.Hour // RetryAfter is an hour: a nack, not a drop

	for _, c := range []struct {
		lane    limits.Lane
		channel string
		warm    int // messages that empty the first bucket
		class   limits.BucketClass
	}{
		{limits.LaneStandard, "42", 1, limits.ClassStandard}, // the share's one token (the shared bucket keeps one)
		{limits.LanePremium, "43", 2, limits.ClassShared},    // the shared bucket's two
	} {
		t.Run(c.lane.String(), func(t *testing.T) {
			e.seed(t, c.channel, false)
			for range c.warm {
				if p, err := e.process(t, c.lane, chat(c.channel)); err != nil || !p.Admitted {
					t.Fatalf("warm-up: %+v, %v", p, err)
				}
			}
			std, shared := channels.ChatKeys(e.prefix, c.channel)
			key := std
			if c.lane == limits.LanePremium {
				key = shared
			}
			m := e.message(chat(c.channel))
			w0, s0 := e.writes(t), testenv.CommandStats(t, e.raw)
			path, err := e.worker.Process(testenv.Ctx(t), c.lane, m)
			w1, s1 := e.writes(t), testenv.CommandStats(t, e.raw)
			var nack *bus.ExpectedNack
			if !errors.As(err, &nack) || nack.Reason != bus.NackLimited || path.Admitted || path.LimiterCalls != 1 {
				t.Fatalf("path %+v, err %v: want denied in one call and nacked as limited", path, err)
			}
			if got := e.metrics.Denied(c.lane, c.class); got != 1 {
				t.Errorf("%d denials by the %v bucket, want 1", got, c.class)
			}
			if w1 != w0 {
				t.Errorf("the denied message wrote: dirty %d -> %d, keys %d -> %d; want no change", w0.dirty, w1.dirty, w0.keys, w1.keys)
			}
			for _, name := range []string{"set", "hset", "del", "eval"} {
				if n := s1[name].Calls - s0[name].Calls; n != 0 {
					t.Errorf("%d %s during the denied message, want 0", n, name)
				}
			}
			if n := s1["evalsha"].Calls - s0["evalsha"].Calls; n != 1 {
				t.Errorf("%d EVALSHA, want 1: one script run decided", n)
			}
			record, err := admit.OnceRecordKey(key, DecisionID(m))
			if err != nil {
				t.Fatal(err)
			}
			if n, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Exists().Key(record).Build()).AsInt64(); err != nil || n != 0 {
				t.Errorf("EXISTS %s: %d, %v; want no record for a denial", record, n, err)
			}

			// The bucket refills (deleting it stands for that); the
			// redelivery, under the same message id, decides and is admitted.
			if err := e.raw.Do(testenv.Ctx(t), e.raw.B().Del().Key(key).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			m.Attempt++
			path, err = e.worker.Process(testenv.Ctx(t), c.lane, m)
			if err != nil || !path.Admitted || path.LimiterCalls != 1 || path.Redecided {
				t.Errorf("redelivery: path %+v, err %v; want admitted in one call", path, err)
			}
		})
	}
}

// TestRedeliveryAfterSecondBucketDenial: a standard message refused by the
// shared bucket (its share admitted: the share was charged, and admit
// recorded the denial under the message's id) is nacked; its redelivery
// gets the recorded denial back (Replayed), decides afresh under
// RedecisionID and is admitted once the shared bucket has room. Without the
// second decision the message would be refused for admit.OnceWindow, past
// its lifetime.
func TestRedeliveryAfterSecondBucketDenial(t *testing.T) {
	l := slowChat()
	l.ChatShared = admit.MustSpec(admit.Every(time.Hour), 1)
	e := newEnv(t, nil, withLimits(l), withRetryUnknown())
	e.seed(t, "42", false)
	std, shared := channels.ChatKeys(e.prefix, "42")
	if p, err := e.process(t, limits.LanePremium, chat("42")); err != nil || !p.Admitted { // premium takes the shared bucket's one token
		t.Fatalf("premium: %+v, %v", p, err)
	}
	e.worker.cfg.Lifetime = 2 * time.Hour
	m := e.message(chat("42"))
	path, err := e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	var nack *bus.ExpectedNack
	if !errors.As(err, &nack) || nack.Reason != bus.NackLimited || path.Admitted || path.Redecided {
		t.Fatalf("path %+v, err %v: want denied by the shared bucket and nacked", path, err)
	}
	if got := e.metrics.Denied(limits.LaneStandard, limits.ClassShared); got != 1 {
		t.Errorf("%d denials by the shared bucket, want 1", got)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "9" || b != "0" {
		t.Errorf("%s and %s tokens, want 9 and 0: the share charged, the shared bucket refused", a, b)
	}
	if err := e.raw.Do(testenv.Ctx(t), e.raw.B().Del().Key(shared).Build()).Error(); err != nil { // the shared bucket refills
		t.Fatal(err)
	}
	m.Attempt++
	path, err = e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	if err != nil || !path.Admitted || !path.Redecided || path.LimiterCalls != 2 {
		t.Fatalf("redelivery: path %+v, err %v; want admitted after the replayed denial and a second decision (2 calls)", path, err)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "8" || b != "0" {
		t.Errorf("%s and %s tokens, want 8 and 0", a, b)
	}
	if got := e.metrics.LimiterRedecisions(limits.LaneStandard); got != 1 {
		t.Errorf("%d redecisions, want 1", got)
	}
	record, err := admit.OnceRecordKey(std, RedecisionID(DecisionID(m), 2))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Exists().Key(record).Build()).AsInt64(); err != nil || n != 1 {
		t.Errorf("EXISTS %s: %d, %v; want the second decision recorded under the delivery's id", record, n, err)
	}
}

// TestNotExecutedIsRetried has the server refuse the first script call
// before running it (maxmemory 1: OOM), then accept the second: admit says
// ErrNotExecuted, so the worker repeats the decision within the delivery
// and the message is admitted, with two script calls and one retry
// counted.
func TestNotExecutedIsRetried(t *testing.T) {
	srv := testenv.Own(t)
	e := newEnv(t, srv)
	e.seed(t, "42", false)
	if _, err := e.process(t, limits.LaneStandard, chat("42")); err != nil { // loads the channel and the script
		t.Fatal(err)
	}
	admin := testenv.Client(t, srv.Addr)
	setMaxmemory := func(v string) {
		if err := admin.Do(testenv.Ctx(t), admin.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", v).Build()).Error(); err != nil {
			t.Error(err)
		}
	}
	orig, err := admin.Do(testenv.Ctx(t), admin.B().ConfigGet().Parameter("maxmemory").Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { setMaxmemory(orig["maxmemory"]) })
	var scripts atomic.Int64
	e.c.Gate = func(cmd valkey.Completed) {
		if testenv.IsCommand(cmd, "EVALSHA") || testenv.IsCommand(cmd, "EVAL") {
			switch scripts.Add(1) {
			case 1:
				setMaxmemory("1") // this call is refused: OOM
			case 2:
				setMaxmemory(orig["maxmemory"])
			}
		}
	}

	path, err := e.process(t, limits.LaneStandard, chat("42"))
	if err != nil || !path.Admitted {
		t.Fatalf("path %+v, err %v: want admitted after a retry", path, err)
	}
	if path.LimiterCalls != 2 || scripts.Load() != 2 {
		t.Errorf("%d limiter calls, %d script commands; want 2 and 2", path.LimiterCalls, scripts.Load())
	}
	notExecuted, unknown := e.metrics.LimiterFailures(limits.LaneStandard)
	if notExecuted != 1 || unknown != 0 || e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionNotExecuted) != 1 || e.metrics.Admitted(limits.LaneStandard) != 2 {
		t.Errorf("metrics: %d not executed, %d unknown, %d retries, %d admitted; want 1, 0, 1, 2",
			notExecuted, unknown, e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionNotExecuted), e.metrics.Admitted(limits.LaneStandard))
	}

	// Refused on every call: the retries are bounded (DecisionAttempts, 3),
	// then the error nacks the message.
	scripts.Store(0)
	e.c.Gate = func(cmd valkey.Completed) {
		if testenv.IsCommand(cmd, "EVALSHA") || testenv.IsCommand(cmd, "EVAL") {
			scripts.Add(1)
			setMaxmemory("1")
		}
	}
	path, err = e.process(t, limits.LaneStandard, chat("42"))
	var nack *bus.ExpectedNack
	var drop *bus.Dropped
	if !errors.Is(err, admit.ErrNotExecuted) || errors.As(err, &nack) || errors.As(err, &drop) || path.Decided {
		t.Errorf("path %+v, err %v: want an ErrNotExecuted error (reported and redelivered by the bus)", path, err)
	}
	if path.LimiterCalls != 3 || scripts.Load() != 3 {
		t.Errorf("%d limiter calls, %d script commands; want 3 and 3 (the bound)", path.LimiterCalls, scripts.Load())
	}
}

// TestOutcomeUnknownPastDeadlineNotRepeated holds the script call past the
// message's deadline, so admit cannot tell whether it ran
// (ErrOutcomeUnknown) and no time is left for the one repeat: the worker
// returns the error, which nacks the message.
func TestOutcomeUnknownPastDeadlineNotRepeated(t *testing.T) {
	e := newEnv(t, nil, withRetryUnknown())
	e.seed(t, "42", false)
	if _, err := e.process(t, limits.LaneStandard, chat("42")); err != nil { // loads the channel and the script
		t.Fatal(err)
	}
	var scripts atomic.Int64
	e.c.Gate = func(cmd valkey.Completed) {
		if testenv.IsCommand(cmd, "EVALSHA") || testenv.IsCommand(cmd, "EVAL") {
			scripts.Add(1)
			time.Sleep(200 * time.Millisecond) // past the message's deadline
		}
	}
	// 100 ms of the message's 5 s lifetime are left.
	m := e.message(chat("42"))
	m.Published = time.Now().Add(-5*time.Second + 100*time.Millisecond)
	path, err := e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	var nack *bus.ExpectedNack
	var drop *bus.Dropped
	if !errors.Is(err, admit.ErrOutcomeUnknown) || errors.As(err, &nack) || errors.As(err, &drop) || path.Decided {
		t.Errorf("path %+v, err %v: want an ErrOutcomeUnknown error", path, err)
	}
	if path.LimiterCalls != 1 || scripts.Load() != 1 {
		t.Errorf("%d limiter calls, %d script commands; want 1 and 1 (no time left to repeat it)", path.LimiterCalls, scripts.Load())
	}
	notExecuted, unknown := e.metrics.LimiterFailures(limits.LaneStandard)
	if notExecuted != 0 || unknown != 1 || e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionOutcomeUnknown) != 0 {
		t.Errorf("metrics: %d not executed, %d unknown, %d retries; want 0, 1, 0", notExecuted, unknown, e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionOutcomeUnknown))
	}
}

// slowChat are limits whose chat buckets refill one token an hour, so a
// test can read exactly how many tokens its messages took.
func slowChat() limits.Limits {
	l := limits.DefaultLimits
	l.ChatStandard = admit.MustSpec(admit.Every(time.Hour), 10)
	l.ChatShared = admit.MustSpec(admit.Every(time.Hour), 20)
	return l
}

// tokens reads the tokens field of a bucket hash.
func (e *env) tokens(t *testing.T, key string) string {
	t.Helper()
	v, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Hget().Key(key).Field("tokens").Build()).ToString()
	if err != nil {
		t.Fatalf("HGET %s tokens: %v", key, err)
	}
	return v
}

// TestOutcomeUnknownRetriedOnce loses the reply of the first script call
// after the server ran it (the decision was made and charged; the client
// sees a dropped connection: ErrOutcomeUnknown). The worker repeats the
// call once under the same id: the server returns the recorded Decision and
// takes nothing, so the message is sent once and both buckets are charged
// once. Lost twice, the error nacks the message, still charged once; its
// redelivery, under the same message id (DecisionID), gets the recorded
// admission back and is not charged again.
func TestOutcomeUnknownRetriedOnce(t *testing.T) {
	e := newEnv(t, nil, withLimits(slowChat()), withRetryUnknown())
	e.seed(t, "42", false)
	std, shared := channels.ChatKeys(e.prefix, "42")
	if p, err := e.process(t, limits.LaneStandard, chat("42")); err != nil || !p.Admitted { // loads the channel and the script
		t.Fatalf("warm-up: %+v, %v", p, err)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "9" || b != "19" {
		t.Fatalf("after one message: %s and %s tokens, want 9 and 19", a, b)
	}
	var scripts, lost, loseFirst atomic.Int64
	loseFirst.Store(1)
	isScript := func(cmd valkey.Completed) bool {
		return testenv.IsCommand(cmd, "EVALSHA") || testenv.IsCommand(cmd, "EVAL")
	}
	e.c.Lose = func(cmd valkey.Completed) error {
		if isScript(cmd) && scripts.Add(1) <= loseFirst.Load() {
			lost.Add(1)
			return io.ErrUnexpectedEOF // the connection dropped before the reply
		}
		return nil
	}
	sent := e.fake.Requests()

	m := e.message(chat("42"))
	path, err := e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	if err != nil || !path.Admitted || path.LimiterCalls != 2 || scripts.Load() != 2 || lost.Load() != 1 {
		t.Fatalf("path %+v, err %v, %d script commands, %d replies lost; want admitted after 2 calls, 2 scripts, 1 lost", path, err, scripts.Load(), lost.Load())
	}
	if n := e.fake.Requests() - sent; n != 1 {
		t.Errorf("sent %d times, want exactly once", n)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "8" || b != "18" {
		t.Errorf("%s and %s tokens, want 8 and 18: charged exactly once (7 and 17 would be twice)", a, b)
	}
	record, err := admit.OnceRecordKey(std, DecisionID(m))
	if err != nil {
		t.Fatal(err)
	}
	// The record holds "<reply>|<request>" (docs/errors.md, AllowOrderedOnce).
	rec, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Get().Key(record).Build()).ToString()
	if reply, _, _ := strings.Cut(rec, "|"); err != nil || reply != "0 0 8 18" {
		t.Errorf("record %q, %v; want the first call's reply \"0 0 8 18\" under the message's id", rec, err)
	}
	notExecuted, unknown := e.metrics.LimiterFailures(limits.LaneStandard)
	if notExecuted != 0 || unknown != 1 || e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionOutcomeUnknown) != 1 ||
		e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionNotExecuted) != 0 || e.metrics.Admitted(limits.LaneStandard) != 2 {
		t.Errorf("metrics: %d not executed, %d unknown, %d retries after unknown, %d after not executed, %d admitted; want 0, 1, 1, 0, 2",
			notExecuted, unknown, e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionOutcomeUnknown),
			e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionNotExecuted), e.metrics.Admitted(limits.LaneStandard))
	}

	// Both replies lost: the repeat is not repeated; the error nacks the
	// message (an error, not an expected nack or a drop).
	scripts.Store(0)
	lost.Store(0)
	loseFirst.Store(2)
	m = e.message(chat("42"))
	sent = e.fake.Requests()
	path, err = e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	var nack *bus.ExpectedNack
	var drop *bus.Dropped
	if !errors.Is(err, admit.ErrOutcomeUnknown) || errors.As(err, &nack) || errors.As(err, &drop) || path.Decided ||
		path.LimiterCalls != 2 || scripts.Load() != 2 || lost.Load() != 2 {
		t.Errorf("path %+v, err %v, %d script commands, %d lost: want an ErrOutcomeUnknown error after 2 calls", path, err, scripts.Load(), lost.Load())
	}
	if n := e.fake.Requests() - sent; n != 0 {
		t.Errorf("sent %d times, want none", n)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "7" || b != "17" {
		t.Errorf("%s and %s tokens, want 7 and 17: the first call charged once, the repeat took nothing", a, b)
	}
	if got := e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionOutcomeUnknown); got != 2 {
		t.Errorf("%d retries after outcome unknown, want 2 (one per message)", got)
	}

	// The redelivery carries the message's own id: the server returns the
	// admission the first call recorded, and nothing is charged again.
	scripts.Store(0)
	e.c.Lose = nil
	m.Attempt++
	sent = e.fake.Requests()
	path, err = e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	if err != nil || !path.Admitted || path.LimiterCalls != 1 || path.Redecided {
		t.Errorf("redelivery: path %+v, err %v; want admitted in one call (the recorded admission)", path, err)
	}
	if n := e.fake.Requests() - sent; n != 1 {
		t.Errorf("redelivery sent %d times, want once", n)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "7" || b != "17" {
		t.Errorf("after the redelivery %s and %s tokens, want 7 and 17: not charged again", a, b)
	}
}

// TestOutcomeUnknownOverTheBus: the same lost reply on a message delivered
// by JetStream. The decision's id comes from the delivery's metadata (the
// stream and sequence the publish returned); the message is acked on its
// first delivery, sent once, charged once, and no error is reported.
func TestOutcomeUnknownOverTheBus(t *testing.T) {
	e := newEnv(t, nil, withLimits(slowChat()), withRetryUnknown())
	e.seed(t, "42", false)
	std, shared := channels.ChatKeys(e.prefix, "42")
	if p, err := e.process(t, limits.LaneStandard, chat("42")); err != nil || !p.Admitted { // loads the channel and the script
		t.Fatalf("warm-up: %+v, %v", p, err)
	}
	var scripts, reports, finals atomic.Int64
	e.c.Lose = func(cmd valkey.Completed) error {
		if (testenv.IsCommand(cmd, "EVALSHA") || testenv.IsCommand(cmd, "EVAL")) && scripts.Add(1) == 1 {
			return io.ErrUnexpectedEOF
		}
		return nil
	}
	b := newTestBus(t, bus.Config{
		OnError: func(string, error) { reports.Add(1) },
		Observe: func(m *bus.Message, o bus.Outcome, reason uint8) {
			if o.Final() {
				finals.Add(1)
			}
		},
	})
	subject := b.cfg.Subjects[limits.LaneStandard]
	ids := make(chan string, 4)
	handler := func(ctx context.Context, m *bus.Message) error {
		ids <- DecisionID(m)
		return e.worker.Handler(limits.LaneStandard)(ctx, m)
	}
	sent := e.fake.Requests()
	seq, err := b.Publish(testenv.Ctx(t), subject, []byte(chat("42")))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Consume(testenv.Ctx(t), subject, 1, handler); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(func() bool { return finals.Load() == 1 }) {
		t.Fatalf("the message did not finish; stats %+v", b.Stats())
	}
	if got := b.Stats(); got != (bus.Stats{Delivered: 1, Acked: 1}) {
		t.Errorf("stats %+v, want one delivery, acked", got)
	}
	id := <-ids
	if want := b.cfg.Stream + ":" + strconv.FormatUint(seq, 10) + ":"; !strings.HasPrefix(id, want) || strings.Count(id, ":") != 2 {
		t.Errorf("decision id %q, want %s<stored at>", id, want)
	}
	if n := e.fake.Requests() - sent; n != 1 || scripts.Load() != 2 || reports.Load() != 0 {
		t.Errorf("sent %d times after %d script commands, %d errors reported; want 1, 2, 0", n, scripts.Load(), reports.Load())
	}
	if a, c := e.tokens(t, std), e.tokens(t, shared); a != "8" || c != "18" {
		t.Errorf("%s and %s tokens, want 8 and 18: charged exactly once", a, c)
	}
	if got := e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionOutcomeUnknown); got != 1 {
		t.Errorf("%d retries after outcome unknown, want 1", got)
	}
}

// TestOutcomeUnknownNotRetriedByDefault: the plan's rule, the worker's
// default: the script is not retried. The first script call's reply is
// lost after the server ran it (charged): the message fails at once with
// ErrOutcomeUnknown after that one call, nothing is sent, no id record is
// written, and the redelivery decides afresh and is charged again (the
// trade-off Config.RetryOutcomeUnknown takes the other way).
func TestOutcomeUnknownNotRetriedByDefault(t *testing.T) {
	e := newEnv(t, nil, withLimits(slowChat()))
	e.seed(t, "42", false)
	std, shared := channels.ChatKeys(e.prefix, "42")
	if p, err := e.process(t, limits.LaneStandard, chat("42")); err != nil || !p.Admitted { // loads the channel and the script
		t.Fatalf("warm-up: %+v, %v", p, err)
	}
	var scripts atomic.Int64
	e.c.Lose = func(cmd valkey.Completed) error {
		if (testenv.IsCommand(cmd, "EVALSHA") || testenv.IsCommand(cmd, "EVAL")) && scripts.Add(1) == 1 {
			return io.ErrUnexpectedEOF // the connection dropped before the reply
		}
		return nil
	}
	sent := e.fake.Requests()
	m := e.message(chat("42"))
	path, err := e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	if !errors.Is(err, admit.ErrOutcomeUnknown) || path.LimiterCalls != 1 || scripts.Load() != 1 || path.Decided {
		t.Fatalf("path %+v, err %v, %d script commands; want ErrOutcomeUnknown after one call", path, err, scripts.Load())
	}
	if n := e.fake.Requests() - sent; n != 0 {
		t.Errorf("sent %d times, want none", n)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "8" || b != "18" {
		t.Errorf("%s and %s tokens, want 8 and 18: the lost call ran and charged", a, b)
	}
	record, err := admit.OnceRecordKey(std, DecisionID(m))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Exists().Key(record).Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("id record %s exists (%d, %v); want none without RetryOutcomeUnknown", record, n, err)
	}
	if got := e.metrics.LimiterRetries(limits.LaneStandard, metrics.DecisionOutcomeUnknown); got != 0 {
		t.Errorf("%d retries after outcome unknown, want 0", got)
	}
	m.Attempt++
	path, err = e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	if err != nil || !path.Admitted || path.LimiterCalls != 1 {
		t.Errorf("redelivery: path %+v, err %v; want admitted in one call", path, err)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "7" || b != "17" {
		t.Errorf("after the redelivery %s and %s tokens, want 7 and 17: decided and charged again", a, b)
	}
}

func TestRetryOrDrop(t *testing.T) {
	for _, c := range []struct {
		retry, remaining time.Duration
		nack             bool
	}{
		{time.Second, 2 * time.Second, true},
		{2*time.Second - 1, 2 * time.Second, true},
		{2 * time.Second, 2 * time.Second, false}, // redelivered at the deadline: expired
		{3 * time.Second, 2 * time.Second, false},
		{time.Second, -time.Second, false},
	} {
		err := bus.RetryOrDrop(bus.NackLimited, c.retry, c.remaining)
		var nack *bus.ExpectedNack
		var drop *bus.Dropped
		switch {
		case c.nack && (!errors.As(err, &nack) || nack.RetryAfter != c.retry || nack.Reason != bus.NackLimited):
			t.Errorf("retry %v, remaining %v: %v, want a limited nack after %v", c.retry, c.remaining, err, c.retry)
		case !c.nack && (!errors.As(err, &drop) || drop.Reason != bus.DropNoTimeLimited):
			t.Errorf("retry %v, remaining %v: %v, want dropped (no time to retry)", c.retry, c.remaining, err)
		}
	}
}

// TestDenialIsExpectedNack sends 11 standard messages to one channel over
// NATS: its standard share admits 10; the 11th is nacked with the
// limiter's delay, counted by reason, never reported as an error, and
// acked once redelivered after that delay (the share has refilled).
func TestDenialIsExpectedNack(t *testing.T) {
	e := newEnv(t, nil, withDelayUntilToken())
	e.seed(t, "42", false)
	var reports, finals atomic.Int64
	var mu sync.Mutex
	var delays []time.Duration
	b := newTestBus(t, bus.Config{
		OnError: func(string, error) { reports.Add(1) },
		Observe: func(m *bus.Message, o bus.Outcome, reason uint8) {
			e.metrics.Delivery(m, o, reason)
			if o.Final() {
				finals.Add(1)
			}
		},
	})
	subject := b.cfg.Subjects[limits.LaneStandard]
	handler := func(ctx context.Context, m *bus.Message) error {
		err := e.worker.Handler(limits.LaneStandard)(ctx, m)
		var nack *bus.ExpectedNack
		if errors.As(err, &nack) {
			mu.Lock()
			delays = append(delays, nack.RetryAfter)
			mu.Unlock()
		}
		return err
	}
	for range 11 {
		if _, err := b.Publish(testenv.Ctx(t), subject, []byte(chat("42"))); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Consume(testenv.Ctx(t), subject, 1, handler); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(func() bool { return finals.Load() == 11 }) {
		t.Fatalf("%d of 11 messages finished; stats %+v", finals.Load(), b.Stats())
	}
	want := bus.Stats{Delivered: 12, Acked: 11}
	want.Nacked[bus.NackLimited] = 1
	if got := b.Stats(); got != want {
		t.Errorf("stats\n got %+v\nwant %+v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(delays) != 1 || delays[0] <= 0 || delays[0] > limits.DefaultLimits.ChatStandard.Interval() {
		t.Errorf("nack delays %v, want one: the limiter's RetryAfter, in (0, %v]", delays, limits.DefaultLimits.ChatStandard.Interval())
	}
	if n := reports.Load(); n != 0 {
		t.Errorf("%d error reports for a denial, want 0", n)
	}
	if a, d := e.metrics.Admitted(limits.LaneStandard), e.metrics.Denied(limits.LaneStandard, limits.ClassStandard); a != 11 || d != 1 {
		t.Errorf("metrics: %d admitted, %d denied by the standard share; want 11 and 1", a, d)
	}
}

// TestDenialBeyondLifetimeDropped: a denied message with less life left
// than the limiter's delay is dropped at once, not nacked.
func TestDenialBeyondLifetimeDropped(t *testing.T) {
	e := newEnv(t, nil, withDelayUntilToken())
	e.seed(t, "42", false)
	for i := range 10 {
		if _, err := e.process(t, limits.LaneStandard, chat("42")); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	// The share refills one token every 3 s; this message has 1 s left.
	old := &bus.Message{Data: []byte(chat("42")), Published: time.Now().Add(-4 * time.Second)}
	path, err := e.worker.Process(testenv.Ctx(t), limits.LaneStandard, old)
	var drop *bus.Dropped
	if !errors.As(err, &drop) || drop.Reason != bus.DropNoTimeLimited || !path.Decided || path.Admitted {
		t.Errorf("path %+v, err %v: want denied and dropped (no time to retry)", path, err)
	}
	// The same denial with the whole lifetime left is a nack.
	path, err = e.process(t, limits.LaneStandard, chat("42"))
	var nack *bus.ExpectedNack
	if !errors.As(err, &nack) || nack.Reason != bus.NackLimited || path.Admitted {
		t.Errorf("path %+v, err %v: want a limited nack", path, err)
	}
}

// TestValkeyDownIsRealError: with the server gone, the limiter's failure
// is a dependency failure: reported and redelivered, not an expected nack.
func TestValkeyDownIsRealError(t *testing.T) {
	srv := testenv.Own(t)
	e := newEnv(t, srv, withPrefix("down:"))
	e.seed(t, "42", false)
	if _, err := e.process(t, limits.LaneStandard, chat("42")); err != nil { // warms the channel cache
		t.Fatal(err)
	}
	srv.Stop()

	_, err := e.process(t, limits.LaneStandard, chat("42"))
	var nack *bus.ExpectedNack
	var drop *bus.Dropped
	if err == nil || errors.As(err, &nack) || errors.As(err, &drop) {
		t.Fatalf("limiter with the server down: %v, want a real error", err)
	}
	if !errors.Is(err, admit.ErrNotExecuted) && !errors.Is(err, admit.ErrOutcomeUnknown) {
		t.Errorf("error %v lost admit's class", err)
	}

	var reports atomic.Int64
	var events sync.Map // outcome -> count
	b := newTestBus(t, bus.Config{
		ErrorDelay: 10 * time.Second, // past the lifetime: the error is reported, then the message dropped
		OnError:    func(string, error) { reports.Add(1) },
		Observe: func(_ *bus.Message, o bus.Outcome, _ uint8) {
			n, _ := events.LoadOrStore(o, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		},
	})
	subject := b.cfg.Subjects[limits.LaneStandard]
	b.Consume(testenv.Ctx(t), subject, 1, func(ctx context.Context, m *bus.Message) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := e.worker.Process(ctx, limits.LaneStandard, m)
		return err
	})
	b.Publish(testenv.Ctx(t), subject, []byte(chat("42")))
	if !testenv.WaitFor(func() bool { return b.Stats().Dropped[bus.DropNoTimeError] == 1 }) {
		t.Fatalf("stats %+v: want the error, then a drop (no time to retry)", b.Stats())
	}
	if s := b.Stats(); reports.Load() != 1 || s.Errors != 0 || s.Acked != 0 || s.Nacked != [bus.NumNackReasons]int64{} {
		t.Errorf("stats %+v, %d reports: want the error reported once, nothing acked or nacked as expected", s, reports.Load())
	}
}

// TestNackSuppressionKeepsRedeliveryTiming: by default (no
// DelayUntilToken) a denied message comes back after the bus's error
// delay, whether the nack-suppression step is on (an expected nack, not
// reported) or off (a plain error, reported): the step changes what is
// reported, not when the message is redelivered. The share refills in an
// hour, past the message's life: it is not dropped early either.
func TestNackSuppressionKeepsRedeliveryTiming(t *testing.T) {
	srv := testenv.Shared(t)
	for _, off := range []Steps{0, StepNackSuppression} {
		t.Run("off="+off.String(), func(t *testing.T) {
			l := slowChat()
			l.ChatStandard = admit.MustSpec(admit.Every(time.Hour), 1)
			e := newEnv(t, srv, withLimits(l), withOff(off))
			e.seed(t, "42", false)
			if p, err := e.process(t, limits.LaneStandard, chat("42")); err != nil || !p.Admitted { // the share's one token
				t.Fatalf("first message: %+v, %v", p, err)
			}
			var deliveries, reports atomic.Int64
			b := newTestBus(t, bus.Config{ErrorDelay: 50 * time.Millisecond, OnError: func(string, error) { reports.Add(1) }})
			subject := b.cfg.Subjects[limits.LaneStandard]
			h := e.worker.Handler(limits.LaneStandard)
			if err := b.Consume(testenv.Ctx(t), subject, 1, func(ctx context.Context, m *bus.Message) error {
				deliveries.Add(1)
				return h(ctx, m)
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Publish(testenv.Ctx(t), subject, []byte(chat("42"))); err != nil {
				t.Fatal(err)
			}
			if !testenv.WaitFor(func() bool { return deliveries.Load() >= 3 }) {
				t.Fatalf("%d deliveries, stats %+v; want the denied message back after the 50 ms error delay, again and again", deliveries.Load(), b.Stats())
			}
			st := b.Stats()
			if sum(st.Dropped[:]) != 0 {
				t.Errorf("stats %+v: dropped, want redelivered", st)
			}
			if off == 0 && (reports.Load() != 0 || st.Nacked[bus.NackLimited] < 2) {
				t.Errorf("step on: %d reports, stats %+v; want expected nacks, none reported", reports.Load(), st)
			}
			if off != 0 && (reports.Load() < 2 || st.Errors < 2) {
				t.Errorf("step off: %d reports, stats %+v; want errors, reported", reports.Load(), st)
			}
		})
	}
}

// sum adds counts.
func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}

// TestSameDelayAsErrorOverridesRetryAfter: an expected nack marked
// SameDelayAsError is redelivered after the bus's error delay, not after
// its RetryAfter (an hour here, past the message's life, which would drop
// it), and is not reported.
func TestSameDelayAsErrorOverridesRetryAfter(t *testing.T) {
	var deliveries, reports atomic.Int64
	b := newTestBus(t, bus.Config{ErrorDelay: 50 * time.Millisecond, OnError: func(string, error) { reports.Add(1) }})
	subject := b.cfg.Subjects[limits.LaneStandard]
	if err := b.Consume(testenv.Ctx(t), subject, 1, func(context.Context, *bus.Message) error {
		deliveries.Add(1)
		return &bus.ExpectedNack{Reason: bus.NackLimited, RetryAfter: time.Hour, SameDelayAsError: true}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(testenv.Ctx(t), subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(func() bool { return deliveries.Load() >= 3 }) {
		t.Fatalf("%d deliveries, stats %+v; want redelivered after the error delay", deliveries.Load(), b.Stats())
	}
	if st := b.Stats(); sum(st.Dropped[:]) != 0 || st.Nacked[bus.NackLimited] < 2 || reports.Load() != 0 {
		t.Errorf("stats %+v, %d reports; want expected nacks, none dropped or reported", st, reports.Load())
	}
}

// TestPauseEventsOnNATS: a worker's pause change travels as one event on
// the fleet's NATS subject, and every replica applies it. Three workers
// share a Valkey (a server of the test's own) and a subject; the first
// pauses, then resumes. A subscriber of the test's own counts the subject's
// messages: exactly "1:1" and "0:2" (then the test's marker). Each other
// replica applies both events (it reconciles once an hour, so only the
// events can tell it) and its worker's next message is a paused nack,
// then, after the resume, admitted. Valkey carries no pub/sub at all: its
// INFO commandstats counts no PUBLISH and no SUBSCRIBE.
func TestPauseEventsOnNATS(t *testing.T) {
	srv := testenv.Own(t)
	first := newEnv(t, srv)
	replicas := []*env{first, newEnv(t, srv, withPrefix(first.prefix)), newEnv(t, srv, withPrefix(first.prefix))}
	first.seed(t, "42", false)
	subject := testenv.PauseSubject(first.prefix)

	var mu sync.Mutex
	var seen []string
	counter := testenv.NATSConn(t)
	if _, err := counter.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, string(m.Data))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := counter.FlushWithContext(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	messages := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}

	for i, paused := range []bool{true, false} {
		version, err := first.pause.SetPaused(testenv.Ctx(t), paused, int64(i))
		if err != nil || version != int64(i+1) {
			t.Fatalf("SetPaused(%v): version %d, %v; want version %d", paused, version, err, i+1)
		}
		for r, e := range replicas {
			if !testenv.WaitFor(func() bool { s, _ := e.pause.Snapshot(); return s.Version == version }) {
				t.Fatalf("replica %d never applied version %d: %+v", r, version, e.pause.Stats())
			}
			path, err := e.process(t, limits.LanePremium, chat("42"))
			var nack *bus.ExpectedNack
			switch {
			case paused && (!path.Paused || !errors.As(err, &nack) || nack.Reason != bus.NackPaused):
				t.Errorf("replica %d while paused: path %+v, err %v; want a paused nack", r, path, err)
			case !paused && (path.Paused || !path.Admitted || err != nil):
				t.Errorf("replica %d after the resume: path %+v, err %v; want admitted and sent", r, path, err)
			}
		}
	}

	// A marker published after both changes arrives after both events;
	// once every receiver has it, the counts are final.
	marker := testenv.NATSConn(t)
	if err := marker.Publish(subject, []byte("marker")); err != nil {
		t.Fatal(err)
	}
	if err := marker.FlushWithContext(testenv.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(func() bool { m := messages(); return len(m) > 0 && m[len(m)-1] == "marker" }) {
		t.Fatalf("the marker never arrived; messages on %s: %q", subject, messages())
	}
	if got := messages(); !slices.Equal(got, []string{"1:1", "0:2", "marker"}) {
		t.Errorf("messages on %s: %q; want exactly \"1:1\", \"0:2\" (then the test's marker)", subject, got)
	}
	for r, e := range replicas {
		if !testenv.WaitFor(func() bool { return e.pause.Stats().EventsMalformed == 1 }) {
			t.Fatalf("replica %d never received the marker: %+v", r, e.pause.Stats())
		}
		applied, ignored := int64(2), int64(0)
		if r == 0 { // the writer applied each change when its transaction returned; its own events come back to it, ignored
			applied, ignored = 0, 2
		}
		if st := e.pause.Stats(); st.EventsApplied != applied || st.EventsIgnored != ignored || st.Reconciles != 1 {
			t.Errorf("replica %d: %d events applied, %d ignored, %d reconciles; want %d, %d and 1 (the initial load)",
				r, st.EventsApplied, st.EventsIgnored, st.Reconciles, applied, ignored)
		}
	}
	stats := testenv.CommandStats(t, first.raw)
	for _, name := range []string{"publish", "spublish", "subscribe", "ssubscribe", "psubscribe"} {
		if n := stats[name].Calls; n != 0 {
			t.Errorf("Valkey ran %s %d times; want 0 (the pause events are on NATS)", name, n)
		}
	}
}

// TestCommandsPerMessage counts, from the server's INFO commandstats, the
// commands each path sends: the plan's table, before and after, exactly.
// It runs on a server of its own, so no other traffic is counted.
func TestCommandsPerMessage(t *testing.T) {
	srv := testenv.Own(t)
	e := newEnv(t, srv)
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		e.seed(t, id, false)
	}
	start := testenv.CommandStats(t, e.raw)
	// The Limiter's observer (metrics.ObserveLimiter) counts every call that
	// reached the server: exactly the script runs the server counted (the
	// pause writes are a MULTI/EXEC, no script).
	defer func() {
		end := testenv.CommandStats(t, e.raw)
		runs := end["evalsha"].Calls - start["evalsha"].Calls - (end["evalsha"].Failed - start["evalsha"].Failed) + end["eval"].Calls - start["eval"].Calls
		if got := e.metrics.ScriptRuns(); got != runs || runs == 0 {
			t.Errorf("the observer counted %d script runs, the server %d", got, runs)
		}
	}()
	// once: the path decides with AllowOrderedOnce (the worker's), not
	// with AllowOrdered (the legacy path's).
	measure := func(t *testing.T, want map[string]int64, once bool, send func() (Path, error)) (Path, error) {
		t.Helper()
		before := testenv.CommandStats(t, e.raw)
		path, err := send()
		after := testenv.CommandStats(t, e.raw)
		if diff := cmp.Diff(want, commandDelta(t, before, after, once)); diff != "" {
			t.Errorf("commands (-want +got):\n%s", diff)
		}
		return path, err
	}
	send := func(lane limits.Lane, body string) func() (Path, error) {
		return func() (Path, error) { return e.process(t, lane, body) }
	}
	legacy := func(lane limits.Lane, body string) func() (Path, error) {
		return func() (Path, error) {
			_, p, err := e.worker.LegacyPrepare(testenv.Ctx(t), lane, &bus.Message{Data: []byte(body), Published: e.worker.cfg.Now()})
			return p, err
		}
	}

	// With no cached script, the first decision costs EVALSHA (NOSCRIPT)
	// and EVAL; every later one is one EVALSHA. (The server is fresh; the
	// flush covers VALKEY_ADDR with VALKEY_ALLOW_DESTRUCTIVE=1.)
	if err := e.raw.Do(testenv.Ctx(t), e.raw.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := measure(t, map[string]int64{"evalsha": 1, "eval": 1, "hgetall": 1}, e.worker.cfg.RetryOutcomeUnknown, send(limits.LaneStandard, chat("5"))); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		lane limits.Lane
		body string
		old  bool
		want map[string]int64
	}{
		{"after/standard/cold", limits.LaneStandard, chat("1"), false, map[string]int64{"hgetall": 1, "evalsha": 1}},
		{"after/standard/warm", limits.LaneStandard, chat("1"), false, map[string]int64{"evalsha": 1}},
		{"after/premium/cold", limits.LanePremium, chat("2"), false, map[string]int64{"hgetall": 1, "evalsha": 1}},
		{"after/premium/warm", limits.LanePremium, chat("2"), false, map[string]int64{"evalsha": 1}},
		{"after/helix-api/system", limits.LaneSystem, `{"kind":"api","method":"GET","path":"/helix/users"}`, false, map[string]int64{"evalsha": 1}},
		{"after/announce/warm", limits.LaneStandard, `{"kind":"announce","channel":"1","text":"hi"}`, false, map[string]int64{"evalsha": 1}},
		{"before/standard/cold", limits.LaneStandard, chat("3"), true, map[string]int64{"get": 1, "hgetall": 1, "evalsha": 2}},
		{"before/standard/warm", limits.LaneStandard, chat("3"), true, map[string]int64{"get": 1, "evalsha": 2}},
		{"before/premium/cold", limits.LanePremium, chat("4"), true, map[string]int64{"get": 1, "hgetall": 1, "evalsha": 1}},
		{"before/premium/warm", limits.LanePremium, chat("4"), true, map[string]int64{"get": 1, "evalsha": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := send(c.lane, c.body)
			if c.old {
				f = legacy(c.lane, c.body)
			}
			p, err := measure(t, c.want, !c.old && e.worker.cfg.RetryOutcomeUnknown, f)
			if err != nil || !p.Admitted {
				t.Errorf("path %+v, err %v: want admitted and sent; the counts are for that path", p, err)
			}
		})
	}

	t.Run("after/paused", func(t *testing.T) {
		if _, err := e.pause.SetPaused(testenv.Ctx(t), true, 0); err != nil {
			t.Fatal(err)
		}
		p, err := measure(t, map[string]int64{}, true, send(limits.LaneStandard, chat("1")))
		var nack *bus.ExpectedNack
		if !p.Paused || !errors.As(err, &nack) || nack.Reason != bus.NackPaused {
			t.Errorf("path %+v, err %v: want stopped by the pause with an expected nack", p, err)
		}
	})
}

// TestHelixRoutesShareOneHelper: the three Helix routes are charged through
// the same per-lane plan, so spending the standard share through one route
// denies the others, while premium (the general budget alone) and system
// (its own share) still pass.
func TestHelixRoutesShareOneHelper(t *testing.T) {
	l := limits.DefaultLimits
	l.HelixStandard = admit.MustSpec(admit.Every(time.Hour), 2)
	l.HelixSystem = admit.MustSpec(admit.Every(time.Hour), 1)
	e := newEnv(t, nil, withLimits(l), withDelayUntilToken())
	e.seed(t, "1", true)
	e.seed(t, "2", false)
	api := `{"kind":"api","method":"GET","path":"/helix/users?id=1"}`
	announce := `{"kind":"announce","channel":"1","text":"hi","color":"blue"}`
	shoutout := `{"kind":"shoutout","channel":"1","to":"2"}`

	for _, kind := range []command.Kind{command.KindAPI, command.KindAnnounce, command.KindShoutout} {
		for _, lane := range []limits.Lane{limits.LaneStandard, limits.LanePremium, limits.LaneSystem} {
			if got, want := e.worker.plan(lane, kind, nil), &e.worker.helixBy[lane]; got != want {
				t.Errorf("%v on %v: a plan of its own, want the lane's shared Helix plan", kind, lane)
			}
		}
	}

	steps := []struct {
		lane    limits.Lane
		body    string
		allowed bool
		denied  limits.BucketClass
	}{
		{limits.LaneStandard, api, true, 0},
		{limits.LaneStandard, announce, true, 0},
		{limits.LaneStandard, shoutout, false, limits.ClassStandard}, // the share (2) is spent
		{limits.LaneStandard, api, false, limits.ClassStandard},
		{limits.LaneStandard, announce, false, limits.ClassStandard},
		{limits.LanePremium, shoutout, true, 0}, // the general budget alone
		{limits.LaneSystem, announce, true, 0},
		{limits.LaneSystem, api, false, limits.ClassSystem},
		{limits.LaneSystem, shoutout, false, limits.ClassSystem},
	}
	var denied [limits.NumLanes][limits.NumClasses]int64
	for i, s := range steps {
		path, err := e.process(t, s.lane, s.body)
		// The shares refill hourly: a denial's delay outlives the message,
		// so it is dropped rather than nacked.
		var drop *bus.Dropped
		switch {
		case s.allowed && (err != nil || !path.Admitted):
			t.Errorf("step %d (%v %s): %+v, %v; want admitted and sent", i, s.lane, s.body, path, err)
		case !s.allowed && (!errors.As(err, &drop) || drop.Reason != bus.DropNoTimeLimited || !path.Decided || path.Admitted):
			t.Errorf("step %d (%v %s): %+v, %v; want denied", i, s.lane, s.body, path, err)
		}
		if !s.allowed {
			denied[s.lane][s.denied]++
		}
	}
	for lane := range limits.NumLanes {
		for class := range limits.NumClasses {
			if got := e.metrics.Denied(lane, class); got != denied[lane][class] {
				t.Errorf("%v lane denied by %v: %d, want %d", lane, class, got, denied[lane][class])
			}
		}
	}
}

// allowedLabels is every value each label of an outgress_ metric may take.
func allowedLabels() map[string][]string {
	vals := func(n int, name func(int) string) []string {
		var v []string
		for i := range n {
			v = append(v, name(i))
		}
		return v
	}
	return map[string][]string{
		"stage":        vals(int(metrics.NumStages), func(i int) string { return metrics.Stage(i).String() }),
		"lane":         vals(int(limits.NumLanes), func(i int) string { return limits.Lane(i).String() }),
		"kind":         vals(int(command.NumKinds), func(i int) string { return command.Kind(i).String() }),
		"decision":     vals(int(metrics.NumDecisions), func(i int) string { return metrics.Decision(i).String() }),
		"result":       {"hit", "miss", "joined"},
		"status_class": vals(int(helix.NumStatus), func(i int) string { return helix.StatusClass(i).String() }),
		"reused":       {"true", "false"},
		"outcome":      vals(int(bus.NumOutcomes), func(i int) string { return bus.Outcome(i).String() }),
		"reason": append(append([]string{""},
			vals(int(bus.NumNackReasons), func(i int) string { return bus.NackReason(i).String() })...),
			vals(int(bus.NumDropReasons), func(i int) string { return bus.DropReason(i).String() })...),
		"replica":     {"A"},
		"after":       {metrics.DecisionNotExecuted.String(), metrics.DecisionOutcomeUnknown.String()},
		"step":        metrics.RolloutSteps[:],
		"proto":       {"HTTP/1", "HTTP/2", "other"},
		"dropped":     {"false", "true"},
		"redelivered": {"false", "true"},
		"class":       vals(int(limits.NumClasses), func(i int) string { return limits.BucketClass(i).String() }),
		"op":          {"invalid", "take", "once", "peek", "refund", "wait-attempt"},
		"answer":      vals(int(metrics.NumCallOutcomes), func(i int) string { return metrics.CallOutcome(i).String() }),
	}
}

// TestMetricsLabelSetsFixed sends traffic on 60 channels through a worker
// and checks, on the gathered registry, that every outgress_ series' labels
// take only the fixed values and that the traffic created no series: the
// set after equals the set created up front.
func TestMetricsLabelSetsFixed(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.metrics.RegisterPause("A", e.pause); err != nil {
		t.Fatal(err)
	}
	series := func() []string {
		t.Helper()
		mfs, err := e.metrics.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		allowed := allowedLabels()
		var out []string
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "outgress_") {
				continue
			}
			for _, m := range mf.GetMetric() {
				id := mf.GetName()
				for _, lp := range m.GetLabel() {
					if !slices.Contains(allowed[lp.GetName()], lp.GetValue()) {
						t.Errorf("%s: label %s=%q is not one of the fixed values", mf.GetName(), lp.GetName(), lp.GetValue())
					}
					id += "," + lp.GetName() + "=" + lp.GetValue()
				}
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	before := series()
	for i := range 60 {
		id := strconv.Itoa(5000 + i)
		e.seed(t, id, i%5 == 0)
		for _, body := range []string{chat(id), `{"kind":"api","method":"GET","path":"/helix/users?id=` + id + `"}`, chat("999" + id)} {
			e.process(t, limits.Lane(i%2), body)
		}
	}
	if after := series(); !slices.Equal(before, after) {
		t.Errorf("traffic changed the series: %d before, %d after", len(before), len(after))
	}
	// 60 standard/premium chats, 60 API calls, 60 unknown channels.
	if got := e.metrics.Commands(limits.LaneStandard, command.KindChat) + e.metrics.Commands(limits.LanePremium, command.KindChat); got != 120 {
		t.Errorf("%d chat commands counted, want 120", got)
	}
	if got := e.metrics.CacheLookups(channels.CacheMiss); got != 120 {
		t.Errorf("%d cache misses, want 120 (60 channels, 60 unknown)", got)
	}
}

// TestRefusalInsideLifetimeKeepsErrorDelay: by default (no
// DelayUntilToken) a denial whose RetryAfter falls inside the message's
// life (the standard share refills a token every 3 s; the message has
// 5 s) is an expected nack marked SameDelayAsError: the bus redelivers
// it after its error delay (1 s), as before nack suppression, not after
// the limiter's RetryAfter. With DelayUntilToken it carries the
// RetryAfter instead.
func TestRefusalInsideLifetimeKeepsErrorDelay(t *testing.T) {
	for _, delayToken := range []bool{false, true} {
		t.Run(fmt.Sprintf("DelayUntilToken=%v", delayToken), func(t *testing.T) {
			var opts []envOption
			if delayToken {
				opts = append(opts, withDelayUntilToken())
			}
			e := newEnv(t, nil, opts...)
			e.seed(t, "42", false)
			for i := range 10 { // the share's burst
				if p, err := e.process(t, limits.LaneStandard, chat("42")); err != nil || !p.Admitted {
					t.Fatalf("message %d: %+v, %v", i, p, err)
				}
			}
			p, err := e.process(t, limits.LaneStandard, chat("42"))
			var nack *bus.ExpectedNack
			if !errors.As(err, &nack) || nack.Reason != bus.NackLimited || p.Admitted || !p.Decided {
				t.Fatalf("the 11th message: %+v, %v; want a limited nack", p, err)
			}
			life := e.worker.cfg.Lifetime
			if nack.RetryAfter <= 0 || nack.RetryAfter >= life {
				t.Fatalf("RetryAfter %v, want inside the lifetime %v (the case under test)", nack.RetryAfter, life)
			}
			if nack.SameDelayAsError == delayToken {
				t.Errorf("nack %+v: SameDelayAsError %v, want %v (redelivered after the %s)", nack, nack.SameDelayAsError, !delayToken,
					map[bool]string{false: "bus's error delay", true: "limiter's RetryAfter"}[delayToken])
			}
		})
	}
}
