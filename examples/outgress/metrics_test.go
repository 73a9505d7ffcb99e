package main

import (
	"github.com/admitkit/admit/examples/outgress/bus"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsNoAllocs: recording allocates nothing, so the hot path can
// afford it.
func TestMetricsNoAllocs(t *testing.T) {
	m := NewMetrics()
	if a := testing.AllocsPerRun(1000, func() {
		m.Observe(StagePause, time.Millisecond)
		m.limiterCall(LaneStandard, DecisionDenied+Decision(ClassShared), time.Millisecond)
		m.cacheLookup(CacheHit)
		m.command(LanePremium, KindChat)
		m.Delivery(nil, bus.OutcomeNacked, uint8(bus.NackLimited))
	}); a != 0 {
		t.Errorf("%v allocations, want 0", a)
	}
	if m.Denied(LaneStandard, ClassShared) != 1001 || m.CacheLookups(CacheHit) != 1001 || m.Commands(LanePremium, KindChat) != 1001 {
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
	add("stage", int(numStages), func(i int) string { return Stage(i).String() })
	add("lane", int(numLanes), func(i int) string { return Lane(i).String() })
	add("class", int(numClasses), func(i int) string { return BucketClass(i).String() })
	add("status", int(numStatus), func(i int) string { return StatusClass(i).String() })
	add("nack", int(bus.NumNackReasons), func(i int) string { return bus.NackReason(i).String() })
	add("drop", int(bus.NumDropReasons), func(i int) string { return bus.DropReason(i).String() })
	add("kind", int(numKinds), func(i int) string { return Kind(i).String() })
	add("decision", int(numDecisions), func(i int) string { return Decision(i).String() })
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
	for code, want := range map[int]StatusClass{200: Status2xx, 204: Status2xx, 301: Status3xx, 400: Status4xx, 429: Status429, 500: Status5xx, 503: Status5xx, 99: Status5xx} {
		if got := statusClass(code); got != want {
			t.Errorf("status %d: %v, want %v", code, got, want)
		}
	}
}

// allowedLabels is every value each label of an outgress_ metric may take.
func allowedLabels() map[string][]string {
	vals := func(n int, name func(int) string) []string {
		var v []string
		for i := range n {
			v = append(v, name(i))
		}
		return v
	}
	return map[string][]string{
		"stage":        vals(int(numStages), func(i int) string { return Stage(i).String() }),
		"lane":         vals(int(numLanes), func(i int) string { return Lane(i).String() }),
		"kind":         vals(int(numKinds), func(i int) string { return Kind(i).String() }),
		"decision":     vals(int(numDecisions), func(i int) string { return Decision(i).String() }),
		"result":       {"hit", "miss", "joined"},
		"status_class": vals(int(numStatus), func(i int) string { return StatusClass(i).String() }),
		"reused":       {"true", "false"},
		"outcome":      vals(int(bus.NumOutcomes), func(i int) string { return bus.Outcome(i).String() }),
		"reason": append(append([]string{""},
			vals(int(bus.NumNackReasons), func(i int) string { return bus.NackReason(i).String() })...),
			vals(int(bus.NumDropReasons), func(i int) string { return bus.DropReason(i).String() })...),
		"replica": {"A"},
	}
}

// TestMetricsLabelSetsFixed sends traffic on 60 channels through a worker
// and checks, on the gathered registry, that every outgress_ series' labels
// take only the fixed values and that the traffic created no series: the
// set after equals the set created up front.
func TestMetricsLabelSetsFixed(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.metrics.RegisterPause("A", e.pause); err != nil {
		t.Fatal(err)
	}
	series := func() []string {
		t.Helper()
		mfs, err := e.metrics.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		allowed := allowedLabels()
		var out []string
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "outgress_") {
				continue
			}
			for _, m := range mf.GetMetric() {
				id := mf.GetName()
				for _, lp := range m.GetLabel() {
					if !slices.Contains(allowed[lp.GetName()], lp.GetValue()) {
						t.Errorf("%s: label %s=%q is not one of the fixed values", mf.GetName(), lp.GetName(), lp.GetValue())
					}
					id += "," + lp.GetName() + "=" + lp.GetValue()
				}
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	before := series()
	for i := range 60 {
		id := strconv.Itoa(5000 + i)
		e.seed(t, id, i%5 == 0)
		for _, body := range []string{chat(id), `{"kind":"api","method":"GET","path":"/helix/users?id=` + id + `"}`, chat("999" + id)} {
			e.process(t, Lane(i%2), body)
		}
	}
	if after := series(); !slices.Equal(before, after) {
		t.Errorf("traffic changed the series: %d before, %d after", len(before), len(after))
	}
	// 60 standard/premium chats, 60 API calls, 60 unknown channels.
	if got := e.metrics.Commands(LaneStandard, KindChat) + e.metrics.Commands(LanePremium, KindChat); got != 120 {
		t.Errorf("%d chat commands counted, want 120", got)
	}
	if got := e.metrics.CacheLookups(CacheMiss); got != 120 {
		t.Errorf("%d cache misses, want 120 (60 channels, 60 unknown)", got)
	}
}

// TestMetricsScrape serves the registry over HTTP, as the demo does on
// /metrics, and compares what a scraper reads for the delivery and cache
// counters with what was recorded.
func TestMetricsScrape(t *testing.T) {
	m := NewMetrics()
	m.Delivery(nil, bus.OutcomeAcked, 0)
	m.Delivery(nil, bus.OutcomeAcked, 0)
	m.Delivery(nil, bus.OutcomeNacked, uint8(bus.NackPaused))
	m.Delivery(nil, bus.OutcomeDropped, uint8(bus.DropNoTimeToRetry))
	m.Delivery(nil, bus.OutcomeError, 0)
	m.cacheLookup(CacheHit)
	m.cacheLookup(CacheMiss)
	m.cacheLookup(CacheNone) // a command in no channel: not a lookup
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
outgress_deliveries_total{outcome="dropped",reason="no_time_to_retry"} 1
outgress_deliveries_total{outcome="dropped",reason="rejected"} 0
outgress_deliveries_total{outcome="dropped",reason="unknown_channel"} 0
outgress_deliveries_total{outcome="error",reason=""} 1
outgress_deliveries_total{outcome="nacked",reason="limited"} 0
outgress_deliveries_total{outcome="nacked",reason="paused"} 1
outgress_deliveries_total{outcome="nacked",reason="throttled"} 0
outgress_deliveries_total{outcome="released",reason=""} 0
`
	if err := testutil.ScrapeAndCompare(srv.URL, strings.NewReader(want), metricCache, metricDeliver); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), metricLimiter); n != int(numLanes)*int(numDecisions) {
		t.Errorf("%d limiter series, want %d (every lane × decision, created up front)", n, int(numLanes)*int(numDecisions))
	}
}
