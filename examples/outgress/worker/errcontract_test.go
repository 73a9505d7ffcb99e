package worker

import (
	"errors"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestNotExecutedIsRetried has the server refuse the first script call
// before running it (maxmemory 1: OOM), then accept the second: admit says
// ErrNotExecuted, so the worker repeats the decision within the delivery
// and the message is admitted, with two script calls and one retry
// counted.
func TestNotExecutedIsRetried(t *testing.T) {
	srv := testserver.Own(t)
	if !srv.Owned {
		t.Skip("changes maxmemory; skipped on VALKEY_ADDR")
	}
	e := newEnv(t, srv)
	e.seed(t, "42", false)
	if _, err := e.process(t, limits.LaneStandard, chat("42")); err != nil { // loads the channel and the script
		t.Fatal(err)
	}
	admin := testserver.NewClient(t, srv)
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
	if notExecuted != 1 || unknown != 0 || e.metrics.LimiterRetries(limits.LaneStandard) != 1 || e.metrics.Admitted(limits.LaneStandard) != 2 {
		t.Errorf("metrics: %d not executed, %d unknown, %d retries, %d admitted; want 1, 0, 1, 2",
			notExecuted, unknown, e.metrics.LimiterRetries(limits.LaneStandard), e.metrics.Admitted(limits.LaneStandard))
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

// TestOutcomeUnknownNotRepeated holds the script call past the message's
// deadline, so admit cannot tell whether it ran (ErrOutcomeUnknown): the
// worker must not repeat the decision, which may have taken tokens, and
// returns the error, which nacks the message.
func TestOutcomeUnknownNotRepeated(t *testing.T) {
	e := newEnv(t, nil)
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
	m := &bus.Message{Data: []byte(chat("42")), Published: time.Now().Add(-5*time.Second + 100*time.Millisecond)}
	path, err := e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	var nack *bus.ExpectedNack
	var drop *bus.Dropped
	if !errors.Is(err, admit.ErrOutcomeUnknown) || errors.As(err, &nack) || errors.As(err, &drop) || path.Decided {
		t.Errorf("path %+v, err %v: want an ErrOutcomeUnknown error", path, err)
	}
	if path.LimiterCalls != 1 || scripts.Load() != 1 {
		t.Errorf("%d limiter calls, %d script commands; want 1 and 1 (never repeated)", path.LimiterCalls, scripts.Load())
	}
	notExecuted, unknown := e.metrics.LimiterFailures(limits.LaneStandard)
	if notExecuted != 0 || unknown != 1 || e.metrics.LimiterRetries(limits.LaneStandard) != 0 {
		t.Errorf("metrics: %d not executed, %d unknown, %d retries; want 0, 1, 0", notExecuted, unknown, e.metrics.LimiterRetries(limits.LaneStandard))
	}
}
