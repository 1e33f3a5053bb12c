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
const attnBlockRows = 32

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
		// Causal rows see more keys the later they are: the blocks go
		// first, last, second, second to last…, so that the workers'
		// contiguous ranges of items get even shares of the work.
		blocks := (sq.QueryLen + attnBlockRows - 1) / attnBlockRows
		for j := range blocks {
			b := j / 2
			if j%2 == 1 {
				b = blocks - 1 - j/2
			}
			r0 := b * attnBlockRows
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
	be.pool.parallelFor(len(items), 3*maxRows*group*maxKeys*shape.HeadDim, func(lo, hi int) {
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
	sees        []bool
	keys        []int
	k, v, q     []float32
	scores      []float32
	top, sums   []float32
	acc         []float32
	partVisible []bool
}

var attnScratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

// grow returns s resized to n elements, reallocating only when it is too short.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// attendBlock computes one work item in two passes over the keys, each in
// blocks of attnBlockKeys positions: the first finds each query row's
// largest scaled score x = q·k·scale over the keys it sees, the second
// adds exp(x − top)·v and exp(x − top) to the row's value and weight sums,
// key by key in order (mixRows). Each block gathers the keys any of its
// rows sees (widened to F32) and scores every query against every one
// with rows4; a key a row does not see gets weight 0, which changes no bit
// of its sums. A score is a fixed function of its query and key, the max
// does not depend on order, and the sums run over the row's own visible
// keys in order, so a row's result depends only on what it sees: not on
// where blocks start, on the other rows, or on the keys' positions (a
// verify row equals the same row decoded over its accepted path).
func (kern *kernelSet) attendBlock(sc *attnScratch, out, q []float32, kc, vc kvRows, shape kernels.AttnShape, sq *kernels.AttnSeq, pages, mask []int32, it attnItem) {
	hd, total := shape.HeadDim, sq.Prefix+sq.QueryLen
	group := shape.NumHeads / shape.NumKVHeads
	qDim := shape.NumHeads * hd
	hd16 := (hd + 15) &^ 15 // value rows are padded to whole vectors
	nq := it.rows * group
	// Query heads kvHead·group … +group-1 are adjacent in each row.
	sc.q = grow(sc.q, nq*hd)
	for r := range it.rows {
		copy(sc.q[r*group*hd:(r+1)*group*hd], q[r*qDim+it.kvHead*group*hd:])
	}
	sc.top, sc.sums, sc.acc = grow(sc.top, nq), grow(sc.sums, nq*attnSumStride), grow(sc.acc, nq*hd16)
	for i := range nq {
		sc.top[i] = float32(math.Inf(-1))
	}
	clear(sc.sums)
	clear(sc.acc)
	first := 0 // no row of the item sees a key before its first row's window
	if sq.Window > 0 {
		first = max(0, sq.Prefix+it.row0-sq.Window+1)
	}
	const n4 = attnBlockKeys // scores stride: whole tiles of keys, zero-padded
	sc.sees = grow(sc.sees, it.rows*attnBlockKeys)
	sc.partVisible = grow(sc.partVisible, it.rows)
	// The first pass keeps the scores of its first blocks (as many as fit
	// in attnScoreFloats, one slot left for the others): the second pass
	// reads them instead of gathering the keys again, which a decode row's
	// whole context fits in.
	block := nq * n4
	kept := max(0, attnScoreFloats/block-1)
	sc.scores = grow(sc.scores, max(attnScoreFloats, block))
	for pass := range 2 {
		for bi, b0 := 0, first; b0 < total; bi, b0 = bi+1, b0+attnBlockKeys {
			stored := pass == 1 && bi < kept
			n := kern.gatherKeys(sc, kc, vc, shape, sq, pages, mask, it, b0, !stored, pass == 1)
			if n == 0 {
				continue
			}
			scores := sc.scores[min(bi, kept)*block:][:block]
			if !stored {
				kern.rows4(scores, n4, sc.q, nq, hd, sc.k[:(n+matmulTile-1)&^(matmulTile-1)*hd], nil)
			}
			for i := range nq {
				x := scores[i*n4 : i*n4+n]
				if r := i / group; !stored && sc.partVisible[r] {
					for u, v := range sc.sees[r*attnBlockKeys : r*attnBlockKeys+n] {
						if !v {
							x[u] = float32(math.Inf(-1))
						}
					}
				}
				if pass == 0 {
					sc.top[i] = max(sc.top[i], kern.scaledMax(x, shape.Scale))
				} else if math.IsInf(float64(sc.top[i]), -1) {
					clear(x) // the row sees no key
				} else {
					kern.scaledExp(x, shape.Scale, sc.top[i])
				}
			}
			if pass == 1 {
				kern.mixRows(sc.acc, hd16, scores, n4, nq, n, sc.v, hd16, sc.sums)
			}
		}
	}
	for r := range it.rows {
		for g := range group {
			i := r*group + g
			o := out[r*qDim+(it.kvHead*group+g)*hd:][:hd]
			inv := float32(0) // a row that sees no key gets zeros
			if s := sc.sums[i*attnSumStride]; s > 0 {
				inv = 1 / s
			}
			for d, a := range sc.acc[i*hd16 : i*hd16+hd] {
				o[d] = a * inv
			}
		}
	}
}

// attnScoreFloats bounds the scores a work item keeps between its passes.
const attnScoreFloats = 1 << 17

// attnSumStride is the stride of the rows' weight sums in attnScratch.sums
// (mixRows keeps each in the first lane of a vector).
const attnSumStride = 16

// gatherKeys collects the positions in [b0, b0+attnBlockKeys) that any row
// of the item sees (sc.keys, with each row's visibility in sc.sees and
// sc.partVisible set for rows that miss some of them), and widens, when
// keys is set, their keys into sc.k (zero-padded to a whole tile) and,
// when values is set, their values into sc.v (rows of hd rounded up to 16,
// zero-padded). It returns the number of positions.
func (kern *kernelSet) gatherKeys(sc *attnScratch, kc, vc kvRows, shape kernels.AttnShape, sq *kernels.AttnSeq, pages, mask []int32, it attnItem, b0 int, keys, values bool) int {
	hd, kvDim := shape.HeadDim, shape.NumKVHeads*shape.HeadDim
	hd16 := (hd + 15) &^ 15
	total := sq.Prefix + sq.QueryLen
	sc.keys = sc.keys[:0]
	clear(sc.partVisible)
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
	for r := range it.rows {
		for _, v := range sc.sees[r*attnBlockKeys : r*attnBlockKeys+n] {
			sc.partVisible[r] = sc.partVisible[r] || !v
		}
	}
	sc.k = grow(sc.k, attnBlockKeys*hd)
	clear(sc.k[n*hd : (n+matmulTile-1)&^(matmulTile-1)*hd])
	if values {
		sc.v = grow(sc.v, attnBlockKeys*hd16)
	}
	for u, p := range sc.keys {
		slot := int(pages[p/shape.PageSize])*shape.PageSize + p%shape.PageSize
		if slot < 0 || slot >= kc.slots() {
			panic(fmt.Sprintf("cpu: Attention page table points at slot %d outside the cache's %d slots", slot, kc.slots()))
		}
		base := slot*kvDim + it.kvHead*hd
		if keys {
			kern.widenRow(sc.k[u*hd:(u+1)*hd], kc.span(base, hd))
		}
		if values {
			kern.widenRow(sc.v[u*hd16:u*hd16+hd], vc.span(base, hd))
			clear(sc.v[u*hd16+hd : (u+1)*hd16])
		}
	}
	return n
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

// scaledMaxPortable returns the largest x[j]·scale (−Inf for none).
func scaledMaxPortable(x []float32, scale float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v*scale)
	}
	return m
}

// scaledExpPortable sets x[j] = exp(x[j]·scale − top) (0 for x[j] = −Inf).
func scaledExpPortable(x []float32, scale, top float32) {
	for j, v := range x {
		x[j] = float32(math.Exp(float64(v*scale - top)))
	}
}

// mixRowsPortable adds, for each of the nq rows i, Σ_u w[i·wStride+u]·v_u
// to acc[i·accStride:][:vStride] and (sums not nil) Σ_u w[i·wStride+u] to
// sums[i·attnSumStride], over the n value rows v_u (v[u·vStride:]) in order.
func mixRowsPortable(acc []float32, accStride int, w []float32, wStride, nq, n int, v []float32, vStride int, sums []float32) {
	for i := range nq {
		wi := w[i*wStride : i*wStride+n]
		accumRowsPortable(acc[i*accStride:i*accStride+vStride], wi, v, vStride)
		addWeights(sums, i, wi)
	}
}

// addWeights adds the weights w to row i's sum in sums (if not nil), in order.
func addWeights(sums []float32, i int, w []float32) {
	if sums == nil {
		return
	}
	s := sums[i*attnSumStride]
	for _, x := range w {
		s += x
	}
	sums[i*attnSumStride] = s
}
