package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
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
		err := retryOrDrop(NackLimited, c.retry, c.remaining)
		var nack *ExpectedNack
		var drop *Dropped
		switch {
		case c.nack && (!errors.As(err, &nack) || nack.RetryAfter != c.retry || nack.Reason != NackLimited):
			t.Errorf("retry %v, remaining %v: %v, want a limited nack after %v", c.retry, c.remaining, err, c.retry)
		case !c.nack && (!errors.As(err, &drop) || drop.Reason != DropNoTimeToRetry):
			t.Errorf("retry %v, remaining %v: %v, want dropped (no time to retry)", c.retry, c.remaining, err)
		}
	}
}

// TestDenialIsExpectedNack sends 11 standard messages to one channel over
// the bus: its standard share admits 10; the 11th is nacked with the
// limiter's delay, counted, and never reported as an error.
func TestDenialIsExpectedNack(t *testing.T) {
	e := newEnv(t, nil)
	e.seed(t, "42", false)
	var rec delays
	var reports atomic.Int64
	bus := NewMemBus(MemBusConfig{AfterFunc: func(d time.Duration, f func()) *time.Timer {
		rec.record(d)
		return time.AfterFunc(time.Hour, f) // not redelivered within the test
	}, OnError: func(string, error) { reports.Add(1) }})
	defer bus.Close()
	if err := bus.Consume("std", 1, e.worker.Handler(LaneStandard)); err != nil {
		t.Fatal(err)
	}
	for range 11 {
		if err := bus.Publish(ctxT(t), "std", []byte(chat("42"))); err != nil {
			t.Fatal(err)
		}
	}
	if !waitFor(func() bool { return bus.Stats().Delivered == 11 && len(rec.get()) == 1 }) {
		t.Fatalf("stats %+v", bus.Stats())
	}
	want := BusStats{Published: 11, Delivered: 11, Acked: 10}
	want.Nacked[NackLimited] = 1
	if got := bus.Stats(); got != want {
		t.Errorf("stats\n got %+v\nwant %+v", got, want)
	}
	if d := rec.get()[0]; d <= 0 || d > chatStandard.Interval() {
		t.Errorf("redelivery delay %v, want the limiter's RetryAfter, in (0, %v]", d, chatStandard.Interval())
	}
	if n := reports.Load(); n != 0 {
		t.Errorf("%d error reports for a denial, want 0", n)
	}
	if a, d := e.metrics.Admitted(LaneStandard), e.metrics.Denied(LaneStandard, ClassStandard); a != 10 || d != 1 {
		t.Errorf("metrics: %d admitted, %d denied by the standard share; want 10 and 1", a, d)
	}
}

// TestDenialBeyondLifetimeDropped: a denied message with less life left
// than the limiter's delay is dropped at once, not nacked.
func TestDenialBeyondLifetimeDropped(t *testing.T) {
	e := newEnv(t, nil)
	e.seed(t, "42", false)
	for i := range 10 {
		if _, err := e.process(t, LaneStandard, chat("42")); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	// The share refills one token every 3 s; this message has 1 s left.
	old := &Message{Data: []byte(chat("42")), Published: time.Now().Add(-4 * time.Second)}
	path, err := e.worker.Process(ctxT(t), LaneStandard, old)
	var drop *Dropped
	if !errors.As(err, &drop) || drop.Reason != DropNoTimeToRetry || !path.Decided || path.Admitted {
		t.Errorf("path %+v, err %v: want denied and dropped (no time to retry)", path, err)
	}
	// The same denial with the whole lifetime left is a nack.
	path, err = e.process(t, LaneStandard, chat("42"))
	var nack *ExpectedNack
	if !errors.As(err, &nack) || nack.Reason != NackLimited || path.Admitted {
		t.Errorf("path %+v, err %v: want a limited nack", path, err)
	}
}

// TestValkeyDownIsRealError: with the server gone, the limiter's failure
// is a dependency failure: reported and redelivered, not an expected nack.
func TestValkeyDownIsRealError(t *testing.T) {
	srv := testserver.Own(t)
	if !srv.Owned {
		t.Skip("stops the server; skipped on VALKEY_ADDR")
	}
	e := newEnv(t, srv, withPrefix("down:"))
	e.seed(t, "42", false)
	if _, err := e.process(t, LaneStandard, chat("42")); err != nil { // warms the channel cache
		t.Fatal(err)
	}
	srv.Stop()

	_, err := e.process(t, LaneStandard, chat("42"))
	var nack *ExpectedNack
	var drop *Dropped
	if err == nil || errors.As(err, &nack) || errors.As(err, &drop) {
		t.Fatalf("limiter with the server down: %v, want a real error", err)
	}
	if !errors.Is(err, admit.ErrNotExecuted) && !errors.Is(err, admit.ErrOutcomeUnknown) {
		t.Errorf("error %v lost admit's class", err)
	}

	var reports atomic.Int64
	bus := NewMemBus(MemBusConfig{ErrorDelay: time.Hour, OnError: func(string, error) { reports.Add(1) }})
	defer bus.Close()
	bus.Consume("std", 1, func(ctx context.Context, m *Message) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := e.worker.Process(ctx, LaneStandard, m)
		return err
	})
	bus.Publish(ctxT(t), "std", []byte(chat("42")))
	if !waitFor(func() bool { return bus.Stats().Errors == 1 }) {
		t.Fatalf("stats %+v: want 1 error", bus.Stats())
	}
	if s := bus.Stats(); reports.Load() != 1 || s.Acked != 0 || s.Nacked != [numNackReasons]int64{} {
		t.Errorf("stats %+v, %d reports: want the error reported once, nothing acked or nacked as expected", s, reports.Load())
	}
}
