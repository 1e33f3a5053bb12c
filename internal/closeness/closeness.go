// Package closeness measures, for tests, how far computed values lie from
// reference values. Garbage always reads as infinitely far: a NaN or ±Inf
// anywhere makes the distance +Inf, so a check `d > bound` fails on it. (The
// obvious loop `d = math.Max(d, |a−b|)` turns into NaN, and `NaN > bound` is
// false: such a test passes on NaN logits.)
package closeness

import "math"

// Float is the element type of the compared slices.
type Float interface{ ~float32 | ~float64 }

// MaxAbsDiff is max |got[i] − want[i]|, or +Inf when the lengths differ or
// any difference is not finite. Equal values are no difference, infinite
// ones included: a masked logit is -Inf in both.
func MaxAbsDiff[G, W Float](got []G, want []W) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range want {
		if float64(got[i]) == float64(want[i]) {
			continue
		}
		diff := math.Abs(float64(got[i]) - float64(want[i]))
		if !finite(diff) {
			return math.Inf(1)
		}
		d = max(d, diff)
	}
	return d
}

// Scale is max(1, largest finite |v[i]|): the magnitude that relative bounds
// multiply, which a NaN in v cannot poison (the difference catches it).
func Scale[T Float](v []T) float64 {
	s := 1.0
	for _, x := range v {
		if a := math.Abs(float64(x)); finite(a) {
			s = max(s, a)
		}
	}
	return s
}

// RelNorm is ‖got − want‖₂ / ‖want‖₂, or +Inf when the lengths differ or the
// ratio is not finite.
func RelNorm[G, W Float](got []G, want []W) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var diff, norm float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		diff += d * d
		norm += float64(want[i]) * float64(want[i])
	}
	r := math.Sqrt(diff / norm)
	if !finite(r) {
		return math.Inf(1)
	}
	return r
}

// Near says whether |a − b| ≤ tol; false when either is NaN.
func Near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
