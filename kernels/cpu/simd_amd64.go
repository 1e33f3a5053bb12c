//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"

	"ddflash/kernels"
)

// simdKernels returns the SIMD kernel sets this CPU can run, the fastest
// first: the AVX-512 kernels, and the AVX2 ones (bit-identical to them,
// see avx2Kernels) on any CPU with AVX2, FMA and F16C.
func simdKernels() []kernelSet {
	var sets []kernelSet
	if archsimd.X86.AVX512() {
		sets = append(sets, avx512Kernels)
	}
	if archsimd.X86.AVX2() && archsimd.X86.FMA() && cpuHasF16C() {
		sets = append(sets, avx2Kernels)
	}
	return sets
}

var avx512Kernels = kernelSet{
	name:       "avx512",
	rows4:      rows4AVX512,
	rows4BF16:  rows4BF16AVX512,
	tileFP8:    tileFP8AVX512,
	widen:      widenAVX512,
	swiglu:     swigluAVX512,
	silu:       siluAVX512,
	mulSigmoid: mulSigmoidAVX512,
	deltaStep:  deltaStepAVX2, // eight 8-lane FMA chains in flight, where two 16-lane ones waited on latency
	accumRows:  accumRowsAVX512,
	conv:       convAVX512,
	scaledMax:  scaledMaxAVX512,
	scaledExp:  scaledExpAVX512,
	mixRows:    mixRowsAVX512,
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
func rowPtr[T float32 | uint16 | uint8](s []T, k int) unsafe.Pointer {
	return unsafe.Pointer(unsafe.SliceData(s[:k]))
}

// rows4AVX512 computes each tile's pairs of x rows with dot4x2, then a
// last odd x row with dot4x1.
func rows4AVX512(out []float32, outStride int, x []float32, m, k int, w []float32, next []uint16) {
	rows4Tiles(out, outStride, x, m, k, w, nil, next)
}

// rows4BF16AVX512 is rows4AVX512 with bfloat16 weight rows, each weight
// vector widened in registers right before its FMAs: no widened copy of
// the weights is written, which for a few x rows costs more than the FMAs.
func rows4BF16AVX512(out []float32, outStride int, x []float32, m, k int, w []uint16) {
	rows4Tiles(out, outStride, x, m, k, nil, w, nil)
}

// rows4Tiles runs the tiles of four weight rows of wf (float32) or wh
// (bfloat16): rowsQuad over fours of x rows (without k%16 tails),
// dot4x2 or dot4x2BF16 over pairs of the rest, dot4x1 or dot4x1BF16 over a
// last odd one, then the k%16 tails, then the sums. The rowsQuads prefetch
// the next tile of bfloat16 rows: wh's, or next with float32 rows.
func rows4Tiles(out []float32, outStride int, x []float32, m, k int, wf []float32, wh []uint16, next []uint16) {
	bf16 := wh != nil
	k16 := k &^ 15
	for j := 0; j*k < len(wf)+len(wh); j += 4 {
		var p0, p1, p2, p3 unsafe.Pointer
		if bf16 {
			p0, p1, p2, p3 = rowPtr(wh[j*k:], k), rowPtr(wh[(j+1)*k:], k), rowPtr(wh[(j+2)*k:], k), rowPtr(wh[(j+3)*k:], k)
		} else {
			p0, p1, p2, p3 = rowPtr(wf[j*k:], k), rowPtr(wf[(j+1)*k:], k), rowPtr(wf[(j+2)*k:], k), rowPtr(wf[(j+3)*k:], k)
		}
		// The first four rowsQuads each prefetch a quarter of the next tile
		// (past the end for the last one: a prefetch never faults), so that
		// memory serves it at a steady rate while the FMAs run.
		var nextTile uintptr
		switch {
		case bf16:
			nextTile = uintptr(p3) + uintptr(2*k)
		case next != nil:
			nextTile = uintptr(rowPtr(next, 4*k))
		}
		i := 0
		for ; k16 == k && i+4 <= m; i += 4 {
			var pf uintptr
			if nextTile != 0 && i < 16 {
				pf = nextTile + uintptr(i*k/2)
			}
			rowsQuad(out[i*outStride+j:], outStride, x[i*k:(i+4)*k], k, bf16, p0, p1, p2, p3, pf)
		}
		for ; i+2 <= m; i += 2 {
			x0, x1 := x[i*k:(i+1)*k], x[(i+1)*k:(i+2)*k]
			var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16
			if bf16 {
				a0, a1, a2, a3, b0, b1, b2, b3 = dot4x2BF16(p0, p1, p2, p3, rowPtr(x0, k), rowPtr(x1, k), k16)
			} else {
				a0, a1, a2, a3, b0, b1, b2, b3 = dot4x2(p0, p1, p2, p3, rowPtr(x0, k), rowPtr(x1, k), k16)
			}
			if k16 < k {
				a0, a1, a2, a3 = addTail(x0[k16:], wf, wh, j, k, a0, a1, a2, a3)
				b0, b1, b2, b3 = addTail(x1[k16:], wf, wh, j, k, b0, b1, b2, b3)
			}
			s := sums8(a0, a1, a2, a3, b0, b1, b2, b3)
			s.GetLo().StoreSlice(out[i*outStride+j:][:4])
			s.GetHi().StoreSlice(out[(i+1)*outStride+j:][:4])
		}
		if i < m {
			xr := x[i*k : (i+1)*k]
			var a0, a1, a2, a3 archsimd.Float32x16
			if bf16 {
				var acc [4][16]float32
				dot4x1BF16(p0, p1, p2, p3, rowPtr(xr, k), k16, uintptr(p3)+uintptr(2*k), &acc)
				a0, a1, a2, a3 = archsimd.LoadFloat32x16(&acc[0]), archsimd.LoadFloat32x16(&acc[1]), archsimd.LoadFloat32x16(&acc[2]), archsimd.LoadFloat32x16(&acc[3])
			} else {
				a0, a1, a2, a3 = dot4x1(p0, p1, p2, p3, rowPtr(xr, k), k16)
			}
			if k16 < k {
				a0, a1, a2, a3 = addTail(xr[k16:], wf, wh, j, k, a0, a1, a2, a3)
			}
			sum4(a0, a1, a2, a3).StoreSlice(out[i*outStride+j:][:4])
		}
	}
	archsimd.ClearAVXUpperBits()
}

// rowsQuad stores x_i·w_r for four x rows (x [4,k], k a multiple of 16) and
// the four weight rows at p0…p3 (bfloat16 when bf16, else float32) to
// out[i*outStride+r]. Widening a weight vector costs as much as two FMAs;
// dot4x4BF16 feeds each to four x rows, with the registers this needs.
func rowsQuad(out []float32, outStride int, x []float32, k int, bf16 bool, p0, p1, p2, p3 unsafe.Pointer, next uintptr) {
	_ = out[3*outStride+3] // the assembly writes rows 0…3, columns 0…3
	if bf16 {
		dot4x4BF16(p0, p1, p2, p3, rowPtr(x, 4*k), k, unsafe.Pointer(&out[0]), outStride, next)
	} else {
		dot4x4F32(p0, p1, p2, p3, rowPtr(x, 4*k), k, unsafe.Pointer(&out[0]), outStride, next)
	}
}

// dot4x4BF16 computes, in assembly (dot_amd64.s), the sixteen dot products
// of four weight rows and four x rows exactly as dot4x1BF16 and sum4 compute
// each one (the same FMA chain per lane, the same tree over the lanes), with
// the 28 vector registers it needs (Go's register allocator leaves archsimd
// code too few for this 4×4 block), and stores them to rows of out.
// Unless next is 0, it also prefetches the 2·k bytes there into L2 (a
// quarter of the next tile of four rows) as it goes: a verify block's
// weights come from memory, and its FMAs would otherwise wait for them.
//
//go:noescape
func dot4x4BF16(p0, p1, p2, p3, x unsafe.Pointer, k int, out unsafe.Pointer, outStride int, next uintptr)

// dot4x4F32 is dot4x4BF16 with float32 weight rows (a prefill's bfloat16
// tiles widened once; next is then in the next bfloat16 tile, which the
// prefill widens next).
//
//go:noescape
func dot4x4F32(p0, p1, p2, p3, x unsafe.Pointer, k int, out unsafe.Pointer, outStride int, next uintptr)

// addTail adds the last k%16 elements of an x row (xTail) times those of
// weight rows j…j+3 (zero-padded) to the four accumulators.
func addTail(xTail, wf []float32, wh []uint16, j, k int, a0, a1, a2, a3 archsimd.Float32x16) (archsimd.Float32x16, archsimd.Float32x16, archsimd.Float32x16, archsimd.Float32x16) {
	u := loadPart(xTail)
	var w [4]archsimd.Float32x16
	for r := range w {
		lo, hi := (j+r)*k+k&^15, (j+r+1)*k
		if wh != nil {
			w[r] = loadPartBF16(wh[lo:hi])
		} else {
			w[r] = loadPart(wf[lo:hi])
		}
	}
	return w[0].MulAdd(u, a0), w[1].MulAdd(u, a1), w[2].MulAdd(u, a2), w[3].MulAdd(u, a3)
}

// sums8 returns the lane sums of a0…a3 then b0…b3, each by one fixed tree:
// lanes i and i+8, then i and i+4, then adjacent pairs, then the two pair
// sums. It transposes as it adds, so the eight sums take 17 shuffles (the
// shuffle port is the bottleneck) where reducing each vector alone takes 28.
func sums8(a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16) archsimd.Float32x8 {
	a := fold(fold(a0, a1, 0), fold(a2, a3, 0), 1) // a_g's four lanes in 128-bit group g
	b := fold(fold(b0, b1, 0), fold(b2, b3, 0), 1)
	// Per group: a_g's and b_g's adjacent pairs, then the two pair sums (lanes 0 and 2).
	pairs := a.SelectFromPairGrouped(0, 2, 4, 6, b).Add(a.SelectFromPairGrouped(1, 3, 5, 7, b))
	s := pairs.Add(pairs.SelectFromPairGrouped(1, 0, 7, 6, pairs))
	return s.Permute(archsimd.LoadUint32x16(&gatherSums)).GetLo()
}

// sum4 returns the lane sums of four vectors by sums8's tree, one vector
// at a time: fewer instructions than sums8 when there is a single x row.
func sum4(a0, a1, a2, a3 archsimd.Float32x16) archsimd.Float32x4 {
	half := func(v archsimd.Float32x16) archsimd.Float32x4 {
		h := v.GetLo().Add(v.GetHi())
		return h.GetLo().Add(h.GetHi())
	}
	return half(a0).AddPairs(half(a1)).AddPairs(half(a2).AddPairs(half(a3)))
}

// fold adds the two selections of step s from the lanes of x‖y.
func fold(x, y archsimd.Float32x16, s int) archsimd.Float32x16 {
	lo := x.ConcatPermute(y, archsimd.LoadUint32x16(&foldIdx[s][0]))
	return lo.Add(x.ConcatPermute(y, archsimd.LoadUint32x16(&foldIdx[s][1])))
}

// foldIdx selects, per step of sums8, the two halves of each sum's lanes
// (of x and of y) to add.
var foldIdx = [2][2][16]uint32{
	{{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
	{{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}, {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}},
}

// gatherSums moves sums8's a sums (lane 0 of each group) then b sums (lane 2) to the front.
var gatherSums = [16]uint32{0, 4, 8, 12, 2, 6, 10, 14, 0, 4, 8, 12, 2, 6, 10, 14}

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

// dot4x2BF16 is dot4x2 with bfloat16 weight rows; widening is exact, so
// it matches dot4x2 on the widened rows bit for bit.
//
//go:noinline
func dot4x2BF16(p0, p1, p2, p3, q0, q1 unsafe.Pointer, n int) (a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16) {
	for l := 0; l < n; l += 16 {
		u, t := f32x16(q0, l), f32x16(q1, l)
		v := bf16x16(p0, l)
		a0, b0 = v.MulAdd(u, a0), v.MulAdd(t, b0)
		v = bf16x16(p1, l)
		a1, b1 = v.MulAdd(u, a1), v.MulAdd(t, b1)
		v = bf16x16(p2, l)
		a2, b2 = v.MulAdd(u, a2), v.MulAdd(t, b2)
		v = bf16x16(p3, l)
		a3, b3 = v.MulAdd(u, a3), v.MulAdd(t, b3)
	}
	return
}

// dot4x1BF16 is dot4x2BF16 for one x row (a decode step), in assembly
// (dot_amd64.s) to prefetch the next tile of weight rows, which starts at
// next, while it reads this one: it stores its accumulators to acc.
//
//go:noescape
func dot4x1BF16(p0, p1, p2, p3, q unsafe.Pointer, n int, next uintptr, acc *[4][16]float32)

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
