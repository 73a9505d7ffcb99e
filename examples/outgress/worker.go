package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/admitkit/admit/examples/outgress/bus"
	"net/http"
	"time"

	"github.com/admitkit/admit"
)

// WorkerConfig configures a Worker. Zero fields take the defaults named.
type WorkerConfig struct {
	// Prefix starts every limiter key. Default "".
	Prefix string
	// Limits are the bucket Specs. Default DefaultLimits.
	Limits *Limits
	// Lifetime is a message's time to live from publication: past it, work
	// is pointless. Default 5s.
	Lifetime time.Duration
	// PausedRetry is how long a message waits while sending is paused.
	// Default 500ms.
	PausedRetry time.Duration
	// DecisionAttempts bounds the limiter calls of one delivery, when
	// calls fail with admit.ErrNotExecuted. Default 3.
	DecisionAttempts int
	// DecisionBackoff is the pause before the first retry of a limiter
	// call; the n-th retry waits n times as long. Default 5ms.
	DecisionBackoff time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Worker is the egress hot path: decode, pause snapshot, channel cache, one
// limiter script, build the Helix request, send it over a reused connection.
// A warm message costs one Valkey round trip (the script); a cold one adds
// the channel's HGETALL. It is safe for concurrent use.
type Worker struct {
	cfg      WorkerConfig
	limits   Limits
	lim      *admit.Limiter
	pause    *Pause
	channels *ChannelCache
	helix    *Helix
	metrics  *Metrics
	helixBy  [numLanes]bucketPlan
}

// NewWorker assembles a worker from its parts.
func NewWorker(lim *admit.Limiter, pause *Pause, channels *ChannelCache, helix *Helix, m *Metrics, cfg WorkerConfig) *Worker {
	if cfg.Limits == nil {
		cfg.Limits = &DefaultLimits
	}
	if cfg.Lifetime <= 0 {
		cfg.Lifetime = 5 * time.Second
	}
	if cfg.PausedRetry <= 0 {
		cfg.PausedRetry = 500 * time.Millisecond
	}
	if cfg.DecisionAttempts <= 0 {
		cfg.DecisionAttempts = 3
	}
	if cfg.DecisionBackoff <= 0 {
		cfg.DecisionBackoff = 5 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	w := &Worker{cfg: cfg, limits: *cfg.Limits, lim: lim, pause: pause, channels: channels, helix: helix, metrics: m}
	w.helixBy = helixPlans(&w.limits, cfg.Prefix)
	return w
}

// Handler returns the bus handler for a lane's subject.
func (w *Worker) Handler(lane Lane) bus.Handler {
	return func(ctx context.Context, m *bus.Message) error {
		_, err := w.Process(ctx, lane, m)
		return err
	}
}

// Path describes how far a message went and which way: what the demo and
// tests group Valkey commands by.
type Path struct {
	Lane    Lane
	Kind    Kind
	Decoded bool
	Paused  bool // stopped by the pause snapshot
	Cache   CacheUse
	Decided bool // reached the limiter and got an answer
	// LimiterCalls counts AllowOrdered calls: 1, or more when calls that
	// did not run were retried.
	LimiterCalls int
	Admitted     bool
}

// CacheUse is how a message used the channel cache.
type CacheUse uint8

// The cache uses.
const (
	CacheNone   CacheUse = iota // the command acts in no channel
	CacheHit                    // served from memory
	CacheMiss                   // loaded from Valkey: one HGETALL
	CacheJoined                 // waited for another message's load of the channel
	numCacheUses
)

var cacheUseNames = [numCacheUses]string{"none", "hit", "miss", "joined"}

func (c CacheUse) String() string {
	if c < numCacheUses {
		return cacheUseNames[c]
	}
	return "invalid"
}

// Process handles one delivery and returns its path and the bus outcome.
func (w *Worker) Process(ctx context.Context, lane Lane, m *bus.Message) (Path, error) {
	deadline := m.Published.Add(w.cfg.Lifetime)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	req, path, err := w.Prepare(ctx, lane, m)
	if err != nil {
		return path, err
	}
	return path, w.helix.Send(req, deadline)
}

// Prepare is the path before the third party: it decodes the command,
// checks the pause snapshot, looks the channel up, asks the limiter once
// and builds the Helix request. ctx should carry the message's deadline.
func (w *Worker) Prepare(ctx context.Context, lane Lane, m *bus.Message) (*http.Request, Path, error) {
	path := Path{Lane: lane}
	deadline := m.Published.Add(w.cfg.Lifetime)
	start := w.cfg.Now()

	cmd, err := decodeCommand(m.Data)
	t := w.cfg.Now()
	w.metrics.Observe(StageDecode, t.Sub(start))
	if err == nil && cmd.Kind == KindChat && lane == LaneSystem {
		err = malformed("chat is never sent on the system lane")
	}
	if err != nil {
		return nil, path, &bus.Dropped{Reason: bus.DropMalformed, Err: err}
	}
	path.Decoded, path.Kind = true, cmd.Kind
	w.metrics.command(lane, cmd.Kind)

	err = w.pause.Check()
	t0, t := t, w.cfg.Now()
	w.metrics.Observe(StagePause, t.Sub(t0))
	if errors.Is(err, ErrPaused) {
		path.Paused = true
		return nil, path, bus.RetryOrDrop(bus.NackPaused, w.cfg.PausedRetry, deadline.Sub(t))
	}
	if err != nil { // not ready or stale: fail closed, and say so
		return nil, path, err
	}

	var ch *Channel
	if cmd.Kind.needsChannel() {
		ch, path.Cache, err = w.channels.Get(ctx, cmd.Channel)
		t0, t = t, w.cfg.Now()
		w.metrics.Observe(StageChannel, t.Sub(t0))
		if path.Cache != CacheHit {
			w.metrics.Observe(StageLoad, t.Sub(t0))
		}
		w.metrics.cacheLookup(path.Cache)
		if errors.Is(err, ErrUnknownChannel) {
			return nil, path, &bus.Dropped{Reason: bus.DropUnknownChannel}
		}
		if err != nil {
			return nil, path, err
		}
	}

	plan := w.plan(lane, cmd.Kind, ch)
	d, err := w.decide(ctx, lane, plan, &path)
	t = w.cfg.Now()
	if err != nil {
		// Either class is a dependency failure, not backpressure: the bus
		// reports it and redelivers the message after its error delay. An
		// ErrNotExecuted was already retried (bounded) by decide; an
		// ErrOutcomeUnknown is never repeated here, since the first call
		// may have taken tokens. (With retry-safe decisions keyed by the
		// message id, it could be.)
		return nil, path, err
	}
	path.Decided, path.Admitted = true, d.Allowed()
	if !d.Allowed() {
		return nil, path, bus.RetryOrDrop(bus.NackLimited, d.RetryAfter, deadline.Sub(t))
	}

	req, err := w.helix.NewRequest(ctx, &cmd, ch)
	t0, t = t, w.cfg.Now()
	w.metrics.Observe(StageBuild, t.Sub(t0))
	w.metrics.Observe(StagePreHTTP, t.Sub(start))
	if err != nil {
		return nil, path, &bus.Dropped{Reason: bus.DropMalformed, Err: err}
	}
	return req, path, nil
}

// plan picks the buckets: chat by channel and lane; the three Helix routes
// all by lane alone, through the same precomputed plans.
func (w *Worker) plan(lane Lane, k Kind, ch *Channel) *bucketPlan {
	if k == KindChat {
		p := chatPlan(&w.limits, lane, ch)
		return &p
	}
	return &w.helixBy[lane%numLanes]
}

// decide is the one limiter call of a message: one script, one round trip.
// A denial is a Decision; only a failed call is an error, and it stays one
// (a dependency failure is not backpressure). admit's error contract
// decides what happens next:
//
//   - admit.ErrNotExecuted (the server proves nothing ran, no token was
//     taken): the call is repeated, at most DecisionAttempts calls in all,
//     after a short pause, within the message's deadline. Refusals that
//     cannot pass on a retry (an invalid request, a wrong-type or corrupt
//     bucket) are not repeated.
//   - admit.ErrOutcomeUnknown (it may have run and taken tokens): never
//     repeated within the delivery; the error nacks the message.
//
// Every call is timed into the limiter histogram under its lane and
// decision; path.LimiterCalls counts them.
func (w *Worker) decide(ctx context.Context, lane Lane, p *bucketPlan, path *Path) (admit.Decision, error) {
	var second *admit.Request
	if p.hasSecond {
		second = &p.second
	}
	for {
		start := w.cfg.Now()
		d, err := w.lim.AllowOrdered(ctx, p.first, second)
		path.LimiterCalls++
		w.metrics.limiterCall(lane, decisionOf(p, d, err), w.cfg.Now().Sub(start))
		if err == nil {
			return d, nil
		}
		if !retryable(err) || path.LimiterCalls >= w.cfg.DecisionAttempts {
			return d, fmt.Errorf("outgress: limiter (%d calls): %w", path.LimiterCalls, err)
		}
		w.metrics.limiterRetry(lane)
		pause := time.NewTimer(w.cfg.DecisionBackoff * time.Duration(path.LimiterCalls))
		select {
		case <-ctx.Done():
			pause.Stop()
			return d, fmt.Errorf("outgress: limiter (%d calls, deadline reached before a retry): %w", path.LimiterCalls, err)
		case <-pause.C:
		}
	}
}

// retryable reports whether a failed limiter call may be repeated at once:
// it provably did not run, and for a reason that can pass (a refused or
// missing connection, a server busy or loading), not a request or a bucket
// that will be refused again.
func retryable(err error) bool {
	return errors.Is(err, admit.ErrNotExecuted) && !errors.Is(err, admit.ErrInvalidRequest) &&
		!errors.Is(err, admit.ErrWrongType) && !errors.Is(err, admit.ErrCorruptState)
}

// decisionOf is the metric label of a limiter call's result.
func decisionOf(p *bucketPlan, d admit.Decision, err error) Decision {
	switch {
	case errors.Is(err, admit.ErrNotExecuted):
		return DecisionNotExecuted
	case err != nil:
		return DecisionOutcomeUnknown
	case d.Allowed():
		return DecisionAllowed
	}
	return DecisionDenied + Decision(p.deniedClass(d))
}
