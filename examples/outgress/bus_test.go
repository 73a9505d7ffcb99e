package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// delays records the delays the bus schedules redeliveries with, and
// redelivers at once so tests need not wait.
type delays struct {
	mu sync.Mutex
	d  []time.Duration
}

func (r *delays) afterFunc(d time.Duration, f func()) *time.Timer {
	r.record(d)
	return time.AfterFunc(0, f)
}

func (r *delays) record(d time.Duration) {
	r.mu.Lock()
	r.d = append(r.d, d)
	r.mu.Unlock()
}

func (r *delays) get() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.d...)
}

// TestMemBusContract walks one message through every outcome of the
// contract: an expected nack (redelivered after its delay, not reported),
// an error (reported, redelivered after ErrorDelay), then an ack; and a
// second message that is dropped.
func TestMemBusContract(t *testing.T) {
	var rec delays
	var reports atomic.Int64
	b := NewMemBus(MemBusConfig{ErrorDelay: 7 * time.Second, AfterFunc: rec.afterFunc,
		OnError: func(string, error) { reports.Add(1) }})
	defer b.Close()
	var attempts sync.Map // body -> attempts seen
	h := func(_ context.Context, m *Message) error {
		attempts.Store(string(m.Data), m.Attempt)
		switch {
		case string(m.Data) == "drop":
			return &Dropped{Reason: DropRejected}
		case m.Attempt == 1:
			return &ExpectedNack{Reason: NackLimited, RetryAfter: 30 * time.Millisecond}
		case m.Attempt == 2:
			return errors.New("dependency down")
		}
		return nil
	}
	if err := b.Consume("s", 2, h); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"work", "drop"} {
		if err := b.Publish(ctxT(t), "s", []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if !waitFor(b.Idle) {
		t.Fatalf("not idle: %+v", b.Stats())
	}
	want := BusStats{Published: 2, Delivered: 4, Acked: 1, Errors: 1}
	want.Nacked[NackLimited] = 1
	want.Dropped[DropRejected] = 1
	if got := b.Stats(); got != want {
		t.Errorf("stats\n got %+v\nwant %+v", got, want)
	}
	if d := rec.get(); len(d) != 2 || d[0] != 30*time.Millisecond || d[1] != 7*time.Second {
		t.Errorf("redelivery delays %v, want [30ms 7s]: the nack's own, then ErrorDelay", d)
	}
	if n := reports.Load(); n != 1 {
		t.Errorf("%d error reports, want 1: only the unexpected error", n)
	}
	if n, _ := attempts.Load("work"); n != 3 {
		t.Errorf("work took %v attempts, want 3", n)
	}
}

// TestMemBusExpired: a message past its lifetime is dropped unhandled.
func TestMemBusExpired(t *testing.T) {
	var clock atomic.Int64
	t0 := time.Now()
	clock.Store(t0.UnixNano())
	b := NewMemBus(MemBusConfig{Lifetime: 5 * time.Second, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	defer b.Close()
	if err := b.Publish(ctxT(t), "s", []byte("late")); err != nil {
		t.Fatal(err)
	}
	clock.Store(t0.Add(5 * time.Second).UnixNano())
	var called atomic.Int64
	b.Consume("s", 1, func(context.Context, *Message) error { called.Add(1); return nil })
	if !waitFor(b.Idle) {
		t.Fatal("not idle")
	}
	if s := b.Stats(); s.Dropped[DropExpired] != 1 || called.Load() != 0 {
		t.Errorf("stats %+v, %d handler calls; want 1 expired drop and none", s, called.Load())
	}
}

// TestMemBusMaxAttempts: redelivery stops after MaxAttempts.
func TestMemBusMaxAttempts(t *testing.T) {
	var rec delays
	b := NewMemBus(MemBusConfig{MaxAttempts: 3, AfterFunc: rec.afterFunc})
	defer b.Close()
	b.Consume("s", 1, func(context.Context, *Message) error {
		return &ExpectedNack{Reason: NackPaused, RetryAfter: time.Millisecond}
	})
	b.Publish(ctxT(t), "s", []byte("x"))
	if !waitFor(b.Idle) {
		t.Fatal("not idle")
	}
	if s := b.Stats(); s.Delivered != 3 || s.Nacked[NackPaused] != 3 || s.Dropped[DropMaxAttempts] != 1 {
		t.Errorf("stats %+v: want 3 deliveries, 3 nacks, 1 max-attempts drop", s)
	}
}

// TestMemBusCloseAbandons: a message awaiting redelivery at Close is
// counted as abandoned, and Close leaves the bus idle.
func TestMemBusCloseAbandons(t *testing.T) {
	b := NewMemBus(MemBusConfig{})
	b.Consume("s", 1, func(context.Context, *Message) error {
		return &ExpectedNack{Reason: NackLimited, RetryAfter: time.Hour}
	})
	b.Publish(ctxT(t), "s", []byte("x"))
	if !waitFor(func() bool { return b.Stats().Nacked[NackLimited] == 1 }) {
		t.Fatal("never nacked")
	}
	b.Close()
	if s := b.Stats(); s.Abandoned != 1 || !b.Idle() {
		t.Errorf("stats %+v, idle %v: want 1 abandoned and idle", s, b.Idle())
	}
	if err := b.Publish(ctxT(t), "s", nil); !errors.Is(err, ErrBusClosed) {
		t.Errorf("Publish after Close: %v, want ErrBusClosed", err)
	}
	b.Close()
}

// TestMemBusFull: Publish refuses rather than blocks on a full queue.
func TestMemBusFull(t *testing.T) {
	b := NewMemBus(MemBusConfig{QueueLen: 2})
	defer b.Close()
	for i, want := range []error{nil, nil, ErrBusFull} {
		if err := b.Publish(ctxT(t), "s", nil); !errors.Is(err, want) && err != want {
			t.Errorf("publish %d: %v, want %v", i, err, want)
		}
	}
}

// TestMemBusCloseCancelsInFlight: a handler that Close cancels is abandoned
// (a broker would redeliver it), not reported as an error.
func TestMemBusCloseCancelsInFlight(t *testing.T) {
	var reports atomic.Int64
	b := NewMemBus(MemBusConfig{OnError: func(string, error) { reports.Add(1) }})
	started := make(chan struct{})
	b.Consume("s", 1, func(ctx context.Context, _ *Message) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	b.Publish(ctxT(t), "s", []byte("x"))
	<-started
	b.Close()
	if s := b.Stats(); s.Abandoned != 1 || s.Errors != 0 || reports.Load() != 0 || !b.Idle() {
		t.Errorf("stats %+v, %d reports, idle %v: want 1 abandoned, no error, idle", s, reports.Load(), b.Idle())
	}
}
