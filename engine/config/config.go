// Package config parses Hugging Face config.json files for the Qwen3.5/3.6
// hybrid architecture (Gated DeltaNet + gated full attention).
package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// LayerKind says which token mixer a decoder layer uses.
type LayerKind int

const (
	// Linear is a Gated DeltaNet ("linear_attention") layer.
	Linear LayerKind = iota
	// Full is a gated full-attention layer.
	Full
)

func (k LayerKind) String() string {
	if k == Full {
		return "full_attention"
	}
	return "linear_attention"
}

// Config is the text model's architecture, with every field the engine needs.
type Config struct {
	ModelType string // "qwen3_5_text" after unwrapping

	HiddenSize       int
	NumLayers        int
	IntermediateSize int
	VocabSize        int // embedding rows (padded)
	RMSNormEps       float64
	Layers           []LayerKind

	// Full attention.
	NumHeads       int
	NumKVHeads     int
	HeadDim        int
	AttnOutputGate bool
	RopeTheta      float64
	PartialRotary  float64 // fraction of HeadDim that rotates
	YaRN           *YaRN   // nil for plain RoPE
	MaxPositions   int

	// Gated DeltaNet.
	LinearKeyHeads   int
	LinearValueHeads int
	LinearKeyDim     int
	LinearValueDim   int
	ConvKernel       int

	TieWordEmbeddings bool
	// MTPLayers is mtp_num_hidden_layers: the multi-token-prediction
	// layers the checkpoint ships under mtp.* (0 when absent).
	MTPLayers   int
	EOSTokenIDs []int
	BOSTokenID  int    // -1 when absent
	SSMDtype    string // mamba_ssm_dtype: float32 (the default), bfloat16 or float16
	Dtype       string

	Quant *Quantization // quantization_config; nil for unquantised checkpoints
}

// ssmDtypes are the mamba_ssm_dtype values a config may name.
var ssmDtypes = []string{"float32", "bfloat16", "float16"}

// RotaryDim is the number of leading head dimensions that RoPE rotates.
func (c *Config) RotaryDim() int { return int(float64(c.HeadDim) * c.PartialRotary) }

// KeyDim is the width of the GDN q (and k) projection: key heads × key dim.
func (c *Config) KeyDim() int { return c.LinearKeyHeads * c.LinearKeyDim }

// ValueDim is the width of the GDN v projection and of the gate z.
func (c *Config) ValueDim() int { return c.LinearValueHeads * c.LinearValueDim }

// ConvDim is the number of channels of the GDN causal conv: q | k | v.
func (c *Config) ConvDim() int { return 2*c.KeyDim() + c.ValueDim() }

// NumFull counts the full-attention layers.
func (c *Config) NumFull() int { return c.count(Full) }

// NumLinear counts the Gated DeltaNet layers.
func (c *Config) NumLinear() int { return c.count(Linear) }

func (c *Config) count(k LayerKind) int {
	n := 0
	for _, l := range c.Layers {
		if l == k {
			n++
		}
	}
	return n
}

// Load reads DIR/config.json.
func Load(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read model config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parseArchitecture reads a config.json body: either a multimodal wrapper
// (model_type "qwen3_5", text fields under text_config) or a flat
// "qwen3_5_text" config.
func parseArchitecture(data []byte) (*Config, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	f := fields{m: top}
	modelType, err := f.str("model_type")
	if err != nil {
		return nil, err
	}
	switch modelType {
	case "qwen3_5":
		raw, ok := top["text_config"]
		if !ok {
			return nil, fmt.Errorf("field text_config: missing (model_type qwen3_5 keeps the text model under text_config)")
		}
		var inner map[string]json.RawMessage
		if err := json.Unmarshal(raw, &inner); err != nil {
			return nil, fmt.Errorf("field text_config: %w", err)
		}
		f = fields{m: inner, prefix: "text_config."}
		// tie_word_embeddings sits at the top level of the wrapper.
		c, err := parseText(f)
		if err != nil {
			return nil, err
		}
		if _, ok := top["tie_word_embeddings"]; ok {
			if c.TieWordEmbeddings, err = (fields{m: top}).boolean("tie_word_embeddings"); err != nil {
				return nil, err
			}
		}
		return c, nil
	case "qwen3_5_text":
		return parseText(f)
	default:
		return nil, fmt.Errorf("field model_type: unsupported architecture %q (ddflash runs qwen3_5 and qwen3_5_text)", modelType)
	}
}

func parseText(f fields) (*Config, error) {
	c := &Config{ModelType: "qwen3_5_text", BOSTokenID: -1, SSMDtype: "float32"}
	if err := refuseUnsupportedMath(f); err != nil {
		return nil, err
	}
	ints := []struct {
		name string
		dst  *int
	}{
		{"hidden_size", &c.HiddenSize},
		{"num_hidden_layers", &c.NumLayers},
		{"intermediate_size", &c.IntermediateSize},
		{"vocab_size", &c.VocabSize},
		{"num_attention_heads", &c.NumHeads},
		{"num_key_value_heads", &c.NumKVHeads},
		{"linear_num_key_heads", &c.LinearKeyHeads},
		{"linear_num_value_heads", &c.LinearValueHeads},
		{"linear_key_head_dim", &c.LinearKeyDim},
		{"linear_value_head_dim", &c.LinearValueDim},
		{"linear_conv_kernel_dim", &c.ConvKernel},
	}
	c.HeadDim = defaultHeadDim
	if f.has("head_dim") {
		ints = append(ints, struct {
			name string
			dst  *int
		}{"head_dim", &c.HeadDim})
	}
	for _, it := range ints {
		v, err := f.positiveInt(it.name)
		if err != nil {
			return nil, err
		}
		*it.dst = v
	}
	var err error
	if c.RMSNormEps, err = f.number("rms_norm_eps"); err != nil {
		return nil, err
	}
	if c.MaxPositions, err = f.positiveInt("max_position_embeddings"); err != nil {
		return nil, err
	}
	c.AttnOutputGate = true
	if f.has("attn_output_gate") {
		if c.AttnOutputGate, err = f.boolean("attn_output_gate"); err != nil {
			return nil, err
		}
	}
	if f.has("tie_word_embeddings") {
		if c.TieWordEmbeddings, err = f.boolean("tie_word_embeddings"); err != nil {
			return nil, err
		}
	}
	if f.has("mtp_num_hidden_layers") {
		if c.MTPLayers, err = f.integer("mtp_num_hidden_layers"); err != nil {
			return nil, err
		}
		if c.MTPLayers < 0 {
			return nil, fmt.Errorf("field %smtp_num_hidden_layers: %d is negative", f.prefix, c.MTPLayers)
		}
	}
	if err := parseLayers(f, c); err != nil {
		return nil, err
	}
	if err := parseRope(f, c); err != nil {
		return nil, err
	}
	if f.has("eos_token_id") {
		if c.EOSTokenIDs, err = f.intOrList("eos_token_id"); err != nil {
			return nil, err
		}
	}
	if f.has("bos_token_id") && !f.isNull("bos_token_id") {
		if c.BOSTokenID, err = f.integer("bos_token_id"); err != nil {
			return nil, err
		}
	}
	if f.has("mamba_ssm_dtype") {
		if c.SSMDtype, err = f.str("mamba_ssm_dtype"); err != nil {
			return nil, err
		}
		if !slices.Contains(ssmDtypes, c.SSMDtype) {
			return nil, fmt.Errorf("field %smamba_ssm_dtype: unsupported %q (want one of %s)", f.prefix, c.SSMDtype, strings.Join(ssmDtypes, ", "))
		}
	}
	if f.has("dtype") {
		c.Dtype, _ = f.str("dtype")
	} else if f.has("torch_dtype") {
		c.Dtype, _ = f.str("torch_dtype")
	}
	return c, c.validate(f.prefix)
}

func parseLayers(f fields, c *Config) error {
	if f.has("layer_types") {
		var names []string
		if err := json.Unmarshal(f.m["layer_types"], &names); err != nil {
			return fmt.Errorf("field %slayer_types: want a list of strings: %w", f.prefix, err)
		}
		if len(names) != c.NumLayers {
			return fmt.Errorf("field %slayer_types: %d entries for num_hidden_layers %d", f.prefix, len(names), c.NumLayers)
		}
		for i, n := range names {
			switch n {
			case "linear_attention":
				c.Layers = append(c.Layers, Linear)
			case "full_attention":
				c.Layers = append(c.Layers, Full)
			default:
				return fmt.Errorf("field %slayer_types[%d]: unsupported layer type %q", f.prefix, i, n)
			}
		}
		return nil
	}
	interval := defaultFullAttentionInterval
	if f.has("full_attention_interval") {
		var err error
		if interval, err = f.positiveInt("full_attention_interval"); err != nil {
			return err
		}
	}
	for i := 0; i < c.NumLayers; i++ {
		if (i+1)%interval == 0 {
			c.Layers = append(c.Layers, Full)
		} else {
			c.Layers = append(c.Layers, Linear)
		}
	}
	return nil
}

// parseRope sets the target's RoPE settings (see readRope).
func parseRope(f fields, c *Config) error {
	r, err := readRope(f, c.MaxPositions, Rope{Theta: defaultRopeTheta, PartialRotary: defaultPartialRotary})
	c.RopeTheta, c.PartialRotary, c.YaRN = r.Theta, r.PartialRotary, r.YaRN
	return err
}

// Rope is a config's rotary embedding: theta, the rotated fraction of each
// head and, for the yarn rope type, its scaling.
type Rope struct {
	Theta         float64
	PartialRotary float64
	YaRN          *YaRN // nil for plain RoPE
}

// ParseRope reads the RoPE settings of a config.json object (its top-level
// keys, as raw JSON) as the target's parser does, for other models (the
// drafter): def gives theta and the rotary fraction when absent (Theta 0:
// rope_theta is required); maxPositions is max_position_embeddings.
func ParseRope(object map[string]json.RawMessage, maxPositions int, def Rope) (Rope, error) {
	return readRope(fields{m: object}, maxPositions, def)
}

// readRope reads the RoPE settings as transformers does: a legacy
// rope_scaling object replaces rope_parameters; rope_theta and
// partial_rotary_factor fall back to top-level fields, then to def.
func readRope(f fields, maxPositions int, def Rope) (Rope, error) {
	var r Rope
	var objects []fields // rope_scaling, then rope_parameters, where set and not empty
	for _, key := range []string{"rope_scaling", "rope_parameters"} {
		if !f.has(key) || f.isNull(key) {
			continue
		}
		var inner map[string]json.RawMessage
		if err := json.Unmarshal(f.m[key], &inner); err != nil {
			return r, fmt.Errorf("field %s%s: want an object: %w", f.prefix, key, err)
		}
		if len(inner) > 0 {
			objects = append(objects, fields{m: inner, prefix: f.prefix + key + "."})
		}
	}
	rf := fields{m: map[string]json.RawMessage{}, prefix: f.prefix + "rope_parameters."}
	if len(objects) > 0 {
		rf = objects[0]
	}
	// A rope_parameters that rope_scaling replaces must not hold a theta or
	// rotary fraction that transformers would then drop for the default.
	shadowed := objects[min(1, len(objects)):]
	ropeType := "default"
	for _, key := range []string{"rope_type", "type"} { // "type" in older transformers
		if rf.has(key) {
			var err error
			if ropeType, err = rf.str(key); err != nil {
				return r, err
			}
			break
		}
	}
	known, ok := ropeKeys[ropeType]
	if !ok {
		return r, fmt.Errorf("field %srope_type: unsupported %q (ddflash runs default and yarn RoPE)", rf.prefix, ropeType)
	}
	for key := range rf.m {
		if !known[key] && !ropeKeys["default"][key] {
			return r, fmt.Errorf("field %s%s: not supported with rope_type %q", rf.prefix, key, ropeType)
		}
	}
	var err error
	read := []fields{rf, f}
	if r.Theta, err = agreedNumber(def.Theta, "rope_theta", read, shadowed...); err != nil {
		return r, err
	}
	if r.Theta <= 0 {
		where := f.prefix
		if len(objects) > 0 {
			where = rf.prefix
		}
		if def.Theta == 0 && r.Theta == 0 { // required, and absent
			return r, fmt.Errorf("field %srope_theta: missing", where)
		}
		return r, fmt.Errorf("field %srope_theta: %g, want a positive number", where, r.Theta)
	}
	if r.PartialRotary, err = agreedNumber(def.PartialRotary, "partial_rotary_factor", read, shadowed...); err != nil {
		return r, err
	}
	if ropeType == "yarn" {
		r.YaRN, err = parseYaRN(rf, f, maxPositions)
	}
	return r, err
}

// ropeKeys are the keys of a RoPE object that ddflash reads, by rope type
// (every type also takes the default's); any other key is refused, as it
// would change the math. mrope_* split the rotary pairs over the temporal,
// height and width position streams, which are all equal for text, so text
// runs plain RoPE whatever they say.
var ropeKeys = map[string]map[string]bool{
	"default": {"rope_type": true, "type": true, "rope_theta": true, "partial_rotary_factor": true, "mrope_section": true, "mrope_interleaved": true},
	"yarn": {"factor": true, "original_max_position_embeddings": true, "attention_factor": true, "beta_fast": true, "beta_slow": true,
		"mscale": true, "mscale_all_dim": true, "truncate": true},
}

// parseYaRN reads a yarn RoPE object with transformers' defaults: the
// original context is the model's max_position_embeddings unless given,
// beta_fast 32 and beta_slow 1 (also when 0), truncated ramp bounds.
func parseYaRN(rf, top fields, maxPositions int) (*YaRN, error) {
	y := &YaRN{BetaFast: 32, BetaSlow: 1}
	var err error
	if y.Factor, err = rf.number("factor"); err != nil {
		return nil, err
	}
	if y.Factor < 1 {
		return nil, fmt.Errorf("field %sfactor: %g, YaRN needs at least 1", rf.prefix, y.Factor)
	}
	orig, err := agreedNumber(float64(maxPositions), "original_max_position_embeddings", []fields{rf, top})
	if err != nil {
		return nil, err
	}
	if y.OriginalMaxPositions = int(orig); float64(y.OriginalMaxPositions) != orig || orig <= 0 {
		return nil, fmt.Errorf("field %soriginal_max_position_embeddings: %g, want a positive integer", rf.prefix, orig)
	}
	for _, o := range []struct {
		name string
		dst  *float64
	}{{"beta_fast", &y.BetaFast}, {"beta_slow", &y.BetaSlow}, {"attention_factor", &y.AttentionFactor}, {"mscale", &y.Mscale}, {"mscale_all_dim", &y.MscaleAllDim}} {
		if !rf.has(o.name) || rf.isNull(o.name) {
			continue
		}
		v, err := rf.number(o.name)
		if err != nil {
			return nil, err
		}
		if v != 0 || o.name != "beta_fast" && o.name != "beta_slow" {
			*o.dst = v
		}
	}
	if rf.has("attention_factor") && y.AttentionFactor <= 0 {
		return nil, fmt.Errorf("field %sattention_factor: %g, want a positive number", rf.prefix, y.AttentionFactor)
	}
	if rf.has("truncate") {
		truncate, err := rf.boolean("truncate")
		if err != nil {
			return nil, err
		}
		y.NoTruncate = !truncate
	}
	return y, nil
}

// agreedNumber reads name from the first of read that sets it, else def.
// Every set in read and also that sets it must agree: transformers'
// precedence between these places differs between its versions (or drops
// one), and a silent disagreement would change the math.
func agreedNumber(def float64, name string, read []fields, also ...fields) (float64, error) {
	v, found := def, false
	for i, s := range append(read, also...) {
		if !s.has(name) || s.isNull(name) {
			continue
		}
		w, err := s.number(name)
		if err != nil {
			return 0, err
		}
		if !found && i < len(read) {
			v, found = w, true
		} else if w != v {
			return 0, fmt.Errorf("field %s%s: %g disagrees with %g, the value transformers would use", s.prefix, name, w, v)
		}
	}
	return v, nil
}

// Defaults that transformers' Qwen3.5 text config applies to absent fields.
const (
	defaultHeadDim               = 256
	defaultPartialRotary         = 0.25
	defaultRopeTheta             = 10_000
	defaultFullAttentionInterval = 4
)

// supportedMath lists fields that change the forward pass, with the only
// value ddflash implements (also the default when absent).
var supportedMath = []struct {
	name string
	want any
}{
	{"hidden_act", "silu"},    // the MLP's and the GDN conv's activation
	{"attention_bias", false}, // biases on q, k, v and o
	{"output_gate_type", "swish"},
}

// refuseUnsupportedMath fails on a field of supportedMath set to another value.
func refuseUnsupportedMath(f fields) error {
	for _, s := range supportedMath {
		if !f.has(s.name) || f.isNull(s.name) {
			continue
		}
		var got any
		if err := json.Unmarshal(f.m[s.name], &got); err != nil || got != s.want {
			return fmt.Errorf("field %s%s: %s is not supported (ddflash implements %v)", f.prefix, s.name, f.m[s.name], s.want)
		}
	}
	return nil
}

func (c *Config) validate(prefix string) error {
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("field %shead_dim: %d is odd", prefix, c.HeadDim)
	}
	if c.PartialRotary <= 0 || c.PartialRotary > 1 {
		return fmt.Errorf("field %spartial_rotary_factor: %g is outside (0, 1]", prefix, c.PartialRotary)
	}
	if rd := c.RotaryDim(); rd%2 != 0 || rd == 0 {
		return fmt.Errorf("field %spartial_rotary_factor: rotary dim %d must be even and positive", prefix, rd)
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("field %snum_key_value_heads: %d does not divide num_attention_heads %d", prefix, c.NumKVHeads, c.NumHeads)
	}
	if c.LinearValueHeads%c.LinearKeyHeads != 0 {
		return fmt.Errorf("field %slinear_num_key_heads: %d does not divide linear_num_value_heads %d", prefix, c.LinearKeyHeads, c.LinearValueHeads)
	}
	if c.ConvKernel < 2 {
		return fmt.Errorf("field %slinear_conv_kernel_dim: %d, need at least 2", prefix, c.ConvKernel)
	}
	return nil
}

// fields reads typed values from a JSON object and names the field in errors.
type fields struct {
	m      map[string]json.RawMessage
	prefix string
}

func (f fields) has(name string) bool { _, ok := f.m[name]; return ok }

func (f fields) isNull(name string) bool { return string(f.m[name]) == "null" }

func (f fields) get(name string, dst any, want string) error {
	raw, ok := f.m[name]
	if !ok {
		return fmt.Errorf("field %s%s: missing", f.prefix, name)
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("field %s%s: want %s, got %s", f.prefix, name, want, raw)
	}
	return nil
}

func (f fields) str(name string) (string, error) {
	var s string
	return s, f.get(name, &s, "a string")
}

func (f fields) boolean(name string) (bool, error) {
	var b bool
	return b, f.get(name, &b, "true or false")
}

func (f fields) number(name string) (float64, error) {
	var v float64
	return v, f.get(name, &v, "a number")
}

func (f fields) integer(name string) (int, error) {
	var v int
	return v, f.get(name, &v, "an integer")
}

func (f fields) positiveInt(name string) (int, error) {
	v, err := f.integer(name)
	if err == nil && v <= 0 {
		err = fmt.Errorf("field %s%s: %d, want a positive integer", f.prefix, name, v)
	}
	return v, err
}

func (f fields) intOrList(name string) ([]int, error) {
	var one int
	if err := json.Unmarshal(f.m[name], &one); err == nil {
		return []int{one}, nil
	}
	var list []int
	return list, f.get(name, &list, "an integer or a list of integers")
}
