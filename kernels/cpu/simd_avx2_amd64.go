//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// avx2Kernels are the kernels for CPUs with AVX2, FMA and F16C but not
// AVX-512 (AMD Zen 1-3, Intel client cores). They compute what the AVX-512 kernels
// compute, bit for bit: each 16-lane vector of those is two 8-lane halves
// (lanes 0-7 and 8-15) doing the same per-lane operations, reductions over
// lanes follow the same trees, and rowmath.Exp8 is Exp16 on 8 lanes. The
// blocking differs (16 YMM registers hold a 4×1 block of 16-lane dot
// products, not the AVX-512 kernels' 4×4), the outputs do not, so a model
// decodes the same tokens on either CPU.
var avx2Kernels = kernelSet{
	name:       "avx2",
	rows4:      rows4AVX2,
	rows4BF16:  rows4BF16AVX2,
	tileFP8:    tileFP8AVX2,
	widen:      widenAVX2,
	swiglu:     swigluAVX2,
	silu:       siluAVX2,
	mulSigmoid: mulSigmoidAVX2,
	deltaStep:  deltaStepAVX2,
	accumRows:  accumRowsAVX2,
	conv:       convAVX2,
	scaledMax:  scaledMaxAVX2,
	scaledExp:  scaledExpAVX2,
	mixRows:    mixRowsAVX2,
}

// avx2Chunk is how many elements of a tile's four weight rows tileAVX2
// widens at a time for several x rows (a multiple of the FP8 scale block):
// 4 KiB of float32 that, with a 16-row verify block's 16 KiB of x, stay
// in the L1 cache (16-row verify blocks ran up to 8 % faster than with
// fp8Chunk's 1,024).
const avx2Chunk = 256

// avx2ThreeRows is the most x rows for which a bfloat16 tile is widened in
// registers, three x rows at a time (dot4x3BF16AVX2), instead of into the
// chunk scratch.
const avx2ThreeRows = 16

// tile4 is one tile of four weight rows, as tileAVX2 reads it.
type tile4 struct {
	// one, when not nil, returns one x row's 16-lane chains over the
	// first k&^15 elements, straight from the weights (a decode step).
	// (one and tail return arrays, as a pointer passed to a func value
	// would move them to the heap.)
	one func(x unsafe.Pointer) [4][16]float32
	// three, when not nil, continues three x rows' chains over the first
	// k&^15 elements straight from the weights (a few-row verify).
	three func(x0, x1, x2 unsafe.Pointer, acc0, acc1, acc2 *[4][16]float32)
	// chunk returns the four rows' elements [c, c+n) as float32 rows,
	// widened into tile (4·n floats) where they are not float32.
	chunk func(c, n int, tile []float32) [4]unsafe.Pointer
	// tail returns row r's last k%16 elements as float32, zero-filled.
	tail func(r int) [16]float32
}

// tileAVX2 sets out[i*outStride+r] = x_i·w_r for the m rows of x [m,k] and
// the first cols rows of the tile t: each the AVX-512 kernels' 16-lane FMA
// chain over k, its k%16 tail and sum4's tree. A single x row with t.one
// runs it (weights widened in registers); otherwise the weights are
// widened avx2Chunk elements at a time into an L1-sized scratch that every
// pair of x rows reads, each x row's chains carried from chunk to chunk in
// the scratch (one chain per output either way: every row is
// bit-identical to the row alone). The tail is one more step of the
// chains, on zero-filled copies of the last k%16 elements, as addTail
// adds it.
func tileAVX2(out []float32, outStride, cols int, x []float32, m, k int, t *tile4) {
	k16 := k &^ 15
	if m == 0 {
		return
	}
	if m == 1 && t.one != nil {
		acc := t.one(rowPtr(x, k))
		var xt [16]float32
		finishAVX2(out, outStride, cols, x, 1, k, t, unsafe.Slice(&acc[0][0], 64), xt[:])
		return
	}
	if m <= avx2ThreeRows && t.three != nil {
		tileThrees(out, outStride, cols, x, m, k, t)
		return
	}
	chunk := min(k16, avx2Chunk)
	scratch := scratchPool.Get().(*[]float32)
	defer scratchPool.Put(scratch)
	if need := matmulTile*chunk + m*(64+16); cap(*scratch) < need {
		*scratch = make([]float32, need)
	}
	tile := (*scratch)[:matmulTile*chunk]
	accs := (*scratch)[matmulTile*chunk : matmulTile*chunk+m*64]
	clear(accs)
	for c := 0; c < k16; c += chunk {
		n := min(chunk, k16-c)
		w := t.chunk(c, n, tile)
		rowPairs(&w, x[c:], k, m, n, accs)
	}
	finishAVX2(out, outStride, cols, x, m, k, t, accs, (*scratch)[matmulTile*chunk+m*64:matmulTile*chunk+m*80])
}

// tileThrees is tileAVX2 for a few x rows of a tile with t.three: three
// rows at a time, a last one or two alongside copies of the first (their
// chains go to a spare accumulator and are dropped).
func tileThrees(out []float32, outStride, cols int, x []float32, m, k int, t *tile4) {
	scratch := scratchPool.Get().(*[]float32)
	defer scratchPool.Put(scratch)
	if need := m*(64+16) + 64; cap(*scratch) < need {
		*scratch = make([]float32, need)
	}
	accs := (*scratch)[:m*64]
	spare := (*[4][16]float32)(unsafe.Pointer(&(*scratch)[m*64]))
	clear(accs)
	acc := func(i int) *[4][16]float32 { return (*[4][16]float32)(unsafe.Pointer(&accs[i*64])) }
	for i := 0; i < m; i += 3 {
		x0, a0 := rowPtr(x[i*k:], k), acc(i)
		x1, a1, x2, a2 := x0, spare, x0, spare
		if i+1 < m {
			x1, a1 = rowPtr(x[(i+1)*k:], k), acc(i+1)
		}
		if i+2 < m {
			x2, a2 = rowPtr(x[(i+2)*k:], k), acc(i+2)
		}
		t.three(x0, x1, x2, a0, a1, a2)
	}
	finishAVX2(out, outStride, cols, x, m, k, t, accs, (*scratch)[m*64+64:m*(64+16)+64])
}

// rowPairs continues the chains accs (m of [4][16]) of the m x rows (k
// apart from x[0]) with the n float32 elements at w of four weight rows:
// pairs of x rows, then a last odd one.
func rowPairs(w *[4]unsafe.Pointer, x []float32, k, m, n int, accs []float32) {
	acc := func(i int) *[4][16]float32 { return (*[4][16]float32)(unsafe.Pointer(&accs[i*64 : (i+1)*64][0])) }
	i := 0
	for ; i+2 <= m; i += 2 {
		dot4x2F32AVX2(w[0], w[1], w[2], w[3], rowPtr(x[i*k:], n), rowPtr(x[(i+1)*k:], n), n, acc(i), acc(i+1))
	}
	if i < m {
		dot4x1F32AVX2(w[0], w[1], w[2], w[3], rowPtr(x[i*k:], n), n, acc(i))
	}
}

// finishAVX2 adds the k%16 tails to the chains accs of the m x rows (in
// xt, zero-filled 16-float copies of them) and stores the sums.
func finishAVX2(out []float32, outStride, cols int, x []float32, m, k int, t *tile4, accs, xt []float32) {
	if k16 := k &^ 15; k16 < k {
		var tails [4][16]float32 // the weight rows' tails
		for r := range tails {
			tails[r] = t.tail(r)
		}
		clear(xt)
		for i := range m {
			copy(xt[i*16:], x[i*k+k16:(i+1)*k])
		}
		w := [4]unsafe.Pointer{unsafe.Pointer(&tails[0]), unsafe.Pointer(&tails[1]), unsafe.Pointer(&tails[2]), unsafe.Pointer(&tails[3])}
		rowPairs(&w, xt, 16, m, 16, accs)
	}
	if cols == 4 {
		_ = out[(m-1)*outStride+3] // the assembly writes rows 0…m-1, columns 0…3
		sums4AVX2(unsafe.Pointer(&accs[0]), m, unsafe.Pointer(&out[0]), outStride)
		return
	}
	for i := range m { // a partial tile: four sums, then the first cols
		var sums [4]float32
		sums4AVX2(unsafe.Pointer(&accs[i*64]), 1, unsafe.Pointer(&sums), 4)
		copy(out[i*outStride:i*outStride+cols], sums[:cols])
	}
}

// rows4AVX2 runs tileAVX2 on each tile of float32 weight rows. (The
// prefill's next tile is left to the hardware prefetcher.)
func rows4AVX2(out []float32, outStride int, x []float32, m, k int, w []float32, _ []uint16) {
	k16 := k &^ 15
	for j := 0; j*k < len(w); j += 4 {
		rows := w[j*k : (j+4)*k]
		p := rowPtr(rows, 4*k)
		tileAVX2(out[j:], outStride, 4, x, m, k, &tile4{
			chunk: func(c, _ int, _ []float32) [4]unsafe.Pointer {
				return [4]unsafe.Pointer{unsafe.Add(p, 4*c), unsafe.Add(p, 4*(k+c)), unsafe.Add(p, 4*(2*k+c)), unsafe.Add(p, 4*(3*k+c))}
			},
			tail: func(r int) (buf [16]float32) {
				copy(buf[:], rows[r*k+k16:(r+1)*k])
				return buf
			},
		})
	}
}

// rows4BF16AVX2 runs tileAVX2 on each tile of bfloat16 weight rows: a
// decode step widens in registers (dot4x1BF16AVX2, prefetching the next
// tile), more x rows widen each chunk once.
func rows4BF16AVX2(out []float32, outStride int, x []float32, m, k int, w []uint16) {
	k16 := k &^ 15
	for j := 0; j*k < len(w); j += 4 {
		rows := w[j*k : (j+4)*k]
		p := rowPtr(rows, 4*k)
		tileAVX2(out[j:], outStride, 4, x, m, k, &tile4{
			one: func(xr unsafe.Pointer) (acc [4][16]float32) {
				dot4x1BF16AVX2(p, unsafe.Add(p, 2*k), unsafe.Add(p, 4*k), unsafe.Add(p, 6*k), xr, k16, uintptr(p)+uintptr(8*k), &acc)
				return acc
			},
			three: func(x0, x1, x2 unsafe.Pointer, a0, a1, a2 *[4][16]float32) {
				dot4x3BF16AVX2(p, uintptr(2*k), x0, x1, x2, k16, uintptr(p)+uintptr(8*k), a0, a1, a2)
			},
			chunk: func(c, n int, tile []float32) (d [4]unsafe.Pointer) {
				for r := range d {
					d[r] = unsafe.Pointer(&tile[r*n : (r+1)*n][0])
					row := unsafe.Add(p, 2*(r*k+c))
					widenBF16AVX2(row, n, d[r], uintptr(row)+uintptr(8*k))
				}
				return d
			},
			tail: func(r int) (buf [16]float32) {
				for l, h := range rows[r*k+k16 : (r+1)*k] {
					buf[l] = half.BF16ToFloat32(h)
				}
				return buf
			},
		})
	}
}

// tileFP8AVX2 is tileFP8AVX512 on tileAVX2: fp8Dot4x1AVX2 for a single x
// row, fp8WidenAVX2's chunks for more (the same widening, 8 lanes at a
// time); a scale of 2^8 or more takes the portable kernel.
func tileFP8AVX2(out []float32, outStride, cols int, x []float32, m, k int, q *[4][]uint8, scales []float32) {
	blocks, ok := fp8SIMDBlocks(scales, k)
	if !ok {
		tileFP8Portable(out, outStride, cols, x, m, k, q, scales)
		return
	}
	k16 := k &^ 15
	sp := unsafe.Pointer(unsafe.SliceData(blocks))
	p := [4]unsafe.Pointer{rowPtr(q[0], k), rowPtr(q[1], k), rowPtr(q[2], k), rowPtr(q[3], k)}
	tileAVX2(out, outStride, cols, x, m, k, &tile4{
		one: func(xr unsafe.Pointer) (acc [4][16]float32) {
			fp8Dot4x1AVX2(p[0], p[1], p[2], p[3], sp, xr, k16, &acc, uintptr(p[3])+uintptr(k))
			return acc
		},
		chunk: func(c, n int, tile []float32) (d [4]unsafe.Pointer) {
			for r := range d {
				d[r] = unsafe.Pointer(&tile[r*n])
				fp8WidenAVX2(unsafe.Add(p[r], c), unsafe.Add(sp, 4*(c/kernels.FP8Block)), n, d[r], uintptr(p[r])+matmulTile*uintptr(k)+uintptr(c))
			}
			return d
		},
		tail: func(r int) (buf [16]float32) {
			s := scales[k16/kernels.FP8Block]
			for l, b := range q[r][k16:k] {
				buf[l] = e4m3Values[b] * s
			}
			return buf
		},
	})
}

// dot4x1BF16AVX2 is dot4x1BF16 on 8-lane halves (dot_avx2_amd64.s).
//
//go:noescape
func dot4x1BF16AVX2(p0, p1, p2, p3, q unsafe.Pointer, n int, next uintptr, acc *[4][16]float32)

// dot4x3BF16AVX2 is dot4x1BF16AVX2 for three x rows, continuing the
// chains in acc0, acc1 and acc2; weight row r is at w + r·wStride.
//
//go:noescape
func dot4x3BF16AVX2(w unsafe.Pointer, wStride uintptr, x0, x1, x2 unsafe.Pointer, n int, next uintptr, acc0, acc1, acc2 *[4][16]float32)

// dot4x1F32AVX2 adds to acc[r], continuing its 16-lane chains, the x row
// times float32 weight row r over the first n elements (a multiple of 16).
//
//go:noescape
func dot4x1F32AVX2(p0, p1, p2, p3, x unsafe.Pointer, n int, acc *[4][16]float32)

// sums4AVX2 stores the lane sums (sum4's tree) of the m [4][16]float32
// chains at acc to four floats at out + i·outStride floats each.
//
//go:noescape
func sums4AVX2(acc unsafe.Pointer, m int, out unsafe.Pointer, outStride int)

// dot4x2F32AVX2 is dot4x1F32AVX2 for two x rows, acc0 and acc1.
//
//go:noescape
func dot4x2F32AVX2(p0, p1, p2, p3, x0, x1 unsafe.Pointer, n int, acc0, acc1 *[4][16]float32)

// widenBF16AVX2 widens n bfloat16s at p (a multiple of 16) to dst,
// prefetching the 2·n bytes at ahead.
//
//go:noescape
func widenBF16AVX2(p unsafe.Pointer, n int, dst unsafe.Pointer, ahead uintptr)

// fp8Dot4x1AVX2 is fp8Dot4x1 on 8-lane halves.
//
//go:noescape
func fp8Dot4x1AVX2(p0, p1, p2, p3, sp, x unsafe.Pointer, n int, acc *[4][16]float32, ahead uintptr)

// fp8WidenAVX2 is fp8Widen on 8-lane halves.
//
//go:noescape
func fp8WidenAVX2(p, sp unsafe.Pointer, n int, dst unsafe.Pointer, ahead uintptr)

// cpuHasF16C reports whether the CPU converts half precision (VCVTPH2PS).
func cpuHasF16C() bool

// widenAVX2 widens bfloat16 weights 8 at a time; F16 takes the portable path.
func widenAVX2(dst []float32, src []uint16, dt kernels.DType) {
	if dt != kernels.BF16 {
		widenInto(dst, src, dt)
		return
	}
	src = src[:len(dst)]
	l := 0
	for ; l+8 <= len(dst); l += 8 {
		archsimd.LoadUint16x8Slice(src[l:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8().StoreSlice(dst[l:])
	}
	archsimd.ClearAVXUpperBits()
	for ; l < len(dst); l++ {
		dst[l] = half.BF16ToFloat32(src[l])
	}
}
