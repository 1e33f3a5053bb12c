package engine

import (
	"fmt"
	"math"
	"slices"

	"ddflash/ddtree"
	"ddflash/engine/config"
	"ddflash/kernels"
	"ddflash/mamba"
)

// chunkedPrefillMin is the block length from which the GDN recurrence uses
// the chunked form: below it the token loop is as fast and simpler.
const chunkedPrefillMin = 64

// gdnChunk is the chunk length of the chunked GDN form (as in the reference).
const gdnChunk = 64

// LogitRows selects which of a sequence's new rows produce logits.
type LogitRows int

const (
	// LastRow produces logits for the last new token only (prefill, decode).
	LastRow LogitRows = iota
	// AllRows produces logits for every new token (speculative verify).
	AllRows
	// NoRows produces no logits (a prefill chunk that is not the last).
	NoRows
)

// SeqInput is one sequence's share of a forward step: new tokens appended
// after Start tokens already in its KV cache and GDN state.
type SeqInput struct {
	Tokens []int32
	Start  int    // number of tokens already cached; Tokens[0] has position Start
	KV     *SeqKV // must already own pages for Start+len(Tokens) tokens
	Slot   int    // GDN state slot in the model's pool
	Logits LogitRows

	// Parents makes the new tokens a tree (speculative verify): token i
	// continues token Parents[i] (-1: the cached sequence), sits at position
	// Start+depth(i) and attends to its ancestors only. nil means a chain.
	Parents []int32
	// Spec, when set, verifies instead of committing: the GDN state is left
	// as it was and the inputs needed to commit an accepted path are kept in
	// Spec (see mamba.Verify.Commit and Model.CommitKV). The new tokens' K/V
	// are written at logical positions Start..Start+len(Tokens)-1 in token order.
	Spec *mamba.Verify
}

// SeqOutput is what the forward returns for one sequence.
type SeqOutput struct {
	// Logits holds rows×vocab values, rows as selected by SeqInput.Logits.
	Logits []float32
	// Hidden maps a tapped layer to its output hidden states, len(Tokens)×hidden.
	Hidden map[int][]float32
}

// Model runs the Qwen3.6 hybrid forward over a batch of sequences on a backend.
// It is not safe for concurrent use: one step loop owns it.
type Model struct {
	Cfg    *config.Config
	W      *Weights
	KV     *KVCache
	States *mamba.Pool

	b         kernels.Backend
	layerSlot []int // per layer: its index among layers of the same kind
	attn      kernels.AttnShape
	gdn       kernels.GDNShape
	invFreq   kernels.Buffer // RoPE inverse frequencies, F32 [rotary dim / 2]
	s         scratch
}

// NewModel wires weights and caches together. kv must have one layer per
// full-attention layer and states one per GDN layer.
func NewModel(b kernels.Backend, cfg *config.Config, w *Weights, kv *KVCache, states *mamba.Pool) (*Model, error) {
	m := &Model{Cfg: cfg, W: w, KV: kv, States: states, b: b}
	var nFull, nLinear int
	for _, kind := range cfg.Layers {
		if kind == config.Full {
			m.layerSlot = append(m.layerSlot, nFull)
			nFull++
		} else {
			m.layerSlot = append(m.layerSlot, nLinear)
			nLinear++
		}
	}
	m.attn = kernels.AttnShape{
		NumHeads: cfg.NumHeads, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		PageSize: kv.PageSize(), Scale: float32(1 / math.Sqrt(float64(cfg.HeadDim))),
	}
	m.gdn = StateShape(cfg).GDN
	var err error
	m.invFreq, err = UploadRopeFrequencies(b, RopeFrequencies(cfg.RopeTheta, cfg.RotaryDim()))
	return m, err
}

// RopeFrequencies are plain RoPE's inverse frequencies theta^(-2i/rotDim),
// rounded to F32 as the reference computes them.
func RopeFrequencies(theta float64, rotDim int) []float32 {
	f := make([]float32, rotDim/2)
	for i := range f {
		f[i] = float32(math.Pow(theta, -2*float64(i)/float64(rotDim)))
	}
	return f
}

// UploadRopeFrequencies puts inverse frequencies on the backend.
func UploadRopeFrequencies(b kernels.Backend, f []float32) (kernels.Buffer, error) {
	buf, err := b.Alloc(kernels.F32, len(f))
	if err != nil {
		return nil, fmt.Errorf("engine: RoPE frequencies: %w", err)
	}
	if err := b.UploadF32(buf, 0, f); err != nil {
		b.Free(buf)
		return nil, fmt.Errorf("engine: RoPE frequencies: %w", err)
	}
	return buf, nil
}

// StateShape is the GDN state geometry of a config, for sizing a mamba.Pool.
func StateShape(cfg *config.Config) mamba.Shape {
	return mamba.Shape{
		Layers: cfg.NumLinear(), ConvDim: cfg.ConvDim(), ConvKernel: cfg.ConvKernel,
		GDN: kernels.GDNShape{
			KeyHeads: cfg.LinearKeyHeads, ValueHeads: cfg.LinearValueHeads,
			KeyDim: cfg.LinearKeyDim, ValueDim: cfg.LinearValueDim,
		},
	}
}

// KVDim is the width of one token's K (or V) in one attention layer.
func KVDim(cfg *config.Config) int { return cfg.NumKVHeads * cfg.HeadDim }

// Forward runs one step for a batch of sequences and commits the new tokens
// to their KV caches and GDN states. taps lists layers whose output hidden
// states are returned (DFlash conditions on them).
func (m *Model) Forward(seqs []SeqInput, taps []int) ([]SeqOutput, error) {
	rows := 0
	for i, s := range seqs {
		if len(s.Tokens) == 0 {
			return nil, fmt.Errorf("engine: sequence %d has no new tokens", i)
		}
		if end := s.Start + len(s.Tokens); end > len(s.KV.Pages)*m.KV.PageSize() {
			return nil, fmt.Errorf("engine: sequence %d needs KV pages for %d tokens, has %d", i, end, len(s.KV.Pages)*m.KV.PageSize())
		}
		if s.Parents != nil && (s.Spec == nil || len(s.Parents) != len(s.Tokens)) {
			return nil, fmt.Errorf("engine: sequence %d: a tree needs one parent per token and verify scratch", i)
		}
		if s.Spec != nil {
			if err := s.Spec.Begin(len(s.Tokens), s.Parents); err != nil {
				return nil, fmt.Errorf("engine: sequence %d: %w", i, err)
			}
		}
		for _, t := range s.Tokens {
			if t < 0 || int(t) >= m.Cfg.VocabSize {
				return nil, fmt.Errorf("engine: sequence %d: token id %d outside the vocabulary of %d", i, t, m.Cfg.VocabSize)
			}
		}
		rows += len(s.Tokens)
	}
	for _, l := range taps {
		if l < 0 || l >= m.Cfg.NumLayers {
			return nil, fmt.Errorf("engine: tap layer %d outside 0..%d", l, m.Cfg.NumLayers-1)
		}
	}
	if err := m.s.ensure(m.b, m.Cfg, rows); err != nil {
		return nil, err
	}
	meta, err := m.uploadMeta(seqs, rows)
	if err != nil {
		return nil, err
	}
	defer meta.free(m.b)

	cfg, b, s := m.Cfg, m.b, &m.s
	H := cfg.HiddenSize
	eps := float32(cfg.RMSNormEps)
	b.Embedding(s.x, m.W.Embed, meta.ids, rows, H)

	tapped := map[int]kernels.Buffer{}
	for l, lw := range m.W.Layers {
		b.RMSNorm(s.h, s.x, lw.InputNorm, rows, H, eps, true)
		if lw.Kind == config.Full {
			m.attention(&lw, m.layerSlot[l], seqs, meta, rows)
		} else {
			m.deltaNet(&lw, m.layerSlot[l], seqs, rows)
		}
		b.Add(s.x, s.x, s.mix, rows*H)
		b.RMSNorm(s.h, s.x, lw.PostNorm, rows, H, eps, true)
		m.mlp(&lw, rows)
		b.Add(s.x, s.x, s.mix, rows*H)
		if slices.Contains(taps, l) {
			t, err := b.Alloc(kernels.F32, rows*H)
			if err != nil {
				return nil, fmt.Errorf("engine: hidden-state tap: %w", err)
			}
			defer b.Free(t)
			b.Copy(t, s.x, 1, rows*H, 0, 0)
			tapped[l] = t
		}
	}
	return m.outputs(seqs, rows, tapped)
}

func (m *Model) attention(lw *LayerWeights, idx int, seqs []SeqInput, meta *stepMeta, rows int) {
	cfg, b, s := m.Cfg, m.b, &m.s
	H, hd := cfg.HiddenSize, cfg.HeadDim
	qDim, kvDim := cfg.NumHeads*hd, KVDim(cfg)
	eps := float32(cfg.RMSNormEps)
	if cfg.AttnOutputGate {
		// q_proj emits [query | gate] per head: split the halves.
		b.MatMul(s.qg, s.h, lw.QProj, rows, 2*qDim, H)
		b.Copy(s.q, s.qg, rows*cfg.NumHeads, hd, hd, 2*hd)
		b.Copy(s.gate, b.Slice(s.qg, hd, s.qg.Len()-hd), rows*cfg.NumHeads, hd, hd, 2*hd)
	} else {
		b.MatMul(s.q, s.h, lw.QProj, rows, qDim, H)
	}
	b.MatMul(s.k, s.h, lw.KProj, rows, kvDim, H)
	b.MatMul(s.v, s.h, lw.VProj, rows, kvDim, H)
	b.RMSNorm(s.q, s.q, lw.QNorm, rows*cfg.NumHeads, hd, eps, true)
	b.RMSNorm(s.k, s.k, lw.KNorm, rows*cfg.NumKVHeads, hd, eps, true)
	b.RoPE(s.q, meta.pos, m.invFreq, rows, cfg.NumHeads, hd, cfg.RotaryDim(), 1)
	b.RoPE(s.k, meta.pos, m.invFreq, rows, cfg.NumKVHeads, hd, cfg.RotaryDim(), 1)
	kc, vc := m.KV.Layer(idx)
	b.WriteKV(kc, vc, s.k, s.v, meta.slots, rows, kvDim)
	b.Attention(s.attn, s.q, kc, vc, m.attn, meta.attnSeqs)
	if cfg.AttnOutputGate {
		b.MulSigmoid(s.attn, s.gate, rows*qDim)
	}
	b.MatMul(s.mix, s.attn, lw.OProj, rows, H, qDim)
}

func (m *Model) deltaNet(lw *LayerWeights, idx int, seqs []SeqInput, rows int) {
	cfg, b, s := m.Cfg, m.b, &m.s
	H := cfg.HiddenSize
	convDim, keyDim, valueDim := cfg.ConvDim(), cfg.KeyDim(), cfg.ValueDim()
	hv, K := cfg.LinearValueHeads, cfg.ConvKernel
	b.MatMul(s.mixed, s.h, lw.InProjQKV, rows, convDim, H)
	b.MatMul(s.z, s.h, lw.InProjZ, rows, valueDim, H)
	b.MatMul(s.beta, s.h, lw.InProjB, rows, hv, H)
	b.MatMul(s.g, s.h, lw.InProjA, rows, hv, H)
	b.GDNGates(s.g, s.beta, lw.ALog, lw.DtBias, rows, hv)

	r0 := 0
	for _, sq := range seqs {
		T := len(sq.Tokens)
		state, x := m.States.Conv(idx, sq.Slot), rowsOf(b, s.mixed, r0, T, convDim)
		b.CausalConv(rowsOf(b, s.conv, r0, T, convDim), x, state, lw.Conv, sq.Spec.Parents(), T, convDim, K)
		if sq.Spec == nil {
			b.ConvCommit(state, x, nil, T-1, convDim, K)
		}
		r0 += T
	}
	b.Copy(s.gq, s.conv, rows, keyDim, keyDim, convDim)
	b.Copy(s.gk, b.Slice(s.conv, keyDim, s.conv.Len()-keyDim), rows, keyDim, keyDim, convDim)
	b.Copy(s.gv, b.Slice(s.conv, 2*keyDim, s.conv.Len()-2*keyDim), rows, valueDim, valueDim, convDim)
	const l2eps = 1e-6
	b.L2Norm(s.gq, rows*cfg.LinearKeyHeads, cfg.LinearKeyDim, l2eps, float32(1/math.Sqrt(float64(cfg.LinearKeyDim))))
	b.L2Norm(s.gk, rows*cfg.LinearKeyHeads, cfg.LinearKeyDim, l2eps, 1)

	r0 = 0
	for _, sq := range seqs {
		T := len(sq.Tokens)
		state := m.States.SSM(idx, sq.Slot)
		out := rowsOf(b, s.gout, r0, T, valueDim)
		q, k, v := rowsOf(b, s.gq, r0, T, keyDim), rowsOf(b, s.gk, r0, T, keyDim), rowsOf(b, s.gv, r0, T, valueDim)
		g, beta := rowsOf(b, s.g, r0, T, hv), rowsOf(b, s.beta, r0, T, hv)
		switch {
		case sq.Spec != nil:
			sq.Spec.Save(idx, rowsOf(b, s.mixed, r0, T, convDim), q, k, v, g, beta)
			stateOut, nodeStates := sq.Spec.Targets(idx)
			b.GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, sq.Spec.Parents(), T, m.gdn)
		case T >= chunkedPrefillMin:
			b.GDNChunked(out, q, k, v, g, beta, state, state, T, gdnChunk, m.gdn)
		default:
			b.GDNRecurrence(out, q, k, v, g, beta, state, state, nil, nil, T, m.gdn)
		}
		r0 += T
	}
	b.GatedRMSNorm(s.gout, s.gout, s.z, lw.Norm, rows*hv, cfg.LinearValueDim, float32(cfg.RMSNormEps))
	b.MatMul(s.mix, s.gout, lw.OutProj, rows, H, valueDim)
}

func (m *Model) mlp(lw *LayerWeights, rows int) {
	cfg, b, s := m.Cfg, m.b, &m.s
	H, I := cfg.HiddenSize, cfg.IntermediateSize
	b.MatMul(s.up, s.h, lw.Up, rows, I, H)
	b.MatMul(s.act, s.h, lw.Gate, rows, I, H)
	b.SwiGLU(s.act, s.act, s.up, rows*I)
	b.MatMul(s.mix, s.act, lw.Down, rows, H, I)
}

// outputs computes logits for the selected rows and downloads them and the taps.
func (m *Model) outputs(seqs []SeqInput, rows int, tapped map[int]kernels.Buffer) ([]SeqOutput, error) {
	cfg, b, s := m.Cfg, m.b, &m.s
	H, V := cfg.HiddenSize, cfg.VocabSize
	// Gather the rows that need logits into s.h, then norm and project them.
	n, r0 := 0, 0
	for _, sq := range seqs {
		T := len(sq.Tokens)
		switch sq.Logits {
		case LastRow:
			b.Copy(rowsOf(b, s.h, n, 1, H), rowsOf(b, s.x, r0+T-1, 1, H), 1, H, H, H)
			n++
		case AllRows:
			b.Copy(rowsOf(b, s.h, n, T, H), rowsOf(b, s.x, r0, T, H), T, H, H, H)
			n += T
		}
		r0 += T
	}
	var logits kernels.Buffer
	if n > 0 {
		var err error
		if logits, err = b.Alloc(kernels.F32, n*V); err != nil {
			return nil, fmt.Errorf("engine: logits for %d rows: %w", n, err)
		}
		defer b.Free(logits)
		b.RMSNorm(s.h, s.h, m.W.FinalNorm, n, H, float32(cfg.RMSNormEps), true)
		b.MatMul(logits, s.h, m.W.LMHead, n, V, H)
	}
	out := make([]SeqOutput, len(seqs))
	n, r0 = 0, 0
	for i, sq := range seqs {
		T := len(sq.Tokens)
		want := map[LogitRows]int{LastRow: 1, AllRows: T}[sq.Logits]
		if want > 0 {
			out[i].Logits = make([]float32, want*V)
			if err := b.DownloadF32(logits, n*V, out[i].Logits); err != nil {
				return nil, fmt.Errorf("engine: download logits: %w", err)
			}
			n += want
		}
		if len(tapped) > 0 {
			out[i].Hidden = map[int][]float32{}
			for l, t := range tapped {
				h := make([]float32, T*H)
				if err := b.DownloadF32(t, r0*H, h); err != nil {
					return nil, fmt.Errorf("engine: download hidden states: %w", err)
				}
				out[i].Hidden[l] = h
			}
		}
		r0 += T
	}
	return out, nil
}

// CommitKV compacts an accepted tree path in the KV cache: the K/V of the
// token at logical position start+path[d] moves to start+d, in every
// attention layer. A chain prefix (path[d] == d) moves nothing.
func (m *Model) CommitKV(kv *SeqKV, start int, path []int32) error {
	ps := m.KV.PageSize()
	var dst, src []int32
	for _, mv := range ddtree.KVMoves(path) {
		dst = append(dst, kv.Slot(ps, start+mv.Dst))
		src = append(src, kv.Slot(ps, start+mv.Src))
	}
	if len(dst) == 0 {
		return nil
	}
	dstBuf, err := uploadI32(m.b, dst)
	if err != nil {
		return err
	}
	defer m.b.Free(dstBuf)
	srcBuf, err := uploadI32(m.b, src)
	if err != nil {
		return err
	}
	defer m.b.Free(srcBuf)
	for l := 0; l < m.Cfg.NumFull(); l++ {
		k, v := m.KV.Layer(l)
		m.b.MoveKV(k, v, dstBuf, srcBuf, len(dst), KVDim(m.Cfg))
	}
	return nil
}

// rowsOf is the view of rows r0..r0+n of a [*, width] buffer.
func rowsOf(b kernels.Backend, buf kernels.Buffer, r0, n, width int) kernels.Buffer {
	return b.Slice(buf, r0*width, n*width)
}

// stepMeta is the index data of one step, uploaded once and shared by layers.
type stepMeta struct {
	ids, pos, slots kernels.Buffer
	owned           []kernels.Buffer // per-sequence page tables and masks
	attnSeqs        []kernels.AttnSeq
}

func (m *Model) uploadMeta(seqs []SeqInput, rows int) (*stepMeta, error) {
	b, ps := m.b, m.KV.PageSize()
	ids := make([]int32, 0, rows)
	pos := make([]int32, 0, rows)
	slots := make([]int32, 0, rows)
	meta := &stepMeta{}
	r0 := 0
	for _, sq := range seqs {
		depth := treeDepths(sq.Parents, len(sq.Tokens))
		for j, t := range sq.Tokens {
			ids = append(ids, t)
			pos = append(pos, int32(sq.Start)+depth[j])
			slots = append(slots, sq.KV.Slot(ps, sq.Start+j))
		}
		attn := kernels.AttnSeq{QueryStart: r0, QueryLen: len(sq.Tokens), Prefix: sq.Start}
		var err error
		if attn.Pages, err = uploadI32(b, sq.KV.Pages); err != nil {
			meta.free(b)
			return nil, err
		}
		meta.owned = append(meta.owned, attn.Pages)
		if sq.Parents != nil {
			if attn.Mask, err = uploadI32(b, ddtree.AncestorMask(sq.Parents)); err != nil {
				meta.free(b)
				return nil, err
			}
			meta.owned = append(meta.owned, attn.Mask)
		}
		meta.attnSeqs = append(meta.attnSeqs, attn)
		r0 += len(sq.Tokens)
	}
	var err error
	for _, u := range []struct {
		dst *kernels.Buffer
		src []int32
	}{{&meta.ids, ids}, {&meta.pos, pos}, {&meta.slots, slots}} {
		if *u.dst, err = uploadI32(b, u.src); err != nil {
			meta.free(b)
			return nil, err
		}
	}
	return meta, nil
}

func (meta *stepMeta) free(b kernels.Backend) {
	for _, buf := range append([]kernels.Buffer{meta.ids, meta.pos, meta.slots}, meta.owned...) {
		if buf != nil {
			b.Free(buf)
		}
	}
}

// treeDepths returns each token's depth below the cached sequence: its index
// for a chain (parents nil), its distance from the root for a tree.
func treeDepths(parents []int32, n int) []int32 {
	d := make([]int32, n)
	for i := range d {
		switch {
		case parents == nil:
			d[i] = int32(i)
		case parents[i] >= 0:
			d[i] = d[parents[i]] + 1
		}
	}
	return d
}

func uploadI32(b kernels.Backend, v []int32) (kernels.Buffer, error) {
	buf, err := b.Alloc(kernels.I32, max(len(v), 1))
	if err != nil {
		return nil, fmt.Errorf("engine: index buffer: %w", err)
	}
	if err := b.UploadI32(buf, 0, v); err != nil {
		b.Free(buf)
		return nil, fmt.Errorf("engine: upload index buffer: %w", err)
	}
	return buf, nil
}

// scratch holds the step's activations, grown to the largest batch seen.
type scratch struct {
	rows int
	bufs []kernels.Buffer

	x, h, mix           kernels.Buffer // [rows, hidden]
	qg, q, gate, attn   kernels.Buffer // attention
	k, v                kernels.Buffer
	mixed, conv, z      kernels.Buffer // GDN
	g, beta, gq, gk, gv kernels.Buffer
	gout                kernels.Buffer
	up, act             kernels.Buffer // MLP
}

func (s *scratch) ensure(b kernels.Backend, cfg *config.Config, rows int) error {
	if rows <= s.rows {
		return nil
	}
	for _, buf := range s.bufs {
		b.Free(buf)
	}
	s.bufs = nil
	H, qDim, kvDim := cfg.HiddenSize, cfg.NumHeads*cfg.HeadDim, KVDim(cfg)
	sizes := []struct {
		dst   *kernels.Buffer
		width int
	}{
		{&s.x, H}, {&s.h, H}, {&s.mix, H},
		{&s.qg, 2 * qDim}, {&s.q, qDim}, {&s.gate, qDim}, {&s.attn, qDim}, {&s.k, kvDim}, {&s.v, kvDim},
		{&s.mixed, cfg.ConvDim()}, {&s.conv, cfg.ConvDim()}, {&s.z, cfg.ValueDim()},
		{&s.g, cfg.LinearValueHeads}, {&s.beta, cfg.LinearValueHeads},
		{&s.gq, cfg.KeyDim()}, {&s.gk, cfg.KeyDim()}, {&s.gv, cfg.ValueDim()}, {&s.gout, cfg.ValueDim()},
		{&s.up, cfg.IntermediateSize}, {&s.act, cfg.IntermediateSize},
	}
	for _, sz := range sizes {
		buf, err := b.Alloc(kernels.F32, rows*sz.width)
		if err != nil {
			return fmt.Errorf("engine: activations for %d rows: %w", rows, err)
		}
		*sz.dst = buf
		s.bufs = append(s.bufs, buf)
	}
	s.rows = rows
	return nil
}
