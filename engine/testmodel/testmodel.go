package testmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"ddflash/engine/config"
	"ddflash/engine/fp8"
	"ddflash/engine/safetensors"
)

// TextPrefix is where the text model's tensors live, as in the multimodal
// Qwen3.5/3.6 checkpoints.
const TextPrefix = "model.language_model."

// Options selects what Write produces.
type Options struct {
	Preset Preset
	Seed   uint64
	DType  string // "f32", "bf16" or "fp8" (bf16 with FP8 linear layers); empty means f32
	Shards int    // safetensors files; 0 or 1 writes a single model.safetensors
	// MTP adds the multi-token-prediction head every Qwen3.5/3.6/3.8
	// checkpoint ships (mtp.*, mtp_num_hidden_layers 1), in its published
	// layout.
	MTP bool
}

// checkOptions validates a preset and dtype option (empty means f32) and
// returns the dtype's names.
func checkOptions(what string, p Preset, dtype string) (dtypeNames, error) {
	if p.Name == "" {
		return dtypeNames{}, fmt.Errorf("%s: no preset given", what)
	}
	if dtype == "" {
		dtype = "f32"
	}
	dt, ok := checkpointDTypes[dtype]
	if !ok {
		return dt, fmt.Errorf("%s: dtype %q: choose f32, bf16 or fp8", what, dtype)
	}
	return dt, nil
}

// dtypeNames is a dtype's name in safetensors headers and in config.json;
// fp8 checkpoints then quantise their linear layers (package fp8).
type dtypeNames struct {
	tensor, config string
	fp8            bool
}

// checkpointDTypes maps the DType option to the safetensors and config.json names.
var checkpointDTypes = map[string]dtypeNames{
	"f32":  {"F32", "float32", false},
	"bf16": {"BF16", "bfloat16", false},
	"fp8":  {"BF16", "bfloat16", true},
}

// Init scales (see initValues): matrices are N(0, 1/sqrt(fan_in)) so
// activations keep unit scale, and lm_head gives logits a spread of a few units.
const (
	normStd     = 0.1 // zero-centred (1+w) norm weights and the plain GDN norm's offset from 1
	logitSpread = 3.0 // standard deviation of the logits of a unit-RMS hidden state
	// padLogitBoost makes the padding rows of lm_head dominate, so an engine
	// that forgets to mask them emits padding ids under greedy decoding.
	padLogitBoost = 4.0
)

// Write creates dir (if needed) and writes config.json, generation_config.json,
// the safetensors weights, tokenizer.json and tokenizer_config.json. The
// output is a function of the options alone.
func Write(dir string, opt Options) error {
	p := opt.Preset
	dt, err := checkOptions("test model", p, opt.DType)
	if err != nil {
		return err
	}
	if tensors := len(plan(p, opt.MTP)); opt.Shards > tensors {
		return fmt.Errorf("test model: %d shards for %d tensors; use at most %d", opt.Shards, tensors, tensors)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("test model: %w", err)
	}
	vocab := learnBPE(sampleText, p.MaxMerges)
	if vocab.idCount() >= p.VocabSize {
		return fmt.Errorf("test model preset %s: tokenizer uses %d ids, vocab_size %d leaves no padding rows", p.Name, vocab.idCount(), p.VocabSize)
	}
	tokJSON, tokCfgJSON, special, err := tokenizerFiles(vocab)
	if err != nil {
		return err
	}
	eos := []int{special["<|im_end|>"], special["<|endoftext|>"]}
	cfg := configJSON(p, dt.config, eos, opt.MTP)
	var quant *config.Quantization
	if dt.fp8 {
		quant = &config.Quantization{NotConverted: fp8.QwenNotConverted(p.layerKinds(), TextPrefix)}
		cfg["quantization_config"] = fp8.ConfigJSON(quant.NotConverted)
	}
	modelCfg, err := marshalJSON(cfg)
	if err != nil {
		return fmt.Errorf("test model: encode config.json: %w", err)
	}
	genCfg, err := marshalJSON(map[string]any{"eos_token_id": eos, "pad_token_id": special["<|endoftext|>"], "do_sample": false})
	if err != nil {
		return fmt.Errorf("test model: encode generation_config.json: %w", err)
	}
	files := []struct {
		name string
		data []byte
	}{
		{"config.json", modelCfg},
		{"generation_config.json", genCfg},
		{"tokenizer.json", tokJSON},
		{"tokenizer_config.json", tokCfgJSON},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return fmt.Errorf("test model: %w", err)
		}
	}
	tensors, err := randomTensors(p, opt.MTP, dt.tensor, vocab.idCount(), opt.Seed)
	if err != nil {
		return err
	}
	if tensors, err = fp8.Convert(tensors, quant); err != nil {
		return fmt.Errorf("test model: %w", err)
	}
	meta := map[string]string{"format": "pt", "generator": "ddflash testmodel " + p.Name}
	return safetensors.WriteCheckpoint(dir, tensors, opt.Shards, meta)
}

// configJSON is config.json in the multimodal wrapper layout of Qwen3.6-27B
// (docs/qwen36-model.md §1), without a vision tower.
func configJSON(p Preset, dtype string, eos []int, mtp bool) map[string]any {
	layerTypes := make([]string, p.Layers)
	for i := range layerTypes {
		layerTypes[i] = "linear_attention"
		if p.isFull(i) {
			layerTypes[i] = "full_attention"
		}
	}
	rotary := int(float64(p.HeadDim) * p.PartialRotary)
	text := map[string]any{
		"model_type":              "qwen3_5_text",
		"hidden_size":             p.Hidden,
		"num_hidden_layers":       p.Layers,
		"layer_types":             layerTypes,
		"full_attention_interval": p.FullEvery,
		"intermediate_size":       p.Intermediate,
		"hidden_act":              "silu",
		"vocab_size":              p.VocabSize,
		"num_attention_heads":     p.Heads,
		"num_key_value_heads":     p.KVHeads,
		"head_dim":                p.HeadDim,
		"attn_output_gate":        true,
		"attention_bias":          false,
		"linear_num_key_heads":    p.LinearKeyHeads,
		"linear_num_value_heads":  p.LinearValueHeads,
		"linear_key_head_dim":     p.LinearHeadDim,
		"linear_value_head_dim":   p.LinearHeadDim,
		"linear_conv_kernel_dim":  p.ConvKernel,
		"rope_parameters": map[string]any{
			"rope_type":             "default",
			"rope_theta":            10_000_000,
			"partial_rotary_factor": p.PartialRotary,
			"mrope_section":         mropeSection(rotary / 2),
			"mrope_interleaved":     true,
		},
		"rms_norm_eps":            1e-6,
		"max_position_embeddings": p.MaxPositions,
		"tie_word_embeddings":     false,
		"mamba_ssm_dtype":         "float32",
		"mtp_num_hidden_layers":   boolInt(mtp),
		"eos_token_id":            eos,
		"bos_token_id":            nil,
		"dtype":                   dtype,
	}
	return map[string]any{
		"architectures":       []string{"Qwen3_5ForConditionalGeneration"},
		"model_type":          "qwen3_5",
		"tie_word_embeddings": false,
		"text_config":         text,
		"dtype":               dtype,
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// mropeSection splits the rotary frequencies over the T/H/W streams as the
// real [11,11,10] does for 32 frequencies: near-equal parts, the remainder first.
func mropeSection(freqs int) []int {
	s := []int{freqs / 3, freqs / 3, freqs / 3}
	for i := 0; i < freqs%3; i++ {
		s[i]++
	}
	return s
}

// marshalJSON is indented JSON without HTML escaping, like Hugging Face's files.
func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// initKind says how a tensor's values are drawn.
type initKind int

const (
	initMatrix      initKind = iota // N(0, 1/sqrt(fan_in)), fan_in the last dim (K for the conv)
	initEmbedding                   // N(0, 1)
	initLMHead                      // N(0, logitSpread/sqrt(hidden)), padding rows boosted
	initZeroNorm                    // N(0, normStd): weights applied as (1+w)
	initPlainNorm                   // 1 + N(0, normStd)
	initALog                        // log(U(1, 16))
	initDtBias                      // softplus⁻¹(dt), dt log-uniform in [1e-3, 1e-1] (Mamba's init)
	initConvBase                    // DFlash2 static taps [2, taps, hidden]: tap 0 1 + N(0, normStd), later taps N(0, normStd)
	initDynamicTaps                 // N(0, normStd/sqrt(fan_in)): DFlash2 dynamic taps near zero
)

type tensorPlan struct {
	name  string
	shape []int
	init  initKind
	f32   bool // stored as F32 whatever the checkpoint dtype (A_log, as in real bf16 checkpoints)
}

// plan lists every tensor of the preset in checkpoint order, with the MTP
// head's last when mtp is set.
func plan(p Preset, mtp bool) []tensorPlan {
	h := p.Hidden
	out := []tensorPlan{
		{name: TextPrefix + "embed_tokens.weight", shape: []int{p.VocabSize, h}, init: initEmbedding},
	}
	for i := 0; i < p.Layers; i++ {
		out = append(out, decoderLayer(p, fmt.Sprintf("%slayers.%d.", TextPrefix, i), p.isFull(i))...)
	}
	out = append(out,
		tensorPlan{name: TextPrefix + "norm.weight", shape: []int{h}, init: initZeroNorm},
		tensorPlan{name: "lm_head.weight", shape: []int{p.VocabSize, h}, init: initLMHead},
	)
	if !mtp {
		return out
	}
	// The MTP head (Qwen3.6-27B's index; docs/mtp.md): fc over [embedding |
	// hidden], their two norms, one full-attention decoder layer, its norm.
	out = append(out,
		tensorPlan{name: "mtp.fc.weight", shape: []int{h, 2 * h}, init: initMatrix},
		tensorPlan{name: "mtp.pre_fc_norm_embedding.weight", shape: []int{h}, init: initZeroNorm},
		tensorPlan{name: "mtp.pre_fc_norm_hidden.weight", shape: []int{h}, init: initZeroNorm},
	)
	out = append(out, decoderLayer(p, "mtp.layers.0.", true)...)
	return append(out, tensorPlan{name: "mtp.norm.weight", shape: []int{h}, init: initZeroNorm})
}

// decoderLayer lists one decoder layer's tensors under prefix l: gated full
// attention or a Gated DeltaNet mixer, each with its norms and MLP.
func decoderLayer(p Preset, l string, full bool) []tensorPlan {
	h := p.Hidden
	var out []tensorPlan
	add := func(name string, init initKind, shape ...int) {
		out = append(out, tensorPlan{name: l + name, shape: shape, init: init, f32: name == "linear_attn.A_log"})
	}
	add("input_layernorm.weight", initZeroNorm, h)
	if full {
		add("self_attn.q_proj.weight", initMatrix, 2*p.Heads*p.HeadDim, h)
		add("self_attn.k_proj.weight", initMatrix, p.KVHeads*p.HeadDim, h)
		add("self_attn.v_proj.weight", initMatrix, p.KVHeads*p.HeadDim, h)
		add("self_attn.o_proj.weight", initMatrix, h, p.Heads*p.HeadDim)
		add("self_attn.q_norm.weight", initZeroNorm, p.HeadDim)
		add("self_attn.k_norm.weight", initZeroNorm, p.HeadDim)
	} else {
		add("linear_attn.in_proj_qkv.weight", initMatrix, p.convDim(), h)
		add("linear_attn.in_proj_z.weight", initMatrix, p.valueDim(), h)
		add("linear_attn.in_proj_b.weight", initMatrix, p.LinearValueHeads, h)
		add("linear_attn.in_proj_a.weight", initMatrix, p.LinearValueHeads, h)
		add("linear_attn.conv1d.weight", initMatrix, p.convDim(), 1, p.ConvKernel)
		add("linear_attn.dt_bias", initDtBias, p.LinearValueHeads)
		add("linear_attn.A_log", initALog, p.LinearValueHeads)
		add("linear_attn.norm.weight", initPlainNorm, p.LinearHeadDim)
		add("linear_attn.out_proj.weight", initMatrix, h, p.valueDim())
	}
	add("post_attention_layernorm.weight", initZeroNorm, h)
	add("mlp.gate_proj.weight", initMatrix, p.Intermediate, h)
	add("mlp.up_proj.weight", initMatrix, p.Intermediate, h)
	add("mlp.down_proj.weight", initMatrix, h, p.Intermediate)
	return out
}

// randomTensors draws every tensor from one PCG stream seeded by seed.
// usedIDs is the number of real token ids; lm_head rows from there on are padding.
func randomTensors(p Preset, mtp bool, dtype string, usedIDs int, seed uint64) ([]safetensors.Tensor, error) {
	rng := rand.New(rand.NewPCG(seed, 0x7e57_30de1))
	var tensors []safetensors.Tensor
	for _, tp := range plan(p, mtp) {
		dt := dtype
		if tp.f32 {
			dt = "F32"
		}
		data, err := encodeTensor(rng, tp, usedIDs, dt)
		if err != nil {
			return nil, fmt.Errorf("test model: tensor %s: %w", tp.name, err)
		}
		tensors = append(tensors, safetensors.Tensor{Name: tp.name, DType: dt, Shape: tp.shape, Data: data})
	}
	return tensors, nil
}

// encodeTensor draws a tensor's values and encodes them in dtype, a block at
// a time, so that a big tensor (qwen36-shapes' 1.3G-value embedding) never
// exists as float32 values as a whole.
func encodeTensor(rng *rand.Rand, tp tensorPlan, usedIDs int, dtype string) ([]byte, error) {
	n := 1
	for _, d := range tp.shape {
		n *= d
	}
	const block = 1 << 20
	vals := make([]float32, min(n, block))
	out := make([]byte, 0, n*safetensors.DTypeSize(dtype))
	for from := 0; from < n; from += block {
		part := vals[:min(block, n-from)]
		initValues(rng, tp, usedIDs, from, part)
		data, err := safetensors.Encode(dtype, part)
		if err != nil {
			return nil, err
		}
		out = append(out, data...)
	}
	return out, nil
}

// initValues draws the tensor's values from index from on into vals.
func initValues(rng *rand.Rand, tp tensorPlan, usedIDs, from int, vals []float32) {
	last := tp.shape[len(tp.shape)-1]
	normal := func(std float64) float32 { return float32(rng.NormFloat64() * std) }
	for j := range vals {
		i := from + j
		switch tp.init {
		case initMatrix:
			vals[j] = normal(1 / math.Sqrt(float64(last)))
		case initEmbedding:
			vals[j] = normal(1)
		case initLMHead:
			std := logitSpread / math.Sqrt(float64(last))
			if i/last >= usedIDs {
				std *= padLogitBoost
			}
			vals[j] = normal(std)
		case initZeroNorm:
			vals[j] = normal(normStd)
		case initPlainNorm:
			vals[j] = 1 + normal(normStd)
		case initALog:
			vals[j] = float32(math.Log(1 + 15*rng.Float64()))
		case initConvBase:
			vals[j] = normal(normStd)
			if i/last%tp.shape[1] == 0 {
				vals[j]++
			}
		case initDynamicTaps:
			vals[j] = normal(normStd / math.Sqrt(float64(last)))
		case initDtBias:
			dt := math.Exp(math.Log(1e-3) + rng.Float64()*(math.Log(1e-1)-math.Log(1e-3)))
			vals[j] = float32(dt + math.Log(-math.Expm1(-dt))) // softplus⁻¹(dt)
		}
	}
}
