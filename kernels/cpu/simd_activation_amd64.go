//go:build goexperiment.simd && amd64

package cpu

import "simd/archsimd"

func splat(v float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(v) }

// exp16 is Cephes' expf on 16 lanes: x = n·ln2 + r with |r| ≤ ln2/2, a
// degree-5 polynomial for e^r, then VSCALEF by n. Inputs are clamped to
// [-104, 89], outside which the float32 result is 0 or +Inf anyway; NaN
// stays NaN (set back explicitly: which operand VMAXPS returns for NaN
// depends on the operand order the compiler picks). The constants are
// vectors in memory: loads keep exp16 small enough to inline (broadcasts
// did not), so a loop calling it makes no call and spills nothing around one.
func exp16(x archsimd.Float32x16) archsimd.Float32x16 {
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

// exp16's constants: indices into expConsts.
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
