// Package worker is the outgress adapter: the hot path of one message,
// from the bus to Helix. Decode, check the pause snapshot (one atomic
// load), look the channel up (a miss is one HGETALL), ask admit once (one
// script: the only Valkey round trip of a warm message), build the Helix
// request, send it. A handler's error is the bus outcome; admit's error
// classes decide between a bounded retry and a nack.
package worker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/defaults"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/pause"
)

// Config configures a Worker. Zero fields take the defaults named.
type Config struct {
	// Prefix starts every limiter key. Default "".
	Prefix string
	// Limits are the bucket Specs. Default DefaultLimits.
	Limits *limits.Limits
	// Lifetime is a message's time to live from publication: past it, work
	// is pointless. Default 5s.
	Lifetime time.Duration
	// PausedRetry is how long a message waits while sending is paused.
	// Default 500ms.
	PausedRetry time.Duration
	// KillGrace is how long a replica has from the signal that stops it
	// (SIGTERM, or an interrupt) until it is killed: its deployment's kill
	// grace period. Stopping lets running handlers finish, at most a
	// Lifetime, then flushes their last acks for at most bus.CloseFlush;
	// CheckTiming refuses a KillGrace that cannot hold both. Default 30s
	// (Kubernetes' terminationGracePeriodSeconds).
	KillGrace time.Duration
	// DecisionAttempts bounds the limiter calls of one delivery, when
	// calls fail with admit.ErrNotExecuted. Default 3.
	DecisionAttempts int
	// DecisionBackoff is the pause before the first retry of a limiter
	// call; the n-th retry waits n times as long. Default 5ms.
	DecisionBackoff time.Duration
	// DelayUntilToken redelivers a message refused by a limit (a limiter
	// denial, a Helix 429) no sooner than its RetryAfter, when the limit
	// can have room again, and drops it at once when that is past its
	// lifetime (the plan's deferred change). Off by default: such a message
	// keeps the delivery timing of an error (the bus's ErrorDelay), only not
	// reported when StepNackSuppression is on.
	DelayUntilToken bool
	// RetryOutcomeUnknown, a departure from the plan (whose script is not
	// retried), decides with AllowOrderedOnce under the message's id (see
	// [DecisionID]) and repeats a call that failed with
	// admit.ErrOutcomeUnknown once: the server returns the Decision it
	// recorded if the first call ran, and a redelivery of an admitted
	// message is not charged again. The id's record costs a GET and a SET
	// inside every admission's script. Off by default: the worker decides
	// with AllowOrdered, and an ErrOutcomeUnknown is the message's error at
	// once (the bus redelivers it, and its next decision may charge again).
	RetryOutcomeUnknown bool
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// DoubleChargeShared is a deliberate bug, for the canary's tests and
	// demo: the standard and system lanes charge their second bucket (the
	// shared or general one) 2 tokens instead of 1, eating the premium
	// reserve. Never set it in production.
	DoubleChargeShared bool
	// ExtraPauseLookup is another deliberate bug: with the pause snapshot
	// on, the flag is also read from Valkey on every message (one more
	// round trip). Never set it in production.
	ExtraPauseLookup bool
	// Off is the set of rollout steps switched off (see Steps): zero, the
	// default, runs every step. A step switched off runs the shape it
	// replaced, on the same keys, so replicas with different Off share one
	// Valkey and one bus. Step 2's transport half is the Helix client's
	// (helix.Config.LegacyTransport from Steps.HelixLegacy).
	Off Steps
}

// WithDefaults returns cfg with every zero field set to its default: the
// values a Worker runs with.
func (cfg Config) WithDefaults() Config {
	if cfg.Limits == nil {
		cfg.Limits = &limits.DefaultLimits
	}
	cfg.Lifetime = defaults.Positive(cfg.Lifetime, 5*time.Second)
	cfg.PausedRetry = defaults.Positive(cfg.PausedRetry, 500*time.Millisecond)
	cfg.KillGrace = defaults.Positive(cfg.KillGrace, 30*time.Second)
	cfg.DecisionAttempts = defaults.Positive(cfg.DecisionAttempts, 3)
	cfg.DecisionBackoff = defaults.Positive(cfg.DecisionBackoff, 5*time.Millisecond)
	cfg.Now = defaults.Clock(cfg.Now)
	return cfg
}

// Worker is the egress hot path: decode, pause snapshot, channel cache, one
// limiter script, build the Helix request, send it over a reused connection.
// A warm message costs one Valkey round trip (the script); a cold one adds
// the channel's HGETALL. It is safe for concurrent use.
type Worker struct {
	cfg      Config
	limits   limits.Limits
	lim      *admit.Limiter
	pause    *pause.Pause
	channels *channels.Cache
	helix    *helix.Helix
	metrics  *metrics.Metrics
	helixBy  [limits.NumLanes]limits.Plan
	steps    Steps
	legacy   *Worker // the same parts with every step off: LegacyPrepare
}

// New assembles a worker from its parts.
func New(lim *admit.Limiter, p *pause.Pause, cc *channels.Cache, hx *helix.Helix, m *metrics.Metrics, cfg Config) *Worker {
	cfg = cfg.WithDefaults()
	w := &Worker{cfg: cfg, limits: *cfg.Limits, lim: lim, pause: p, channels: cc, helix: hx, metrics: m, steps: AllSteps &^ cfg.Off}
	w.helixBy = limits.HelixPlans(&w.limits, cfg.Prefix)
	legacy := *w
	legacy.steps = 0
	w.legacy = &legacy
	var on [NumSteps]bool
	for i, x := range StepList {
		on[i] = w.steps.Has(x)
	}
	m.Rollout(on)
	return w
}

// Steps returns the rollout steps the worker runs.
func (w *Worker) Steps() Steps { return w.steps }

// Handler returns the bus handler for a lane's subject.
func (w *Worker) Handler(lane limits.Lane) bus.Handler {
	return func(ctx context.Context, m *bus.Message) error {
		_, err := w.Process(ctx, lane, m)
		return err
	}
}

// Path describes how far a message went and which way: what the demo and
// tests group Valkey commands by.
type Path struct {
	Lane    limits.Lane
	Kind    command.Kind
	Decoded bool
	Paused  bool // stopped by the pause snapshot
	Cache   channels.CacheUse
	Decided bool // reached the limiter and got an answer
	// LimiterCalls counts AllowOrderedOnce calls: 1, or more when a call
	// that did not run, or whose outcome is unknown, was repeated, or when
	// a replayed denial was decided again (Redecided).
	LimiterCalls int
	// Redecided is set when the message's id returned a second-bucket
	// denial recorded by an earlier delivery, and this delivery decided
	// again under RedecisionID.
	Redecided bool
	// PauseLookups counts GETs of the pause flag: 1 with StepPauseSnapshot
	// off, else 0.
	PauseLookups int
	Admitted     bool
}

// Process handles one delivery and returns its path and the bus outcome.
func (w *Worker) Process(ctx context.Context, lane limits.Lane, m *bus.Message) (Path, error) {
	deadline := m.Published.Add(w.cfg.Lifetime)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	req, path, err := w.Prepare(ctx, lane, m)
	if err == nil {
		if w.steps.Has(StepTransport) {
			err = w.helix.Send(req, deadline)
		} else {
			err = w.helix.SendUndrained(req, deadline)
		}
		if err == nil {
			w.metrics.Observe(metrics.StagePublishToSent, w.cfg.Now().Sub(m.Published))
		}
	}
	return path, w.outcome(err)
}

// outcome is the error the bus gets. Without Config.DelayUntilToken, a
// message refused by a limit (a denial, a 429) is an expected nack
// redelivered after the bus's error delay, as an error would be, even when
// the limit's RetryAfter is past its lifetime (no early drop). With
// StepNackSuppression off, an expected nack (a denial, a pause, a 429) is
// returned as a plain error, as before the step: the bus reports it and
// redelivers it after its error delay. So the step changes what is
// reported, never when a message comes back.
func (w *Worker) outcome(err error) error {
	if err == nil {
		return nil
	}
	var nack *bus.ExpectedNack
	var drop *bus.Dropped
	if !w.cfg.DelayUntilToken {
		for _, r := range []bus.NackReason{bus.NackLimited, bus.NackThrottled} {
			if errors.As(err, &nack) && nack.Reason == r {
				same := *nack
				same.SameDelayAsError = true
				err = &same
				break
			}
			if errors.As(err, &drop) && drop.Reason == bus.NoTimeToRetry(r) {
				err = &bus.ExpectedNack{Reason: r, SameDelayAsError: true}
				break
			}
		}
	}
	if !w.steps.Has(StepNackSuppression) && errors.As(err, &nack) {
		return errors.New(nack.Error())
	}
	return err
}

// Prepare is the path before the third party: it decodes the command,
// checks the pause snapshot, looks the channel up, asks the limiter once
// and builds the Helix request. ctx should carry the message's deadline.
// Each rollout step switched off (Config.Off) takes the shape it replaced.
func (w *Worker) Prepare(ctx context.Context, lane limits.Lane, m *bus.Message) (*http.Request, Path, error) {
	path := Path{Lane: lane}
	deadline := m.Published.Add(w.cfg.Lifetime)
	stages := w.steps.Has(StepMetrics)
	start := w.cfg.Now()
	observe := func(s metrics.Stage, t0, t time.Time) {
		if stages {
			w.metrics.Observe(s, t.Sub(t0))
		}
	}

	cmd, err := command.Decode(m.Data)
	t := w.cfg.Now()
	observe(metrics.StageDecode, start, t)
	if err == nil && cmd.Kind == command.KindChat && lane == limits.LaneSystem {
		err = fmt.Errorf("%w: chat is never sent on the system lane", command.ErrMalformed)
	}
	if err != nil {
		return nil, path, &bus.Dropped{Reason: bus.DropMalformed, Err: err}
	}
	path.Decoded, path.Kind = true, cmd.Kind
	w.metrics.Command(lane, cmd.Kind)

	if w.steps.Has(StepPauseSnapshot) {
		err = w.pause.Check()
		if err == nil && w.cfg.ExtraPauseLookup {
			_, err = w.pause.Lookup(ctx)
			path.PauseLookups++
		}
	} else {
		var paused bool
		paused, err = w.pause.Lookup(ctx) // the shape before the snapshot: a GET per message
		path.PauseLookups++
		if err == nil && paused {
			err = pause.ErrPaused
		}
	}
	t0 := t
	t = w.cfg.Now()
	observe(metrics.StagePause, t0, t)
	if errors.Is(err, pause.ErrPaused) {
		path.Paused = true
		return nil, path, bus.RetryOrDrop(bus.NackPaused, w.cfg.PausedRetry, deadline.Sub(t))
	}
	if err != nil { // not ready or stale: fail closed, and say so
		return nil, path, err
	}

	var ch *channels.Channel
	if cmd.Kind.NeedsChannel() {
		ch, path.Cache, err = w.channels.Get(ctx, cmd.Channel)
		t0, t = t, w.cfg.Now()
		observe(metrics.StageChannel, t0, t)
		if path.Cache != channels.CacheHit {
			observe(metrics.StageLoad, t0, t)
		}
		w.metrics.CacheLookup(path.Cache)
		if errors.Is(err, channels.ErrUnknown) {
			return nil, path, &bus.Dropped{Reason: bus.DropUnknownChannel}
		}
		if err != nil {
			return nil, path, err
		}
	}

	plan := w.plan(lane, cmd.Kind, ch)
	var d admit.Decision
	if w.steps.Has(StepOrderedScript) {
		d, err = w.decide(ctx, lane, plan, m, &path)
	} else {
		d, err = w.decideInSequence(ctx, lane, plan, &path)
	}
	t = w.cfg.Now()
	if err != nil {
		// Either class is a dependency failure, not backpressure: the bus
		// reports it and redelivers the message after its error delay.
		// decide has already repeated the call: an ErrNotExecuted up to
		// DecisionAttempts calls, an ErrOutcomeUnknown once under the same
		// id, which the server answers with the recorded Decision if the
		// first call ran.
		return nil, path, err
	}
	path.Decided, path.Admitted = true, d.Allowed()
	if !d.Allowed() {
		return nil, path, bus.RetryOrDrop(bus.NackLimited, d.RetryAfter, deadline.Sub(t))
	}

	w.metrics.Warm(lane, path.Cache == channels.CacheHit || path.Cache == channels.CacheNone, path.LimiterCalls+path.PauseLookups)
	req, err := w.helix.NewRequest(ctx, &cmd, ch)
	t0, t = t, w.cfg.Now()
	observe(metrics.StageBuild, t0, t)
	w.metrics.Observe(metrics.StagePreHTTP, t.Sub(start))
	if err != nil {
		return nil, path, &bus.Dropped{Reason: bus.DropMalformed, Err: err}
	}
	return req, path, nil
}

// charged counts the tokens a decision charged: the first bucket's when it
// admitted, the second's when both did.
func (w *Worker) charged(lane limits.Lane, p *limits.Plan, first, second bool) {
	if first {
		w.metrics.Charged(lane, p.FirstClass, max(p.First.Cost, 1))
	}
	if second && p.HasSecond {
		w.metrics.Charged(lane, p.SecondClass, max(p.Second.Cost, 1))
	}
}

// decideInSequence is the limiter decision with StepOrderedScript off, the
// shape before it: AllowOrdered on the first bucket, then, only when it
// admitted, on the second (Denied 2 when the second refuses), on the same
// keys and Specs. No id, no retry: an error is returned at once.
func (w *Worker) decideInSequence(ctx context.Context, lane limits.Lane, p *limits.Plan, path *Path) (admit.Decision, error) {
	d, err := w.lim.AllowOrdered(ctx, p.First, nil)
	path.LimiterCalls++
	first := err == nil && d.Allowed()
	if first && p.HasSecond {
		d, err = w.lim.AllowOrdered(ctx, p.Second, nil)
		path.LimiterCalls++
		if err == nil && !d.Allowed() {
			d.Denied = 2
		}
	}
	w.charged(lane, p, first, first && p.HasSecond && err == nil && d.Allowed())
	w.metrics.LimiterCall(lane, decisionOf(p, d, err))
	if err != nil {
		return d, fmt.Errorf("outgress: limiter: %w", err)
	}
	return d, nil
}

// plan picks the buckets: chat by channel and lane; the three Helix routes
// all by lane alone, through the same precomputed plans.
//
// With StepPrecomputed off, the shape before it: the channel's keys and the
// Helix plans are built again for every message.
func (w *Worker) plan(lane limits.Lane, k command.Kind, ch *channels.Channel) *limits.Plan {
	if w.cfg.DoubleChargeShared {
		p := *w.plan1(lane, k, ch)
		if p.HasSecond {
			p.Second.Cost = 2
		}
		return &p
	}
	return w.plan1(lane, k, ch)
}

func (w *Worker) plan1(lane limits.Lane, k command.Kind, ch *channels.Channel) *limits.Plan {
	if !w.steps.Has(StepPrecomputed) {
		if k == command.KindChat {
			c := *ch
			c.StandardKey, c.SharedKey = channels.ChatKeys(w.cfg.Prefix, ch.ID)
			p := limits.ChatPlan(&w.limits, lane, &c)
			return &p
		}
		p := limits.HelixPlans(&w.limits, w.cfg.Prefix)[lane%limits.NumLanes]
		return &p
	}
	if k == command.KindChat {
		p := limits.ChatPlan(&w.limits, lane, ch)
		return &p
	}
	return &w.helixBy[lane%limits.NumLanes]
}

// decide is the one limiter decision of a message: one script, one round
// trip, made with AllowOrdered, or, with Config.RetryOutcomeUnknown, with
// AllowOrderedOnce under the message's id (see [DecisionID]). A denial is a
// Decision; only a failed call is an error, and it stays one (a dependency
// failure is not backpressure). admit's error contract decides what happens
// next:
//
//   - admit.ErrNotExecuted (the server proves nothing ran, no token was
//     taken): the call is repeated, at most DecisionAttempts calls in all,
//     after a short pause, within the message's deadline. Refusals that
//     cannot pass on a retry (an invalid request, a wrong-type or corrupt
//     bucket) are not repeated.
//   - admit.ErrOutcomeUnknown (it may have run and taken tokens): by
//     default not repeated, as the plan says of its script: the error nacks
//     the message. With Config.RetryOutcomeUnknown it is repeated once, with
//     the same id, after the same short pause and within the deadline. If
//     the first call ran, the server returns the Decision it recorded then
//     and takes nothing; if it did not, this call decides. A second
//     ErrOutcomeUnknown is returned: the error nacks the message.
//
// The rest of this comment is about the id path (RetryOutcomeUnknown).
// Every call of a delivery uses the same id, so the two rules combine
// safely: at most DecisionAttempts + 1 calls in all.
//
// A replayed denial (Decision.Replayed, not Allowed) is a second-bucket
// denial that an earlier delivery of this message recorded: the message was
// nacked then, and is due again now. It is not this delivery's answer: the
// delivery decides afresh under [RedecisionID] (one more round trip, only on
// this path). A first-bucket denial charges nothing and is not recorded, so
// the usual redelivery after a denial decides under the message's own id
// in one call. A replayed admission is the answer: an earlier delivery was
// admitted and charged, and this one sends without being charged again.
//
// The worker settles nothing after a decision (no refund of a second-bucket
// denial's first charge); a settlement added here must run only when
// !d.Replayed(), or a retry would settle twice.
//
// Every call is counted under its lane and decision (its latency, by op, is
// the Limiter's observer's: see metrics.ObserveLimiter); path.LimiterCalls
// counts them, and each repeat is counted under the failure that caused it.
func (w *Worker) decide(ctx context.Context, lane limits.Lane, p *limits.Plan, m *bus.Message, path *Path) (admit.Decision, error) {
	if !w.cfg.RetryOutcomeUnknown {
		return w.decideOnce(ctx, lane, p, "", path)
	}
	id := DecisionID(m)
	d, err := w.decideOnce(ctx, lane, p, id, path)
	if err == nil && d.Replayed() && !d.Allowed() {
		path.Redecided = true
		w.metrics.LimiterRedecision(lane)
		d, err = w.decideOnce(ctx, lane, p, RedecisionID(id, m.Attempt), path)
	}
	return d, err
}

// decideOnce is one decision under id (AllowOrderedOnce), or with
// AllowOrdered when id is "", with admit's error contract (see decide); an
// ErrOutcomeUnknown is repeated only under an id.
func (w *Worker) decideOnce(ctx context.Context, lane limits.Lane, p *limits.Plan, id string, path *Path) (admit.Decision, error) {
	var second *admit.Request
	if p.HasSecond {
		second = &p.Second
	}
	unknownRetried := id == "" // without an id, not repeated: the plan's rule
	calls := 0
	for {
		var d admit.Decision
		var err error
		if id == "" {
			d, err = w.lim.AllowOrdered(ctx, p.First, second)
		} else {
			d, err = w.lim.AllowOrderedOnce(ctx, id, p.First, second)
		}
		path.LimiterCalls++
		calls++
		label := decisionOf(p, d, err)
		w.metrics.LimiterCall(lane, label) // timed by the Limiter's observer (metrics.ObserveLimiter)
		if err == nil {
			if !d.Replayed() { // a replay charged nothing
				w.charged(lane, p, d.Denied != 1, d.Allowed())
			}
			return d, nil
		}
		switch {
		case errors.Is(err, admit.ErrOutcomeUnknown) && !unknownRetried:
			unknownRetried = true
		case retryable(err) && calls < w.cfg.DecisionAttempts:
		default:
			return d, fmt.Errorf("outgress: limiter (%d calls): %w", calls, err)
		}
		wait := time.NewTimer(w.cfg.DecisionBackoff * time.Duration(calls))
		select {
		case <-ctx.Done():
			wait.Stop()
			return d, fmt.Errorf("outgress: limiter (%d calls, deadline reached before a retry): %w", calls, err)
		case <-wait.C:
		}
		w.metrics.LimiterRetry(lane, label)
	}
}

// DecisionID is the id a message's limiter decision is made under with
// AllowOrderedOnce: "<stream>:<sequence>:<stored at, Unix ns>", the bus
// message's own stable id, the same on every delivery.
//
// The stream sequence is what stays the same when JetStream redelivers a
// message (the reply subject and ack token change on every delivery; a
// Nats-Msg-Id header exists only if the publisher sets one). The stream name
// and the time the stream stored the message make it unique beyond one
// stream's life: a stream deleted and created again restarts its sequence
// at 1, within admit.OnceWindow perhaps.
//
// Stable across deliveries, the id makes a redelivery safe as well as a
// retry: a message whose replica decided and then died, or whose decision's
// reply was lost twice in a row, is not charged again on its redelivery (the
// server returns the recorded admission). A redelivery after a denial still
// decides again: admit records only a decision that charged something, so a
// first-bucket denial leaves no record (and writes nothing to Valkey), and a
// recorded second-bucket denial is decided afresh under [RedecisionID]
// (see decide).
//
// A message with no stream sequence (one built by hand, not delivered by
// JetStream, whose sequences start at 1) gets a random id: still one
// decision for the delivery, retry included.
func DecisionID(m *bus.Message) string {
	if m.Seq == 0 {
		var b [16]byte
		rand.Read(b[:])
		return "local:" + hex.EncodeToString(b[:])
	}
	return fitID(m.Stream + ":" + strconv.FormatUint(m.Seq, 10) + ":" + strconv.FormatInt(m.Published.UnixNano(), 10))
}

// RedecisionID is the id a delivery decides under when the message's own
// id (see [DecisionID]) returned a recorded second-bucket denial: that id
// followed by ":" and the delivery number (1 on the first delivery).
func RedecisionID(id string, attempt int) string {
	return fitID(id + ":" + strconv.Itoa(attempt))
}

// fitID keeps an id within admit.MaxOnceIDLen: a longer one (a very long
// stream name) is replaced by its SHA-256.
func fitID(id string) string {
	if len(id) > admit.MaxOnceIDLen {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	return id
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
func decisionOf(p *limits.Plan, d admit.Decision, err error) metrics.Decision {
	switch {
	case errors.Is(err, admit.ErrNotExecuted):
		return metrics.DecisionNotExecuted
	case err != nil:
		return metrics.DecisionOutcomeUnknown
	case d.Allowed():
		return metrics.DecisionAllowed
	}
	return metrics.DecisionDenied + metrics.Decision(p.DeniedClass(d))
}
