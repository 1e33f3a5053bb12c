//go:build goexperiment.simd && amd64

package cpu

import "simd/archsimd"

func splat(v float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(v) }

// exp16 is Cephes' expf on 16 lanes: x = n·ln2 + r with |r| ≤ ln2/2, a
// degree-5 polynomial for e^r, then VSCALEF by n. Inputs are clamped to
// [-104, 89], outside which the float32 result is 0 or +Inf anyway; the
// operand order of the clamp lets NaN through (VMAXPS and VMINPS return
// their second source when one is NaN).
func exp16(x archsimd.Float32x16) archsimd.Float32x16 {
	const (
		log2e = 1.44269504088896341
		ln2Hi = 0.693359375 // ln2 = ln2Hi + ln2Lo, with ln2Hi exact in few bits
		ln2Lo = -2.12194440e-4
	)
	x = splat(89).Min(splat(-104).Max(x))
	n := x.Mul(splat(log2e)).RoundToEvenScaled(0)
	r := n.MulAdd(splat(-ln2Hi), x)
	r = n.MulAdd(splat(-ln2Lo), r)
	p := splat(1.9875691500e-4).MulAdd(r, splat(1.3981999507e-3))
	p = p.MulAdd(r, splat(8.3334519073e-3))
	p = p.MulAdd(r, splat(4.1665795894e-2))
	p = p.MulAdd(r, splat(1.6666665459e-1))
	p = p.MulAdd(r, splat(5.0000001201e-1))
	p = p.MulAdd(r.Mul(r), r.Add(splat(1)))
	return p.Scale(n)
}

// sigmoid16 is 1/(1+e^-x).
func sigmoid16(x archsimd.Float32x16) archsimd.Float32x16 {
	one := splat(1)
	return one.Div(one.Add(exp16(x.Mul(splat(-1)))))
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
