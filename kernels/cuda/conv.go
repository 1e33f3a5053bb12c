//go:build cgo

package cuda

import (
	"encoding/binary"
	"fmt"

	"ddflash/kernels"
)

// maxConvK is MAX_CONV_K in conv.cu.
const maxConvK = 16

func checkConvK(op string, K int) {
	if K < 1 || K > maxConvK {
		panic(fmt.Sprintf("cuda: %s kernel size %d: the kernels support 1..%d", op, K, maxConvK))
	}
}

// CausalConv runs the depthwise causal conv + SiLU over rows whose history
// is their ancestor chain. A parent that is not an earlier row traps.
func (be *Backend) CausalConv(out, x, state, w, parents kernels.Buffer, T, channels, K int) {
	checkConvK("CausalConv", K)
	o, xv := f32s("CausalConv out", out, T*channels), f32s("CausalConv x", x, T*channels)
	st, stBF16 := convState("CausalConv state", state, (K-1)*channels)
	wv, variant := weights("CausalConv w", w, channels*K)
	par := optI32s("CausalConv parents", parents, T)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("causal_conv"+variant, be.gridFor(T*channels, 256), d1(256), 0,
		o, xv, st, stBF16, wv, par, i32(T), i32(channels), i32(K))
}

// ConvCommit sets state to the last K-1 inputs of the chain ending at node.
func (be *Backend) ConvCommit(state, x, parents kernels.Buffer, node, channels, K int) {
	checkConvK("ConvCommit", K)
	st, stBF16 := convState("ConvCommit state", state, (K-1)*channels)
	if node < 0 {
		return // nothing accepted: the state stays
	}
	xv := f32s("ConvCommit x", x, (node+1)*channels)
	par := optI32s("ConvCommit parents", parents, node+1)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("conv_commit", be.gridFor(channels, 256), d1(256), 0, st, stBF16, xv, par, nil, nil, i32(node), i32(1), i32(channels), i32(K))
}

// ConvCommitAt is ConvCommit of the node read at run time from nodeAt (one
// I32 on the device, 0..maxNode), in the slot slotAt names when set
// (slot_state): a recording of it serves any node and slot.
func (be *Backend) ConvCommitAt(state, x, parents, nodeAt, slotAt kernels.Buffer, maxNode, channels, K int) {
	checkConvK("ConvCommitAt", K)
	st, stBF16 := convState("ConvCommitAt state", state, (K-1)*channels)
	xv := f32s("ConvCommitAt x", x, (maxNode+1)*channels)
	par := optI32s("ConvCommitAt parents", parents, maxNode+1)
	at := i32s("ConvCommitAt node", nodeAt, 1)
	var slot any
	slots := 1
	if slotAt != nil {
		slot, slots = i32s("ConvCommitAt slot", slotAt, 1), st.n/((K-1)*channels)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("conv_commit", be.gridFor(channels, 256), d1(256), 0, st, stBF16, xv, par, at, slot, i32(0), i32(slots), i32(channels), i32(K))
}

const (
	// maxConvSeqs is MAX_CONV_SEQS in conv.cu; convSeqLen and convSeqsLen
	// are the sizes of its ConvSeq and ConvSeqs.
	maxConvSeqs = 32
	convSeqLen  = 48
	convSeqsLen = maxConvSeqs*convSeqLen + 8
)

// GDNConvInputs runs the conv, its commits, the gates and the split with
// L2 norms in one launch per maxConvSeqs sequences (gdn_conv_inputs).
func (be *Backend) GDNConvInputs(q, k, v, a, b, x, convW, aLog, dtBias kernels.Buffer, seqs []kernels.GDNConvSeq, K int, s kernels.GDNShape, eps, qScale float32) {
	checkConvK("GDNConvInputs", K)
	qk, vd, hv := s.KeyHeads*s.KeyDim, s.ValueHeads*s.ValueDim, s.ValueHeads
	width, T := 2*qk+vd, 0
	for _, sq := range seqs {
		T += sq.Rows
	}
	qv, kv, vv := f32s("GDNConvInputs q", q, T*qk), f32s("GDNConvInputs k", k, T*qk), f32s("GDNConvInputs v", v, T*vd)
	av, bv := f32s("GDNConvInputs a", a, T*hv), f32s("GDNConvInputs b", b, T*hv)
	xv := f32s("GDNConvInputs x", x, T*width)
	wv, variant := weights("GDNConvInputs convW", convW, width*K)
	al, alVariant := weights("GDNConvInputs aLog", aLog, hv)
	db, dbVariant := weights("GDNConvInputs dtBias", dtBias, hv)
	if alVariant != variant || dbVariant != variant {
		panic(fmt.Sprintf("cuda: GDNConvInputs convW is %v, aLog %v and dtBias %v: the kernel needs one dtype", wv.dt, al.dt, db.dt))
	}
	for r0, first := 0, 0; first < len(seqs); first += maxConvSeqs {
		chunk := seqs[first:min(first+maxConvSeqs, len(seqs))]
		desc := make([]byte, convSeqsLen)
		for i, sq := range chunk {
			st, stBF16 := convState("GDNConvInputs state", sq.State, (K-1)*width)
			d := desc[i*convSeqLen:]
			binary.LittleEndian.PutUint64(d, uint64(st.addr()))
			if sq.Parents != nil {
				binary.LittleEndian.PutUint64(d[8:], uint64(i32s("GDNConvInputs parents", sq.Parents, sq.Rows).addr()))
			}
			slots := slotStates("GDNConvInputs", sq.SlotAt, st, (K-1)*width, d[16:])
			commit := 0
			if sq.Commit && sq.Rows > 0 {
				commit = 1
			}
			for j, v := range []int{r0, sq.Rows, commit, int(stBF16), slots} {
				binary.LittleEndian.PutUint32(d[24+4*j:], uint32(i32(v)))
			}
			r0 += sq.Rows
		}
		binary.LittleEndian.PutUint32(desc[maxConvSeqs*convSeqLen:], uint32(len(chunk)))
		func() {
			be.mu.Lock()
			defer be.mu.Unlock()
			// l2norm's block size, so that each head's sum of squares adds in its order.
			be.launch("gdn_conv_inputs"+variant, dim3{2*s.KeyHeads + hv, len(chunk), 1}, rowThreads(s.KeyDim, 256), 0,
				qv, kv, vv, av, bv, xv, wv, al, db, desc, i32(s.KeyHeads), i32(s.KeyDim), i32(hv), i32(s.ValueDim), i32(K), eps, qScale)
		}()
	}
}

// slotStates puts slotAt's device address (one I32) into dst and returns
// how many states of n elements st holds: with SlotAt a sequence's state is
// the one of them slotAt names when the kernel runs (slot_state). Without
// slotAt it writes nothing and returns 1.
func slotStates(op string, slotAt kernels.Buffer, st *buffer, n int, dst []byte) int {
	if slotAt == nil {
		return 1
	}
	binary.LittleEndian.PutUint64(dst, uint64(i32s(op+" slot", slotAt, 1).addr()))
	return st.n / n
}

// convState checks an F32 or BF16 conv state of at least n elements and
// returns the kernels' state_bf16 flag.
func convState(op string, state kernels.Buffer, n int) (*buffer, int32) {
	st, variant := weights(op, state, n)
	switch variant {
	case "_f32":
		return st, 0
	case "_bf16":
		return st, 1
	}
	panic(fmt.Sprintf("cuda: %s needs an F32 or BF16 state, got %v", op, st.dt))
}
