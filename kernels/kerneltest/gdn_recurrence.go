package kerneltest

import (
	"fmt"
	"math"

	"ddflash/kernels"
)

// gdnShape has heads that are not powers of two and head sizes that are
// not multiples of 16 (a SIMD backend sees full and partial vectors).
var gdnShape = kernels.GDNShape{KeyHeads: 2, ValueHeads: 6, KeyDim: 12, ValueDim: 20}

// gdnInputs are one GDN call's inputs, shaped as the model produces them.
type gdnInputs struct {
	T                  int
	q, k, v, g, beta   []float32
	state              []float32
	qb, kb, vb, gb, bb kernels.Buffer
}

// newGDNInputs draws L2-normalised q and k (q also scaled by 1/√KeyDim),
// decays mostly mild with some strong ones, and a random initial state.
func (h *harness) newGDNInputs(T int) *gdnInputs {
	s := gdnShape
	in := &gdnInputs{T: T}
	in.q, in.k = h.normal(T*s.KeyHeads*s.KeyDim, 1), h.normal(T*s.KeyHeads*s.KeyDim, 1)
	for r := range T * s.KeyHeads {
		normalise(in.q[r*s.KeyDim:(r+1)*s.KeyDim], 1/math.Sqrt(float64(s.KeyDim)))
		normalise(in.k[r*s.KeyDim:(r+1)*s.KeyDim], 1)
	}
	in.v = h.normal(T*s.ValueHeads*s.ValueDim, 1)
	in.g = h.uniform(T*s.ValueHeads, -1.5, 0)
	for i := range in.g {
		if h.rng.IntN(8) == 0 {
			in.g[i] = -8
		}
	}
	in.beta = h.uniform(T*s.ValueHeads, 0, 1)
	in.state = h.normal(s.StateLen(), 0.5)
	in.qb, in.kb, in.vb, in.gb, in.bb = h.f32(in.q), h.f32(in.k), h.f32(in.v), h.f32(in.g), h.f32(in.beta)
	return in
}

func normalise(x []float32, scale float64) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	f := scale / math.Sqrt(ss)
	for i := range x {
		x[i] = float32(float64(x[i]) * f)
	}
}

// stateIn uploads the initial state as a state of dtype dt; in.state
// becomes the values the device holds (rounded for BF16).
func (h *harness) stateIn(in *gdnInputs, dt kernels.DType) kernels.Buffer {
	b, held := h.stateOf(dt, in.state)
	in.state = held
	return b
}

// refGDN runs the token path of every listed node in float64 from the
// initial state: the output of each path's last token and the state after it.
// For a chain pass the prefix paths 0..t. roundEach rounds the state to
// bfloat16 after every token, as a BF16 state is stored between tokens.
func (in *gdnInputs) refGDN(paths [][]int, roundEach bool) (out, states []float64) {
	s := gdnShape
	group := s.ValueHeads / s.KeyHeads
	out = make([]float64, len(paths)*s.ValueHeads*s.ValueDim)
	states = make([]float64, len(paths)*s.StateLen())
	headLen := s.KeyDim * s.ValueDim
	for n, path := range paths {
		for hd := range s.ValueHeads {
			S := newGDNState(s.KeyDim, s.ValueDim, in.state[hd*headLen:])
			var o []float64
			for _, t := range path {
				qk := (t*s.KeyHeads + hd/group) * s.KeyDim
				vo := (t*s.ValueHeads + hd) * s.ValueDim
				o = S.step(in.q[qk:qk+s.KeyDim], in.k[qk:qk+s.KeyDim], in.v[vo:vo+s.ValueDim], in.g[t*s.ValueHeads+hd], in.beta[t*s.ValueHeads+hd])
				if roundEach {
					S.roundToBF16()
				}
			}
			copy(out[(n*s.ValueHeads+hd)*s.ValueDim:], o)
			copy(states[n*s.StateLen()+hd*headLen:], S.flat())
		}
	}
	return out, states
}

func chainPaths(T int) [][]int {
	paths := make([][]int, T)
	for t := range paths {
		paths[t] = pathTo(nil, t)
	}
	return paths
}

// expectGDN compares a GDN result with its float64 reference. Bound,
// normwise: 2e-5 of the tensor's largest magnitude, a few hundred float32
// roundings over the longest (65-token) run. With a BF16 state, float32
// error can tip a rounding the other way at any token, and a tipped
// element carries its bfloat16 step (2^-7 relative) into the next tokens,
// where another can tip: up to 4 steps per state element (2 were seen in
// random runs, a wrong update is far larger), and 2^-6 of the largest
// output. A tipped element also moves the rest of its row by up to its
// own change at the next token (the delta rule's k·S, with k of unit
// length), which for a small element can be many of its own steps: one
// step of the largest element bounds that (seen: 2^-12.8 of the largest,
// once in about 100 random runs before this term).
func (h *harness) expectGDN(what string, got []float32, want []float64, state kernels.DType, isState bool) {
	h.t.Helper()
	tol := tolerance{2e-5 * maxAbs(want), 0}
	switch {
	case state == kernels.BF16 && isState:
		tol.atol += maxAbs(want) / 256
		tol.rtol = 4.0 / 128
	case state == kernels.BF16:
		tol.atol += maxAbs(want) / 64
	}
	h.expectClose(what, got, want, nil, tol)
}

// stateTypes are the recurrent state's storage dtypes.
var stateTypes = []kernels.DType{kernels.F32, kernels.BF16}

// stepByStep runs the tokens of path one GDNRecurrence call each from the
// initial state (stored as dt): each token's output and the state after it,
// as decoding stores them. Chain and tree calls must match it bit for bit.
func (h *harness) stepByStep(in *gdnInputs, path []int, dt kernels.DType) (outs, states [][]float32) {
	s := gdnShape
	qkDim, vDim, sl := s.KeyHeads*s.KeyDim, s.ValueHeads*s.ValueDim, s.StateLen()
	state, _ := h.stateOf(dt, in.state)
	out := h.alloc(kernels.F32, vDim)
	for _, t := range path {
		row := func(x []float32, width int) kernels.Buffer { return h.f32(x[t*width : (t+1)*width]) }
		h.be.GDNRecurrence(out, row(in.q, qkDim), row(in.k, qkDim), row(in.v, vDim), row(in.g, s.ValueHeads), row(in.beta, s.ValueHeads),
			state, state, nil, nil, 1, s)
		outs = append(outs, h.read(out, vDim))
		states = append(states, h.read(state, sl))
	}
	return outs, states
}

// testGDNChain runs chains with per-token states and a separate stateOut,
// then as a replay (out nil, no nodeStates) with stateOut aliasing state,
// for each state dtype; each equals decoding the tokens one call at a time.
func testGDNChain(h *harness) {
	s := gdnShape
	vDim, sl := s.ValueHeads*s.ValueDim, s.StateLen()
	for _, dt := range stateTypes {
		for _, T := range []int{1, 9} {
			in := h.newGDNInputs(T)
			stateb := h.stateIn(in, dt)
			wantOut, wantStates := in.refGDN(chainPaths(T), dt == kernels.BF16)
			final := wantStates[(T-1)*sl:]

			out := h.alloc(kernels.F32, T*vDim)
			stateOut, nodes := h.alloc(dt, sl), h.alloc(dt, T*sl)
			h.be.GDNRecurrence(out, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, stateOut, nodes, nil, T, s)
			name := fmt.Sprintf("chain %v T=%d", dt, T)
			gotOut, gotNodes, gotFinal := h.read(out, T*vDim), h.read(nodes, T*sl), h.read(stateOut, sl)
			h.expectGDN(name+" out", gotOut, wantOut, dt, false)
			h.expectGDN(name+" nodeStates", gotNodes, wantStates, dt, true)
			h.expectGDN(name+" stateOut", gotFinal, final, dt, true)
			h.expectEqual(name+" state untouched", h.read(stateb, sl), in.state)

			stepOuts, stepStates := h.stepByStep(in, pathTo(nil, T-1), dt)
			for t := range T {
				h.expectEqual(fmt.Sprintf("%s out[%d] = token by token", name, t), gotOut[t*vDim:(t+1)*vDim], stepOuts[t])
				h.expectEqual(fmt.Sprintf("%s nodeStates[%d] = token by token", name, t), gotNodes[t*sl:(t+1)*sl], stepStates[t])
			}
			h.expectEqual(name+" stateOut = token by token", gotFinal, stepStates[T-1])

			h.be.GDNRecurrence(nil, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, stateb, nil, nil, T, s)
			h.expectEqual(name+" replay in place = token by token", h.read(stateb, sl), stepStates[T-1])
		}
	}
}

// testGDNRecurrences checks, for each state dtype, that one call over
// several sequences equals one GDNRecurrence per sequence on the same
// backend (checked against float64 references above), bit for bit: a
// chain with node states and its own stateOut, a tree, a replay (out nil),
// a chain in place, with rows between them that no sequence takes, and
// when batched the first, second and last reading their state from slot 1
// of three (SlotAt: a verify's chain and tree leave the slots as they
// were, the chain in place writes its slot alone); and 18 one-token
// chains, more than one launch takes on CUDA.
func testGDNRecurrences(h *harness) {
	s := gdnShape
	vDim, sl := s.ValueHeads*s.ValueDim, s.StateLen()
	type seq struct {
		start, rows                    int
		tree, nodes, separate, slotted bool
	}
	many := make([]seq, 18)
	for i := range many {
		many[i] = seq{start: i, rows: 1}
	}
	// A slotted sequence's state is slot 1 of three (SlotAt) when batched;
	// the others must stay as they were.
	const slots, slot = 3, 1
	for _, dt := range stateTypes {
		mixed := []seq{{0, 3, false, true, true, true}, {4, 5, true, true, false, true}, {9, 2, false, false, false, false}, {11, 2, false, false, false, true}}
		for ci, seqs := range [][]seq{mixed, many} {
			T := 0
			for _, sq := range seqs {
				T = max(T, sq.start+sq.rows+1)
			}
			in := h.newGDNInputs(T)
			states, trees := make([][]float32, len(seqs)), make([][]int32, len(seqs))
			for i, sq := range seqs {
				states[i] = h.normal(sl, 0.5)
				if sq.tree {
					trees[i] = h.randomTree(sq.rows)
				}
			}
			for _, withOut := range []bool{true, false} {
				run := func(batched bool) (out []float32, results [][]float32) {
					var ob kernels.Buffer
					if withOut {
						ob = h.alloc(kernels.F32, T*vDim)
					}
					descs := make([]kernels.GDNSeq, len(seqs))
					others := make([][]float32, len(seqs)) // a slotted sequence's states, as they were
					for i, sq := range seqs {
						d := &descs[i]
						d.Start, d.Rows = sq.start, sq.rows
						d.State, _ = h.stateOf(dt, states[i])
						if sq.slotted && batched {
							all := h.normal(slots*sl, 0.5)
							copy(all[slot*sl:], states[i])
							d.State, others[i] = h.stateOf(dt, all)
							d.SlotAt = h.i32([]int32{slot})
						}
						d.StateOut = d.State
						if sq.separate {
							d.StateOut = h.alloc(dt, sl)
						}
						if sq.nodes || sq.tree {
							d.NodeStates = h.alloc(dt, sq.rows*sl)
						}
						if sq.tree {
							d.Parents, d.StateOut = h.i32(trees[i]), nil
						}
					}
					if batched {
						h.be.GDNRecurrences(ob, in.qb, in.kb, in.vb, in.gb, in.bb, descs, s)
					} else {
						for _, d := range descs {
							rows := func(b kernels.Buffer, width int) kernels.Buffer {
								if b == nil {
									return nil
								}
								return h.be.Slice(b, d.Start*width, d.Rows*width)
							}
							h.be.GDNRecurrence(rows(ob, vDim), rows(in.qb, s.KeyHeads*s.KeyDim), rows(in.kb, s.KeyHeads*s.KeyDim), rows(in.vb, vDim),
								rows(in.gb, s.ValueHeads), rows(in.bb, s.ValueHeads), d.State, d.StateOut, d.NodeStates, d.Parents, d.Rows, s)
						}
					}
					if withOut {
						out = h.read(ob, T*vDim)
					}
					for i, d := range descs {
						inPlace := !seqs[i].separate && !seqs[i].tree
						if d.SlotAt != nil && !inPlace {
							// A verify: the slots stay as they were, its own included.
							h.expectEqual("GDNRecurrences slots read by a verify", h.read(d.State, slots*sl), others[i])
						}
						for k, b := range []kernels.Buffer{d.StateOut, d.NodeStates} {
							if b == nil {
								continue
							}
							got := h.read(b, b.Len())
							if d.SlotAt != nil && inPlace && k == 0 {
								h.expectEqual("GDNRecurrences slots before the slotted one", got[:slot*sl], others[i][:slot*sl])
								h.expectEqual("GDNRecurrences slots after the slotted one", got[(slot+1)*sl:], others[i][(slot+1)*sl:])
								got = got[slot*sl : (slot+1)*sl]
							}
							results = append(results, got)
						}
					}
					return out, results
				}
				gotOut, gotStates := run(true)
				wantOut, wantStates := run(false)
				name := fmt.Sprintf("GDNRecurrences %v case %d out=%v", dt, ci, withOut)
				h.expectEqual(name+" out", gotOut, wantOut)
				for i := range wantStates {
					h.expectEqual(fmt.Sprintf("%s state %d", name, i), gotStates[i], wantStates[i])
				}
			}
		}
	}
}

// testGDNTree checks, for each state dtype, that every node of a random
// tree equals running its root-to-node path sequentially (the float64
// reference, and one call per token bit for bit), and that the committed
// state is only read.
func testGDNTree(h *harness) {
	s := gdnShape
	const T = 11
	vDim, sl := s.ValueHeads*s.ValueDim, s.StateLen()
	for _, dt := range stateTypes {
		in := h.newGDNInputs(T)
		stateb := h.stateIn(in, dt)
		parents := h.randomTree(T)
		paths := make([][]int, T)
		for t := range paths {
			paths[t] = pathTo(parents, t)
		}
		wantOut, wantStates := in.refGDN(paths, dt == kernels.BF16)
		out, nodes := h.alloc(kernels.F32, T*vDim), h.alloc(dt, T*sl)
		h.be.GDNRecurrence(out, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, nil, nodes, h.i32(parents), T, s)
		name := fmt.Sprintf("tree %v", dt)
		gotOut, gotNodes := h.read(out, T*vDim), h.read(nodes, T*sl)
		h.expectGDN(name+" out", gotOut, wantOut, dt, false)
		h.expectGDN(name+" nodeStates", gotNodes, wantStates, dt, true)
		h.expectEqual(name+" state untouched", h.read(stateb, sl), in.state)
		for t, path := range paths {
			stepOuts, stepStates := h.stepByStep(in, path, dt)
			h.expectEqual(fmt.Sprintf("%s out[%d] = its path token by token", name, t), gotOut[t*vDim:(t+1)*vDim], stepOuts[len(path)-1])
			h.expectEqual(fmt.Sprintf("%s nodeStates[%d] = its path token by token", name, t), gotNodes[t*sl:(t+1)*sl], stepStates[len(path)-1])
		}
	}
}

// testGDNChunked compares the chunked form with the float64 token loop for
// T below, equal to, and not a multiple of the chunk, once with stateOut
// aliasing state, for each state dtype (BF16: widened on load, rounded
// once on store).
func testGDNChunked(h *harness) {
	s := gdnShape
	vDim, sl := s.ValueHeads*s.ValueDim, s.StateLen()
	for _, dt := range stateTypes {
		for _, c := range []struct {
			T, chunk int
			inPlace  bool
		}{{1, 64, false}, {5, 4, false}, {16, 16, true}, {37, 8, false}, {65, 64, true}} {
			in := h.newGDNInputs(c.T)
			stateb := h.stateIn(in, dt)
			wantOut, wantStates := in.refGDN(chainPaths(c.T), false)
			out := h.alloc(kernels.F32, c.T*vDim)
			stateOut := stateb
			if !c.inPlace {
				stateOut = h.alloc(dt, sl)
			}
			h.be.GDNChunked(out, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, stateOut, c.T, c.chunk, s)
			name := fmt.Sprintf("chunked %v T=%d chunk=%d inPlace=%v", dt, c.T, c.chunk, c.inPlace)
			h.expectGDN(name+" out", h.read(out, c.T*vDim), wantOut, kernels.F32, false)
			h.expectGDN(name+" state", h.read(stateOut, sl), wantStates[(c.T-1)*sl:], dt, true)
			if !c.inPlace {
				h.expectEqual(name+" state untouched", h.read(stateb, sl), in.state)
			}
		}
	}
}
