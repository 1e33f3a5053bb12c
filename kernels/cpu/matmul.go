package cpu

import (
	"fmt"
	"sync"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// matmulTile is the number of weight rows loaded together: each weight
// vector loaded feeds every x row of a pair (verify blocks read the weights
// once per pair of rows), and one horizontal reduction yields four outputs.
const matmulTile = 4

// matmulXBlock is the most bytes of x rows that columns runs against its
// weight tiles at a time: a prefill's x (hundreds of rows) would otherwise
// stream from memory once per tile of four weight rows, where a block stays
// in the core's L2 cache while the tiles pass over it.
const matmulXBlock = 1 << 20

// matmulWidenRows is the least number of x rows for which BF16 weight tiles
// are widened into scratch first (decode and verify blocks widen in registers).
const matmulWidenRows = 64

// scratchPool recycles the float32 buffers that hold widened weight tiles.
var scratchPool = sync.Pool{New: func() any { return new([]float32) }}

// MatMul computes out[m,n] = x[m,k]·w[n,k]ᵀ; w is F32, BF16, F16 or
// *kernels.BlockScaled (fp8.go).
func (be *Backend) MatMul(out, x, w kernels.Buffer, m, n, k int) {
	tiles, run := be.matmulTiles(out, x, w, m, n, k)
	be.pool.parallelFor(tiles, m*k*matmulTile, run)
}

// matmulTiles returns MatMul's work as tiles of matmulTile weight rows and
// the function that computes a range of them.
func (be *Backend) matmulTiles(out, x, w kernels.Buffer, m, n, k int) (int, func(lo, hi int)) {
	o := f32s("MatMul out", out, m*n)
	xv := f32s("MatMul x", x, m*k)
	tiles := (n + matmulTile - 1) / matmulTile
	if m == 0 {
		tiles = 0
	}
	if fp8, ok := w.(*kernels.BlockScaled); ok {
		return tiles, be.fp8Tiles(o, xv, fp8, m, n, k)
	}
	wb := asBuffer(w)
	checkLen("MatMul w", wb, n*k)
	if wb.dt == kernels.I32 {
		panic(fmt.Sprintf("cpu: MatMul weights must be F32, BF16 or F16, got %v", wb.dt))
	}
	return tiles, func(lo, hi int) {
		be.kern.columns(o, xv, wb, m, n, k, lo*matmulTile, min(n, hi*matmulTile))
	}
}

// MatMulParts runs MatMul per part, as one parallel loop over all the
// parts' tiles: a decode step's threads meet once for a layer's
// projections instead of once per weight.
func (be *Backend) MatMulParts(x kernels.Buffer, m, k int, parts []kernels.MatMulPart) {
	starts := make([]int, len(parts)+1) // the first tile of each part in the loop
	runs := make([]func(lo, hi int), len(parts))
	for i, p := range parts {
		var tiles int
		tiles, runs[i] = be.matmulTiles(p.Out, x, p.W, m, p.N, k)
		starts[i+1] = starts[i] + tiles
	}
	be.pool.parallelFor(starts[len(parts)], m*k*matmulTile, func(lo, hi int) {
		for i, run := range runs {
			if a, b := max(lo, starts[i]), min(hi, starts[i+1]); a < b {
				run(a-starts[i], b-starts[i])
			}
		}
	})
}

// MatMulGLU runs the gate and up MatMuls, then SwiGLU.
func (be *Backend) MatMulGLU(out, up, x, gate, upW kernels.Buffer, m, n, k int) {
	be.MatMulParts(x, m, k, []kernels.MatMulPart{{W: gate, Out: out, N: n}, {W: upW, Out: up, N: n}})
	be.SwiGLU(out, out, up, m*n)
}

// columns computes output columns [nLo, nHi) of out [m,n]. Each output is
// computed the same way whatever m is (see kernelSet.rows4), so a verify
// row equals the same row decoded alone.
func (kern *kernelSet) columns(out, x []float32, w *buffer, m, n, k, nLo, nHi int) {
	full := nLo + (nHi-nLo)&^(matmulTile-1) // whole tiles end here
	// F16 tiles, and BF16 tiles under many x rows, are widened to float32
	// once per block of x rows (widening is exact, so the sums are the
	// same): a prefill's FMAs then read plain floats.
	widenTiles := w.dt == kernels.F16 || (w.dt == kernels.BF16 && m >= matmulWidenRows)
	var tile []float32
	if widenTiles || full < nHi {
		scratch := scratchPool.Get().(*[]float32)
		defer scratchPool.Put(scratch)
		if cap(*scratch) < matmulTile*k {
			*scratch = make([]float32, matmulTile*k)
		}
		tile = (*scratch)[:matmulTile*k]
	}
	// Blocks of a multiple of four rows keep rows4's grouping of x rows, so
	// every output is computed exactly as without blocks.
	block := max(4, matmulXBlock/(4*k)) &^ 3
	for i := 0; i < m; i += block {
		rows := min(block, m-i)
		o, xb := out[i*n:], x[i*k:(i+rows)*k]
		switch {
		case full == nLo:
		case widenTiles:
			for j := nLo; j < full; j += matmulTile {
				kern.widen(tile, w.u16[j*k:(j+matmulTile)*k], w.dt)
				var next []uint16 // read from memory while this tile runs
				if j+matmulTile < full {
					next = w.u16[(j+matmulTile)*k : (j+2*matmulTile)*k]
				}
				kern.rows4(o[j:], n, xb, rows, k, tile, next)
			}
		case w.dt == kernels.BF16:
			kern.rows4BF16(o[nLo:], n, xb, rows, k, w.u16[nLo*k:full*k])
		default:
			kern.rows4(o[nLo:], n, xb, rows, k, w.f32[nLo*k:full*k], nil)
		}
		if full < nHi { // the last, partial tile
			last := tile[:(nHi-full)*k]
			if w.dt == kernels.F32 {
				copy(last, w.f32[full*k:nHi*k])
			} else {
				kern.widen(last, w.u16[full*k:nHi*k], w.dt)
			}
			for r := range nHi - full {
				for i := range rows {
					o[i*n+full+r] = dot(xb[i*k:(i+1)*k], last[r*k:(r+1)*k])
				}
			}
		}
	}
}

func rows4Portable(out []float32, outStride int, x []float32, m, k int, w []float32, _ []uint16) {
	for j := 0; j*k < len(w); j += 4 {
		w0, w1, w2, w3 := w[j*k:(j+1)*k], w[(j+1)*k:(j+2)*k], w[(j+2)*k:(j+3)*k], w[(j+3)*k:(j+4)*k]
		for i := range m {
			d0, d1, d2, d3 := dot4(x[i*k:(i+1)*k], w0, w1, w2, w3)
			o := out[i*outStride+j : i*outStride+j+4]
			o[0], o[1], o[2], o[3] = d0, d1, d2, d3
		}
	}
}

// rows4BF16Portable is rows4Portable on the widened rows.
func rows4BF16Portable(out []float32, outStride int, x []float32, m, k int, w []uint16) {
	for j := 0; j*k < len(w); j += 4 {
		w0, w1, w2, w3 := w[j*k:(j+1)*k], w[(j+1)*k:(j+2)*k], w[(j+2)*k:(j+3)*k], w[(j+3)*k:(j+4)*k]
		for i := range m {
			var d0, d1, d2, d3 float32
			for l, xl := range x[i*k : (i+1)*k] {
				d0 += xl * half.BF16ToFloat32(w0[l])
				d1 += xl * half.BF16ToFloat32(w1[l])
				d2 += xl * half.BF16ToFloat32(w2[l])
				d3 += xl * half.BF16ToFloat32(w3[l])
			}
			o := out[i*outStride+j : i*outStride+j+4]
			o[0], o[1], o[2], o[3] = d0, d1, d2, d3
		}
	}
}

// dot4 returns the dot products of x with four rows, reading x once.
func dot4(x, w0, w1, w2, w3 []float32) (d0, d1, d2, d3 float32) {
	w0, w1, w2, w3 = w0[:len(x)], w1[:len(x)], w2[:len(x)], w3[:len(x)]
	for i, xi := range x {
		d0 += xi * w0[i]
		d1 += xi * w1[i]
		d2 += xi * w2[i]
		d3 += xi * w3[i]
	}
	return
}

// dot is a plain dot product with four partial sums.
func dot(x, w []float32) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * w[i]
		s1 += x[i+1] * w[i+1]
		s2 += x[i+2] * w[i+2]
		s3 += x[i+3] * w[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * w[i]
	}
	return (s0 + s1) + (s2 + s3)
}
