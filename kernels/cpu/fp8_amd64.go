//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"simd/archsimd"
	"unsafe"

	"ddflash/kernels"
)

// tileFP8AVX512 is the AVX-512 fp8Tile, in assembly (fp8_amd64.s) where
// archsimd lacks the half to float conversion or the registers. A single x
// row (decode) runs fp8Dot4x1, which widens each weight vector in
// registers right before its FMAs. Fours of x rows (verify blocks,
// prefill) would widen every weight vector once per row, so the tile's
// four weight rows are widened once, fp8Chunk elements at a time
// (fp8Widen), into an L1-sized float32 scratch that fp8Dot4x4 reads for
// every four x rows, carrying their sums from chunk to chunk: the weights
// are never held dequantised beyond the chunk of four rows in use. All paths leave
// per-lane partial sums of the same FMA chain that fp8Finish completes
// (k%16 tail, sum4), so every output equals rows4's on the dequantised
// weights and every row is bit-identical to the row alone. A block row
// with a scale of 2^8 or more (never seen in checkpoints: weights beyond
// 10^5) takes the portable kernel, whose widening has no range limit.
func tileFP8AVX512(out []float32, outStride, cols int, x []float32, m, k int, q *[4][]uint8, scales []float32) {
	blocks, ok := fp8SIMDBlocks(scales, k)
	if !ok {
		tileFP8Portable(out, outStride, cols, x, m, k, q, scales)
		return
	}
	k16 := k &^ 15
	sp := unsafe.Pointer(unsafe.SliceData(blocks))
	p0, p1, p2, p3 := rowPtr(q[0], k), rowPtr(q[1], k), rowPtr(q[2], k), rowPtr(q[3], k)
	i := 0
	if quads := m / 4; quads > 0 {
		chunk := min(k16, fp8Chunk)
		scratch := scratchPool.Get().(*[]float32)
		defer scratchPool.Put(scratch)
		if need := matmulTile*chunk + quads*256; cap(*scratch) < need {
			*scratch = make([]float32, need)
		}
		tile := (*scratch)[:matmulTile*chunk]
		sums := (*scratch)[matmulTile*chunk : matmulTile*chunk+quads*256]
		clear(sums)
		quadSums := func(s int) *[16][16]float32 { return (*[16][16]float32)(unsafe.Pointer(&sums[s*256])) }
		for c := 0; c < k16; c += chunk {
			n := min(chunk, k16-c)
			var w [4]unsafe.Pointer
			for r, p := range [4]unsafe.Pointer{p0, p1, p2, p3} {
				w[r] = unsafe.Pointer(&tile[r*chunk])
				fp8Widen(unsafe.Add(p, c), unsafe.Add(sp, 4*(c/kernels.FP8Block)), n, w[r], uintptr(p)+matmulTile*uintptr(k)+uintptr(c))
			}
			for s := range quads {
				fp8Dot4x4(w[0], w[1], w[2], w[3], rowPtr(x[(4*s*k+c):], 3*k+n), n, k, quadSums(s))
			}
		}
		for s := range quads {
			for r := range 4 {
				i = 4*s + r
				fp8Finish(out[i*outStride:], cols, x[i*k:(i+1)*k], q, scales, k, (*[4][16]float32)(quadSums(s)[4*r:]))
			}
		}
		i = 4 * quads
	}
	var acc [4][16]float32
	for ; i < m; i++ {
		fp8Dot4x1(p0, p1, p2, p3, sp, rowPtr(x[i*k:], k), k16, &acc, uintptr(p3)+uintptr(k))
		fp8Finish(out[i*outStride:], cols, x[i*k:(i+1)*k], q, scales, k, &acc)
	}
	archsimd.ClearAVXUpperBits()
}

// fp8MaxSIMDScale bounds the block scales the assembly widening handles.
const fp8MaxSIMDScale = 1 << 8

// fp8SIMDBlocks returns the tile's ceil(k/128) block scales, and false if
// one is beyond what the SIMD widening handles (fp8MaxSIMDScale).
func fp8SIMDBlocks(scales []float32, k int) ([]float32, bool) {
	blocks := scales[:(k+kernels.FP8Block-1)/kernels.FP8Block]
	for _, s := range blocks {
		if math.Abs(float64(s)) >= fp8MaxSIMDScale {
			return nil, false
		}
	}
	return blocks, true
}

// fp8Chunk is how many elements of a tile's four weight rows are widened at
// a time for fours of x rows: 16 KiB of float32 that stay in the L1 cache
// while every four x rows read them (whole rows of Qwen3.6's widths would
// spill to L2 and made 16-row verify slower than bf16's). A multiple of
// the scale block.
const fp8Chunk = 1024

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
// in k order. It also prefetches the 4·n bytes from ahead on (the caller
// passes the next tile's rows), one cache line per 16 elements: widening
// takes so many instructions per byte that the out-of-order window holds
// too few of the loads to keep memory busy, and decode stalled on misses
// at half the bandwidth bf16 weights reach.
//
//go:noescape
func fp8Dot4x1(p0, p1, p2, p3, sp, x unsafe.Pointer, n int, acc *[4][16]float32, ahead uintptr)

// fp8Dot4x4 adds to acc[4s+r], continuing its per-lane FMA chains, x row s
// (stride floats apart) times float32 weight row r over the first n
// elements (a multiple of 16), in fp8Dot4x1's order: chunks of k run one
// after another give the sums of the whole rows.
//
//go:noescape
func fp8Dot4x4(p0, p1, p2, p3, x unsafe.Pointer, n, stride int, acc *[16][16]float32)

// fp8Widen writes the first n (a multiple of 16) dequantised float32
// weights of the E4M3 row at p to dst, as fp8Dot4x1 computes them, and
// prefetches the n bytes from ahead on (the row of the next tile).
//
//go:noescape
func fp8Widen(p, sp unsafe.Pointer, n int, dst unsafe.Pointer, ahead uintptr)
