package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the q-quantile (0 <= q <= 1) of samples by the
// nearest-rank method: the smallest sample such that at least q of all
// samples are at or below it. It returns 0 for no samples and does not
// modify samples.
func Percentile(samples []time.Duration, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := max(1, min(int(math.Ceil(q*float64(len(s)))), len(s)))
	return s[rank-1]
}

// Ratio returns a/b, or 0 when b is 0.
func Ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// ms converts d to float milliseconds rounded to 0.01 ms.
func ms(d time.Duration) float64 {
	return float64(d.Round(10*time.Microsecond)) / float64(time.Millisecond)
}
