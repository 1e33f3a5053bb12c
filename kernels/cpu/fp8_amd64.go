//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"

	"ddflash/kernels"
)

// tileFP8AVX512 is the AVX-512 fp8Tile: fours of x rows in fp8Dot4x4, the
// rest one at a time in fp8Dot4x1, both in assembly (fp8_amd64.s; the half
// to float conversion has no archsimd form). Both leave per-lane partial
// sums that, after the k%16 tail, sum4 adds: rows4's chain and tree on the
// dequantised weights, so every row is bit-identical to the row alone.
func tileFP8AVX512(out []float32, outStride, cols int, x []float32, m, k int, q *[4][]uint8, scales []float32) {
	k16 := k &^ 15
	p0, p1, p2, p3 := rowPtr(q[0], k), rowPtr(q[1], k), rowPtr(q[2], k), rowPtr(q[3], k)
	sp := unsafe.Pointer(unsafe.SliceData(scales[:(k+kernels.FP8Block-1)/kernels.FP8Block]))
	var acc [16][16]float32
	i := 0
	for ; i+4 <= m; i += 4 {
		fp8Dot4x4(p0, p1, p2, p3, sp, rowPtr(x[i*k:], 4*k), k16, k, &acc)
		for s := range 4 {
			fp8Finish(out[(i+s)*outStride:], cols, x[(i+s)*k:(i+s+1)*k], q, scales, k, (*[4][16]float32)(acc[4*s:]))
		}
	}
	for ; i < m; i++ {
		fp8Dot4x1(p0, p1, p2, p3, sp, rowPtr(x[i*k:], k), k16, (*[4][16]float32)(acc[:4]))
		fp8Finish(out[i*outStride:], cols, x[i*k:(i+1)*k], q, scales, k, (*[4][16]float32)(acc[:4]))
	}
	archsimd.ClearAVXUpperBits()
}

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

// fp8Dot4x4 stores to acc[4s+r] the 16 per-lane partial sums of x row s
// (x, rows stride floats apart) times E4M3 weight row r (p0…p3) over the
// first n elements (a multiple of 16): each weight vector widened through
// half precision, multiplied by 256·its block's scale (sp, one per 128
// elements), then one FMA per 16 elements in k order.
//
//go:noescape
func fp8Dot4x4(p0, p1, p2, p3, sp, x unsafe.Pointer, n, stride int, acc *[16][16]float32)

// fp8Dot4x1 is fp8Dot4x4 for one x row.
//
//go:noescape
func fp8Dot4x1(p0, p1, p2, p3, sp, x unsafe.Pointer, n int, acc *[4][16]float32)
