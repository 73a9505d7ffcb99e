package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
)

func TestParseSteps(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Steps
	}{
		{"all", AllSteps}, {"none", 0}, {"", 0},
		{"metrics", StepMetrics},
		{"ordered_script, pause_snapshot", StepOrderedScript | StepPauseSnapshot},
		{"metrics,transport,ordered_script,pause_snapshot,nack_suppression,precomputed", AllSteps},
	} {
		got, err := ParseSteps(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSteps(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if back, err := ParseSteps(got.String()); err != nil || back != got {
			t.Errorf("ParseSteps(%q.String() = %q) = %v, %v", c.in, got.String(), back, err)
		}
	}
	if _, err := ParseSteps("metrics,turbo"); err == nil {
		t.Error("an unknown step was accepted")
	}
}

// TestStepsEachSwitch runs one warm standard message through a worker with
// each step off in turn and checks what the step changes: round trips,
// stage timing, the outcome of a denial.
func TestStepsEachSwitch(t *testing.T) {
	srv := testenv.Shared(t)
	for _, c := range []struct {
		off          Steps
		limiterCalls int
		pauseLookups int
	}{
		{0, 1, 0},
		{StepMetrics, 1, 0},
		{StepTransport, 1, 0},
		{StepOrderedScript, 2, 0},
		{StepPauseSnapshot, 1, 1},
		{StepNackSuppression, 1, 0},
		{StepPrecomputed, 1, 0},
		{AllSteps, 2, 1},
	} {
		t.Run("off="+c.off.String(), func(t *testing.T) {
			e := newEnv(t, srv, withOff(c.off))
			e.seed(t, "42", false)
			if _, err := e.process(t, limits.LaneStandard, chat("42")); err != nil { // the cold message
				t.Fatal(err)
			}
			path, err := e.process(t, limits.LaneStandard, chat("42"))
			if err != nil || !path.Admitted || path.LimiterCalls != c.limiterCalls || path.PauseLookups != c.pauseLookups {
				t.Errorf("path %+v, err %v; want admitted after %d limiter calls and %d pause lookups", path, err, c.limiterCalls, c.pauseLookups)
			}
			msgs, calls := e.metrics.WarmCalls(limits.LaneStandard)
			if msgs != 1 || calls != int64(c.limiterCalls+c.pauseLookups) {
				t.Errorf("warm messages %d with %d Valkey calls, want 1 with %d", msgs, calls, c.limiterCalls+c.pauseLookups)
			}
			if n, want := e.metrics.StageLatency(0).Count, uint64(2); c.off.Has(StepMetrics) != (n == 0) || (n != 0 && n != want) {
				t.Errorf("%d decode timings; want %d with the metrics step on, 0 off", n, want)
			}
			if got := e.metrics.StageLatency(metrics.StagePreHTTP).Count; got != 2 { // recorded either way
				t.Errorf("%d pre_http timings, want 2", got)
			}
			if got := e.metrics.StageLatency(metrics.StagePublishToSent).Count; got != 2 { // both sent
				t.Errorf("%d publish_to_sent timings, want 2", got)
			}
			if got := e.metrics.Protos(helix.ProtoHTTP1); got != 2 { // every request traced (TraceEvery 1); the fake is HTTP/1.1
				t.Errorf("%d sampled HTTP/1 responses, want 2", got)
			}
			// A denial: an expected nack, or with the step off a plain error.
			for range 9 {
				e.process(t, limits.LaneStandard, chat("42"))
			}
			_, err = e.process(t, limits.LaneStandard, chat("42"))
			var nack *bus.ExpectedNack
			if c.off.Has(StepNackSuppression) == errors.As(err, &nack) || err == nil {
				t.Errorf("a denial returned %v; want an expected nack with the step on, a plain error off", err)
			}
		})
	}
}

// TestMixedFleet is the rolling deploy: a worker with every step on and
// one with every step off consume the same bus and decide on the same
// Valkey keys at once. The shares hold exactly across both (10 standard
// admissions, the shared bucket's other 10 for premium), and a pause set
// by the new worker stops the old one at once.
func TestMixedFleet(t *testing.T) {
	srv := testenv.Shared(t)
	// Refusals past their lifetime dropped at once (DelayUntilToken), in
	// both: the switch is not a rollout step.
	fresh := newEnv(t, srv, withLimits(slowChat()), withDelayUntilToken())
	old := newEnv(t, srv, withLimits(slowChat()), withPrefix(fresh.prefix), withOff(AllSteps), withDelayUntilToken())
	fresh.seed(t, "42", false)
	std, shared := channels.ChatKeys(fresh.prefix, "42")

	var finals atomic.Int64
	var handled [2]atomic.Int64
	b := newTestBus(t, bus.Config{
		Observe: func(m *bus.Message, o bus.Outcome, reason uint8) {
			if o.Final() {
				finals.Add(1)
			}
		},
	})
	for i, e := range []*env{fresh, old} {
		for _, lane := range []limits.Lane{limits.LaneStandard, limits.LanePremium} {
			h := e.worker.Handler(lane)
			err := b.Consume(testenv.Ctx(t), b.cfg.Subjects[lane], 1, func(ctx context.Context, m *bus.Message) error {
				handled[i].Add(1)
				return h(ctx, m)
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	publish := func(lane limits.Lane, n int) {
		t.Helper()
		for range n {
			if _, err := b.Publish(testenv.Ctx(t), b.cfg.Subjects[lane], []byte(chat("42"))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(limits.LaneStandard, 15)
	if !testenv.WaitFor(func() bool { return finals.Load() == 15 }) {
		t.Fatalf("%d of 15 standard messages finished; stats %+v", finals.Load(), b.Stats())
	}
	publish(limits.LanePremium, 12)
	if !testenv.WaitFor(func() bool { return finals.Load() == 27 }) {
		t.Fatalf("%d of 27 messages finished; stats %+v", finals.Load(), b.Stats())
	}
	if handled[0].Load() == 0 || handled[1].Load() == 0 {
		t.Errorf("deliveries handled: new %d, old %d; want both replicas in the run", handled[0].Load(), handled[1].Load())
	}
	adm := func(lane limits.Lane) int64 { return fresh.metrics.Admitted(lane) + old.metrics.Admitted(lane) }
	if a, p := adm(limits.LaneStandard), adm(limits.LanePremium); a != 10 || p != 10 {
		t.Errorf("admitted %d standard, %d premium across both replicas; want 10 and 10", a, p)
	}
	tok := func(lane limits.Lane, c limits.BucketClass) int64 {
		return fresh.metrics.Tokens(lane, c) + old.metrics.Tokens(lane, c)
	}
	if a, b, c := tok(limits.LaneStandard, limits.ClassStandard), tok(limits.LaneStandard, limits.ClassShared), tok(limits.LanePremium, limits.ClassShared); a != 10 || b != 10 || c != 10 {
		t.Errorf("tokens counted: standard lane %d to its share, %d to the shared bucket; premium %d; want 10, 10, 10", a, b, c)
	}
	if a, c := fresh.tokens(t, std), fresh.tokens(t, shared); a != "0" || c != "0" {
		t.Errorf("%s and %s tokens, want 0 and 0: each admission charged once, on the same keys", a, c)
	}
	s := b.Stats()
	if s.Acked != 20 || s.Dropped[bus.DropNoTimeLimited] != 7 {
		t.Errorf("stats %+v; want 20 acked, 7 dropped (no time to retry: the refill is an hour)", s)
	}

	// The new replica pauses; the old one, which GETs the flag, stops at once.
	if _, err := fresh.pause.SetPaused(testenv.Ctx(t), true, 0); err != nil {
		t.Fatal(err)
	}
	path, err := old.process(t, limits.LanePremium, chat("42"))
	if !path.Paused || err == nil {
		t.Errorf("old replica after the new one paused: path %+v, err %v; want paused", path, err)
	}
	path, err = fresh.process(t, limits.LanePremium, chat("42"))
	var nack *bus.ExpectedNack
	if !path.Paused || !errors.As(err, &nack) || nack.Reason != bus.NackPaused {
		t.Errorf("new replica: path %+v, err %v; want a paused nack", path, err)
	}
}
