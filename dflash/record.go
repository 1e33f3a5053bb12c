package dflash

import (
	"fmt"
	"slices"

	"ddflash/kernels"
)

// Recorded drafts. On a backend that records ops (kernels.Replayer) with a
// target on one rank, a DFlash block draft and its device top-k
// (Session.DraftTop) are recorded as the target's steps are
// (engine/step.go): run op by op the first time their shape is seen,
// recorded the second time and replayed from then on, one launch instead
// of one per op. A recording reads its per-draft data (token ids,
// positions, K/V slots, page tables and each layer's attention table)
// from one persistent buffer written by one upload, and its activations
// from the drafter's arena, which keeps them from draft to draft.
// Model.Eager turns it off, as it does the target's.

// blockRecordings are a drafter's recorded blocks by shape.
type blockRecordings struct {
	meta   kernels.Buffer // I32, grown as needed (placePlan)
	host   []int32
	seen   map[string]bool
	graphs map[string]blockGraph
	// What the recordings read besides the meta buffer: the target's step
	// buffers (its LM head) and the arena's. A recording is stale once
	// either has moved since it was made.
	targetMoves, arenaAllocs int
}

// blockGraph is a recorded block and the buffer its top-k records land in.
type blockGraph struct {
	g   kernels.Graph
	top kernels.Buffer
}

// drop closes every recording; the next block of each shape runs op by op
// again, sizing what moved.
func (r *blockRecordings) drop() {
	for _, bg := range r.graphs {
		bg.g.Close()
	}
	r.graphs, r.seen = nil, nil
}

func (r *blockRecordings) free(b kernels.Backend) {
	r.drop()
	if r.meta != nil {
		b.Free(r.meta)
		r.meta = nil
	}
}

// records reports whether the drafter records its blocks.
func (d *Drafter) records() bool {
	_, ok := d.b.(kernels.Replayer)
	return ok && !d.target.Eager && d.target.Ranks() == 1
}

// placePlan writes p to the persistent buffer, one upload, and returns its
// views there. Each layer's attention table comes first, then ids,
// positions and both kinds of slots at fixed places (room for the
// drafter's whole block), so that a recording's arguments stay where they
// are; the page tables, which the tables point at, follow.
func (d *Drafter) placePlan(rp kernels.Replayer, p *blockPlan) (*blockInputs, error) {
	r, L, Qmax := &d.rec, len(d.layers), d.Cfg.BlockSize
	T := rp.AttnTableLen(1)
	T += T % 2 // 8-byte aligned: tables hold device pointers
	fixed := L*T + 4*Qmax
	size := fixed + len(p.pages[0]) + len(p.pages[1])
	if r.meta == nil || r.meta.Len() < size {
		r.drop()
		if r.meta != nil {
			d.b.Free(r.meta)
			r.meta = nil
		}
		buf, err := d.b.Alloc(kernels.I32, 2*size) // room to grow: page tables lengthen
		if err != nil {
			return nil, fmt.Errorf("dflash: block metadata: %w", err)
		}
		r.meta = buf
	}
	view := func(off, n int) kernels.Buffer { return d.b.Slice(r.meta, off, n) }
	host := slices.Grow(r.host[:0], size)[:size]
	place := func(off int, v []int32) kernels.Buffer {
		if len(v) == 0 {
			return nil // as arena.i32: no kernel reads it
		}
		copy(host[off:], v)
		return view(off, len(v))
	}
	in := &blockInputs{seqs: slices.Clone(p.seqs), cacheOf: p.cacheOf, maxKeys: p.maxKeys}
	in.ids, in.pos = place(L*T, p.ids), place(L*T+Qmax, p.pos)
	off := fixed
	var pages [2]kernels.Buffer
	for kind := range 2 {
		in.slots[kind] = place(L*T+(2+kind)*Qmax, p.slots[kind])
		pages[kind] = place(off, p.pages[kind])
		off += len(p.pages[kind])
	}
	for i := range in.seqs {
		in.seqs[i].Pages = pages[p.cacheOf[i]]
		in.tables = append(in.tables, view(i*T, T))
		rp.EncodeAttnTable(host[i*T:(i+1)*T], in.seqs[i:i+1], d.attn.PageSize)
	}
	r.host = host
	if err := d.b.UploadI32(r.meta, 0, host); err != nil {
		return nil, fmt.Errorf("dflash: upload block metadata: %w", err)
	}
	return in, nil
}

// runRecorded runs block (which issues a block's ops and returns where its
// top-k records land) op by op, records it, or replays its recording, by
// shape key, as described above.
func (d *Drafter) runRecorded(rp kernels.Replayer, key string, block func() (kernels.Buffer, error)) (kernels.Buffer, error) {
	r := &d.rec
	if r.targetMoves != d.target.Moves() || r.arenaAllocs != d.scratch.allocs {
		r.drop()
	}
	defer func() { r.targetMoves, r.arenaAllocs = d.target.Moves(), d.scratch.allocs }()
	if bg, ok := r.graphs[key]; ok {
		return bg.top, bg.g.Replay()
	}
	if !r.seen[key] {
		if r.seen == nil {
			r.seen = map[string]bool{}
		}
		r.seen[key] = true
		return block() // sizes the buffers the recording will use
	}
	var top kernels.Buffer
	g, err := rp.Capture(func() error {
		var err error
		top, err = block()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dflash: recording a draft: %w", err)
	}
	if r.graphs == nil {
		r.graphs = map[string]blockGraph{}
	}
	r.graphs[key] = blockGraph{g: g, top: top}
	return top, g.Replay()
}
