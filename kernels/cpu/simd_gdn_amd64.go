//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"simd/archsimd"
)

// deltaStepAVX512 is deltaStep over 16-lane chunks of the value dimension:
// per chunk, one pass over the key rows forms Sᵀk, a second updates S and
// accumulates Sᵀq, so delta and out never leave registers.
func deltaStepAVX512(S, q, k, v []float32, g, beta float32, out, _ []float32) {
	vd := len(v)
	decay := splat(float32(math.Exp(float64(g))))
	S = S[:len(k)*vd]
	for j := 0; j < vd; j += 16 {
		n := min(16, vd-j)
		var pred archsimd.Float32x16
		for i, ki := range k {
			pred = loadN(S[i*vd+j:], n).MulAdd(splat(ki), pred)
		}
		delta := splat(beta).Mul(loadN(v[j:], n).Sub(decay.Mul(pred)))
		var o archsimd.Float32x16
		for i, ki := range k {
			s := splat(ki).MulAdd(delta, loadN(S[i*vd+j:], n).Mul(decay))
			storeN(s, S[i*vd+j:], n)
			o = s.MulAdd(splat(q[i]), o)
		}
		if out != nil {
			storeN(o, out[j:], n)
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
