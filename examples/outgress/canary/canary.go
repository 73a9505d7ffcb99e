// Package canary is the rollout's gates as a program: it reads the
// Prometheus metrics of a baseline replica and a canary replica over a
// window (scraping their /metrics endpoints), computes each gate of the
// plan from what the window added, and gives each a verdict.
//
// The gates (the plan's, with how each is measured):
//
//   - 429s: Helix 429 responses per response; the canary's may exceed the
//     baseline's by Bounds.RateSlack plus three standard errors of the
//     difference (the two replicas split one stream's traffic, so their
//     rates differ by chance alone; three standard errors is what chance
//     exceeds about once in 700 windows) at most.
//   - auth failures: Helix 401 and 403 responses per response, the same.
//   - premium reserve: the premium reservation invariant as a measured
//     quantity: the tokens the standard and system lanes took from the
//     shared (chat) or general (Helix) bucket beyond the tokens their own
//     shares charged (outgress_limiter_tokens_total). Ordered charging makes
//     it at most 0: every shared token a standard message takes is matched
//     by one of its share's. Above 0, standard traffic took tokens the
//     premium reserve holds. Premium's refusals by those buckets are shown
//     beside it.
//   - dropped, redelivered: messages the replica finished (acked or
//     dropped) that were dropped, and that had been delivered more than
//     once, per message finished (each message counted once, by the replica
//     that finished it); Bounds.RateSlack and three standard errors again.
//   - commands per warm message, standard and premium: the worker's own
//     count of Valkey round trips (limiter calls and pause lookups) per
//     message admitted with a warm channel cache, which must equal what the
//     canary's steps imply: 1 for both lanes with every step on, one more
//     on standard without the ordered script, one more on both without the
//     pause snapshot. The workers' counters are checked against the
//     server: the script runs both replicas' Limiters report
//     (outgress_limiter_calls_total, admit.WithObserver) must equal the
//     server's (INFO commandstats) over the window, when a Server is given:
//     the server is read on both sides of each edge's scrapes, and the
//     workers' count must lie within that range, widened by the calls in
//     flight at an edge (Bounds.InFlight).
//   - pre-HTTP latency: the plan's "lower pre-Twitch p95/p99", judged by a
//     one-sided Mann-Whitney U test over the pre_http histogram's buckets
//     (RankTest): it fails when the canary is slower at
//     Bounds.LatencyConfidence (0.99 by default), after its observations
//     are moved down by Bounds.LatencyTolerance buckets (0 by default), and
//     says "no data" when either side has fewer than
//     Bounds.LatencyMinSamples observations. The p95 and p99 are gated
//     too, each by a one-sided binomial test (TailTest): the canary fails
//     when its share of observations above the bucket holding the
//     baseline's p95 (p99) is significantly more than 5% (1%) at the same
//     confidence, after the same tolerance; the p99 judges nothing with
//     fewer than 100 baseline observations.
//   - connection churn: newly dialled connections per sampled Helix request;
//     Bounds.RateSlack again.
//   - pause: the canary's propagation of pause changes (p99, from
//     outgress_pause_propagation_seconds) within Bounds.Propagation, and its
//     snapshot age, sampled through the window, within Bounds.MaxAge; both
//     bounds derive from the fleet's pause.Config (Bounds.Pause).
package canary

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/admitkit/admit/examples/outgress/pause"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// A Sample is one scrape of a replica's /metrics: every counter, gauge and
// histogram bucket by name and labels.
type Sample struct {
	series map[string][]series
}

type series struct {
	labels map[string]string
	value  float64
}

// Parse reads the Prometheus text exposition format.
func Parse(r io.Reader) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("canary: parsing metrics: %w", err)
	}
	s := Sample{series: map[string][]series{}}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				s.add(name, labels, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				s.add(name, labels, m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				s.add(name+"_count", labels, float64(h.GetSampleCount()))
				for _, b := range h.GetBucket() {
					bl := map[string]string{"le": strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)}
					for k, v := range labels {
						bl[k] = v
					}
					s.add(name+"_bucket", bl, float64(b.GetCumulativeCount()))
				}
			}
		}
	}
	return s, nil
}

func (s Sample) add(name string, labels map[string]string, v float64) {
	s.series[name] = append(s.series[name], series{labels, v})
}

// Get sums the series of name whose labels include the given pairs
// ("lane", "standard", ...).
func (s Sample) Get(name string, kv ...string) float64 {
	var sum float64
	for _, se := range s.series[name] {
		ok := true
		for i := 0; i+1 < len(kv); i += 2 {
			if se.labels[kv[i]] != kv[i+1] {
				ok = false
				break
			}
		}
		if ok {
			sum += se.value
		}
	}
	return sum
}

// Scrape reads url, a /metrics endpoint, as Prometheus would.
func Scrape(ctx context.Context, url string) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Sample{}, fmt.Errorf("canary: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Sample{}, fmt.Errorf("canary: scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("canary: scraping %s: %s", url, resp.Status)
	}
	return Parse(io.LimitReader(resp.Body, 16<<20))
}

// Replica is what a window saw of one replica: its metrics at the start and
// at the end, and the largest pause snapshot age sampled in between.
type Replica struct {
	Start, End Sample
	MaxAge     float64 // seconds
	AgeSamples int     // readings of the age MaxAge is the largest of
}

// delta is what the window added to the series of name with those labels.
func (r *Replica) delta(name string, kv ...string) float64 {
	return r.End.Get(name, kv...) - r.Start.Get(name, kv...)
}

// Window is one observation of both replicas, and of the server's script
// runs when a Server was given.
type Window struct {
	Baseline, Canary Replica
	Duration         time.Duration
	// ServerScripts to ServerScriptsMax is the script runs the server
	// counted in the window: the server is read on both sides of each
	// edge's scrapes, so the replicas' window lies between the two. -1 when
	// not measured.
	ServerScripts, ServerScriptsMax int64
	ServerNote                      string // why not, or where from
	// Others are the other replicas on the same server, scraped at the
	// window's edges with the two (see Begin): their script runs count
	// with the workers' in the script-runs gate, and nothing else of
	// theirs is judged.
	Others []Replica
}

// A Server counts the script runs the Valkey server executed (INFO
// commandstats: EVALSHA calls less failed ones, plus EVAL).
type Server interface {
	ScriptRuns(ctx context.Context) (int64, error)
}

// Watch observes the two replicas for window: it scrapes both, samples
// their pause snapshot age every sampleEvery, and scrapes both again. srv
// may be nil.
func Watch(ctx context.Context, baselineURL, canaryURL string, window, sampleEvery time.Duration, srv Server) (*Window, error) {
	return WatchUntil(ctx, baselineURL, canaryURL, window, sampleEvery, srv, nil, 0)
}

// WatchUntil is Watch whose window, once window has passed, goes on until
// done reports true (checked every sampleEvery), for at most limit more:
// a window that must hold what the replicas measure late (a pause change's
// propagation is measured at the reconcile after it). done may be nil.
func WatchUntil(ctx context.Context, baselineURL, canaryURL string, window, sampleEvery time.Duration, srv Server, done func() bool, limit time.Duration) (*Window, error) {
	wa, err := Begin(ctx, baselineURL, canaryURL, srv)
	if err != nil {
		return nil, err
	}
	return wa.Until(ctx, window, sampleEvery, done, limit)
}

// A Watching is a window begun: both replicas scraped at its start.
type Watching struct {
	w                      *Window
	baselineURL, canaryURL string
	otherURLs              []string
	srv                    Server
	reads                  [4]int64 // the server's script runs around the start's and the end's scrapes
	start                  time.Time
}

// Begin starts a window: it scrapes both replicas, reading srv (which may
// be nil) on both sides of the scrapes. What the replicas do from its
// return on is in the window: a caller that drives the traffic starts it
// after Begin.
//
// others are the /metrics URLs of any other replicas that run scripts on
// srv's server (the rest of a fleet during a roll): they are scraped with
// the two at each edge, so that the server's script runs can be checked
// against every replica's.
func Begin(ctx context.Context, baselineURL, canaryURL string, srv Server, others ...string) (*Watching, error) {
	wa := &Watching{w: &Window{ServerScripts: -1}, baselineURL: baselineURL, canaryURL: canaryURL, otherURLs: others, srv: srv}
	if srv == nil {
		wa.w.ServerNote = "no server given"
	}
	wa.w.Others = make([]Replica, len(others))
	wa.read(ctx, 0)
	if err := wa.scrapeBoth(ctx, &wa.w.Baseline.Start, &wa.w.Canary.Start); err != nil {
		return nil, err
	}
	for i := range others {
		if err := wa.scrapeOther(ctx, i, &wa.w.Others[i].Start); err != nil {
			return nil, err
		}
	}
	wa.read(ctx, 1)
	wa.start = time.Now()
	return wa, nil
}

// read reads the server's script runs into reads[i]. The server is read
// before and after each edge's scrapes: calls made while the replicas are
// scraped land in one count and not the other, so the server's figure is a
// range (ServerScripts to ServerScriptsMax).
func (wa *Watching) read(ctx context.Context, i int) {
	if wa.srv == nil {
		return
	}
	n, err := wa.srv.ScriptRuns(ctx)
	if err != nil {
		wa.w.ServerNote = err.Error()
		wa.srv = nil
		return
	}
	wa.reads[i] = n
}

func (wa *Watching) scrapeOther(ctx context.Context, i int, s *Sample) error {
	var err error
	*s, err = Scrape(ctx, wa.otherURLs[i])
	return err
}

func (wa *Watching) scrapeBoth(ctx context.Context, b, c *Sample) error {
	var err error
	if *b, err = Scrape(ctx, wa.baselineURL); err != nil {
		return err
	}
	*c, err = Scrape(ctx, wa.canaryURL)
	return err
}

// Until ends the window: once window has passed since Begin and done
// reports true (checked every sampleEvery; nil: at once), or limit after
// window at the latest, it scrapes both replicas again. Meanwhile it
// samples their pause snapshot age every sampleEvery. Call it once.
func (wa *Watching) Until(ctx context.Context, window, sampleEvery time.Duration, done func() bool, limit time.Duration) (*Window, error) {
	w := wa.w
	end, last := wa.start.Add(window), wa.start.Add(window+max(limit, 0))
	for {
		now := time.Now()
		if !now.Before(last) || !now.Before(end) && (done == nil || done()) {
			break
		}
		next := end
		if !now.Before(end) {
			next = last
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(sampleEvery, time.Until(next))):
		}
		for _, r := range []struct {
			url string
			rep *Replica
		}{{wa.baselineURL, &w.Baseline}, {wa.canaryURL, &w.Canary}} {
			if s, err := Scrape(ctx, r.url); err == nil {
				r.rep.MaxAge = max(r.rep.MaxAge, s.Get(MetricAge))
				r.rep.AgeSamples++
			}
		}
	}
	wa.read(ctx, 2)
	if err := wa.scrapeBoth(ctx, &w.Baseline.End, &w.Canary.End); err != nil {
		return nil, err
	}
	for i := range w.Others {
		if err := wa.scrapeOther(ctx, i, &w.Others[i].End); err != nil {
			return nil, err
		}
	}
	wa.read(ctx, 3)
	w.Duration = time.Since(wa.start)
	if wa.srv != nil {
		w.ServerScripts, w.ServerScriptsMax = wa.reads[2]-wa.reads[1], wa.reads[3]-wa.reads[0]
	}
	for _, r := range []*Replica{&w.Baseline, &w.Canary} {
		r.MaxAge = max(r.MaxAge, r.End.Get(MetricAge))
		r.AgeSamples++
	}
	return w, nil
}

// Bounds are the gates' declared limits. The zero value is production's:
// strict.
type Bounds struct {
	// RateSlack is how much a canary's rate (429s, auth failures, drops,
	// redeliveries, connection churn, each per response, delivery or
	// sampled request) may exceed the baseline's. Default 0.03 (3
	// percentage points).
	RateSlack float64
	// Pause is the fleet's pause configuration, which the two pause bounds
	// below derive from when they are zero (its defaults where its fields
	// are zero).
	Pause pause.Config
	// Propagation bounds the canary's pause propagation p99. Default
	// Pause.LongestGap(): a lost event is repaired by the next reconcile,
	// at most ReconcileEvery + 20% and a reconcile's Timeout after the
	// change (2.2 s with the pause defaults).
	Propagation time.Duration
	// MaxAge bounds the canary's pause snapshot age. Default Pause.MaxAge,
	// where a replica fails closed (5 s with the pause defaults).
	MaxAge time.Duration
	// CommandSlack is how far commands per warm message may stray from
	// what the canary's steps imply (retries and re-decisions add a few).
	// Default 0.05.
	CommandSlack float64
	// LatencyConfidence is the confidence at which the pre-HTTP latency
	// gate's one-sided rank test must find the canary slower to fail it:
	// it fails when the test's p-value is below 1 - LatencyConfidence.
	// Default 0.99.
	LatencyConfidence float64
	// LatencyTolerance is how many histogram buckets (each about 41%
	// wider than the one below) the canary's pre-HTTP latencies are moved
	// down by before the test: a slowdown of up to that many buckets is
	// tolerated. Default 0: none. A demo on a shared machine may set it;
	// production should not.
	LatencyTolerance int
	// LatencyMinSamples is the fewest pre-HTTP observations on each side
	// the latency gate judges; with fewer it says "no data". Default 30
	// (the normal approximation of the rank test's statistic holds well
	// from about 20 a side).
	LatencyMinSamples int
	// InFlight is how many script runs the workers' and the server's
	// counts may differ by: the calls in flight at the window's two edges
	// (the server counts a call before its replica's observer does), at
	// most the replicas' workers. Default 0.
	InFlight int
}

func (b *Bounds) defaults() {
	if b.RateSlack == 0 {
		b.RateSlack = 0.03
	}
	p := b.Pause.WithDefaults()
	if b.Propagation == 0 {
		b.Propagation = p.LongestGap()
	}
	if b.MaxAge == 0 {
		b.MaxAge = p.MaxAge
	}
	if b.CommandSlack == 0 {
		b.CommandSlack = 0.05
	}
	if b.LatencyConfidence == 0 {
		b.LatencyConfidence = 0.99
	}
	if b.LatencyMinSamples == 0 {
		b.LatencyMinSamples = 30
	}
}

// The metric names the gates read (package metrics').
const (
	MetricAge      = "outgress_pause_snapshot_age_seconds"
	metricHelix    = "outgress_helix_responses_total"
	metricTokens   = "outgress_limiter_tokens_total"
	metricDecision = "outgress_limiter_decisions_total"
	metricFinished = "outgress_messages_finished_total"
	metricWarm     = "outgress_warm_messages_total"
	metricWarmCall = "outgress_warm_valkey_calls_total"
	metricCalls    = "outgress_limiter_calls_total"
	metricStage    = "outgress_stage_duration_seconds"
	metricConns    = "outgress_helix_sampled_connections_total"
	metricPropag   = "outgress_pause_propagation_seconds"
	metricRollout  = "outgress_rollout_step"
)

// A Gate is one line of the table.
type Gate struct {
	Name             string
	Baseline, Canary string
	Pass             bool
	Rule             string // what passes
	// BaselineN and CanaryN are how many observations each side's figure
	// was computed from, in the window: responses, finished messages, warm
	// messages, tokens, script runs, sampled requests, histogram
	// observations (pre-HTTP latency, pause changes), age readings. A gate
	// that passes on a canary figure computed from nothing (CanaryN 0)
	// judged nothing: Print says "no data", and Report.NoData names it.
	BaselineN, CanaryN float64
	// NoData, when not empty, is why the gate judged nothing though it
	// has observations (too few of them for its test, say): it passes, and
	// Print says "no data" and this reason.
	NoData string
}

// judged reports whether g judged anything.
func (g Gate) judged() bool { return g.CanaryN > 0 && g.NoData == "" }

// Report is every gate of one window.
type Report struct {
	Gates []Gate
	// Pass is every gate's.
	Pass bool
	// NoData names the gates that passed on no canary observation (a
	// window without a pause change has no propagation to judge, say).
	NoData []string
	// Steps is the canary's rollout steps, from its outgress_rollout_step.
	Steps string
}

// Gate returns the gate named name, and whether there is one.
func (r *Report) Gate(name string) (Gate, bool) {
	i := slices.IndexFunc(r.Gates, func(g Gate) bool { return g.Name == name })
	if i < 0 {
		return Gate{}, false
	}
	return r.Gates[i], true
}

// The gates' names.
const (
	Gate429         = "429s per response"
	GateAuth        = "auth failures per response"
	GateReserve     = "premium reserve taken"
	GateDropped     = "dropped per message"
	GateRedelivered = "redelivered per message"
	GateCmdStandard = "commands/warm msg, standard"
	GateCmdPremium  = "commands/warm msg, premium"
	GateCmdServer   = "script runs: workers = server"
	GateLatency     = "pre-HTTP latency, rank test"
	GateP95         = "pre-HTTP p95, tail test"
	GateP99         = "pre-HTTP p99, tail test"
	GateChurn       = "new conns per sampled request"
	GatePropagation = "pause propagation p99"
	GatePauseAge    = "pause snapshot age, max"
)

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// stdErr is the standard error of the difference of two rates p1 of n1
// and p2 of n2, pooled: what chance alone moves one replica's rate by when
// both see the same traffic.
func stdErr(p1, p2, n1, n2 float64) float64 {
	if n1 == 0 || n2 == 0 {
		return 0
	}
	p := (p1*n1 + p2*n2) / (n1 + n2)
	return math.Sqrt(p * (1 - p) * (1/n1 + 1/n2))
}

func pct(v float64) string { return strconv.FormatFloat(100*v, 'f', 1, 64) + "%" }

// Evaluate computes every gate of w.
func Evaluate(w *Window, b Bounds) *Report {
	b.defaults()
	rep := &Report{Pass: true}
	add := func(g Gate) {
		rep.Gates = append(rep.Gates, g)
		rep.Pass = rep.Pass && g.Pass
		if g.Pass && !g.judged() {
			rep.NoData = append(rep.NoData, g.Name)
		}
	}
	base, can := &w.Baseline, &w.Canary

	rate := func(name string, num func(*Replica) float64, den func(*Replica) float64) Gate {
		bn, cn := den(base), den(can)
		bv, cv := ratio(num(base), bn), ratio(num(can), cn)
		allowed := bv + b.RateSlack + 3*stdErr(bv, cv, bn, cn)
		return Gate{Name: name, Baseline: fmt.Sprintf("%s of %.0f", pct(bv), bn), Canary: fmt.Sprintf("%s of %.0f", pct(cv), cn),
			Pass: cv <= allowed, Rule: "canary <= baseline + " + pct(b.RateSlack) + " + 3 SE (" + pct(allowed) + ")", BaselineN: bn, CanaryN: cn}
	}
	responses := func(r *Replica) float64 { return r.delta(metricHelix) }
	add(rate(Gate429, func(r *Replica) float64 { return r.delta(metricHelix, "status_class", "429") }, responses))
	add(rate(GateAuth, func(r *Replica) float64 { return r.delta(metricHelix, "status_class", "auth") }, responses))

	// reserve's n is the tokens the standard and system lanes took from the
	// shared and general buckets: what the excess is a part of.
	reserve := func(r *Replica) (excess, premiumRefused, n float64) {
		tok := func(lane, class string) float64 { return r.delta(metricTokens, "lane", lane, "class", class) }
		n = tok("standard", "shared") + tok("standard", "general") + tok("system", "general")
		excess = n - tok("standard", "standard") - tok("system", "system")
		premiumRefused = r.delta(metricDecision, "lane", "premium", "decision", "denied_shared") +
			r.delta(metricDecision, "lane", "premium", "decision", "denied_general")
		return max(excess, 0), premiumRefused, n
	}
	be, bp, bn := reserve(base)
	ce, cp, cn := reserve(can)
	add(Gate{Name: GateReserve, Rule: "canary takes 0 tokens of the reserve",
		Baseline: fmt.Sprintf("%.0f (premium refused %.0f)", be, bp), Canary: fmt.Sprintf("%.0f (premium refused %.0f)", ce, cp), Pass: ce == 0,
		BaselineN: bn, CanaryN: cn})

	messages := func(r *Replica) float64 { return r.delta(metricFinished) }
	add(rate(GateDropped, func(r *Replica) float64 { return r.delta(metricFinished, "dropped", "true") }, messages))
	add(rate(GateRedelivered, func(r *Replica) float64 { return r.delta(metricFinished, "redelivered", "true") }, messages))

	on := func(step string) bool { return can.End.Get(metricRollout, "step", step) == 1 }
	var steps []string
	for _, s := range []string{"metrics", "transport", "ordered_script", "pause_snapshot", "nack_suppression", "precomputed"} {
		if on(s) {
			steps = append(steps, s)
		}
	}
	rep.Steps = strings.Join(steps, ",")
	if rep.Steps == "" {
		rep.Steps = "none"
	}
	extraPause := 0.0
	if !on("pause_snapshot") {
		extraPause = 1
	}
	expect := map[string]float64{"standard": 1 + extraPause, "premium": 1 + extraPause}
	if !on("ordered_script") {
		expect["standard"]++
	}
	for _, c := range []struct{ name, lane string }{{GateCmdStandard, "standard"}, {GateCmdPremium, "premium"}} {
		per := func(r *Replica) (float64, float64) {
			n := r.delta(metricWarm, "lane", c.lane)
			return ratio(r.delta(metricWarmCall, "lane", c.lane), n), n
		}
		bv, bn := per(base)
		cv, n := per(can)
		want := expect[c.lane]
		// A scrape reads the message and call counters one after the
		// other, so a message counted between the two reads moves the
		// ratio by want/n at each edge of the window: two messages' worth
		// of slack beside CommandSlack.
		slack := b.CommandSlack
		if n > 0 {
			slack += 2 * want / n
		}
		add(Gate{Name: c.name, Baseline: fmt.Sprintf("%.2f", bv), Canary: fmt.Sprintf("%.2f (%.0f msgs)", cv, n),
			Rule: fmt.Sprintf("canary = %.0f (its steps) ± %.2f", want, slack), Pass: n > 0 && math.Abs(cv-want) <= slack,
			BaselineN: bn, CanaryN: n})
	}
	scripts := func(r *Replica) float64 {
		var n float64
		for _, a := range []string{"allowed", "denied", "replayed", "outcome_unknown"} {
			n += r.delta(metricCalls, "answer", a)
		}
		return n
	}
	// This gate's figures are both replicas' script runs (Baseline) and
	// the server's (Canary); its N is the workers' runs, and 0 on the
	// canary's side when the server could not be read.
	workers := scripts(base) + scripts(can)
	for i := range w.Others {
		workers += scripts(&w.Others[i])
	}
	if w.ServerScripts < 0 {
		add(Gate{Name: GateCmdServer, Baseline: fmt.Sprintf("workers %.0f", workers), Canary: "server n/a: " + w.ServerNote,
			Rule: "equal, when the server counts", Pass: true, BaselineN: workers})
	} else {
		lo, hi := float64(w.ServerScripts-int64(b.InFlight)), float64(w.ServerScriptsMax+int64(b.InFlight))
		add(Gate{Name: GateCmdServer, Baseline: fmt.Sprintf("workers %.0f", workers), Canary: fmt.Sprintf("server %d-%d", w.ServerScripts, w.ServerScriptsMax),
			Rule: fmt.Sprintf("within the server's ± %d in flight", b.InFlight), Pass: workers >= lo && workers <= hi, BaselineN: workers, CanaryN: workers})
	}

	add(latencyGate(base, can, b))
	bb, bc := histogram(base, metricStage, "stage", "pre_http")
	cb, cc := histogram(can, metricStage, "stage", "pre_http")
	add(tailGate(GateP95, 0.95, bb, bc, cb, cc, b))
	add(tailGate(GateP99, 0.99, bb, bc, cb, cc, b))
	add(rate(GateChurn, func(r *Replica) float64 { return r.delta(metricConns, "reused", "false") },
		func(r *Replica) float64 { return r.delta(metricConns) }))

	bp99, bchanges := quantile(base, metricPropag, 0.99)
	cp99, changes := quantile(can, metricPropag, 0.99)
	add(Gate{Name: GatePropagation, Baseline: fmt.Sprintf("%s (%.0f changes)", dur(bp99), bchanges), Canary: fmt.Sprintf("%s (%.0f changes)", dur(cp99), changes),
		Rule: "canary <= " + b.Propagation.String(), Pass: cp99 <= b.Propagation.Seconds(), BaselineN: bchanges, CanaryN: changes})
	add(Gate{Name: GatePauseAge, Baseline: dur(base.MaxAge), Canary: dur(can.MaxAge),
		Rule: "canary <= " + b.MaxAge.String(), Pass: can.MaxAge <= b.MaxAge.Seconds(),
		BaselineN: float64(base.AgeSamples), CanaryN: float64(can.AgeSamples)})
	return rep
}

// histogram is what the window added to name's histogram (series
// matching kv merged): its bucket bounds in ascending order (+Inf last)
// and the cumulative count at each.
func histogram(r *Replica, name string, kv ...string) (bounds, cum []float64) {
	byLE := map[float64]float64{}
	for _, s := range []struct {
		sample Sample
		sign   float64
	}{{r.End, 1}, {r.Start, -1}} {
		for _, se := range s.sample.series[name+"_bucket"] {
			ok := true
			for i := 0; i+1 < len(kv); i += 2 {
				if se.labels[kv[i]] != kv[i+1] {
					ok = false
				}
			}
			if !ok {
				continue
			}
			le, err := strconv.ParseFloat(se.labels["le"], 64)
			if err == nil {
				byLE[le] += s.sign * se.value
			}
		}
	}
	for le := range byLE {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	for _, le := range bounds {
		cum = append(cum, byLE[le])
	}
	return bounds, cum
}

// quantile is the upper bound of the histogram bucket holding quantile q of
// what the window added to name's histogram (series matching kv merged),
// and the observations the window added (its +Inf bucket); 0 and 0 when
// the window added nothing.
func quantile(r *Replica, name string, q float64, kv ...string) (bound, n float64) {
	bounds, cum := histogram(r, name, kv...)
	return quantileOf(bounds, cum, q)
}

func quantileOf(bounds, cum []float64, q float64) (bound, n float64) {
	if len(bounds) == 0 || cum[len(cum)-1] <= 0 {
		return 0, 0
	}
	total := cum[len(cum)-1]
	rank := math.Ceil(q * total)
	for i, le := range bounds {
		if cum[i] >= rank {
			return le, total
		}
	}
	return math.Inf(1), total
}

// latencyGate is the pre-HTTP latency gate: the one-sided rank test of the
// canary's pre_http histogram against the baseline's (RankTest), with both
// sides' p95 and p99 beside it.
func latencyGate(base, can *Replica, b Bounds) Gate {
	bb, bc := histogram(base, metricStage, "stage", "pre_http")
	cb, cc := histogram(can, metricStage, "stage", "pre_http")
	alpha := 1 - b.LatencyConfidence
	g := Gate{Name: GateLatency, Pass: true,
		Rule: fmt.Sprintf("not slower, one-sided rank test: p >= %.3g (%.3g%% confidence), tolerance %d buckets, n >= %d a side",
			alpha, 100*b.LatencyConfidence, b.LatencyTolerance, b.LatencyMinSamples)}
	quantiles := func(bounds, cum []float64) string {
		p95, n := quantileOf(bounds, cum, 0.95)
		p99, _ := quantileOf(bounds, cum, 0.99)
		return fmt.Sprintf("p95 %s, p99 %s, n %.0f", dur(p95), dur(p99), n)
	}
	g.Baseline, g.Canary = quantiles(bb, bc), quantiles(cb, cc)
	if len(bc) > 0 {
		g.BaselineN = bc[len(bc)-1]
	}
	if len(cc) > 0 {
		g.CanaryN = cc[len(cc)-1]
	}
	switch {
	case g.BaselineN < float64(b.LatencyMinSamples) || g.CanaryN < float64(b.LatencyMinSamples):
		g.NoData = fmt.Sprintf("n %.0f baseline, %.0f canary: under %d a side", g.BaselineN, g.CanaryN, b.LatencyMinSamples)
		return g
	case !slices.Equal(bb, cb):
		g.NoData = "the two histograms' buckets differ"
		return g
	}
	rt := rankTest(perBucket(bc), perBucket(cc), b.LatencyTolerance)
	g.Canary += fmt.Sprintf("; U %.0f, z %.2f, p %.3g", rt.U, rt.Z, rt.P)
	g.Pass = rt.P >= alpha
	return g
}

// perBucket turns cumulative counts into each bucket's own.
func perBucket(cum []float64) []float64 {
	out := make([]float64, len(cum))
	prev := 0.0
	for i, c := range cum {
		out[i], prev = max(c-prev, 0), c
	}
	return out
}

func dur(sec float64) string {
	switch {
	case math.IsInf(sec, 1):
		return "+Inf"
	case sec == 0:
		return "-"
	}
	return time.Duration(sec * float64(time.Second)).Round(time.Microsecond).String()
}

// Print writes the gate table and the verdict.
func (r *Report) Print(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "   gate\tbaseline\tcanary\tpasses when\tverdict\t")
	for _, g := range r.Gates {
		v := "pass"
		switch {
		case !g.Pass:
			v = "FAIL"
		case g.NoData != "":
			v = "no data (" + g.NoData + ")"
		case g.CanaryN == 0:
			v = "no data"
		}
		fmt.Fprintf(w, "   %s\t%s\t%s\t%s\t%s\t\n", g.Name, g.Baseline, g.Canary, g.Rule, v)
	}
	w.Flush()
	if r.Pass {
		nodata := ""
		if len(r.NoData) > 0 {
			nodata = "; no data for " + strings.Join(r.NoData, "; ")
		}
		fmt.Fprintln(out, "   verdict: PASS (canary steps: "+r.Steps+nodata+")")
	} else {
		var failed []string
		for _, g := range r.Gates {
			if !g.Pass {
				failed = append(failed, g.Name)
			}
		}
		fmt.Fprintln(out, "   verdict: FAIL ("+strings.Join(failed, "; ")+"; canary steps: "+r.Steps+")")
	}
}

// CommandStats reads script runs from a Valkey server's INFO commandstats:
// pass a function that returns the section's text.
type CommandStats func(ctx context.Context) (string, error)

// ScriptRuns implements Server: EVALSHA calls less failed ones (NOSCRIPT),
// plus EVAL.
func (f CommandStats) ScriptRuns(ctx context.Context) (int64, error) {
	info, err := f(ctx)
	if err != nil {
		return 0, err
	}
	var evalsha, failed, eval int64
	found := false
	for line := range strings.SplitSeq(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		found = true
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch {
			case name == "cmdstat_evalsha" && k == "calls":
				evalsha = n
			case name == "cmdstat_evalsha" && k == "failed_calls":
				failed = n
			case name == "cmdstat_eval" && k == "calls":
				eval = n
			}
		}
	}
	if !found && !strings.Contains(info, "# Commandstats") {
		return 0, fmt.Errorf("the server has no INFO commandstats")
	}
	return evalsha - failed + eval, nil
}
