//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"
)

// expAVX512 is expPortable on 16-lane vectors (exp16: each lane a fixed
// function of its input).
func expAVX512(x []float32) {
	for j := 0; j < len(x); j += 16 {
		n := min(16, len(x)-j)
		storeN(exp16(loadN(x[j:], n)), x[j:], n)
	}
	archsimd.ClearAVXUpperBits()
}

// mixValuesAVX512 is mixValuesPortable for four rows of acc at a time, one
// 16-lane chunk of the head dimension at a time: each value vector loaded
// feeds four FMAs, one per row, in key order. The keys between two events
// run without rescaling; at an event every row's accumulator is scaled by
// its factor (1, which changes no bit, for the rows that do not rescale).
func mixValuesAVX512(acc, p, f []float32, pStride, nq, n int, v []float32, hd int, events []int) {
	hd16 := (hd + 15) &^ 15
	vp := rowPtr(v, n*hd16)
	for i := 0; i < nq; i += 4 {
		var w [4]unsafe.Pointer
		var fr [4][]float32
		for r := range w { // past nq, repeat the last row and drop its sums
			row := min(i+r, nq-1)
			w[r], fr[r] = rowPtr(p[row*pStride:], n), f[row*pStride:row*pStride+n]
		}
		rows := min(4, nq-i)
		for d := 0; d < hd; d += 16 {
			lanes := min(16, hd-d)
			var a [4]archsimd.Float32x16
			for r := range rows {
				a[r] = loadN(acc[(i+r)*hd+d:], lanes)
			}
			from := 0
			for e := 0; e <= len(events); e++ {
				to := n
				if e < len(events) {
					to = events[e]
				}
				a[0], a[1], a[2], a[3] = mix4(unsafe.Add(w[0], 4*from), unsafe.Add(w[1], 4*from), unsafe.Add(w[2], 4*from), unsafe.Add(w[3], 4*from),
					unsafe.Add(vp, 4*(from*hd16+d)), to-from, hd16, a[0], a[1], a[2], a[3])
				if e < len(events) {
					for r := range a {
						a[r] = a[r].Mul(splat(fr[r][to]))
					}
				}
				from = to
			}
			for r := range rows {
				storeN(a[r], acc[(i+r)*hd+d:], lanes)
			}
		}
	}
	archsimd.ClearAVXUpperBits()
}

// mix4 returns a_r + Σ_j w_r[j]·v_j for the four weight rows w_r over the
// n vectors v_j at v + j·stride floats, adding in order.
//
//go:noinline
func mix4(w0, w1, w2, w3, v unsafe.Pointer, n, stride int, a0, a1, a2, a3 archsimd.Float32x16) (archsimd.Float32x16, archsimd.Float32x16, archsimd.Float32x16, archsimd.Float32x16) {
	for j := range n {
		x := f32x16(v, j*stride)
		a0 = splat(*(*float32)(unsafe.Add(w0, 4*j))).MulAdd(x, a0)
		a1 = splat(*(*float32)(unsafe.Add(w1, 4*j))).MulAdd(x, a1)
		a2 = splat(*(*float32)(unsafe.Add(w2, 4*j))).MulAdd(x, a2)
		a3 = splat(*(*float32)(unsafe.Add(w3, 4*j))).MulAdd(x, a3)
	}
	return a0, a1, a2, a3
}
