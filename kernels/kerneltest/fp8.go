package kerneltest

import (
	"fmt"
	"math"

	"ddflash/kernels"
)

// testMatMulFP8 checks MatMul on block-scaled FP8 weights against the
// float64 product with the dequantised weights, w = e4m3(q)·scale[i/128][j/128],
// decoded here from the format's definition. Shapes cross partial scale
// blocks in both dimensions, partial tiles of weight rows, vector tails and
// the few-row and many-row paths (up to more than one block of 64 rows).
// Bound: MatMul's, with one more rounding per product for the dequantised
// weight.
func testMatMulFP8(h *harness) {
	shapes := [][3]int{{1, 130, 300}, {1, 8, 256}, {2, 5, 40}, {4, 36, 128}, {9, 260, 136}, {16, 64, 384}, {17, 13, 37}, {70, 70, 200}}
	for _, s := range shapes {
		m, n, k := s[0], s[1], s[2]
		x := h.normal(m*k+3, 1)
		w, wv := h.fp8Weights(n, k)
		outBuf := h.alloc(kernels.F32, m*n+5)
		h.be.MatMul(h.be.Slice(outBuf, 5, m*n), h.be.Slice(h.f32(x), 3, m*k), w, m, n, k)
		want, scale := matmulReference(x[3:], wv, m, n, k)
		got := h.read(outBuf, m*n+5)[5:]
		h.expectClose(fmt.Sprintf("MatMul FP8 m=%d n=%d k=%d", m, n, k), got, want, scale, tolerance{1e-30, (2*float64(k) + 2) * f32Unit})
	}
}

// fp8Weights makes a random block-scaled FP8 weight [n,k]: every E4M3
// pattern but NaN, block scales spread over four orders of magnitude.
// It returns the weight and its exact dequantised values.
func (h *harness) fp8Weights(n, k int) (*kernels.BlockScaled, []float64) {
	h.t.Helper()
	br, bc := kernels.ScaleBlocks(n, k)
	scales := make([]float32, br*bc)
	for i := range scales {
		scales[i] = float32(math.Pow(10, -4+4*h.rng.Float64()))
	}
	raw := make([]byte, n*k)
	exact := make([]float64, n*k)
	for i := range raw {
		b := uint8(h.rng.IntN(256))
		if b&0x7f == 0x7f {
			b &^= 1
		}
		raw[i] = b
		r, c := i/k, i%k
		exact[i] = e4m3Value(b) * float64(scales[(r/kernels.FP8Block)*bc+c/kernels.FP8Block])
	}
	q := h.alloc(kernels.F8E4M3, n*k)
	if err := h.be.Upload(q, 0, raw); err != nil {
		h.t.Fatalf("Upload(F8E4M3): %v", err)
	}
	w, err := kernels.NewBlockScaled(q, h.f32(scales), n, k)
	if err != nil {
		h.t.Fatal(err)
	}
	return w, exact
}

// e4m3Value decodes a float8 E4M3 byte by its definition: sign, 4 exponent
// bits with bias 7 (0: subnormal), 3 mantissa bits.
func e4m3Value(b uint8) float64 {
	exp, mant := int(b>>3&0xf), float64(b&7)
	v := (1 + mant/8) * math.Pow(2, float64(exp-7))
	if exp == 0 {
		v = mant / 8 * math.Pow(2, -6)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return v
}
