package canary

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// TestRankTestByHand pins rankTest against cases computed by hand from the
// definitions: U sums, over the canary's observations, the baseline's
// below (1 each) and tied (1/2 each); the mean is n1 n2 / 2; the variance
// n1 n2 / 12 ((N + 1) - sum(t^3 - t) / (N (N - 1))) over the tie groups t
// (one per bucket); Z = (U - mean - 1/2) / sd; P = 1 - Phi(Z).
func TestRankTestByHand(t *testing.T) {
	for _, c := range []struct {
		name      string
		base, can []float64
		shift     int
		u, z, p   float64
	}{
		// 3 a side, every bucket a tie group of 2: U = 0(0+1) + 1(2+1/2) +
		// 2(3+0) = 8.5; var = 9/12 (7 - 3*6/30) = 4.8; Z = 3.5/sqrt(4.8).
		{"small, ties", []float64{2, 1, 0}, []float64{0, 1, 2}, 0, 8.5, 1.5975241, 0.0550745},
		// The mirror: the canary faster. U = 0.5; Z = -4.5/sqrt(4.8).
		{"small, canary faster", []float64{0, 1, 2}, []float64{2, 1, 0}, 0, 0.5, -2.0539596, 0.9800102},
		// Identical: U = 10(0+5) + 10(10+5) + 10(20+5) = 450 = the mean;
		// var = 900/12 (61 - 3*7980/3540); Z = -0.5/sd.
		{"identical", []float64{10, 10, 10}, []float64{10, 10, 10}, 0, 450, -0.0078395, 0.5031275},
		// Every canary observation one bucket up: U = 100*100; var =
		// 10000/12 (201 - 2*999900/39800).
		{"clear shift", []float64{100, 0}, []float64{0, 100}, 0, 10000, 14.1053253, 1.7608e-45},
		// 2% of the canary three buckets up, the rest tied: U = 980*500 +
		// 20*1000 = 510000; var = 1e6/12 (2001 - (1980^3-1980 +
		// 20^3-20)/(2000*1999)).
		{"2% tail", []float64{1000, 0, 0, 0}, []float64{980, 0, 0, 20}, 0, 510000, 4.4933173, 3.50611e-6},
		// The same shift with a tolerance of one bucket: both sides in
		// one bucket, all tied, no variance: no evidence, P = 1.
		{"shift within tolerance", []float64{100, 0}, []float64{0, 100}, 1, 5000, 0, 1},
		// Everything in one bucket: P = 1.
		{"all tied", []float64{0, 50, 0}, []float64{0, 70, 0}, 0, 1750, 0, 1},
		// Shifted below the lowest bucket: clamped into it.
		{"clamped", []float64{5, 0, 0}, []float64{0, 5, 0}, 3, 12.5, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := rankTest(c.base, c.can, c.shift)
			near := func(got, want float64) bool {
				return got == want || math.Abs(got-want) <= 1e-6*math.Max(1, math.Abs(want)) || math.Abs(got-want) <= 1e-4*math.Abs(want)
			}
			if r.U != c.u || !near(r.Z, c.z) || !near(r.P, c.p) {
				t.Errorf("U %v, Z %v, P %v; want U %v, Z %v, P %v", r.U, r.Z, r.P, c.u, c.z, c.p)
			}
			var nb, nc float64
			for i := range c.base {
				nb, nc = nb+c.base[i], nc+c.can[i]
			}
			if r.NBaseline != nb || r.NCanary != nc {
				t.Errorf("n %v and %v; want %v and %v", r.NBaseline, r.NCanary, nb, nc)
			}
		})
	}
}

// latencyWindow is a window whose pre_http histograms hold base and can:
// observations by bucket bound (the test histogram's bounds).
func latencyWindow(t *testing.T, base, can map[float64]int) *Window {
	t.Helper()
	empty := sample(t, counts{}.text(0, 0))
	return &Window{
		Baseline:      Replica{Start: empty, End: sample(t, healthy().textHist(base, 0.001)), AgeSamples: 10},
		Canary:        Replica{Start: empty, End: sample(t, healthy().textHist(can, 0.001)), AgeSamples: 10},
		ServerScripts: 2000, ServerScriptsMax: 2000,
	}
}

// TestLatencyGate: the gate over Evaluate: identical distributions pass,
// with the test's figures printed; a clear shift fails (and fails the
// verdict); a shift the tolerance covers passes; a side with fewer than the
// minimum observations says "no data" with both sample sizes, and the
// verdict names it instead of a bare pass; a canary faster passes.
func TestLatencyGate(t *testing.T) {
	gate := func(t *testing.T, w *Window, b Bounds) (Gate, *Report, string) {
		t.Helper()
		rep := Evaluate(w, b)
		var out strings.Builder
		rep.Print(&out)
		g, ok := rep.Gate(GateLatency)
		if !ok {
			t.Fatalf("no %q gate:\n%s", GateLatency, out.String())
		}
		return g, rep, out.String()
	}
	t.Run("identical", func(t *testing.T) {
		h := map[float64]int{0.001: 300, 0.002: 500, 0.004: 200}
		g, rep, out := gate(t, latencyWindow(t, h, h), Bounds{})
		if !g.Pass || !rep.Pass || g.NoData != "" || g.BaselineN != 1000 || g.CanaryN != 1000 {
			t.Errorf("identical distributions: %+v (verdict %v); want a judged pass on 1000 a side:\n%s", g, rep.Pass, out)
		}
		if !strings.Contains(out, "U 500000, z -0.00, p 0.5") {
			t.Errorf("the table lacks the test's U, z and p:\n%s", out)
		}
	})
	t.Run("one bucket slower fails", func(t *testing.T) {
		g, rep, out := gate(t, latencyWindow(t, map[float64]int{0.002: 100}, map[float64]int{0.004: 100}), Bounds{})
		if g.Pass || rep.Pass || !strings.Contains(out, "verdict: FAIL ("+GateLatency) {
			t.Errorf("every canary latency one bucket up: %+v; want FAIL, named by the verdict:\n%s", g, out)
		}
	})
	t.Run("tolerance", func(t *testing.T) {
		g, _, out := gate(t, latencyWindow(t, map[float64]int{0.002: 100}, map[float64]int{0.004: 100}), Bounds{LatencyTolerance: 1})
		if !g.Pass || g.NoData != "" || !strings.Contains(out, "tolerance 1 buckets") {
			t.Errorf("one bucket up, a tolerance of one bucket: %+v; want a judged pass, the tolerance printed:\n%s", g, out)
		}
	})
	t.Run("canary faster passes", func(t *testing.T) {
		g, _, out := gate(t, latencyWindow(t, map[float64]int{0.004: 100}, map[float64]int{0.002: 100}), Bounds{})
		if !g.Pass || g.NoData != "" {
			t.Errorf("canary one bucket faster: %+v; want a judged pass:\n%s", g, out)
		}
	})
	t.Run("too few", func(t *testing.T) {
		// 29 canary observations, all three buckets slower: the test
		// would fail it, but under 30 a side it judges nothing.
		g, rep, out := gate(t, latencyWindow(t, map[float64]int{0.002: 100}, map[float64]int{0.5: 29}), Bounds{})
		if want := []string{GateLatency, GateP95, GateP99}; !g.Pass || g.NoData == "" || !rep.Pass || !slices.Equal(rep.NoData, want) {
			t.Errorf("29 canary observations: %+v, report no data %q; want no data for %q alone", g, rep.NoData, want)
		}
		for _, s := range []string{"no data (n 100 baseline, 29 canary: under 30 a side)", "no data for " + GateLatency} {
			if !strings.Contains(out, s) {
				t.Errorf("the table lacks %q:\n%s", s, out)
			}
		}
		// At the minimum it judges: 30 observations three buckets up fail.
		g, _, out = gate(t, latencyWindow(t, map[float64]int{0.002: 100}, map[float64]int{0.5: 30}), Bounds{})
		if g.Pass || g.NoData != "" {
			t.Errorf("30 canary observations three buckets up: %+v; want judged, FAIL:\n%s", g, out)
		}
	})
	t.Run("default confidence 99%", func(t *testing.T) {
		// 40 a side, the canary a little slower: U 980, Z 1.934, P 0.0266
		// (by the formulas above): significant at 95%, not at 99%.
		base, can := map[float64]int{0.001: 20, 0.002: 20}, map[float64]int{0.001: 14, 0.002: 20, 0.004: 6}
		g, _, out := gate(t, latencyWindow(t, base, can), Bounds{})
		if !g.Pass || g.NoData != "" || !strings.Contains(g.Rule, "p >= 0.01 (99% confidence)") || !strings.Contains(g.Canary, "p 0.0266") {
			t.Errorf("P 0.0266 at the default confidence: %+v; want a judged pass at 99%%:\n%s", g, out)
		}
		if g, _, out := gate(t, latencyWindow(t, base, can), Bounds{LatencyConfidence: 0.95}); g.Pass {
			t.Errorf("P 0.0266 at 95%%: %+v; want FAIL:\n%s", g, out)
		}
	})
	t.Run("confidence", func(t *testing.T) {
		// 12 a side, the canary mostly a bucket up: U 136, Z 3.885, P
		// 5.1e-5 (by the formulas above), with the minimum lowered to 10: at
		// 99% it fails, at 99.999% it passes.
		base, can := map[float64]int{0.001: 8, 0.002: 4}, map[float64]int{0.002: 4, 0.004: 8}
		g, _, out := gate(t, latencyWindow(t, base, can), Bounds{LatencyMinSamples: 10})
		if g.Pass {
			t.Errorf("at 99%%: %+v; want FAIL:\n%s", g, out)
		}
		g, _, out = gate(t, latencyWindow(t, base, can), Bounds{LatencyMinSamples: 10, LatencyConfidence: 0.99999})
		if !g.Pass || g.NoData != "" {
			t.Errorf("at 99.999%%: %+v; want a judged pass:\n%s", g, out)
		}
	})
}
