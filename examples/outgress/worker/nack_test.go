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
	e := newEnv(t, nil)
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
	e := newEnv(t, nil)
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
