package cpu

import (
	"fmt"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// fp8Tile is one tile of an FP8 MatMul: four weight rows (their E4M3 bytes,
// k each; a last partial tile repeats its final row) and the scales of
// their block row, ceil(k/128) of them. It sets out[i*outStride+r] for the
// m x rows and the first cols (<= 4) rows. Each output equals rows4's on
// the dequantised weights, q·scale rounded to float32, bit for bit: the
// kernels widen and scale in registers, then run rows4's FMA chain and sum.
type fp8Tile func(out []float32, outStride, cols int, x []float32, m, k int, q *[4][]uint8, scales []float32)

// e4m3Values decodes every E4M3 byte. The NaN patterns read as ±480, as
// the SIMD kernels' half-precision widening reads them (half.E4M3ToF16).
var e4m3Values = func() (t [256]float32) {
	for b := range t {
		t[b] = half.F16ToFloat32(half.E4M3ToF16(uint8(b))) * 256
	}
	return t
}()

// fp8Tiles is matmulTiles for a block-scaled FP8 weight w [n,k]: the
// function that computes a range of tiles of four weight rows.
func (be *Backend) fp8Tiles(out, x []float32, w *kernels.BlockScaled, m, n, k int) func(lo, hi int) {
	if w.Rows != n || w.Cols != k {
		panic(fmt.Sprintf("cpu: MatMul n=%d k=%d on an FP8 weight [%d, %d]", n, k, w.Rows, w.Cols))
	}
	q := asBuffer(w.Q)
	checkDType("MatMul fp8 values", q, kernels.F8E4M3)
	_, blocks := kernels.ScaleBlocks(n, k)
	scales := f32s("MatMul fp8 scales", w.Scale, w.Scale.Len())
	return func(lo, hi int) {
		var rows [4][]uint8
		for t := lo; t < hi; t++ {
			j := t * matmulTile
			for r := range rows {
				row := min(j+r, n-1)
				rows[r] = q.u8[row*k : (row+1)*k]
			}
			br := j / kernels.FP8Block
			be.kern.tileFP8(out[j:], n, min(matmulTile, n-j), x, m, k, &rows, scales[br*blocks:(br+1)*blocks])
		}
	}
}

// tileFP8Portable is the portable fp8Tile: rows4Portable's dot4 chain on
// weights dequantised one element at a time.
func tileFP8Portable(out []float32, outStride, cols int, x []float32, m, k int, q *[4][]uint8, scales []float32) {
	q0, q1, q2, q3 := q[0][:k], q[1][:k], q[2][:k], q[3][:k]
	for i := range m {
		var d [4]float32
		for l, xl := range x[i*k : (i+1)*k] {
			s := scales[l/kernels.FP8Block]
			// The conversions round each dequantised weight to float32, as
			// a dequantised copy would hold it, before the multiply-add.
			d[0] += xl * float32(e4m3Values[q0[l]]*s)
			d[1] += xl * float32(e4m3Values[q1[l]]*s)
			d[2] += xl * float32(e4m3Values[q2[l]]*s)
			d[3] += xl * float32(e4m3Values[q3[l]]*s)
		}
		copy(out[i*outStride:i*outStride+cols], d[:cols])
	}
}
