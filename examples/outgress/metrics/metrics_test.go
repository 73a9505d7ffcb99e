package metrics

import (
	"errors"

	"fmt"
	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestMetricsNoAllocs: recording allocates nothing, so the hot path can
// afford it.
func TestMetricsNoAllocs(t *testing.T) {
	m := New()
	if a := testing.AllocsPerRun(1000, func() {
		m.Observe(StagePause, time.Millisecond)
		m.LimiterCall(limits.LaneStandard, DecisionDenied+Decision(limits.ClassShared))
		m.ObserveLimiter(admit.Observation{Op: admit.OpOnce, Duration: time.Millisecond})
		m.CacheLookup(channels.CacheHit)
		m.Command(limits.LanePremium, command.KindChat)
		m.Delivery(nil, bus.OutcomeNacked, uint8(bus.NackLimited))
	}); a != 0 {
		t.Errorf("%v allocations, want 0", a)
	}
	if m.Denied(limits.LaneStandard, limits.ClassShared) != 1001 || m.CacheLookups(channels.CacheHit) != 1001 || m.Commands(limits.LanePremium, command.KindChat) != 1001 {
		t.Error("counts lost")
	}
}

// TestLabelsAreFixed: every label value comes from a fixed list, and an
// out-of-range value is named "invalid", never formatted from its input.
func TestLabelsAreFixed(t *testing.T) {
	names := map[string][]string{}
	add := func(label string, n int, name func(int) string) {
		for i := range n + 1 {
			names[label] = append(names[label], name(i))
		}
	}
	add("stage", int(NumStages), func(i int) string { return Stage(i).String() })
	add("lane", int(limits.NumLanes), func(i int) string { return limits.Lane(i).String() })
	add("class", int(limits.NumClasses), func(i int) string { return limits.BucketClass(i).String() })
	add("status", int(helix.NumStatus), func(i int) string { return helix.StatusClass(i).String() })
	add("nack", int(bus.NumNackReasons), func(i int) string { return bus.NackReason(i).String() })
	add("drop", int(bus.NumDropReasons), func(i int) string { return bus.DropReason(i).String() })
	add("kind", int(command.NumKinds), func(i int) string { return command.Kind(i).String() })
	add("decision", int(NumDecisions), func(i int) string { return Decision(i).String() })
	add("outcome", int(bus.NumOutcomes), func(i int) string { return bus.Outcome(i).String() })
	for label, vals := range names {
		seen := map[string]bool{}
		for i, v := range vals {
			last := i == len(vals)-1
			if (v == "invalid") != last || v == "" || seen[v] {
				t.Errorf("%s %d: %q", label, i, v)
			}
			seen[v] = true
		}
	}
	for code, want := range map[int]helix.StatusClass{200: helix.Status2xx, 204: helix.Status2xx, 301: helix.Status3xx, 400: helix.Status4xx, 429: helix.Status429, 500: helix.Status5xx, 503: helix.Status5xx, 99: helix.Status5xx} {
		if got := helix.ClassOf(code); got != want {
			t.Errorf("status %d: %v, want %v", code, got, want)
		}
	}
}

// TestMetricsScrape serves the registry over HTTP, as the demo does on
// /metrics, and compares what a scraper reads for the delivery and cache
// counters with what was recorded.
func TestMetricsScrape(t *testing.T) {
	m := New()
	m.Delivery(nil, bus.OutcomeAcked, 0)
	m.Delivery(nil, bus.OutcomeAcked, 0)
	m.Delivery(nil, bus.OutcomeNacked, uint8(bus.NackPaused))
	m.Delivery(nil, bus.OutcomeDropped, uint8(bus.DropNoTimeError))
	m.Delivery(nil, bus.OutcomeError, 0)
	m.CacheLookup(channels.CacheHit)
	m.CacheLookup(channels.CacheMiss)
	m.CacheLookup(channels.CacheNone) // a command in no channel: not a lookup
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	want := `
# HELP outgress_channel_lookups_total Channel cache lookups: hit, miss (one HGETALL) or joined (another caller's load).
# TYPE outgress_channel_lookups_total counter
outgress_channel_lookups_total{result="hit"} 1
outgress_channel_lookups_total{result="joined"} 0
outgress_channel_lookups_total{result="miss"} 1
# HELP outgress_deliveries_total Bus deliveries by outcome and reason (none for acked, error and released).
# TYPE outgress_deliveries_total counter
outgress_deliveries_total{outcome="acked",reason=""} 2
outgress_deliveries_total{outcome="dropped",reason="expired"} 0
outgress_deliveries_total{outcome="dropped",reason="malformed"} 0
outgress_deliveries_total{outcome="dropped",reason="max_attempts"} 0
outgress_deliveries_total{outcome="dropped",reason="no_time_error"} 1
outgress_deliveries_total{outcome="dropped",reason="no_time_limited"} 0
outgress_deliveries_total{outcome="dropped",reason="no_time_paused"} 0
outgress_deliveries_total{outcome="dropped",reason="no_time_throttled"} 0
outgress_deliveries_total{outcome="dropped",reason="rejected"} 0
outgress_deliveries_total{outcome="dropped",reason="unknown_channel"} 0
outgress_deliveries_total{outcome="error",reason=""} 1
outgress_deliveries_total{outcome="nacked",reason="limited"} 0
outgress_deliveries_total{outcome="nacked",reason="paused"} 1
outgress_deliveries_total{outcome="nacked",reason="throttled"} 0
outgress_deliveries_total{outcome="released",reason=""} 0
`
	if err := testutil.ScrapeAndCompare(srv.URL, strings.NewReader(want), MetricCache, MetricDeliver); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), MetricLimiter); n != int(limits.NumLanes)*int(NumDecisions) {
		t.Errorf("%d limiter series, want %d (every lane × decision, created up front)", n, int(limits.NumLanes)*int(NumDecisions))
	}
}

// TestRetriesByCause: a repeat is counted under the failure that caused it,
// and only the two failure classes are causes.
func TestRetriesByCause(t *testing.T) {
	m := New()
	m.LimiterRetry(limits.LaneStandard, DecisionNotExecuted)
	m.LimiterRetry(limits.LaneStandard, DecisionOutcomeUnknown)
	m.LimiterRetry(limits.LaneStandard, DecisionOutcomeUnknown)
	m.LimiterRetry(limits.LaneStandard, DecisionAllowed) // not a cause: ignored
	m.LimiterRetry(limits.NumLanes, DecisionNotExecuted) // not a lane: ignored
	want := `
# HELP outgress_limiter_retries_total Limiter calls repeated within a delivery, by lane and the failure of the call before: not_executed (it provably did not run; bounded retries) or outcome_unknown (it may have run; repeated once under the same id, which takes nothing if it ran).
# TYPE outgress_limiter_retries_total counter
outgress_limiter_retries_total{after="not_executed",lane="premium"} 0
outgress_limiter_retries_total{after="not_executed",lane="standard"} 1
outgress_limiter_retries_total{after="not_executed",lane="system"} 0
outgress_limiter_retries_total{after="outcome_unknown",lane="premium"} 0
outgress_limiter_retries_total{after="outcome_unknown",lane="standard"} 2
outgress_limiter_retries_total{after="outcome_unknown",lane="system"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), MetricRetries); err != nil {
		t.Error(err)
	}
	if m.LimiterRetries(limits.LaneStandard, DecisionOutcomeUnknown) != 2 || m.LimiterRetries(limits.LaneStandard, DecisionAllowed) != 0 {
		t.Error("LimiterRetries disagrees with the scrape")
	}
}

// TestObserveLimiter: every admit.Observation is counted under its op and
// outcome (an error's class first, then cached, replayed, allowed or
// denied; a refund, which returns no Decision, as allowed) and timed under
// its op; ScriptRuns leaves out the cached and the not-executed calls.
func TestObserveLimiter(t *testing.T) {
	m := New()
	notExec := fmt.Errorf("refused: %w", admit.ErrNotExecuted)
	unknown := fmt.Errorf("lost: %w", admit.ErrOutcomeUnknown)
	for _, o := range []admit.Observation{
		{Op: admit.OpOnce, Err: notExec},
		{Op: admit.OpOnce, Err: unknown},
		{Op: admit.OpOnce, Err: errors.Join(unknown)},
		{Op: admit.OpTake, Cached: true},
		{Op: admit.OpRefund},
		{Op: admit.OpPeek},                // the zero Decision: denied
		{Op: admit.Op(200), Err: unknown}, // an Op admit adds later
	} {
		m.ObserveLimiter(o)
	}
	for _, c := range []struct {
		op   admit.Op
		o    CallOutcome
		want int64
	}{
		{admit.OpOnce, CallNotExecuted, 1},
		{admit.OpOnce, CallOutcomeUnknown, 2},
		{admit.OpTake, CallCached, 1},
		{admit.OpRefund, CallAllowed, 1},
		{admit.OpPeek, CallDenied, 1},
		{0, CallOutcomeUnknown, 1},
	} {
		if got := m.LimiterCalls(c.op, c.o); got != c.want {
			t.Errorf("%v %v: %d, want %d", c.op, c.o, got, c.want)
		}
	}
	if got := m.ScriptRuns(); got != 5 {
		t.Errorf("ScriptRuns %d, want 5 (7 calls but one cached and one not executed)", got)
	}
	if got := m.LimiterLatency().Count; got != 7 {
		t.Errorf("%d timed calls, want 7", got)
	}
	if n := testutil.CollectAndCount(m.Registry(), MetricCalls); n != int(numOps)*int(NumCallOutcomes) {
		t.Errorf("%d call series, want %d (created up front)", n, int(numOps)*int(NumCallOutcomes))
	}
}
