package canary

import (
	"fmt"
	"math"
	"slices"
)

// A TailTest is a one-sided binomial test of "the canary's q-quantile is
// above the baseline's": it counts the canary's observations above the
// bucket that holds the baseline's q-quantile (Above of NCanary). If the
// canary's q-quantile is no higher, each of its observations lands above
// that bucket with a chance of at most 1 - q (the baseline's own share
// there is at most 1 - q, since the bucket holds its quantile); P is the
// chance of Above or more such observations of NCanary at exactly 1 - q,
// so a small P says the canary's tail is higher.
type TailTest struct {
	Q                  float64 // the quantile, 0.95 or 0.99
	Bound              float64 // the upper bound of the baseline's q-quantile bucket, in seconds
	NBaseline, NCanary float64
	Above              float64 // canary observations above Bound, after the tolerance
	P                  float64 // one-sided p-value; 1 when Above is at most NCanary × (1 - q)
}

// tailTest runs the test over per-bucket counts (not cumulative), both
// over bounds in ascending order. The canary's observations are first
// moved down by shift buckets, as in rankTest.
func tailTest(bounds, base, can []float64, q float64, shift int) TailTest {
	t := TailTest{Q: q, P: 1}
	for i, b := range base {
		t.NBaseline += b
		t.NCanary += can[i]
	}
	if t.NBaseline == 0 || t.NCanary == 0 {
		return t
	}
	rank, below, at := math.Ceil(q*t.NBaseline), 0.0, len(base)-1
	for i, b := range base {
		if below += b; below >= rank {
			at = i
			break
		}
	}
	t.Bound = bounds[at]
	for i, c := range can {
		if i-shift > at {
			t.Above += c
		}
	}
	t.P = binomialTail(int(math.Round(t.Above)), int(math.Round(t.NCanary)), 1-q)
	return t
}

// binomialTail is P(K >= k) for K binomial of n trials with chance p each.
// It sums the pmf from k up when k is above the mean, else one minus the
// sum from k-1 down, so that a pmf too small for a float64 at the start of
// a sum means a tail too small to matter.
func binomialTail(k, n int, p float64) float64 {
	switch {
	case k <= 0:
		return 1
	case k > n:
		return 0
	}
	logPMF := func(i int) float64 {
		a, _ := math.Lgamma(float64(n + 1))
		b, _ := math.Lgamma(float64(i + 1))
		c, _ := math.Lgamma(float64(n - i + 1))
		return a - b - c + float64(i)*math.Log(p) + float64(n-i)*math.Log1p(-p)
	}
	sum := 0.0
	if float64(k) > float64(n)*p {
		term := math.Exp(logPMF(k))
		for i := k; i <= n && term > 0; i++ {
			sum += term
			term *= float64(n-i) / float64(i+1) * p / (1 - p)
		}
		return min(sum, 1)
	}
	term := math.Exp(logPMF(k - 1))
	for i := k - 1; i >= 0 && term > 0; i-- {
		sum += term
		term *= float64(i) / float64(n-i+1) * (1 - p) / p
	}
	return max(1-sum, 0)
}

// tailGate is a pre-HTTP tail gate: the TailTest of the canary's
// pre_http histogram against the baseline's q-quantile. It judges nothing
// with fewer than LatencyMinSamples canary observations, or fewer baseline
// observations than LatencyMinSamples and 1/(1-q) (the baseline's
// quantile needs that many to exist: 100 for the p99).
func tailGate(name string, q float64, bb, bc, cb, cc []float64, b Bounds) Gate {
	alpha := 1 - b.LatencyConfidence
	minBase := max(float64(b.LatencyMinSamples), math.Ceil(1/(1-q)-1e-9))
	g := Gate{Name: name, Pass: true,
		Rule: fmt.Sprintf("canary's share above the baseline's p%.0f bucket not over %.0f%%, one-sided binomial test: p >= %.3g, tolerance %d buckets, n >= %.0f baseline, %d canary",
			100*q, 100*(1-q), alpha, b.LatencyTolerance, minBase, b.LatencyMinSamples)}
	if len(bc) > 0 {
		g.BaselineN = bc[len(bc)-1]
	}
	if len(cc) > 0 {
		g.CanaryN = cc[len(cc)-1]
	}
	switch {
	case g.BaselineN < minBase || g.CanaryN < float64(b.LatencyMinSamples):
		g.NoData = fmt.Sprintf("n %.0f baseline, %.0f canary: under %.0f and %d", g.BaselineN, g.CanaryN, minBase, b.LatencyMinSamples)
		return g
	case !slices.Equal(bb, cb):
		g.NoData = "the two histograms' buckets differ"
		return g
	}
	tt := tailTest(bb, perBucket(bc), perBucket(cc), q, b.LatencyTolerance)
	g.Baseline = fmt.Sprintf("p%.0f %s, n %.0f", 100*q, dur(tt.Bound), tt.NBaseline)
	g.Canary = fmt.Sprintf("%.0f of %.0f above it (%s); p %.3g", tt.Above, tt.NCanary, pct(ratio(tt.Above, tt.NCanary)), tt.P)
	g.Pass = tt.P >= alpha
	return g
}
