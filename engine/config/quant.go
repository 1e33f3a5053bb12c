package config

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"ddflash/kernels"
)

// Quantization is a checkpoint's quantization_config. ddflash reads the
// format of Qwen's FP8 checkpoints: E4M3 weights with one scale per
// 128×128 block (weight-only; activations are computed as usual) for every
// linear layer except the modules in NotConverted.
type Quantization struct {
	// NotConverted lists modules_to_not_convert: module names (tensor names
	// without .weight) that stay unquantised, with everything under them.
	NotConverted []string
}

// Parse reads a config.json body: the architecture (see parseArchitecture)
// and, when present, quantization_config.
func Parse(data []byte) (*Config, error) {
	c, err := parseArchitecture(data)
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if raw, ok := top["quantization_config"]; ok && string(raw) != "null" {
		if c.Quant, err = parseQuantization(raw); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// quantFields are the quantization_config keys ddflash understands; any
// other key could change the meaning of the weights, so it is refused.
var quantFields = []string{"quant_method", "fmt", "activation_scheme", "weight_block_size", "modules_to_not_convert"}

func parseQuantization(raw json.RawMessage) (*Quantization, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("field quantization_config: want an object: %w", err)
	}
	f := fields{m: m, prefix: "quantization_config."}
	for name := range m {
		if !slices.Contains(quantFields, name) {
			return nil, fmt.Errorf("field quantization_config.%s: not supported (ddflash reads %s)", name, strings.Join(quantFields, ", "))
		}
	}
	method, err := f.str("quant_method")
	if err != nil {
		return nil, err
	}
	if method != "fp8" {
		return nil, fmt.Errorf("field quantization_config.quant_method: unsupported %q (ddflash runs fp8 checkpoints)", method)
	}
	// fmt and activation_scheme default, as in transformers, to e4m3 and dynamic.
	if err := f.optionalIs("fmt", "e4m3", "ddflash reads e4m3 weights"); err != nil {
		return nil, err
	}
	if err := f.optionalIs("activation_scheme", "dynamic", `ddflash quantises weights only and needs "dynamic"`); err != nil {
		return nil, err
	}
	if !f.has("weight_block_size") || f.isNull("weight_block_size") {
		return nil, fmt.Errorf("field quantization_config.weight_block_size: missing: per-tensor FP8 scales are not supported (ddflash reads [%d, %d] blocks)", kernels.FP8Block, kernels.FP8Block)
	}
	var block []int
	if err := f.get("weight_block_size", &block, "a list of two integers"); err != nil {
		return nil, err
	}
	if !slices.Equal(block, []int{kernels.FP8Block, kernels.FP8Block}) {
		return nil, fmt.Errorf("field quantization_config.weight_block_size: unsupported %v (ddflash reads [%d, %d] blocks)", block, kernels.FP8Block, kernels.FP8Block)
	}
	q := &Quantization{}
	if f.has("modules_to_not_convert") && !f.isNull("modules_to_not_convert") {
		if err := f.get("modules_to_not_convert", &q.NotConverted, "a list of module names"); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// textPrefixes are the text model's tensor prefixes in multimodal and in
// text-only checkpoints. Module names are compared without them, so a list
// written for one layout applies to the other (Qwen's own list names
// model.embed_tokens next to model.language_model.layers.*).
var textPrefixes = []string{"model.language_model.", "model."}

func trimTextPrefix(name string) string {
	for _, p := range textPrefixes {
		if rest, ok := strings.CutPrefix(name, p); ok {
			return rest
		}
	}
	return name
}

// Quantized says whether the linear module (a tensor name without .weight,
// e.g. model.language_model.layers.0.mlp.gate_proj or lm_head) holds FP8
// weights: false for every module of an unquantised checkpoint, and for
// one in NotConverted or under one. Only linear layers are ever quantised
// (as in transformers); embeddings and norms are not, listed or not. Names
// are whole dotted paths, so "layers.0.mlp.gate" covers neither
// "layers.0.mlp.gate_proj" nor anything else in a dense model: such names
// match nothing, which is fine.
func (q *Quantization) Quantized(module string) bool {
	if q == nil {
		return false
	}
	module = trimTextPrefix(module)
	for _, p := range q.NotConverted {
		p = trimTextPrefix(p)
		if module == p || strings.HasPrefix(module, p+".") {
			return false
		}
	}
	return true
}

// optionalIs checks that the string field, when present, is want.
func (f fields) optionalIs(name, want, why string) error {
	if !f.has(name) {
		return nil
	}
	v, err := f.str(name)
	if err == nil && v != want {
		err = fmt.Errorf("field %s%s: unsupported %q (%s)", f.prefix, name, v, why)
	}
	return err
}
