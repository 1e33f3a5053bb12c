// Package rowmath holds the row kernels: the passes over a whole logit row
// that the samplers, DDTree's draft top-k and the CPU backend's TopK make
// (the maximum, the first entry past a bound, softmax weights and their
// sum, the weight at or above a bound, the inverse cumulative weight), as
// AVX-512 loops under GOEXPERIMENT=simd (simd_amd64.go, with the 16-lane
// exp the CPU backend's softmax and activations share) and portable twins
// here. At the real vocabulary (248,320 logits) each is one streaming pass.
// It imports no backend, so that the pure packages (ddtree) can use it.
//
// NaN is treated as -Inf everywhere: never the maximum, never at or above
// a bound, and weight 0.
package rowmath

import (
	"fmt"
	"math"
)

// rowKernels are one implementation of the row kernels.
type rowKernels struct {
	name string
	// maxValue returns the largest non-NaN value of x (-Inf when there is none).
	maxValue func(x []float32) float32
	// nextAtLeast returns the first i with x[i] ≥ bound, or len(x).
	nextAtLeast func(x []float32, bound float32) int
	// expWeights is ExpWeights; w may be nil (the sum only).
	expWeights func(w, x []float32, top, scale float32) float64
	// massAtLeast is MassAtLeast.
	massAtLeast func(mass []float64, count []int, w, x []float32, bounds []float32)
	// appendBetween is AppendBetween.
	appendBetween func(dst []int32, x []float32, lo, hi float32) []int32
	// keepAtLeast is KeepAtLeast.
	keepAtLeast func(w, x []float32, bound float32)
	// blockSums sets sums[b] = Σ w[b·sumBlock : (b+1)·sumBlock] (the last
	// block may be short), for at most 64 blocks.
	blockSums func(sums []float64, w []float32)
}

var portableRows = rowKernels{
	name:          "portable",
	maxValue:      maxValuePortable,
	nextAtLeast:   nextAtLeastPortable,
	expWeights:    expWeightsPortable,
	massAtLeast:   massAtLeastPortable,
	appendBetween: appendBetweenPortable,
	keepAtLeast:   keepAtLeastPortable,
	blockSums:     blockSumsPortable,
}

// hostRows are the row kernels in use: the SIMD ones when the build and
// the CPU have them.
var hostRows = func() rowKernels {
	if kern, ok := simdRows(); ok {
		return kern
	}
	return portableRows
}()

// minWeightArg is ln 2⁻¹²⁶: a softmax weight exp(d) with d below it would be
// a float32 subnormal, and counts as 0 (relative to the top token's weight
// 1, far below anything sampling can resolve; and subnormal arithmetic
// costs microcode assists).
const minWeightArg = -87.33654

// sumBlock is how many weights SearchCumulative adds before it looks at
// the running sum.
const sumBlock = 256

// MaxIndex returns the index of the largest value of x, the lowest index
// on ties, ignoring NaN; -1 when x is empty or all NaN.
func MaxIndex(x []float32) int {
	top := hostRows.maxValue(x)
	if i := hostRows.nextAtLeast(x, top); i < len(x) {
		return i
	}
	return -1
}

// NextAtLeast returns the first index i with x[i] ≥ bound, or len(x).
func NextAtLeast(x []float32, bound float32) int {
	return hostRows.nextAtLeast(x, bound)
}

// ExpWeights sets w[i] = exp((x[i] − top)·scale) and returns Σ w[i] summed
// in float64: a sampler's softmax weights (top the row's maximum, finite;
// scale the inverse temperature). -Inf and NaN weigh 0, and so does any
// weight below 2⁻¹²⁶ (see minWeightArg). Both kernels use Cephes' expf
// (Exp16, which the CPU backend's attention softmax uses too; its scalar twin expWeight), within a few
// float32 ulps.
func ExpWeights(w, x []float32, top, scale float32) float64 {
	return hostRows.expWeights(w[:len(x)], x, top, scale)
}

// ExpSum is ExpWeights' sum without the weights: Σ exp((x[i] − top)·scale).
func ExpSum(x []float32, top, scale float32) float64 {
	return hostRows.expWeights(nil, x, top, scale)
}

// LogSumExp returns log Σ exp(x[i]) (NaN ignored): the maximum plus the
// log of ExpSum; the maximum itself when it is infinite (-Inf for an empty
// or all-NaN row).
func LogSumExp(x []float32) float64 {
	top := hostRows.maxValue(x)
	if math.IsInf(float64(top), 0) {
		return float64(top)
	}
	return float64(top) + math.Log(ExpSum(x, top, 1))
}

// MassBounds is how many bounds one MassAtLeast pass takes.
const MassBounds = 4

// MassAtLeast sets mass[j] = Σ w[i] over the i with x[i] ≥ bounds[j],
// summed in float64, and count[j] to how many such i there are, for up to
// MassBounds bounds in one pass: the weight of the tokens whose logit
// reaches each bound.
func MassAtLeast(mass []float64, count []int, w, x []float32, bounds []float32) {
	if len(bounds) > MassBounds {
		panic(fmt.Sprintf("rowmath: MassAtLeast takes at most %d bounds, not %d", MassBounds, len(bounds)))
	}
	hostRows.massAtLeast(mass[:len(bounds)], count[:len(bounds)], w[:len(x)], x, bounds)
}

// AppendBetween appends to dst the indices i with lo ≤ x[i] < hi, in order
// (hi +Inf: every x[i] ≥ lo but +Inf).
func AppendBetween(dst []int32, x []float32, lo, hi float32) []int32 {
	return hostRows.appendBetween(dst, x, lo, hi)
}

// KeepAtLeast sets w[i] = 0 where x[i] is below bound (or NaN).
func KeepAtLeast(w, x []float32, bound float32) {
	hostRows.keepAtLeast(w[:len(x)], x, bound)
}

// SearchCumulative returns the first i with w[0] + … + w[i] > u, or len(w)
// when the whole sum is at most u: the token that a uniform draw u ∈ [0,
// Σw) picks. Whole blocks are skipped by their vectorised sums, so the
// running sum is rounded differently from a sequential one (by about
// len(w)·2⁻²⁴ of the sum at most).
func SearchCumulative(w []float32, u float64) int {
	var sums [64]float64
	for lo := 0; lo < len(w); lo += len(sums) * sumBlock {
		chunk := w[lo:min(lo+len(sums)*sumBlock, len(w))]
		blocks := sums[:(len(chunk)+sumBlock-1)/sumBlock]
		hostRows.blockSums(blocks, chunk)
		for b, s := range blocks {
			if u >= s {
				u -= s
				continue
			}
			for i, x := range chunk[b*sumBlock : min((b+1)*sumBlock, len(chunk))] {
				if u -= float64(x); u < 0 {
					return lo + b*sumBlock + i
				}
			}
			u = 0 // rounding left u at or above the block's sequential sum: the next weight takes it
		}
	}
	return len(w)
}

func maxValuePortable(x []float32) float32 {
	top := float32(math.Inf(-1))
	for _, v := range x {
		if v > top {
			top = v
		}
	}
	return top
}

func nextAtLeastPortable(x []float32, bound float32) int {
	for i, v := range x {
		if v >= bound {
			return i
		}
	}
	return len(x)
}

func expWeightsPortable(w, x []float32, top, scale float32) float64 {
	total := 0.0
	for i, v := range x {
		var e float32
		if d := (v - top) * scale; d >= minWeightArg {
			e = expWeight(d)
		}
		if w != nil {
			w[i] = e
		}
		total += float64(e)
	}
	return total
}

// expWeight is exp(d) for minWeightArg ≤ d ≤ 0 by Exp16's method (Cephes'
// expf) in scalar float32: a few times cheaper than float64 math.Exp over
// a whole vocabulary. ln2Hi has few enough bits that n·ln2Hi is exact.
func expWeight(d float32) float32 {
	const log2e, ln2Hi, ln2Lo = 1.44269504088896341, 0.693359375, -2.12194440e-4
	n := float32(int32(d*log2e - 0.5)) // d·log2 e rounded to nearest: it is at most 0
	r := d - n*ln2Hi
	r -= n * ln2Lo
	p := float32(1.9875691500e-4)*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	p = p*r*r + r + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23) // 2ⁿ, n ≥ -126
}

func massAtLeastPortable(mass []float64, count []int, w, x []float32, bounds []float32) {
	clear(mass)
	clear(count)
	for i, v := range x {
		for j, bound := range bounds {
			if v >= bound {
				mass[j] += float64(w[i])
				count[j]++
			}
		}
	}
}

func appendBetweenPortable(dst []int32, x []float32, lo, hi float32) []int32 {
	for i, v := range x {
		if v >= lo && v < hi {
			dst = append(dst, int32(i))
		}
	}
	return dst
}

func keepAtLeastPortable(w, x []float32, bound float32) {
	for i, v := range x {
		if !(v >= bound) {
			w[i] = 0
		}
	}
}

func blockSumsPortable(sums []float64, w []float32) {
	for b := range sums {
		s := 0.0
		for _, x := range w[b*sumBlock : min((b+1)*sumBlock, len(w))] {
			s += float64(x)
		}
		sums[b] = s
	}
}
