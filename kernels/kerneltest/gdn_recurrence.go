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

// refGDN runs the token path of every listed node in float64 from the
// initial state: the output of each path's last token and the state after it.
// For a chain pass the prefix paths 0..t.
func (in *gdnInputs) refGDN(paths [][]int) (out, states []float64) {
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
// roundings over the longest (65-token) run.
func (h *harness) expectGDN(what string, got []float32, want []float64) {
	h.t.Helper()
	h.expectClose(what, got, want, nil, tolerance{2e-5 * maxAbs(want), 0})
}

// testGDNChain runs chains with per-token states and a separate stateOut,
// then as a replay (out nil, no nodeStates) with stateOut aliasing state.
func testGDNChain(h *harness) {
	s := gdnShape
	vDim, sl := s.ValueHeads*s.ValueDim, s.StateLen()
	for _, T := range []int{1, 9} {
		in := h.newGDNInputs(T)
		wantOut, wantStates := in.refGDN(chainPaths(T))
		final := wantStates[(T-1)*sl:]

		out, stateb := h.alloc(kernels.F32, T*vDim), h.f32(in.state)
		stateOut, nodes := h.alloc(kernels.F32, sl), h.alloc(kernels.F32, T*sl)
		h.be.GDNRecurrence(out, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, stateOut, nodes, nil, T, s)
		h.expectGDN(fmt.Sprintf("chain T=%d out", T), h.read(out, T*vDim), wantOut)
		h.expectGDN(fmt.Sprintf("chain T=%d nodeStates", T), h.read(nodes, T*sl), wantStates)
		h.expectGDN(fmt.Sprintf("chain T=%d stateOut", T), h.read(stateOut, sl), final)
		h.expectEqual(fmt.Sprintf("chain T=%d state untouched", T), h.read(stateb, sl), in.state)

		h.be.GDNRecurrence(nil, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, stateb, nil, nil, T, s)
		h.expectGDN(fmt.Sprintf("replay T=%d state in place", T), h.read(stateb, sl), final)
	}
}

// testGDNTree checks that every node of a random tree equals running its
// root-to-node path sequentially, and that the committed state is only read.
func testGDNTree(h *harness) {
	s := gdnShape
	const T = 11
	vDim, sl := s.ValueHeads*s.ValueDim, s.StateLen()
	in := h.newGDNInputs(T)
	parents := h.randomTree(T)
	paths := make([][]int, T)
	for t := range paths {
		paths[t] = pathTo(parents, t)
	}
	wantOut, wantStates := in.refGDN(paths)
	out, stateb, nodes := h.alloc(kernels.F32, T*vDim), h.f32(in.state), h.alloc(kernels.F32, T*sl)
	h.be.GDNRecurrence(out, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, nil, nodes, h.i32(parents), T, s)
	h.expectGDN("tree out", h.read(out, T*vDim), wantOut)
	h.expectGDN("tree nodeStates", h.read(nodes, T*sl), wantStates)
	h.expectEqual("tree state untouched", h.read(stateb, sl), in.state)
}

// testGDNChunked compares the chunked form with the float64 token loop for
// T below, equal to, and not a multiple of the chunk, once with stateOut
// aliasing state.
func testGDNChunked(h *harness) {
	s := gdnShape
	vDim, sl := s.ValueHeads*s.ValueDim, s.StateLen()
	for _, c := range []struct {
		T, chunk int
		inPlace  bool
	}{{1, 64, false}, {5, 4, false}, {16, 16, true}, {37, 8, false}, {65, 64, true}} {
		in := h.newGDNInputs(c.T)
		wantOut, wantStates := in.refGDN(chainPaths(c.T))
		out, stateb := h.alloc(kernels.F32, c.T*vDim), h.f32(in.state)
		stateOut := stateb
		if !c.inPlace {
			stateOut = h.alloc(kernels.F32, sl)
		}
		h.be.GDNChunked(out, in.qb, in.kb, in.vb, in.gb, in.bb, stateb, stateOut, c.T, c.chunk, s)
		name := fmt.Sprintf("chunked T=%d chunk=%d inPlace=%v", c.T, c.chunk, c.inPlace)
		h.expectGDN(name+" out", h.read(out, c.T*vDim), wantOut)
		h.expectGDN(name+" state", h.read(stateOut, sl), wantStates[(c.T-1)*sl:])
		if !c.inPlace {
			h.expectEqual(name+" state untouched", h.read(stateb, sl), in.state)
		}
	}
}
