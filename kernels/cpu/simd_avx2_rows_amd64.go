//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"simd/archsimd"

	"ddflash/kernels/rowmath"
)

// The AVX2 kernels (see avx2Kernels) whose every output lane is a fixed
// function of its own inputs (activations, exp, GDN, conv, value sums)
// run 8 lanes at a time with the AVX-512 kernels' per-lane operations;
// scaledMax keeps 16 lanes as two halves, as a max over lanes is exact
// but a NaN's place among them is not.

func splat8(v float32) archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(v) }

// sigmoid8 is sigmoid16 on 8 lanes.
func sigmoid8(x archsimd.Float32x8) archsimd.Float32x8 {
	one := splat8(1)
	return one.Div(one.Add(rowmath.Exp8(x.Mul(splat8(-1)))))
}

// load8 loads n ≤ 8 floats, zero-filling the rest.
func load8(s []float32, n int) archsimd.Float32x8 {
	if n == 8 {
		return archsimd.LoadFloat32x8Slice(s)
	}
	var buf [8]float32
	copy(buf[:], s[:n])
	return archsimd.LoadFloat32x8(&buf)
}

// store8 stores the first n ≤ 8 lanes of x.
func store8(x archsimd.Float32x8, s []float32, n int) {
	if n == 8 {
		x.StoreSlice(s)
		return
	}
	var buf [8]float32
	x.Store(&buf)
	copy(s[:n], buf[:n])
}

// map8 is map16 8 lanes at a time.
func map8(out, a, b []float32, f func(a, b archsimd.Float32x8) archsimd.Float32x8) {
	a, b = a[:len(out)], b[:len(out)]
	for l := 0; l < len(out); l += 8 {
		n := min(8, len(out)-l)
		store8(f(load8(a[l:], n), load8(b[l:], n)), out[l:], n)
	}
	archsimd.ClearAVXUpperBits()
}

func swigluAVX2(out, gate, up []float32) {
	map8(out, gate, up, func(g, u archsimd.Float32x8) archsimd.Float32x8 {
		return g.Mul(sigmoid8(g)).Mul(u)
	})
}

func siluAVX2(x []float32) {
	map8(x, x, x, func(v, _ archsimd.Float32x8) archsimd.Float32x8 {
		return v.Mul(sigmoid8(v))
	})
}

func mulSigmoidAVX2(x, gate []float32) {
	map8(x, x, gate, func(v, g archsimd.Float32x8) archsimd.Float32x8 {
		return v.Mul(sigmoid8(g))
	})
}

// convAVX2 is convAVX512 on 8 channels at a time.
func convAVX2(out []float32, window [][]float32, wT []float32) {
	n := len(out)
	for c := 0; c < n; c += 8 {
		m := min(8, n-c)
		var acc archsimd.Float32x8
		for j, in := range window {
			acc = load8(wT[j*n+c:], m).MulAdd(load8(in[c:], m), acc)
		}
		store8(acc, out[c:], m)
	}
	archsimd.ClearAVXUpperBits()
}

// scaledMaxAVX2 is scaledMaxAVX512 with each 16-lane maximum as two halves.
func scaledMaxAVX2(x []float32, scale float32) float32 {
	s, lo := splat8(scale), splat8(float32(math.Inf(-1)))
	hi := lo
	j := 0
	for ; j+16 <= len(x); j += 16 {
		lo = lo.Max(archsimd.LoadFloat32x8Slice(x[j:]).Mul(s))
		hi = hi.Max(archsimd.LoadFloat32x8Slice(x[j+8:]).Mul(s))
	}
	if j < len(x) {
		var buf [16]float32
		for l := range buf {
			buf[l] = float32(math.Inf(-1))
		}
		copy(buf[:], x[j:])
		lo = lo.Max(lanes8(&buf, 0).Mul(s))
		hi = hi.Max(lanes8(&buf, 8).Mul(s))
	}
	var lanes [16]float32
	lo.Store((*[8]float32)(lanes[:8]))
	hi.Store((*[8]float32)(lanes[8:]))
	archsimd.ClearAVXUpperBits()
	top := lanes[0]
	for _, v := range lanes[1:] {
		top = max(top, v)
	}
	return top
}

// lanes8 loads lanes l…l+7 of a 16-lane vector held in memory.
func lanes8(a *[16]float32, l int) archsimd.Float32x8 {
	return archsimd.LoadFloat32x8((*[8]float32)(a[l : l+8]))
}

// scaledExpAVX2 is scaledExpAVX512 with rowmath.Exp8.
func scaledExpAVX2(x []float32, scale, top float32) {
	s, t, none := splat8(scale), splat8(top), splat8(float32(math.Inf(-1)))
	for j := 0; j < len(x); j += 8 {
		n := min(8, len(x)-j)
		v := load8(x[j:], n)
		store8(rowmath.Exp8(v.Mul(s).Sub(t)).Masked(v.Greater(none)), x[j:], n)
	}
	archsimd.ClearAVXUpperBits()
}

// mixRowsAVX2 is mixRowsPortable with accumRowsAVX2: the same FMA chain
// per element, the same adds per sum, as mixRowsAVX512.
func mixRowsAVX2(acc []float32, accStride int, w []float32, wStride, nq, n int, v []float32, vStride int, sums []float32) {
	if n == 0 {
		return
	}
	for i := range nq {
		wi := w[i*wStride : i*wStride+n]
		accumRowsAVX2(acc[i*accStride:i*accStride+vStride], wi, v, vStride)
		addWeights(sums, i, wi)
	}
}

// accumRowsAVX2 is accumRowsAVX512 32 lanes at a time (four accumulators),
// the last n%32 lanes 8 at a time.
func accumRowsAVX2(out, c, b []float32, stride int) {
	n := len(out)
	if len(c) == 0 || n == 0 {
		return
	}
	b = b[:(len(c)-1)*stride+n]
	j := 0
	for ; j+32 <= n; j += 32 {
		o := out[j : j+32]
		a0, a1, a2, a3 := archsimd.LoadFloat32x8Slice(o), archsimd.LoadFloat32x8Slice(o[8:]), archsimd.LoadFloat32x8Slice(o[16:]), archsimd.LoadFloat32x8Slice(o[24:])
		for r, cr := range c {
			row, cv := b[r*stride+j:r*stride+j+32], splat8(cr)
			a0 = archsimd.LoadFloat32x8Slice(row).MulAdd(cv, a0)
			a1 = archsimd.LoadFloat32x8Slice(row[8:]).MulAdd(cv, a1)
			a2 = archsimd.LoadFloat32x8Slice(row[16:]).MulAdd(cv, a2)
			a3 = archsimd.LoadFloat32x8Slice(row[24:]).MulAdd(cv, a3)
		}
		a0.StoreSlice(o)
		a1.StoreSlice(o[8:])
		a2.StoreSlice(o[16:])
		a3.StoreSlice(o[24:])
	}
	for ; j < n; j += 8 {
		lanes := min(8, n-j)
		a := load8(out[j:], lanes)
		for r, cr := range c {
			a = load8(b[r*stride+j:], lanes).MulAdd(splat8(cr), a)
		}
		store8(a, out[j:], lanes)
	}
	archsimd.ClearAVXUpperBits()
}

// deltaStepAVX2 is deltaStepPortable with the 16-lane model's per-lane
// FMA chains (lanes16_test.go), for both SIMD sets. A value dimension of
// whole 64-lane blocks (the models' 128) takes deltaStep64x8; others go
// over 16-lane slices (two vectors) of it: per slice, one pass over the
// key rows forms Sᵀk, a second updates S and accumulates Sᵀq, so delta
// and out never leave registers.
func deltaStepAVX2(S, q, k, v []float32, g, beta float32, out, delta []float32) {
	vd := len(v)
	if vd%64 == 0 && out != nil {
		deltaStep64x8(S, q, k, v, g, beta, out, delta)
		return
	}
	decay := splat8(float32(math.Exp(float64(g))))
	S = S[:len(k)*vd]
	q = q[:len(k)]
	for j := 0; j < vd; j += 16 {
		n0, n1 := min(8, vd-j), max(0, min(8, vd-j-8)) // lanes in each vector
		var p0, p1 archsimd.Float32x8
		for i, ki := range k {
			row, kv := S[i*vd+j:], splat8(ki)
			p0 = load8(row, n0).MulAdd(kv, p0)
			if n1 > 0 {
				p1 = load8(row[8:], n1).MulAdd(kv, p1)
			}
		}
		b := splat8(beta)
		d0 := b.Mul(load8(v[j:], n0).Sub(decay.Mul(p0)))
		var d1 archsimd.Float32x8
		if n1 > 0 {
			d1 = b.Mul(load8(v[j+8:], n1).Sub(decay.Mul(p1)))
		}
		var o0, o1 archsimd.Float32x8
		for i, ki := range k {
			row, kv, qv := S[i*vd+j:], splat8(ki), splat8(q[i])
			s := kv.MulAdd(d0, load8(row, n0).Mul(decay))
			store8(s, row, n0)
			o0 = s.MulAdd(qv, o0)
			if n1 > 0 {
				s := kv.MulAdd(d1, load8(row[8:], n1).Mul(decay))
				store8(s, row[8:], n1)
				o1 = s.MulAdd(qv, o1)
			}
		}
		if out != nil {
			store8(o0, out[j:], n0)
			if n1 > 0 {
				store8(o1, out[j+8:], n1)
			}
		}
	}
	archsimd.ClearAVXUpperBits()
}

// deltaStep64x8 is deltaStepAVX2 for a value dimension of whole 64-lane
// blocks, computing the same per-lane chains with more of them in flight:
// Sᵀk eight vectors at a time (eight independent FMA chains cover the FMA
// latency on both units, where a 16-lane slice's two chains waited on it),
// into delta, then the update and Sᵀq four vectors at a time.
func deltaStep64x8(S, q, k, v []float32, g, beta float32, out, delta []float32) {
	vd := len(v)
	decay, b := splat8(float32(math.Exp(float64(g)))), splat8(beta)
	S = S[:len(k)*vd]
	q = q[:len(k)]
	delta, out = delta[:vd], out[:vd]
	load := archsimd.LoadFloat32x8Slice
	for j := 0; j < vd; j += 64 {
		var p0, p1, p2, p3, p4, p5, p6, p7 archsimd.Float32x8
		for i, ki := range k {
			row, kv := S[i*vd+j:i*vd+j+64], splat8(ki)
			p0 = load(row[0:]).MulAdd(kv, p0)
			p1 = load(row[8:]).MulAdd(kv, p1)
			p2 = load(row[16:]).MulAdd(kv, p2)
			p3 = load(row[24:]).MulAdd(kv, p3)
			p4 = load(row[32:]).MulAdd(kv, p4)
			p5 = load(row[40:]).MulAdd(kv, p5)
			p6 = load(row[48:]).MulAdd(kv, p6)
			p7 = load(row[56:]).MulAdd(kv, p7)
		}
		for l, p := range [8]archsimd.Float32x8{p0, p1, p2, p3, p4, p5, p6, p7} {
			o := j + 8*l
			b.Mul(load(v[o:]).Sub(decay.Mul(p))).StoreSlice(delta[o:])
		}
	}
	for j := 0; j < vd; j += 32 {
		d0, d1, d2, d3 := load(delta[j:]), load(delta[j+8:]), load(delta[j+16:]), load(delta[j+24:])
		var o0, o1, o2, o3 archsimd.Float32x8
		for i, ki := range k {
			row, kv, qv := S[i*vd+j:i*vd+j+32], splat8(ki), splat8(q[i])
			s0 := kv.MulAdd(d0, load(row[0:]).Mul(decay))
			s1 := kv.MulAdd(d1, load(row[8:]).Mul(decay))
			s2 := kv.MulAdd(d2, load(row[16:]).Mul(decay))
			s3 := kv.MulAdd(d3, load(row[24:]).Mul(decay))
			s0.StoreSlice(row[0:])
			s1.StoreSlice(row[8:])
			s2.StoreSlice(row[16:])
			s3.StoreSlice(row[24:])
			o0, o1, o2, o3 = s0.MulAdd(qv, o0), s1.MulAdd(qv, o1), s2.MulAdd(qv, o2), s3.MulAdd(qv, o3)
		}
		o0.StoreSlice(out[j:])
		o1.StoreSlice(out[j+8:])
		o2.StoreSlice(out[j+16:])
		o3.StoreSlice(out[j+24:])
	}
	archsimd.ClearAVXUpperBits()
}
