package canary

import (
	"math"
	"strings"
	"testing"
)

// TestBinomialTailByHand pins binomialTail against sums of the binomial
// pmf computed exactly (Python's math.comb), on both of its branches
// (k above the mean, and at or below it) and at its edges.
func TestBinomialTailByHand(t *testing.T) {
	for _, c := range []struct {
		k, n int
		p    float64
		want float64
	}{
		{20, 1000, 0.01, 0.00328836},
		{19, 1000, 0.01, 0.00690499},
		{18, 1000, 0.01, 0.0138326},
		{3, 30, 0.01, 0.00331771},
		{2, 30, 0.01, 0.036148},
		{1, 10, 0.5, 0.999023},
		{5, 100, 0.05, 0.564019}, // at the mean: the lower branch
		{60, 1000, 0.05, 0.0867322},
		{0, 5, 0.1, 1},
		{6, 5, 0.1, 0},
		{900, 100000, 0.01, 0.999411}, // a large n, below the mean
		{300, 100000, 0.01, 1},        // far below the mean: the lower sum's first term underflows to 0
		{2000, 100000, 0.01, 0},       // far above: the upper sum's first term underflows to 0
	} {
		if got := binomialTail(c.k, c.n, c.p); math.Abs(got-c.want) > 1e-5*math.Max(c.want, 1e-3) {
			t.Errorf("P(K >= %d; n %d, p %v) = %.6g, want %.6g", c.k, c.n, c.p, got, c.want)
		}
	}
}

// TestTailGates: the p95 and p99 gates. Identical distributions pass
// both; 2% of the canary three buckets up fails the p99 (20 of 1,000
// above the baseline's p99 bucket, p 0.00329) and not the p95; at the
// boundary, 19 above fails (p 0.0069) and 18 pass (p 0.0138) at 99%
// confidence; a tolerance of the bucket they moved by passes them; a
// baseline of 99 observations judges the p95 but not the p99 ("no data":
// its p99 needs 100).
func TestTailGates(t *testing.T) {
	gates := func(t *testing.T, base, can map[float64]int, b Bounds) (p95, p99 Gate, out string) {
		t.Helper()
		rep := Evaluate(latencyWindow(t, base, can), b)
		var w strings.Builder
		rep.Print(&w)
		p95, ok1 := rep.Gate(GateP95)
		p99, ok2 := rep.Gate(GateP99)
		if !ok1 || !ok2 {
			t.Fatalf("no tail gates:\n%s", w.String())
		}
		return p95, p99, w.String()
	}
	base := map[float64]int{0.001: 500, 0.002: 500}
	t.Run("identical", func(t *testing.T) {
		p95, p99, out := gates(t, base, base, Bounds{})
		if !p95.Pass || !p99.Pass || p95.NoData != "" || p99.NoData != "" || p99.Baseline != "p99 2ms, n 1000" || p99.Canary != "0 of 1000 above it (0.0%); p 1" {
			t.Errorf("identical: %+v, %+v; want both judged and passing:\n%s", p95, p99, out)
		}
	})
	t.Run("p99 moves", func(t *testing.T) {
		p95, p99, out := gates(t, base, map[float64]int{0.001: 500, 0.002: 480, 0.5: 20}, Bounds{})
		if !p95.Pass || p99.Pass || p99.Canary != "20 of 1000 above it (2.0%); p 0.00329" || !strings.Contains(out, "verdict: FAIL (") {
			t.Errorf("2%% three buckets up: p95 %+v, p99 %+v; want the p99 alone failing, p 0.00329:\n%s", p95, p99, out)
		}
		if !strings.Contains(p99.Rule, "not over 1%, one-sided binomial test: p >= 0.01, tolerance 0 buckets, n >= 100 baseline, 30 canary") {
			t.Errorf("p99 rule %q", p99.Rule)
		}
	})
	t.Run("boundary", func(t *testing.T) {
		for above, pass := range map[int]bool{19: false, 18: true} {
			_, p99, out := gates(t, base, map[float64]int{0.001: 500, 0.002: 500 - above, 0.004: above}, Bounds{})
			if p99.Pass != pass {
				t.Errorf("%d of 1000 above: %+v; want pass %v:\n%s", above, p99, pass, out)
			}
		}
	})
	t.Run("tolerance", func(t *testing.T) {
		_, p99, out := gates(t, base, map[float64]int{0.001: 500, 0.002: 450, 0.004: 50}, Bounds{LatencyTolerance: 1})
		if !p99.Pass || p99.Canary != "0 of 1000 above it (0.0%); p 1" {
			t.Errorf("5%% one bucket up, a tolerance of one bucket: %+v; want a pass:\n%s", p99, out)
		}
		_, p99, out = gates(t, base, map[float64]int{0.001: 500, 0.002: 450, 0.004: 50}, Bounds{})
		if p99.Pass {
			t.Errorf("the same without the tolerance: %+v; want FAIL:\n%s", p99, out)
		}
	})
	t.Run("too few for the p99", func(t *testing.T) {
		p95, p99, out := gates(t, map[float64]int{0.002: 99}, map[float64]int{0.002: 1000}, Bounds{})
		if p95.NoData != "" || !p95.Pass || p99.NoData != "n 99 baseline, 1000 canary: under 100 and 30" || !p99.Pass {
			t.Errorf("99 baseline observations: p95 %+v, p99 %+v; want the p95 judged, the p99 no data:\n%s", p95, p99, out)
		}
	})
}
