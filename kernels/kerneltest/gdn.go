package kerneltest

import (
	"fmt"
	"math"

	"ddflash/kernels"
)

// convInputs returns the K inputs (oldest first) of node t's window for
// channel c: the committed state rows followed by the node's root-to-node path.
func convInputs(state, x []float32, path []int, channels, K, c int) []float64 {
	var seq []float64
	for r := range K - 1 {
		seq = append(seq, float64(state[r*channels+c]))
	}
	for _, p := range path {
		seq = append(seq, float64(x[p*channels+c]))
	}
	return seq[len(seq)-K:]
}

// pathTo lists node's root-to-node path; parents nil means a chain.
func pathTo(parents []int32, node int) []int {
	var rev []int
	for t := node; t >= 0; {
		rev = append(rev, t)
		if parents == nil {
			t--
		} else {
			t = int(parents[t])
		}
	}
	path := make([]int, len(rev))
	for i, t := range rev {
		path[len(rev)-1-i] = t
	}
	return path
}

// refConv computes the conv+SiLU output of every row, and the scale Σ|w·x|.
// A row's history inputs (all but its own) are as a state of stateType
// holds them: a BF16 state's rows are rounded to nearest even, so a row
// sees the same inputs in a block as decoded after its history was committed.
func refConv(state, x []float32, w []float64, parents []int32, T, channels, K int, stateType kernels.DType) (out, scale []float64) {
	out, scale = make([]float64, T*channels), make([]float64, T*channels)
	history := x
	if stateType == kernels.BF16 {
		history = make([]float32, len(x))
		for i, v := range x {
			_, rounded := roundBF16(v)
			history[i] = float32(rounded)
		}
	}
	for t := range T {
		path := pathTo(parents, t)
		for c := range channels {
			var sum float64
			inputs := convInputs(state, history, path, channels, K, c)
			inputs[K-1] = float64(x[t*channels+c])
			for j, in := range inputs {
				sum += w[c*K+j] * in
				scale[t*channels+c] += math.Abs(w[c*K+j] * in)
			}
			out[t*channels+c] = silu64(sum)
		}
	}
	return out, scale
}

// testCausalConv runs the conv as a chain, as a tree whose parents form the
// same chain (which must give identical results), and as a random tree, with
// F32 and BF16 kernels and F32 and BF16 states. Bound: (K+8)·u·Σ|w·x|.
func testCausalConv(h *harness) {
	const channels = 37
	for _, K := range []int{4, 2} {
		for i, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			stateType := []kernels.DType{kernels.BF16, kernels.F32}[i] // both pairings with the weights
			for _, T := range []int{1, 7} {
				x := h.normal(T*channels, 1)
				sb, state := h.stateOf(stateType, h.normal((K-1)*channels, 1))
				w, wv := h.weights(dt, h.normal(channels*K, 0.5))
				xb := h.f32(x)
				run := func(parents []int32) []float32 {
					out := h.alloc(kernels.F32, T*channels)
					var pb kernels.Buffer
					if parents != nil {
						pb = h.i32(parents)
					}
					h.be.CausalConv(out, xb, sb, w, pb, T, channels, K)
					return h.read(out, T*channels)
				}
				tol := tolerance{1e-30, float64(K+8) * f32Unit}
				name := fmt.Sprintf("CausalConv K=%d w %v state %v T=%d", K, dt, stateType, T)
				chain := run(nil)
				want, scale := refConv(state, x, wv, nil, T, channels, K, stateType)
				h.expectClose(name+" chain", chain, want, scale, tol)

				chainParents := make([]int32, T)
				for t := range chainParents {
					chainParents[t] = int32(t - 1)
				}
				h.expectEqual(name+" tree shaped as the chain", run(chainParents), chain)

				tree := h.randomTree(T)
				want, scale = refConv(state, x, wv, tree, T, channels, K, stateType)
				h.expectClose(name+" random tree", run(tree), want, scale, tol)
				h.expectEqual(name+" state untouched", h.read(sb, len(state)), state)

				// Each row alone, after committing its history, equals its row of the block.
				for t := range T {
					committed, _ := h.stateOf(stateType, state)
					h.be.ConvCommit(committed, xb, nil, t-1, channels, K)
					one := h.alloc(kernels.F32, channels)
					h.be.CausalConv(one, h.be.Slice(xb, t*channels, channels), committed, w, nil, 1, channels, K)
					h.expectEqual(fmt.Sprintf("%s row %d alone after ConvCommit", name, t), h.read(one, channels), chain[t*channels:(t+1)*channels])
				}
			}
		}
	}
}

// testConvCommit commits every node of a chain (shorter and longer than
// K-1) and of a random tree: the new state is the last K-1 inputs of the
// node's path after the old state; pure copies, so exact for an F32 state
// and rounded to nearest even for a BF16 one.
func testConvCommit(h *harness) {
	for _, stateType := range []kernels.DType{kernels.F32, kernels.BF16} {
		for _, tree := range []bool{false, true} {
			testConvCommitOf(h, stateType, tree)
		}
	}
}

func testConvCommitOf(h *harness, stateType kernels.DType, tree bool) {
	const channels, K = 6, 4
	const T = 7
	x := h.normal(T*channels, 1)
	_, state := h.stateOf(stateType, h.normal((K-1)*channels, 1))
	var parents []int32
	var pb kernels.Buffer
	if tree {
		parents = h.randomTree(T)
		pb = h.i32(parents)
	}
	xb := h.f32(x)
	for node := range T {
		sb, _ := h.stateOf(stateType, state)
		h.be.ConvCommit(sb, xb, pb, node, channels, K)
		want := make([]float32, (K-1)*channels)
		path := pathTo(parents, node)
		for c := range channels {
			// The window of a virtual next row minus that row: the last K-1 inputs.
			inputs := convInputs(state, x, path, channels, K, c)[1:]
			for r, v := range inputs {
				want[r*channels+c] = float32(v)
				if stateType == kernels.BF16 {
					_, rounded := roundBF16(float32(v))
					want[r*channels+c] = float32(rounded)
				}
			}
		}
		h.expectEqual(fmt.Sprintf("ConvCommit %v state tree=%v node %d", stateType, tree, node), h.read(sb, len(want)), want)
	}
}

// testGDNGates includes a+dtBias beyond softplus's threshold of 20 (where
// exp overflows in float32) and far below zero. Bound: 8u relative for beta;
// for g, 8u·(1+|a+dtBias|), since softplus(x) for x ≪ 0 magnifies the
// rounding of the float32 sum a+dtBias by |x|.
func testGDNGates(h *harness) {
	const T, heads = 3, 5
	a, b := h.normal(T*heads, 3), h.normal(T*heads, 3)
	a[0], a[1], a[2], a[3] = 19.5, 25, 150, -90
	aLog, dtBias := h.normal(heads, 1), h.normal(heads, 0.5)
	ab, bb := h.f32(a), h.f32(b)
	h.be.GDNGates(ab, bb, h.f32(aLog), h.f32(dtBias), T, heads)
	wantG, wantB, scaleG := make([]float64, T*heads), make([]float64, T*heads), make([]float64, T*heads)
	for i := range wantG {
		hd := i % heads
		x := float64(a[i]) + float64(dtBias[hd])
		wantG[i] = -math.Exp(float64(aLog[hd])) * softplus64(x)
		scaleG[i] = math.Abs(wantG[i]) * (1 + math.Abs(x))
		wantB[i] = sigmoid64(float64(b[i]))
	}
	tol := tolerance{1e-30, 8 * f32Unit}
	h.expectClose("GDNGates g", h.read(ab, T*heads), wantG, scaleG, tol)
	h.expectClose("GDNGates beta", h.read(bb, T*heads), wantB, nil, tol)
}

// testGDNConvInputs checks the fused GDN input preparation against
// CausalConv, ConvCommit, GDNGates, Copy and L2Norm on the same backend
// (each checked against float64 references): q, k, v, the gates and the
// conv states equal, bit for bit. Sequences: a committed chain with an F32
// state, a tree and a one-row committed chain with BF16 states, a chain
// whose BF16 state is slot 1 of three (SlotAt: the others stay as they
// were); and 34 one-row sequences, more than one launch takes on CUDA.
func testGDNConvInputs(h *harness) {
	const K, eps, qScale = 4, 1e-6, 0.125
	s := kernels.GDNShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 20, ValueDim: 9}
	qk, vd, hv := s.KeyHeads*s.KeyDim, s.ValueHeads*s.ValueDim, s.ValueHeads
	width := 2*qk + vd
	type seq struct {
		rows    int
		state   kernels.DType
		tree    bool
		commit  bool
		slotted bool
	}
	many := make([]seq, 34)
	for i := range many {
		many[i] = seq{1, kernels.F32, false, true, false}
	}
	const slots, slot = 3, 1
	n := (K - 1) * width
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		mixed := []seq{{5, kernels.F32, false, true, false}, {6, kernels.BF16, true, false, false}, {1, kernels.BF16, false, true, false}, {3, kernels.BF16, false, true, true}}
		for ci, seqs := range [][]seq{mixed, many} {
			T := 0
			for _, sq := range seqs {
				T += sq.rows
			}
			x, a, b := h.f32(h.normal(T*width, 1)), h.normal(T*hv, 3), h.normal(T*hv, 3)
			convW, _ := h.weights(dt, h.normal(width*K, 0.5))
			aLog, _ := h.weights(dt, h.normal(hv, 1))
			dtBias, _ := h.weights(dt, h.normal(hv, 0.5))
			fused, unfused := make([]kernels.GDNConvSeq, len(seqs)), make([]kernels.GDNConvSeq, len(seqs))
			var others []float32 // the slotted sequence's states, as they were
			for i, sq := range seqs {
				state := h.normal(n, 1)
				fused[i] = kernels.GDNConvSeq{Rows: sq.rows, Commit: sq.commit}
				if sq.tree {
					fused[i].Parents = h.i32(h.randomTree(sq.rows))
				}
				unfused[i] = fused[i]
				fused[i].State, _ = h.stateOf(sq.state, state)
				unfused[i].State, _ = h.stateOf(sq.state, state)
				if sq.slotted {
					all := h.normal(slots*n, 1)
					copy(all[slot*n:], state)
					fused[i].State, others = h.stateOf(sq.state, all)
					fused[i].SlotAt = h.i32([]int32{slot})
				}
			}
			name := fmt.Sprintf("GDNConvInputs w %v case %d", dt, ci)
			q, k, v := h.alloc(kernels.F32, T*qk), h.alloc(kernels.F32, T*qk), h.alloc(kernels.F32, T*vd)
			ab, bb := h.f32(a), h.f32(b)
			h.be.GDNConvInputs(q, k, v, ab, bb, x, convW, aLog, dtBias, fused, K, s, eps, qScale)

			conv := h.alloc(kernels.F32, T*width)
			r0 := 0
			for _, sq := range unfused {
				xs := h.be.Slice(x, r0*width, sq.Rows*width)
				h.be.CausalConv(h.be.Slice(conv, r0*width, sq.Rows*width), xs, sq.State, convW, sq.Parents, sq.Rows, width, K)
				if sq.Commit {
					h.be.ConvCommit(sq.State, xs, sq.Parents, sq.Rows-1, width, K)
				}
				r0 += sq.Rows
			}
			wa, wb := h.f32(a), h.f32(b)
			h.be.GDNGates(wa, wb, aLog, dtBias, T, hv)
			wq, wk, wv := h.alloc(kernels.F32, T*qk), h.alloc(kernels.F32, T*qk), h.alloc(kernels.F32, T*vd)
			h.be.Copy(wq, conv, T, qk, qk, width)
			h.be.Copy(wk, h.be.Slice(conv, qk, T*width-qk), T, qk, qk, width)
			h.be.Copy(wv, h.be.Slice(conv, 2*qk, T*width-2*qk), T, vd, vd, width)
			h.be.L2Norm(wq, T*s.KeyHeads, s.KeyDim, eps, qScale)
			h.be.L2Norm(wk, T*s.KeyHeads, s.KeyDim, eps, 1)
			h.expectEqual(name+" q", h.read(q, T*qk), h.read(wq, T*qk))
			h.expectEqual(name+" k", h.read(k, T*qk), h.read(wk, T*qk))
			h.expectEqual(name+" v", h.read(v, T*vd), h.read(wv, T*vd))
			h.expectEqual(name+" g", h.read(ab, T*hv), h.read(wa, T*hv))
			h.expectEqual(name+" beta", h.read(bb, T*hv), h.read(wb, T*hv))
			for i := range fused {
				got := h.read(fused[i].State, fused[i].State.Len())
				if fused[i].SlotAt != nil {
					h.expectEqual(fmt.Sprintf("%s slots before %d", name, slot), got[:slot*n], others[:slot*n])
					h.expectEqual(fmt.Sprintf("%s slots after %d", name, slot), got[(slot+1)*n:], others[(slot+1)*n:])
					got = got[slot*n:]
				}
				h.expectEqual(fmt.Sprintf("%s state %d", name, i), got[:n], h.read(unfused[i].State, n))
			}
		}
	}
}

// stateOf uploads values as a state of dtype dt (BF16: rounded to nearest
// even) and returns the buffer and the values it holds.
func (h *harness) stateOf(dt kernels.DType, values []float32) (kernels.Buffer, []float32) {
	h.t.Helper()
	b, exact := h.weights(dt, values)
	held := make([]float32, len(exact))
	for i, v := range exact {
		held[i] = float32(v)
	}
	return b, held
}
