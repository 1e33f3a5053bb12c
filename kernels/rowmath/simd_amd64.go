//go:build goexperiment.simd && amd64

package rowmath

import (
	"math"
	"math/bits"
	"simd/archsimd"
	"slices"
)

// simdRows returns the AVX-512 row kernels when the CPU has AVX-512.
//
// Each loop holds only vector values (bounds and sums are splatted before
// it, tails go through padded partial vectors): a scalar float reloaded
// inside a loop that calls Exp16 compiles to a legacy-SSE instruction,
// which right after 512-bit code costs many times the whole iteration (see
// the notes in kernels/cpu/simd_amd64.go).
func simdRows() (rowKernels, bool) {
	if !archsimd.X86.AVX512() {
		return rowKernels{}, false
	}
	return rowKernels{
		name:          "avx512",
		maxValue:      maxValueAVX512,
		nextAtLeast:   nextAtLeastAVX512,
		expWeights:    expWeightsAVX512,
		massHistogram: massHistogramAVX512,
		appendBetween: appendBetweenAVX512,
		keepAtLeast:   keepAtLeastAVX512,
		blockSums:     blockSumsAVX512,
	}, true
}

// Exp16 is Cephes' expf on 16 lanes: x = n·ln2 + r with |r| ≤ ln2/2, a
// degree-5 polynomial for e^r, then VSCALEF by n. Inputs are clamped to
// [-104, 89], outside which the float32 result is 0 or +Inf anyway; NaN
// stays NaN (set back explicitly: which operand VMAXPS returns for NaN
// depends on the operand order the compiler picks). The constants are
// vectors in memory: loads keep Exp16 small enough to inline (broadcasts
// did not), so a loop calling it (in this package or another) makes no call and
// spills nothing around one.
func Exp16(x archsimd.Float32x16) archsimd.Float32x16 {
	c := func(i int) archsimd.Float32x16 { return archsimd.LoadFloat32x16(&expConsts[i]) }
	in := x
	x = c(expHi).Min(c(expLo).Max(x))
	n := x.Mul(c(expLog2E)).RoundToEvenScaled(0)
	r := n.MulAdd(c(expNegLn2Hi), x)
	r = n.MulAdd(c(expNegLn2Lo), r)
	p := c(expP0).MulAdd(r, c(expP0+1))
	p = p.MulAdd(r, c(expP0+2))
	p = p.MulAdd(r, c(expP0+3))
	p = p.MulAdd(r, c(expP0+4))
	p = p.MulAdd(r, c(expP0+5))
	p = p.MulAdd(r.Mul(r), r.Add(c(expOne)))
	return p.Scale(n).Merge(in, in.Equal(in))
}

// Exp8 is Exp16 on 8 lanes for CPUs without AVX-512, bit for bit: the same
// clamp, rounding and polynomial, and p·2ⁿ (VSCALEFPS is AVX-512) as two
// multiplies by powers of two, p·2^⌊n/2⌋ exact (p is near 1 and
// |n| ≤ 150, so it stays normal), the second rounding once as VSCALEFPS
// does, subnormal and overflowing results included. Unlike Exp16 it is
// beyond Go's inlining budget: a call per 8 lanes.
func Exp8(x archsimd.Float32x8) archsimd.Float32x8 {
	c := func(i int) archsimd.Float32x8 { return archsimd.LoadFloat32x8((*[8]float32)(expConsts[i][:8])) }
	in := x
	x = c(expHi).Min(c(expLo).Max(x))
	n := x.Mul(c(expLog2E)).RoundToEven()
	r := n.MulAdd(c(expNegLn2Hi), x)
	r = n.MulAdd(c(expNegLn2Lo), r)
	p := c(expP0).MulAdd(r, c(expP0+1))
	p = p.MulAdd(r, c(expP0+2))
	p = p.MulAdd(r, c(expP0+3))
	p = p.MulAdd(r, c(expP0+4))
	p = p.MulAdd(r, c(expP0+5))
	p = p.MulAdd(r.Mul(r), r.Add(c(expOne)))
	// 2^h is h<<23 plus the bits of 1.0 (a normal exponent: |h| ≤ 75).
	e, one := n.ConvertToInt32(), c(expOne).AsInt32x8()
	h := e.ShiftAllRight(1)
	p = p.Mul(h.ShiftAllLeft(23).Add(one).AsFloat32x8())
	return p.Mul(e.Sub(h).ShiftAllLeft(23).Add(one).AsFloat32x8()).Merge(in, in.Equal(in))
}

// Exp16's constants: indices into expConsts.
const (
	expHi = iota
	expLo
	expLog2E
	expNegLn2Hi
	expNegLn2Lo
	expOne
	expP0 // six polynomial coefficients, highest degree first
)

var expConsts = func() (c [expP0 + 6][16]float32) {
	const ln2Hi, ln2Lo = 0.693359375, -2.12194440e-4 // ln2 = ln2Hi + ln2Lo, with ln2Hi exact in few bits
	for i, v := range []float32{89, -104, 1.44269504088896341, -ln2Hi, -ln2Lo, 1,
		1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1} {
		for l := range c[i] {
			c[i][l] = v
		}
	}
	return c
}()

// splat is v in every lane.
func splat(v float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(v) }

// loadFill loads len(s) < 16 floats, filling the other lanes with fill.
func loadFill(s []float32, fill float32) archsimd.Float32x16 {
	var buf [16]float32
	for i := copy(buf[:], s); i < len(buf); i++ {
		buf[i] = fill
	}
	return archsimd.LoadFloat32x16(&buf)
}

// maxValueAVX512 keeps 16 lane maxima, taking a lane's new value only
// where it compares greater (an ordered compare, false for NaN: VMAXPS's
// NaN rule depends on an operand order the compiler may swap).
func maxValueAVX512(x []float32) float32 {
	m := splat(float32(math.Inf(-1)))
	raise := func(v archsimd.Float32x16) { m = v.Merge(m, v.Greater(m)) }
	l := 0
	for ; l+16 <= len(x); l += 16 {
		raise(archsimd.LoadFloat32x16Slice(x[l:]))
	}
	if l < len(x) {
		raise(loadFill(x[l:], float32(math.NaN())))
	}
	var lanes [16]float32
	m.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	return maxValuePortable(lanes[:])
}

// nextAtLeastAVX512 tests 16 entries per compare (an ordered compare: NaN
// is never at least the bound).
func nextAtLeastAVX512(x []float32, bound float32) int {
	b := splat(bound)
	l := 0
	for ; l+16 <= len(x); l += 16 {
		if hit := archsimd.LoadFloat32x16Slice(x[l:]).GreaterEqual(b).ToBits(); hit != 0 {
			archsimd.ClearAVXUpperBits()
			return l + bits.TrailingZeros16(hit)
		}
	}
	if l < len(x) {
		if hit := loadFill(x[l:], float32(math.NaN())).GreaterEqual(b).ToBits(); hit != 0 {
			l += bits.TrailingZeros16(hit)
		} else {
			l = len(x)
		}
	}
	archsimd.ClearAVXUpperBits()
	return l
}

// expWeightsAVX512 is expWeightsPortable with Exp16, 16 lanes at a time:
// float32 lane sums over blocks of sumBlock elements (each weight is at
// most 1), each block's added into float64 lanes. Lanes whose argument is
// below minWeightArg, or NaN (the compare is ordered), weigh 0. One loop
// body serves the tail too (through a NaN-padded vector), so that Exp16 is
// inlined once.
func expWeightsAVX512(w, x []float32, top, scale float32) float64 {
	t, s, lowest := splat(top), splat(scale), splat(minWeightArg)
	var acc archsimd.Float64x8
	var part archsimd.Float32x16
	for l := 0; l < len(x); l += 16 {
		whole := l+16 <= len(x)
		var v archsimd.Float32x16
		if whole {
			v = archsimd.LoadFloat32x16Slice(x[l:])
		} else {
			v = loadFill(x[l:], float32(math.NaN()))
		}
		d := v.Sub(t).Mul(s)
		e := Exp16(d).Masked(d.GreaterEqual(lowest))
		switch {
		case w == nil:
		case whole:
			e.StoreSlice(w[l:])
		default:
			e.StoreSlicePart(w[l:])
		}
		part = part.Add(e)
		if (l+16)%sumBlock == 0 || !whole || l+16 == len(x) {
			acc, part = widenAdd(acc, part), archsimd.Float32x16{}
		}
	}
	return sum8(acc)
}

// massHistogramAVX512 finds the buckets 8 lanes at a time, each by
// Buckets.of's float64 steps, so exactly as it does, and compresses the
// buckets and positions of the entries in [lo, hi) into a list, a chunk
// at a time (a branch per entry would mispredict where a tenth of them are
// in range). The adds, which scatter over the buckets, stay scalar, after
// a VZEROUPPER (scalar code runs about a third slower while the upper
// vector state is dirty).
func massHistogramAVX512(h *Histogram, w, x []float32, b Buckets) {
	*h = Histogram{}
	lo, hi, scale := archsimd.BroadcastFloat64x8(float64(b.lo)), archsimd.BroadcastFloat64x8(float64(b.hi)), archsimd.BroadcastFloat64x8(b.scale)
	last, step := archsimd.BroadcastInt32x8(HistogramBuckets-1), archsimd.BroadcastInt32x8(8)
	const chunk = 512
	var buckets, at [chunk + 8]int32 // room for a whole vector stored past the last entry
	for base := 0; base < len(x); base += chunk {
		end := min(base+chunk, len(x))
		pos := archsimd.LoadInt32x8((*[8]int32)(lanes16[:8])).Add(archsimd.BroadcastInt32x8(int32(base)))
		n := 0
		for l := base; l < end; l += 8 {
			v := archsimd.LoadFloat32x8SlicePart(x[l:end]).ConvertToFloat64()
			in := v.GreaterEqual(lo).And(v.Less(hi)).ToBits() & (0xff >> max(0, l+8-end)) // not the lanes past end
			mask := archsimd.Mask32x8FromBits(in)
			hi.Sub(v).Mul(scale).ConvertToInt32().Min(last).Compress(mask).StoreSlice(buckets[n:])
			pos.Compress(mask).StoreSlice(at[n:])
			n += bits.OnesCount8(in)
			pos = pos.Add(step)
		}
		archsimd.ClearAVXUpperBits()
		for j, k := range buckets[:n] {
			h.Mass[k] += float64(w[at[j]])
			h.Count[k]++
		}
	}
}

// appendBetweenAVX512 compresses the indices of each 16 entries in [lo,
// hi) into dst (VPCOMPRESSD), growing it only between vectors.
func appendBetweenAVX512(dst []int32, x []float32, lo, hi float32) []int32 {
	l0, h0 := splat(lo), splat(hi)
	idx := archsimd.LoadInt32x16(&lanes16)
	step := archsimd.BroadcastInt32x16(16)
	n := len(dst)
	for l := 0; l < len(x); l += 16 {
		var v archsimd.Float32x16
		if l+16 <= len(x) {
			v = archsimd.LoadFloat32x16Slice(x[l:])
		} else {
			v = loadFill(x[l:], float32(math.NaN()))
		}
		m := v.GreaterEqual(l0).And(v.Less(h0))
		if hit := m.ToBits(); hit != 0 {
			if cap(dst)-n < 16 {
				dst = slices.Grow(dst[:n], 16+n)
			}
			idx.Compress(m).StoreSlice(dst[n : n+16])
			n += bits.OnesCount16(hit)
		}
		idx = idx.Add(step)
	}
	archsimd.ClearAVXUpperBits()
	return dst[:n]
}

// keepAtLeastAVX512 zeroes the weights of 16 entries per compare.
func keepAtLeastAVX512(w, x []float32, bound float32) {
	b := splat(bound)
	l := 0
	for ; l+16 <= len(x); l += 16 {
		archsimd.LoadFloat32x16Slice(w[l:]).Masked(archsimd.LoadFloat32x16Slice(x[l:]).GreaterEqual(b)).StoreSlice(w[l:])
	}
	if l < len(x) {
		archsimd.LoadFloat32x16SlicePart(w[l:len(x)]).Masked(loadFill(x[l:], float32(math.NaN())).GreaterEqual(b)).StoreSlicePart(w[l:len(x)])
	}
	archsimd.ClearAVXUpperBits()
}

// lanes16 is 0, 1, …, 15.
var lanes16 = [16]int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

// widenAdd adds the 16 float32 lanes of part into the 8 float64 lanes of acc.
func widenAdd(acc archsimd.Float64x8, part archsimd.Float32x16) archsimd.Float64x8 {
	return acc.Add(part.GetLo().ConvertToFloat64()).Add(part.GetHi().ConvertToFloat64())
}

// blockSumsAVX512 sums each block in float32 lanes, widened to float64
// lanes; the lanes go to a buffer and are added after the vector code.
func blockSumsAVX512(sums []float64, w []float32) {
	var lanes [64][8]float64
	for b := range sums {
		var part archsimd.Float32x16
		end := min((b+1)*sumBlock, len(w))
		j := b * sumBlock
		for ; j+16 <= end; j += 16 {
			part = part.Add(archsimd.LoadFloat32x16Slice(w[j:]))
		}
		if j < end {
			part = part.Add(archsimd.LoadFloat32x16SlicePart(w[j:end]))
		}
		widenAdd(archsimd.Float64x8{}, part).Store(&lanes[b])
	}
	archsimd.ClearAVXUpperBits()
	for b := range sums {
		sums[b] = 0
		for _, v := range lanes[b] {
			sums[b] += v
		}
	}
}

// sum8 adds the eight lanes after clearing the upper vector state.
func sum8(acc archsimd.Float64x8) float64 {
	var lanes [8]float64
	acc.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	total := 0.0
	for _, v := range lanes {
		total += v
	}
	return total
}
