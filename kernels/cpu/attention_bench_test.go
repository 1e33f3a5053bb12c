package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"ddflash/kernels"
)

// BenchmarkAttention times Qwen3.6-27B's attention shape (24 query heads,
// 4 KV heads, head dim 256) on one thread: a decode row and a 64-row
// prefill chunk after a long prefix, over an F32 cache.
func BenchmarkAttention(b *testing.B) {
	shape := kernels.AttnShape{NumHeads: 24, NumKVHeads: 4, HeadDim: 256, PageSize: 16, Scale: 0.0625}
	for _, c := range []struct{ prefix, rows int }{{8192, 1}, {2048, 64}} {
		b.Run(fmt.Sprintf("prefix%d-rows%d", c.prefix, c.rows), func(b *testing.B) {
			be := New(1)
			rng := rand.New(rand.NewPCG(1, 2))
			total := c.prefix + c.rows
			kvDim, qDim := shape.NumKVHeads*shape.HeadDim, shape.NumHeads*shape.HeadDim
			random := func(n int) kernels.Buffer {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				buf, _ := be.Alloc(kernels.F32, n)
				if err := be.UploadF32(buf, 0, v); err != nil {
					b.Fatal(err)
				}
				return buf
			}
			kc, vc, q := random(total*kvDim), random(total*kvDim), random(c.rows*qDim)
			out, _ := be.Alloc(kernels.F32, c.rows*qDim)
			pages := make([]int32, (total+shape.PageSize-1)/shape.PageSize)
			for i := range pages {
				pages[i] = int32(i)
			}
			pb, _ := be.Alloc(kernels.I32, len(pages))
			if err := be.UploadI32(pb, 0, pages); err != nil {
				b.Fatal(err)
			}
			seqs := []kernels.AttnSeq{{QueryLen: c.rows, Prefix: c.prefix, Pages: pb}}
			b.ResetTimer()
			for b.Loop() {
				be.Attention(out, q, kc, vc, shape, seqs)
			}
		})
	}
}
