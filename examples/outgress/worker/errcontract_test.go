package worker

import (
	"context"
	"errors"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/valkey-io/valkey-go"
)

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
