// Package mtp runs the multi-token-prediction head that Qwen3.5/3.6/3.8
// checkpoints ship beside the text model (mtp.*) as a drafter: one
// full-attention decoder layer over fc([norm(embed(next token)) |
// norm(target hidden)]), applied Steps times per draft, each step fed its
// own previous output and its own greedy token. docs/mtp.md gives the
// published forward and where each detail comes from.
package mtp

import (
	"errors"
	"fmt"
	"math"

	"ddflash/engine"
	"ddflash/engine/config"
	"ddflash/engine/safetensors"
	"ddflash/kernels"
)

// MaxSteps is the most times one draft applies the head (--mtp-steps).
const MaxSteps = 8

// Head is the loaded MTP head bound to its target, whose embedding, final
// norm and LM head it shares, with the context K/V cache of its one
// attention layer. It runs on the target's rank-0 backend.
type Head struct {
	cfg    *config.Config // the target's: the MTP layer has its shapes
	b      kernels.Backend
	target *engine.Model

	fc                        kernels.Buffer // [hidden, 2·hidden] over [embedding | hidden]
	normEmbedding, normHidden kernels.Buffer // [hidden], (1+w)
	norm                      kernels.Buffer // [hidden], (1+w): before the LM head
	layer                     engine.LayerWeights

	kv        *engine.KVCache // one layer
	attn      kernels.AttnShape
	invFreq   kernels.Buffer
	ropeScale float32
	s         scratch
}

// Options sizes the head's KV cache: Tokens tokens (0: Sequences ×
// (Context + MaxSteps)) in pages of PageSize (0: engine.DefaultPageSize).
type Options struct {
	PageSize, Sequences, Context, Tokens int
}

// Load reads the MTP head from the target checkpoint in dir (the mtp.*
// tensors the target's own loader skips) and binds it to target.
func Load(dir string, target *engine.Model, opts Options) (*Head, error) {
	cfg := target.Cfg
	if cfg.MTPLayers != 1 {
		return nil, fmt.Errorf("mtp: %s has mtp_num_hidden_layers %d; ddflash runs checkpoints with one MTP layer (every Qwen3.5/3.6/3.8 release)", dir, cfg.MTPLayers)
	}
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ckpt.Close()
	h := &Head{cfg: cfg, b: target.Backend(), target: target}
	specs := h.tensorSpecs()
	engine.MarkQuantized(specs, cfg)
	if err := engine.LoadTensors(h.b, ckpt, specs, "mtp."); err != nil {
		return nil, fmt.Errorf("mtp head of %s: %w", dir, err)
	}
	if opts.PageSize <= 0 {
		opts.PageSize = engine.DefaultPageSize
	}
	if opts.Context <= 0 {
		opts.Context = cfg.MaxPositions
	}
	if opts.Tokens <= 0 {
		opts.Tokens = max(opts.Sequences, 1) * (opts.Context + MaxSteps)
	}
	shard := []engine.KVShard{{B: h.b, KVDim: engine.KVDim(cfg), DType: target.KV.Shard(0).DType}}
	if h.kv, err = engine.NewKVCache(shard, 1, opts.PageSize, (opts.Tokens+opts.PageSize-1)/opts.PageSize); err != nil {
		h.Close()
		return nil, err
	}
	freq, scale := config.RopeFrequencies(cfg.RopeTheta, cfg.RotaryDim(), cfg.YaRN)
	if h.invFreq, err = engine.UploadRopeFrequencies(h.b, freq); err != nil {
		h.Close()
		return nil, err
	}
	h.ropeScale = scale
	h.attn = kernels.AttnShape{
		NumHeads: cfg.NumHeads, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		PageSize: opts.PageSize, Scale: float32(1 / math.Sqrt(float64(cfg.HeadDim))),
	}
	return h, nil
}

// tensorSpecs lists the head's tensors (Qwen3.6-27B's published names).
func (h *Head) tensorSpecs() []engine.TensorSpec {
	c, l := h.cfg, &h.layer
	H, hd := c.HiddenSize, c.HeadDim
	qRows := c.NumHeads * hd
	if c.AttnOutputGate {
		qRows *= 2 // per head [query | gate]
	}
	kvDim := engine.KVDim(c)
	spec := func(name string, toF32 bool, dst *kernels.Buffer, shape ...int) engine.TensorSpec {
		return engine.TensorSpec{Name: name, Shape: shape, ToF32: toF32, Dst: dst}
	}
	p := "mtp.layers.0."
	return []engine.TensorSpec{
		spec("mtp.fc.weight", false, &h.fc, H, 2*H),
		spec("mtp.pre_fc_norm_embedding.weight", true, &h.normEmbedding, H),
		spec("mtp.pre_fc_norm_hidden.weight", true, &h.normHidden, H),
		spec("mtp.norm.weight", true, &h.norm, H),
		spec(p+"input_layernorm.weight", true, &l.InputNorm, H),
		spec(p+"post_attention_layernorm.weight", true, &l.PostNorm, H),
		spec(p+"self_attn.q_proj.weight", false, &l.QProj, qRows, H),
		spec(p+"self_attn.k_proj.weight", false, &l.KProj, kvDim, H),
		spec(p+"self_attn.v_proj.weight", false, &l.VProj, kvDim, H),
		spec(p+"self_attn.o_proj.weight", false, &l.OProj, H, c.NumHeads*hd),
		spec(p+"self_attn.q_norm.weight", true, &l.QNorm, hd),
		spec(p+"self_attn.k_norm.weight", true, &l.KNorm, hd),
		spec(p+"mlp.gate_proj.weight", false, &l.Gate, c.IntermediateSize, H),
		spec(p+"mlp.up_proj.weight", false, &l.Up, c.IntermediateSize, H),
		spec(p+"mlp.down_proj.weight", false, &l.Down, H, c.IntermediateSize),
	}
}

// Close releases the head's weights, cache and scratch (the shared
// embedding, final norm and LM head belong to the target). Closing again
// does nothing: each of a head's drafters (step counts) closes it.
func (h *Head) Close() {
	for _, s := range h.tensorSpecs() {
		if *s.Dst != nil {
			h.b.Free(*s.Dst)
			*s.Dst = nil
		}
	}
	if h.kv != nil {
		h.kv.Close()
		h.kv = nil
	}
	if h.invFreq != nil {
		h.b.Free(h.invFreq)
		h.invFreq = nil
	}
	h.s.free(h.b)
}

// Drafter is the head applied Steps times per draft: an engine.Drafter
// whose block is the anchor and Steps proposals. Drafters of one head
// share its weights and cache.
type Drafter struct {
	*Head
	Steps int
}

// Drafter returns the head as a drafter of steps proposals (1..MaxSteps).
func (h *Head) Drafter(steps int) (*Drafter, error) {
	if steps < 1 || steps > MaxSteps {
		return nil, fmt.Errorf("mtp: %d steps; want 1..%d", steps, MaxSteps)
	}
	return &Drafter{Head: h, Steps: steps}, nil
}

// TapLayers is the target's last layer: the head reads the hidden state
// after the final norm, which it applies to this tap itself.
func (d *Drafter) TapLayers() []int { return []int{d.cfg.NumLayers - 1} }

// BlockSize is the anchor and the Steps proposals.
func (d *Drafter) BlockSize() int { return d.Steps + 1 }

// NewSession starts an empty context.
func (d *Drafter) NewSession([]int32) (engine.DraftSession, error) { return &Session{d: d}, nil }

// Session is one sequence's head state: the K/V of its committed
// positions. Only committed positions stay in it; a draft's later steps
// write past them and the next draft overwrites those.
type Session struct {
	d      *Drafter
	kv     engine.SeqKV
	cached int // committed positions whose K/V are in the cache
}

// Close returns the session's cache pages.
func (s *Session) Close() { s.d.kv.Truncate(&s.kv, 0) }

// Draft fails: the head needs the tokens of its rows (DraftTokens).
func (s *Session) Draft([]float32, int32) ([]float32, error) {
	return nil, errors.New("mtp: a draft needs the committed tokens (engine.TokenDraftSession)")
}

// DraftTokens appends the committed rows (each the target's last-layer
// hidden state and its token) and returns Steps rows of logits over the
// target vocabulary. Row i of the context pairs hidden state i with the
// token after it (tokens[i+1], the anchor for the last) at position
// cached+i; step 1 is the last row's output; step k > 1 feeds step k-1's
// output hidden state and greedy token at the next position.
func (s *Session) DraftTokens(features []float32, tokens []int32, anchor int32) ([]float32, error) {
	d, b := s.d, s.d.b
	H, V := d.cfg.HiddenSize, d.cfg.VocabSize
	n := len(tokens)
	if n == 0 || len(features) != n*H {
		return nil, fmt.Errorf("mtp: %d feature values for %d tokens of %d-wide hidden states", len(features), n, H)
	}
	start := s.cached
	if err := d.kv.Reserve(&s.kv, start+n+d.Steps-1); err != nil {
		return nil, err
	}
	if err := d.s.ensure(b, d.cfg, n); err != nil {
		return nil, err
	}
	sc := &d.s
	if err := b.UploadF32(sc.hidden, 0, features); err != nil {
		return nil, err
	}
	// The target's hidden state as its LM head sees it: after the final norm.
	eps := float32(d.cfg.RMSNormEps)
	b.RMSNorm(sc.hidden, sc.hidden, d.target.FinalNorm(), n, H, eps, true)
	next := append(append(make([]int32, 0, n), tokens[1:]...), anchor)
	out := make([]float32, d.Steps*V)
	valid := d.target.ValidVocab
	if valid <= 0 || valid > V {
		valid = V
	}
	hidden := sc.hidden
	for k := range d.Steps {
		rows, pos := n, start
		if k > 0 {
			rows, pos = 1, start+n+k-1
		}
		if err := d.step(&s.kv, next, hidden, pos, rows); err != nil {
			return nil, err
		}
		// The last row's output is both the next step's hidden state and
		// this step's prediction.
		last := b.Slice(sc.out, (rows-1)*H, H)
		if err := d.target.ProjectVocab(sc.logits, last, 1); err != nil {
			return nil, err
		}
		row := out[k*V : (k+1)*V]
		if err := b.DownloadF32(sc.logits, 0, row); err != nil {
			return nil, err
		}
		b.Copy(sc.prev, last, 1, H, 0, 0)
		hidden, next = sc.prev, []int32{int32(engine.Argmax(row[:valid]))}
	}
	s.cached = start + n
	return out, nil
}

// step runs the head over rows inputs at positions pos.. : the tokens' ids
// and hidden states [rows, hidden] in; the normed outputs in d.s.out.
func (d *Drafter) step(kv *engine.SeqKV, ids []int32, hidden kernels.Buffer, pos, rows int) error {
	b, c, sc := d.b, d.cfg, &d.s
	H, hd := c.HiddenSize, c.HeadDim
	qDim, kvDim := c.NumHeads*hd, engine.KVDim(c)
	eps := float32(c.RMSNormEps)
	positions := make([]int32, rows)
	slots := make([]int32, rows)
	for i := range positions {
		positions[i] = int32(pos + i)
		slots[i] = kv.Slot(d.kv.PageSize(), pos+i)
	}
	idx, err := uploadIndices(b, ids, positions, slots, kv.Pages)
	if err != nil {
		return err
	}
	defer idx.free(b)

	// x = fc([norm_emb(embed(ids)) | norm_hidden(hidden)])
	b.Embedding(sc.u, d.target.Embeddings(), idx.ids, rows, H)
	b.RMSNorm(sc.u, sc.u, d.normEmbedding, rows, H, eps, true)
	b.Copy(sc.cat, sc.u, rows, H, 2*H, H)
	b.RMSNorm(sc.u, hidden, d.normHidden, rows, H, eps, true)
	b.Copy(b.Slice(sc.cat, H, sc.cat.Len()-H), sc.u, rows, H, 2*H, H)
	b.MatMul(sc.x, sc.cat, d.fc, rows, H, 2*H)

	// One gated full-attention decoder layer, as the target's.
	l := &d.layer
	b.RMSNorm(sc.u, sc.x, l.InputNorm, rows, H, eps, true)
	if c.AttnOutputGate {
		b.MatMul(sc.qg, sc.u, l.QProj, rows, 2*qDim, H)
		b.Copy(sc.q, sc.qg, rows*c.NumHeads, hd, hd, 2*hd)
		b.Copy(sc.gate, b.Slice(sc.qg, hd, sc.qg.Len()-hd), rows*c.NumHeads, hd, hd, 2*hd)
	} else {
		b.MatMul(sc.q, sc.u, l.QProj, rows, qDim, H)
	}
	b.MatMul(sc.k, sc.u, l.KProj, rows, kvDim, H)
	b.MatMul(sc.v, sc.u, l.VProj, rows, kvDim, H)
	b.RMSNorm(sc.q, sc.q, l.QNorm, rows*c.NumHeads, hd, eps, true)
	b.RMSNorm(sc.k, sc.k, l.KNorm, rows*c.NumKVHeads, hd, eps, true)
	b.RoPE(sc.q, idx.pos, d.invFreq, rows, c.NumHeads, hd, c.RotaryDim(), d.ropeScale)
	b.RoPE(sc.k, idx.pos, d.invFreq, rows, c.NumKVHeads, hd, c.RotaryDim(), d.ropeScale)
	kc, vc := d.kv.Layer(0, 0)
	b.WriteKV(kc, vc, sc.k, sc.v, idx.slots, rows, kvDim)
	b.Attention(sc.attn, sc.q, kc, vc, d.attn, []kernels.AttnSeq{{QueryLen: rows, Prefix: pos, Pages: idx.pages}})
	if c.AttnOutputGate {
		b.MulSigmoid(sc.attn, sc.gate, rows*qDim)
	}
	b.MatMul(sc.u, sc.attn, l.OProj, rows, H, qDim)
	b.Add(sc.x, sc.x, sc.u, rows*H)
	b.RMSNorm(sc.u, sc.x, l.PostNorm, rows, H, eps, true)
	b.MatMulGLU(sc.act, sc.up, sc.u, l.Gate, l.Up, rows, c.IntermediateSize, H)
	b.MatMul(sc.u, sc.act, l.Down, rows, H, c.IntermediateSize)
	b.Add(sc.x, sc.x, sc.u, rows*H)
	b.RMSNorm(sc.out, sc.x, d.norm, rows, H, eps, true)
	return nil
}

// indices are one step's uploaded index buffers.
type indices struct{ ids, pos, slots, pages kernels.Buffer }

func uploadIndices(b kernels.Backend, ids, pos, slots, pages []int32) (*indices, error) {
	idx := &indices{}
	for _, u := range []struct {
		dst *kernels.Buffer
		src []int32
	}{{&idx.ids, ids}, {&idx.pos, pos}, {&idx.slots, slots}, {&idx.pages, pages}} {
		buf, err := b.Alloc(kernels.I32, len(u.src))
		if err == nil {
			*u.dst = buf
			err = b.UploadI32(buf, 0, u.src)
		}
		if err != nil {
			idx.free(b)
			return nil, fmt.Errorf("mtp: index buffer: %w", err)
		}
	}
	return idx, nil
}

func (idx *indices) free(b kernels.Backend) {
	for _, buf := range []kernels.Buffer{idx.ids, idx.pos, idx.slots, idx.pages} {
		if buf != nil {
			b.Free(buf)
		}
	}
}

// scratch holds a draft's activations, grown to the most rows seen.
type scratch struct {
	rows int
	bufs []kernels.Buffer

	hidden, prev, out, x, u kernels.Buffer // [rows, hidden] (prev: one row)
	cat                     kernels.Buffer // [rows, 2·hidden]
	qg, q, gate, attn, k, v kernels.Buffer
	up, act                 kernels.Buffer
	logits                  kernels.Buffer // one row over the vocabulary
}

func (s *scratch) free(b kernels.Backend) {
	for _, buf := range s.bufs {
		b.Free(buf)
	}
	s.bufs, s.rows = nil, 0
}

func (s *scratch) ensure(b kernels.Backend, c *config.Config, rows int) error {
	if rows <= s.rows {
		return nil
	}
	s.free(b)
	H, qDim, kvDim := c.HiddenSize, c.NumHeads*c.HeadDim, engine.KVDim(c)
	for _, sz := range []struct {
		dst *kernels.Buffer
		n   int
	}{
		{&s.hidden, rows * H}, {&s.prev, H}, {&s.out, rows * H}, {&s.x, rows * H}, {&s.u, rows * H},
		{&s.cat, rows * 2 * H}, {&s.qg, rows * 2 * qDim}, {&s.q, rows * qDim}, {&s.gate, rows * qDim},
		{&s.attn, rows * qDim}, {&s.k, rows * kvDim}, {&s.v, rows * kvDim},
		{&s.up, rows * c.IntermediateSize}, {&s.act, rows * c.IntermediateSize}, {&s.logits, c.VocabSize},
	} {
		buf, err := b.Alloc(kernels.F32, sz.n)
		if err != nil {
			s.free(b)
			return fmt.Errorf("mtp: activations for %d rows: %w", rows, err)
		}
		*sz.dst = buf
		s.bufs = append(s.bufs, buf)
	}
	s.rows = rows
	return nil
}

// LoadFor loads the MTP head of the engine's target checkpoint (dir), its
// cache holding as many tokens as the target's KV cache.
func LoadFor(e *engine.Engine, dir string) (*Head, error) {
	kv := e.Model.KV
	return Load(dir, e.Model, Options{Sequences: e.MaxSeqs(), Context: e.Context, Tokens: kv.Pages() * kv.PageSize(), PageSize: kv.PageSize()})
}

// Attach loads the MTP head of the engine's target checkpoint (dir) and
// enables speculative decoding with it, steps proposals per draft. The
// engine must have been sized with Options.VerifyTokens >=
// spec.VerifyTokens(steps+1).
func Attach(e *engine.Engine, dir string, steps int, spec engine.SpecOptions) error {
	h, err := LoadFor(e, dir)
	if err != nil {
		return err
	}
	d, err := h.Drafter(steps)
	if err != nil {
		h.Close()
		return err
	}
	e.Drafter, e.Spec = d, spec
	return nil
}
