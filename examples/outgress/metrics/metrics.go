// Package metrics is the outgress worker's Prometheus metrics
// (client_golang), on a registry of their own: stage latencies, the
// limiter call's latency by lane and decision, commands, cache lookups,
// Helix responses, connection reuse, deliveries by outcome and reason, and
// each replica's pause state. Every label value comes from a fixed list,
// and every series is created up front, so traffic can never add one.
package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/label"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Stage is a step of the message path, the label of its latency histogram.
type Stage uint8

// The stages, in path order. PreHTTP spans decode through build: the
// worker's own cost before the third party is called. The limiter call has
// a histogram of its own, split by lane and decision.
const (
	StageDecode  Stage = iota
	StagePause         // the pause snapshot check
	StageChannel       // channel cache lookup, hit or miss
	StageLoad          // channel lookups that were not hits: a load, or joining one
	StageBuild         // building the Helix request
	StagePreHTTP       // decode through build
	StageHTTP          // the Helix request, through draining the body
	// StagePublishToSent is from the message's storage in the stream (the
	// bus server's clock) to the end of its successful Helix request (the
	// worker's): the whole delay a user sees, redeliveries included.
	StagePublishToSent
	NumStages
)

var stageNames = [NumStages]string{"decode", "pause", "channel", "channel_load", "build", "pre_http", "http", "publish_to_sent"}

// String is the stage's metric label.
func (s Stage) String() string { return label.Of(stageNames[:], s) }

// Decision is the label of a limiter call's outcome: admitted, denied by a
// bucket of a class, or failed in one of admit's two error classes.
type Decision uint8

// The decisions. DecisionDenied+c is a denial by a bucket of class c.
const (
	DecisionAllowed        Decision                                       = iota
	DecisionDenied                                                        // + limits.BucketClass
	DecisionNotExecuted    = DecisionDenied + Decision(limits.NumClasses) // admit.ErrNotExecuted: nothing ran
	DecisionOutcomeUnknown = DecisionNotExecuted + 1                      // admit.ErrOutcomeUnknown: it may have run
	NumDecisions           = DecisionOutcomeUnknown + 1
)

// String is the decision's metric label.
func (d Decision) String() string {
	switch {
	case d == DecisionAllowed:
		return "allowed"
	case d < DecisionNotExecuted:
		return "denied_" + limits.BucketClass(d-DecisionDenied).String()
	case d == DecisionNotExecuted:
		return "not_executed"
	case d == DecisionOutcomeUnknown:
		return "outcome_unknown"
	}
	return "invalid"
}

// The metric names. Every label value comes from one of the fixed lists above
// (stage, lane, kind, decision, cache use, status class, outcome and
// reason): never a channel id, a key or a URL, whose number is unbounded.
const (
	MetricStage    = "outgress_stage_duration_seconds"
	MetricLimiter  = "outgress_limiter_decisions_total"
	MetricCalls    = "outgress_limiter_calls_total"
	MetricCallTime = "outgress_limiter_call_duration_seconds"
	MetricRetries  = "outgress_limiter_retries_total"
	MetricRedecide = "outgress_limiter_redecisions_total"
	MetricCommands = "outgress_commands_total"
	MetricCache    = "outgress_channel_lookups_total"
	MetricHelix    = "outgress_helix_responses_total"
	MetricConns    = "outgress_helix_sampled_connections_total"
	MetricDeliver  = "outgress_deliveries_total"
	MetricProto    = "outgress_helix_sampled_protocol_total"
	MetricTokens   = "outgress_limiter_tokens_total"
	MetricRollout  = "outgress_rollout_step"
	MetricPropag   = "outgress_pause_propagation_seconds"
	MetricFinished = "outgress_messages_finished_total"
	MetricWarm     = "outgress_warm_messages_total"
	MetricWarmCall = "outgress_warm_valkey_calls_total"
)

// latencyBuckets: 1 µs to 10 s, two per doubling (each about 42% wider
// than the one before).
var latencyBuckets = prometheus.ExponentialBucketsRange(1e-6, 10, 47)

// Metrics are the worker's Prometheus metrics, on a registry of their own.
// Every series is created up front, so a scrape shows the whole fixed set
// from the start and traffic can never add one. The recording methods are
// safe for concurrent use and allocate nothing.
type Metrics struct {
	reg   *prometheus.Registry
	ready atomic.Pointer[func() error]

	stages   [NumStages]prometheus.Histogram
	limiter  [limits.NumLanes][NumDecisions]prometheus.Counter
	calls    [numOps][NumCallOutcomes]prometheus.Counter
	callTime [numOps]prometheus.Histogram
	retries  [limits.NumLanes][2]prometheus.Counter // after not_executed, outcome_unknown
	redecide [limits.NumLanes]prometheus.Counter
	warm     [limits.NumLanes]prometheus.Counter
	finished [2][2]prometheus.Counter // [dropped][redelivered]
	tokens   [limits.NumLanes][limits.NumClasses]prometheus.Counter
	rollout  [len(RolloutSteps)]prometheus.Gauge
	propag   prometheus.Histogram
	warmCall [limits.NumLanes]prometheus.Counter
	commands [limits.NumLanes][command.NumKinds]prometheus.Counter
	cache    [channels.NumCacheUses]prometheus.Counter
	status   [helix.NumStatus]prometheus.Counter
	conns    [2]prometheus.Counter // reused, new
	protos   [helix.NumProtos]prometheus.Counter
	acked    prometheus.Counter
	errs     prometheus.Counter
	released prometheus.Counter
	nacked   [bus.NumNackReasons]prometheus.Counter
	dropped  [bus.NumDropReasons]prometheus.Counter
}

// New returns the metrics, registered with a new registry together
// with the Go runtime and process collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	stage := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricStage,
		Help: "Latency of each stage of the message path.", Buckets: latencyBuckets}, []string{"stage"})
	limiter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricLimiter,
		Help: "Limiter calls a message's decision made, by lane and decision: allowed, denied_<class of the bucket that refused>, or one of admit's error classes."}, []string{"lane", "decision"})
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricCalls,
		Help: "Every call of the replica's admit.Limiter, as admit.WithObserver reports it, by op (take, once, peek, refund, wait-attempt) and answer (allowed, denied, replayed, cached, not_executed, outcome_unknown). All but cached are one script run on the server."}, []string{"op", "answer"})
	callTime := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricCallTime,
		Help: "Latency of every call of the replica's admit.Limiter, round trip included, by op (admit.WithObserver).", Buckets: latencyBuckets}, []string{"op"})
	commands := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricCommands,
		Help: "Decoded commands by lane and kind."}, []string{"lane", "kind"})
	cache := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricCache,
		Help: "Channel cache lookups: hit, miss (one HGETALL) or joined (another caller's load)."}, []string{"result"})
	status := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricHelix,
		Help: "Helix responses by status class; error is no Response."}, []string{"status_class"})
	conns := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricConns,
		Help: "Sampled Helix requests by whether they reused a connection."}, []string{"reused"})
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRetries,
		Help: "Limiter calls repeated within a delivery, by lane and the failure of the call before: not_executed (it provably did not run; bounded retries) or outcome_unknown (it may have run; repeated once under the same id, which takes nothing if it ran)."}, []string{"lane", "after"})
	redecide := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRedecide,
		Help: "Deliveries whose message id returned a second-bucket denial recorded by an earlier delivery, and which decided again under a delivery id, by lane."}, []string{"lane"})
	warm := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricWarm,
		Help: "Messages admitted by the limiter with a warm channel cache (or none needed), by lane: the plan's table of commands per message."}, []string{"lane"})
	warmCall := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricWarmCall,
		Help: "Valkey round trips of the messages in outgress_warm_messages_total, as the worker counts them: its limiter calls and pause lookups, by lane."}, []string{"lane"})
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricTokens,
		Help: "Tokens the limiter charged for the lane's decisions, by lane and class of the bucket charged (replays charge nothing). The standard and system lanes' charges to the shared (chat) or general (Helix) bucket beyond their own share's are the premium reserve they took."}, []string{"lane", "class"})
	rollout := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricRollout,
		Help: "1 for each rollout step the replica's worker runs, 0 for a step switched off (worker.Steps)."}, []string{"step"})
	propag := prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricPropag,
		Help: "Time from a pause change's write (its writer's clock) to when this replica acted on it, once per change.", Buckets: latencyBuckets})
	finished := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricFinished,
		Help: "Messages finished (acked or dropped) by this replica, by whether they were dropped and whether they had been delivered more than once: each message counted once."}, []string{"dropped", "redelivered"})
	protos := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricProto,
		Help: "Sampled Helix requests by the HTTP protocol of their response."}, []string{"proto"})
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricDeliver,
		Help: "Bus deliveries by outcome and reason (none for acked, error and released)."}, []string{"outcome", "reason"})
	m.reg.MustRegister(protos, stage, limiter, calls, callTime, retries, redecide, warm, warmCall, finished, tokens, rollout, propag, commands, cache, status, conns, deliveries)

	hist := func(o prometheus.Observer) prometheus.Histogram { return o.(prometheus.Histogram) }
	for s := range NumStages {
		m.stages[s] = hist(stage.WithLabelValues(s.String()))
	}
	for lane := range limits.NumLanes {
		for d := range NumDecisions {
			m.limiter[lane][d] = limiter.WithLabelValues(lane.String(), d.String())
		}
		for k := range command.NumKinds {
			m.commands[lane][k] = commands.WithLabelValues(lane.String(), k.String())
		}
		m.retries[lane][0] = retries.WithLabelValues(lane.String(), DecisionNotExecuted.String())
		m.retries[lane][1] = retries.WithLabelValues(lane.String(), DecisionOutcomeUnknown.String())
		m.redecide[lane] = redecide.WithLabelValues(lane.String())
		m.warm[lane] = warm.WithLabelValues(lane.String())
		for c := range limits.NumClasses {
			m.tokens[lane][c] = tokens.WithLabelValues(lane.String(), c.String())
		}
		m.warmCall[lane] = warmCall.WithLabelValues(lane.String())
	}
	for i, name := range RolloutSteps {
		m.rollout[i] = rollout.WithLabelValues(name)
	}
	m.propag = propag
	for d, dv := range []string{"false", "true"} {
		for r, rv := range []string{"false", "true"} {
			m.finished[d][r] = finished.WithLabelValues(dv, rv)
		}
	}
	for op := range numOps {
		m.callTime[op] = hist(callTime.WithLabelValues(opName(op)))
		for o := range NumCallOutcomes {
			m.calls[op][o] = calls.WithLabelValues(opName(op), o.String())
		}
	}
	for u := range channels.NumCacheUses {
		if u != channels.CacheNone {
			m.cache[u] = cache.WithLabelValues(u.String())
		}
	}
	for c := range helix.NumStatus {
		m.status[c] = status.WithLabelValues(c.String())
	}
	m.conns[0], m.conns[1] = conns.WithLabelValues("true"), conns.WithLabelValues("false")
	for p := range helix.NumProtos {
		m.protos[p] = protos.WithLabelValues(p.String())
	}
	m.acked = deliveries.WithLabelValues(bus.OutcomeAcked.String(), "")
	m.errs = deliveries.WithLabelValues(bus.OutcomeError.String(), "")
	m.released = deliveries.WithLabelValues(bus.OutcomeReleased.String(), "")
	for r := range bus.NumNackReasons {
		m.nacked[r] = deliveries.WithLabelValues(bus.OutcomeNacked.String(), r.String())
	}
	for r := range bus.NumDropReasons {
		m.dropped[r] = deliveries.WithLabelValues(bus.OutcomeDropped.String(), r.String())
	}
	return m
}

// Registry is the registry the metrics are on; register more collectors
// (a Pause's, with RegisterPause) there.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format: mount it
// on /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Observe records one duration of a stage.
func (m *Metrics) Observe(s Stage, d time.Duration) {
	if s < NumStages {
		m.stages[s].Observe(d.Seconds())
	}
}

// LimiterCall counts one limiter call of lane's decision with its result.
// Its latency is recorded by the Limiter's observer (ObserveLimiter).
func (m *Metrics) LimiterCall(lane limits.Lane, d Decision) {
	if lane < limits.NumLanes && d < NumDecisions {
		m.limiter[lane][d].Inc()
	}
}

// CallOutcome is the outcome label of one call of an admit.Limiter.
type CallOutcome uint8

// The outcomes of a call, as ObserveLimiter sorts an admit.Observation.
const (
	CallAllowed        CallOutcome = iota
	CallDenied                     // the server denied it
	CallReplayed                   // AllowOrderedOnce returned a recorded Decision: nothing charged
	CallCached                     // the denial cache answered: nothing sent
	CallNotExecuted                // admit.ErrNotExecuted
	CallOutcomeUnknown             // admit.ErrOutcomeUnknown
	NumCallOutcomes
)

var callOutcomeNames = [NumCallOutcomes]string{"allowed", "denied", "replayed", "cached", "not_executed", "outcome_unknown"}

// String is the outcome's metric label.
func (o CallOutcome) String() string { return label.Of(callOutcomeNames[:], o) }

// numOps bounds admit's Ops (OpTake is 1); op 0 is "invalid", where an Op
// admit adds later is counted until it is listed.
const numOps = admit.OpWaitAttempt + 1

func opName(op admit.Op) string {
	if op == 0 || op >= numOps {
		return "invalid"
	}
	return op.String()
}

// ObserveLimiter records one call of an admit.Limiter: pass it to
// admit.WithObserver. It counts the call by op and outcome, and times it by
// op, for every call the Limiter makes (the worker's decisions, their
// retries, and anything else the replica asks), where the worker used to
// time its own calls. It allocates nothing.
func (m *Metrics) ObserveLimiter(o admit.Observation) {
	op := o.Op
	if op >= numOps {
		op = 0
	}
	var out CallOutcome
	switch {
	case errors.Is(o.Err, admit.ErrNotExecuted):
		out = CallNotExecuted
	case o.Err != nil:
		out = CallOutcomeUnknown
	case o.Cached:
		out = CallCached
	case o.Decision.Replayed():
		out = CallReplayed
	case o.Op == admit.OpRefund, o.Decision.Allowed():
		out = CallAllowed
	default:
		out = CallDenied
	}
	m.calls[op][out].Inc()
	m.callTime[op].Observe(o.Duration.Seconds())
}

// LimiterCalls returns the calls of op with outcome the observer counted.
func (m *Metrics) LimiterCalls(op admit.Op, o CallOutcome) int64 {
	if op >= numOps || o >= NumCallOutcomes {
		return 0
	}
	return counterValue(m.calls[op][o])
}

// ScriptRuns returns the observed calls that reached the server: every
// call but those the denial cache answered and those that provably did not
// run (the server refused them, or they were never sent).
func (m *Metrics) ScriptRuns() int64 {
	var n int64
	for op := range numOps {
		for o := range NumCallOutcomes {
			if o != CallCached && o != CallNotExecuted {
				n += counterValue(m.calls[op][o])
			}
		}
	}
	return n
}

// LimiterRetry counts a limiter call repeated after one that failed with
// after, DecisionNotExecuted or DecisionOutcomeUnknown; other values are
// not counted.
func (m *Metrics) LimiterRetry(lane limits.Lane, after Decision) {
	if i, ok := retryIndex(after); ok && lane < limits.NumLanes {
		m.retries[lane][i].Inc()
	}
}

// LimiterRedecision counts a delivery of lane that decided again after its
// message's id returned a recorded second-bucket denial.
func (m *Metrics) LimiterRedecision(lane limits.Lane) {
	if lane < limits.NumLanes {
		m.redecide[lane].Inc()
	}
}

// Warm counts a message of lane that the limiter admitted, with the Valkey
// round trips it cost (limiter calls and pause lookups), when its channel
// cache was warm (warm false: not counted).
func (m *Metrics) Warm(lane limits.Lane, warm bool, calls int) {
	if warm && lane < limits.NumLanes {
		m.warm[lane].Inc()
		m.warmCall[lane].Add(float64(calls))
	}
}

// WarmCalls returns the warm messages of lane and their Valkey round trips.
func (m *Metrics) WarmCalls(lane limits.Lane) (messages, calls int64) {
	return counterValue(m.warm[lane%limits.NumLanes]), counterValue(m.warmCall[lane%limits.NumLanes])
}

// RolloutSteps names the rollout's six steps, in order (worker.Steps).
var RolloutSteps = [...]string{"metrics", "transport", "ordered_script", "pause_snapshot", "nack_suppression", "precomputed"}

// Rollout sets the rollout step gauges: on[i] for RolloutSteps[i]. The
// replica's worker sets them when it is built.
func (m *Metrics) Rollout(on [len(RolloutSteps)]bool) {
	for i, g := range m.rollout {
		if on[i] {
			g.Set(1)
		} else {
			g.Set(0)
		}
	}
}

// Charged counts n tokens charged for a decision of lane to a bucket of
// class.
func (m *Metrics) Charged(lane limits.Lane, class limits.BucketClass, n int) {
	if lane < limits.NumLanes && class < limits.NumClasses && n > 0 {
		m.tokens[lane][class].Add(float64(n))
	}
}

// Tokens returns the tokens charged for lane's decisions to buckets of
// class.
func (m *Metrics) Tokens(lane limits.Lane, class limits.BucketClass) int64 {
	return counterValue(m.tokens[lane%limits.NumLanes][class%limits.NumClasses])
}

// PausePropagation records one pause change's propagation to the replica:
// pass it as pause.Config.OnPropagation.
func (m *Metrics) PausePropagation(d time.Duration) { m.propag.Observe(d.Seconds()) }

// LimiterRedecisions returns the deliveries of lane that decided again
// after a replayed denial.
func (m *Metrics) LimiterRedecisions(lane limits.Lane) int64 {
	return counterValue(m.redecide[lane%limits.NumLanes])
}

func retryIndex(after Decision) (int, bool) {
	switch after {
	case DecisionNotExecuted:
		return 0, true
	case DecisionOutcomeUnknown:
		return 1, true
	}
	return 0, false
}

// CacheLookup counts one channel lookup (none for a command in no channel).
func (m *Metrics) CacheLookup(u channels.CacheUse) {
	if u != channels.CacheNone && u < channels.NumCacheUses {
		m.cache[u].Inc()
	}
}

// Command counts one decoded command.
func (m *Metrics) Command(lane limits.Lane, k command.Kind) {
	if lane < limits.NumLanes && k < command.NumKinds {
		m.commands[lane][k].Inc()
	}
}

// Response records one Helix request: its status class and its latency
// (the http stage). It makes Metrics a helix.Recorder.
func (m *Metrics) Response(c helix.StatusClass, took time.Duration) {
	m.status[c%helix.NumStatus].Inc()
	m.stages[StageHTTP].Observe(took.Seconds())
}

// SampledConn records whether a sampled Helix request reused a connection.
func (m *Metrics) SampledConn(reused bool) {
	if reused {
		m.conns[0].Inc()
	} else {
		m.conns[1].Inc()
	}
}

// SampledProto records the HTTP protocol of a sampled Helix response.
func (m *Metrics) SampledProto(p helix.Proto) { m.protos[p%helix.NumProtos].Inc() }

// Protos returns the sampled Helix responses of protocol p.
func (m *Metrics) Protos(p helix.Proto) int64 { return counterValue(m.protos[p%helix.NumProtos]) }

// Delivery records what became of one delivery; reason is a NackReason or
// DropReason for those outcomes and ignored otherwise. Its signature fits
// bus.Config.Observe; the message (which may be nil) tells a redelivered
// message's end from a first delivery's.
func (m *Metrics) Delivery(msg *bus.Message, o bus.Outcome, reason uint8) {
	if o.Final() {
		d, r := 0, 0
		if o == bus.OutcomeDropped {
			d = 1
		}
		if msg != nil && msg.Attempt > 1 {
			r = 1
		}
		m.finished[d][r].Inc()
	}
	switch o {
	case bus.OutcomeAcked:
		m.acked.Inc()
	case bus.OutcomeError:
		m.errs.Inc()
	case bus.OutcomeReleased:
		m.released.Inc()
	case bus.OutcomeNacked:
		m.nacked[min(bus.NackReason(reason), bus.NumNackReasons-1)].Inc()
	case bus.OutcomeDropped:
		m.dropped[min(bus.DropReason(reason), bus.NumDropReasons-1)].Inc()
	}
}

// RegisterPause exports a Pause's state: the age of its last confirmation,
// whether it is paused, its version and its reconcile counters. replica is
// one of a fixed set of replica names (one per process in production).
func (m *Metrics) RegisterPause(replica string, p *pause.Pause) error {
	labels := prometheus.Labels{"replica": replica}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	snap := func() (pause.Snapshot, bool) { return p.Snapshot() }
	for _, c := range []prometheus.Collector{
		gauge("outgress_pause_snapshot_age_seconds", "Time since Valkey last confirmed the pause state (monotonic); past the maximum age sending fails closed.",
			func() float64 { return p.Age().Seconds() }),
		gauge("outgress_pause_paused", "1 while sending is paused, 0 otherwise (also 0 before the first load).", func() float64 {
			if s, ok := snap(); ok && s.Paused {
				return 1
			}
			return 0
		}),
		gauge("outgress_pause_until_seconds", "When the timed pause the replica acts on ends on its own, Unix seconds; 0 when no timed pause is in force (running, an open pause, or past its end).", func() float64 {
			if s, ok := snap(); ok && s.Paused && !s.Until.IsZero() {
				return float64(s.Until.UnixMilli()) / 1000
			}
			return 0
		}),
		gauge("outgress_pause_version", "Version of the pause state the replica acts on.", func() float64 {
			s, _ := snap()
			return float64(s.Version)
		}),
		counter("outgress_pause_reconciles_total", "Successful reconciles of the pause state, the initial load included.",
			func() float64 { return float64(p.Stats().Reconciles) }),
		counter("outgress_pause_reconcile_failures_total", "Failed reconciles: errors, and reads older than the snapshot.",
			func() float64 { return float64(p.Stats().ReconcileFailures) }),
	} {
		if err := m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Readers for the demo's report and the tests.

func counterValue(c prometheus.Counter) int64 {
	var pb dto.Metric
	if c == nil || c.Write(&pb) != nil {
		return 0
	}
	return int64(pb.GetCounter().GetValue())
}

// Admitted returns the limiter's admissions on lane.
func (m *Metrics) Admitted(lane limits.Lane) int64 {
	return counterValue(m.limiter[lane%limits.NumLanes][DecisionAllowed])
}

// Denied returns the limiter's denials on lane by a bucket of class.
func (m *Metrics) Denied(lane limits.Lane, class limits.BucketClass) int64 {
	return counterValue(m.limiter[lane%limits.NumLanes][DecisionDenied+Decision(class%limits.NumClasses)])
}

// LimiterFailures returns the failed limiter calls on lane by class:
// not executed (each retried call counts) and outcome unknown.
func (m *Metrics) LimiterFailures(lane limits.Lane) (notExecuted, outcomeUnknown int64) {
	return counterValue(m.limiter[lane%limits.NumLanes][DecisionNotExecuted]), counterValue(m.limiter[lane%limits.NumLanes][DecisionOutcomeUnknown])
}

// LimiterRetries returns the limiter calls repeated on lane after a call
// that failed with after (DecisionNotExecuted or DecisionOutcomeUnknown).
func (m *Metrics) LimiterRetries(lane limits.Lane, after Decision) int64 {
	i, ok := retryIndex(after)
	if !ok {
		return 0
	}
	return counterValue(m.retries[lane%limits.NumLanes][i])
}

// CacheLookups counts channel lookups of one kind (hit, miss or joined).
func (m *Metrics) CacheLookups(u channels.CacheUse) int64 {
	return counterValue(m.cache[u%channels.NumCacheUses])
}

// Status counts Helix outcomes of a class.
func (m *Metrics) Status(c helix.StatusClass) int64 { return counterValue(m.status[c%helix.NumStatus]) }

// Conns returns the sampled connection counts: reused and newly dialled.
func (m *Metrics) Conns() (reused, fresh int64) {
	return counterValue(m.conns[0]), counterValue(m.conns[1])
}

// Commands counts decoded commands on lane of kind k.
func (m *Metrics) Commands(lane limits.Lane, k command.Kind) int64 {
	return counterValue(m.commands[lane%limits.NumLanes][k%command.NumKinds])
}

// Latency summarises histograms (merged when several): the observation
// count and upper bounds of the p50, p95 and p99 (the upper bound of the
// bucket holding the quantile; +Inf past the last bucket).
type Latency struct {
	Count         uint64
	P50, P95, P99 float64 // seconds
}

// StageLatency summarises a stage's histogram.
func (m *Metrics) StageLatency(s Stage) Latency { return merge(m.stages[s%NumStages]) }

// LimiterLatency summarises the latency of every call of the Limiter, of
// every op, as its observer recorded it.
func (m *Metrics) LimiterLatency() Latency { return merge(m.callTime[:]...) }

func merge(hs ...prometheus.Histogram) Latency {
	var bounds []float64
	var cum []uint64
	var total uint64
	for _, h := range hs {
		var pb dto.Metric
		if h.Write(&pb) != nil {
			continue
		}
		total += pb.GetHistogram().GetSampleCount()
		for i, b := range pb.GetHistogram().GetBucket() {
			if i >= len(cum) {
				bounds, cum = append(bounds, b.GetUpperBound()), append(cum, 0)
			}
			cum[i] += b.GetCumulativeCount()
		}
	}
	q := func(q float64) float64 {
		if total == 0 {
			return 0
		}
		rank := uint64(math.Ceil(q * float64(total)))
		if i := slices.IndexFunc(cum, func(c uint64) bool { return c >= rank }); i >= 0 {
			return bounds[i]
		}
		return math.Inf(1)
	}
	return Latency{Count: total, P50: q(0.5), P95: q(0.95), P99: q(0.99)}
}

// SetReady sets what /readyz asks: 200 "ready" when ready returns nil,
// 503 with its error otherwise. Until it is set, /readyz answers 503
// "starting".
func (m *Metrics) SetReady(ready func() error) { m.ready.Store(&ready) }

// Serve serves the metrics on http://addr/metrics and the readiness probe
// on http://addr/readyz (see SetReady), addr "" being 127.0.0.1 on a free
// port, until stop; url is the metrics' address.
func (m *Metrics) Serve(addr string) (url string, stop func(), err error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics: listening: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		err := errors.New("starting")
		if f := m.ready.Load(); f != nil {
			err = (*f)()
		}
		if err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String() + "/metrics", func() { srv.Close() }, nil
}

// Excerpt scrapes url as Prometheus would and keeps the series that say
// what happened: deliveries and limiter calls that are not zero, retries,
// and the pause state.
func Excerpt(url string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return []string{"scrape failed: " + err.Error()}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return []string{"scrape failed: " + err.Error()}
	}
	defer resp.Body.Close()
	var keep []string
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, MetricDeliver+"{") && !strings.HasSuffix(line, " 0"),
			strings.HasPrefix(line, MetricLimiter+"{") && !strings.HasSuffix(line, " 0"),
			strings.HasPrefix(line, MetricCalls+"{") && !strings.HasSuffix(line, " 0"),
			strings.HasPrefix(line, MetricRetries+"{") && !strings.HasSuffix(line, " 0"),
			strings.HasPrefix(line, "outgress_pause_"):
			keep = append(keep, line)
		}
	}
	return keep
}
