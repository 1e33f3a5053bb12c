package cpu

import (
	"fmt"
	"math"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// softplus matches torch's (beta 1, threshold 20): linear above 20.
func softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// GDNGates turns a into g = -exp(aLog)·softplus(a+dtBias) and b into sigmoid(b).
func (be *Backend) GDNGates(a, b, aLog, dtBias kernels.Buffer, T, heads int) {
	av, bv := f32s("GDNGates a", a, T*heads), f32s("GDNGates b", b, T*heads)
	al, db := widened("GDNGates aLog", aLog, heads), widened("GDNGates dtBias", dtBias, heads)
	for i := range av {
		h := i % heads
		av[i] = float32(-math.Exp(float64(al[h])) * softplus(float64(av[i]+db[h])))
		bv[i] = sigmoid(bv[i])
	}
}

// gdnArgs are the per-token inputs of a GDN op, as slices.
type gdnArgs struct {
	shape       kernels.GDNShape
	q, k, v     []float32
	g, beta     []float32
	out         []float32 // nil when only the state is wanted
	qkDim, vDim int       // row strides of q/k and of v/out
}

func gdnInputs(op string, out, q, k, v, g, beta kernels.Buffer, T int, shape kernels.GDNShape) gdnArgs {
	if shape.KeyHeads <= 0 || shape.ValueHeads%shape.KeyHeads != 0 {
		panic(fmt.Sprintf("cpu: %s shape %+v: ValueHeads must be a positive multiple of KeyHeads", op, shape))
	}
	a := gdnArgs{shape: shape, qkDim: shape.KeyHeads * shape.KeyDim, vDim: shape.ValueHeads * shape.ValueDim}
	a.q = f32s(op+" q", q, T*a.qkDim)
	a.k = f32s(op+" k", k, T*a.qkDim)
	a.v = f32s(op+" v", v, T*a.vDim)
	a.g = f32s(op+" g", g, T*shape.ValueHeads)
	a.beta = f32s(op+" beta", beta, T*shape.ValueHeads)
	if out != nil {
		a.out = f32s(op+" out", out, T*a.vDim)
	}
	return a
}

// token returns token t's vectors for value head h.
func (a *gdnArgs) token(t, h int) (q, k, v []float32, g, beta float32) {
	kh := h / (a.shape.ValueHeads / a.shape.KeyHeads)
	kd, vd := a.shape.KeyDim, a.shape.ValueDim
	qk := t*a.qkDim + kh*kd
	vo := t*a.vDim + h*vd
	return a.q[qk : qk+kd], a.k[qk : qk+kd], a.v[vo : vo+vd], a.g[t*a.shape.ValueHeads+h], a.beta[t*a.shape.ValueHeads+h]
}

// tail returns the keys and values of value head h from token t to the end
// (token t+j's rows at offsets j·qkDim and j·vDim), for accumRows.
func (a *gdnArgs) tail(t, h int) (k, v []float32) {
	kh := h / (a.shape.ValueHeads / a.shape.KeyHeads)
	return a.k[t*a.qkDim+kh*a.shape.KeyDim:], a.v[t*a.vDim+h*a.shape.ValueDim:]
}

// outRow returns token t's output for value head h, or nil.
func (a *gdnArgs) outRow(t, h int) []float32 {
	if a.out == nil {
		return nil
	}
	vo := t*a.vDim + h*a.shape.ValueDim
	return a.out[vo : vo+a.shape.ValueDim]
}

// deltaStepPortable applies one token to the state S [kd, vd] of one head
// in place: S = exp(g)·S; S += k ⊗ beta·(v − Sᵀk); out = Sᵀq (out may be
// nil). delta is vd elements of scratch.
func deltaStepPortable(S, q, k, v []float32, g, beta float32, out, delta []float32) {
	vd := len(v)
	decay := float32(math.Exp(float64(g)))
	// delta = beta·(v − decay·S_oldᵀk)
	clear(delta)
	for i, ki := range k {
		axpy(delta, S[i*vd:(i+1)*vd], ki)
	}
	for j := range delta {
		delta[j] = beta * (v[j] - decay*delta[j])
	}
	if out != nil {
		clear(out)
	}
	for i, ki := range k {
		row := S[i*vd : (i+1)*vd]
		for j := range row {
			row[j] = decay*row[j] + ki*delta[j]
		}
		if out != nil {
			axpy(out, row, q[i])
		}
	}
}

// axpy adds a·x to y.
func axpy(y, x []float32, a float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// GDNRecurrences runs GDNRecurrence per sequence.
func (be *Backend) GDNRecurrences(out, q, k, v, g, beta kernels.Buffer, seqs []kernels.GDNSeq, s kernels.GDNShape) {
	qk, vd := s.KeyHeads*s.KeyDim, s.ValueHeads*s.ValueDim
	for _, sq := range seqs {
		rows := func(b kernels.Buffer, width int) kernels.Buffer {
			if b == nil {
				return nil
			}
			return be.Slice(b, sq.Start*width, sq.Rows*width)
		}
		state, stateOut := sq.State, sq.StateOut
		if sq.SlotAt != nil {
			if stateOut != nil && stateOut.Len() == state.Len() {
				stateOut = be.slotState("GDNRecurrence stateOut", stateOut, sq.SlotAt, s.StateLen())
			}
			state = be.slotState("GDNRecurrence state", state, sq.SlotAt, s.StateLen())
		}
		be.GDNRecurrence(rows(out, vd), rows(q, qk), rows(k, qk), rows(v, vd), rows(g, s.ValueHeads), rows(beta, s.ValueHeads),
			state, stateOut, sq.NodeStates, sq.Parents, sq.Rows, s)
	}
}

// GDNRecurrence runs the gated delta rule token by token, as a chain or a
// tree. A BF16 state is rounded to nearest even after every token, so that
// a T-token call computes exactly what T one-token calls do.
func (be *Backend) GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, parents kernels.Buffer, T int, shape kernels.GDNShape) {
	a := gdnInputs("GDNRecurrence", out, q, k, v, g, beta, T, shape)
	sl := shape.StateLen()
	dt := stateDType("GDNRecurrence state", state)
	st := recurrentStates("GDNRecurrence state", state, dt, sl)
	par := treeParents("GDNRecurrence", parents, T)
	var nodes, final recurrentState
	if nodeStates != nil || par != nil {
		nodes = recurrentStates("GDNRecurrence nodeStates", nodeStates, dt, T*sl)
	}
	if par == nil {
		final = recurrentStates("GDNRecurrence stateOut", stateOut, dt, sl)
	}
	headLen := shape.KeyDim * shape.ValueDim
	// A token costs a head about four multiply-adds per state element (a
	// multiply and three FMAs), and a decode step finds the state in memory.
	be.pool.parallelFor(shape.ValueHeads, 4*T*headLen, func(lo, hi int) {
		deltaTemp, delta := be.temps.get(shape.ValueDim)
		defer be.temps.put(deltaTemp)
		var work []float32 // a BF16 head's working copy
		if dt == kernels.BF16 {
			var workTemp *[]float32
			workTemp, work = be.temps.get(headLen)
			defer be.temps.put(workTemp)
		}
		for h := lo; h < hi; h++ {
			head := h * headLen
			step := func(S []float32, t int) {
				qt, kt, vt, gt, bt := a.token(t, h)
				be.kern.deltaStep(S, qt, kt, vt, gt, bt, a.outRow(t, h), delta)
				if dt == kernels.BF16 {
					roundToBF16(S) // the state as stored between tokens
				}
			}
			if par == nil {
				S := final.working(head, headLen, work)
				st.load(S, head) // a no-op when stateOut is state
				for t := range T {
					step(S, t)
					if nodes.present() {
						nodes.store(t*sl+head, S)
					}
				}
				final.store(head, S)
				continue
			}
			for t := range T {
				S := nodes.working(t*sl+head, headLen, work)
				if p := par[t]; p < 0 {
					st.load(S, head)
				} else {
					nodes.load(S, int(p)*sl+head)
				}
				step(S, t)
				nodes.store(t*sl+head, S)
			}
		}
	})
}

// recurrentState is a GDN recurrent-state buffer (state, stateOut or
// nodeStates) as the kernels use it: an F32 state is updated in place; a
// BF16 one is widened into a working copy and rounded back on store.
type recurrentState struct {
	f32  []float32
	bf16 []uint16
}

// stateDType is the recurrent state's storage dtype, F32 or BF16; the
// other state buffers of a call must have the same.
func stateDType(op string, state kernels.Buffer) kernels.DType {
	dt := asBuffer(state).dt
	if dt != kernels.F32 && dt != kernels.BF16 {
		panic(fmt.Sprintf("cpu: %s needs an F32 or BF16 buffer, got %v", op, dt))
	}
	return dt
}

// recurrentStates returns the first n elements of a state buffer of dtype dt.
func recurrentStates(op string, b kernels.Buffer, dt kernels.DType, n int) recurrentState {
	buf := asBuffer(b)
	checkDType(op, buf, dt)
	checkLen(op, buf, n)
	if dt == kernels.BF16 {
		return recurrentState{bf16: buf.u16[:n]}
	}
	return recurrentState{f32: buf.f32[:n]}
}

func (s recurrentState) present() bool { return s.f32 != nil || s.bf16 != nil }

// working is where n elements at off are updated: an F32 buffer's own
// elements, else work.
func (s recurrentState) working(off, n int, work []float32) []float32 {
	if s.f32 != nil {
		return s.f32[off : off+n]
	}
	return work[:n]
}

// load puts the len(dst) elements at off into dst, widening BF16.
func (s recurrentState) load(dst []float32, off int) {
	if s.f32 != nil {
		if &s.f32[off] != &dst[0] {
			copy(dst, s.f32[off:])
		}
		return
	}
	for i, h := range s.bf16[off : off+len(dst)] {
		dst[i] = half.BF16ToFloat32(h)
	}
}

// store writes src at off, rounding to nearest even for BF16.
func (s recurrentState) store(off int, src []float32) {
	if s.f32 != nil {
		if &s.f32[off] != &src[0] {
			copy(s.f32[off:], src)
		}
		return
	}
	for i, v := range src {
		s.bf16[off+i] = half.Float32ToBF16(v)
	}
}

// roundToBF16 rounds every value to the nearest bfloat16, ties to even.
func roundToBF16(x []float32) {
	for i, v := range x {
		x[i] = half.BF16ToFloat32(half.Float32ToBF16(v))
	}
}
