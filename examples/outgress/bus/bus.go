// Package bus is the outgress worker's message bus on NATS JetStream: a
// work-queue stream of commands, one subject per lane, and per lane one
// durable pull consumer that every replica shares, so each message goes to
// one replica at a time and comes back to another if that one stops.
//
// A handler's error is the delivery's outcome (see [ExpectedNack] and
// [Dropped]): an expected nack becomes NakWithDelay(RetryAfter), a drop or
// a retry past the message's lifetime becomes Term, success a confirmed
// Ack. Every delivery's outcome is reported to Config.Observe with a fixed
// reason, so the fleet can account for every published message: acked, or
// dropped with a reason, after any number of redeliveries, each with its
// reason.
//
// [StartEmbedded] runs an in-process nats-server with JetStream on
// 127.0.0.1, for the demo and the tests; production dials its NATS_URL.
package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Message is one delivery of a command.
type Message struct {
	Subject   string
	Data      []byte
	Stream    string    // the stream's name
	Seq       uint64    // the stream sequence: the message's identity across deliveries
	Published time.Time // when the stream stored it; the lifetime runs from here
	Attempt   int       // 1 on the first delivery
}

// Handler processes one delivery; its error is the outcome (see the
// package doc). ctx ends when the bus is killed, not when it is closed:
// Close lets running handlers finish.
type Handler func(ctx context.Context, m *Message) error

// Config describes the stream, its consumers and the delivery contract.
// Zero fields take the defaults named.
type Config struct {
	// Stream is the stream's name. Default "OUTGRESS".
	Stream string
	// Subjects are the lanes' subjects, in lane order; the stream holds
	// exactly these. Default outgress.standard, outgress.premium,
	// outgress.system.
	Subjects []string
	// Lifetime is how long a command is worth sending after it was
	// published. A delivery past it is dropped (DropExpired), and a nack
	// whose delay reaches past it is a Term (DropNoTimeLimited and the rest, by cause). Default 5s.
	Lifetime time.Duration
	// AckWait is how long the server waits for a delivery's ack before it
	// redelivers the message to any replica: it only acts when a replica
	// dies holding a message. It must exceed the longest handler run, which
	// the message's lifetime bounds, or a slow handler's message would be
	// sent twice. Default Lifetime + 1s.
	AckWait time.Duration
	// MaxDeliver bounds deliveries of one message. The bus terms the
	// message on its last allowed delivery rather than nack it
	// (DropMaxAttempts), so the server never silently stops delivering
	// one. Default 20; the lifetime normally ends a message's retries first.
	MaxDeliver int
	// ErrorDelay is the redelivery delay after an unexpected error.
	// Default 1s.
	ErrorDelay time.Duration
	// MaxAge bounds how long the stream keeps a message no replica
	// finished: only reached with no replica running. Default 1 minute.
	MaxAge time.Duration
	// Observe, if set, receives every delivery's outcome, with a NackReason
	// for OutcomeNacked and a DropReason for OutcomeDropped. It must be
	// safe for concurrent use and quick.
	Observe func(m *Message, o Outcome, reason uint8)
	// OnError receives every unexpected handler error: the error report
	// (NoticeError and a warning log in production). It is never called for
	// an ExpectedNack or a Dropped. It must be safe for concurrent use.
	OnError func(subject string, err error)
	// Now is the clock that ages messages. Default time.Now.
	Now func() time.Time
}

// WithDefaults returns c with every zero field set to its default: the
// values the bus runs with.
func (c Config) WithDefaults() Config {
	c.defaults()
	return c
}

func (c *Config) defaults() {
	if c.Stream == "" {
		c.Stream = "OUTGRESS"
	}
	if len(c.Subjects) == 0 {
		c.Subjects = []string{"outgress.standard", "outgress.premium", "outgress.system"}
	}
	if c.Lifetime <= 0 {
		c.Lifetime = 5 * time.Second
	}
	if c.AckWait <= 0 {
		c.AckWait = c.Lifetime + time.Second
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = 20
	}
	if c.ErrorDelay <= 0 {
		c.ErrorDelay = time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Setup creates the stream and one durable consumer per subject, or updates
// them to cfg. Every replica may call it; the last call's config wins.
//
// The stream has work-queue retention: a message is removed once acked or
// termed, so it holds exactly the commands no replica has finished. Each
// consumer acks explicitly and is shared by every replica (pull
// consumers: a replica asks for a message when it has a free worker).
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	cfg.defaults()
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:      cfg.Stream,
		Subjects:  cfg.Subjects,
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.MemoryStorage,
		MaxAge:    cfg.MaxAge,
	})
	if err != nil {
		return fmt.Errorf("bus: stream %s: %w", cfg.Stream, err)
	}
	for _, subject := range cfg.Subjects {
		_, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
			Durable:       consumerName(subject),
			FilterSubject: subject,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxDeliver:    cfg.MaxDeliver,
		})
		if err != nil {
			return fmt.Errorf("bus: consumer for %s: %w", subject, err)
		}
	}
	return nil
}

// consumerName is a subject's durable consumer: its dots become dashes.
func consumerName(subject string) string {
	b := []byte(subject)
	for i, c := range b {
		if c == '.' || c == '*' || c == '>' {
			b[i] = '-'
		}
	}
	return string(b)
}

// Stats are one Bus's counters. Every index is a fixed reason.
type Stats struct {
	Delivered int64 // handler calls, redeliveries included
	Acked     int64
	Nacked    [NumNackReasons]int64
	Dropped   [NumDropReasons]int64
	Errors    int64 // unexpected errors: reported and redelivered
	Released  int64 // handed back unhandled at Close
	// AckFailures counts acks, nacks and terms the server did not confirm
	// or that could not be sent: the message comes back after AckWait.
	AckFailures int64
}

// Bus is one replica's connection to the stream: it publishes, and it runs
// workers on the lanes' consumers. It is safe for concurrent use.
type Bus struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream

	ctx    context.Context // cancelled by Kill only
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	iters   []jetstream.MessagesContext
	closing atomic.Bool

	delivered, acked, errs, released, ackFailures atomic.Int64
	nacked                                        [NumNackReasons]atomic.Int64
	dropped                                       [NumDropReasons]atomic.Int64
}

// Connect dials url and returns a Bus on the stream cfg describes, which
// Setup must have created. name labels the connection on the server.
func Connect(ctx context.Context, url, name string, cfg Config) (*Bus, error) {
	cfg.defaults()
	nc, err := nats.Connect(url, nats.Name(name), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("bus: connecting to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus: %w", err)
	}
	bctx, cancel := context.WithCancel(context.Background())
	return &Bus{cfg: cfg, nc: nc, js: js, ctx: bctx, cancel: cancel}, nil
}

// JetStream returns the bus's JetStream context, for Setup and inspection.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// Conn is the bus's NATS connection, for core NATS requests (package mgmt).
func (b *Bus) Conn() *nats.Conn { return b.nc }

// Publish stores data on subject and waits for the stream's
// acknowledgement; it returns the message's stream sequence.
func (b *Bus) Publish(ctx context.Context, subject string, data []byte) (uint64, error) {
	ack, err := b.js.Publish(ctx, subject, data)
	if err != nil {
		return 0, fmt.Errorf("bus: publish on %s: %w", subject, err)
	}
	return ack.Sequence, nil
}

// pullExpiry is how long each pull request of a worker waits on the
// server. The client library's default is 30 s, with a heartbeat every
// 15 s, so a pull request that goes missing (seen in the tests: the
// consumer shows no waiting request and messages pending, while the worker
// waits) stalls its worker for 30 s until two heartbeats are missed. At 1 s
// (heartbeat 500 ms) a stall ends within a second; an idle worker then
// sends one small request a second.
const pullExpiry = time.Second

// Consume starts workers goroutines on subject's consumer, each pulling
// one message at a time and running h on it.
func (b *Bus) Consume(ctx context.Context, subject string, workers int, h Handler) error {
	if workers < 1 {
		return errors.New("bus: Consume needs at least one worker")
	}
	cons, err := b.js.Consumer(ctx, b.cfg.Stream, consumerName(subject))
	if err != nil {
		return fmt.Errorf("bus: consumer for %s: %w", subject, err)
	}
	for range workers {
		it, err := cons.Messages(jetstream.PullMaxMessages(1), jetstream.PullExpiry(pullExpiry))
		if err != nil {
			return fmt.Errorf("bus: consuming %s: %w", subject, err)
		}
		b.mu.Lock()
		if b.closing.Load() {
			b.mu.Unlock()
			it.Stop()
			return errors.New("bus: closed")
		}
		b.iters = append(b.iters, it)
		b.wg.Add(1)
		b.mu.Unlock()
		go b.work(it, h)
	}
	return nil
}

// work handles messages until its iterator is closed. The number of
// iterations is bounded by the messages the server delivers; each ends in
// at most the message's lifetime (the handler's deadline) plus one
// acknowledgement.
func (b *Bus) work(it jetstream.MessagesContext, h Handler) {
	defer b.wg.Done()
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return
		}
		if err != nil { // a missed heartbeat or a reconnect: the iterator re-pulls
			if b.ctx.Err() != nil || b.nc.IsClosed() {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		b.deliver(msg, h)
	}
}

func (b *Bus) deliver(msg jetstream.Msg, h Handler) {
	meta, err := msg.Metadata()
	if err != nil { // not a JetStream message: nothing to ack
		b.ackFailures.Add(1)
		return
	}
	m := &Message{
		Subject: msg.Subject(), Data: msg.Data(), Stream: meta.Stream, Seq: meta.Sequence.Stream,
		Published: meta.Timestamp, Attempt: int(meta.NumDelivered),
	}
	if b.closing.Load() { // fetched while stopping: hand it back unhandled
		b.settle(msg, m, OutcomeReleased, 0)
		return
	}
	deadline := m.Published.Add(b.cfg.Lifetime)
	if !b.cfg.Now().Before(deadline) {
		b.settle(msg, m, OutcomeDropped, uint8(DropExpired))
		return
	}
	b.delivered.Add(1)
	err = h(b.ctx, m)
	var nack *ExpectedNack
	var drop *Dropped
	switch {
	case err == nil:
		b.settle(msg, m, OutcomeAcked, 0)
	case b.ctx.Err() != nil:
		// Killed: the handler's failure is the kill's, not the message's.
		// No ack is possible any more; the server redelivers after AckWait.
	case errors.As(err, &drop):
		b.settle(msg, m, OutcomeDropped, uint8(drop.Reason))
	case errors.As(err, &nack):
		delay := nack.RetryAfter
		if nack.SameDelayAsError {
			delay = b.cfg.ErrorDelay
		}
		b.retry(msg, m, OutcomeNacked, uint8(nack.Reason), delay, deadline)
	default:
		if b.cfg.OnError != nil {
			b.cfg.OnError(m.Subject, err)
		}
		b.retry(msg, m, OutcomeError, 0, b.cfg.ErrorDelay, deadline)
	}
}

// retry nacks with delay, unless the redelivery would come past the
// message's deadline or past MaxDeliver: then the message is termed, with
// the reason why, so that no message leaves the stream unaccounted.
func (b *Bus) retry(msg jetstream.Msg, m *Message, o Outcome, reason uint8, delay time.Duration, deadline time.Time) {
	switch {
	case delay >= deadline.Sub(b.cfg.Now()):
		why := DropNoTimeError
		if o == OutcomeNacked {
			why = NoTimeToRetry(NackReason(reason))
		}
		b.settle(msg, m, OutcomeDropped, uint8(why))
	case m.Attempt >= b.cfg.MaxDeliver:
		b.settle(msg, m, OutcomeDropped, uint8(DropMaxAttempts))
	default:
		b.settleDelay(msg, m, o, reason, delay)
	}
}

func (b *Bus) settle(msg jetstream.Msg, m *Message, o Outcome, reason uint8) {
	b.settleDelay(msg, m, o, reason, 0)
}

// settleDelay tells the server the outcome, then counts it. An ack waits
// for the server's confirmation, so that "acked" means the stream has let
// go of the message; nacks and terms are sent without waiting.
func (b *Bus) settleDelay(msg jetstream.Msg, m *Message, o Outcome, reason uint8, delay time.Duration) {
	var err error
	switch o {
	case OutcomeAcked:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = msg.DoubleAck(ctx)
		cancel()
	case OutcomeDropped:
		err = msg.TermWithReason(DropReason(reason).String())
	case OutcomeReleased:
		err = msg.Nak()
	default:
		err = msg.NakWithDelay(delay)
	}
	if err != nil {
		b.ackFailures.Add(1)
		return
	}
	switch o {
	case OutcomeAcked:
		b.acked.Add(1)
	case OutcomeNacked:
		b.nacked[min(NackReason(reason), NumNackReasons-1)].Add(1)
	case OutcomeDropped:
		b.dropped[min(DropReason(reason), NumDropReasons-1)].Add(1)
	case OutcomeError:
		b.errs.Add(1)
	case OutcomeReleased:
		b.released.Add(1)
	}
	if b.cfg.Observe != nil {
		b.cfg.Observe(m, o, reason)
	}
}

// Stats returns the counters.
func (b *Bus) Stats() Stats {
	s := Stats{
		Delivered: b.delivered.Load(), Acked: b.acked.Load(), Errors: b.errs.Load(),
		Released: b.released.Load(), AckFailures: b.ackFailures.Load(),
	}
	for i := range s.Nacked {
		s.Nacked[i] = b.nacked[i].Load()
	}
	for i := range s.Dropped {
		s.Dropped[i] = b.dropped[i].Load()
	}
	return s
}

// CloseFlush bounds how long Close waits for the server to take the last
// acks, nacks and terms of the handlers it let finish.
const CloseFlush = 2 * time.Second

// Close stops pulling, hands back any message fetched but not started
// (Released: another replica gets it at once), lets running handlers
// finish and settle their messages, and closes the connection. A restart
// of the replica is Close, then Connect and Consume again.
func (b *Bus) Close() {
	b.mu.Lock()
	if b.closing.Swap(true) {
		b.mu.Unlock()
		return
	}
	iters := b.iters
	b.mu.Unlock()
	for _, it := range iters {
		it.Drain()
	}
	b.wg.Wait()
	b.nc.FlushTimeout(CloseFlush) // the last nacks and terms are sent without waiting
	b.nc.Close()
	b.cancel()
}

// Kill drops the connection at once, as a crashed process would: running
// handlers see their context end, nothing more is acked, and the server
// redelivers what this replica held once AckWait passes. For tests.
func (b *Bus) Kill() {
	b.mu.Lock()
	b.closing.Store(true)
	iters := b.iters
	b.mu.Unlock()
	b.cancel()
	b.nc.Close()
	for _, it := range iters {
		it.Stop()
	}
	b.wg.Wait()
}
