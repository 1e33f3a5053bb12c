package dflash

import (
	"fmt"
	"slices"

	"ddflash/kernels"
)

// Recorded drafts. On a backend that records ops (kernels.Replayer) with a
// target on one rank, a DFlash block draft and its device top-k
// (Session.DraftTop), and taking a verify's accepted rows into the context
// (Session.Absorb), are recorded as the target's steps are
// (engine/step.go): run op by op the first time their shape is seen,
// recorded the second time and replayed from then on, one launch instead
// of one per op. A recording reads its per-call data (token ids, row
// indices, positions, K/V slots, page tables and each layer's attention
// table) from one persistent buffer written by one upload, its activations
// from the drafter's arenas, which keep them from call to call, and the
// accepted rows from the target's tap buffer, which stays where it is.
// Model.Eager turns it off, as it does the target's.

// recordings are a drafter's recorded calls of one kind by shape.
type recordings struct {
	meta   kernels.Buffer // I32, grown as needed
	host   []int32
	seen   map[string]bool
	graphs map[string]recording
	// stamp is what the recordings read besides the meta buffer when they
	// were made: the target's step buffers (its LM head, its taps) and the
	// arena's. A recording is stale once either has moved.
	stamp [2]int
}

// recording is a recorded call and the buffer its results land in.
type recording struct {
	g   kernels.Graph
	out kernels.Buffer
}

// drop closes every recording; the next call of each shape runs op by op
// again, sizing what moved.
func (r *recordings) drop() {
	for _, rec := range r.graphs {
		rec.g.Close()
	}
	r.graphs, r.seen = nil, nil
}

func (r *recordings) free(b kernels.Backend) {
	r.drop()
	if r.meta != nil {
		b.Free(r.meta)
		r.meta = nil
	}
}

// ensureMeta makes the meta buffer hold size values (dropping the
// recordings, which read the old one, when it grows) and returns its host
// copy, size long.
func (r *recordings) ensureMeta(b kernels.Backend, size int) ([]int32, error) {
	if r.meta == nil || r.meta.Len() < size {
		r.drop()
		if r.meta != nil {
			b.Free(r.meta)
			r.meta = nil
		}
		buf, err := b.Alloc(kernels.I32, 2*size) // room to grow: page tables lengthen
		if err != nil {
			return nil, fmt.Errorf("dflash: recorded call metadata: %w", err)
		}
		r.meta = buf
	}
	r.host = slices.Grow(r.host[:0], size)[:size]
	return r.host, nil
}

// run runs call (which issues a call's ops and returns where its results
// land) op by op, records it, or replays its recording, by shape key, as
// described above. stamp reads the state the recordings depend on.
func (r *recordings) run(rp kernels.Replayer, key string, stamp func() [2]int, call func() (kernels.Buffer, error)) (kernels.Buffer, error) {
	if r.stamp != stamp() {
		r.drop()
	}
	defer func() { r.stamp = stamp() }()
	if rec, ok := r.graphs[key]; ok {
		return rec.out, rec.g.Replay()
	}
	if !r.seen[key] {
		if r.seen == nil {
			r.seen = map[string]bool{}
		}
		r.seen[key] = true
		return call() // sizes the buffers the recording will use
	}
	var out kernels.Buffer
	g, err := rp.Capture(func() error {
		var err error
		out, err = call()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dflash: recording a draft: %w", err)
	}
	if r.graphs == nil {
		r.graphs = map[string]recording{}
	}
	r.graphs[key] = recording{g: g, out: out}
	return out, g.Replay()
}

// records reports whether the drafter records its calls.
func (d *Drafter) records() bool {
	_, ok := d.b.(kernels.Replayer)
	return ok && !d.target.Eager && d.target.Ranks() == 1
}

// blockStamp and contextStamp are the state the block's and the context
// intake's recordings read (recordings.stamp).
func (d *Drafter) blockStamp() [2]int   { return [2]int{d.target.Moves(), d.scratch.allocs} }
func (d *Drafter) contextStamp() [2]int { return [2]int{d.target.Moves(), d.contextScratch.allocs} }

// placePlan writes p to the block's persistent buffer, one upload, and
// returns its views there. Each layer's attention table comes first, then
// ids, positions and both kinds of slots at fixed places (room for the
// drafter's whole block), so that a recording's arguments stay where they
// are; the page tables, which the tables point at, follow.
func (d *Drafter) placePlan(rp kernels.Replayer, p *blockPlan) (*blockInputs, error) {
	r, L, Qmax := &d.blocks, len(d.layers), d.Cfg.BlockSize
	T := rp.AttnTableLen(1)
	T += T % 2 // 8-byte aligned: tables hold device pointers
	fixed := L*T + 4*Qmax
	host, err := r.ensureMeta(d.b, fixed+len(p.pages[0])+len(p.pages[1]))
	if err != nil {
		return nil, err
	}
	place := placer(d.b, r.meta, host)
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
		in.tables = append(in.tables, d.b.Slice(r.meta, i*T, T))
		rp.EncodeAttnTable(host[i*T:(i+1)*T], in.seqs[i:i+1], d.attn.PageSize)
	}
	if err := d.b.UploadI32(r.meta, 0, host); err != nil {
		return nil, fmt.Errorf("dflash: upload block metadata: %w", err)
	}
	return in, nil
}

// placeContext writes a context intake's row indices and p to the context
// intake's persistent buffer (room for a whole block of rows each), one
// upload, and returns their views there.
func (d *Drafter) placeContext(rows []int32, p *contextPlan) (*contextInputs, error) {
	r, Qmax := &d.contexts, d.Cfg.BlockSize
	host, err := r.ensureMeta(d.b, 4*Qmax)
	if err != nil {
		return nil, err
	}
	place := placer(d.b, r.meta, host)
	in := &contextInputs{rows: place(0, rows), pos: place(Qmax, p.pos)}
	for kind := range 2 {
		in.slots[kind] = place((2+kind)*Qmax, p.slots[kind])
	}
	if err := d.b.UploadI32(r.meta, 0, host); err != nil {
		return nil, fmt.Errorf("dflash: upload context metadata: %w", err)
	}
	return in, nil
}

// placer returns a function that copies v to host at off and returns its
// view in meta (nil for no values, as arena.i32: no kernel reads it).
func placer(b kernels.Backend, meta kernels.Buffer, host []int32) func(off int, v []int32) kernels.Buffer {
	return func(off int, v []int32) kernels.Buffer {
		if len(v) == 0 {
			return nil
		}
		copy(host[off:], v)
		return b.Slice(meta, off, len(v))
	}
}
