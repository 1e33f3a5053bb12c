package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"ddflash/kernels"
)

// BenchmarkMatMul measures decode (m=1) and verify-block (m=16) shapes
// and reports GFLOP/s (2·m·n·k per op) and ns per x row: a verify block is
// cheap when its ns/row is far below decode's.
func BenchmarkMatMul(b *testing.B) {
	be := New(0)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		// The default pair's projections (k=192 in, k=512 MLP down) and a larger model's.
		for _, kn := range [][2]int{{192, 512}, {512, 192}, {1024, 1024}, {1024, 4096}} {
			k, n := kn[0], kn[1]
			w := benchWeights(b, be, dt, n*k, rng)
			for _, m := range []int{1, 16} {
				b.Run(fmt.Sprintf("%v/m=%d/k=%d/n=%d", dt, m, k, n), func(b *testing.B) {
					x := benchActivations(b, be, m*k, rng)
					out, _ := be.Alloc(kernels.F32, m*n)
					for b.Loop() {
						be.MatMul(out, x, w, m, n, k)
					}
					b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*m), "ns/row")
				})
			}
		}
	}
}

// benchActivations returns n random normal F32 values.
func benchActivations(b *testing.B, be kernels.Backend, n int, rng *rand.Rand) kernels.Buffer {
	x, _ := be.Alloc(kernels.F32, n)
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	if err := be.UploadF32(x, 0, xs); err != nil {
		b.Fatal(err)
	}
	return x
}

// benchWeights returns n random normal weights of dt (BF16: truncated float32 bits).
func benchWeights(b *testing.B, be kernels.Backend, dt kernels.DType, n int, rng *rand.Rand) kernels.Buffer {
	w, err := be.Alloc(dt, n)
	if err != nil {
		b.Fatal(err)
	}
	raw := make([]byte, 0, n*dt.Size())
	for range n {
		bits := math.Float32bits(float32(rng.NormFloat64()))
		if dt == kernels.BF16 {
			raw = binary.LittleEndian.AppendUint16(raw, uint16(bits>>16))
		} else {
			raw = binary.LittleEndian.AppendUint32(raw, bits)
		}
	}
	if err := be.Upload(w, 0, raw); err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkMatMulFP8 times MatMul with bf16 weights and with the same
// weights block-scaled to FP8, interleaved in one run, on decode (m=1) and
// verify (m=16) shapes, and reports bf16 time / FP8 time.
func BenchmarkMatMulFP8(b *testing.B) {
	be := New(0)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, kn := range [][2]int{{1024, 4096}, {4096, 1024}, {5120, 17408}} {
		k, n := kn[0], kn[1]
		bf16 := benchWeights(b, be, kernels.BF16, n*k, rng)
		fp8 := benchFP8Weights(b, be, n, k, rng)
		for _, m := range []int{1, 16} {
			b.Run(fmt.Sprintf("m=%d/k=%d/n=%d", m, k, n), func(b *testing.B) {
				x, _ := be.Alloc(kernels.F32, m*k)
				out, _ := be.Alloc(kernels.F32, m*n)
				var spent [2]time.Duration
				for b.Loop() {
					for i, w := range []kernels.Buffer{bf16, fp8} {
						t0 := time.Now()
						be.MatMul(out, x, w, m, n, k)
						spent[i] += time.Since(t0)
					}
				}
				b.ReportMetric(spent[0].Seconds()/spent[1].Seconds(), "fp8-speedup")
			})
		}
		be.Free(bf16)
		be.Free(fp8)
	}
}

// benchFP8Weights returns a random FP8 weight [n,k] with unit block scales.
func benchFP8Weights(b *testing.B, be kernels.Backend, n, k int, rng *rand.Rand) kernels.Buffer {
	q, _ := be.Alloc(kernels.F8E4M3, n*k)
	raw := make([]byte, n*k)
	for i := range raw {
		raw[i] = uint8(rng.IntN(256)) &^ 0x40 // exponents up to 2^0: no NaNs
	}
	br, bc := kernels.ScaleBlocks(n, k)
	s, _ := be.Alloc(kernels.F32, br*bc)
	be.Fill(s, 1)
	if err := be.Upload(q, 0, raw); err != nil {
		b.Fatal(err)
	}
	w, err := kernels.NewBlockScaled(q, s, n, k)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkMatMulPrefill times one 512-row prefill forward's MatMul shapes of
// the mid preset (BF16 weights, one thread) and reports GFLOP/s.
func BenchmarkMatMulPrefill(b *testing.B) {
	be := New(1)
	rng := rand.New(rand.NewPCG(1, 2))
	const m = 512
	for _, kn := range [][2]int{{1536, 6144}, {6144, 1536}, {2048, 1536}} {
		k, n := kn[0], kn[1]
		w := benchWeights(b, be, kernels.BF16, n*k, rng)
		x := benchActivations(b, be, m*k, rng)
		out, _ := be.Alloc(kernels.F32, m*n)
		b.Run(fmt.Sprintf("k=%d/n=%d", k, n), func(b *testing.B) {
			for b.Loop() {
				be.MatMul(out, x, w, m, n, k)
			}
			b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkKernelSets times MatMul with every kernel set this build and
// CPU run, in turn within each iteration (so that a shared machine's load
// falls on all alike), on the mid preset's 1536→6144 BF16 projection: a
// decode row (m=1: weights GB/s) and a 16-row verify block (GFLOP/s), on
// two threads, and each SIMD set's speedup over the portable one.
// The weights rotate over copies larger than the L3, so decode reads them
// from memory. Run:
//
//	GOEXPERIMENT=simd go test ./kernels/cpu/ -run '^$' -bench KernelSets -benchtime 20x
func BenchmarkKernelSets(b *testing.B) {
	const k, n, copies = 1536, 6144, 4
	rng := rand.New(rand.NewPCG(1, 2))
	sets := kernelVariants()
	bes := make([]*Backend, len(sets))
	for i, set := range sets {
		bes[i] = newBackend(2, set, defaultMinWork)
	}
	ws := make([]kernels.Buffer, copies)
	for i := range ws {
		ws[i] = benchWeights(b, bes[0], kernels.BF16, n*k, rng)
	}
	for _, m := range []int{1, 16} {
		b.Run(fmt.Sprintf("m=%d", m), func(b *testing.B) {
			x := benchActivations(b, bes[0], m*k, rng)
			out, _ := bes[0].Alloc(kernels.F32, m*n)
			spent := make([]time.Duration, len(sets))
			for i := range b.N {
				for s, be := range bes {
					t0 := time.Now()
					be.MatMul(out, x, ws[(i*len(bes)+s)%copies], m, n, k)
					spent[s] += time.Since(t0)
				}
			}
			for s, set := range sets {
				sec := spent[s].Seconds() / float64(b.N)
				if m == 1 {
					b.ReportMetric(float64(2*n*k)/sec/1e9, set.name+"-GB/s")
				} else {
					b.ReportMetric(float64(2*m*n*k)/sec/1e9, set.name+"-GFLOP/s")
				}
				if s > 0 {
					b.ReportMetric(spent[0].Seconds()/spent[s].Seconds(), set.name+"-speedup")
				}
			}
		})
	}
}
