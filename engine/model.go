package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

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
	// Top > 0 reduces the logit rows on the device: the step returns each
	// row's Top best logits over the real token ids with their ids
	// (SeqOutput.TopIDs and TopLogits) instead of the row, for a token that
	// needs nothing else from it: greedy decoding (1), sampling with top-k (k).
	Top int
	// KeepTaps leaves the sequence's tapped rows on the device
	// (SeqOutput.Taps) instead of bringing them home (Features).
	KeepTaps bool
}

// SeqOutput is what the forward returns for one sequence.
type SeqOutput struct {
	// Logits holds rows×vocab values, rows as selected by SeqInput.Logits.
	// It is nil when SeqInput.Top reduced the rows.
	Logits []float32
	// Top is SeqInput.Top; TopIDs and TopLogits hold rows×Top ids and
	// logits, each row's best first (ties: the lower id).
	Top       int
	TopIDs    []int32
	TopLogits []float32
	// Features holds, for each of the len(Tokens) rows, the tapped layers'
	// output hidden states in the order taps lists them: the drafter's input
	// layout. It is the model's buffer, valid until the next Forward; nil
	// when SeqInput.KeepTaps left them on the device.
	Features []float32
	// Taps holds the same rows on rank 0's backend: the model's whole tap
	// buffer, rows of [taps, hidden], whose first rows are the step's, every
	// sequence's in turn, this one's from TapRow on. The buffer and its
	// length stay as they are from step to step until Moves changes, so a
	// recording may read it; its contents are valid until the next Forward.
	Taps   kernels.Buffer
	TapRow int
}

// Model runs the Qwen3.6 hybrid forward over a batch of sequences on one
// backend, or split over tensor-parallel ranks (tp.go). It is not safe for
// concurrent use: one step loop owns it.
type Model struct {
	Cfg    *config.Config // the whole model
	KV     *KVCache
	States *mamba.Pool

	// ValidVocab is the number of real token ids (Cfg.VocabSize when 0);
	// device argmaxes skip the padding rows beyond.
	ValidVocab int

	ranks     []*rank
	comm      Comm
	layerSlot []int // per layer: its index among layers of the same kind
	// out holds what a step brings home from rank 0 (stepOutputs): the
	// tapped hidden states, [rows, taps, hidden], then a Replayer's device
	// top-k; hostOut is their copy on the host (SeqOutput.Features point
	// into it). Both are kept between steps: a drafting request taps every
	// step.
	out     kernels.Buffer
	hostOut []float32

	// Eager runs every step op by op, never replaying a recorded one
	// (for comparisons and measurements of the replay).
	Eager bool
	// Steps counts the forwards run (prefill chunks, decode and verify steps).
	Steps int64
	steps stepGraphs // recorded steps (step.go)
	padKV SeqKV      // a padding sequence's borrowed page (padDecode)
	moves int        // dropGraphs calls (Moves)
	tops  deviceTops // the layout of a Replayer's step's device top-k
}

// Shard is one tensor-parallel rank's weights and the backend they are on.
type Shard struct {
	B kernels.Backend
	W *Weights
}

// rank is one tensor-parallel rank: its backend, weights, the geometry of
// the heads it owns and its activations.
type rank struct {
	id        int
	b         kernels.Backend
	cfg       *config.Config // this rank's share of heads and MLP width
	w         *Weights
	vocab     int // LM-head rows (vocabulary slice) on this rank
	attn      kernels.AttnShape
	gdn       kernels.GDNShape
	invFreq   kernels.Buffer // RoPE inverse frequencies, F32 [rotary dim / 2] (plain or YaRN)
	ropeScale float32        // YaRN's attention factor on cos and sin; 1 for plain RoPE
	s         scratch
	meta      *stepMeta        // the step's index data (uploadMeta)
	head      *vocabProjection // the LM head's buffers (Model.head)
	moves     kernels.Buffer   // CommitKV's slot pairs, kept between commits
}

// NewModel wires weights and caches together: one shard per tensor-parallel
// rank (comm connects them; nil for one rank). kv must have one layer per
// full-attention layer and states one per GDN layer, on the same ranks.
func NewModel(cfg *config.Config, shards []Shard, kv *KVCache, states *mamba.Pool, comm Comm) (*Model, error) {
	tp := len(shards)
	rc, err := splitConfig(cfg, tp)
	if err != nil {
		return nil, err
	}
	if tp > 1 && (comm == nil || comm.Size() != tp) {
		return nil, fmt.Errorf("engine: %d ranks need a communicator of that size", tp)
	}
	m := &Model{Cfg: cfg, KV: kv, States: states, comm: comm}
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
	for i, sh := range shards {
		r := &rank{id: i, b: sh.B, cfg: rc, w: sh.W, vocab: cfg.VocabSize / tp, gdn: StateShape(rc).GDN,
			attn: kernels.AttnShape{
				NumHeads: rc.NumHeads, NumKVHeads: rc.NumKVHeads, HeadDim: rc.HeadDim,
				PageSize: kv.PageSize(), Scale: float32(1 / math.Sqrt(float64(rc.HeadDim))),
			}}
		freqs, scale := config.RopeFrequencies(cfg.RopeTheta, cfg.RotaryDim(), cfg.YaRN)
		if r.invFreq, err = UploadRopeFrequencies(sh.B, freqs); err != nil {
			return nil, err
		}
		r.ropeScale = scale
		m.ranks = append(m.ranks, r)
	}
	return m, nil
}

// Close releases the model's weights, activations and caches on every rank.
func (m *Model) Close() {
	m.dropGraphs()
	for _, r := range m.ranks {
		r.w.Free(r.b)
		r.b.Free(r.invFreq)
		r.s.free(r.b)
		r.meta.free(r.b)
		if r.head != nil {
			r.head.free(r.b)
		}
		if r.moves != nil {
			r.b.Free(r.moves)
		}
	}
	if m.out != nil {
		m.ranks[0].b.Free(m.out)
	}
	m.KV.Close()
	m.States.Close()
	if c, ok := m.comm.(interface{ Close() }); ok { // NCCL communicators
		c.Close()
	}
}

// Backend is rank 0's backend, where the drafter runs and outputs are read.
func (m *Model) Backend() kernels.Backend { return m.ranks[0].b }

// Embeddings is the token embedding table [vocab, hidden] on rank 0 (every
// rank holds a replica).
func (m *Model) Embeddings() kernels.Buffer { return m.ranks[0].w.Embed }

// FinalNorm is the final norm's weight [hidden] on rank 0, (1+w): the
// norm before the LM head.
func (m *Model) FinalNorm() kernels.Buffer { return m.ranks[0].w.FinalNorm }

// onRanks runs f on every rank at once (each rank its own goroutine, as
// collectives need) and joins their errors.
func (m *Model) onRanks(f func(r *rank) error) error {
	if len(m.ranks) == 1 {
		return f(m.ranks[0])
	}
	errs := make([]error, len(m.ranks))
	var wg sync.WaitGroup
	for i, r := range m.ranks {
		wg.Go(func() { errs[i] = f(r) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// allReduce sums a row-parallel layer's partial outputs over ranks.
func (m *Model) allReduce(r *rank, buf kernels.Buffer, n int) error {
	if m.comm == nil || len(m.ranks) == 1 {
		return nil
	}
	return m.comm.AllReduceSum(r.id, buf, n)
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
//
// On a backend that records steps (kernels.Replayer, one rank), a decode
// or verify step whose shape was seen before replays the ops recorded the
// second time it was seen (step.go); its per-step values reach the device
// in one upload, and its buffers persist, so it allocates nothing.
func (m *Model) Forward(seqs []SeqInput, taps []int) ([]SeqOutput, error) {
	real := len(seqs)
	seqs = m.padDecode(seqs)
	rows, logitRows, err := m.checkInputs(seqs, taps)
	if err != nil {
		return nil, err
	}
	// Everything that can fail is allocated before the ranks start, so no
	// rank can give up while its peers wait in a collective.
	heads := make([]*vocabProjection, len(m.ranks))
	for i, r := range m.ranks {
		if r.s.rows < rows {
			m.dropGraphs() // the activations move
		}
		if err := r.s.ensure(r.b, r.cfg, rows); err != nil {
			return nil, err
		}
		if err := m.uploadMeta(r, seqs, rows); err != nil {
			return nil, err
		}
		if logitRows > 0 {
			if heads[i], err = m.head(r, logitRows); err != nil {
				return nil, err
			}
		}
	}
	tapped, tops, err := m.stepOutputs(seqs, len(taps), rows, logitRows)
	if err != nil {
		return nil, err
	}
	step := func() error {
		err := m.onRanks(func(r *rank) error {
			if err := m.layers(r, seqs, r.meta, rows, taps, tapped); err != nil {
				return err
			}
			if logitRows == 0 {
				return nil
			}
			m.gatherLogitRows(r, seqs)
			r.b.RMSNorm(r.s.h, r.s.h, r.w.FinalNorm, logitRows, m.Cfg.HiddenSize, float32(m.Cfg.RMSNormEps), true)
			return m.projectVocab(r, heads[r.id], r.s.h, logitRows)
		})
		if err == nil && tops != nil {
			m.reduceTops(seqs, heads[0].logits, tops)
		}
		return err
	}
	if err := m.runStep(seqs, taps, step); err != nil {
		return nil, err
	}
	m.Steps++
	var logits kernels.Buffer
	if logitRows > 0 {
		logits = heads[0].logits
	}
	out, err := m.outputs(seqs, logits, tops, len(taps), tapped)
	if err != nil {
		return nil, err
	}
	return out[:real], nil
}

// stepOutputs lays out rank 0's m.out for a step: the tapped layers'
// hidden states [rows, taps, hidden] (nil without taps), then the device
// top-k (nil unless a Replayer's step asks for one), so that one download
// brings both home. m.out grows when they do not fit.
func (m *Model) stepOutputs(seqs []SeqInput, taps, rows, logitRows int) (kernels.Buffer, *deviceTops, error) {
	b0 := m.ranks[0].b
	tapsLen := rows * taps * m.Cfg.HiddenSize
	tops := m.layoutTops(seqs, logitRows)
	size := tapsLen
	if tops != nil {
		size += tops.used
	}
	if size == 0 {
		return nil, nil, nil
	}
	if m.out == nil || m.out.Len() < size {
		m.dropGraphs()
		if m.out != nil {
			b0.Free(m.out)
			m.out = nil
		}
		buf, err := b0.Alloc(kernels.F32, size)
		if err != nil {
			return nil, nil, fmt.Errorf("engine: step outputs: %w", err)
		}
		m.out = buf
	}
	var tapped kernels.Buffer
	if tapsLen > 0 {
		tapped = b0.Slice(m.out, 0, tapsLen)
	}
	if tops != nil {
		tops.buf = b0.Slice(m.out, tapsLen, tops.used)
	}
	return tapped, tops, nil
}

// checkInputs validates a step and begins its verifies; it returns the rows
// of the step and how many of them produce logits.
func (m *Model) checkInputs(seqs []SeqInput, taps []int) (rows, logitRows int, err error) {
	for i, s := range seqs {
		if len(s.Tokens) == 0 {
			return 0, 0, fmt.Errorf("engine: sequence %d has no new tokens", i)
		}
		if end := s.Start + len(s.Tokens); end > len(s.KV.Pages)*m.KV.PageSize() {
			return 0, 0, fmt.Errorf("engine: sequence %d needs KV pages for %d tokens, has %d", i, end, len(s.KV.Pages)*m.KV.PageSize())
		}
		if s.Parents != nil && (s.Spec == nil || len(s.Parents) != len(s.Tokens)) {
			return 0, 0, fmt.Errorf("engine: sequence %d: a tree needs one parent per token and verify scratch", i)
		}
		if s.Spec != nil {
			if err := s.Spec.Begin(len(s.Tokens), s.Parents); err != nil {
				return 0, 0, fmt.Errorf("engine: sequence %d: %w", i, err)
			}
		}
		for _, t := range s.Tokens {
			if t < 0 || int(t) >= m.Cfg.VocabSize {
				return 0, 0, fmt.Errorf("engine: sequence %d: token id %d outside the vocabulary of %d", i, t, m.Cfg.VocabSize)
			}
		}
		rows += len(s.Tokens)
		logitRows += s.Logits.count(len(s.Tokens))
	}
	for _, l := range taps {
		if l < 0 || l >= m.Cfg.NumLayers {
			return 0, 0, fmt.Errorf("engine: tap layer %d outside 0..%d", l, m.Cfg.NumLayers-1)
		}
	}
	return rows, logitRows, nil
}

// count is how many of a sequence's n new rows produce logits.
func (lr LogitRows) count(n int) int {
	switch lr {
	case LastRow:
		return 1
	case AllRows:
		return n
	}
	return 0
}

// layers runs the decoder stack on one rank, leaving the final residual
// stream in r.s.x; rank 0 copies the outputs of the layers taps lists into
// tapped, [rows, taps, hidden].
func (m *Model) layers(r *rank, seqs []SeqInput, meta *stepMeta, rows int, taps []int, tapped kernels.Buffer) error {
	b, s, H := r.b, &r.s, m.Cfg.HiddenSize
	eps := float32(m.Cfg.RMSNormEps)
	b.Embedding(s.x, r.w.Embed, meta.ids, rows, H)
	b.RMSNorm(s.h, s.x, r.w.Layers[0].InputNorm, rows, H, eps, true)
	// Each residual add is fused with the norm that follows it: the MLP's,
	// and the next layer's input norm.
	for l, lw := range r.w.Layers {
		if lw.Kind == config.Full {
			m.attention(r, &lw, m.layerSlot[l], meta, rows)
		} else {
			m.deltaNet(r, &lw, m.layerSlot[l], seqs, rows)
		}
		if err := m.allReduce(r, s.mix, rows*H); err != nil {
			return err
		}
		b.AddRMSNorm(s.x, s.mix, s.h, lw.PostNorm, rows, H, eps, true)
		m.mlp(r, &lw, rows)
		if err := m.allReduce(r, s.mix, rows*H); err != nil {
			return err
		}
		if l+1 < len(r.w.Layers) {
			b.AddRMSNorm(s.x, s.mix, s.h, r.w.Layers[l+1].InputNorm, rows, H, eps, true)
		} else {
			b.Add(s.x, s.x, s.mix, rows*H)
		}
		if k := slices.Index(taps, l); k >= 0 && r.id == 0 {
			width := len(taps) * H
			b.Copy(b.Slice(tapped, k*H, rows*width-k*H), s.x, rows, H, width, H)
		}
	}
	return nil
}

func (m *Model) attention(r *rank, lw *LayerWeights, idx int, meta *stepMeta, rows int) {
	cfg, b, s := r.cfg, r.b, &r.s
	H, hd := cfg.HiddenSize, cfg.HeadDim
	qDim, kvDim := cfg.NumHeads*hd, KVDim(cfg)
	eps := float32(cfg.RMSNormEps)
	q := kernels.MatMulPart{W: lw.QProj, Out: s.q, N: qDim}
	var qg, gate kernels.Buffer
	if cfg.AttnOutputGate { // q_proj emits [query | gate] per head: AttnInputs splits the halves
		q.Out, q.N, qg, gate = s.qg, 2*qDim, s.qg, s.gate
	}
	b.MatMulParts(s.h, rows, H, []kernels.MatMulPart{q, {W: lw.KProj, Out: s.k, N: kvDim}, {W: lw.VProj, Out: s.v, N: kvDim}})
	kc, vc := m.KV.Layer(r.id, idx)
	b.AttnInputs(s.q, qg, gate, s.k, s.v, lw.QNorm, lw.KNorm, meta.pos, r.invFreq, kc, vc, meta.slots, rows, kernels.AttnInputShape{
		Heads: cfg.NumHeads, KVHeads: cfg.NumKVHeads, HeadDim: hd, RotDim: cfg.RotaryDim(), Eps: eps, RoPEScale: r.ropeScale,
	})
	if rp, ok := b.(kernels.Replayer); ok {
		rp.AttentionTable(s.attn, s.q, kc, vc, r.attn, meta.attnSeqs, meta.table, meta.maxKeys)
	} else {
		b.Attention(s.attn, s.q, kc, vc, r.attn, meta.attnSeqs)
	}
	if cfg.AttnOutputGate {
		b.MulSigmoid(s.attn, s.gate, rows*qDim)
	}
	b.MatMul(s.mix, s.attn, lw.OProj, rows, H, qDim)
}

func (m *Model) deltaNet(r *rank, lw *LayerWeights, idx int, seqs []SeqInput, rows int) {
	cfg, b, s := r.cfg, r.b, &r.s
	H := cfg.HiddenSize
	convDim, keyDim, valueDim := cfg.ConvDim(), cfg.KeyDim(), cfg.ValueDim()
	hv, K := cfg.LinearValueHeads, cfg.ConvKernel
	b.MatMulParts(s.h, rows, H, []kernels.MatMulPart{
		{W: lw.InProjQKV, Out: s.mixed, N: convDim}, {W: lw.InProjZ, Out: s.z, N: valueDim},
		{W: lw.InProjB, Out: s.beta, N: hv}, {W: lw.InProjA, Out: s.g, N: hv},
	})
	// On a backend that records steps, a decoding or verifying sequence
	// names its state slot through the step's metadata (meta.states), so
	// that one recording serves any slots (stepShape leaves them out).
	_, slotted := b.(kernels.Replayer)
	slotAt := func(i int) kernels.Buffer { return b.Slice(r.meta.states, i, 1) }
	convSeqs := make([]kernels.GDNConvSeq, len(seqs))
	for i, sq := range seqs {
		convSeqs[i] = kernels.GDNConvSeq{Rows: len(sq.Tokens), State: m.States.Conv(r.id, idx, sq.Slot), Parents: sq.Spec.Parents(r.id), Commit: sq.Spec == nil}
		if slotted {
			convSeqs[i].State, convSeqs[i].SlotAt = m.States.ConvLayer(r.id, idx), slotAt(i)
		}
	}
	const l2eps = 1e-6
	b.GDNConvInputs(s.gq, s.gk, s.gv, s.g, s.beta, s.mixed, lw.Conv, lw.ALog, lw.DtBias, convSeqs, K, r.gdn, l2eps, float32(1/math.Sqrt(float64(cfg.LinearKeyDim))))

	// The token-loop recurrences (verifies, decode) run together; chains
	// long enough for the chunked form run on their own.
	var rec []kernels.GDNSeq
	r0 := 0
	for i, sq := range seqs {
		T := len(sq.Tokens)
		state := m.States.SSM(r.id, idx, sq.Slot)
		switch _, whole := chainSplit(sq.Start, T); {
		case sq.Spec != nil:
			q, k, v := rowsOf(b, s.gq, r0, T, keyDim), rowsOf(b, s.gk, r0, T, keyDim), rowsOf(b, s.gv, r0, T, valueDim)
			g, beta := rowsOf(b, s.g, r0, T, hv), rowsOf(b, s.beta, r0, T, hv)
			sq.Spec.Save(r.id, idx, rowsOf(b, s.mixed, r0, T, convDim), q, k, v, g, beta)
			stateOut, nodeStates := sq.Spec.Targets(r.id, idx)
			d := kernels.GDNSeq{Start: r0, Rows: T, State: state, StateOut: stateOut, NodeStates: nodeStates, Parents: sq.Spec.Parents(r.id)}
			if slotted {
				d.State, d.SlotAt = m.States.SSMLayer(r.id, idx), slotAt(i)
			}
			rec = append(rec, d)
		case whole == 0 && slotted:
			all := m.States.SSMLayer(r.id, idx)
			rec = append(rec, kernels.GDNSeq{Start: r0, Rows: T, State: all, StateOut: all, SlotAt: slotAt(i)})
		case whole == 0:
			rec = append(rec, kernels.GDNSeq{Start: r0, Rows: T, State: state, StateOut: state})
		default:
			m.gdnChain(r, sq.Start, T, r0, state)
		}
		r0 += T
	}
	b.GDNRecurrences(s.gout, s.gq, s.gk, s.gv, s.g, s.beta, rec, r.gdn)
	b.GatedRMSNorm(s.gout, s.gout, s.z, lw.Norm, rows*hv, cfg.LinearValueDim, float32(cfg.RMSNormEps))
	b.MatMul(s.mix, s.gout, lw.OutProj, rows, H, valueDim)
}

// chainSplit splits a chain of T tokens from position start into the
// tokens before the first whole gdnChunk-aligned chunk (by absolute
// position) and the whole chunks after them: all head when the chunks
// would be fewer than chunkedPrefillMin tokens.
func chainSplit(start, T int) (head, whole int) {
	head = min((gdnChunk-start%gdnChunk)%gdnChunk, T)
	whole = (T - head) / gdnChunk * gdnChunk
	if whole < chunkedPrefillMin {
		return T, 0
	}
	return head, whole
}

// gdnChain runs the recurrence over a chain of T tokens from position start
// whose inputs are rows r0.. of the step: the whole gdnChunk-aligned chunks
// (by absolute position) in the chunked form, the tokens before and after
// them in the token loop. The states and outputs then depend only on the
// tokens, not on where prefill forwards begin and end at chunk boundaries,
// so a prefix restored from a cached checkpoint continues exactly as a
// prefill from the start would.
func (m *Model) gdnChain(r *rank, start, T, r0 int, state kernels.Buffer) {
	b, s, cfg := r.b, &r.s, r.cfg
	keyDim, valueDim, hv := cfg.KeyDim(), cfg.ValueDim(), cfg.LinearValueHeads
	head, whole := chainSplit(start, T)
	run := func(from, n int, chunked bool) {
		if n == 0 {
			return
		}
		i := r0 + from
		out := rowsOf(b, s.gout, i, n, valueDim)
		q, k, v := rowsOf(b, s.gq, i, n, keyDim), rowsOf(b, s.gk, i, n, keyDim), rowsOf(b, s.gv, i, n, valueDim)
		g, beta := rowsOf(b, s.g, i, n, hv), rowsOf(b, s.beta, i, n, hv)
		if chunked {
			b.GDNChunked(out, q, k, v, g, beta, state, state, n, gdnChunk, r.gdn)
		} else {
			b.GDNRecurrence(out, q, k, v, g, beta, state, state, nil, nil, n, r.gdn)
		}
	}
	run(0, head, false)
	run(head, whole, true)
	run(head+whole, T-head-whole, false)
}

func (m *Model) mlp(r *rank, lw *LayerWeights, rows int) {
	b, s := r.b, &r.s
	H, I := r.cfg.HiddenSize, r.cfg.IntermediateSize
	b.MatMulGLU(s.act, s.up, s.h, lw.Gate, lw.Up, rows, I, H)
	b.MatMul(s.mix, s.act, lw.Down, rows, H, I)
}

// gatherLogitRows copies the rows that need logits from the residual stream
// into r.s.h, in sequence order.
func (m *Model) gatherLogitRows(r *rank, seqs []SeqInput) {
	b, s, H := r.b, &r.s, m.Cfg.HiddenSize
	n, r0 := 0, 0
	for _, sq := range seqs {
		T := len(sq.Tokens)
		if c := sq.Logits.count(T); c > 0 {
			b.Copy(rowsOf(b, s.h, n, c, H), rowsOf(b, s.x, r0+T-c, c, H), c, H, H, H)
			n += c
		}
		r0 += T
	}
}

// vocabProjection holds one rank's buffers for scoring n rows over the
// vocabulary: its slice of the logits and, with several ranks, every rank's
// slices gathered, which rank 0 interleaves into logits [n, vocab].
type vocabProjection struct {
	rows, scored   int // logit rows; this rank's real-id rows of the head
	part, gathered kernels.Buffer
	logits         kernels.Buffer // rank 0 only
	// With padding rows in this rank's slice: the scores of its real ids
	// when several rows are scored (MatMul writes them packed), and one
	// row of -Inf for the padding columns.
	packed, padding kernels.Buffer
	bufs            []kernels.Buffer
}

// scoredRows is how many of rank r's LM-head rows belong to real token ids.
// The padding rows beyond them are never sampled, so their weights are not
// read and their logits are -Inf.
func (m *Model) scoredRows(r *rank) int {
	return min(r.vocab, max(0, m.validVocab()-r.id*r.vocab))
}

// validVocab is the number of real token ids: ValidVocab, or the whole
// vocabulary when that is unset or out of range.
func (m *Model) validVocab() int {
	if m.ValidVocab <= 0 || m.ValidVocab > m.Cfg.VocabSize {
		return m.Cfg.VocabSize
	}
	return m.ValidVocab
}

// newVocabProjection allocates rank r's buffers for scoring n rows; with
// into (one rank only), the logits are scored straight into it.
func (m *Model) newVocabProjection(r *rank, n int, into kernels.Buffer) (*vocabProjection, error) {
	vp := &vocabProjection{rows: n, scored: m.scoredRows(r), part: into}
	alloc := func(dst *kernels.Buffer, size int) error {
		buf, err := r.b.Alloc(kernels.F32, size)
		if err != nil {
			vp.free(r.b)
			return fmt.Errorf("engine: logits for %d rows: %w", n, err)
		}
		*dst = buf
		vp.bufs = append(vp.bufs, buf)
		return nil
	}
	if into == nil {
		if err := alloc(&vp.part, n*r.vocab); err != nil {
			return nil, err
		}
	}
	if scored := m.scoredRows(r); scored < r.vocab {
		if err := alloc(&vp.padding, r.vocab-scored); err != nil {
			return nil, err
		}
		r.b.Fill(vp.padding, float32(math.Inf(-1)))
		if n > 1 && scored > 0 {
			if err := alloc(&vp.packed, n*scored); err != nil {
				return nil, err
			}
		}
	}
	if len(m.ranks) == 1 {
		vp.logits = vp.part
		return vp, nil
	}
	if err := alloc(&vp.gathered, n*m.Cfg.VocabSize); err != nil {
		return nil, err
	}
	if r.id == 0 {
		if err := alloc(&vp.logits, n*m.Cfg.VocabSize); err != nil {
			return nil, err
		}
	}
	return vp, nil
}

// head returns rank r's LM-head buffers for n logit rows: views of the
// first n rows of buffers kept from step to step (a recorded step reads
// them), grown for the most rows a step has had (and made again when
// ValidVocab changes).
func (m *Model) head(r *rank, n int) (*vocabProjection, error) {
	if r.head == nil || r.head.rows < n || r.head.scored != m.scoredRows(r) {
		m.dropGraphs()
		if r.head != nil {
			r.head.free(r.b)
			r.head = nil
		}
		vp, err := m.newVocabProjection(r, n, nil)
		if err != nil {
			return nil, err
		}
		r.head = vp
	}
	vp := r.head
	rowsOf := func(buf kernels.Buffer) kernels.Buffer {
		if buf == nil {
			return nil
		}
		return r.b.Slice(buf, 0, buf.Len()/vp.rows*n)
	}
	return &vocabProjection{rows: n, scored: vp.scored, part: rowsOf(vp.part), gathered: rowsOf(vp.gathered), logits: rowsOf(vp.logits),
		packed: rowsOf(vp.packed), padding: vp.padding}, nil
}

func (vp *vocabProjection) free(b kernels.Backend) {
	for _, buf := range vp.bufs {
		b.Free(buf)
	}
	vp.bufs = nil
}

// projectVocab scores hidden [n, hidden] (already normed) with this rank's
// slice of the LM head and gathers the slices into rank 0's vp.logits.
func (m *Model) projectVocab(r *rank, vp *vocabProjection, hidden kernels.Buffer, n int) error {
	b, V := r.b, m.Cfg.VocabSize
	m.scoreSlice(r, vp, hidden, n)
	if len(m.ranks) == 1 {
		return nil
	}
	if err := m.comm.AllGather(r.id, vp.gathered, vp.part, n*r.vocab); err != nil {
		return err
	}
	if r.id == 0 {
		for src := range m.ranks {
			b.Copy(b.Slice(vp.logits, src*r.vocab, n*V-src*r.vocab), b.Slice(vp.gathered, src*n*r.vocab, n*r.vocab), n, r.vocab, V, r.vocab)
		}
	}
	return nil
}

// scoreSlice writes rank r's slice of the logits of n rows, vp.part [n,
// r.vocab]: the real ids' rows of the LM head, -Inf for the padding rows.
func (m *Model) scoreSlice(r *rank, vp *vocabProjection, hidden kernels.Buffer, n int) {
	b, H, scored, out := r.b, m.Cfg.HiddenSize, m.scoredRows(r), vp.part
	pad := r.vocab - scored
	switch {
	case pad == 0:
		b.MatMul(out, hidden, r.w.LMHead, n, r.vocab, H)
		return
	case n == 1 && scored > 0: // one row is already laid out as out's
		b.MatMul(out, hidden, r.w.LMHead, 1, scored, H)
	case scored > 0:
		b.MatMul(vp.packed, hidden, r.w.LMHead, n, scored, H)
		b.Copy(out, vp.packed, n, scored, r.vocab, scored)
	}
	b.Copy(b.Slice(out, scored, n*r.vocab-scored), vp.padding, n, pad, r.vocab, 0)
}

// ProjectVocab scores n rows of hidden states (on rank 0, already normed)
// with the target's LM head into logits [n, vocab] on rank 0, through every
// rank's vocabulary slice: the drafter shares the target's head this way.
func (m *Model) ProjectVocab(logits, hidden kernels.Buffer, n int) error {
	H := m.Cfg.HiddenSize
	if len(m.ranks) == 1 { // straight into logits, with the step's head buffers
		r := m.ranks[0]
		vp, err := m.head(r, n)
		if err != nil {
			return err
		}
		vp.part = logits
		m.scoreSlice(r, vp, hidden, n)
		return nil
	}
	inputs := make([]kernels.Buffer, len(m.ranks))
	heads := make([]*vocabProjection, len(m.ranks))
	defer func() {
		for i, r := range m.ranks {
			if heads[i] != nil {
				heads[i].free(r.b)
			}
			if i > 0 && inputs[i] != nil {
				r.b.Free(inputs[i])
			}
		}
	}()
	inputs[0] = hidden
	for i, r := range m.ranks {
		var err error
		if heads[i], err = m.newVocabProjection(r, n, nil); err != nil {
			return err
		}
		if i > 0 {
			if inputs[i], err = r.b.Alloc(kernels.F32, n*H); err != nil {
				return fmt.Errorf("engine: rank %d draft hidden states: %w", i, err)
			}
		}
	}
	err := m.onRanks(func(r *rank) error {
		if err := m.comm.Broadcast(r.id, 0, inputs[r.id], n*H); err != nil {
			return err
		}
		return m.projectVocab(r, heads[r.id], inputs[r.id], n)
	})
	if err != nil {
		return err
	}
	b := m.ranks[0].b
	b.Copy(logits, heads[0].logits, 1, n*m.Cfg.VocabSize, 0, 0)
	return nil
}

// outputs downloads from rank 0 the taps of the rows whose sequences do
// not keep them on the device (from the first such row on) and, with tops
// (a Replayer's step), every sequence's device top-k, all in one copy into
// m.hostOut, then the logit rows of the sequences that want them.
func (m *Model) outputs(seqs []SeqInput, logits kernels.Buffer, tops *deviceTops, taps int, tapped kernels.Buffer) ([]SeqOutput, error) {
	b, V := m.ranks[0].b, m.Cfg.VocabSize
	width := taps * m.Cfg.HiddenSize
	tapsLen := 0
	if tapped != nil {
		tapsLen = tapped.Len()
	}
	size := tapsLen
	if tops != nil {
		size += tops.used
	}
	from := tapsLen // the first value of a row that comes home
	for i, r0 := 0, 0; i < len(seqs) && from == tapsLen; i++ {
		if !seqs[i].KeepTaps {
			from = min(r0*width, tapsLen)
		}
		r0 += len(seqs[i].Tokens)
	}
	if len(m.hostOut) < size {
		m.hostOut = make([]float32, size)
	}
	if size > from {
		if err := b.DownloadF32(m.out, from, m.hostOut[from:size]); err != nil {
			return nil, fmt.Errorf("engine: download step outputs: %w", err)
		}
	}
	hostTaps, top := m.hostOut[:tapsLen], m.hostOut[tapsLen:size]
	var tapBuffer kernels.Buffer // Model.out in whole rows: its length stays with it
	if tapped != nil {
		tapBuffer = b.Slice(m.out, 0, m.out.Len()/width*width)
	}
	out := make([]SeqOutput, len(seqs))
	n, r0 := 0, 0
	for i, sq := range seqs {
		T := len(sq.Tokens)
		if want := sq.Logits.count(T); want > 0 {
			var err error
			switch {
			case sq.Top > 0 && tops != nil:
				out[i].Top = sq.Top
				out[i].TopIDs, out[i].TopLogits = unpackTop(top[tops.at[i]:], want, sq.Top)
			case sq.Top > 0:
				out[i].Top = sq.Top
				out[i].TopIDs, out[i].TopLogits, err = m.rowTop(b, logits, n, want, sq.Top)
			default:
				out[i].Logits = make([]float32, want*V)
				err = b.DownloadF32(logits, n*V, out[i].Logits)
			}
			if err != nil {
				return nil, fmt.Errorf("engine: download logits: %w", err)
			}
			n += want
		}
		if tapped != nil {
			out[i].Taps, out[i].TapRow = tapBuffer, r0
			if !sq.KeepTaps {
				out[i].Features = hostTaps[r0*width : (r0+T)*width : (r0+T)*width]
			}
		}
		r0 += T
	}
	return out, nil
}

// rowTop returns the k best logits over the real token ids (best first,
// ties: the lower id) and their ids, k per row, of logits rows
// first..first+rows-1, computed on the device by TopK: only k ids and
// values per row cross to the host.
func (m *Model) rowTop(b kernels.Backend, logits kernels.Buffer, first, rows, k int) ([]int32, []float32, error) {
	V, valid := m.Cfg.VocabSize, m.validVocab()
	var bufs []kernels.Buffer
	defer func() {
		for _, buf := range bufs {
			b.Free(buf)
		}
	}()
	alloc := func(dt kernels.DType, n int) (kernels.Buffer, error) {
		buf, err := b.Alloc(dt, n)
		if err == nil {
			bufs = append(bufs, buf)
		}
		return buf, err
	}
	src := b.Slice(logits, first*V, rows*V)
	if valid < V { // pack the real ids' columns: TopK takes contiguous rows
		packed, err := alloc(kernels.F32, rows*valid)
		if err != nil {
			return nil, nil, err
		}
		b.Copy(packed, src, rows, valid, valid, V)
		src = packed
	}
	vals, err := alloc(kernels.F32, rows*k)
	if err != nil {
		return nil, nil, err
	}
	idx, err := alloc(kernels.I32, rows*k)
	if err != nil {
		return nil, nil, err
	}
	b.TopK(vals, idx, src, rows, valid, k)
	ids, top := make([]float32, rows*k), make([]float32, rows*k) // DownloadF32 converts I32 ids, exact below 2^24
	if err := b.DownloadF32(idx, 0, ids); err != nil {
		return nil, nil, err
	}
	if err := b.DownloadF32(vals, 0, top); err != nil {
		return nil, nil, err
	}
	out := make([]int32, rows*k)
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, top, nil
}

// CommitKV compacts an accepted tree path in the KV cache: the K/V of the
// token at logical position start+path[d] moves to start+d, in every
// attention layer on every rank. A chain prefix (path[d] == d) moves nothing.
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
	rp, record := m.ranks[0].b.(kernels.Replayer)
	record = record && len(m.ranks) == 1 && !m.Eager
	for _, r := range m.ranks {
		if r.moves == nil || r.moves.Len() < 2*len(dst) {
			m.dropKVMoves()
			if r.moves != nil {
				r.b.Free(r.moves)
				r.moves = nil
			}
			buf, err := r.b.Alloc(kernels.I32, max(4*len(dst), 64)) // a path of a few dozen tokens
			if err != nil {
				return fmt.Errorf("engine: KV moves: %w", err)
			}
			r.moves = buf
		}
		n := len(dst)
		if record {
			// As many moves as the buffer holds, the rest the root's slot onto
			// itself: no real move reads or writes it (the root stays where it
			// is), so one recording serves every path.
			n = r.moves.Len() / 2
			root := kv.Slot(ps, start)
			for len(dst) < n {
				dst, src = append(dst, root), append(src, root)
			}
		}
		if err := r.b.UploadI32(r.moves, 0, append(dst, src...)); err != nil {
			return fmt.Errorf("engine: upload KV moves: %w", err)
		}
		dstBuf, srcBuf := r.b.Slice(r.moves, 0, n), r.b.Slice(r.moves, n, n)
		move := func() error {
			for l := 0; l < m.Cfg.NumFull(); l++ {
				k, v := m.KV.Layer(r.id, l)
				r.b.MoveKV(k, v, dstBuf, srcBuf, n, KVDim(r.cfg))
			}
			return nil
		}
		if !record || !m.steps.kvMovesSeen { // the first op by op: MoveKV sizes the backend's scratch
			m.steps.kvMovesSeen = record
			_ = move()
			continue
		}
		if m.steps.kvMoves == nil {
			g, err := rp.Capture(move)
			if err != nil {
				return fmt.Errorf("engine: recording KV moves: %w", err)
			}
			m.steps.kvMoves = g
		}
		if err := m.steps.kvMoves.Replay(); err != nil {
			return err
		}
	}
	return nil
}

// rowsOf is the view of rows r0..r0+n of a [*, width] buffer.
func rowsOf(b kernels.Backend, buf kernels.Buffer, r0, n, width int) kernels.Buffer {
	return b.Slice(buf, r0*width, n*width)
}

// stepMeta is a rank's index data of a step, shared by its layers: token
// ids, positions and KV slots, each sequence's page table and tree mask
// and, on a Replayer, the attention table that points at them, all views of
// one persistent I32 buffer written by one upload per step. The table comes
// first and ids, positions and slots after it, so that a step's views stay
// at the addresses a recorded step reads as long as its rows and sequence
// count do; page tables and masks follow, where the table says.
type stepMeta struct {
	buf                    kernels.Buffer // grown as needed, never shrunk
	host                   []int32        // the upload, reused
	table, ids, pos, slots kernels.Buffer
	// states holds each sequence's state slot, where a Replayer's GDN ops
	// read it (kernels.GDNConvSeq.SlotAt): a recorded step serves any slots.
	states   kernels.Buffer
	attnSeqs []kernels.AttnSeq
	// maxKeys bounds every sequence's keys: the next power of two (at
	// least minKeyBucket) above the longest, so that the attention split
	// plan changes only when a sequence crosses a power of two.
	maxKeys int
}

// minKeyBucket is the smallest maxKeys of a step.
const minKeyBucket = 256

// uploadMeta builds rank r's metadata for seqs in r.meta and uploads it.
func (m *Model) uploadMeta(r *rank, seqs []SeqInput, rows int) error {
	if r.meta == nil {
		r.meta = &stepMeta{}
	}
	meta, b, ps := r.meta, r.b, m.KV.PageSize()
	replayer, _ := b.(kernels.Replayer)
	tableLen := 0
	if replayer != nil {
		tableLen = replayer.AttnTableLen(len(seqs))
	}
	size := tableLen + 3*rows + len(seqs)
	for _, sq := range seqs {
		size += max(len(sq.KV.Pages), 1)
		if sq.Parents != nil {
			size += len(sq.Tokens) * len(sq.Tokens)
		}
	}
	if meta.buf == nil || meta.buf.Len() < size {
		m.dropGraphs()
		if meta.buf != nil {
			b.Free(meta.buf)
			meta.buf = nil
		}
		buf, err := b.Alloc(kernels.I32, 2*size) // room to grow: page tables lengthen
		if err != nil {
			return fmt.Errorf("engine: step metadata: %w", err)
		}
		meta.buf = buf
	}
	view := func(off, n int) kernels.Buffer { return b.Slice(meta.buf, off, n) }
	host := slices.Grow(meta.host[:0], size)[:tableLen+3*rows+len(seqs)]
	meta.table, meta.ids, meta.pos, meta.slots = view(0, tableLen), view(tableLen, rows), view(tableLen+rows, rows), view(tableLen+2*rows, rows)
	meta.states = view(tableLen+3*rows, len(seqs))
	ids, pos, slots := host[tableLen:tableLen+rows], host[tableLen+rows:tableLen+2*rows], host[tableLen+2*rows:tableLen+3*rows]
	states := host[tableLen+3*rows:]
	meta.attnSeqs = meta.attnSeqs[:0]
	meta.maxKeys = minKeyBucket
	r0 := 0
	for i, sq := range seqs {
		states[i] = int32(sq.Slot)
		depth := treeDepths(sq.Parents, len(sq.Tokens))
		for j, t := range sq.Tokens {
			ids[r0+j] = t
			pos[r0+j] = int32(sq.Start) + depth[j]
			slots[r0+j] = sq.KV.Slot(ps, sq.Start+j)
		}
		attn := kernels.AttnSeq{QueryStart: r0, QueryLen: len(sq.Tokens), Prefix: sq.Start}
		attn.Pages = view(len(host), max(len(sq.KV.Pages), 1))
		host = append(host, sq.KV.Pages...)
		if len(sq.KV.Pages) == 0 {
			host = append(host, 0)
		}
		if sq.Parents != nil {
			mask := ddtree.AncestorMask(sq.Parents)
			attn.Mask = view(len(host), len(mask))
			host = append(host, mask...)
		}
		meta.attnSeqs = append(meta.attnSeqs, attn)
		for meta.maxKeys < sq.Start+len(sq.Tokens) {
			meta.maxKeys *= 2
		}
		r0 += len(sq.Tokens)
	}
	if replayer != nil {
		replayer.EncodeAttnTable(host[:tableLen], meta.attnSeqs, ps)
	}
	meta.host = host
	if err := b.UploadI32(meta.buf, 0, host); err != nil {
		return fmt.Errorf("engine: upload step metadata: %w", err)
	}
	return nil
}

func (meta *stepMeta) free(b kernels.Backend) {
	if meta != nil && meta.buf != nil {
		b.Free(meta.buf)
		meta.buf = nil
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

// scratch holds the step's activations, grown to the largest batch seen.
type scratch struct {
	rows int
	bufs []kernels.Buffer

	x, h, mix           kernels.Buffer // [rows, hidden]
	qg, q, gate, attn   kernels.Buffer // attention
	k, v                kernels.Buffer
	mixed, z            kernels.Buffer // GDN
	g, beta, gq, gk, gv kernels.Buffer
	gout                kernels.Buffer
	up, act             kernels.Buffer // MLP
}

func (s *scratch) free(b kernels.Backend) {
	for _, buf := range s.bufs {
		b.Free(buf)
	}
	s.bufs, s.rows = nil, 0
}

func (s *scratch) ensure(b kernels.Backend, cfg *config.Config, rows int) error {
	if rows <= s.rows {
		return nil
	}
	s.free(b)
	H, qDim, kvDim := cfg.HiddenSize, cfg.NumHeads*cfg.HeadDim, KVDim(cfg)
	sizes := []struct {
		dst   *kernels.Buffer
		width int
	}{
		{&s.x, H}, {&s.h, H}, {&s.mix, H},
		{&s.qg, 2 * qDim}, {&s.q, qDim}, {&s.gate, qDim}, {&s.attn, qDim}, {&s.k, kvDim}, {&s.v, kvDim},
		{&s.mixed, cfg.ConvDim()}, {&s.z, cfg.ValueDim()},
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
