// Package dflash implements the DFlash block-diffusion drafter.
package dflash

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"ddflash/engine/config"
)

// LayerKind says how a drafter layer attends.
type LayerKind int

const (
	// FullAttention layers see every context key (non-causal by default).
	FullAttention LayerKind = iota
	// SlidingAttention layers see the last SlidingWindow positions (causal by default).
	SlidingAttention
)

func (k LayerKind) String() string {
	if k == SlidingAttention {
		return "sliding_attention"
	}
	return "full_attention"
}

// YaRN holds the rope_scaling fields of a "yarn" RoPE.
type YaRN struct {
	Factor               float64
	OriginalMaxPositions int
	BetaFast             float64
	BetaSlow             float64
	AttentionFactor      float64 // 0 when the config leaves it to the default 0.1·ln(factor)+1
}

// Config is a z-lab DFlash drafter config.json: a plain Qwen3 decoder config
// plus block_size and a dflash_config object.
type Config struct {
	HiddenSize       int
	NumLayers        int
	NumHeads         int
	NumKVHeads       int
	HeadDim          int
	IntermediateSize int
	VocabSize        int
	RMSNormEps       float64
	RopeTheta        float64
	YaRN             *YaRN // nil without rope scaling
	MaxPositions     int

	BlockSize       int   // query block: one anchor and BlockSize-1 mask tokens
	MaskTokenID     int   // dflash_config.mask_token_id
	TargetLayerIDs  []int // 0-based target layers whose outputs feed the drafter
	NumTargetLayers int   // 0 when absent; only the default tap formula needs it

	Layers        []LayerKind
	SlidingWindow int   // 0 when no layer slides
	Causal        *bool // is_causal (or dflash_config.causal) when the config sets it
	Dtype         string
}

// LayerCausal reports whether layer i masks future block positions: sliding
// layers are causal and full layers are not, unless the config overrides it.
func (c *Config) LayerCausal(i int) bool {
	if c.Causal != nil {
		return *c.Causal
	}
	return c.Layers[i] == SlidingAttention
}

// NumSliding counts the sliding-window layers.
func (c *Config) NumSliding() int {
	n := 0
	for _, k := range c.Layers {
		if k == SlidingAttention {
			n++
		}
	}
	return n
}

// DefaultTargetLayerIDs is z-lab's build_target_layer_ids: one draft layer taps
// the middle target layer; otherwise the taps are spread evenly over
// [1, targetLayers-3], rounded half to even as Python's round does.
func DefaultTargetLayerIDs(targetLayers, draftLayers int) []int {
	if draftLayers == 1 {
		return []int{targetLayers / 2}
	}
	start, end := 1, targetLayers-3
	span := float64(end - start)
	ids := make([]int, draftLayers)
	for i := range ids {
		ids[i] = int(math.RoundToEven(float64(start) + float64(i)*span/float64(draftLayers-1)))
	}
	return ids
}

// Load reads DIR/config.json.
func Load(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read drafter config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("drafter %s: %w", path, err)
	}
	return c, nil
}

// Parse reads a drafter config.json body.
func Parse(data []byte) (*Config, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	f := fields{m: top}
	c := &Config{}
	ints := []struct {
		name string
		dst  *int
	}{
		{"hidden_size", &c.HiddenSize},
		{"num_hidden_layers", &c.NumLayers},
		{"num_attention_heads", &c.NumHeads},
		{"num_key_value_heads", &c.NumKVHeads},
		{"intermediate_size", &c.IntermediateSize},
		{"vocab_size", &c.VocabSize},
		{"max_position_embeddings", &c.MaxPositions},
		{"block_size", &c.BlockSize},
	}
	for _, it := range ints {
		v, err := f.positiveInt(it.name)
		if err != nil {
			return nil, err
		}
		*it.dst = v
	}
	var err error
	// Qwen3Config derives head_dim from the hidden size when it is absent.
	c.HeadDim = c.HiddenSize / c.NumHeads
	if f.present("head_dim") {
		if c.HeadDim, err = f.positiveInt("head_dim"); err != nil {
			return nil, err
		}
	}
	if c.RMSNormEps, err = f.number("rms_norm_eps"); err != nil {
		return nil, err
	}
	if f.present("num_target_layers") {
		if c.NumTargetLayers, err = f.positiveInt("num_target_layers"); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{"dtype", "torch_dtype"} {
		if f.present(name) && c.Dtype == "" {
			if c.Dtype, err = f.str(name); err != nil {
				return nil, err
			}
		}
	}
	steps := []func(fields, *Config) error{parseRope, parseDFlash, parseLayerTypes}
	for _, step := range steps {
		if err := step(f, c); err != nil {
			return nil, err
		}
	}
	return c, c.validate()
}

// parseRope reads rope_theta and rope_scaling, or the newer rope_parameters
// object that holds both.
func parseRope(f fields, c *Config) error {
	scaling := f
	thetaFrom := f
	switch {
	case f.present("rope_parameters"):
		inner, err := f.object("rope_parameters")
		if err != nil {
			return err
		}
		scaling, thetaFrom = inner, inner
	case f.present("rope_scaling"):
		inner, err := f.object("rope_scaling")
		if err != nil {
			return err
		}
		scaling = inner
	}
	var err error
	if c.RopeTheta, err = thetaFrom.number("rope_theta"); err != nil {
		return err
	}
	if scaling.m == nil || (!scaling.present("rope_type") && !scaling.present("type")) {
		return nil // no scaling: plain RoPE
	}
	typeField := "rope_type"
	if !scaling.present(typeField) {
		typeField = "type" // older transformers releases
	}
	kind, err := scaling.str(typeField)
	if err != nil {
		return err
	}
	switch kind {
	case "default":
		return nil
	case "yarn":
		c.YaRN, err = parseYaRN(scaling, c.MaxPositions)
		return err
	default:
		return fmt.Errorf("field %s%s: unsupported RoPE type %q (ddflash supports default and yarn)", scaling.prefix, typeField, kind)
	}
}

// parseYaRN applies transformers' defaults: beta_fast 32, beta_slow 1, and the
// model's max_position_embeddings as the original length.
func parseYaRN(f fields, maxPositions int) (*YaRN, error) {
	y := &YaRN{OriginalMaxPositions: maxPositions, BetaFast: 32, BetaSlow: 1}
	var err error
	if y.Factor, err = f.number("factor"); err != nil {
		return nil, err
	}
	if y.Factor < 1 {
		return nil, fmt.Errorf("field %sfactor: %g, YaRN needs a factor of at least 1", f.prefix, y.Factor)
	}
	if f.present("original_max_position_embeddings") {
		if y.OriginalMaxPositions, err = f.positiveInt("original_max_position_embeddings"); err != nil {
			return nil, err
		}
	}
	optional := []struct {
		name string
		dst  *float64
	}{{"beta_fast", &y.BetaFast}, {"beta_slow", &y.BetaSlow}, {"attention_factor", &y.AttentionFactor}}
	for _, o := range optional {
		if f.present(o.name) {
			if *o.dst, err = f.number(o.name); err != nil {
				return nil, err
			}
		}
	}
	return y, nil
}

func parseDFlash(f fields, c *Config) error {
	d, err := f.object("dflash_config")
	if err != nil {
		return err
	}
	if c.MaskTokenID, err = d.integer("mask_token_id"); err != nil {
		return err
	}
	if d.present("target_layer_ids") {
		if c.TargetLayerIDs, err = d.intList("target_layer_ids"); err != nil {
			return err
		}
		if len(c.TargetLayerIDs) == 0 {
			return fmt.Errorf("field dflash_config.target_layer_ids: empty, the drafter needs at least one target layer")
		}
	} else {
		if c.NumTargetLayers == 0 {
			return fmt.Errorf("field num_target_layers: missing (needed for the default target_layer_ids, which dflash_config does not set)")
		}
		c.TargetLayerIDs = DefaultTargetLayerIDs(c.NumTargetLayers, c.NumLayers)
	}
	for _, src := range []fields{f.with("is_causal"), d.with("causal")} {
		if src.m == nil {
			continue
		}
		name := src.only
		if !src.isNull(name) {
			b, err := src.boolean(name)
			if err != nil {
				return err
			}
			c.Causal = &b
		}
	}
	return nil
}

func parseLayerTypes(f fields, c *Config) error {
	if !f.present("layer_types") {
		// Early checkpoints (Qwen3.5-27B-DFlash) have only full-attention layers.
		c.Layers = make([]LayerKind, c.NumLayers)
		return nil
	}
	names, err := f.strList("layer_types")
	if err != nil {
		return err
	}
	if len(names) != c.NumLayers {
		return fmt.Errorf("field layer_types: %d entries for num_hidden_layers %d", len(names), c.NumLayers)
	}
	for i, n := range names {
		switch n {
		case "full_attention":
			c.Layers = append(c.Layers, FullAttention)
		case "sliding_attention":
			c.Layers = append(c.Layers, SlidingAttention)
		default:
			return fmt.Errorf("field layer_types[%d]: unsupported layer type %q (want full_attention or sliding_attention)", i, n)
		}
	}
	if c.NumSliding() > 0 {
		if c.SlidingWindow, err = f.positiveInt("sliding_window"); err != nil {
			return fmt.Errorf("%w (layer_types has sliding_attention layers)", err)
		}
	}
	return nil
}

func (c *Config) validate() error {
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("field num_key_value_heads: %d does not divide num_attention_heads %d", c.NumKVHeads, c.NumHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("field head_dim: %d is odd, RoPE needs an even head dim", c.HeadDim)
	}
	if c.BlockSize < 2 {
		return fmt.Errorf("field block_size: %d, a block needs the anchor and at least one mask token", c.BlockSize)
	}
	if c.MaskTokenID < 0 || c.MaskTokenID >= c.VocabSize {
		return fmt.Errorf("field dflash_config.mask_token_id: %d is outside the vocabulary [0, %d)", c.MaskTokenID, c.VocabSize)
	}
	return nil
}

// CheckTarget reports whether the drafter can run on a target: the fused
// target features and the shared embedding and LM head need equal hidden and
// vocabulary sizes, and every tapped layer must exist.
func (c *Config) CheckTarget(t *config.Config) error {
	if c.HiddenSize != t.HiddenSize {
		return fmt.Errorf("drafter hidden_size %d differs from the target's %d: this drafter belongs to another model", c.HiddenSize, t.HiddenSize)
	}
	if c.VocabSize != t.VocabSize {
		return fmt.Errorf("drafter vocab_size %d differs from the target's %d: the drafter uses the target's LM head", c.VocabSize, t.VocabSize)
	}
	if c.NumTargetLayers != 0 && c.NumTargetLayers != t.NumLayers {
		return fmt.Errorf("drafter was trained for a %d-layer target, this target has %d layers", c.NumTargetLayers, t.NumLayers)
	}
	for i, id := range c.TargetLayerIDs {
		if id < 0 || id >= t.NumLayers {
			return fmt.Errorf("drafter target_layer_ids[%d] = %d is outside the target's layers [0, %d)", i, id, t.NumLayers)
		}
	}
	return nil
}

// WeightParams counts the drafter's parameters: the fc that fuses the tapped
// target features, two norms, and per layer attention, q/k norms, SwiGLU MLP
// and two norms. Embedding and LM head are the target's.
func (c *Config) WeightParams() int64 {
	h := int64(c.HiddenSize)
	q := int64(c.NumHeads * c.HeadDim)
	kv := int64(c.NumKVHeads * c.HeadDim)
	attn := h*q + 2*h*kv + q*h + 2*int64(c.HeadDim)
	mlp := 3 * h * int64(c.IntermediateSize)
	perLayer := attn + mlp + 2*h
	fc := int64(len(c.TargetLayerIDs)) * h * h
	return fc + 2*h + int64(c.NumLayers)*perLayer
}

// fields reads typed values from a JSON object and names the field in errors.
// only, when set, is the single field a with() view exposes.
type fields struct {
	m      map[string]json.RawMessage
	prefix string
	only   string
}

// present reports whether a field exists and is not null.
func (f fields) present(name string) bool {
	raw, ok := f.m[name]
	return ok && string(raw) != "null"
}

func (f fields) isNull(name string) bool { return string(f.m[name]) == "null" }

// with returns a view of one field, or a nil view when it is absent.
func (f fields) with(name string) fields {
	if _, ok := f.m[name]; !ok {
		return fields{}
	}
	return fields{m: f.m, prefix: f.prefix, only: name}
}

func (f fields) get(name string, dst any, want string) error {
	raw, ok := f.m[name]
	if !ok || string(raw) == "null" {
		return fmt.Errorf("field %s%s: missing", f.prefix, name)
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("field %s%s: want %s, got %s", f.prefix, name, want, raw)
	}
	return nil
}

func (f fields) object(name string) (fields, error) {
	var inner map[string]json.RawMessage
	if err := f.get(name, &inner, "an object"); err != nil {
		return fields{}, err
	}
	return fields{m: inner, prefix: f.prefix + name + "."}, nil
}

func (f fields) str(name string) (string, error) {
	var s string
	return s, f.get(name, &s, "a string")
}

func (f fields) strList(name string) ([]string, error) {
	var s []string
	return s, f.get(name, &s, "a list of strings")
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

func (f fields) intList(name string) ([]int, error) {
	var v []int
	return v, f.get(name, &v, "a list of integers")
}

func (f fields) positiveInt(name string) (int, error) {
	v, err := f.integer(name)
	if err == nil && v <= 0 {
		err = fmt.Errorf("field %s%s: %d, want a positive integer", f.prefix, name, v)
	}
	return v, err
}
