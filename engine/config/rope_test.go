package config

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"ddflash/internal/closeness"
)

// realConfig reads a real config.json from testdata (see testdata/README.md)
// and applies edit to its text_config.
func realConfig(t *testing.T, name string, edit func(text map[string]any)) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(top["text_config"].(map[string]any))
	}
	out, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRealConfigs parses Qwen3.6-27B's real config.json files: plain RoPE
// with theta 1e7 over 64 of 256 head dims, nothing refused.
func TestRealConfigs(t *testing.T) {
	for _, name := range []string{"qwen3.6-27b", "qwen3.6-27b-fp8"} {
		c, err := Parse(realConfig(t, name, nil))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if c.YaRN != nil || c.RopeTheta != 1e7 || c.RotaryDim() != 64 || c.HeadDim != 256 || c.NumFull() != 16 || c.VocabSize != 248320 {
			t.Errorf("%s: yarn %+v theta %g rotary %d head %d full %d vocab %d", name, c.YaRN, c.RopeTheta, c.RotaryDim(), c.HeadDim, c.NumFull(), c.VocabSize)
		}
	}
}

// TestYaRNConfigs adds YaRN to the real config the ways a user can: the
// legacy rope_scaling block Qwen documents (which replaces rope_parameters,
// as in transformers), or rope_parameters edited in place.
func TestYaRNConfigs(t *testing.T) {
	qwenYaRN := &YaRN{Factor: 4, OriginalMaxPositions: 262144, BetaFast: 32, BetaSlow: 1}
	cases := []struct {
		name string
		edit func(text map[string]any)
		want *YaRN
		err  string
	}{
		{"legacy rope_scaling", func(text map[string]any) {
			text["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144, "rope_theta": 1e7}
		}, qwenYaRN, ""},
		{"legacy type key", func(text map[string]any) {
			text["rope_scaling"] = map[string]any{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144, "rope_theta": 1e7}
		}, qwenYaRN, ""},
		{"rope_parameters in place", func(text map[string]any) {
			rp := text["rope_parameters"].(map[string]any)
			rp["rope_type"], rp["factor"], rp["original_max_position_embeddings"] = "yarn", 4.0, 262144
		}, qwenYaRN, ""},
		{"all optional fields", func(text map[string]any) {
			rp := text["rope_parameters"].(map[string]any)
			rp["rope_type"], rp["factor"], rp["beta_fast"], rp["beta_slow"] = "yarn", 8.0, 16.0, 2.0
			rp["mscale"], rp["mscale_all_dim"], rp["truncate"] = 1.0, 0.5, false
		}, &YaRN{Factor: 8, OriginalMaxPositions: 262144, BetaFast: 16, BetaSlow: 2, Mscale: 1, MscaleAllDim: 0.5, NoTruncate: true}, ""},
		{"rope_scaling drops theta", func(text map[string]any) {
			text["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
		}, nil, "field text_config.rope_parameters.rope_theta: 1e+07 disagrees with 10000"},
		{"null rope_scaling", func(text map[string]any) { text["rope_scaling"] = nil }, nil, ""},
		{"no factor", func(text map[string]any) { text["rope_parameters"].(map[string]any)["rope_type"] = "yarn" }, nil, "field text_config.rope_parameters.factor: missing"},
		{"factor below 1", func(text map[string]any) {
			rp := text["rope_parameters"].(map[string]any)
			rp["rope_type"], rp["factor"] = "yarn", 0.5
		}, nil, "rope_parameters.factor: 0.5"},
		{"zero attention factor", func(text map[string]any) {
			rp := text["rope_parameters"].(map[string]any)
			rp["rope_type"], rp["factor"], rp["attention_factor"] = "yarn", 2.0, 0.0
		}, nil, "rope_parameters.attention_factor: 0"},
		{"unknown rope type", func(text map[string]any) { text["rope_parameters"].(map[string]any)["rope_type"] = "llama3" }, nil, `field text_config.rope_parameters.rope_type: unsupported "llama3"`},
		{"yarn key on default rope", func(text map[string]any) { text["rope_parameters"].(map[string]any)["factor"] = 4.0 }, nil, `field text_config.rope_parameters.factor: not supported with rope_type "default"`},
		{"unknown rope key", func(text map[string]any) {
			rp := text["rope_parameters"].(map[string]any)
			rp["rope_type"], rp["factor"], rp["low_freq_factor"] = "yarn", 2.0, 1.0
		}, nil, `field text_config.rope_parameters.low_freq_factor: not supported with rope_type "yarn"`},
		{"partial rotary disagrees", func(text map[string]any) { text["partial_rotary_factor"] = 0.5 }, nil, "field text_config.partial_rotary_factor: 0.5 disagrees with 0.25"},
	}
	for _, c := range cases {
		got, err := Parse(realConfig(t, "qwen3.6-27b", c.edit))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if (got.YaRN == nil) != (c.want == nil) || got.YaRN != nil && *got.YaRN != *c.want || got.RopeTheta != 1e7 || got.RotaryDim() != 64 {
			t.Errorf("%s: yarn %+v theta %g rotary %d, want yarn %+v theta 1e7 rotary 64", c.name, got.YaRN, got.RopeTheta, got.RotaryDim(), c.want)
		}
	}
}

// TestMathFieldsRefused sets each field that would change the forward pass
// to a value ddflash does not implement and expects the error to name it.
func TestMathFieldsRefused(t *testing.T) {
	for field, value := range map[string]any{"hidden_act": "gelu", "attention_bias": true, "output_gate_type": "sigmoid"} {
		_, err := Parse(realConfig(t, "qwen3.6-27b", func(text map[string]any) { text[field] = value }))
		if want := "field text_config." + field + ": "; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s = %v: error %v, want it to name the field", field, value, err)
		}
	}
}

// TestMissingFieldDefaults drops the fields transformers' Qwen3.5 text
// config gives defaults and expects those defaults: head_dim 256, rotary
// fraction 0.25, theta 10000, a full-attention layer every 4th.
func TestMissingFieldDefaults(t *testing.T) {
	c, err := Parse(realConfig(t, "qwen3.6-27b", func(text map[string]any) {
		for _, k := range []string{"head_dim", "partial_rotary_factor", "rope_parameters", "layer_types", "full_attention_interval"} {
			delete(text, k)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.HeadDim != 256 || c.PartialRotary != 0.25 || c.RopeTheta != 10000 || c.YaRN != nil || c.NumFull() != 16 || c.Layers[3] != Full || c.Layers[4] != Linear {
		t.Errorf("head %d rotary %g theta %g yarn %v full layers %d", c.HeadDim, c.PartialRotary, c.RopeTheta, c.YaRN, c.NumFull())
	}
}

// TestRopeFrequencies checks plain RoPE and YaRN at Qwen3.6-27B's rotary
// dim 64 and theta 1e7 against the formulas, written out independently:
// pair i keeps theta^(-2i/64) below the ramp, is divided by the factor above
// it, and the ramp runs between the pairs that turn beta_fast and beta_slow
// times over the original context.
func TestRopeFrequencies(t *testing.T) {
	const theta, dim, factor, orig = 1e7, 64, 4.0, 262144
	plain, scale := RopeFrequencies(theta, dim, nil)
	if scale != 1 || len(plain) != dim/2 {
		t.Fatalf("plain: %d frequencies, scale %g", len(plain), scale)
	}
	pairAt := func(rotations float64) float64 {
		// wavelength 2π/f = orig/rotations, f = theta^(-2i/dim)
		return math.Log(orig/(rotations*2*math.Pi)) / math.Log(theta) * dim / 2
	}
	low, high := math.Floor(pairAt(32)), math.Ceil(pairAt(1))
	for _, y := range []struct {
		yarn      YaRN
		scale     float64
		low, high float64
	}{
		{YaRN{Factor: factor, OriginalMaxPositions: orig, BetaFast: 32, BetaSlow: 1}, 0.1*math.Log(factor) + 1, low, high},
		{YaRN{Factor: factor, OriginalMaxPositions: orig, BetaFast: 32, BetaSlow: 1, AttentionFactor: 1.5}, 1.5, low, high},
		{YaRN{Factor: factor, OriginalMaxPositions: orig, BetaFast: 32, BetaSlow: 1, Mscale: 1, MscaleAllDim: 0.5},
			(0.1*math.Log(factor) + 1) / (0.05*math.Log(factor) + 1), low, high},
		{YaRN{Factor: factor, OriginalMaxPositions: orig, BetaFast: 32, BetaSlow: 1, NoTruncate: true}, 0.1*math.Log(factor) + 1, pairAt(32), pairAt(1)},
	} {
		freqs, scale := RopeFrequencies(theta, dim, &y.yarn)
		if !closeness.Near(float64(scale), y.scale, 1e-6) {
			t.Errorf("%+v: scale %g, want %g", y.yarn, scale, y.scale)
		}
		for i, f := range freqs {
			want := math.Pow(theta, -2*float64(i)/dim)
			ramp := min(max((float64(i)-y.low)/(y.high-y.low), 0), 1)
			want = want * (1 - ramp + ramp/factor)
			if !closeness.Near(float64(f), want, 1e-6*want) {
				t.Errorf("%+v: pair %d: %g, want %g", y.yarn, i, f, want)
			}
		}
		if freqs[0] != plain[0] || !closeness.Near(float64(freqs[dim/2-1]), float64(plain[dim/2-1])/factor, 1e-6*float64(plain[dim/2-1])) {
			t.Errorf("%+v: the fastest pair must be kept and the slowest divided by the factor", y.yarn)
		}
	}
}
