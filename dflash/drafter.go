// Package dflash runs the DFlash block-diffusion drafter: one forward pass
// proposes a whole block of tokens, conditioned on hidden states the target
// exposes at a few of its layers.
package dflash

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"ddflash/ddtree"
	"ddflash/engine"
	"ddflash/engine/safetensors"
	"ddflash/kernels"
)

// layerWeights is one draft decoder layer: a Qwen3 layer whose keys and
// values also come from the fused target features. Norms use Qwen3's plain
// weight (not the target's 1+w).
type layerWeights struct {
	InputNorm, PostNorm kernels.Buffer // [hidden]
	QProj, KProj, VProj kernels.Buffer // [heads*headDim | kvHeads*headDim, hidden]
	OProj               kernels.Buffer // [hidden, heads*headDim]
	QNorm, KNorm        kernels.Buffer // [headDim]
	Gate, Up, Down      kernels.Buffer
	// DFlash2 only: the convolutions around the attention and the MLP.
	attnConv, mlpConv convWeights
}

// Drafter is a loaded DFlash drafter bound to its target model, whose token
// embedding and LM head it shares.
type Drafter struct {
	Cfg *Config

	b          kernels.Backend
	target     *engine.Model
	fc         kernels.Buffer // [hidden, taps*targetHidden]
	hiddenNorm kernels.Buffer // [hidden]
	norm       kernels.Buffer // [hidden]
	layers     []layerWeights
	selector   selectorWeights // DFlash2 only
	// Context K/V of committed tokens: full-attention layers page the whole
	// sequence in kv; sliding layers keep a ring of ringPages pages per
	// session in ring (see ringTable). cacheIndex is a layer's index in its
	// cache. A cache no layer uses is nil.
	kv, ring   *engine.KVCache
	ringPages  int
	cacheIndex []int
	masks      map[int]blockMasks // by block rows: the checkpoint's block and any shorter one a session drafts
	attn       kernels.AttnShape
	invFreq    kernels.Buffer // RoPE inverse frequencies (plain or YaRN)
	ropeScale  float32
	// A draft's buffers and those of taking rows into the context (kept
	// apart: the two run at different times, each asking for its buffers
	// in the same order every time).
	scratch, contextScratch arena
	// Recorded blocks and context intakes (record.go).
	blocks, contexts recordings
}

// blockMasks are a block's attention masks, I32 [rows·rows].
type blockMasks struct {
	all kernels.Buffer // ones: non-causal full layers
	// near is the mask of non-causal sliding layers: block keys less than a
	// window away on either side (the kernel's window hides only keys
	// before a query); nil without sliding layers.
	near kernels.Buffer
}

// Options sizes the drafter's context cache: room for Sequences sessions
// of Context committed tokens plus one block each in the full-attention
// layers, and one ring (Config.RingTokens) each in the sliding layers,
// stored in the target's KV cache dtype.
type Options struct {
	PageSize  int // tokens per page of the draft KV cache; 0 means engine.DefaultPageSize
	Sequences int // sessions in flight; 0 means 1
	Context   int // longest sequence; 0 means the target's max positions
	// Tokens is the full-attention layers' capacity, like the target's KV
	// tokens; 0 means Sequences × (Context + BlockSize).
	Tokens int

	// pagedSliding keeps the sliding layers in the paged cache with the
	// full ones (the rings' reference in tests).
	pagedSliding bool
}

// LoadDrafter reads a z-lab drafter checkpoint (config.json and safetensors
// with fc, hidden_norm, norm and layers.N.*) and binds it to the target. The
// drafter runs on the target's rank-0 backend (replicated nowhere else: it
// is small), sharing the target's embedding and its vocabulary-parallel LM
// head.
func LoadDrafter(dir string, target *engine.Model, opts Options) (*Drafter, error) {
	b := target.Backend()
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if err := cfg.CheckTarget(target.Cfg); err != nil {
		return nil, fmt.Errorf("drafter %s: %w", dir, err)
	}
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ckpt.Close()
	d := &Drafter{Cfg: cfg, b: b, target: target, layers: make([]layerWeights, cfg.NumLayers)}
	if err := engine.LoadTensors(b, ckpt, d.tensorSpecs(), ""); err != nil {
		return nil, fmt.Errorf("drafter %s: %w", dir, err)
	}
	if opts.PageSize <= 0 {
		opts.PageSize = engine.DefaultPageSize
	}
	if opts.Context <= 0 {
		opts.Context = target.Cfg.MaxPositions
	}
	if err := d.allocCaches(opts); err != nil {
		d.Close()
		return nil, err
	}
	if _, err = d.blockMasks(cfg.BlockSize); err != nil {
		d.Close()
		return nil, err
	}
	freq, scale := cfg.RopeFrequencies()
	if d.invFreq, err = engine.UploadRopeFrequencies(b, freq); err != nil {
		d.Close()
		return nil, err
	}
	d.ropeScale = scale
	d.attn = kernels.AttnShape{
		NumHeads: cfg.NumHeads, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		PageSize: opts.PageSize, Scale: float32(1 / math.Sqrt(float64(cfg.HeadDim))),
	}
	return d, nil
}

// blockMasks returns the masks of a block of Q rows, uploading them on a
// block size's first use.
func (d *Drafter) blockMasks(Q int) (blockMasks, error) {
	if m, ok := d.masks[Q]; ok {
		return m, nil
	}
	var m blockMasks
	var err error
	if m.all, err = d.blockMask(Q, Q); err != nil {
		return blockMasks{}, err
	}
	if d.Cfg.SlidingWindow > 0 {
		if m.near, err = d.blockMask(Q, d.Cfg.SlidingWindow); err != nil {
			d.b.Free(m.all)
			return blockMasks{}, err
		}
	}
	if d.masks == nil {
		d.masks = map[int]blockMasks{}
	}
	d.masks[Q] = m
	return m, nil
}

// blockMask uploads the mask of a block of Q rows that shows block row i
// the block keys j with |i−j| < window.
func (d *Drafter) blockMask(Q, window int) (kernels.Buffer, error) {
	mask := make([]int32, Q*Q)
	for i := range Q {
		for j := range Q {
			if max(i-j, j-i) < window {
				mask[i*Q+j] = 1
			}
		}
	}
	buf, err := d.b.Alloc(kernels.I32, len(mask))
	if err != nil {
		return nil, err
	}
	return buf, d.b.UploadI32(buf, 0, mask)
}

func (d *Drafter) tensorSpecs() []engine.TensorSpec {
	c := d.Cfg
	h, qDim, kvDim := c.HiddenSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	taps := len(c.TargetLayerIDs) * d.target.Cfg.HiddenSize
	specs := []engine.TensorSpec{
		{Name: "fc.weight", Shape: []int{h, taps}, Dst: &d.fc},
		{Name: "hidden_norm.weight", Shape: []int{h}, ToF32: true, Dst: &d.hiddenNorm},
		{Name: "norm.weight", Shape: []int{h}, ToF32: true, Dst: &d.norm},
	}
	for i := range d.layers {
		l := &d.layers[i]
		p := fmt.Sprintf("layers.%d.", i)
		for _, s := range []struct {
			name  string
			dst   *kernels.Buffer
			toF32 bool
			shape []int
		}{
			{"input_layernorm.weight", &l.InputNorm, true, []int{h}},
			{"post_attention_layernorm.weight", &l.PostNorm, true, []int{h}},
			{"self_attn.q_proj.weight", &l.QProj, false, []int{qDim, h}},
			{"self_attn.k_proj.weight", &l.KProj, false, []int{kvDim, h}},
			{"self_attn.v_proj.weight", &l.VProj, false, []int{kvDim, h}},
			{"self_attn.o_proj.weight", &l.OProj, false, []int{h, qDim}},
			{"self_attn.q_norm.weight", &l.QNorm, true, []int{c.HeadDim}},
			{"self_attn.k_norm.weight", &l.KNorm, true, []int{c.HeadDim}},
			{"mlp.gate_proj.weight", &l.Gate, false, []int{c.IntermediateSize, h}},
			{"mlp.up_proj.weight", &l.Up, false, []int{c.IntermediateSize, h}},
			{"mlp.down_proj.weight", &l.Down, false, []int{h, c.IntermediateSize}},
		} {
			specs = append(specs, engine.TensorSpec{Name: p + s.name, Shape: s.shape, ToF32: s.toF32, Dst: s.dst})
		}
	}
	if c.V2 != nil {
		specs = append(specs, d.v2Specs()...)
	}
	return specs
}

// allocCaches allocates the paged cache of the full-attention layers and
// the rings of the sliding ones.
func (d *Drafter) allocCaches(opts Options) error {
	cfg, seqs := d.Cfg, max(opts.Sequences, 1)
	shard := []engine.KVShard{{B: d.b, KVDim: cfg.NumKVHeads * cfg.HeadDim, DType: d.target.KV.Shard(0).DType}}
	var paged, ringed int
	for _, kind := range cfg.Layers {
		if kind == SlidingAttention && !opts.pagedSliding {
			d.cacheIndex = append(d.cacheIndex, ringed)
			ringed++
		} else {
			d.cacheIndex = append(d.cacheIndex, paged)
			paged++
		}
	}
	tokens := opts.Tokens
	if tokens <= 0 {
		tokens = seqs * (opts.Context + cfg.BlockSize)
	}
	pages := (tokens + opts.PageSize - 1) / opts.PageSize
	var err error
	if paged > 0 {
		if d.kv, err = engine.NewKVCache(shard, paged, opts.PageSize, pages); err != nil {
			return err
		}
	}
	if ringed > 0 {
		d.ringPages = cfg.RingTokens(opts.PageSize, opts.Context) / opts.PageSize
		if d.ring, err = engine.NewKVCache(shard, ringed, opts.PageSize, seqs*d.ringPages); err != nil {
			return err
		}
	}
	return nil
}

// ringed reports whether layer i keeps its context in a ring.
func (d *Drafter) ringed(i int) bool { return d.ring != nil && d.Cfg.Layers[i] == SlidingAttention }

// Close releases the drafter's weights, caches and constants (the shared
// embedding and LM head belong to the target). Closing again does
// nothing: a choice among drafters and a bench engine may both close it.
func (d *Drafter) Close() {
	for _, s := range d.tensorSpecs() {
		if *s.Dst != nil {
			d.b.Free(*s.Dst)
			*s.Dst = nil
		}
	}
	for _, c := range []**engine.KVCache{&d.kv, &d.ring} {
		if *c != nil {
			(*c).Close()
			*c = nil
		}
	}
	for _, m := range d.masks {
		for _, buf := range []kernels.Buffer{m.all, m.near} {
			if buf != nil {
				d.b.Free(buf)
			}
		}
	}
	d.masks = nil
	if d.invFreq != nil {
		d.b.Free(d.invFreq)
		d.invFreq = nil
	}
	d.blocks.free(d.b)
	d.contexts.free(d.b)
	d.scratch.free()
	d.contextScratch.free()
}

// TapLayers lists the target layers whose outputs the drafter reads.
func (d *Drafter) TapLayers() []int { return d.Cfg.TargetLayerIDs }

// BlockSize is the query block: the anchor and BlockSize-1 proposals.
func (d *Drafter) BlockSize() int { return d.Cfg.BlockSize }

// Session is one sequence's drafter state: the context K/V of its committed
// tokens (the sliding layers' last ones in its ring). Only committed tokens
// ever stay in it.
type Session struct {
	d        *Drafter
	block    int // rows a draft runs: the anchor and block−1 masks
	kv, ring engine.SeqKV
	cached   int             // committed tokens whose context K/V are in the cache
	lattice  *ddtree.Lattice // DFlash2: the latest draft's selector lattice
}

// NewSession starts an empty context; the drafter sees the prompt through
// the target's features, not its tokens. A DFlash2 drafter's session is
// also an engine.LatticeSession.
func (d *Drafter) NewSession(prompt []int32) (engine.DraftSession, error) {
	return d.NewBlockSession(prompt, d.Cfg.BlockSize)
}

// NewBlockSession starts a session whose drafts run a block of block rows,
// the anchor and block−1 masks, instead of the checkpoint's block_size
// (engine.BlockDrafter): its proposals are block−1 deep, and the block's
// cost, which on a CPU grows with its rows, shrinks with them. Each row
// still sees the whole block, as in training, only with fewer masks after
// it, so the drafter's distributions change a little and acceptance is the
// measure of a shorter block. A DFlash2 drafter keeps its whole block: its
// selector lattice spans it.
func (d *Drafter) NewBlockSession(_ []int32, block int) (engine.DraftSession, error) {
	if block < 2 || block > d.Cfg.BlockSize {
		return nil, fmt.Errorf("dflash: a block of %d rows: want 2 to the drafter's %d (the anchor and at least one mask)", block, d.Cfg.BlockSize)
	}
	if d.Cfg.V2 != nil {
		return v2Session{&Session{d: d, block: d.Cfg.BlockSize}}, nil
	}
	if _, err := d.blockMasks(block); err != nil {
		return nil, err
	}
	return &Session{d: d, block: block}, nil
}

// Close returns the session's cache pages.
func (s *Session) Close() {
	if s.d.kv != nil {
		s.d.kv.Truncate(&s.kv, 0)
	}
	if s.d.ring != nil {
		s.d.ring.Truncate(&s.ring, 0)
	}
}

// ringTable maps the positions [from, end) of a session's sliding layers
// to its ring: from must start a page, and logical page j (positions
// from+j·P …) is ring page (from/P + j) mod ringPages. Positions a whole
// ring apart share a slot; a ring holds the window and a block (see
// Config.RingTokens), so every position a query still sees is intact.
func (s *Session) ringTable(from, end int) []int32 {
	P := s.d.ring.PageSize()
	table := make([]int32, (end-from+P-1)/P)
	for j := range table {
		table[j] = s.ring.Pages[(from/P+j)%s.d.ringPages]
	}
	return table
}

// ringSlots is the ring slot of each position.
func (s *Session) ringSlots(pos []int32) []int32 {
	P := s.d.ring.PageSize()
	slots := make([]int32, len(pos))
	for i, p := range pos {
		slots[i] = s.ring.Pages[(int(p)/P)%s.d.ringPages]*int32(P) + p%int32(P)
	}
	return slots
}

// blockPlan is a draft block's per-draft data on the host: its token ids
// and positions, the K/V slots of the block rows in the paged and the
// ringed cache, their attention pages (the session's page table; the
// ring's pages from where the block's first window starts) and each
// layer's attention over its cache (Pages left for the caller to place).
type blockPlan struct {
	ids, pos []int32
	slots    [2][]int32 // paged, ringed
	pages    [2][]int32
	seqs     []kernels.AttnSeq
	cacheOf  []int // per layer: 0 paged, 1 ringed
	maxKeys  int   // a power of two (at least 256) bounding every layer's keys
}

// plan reserves the session's cache room for a block at the anchor's
// position (the committed tokens) and returns its data.
func (s *Session) plan(anchor int32) (*blockPlan, error) {
	d, c := s.d, s.d.Cfg
	start, Q := s.cached, s.block
	p := &blockPlan{ids: make([]int32, Q), pos: positions(start, Q), maxKeys: 256}
	p.ids[0] = anchor
	for i := 1; i < Q; i++ {
		p.ids[i] = int32(c.MaskTokenID)
	}
	prefix := [2]int{start, 0}
	if d.kv != nil {
		if err := d.kv.Reserve(&s.kv, start+Q); err != nil {
			return nil, err
		}
		p.slots[0], p.pages[0] = slotsOf(&s.kv, d.kv.PageSize(), p.pos), s.kv.Pages
	}
	if d.ring != nil {
		P := d.ring.PageSize()
		if err := d.ring.Reserve(&s.ring, d.ringPages*P); err != nil {
			return nil, err
		}
		ringFrom := s.windowStart(start) / P * P
		p.slots[1], p.pages[1], prefix[1] = s.ringSlots(p.pos), s.ringTable(ringFrom, start+Q), start-ringFrom
	}
	for i := range d.layers {
		kind := 0
		if d.ringed(i) {
			kind = 1
		}
		seq := kernels.AttnSeq{QueryLen: Q, Prefix: prefix[kind]}
		if c.Layers[i] == SlidingAttention {
			seq.Window = c.SlidingWindow
		}
		switch {
		case c.LayerCausal(i): // no mask: the kernel's causal order
		case seq.Window > 0:
			seq.Mask = d.masks[Q].near
		default:
			seq.Mask = d.masks[Q].all
		}
		p.seqs, p.cacheOf = append(p.seqs, seq), append(p.cacheOf, kind)
		for p.maxKeys < prefix[kind]+Q {
			p.maxKeys *= 2
		}
	}
	return p, nil
}

// blockInputs are a block's per-draft data on the device: the plan's ids,
// positions and slots, and each layer's attention sequence pointing at its
// pages there; on a Replayer also each layer's attention table
// (AttentionTable), so that a recorded block reads them all from memory.
type blockInputs struct {
	ids, pos kernels.Buffer
	slots    [2]kernels.Buffer
	seqs     []kernels.AttnSeq
	cacheOf  []int
	tables   []kernels.Buffer
	maxKeys  int
}

// uploadPlan places p in arena buffers, one upload each.
func uploadPlan(a *arena, p *blockPlan) (*blockInputs, error) {
	in := &blockInputs{ids: a.i32(p.ids), pos: a.i32(p.pos), seqs: slices.Clone(p.seqs), cacheOf: p.cacheOf, maxKeys: p.maxKeys}
	var pages [2]kernels.Buffer
	for kind := range 2 {
		in.slots[kind], pages[kind] = a.i32(p.slots[kind]), a.i32(p.pages[kind])
	}
	for i := range in.seqs {
		in.seqs[i].Pages = pages[p.cacheOf[i]]
	}
	return in, a.err
}

// windowStart is the first position a sliding layer's query at start sees.
func (s *Session) windowStart(start int) int { return max(0, start-(s.d.Cfg.SlidingWindow-1)) }

// Draft appends the fused features of newly committed tokens (rows of
// len(TapLayers)·targetHidden values, in tap order) to the context, runs the
// block [anchor, mask, …, mask] at positions start..start+block-1 (start
// = committed tokens, the anchor's position) and returns the logits of the
// block-1 proposal positions, row-major over the target vocabulary. A
// DFlash2 drafter convolves around every sublayer, returns its unary logits
// (after output_multiplier and the soft cap) and keeps the selector's
// lattice of them for Lattice.
func (s *Session) Draft(features []float32, anchor int32) ([]float32, error) {
	a := s.d.scratch.reset(s.d.b)
	logits, proposals, err := s.draft(a, features, anchor)
	if err != nil {
		return nil, err
	}
	out := make([]float32, logits.Len())
	if err := a.b.DownloadF32(logits, 0, out); err != nil {
		return nil, err
	}
	if v2 := s.d.Cfg.V2; v2 != nil {
		v2.unary(out)
		rows := logits.Len() / s.d.target.Cfg.VocabSize
		if s.lattice, err = s.d.selectLattice(a, proposals, out, anchor, rows); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DraftTop drafts as Draft does and returns each proposal row's k best
// tokens among the first valid ids with their log-probabilities
// (engine.TopDraftSession). On a device that records steps
// (kernels.Replayer) the rows are reduced there: one download of k
// candidates and a log-sum-exp a row instead of the rows.
func (s *Session) DraftTop(features []float32, anchor int32, valid, k int) ([][]ddtree.Candidate, error) {
	rp, onDevice := s.d.b.(kernels.Replayer)
	if !onDevice {
		logits, err := s.Draft(features, anchor)
		if err != nil {
			return nil, err
		}
		V := s.d.target.Cfg.VocabSize
		rows := make([][]ddtree.Candidate, len(logits)/V)
		for i := range rows {
			rows[i] = ddtree.TopK(logits[i*V:(i+1)*V], valid, k)
		}
		return rows, nil
	}
	k = min(k, valid)
	top, err := s.draftTopOnDevice(rp, features, anchor, valid, k)
	if err != nil {
		return nil, err
	}
	n, width := s.block-1, 2*k+1
	rec := make([]float32, n*width)
	if err := rp.DownloadF32(top, 0, rec); err != nil {
		return nil, err
	}
	rows := make([][]ddtree.Candidate, n)
	for i := range rows {
		o := rec[i*width:]
		lse := float64(o[2*k])
		for j := range k {
			v := float64(o[j])
			if math.IsNaN(v) {
				break // fewer than k ids are numbers
			}
			lp := v - lse
			if v == lse { // an infinite maximum: the softmax's limit, as ddtree.TopK
				lp = 0
			}
			rows[i] = append(rows[i], ddtree.Candidate{Token: int32(o[k+j]), Logprob: lp})
		}
	}
	return rows, nil
}

// draftTopOnDevice takes features into the context, runs the block and
// reduces its proposal rows to their top-k records on the device, recorded
// where the drafter records its blocks (record.go; op by op the same way
// where it does not), and returns the records [block-1, 2k+1].
func (s *Session) draftTopOnDevice(rp kernels.Replayer, features []float32, anchor int32, valid, k int) (kernels.Buffer, error) {
	if err := s.Absorb(features, nil, nil); err != nil {
		return nil, err
	}
	d := s.d
	p, err := s.plan(anchor)
	if err != nil {
		return nil, err
	}
	in, err := d.placePlan(rp, p)
	if err != nil {
		return nil, err
	}
	a := d.scratch.reset(d.b)
	block := func() (kernels.Buffer, error) {
		logits, _, err := s.blockOps(a, in)
		if err != nil {
			return nil, err
		}
		V, n := d.target.Cfg.VocabSize, s.block-1
		top := a.f32(n * (2*k + 1))
		if a.err != nil {
			return nil, a.err
		}
		rp.TopKLSE(top, logits, n, valid, V, k)
		return top, nil
	}
	if !d.records() {
		return block()
	}
	return d.blocks.run(rp, fmt.Sprintf("block %d keys %d valid %d top %d", s.block, in.maxKeys, valid, k), d.blockStamp, block)
}

// draft takes features (rows of the fused target features of newly
// committed tokens) into the context and runs the block after them.
func (s *Session) draft(a *arena, features []float32, anchor int32) (kernels.Buffer, kernels.Buffer, error) {
	if err := s.Absorb(features, nil, nil); err != nil {
		return nil, nil, err
	}
	return s.runBlock(a, anchor)
}

// Absorb takes newly committed tokens into the context (engine.TapAbsorber):
// the rows of features (on the host) and then rows of taps, the target's
// step output on the drafter's backend ([rows, taps, targetHidden]), that
// rows lists, in that order. Their fused features are projected and each
// layer's context keys and values written to the session's caches; the
// next draft runs its block after them. The tapped rows never leave the
// device, and where the drafter records its calls (record.go) taking up to
// a block of them is one replay.
func (s *Session) Absorb(features []float32, taps kernels.Buffer, rows []int32) error {
	d := s.d
	width := len(d.Cfg.TargetLayerIDs) * d.target.Cfg.HiddenSize
	if len(features)%width != 0 {
		return fmt.Errorf("dflash: %d feature values is not a whole number of %d-wide rows", len(features), width)
	}
	hostRows := len(features) / width
	n := hostRows + len(rows)
	if n == 0 {
		return nil
	}
	p, err := s.contextPlan(n)
	if err != nil {
		return err
	}
	a := d.contextScratch.reset(d.b)
	if rp, ok := d.b.(kernels.Replayer); ok && d.records() && hostRows == 0 && n <= d.Cfg.BlockSize {
		in, err := d.placeContext(rows, p)
		if err != nil {
			return err
		}
		_, err = d.contexts.run(rp, fmt.Sprintf("context %d keep %v", n, p.keep), d.contextStamp, func() (kernels.Buffer, error) {
			return nil, s.contextOps(d.contextBuffers(a, n), taps, in, 0, p)
		})
		s.cached += n
		return err
	}
	// The activations first, where the recorded intake has them: with the
	// inputs first, the two would trade the arena's buffers (F32 for I32)
	// at every request's prompt, reallocating them and so dropping the
	// recordings.
	bufs := d.contextBuffers(a, n)
	in := &contextInputs{rows: a.i32(rows), pos: a.i32(p.pos)}
	for kind := range 2 {
		in.slots[kind] = a.i32(p.slots[kind])
	}
	if a.err != nil {
		return a.err
	}
	if hostRows > 0 {
		if err := d.b.UploadF32(bufs.feat, 0, features); err != nil {
			return err
		}
	}
	if err := s.contextOps(bufs, taps, in, hostRows, p); err != nil {
		return err
	}
	s.cached += n
	return nil
}

// contextPlan is taking n committed tokens into the context: their
// positions, and the rows each kind of cache keeps (the paged layers all
// n, the sliding layers the last ones the next block's window sees) with
// their slots.
type contextPlan struct {
	pos   []int32
	keep  [2]int
	slots [2][]int32
}

// contextPlan reserves the session's cache room for n more committed
// tokens and returns their plan.
func (s *Session) contextPlan(n int) (*contextPlan, error) {
	d := s.d
	start := s.cached + n // the next block's anchor position
	p := &contextPlan{pos: positions(s.cached, n)}
	if d.kv != nil {
		if err := d.kv.Reserve(&s.kv, start); err != nil {
			return nil, err
		}
		p.keep[0], p.slots[0] = n, slotsOf(&s.kv, d.kv.PageSize(), p.pos)
	}
	if d.ring != nil {
		if err := d.ring.Reserve(&s.ring, d.ringPages*d.ring.PageSize()); err != nil {
			return nil, err
		}
		p.keep[1] = start - max(s.cached, s.windowStart(start))
		p.slots[1] = s.ringSlots(p.pos[n-p.keep[1]:])
	}
	return p, nil
}

// contextInputs are a context intake's data on the device: the indices of
// its rows in the target's tap buffer, their positions and slots.
type contextInputs struct {
	rows, pos kernels.Buffer
	slots     [2]kernels.Buffer
}

// contextBufs are a context intake's activations: the fused features, their
// projection, and one layer's keys and values.
type contextBufs struct {
	feat, ctx, k, v kernels.Buffer
}

// contextBuffers asks a for the activations of n rows, each at least a
// block's worth, so that intakes of any accepted path share them.
func (d *Drafter) contextBuffers(a *arena, n int) contextBufs {
	c, rows := d.Cfg, max(n, d.Cfg.BlockSize)
	width := len(c.TargetLayerIDs) * d.target.Cfg.HiddenSize
	kvDim := c.NumKVHeads * c.HeadDim
	bufs := contextBufs{feat: a.f32(rows * width), ctx: a.f32(rows * c.HiddenSize), k: a.f32(rows * kvDim), v: a.f32(rows * kvDim)}
	if a.err != nil {
		return contextBufs{}
	}
	for _, buf := range []*kernels.Buffer{&bufs.feat, &bufs.ctx, &bufs.k, &bufs.v} {
		*buf = d.b.Slice(*buf, 0, (*buf).Len()/rows*n)
	}
	return bufs
}

// contextOps issues a context intake's ops: the tapped rows gathered after
// hostRows rows already in bufs.feat, their projection through fc and its
// norm, and each layer's keys and values of the rows its cache keeps,
// written there. No upload or download, so that a Replayer can record them.
func (s *Session) contextOps(bufs contextBufs, taps kernels.Buffer, in *contextInputs, hostRows int, p *contextPlan) error {
	d, b, c := s.d, s.d.b, s.d.Cfg
	if bufs.feat == nil {
		return fmt.Errorf("dflash: context activations: %w", d.contextScratch.err)
	}
	n := len(p.pos)
	width, H, kvDim := bufs.feat.Len()/n, c.HiddenSize, c.NumKVHeads*c.HeadDim
	if tapped := n - hostRows; tapped > 0 {
		b.Embedding(b.Slice(bufs.feat, hostRows*width, tapped*width), taps, in.rows, tapped, width)
	}
	eps := float32(c.RMSNormEps)
	b.MatMul(bufs.ctx, bufs.feat, d.fc, n, H, width)
	b.RMSNorm(bufs.ctx, bufs.ctx, d.hiddenNorm, n, H, eps, false)
	for i := range d.layers {
		cache, kind := d.kv, 0
		if d.ringed(i) {
			cache, kind = d.ring, 1
		}
		keep := p.keep[kind]
		if keep == 0 {
			continue
		}
		from := n - keep
		kc, vc := cache.Layer(0, d.cacheIndex[i])
		d.keysValues(&d.layers[i], bufs.k, bufs.v, b.Slice(bufs.ctx, from*H, keep*H), b.Slice(in.pos, from, keep), keep)
		b.WriteKV(kc, vc, bufs.k, bufs.v, in.slots[kind], keep, kvDim)
	}
	return nil
}

// runBlock runs the block [anchor, mask, …, mask] at positions
// start..start+block-1 (start = committed tokens, the anchor's position)
// over the context and returns its proposal rows' logits on the device,
// [block-1, vocab], and their normed hidden states, in arena buffers.
func (s *Session) runBlock(a *arena, anchor int32) (kernels.Buffer, kernels.Buffer, error) {
	p, err := s.plan(anchor)
	if err != nil {
		return nil, nil, err
	}
	in, err := uploadPlan(a, p)
	if err != nil {
		return nil, nil, err
	}
	return s.blockOps(a, in)
}

// blockOps issues a block's ops over its inputs: no upload or download, so
// that a Replayer can record them.
func (s *Session) blockOps(a *arena, in *blockInputs) (kernels.Buffer, kernels.Buffer, error) {
	d, b, c := s.d, s.d.b, s.d.Cfg
	tc := d.target.Cfg
	Q, H := s.block, c.HiddenSize
	qDim, kvDim := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	x, u := a.f32(Q*H), a.f32(Q*H)
	q, attn := a.f32(Q*qDim), a.f32(Q*qDim)
	k, v := a.f32(Q*kvDim), a.f32(Q*kvDim)
	act, up := a.f32(Q*c.IntermediateSize), a.f32(Q*c.IntermediateSize)
	var conv convScratch
	if c.V2 != nil {
		conv = convScratch{delta: a.f32(Q * 2 * c.V2.ConvKernelSize * c.ConvGroups()), out: a.f32(Q * H)}
	}
	logits := a.f32((Q - 1) * tc.VocabSize)
	if a.err != nil {
		return nil, nil, a.err
	}
	eps := float32(c.RMSNormEps)
	b.Embedding(x, d.target.Embeddings(), in.ids, Q, H)
	if c.V2 != nil && c.V2.InputEmbeddingScale != 1 {
		if err := d.scaleRows(x, Q*H, c.V2.InputEmbeddingScale); err != nil {
			return nil, nil, err
		}
	}
	for i := range d.layers {
		lw := &d.layers[i]
		cache := d.kv
		if d.ringed(i) {
			cache = d.ring
		}
		kc, vc := cache.Layer(0, d.cacheIndex[i])
		b.RMSNorm(u, x, lw.InputNorm, Q, H, eps, false)
		in1 := d.convIn(&lw.attnConv, &conv, u, Q)
		d.keysValues(lw, k, v, in1, in.pos, Q)
		b.WriteKV(kc, vc, k, v, in.slots[in.cacheOf[i]], Q, kvDim)
		b.MatMul(q, in1, lw.QProj, Q, qDim, H)
		b.RMSNorm(q, q, lw.QNorm, Q*c.NumHeads, c.HeadDim, eps, false)
		b.RoPE(q, in.pos, d.invFreq, Q, c.NumHeads, c.HeadDim, c.HeadDim, d.ropeScale)
		if in.tables != nil {
			b.(kernels.Replayer).AttentionTable(attn, q, kc, vc, d.attn, in.seqs[i:i+1], in.tables[i], in.maxKeys)
		} else {
			b.Attention(attn, q, kc, vc, d.attn, in.seqs[i:i+1])
		}
		b.MatMul(u, attn, lw.OProj, Q, H, qDim)
		b.Add(x, x, d.convOut(&lw.attnConv, &conv, u, Q), Q*H)
		b.RMSNorm(u, x, lw.PostNorm, Q, H, eps, false)
		in1 = d.convIn(&lw.mlpConv, &conv, u, Q)
		b.MatMulGLU(act, up, in1, lw.Gate, lw.Up, Q, c.IntermediateSize, H)
		b.MatMul(u, act, lw.Down, Q, H, c.IntermediateSize)
		b.Add(x, x, d.convOut(&lw.mlpConv, &conv, u, Q), Q*H)
	}
	// The block's K/V above start are overwritten by the next context rows:
	// only committed tokens stay in the context.
	proposals := b.Slice(x, H, (Q-1)*H)
	b.RMSNorm(proposals, proposals, d.norm, Q-1, H, eps, false)
	if err := d.target.ProjectVocab(logits, proposals, Q-1); err != nil {
		return nil, nil, err
	}
	return logits, proposals, nil
}

// keysValues projects rows of src to normed, rotated keys and to values.
func (d *Drafter) keysValues(lw *layerWeights, k, v, src, pos kernels.Buffer, rows int) {
	b, c := d.b, d.Cfg
	kvDim := c.NumKVHeads * c.HeadDim
	b.MatMul(k, src, lw.KProj, rows, kvDim, c.HiddenSize)
	b.MatMul(v, src, lw.VProj, rows, kvDim, c.HiddenSize)
	b.RMSNorm(k, k, lw.KNorm, rows*c.NumKVHeads, c.HeadDim, float32(c.RMSNormEps), false)
	b.RoPE(k, pos, d.invFreq, rows, c.NumKVHeads, c.HeadDim, c.HeadDim, d.ropeScale)
}

func positions(start, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(start + i)
	}
	return p
}

func slotsOf(kv *engine.SeqKV, pageSize int, pos []int32) []int32 {
	s := make([]int32, len(pos))
	for i, p := range pos {
		s[i] = kv.Slot(pageSize, int(p))
	}
	return s
}

// arena hands out a draft's buffers and keeps them for the next draft: a
// draft asks for its buffers in the same order every time, and each
// request reuses the buffer the same request got last time when that one
// is large enough, so a steady drafter allocates nothing. The first
// allocation error sticks until the next reset.
type arena struct {
	b      kernels.Backend
	bufs   []kernels.Buffer
	next   int // the request being served
	err    error
	allocs int // buffers allocated so far: each moves a request's buffer
}

// reset starts a draft's requests on b.
func (a *arena) reset(b kernels.Backend) *arena {
	a.b, a.next, a.err = b, 0, nil
	return a
}

func (a *arena) alloc(dt kernels.DType, n int) kernels.Buffer {
	if a.err != nil {
		return nil
	}
	n = max(n, 1)
	i := a.next
	a.next++
	if i == len(a.bufs) {
		a.bufs = append(a.bufs, nil)
	}
	if old := a.bufs[i]; old != nil {
		if old.DType() == dt && old.Len() >= n {
			return a.b.Slice(old, 0, n)
		}
		a.b.Free(old)
		a.bufs[i] = nil
	}
	buf, err := a.b.Alloc(dt, n)
	if err != nil {
		a.err = fmt.Errorf("dflash: %w", err)
		return nil
	}
	a.bufs[i] = buf
	a.allocs++
	return buf
}

func (a *arena) f32(n int) kernels.Buffer { return a.alloc(kernels.F32, n) }

// i32 uploads v to a buffer; an empty v gets none (nil), as no kernel
// reads it, but still takes its turn, so that later requests keep theirs.
func (a *arena) i32(v []int32) kernels.Buffer {
	buf := a.alloc(kernels.I32, len(v))
	if len(v) == 0 || buf == nil {
		return nil
	}
	if err := a.b.UploadI32(buf, 0, v); err != nil {
		a.err = errors.Join(a.err, err)
	}
	return buf
}

// free releases the buffers kept.
func (a *arena) free() {
	for _, buf := range a.bufs {
		if buf != nil {
			a.b.Free(buf)
		}
	}
	a.bufs = nil
}

// Attach loads the drafter in dir for the engine's target (see Load) and
// enables speculative decoding with the given options. The engine must
// have been sized with Options.VerifyTokens >= spec.VerifyTokens(block
// size); see VerifyTokens.
func Attach(e *engine.Engine, dir string, spec engine.SpecOptions) error {
	d, err := Load(e, dir)
	if err != nil {
		return err
	}
	e.Drafter, e.Spec = d, spec
	return nil
}

// Load loads the drafter in dir for the engine's target, sized for it:
// its full-attention layers hold as many tokens as the target's KV cache,
// its rings one per state slot.
func Load(e *engine.Engine, dir string) (*Drafter, error) {
	kv := e.Model.KV
	return LoadDrafter(dir, e.Model, Options{Sequences: e.MaxSeqs(), Context: e.Context, Tokens: kv.Pages() * kv.PageSize()})
}

// VerifyTokens reads the drafter config in dir and returns how many tokens
// one verify of the given spec mode feeds the target, for sizing the engine.
func VerifyTokens(dir string, spec engine.SpecOptions) (int, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return 0, err
	}
	return spec.VerifyTokens(cfg.BlockSize), nil
}
