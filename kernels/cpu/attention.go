package cpu

import (
	"fmt"
	"math"
	"sync"

	"ddflash/kernels"
)

// WriteKV stores n rows of k and v into the caches at the given slots.
func (be *Backend) WriteKV(kCache, vCache, k, v, slots kernels.Buffer, n, kvDim int) {
	kv, vv := f32s("WriteKV k", k, n*kvDim), f32s("WriteKV v", v, n*kvDim)
	sl := i32s("WriteKV slots", slots, n)
	kc, vc := cacheRows("WriteKV", kCache, vCache, kvDim)
	for i, s := range sl {
		checkSlot("WriteKV", s, kc, kvDim)
		copy(kc[int(s)*kvDim:(int(s)+1)*kvDim], kv[i*kvDim:(i+1)*kvDim])
		copy(vc[int(s)*kvDim:(int(s)+1)*kvDim], vv[i*kvDim:(i+1)*kvDim])
	}
}

// MoveKV copies cache rows src[i] → dst[i], reading every source first.
func (be *Backend) MoveKV(kCache, vCache, dst, src kernels.Buffer, n, kvDim int) {
	dv, sv := i32s("MoveKV dst", dst, n), i32s("MoveKV src", src, n)
	kc, vc := cacheRows("MoveKV", kCache, vCache, kvDim)
	saved := make([]float32, 2*n*kvDim)
	for i, s := range sv {
		checkSlot("MoveKV src", s, kc, kvDim)
		copy(saved[2*i*kvDim:], kc[int(s)*kvDim:(int(s)+1)*kvDim])
		copy(saved[(2*i+1)*kvDim:], vc[int(s)*kvDim:(int(s)+1)*kvDim])
	}
	for i, d := range dv {
		checkSlot("MoveKV dst", d, kc, kvDim)
		copy(kc[int(d)*kvDim:(int(d)+1)*kvDim], saved[2*i*kvDim:(2*i+1)*kvDim])
		copy(vc[int(d)*kvDim:(int(d)+1)*kvDim], saved[(2*i+1)*kvDim:(2*i+2)*kvDim])
	}
}

// cacheRows returns the two F32 caches, which must have the same length.
func cacheRows(op string, kCache, vCache kernels.Buffer, kvDim int) (k, v []float32) {
	kb, vb := asBuffer(kCache), asBuffer(vCache)
	checkDType(op+" kCache", kb, kernels.F32)
	checkDType(op+" vCache", vb, kernels.F32)
	if len(kb.f32) != len(vb.f32) || kvDim <= 0 {
		panic(fmt.Sprintf("cpu: %s caches of %d and %d elements with kvDim %d: need equal caches and kvDim > 0", op, len(kb.f32), len(vb.f32), kvDim))
	}
	return kb.f32, vb.f32
}

func checkSlot(op string, slot int32, cache []float32, kvDim int) {
	if slot < 0 || int(slot) >= len(cache)/kvDim {
		panic(fmt.Sprintf("cpu: %s slot %d outside the cache's %d slots", op, slot, len(cache)/kvDim))
	}
}

// attnBlockRows is the most query rows of one work item: all the query
// heads of these rows that read one KV head share its key and value loads.
const attnBlockRows = 16

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

// attnScratch holds one worker's buffers for attendBlock.
type attnScratch struct {
	sees         []bool
	keys         []int
	k, v, q, out []float32
	scores, row  []float32
	inv          []float32
}

var attnScratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

// grow returns s resized to n elements, reallocating only when it is too short.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// attendBlock computes one work item. It gathers the keys any of its rows
// sees (in position order) and the rows' query heads into dense arrays,
// scores every query against every gathered key with rows4, takes the
// softmax of each row's own visible scores, in order, and sets the others
// to zero, then sums the values in key order. A score is a fixed function
// of its query and key, and adding a zero-weighted value changes no bit
// (values are finite), so a row's result depends only on what it sees.
func (kern *kernelSet) attendBlock(sc *attnScratch, out, q, kc, vc []float32, shape kernels.AttnShape, sq *kernels.AttnSeq, pages, mask []int32, it attnItem) {
	hd, total := shape.HeadDim, sq.Prefix+sq.QueryLen
	group := shape.NumHeads / shape.NumKVHeads
	kvDim, qDim := shape.NumKVHeads*hd, shape.NumHeads*hd
	sc.sees = grow(sc.sees, it.rows*total)
	sc.keys = sc.keys[:0]
	for p := range total {
		seen := false
		for r := range it.rows {
			v := sees(sq, it.row0+r, p, mask)
			sc.sees[r*total+p] = v
			seen = seen || v
		}
		if seen {
			sc.keys = append(sc.keys, p)
		}
	}
	n := len(sc.keys)
	n4 := (n + matmulTile - 1) &^ (matmulTile - 1) // whole tiles of keys, zero-padded
	hd16 := (hd + 15) &^ 15                        // value rows are padded to whole vectors
	sc.k, sc.v = grow(sc.k, n4*hd), grow(sc.v, n*hd16)
	clear(sc.k[n*hd:])
	for u, p := range sc.keys {
		slot := int(pages[p/shape.PageSize])*shape.PageSize + p%shape.PageSize
		base := slot*kvDim + it.kvHead*hd
		if base+hd > len(kc) {
			panic(fmt.Sprintf("cpu: Attention page table points at slot %d outside the cache's %d slots", slot, len(kc)/kvDim))
		}
		copy(sc.k[u*hd:(u+1)*hd], kc[base:base+hd])
		copy(sc.v[u*hd16:u*hd16+hd], vc[base:base+hd])
		clear(sc.v[u*hd16+hd : (u+1)*hd16])
	}
	// Query heads kvHead·group … +group-1 are adjacent in each row.
	nq := it.rows * group
	sc.q = grow(sc.q, nq*hd)
	for r := range it.rows {
		copy(sc.q[r*group*hd:(r+1)*group*hd], q[r*qDim+it.kvHead*group*hd:])
	}
	sc.scores = grow(sc.scores, nq*n4)
	kern.rows4(sc.scores, n4, sc.q, nq, hd, sc.k)
	sc.row, sc.inv = grow(sc.row, n), grow(sc.inv, nq)
	for i := range nq {
		scores, visible := sc.scores[i*n4:i*n4+n], sc.sees[i/group*total:]
		row := sc.row[:0]
		for u, p := range sc.keys {
			if visible[p] {
				row = append(row, scores[u]*shape.Scale)
			}
		}
		sc.inv[i] = kern.softmax(row)
		for u, p := range sc.keys {
			if visible[p] {
				scores[u], row = row[0], row[1:]
			} else {
				scores[u] = 0
			}
		}
	}
	sc.out = grow(sc.out, nq*hd)
	kern.mixValues(sc.out, sc.scores, n4, nq, n, sc.v, hd, sc.inv)
	for r := range it.rows {
		copy(out[r*qDim+it.kvHead*group*hd:], sc.out[r*group*hd:(r+1)*group*hd])
	}
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

// softmaxPortable sets s[j] = exp(s[j] - max s) and returns 1/Σ s[j], or 0
// for an empty row.
func softmaxPortable(s []float32) float32 {
	if len(s) == 0 {
		return 0
	}
	top := float32(math.Inf(-1))
	for _, v := range s {
		top = max(top, v)
	}
	var sum float32
	for j, v := range s {
		s[j] = float32(math.Exp(float64(v - top)))
		sum += s[j]
	}
	return 1 / sum
}

// mixValuesPortable sets out[i] = inv[i]·Σ_j p[i·pStride+j]·v_j over the
// n value rows v_j (of stride hd rounded up to 16), for the nq rows of out [nq, hd].
func mixValuesPortable(out, p []float32, pStride, nq, n int, v []float32, hd int, inv []float32) {
	hd16 := (hd + 15) &^ 15
	for i := range nq {
		o := out[i*hd : (i+1)*hd]
		clear(o)
		for j, pj := range p[i*pStride : i*pStride+n] {
			axpy(o, v[j*hd16:j*hd16+hd], pj)
		}
		for d := range o {
			o[d] *= inv[i]
		}
	}
}
