package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"ddflash/kernels"
	"ddflash/mamba"
)

// TestSpecGreedyIsLosslessPerCacheDType: with each combination of KV
// cache, conv state and recurrent state dtypes, greedy speculative decoding
// (linear and tree, replay and snapshot rollback) reproduces autoregressive
// decoding on the same dtypes token for token: verify rows, the moved tree
// K/V and decode rows read the same rounded keys and values; a committed
// conv state is rounded once, from the same inputs, whichever way it is
// reached; and a BF16 recurrent state is rounded after every token, in a
// verify chain, at every tree node, in a replay and in decoding alike.
func TestSpecGreedyIsLosslessPerCacheDType(t *testing.T) {
	const ctxLen = 64
	rng := rand.New(rand.NewPCG(91, 92))
	prompts := [][]int32{randomTokens(rng, 5, 290), randomTokens(rng, 30, 290)}
	cases := []specCase{{SpecLinear, 0, mamba.Replay}, {SpecLinear, 0, mamba.Snapshot}, {SpecTree, 8, mamba.Replay}, {SpecTree, 16, mamba.Snapshot}}
	bf16, f32 := kernels.BF16, kernels.F32
	for _, dt := range []struct {
		kv, conv kernels.DType
		ssm      SSMDType
	}{{bf16, bf16, SSMF32}, {bf16, f32, SSMF32}, {f32, bf16, SSMF32}, {f32, f32, SSMBF16}, {bf16, bf16, SSMBF16}} {
		opts := Options{KVDType: dt.kv, ConvDType: dt.conv, SSMDType: dt.ssm}
		wantSSM := map[SSMDType]kernels.DType{SSMF32: f32, SSMBF16: bf16}[dt.ssm]
		name := fmt.Sprintf("KV %v conv %v recurrent %v", dt.kv, dt.conv, wantSSM)
		for pi, prompt := range prompts {
			arOpts := opts
			arOpts.Context = ctxLen
			ar := newTestEngine(t, "tiny", 1, arOpts)
			states := ar.Model.States
			if got := [3]kernels.DType{ar.Model.KV.Shard(0).DType, states.Conv(0, 0, 0).DType(), states.SSM(0, 0, 0).DType()}; got != [3]kernels.DType{dt.kv, dt.conv, wantSSM} {
				t.Fatalf("asked for %s, got %v", name, got)
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
					t.Fatalf("%s prompt %d %v: %v", name, pi, c, err)
				}
				if !slices.Equal(got.Tokens, want.Tokens) {
					t.Fatalf("%s prompt %d %v: spec output differs from autoregressive\n got %v\nwant %v", name, pi, c, got.Tokens, want.Tokens)
				}
			}
		}
	}
}

// TestRecurrentStateDTypeFollowsConfig: without a choice in Options the
// recurrent state is stored as config.json's mamba_ssm_dtype says; a choice
// overrides it; a dtype the engine cannot store is refused naming the field.
func TestRecurrentStateDTypeFollowsConfig(t *testing.T) {
	e := newTestEngine(t, "tiny", 1, Options{Context: 32})
	shards := []Shard{{B: e.Model.Backend(), W: e.Model.ranks[0].w}}
	for _, c := range []struct {
		config string
		choice SSMDType
		want   kernels.DType
	}{
		{"float32", SSMFromConfig, kernels.F32},
		{"bfloat16", SSMFromConfig, kernels.BF16},
		{"bfloat16", SSMF32, kernels.F32},
		{"float32", SSMBF16, kernels.BF16},
	} {
		cfg := *e.Model.Cfg
		cfg.SSMDtype = c.config
		got, err := New(&cfg, shards, nil, e.ValidVocab, e.EOS, Options{Context: 32, SSMDType: c.choice})
		if err != nil {
			t.Fatalf("config %s, choice %d: %v", c.config, c.choice, err)
		}
		if dt := got.Model.States.SSM(0, 0, 0).DType(); dt != c.want {
			t.Errorf("config %s, choice %d: a %v recurrent state, want %v", c.config, c.choice, dt, c.want)
		}
		got.Model.States.Close()
		got.Model.KV.Close()
	}
	cfg := *e.Model.Cfg
	cfg.SSMDtype = "float16"
	if _, err := New(&cfg, shards, nil, e.ValidVocab, e.EOS, Options{Context: 32}); err == nil || !strings.Contains(err.Error(), "mamba_ssm_dtype float16") {
		t.Fatalf("a float16 recurrent state: %v, want a refusal naming mamba_ssm_dtype", err)
	}
}
