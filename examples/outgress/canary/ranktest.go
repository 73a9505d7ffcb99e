package canary

import "math"

// A RankTest is a one-sided Mann-Whitney U test of "the canary is slower
// than the baseline" over two histograms with the same buckets. Every
// observation is known only by its bucket, so observations in one bucket
// are ties: each pair of a canary and a baseline observation counts 1
// towards U when the canary's bucket is higher, 1/2 when the buckets are
// the same, 0 when lower. Without a difference, U is n_baseline x
// n_canary / 2 on average; P is the chance of a U at least as large as the
// one seen when the canary is in truth no slower (the normal
// approximation of U, with the variance corrected for ties and a
// continuity correction of 1/2), so a small P says the canary is slower.
type RankTest struct {
	NBaseline, NCanary float64
	U                  float64 // the canary's U
	Z                  float64 // (U - mean - 1/2) / standard deviation; 0 when every observation is tied
	P                  float64 // one-sided p-value; 1 when every observation is tied
}

// rankTest runs the test over per-bucket counts (not cumulative), both
// over the same buckets in ascending order. The canary's observations are
// first moved down by shift buckets (the lowest bucket holds those it
// would push below it): a tolerance of shift buckets, 0 for none.
func rankTest(base, can []float64, shift int) RankTest {
	shifted := make([]float64, len(can))
	for i, c := range can {
		shifted[max(i-shift, 0)] += c
	}
	var t RankTest
	var below, ties float64 // baseline observations in lower buckets; sum of t^3 - t over tie groups
	for i, b := range base {
		c := shifted[i]
		t.U += c * (below + b/2)
		below += b
		t.NBaseline += b
		t.NCanary += c
		g := b + c
		ties += g*g*g - g
	}
	n1, n2 := t.NBaseline, t.NCanary
	n := n1 + n2
	if n1 == 0 || n2 == 0 {
		t.P = 1
		return t
	}
	variance := n1 * n2 / 12 * ((n + 1) - ties/(n*(n-1)))
	if variance <= 0 { // every observation in one bucket: no evidence either way
		t.P = 1
		return t
	}
	t.Z = (t.U - n1*n2/2 - 0.5) / math.Sqrt(variance)
	t.P = 0.5 * math.Erfc(t.Z/math.Sqrt2) // 1 - Phi(Z)
	return t
}
