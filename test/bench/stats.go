package bench

import (
	"math"
	"sort"
	"time"
)

// Percentiles summarises a latency distribution in milliseconds.
type Percentiles struct {
	// Count is how many observations the percentiles are computed from.
	Count int     `json:"count"`
	P50   float64 `json:"p50Ms"`
	P90   float64 `json:"p90Ms"`
	P99   float64 `json:"p99Ms"`
	Max   float64 `json:"maxMs"`
}

// percentiles uses the nearest-rank method, so every reported value is one that was
// observed.
func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	sorted := append([]time.Duration(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(sorted)))) - 1
		i = max(0, min(i, len(sorted)-1))
		return ms(sorted[i])
	}
	return Percentiles{Count: len(sorted), P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Max: ms(sorted[len(sorted)-1])}
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

// round keeps results readable in JSON: n decimals.
func round(v float64, n int) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	p := math.Pow(10, float64(n))
	return math.Round(v*p) / p
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round(a/b, 3)
}

// leastSquares fits y = intercept + slope·x; ok is false with fewer than two distinct xs.
func leastSquares(xs, ys []float64) (slope, intercept float64, ok bool) {
	if len(xs) < 2 || len(xs) != len(ys) {
		return 0, 0, false
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	n := float64(len(xs))
	d := n*sxx - sx*sx
	if d == 0 {
		return 0, 0, false
	}
	slope = (n*sxy - sx*sy) / d
	return slope, (sy - slope*sx) / n, true
}
