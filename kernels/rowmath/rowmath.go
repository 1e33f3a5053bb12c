// Package rowmath holds the row kernels: the passes over a whole logit row
// that the samplers, DDTree's draft top-k and the CPU backend's TopK make
// (the maximum, the first entry past a bound, softmax weights and their
// sum, the weight histogram that places top-p's cut, the inverse
// cumulative weight), as AVX-512 loops under GOEXPERIMENT=simd
// (simd_amd64.go, with the 16-lane exp the CPU backend's softmax and
// activations share) and portable twins here. At the real vocabulary
// (248,320 logits) each is one streaming pass. It imports no backend, so
// that the pure packages (ddtree) can use it.
//
// NaN is treated as -Inf everywhere: never the maximum, never at or above
// a bound, and weight 0.
package rowmath

import "math"

// rowKernels are one implementation of the row kernels.
type rowKernels struct {
	name string
	// maxValue returns the largest non-NaN value of x (-Inf when there is none).
	maxValue func(x []float32) float32
	// nextAtLeast returns the first i with x[i] ≥ bound, or len(x).
	nextAtLeast func(x []float32, bound float32) int
	// expWeights is ExpWeights; w may be nil (the sum only).
	expWeights func(w, x []float32, top, scale float32) float64
	// massHistogram sets h to the weight and count of x's entries in each
	// of b's buckets.
	massHistogram func(h *Histogram, w, x []float32, b Buckets)
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
	massHistogram: massHistogramPortable,
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
// weight below 2⁻¹²⁶ (see minWeightArg). The AVX-512 kernel uses Exp16
// (Cephes' expf, within a few float32 ulps), the portable one expWeight
// (within one ulp).
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

// expWeight is exp(d) for minWeightArg ≤ d ≤ 0, within one float32 ulp, by
// the method of glibc's expf, in float64: d·32/ln 2 rounded to the nearest
// integer k (by adding 1.5·2⁵², which leaves k in the low bits), 2^(k/32)
// as expTable's 2^((k mod 32)/32) with k's high bits added to its
// exponent, times a cubic for the remainder: half the time of Cephes'
// float32 polynomial without FMA, and small enough to inline (a call per
// weight spills the loop's registers).
func expWeight(d float32) float32 {
	const perLn2 = expTableSize / math.Ln2
	const round = 0x1.8p52
	z := float64(d) * perLn2
	kd := z + round
	k := math.Float64bits(kd)
	r := z - (kd - round) // |r| ≤ 1/2: exp(d) = 2^(k/32)·e^(r·ln2/32)
	scale := math.Float64frombits(expTable[k%expTableSize] + k<<(52-expTableBits))
	const c1 = math.Ln2 / expTableSize // e^(c1·r) by its Taylor terms to r³: within 2⁻³⁰ (relative)
	const c2, c3 = c1 * c1 / 2, c1 * c1 * c1 / 6
	return float32(scale * ((c3*r+c2)*(r*r) + (c1*r + 1)))
}

const expTableBits = 5
const expTableSize = 1 << expTableBits

// expTable holds the bits of 2^(j/32) less j·2⁴⁷, so that adding k·2⁴⁷ (k
// ≡ j mod 32) yields the bits of 2^(k/32).
var expTable = func() (t [expTableSize]uint64) {
	for j := range t {
		t[j] = math.Float64bits(math.Exp2(float64(j)/expTableSize)) - uint64(j)<<(52-expTableBits)
	}
	return t
}()

// appendBetweenPortable tests lo ≤ x[i] < hi as one unsigned compare of
// orderKeys, key(x[i]) − key(lo) < key(hi) − key(lo): two float compares
// would mispredict on a flat row, where about half the entries reach lo.
// NaN's keys lie beyond the infinities', outside every range.
func appendBetweenPortable(dst []int32, x []float32, lo, hi float32) []int32 {
	if !(lo < hi) {
		return dst
	}
	first := boundKey(lo)
	width := boundKey(hi) - first
	for i, v := range x {
		if orderKey(v)-first < width {
			dst = append(dst, int32(i))
		}
	}
	return dst
}

// boundKey is a bound's orderKey, that of −0 for either zero: −0 equals 0,
// so a range from 0 starts below −0's key and one up to 0 ends there.
func boundKey(b float32) uint32 {
	if b == 0 {
		return orderKey(float32(math.Copysign(0, -1)))
	}
	return orderKey(b)
}

// keepAtLeastPortable masks the weights' bits: a branch would mispredict on
// a flat row.
func keepAtLeastPortable(w, x []float32, bound float32) {
	for i, v := range x {
		keep := uint32(0)
		if v >= bound {
			keep = math.MaxUint32
		}
		w[i] = math.Float32frombits(math.Float32bits(w[i]) & keep)
	}
}

// blockSumsPortable adds each block in four interleaved chains: one chain
// would wait out an add's latency per weight.
func blockSumsPortable(sums []float64, w []float32) {
	for b := range sums {
		block := w[b*sumBlock : min((b+1)*sumBlock, len(w))]
		var s0, s1, s2, s3 float64
		i := 0
		for ; i+4 <= len(block); i += 4 {
			s0 += float64(block[i])
			s1 += float64(block[i+1])
			s2 += float64(block[i+2])
			s3 += float64(block[i+3])
		}
		for ; i < len(block); i++ {
			s0 += float64(block[i])
		}
		sums[b] = (s0 + s1) + (s2 + s3)
	}
}
