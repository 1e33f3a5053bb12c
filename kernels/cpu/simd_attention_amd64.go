//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"simd/archsimd"
	"unsafe"
)

// softmaxAVX512 is softmaxPortable on 16-lane vectors: the sum adds lane j
// of every chunk, then the lanes by sum4's tree.
func softmaxAVX512(s []float32) float32 {
	if len(s) == 0 {
		return 0
	}
	top := splat(float32(math.Inf(-1)))
	for j := 0; j < len(s); j += 16 {
		n := min(16, len(s)-j)
		v := loadN(s[j:], n)
		if n < 16 {
			v = v.Add(archsimd.LoadFloat32x16((*[16]float32)(negPad[16-n:]))) // padding lanes -Inf, not 0
		}
		top = top.Max(v)
	}
	top = splat(maxLanes(top))
	var total archsimd.Float32x16
	for j := 0; j < len(s); j += 16 {
		n := min(16, len(s)-j)
		e := exp16(loadN(s[j:], n).Sub(top))
		if n < 16 {
			e = e.Mul(loadPart(ones[:n])) // the padding lanes held exp(-top), not 0
		}
		storeN(e, s[j:], n)
		total = total.Add(e)
	}
	var sums [4]float32
	sum4(total, total, total, total).Store(&sums)
	archsimd.ClearAVXUpperBits()
	return 1 / sums[0]
}

// maxLanes returns the largest lane of x.
func maxLanes(x archsimd.Float32x16) float32 {
	var lanes [16]float32
	x.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	m := lanes[0]
	for _, v := range lanes[1:] {
		m = max(m, v)
	}
	return m
}

// mixValuesAVX512 is mixValuesPortable for four rows of out at a time, one
// 16-lane chunk of the head dimension at a time: each value vector loaded
// feeds four FMAs, one per row, in key order.
func mixValuesAVX512(out, p []float32, pStride, nq, n int, v []float32, hd int, inv []float32) {
	hd16 := (hd + 15) &^ 15
	vp := rowPtr(v, n*hd16)
	for i := 0; i < nq; i += 4 {
		var w [4]unsafe.Pointer
		for r := range w { // past nq, repeat the last row and drop its sums
			w[r] = rowPtr(p[min(i+r, nq-1)*pStride:], n)
		}
		for d := 0; d < hd; d += 16 {
			var a [4]archsimd.Float32x16
			a[0], a[1], a[2], a[3] = mix4(w[0], w[1], w[2], w[3], unsafe.Add(vp, 4*d), n, hd16)
			for r := range min(4, nq-i) {
				storeN(a[r].Mul(splat(inv[i+r])), out[(i+r)*hd+d:], min(16, hd-d))
			}
		}
	}
	archsimd.ClearAVXUpperBits()
}

// mix4 returns Σ_j w_r[j]·v_j for the four weight rows w_r over the n
// vectors v_j at v + j·stride floats.
//
//go:noinline
func mix4(w0, w1, w2, w3, v unsafe.Pointer, n, stride int) (a0, a1, a2, a3 archsimd.Float32x16) {
	for j := range n {
		x := f32x16(v, j*stride)
		a0 = splat(*(*float32)(unsafe.Add(w0, 4*j))).MulAdd(x, a0)
		a1 = splat(*(*float32)(unsafe.Add(w1, 4*j))).MulAdd(x, a1)
		a2 = splat(*(*float32)(unsafe.Add(w2, 4*j))).MulAdd(x, a2)
		a3 = splat(*(*float32)(unsafe.Add(w3, 4*j))).MulAdd(x, a3)
	}
	return
}

// negPad[16-n:32-n] is n zeros, then -Inf.
var negPad = func() (p [32]float32) {
	for i := 16; i < 32; i++ {
		p[i] = float32(math.Inf(-1))
	}
	return p
}()

// ones masks the valid lanes of a partial vector.
var ones = [16]float32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
