package dflash

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	"ddflash/engine/config"
)

// The built-in presets live with the planner, which embeds them.
const (
	drafterPreset = "../engine/planner/presets/qwen3.6-27b-dflash.json"
	targetPreset  = "../engine/planner/presets/qwen3.6-27b.json"
)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// edit returns the JSON object in data with fields set (nil deletes a field);
// keys with a dot address dflash_config's fields.
func edit(t *testing.T, data []byte, fields map[string]any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		obj, key := m, k
		if inner, ok := strings.CutPrefix(k, "dflash_config."); ok {
			obj, key = m["dflash_config"].(map[string]any), inner
		}
		if v == nil {
			delete(obj, key)
		} else {
			obj[key] = v
		}
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestParseQwen36Preset(t *testing.T) {
	c, err := ParseConfig(readFile(t, drafterPreset))
	if err != nil {
		t.Fatal(err)
	}
	// docs/dflash-ddtree.md §1.1, Qwen3.6-27B-DFlash column.
	want := &Config{
		HiddenSize: 5120, NumLayers: 5, NumHeads: 32, NumKVHeads: 8, HeadDim: 128,
		IntermediateSize: 17408, VocabSize: 248320, RMSNormEps: 1e-6, RopeTheta: 1e7,
		MaxPositions: 262144, BlockSize: 16, MaskTokenID: 248070,
		TargetLayerIDs: []int{1, 16, 31, 46, 61}, NumTargetLayers: 64,
		Layers:        []LayerKind{SlidingAttention, SlidingAttention, SlidingAttention, SlidingAttention, FullAttention},
		SlidingWindow: 2048, Dtype: "bfloat16",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("parsed\n%+v\nwant\n%+v", c, want)
	}
	for i, causal := range []bool{true, true, true, true, false} {
		if c.LayerCausal(i) != causal {
			t.Errorf("layer %d causal = %v, want %v (sliding layers causal, the full layer not)", i, !causal, causal)
		}
	}
	target, err := config.Parse(readFile(t, targetPreset))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckTarget(target); err != nil {
		t.Errorf("preset drafter rejected for its own target: %v", err)
	}
}

func TestDefaultTargetLayerIDs(t *testing.T) {
	// Expected values from z-lab's Python build_target_layer_ids; (31, 3) has
	// an exact half (14.5) that Python rounds to even.
	cases := []struct {
		target, draft int
		want          []int
	}{
		{64, 5, []int{1, 16, 31, 46, 61}},
		{64, 1, []int{32}},
		{48, 3, []int{1, 23, 45}},
		{31, 3, []int{1, 14, 28}},
		{36, 5, []int{1, 9, 17, 25, 33}},
		{64, 6, []int{1, 13, 25, 37, 49, 61}},
		{40, 8, []int{1, 6, 11, 16, 22, 27, 32, 37}},
		{32, 2, []int{1, 29}},
	}
	for _, c := range cases {
		if got := DefaultTargetLayerIDs(c.target, c.draft); !reflect.DeepEqual(got, c.want) {
			t.Errorf("DefaultTargetLayerIDs(%d, %d) = %v, want %v", c.target, c.draft, got, c.want)
		}
	}
}

func TestParseVariants(t *testing.T) {
	base := readFile(t, drafterPreset)
	cases := []struct {
		name  string
		edits map[string]any
		check func(t *testing.T, c *Config)
	}{
		{"default taps from num_target_layers", map[string]any{"dflash_config.target_layer_ids": nil, "num_target_layers": 48},
			func(t *testing.T, c *Config) {
				if want := []int{1, 12, 23, 34, 45}; !reflect.DeepEqual(c.TargetLayerIDs, want) {
					t.Errorf("taps %v, want %v", c.TargetLayerIDs, want)
				}
			}},
		{"head_dim derived", map[string]any{"head_dim": nil, "hidden_size": 4096},
			func(t *testing.T, c *Config) {
				if c.HeadDim != 128 {
					t.Errorf("head_dim %d, want 4096/32 = 128", c.HeadDim)
				}
			}},
		{"all full attention when layer_types is absent", map[string]any{"layer_types": nil, "sliding_window": nil},
			func(t *testing.T, c *Config) {
				if c.NumSliding() != 0 || len(c.Layers) != 5 || c.SlidingWindow != 0 {
					t.Errorf("layers %v window %d, want 5 full layers", c.Layers, c.SlidingWindow)
				}
			}},
		{"is_causal overrides", map[string]any{"is_causal": false},
			func(t *testing.T, c *Config) {
				if c.LayerCausal(0) {
					t.Error("is_causal=false left sliding layer 0 causal")
				}
			}},
		{"dflash_config.causal overrides", map[string]any{"dflash_config.causal": true},
			func(t *testing.T, c *Config) {
				if !c.LayerCausal(4) {
					t.Error("dflash_config.causal=true left the full layer non-causal")
				}
			}},
		{"yarn in rope_scaling with defaults", map[string]any{
			"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 65536}},
			func(t *testing.T, c *Config) {
				want := &YaRN{Factor: 4, OriginalMaxPositions: 65536, BetaFast: 32, BetaSlow: 1}
				if !reflect.DeepEqual(c.YaRN, want) || c.RopeTheta != 1e7 {
					t.Errorf("yarn %+v theta %g, want %+v theta 1e7", c.YaRN, c.RopeTheta, want)
				}
			}},
		{"yarn in rope_parameters, legacy type key", map[string]any{
			"rope_theta": nil, "rope_scaling": nil,
			"rope_parameters": map[string]any{"type": "yarn", "rope_theta": 1e6, "factor": 2.0,
				"beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.1}},
			func(t *testing.T, c *Config) {
				want := &YaRN{Factor: 2, OriginalMaxPositions: 262144, BetaFast: 16, BetaSlow: 2, AttentionFactor: 1.1}
				if !reflect.DeepEqual(c.YaRN, want) || c.RopeTheta != 1e6 {
					t.Errorf("yarn %+v theta %g, want %+v theta 1e6", c.YaRN, c.RopeTheta, want)
				}
			}},
		{"yarn with mscale, mscale_all_dim and truncate, as the target reads them", map[string]any{
			"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 8.0, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false}},
			func(t *testing.T, c *Config) {
				want := &YaRN{Factor: 8, OriginalMaxPositions: 262144, BetaFast: 32, BetaSlow: 1, Mscale: 0.707, MscaleAllDim: 1, NoTruncate: true}
				if !reflect.DeepEqual(c.YaRN, want) {
					t.Errorf("yarn %+v, want %+v", c.YaRN, want)
				}
				target, err := config.Parse([]byte(`{"model_type":"qwen3_5_text","hidden_size":64,"num_hidden_layers":2,"intermediate_size":128,
"vocab_size":320,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"linear_num_key_heads":2,
"linear_num_value_heads":4,"linear_key_head_dim":16,"linear_value_head_dim":16,"linear_conv_kernel_dim":4,
"rms_norm_eps":1e-6,"max_position_embeddings":262144,"rope_theta":1e7,"partial_rotary_factor":1,
"rope_scaling":{"rope_type":"yarn","factor":8.0,"mscale":0.707,"mscale_all_dim":1.0,"truncate":false}}`))
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(c.YaRN, target.YaRN) {
					t.Errorf("the drafter reads %+v, the target %+v from the same rope_scaling", c.YaRN, target.YaRN)
				}
			}},
		{"default rope type", map[string]any{"rope_scaling": map[string]any{"rope_type": "default"}},
			func(t *testing.T, c *Config) {
				if c.YaRN != nil {
					t.Errorf("yarn %+v for a default RoPE", c.YaRN)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig(edit(t, base, c.edits))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, cfg)
		})
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	base := readFile(t, drafterPreset)
	cases := []struct {
		edits map[string]any
		want  string
	}{
		{map[string]any{"hidden_size": nil}, "field hidden_size: missing"},
		{map[string]any{"num_hidden_layers": nil}, "field num_hidden_layers: missing"},
		{map[string]any{"num_attention_heads": nil}, "field num_attention_heads: missing"},
		{map[string]any{"num_key_value_heads": nil}, "field num_key_value_heads: missing"},
		{map[string]any{"intermediate_size": nil}, "field intermediate_size: missing"},
		{map[string]any{"vocab_size": nil}, "field vocab_size: missing"},
		{map[string]any{"max_position_embeddings": nil}, "field max_position_embeddings: missing"},
		{map[string]any{"block_size": nil}, "field block_size: missing"},
		{map[string]any{"rms_norm_eps": nil}, "field rms_norm_eps: missing"},
		{map[string]any{"rope_theta": nil}, "field rope_theta: missing"},
		{map[string]any{"dflash_config": nil}, "field dflash_config: missing"},
		{map[string]any{"dflash_config.mask_token_id": nil}, "field dflash_config.mask_token_id: missing"},
		{map[string]any{"dflash_config.target_layer_ids": nil, "num_target_layers": nil}, "field num_target_layers: missing"},
		{map[string]any{"dflash_config.target_layer_ids": []int{}}, "target_layer_ids: empty"},
		{map[string]any{"sliding_window": nil}, "field sliding_window: missing"},
		{map[string]any{"hidden_size": "5120"}, "field hidden_size: want a JSON int"},
		{map[string]any{"block_size": 0}, "field block_size: 0, want a positive integer"},
		{map[string]any{"block_size": 1}, "field block_size: 1"},
		{map[string]any{"num_key_value_heads": 7}, "does not divide num_attention_heads"},
		{map[string]any{"head_dim": 127}, "field head_dim: 127 is odd"},
		{map[string]any{"dflash_config.mask_token_id": 248320}, "outside the vocabulary"},
		{map[string]any{"layer_types": []string{"full_attention"}}, "1 entries for num_hidden_layers 5"},
		{map[string]any{"layer_types": []string{"full_attention", "x", "full_attention", "full_attention", "full_attention"}}, `layer_types[1]: unsupported layer type "x"`},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "longrope"}}, `field rope_scaling.rope_type: unsupported "longrope"`},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn"}}, "field rope_scaling.factor: missing"},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 0.5}}, "field rope_scaling.factor: 0.5"},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 2.0, "low_freq_factor": 1.0}}, "field rope_scaling.low_freq_factor: not supported"},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 2.0, "truncate": "no"}}, "field rope_scaling.truncate: want true or false"},
		{map[string]any{"partial_rotary_factor": 0.5}, "field partial_rotary_factor: 0.5"},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6}}, "field rope_theta: 1e+07 disagrees with 1e+06"},
	}
	for _, c := range cases {
		_, err := ParseConfig(edit(t, base, c.edits))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("edits %v: error %v, want one containing %q", c.edits, err, c.want)
		}
	}
	if _, err := ParseConfig([]byte("{")); err == nil || !strings.Contains(err.Error(), "invalid JSON") {
		t.Errorf("truncated JSON: error %v", err)
	}
}

func TestCheckTarget(t *testing.T) {
	target, err := config.Parse(readFile(t, targetPreset))
	if err != nil {
		t.Fatal(err)
	}
	base := readFile(t, drafterPreset)
	cases := []struct {
		edits map[string]any
		want  string
	}{
		{map[string]any{"hidden_size": 4096}, "hidden_size 4096 differs from the target's 5120"},
		{map[string]any{"vocab_size": 151936, "dflash_config.mask_token_id": 151669}, "vocab_size 151936 differs"},
		{map[string]any{"num_target_layers": 48}, "trained for a 48-layer target"},
		{map[string]any{"dflash_config.target_layer_ids": []int{1, 16, 31, 46, 64}}, "target_layer_ids[4] = 64 is outside"},
		{map[string]any{"dflash_config.target_layer_ids": []int{-1, 16, 31, 46, 61}}, "target_layer_ids[0] = -1 is outside"},
	}
	for _, c := range cases {
		d, err := ParseConfig(edit(t, base, c.edits))
		if err != nil {
			t.Fatalf("edits %v: %v", c.edits, err)
		}
		if err := d.CheckTarget(target); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("edits %v: error %v, want one containing %q", c.edits, err, c.want)
		}
	}
}

func TestWeightParams(t *testing.T) {
	c, err := ParseConfig(readFile(t, drafterPreset))
	if err != nil {
		t.Fatal(err)
	}
	// Tensor list of docs/dflash-ddtree.md §1.2, shapes [out, in].
	tensors := [][]float64{
		{5120, 5 * 5120}, {5120}, {5120}, // fc, hidden_norm, norm
	}
	for range 5 {
		tensors = append(tensors,
			[]float64{5120}, []float64{5120}, // input and post-attention norms
			[]float64{4096, 5120}, []float64{1024, 5120}, []float64{1024, 5120}, []float64{5120, 4096},
			[]float64{128}, []float64{128}, // q_norm, k_norm
			[]float64{17408, 5120}, []float64{17408, 5120}, []float64{5120, 17408})
	}
	want := 0.0
	for _, shape := range tensors {
		n := 1.0
		for _, d := range shape {
			n *= d
		}
		want += n
	}
	got := c.WeightParams()
	if float64(got) != want {
		t.Errorf("WeightParams = %d, tensor list sums to %.0f", got, want)
	}
	// The docs round it to 1.73B parameters and 3.46 GB in bf16.
	if b := float64(got) / 1e9; math.Round(b*100)/100 != 1.73 {
		t.Errorf("%.4fB parameters, docs say ~1.73B", b)
	}
	if gb := 2 * float64(got) / 1e9; math.Round(gb*100)/100 != 3.46 {
		t.Errorf("%.4f GB in bf16, docs say 3.46 GB", gb)
	}
}
