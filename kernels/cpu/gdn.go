package cpu

import (
	"fmt"
	"math"

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

// GDNRecurrence runs the gated delta rule token by token, as a chain or a tree.
func (be *Backend) GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, parents kernels.Buffer, T int, shape kernels.GDNShape) {
	a := gdnInputs("GDNRecurrence", out, q, k, v, g, beta, T, shape)
	sl := shape.StateLen()
	st := f32s("GDNRecurrence state", state, sl)
	par := treeParents("GDNRecurrence", parents, T)
	var nodes, final []float32
	if nodeStates != nil || par != nil {
		nodes = f32s("GDNRecurrence nodeStates", nodeStates, T*sl)
	}
	if par == nil {
		final = f32s("GDNRecurrence stateOut", stateOut, sl)
	}
	headLen := shape.KeyDim * shape.ValueDim
	be.pool.parallelFor(shape.ValueHeads, T*headLen, func(lo, hi int) {
		delta := make([]float32, shape.ValueDim)
		for h := lo; h < hi; h++ {
			headOf := func(buf []float32, node int) []float32 {
				return buf[node*sl+h*headLen : node*sl+(h+1)*headLen]
			}
			if par == nil {
				S := headOf(final, 0)
				copy(S, headOf(st, 0)) // a no-op when stateOut is state
				for t := range T {
					qt, kt, vt, gt, bt := a.token(t, h)
					be.kern.deltaStep(S, qt, kt, vt, gt, bt, a.outRow(t, h), delta)
					if nodes != nil {
						copy(headOf(nodes, t), S)
					}
				}
				continue
			}
			for t := range T {
				S := headOf(nodes, t)
				if p := par[t]; p < 0 {
					copy(S, headOf(st, 0))
				} else {
					copy(S, headOf(nodes, int(p)))
				}
				qt, kt, vt, gt, bt := a.token(t, h)
				be.kern.deltaStep(S, qt, kt, vt, gt, bt, a.outRow(t, h), delta)
			}
		}
	})
}
