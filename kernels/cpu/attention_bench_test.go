package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"ddflash/kernels"
)

// BenchmarkAttention times attention on one thread over an F32 cache:
// Qwen3.6-27B's shape (24 query heads, 4 KV heads, head dim 256), a decode
// row and a 64-row prefill chunk after a long prefix; and the mid preset's
// (12 query heads, 2 KV heads, head dim 128), the last 512-token chunk of
// a 4,096-token prefill.
func BenchmarkAttention(b *testing.B) {
	qwen := kernels.AttnShape{NumHeads: 24, NumKVHeads: 4, HeadDim: 256, PageSize: 16, Scale: 0.0625}
	mid := kernels.AttnShape{NumHeads: 12, NumKVHeads: 2, HeadDim: 128, PageSize: 16, Scale: 0.088}
	for _, c := range []struct {
		shape        kernels.AttnShape
		prefix, rows int
	}{{qwen, 8192, 1}, {qwen, 2048, 64}, {mid, 3584, 512}} {
		shape := c.shape
		b.Run(fmt.Sprintf("hd%d-prefix%d-rows%d", shape.HeadDim, c.prefix, c.rows), func(b *testing.B) {
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
