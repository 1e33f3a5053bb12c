package testmodel

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"ddflash/engine/safetensors"
)

// DraftOptions selects what WriteDrafter produces.
type DraftOptions struct {
	Target Preset // the target the drafter conditions on
	Seed   uint64
	DType  string // "f32" or "bf16" (not fp8); empty means f32
	Layers int    // draft layers; 0 means len(LayerTypes), or 2 without them
	// LayerTypes lists the layers' layer_types in order, by their z-lab
	// names or as "sliding" and "full"; nil means the last layer full
	// attention and the others sliding.
	LayerTypes []string
	BlockSize  int     // query block; 0 means 16 as in the real drafters
	Window     int     // sliding window of the sliding layers; 0 means 3/4 of the target context
	YaRN       float64 // > 1 adds YaRN rope_scaling with this factor over a quarter of the context
	// Intermediate is the SwiGLU width; 0 means the target's.
	Intermediate int
	// Taps are the target layers whose outputs the drafter takes in; nil
	// means one per drafter layer, spread over the target, the last layer
	// included.
	Taps []int
	// DFlash2 writes a DFlash2 drafter in the published layout
	// (architecture DFlash2DraftModel, block_size and the DFlash2 fields in
	// dflash_config, a convolution around every sublayer, the candidate
	// selector): conv_kernel_size 2 and selector_top_k 16 as published,
	// conv_group_size 16 (or the hidden size when smaller) and
	// selector_rank a quarter of the hidden size.
	DFlash2 bool
}

// DFlash2 sizes of testmodel drafters (see DraftOptions.DFlash2).
const (
	dflash2Taps = 2
	dflash2TopK = 16
)

func dflash2GroupSize(hidden int) int { return min(16, hidden) }

func dflash2Rank(hidden int) int { return max(1, hidden/4) }

// draftLayerTypes returns the z-lab layer_types of opt's drafter.
func draftLayerTypes(opt DraftOptions) ([]string, error) {
	if opt.Layers < 0 {
		return nil, fmt.Errorf("test drafter: %d layers", opt.Layers)
	}
	if opt.LayerTypes == nil {
		layers := opt.Layers
		if layers == 0 {
			layers = 2
		}
		types := make([]string, layers)
		for i := range types {
			types[i] = "sliding_attention"
		}
		types[layers-1] = "full_attention"
		return types, nil
	}
	if len(opt.LayerTypes) == 0 || opt.Layers != 0 && opt.Layers != len(opt.LayerTypes) {
		return nil, fmt.Errorf("test drafter: %d layer types for %d layers", len(opt.LayerTypes), opt.Layers)
	}
	types := make([]string, len(opt.LayerTypes))
	for i, name := range opt.LayerTypes {
		switch name {
		case "sliding", "sliding_attention":
			types[i] = "sliding_attention"
		case "full", "full_attention":
			types[i] = "full_attention"
		default:
			return nil, fmt.Errorf("test drafter: layer type %q: want sliding_attention (sliding) or full_attention (full)", name)
		}
	}
	return types, nil
}

// WriteDrafter writes a random DFlash drafter for the target preset in the
// z-lab layout: config.json (a Qwen3 config plus block_size, dflash_config
// and layer_types) and model.safetensors (fc, hidden_norm, norm, layers.N.*;
// no embedding or LM head: the drafter borrows the target's). The mask token
// is the target's last (padding) embedding row.
func WriteDrafter(dir string, opt DraftOptions) error {
	p := opt.Target
	dt, err := checkOptions("test drafter", p, opt.DType)
	if err != nil {
		return err
	}
	if dt.fp8 {
		return fmt.Errorf("test drafter: dtype fp8: DFlash drafters ship in bf16 (choose f32 or bf16)")
	}
	layerTypes, err := draftLayerTypes(opt)
	if err != nil {
		return err
	}
	layers := len(layerTypes)
	block := opt.BlockSize
	if block == 0 {
		block = 16
	}
	window := opt.Window
	if window == 0 {
		window = p.MaxPositions * 3 / 4
	}
	taps, err := draftTaps(opt, layers)
	if err != nil {
		return err
	}
	intermediate := opt.Intermediate
	if intermediate == 0 {
		intermediate = p.Intermediate
	}
	cfg := map[string]any{
		"architectures":           []string{"DFlashDraftModel"},
		"model_type":              "qwen3",
		"hidden_size":             p.Hidden,
		"num_hidden_layers":       layers,
		"num_attention_heads":     p.Heads,
		"num_key_value_heads":     p.KVHeads,
		"head_dim":                p.HeadDim,
		"intermediate_size":       intermediate,
		"hidden_act":              "silu",
		"vocab_size":              p.VocabSize,
		"rms_norm_eps":            1e-6,
		"rope_theta":              10_000_000,
		"rope_scaling":            nil,
		"max_position_embeddings": p.MaxPositions,
		"tie_word_embeddings":     false,
		"attention_bias":          false,
		"block_size":              block,
		"num_target_layers":       p.Layers,
		"layer_types":             layerTypes,
		"sliding_window":          window,
		"dflash_config":           map[string]any{"mask_token_id": p.VocabSize - 1, "target_layer_ids": taps},
		"dtype":                   dt.config,
	}
	if opt.DFlash2 {
		cfg["architectures"] = []string{"DFlash2DraftModel"}
		delete(cfg, "block_size")
		cfg["dflash_config"] = map[string]any{
			"mask_token_id": p.VocabSize - 1, "target_layer_ids": taps, "block_size": block,
			"conv_kernel_size": dflash2Taps, "conv_group_size": dflash2GroupSize(p.Hidden),
			"selector_rank": dflash2Rank(p.Hidden), "selector_top_k": dflash2TopK,
		}
	}
	if opt.YaRN > 1 {
		cfg["rope_scaling"] = map[string]any{
			"rope_type": "yarn", "factor": opt.YaRN, "original_max_position_embeddings": p.MaxPositions / 4,
		}
	}
	data, err := marshalJSON(cfg)
	if err != nil {
		return fmt.Errorf("test drafter: encode config.json: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("test drafter: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		return fmt.Errorf("test drafter: %w", err)
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0xd4af7))
	var tensors []safetensors.Tensor
	tensorPlans := draftPlan(p, layers, len(taps), intermediate)
	if opt.DFlash2 {
		tensorPlans = append(tensorPlans, dflash2Plan(p, layers)...)
	}
	for _, tp := range tensorPlans {
		data, err := encodeTensor(rng, tp, p.VocabSize, dt.tensor)
		if err != nil {
			return fmt.Errorf("test drafter: tensor %s: %w", tp.name, err)
		}
		tensors = append(tensors, safetensors.Tensor{Name: tp.name, DType: dt.tensor, Shape: tp.shape, Data: data})
	}
	return safetensors.WriteCheckpoint(dir, tensors, 1, map[string]string{"format": "pt", "generator": "ddflash testmodel drafter"})
}

// draftTaps are opt's tap layers: as given, or one per drafter layer
// spread over the target, always including its last layer.
func draftTaps(opt DraftOptions, layers int) ([]int, error) {
	p := opt.Target
	if opt.Taps != nil {
		for _, l := range opt.Taps {
			if l < 0 || l >= p.Layers {
				return nil, fmt.Errorf("test drafter: tap layer %d outside the target's %d layers", l, p.Layers)
			}
		}
		return opt.Taps, nil
	}
	taps := make([]int, layers)
	for i := range taps {
		taps[i] = 1 + i*(p.Layers-2)/max(layers-1, 1)
	}
	taps[layers-1] = p.Layers - 1
	return taps, nil
}

// draftPlan lists the drafter's tensors; its norms are Qwen3's plain-weight norms.
func draftPlan(p Preset, layers, taps, intermediate int) []tensorPlan {
	h, q, kv := p.Hidden, p.Heads*p.HeadDim, p.KVHeads*p.HeadDim
	out := []tensorPlan{
		{name: "fc.weight", shape: []int{h, taps * h}, init: initMatrix},
		{name: "hidden_norm.weight", shape: []int{h}, init: initPlainNorm},
		{name: "norm.weight", shape: []int{h}, init: initPlainNorm},
	}
	for i := 0; i < layers; i++ {
		l := fmt.Sprintf("layers.%d.", i)
		for _, t := range []tensorPlan{
			{name: "input_layernorm.weight", shape: []int{h}, init: initPlainNorm},
			{name: "post_attention_layernorm.weight", shape: []int{h}, init: initPlainNorm},
			{name: "self_attn.q_proj.weight", shape: []int{q, h}, init: initMatrix},
			{name: "self_attn.k_proj.weight", shape: []int{kv, h}, init: initMatrix},
			{name: "self_attn.v_proj.weight", shape: []int{kv, h}, init: initMatrix},
			{name: "self_attn.o_proj.weight", shape: []int{h, q}, init: initMatrix},
			{name: "self_attn.q_norm.weight", shape: []int{p.HeadDim}, init: initPlainNorm},
			{name: "self_attn.k_norm.weight", shape: []int{p.HeadDim}, init: initPlainNorm},
			{name: "mlp.gate_proj.weight", shape: []int{intermediate, h}, init: initMatrix},
			{name: "mlp.up_proj.weight", shape: []int{intermediate, h}, init: initMatrix},
			{name: "mlp.down_proj.weight", shape: []int{h, intermediate}, init: initMatrix},
		} {
			t.name = l + t.name
			out = append(out, t)
		}
	}
	return out
}

// dflash2Plan lists what a DFlash2 drafter adds: per layer two
// convolutions (static taps near the identity, small dynamic taps) and the
// candidate selector.
func dflash2Plan(p Preset, layers int) []tensorPlan {
	h, rank := p.Hidden, dflash2Rank(p.Hidden)
	groups := h / dflash2GroupSize(h)
	var out []tensorPlan
	for i := 0; i < layers; i++ {
		for _, conv := range []string{"attention_conv", "mlp_conv"} {
			l := fmt.Sprintf("layers.%d.%s.", i, conv)
			out = append(out,
				tensorPlan{name: l + "base_kernel", shape: []int{2, dflash2Taps, h}, init: initConvBase},
				tensorPlan{name: l + "kernel_projection.weight", shape: []int{2 * dflash2Taps * groups, h}, init: initDynamicTaps})
		}
	}
	return append(out,
		tensorPlan{name: "candidate_selector.hidden_projection.weight", shape: []int{rank, h}, init: initMatrix},
		tensorPlan{name: "candidate_selector.predecessor_codebook", shape: []int{p.VocabSize, rank}, init: initEmbedding},
		tensorPlan{name: "candidate_selector.successor_codebook", shape: []int{p.VocabSize, rank}, init: initEmbedding})
}
