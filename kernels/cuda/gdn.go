//go:build cgo

package cuda

import (
	"encoding/binary"
	"fmt"

	"ddflash/kernels"
)

// GDNGates turns a into g = -exp(aLog)·softplus(a+dtBias) and b into sigmoid(b).
func (be *Backend) GDNGates(a, b, aLog, dtBias kernels.Buffer, T, heads int) {
	av, bv := f32s("GDNGates a", a, T*heads), f32s("GDNGates b", b, T*heads)
	al, variant := weights("GDNGates aLog", aLog, heads)
	db, dbVariant := weights("GDNGates dtBias", dtBias, heads)
	if variant != dbVariant {
		panic(fmt.Sprintf("cuda: GDNGates aLog is %v and dtBias %v: the kernel needs one dtype", al.dt, db.dt))
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("gdn_gates"+variant, be.gridFor(T*heads, 256), d1(256), 0, av, bv, al, db, i32(T), i32(heads))
}

// maxGDNKeyDim is the largest key dim the recurrence kernel takes: 8 row
// groups of ROWS_PER_THREAD (32) rows, 256 threads, so that any register
// count the compiler picks fits the block.
const maxGDNKeyDim = 256

// gdnOperands checks a GDN op's inputs like the CPU backend does.
func gdnOperands(op string, out, q, k, v, g, beta kernels.Buffer, T int, shape kernels.GDNShape) []any {
	if shape.KeyHeads <= 0 || shape.ValueHeads%shape.KeyHeads != 0 {
		panic(fmt.Sprintf("cuda: %s shape %+v: ValueHeads must be a positive multiple of KeyHeads", op, shape))
	}
	if shape.KeyDim <= 0 || shape.KeyDim > maxGDNKeyDim || shape.ValueDim <= 0 {
		panic(fmt.Sprintf("cuda: %s shape %+v: the kernel supports key dims 1..%d", op, shape, maxGDNKeyDim))
	}
	qkDim, vDim := shape.KeyHeads*shape.KeyDim, shape.ValueHeads*shape.ValueDim
	var o any
	if out != nil {
		o = f32s(op+" out", out, T*vDim)
	}
	return []any{o, f32s(op+" q", q, T*qkDim), f32s(op+" k", k, T*qkDim), f32s(op+" v", v, T*vDim),
		f32s(op+" g", g, T*shape.ValueHeads), f32s(op+" beta", beta, T*shape.ValueHeads)}
}

// GDNRecurrence runs the gated delta rule token by token, as a chain or a tree.
func (be *Backend) GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, parents kernels.Buffer, T int, shape kernels.GDNShape) {
	be.GDNRecurrences(out, q, k, v, g, beta, []kernels.GDNSeq{{Rows: T, State: state, StateOut: stateOut, NodeStates: nodeStates, Parents: parents}}, shape)
}

// GDNRecurrenceAt runs a chain's recurrence from state to stateOut over
// the rows read at run time from rowsAt (one I32 on the device,
// 0..maxRows), without outputs, in the slot slotAt names when set: a
// recording of it serves any length and slot.
func (be *Backend) GDNRecurrenceAt(q, k, v, g, beta, state, stateOut, rowsAt, slotAt kernels.Buffer, maxRows int, shape kernels.GDNShape) {
	args := gdnOperands("GDNRecurrenceAt", nil, q, k, v, g, beta, maxRows, shape)
	sl := shape.StateLen()
	st, stBF16 := recurrentState("GDNRecurrenceAt state", state, nil, sl)
	final, _ := recurrentState("GDNRecurrenceAt stateOut", stateOut, st, sl)
	d := gdnSeq{state: st, final: final, rowsAt: i32s("GDNRecurrenceAt rows", rowsAt, 1), rows: maxRows}
	if slotAt != nil {
		if final.n != st.n {
			panic(fmt.Sprintf("cuda: GDNRecurrenceAt with a slot: stateOut holds %d elements, state %d; want the same slots", final.n, st.n))
		}
		d.slotAt, d.outSlotted = i32s("GDNRecurrenceAt slot", slotAt, 1), true
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.gdnRecurrence(args, []gdnSeq{d}, stBF16, shape)
}

// GDNRecurrences runs every sequence's recurrence in one launch per
// maxGDNSeqs sequences.
func (be *Backend) GDNRecurrences(out, q, k, v, g, beta kernels.Buffer, seqs []kernels.GDNSeq, shape kernels.GDNShape) {
	rows := 0
	for _, sq := range seqs {
		rows = max(rows, sq.Start+sq.Rows)
	}
	args := gdnOperands("GDNRecurrence", out, q, k, v, g, beta, rows, shape)
	sl := shape.StateLen()
	descs := make([]gdnSeq, len(seqs))
	var like *buffer
	var stBF16 int32
	for i, sq := range seqs {
		d := &descs[i]
		d.start, d.rows = sq.Start, sq.Rows
		d.state, stBF16 = recurrentState("GDNRecurrence state", sq.State, like, sl)
		like = d.state
		if sq.Parents == nil {
			d.final, _ = recurrentState("GDNRecurrence stateOut", sq.StateOut, like, sl)
		}
		if sq.SlotAt != nil {
			d.slotAt = i32s("GDNRecurrence slot", sq.SlotAt, 1)
			d.outSlotted = d.final != nil && d.final.n == d.state.n
		}
		if sq.NodeStates != nil || sq.Parents != nil {
			d.nodes, _ = recurrentState("GDNRecurrence nodeStates", sq.NodeStates, like, sq.Rows*sl)
		}
		if sq.Parents != nil {
			d.parents = i32s("GDNRecurrence parents", sq.Parents, sq.Rows)
		}
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.gdnRecurrence(args, descs, stBF16, shape)
}

// recurrentState checks an F32 or BF16 recurrent state of at least n
// elements, of like's dtype when like is set, and returns the kernels'
// state_bf16 flag.
func recurrentState(op string, state kernels.Buffer, like *buffer, n int) (*buffer, int32) {
	st, flag := convState(op, state, n)
	if like != nil && st.dt != like.dt {
		panic(fmt.Sprintf("cuda: %s is %v but the state is %v: the states must share one dtype", op, st.dt, like.dt))
	}
	return st, flag
}

// gdnChunk is GDN_CHUNK in gdn.cu; gdnChunkedMaxKeyDim keeps
// gdn_chunk_scan's shared memory within the 48 KiB any GPU gives a block.
const (
	gdnChunk            = 64
	gdnSub              = 16 // GDN_SUB
	gdnPrepThreads      = 256
	gdnChunkedMaxKeyDim = 128
)

// GDNChunked computes a chain without node states in the chunked WY form,
// in chunks of gdnChunk tokens whatever chunk asks for (the result is the
// same to F32 rounding): gdn_chunk_prep does the chunks' solves and
// products in parallel, one block per (chunk, value head), into scratch;
// gdn_chunk_scan then carries the state across the chunks. Key dims above
// gdnChunkedMaxKeyDim run the token recurrence instead.
func (be *Backend) GDNChunked(out, q, k, v, g, beta, state, stateOut kernels.Buffer, T, chunk int, shape kernels.GDNShape) {
	if chunk <= 0 {
		panic(fmt.Sprintf("cuda: GDNChunked chunk %d must be positive", chunk))
	}
	args := gdnOperands("GDNChunked", out, q, k, v, g, beta, T, shape)
	sl := shape.StateLen()
	st, stBF16 := recurrentState("GDNChunked state", state, nil, sl)
	final, _ := recurrentState("GDNChunked stateOut", stateOut, st, sl)
	be.mu.Lock()
	defer be.mu.Unlock()
	if shape.KeyDim > gdnChunkedMaxKeyDim {
		be.gdnRecurrence(args, []gdnSeq{{state: st, final: final, rows: T}}, stBF16, shape)
		return
	}
	o, qv, kv, vv, gv, bv := args[0], args[1], args[2], args[3], args[4], args[5]
	kd, vd, vh := shape.KeyDim, shape.ValueDim, shape.ValueHeads
	// Scratch, in floats: gcs [T·vh], wks [T·vh·kd], us [T·vh·vd], qks [T·vh·gdnChunk].
	lens := []int{T * vh, T * vh * kd, T * vh * vd, T * vh * gdnChunk}
	base, err := be.scratchPtr(4 * (lens[0] + lens[1] + lens[2] + lens[3]))
	if err != nil {
		be.fail(err)
		return
	}
	var scratch [4]devPtr
	for i, off := 0, base; i < len(lens); i++ {
		scratch[i], off = off, off+devPtr(4*lens[i])
	}
	gcs, wks, us, qks := scratch[0], scratch[1], scratch[2], scratch[3]
	dims := []any{i32(T), i32(shape.KeyHeads), i32(vh), i32(kd), i32(vd)}
	be.launch("gdn_chunk_prep", dim3{(T + gdnChunk - 1) / gdnChunk, vh, 1}, d1(gdnPrepThreads), 0,
		append([]any{gcs, wks, us, qks, qv, kv, vv, gv, bv}, dims...)...)
	groups := (kd + 31) / 32
	smem := (2*gdnSub*kd + 2*groups*gdnSub*32 + gdnChunk*32) * 4
	be.launch("gdn_chunk_scan", dim3{vh, (vd + 31) / 32, 1}, dim3{32, groups, 1}, smem,
		append([]any{o, qv, kv, gcs, wks, us, qks, st, final, stBF16}, dims...)...)
}

// gdnSeq is one sequence of a gdn_recurrence launch: its rows of the
// operands, its states (final and nodes nil where the kernel takes none)
// and tree parents.
type gdnSeq struct {
	start, rows                                  int
	state, final, nodes, parents, rowsAt, slotAt *buffer
	outSlotted                                   bool // final is slotAt's slot of the slots' final states
}

const (
	// maxGDNSeqs is MAX_GDN_SEQS in gdn.cu; gdnSeqLen and gdnSeqsLen are
	// the sizes of its GDNSeq and GDNSeqs.
	maxGDNSeqs = 16
	gdnSeqLen  = 64
	gdnSeqsLen = maxGDNSeqs*gdnSeqLen + 8
)

// gdnRecurrence launches gdn.cu's kernel on the operands args (out, q, k,
// v, g, beta), once per maxGDNSeqs sequences: block (value head, 32 value
// columns, sequence), 32 threads per 32 key rows. A chain of no rows still
// copies its state to its final state.
func (be *Backend) gdnRecurrence(args []any, seqs []gdnSeq, stBF16 int32, shape kernels.GDNShape) {
	groups := (shape.KeyDim + 31) / 32
	smem := (4*shape.KeyDim + 32*groups) * 4
	for first := 0; first < len(seqs); first += maxGDNSeqs {
		chunk := seqs[first:min(first+maxGDNSeqs, len(seqs))]
		desc := make([]byte, gdnSeqsLen)
		for i, sq := range chunk {
			d := desc[i*gdnSeqLen:]
			for j, b := range []*buffer{sq.state, sq.final, sq.nodes, sq.parents, sq.rowsAt, sq.slotAt} {
				if b != nil {
					binary.LittleEndian.PutUint64(d[8*j:], uint64(b.addr()))
				}
			}
			slots, outSlotted := 1, 0
			if sq.slotAt != nil {
				slots = sq.state.n / shape.StateLen()
			}
			if sq.outSlotted {
				outSlotted = 1
			}
			for j, v := range []int{sq.start, sq.rows, slots, outSlotted} {
				binary.LittleEndian.PutUint32(d[48+4*j:], uint32(i32(v)))
			}
		}
		binary.LittleEndian.PutUint32(desc[maxGDNSeqs*gdnSeqLen:], uint32(len(chunk)))
		grid := dim3{shape.ValueHeads, (shape.ValueDim + 31) / 32, len(chunk)}
		be.launch("gdn_recurrence", grid, dim3{32, groups, 1}, smem, append(args, desc, stBF16, i32(shape.KeyHeads),
			i32(shape.ValueHeads), i32(shape.KeyDim), i32(shape.ValueDim))...)
	}
}
