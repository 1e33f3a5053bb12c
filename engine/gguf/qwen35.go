package gguf

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"ddflash/engine/config"
	"ddflash/engine/safetensors"
)

// ConvertQwen35 writes the text model of the checkpoint in dir as a GGUF
// file of llama.cpp's qwen35 architecture: matrices keep their dtype
// (BF16 stays BF16), norms and GDN parameters become F32 with llama.cpp's
// conventions folded in (RMSNorm weights 1+w, ssm_a = -exp(A_log), GDN
// value heads tiled over the key heads; see valueHead). The
// vocabulary is the tokenizer's ids only: llama.cpp samples from every
// output row, where ddflash never picks a padding row.
func ConvertQwen35(dir, out string) error {
	cfg, err := config.Load(dir)
	if err != nil {
		return err
	}
	interval, err := fullAttentionInterval(cfg.Layers)
	if err != nil {
		return err
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		return err
	}
	defer ck.Close()
	vocab, ids, err := readVocab(dir, cfg)
	if err != nil {
		return err
	}
	c := converter{cfg: cfg, ck: ck}
	c.tensor("token_embd.weight", prefix+"embed_tokens.weight", firstRows(ids))
	for l, kind := range cfg.Layers {
		hf, blk := fmt.Sprintf("%slayers.%d.", prefix, l), fmt.Sprintf("blk.%d.", l)
		c.tensor(blk+"attn_norm.weight", hf+"input_layernorm.weight", plusOne)
		c.tensor(blk+"post_attention_norm.weight", hf+"post_attention_layernorm.weight", plusOne)
		if kind == config.Full {
			for _, p := range [][2]string{{"attn_q", "q_proj"}, {"attn_k", "k_proj"}, {"attn_v", "v_proj"}, {"attn_output", "o_proj"}} {
				c.tensor(blk+p[0]+".weight", hf+"self_attn."+p[1]+".weight", asIs)
			}
			c.tensor(blk+"attn_q_norm.weight", hf+"self_attn.q_norm.weight", plusOne)
			c.tensor(blk+"attn_k_norm.weight", hf+"self_attn.k_norm.weight", plusOne)
		} else {
			la := hf + "linear_attn."
			c.tensor(blk+"attn_qkv.weight", la+"in_proj_qkv.weight", c.rows(2*cfg.KeyDim(), cfg.LinearValueDim))
			c.tensor(blk+"attn_gate.weight", la+"in_proj_z.weight", c.rows(0, cfg.LinearValueDim))
			c.tensor(blk+"ssm_beta.weight", la+"in_proj_b.weight", c.rows(0, 1))
			c.tensor(blk+"ssm_alpha.weight", la+"in_proj_a.weight", c.rows(0, 1))
			c.tensor(blk+"ssm_conv1d.weight", la+"conv1d.weight", c.conv())
			c.tensor(blk+"ssm_dt.bias", la+"dt_bias", c.heads(func(x float32) float32 { return x }))
			c.tensor(blk+"ssm_a", la+"A_log", c.heads(func(x float32) float32 { return float32(-math.Exp(float64(x))) }))
			c.tensor(blk+"ssm_norm.weight", la+"norm.weight", toF32)
			c.tensor(blk+"ssm_out.weight", la+"out_proj.weight", c.columns())
		}
		c.tensor(blk+"ffn_gate.weight", hf+"mlp.gate_proj.weight", asIs)
		c.tensor(blk+"ffn_up.weight", hf+"mlp.up_proj.weight", asIs)
		c.tensor(blk+"ffn_down.weight", hf+"mlp.down_proj.weight", asIs)
	}
	c.tensor("output_norm.weight", prefix+"norm.weight", plusOne)
	if !cfg.TieWordEmbeddings {
		c.tensor("output.weight", "lm_head.weight", firstRows(ids))
	}
	if c.err != nil {
		return c.err
	}
	return Write(out, append(metadata(cfg, interval), vocab...), c.out)
}

const prefix = "model.language_model."

func metadata(cfg *config.Config, interval int) []KV {
	a := "qwen35."
	rotPairs := int32(cfg.RotaryDim() / 2)
	// Text positions are the same in every M-RoPE section, so any split of
	// the rotary pairs gives plain RoPE; this is the real models' proportion.
	s0 := rotPairs * 11 / 32
	return []KV{
		{"general.architecture", "qwen35"},
		{"general.name", "ddflash " + cfg.ModelType},
		{a + "block_count", uint32(cfg.NumLayers)},
		{a + "context_length", uint32(cfg.MaxPositions)},
		{a + "embedding_length", uint32(cfg.HiddenSize)},
		{a + "feed_forward_length", uint32(cfg.IntermediateSize)},
		{a + "attention.head_count", uint32(cfg.NumHeads)},
		{a + "attention.head_count_kv", uint32(cfg.NumKVHeads)},
		{a + "attention.key_length", uint32(cfg.HeadDim)},
		{a + "attention.value_length", uint32(cfg.HeadDim)},
		{a + "attention.layer_norm_rms_epsilon", float32(cfg.RMSNormEps)},
		{a + "rope.dimension_count", uint32(cfg.RotaryDim())},
		{a + "rope.freq_base", float32(cfg.RopeTheta)},
		{a + "rope.dimension_sections", []int32{s0, s0, rotPairs - 2*s0, 0}},
		{a + "full_attention_interval", uint32(interval)},
		{a + "ssm.conv_kernel", uint32(cfg.ConvKernel)},
		{a + "ssm.state_size", uint32(cfg.LinearKeyDim)},
		{a + "ssm.group_count", uint32(cfg.LinearKeyHeads)},
		{a + "ssm.time_step_rank", uint32(cfg.LinearValueHeads)},
		{a + "ssm.inner_size", uint32(cfg.ValueDim())},
	}
}

// fullAttentionInterval finds n with layer i full iff (i+1)%n == 0, the
// only layout the qwen35 metadata can express.
func fullAttentionInterval(layers []config.LayerKind) (int, error) {
	for n := 1; n <= len(layers); n++ {
		ok := true
		for i, k := range layers {
			ok = ok && (k == config.Full) == ((i+1)%n == 0)
		}
		if ok {
			return n, nil
		}
	}
	return 0, fmt.Errorf("gguf: the layer pattern is not one full-attention layer every n layers")
}

// converter accumulates the GGUF tensors and the first error.
type converter struct {
	cfg *config.Config
	ck  *safetensors.Checkpoint
	out []Tensor
	err error
}

// transform turns a checkpoint tensor into a GGUF one (name and dims set by the caller).
type transform func(t safetensors.Tensor) (Tensor, error)

func (c *converter) tensor(name, src string, f transform) {
	if c.err != nil {
		return
	}
	t, ok := c.ck.Tensor(src)
	if !ok {
		c.err = fmt.Errorf("gguf: the checkpoint has no tensor %s", src)
		return
	}
	g, err := f(t)
	if err != nil {
		c.err = fmt.Errorf("gguf: %s: %w", src, err)
		return
	}
	g.Name = name
	if g.Dims == nil {
		g.Dims = ggmlDims(t.Shape)
	}
	c.out = append(c.out, g)
}

// ggmlDims reverses a row-major shape, dropping unit dimensions inside
// (conv1d's [C, 1, K] is the matrix {K, C}).
func ggmlDims(shape []int) []uint64 {
	var d []uint64
	for i := len(shape) - 1; i >= 0; i-- {
		if shape[i] != 1 || (i == 0 && len(d) == 0) {
			d = append(d, uint64(shape[i]))
		}
	}
	return d
}

var tensorTypes = map[string]uint32{"F32": TypeF32, "F16": TypeF16, "BF16": TypeBF16}

// firstRows keeps the first n rows of a matrix.
func firstRows(n int) transform {
	return func(t safetensors.Tensor) (Tensor, error) {
		g, err := asIs(t)
		if err != nil || n > t.Shape[0] {
			return g, cmp.Or(err, fmt.Errorf("%d rows, want the first %d", t.Shape[0], n))
		}
		g.Data = g.Data[:len(g.Data)/t.Shape[0]*n]
		g.Dims = []uint64{uint64(t.Shape[1]), uint64(n)}
		return g, nil
	}
}

func asIs(t safetensors.Tensor) (Tensor, error) {
	ty, ok := tensorTypes[t.DType]
	if !ok {
		return Tensor{}, fmt.Errorf("unsupported dtype %s", t.DType)
	}
	return Tensor{Type: ty, Data: t.Data}, nil
}

func f32Tensor(v []float32) Tensor {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	return Tensor{Type: TypeF32, Data: data}
}

func mapF32(f func(float32) float32) transform {
	return func(t safetensors.Tensor) (Tensor, error) {
		v, err := t.Float32s()
		if err != nil {
			return Tensor{}, err
		}
		for i := range v {
			v[i] = f(v[i])
		}
		return f32Tensor(v), nil
	}
}

var (
	toF32   = mapF32(func(x float32) float32 { return x })
	plusOne = mapF32(func(x float32) float32 { return 1 + x })
)

// valueHead maps a GGUF value head to the checkpoint's. The checkpoint
// groups value heads by key head (head h reads key head h/(Hv/Hk)); llama.cpp
// broadcasts the key heads tiled (head h reads key head h mod Hk). llama.cpp
// v0.4.0 in node-llama-cpp 3.21.1 agrees with ddflash's greedy tokens only
// with this order.
func (c *converter) valueHead(h int) int {
	hk, ratio := c.cfg.LinearKeyHeads, c.cfg.LinearValueHeads/c.cfg.LinearKeyHeads
	return (h%hk)*ratio + h/hk
}

// rows reorders the value heads of a matrix whose value rows start at row
// off, unit rows per head (the first off rows, q and k, stay).
func (c *converter) rows(off, unit int) transform {
	return func(t safetensors.Tensor) (Tensor, error) {
		g, err := asIs(t)
		if err != nil {
			return g, err
		}
		rowBytes := len(t.Data) / t.Shape[0]
		g.Data = c.permute(t.Data, off*rowBytes, unit*rowBytes)
		return g, nil
	}
}

// permute moves blocks of block bytes starting at off into tiled head order.
func (c *converter) permute(data []byte, off, block int) []byte {
	out := append([]byte(nil), data...)
	for h := range c.cfg.LinearValueHeads {
		src := off + c.valueHead(h)*block
		copy(out[off+h*block:off+(h+1)*block], data[src:src+block])
	}
	return out
}

// conv reorders the conv1d channels like in_proj_qkv's rows, as F32.
func (c *converter) conv() transform {
	return func(t safetensors.Tensor) (Tensor, error) {
		g, err := toF32(t)
		if err != nil {
			return g, err
		}
		k := c.cfg.ConvKernel
		g.Data = c.permute(g.Data, 2*c.cfg.KeyDim()*k*4, c.cfg.LinearValueDim*k*4)
		return g, nil
	}
}

// heads reorders a per-value-head vector, as F32, after applying f.
func (c *converter) heads(f func(float32) float32) transform {
	return func(t safetensors.Tensor) (Tensor, error) {
		g, err := mapF32(f)(t)
		if err != nil {
			return g, err
		}
		g.Data = c.permute(g.Data, 0, 4)
		return g, nil
	}
}

// columns reorders the value-head column blocks of out_proj in every row.
func (c *converter) columns() transform {
	return func(t safetensors.Tensor) (Tensor, error) {
		g, err := asIs(t)
		if err != nil {
			return g, err
		}
		rowBytes := len(t.Data) / t.Shape[0]
		block := rowBytes / c.cfg.LinearValueHeads
		out := make([]byte, 0, len(t.Data))
		for r := 0; r < len(t.Data); r += rowBytes {
			out = append(out, c.permute(t.Data[r:r+rowBytes], 0, block)...)
		}
		g.Data = out
		return g, nil
	}
}

// readVocab renders tokenizer.json as GGUF's byte-level BPE vocabulary and
// returns the number of ids it uses (ids missing below the last one become
// unused tokens).
func readVocab(dir string, cfg *config.Config) ([]KV, int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, 0, err
	}
	var tj struct {
		Model struct {
			Vocab  map[string]int  `json:"vocab"`
			Merges json.RawMessage `json:"merges"`
		} `json:"model"`
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(data, &tj); err != nil {
		return nil, 0, fmt.Errorf("gguf: tokenizer.json: %w", err)
	}
	merges, err := parseMerges(tj.Model.Merges)
	if err != nil {
		return nil, 0, err
	}
	n := 0
	for _, id := range tj.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range tj.Added {
		n = max(n, a.ID+1)
	}
	if n > cfg.VocabSize {
		return nil, 0, fmt.Errorf("gguf: tokenizer.json uses ids up to %d, the model has %d embedding rows", n-1, cfg.VocabSize)
	}
	tokens, types := make([]string, n), make([]int32, n)
	const normal, control, userDefined, unused = 1, 3, 4, 5
	for i := range tokens {
		tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), unused
	}
	place := func(id int, s string, ty int32) error {
		if id < 0 || id >= n {
			return fmt.Errorf("gguf: token %q has id %d", s, id)
		}
		tokens[id], types[id] = s, ty
		return nil
	}
	for s, id := range tj.Model.Vocab {
		if err := place(id, s, normal); err != nil {
			return nil, 0, err
		}
	}
	for _, a := range tj.Added {
		ty := int32(userDefined)
		if a.Special {
			ty = control
		}
		if err := place(a.ID, a.Content, ty); err != nil {
			return nil, 0, err
		}
	}
	kv := []KV{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", "qwen2"},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.merges", merges},
		{"tokenizer.ggml.add_bos_token", false},
	}
	if len(cfg.EOSTokenIDs) > 0 {
		kv = append(kv, KV{"tokenizer.ggml.eos_token_id", uint32(cfg.EOSTokenIDs[0])})
	}
	return kv, n, nil
}

// parseMerges accepts both of tokenizer.json's merge forms: "a b" or ["a", "b"].
func parseMerges(raw json.RawMessage) ([]string, error) {
	var flat []string
	if err := json.Unmarshal(raw, &flat); err == nil {
		return flat, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("gguf: tokenizer.json merges: %w", err)
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = strings.Join(p[:], " ")
	}
	return out, nil
}
