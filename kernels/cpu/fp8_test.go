package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// TestMatMulFP8MatchesDequantised checks, with every kernel set, that
// MatMul on a block-scaled FP8 weight equals MatMul on the float32 copy a
// dequantisation would make (q·scale rounded to float32) bit for bit, for
// single rows and every row of multi-row products (whole tiles of weight
// rows: a last partial one is checked for batch invariance), so FP8 weights
// are as batch-invariant as the others and speculation stays lossless.
// k = 2100 spans several of the chunks that fours of x rows widen at a
// time (fp8Chunk), the last one partial, and a k%16 tail.
func TestMatMulFP8MatchesDequantised(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	for _, nk := range [][2]int{{12, 53}, {13, 64}, {130, 256}, {36, 200}, {20, 384}, {8, 2100}} {
		n, k := nk[0], nk[1]
		br, bc := kernels.ScaleBlocks(n, k)
		q, scales := make([]byte, n*k), make([]float32, br*bc)
		for i := range q {
			q[i] = uint8(rng.IntN(256))
		}
		for i := range scales {
			scales[i] = float32(rng.ExpFloat64() * 1e-3)
		}
		deq := make([]float32, n*k)
		for i, b := range q {
			deq[i] = e4m3Values[b] * scales[(i/k/kernels.FP8Block)*bc+i%k/kernels.FP8Block]
		}
		for _, m := range []int{1, 2, 3, 4, 5, 8, 9, 16, 17} {
			xs := make([]float32, m*k)
			for i := range xs {
				xs[i] = float32(rng.NormFloat64())
			}
			for _, kern := range kernelVariants() {
				be := newBackend(2, kern, 1)
				qb, _ := be.Alloc(kernels.F8E4M3, n*k)
				sb, _ := be.Alloc(kernels.F32, br*bc)
				fb, _ := be.Alloc(kernels.F32, n*k)
				for _, err := range []error{be.Upload(qb, 0, q), be.UploadF32(sb, 0, scales), be.UploadF32(fb, 0, deq)} {
					if err != nil {
						t.Fatal(err)
					}
				}
				w, err := kernels.NewBlockScaled(qb, sb, n, k)
				if err != nil {
					t.Fatal(err)
				}
				x, _ := be.Alloc(kernels.F32, m*k)
				if err := be.UploadF32(x, 0, xs); err != nil {
					t.Fatal(err)
				}
				got, want, one := make([]float32, m*n), make([]float32, m*n), make([]float32, n)
				out, _ := be.Alloc(kernels.F32, m*n)
				be.MatMul(out, x, w, m, n, k)
				_ = be.DownloadF32(out, 0, got)
				be.MatMul(out, x, fb, m, n, k)
				_ = be.DownloadF32(out, 0, want)
				name := fmt.Sprintf("%s n=%d k=%d m=%d", kern.name, n, k, m)
				for i := range got {
					if math.IsNaN(float64(got[i])) || math.IsInf(float64(got[i]), 0) {
						t.Fatalf("%s: out[%d] = %v", name, i, got[i])
					}
					// MatMul's other dtypes take a plain dot for a last partial tile.
					if i%n < n&^(matmulTile-1) && math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s: out[%d] = %v, dequantised float32 weights give %v", name, i, got[i], want[i])
					}
				}
				for i := range m {
					be.MatMul(out, be.Slice(x, i*k, k), w, 1, n, k)
					_ = be.DownloadF32(out, 0, one)
					for j := range n {
						if math.Float32bits(one[j]) != math.Float32bits(got[i*n+j]) {
							t.Fatalf("%s: row %d col %d alone = %v, in the block = %v", name, i, j, one[j], got[i*n+j])
						}
					}
				}
			}
		}
	}
}

// TestE4M3TableNaNs pins the two NaN patterns to what the SIMD widening
// reads (±480), so that both kernel sets agree on every byte.
func TestE4M3TableNaNs(t *testing.T) {
	for _, b := range []uint8{0x7f, 0xff} {
		want := float32(480)
		if b&0x80 != 0 {
			want = -480
		}
		if e4m3Values[b] != want {
			t.Errorf("e4m3Values[%#x] = %v, want %v", b, e4m3Values[b], want)
		}
		if !math.IsNaN(float64(half.E4M3ToFloat32(b))) {
			t.Errorf("half.E4M3ToFloat32(%#x) is not NaN", b)
		}
	}
}
