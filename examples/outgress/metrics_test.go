package main

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	if q := h.Quantile(0.5); q != 0 {
		t.Errorf("empty: %v, want 0", q)
	}
	for i := 1; i <= 100; i++ {
		h.Observe(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		rank time.Duration // the exact quantile
	}{{0.5, 50 * time.Microsecond}, {0.95, 95 * time.Microsecond}, {0.99, 99 * time.Microsecond}, {1, 100 * time.Microsecond}} {
		got := h.Quantile(c.q)
		if got < c.rank || float64(got) > float64(c.rank)*1.0906 { // 2^(1/8)
			t.Errorf("q%v = %v, want within one bucket above %v", c.q, got, c.rank)
		}
	}
	if h.Count() != 100 {
		t.Errorf("count %d, want 100", h.Count())
	}
}

// TestHistogramBucketBounds: every value lands in a bucket whose upper
// bound is at least the value and less than one bucket width above it.
func TestHistogramBucketBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		ns := int64(histMin) + rng.Int64N(int64(60*time.Second))
		i := histBucket(ns)
		if up := int64(histUpper(i)); up < ns || (i > 0 && int64(histUpper(i-1)) >= ns) {
			t.Fatalf("%d ns in bucket %d, bounds (%d, %d]", ns, i, histUpper(i-1), up)
		}
	}
	if histBucket(-5) != 0 || histBucket(int64(time.Hour)) != histBuckets-1 {
		t.Error("out-of-range values not clamped")
	}
}

// TestMetricsNoAllocs: recording allocates nothing, so the hot path can
// afford it.
func TestMetricsNoAllocs(t *testing.T) {
	var m Metrics
	if a := testing.AllocsPerRun(1000, func() {
		m.Observe(StageLimiter, time.Millisecond)
		m.decision(LaneStandard, false, ClassShared)
		m.cacheLookup(CacheHit)
		m.command(LanePremium, KindChat)
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
	for i := range numStages + 1 {
		names["stage"] = append(names["stage"], i.String())
	}
	for i := range numLanes + 1 {
		names["lane"] = append(names["lane"], i.String())
	}
	for i := range numClasses + 1 {
		names["class"] = append(names["class"], i.String())
	}
	for i := range numStatus + 1 {
		names["status"] = append(names["status"], i.String())
	}
	for i := range numNackReasons + 1 {
		names["nack"] = append(names["nack"], i.String())
	}
	for i := range numDropReasons + 1 {
		names["drop"] = append(names["drop"], i.String())
	}
	for i := range numKinds + 1 {
		names["kind"] = append(names["kind"], i.String())
	}
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
