//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"

	"ddflash/kernels"
)

// simdKernels returns the AVX-512 kernels when the CPU has AVX-512.
func simdKernels() (kernelSet, bool) {
	if !archsimd.X86.AVX512() {
		return kernelSet{}, false
	}
	return kernelSet{
		name:       "avx512",
		rows4:      rows4AVX512,
		rows4BF16:  rows4BF16AVX512,
		widen:      widenAVX512,
		swiglu:     swigluAVX512,
		silu:       siluAVX512,
		mulSigmoid: mulSigmoidAVX512,
		deltaStep:  deltaStepAVX512,
		attend:     attendAVX512,
	}, true
}

// Notes on the Go compiler these kernels are shaped for:
//   - it allocates only 15 vector registers, so a block holds at most
//     8 accumulators (a 4×4 block of dot products spills);
//   - slice loads keep each row's length live for the bounds checks, and
//     with six rows the general registers spill inside the loop, so the
//     inner loops take base pointers (rows are length-checked by rowPtr);
//   - scalar float code (SSE) right after 512-bit code runs many times
//     slower until VZEROUPPER (ClearAVXUpperBits), which the compiler does
//     not emit: each kernel keeps sums and tails in vector registers
//     (zero-filled partial loads, vector stores) and clears the upper
//     bits before it returns to scalar Go code.
//   - partial vectors go through a zeroed array on the stack: archsimd's
//     SlicePart helpers convert a short slice to a 16-element array
//     pointer, which checkptr (go test -race) rejects at an allocation's end.

// f32x16 loads the 16 floats at element l of the row starting at p.
func f32x16(p unsafe.Pointer, l int) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, 4*l)))
}

// bf16x16 loads the 16 bfloat16s at element l of the row at p, widened (bits << 16).
func bf16x16(p unsafe.Pointer, l int) archsimd.Float32x16 {
	return widenBF16(archsimd.LoadUint16x16((*[16]uint16)(unsafe.Add(p, 2*l))))
}

func widenBF16(h archsimd.Uint16x16) archsimd.Float32x16 {
	return h.ExtendToUint32().ShiftAllLeft(16).AsFloat32x16()
}

// rowPtr returns the address of a row of k elements, checking its length.
func rowPtr[T float32 | uint16](s []T, k int) unsafe.Pointer {
	return unsafe.Pointer(unsafe.SliceData(s[:k]))
}

// rows4AVX512 computes pairs of x rows against the four weight rows with
// dot4x2, then a last odd x row with dot4x1.
func rows4AVX512(out []float32, outStride int, x []float32, m, k int, tile []float32) {
	w := [4][]float32{tile[:k], tile[k : 2*k], tile[2*k : 3*k], tile[3*k : 4*k]}
	p0, p1, p2, p3 := rowPtr(w[0], k), rowPtr(w[1], k), rowPtr(w[2], k), rowPtr(w[3], k)
	k16 := k &^ 15
	i := 0
	for ; i+2 <= m; i += 2 {
		x0, x1 := x[i*k:(i+1)*k], x[(i+1)*k:(i+2)*k]
		a0, a1, a2, a3, b0, b1, b2, b3 := dot4x2(p0, p1, p2, p3, rowPtr(x0, k), rowPtr(x1, k), k16)
		storeSums(out[i*outStride:], x0[k16:], &w, k16, a0, a1, a2, a3)
		storeSums(out[(i+1)*outStride:], x1[k16:], &w, k16, b0, b1, b2, b3)
	}
	if i < m {
		xr := x[i*k : (i+1)*k]
		a0, a1, a2, a3 := dot4x1(p0, p1, p2, p3, rowPtr(xr, k), k16)
		storeSums(out[i*outStride:], xr[k16:], &w, k16, a0, a1, a2, a3)
	}
	archsimd.ClearAVXUpperBits()
}

// dot4x2 returns the vector partial sums of two x rows (q0, q1) against
// four weight rows over n elements (a multiple of 16): 8 accumulators, 6
// loads per 8 FMAs. It stays out of line so that only its pointers and
// accumulators compete for registers.
//
//go:noinline
func dot4x2(p0, p1, p2, p3, q0, q1 unsafe.Pointer, n int) (a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16) {
	for l := 0; l < n; l += 16 {
		u, t := f32x16(q0, l), f32x16(q1, l)
		v := f32x16(p0, l)
		a0, b0 = v.MulAdd(u, a0), v.MulAdd(t, b0)
		v = f32x16(p1, l)
		a1, b1 = v.MulAdd(u, a1), v.MulAdd(t, b1)
		v = f32x16(p2, l)
		a2, b2 = v.MulAdd(u, a2), v.MulAdd(t, b2)
		v = f32x16(p3, l)
		a3, b3 = v.MulAdd(u, a3), v.MulAdd(t, b3)
	}
	return
}

// dot4x1 is dot4x2 for one x row. It keeps one chain per output, like
// dot4x2, so that a row's result does not depend on how many rows the
// call has: a verify block reproduces decode bit for bit.
//
//go:noinline
func dot4x1(p0, p1, p2, p3, q unsafe.Pointer, n int) (a0, a1, a2, a3 archsimd.Float32x16) {
	for l := 0; l < n; l += 16 {
		u := f32x16(q, l)
		a0, a1, a2, a3 = f32x16(p0, l).MulAdd(u, a0), f32x16(p1, l).MulAdd(u, a1), f32x16(p2, l).MulAdd(u, a2), f32x16(p3, l).MulAdd(u, a3)
	}
	return
}

// storeSums adds the k%16 tail (xTail against w[r][k16:]) to the four
// accumulators and stores their sums to out[0:4].
func storeSums(out, xTail []float32, w *[4][]float32, k16 int, a0, a1, a2, a3 archsimd.Float32x16) {
	if len(xTail) > 0 {
		u := loadPart(xTail)
		a0 = loadPart(w[0][k16:]).MulAdd(u, a0)
		a1 = loadPart(w[1][k16:]).MulAdd(u, a1)
		a2 = loadPart(w[2][k16:]).MulAdd(u, a2)
		a3 = loadPart(w[3][k16:]).MulAdd(u, a3)
	}
	sum4(a0, a1, a2, a3).StoreSlice(out[:4])
}

// sum4 returns the lane sums of four vectors as one vector.
func sum4(a0, a1, a2, a3 archsimd.Float32x16) archsimd.Float32x4 {
	half := func(v archsimd.Float32x16) archsimd.Float32x4 {
		h := v.GetLo().Add(v.GetHi())
		return h.GetLo().Add(h.GetHi())
	}
	return half(a0).AddPairs(half(a1)).AddPairs(half(a2).AddPairs(half(a3)))
}

// rows4BF16AVX512 is the decode kernel for bfloat16 weights: each weight
// vector is widened in registers right before its FMA.
func rows4BF16AVX512(out []float32, x []float32, k int, tile []uint16) {
	w := [4][]uint16{tile[:k], tile[k : 2*k], tile[2*k : 3*k], tile[3*k : 4*k]}
	k16 := k &^ 15
	a0, a1, a2, a3 := dot4x1BF16(rowPtr(w[0], k), rowPtr(w[1], k), rowPtr(w[2], k), rowPtr(w[3], k), rowPtr(x, k), k16)
	if k16 < k {
		u := loadPart(x[k16:])
		a0 = loadPartBF16(w[0][k16:]).MulAdd(u, a0)
		a1 = loadPartBF16(w[1][k16:]).MulAdd(u, a1)
		a2 = loadPartBF16(w[2][k16:]).MulAdd(u, a2)
		a3 = loadPartBF16(w[3][k16:]).MulAdd(u, a3)
	}
	sum4(a0, a1, a2, a3).StoreSlice(out[:4])
	archsimd.ClearAVXUpperBits()
}

// dot4x1BF16 is dot4x1 with bfloat16 weight rows; widening is exact, so
// it matches dot4x1 on the widened rows bit for bit.
//
//go:noinline
func dot4x1BF16(p0, p1, p2, p3, q unsafe.Pointer, n int) (a0, a1, a2, a3 archsimd.Float32x16) {
	for l := 0; l < n; l += 16 {
		u := f32x16(q, l)
		a0, a1, a2, a3 = bf16x16(p0, l).MulAdd(u, a0), bf16x16(p1, l).MulAdd(u, a1), bf16x16(p2, l).MulAdd(u, a2), bf16x16(p3, l).MulAdd(u, a3)
	}
	return
}

// widenAVX512 widens bfloat16 weights 16 at a time; F16 takes the portable path.
func widenAVX512(dst []float32, src []uint16, dt kernels.DType) {
	if dt != kernels.BF16 {
		widenInto(dst, src, dt)
		return
	}
	src = src[:len(dst)]
	l := 0
	for ; l+16 <= len(dst); l += 16 {
		widenBF16(archsimd.LoadUint16x16Slice(src[l:])).StoreSlice(dst[l:])
	}
	if l < len(dst) {
		storePart(loadPartBF16(src[l:]), dst[l:])
	}
	archsimd.ClearAVXUpperBits()
}

// loadPart loads len(s) < 16 floats, zero-filling the other lanes.
func loadPart(s []float32) archsimd.Float32x16 {
	var buf [16]float32
	copy(buf[:], s)
	return archsimd.LoadFloat32x16(&buf)
}

// loadPartBF16 loads len(s) < 16 bfloat16s widened, zero-filling the other lanes.
func loadPartBF16(s []uint16) archsimd.Float32x16 {
	var buf [16]uint16
	copy(buf[:], s)
	return widenBF16(archsimd.LoadUint16x16(&buf))
}

// storePart stores the first len(s) < 16 lanes of x.
func storePart(x archsimd.Float32x16, s []float32) {
	var buf [16]float32
	x.Store(&buf)
	copy(s, buf[:])
}
