package rowmath

import "math"

// HistogramBuckets is how many buckets a Histogram has.
const HistogramBuckets = 4096

// Histogram is the weight and the number of a row's entries in each bucket
// of a Buckets.
type Histogram struct {
	Mass  [HistogramBuckets]float64
	Count [HistogramBuckets]int32
}

// Buckets splits the logits in [lo, hi) into HistogramBuckets buckets of
// equal width, the highest logits in bucket 0.
type Buckets struct {
	lo, hi float32
	scale  float64 // buckets per unit of logit
}

// NewBuckets splits [lo, hi) (lo < hi, both finite).
func NewBuckets(lo, hi float32) Buckets {
	return Buckets{lo: lo, hi: hi, scale: HistogramBuckets / (float64(hi) - float64(lo))}
}

// of is the bucket of v (lo ≤ v < hi): ⌊(hi − v)·scale⌋, in float64 (no
// overflow), the last bucket at most. Each step is monotonic, so a lower
// logit never has a lower bucket: each bucket is a range of logits.
func (b Buckets) of(v float32) int {
	return min(int((float64(b.hi)-float64(v))*b.scale), HistogramBuckets-1)
}

// Edge is the lowest logit of bucket k and the ones above it (hi for k <
// 0): for lo ≤ v < hi, v ≥ Edge(k) exactly when v's bucket is at most k.
// A binary search over the float32 values in [lo, hi], in their order as
// integers, for the first whose bucket is at most k.
func (b Buckets) Edge(k int) float32 {
	first, last := orderKey(b.lo), orderKey(b.hi) // the edge is in [first, last]; last stands for hi
	for first < last {
		mid := first + (last-first)/2
		if b.of(fromOrderKey(mid)) <= k {
			last = mid
		} else {
			first = mid + 1
		}
	}
	return fromOrderKey(first)
}

// orderKey maps float32 values to uint32 in the same order (−0 just below
// +0, NaN below -Inf or above +Inf by its sign): the bits with the sign
// flipped for positive values, all flipped for negative ones.
func orderKey(v float32) uint32 {
	u := math.Float32bits(v)
	return u ^ (uint32(int32(u)>>31) | 1<<31)
}

// fromOrderKey is orderKey's inverse.
func fromOrderKey(k uint32) float32 {
	if k>>31 != 0 {
		return math.Float32frombits(k &^ (1 << 31))
	}
	return math.Float32frombits(^k)
}

// MassHistogram sets h to the weight w and the number of x's entries in
// each of b's buckets (NaN and entries outside [lo, hi) in none).
func MassHistogram(h *Histogram, w, x []float32, b Buckets) {
	hostRows.massHistogram(h, w[:len(x)], x, b)
}

func massHistogramPortable(h *Histogram, w, x []float32, b Buckets) {
	*h = Histogram{}
	for i, v := range x {
		if v >= b.lo && v < b.hi {
			k := b.of(v)
			h.Mass[k] += float64(w[i])
			h.Count[k]++
		}
	}
}

// Nucleus brackets top-p's cut in a row: the entries at or above Hi, Count
// of them with weight Mass, are all in the nucleus, and the cut lies among
// the Between entries in [Lo, Hi).
type Nucleus struct {
	Lo, Hi  float32
	Mass    float64
	Count   int
	Between int
}

// nucleusPasses caps FindNucleus' passes: each narrows the bracket
// 4096-fold, so a few reach a single logit value from any range.
const nucleusPasses = 6

// FindNucleus brackets top-p's cut in x: the smallest set of x's best
// entries (by logit) whose weight reaches target. w are ExpWeights(w, x,
// top, scale), summing to total > target. Each pass is a MassHistogram:
// the first over the logits whose weight can matter (see below), each
// later one over the bucket where the weight reaches target, until at most
// maxBetween entries lie in the bracket or they share one logit. On a
// language model's logits one pass does.
//
// The first pass leaves out the entries whose weight is under (total −
// target)/(2·len(x)): together they weigh less than total − target, so
// the entries above them reach target. Where the nucleus is small that is
// most of the row, whose entries then cost a compare each.
func FindNucleus(h *Histogram, w, x []float32, top, scale float32, total, target float64, maxBetween int) Nucleus {
	arg := max(math.Log((total-target)/float64(2*len(x))), -88) // the weight's exponent; e^-88 is a weight of 0 (see minWeightArg)
	n := Nucleus{Lo: logitBelow(float64(top) + arg/float64(scale)), Hi: math.Nextafter32(top, float32(math.Inf(1)))}
	for pass := 1; ; pass++ {
		b := NewBuckets(n.Lo, n.Hi)
		MassHistogram(h, w, x, b)
		k := 0 // the bucket where the weight from the top reaches target (the last if rounding keeps it short)
		for ; k < HistogramBuckets-1 && n.Mass+h.Mass[k] < target; k++ {
			n.Mass += h.Mass[k]
			n.Count += int(h.Count[k])
		}
		n.Lo, n.Hi, n.Between = b.Edge(k), b.Edge(k-1), int(h.Count[k])
		if n.Between <= maxBetween || math.Nextafter32(n.Lo, n.Hi) == n.Hi || pass == nucleusPasses {
			return n
		}
	}
}

// logitBelow is the float32 at or below v, -MaxFloat32 at least: a logit
// under it is under v. (Rounded to nearest, a logit under the float32 could
// lie above v, by an ulp that, times the inverse temperature, need not be
// small.)
func logitBelow(v float64) float32 {
	f := float32(v)
	if float64(f) > v {
		f = math.Nextafter32(f, float32(math.Inf(-1)))
	}
	return max(f, -math.MaxFloat32)
}
