package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/kernels"
	"ddflash/mamba"
)

// TestSpecGreedyIsLosslessPerKVDType: with a BF16 KV cache, greedy
// speculative decoding (linear and tree, replay and snapshot rollback)
// still reproduces autoregressive decoding on the same cache dtype token
// for token: verify rows, the moved tree K/V and decode rows read the same
// rounded keys and values.
func TestSpecGreedyIsLosslessPerKVDType(t *testing.T) {
	const ctxLen = 64
	rng := rand.New(rand.NewPCG(91, 92))
	prompts := [][]int32{randomTokens(rng, 5, 290), randomTokens(rng, 30, 290)}
	cases := []specCase{{SpecLinear, 0, mamba.Replay}, {SpecLinear, 0, mamba.Snapshot}, {SpecTree, 8, mamba.Replay}, {SpecTree, 16, mamba.Snapshot}}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
		for pi, prompt := range prompts {
			ar := newTestEngine(t, "tiny", 1, Options{Context: ctxLen, KVDType: dt})
			if got := ar.Model.KV.Shard(0).DType; got != dt {
				t.Fatalf("asked for a %v KV cache, got %v", dt, got)
			}
			req := Request{Prompt: prompt, MaxTokens: 30}
			want, err := ar.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cases {
				e := specEngineBlock(t, 1, c, pathOracle(concat(prompt, want.Tokens)), 0.3, ctxLen, 16, Options{KVDType: dt})
				got, err := e.Generate(context.Background(), req)
				if err != nil {
					t.Fatalf("%v prompt %d %v: %v", dt, pi, c, err)
				}
				if !slices.Equal(got.Tokens, want.Tokens) {
					t.Fatalf("%v KV prompt %d %v: spec output differs from autoregressive\n got %v\nwant %v", dt, pi, c, got.Tokens, want.Tokens)
				}
			}
		}
	}
}
