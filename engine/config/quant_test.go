package config

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestQwen36FP8Configs parses Qwen3.6-27B-FP8's config.json and the variant
// whose modules_to_not_convert also names MoE modules absent from the dense
// model: both give the bf16 architecture, and quantise exactly the linear
// layers that the real checkpoint stores in FP8.
func TestQwen36FP8Configs(t *testing.T) {
	bf16, err := os.ReadFile("../planner/presets/qwen3.6-27b.json")
	if err != nil {
		t.Fatal(err)
	}
	arch, err := Parse(bf16)
	if err != nil {
		t.Fatal(err)
	}
	if arch.Quant != nil {
		t.Fatal("the bf16 config parsed with a quantization")
	}
	for _, path := range []string{"../planner/presets/qwen3.6-27b-fp8.json", "testdata/qwen3.6-27b-fp8.with-moe-names.json"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Parse(data)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if c.Quant == nil {
			t.Fatalf("%s: no quantization parsed", path)
		}
		if c.HiddenSize != arch.HiddenSize || c.NumLayers != arch.NumLayers || c.VocabSize != arch.VocabSize || c.IntermediateSize != arch.IntermediateSize {
			t.Errorf("%s: architecture differs from the bf16 config", path)
		}
		const p = "model.language_model."
		quantised := []string{
			p + "layers.0.mlp.gate_proj", p + "layers.0.mlp.up_proj", p + "layers.63.mlp.down_proj",
			p + "layers.3.self_attn.q_proj", p + "layers.3.self_attn.k_proj", p + "layers.3.self_attn.v_proj", p + "layers.3.self_attn.o_proj",
			p + "layers.0.linear_attn.in_proj_qkv", p + "layers.0.linear_attn.in_proj_z", p + "layers.0.linear_attn.out_proj",
			"model.layers.0.mlp.gate_proj", // a text-only checkpoint's names
		}
		kept := []string{
			"lm_head", p + "layers.0.linear_attn.in_proj_a", "model.layers.0.linear_attn.in_proj_a", p + "layers.62.linear_attn.in_proj_b",
			p + "layers.0.linear_attn.conv1d", p + "layers.3.self_attn.q_norm", "model.visual.blocks.0.attn.qkv", "model.visual.anything.below",
			"mtp.fc",
		}
		for _, m := range quantised {
			if !c.Quant.Quantized(m) {
				t.Errorf("%s: %s is not quantised", path, m)
			}
		}
		for _, m := range kept {
			if c.Quant.Quantized(m) {
				t.Errorf("%s: %s is quantised", path, m)
			}
		}
	}
}

// TestQuantizationRefusals checks that every quantization_config ddflash
// cannot run is refused with the field named.
func TestQuantizationRefusals(t *testing.T) {
	base, err := os.ReadFile("../planner/presets/qwen3.6-27b.json")
	if err != nil {
		t.Fatal(err)
	}
	good := map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": []int{128, 128}, "modules_to_not_convert": []string{"lm_head"}}
	cases := []struct {
		change  func(q map[string]any)
		wantErr string // empty: accepted
	}{
		{func(map[string]any) {}, ""},
		{func(q map[string]any) {
			delete(q, "fmt")
			delete(q, "activation_scheme")
			delete(q, "modules_to_not_convert")
		}, ""},
		{func(q map[string]any) { q["modules_to_not_convert"] = nil }, ""},
		{func(q map[string]any) { q["quant_method"] = "gptq" }, "quantization_config.quant_method"},
		{func(q map[string]any) { delete(q, "quant_method") }, "quantization_config.quant_method: missing"},
		{func(q map[string]any) { q["fmt"] = "e5m2" }, "quantization_config.fmt"},
		{func(q map[string]any) { q["activation_scheme"] = "static" }, "quantization_config.activation_scheme"},
		{func(q map[string]any) { q["weight_block_size"] = []int{64, 64} }, "quantization_config.weight_block_size"},
		{func(q map[string]any) { q["weight_block_size"] = []int{128} }, "quantization_config.weight_block_size"},
		{func(q map[string]any) { delete(q, "weight_block_size") }, "per-tensor"},
		{func(q map[string]any) { q["weight_block_size"] = "128" }, "quantization_config.weight_block_size"},
		{func(q map[string]any) { q["modules_to_not_convert"] = "lm_head" }, "quantization_config.modules_to_not_convert"},
		{func(q map[string]any) { q["kv_cache_scheme"] = "fp8" }, "quantization_config.kv_cache_scheme"},
	}
	for i, tc := range cases {
		var top map[string]any
		if err := json.Unmarshal(base, &top); err != nil {
			t.Fatal(err)
		}
		q := map[string]any{}
		for k, v := range good {
			q[k] = v
		}
		tc.change(q)
		top["quantization_config"] = q
		data, _ := json.Marshal(top)
		c, err := Parse(data)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("case %d: %v", i, err)
		case tc.wantErr == "" && c.Quant == nil:
			t.Errorf("case %d: no quantization parsed", i)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("case %d: error %v, want one naming %q", i, err, tc.wantErr)
		}
	}
}
