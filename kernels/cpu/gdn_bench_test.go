package cpu

import (
	"math/rand/v2"
	"testing"

	"ddflash/kernels"
)

// BenchmarkGDNChunked times one 512-token prefill forward's chunked GDN for
// the mid preset's shape (8 key heads, 16 value heads of 128) on one thread.
func BenchmarkGDNChunked(b *testing.B) {
	be := New(1)
	rng := rand.New(rand.NewPCG(3, 4))
	shape := kernels.GDNShape{KeyHeads: 8, ValueHeads: 16, KeyDim: 128, ValueDim: 128}
	const T = 512
	qkDim, vDim := shape.KeyHeads*shape.KeyDim, shape.ValueHeads*shape.ValueDim
	uniform := func(n int, lo, hi float64) kernels.Buffer {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(lo + (hi-lo)*rng.Float64())
		}
		buf, _ := be.Alloc(kernels.F32, n)
		if err := be.UploadF32(buf, 0, v); err != nil {
			b.Fatal(err)
		}
		return buf
	}
	// Unit-norm-sized keys and queries, decays in (-1, 0), betas in (0, 1).
	q, k, v := uniform(T*qkDim, -0.09, 0.09), uniform(T*qkDim, -0.09, 0.09), uniform(T*vDim, -1, 1)
	g, beta := uniform(T*shape.ValueHeads, -1, 0), uniform(T*shape.ValueHeads, 0, 1)
	state := uniform(shape.StateLen(), -0.1, 0.1)
	out, _ := be.Alloc(kernels.F32, T*vDim)
	for b.Loop() {
		be.GDNChunked(out, q, k, v, g, beta, state, state, T, 64, shape)
	}
}
