//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"simd/archsimd"
	"unsafe"

	"ddflash/kernels"
)

// tileFP8AVX512 is the AVX-512 fp8Tile: sixteens of x rows in fp8Dot1x16
// (once per weight row), eights in fp8Dot2x8 (twice, two weight rows
// each), the rest one at a time in fp8Dot4x1, all in assembly
// (fp8_amd64.s): the more x rows share a widened weight vector, the less
// widening costs per product. Both leave per-lane partial sums that, after
// the k%16 tail, sum4 adds: rows4's chain and tree on the dequantised
// weights, so every row is bit-identical to the row alone. A block row
// with a scale of 2^8 or more (never seen in checkpoints: weights beyond
// 10^5) takes the portable kernel, whose widening has no range limit.
func tileFP8AVX512(out []float32, outStride, cols int, x []float32, m, k int, q *[4][]uint8, scales []float32) {
	blocks := scales[:(k+kernels.FP8Block-1)/kernels.FP8Block]
	for _, s := range blocks {
		if math.Abs(float64(s)) >= fp8MaxSIMDScale {
			tileFP8Portable(out, outStride, cols, x, m, k, q, scales)
			return
		}
	}
	k16 := k &^ 15
	p0, p1, p2, p3 := rowPtr(q[0], k), rowPtr(q[1], k), rowPtr(q[2], k), rowPtr(q[3], k)
	sp := unsafe.Pointer(unsafe.SliceData(blocks))
	var acc [16][4][16]float32
	i := 0
	for ; i+16 <= m; i += 16 {
		acc = [16][4][16]float32{}
		for kb := 0; kb < k16; kb += fp8Chunk {
			xp := rowPtr(x[i*k+kb:], 15*k+min(fp8Chunk, k16-kb))
			s := unsafe.Add(sp, 4*(kb/kernels.FP8Block))
			for r, p := range [4]unsafe.Pointer{p0, p1, p2, p3} {
				fp8Dot1x16(unsafe.Add(p, kb), s, xp, min(fp8Chunk, k16-kb), k, unsafe.Pointer(&acc[0][r]))
			}
		}
		for s := range 16 {
			fp8Finish(out[(i+s)*outStride:], cols, x[(i+s)*k:(i+s+1)*k], q, scales, k, &acc[s])
		}
	}
	for ; i+8 <= m; i += 8 {
		xp := rowPtr(x[i*k:], 8*k)
		fp8Dot2x8(p0, p1, sp, xp, k16, k, unsafe.Pointer(&acc[0][0]))
		fp8Dot2x8(p2, p3, sp, xp, k16, k, unsafe.Pointer(&acc[0][2]))
		for s := range 8 {
			fp8Finish(out[(i+s)*outStride:], cols, x[(i+s)*k:(i+s+1)*k], q, scales, k, &acc[s])
		}
	}
	for ; i < m; i++ {
		fp8Dot4x1(p0, p1, p2, p3, sp, rowPtr(x[i*k:], k), k16, &acc[0])
		fp8Finish(out[i*outStride:], cols, x[i*k:(i+1)*k], q, scales, k, &acc[0])
	}
	archsimd.ClearAVXUpperBits()
}

// fp8Chunk is how much of k fp8Dot1x16 covers per call: sixteen x rows of
// it (16 KiB) stay in L1 while the four weight rows of a tile pass.
const fp8Chunk = 2 * kernels.FP8Block

// fp8MaxSIMDScale bounds the block scales the assembly widening handles.
const fp8MaxSIMDScale = 1 << 8

// fp8Finish adds the k%16 tail of x row xr to the four partial sums (as
// addTail does), sums their lanes with sum4 and stores the first cols.
func fp8Finish(out []float32, cols int, xr []float32, q *[4][]uint8, scales []float32, k int, acc *[4][16]float32) {
	a := [4]archsimd.Float32x16{}
	for r := range a {
		a[r] = archsimd.LoadFloat32x16(&acc[r])
	}
	if k16 := k &^ 15; k16 < k {
		u := loadPart(xr[k16:])
		s := scales[k16/kernels.FP8Block]
		for r := range a {
			var w [16]float32
			for l, b := range q[r][k16:k] {
				w[l] = e4m3Values[b] * s
			}
			a[r] = archsimd.LoadFloat32x16(&w).MulAdd(u, a[r])
		}
	}
	sums := sum4(a[0], a[1], a[2], a[3])
	if cols == 4 {
		sums.StoreSlice(out[:4])
		return
	}
	var buf [4]float32
	sums.Store(&buf)
	copy(out[:cols], buf[:cols])
}

// fp8Dot4x1 stores to acc[r] the 16 per-lane partial sums of the x row
// at x times E4M3 weight row r (p0…p3) over the first n elements (a
// multiple of 16): each weight vector widened and multiplied by its
// block's scale (sp, one per 128 elements), then one FMA per 16 elements
// in k order.
//
//go:noescape
func fp8Dot4x1(p0, p1, p2, p3, sp, x unsafe.Pointer, n int, acc *[4][16]float32)

// fp8Dot1x16 is fp8Dot4x1 for sixteen x rows (stride floats apart) and one
// weight row over n elements from the start of a scale block; x row s
// continues the sums in the [16]float32 at acc + 256·s.
//
//go:noescape
func fp8Dot1x16(p0, sp, x unsafe.Pointer, n, stride int, acc unsafe.Pointer)

// fp8Dot2x8 is fp8Dot4x1 for eight x rows (stride floats apart) and two
// weight rows; x row s and weight row r sum into the [16]float32 at
// acc + 256·s + 64·r.
//
//go:noescape
func fp8Dot2x8(p0, p1, sp, x unsafe.Pointer, n, stride int, acc unsafe.Pointer)
