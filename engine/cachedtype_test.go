package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"ddflash/kernels"
	"ddflash/mamba"
)

// TestSpecGreedyIsLosslessPerCacheDType: with each combination of KV
// cache and conv state dtypes, greedy speculative decoding (linear and
// tree, replay and snapshot rollback) reproduces autoregressive decoding on
// the same dtypes token for token: verify rows, the moved tree K/V and
// decode rows read the same rounded keys and values, and a committed conv
// state is rounded once, from the same inputs, whichever way it is reached.
func TestSpecGreedyIsLosslessPerCacheDType(t *testing.T) {
	const ctxLen = 64
	rng := rand.New(rand.NewPCG(91, 92))
	prompts := [][]int32{randomTokens(rng, 5, 290), randomTokens(rng, 30, 290)}
	cases := []specCase{{SpecLinear, 0, mamba.Replay}, {SpecLinear, 0, mamba.Snapshot}, {SpecTree, 8, mamba.Replay}, {SpecTree, 16, mamba.Snapshot}}
	for _, dt := range [][2]kernels.DType{{kernels.BF16, kernels.BF16}, {kernels.BF16, kernels.F32}, {kernels.F32, kernels.BF16}} {
		opts := Options{KVDType: dt[0], ConvDType: dt[1]}
		for pi, prompt := range prompts {
			arOpts := opts
			arOpts.Context = ctxLen
			ar := newTestEngine(t, "tiny", 1, arOpts)
			if got := ar.Model.KV.Shard(0).DType; got != dt[0] {
				t.Fatalf("asked for a %v KV cache, got %v", dt[0], got)
			}
			if got := ar.Model.States.Conv(0, 0, 0).DType(); got != dt[1] {
				t.Fatalf("asked for a %v conv state, got %v", dt[1], got)
			}
			req := Request{Prompt: prompt, MaxTokens: 30}
			want, err := ar.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cases {
				e := specEngineBlock(t, "tiny", 1, c, pathOracle(concat(prompt, want.Tokens)), 0.3, ctxLen, 16, opts)
				got, err := e.Generate(context.Background(), req)
				if err != nil {
					t.Fatalf("KV %v conv %v prompt %d %v: %v", dt[0], dt[1], pi, c, err)
				}
				if !slices.Equal(got.Tokens, want.Tokens) {
					t.Fatalf("KV %v conv %v prompt %d %v: spec output differs from autoregressive\n got %v\nwant %v", dt[0], dt[1], pi, c, got.Tokens, want.Tokens)
				}
			}
		}
	}
}

// TestRefusesBF16RecurrentState: a config asking for a bfloat16 recurrent
// state is refused naming the field, not run in another dtype.
func TestRefusesBF16RecurrentState(t *testing.T) {
	e := newTestEngine(t, "tiny", 1, Options{Context: 32})
	cfg := *e.Model.Cfg
	cfg.SSMStateFP32 = false
	shards := []Shard{{B: e.Model.Backend(), W: e.Model.ranks[0].w}}
	if _, err := New(&cfg, shards, nil, e.ValidVocab, e.EOS, Options{Context: 32}); err == nil || !strings.Contains(err.Error(), "mamba_ssm_dtype") {
		t.Fatalf("a bfloat16 recurrent state: %v, want a refusal naming mamba_ssm_dtype", err)
	}
}
