//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"

	"ddflash/kernels/rowmath"
)

func splat(v float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(v) }

// sigmoid16 is 1/(1+e^-x).
func sigmoid16(x archsimd.Float32x16) archsimd.Float32x16 {
	one := splat(1)
	return one.Div(one.Add(rowmath.Exp16(x.Mul(splat(-1)))))
}

// map16 sets out[i] = f(a[i], b[i]) 16 lanes at a time, the tail through
// zero-filled partial vectors, then clears the upper vector state.
func map16(out, a, b []float32, f func(a, b archsimd.Float32x16) archsimd.Float32x16) {
	a, b = a[:len(out)], b[:len(out)]
	l := 0
	for ; l+16 <= len(out); l += 16 {
		f(archsimd.LoadFloat32x16Slice(a[l:]), archsimd.LoadFloat32x16Slice(b[l:])).StoreSlice(out[l:])
	}
	if l < len(out) {
		storePart(f(loadPart(a[l:]), loadPart(b[l:])), out[l:])
	}
	archsimd.ClearAVXUpperBits()
}

func swigluAVX512(out, gate, up []float32) {
	map16(out, gate, up, func(g, u archsimd.Float32x16) archsimd.Float32x16 {
		return g.Mul(sigmoid16(g)).Mul(u)
	})
}

func siluAVX512(x []float32) {
	map16(x, x, x, func(v, _ archsimd.Float32x16) archsimd.Float32x16 {
		return v.Mul(sigmoid16(v))
	})
}

func mulSigmoidAVX512(x, gate []float32) {
	map16(x, x, gate, func(v, g archsimd.Float32x16) archsimd.Float32x16 {
		return v.Mul(sigmoid16(g))
	})
}

// convAVX512 is convPortable on 16 channels at a time, one FMA per tap.
func convAVX512(out []float32, window [][]float32, wT []float32) {
	n := len(out)
	for c := 0; c < n; c += 16 {
		m := min(16, n-c)
		var acc archsimd.Float32x16
		for j, in := range window {
			acc = loadN(wT[j*n+c:], m).MulAdd(loadN(in[c:], m), acc)
		}
		storeN(acc, out[c:], m)
	}
	archsimd.ClearAVXUpperBits()
}
