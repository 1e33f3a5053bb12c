//go:build goexperiment.simd && amd64

package cpu

import "simd/archsimd"

// simdMatMul returns the AVX-512 MatMul kernels when the CPU has AVX-512.
func simdMatMul() (matmulKernels, bool) {
	if !archsimd.X86.AVX512() {
		return matmulKernels{}, false
	}
	return matmulKernels{name: "avx512", rows4: rows4AVX512, rows4BF16: rows4BF16AVX512}, true
}

// rows4AVX512 dots pairs of x rows against the four weight rows with 8
// vector accumulators (6 loads per 8 FMAs; Go allocates only 15 vector
// registers, so a 4×4 block would spill), then a last odd x row on its own.
// The k%16 tail is added in scalar code.
func rows4AVX512(out []float32, outStride int, x []float32, m, k int, tile []float32) {
	w0, w1, w2, w3 := tile[:k], tile[k:2*k], tile[2*k:3*k], tile[3*k:4*k]
	k16 := k &^ 15
	i := 0
	for ; i+2 <= m; i += 2 {
		x0, x1 := x[i*k:(i+1)*k], x[(i+1)*k:(i+2)*k]
		var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16
		for l := 0; l < k16; l += 16 {
			v0 := archsimd.LoadFloat32x16Slice(w0[l:])
			v1 := archsimd.LoadFloat32x16Slice(w1[l:])
			v2 := archsimd.LoadFloat32x16Slice(w2[l:])
			v3 := archsimd.LoadFloat32x16Slice(w3[l:])
			u := archsimd.LoadFloat32x16Slice(x0[l:])
			a0, a1, a2, a3 = u.MulAdd(v0, a0), u.MulAdd(v1, a1), u.MulAdd(v2, a2), u.MulAdd(v3, a3)
			u = archsimd.LoadFloat32x16Slice(x1[l:])
			b0, b1, b2, b3 = u.MulAdd(v0, b0), u.MulAdd(v1, b1), u.MulAdd(v2, b2), u.MulAdd(v3, b3)
		}
		storeTile4(out[i*outStride:], x0, w0, w1, w2, w3, a0, a1, a2, a3, k16)
		storeTile4(out[(i+1)*outStride:], x1, w0, w1, w2, w3, b0, b1, b2, b3, k16)
	}
	for ; i < m; i++ {
		xr := x[i*k : (i+1)*k]
		var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16
		l := 0
		for ; l+32 <= k16; l += 32 { // two independent chains per row hide the FMA latency
			u := archsimd.LoadFloat32x16Slice(xr[l:])
			a0 = u.MulAdd(archsimd.LoadFloat32x16Slice(w0[l:]), a0)
			a1 = u.MulAdd(archsimd.LoadFloat32x16Slice(w1[l:]), a1)
			a2 = u.MulAdd(archsimd.LoadFloat32x16Slice(w2[l:]), a2)
			a3 = u.MulAdd(archsimd.LoadFloat32x16Slice(w3[l:]), a3)
			u = archsimd.LoadFloat32x16Slice(xr[l+16:])
			b0 = u.MulAdd(archsimd.LoadFloat32x16Slice(w0[l+16:]), b0)
			b1 = u.MulAdd(archsimd.LoadFloat32x16Slice(w1[l+16:]), b1)
			b2 = u.MulAdd(archsimd.LoadFloat32x16Slice(w2[l+16:]), b2)
			b3 = u.MulAdd(archsimd.LoadFloat32x16Slice(w3[l+16:]), b3)
		}
		for ; l < k16; l += 16 {
			u := archsimd.LoadFloat32x16Slice(xr[l:])
			a0 = u.MulAdd(archsimd.LoadFloat32x16Slice(w0[l:]), a0)
			a1 = u.MulAdd(archsimd.LoadFloat32x16Slice(w1[l:]), a1)
			a2 = u.MulAdd(archsimd.LoadFloat32x16Slice(w2[l:]), a2)
			a3 = u.MulAdd(archsimd.LoadFloat32x16Slice(w3[l:]), a3)
		}
		storeTile4(out[i*outStride:], xr, w0, w1, w2, w3, a0.Add(b0), a1.Add(b1), a2.Add(b2), a3.Add(b3), k16)
	}
}

// rows4BF16AVX512 is the decode kernel for bfloat16 weights: each weight
// vector is widened in registers (bits << 16) right before its FMA.
func rows4BF16AVX512(out []float32, x []float32, k int, tile []uint16) {
	w0, w1, w2, w3 := tile[:k], tile[k:2*k], tile[2*k:3*k], tile[3*k:4*k]
	k16 := k &^ 15
	var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16
	l := 0
	for ; l+32 <= k16; l += 32 {
		u := archsimd.LoadFloat32x16Slice(x[l:])
		a0 = u.MulAdd(loadBF16(w0[l:]), a0)
		a1 = u.MulAdd(loadBF16(w1[l:]), a1)
		a2 = u.MulAdd(loadBF16(w2[l:]), a2)
		a3 = u.MulAdd(loadBF16(w3[l:]), a3)
		u = archsimd.LoadFloat32x16Slice(x[l+16:])
		b0 = u.MulAdd(loadBF16(w0[l+16:]), b0)
		b1 = u.MulAdd(loadBF16(w1[l+16:]), b1)
		b2 = u.MulAdd(loadBF16(w2[l+16:]), b2)
		b3 = u.MulAdd(loadBF16(w3[l+16:]), b3)
	}
	for ; l < k16; l += 16 {
		u := archsimd.LoadFloat32x16Slice(x[l:])
		a0 = u.MulAdd(loadBF16(w0[l:]), a0)
		a1 = u.MulAdd(loadBF16(w1[l:]), a1)
		a2 = u.MulAdd(loadBF16(w2[l:]), a2)
		a3 = u.MulAdd(loadBF16(w3[l:]), a3)
	}
	sums := [4]float32{hsum(a0.Add(b0)), hsum(a1.Add(b1)), hsum(a2.Add(b2)), hsum(a3.Add(b3))}
	for l := k16; l < k; l++ {
		sums[0] += x[l] * bf16ToF32(w0[l])
		sums[1] += x[l] * bf16ToF32(w1[l])
		sums[2] += x[l] * bf16ToF32(w2[l])
		sums[3] += x[l] * bf16ToF32(w3[l])
	}
	copy(out[:4], sums[:])
}

func loadBF16(s []uint16) archsimd.Float32x16 {
	return archsimd.LoadUint16x16Slice(s).ExtendToUint32().ShiftAllLeft(16).AsFloat32x16()
}

// storeTile4 writes the four dot products of x with w0..w3: the reduced
// vector accumulators (covering the first k16 elements) plus the scalar tail.
func storeTile4(out, x, w0, w1, w2, w3 []float32, a0, a1, a2, a3 archsimd.Float32x16, k16 int) {
	sums := [4]float32{hsum(a0), hsum(a1), hsum(a2), hsum(a3)}
	for l := k16; l < len(x); l++ {
		sums[0] += x[l] * w0[l]
		sums[1] += x[l] * w1[l]
		sums[2] += x[l] * w2[l]
		sums[3] += x[l] * w3[l]
	}
	copy(out[:4], sums[:])
}

// hsum adds the 16 lanes of v.
func hsum(v archsimd.Float32x16) float32 {
	h := v.GetLo().Add(v.GetHi())
	q := h.GetLo().Add(h.GetHi())
	var lanes [4]float32
	q.Store(&lanes)
	return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}
