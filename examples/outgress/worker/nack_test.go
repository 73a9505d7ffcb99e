package worker

import (
	"context"
	"errors"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
)

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
