package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Message is one delivery of a command from the bus.
type Message struct {
	Subject   string
	Data      []byte
	Published time.Time // the message's lifetime runs from here
	Attempt   int       // 1 on the first delivery
}

// Handler processes one delivery. Its error is the delivery's outcome; see
// ExpectedNack and Dropped for the contract.
type Handler func(ctx context.Context, m *Message) error

// Bus is the message bus as the worker sees it. Production would back it
// with NATS; MemBus is an in-memory implementation with the same contract.
type Bus interface {
	// Publish enqueues data on subject.
	Publish(ctx context.Context, subject string, data []byte) error
	// Consume runs h on subject's messages with the given number of
	// concurrent workers, until Close.
	Consume(subject string, workers int, h Handler) error
	// Close stops consuming and waits for running handlers.
	Close()
}

// ErrBusFull: a subject's queue is full; Publish refused the message.
var ErrBusFull = errors.New("outgress: bus queue full")

// ErrBusClosed: the bus is closed.
var ErrBusClosed = errors.New("outgress: bus closed")

// MemBusConfig configures a MemBus. Zero fields take the defaults named.
type MemBusConfig struct {
	// Lifetime is how long a message may wait to be handled: a delivery
	// past it is dropped (DropExpired). Default 5s.
	Lifetime time.Duration
	// ErrorDelay is the redelivery delay after an unexpected error.
	// Default 1s.
	ErrorDelay time.Duration
	// MaxAttempts bounds deliveries of one message. Default 50.
	MaxAttempts int
	// QueueLen is each subject's queue capacity. Default 4096.
	QueueLen int
	// OnError receives every unexpected handler error: the error report
	// (NoticeError and a warning log in production). It is never called for
	// an ExpectedNack or a Dropped. It must be safe for concurrent use.
	OnError func(subject string, err error)
	// Metrics, if set, counts every delivery's outcome.
	Metrics *Metrics
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// AfterFunc schedules redeliveries. Default time.AfterFunc.
	AfterFunc func(d time.Duration, f func()) *time.Timer
}

// BusStats are a MemBus's counters. Every label is a fixed reason.
type BusStats struct {
	Published int64
	Delivered int64 // handler calls, redeliveries included
	Acked     int64 // handled successfully
	Nacked    [numNackReasons]int64
	Dropped   [numDropReasons]int64
	Errors    int64 // unexpected errors: reported and redelivered
	Abandoned int64 // queued, awaiting redelivery or cancelled by Close
}

// MemBus is an in-memory Bus: one queue per subject, redelivery by timer.
// It is safe for concurrent use.
type MemBus struct {
	cfg MemBusConfig

	mu      sync.Mutex
	queues  map[string]chan *Message
	timers  map[uint64]*time.Timer
	timerID uint64
	closed  bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // consumers and pending redelivery timers

	busy                                         atomic.Int64 // accepted and not yet finished
	published, delivered, acked, errs, abandoned atomic.Int64
	nacked                                       [numNackReasons]atomic.Int64
	dropped                                      [numDropReasons]atomic.Int64
}

// NewMemBus returns an empty bus.
func NewMemBus(cfg MemBusConfig) *MemBus {
	if cfg.Lifetime <= 0 {
		cfg.Lifetime = 5 * time.Second
	}
	if cfg.ErrorDelay <= 0 {
		cfg.ErrorDelay = time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 50
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 4096
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.AfterFunc == nil {
		cfg.AfterFunc = time.AfterFunc
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &MemBus{cfg: cfg, queues: map[string]chan *Message{}, timers: map[uint64]*time.Timer{}, ctx: ctx, cancel: cancel}
}

// queueLocked returns subject's queue, creating it. Called with mu held.
func (b *MemBus) queueLocked(subject string) chan *Message {
	q := b.queues[subject]
	if q == nil {
		q = make(chan *Message, b.cfg.QueueLen)
		b.queues[subject] = q
	}
	return q
}

// Publish enqueues a copy of data, stamped with the current time.
func (b *MemBus) Publish(ctx context.Context, subject string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m := &Message{Subject: subject, Data: append([]byte(nil), data...), Published: b.cfg.Now()}
	b.mu.Lock() // held across the send, so Close cannot miss the message
	defer b.mu.Unlock()
	if b.closed {
		return ErrBusClosed
	}
	q := b.queueLocked(subject)
	b.busy.Add(1)
	select {
	case q <- m:
		b.published.Add(1)
		return nil
	default:
		b.busy.Add(-1)
		return ErrBusFull
	}
}

// Consume starts workers goroutines handling subject's messages.
func (b *MemBus) Consume(subject string, workers int, h Handler) error {
	if workers < 1 {
		return errors.New("outgress: Consume needs at least one worker")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrBusClosed
	}
	q := b.queueLocked(subject)
	for range workers {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for {
				select {
				case <-b.ctx.Done():
					return
				case m := <-q:
					b.deliver(q, m, h)
				}
			}
		}()
	}
	return nil
}

func (b *MemBus) deliver(q chan *Message, m *Message, h Handler) {
	if !b.cfg.Now().Before(m.Published.Add(b.cfg.Lifetime)) {
		b.finishDropped(DropExpired)
		return
	}
	m.Attempt++
	b.delivered.Add(1)
	err := h(b.ctx, m)
	var nack *ExpectedNack
	var drop *Dropped
	switch {
	case err != nil && b.ctx.Err() != nil:
		// Close cancelled the handler: the failure is the shutdown's, not
		// the message's. A broker would redeliver it to another consumer.
		b.abandon()
	case err == nil:
		b.acked.Add(1)
		b.record(OutcomeAcked, 0)
		b.busy.Add(-1)
	case errors.As(err, &nack):
		b.nacked[min(nack.Reason, numNackReasons-1)].Add(1)
		b.record(OutcomeNacked, uint8(nack.Reason))
		b.redeliver(q, m, nack.RetryAfter)
	case errors.As(err, &drop):
		b.finishDropped(drop.Reason)
	default:
		b.errs.Add(1)
		b.record(OutcomeError, 0)
		if b.cfg.OnError != nil {
			b.cfg.OnError(m.Subject, err)
		}
		b.redeliver(q, m, b.cfg.ErrorDelay)
	}
}

func (b *MemBus) record(o Outcome, reason uint8) {
	if b.cfg.Metrics != nil {
		b.cfg.Metrics.delivery(o, reason)
	}
}

func (b *MemBus) finishDropped(r DropReason) {
	b.dropped[min(r, numDropReasons-1)].Add(1)
	b.record(OutcomeDropped, uint8(r))
	b.busy.Add(-1)
}

func (b *MemBus) abandon() {
	b.abandoned.Add(1)
	b.busy.Add(-1)
}

// redeliver puts m back on q after delay, unless it has had its attempts or
// the bus closes first.
func (b *MemBus) redeliver(q chan *Message, m *Message, delay time.Duration) {
	if m.Attempt >= b.cfg.MaxAttempts {
		b.finishDropped(DropMaxAttempts)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		b.abandon()
		return
	}
	b.timerID++
	id := b.timerID
	// A timer holds a WaitGroup count until it has run or Close stopped it,
	// so Close also waits for a redelivery that is already firing. (Add runs
	// on a consumer goroutine, which holds a count itself.)
	b.wg.Add(1)
	b.timers[id] = b.cfg.AfterFunc(delay, func() {
		defer b.wg.Done()
		b.mu.Lock()
		delete(b.timers, id)
		b.mu.Unlock()
		select {
		case <-b.ctx.Done():
			b.abandon()
		case q <- m:
		}
	})
}

// Idle reports whether every accepted message is finished: acked, dropped,
// or abandoned at Close.
func (b *MemBus) Idle() bool { return b.busy.Load() == 0 }

// Stats returns the counters.
func (b *MemBus) Stats() BusStats {
	s := BusStats{
		Published: b.published.Load(), Delivered: b.delivered.Load(), Acked: b.acked.Load(),
		Errors: b.errs.Load(), Abandoned: b.abandoned.Load(),
	}
	for i := range s.Nacked {
		s.Nacked[i] = b.nacked[i].Load()
	}
	for i := range s.Dropped {
		s.Dropped[i] = b.dropped[i].Load()
	}
	return s
}

// Close stops redelivery timers and consumers, cancels and waits for running
// handlers, and counts what was left unfinished as abandoned.
func (b *MemBus) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	for id, t := range b.timers {
		if t.Stop() {
			b.abandon()
			b.wg.Done()
		}
		delete(b.timers, id)
	}
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
	// Consumers and timers are done, and nothing is published any more:
	// what is still queued was never handled.
	for _, q := range b.queues {
		for n := len(q); n > 0; n-- {
			<-q
			b.abandon()
		}
	}
}
