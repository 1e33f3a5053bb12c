//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"simd/archsimd"
)

// deltaStepAVX512 is deltaStep over 32-lane slices (two vectors) of the
// value dimension: per slice, one pass over the key rows forms Sᵀk, a
// second updates S and accumulates Sᵀq, so delta and out never leave
// registers, and each broadcast of k[i] or q[i] serves both vectors.
func deltaStepAVX512(S, q, k, v []float32, g, beta float32, out, _ []float32) {
	vd := len(v)
	decay := splat(float32(math.Exp(float64(g))))
	S = S[:len(k)*vd]
	q = q[:len(k)]
	for j := 0; j < vd; j += 32 {
		n0, n1 := min(16, vd-j), max(0, min(16, vd-j-16)) // lanes in each vector
		var p0, p1 archsimd.Float32x16
		for i, ki := range k {
			row, kv := S[i*vd+j:], splat(ki)
			p0 = loadN(row, n0).MulAdd(kv, p0)
			if n1 > 0 {
				p1 = loadN(row[16:], n1).MulAdd(kv, p1)
			}
		}
		b := splat(beta)
		d0 := b.Mul(loadN(v[j:], n0).Sub(decay.Mul(p0)))
		var d1 archsimd.Float32x16
		if n1 > 0 {
			d1 = b.Mul(loadN(v[j+16:], n1).Sub(decay.Mul(p1)))
		}
		var o0, o1 archsimd.Float32x16
		for i, ki := range k {
			row, kv, qv := S[i*vd+j:], splat(ki), splat(q[i])
			s := kv.MulAdd(d0, loadN(row, n0).Mul(decay))
			storeN(s, row, n0)
			o0 = s.MulAdd(qv, o0)
			if n1 > 0 {
				s := kv.MulAdd(d1, loadN(row[16:], n1).Mul(decay))
				storeN(s, row[16:], n1)
				o1 = s.MulAdd(qv, o1)
			}
		}
		if out != nil {
			storeN(o0, out[j:], n0)
			if n1 > 0 {
				storeN(o1, out[j+16:], n1)
			}
		}
	}
	archsimd.ClearAVXUpperBits()
}

// loadN loads n ≤ 16 floats, zero-filling the rest.
func loadN(s []float32, n int) archsimd.Float32x16 {
	if n == 16 {
		return archsimd.LoadFloat32x16Slice(s)
	}
	return loadPart(s[:n])
}

// storeN stores the first n ≤ 16 lanes of x.
func storeN(x archsimd.Float32x16, s []float32, n int) {
	if n == 16 {
		x.StoreSlice(s)
		return
	}
	storePart(x, s[:n])
}

// accumRowsAVX512 is accumRowsPortable 64 lanes at a time: four
// accumulators stay in registers while the rows of b stream past, one
// broadcast and four FMAs per row; the last n%64 lanes go 16 at a time.
func accumRowsAVX512(out, c, b []float32, stride int) {
	n := len(out)
	if len(c) == 0 || n == 0 {
		return
	}
	b = b[:(len(c)-1)*stride+n]
	j := 0
	for ; j+64 <= n; j += 64 {
		o := out[j : j+64]
		a0, a1, a2, a3 := archsimd.LoadFloat32x16Slice(o), archsimd.LoadFloat32x16Slice(o[16:]), archsimd.LoadFloat32x16Slice(o[32:]), archsimd.LoadFloat32x16Slice(o[48:])
		for r, cr := range c {
			row, cv := b[r*stride+j:r*stride+j+64], splat(cr)
			a0 = archsimd.LoadFloat32x16Slice(row).MulAdd(cv, a0)
			a1 = archsimd.LoadFloat32x16Slice(row[16:]).MulAdd(cv, a1)
			a2 = archsimd.LoadFloat32x16Slice(row[32:]).MulAdd(cv, a2)
			a3 = archsimd.LoadFloat32x16Slice(row[48:]).MulAdd(cv, a3)
		}
		a0.StoreSlice(o)
		a1.StoreSlice(o[16:])
		a2.StoreSlice(o[32:])
		a3.StoreSlice(o[48:])
	}
	for ; j < n; j += 16 {
		lanes := min(16, n-j)
		a := loadN(out[j:], lanes)
		for r, cr := range c {
			a = loadN(b[r*stride+j:], lanes).MulAdd(splat(cr), a)
		}
		storeN(a, out[j:], lanes)
	}
	archsimd.ClearAVXUpperBits()
}
