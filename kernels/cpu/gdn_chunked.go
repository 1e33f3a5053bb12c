package cpu

import (
	"fmt"
	"math"

	"ddflash/kernels"
)

// GDNChunked runs a chain of T tokens in chunks of the given length with the
// WY/UT form of HF's torch_chunk_gated_delta_rule: inside a chunk the delta
// rule becomes a triangular solve, and the state is touched once per chunk.
// A BF16 state is widened on load and rounded once, when the final state is
// stored: prefill need not match token-by-token decoding bit for bit.
func (be *Backend) GDNChunked(out, q, k, v, g, beta, state, stateOut kernels.Buffer, T, chunk int, shape kernels.GDNShape) {
	if chunk <= 0 {
		panic(fmt.Sprintf("cpu: GDNChunked chunk %d must be positive", chunk))
	}
	a := gdnInputs("GDNChunked", out, q, k, v, g, beta, T, shape)
	sl := shape.StateLen()
	dt := stateDType("GDNChunked state", state)
	st, final := recurrentStates("GDNChunked state", state, dt, sl), recurrentStates("GDNChunked stateOut", stateOut, dt, sl)
	headLen := shape.KeyDim * shape.ValueDim
	be.pool.parallelFor(shape.ValueHeads, T*headLen, func(lo, hi int) {
		w := newChunkScratch(be.kern, min(chunk, max(T, 1)), shape.KeyDim, shape.ValueDim)
		var work []float32 // a BF16 head's working copy
		if dt == kernels.BF16 {
			work = make([]float32, headLen)
		}
		for h := lo; h < hi; h++ {
			S := final.working(h*headLen, headLen, work)
			st.load(S, h*headLen) // a no-op when stateOut is state
			for start := 0; start < T; start += chunk {
				w.run(&a, S, h, start, min(chunk, T-start))
			}
			final.store(h*headLen, S)
		}
	})
}

// chunkScratch holds one worker's per-chunk matrices (C = chunk length).
type chunkScratch struct {
	kern   *kernelSet
	kd, vd int
	gc     []float32 // [C] cumulative log-decay inside the chunk
	kt     []float32 // [kd, C16] the chunk's keys, transposed, rows zero-padded to C16 = C rounded up to 16
	dots   []float32 // [C16] one row of k_i·k_j or q_i·k_j
	tri    []float32 // [C, C] strictly lower part of the UT transform
	coef   []float32 // [max(C, kd)] the coefficients of one accumRows
	u      []float32 // [C, vd] transformed beta·v, then the new values
	rows   []float32 // [C, kd] or [kd, C]: the coefficient rows of one mixRows
}

// pad16 rounds n up to a whole number of 16-lane vectors.
func pad16(n int) int { return (n + 15) &^ 15 }

func newChunkScratch(kern *kernelSet, c, kd, vd int) *chunkScratch {
	return &chunkScratch{
		kern: kern, kd: kd, vd: vd,
		gc: make([]float32, c), kt: make([]float32, kd*pad16(c)), dots: make([]float32, pad16(c)),
		tri: make([]float32, c*c), coef: make([]float32, max(c, kd)),
		u: make([]float32, c*vd), rows: make([]float32, c*kd),
	}
}

// expDiff is exp(x-y), from the difference so that neither factor can
// overflow or underflow alone.
func expDiff(x, y float32) float32 { return float32(math.Exp(float64(x - y))) }

// run applies tokens [start, start+n) of value head h to the state S. Every
// product over the chunk is an accumRows (rows of keys, values, the state
// or u, read in place), so the SIMD kernel does the O(n·kd·vd) work; those
// with the state or u on the right run for all their rows at once
// (mixRows), each row's sum in the same order as one accumRows.
func (w *chunkScratch) run(a *gdnArgs, S []float32, h, start, n int) {
	kd, vd, acc, mix := w.kd, w.vd, w.kern.accumRows, w.kern.mixRows
	// Key dot products run over whole rows of kt (np columns, the padding
	// zero), so that accumRows never takes its partial-vector path.
	np := pad16(n)
	gc, kt, dots, tri, u := w.gc[:n], w.kt[:kd*np], w.dots[:np], w.tri[:n*n], w.u[:n*vd]
	clear(kt)
	k0, v0 := a.tail(start, h) // token start+j's rows are at offset j·stride
	var cum float32
	for j := range n {
		_, kj, _, gj, _ := a.token(start+j, h)
		cum += gj
		gc[j] = cum
		for r, x := range kj {
			kt[r*np+j] = x
		}
	}
	// With A[i,j] = beta_i·(k_i·k_j)·exp(gc_i-gc_j) for j < i, forward
	// substitution on tri = -A turns I + tri into (I + A)⁻¹.
	for i := range n {
		_, ki, _, _, bi := a.token(start+i, h)
		clear(dots)
		acc(dots, ki, kt, np)
		for j := range i {
			tri[i*n+j] = -bi * dots[j] * expDiff(gc[i], gc[j])
		}
	}
	for i := 1; i < n; i++ {
		row := w.coef[:i]
		copy(row, tri[i*n:i*n+i])
		for j := range i {
			sum := row[j]
			for m := j + 1; m < i; m++ {
				sum += row[m] * tri[m*n+j]
			}
			tri[i*n+j] = sum
		}
	}
	// u_i = Σ_j (I+tri)[i,j]·beta_j·v_j, then u_i -= wk_i·S with
	// wk_i = Σ_j (I+tri)[i,j]·beta_j·exp(gc_j)·k_j, using the state before
	// this chunk.
	for i := range n {
		ui, c := u[i*vd:(i+1)*vd], w.coef[:i+1]
		for j := range c {
			_, _, _, _, bj := a.token(start+j, h)
			c[j] = bj
			if j < i {
				c[j] *= tri[i*n+j]
			}
		}
		clear(ui)
		acc(ui, c, v0, a.vDim)
		for j := range c {
			c[j] *= -float32(math.Exp(float64(gc[j])))
		}
		wk := w.rows[i*kd : (i+1)*kd]
		clear(wk)
		acc(wk, c, k0, a.qkDim)
	}
	mix(u, vd, w.rows, kd, n, kd, S, vd, nil)
	if a.out != nil {
		// out_i = exp(gc_i)·q_i·S + Σ_{j≤i} (q_i·k_j)·exp(gc_i-gc_j)·u_j.
		for i := range n {
			qi, _, _, _, _ := a.token(start+i, h)
			clear(a.outRow(start+i, h))
			decay := float32(math.Exp(float64(gc[i])))
			for r, x := range qi {
				w.rows[i*kd+r] = x * decay
			}
		}
		out0 := a.out[start*a.vDim+h*vd:]
		mix(out0, a.vDim, w.rows, kd, n, kd, S, vd, nil)
		for i := range n {
			qi, _, _, _, _ := a.token(start+i, h)
			oi := a.outRow(start+i, h)
			clear(dots)
			acc(dots, qi, kt, np)
			for j := range i + 1 {
				dots[j] *= expDiff(gc[i], gc[j])
			}
			acc(oi, dots[:i+1], u, vd)
		}
	}
	// S = exp(gc_last)·S + Σ_j exp(gc_last-gc_j)·k_j ⊗ u_j, one key row r of
	// S at a time.
	last := gc[n-1]
	decay := float32(math.Exp(float64(last)))
	for i := range S {
		S[i] *= decay
	}
	for j := range n {
		dots[j] = expDiff(last, gc[j])
	}
	for r := range kd {
		for j := range n {
			w.rows[r*n+j] = dots[j] * kt[r*np+j]
		}
	}
	mix(S, vd, w.rows, n, kd, n, u, vd, nil)
}

func accumRowsPortable(out, c, b []float32, stride int) {
	for r, cr := range c {
		axpy(out, b[r*stride:], cr)
	}
}
