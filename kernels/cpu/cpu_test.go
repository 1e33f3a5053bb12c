package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/kerneltest"
)

// TestConformance runs the suite serially and on three workers that split
// every op however small, with the portable kernels, and with the SIMD ones
// when this build and CPU have them.
func TestConformance(t *testing.T) {
	variants := []kernelSet{portableKernels}
	if simd, ok := simdKernels(); ok {
		variants = append(variants, simd)
	} else {
		t.Log("no SIMD kernels in this build or on this CPU: testing the portable ones only")
	}
	for _, kern := range variants {
		for _, threads := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/threads=%d", kern.name, threads), func(t *testing.T) {
				kerneltest.Run(t, func() kernels.Backend { return newBackend(threads, kern, 1) })
			})
		}
	}
}

// TestMatMulBatchInvariant checks that each row of a multi-row MatMul
// equals the same row computed alone, bit for bit, with every kernel set:
// a speculative verify block then reproduces plain decoding exactly.
func TestMatMulBatchInvariant(t *testing.T) {
	variants := []kernelSet{portableKernels}
	if simd, ok := simdKernels(); ok {
		variants = append(variants, simd)
	}
	const m, n, k = 5, 12, 53
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	xs := make([]float32, m*k)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	raw := make([]byte, 0, 4*n*k)
	for range n * k {
		raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(float32(rng.NormFloat64())))
	}
	for _, kern := range variants {
		be := newBackend(2, kern, 1)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			w, _ := be.Alloc(dt, n*k)
			weightBytes := raw
			if dt == kernels.BF16 { // the top half of each float32
				weightBytes = make([]byte, 0, 2*n*k)
				for i := 0; i < len(raw); i += 4 {
					weightBytes = append(weightBytes, raw[i+2], raw[i+3])
				}
			}
			if err := be.Upload(w, 0, weightBytes); err != nil {
				t.Fatal(err)
			}
			x, _ := be.Alloc(kernels.F32, m*k)
			if err := be.UploadF32(x, 0, xs); err != nil {
				t.Fatal(err)
			}
			all, one := make([]float32, m*n), make([]float32, n)
			out, _ := be.Alloc(kernels.F32, m*n)
			be.MatMul(out, x, w, m, n, k)
			if err := be.DownloadF32(out, 0, all); err != nil {
				t.Fatal(err)
			}
			for i := range m {
				be.MatMul(out, be.Slice(x, i*k, k), w, 1, n, k)
				if err := be.DownloadF32(out, 0, one); err != nil {
					t.Fatal(err)
				}
				for j := range n {
					if one[j] != all[i*n+j] {
						t.Errorf("%s %v: row %d col %d alone = %g, in a batch of %d = %g", kern.name, dt, i, j, one[j], m, all[i*n+j])
					}
				}
			}
		}
	}
}
