package config

import (
	"os"
	"strings"
	"testing"
)

// TestQwen36Preset parses the Qwen3.6-27B config.json (the planner's
// embedded copy, written from docs/qwen36-model.md §1) and checks every field and
// derived size against the numbers in that document.
func TestQwen36Preset(t *testing.T) {
	data, err := os.ReadFile("../planner/presets/qwen3.6-27b.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want int
	}{
		{"hidden", c.HiddenSize, 5120}, {"layers", c.NumLayers, 64}, {"intermediate", c.IntermediateSize, 17408},
		{"vocab", c.VocabSize, 248320}, {"heads", c.NumHeads, 24}, {"kv heads", c.NumKVHeads, 4}, {"head dim", c.HeadDim, 256},
		{"rotary dim", c.RotaryDim(), 64}, {"GDN key dim", c.KeyDim(), 2048}, {"GDN value dim", c.ValueDim(), 6144},
		{"conv dim", c.ConvDim(), 10240}, {"conv kernel", c.ConvKernel, 4}, {"full layers", c.NumFull(), 16}, {"GDN layers", c.NumLinear(), 48},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %d, want %d", ch.name, ch.got, ch.want)
		}
	}
	for i, kind := range c.Layers {
		if want := i%4 == 3; (kind == Full) != want {
			t.Fatalf("layer %d is %v", i, kind)
		}
	}
	if c.RopeTheta != 1e7 || !c.AttnOutputGate || c.TieWordEmbeddings || c.SSMDtype != "float32" {
		t.Fatalf("theta %g, gate %v, tied %v, state %s", c.RopeTheta, c.AttnOutputGate, c.TieWordEmbeddings, c.SSMDtype)
	}
}

// flat is a minimal qwen3_5_text config; tests edit it.
const flat = `{"model_type":"qwen3_5_text","hidden_size":64,"num_hidden_layers":4,"intermediate_size":128,
"vocab_size":320,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"linear_num_key_heads":2,
"linear_num_value_heads":4,"linear_key_head_dim":16,"linear_value_head_dim":16,"linear_conv_kernel_dim":4,
"rms_norm_eps":1e-6,"max_position_embeddings":256,"full_attention_interval":2,
"rope_parameters":{"rope_type":"default","rope_theta":10000,"partial_rotary_factor":0.25},"eos_token_id":7}`

func TestFlatConfigAndLayerInterval(t *testing.T) {
	c, err := Parse([]byte(flat))
	if err != nil {
		t.Fatal(err)
	}
	want := []LayerKind{Linear, Full, Linear, Full} // layer i is full iff (i+1)%interval == 0
	for i, k := range want {
		if c.Layers[i] != k {
			t.Fatalf("layer %d: %v, want %v", i, c.Layers[i], k)
		}
	}
	if len(c.EOSTokenIDs) != 1 || c.EOSTokenIDs[0] != 7 || c.RotaryDim() != 4 || c.BOSTokenID != -1 {
		t.Fatalf("eos %v, rotary %d, bos %d", c.EOSTokenIDs, c.RotaryDim(), c.BOSTokenID)
	}
}

// TestErrorsNameTheField breaks one thing at a time and expects the error to
// name what is wrong.
func TestErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, from, to, want string
	}{
		{"missing field", `"hidden_size":64,`, ``, "field hidden_size: missing"},
		{"wrong type", `"head_dim":16`, `"head_dim":"16"`, "field head_dim: want an integer"},
		{"not positive", `"num_hidden_layers":4`, `"num_hidden_layers":0`, "field num_hidden_layers: 0"},
		{"bad layer interval", `"full_attention_interval":2`, `"full_attention_interval":0`, "full_attention_interval: 0"},
		{"unknown layer type", `"full_attention_interval":2`, `"layer_types":["linear_attention","full_attention","mamba","full_attention"]`, `layer_types[2]: unsupported layer type "mamba"`},
		{"layer count", `"full_attention_interval":2`, `"layer_types":["full_attention"]`, "1 entries for num_hidden_layers 4"},
		{"rope type", `"rope_type":"default"`, `"rope_type":"dynamic"`, `rope_parameters.rope_type: unsupported "dynamic"`},
		{"rope theta", `"rope_theta":10000`, `"rope_theta":"x"`, "rope_parameters.rope_theta: want a number"},
		{"hidden act", `"rms_norm_eps"`, `"hidden_act":"gelu_pytorch_tanh","rms_norm_eps"`, `field hidden_act: "gelu_pytorch_tanh" is not supported`},
		{"gqa", `"num_key_value_heads":2`, `"num_key_value_heads":3`, "num_key_value_heads: 3 does not divide"},
		{"architecture", `"qwen3_5_text"`, `"llama"`, `field model_type: unsupported architecture "llama"`},
		{"bad json", `{"model_type"`, `{model_type`, "invalid JSON"},
		{"ssm dtype", `"eos_token_id":7`, `"eos_token_id":7,"mamba_ssm_dtype":"float8"`, `field mamba_ssm_dtype: unsupported "float8"`},
	}
	for _, c := range cases {
		src := strings.Replace(flat, c.from, c.to, 1)
		if src == flat {
			t.Fatalf("%s: edit %q did not apply", c.name, c.from)
		}
		_, err := Parse([]byte(src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
	if _, err := Parse([]byte(`{"model_type":"qwen3_5"}`)); err == nil || !strings.Contains(err.Error(), "field text_config: missing") {
		t.Errorf("wrapper without text_config: %v", err)
	}
	wrapped := `{"model_type":"qwen3_5","tie_word_embeddings":true,"text_config":` + strings.Replace(flat, `"head_dim":16`, `"head_dim":"x"`, 1) + `}`
	if _, err := Parse([]byte(wrapped)); err == nil || !strings.Contains(err.Error(), "field text_config.head_dim") {
		t.Errorf("nested field error should carry the text_config. prefix: %v", err)
	}
}

// TestSSMDtype: mamba_ssm_dtype is read as given, float32 when absent.
func TestSSMDtype(t *testing.T) {
	for _, c := range []struct{ extra, want string }{{``, "float32"}, {`,"mamba_ssm_dtype":"bfloat16"`, "bfloat16"}, {`,"mamba_ssm_dtype":"float32"`, "float32"}} {
		cfg, err := Parse([]byte(strings.Replace(flat, `"eos_token_id":7`, `"eos_token_id":7`+c.extra, 1)))
		if err != nil {
			t.Fatalf("config with %q: %v", c.extra, err)
		}
		if cfg.SSMDtype != c.want {
			t.Errorf("config with %q: dtype %s, want %s", c.extra, cfg.SSMDtype, c.want)
		}
	}
}
