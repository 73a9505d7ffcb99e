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

	"github.com/admitkit/admit/examples/outgress/internal/defaults"
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
	c.Lifetime = defaults.Positive(c.Lifetime, 5*time.Second)
	c.AckWait = defaults.Positive(c.AckWait, c.Lifetime+time.Second)
	c.MaxDeliver = defaults.Positive(c.MaxDeliver, 20)
	c.ErrorDelay = defaults.Positive(c.ErrorDelay, time.Second)
	c.MaxAge = defaults.Positive(c.MaxAge, time.Minute)
	c.Now = defaults.Clock(c.Now)
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
	// SlowConsumers counts the connection's "slow consumer, messages
	// dropped" events: a subscription's buffer was full and the client
	// dropped what came. A dropped delivery comes back after AckWait.
	SlowConsumers int64
	// AsyncErrors counts the connection's other asynchronous errors (a
	// permissions violation, for one).
	AsyncErrors int64
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

	mu      sync.Mutex // orders Close and Kill after Consume's start of workers
	closing atomic.Bool

	delivered, acked, errs, released, ackFailures atomic.Int64
	slowConsumers, asyncErrors                    atomic.Int64
	nacked                                        [NumNackReasons]atomic.Int64
	dropped                                       [NumDropReasons]atomic.Int64
}

// Connect dials url and returns a Bus on the stream cfg describes, which
// Setup must have created. name labels the connection on the server. The
// connection's asynchronous errors are counted in Stats, not logged.
func Connect(ctx context.Context, url, name string, cfg Config) (*Bus, error) {
	cfg.defaults()
	b := &Bus{cfg: cfg}
	nc, err := nats.Connect(url, nats.Name(name), nats.Timeout(5*time.Second), nats.ErrorHandler(b.asyncError))
	if err != nil {
		return nil, fmt.Errorf("bus: connecting to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus: %w", err)
	}
	b.nc, b.js = nc, js
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b, nil
}

// asyncError counts one of the connection's asynchronous errors.
func (b *Bus) asyncError(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrSlowConsumer) {
		b.slowConsumers.Add(1)
		return
	}
	b.asyncErrors.Add(1)
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

// pullExpiry is how long a free worker's pull request (for one message)
// waits on the server before it expires and the worker asks again: an idle
// worker sends one small request a second. The client gives up on a
// request one second after its expiry, so a request that goes missing
// (seen in the tests: the consumer showing messages pending and no waiting
// request while a worker waited) stalls its worker for two seconds at most.
// Close waits for the requests in flight to end.
const pullExpiry = time.Second

// pullErrorBackoff is the pause before a worker asks again after a pull
// request failed (a reconnect, a consumer being recreated).
const pullErrorBackoff = 10 * time.Millisecond

// Consume starts workers goroutines on subject's consumer. A worker asks
// the server for exactly one message when it is free, runs h on it,
// settles it, and only then asks again: no message is pulled that no
// worker can take, and no message waits in a client-side buffer, where a
// busy worker would leave it to age or to be dropped as a slow consumer.
func (b *Bus) Consume(ctx context.Context, subject string, workers int, h Handler) error {
	if workers < 1 {
		return errors.New("bus: Consume needs at least one worker")
	}
	cons, err := b.js.Consumer(ctx, b.cfg.Stream, consumerName(subject))
	if err != nil {
		return fmt.Errorf("bus: consumer for %s: %w", subject, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing.Load() {
		return errors.New("bus: closed")
	}
	b.wg.Add(workers)
	for range workers {
		go b.work(cons, h)
	}
	return nil
}

// work asks for one message at a time and handles it, until the bus
// closes. Each iteration ends in at most pullExpiry (plus the client's
// second of grace) when no message comes, else in at most the message's
// lifetime (the handler's deadline) plus one acknowledgement.
func (b *Bus) work(cons jetstream.Consumer, h Handler) {
	defer b.wg.Done()
	for !b.closing.Load() {
		msg, err := b.fetchOne(cons)
		if err != nil {
			if b.ctx.Err() != nil || b.nc.IsClosed() {
				return
			}
			time.Sleep(pullErrorBackoff)
			continue
		}
		if msg != nil { // nil: the request expired with no message
			b.deliver(msg, h)
		}
	}
}

// fetchOne sends one pull request for one message and waits for its
// answer: the message, or nil once the request expired. Kill ends the
// wait at once; Close does not, so that a message already on its way is
// handed back (Released) rather than lost until AckWait.
func (b *Bus) fetchOne(cons jetstream.Consumer) (jetstream.Msg, error) {
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(pullExpiry))
	if err != nil {
		return nil, err
	}
	select {
	case msg, ok := <-batch.Messages():
		if ok {
			return msg, nil
		}
		return nil, batch.Error()
	case <-b.ctx.Done():
		return nil, b.ctx.Err()
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
		SlowConsumers: b.slowConsumers.Load(), AsyncErrors: b.asyncErrors.Load(),
	}
	for i := range s.Nacked {
		s.Nacked[i] = b.nacked[i].Load()
	}
	for i := range s.Dropped {
		s.Dropped[i] = b.dropped[i].Load()
	}
	return s
}

// Close stops pulling: each worker's pull request in flight ends (within
// pullExpiry, two seconds for one gone missing), and a message it brings is handed back unhandled (Released:
// another replica gets it at once). Close lets running handlers finish and
// settle their messages, then closes the connection. A restart of the
// replica is Close, then Connect and Consume again.
func (b *Bus) Close() {
	b.mu.Lock()
	if b.closing.Swap(true) {
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.wg.Wait()
	b.nc.FlushTimeout(2 * time.Second) // the last nacks and terms are sent without waiting
	b.nc.Close()
	b.cancel()
}

// Kill drops the connection at once, as a crashed process would: running
// handlers see their context end, nothing more is acked, and the server
// redelivers what this replica held once AckWait passes. For tests.
func (b *Bus) Kill() {
	b.mu.Lock()
	b.closing.Store(true)
	b.mu.Unlock()
	b.cancel()
	b.nc.Close()
	b.wg.Wait()
}
