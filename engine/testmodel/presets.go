// Package testmodel writes random Qwen3.5/3.6-architecture checkpoints in the
// real Hugging Face layout (config.json, safetensors, tokenizer.json,
// tokenizer_config.json), for tests and benchmarks without downloads.
package testmodel

import (
	"fmt"

	"ddflash/engine/config"
	"slices"
	"strings"
)

// Preset is the architecture of a generated model.
type Preset struct {
	Name             string
	Hidden           int
	Layers           int
	FullEvery        int // layer i is full attention when (i+1)%FullEvery == 0, as in the real 3:1 pattern
	Intermediate     int
	Heads, KVHeads   int
	HeadDim          int
	PartialRotary    float64
	LinearKeyHeads   int
	LinearValueHeads int
	LinearHeadDim    int // key and value head dim
	ConvKernel       int
	MaxPositions     int
	MaxMerges        int // BPE merges learned from the built-in sample text, at most
	VocabSize        int // embedding rows; above the tokenizer's ids so padding rows exist
}

// Presets are the built-in model sizes. tiny runs in milliseconds in tests;
// small (~115M parameters) is large enough that a decode step is memory-bound;
// mid (~0.65B, GDN value heads twice the key heads) is the bigger model of
// the llama.cpp comparison (scripts/llamacpp-compare.sh);
// tp8 is as tiny, with head counts that split over 2, 4 and 8
// tensor-parallel ranks and only 2 KV heads (replicated beyond TP 2).
// Each has an -h256 sibling with Qwen3.6-27B's head geometry: attention
// heads of 256 (rotary 64) and GDN heads of 128, 3 value heads per key head.
// long-h256 is a narrow model with that geometry and a 40,960-token context,
// for prefills past 32k. qwen36-shapes has Qwen3.6-27B's exact per-layer
// shapes and vocabulary (docs/qwen36-model.md §1) with one GDN and one
// attention layer: 3.3G parameters (6.6 GB in bf16), 77% of them the
// embedding and LM head, for its own package-level test (engine/realshape).
// demo-shapes has the demo pair's target shapes (docs/demo-pair.md: 3 GDN
// and 1 attention layer of 1024, 64M parameters), random, for measuring
// a memory-bound pair whose drafts never pay.
var Presets = []Preset{
	{
		Name: "tiny", Hidden: 64, Layers: 4, FullEvery: 4, Intermediate: 128,
		Heads: 4, KVHeads: 2, HeadDim: 16, PartialRotary: 0.25,
		LinearKeyHeads: 2, LinearValueHeads: 4, LinearHeadDim: 16, ConvKernel: 4,
		MaxPositions: 256, MaxMerges: 41, VocabSize: 320,
	},
	{
		Name: "small", Hidden: 1024, Layers: 8, FullEvery: 4, Intermediate: 3072,
		Heads: 8, KVHeads: 2, HeadDim: 128, PartialRotary: 0.25,
		LinearKeyHeads: 4, LinearValueHeads: 8, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 8192, MaxMerges: 100, VocabSize: 4096, // room for 4,096-token prefill benchmarks
	},
	{
		Name: "mid", Hidden: 1536, Layers: 16, FullEvery: 4, Intermediate: 6144,
		Heads: 12, KVHeads: 2, HeadDim: 128, PartialRotary: 0.25,
		LinearKeyHeads: 8, LinearValueHeads: 16, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 8192, MaxMerges: 100, VocabSize: 4096,
	},
	{
		Name: "tp8", Hidden: 64, Layers: 4, FullEvery: 4, Intermediate: 128,
		Heads: 8, KVHeads: 2, HeadDim: 16, PartialRotary: 0.25,
		LinearKeyHeads: 8, LinearValueHeads: 16, LinearHeadDim: 8, ConvKernel: 4,
		MaxPositions: 256, MaxMerges: 41, VocabSize: 320,
	},
	{
		Name: "tiny-h256", Hidden: 64, Layers: 4, FullEvery: 4, Intermediate: 128,
		Heads: 2, KVHeads: 1, HeadDim: 256, PartialRotary: 0.25,
		LinearKeyHeads: 1, LinearValueHeads: 3, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 256, MaxMerges: 41, VocabSize: 320,
	},
	{
		Name: "small-h256", Hidden: 1024, Layers: 8, FullEvery: 4, Intermediate: 3072,
		Heads: 4, KVHeads: 1, HeadDim: 256, PartialRotary: 0.25,
		LinearKeyHeads: 2, LinearValueHeads: 6, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 4096, MaxMerges: 100, VocabSize: 4096,
	},
	{
		Name: "tp8-h256", Hidden: 64, Layers: 4, FullEvery: 4, Intermediate: 128,
		Heads: 8, KVHeads: 2, HeadDim: 256, PartialRotary: 0.25,
		LinearKeyHeads: 8, LinearValueHeads: 24, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 256, MaxMerges: 41, VocabSize: 320,
	},
	{
		Name: "long-h256", Hidden: 64, Layers: 2, FullEvery: 2, Intermediate: 128,
		Heads: 1, KVHeads: 1, HeadDim: 256, PartialRotary: 0.25,
		LinearKeyHeads: 1, LinearValueHeads: 3, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 40960, MaxMerges: 41, VocabSize: 320,
	},
	{
		Name: "qwen36-shapes", Hidden: 5120, Layers: 2, FullEvery: 2, Intermediate: 17408,
		Heads: 24, KVHeads: 4, HeadDim: 256, PartialRotary: 0.25,
		LinearKeyHeads: 16, LinearValueHeads: 48, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 262144, MaxMerges: 100, VocabSize: 248320,
	},
	{
		Name: "demo-shapes", Hidden: 1024, Layers: 4, FullEvery: 4, Intermediate: 4096,
		Heads: 4, KVHeads: 1, HeadDim: 256, PartialRotary: 0.25,
		LinearKeyHeads: 2, LinearValueHeads: 6, LinearHeadDim: 128, ConvKernel: 4,
		MaxPositions: 512, MaxMerges: 100, VocabSize: 512,
	},
}

// PresetByName finds a preset in Presets.
func PresetByName(name string) (Preset, error) {
	i := slices.IndexFunc(Presets, func(p Preset) bool { return p.Name == name })
	if i < 0 {
		names := make([]string, len(Presets))
		for j, p := range Presets {
			names[j] = p.Name
		}
		return Preset{}, fmt.Errorf("unknown test model preset %q (choose %s)", name, strings.Join(names, ", "))
	}
	return Presets[i], nil
}

// isFull says whether layer i is a full-attention layer.
func (p Preset) isFull(i int) bool { return (i+1)%p.FullEvery == 0 }

// layerKinds lists every layer's kind.
func (p Preset) layerKinds() []config.LayerKind {
	kinds := make([]config.LayerKind, p.Layers)
	for i := range kinds {
		if p.isFull(i) {
			kinds[i] = config.Full
		}
	}
	return kinds
}

func (p Preset) keyDim() int   { return p.LinearKeyHeads * p.LinearHeadDim }
func (p Preset) valueDim() int { return p.LinearValueHeads * p.LinearHeadDim }
func (p Preset) convDim() int  { return 2*p.keyDim() + p.valueDim() }
