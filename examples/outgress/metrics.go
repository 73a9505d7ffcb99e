package main

import (
	"github.com/admitkit/admit/examples/outgress/bus"
	"math"
	"net/http"
	"slices"
	"time"

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
	numStages
)

var stageNames = [numStages]string{"decode", "pause", "channel", "channel_load", "build", "pre_http", "http"}

func (s Stage) String() string {
	if s < numStages {
		return stageNames[s]
	}
	return "invalid"
}

// StatusClass is the fixed label for an HTTP outcome.
type StatusClass uint8

// The status classes.
const (
	Status2xx StatusClass = iota
	Status3xx
	Status4xx
	Status429
	Status5xx
	StatusError // no response: transport error or cancellation
	numStatus
)

var statusNames = [numStatus]string{"2xx", "3xx", "4xx", "429", "5xx", "error"}

func (s StatusClass) String() string {
	if s < numStatus {
		return statusNames[s]
	}
	return "invalid"
}

func statusClass(code int) StatusClass {
	switch {
	case code == http.StatusTooManyRequests:
		return Status429
	case code >= 200 && code < 300:
		return Status2xx
	case code >= 300 && code < 400:
		return Status3xx
	case code >= 400 && code < 500:
		return Status4xx
	default:
		return Status5xx
	}
}

// Decision is the label of a limiter call's outcome: admitted, denied by a
// bucket of a class, or failed in one of admit's two error classes.
type Decision uint8

// The decisions. DecisionDenied+c is a denial by a bucket of class c.
const (
	DecisionAllowed        Decision                                = iota
	DecisionDenied                                                 // + BucketClass
	DecisionNotExecuted    = DecisionDenied + Decision(numClasses) // admit.ErrNotExecuted: nothing ran
	DecisionOutcomeUnknown = DecisionNotExecuted + 1               // admit.ErrOutcomeUnknown: it may have run
	numDecisions           = DecisionOutcomeUnknown + 1
)

func (d Decision) String() string {
	switch {
	case d == DecisionAllowed:
		return "allowed"
	case d < DecisionNotExecuted:
		return "denied_" + BucketClass(d-DecisionDenied).String()
	case d == DecisionNotExecuted:
		return "not_executed"
	case d == DecisionOutcomeUnknown:
		return "outcome_unknown"
	}
	return "invalid"
}

// Metric names. Every label value comes from one of the fixed lists above
// (stage, lane, kind, decision, cache use, status class, outcome and
// reason): never a channel id, a key or a URL, whose number is unbounded.
const (
	metricStage    = "outgress_stage_duration_seconds"
	metricLimiter  = "outgress_limiter_duration_seconds"
	metricRetries  = "outgress_limiter_retries_total"
	metricCommands = "outgress_commands_total"
	metricCache    = "outgress_channel_lookups_total"
	metricHelix    = "outgress_helix_responses_total"
	metricConns    = "outgress_helix_sampled_connections_total"
	metricDeliver  = "outgress_deliveries_total"
)

// latencyBuckets: 1 µs to 10 s, two per doubling (each about 42% wider
// than the one before).
var latencyBuckets = prometheus.ExponentialBucketsRange(1e-6, 10, 47)

// Metrics are the worker's Prometheus metrics, on a registry of their own.
// Every series is created up front, so a scrape shows the whole fixed set
// from the start and traffic can never add one. The recording methods are
// safe for concurrent use and allocate nothing.
type Metrics struct {
	reg *prometheus.Registry

	stages   [numStages]prometheus.Histogram
	limiter  [numLanes][numDecisions]prometheus.Histogram
	retries  [numLanes]prometheus.Counter
	commands [numLanes][numKinds]prometheus.Counter
	cache    [numCacheUses]prometheus.Counter
	status   [numStatus]prometheus.Counter
	conns    [2]prometheus.Counter // reused, new
	acked    prometheus.Counter
	errs     prometheus.Counter
	released prometheus.Counter
	nacked   [bus.NumNackReasons]prometheus.Counter
	dropped  [bus.NumDropReasons]prometheus.Counter
}

// NewMetrics returns the metrics, registered with a new registry together
// with the Go runtime and process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	stage := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricStage,
		Help: "Latency of each stage of the message path.", Buckets: latencyBuckets}, []string{"stage"})
	limiter := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricLimiter,
		Help: "Latency of the one AllowOrdered call of a message, by lane and decision.", Buckets: latencyBuckets}, []string{"lane", "decision"})
	commands := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricCommands,
		Help: "Decoded commands by lane and kind."}, []string{"lane", "kind"})
	cache := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricCache,
		Help: "Channel cache lookups: hit, miss (one HGETALL) or joined (another caller's load)."}, []string{"result"})
	status := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricHelix,
		Help: "Helix responses by status class; error is no response."}, []string{"status_class"})
	conns := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricConns,
		Help: "Sampled Helix requests by whether they reused a connection."}, []string{"reused"})
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRetries,
		Help: "Limiter calls repeated within a delivery because the previous one provably did not run (admit.ErrNotExecuted)."}, []string{"lane"})
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricDeliver,
		Help: "Bus deliveries by outcome and reason (none for acked, error and released)."}, []string{"outcome", "reason"})
	m.reg.MustRegister(stage, limiter, retries, commands, cache, status, conns, deliveries)

	hist := func(o prometheus.Observer) prometheus.Histogram { return o.(prometheus.Histogram) }
	for s := range numStages {
		m.stages[s] = hist(stage.WithLabelValues(s.String()))
	}
	for lane := range numLanes {
		for d := range numDecisions {
			m.limiter[lane][d] = hist(limiter.WithLabelValues(lane.String(), d.String()))
		}
		for k := range numKinds {
			m.commands[lane][k] = commands.WithLabelValues(lane.String(), k.String())
		}
		m.retries[lane] = retries.WithLabelValues(lane.String())
	}
	for u := range numCacheUses {
		if u != CacheNone {
			m.cache[u] = cache.WithLabelValues(u.String())
		}
	}
	for c := range numStatus {
		m.status[c] = status.WithLabelValues(c.String())
	}
	m.conns[0], m.conns[1] = conns.WithLabelValues("true"), conns.WithLabelValues("false")
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
	if s < numStages {
		m.stages[s].Observe(d.Seconds())
	}
}

// limiterCall records one limiter call of lane with its decision.
func (m *Metrics) limiterCall(lane Lane, d Decision, took time.Duration) {
	if lane < numLanes && d < numDecisions {
		m.limiter[lane][d].Observe(took.Seconds())
	}
}

func (m *Metrics) limiterRetry(lane Lane) {
	if lane < numLanes {
		m.retries[lane].Inc()
	}
}

func (m *Metrics) cacheLookup(u CacheUse) {
	if u != CacheNone && u < numCacheUses {
		m.cache[u].Inc()
	}
}

func (m *Metrics) command(lane Lane, k Kind) {
	if lane < numLanes && k < numKinds {
		m.commands[lane][k].Inc()
	}
}

func (m *Metrics) response(c StatusClass) { m.status[c%numStatus].Inc() }

func (m *Metrics) sampledConn(reused bool) {
	if reused {
		m.conns[0].Inc()
	} else {
		m.conns[1].Inc()
	}
}

// Delivery records what became of one delivery; reason is a NackReason or
// DropReason for those outcomes and ignored otherwise. Its signature fits
// bus.Config.Observe (with the message ignored).
func (m *Metrics) Delivery(_ *bus.Message, o bus.Outcome, reason uint8) {
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
func (m *Metrics) RegisterPause(replica string, p *Pause) error {
	labels := prometheus.Labels{"replica": replica}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	snap := func() (PauseSnapshot, bool) { return p.Snapshot() }
	for _, c := range []prometheus.Collector{
		gauge("outgress_pause_snapshot_age_seconds", "Time since Valkey last confirmed the pause state (monotonic); past the maximum age sending fails closed.",
			func() float64 { return p.Age().Seconds() }),
		gauge("outgress_pause_paused", "1 while sending is paused, 0 otherwise (also 0 before the first load).", func() float64 {
			if s, ok := snap(); ok && s.Paused {
				return 1
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
func (m *Metrics) Admitted(lane Lane) int64 {
	return histCount(m.limiter[lane%numLanes][DecisionAllowed])
}

// Denied returns the limiter's denials on lane by a bucket of class.
func (m *Metrics) Denied(lane Lane, class BucketClass) int64 {
	return histCount(m.limiter[lane%numLanes][DecisionDenied+Decision(class%numClasses)])
}

// LimiterFailures returns the failed limiter calls on lane by class:
// not executed (each retried call counts) and outcome unknown.
func (m *Metrics) LimiterFailures(lane Lane) (notExecuted, outcomeUnknown int64) {
	return histCount(m.limiter[lane%numLanes][DecisionNotExecuted]), histCount(m.limiter[lane%numLanes][DecisionOutcomeUnknown])
}

// LimiterRetries returns the limiter calls repeated on lane after a call
// that did not run.
func (m *Metrics) LimiterRetries(lane Lane) int64 { return counterValue(m.retries[lane%numLanes]) }

// CacheLookups counts channel lookups of one kind (hit, miss or joined).
func (m *Metrics) CacheLookups(u CacheUse) int64 { return counterValue(m.cache[u%numCacheUses]) }

// Status counts Helix outcomes of a class.
func (m *Metrics) Status(c StatusClass) int64 { return counterValue(m.status[c%numStatus]) }

// Conns returns the sampled connection counts: reused and newly dialled.
func (m *Metrics) Conns() (reused, fresh int64) {
	return counterValue(m.conns[0]), counterValue(m.conns[1])
}

// Commands counts decoded commands on lane of kind k.
func (m *Metrics) Commands(lane Lane, k Kind) int64 {
	return counterValue(m.commands[lane%numLanes][k%numKinds])
}

// Latency summarises histograms (merged when several): the observation
// count and upper bounds of the p50, p95 and p99 (the upper bound of the
// bucket holding the quantile; +Inf past the last bucket).
type Latency struct {
	Count         uint64
	P50, P95, P99 float64 // seconds
}

// StageLatency summarises a stage's histogram.
func (m *Metrics) StageLatency(s Stage) Latency { return merge(m.stages[s%numStages]) }

// LimiterLatency summarises the limiter histograms of every lane and
// decision.
func (m *Metrics) LimiterLatency() Latency {
	var hs []prometheus.Histogram
	for lane := range numLanes {
		hs = append(hs, m.limiter[lane][:]...)
	}
	return merge(hs...)
}

func histCount(h prometheus.Histogram) int64 { return int64(merge(h).Count) }

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
