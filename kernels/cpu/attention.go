package cpu

import (
	"fmt"
	"math"

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

// attnRow is one (sequence, query row) pair.
type attnRow struct {
	seq, i int // index into seqs, row within the sequence's block
}

// Attention computes paged, masked softmax attention for every sequence.
func (be *Backend) Attention(out, q, kCache, vCache kernels.Buffer, shape kernels.AttnShape, seqs []kernels.AttnSeq) {
	if shape.NumKVHeads <= 0 || shape.NumHeads%shape.NumKVHeads != 0 || shape.PageSize <= 0 {
		panic(fmt.Sprintf("cpu: Attention shape %+v: NumHeads must be a positive multiple of NumKVHeads and PageSize > 0", shape))
	}
	qDim := shape.NumHeads * shape.HeadDim
	kvDim := shape.NumKVHeads * shape.HeadDim
	kc, vc := cacheRows("Attention", kCache, vCache, kvDim)
	var rows []attnRow
	maxKeys, qRows := 0, 0
	for s := range seqs {
		sq := &seqs[s]
		qRows = max(qRows, sq.QueryStart+sq.QueryLen)
		maxKeys = max(maxKeys, sq.Prefix+sq.QueryLen)
		for i := range sq.QueryLen {
			rows = append(rows, attnRow{s, i})
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
	// Work items are (row, head) pairs, so that a decode row still spreads over the workers.
	heads := shape.NumHeads
	be.pool.parallelFor(len(rows)*heads, maxKeys*shape.HeadDim, func(lo, hi int) {
		slots := make([]int, 0, maxKeys)
		scores := make([]float32, maxKeys)
		for item := lo; item < hi; item++ {
			r, h := rows[item/heads], item%heads
			sq := &seqs[r.seq]
			if item == lo || h == 0 {
				slots = visibleSlots(slots[:0], sq, r.i, pages[r.seq], masks[r.seq], shape.PageSize)
			}
			row := sq.QueryStart + r.i
			kvOff := (h / (heads / shape.NumKVHeads)) * shape.HeadDim
			qh := qv[row*qDim+h*shape.HeadDim : row*qDim+(h+1)*shape.HeadDim]
			oh := ov[row*qDim+h*shape.HeadDim : row*qDim+(h+1)*shape.HeadDim]
			be.kern.attend(oh, qh, kc, vc, slots, scores[:len(slots)], kvDim, kvOff, shape.Scale)
		}
	})
}

// visibleSlots appends the physical cache rows query row i may attend to.
func visibleSlots(slots []int, sq *kernels.AttnSeq, i int, pages, mask []int32, pageSize int) []int {
	for p := range sq.Prefix + sq.QueryLen {
		if j := p - sq.Prefix; j >= 0 {
			if mask == nil && j > i || mask != nil && mask[i*sq.QueryLen+j] == 0 {
				continue
			}
		}
		if sq.Window > 0 && sq.Prefix+i-p >= sq.Window {
			continue
		}
		slots = append(slots, int(pages[p/pageSize])*pageSize+p%pageSize)
	}
	return slots
}

// attendHead computes one head's softmax(q·K/scale)·V over the given slots.
// A row that sees no key gets zeros.
func attendHead(out, q, kc, vc []float32, slots []int, scores []float32, kvDim, kvOff int, scale float32) {
	clear(out)
	if len(slots) == 0 {
		return
	}
	hd := len(q)
	top := float32(math.Inf(-1))
	for j, s := range slots {
		base := s*kvDim + kvOff
		if base+hd > len(kc) {
			panic(fmt.Sprintf("cpu: Attention page table points at slot %d outside the cache's %d slots", s, len(kc)/kvDim))
		}
		scores[j] = dot(q, kc[base:base+hd]) * scale
		top = max(top, scores[j])
	}
	var sum float32
	for j := range scores {
		scores[j] = float32(math.Exp(float64(scores[j] - top)))
		sum += scores[j]
	}
	for j, s := range slots {
		p := scores[j] / sum
		v := vc[s*kvDim+kvOff : s*kvDim+kvOff+hd]
		for d := range out {
			out[d] += p * v[d]
		}
	}
}
