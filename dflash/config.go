// Package dflash implements the DFlash block-diffusion drafter.
package dflash

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

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

// YaRN holds the rope_scaling fields of a "yarn" RoPE, as the target reads them.
type YaRN = config.YaRN

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

	// V2 holds a DFlash2 drafter's additions; nil for a DFlash (v1) drafter.
	V2 *V2Config
}

// V2Config is what a DFlash2 drafter (architecture DFlash2DraftModel) adds
// to DFlash: a grouped dynamic convolution around every sublayer and a
// candidate selector over the top-K tokens of each proposal position (see
// docs/dflash2.md). The fields come from dflash_config, or from the top
// level of config.json where dflash_config lacks them.
type V2Config struct {
	ConvKernelSize int // conv_kernel_size: taps of each convolution (offsets 0..K-1)
	ConvGroupSize  int // conv_group_size: channels sharing one dynamic tap weight
	SelectorRank   int // selector_rank: width of the codebooks and the hidden projection
	SelectorTopK   int // selector_top_k: candidates kept per proposal position
	// OutputMultiplier scales the unary logits (1 when absent) and
	// FinalLogitSoftcap, when positive, caps them to ±cap by cap·tanh(x/cap).
	OutputMultiplier  float64
	FinalLogitSoftcap float64
	// InputEmbeddingScale scales the block's token embeddings (1 when absent).
	InputEmbeddingScale float64
}

// ConvGroups is the number of channel groups of a convolution's dynamic part.
func (c *Config) ConvGroups() int { return c.HiddenSize / c.V2.ConvGroupSize }

// LayerCausal reports whether layer i masks future block positions: sliding
// layers are causal and full layers are not, unless the config overrides it.
func (c *Config) LayerCausal(i int) bool {
	if c.Causal != nil {
		return *c.Causal
	}
	return c.Layers[i] == SlidingAttention
}

// RingTokens is the length of one sliding layer's per-request ring cache
// for pages of pageSize tokens and sequences of at most context tokens:
// whole pages covering the window's last SlidingWindow-1 committed
// positions (from the page the window starts in) and a block being
// drafted, or the whole sequence when that is shorter. 0 without sliding
// layers.
func (c *Config) RingTokens(pageSize, context int) int {
	if c.NumSliding() == 0 {
		return 0
	}
	window := ((c.SlidingWindow-1+c.BlockSize+pageSize-1)/pageSize + 1) * pageSize
	whole := (context + c.BlockSize + pageSize - 1) / pageSize * pageSize
	return min(window, whole)
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

// LoadConfig reads DIR/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read drafter config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("drafter %s: %w", path, err)
	}
	return c, nil
}

// rawConfig is config.json as written; pointers tell absent fields apart.
type rawConfig struct {
	HiddenSize       *int       `json:"hidden_size"`
	NumLayers        *int       `json:"num_hidden_layers"`
	NumHeads         *int       `json:"num_attention_heads"`
	NumKVHeads       *int       `json:"num_key_value_heads"`
	HeadDim          *int       `json:"head_dim"`
	IntermediateSize *int       `json:"intermediate_size"`
	VocabSize        *int       `json:"vocab_size"`
	RMSNormEps       *float64   `json:"rms_norm_eps"`
	MaxPositions     *int       `json:"max_position_embeddings"`
	BlockSize        *int       `json:"block_size"`
	NumTargetLayers  *int       `json:"num_target_layers"`
	LayerTypes       []string   `json:"layer_types"`
	SlidingWindow    *int       `json:"sliding_window"`
	IsCausal         *bool      `json:"is_causal"`
	DFlash           *rawDFlash `json:"dflash_config"`
	Dtype            string     `json:"dtype"`
	TorchDtype       string     `json:"torch_dtype"`
	Architectures    []string   `json:"architectures"`
	rawV2
}

type rawDFlash struct {
	MaskTokenID    *int  `json:"mask_token_id"`
	TargetLayerIDs []int `json:"target_layer_ids"`
	Causal         *bool `json:"causal"`
	BlockSize      *int  `json:"block_size"`
	rawV2
}

// rawV2 is the DFlash2 fields, as dflash_config or the top level spell them.
type rawV2 struct {
	ConvKernelSize      *int     `json:"conv_kernel_size"`
	ConvGroupSize       *int     `json:"conv_group_size"`
	SelectorRank        *int     `json:"selector_rank"`
	SelectorTopK        *int     `json:"selector_top_k"`
	OutputMultiplier    *float64 `json:"output_multiplier"`
	FinalLogitSoftcap   *float64 `json:"final_logit_softcapping"`
	InputEmbeddingScale *float64 `json:"input_embedding_scale"`
}

// V2Architecture is the architectures entry of a DFlash2 drafter.
const V2Architecture = "DFlash2DraftModel"

// ParseConfig reads a drafter config.json body.
func ParseConfig(data []byte) (*Config, error) {
	var raw rawConfig
	if err := json.Unmarshal(data, &raw); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, fmt.Errorf("field %s: want a JSON %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	c := &Config{Dtype: raw.Dtype}
	if c.Dtype == "" {
		c.Dtype = raw.TorchDtype
	}
	ints := []struct {
		name     string
		src      *int
		dst      *int
		optional bool
	}{
		{"hidden_size", raw.HiddenSize, &c.HiddenSize, false},
		{"num_hidden_layers", raw.NumLayers, &c.NumLayers, false},
		{"num_attention_heads", raw.NumHeads, &c.NumHeads, false},
		{"num_key_value_heads", raw.NumKVHeads, &c.NumKVHeads, false},
		{"intermediate_size", raw.IntermediateSize, &c.IntermediateSize, false},
		{"vocab_size", raw.VocabSize, &c.VocabSize, false},
		{"max_position_embeddings", raw.MaxPositions, &c.MaxPositions, false},
		{"head_dim", raw.HeadDim, &c.HeadDim, true},
		{"num_target_layers", raw.NumTargetLayers, &c.NumTargetLayers, true},
	}
	for _, f := range ints {
		if f.src == nil && f.optional {
			continue
		}
		v, err := positive(f.name, f.src)
		if err != nil {
			return nil, err
		}
		*f.dst = v
	}
	if raw.HeadDim == nil {
		// Qwen3Config derives head_dim from the hidden size when it is absent.
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if raw.RMSNormEps == nil {
		return nil, missing("rms_norm_eps")
	}
	c.RMSNormEps = *raw.RMSNormEps
	if err := c.setRope(data); err != nil {
		return nil, err
	}
	if err := c.setDFlash(&raw); err != nil {
		return nil, err
	}
	if err := c.setV2(&raw); err != nil {
		return nil, err
	}
	if err := c.setLayerTypes(&raw); err != nil {
		return nil, err
	}
	return c, c.validate()
}

func missing(name string) error { return fmt.Errorf("field %s: missing", name) }

func positive(name string, v *int) (int, error) {
	if v == nil {
		return 0, missing(name)
	}
	if *v <= 0 {
		return 0, fmt.Errorf("field %s: %d, want a positive integer", name, *v)
	}
	return *v, nil
}

// setRope reads the RoPE settings with the target's parser (the same keys,
// precedence and YaRN fields). rope_theta is required, as z-lab writes it;
// a Qwen3 decoder rotates whole heads.
func (c *Config) setRope(data []byte) error {
	var object map[string]json.RawMessage
	if err := json.Unmarshal(data, &object); err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	r, err := config.ParseRope(object, c.MaxPositions, config.Rope{PartialRotary: 1})
	if err != nil {
		return err
	}
	if r.PartialRotary != 1 {
		return fmt.Errorf("field partial_rotary_factor: %g, the drafter rotates whole heads", r.PartialRotary)
	}
	c.RopeTheta, c.YaRN = r.Theta, r.YaRN
	return nil
}

func (c *Config) setDFlash(raw *rawConfig) error {
	d := raw.DFlash
	if d == nil {
		return missing("dflash_config")
	}
	if d.MaskTokenID == nil {
		return missing("dflash_config.mask_token_id")
	}
	c.MaskTokenID = *d.MaskTokenID
	switch {
	case d.TargetLayerIDs != nil:
		if len(d.TargetLayerIDs) == 0 {
			return fmt.Errorf("field dflash_config.target_layer_ids: empty, the drafter needs at least one target layer")
		}
		c.TargetLayerIDs = d.TargetLayerIDs
	case c.NumTargetLayers == 0:
		return fmt.Errorf("field num_target_layers: missing (the default dflash_config.target_layer_ids are computed from it)")
	default:
		c.TargetLayerIDs = DefaultTargetLayerIDs(c.NumTargetLayers, c.NumLayers)
	}
	c.Causal = raw.IsCausal
	if d.Causal != nil {
		c.Causal = d.Causal
	}
	return c.setBlockSize(raw.BlockSize, d.BlockSize)
}

// setBlockSize reads block_size from the top level (z-lab's DFlash
// drafters) or dflash_config (DFlash2 drafters); where both are set they
// must agree.
func (c *Config) setBlockSize(top, nested *int) error {
	if top != nil && nested != nil && *top != *nested {
		return fmt.Errorf("field dflash_config.block_size: %d, but block_size is %d", *nested, *top)
	}
	name, v := "block_size", top
	if v == nil {
		name, v = "dflash_config.block_size", nested
	}
	if v == nil {
		return missing("block_size")
	}
	n, err := positive(name, v)
	c.BlockSize = n
	return err
}

// setV2 reads the DFlash2 fields: a drafter is DFlash2 when its
// architectures name DFlash2DraftModel or when it sets any of them, and
// then needs the four sizes (the published loaders require them too).
func (c *Config) setV2(raw *rawConfig) error {
	nested := rawV2{}
	if raw.DFlash != nil {
		nested = raw.DFlash.rawV2
	}
	pick := func(n, t *int) *int {
		if n != nil {
			return n
		}
		return t
	}
	pickF := func(n, t *float64) *float64 {
		if n != nil {
			return n
		}
		return t
	}
	top := raw.rawV2
	sizes := []struct {
		name string
		v    *int
	}{
		{"conv_kernel_size", pick(nested.ConvKernelSize, top.ConvKernelSize)},
		{"conv_group_size", pick(nested.ConvGroupSize, top.ConvGroupSize)},
		{"selector_rank", pick(nested.SelectorRank, top.SelectorRank)},
		{"selector_top_k", pick(nested.SelectorTopK, top.SelectorTopK)},
	}
	v2 := slices.Contains(raw.Architectures, V2Architecture)
	for _, f := range sizes {
		v2 = v2 || f.v != nil
	}
	if !v2 {
		return nil
	}
	c.V2 = &V2Config{OutputMultiplier: 1, InputEmbeddingScale: 1}
	for i, dst := range []*int{&c.V2.ConvKernelSize, &c.V2.ConvGroupSize, &c.V2.SelectorRank, &c.V2.SelectorTopK} {
		n, err := positive("dflash_config."+sizes[i].name, sizes[i].v)
		if err != nil {
			return fmt.Errorf("%w (a DFlash2 drafter needs it)", err)
		}
		*dst = n
	}
	for _, f := range []struct {
		name string
		v    *float64
		dst  *float64
	}{
		{"output_multiplier", pickF(nested.OutputMultiplier, top.OutputMultiplier), &c.V2.OutputMultiplier},
		{"final_logit_softcapping", pickF(nested.FinalLogitSoftcap, top.FinalLogitSoftcap), &c.V2.FinalLogitSoftcap},
		{"input_embedding_scale", pickF(nested.InputEmbeddingScale, top.InputEmbeddingScale), &c.V2.InputEmbeddingScale},
	} {
		if f.v == nil {
			continue
		}
		if !finite(*f.v) || *f.v < 0 || (*f.v == 0 && f.name != "final_logit_softcapping") {
			return fmt.Errorf("field dflash_config.%s: %g, want a positive number", f.name, *f.v)
		}
		*f.dst = *f.v
	}
	return nil
}

func finite(x float64) bool { return !math.IsInf(x, 0) && !math.IsNaN(x) }

func (c *Config) setLayerTypes(raw *rawConfig) error {
	if raw.LayerTypes == nil {
		// Early checkpoints (Qwen3.5-27B-DFlash) have only full-attention layers.
		c.Layers = make([]LayerKind, c.NumLayers)
		return nil
	}
	if len(raw.LayerTypes) != c.NumLayers {
		return fmt.Errorf("field layer_types: %d entries for num_hidden_layers %d", len(raw.LayerTypes), c.NumLayers)
	}
	for i, n := range raw.LayerTypes {
		switch n {
		case "full_attention":
			c.Layers = append(c.Layers, FullAttention)
		case "sliding_attention":
			c.Layers = append(c.Layers, SlidingAttention)
		default:
			return fmt.Errorf("field layer_types[%d]: unsupported layer type %q (want full_attention or sliding_attention)", i, n)
		}
	}
	if c.NumSliding() == 0 {
		return nil
	}
	v, err := positive("sliding_window", raw.SlidingWindow)
	if err != nil {
		return fmt.Errorf("%w (layer_types has sliding_attention layers)", err)
	}
	c.SlidingWindow = v
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
// and two norms; a DFlash2 drafter adds two convolutions per layer (static
// kernels and the dynamic kernels' projection) and the selector (two
// codebooks and the hidden projection). Embedding and LM head are the
// target's.
func (c *Config) WeightParams() int64 {
	h := int64(c.HiddenSize)
	q := int64(c.NumHeads * c.HeadDim)
	kv := int64(c.NumKVHeads * c.HeadDim)
	attn := h*q + 2*h*kv + q*h + 2*int64(c.HeadDim)
	mlp := 3 * h * int64(c.IntermediateSize)
	perLayer := attn + mlp + 2*h
	fc := int64(len(c.TargetLayerIDs)) * h * h
	var selector int64
	if v := c.V2; v != nil {
		taps, groups := int64(v.ConvKernelSize), int64(c.ConvGroups())
		perLayer += 2 * (2*taps*h + 2*taps*groups*h)
		selector = int64(v.SelectorRank) * (2*int64(c.VocabSize) + h)
	}
	return fc + 2*h + int64(c.NumLayers)*perLayer + selector
}

func (c *Config) validate() error {
	if c.HeadDim <= 0 {
		return fmt.Errorf("field head_dim: missing, and hidden_size %d / num_attention_heads %d gives none", c.HiddenSize, c.NumHeads)
	}
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
	if v := c.V2; v != nil {
		if c.HiddenSize%v.ConvGroupSize != 0 {
			return fmt.Errorf("field dflash_config.conv_group_size: %d does not divide hidden_size %d", v.ConvGroupSize, c.HiddenSize)
		}
		if v.SelectorTopK > c.VocabSize {
			return fmt.Errorf("field dflash_config.selector_top_k: %d exceeds vocab_size %d", v.SelectorTopK, c.VocabSize)
		}
	}
	return nil
}
