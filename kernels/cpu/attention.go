package cpu

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"ddflash/internal/half"

	"ddflash/kernels"
)

// WriteKV stores n rows of k and v into the caches at the given slots,
// rounding to the caches' dtype (F32, or BF16 to nearest even).
func (be *Backend) WriteKV(kCache, vCache, k, v, slots kernels.Buffer, n, kvDim int) {
	kv, vv := f32s("WriteKV k", k, n*kvDim), f32s("WriteKV v", v, n*kvDim)
	sl := i32s("WriteKV slots", slots, n)
	kc, vc := cacheRows("WriteKV", kCache, vCache, kvDim)
	for i, s := range sl {
		kc.checkSlot("WriteKV", s)
		kc.store(int(s), kv[i*kvDim:(i+1)*kvDim])
		vc.store(int(s), vv[i*kvDim:(i+1)*kvDim])
	}
}

// MoveKV copies cache rows src[i] → dst[i], reading every source first.
func (be *Backend) MoveKV(kCache, vCache, dst, src kernels.Buffer, n, kvDim int) {
	dv, sv := i32s("MoveKV dst", dst, n), i32s("MoveKV src", src, n)
	kc, vc := cacheRows("MoveKV", kCache, vCache, kvDim)
	for _, c := range []kvRows{kc, vc} {
		saved := make([]kvRows, n)
		for i, s := range sv {
			c.checkSlot("MoveKV src", s)
			saved[i] = c.row(int(s)).clone()
		}
		for i, d := range dv {
			c.checkSlot("MoveKV dst", d)
			c.row(int(d)).copyFrom(saved[i])
		}
	}
}

// kvRows is one cache, [slots, width] of F32 or BF16 bit patterns (exactly
// one slice is set), or a row of it.
type kvRows struct {
	f32   []float32
	bf16  []uint16
	width int
}

// cacheRows returns the two caches, which must have one dtype (F32 or
// BF16) and one length.
func cacheRows(op string, kCache, vCache kernels.Buffer, kvDim int) (k, v kvRows) {
	kb, vb := asBuffer(kCache), asBuffer(vCache)
	if kb.dt != vb.dt || kb.dt != kernels.F32 && kb.dt != kernels.BF16 || kb.Len() != vb.Len() || kvDim <= 0 {
		panic(fmt.Sprintf("cpu: %s caches %v[%d] and %v[%d] with kvDim %d: need two F32 or two BF16 caches of one length and kvDim > 0",
			op, kb.dt, kb.Len(), vb.dt, vb.Len(), kvDim))
	}
	return kvRows{kb.f32, kb.u16, kvDim}, kvRows{vb.f32, vb.u16, kvDim}
}

func (c kvRows) slots() int { return (len(c.f32) + len(c.bf16)) / c.width }

func (c kvRows) checkSlot(op string, slot int32) {
	if slot < 0 || int(slot) >= c.slots() {
		panic(fmt.Sprintf("cpu: %s slot %d outside the cache's %d slots", op, slot, c.slots()))
	}
}

// row returns slot s.
func (c kvRows) row(s int) kvRows { return c.span(s*c.width, c.width) }

// span returns elements [off, off+n) as a row.
func (c kvRows) span(off, n int) kvRows {
	if c.bf16 != nil {
		return kvRows{bf16: c.bf16[off : off+n], width: n}
	}
	return kvRows{f32: c.f32[off : off+n], width: n}
}

func (c kvRows) clone() kvRows {
	return kvRows{slices.Clone(c.f32), slices.Clone(c.bf16), c.width}
}

func (c kvRows) copyFrom(src kvRows) {
	copy(c.f32, src.f32)
	copy(c.bf16, src.bf16)
}

// store writes x into slot s, rounding to BF16 when the cache holds it.
func (c kvRows) store(s int, x []float32) {
	r := c.row(s)
	if r.bf16 == nil {
		copy(r.f32, x)
		return
	}
	for i, f := range x {
		r.bf16[i] = half.Float32ToBF16(f)
	}
}

// widen copies the row into dst as float32 (BF16 widening is exact).
func (kern *kernelSet) widenRow(dst []float32, r kvRows) {
	if r.bf16 == nil {
		copy(dst, r.f32)
		return
	}
	kern.widen(dst, r.bf16, kernels.BF16)
}

// attnBlockRows is the most query rows of one work item: all the query
// heads of these rows that read one KV head share its key and value loads.
const attnBlockRows = 16

// attnBlockKeys is the most key positions a work item gathers at a time:
// its scratch is bounded by this, not by the context.
const attnBlockKeys = 256

// attnItem is one work item: rows [row0, row0+rows) of sequence seq, and
// the query heads of KV head kvHead.
type attnItem struct {
	seq, row0, rows, kvHead int
}

// Attention computes paged, masked softmax attention for every sequence.
// Each query row's result depends only on its query and the keys and
// values it sees, in order (see attendBlock): a verify row equals the same
// row decoded alone, bit for bit.
func (be *Backend) Attention(out, q, kCache, vCache kernels.Buffer, shape kernels.AttnShape, seqs []kernels.AttnSeq) {
	if shape.NumKVHeads <= 0 || shape.NumHeads%shape.NumKVHeads != 0 || shape.PageSize <= 0 {
		panic(fmt.Sprintf("cpu: Attention shape %+v: NumHeads must be a positive multiple of NumKVHeads and PageSize > 0", shape))
	}
	qDim := shape.NumHeads * shape.HeadDim
	kvDim := shape.NumKVHeads * shape.HeadDim
	kc, vc := cacheRows("Attention", kCache, vCache, kvDim)
	var items []attnItem
	maxKeys, maxRows, qRows := 0, 0, 0
	for s := range seqs {
		sq := &seqs[s]
		qRows = max(qRows, sq.QueryStart+sq.QueryLen)
		maxKeys = max(maxKeys, sq.Prefix+sq.QueryLen)
		for r0 := 0; r0 < sq.QueryLen; r0 += attnBlockRows {
			rows := min(attnBlockRows, sq.QueryLen-r0)
			maxRows = max(maxRows, rows)
			for g := range shape.NumKVHeads {
				items = append(items, attnItem{s, r0, rows, g})
			}
		}
	}
	qv, ov := f32s("Attention q", q, qRows*qDim), f32s("Attention out", out, qRows*qDim)
	pages := make([][]int32, len(seqs))
	masks := make([][]int32, len(seqs))
	for s, sq := range seqs {
		total := sq.Prefix + sq.QueryLen
		pages[s] = i32s("Attention pages", sq.Pages, (total+shape.PageSize-1)/shape.PageSize)
		if sq.Mask != nil {
			masks[s] = i32s("Attention mask", sq.Mask, sq.QueryLen*sq.QueryLen)
		}
	}
	group := shape.NumHeads / shape.NumKVHeads
	be.pool.parallelFor(len(items), 2*maxRows*group*maxKeys*shape.HeadDim, func(lo, hi int) {
		sc := attnScratchPool.Get().(*attnScratch)
		defer attnScratchPool.Put(sc)
		for _, it := range items[lo:hi] {
			sq := &seqs[it.seq]
			qs := qv[(sq.QueryStart+it.row0)*qDim : (sq.QueryStart+it.row0+it.rows)*qDim]
			os := ov[(sq.QueryStart+it.row0)*qDim : (sq.QueryStart+it.row0+it.rows)*qDim]
			be.kern.attendBlock(sc, os, qs, kc, vc, shape, sq, pages[it.seq], masks[it.seq], it)
		}
	})
}

// attnScratch holds one worker's buffers for attendBlock, all bounded by
// attnBlockRows, attnBlockKeys and the head shape.
type attnScratch struct {
	sees            []bool
	keys            []int
	k, v, q         []float32
	scores, factors []float32
	top, sum, acc   []float32
	raised, events  []int
}

var attnScratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

// grow returns s resized to n elements, reallocating only when it is too short.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// attendBlock computes one work item, streaming over the keys in blocks
// of attnBlockKeys positions: it gathers the keys any of its rows sees in
// the block (widened to F32) and the rows' query heads, scores every query
// against every gathered key with rows4, and folds each row's visible
// scores into its online softmax one key at a time, in order (see
// foldScores): the running max, sum and value accumulator are rescaled
// exactly when a key raises the max. Every step depends only on the row's
// own visible keys in order, never on where blocks start or on the other
// rows (a score is a fixed function of its query and key; an invisible
// key gets weight 0 and factor 1, which change no bit of finite sums), so
// a row's result depends only on what it sees.
func (kern *kernelSet) attendBlock(sc *attnScratch, out, q []float32, kc, vc kvRows, shape kernels.AttnShape, sq *kernels.AttnSeq, pages, mask []int32, it attnItem) {
	hd, total := shape.HeadDim, sq.Prefix+sq.QueryLen
	group := shape.NumHeads / shape.NumKVHeads
	kvDim, qDim := shape.NumKVHeads*hd, shape.NumHeads*hd
	hd16 := (hd + 15) &^ 15 // value rows are padded to whole vectors
	nq := it.rows * group
	// Query heads kvHead·group … +group-1 are adjacent in each row.
	sc.q = grow(sc.q, nq*hd)
	for r := range it.rows {
		copy(sc.q[r*group*hd:(r+1)*group*hd], q[r*qDim+it.kvHead*group*hd:])
	}
	sc.top, sc.sum, sc.acc = grow(sc.top, nq), grow(sc.sum, nq), grow(sc.acc, nq*hd)
	for i := range nq {
		sc.top[i] = float32(math.Inf(-1))
	}
	clear(sc.sum)
	clear(sc.acc)
	first := 0 // no row of the item sees a key before its first row's window
	if sq.Window > 0 {
		first = max(0, sq.Prefix+it.row0-sq.Window+1)
	}
	const n4 = attnBlockKeys // scores stride: whole tiles of keys, zero-padded
	sc.sees = grow(sc.sees, it.rows*attnBlockKeys)
	for b0 := first; b0 < total; b0 += attnBlockKeys {
		sc.keys = sc.keys[:0]
		for p := b0; p < min(b0+attnBlockKeys, total); p++ {
			seen := false
			for r := range it.rows {
				v := sees(sq, it.row0+r, p, mask)
				sc.sees[r*attnBlockKeys+len(sc.keys)] = v
				seen = seen || v
			}
			if seen {
				sc.keys = append(sc.keys, p)
			}
		}
		n := len(sc.keys)
		if n == 0 {
			continue
		}
		sc.k, sc.v = grow(sc.k, n4*hd), grow(sc.v, n*hd16)
		clear(sc.k[n*hd:])
		for u, p := range sc.keys {
			slot := int(pages[p/shape.PageSize])*shape.PageSize + p%shape.PageSize
			if slot < 0 || slot >= kc.slots() {
				panic(fmt.Sprintf("cpu: Attention page table points at slot %d outside the cache's %d slots", slot, kc.slots()))
			}
			base := slot*kvDim + it.kvHead*hd
			kern.widenRow(sc.k[u*hd:(u+1)*hd], kc.span(base, hd))
			kern.widenRow(sc.v[u*hd16:u*hd16+hd], vc.span(base, hd))
			clear(sc.v[u*hd16+hd : (u+1)*hd16])
		}
		sc.scores, sc.factors = grow(sc.scores, nq*n4), grow(sc.factors, nq*n4)
		kern.rows4(sc.scores, n4, sc.q, nq, hd, sc.k[:(n+matmulTile-1)&^(matmulTile-1)*hd])
		for i := range nq {
			visible := sc.sees[i/group*attnBlockKeys : i/group*attnBlockKeys+n]
			kern.foldScores(sc, sc.scores[i*n4:i*n4+n], sc.factors[i*n4:i*n4+n], visible, shape.Scale, &sc.top[i], &sc.sum[i])
		}
		sc.events = rescaleEvents(sc.events[:0], sc.factors, n4, nq, n)
		kern.mixValues(sc.acc, sc.scores, sc.factors, n4, nq, n, sc.v, hd, sc.events)
	}
	for r := range it.rows {
		for g := range group {
			i := r*group + g
			o := out[r*qDim+(it.kvHead*group+g)*hd:][:hd]
			inv := float32(0) // a row that sees no key gets zeros
			if sc.sum[i] > 0 {
				inv = 1 / sc.sum[i]
			}
			for d, a := range sc.acc[i*hd : (i+1)*hd] {
				o[d] = a * inv
			}
		}
	}
}

// foldScores folds one row's scores of a block into its online softmax
// (running max top, running sum), key by key in order. It sets scores[u]
// to the key's weight exp(x_u - top_u), where x_u is its scaled score and
// top_u the max over the row's visible keys up to u, and factors[u] to
// exp(top_{u-1} - top_u), by which everything summed before key u must be
// scaled (1 unless u raises the max; 0 at the row's first key). Invisible
// keys get weight 0 and factor 1.
func (kern *kernelSet) foldScores(sc *attnScratch, scores, factors []float32, visible []bool, scale float32, top, sum *float32) {
	sc.raised = sc.raised[:0]
	m := *top
	for u, s := range scores {
		factors[u] = 1
		if !visible[u] {
			scores[u] = 0
			continue
		}
		x := s * scale
		if x > m {
			sc.raised = append(sc.raised, u)
			factors[u] = float32(math.Exp(float64(m - x))) // 0 when m is -Inf
			m = x
		}
		scores[u] = x - m
	}
	*top = m
	kern.exp(scores)
	l := *sum
	for u, w := range scores {
		if !visible[u] {
			scores[u] = 0
			continue
		}
		l = l*factors[u] + w
	}
	*sum = l
}

// rescaleEvents appends to dst, in order, the keys u < n at which any of
// the nq rows' factors (row i at factors[i*stride:]) is not 1.
func rescaleEvents(dst []int, factors []float32, stride, nq, n int) []int {
	for u := range n {
		for i := range nq {
			if factors[i*stride+u] != 1 {
				dst = append(dst, u)
				break
			}
		}
	}
	return dst
}

// sees reports whether query row i of sq may attend to key position p.
func sees(sq *kernels.AttnSeq, i, p int, mask []int32) bool {
	if j := p - sq.Prefix; j >= 0 {
		if mask == nil && j > i || mask != nil && mask[i*sq.QueryLen+j] == 0 {
			return false
		}
	}
	return sq.Window <= 0 || sq.Prefix+i-p < sq.Window
}

// expPortable sets x[j] = exp(x[j]).
func expPortable(x []float32) {
	for j, v := range x {
		x[j] = float32(math.Exp(float64(v)))
	}
}

// mixValuesPortable updates each of the nq rows of acc [nq, hd], key by
// key in order: acc_i = acc_i·f[i·pStride+u] + p[i·pStride+u]·v_u over the
// n value rows v_u (of stride hd rounded up to 16). Events lists the keys
// where some factor is not 1; this version needs no list.
func mixValuesPortable(acc, p, f []float32, pStride, nq, n int, v []float32, hd int, _ []int) {
	hd16 := (hd + 15) &^ 15
	for i := range nq {
		o := acc[i*hd : (i+1)*hd]
		for u, pu := range p[i*pStride : i*pStride+n] {
			if fu := f[i*pStride+u]; fu != 1 {
				for d := range o {
					o[d] *= fu
				}
			}
			axpy(o, v[u*hd16:u*hd16+hd], pu)
		}
	}
}
