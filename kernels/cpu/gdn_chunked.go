package cpu

import (
	"fmt"
	"math"

	"ddflash/kernels"
)

// GDNChunked runs a chain of T tokens in chunks of the given length with the
// WY/UT form of HF's torch_chunk_gated_delta_rule: inside a chunk the delta
// rule becomes a triangular solve, and the state is touched once per chunk.
func (be *Backend) GDNChunked(out, q, k, v, g, beta, state, stateOut kernels.Buffer, T, chunk int, shape kernels.GDNShape) {
	if chunk <= 0 {
		panic(fmt.Sprintf("cpu: GDNChunked chunk %d must be positive", chunk))
	}
	a := gdnInputs("GDNChunked", out, q, k, v, g, beta, T, shape)
	sl := shape.StateLen()
	st, final := f32s("GDNChunked state", state, sl), f32s("GDNChunked stateOut", stateOut, sl)
	headLen := shape.KeyDim * shape.ValueDim
	be.pool.parallelFor(shape.ValueHeads, T*headLen, func(lo, hi int) {
		w := newChunkScratch(min(chunk, max(T, 1)), shape.KeyDim, shape.ValueDim)
		for h := lo; h < hi; h++ {
			S := final[h*headLen : (h+1)*headLen]
			copy(S, st[h*headLen:(h+1)*headLen]) // a no-op when stateOut is state
			for start := 0; start < T; start += chunk {
				w.run(&a, S, h, start, min(chunk, T-start))
			}
		}
	})
}

// chunkScratch holds one worker's per-chunk matrices (C = chunk length).
type chunkScratch struct {
	kd, vd int
	gc     []float32 // [C] cumulative log-decay inside the chunk
	tri    []float32 // [C, C] strictly lower part of the UT transform
	u      []float32 // [C, vd] transformed beta·v, then the new values
	wk     []float32 // [C, kd] transformed beta·k·exp(gc)
	row    []float32 // [C] one row during forward substitution
}

func newChunkScratch(c, kd, vd int) *chunkScratch {
	return &chunkScratch{
		kd: kd, vd: vd,
		gc: make([]float32, c), tri: make([]float32, c*c),
		u: make([]float32, c*vd), wk: make([]float32, c*kd), row: make([]float32, c),
	}
}

// run applies tokens [start, start+n) of value head h to the state S.
func (w *chunkScratch) run(a *gdnArgs, S []float32, h, start, n int) {
	kd, vd := w.kd, w.vd
	gc, tri, u, wk := w.gc[:n], w.tri[:n*n], w.u[:n*vd], w.wk[:n*kd]
	var acc float32
	for i := range n {
		_, _, _, gi, _ := a.token(start+i, h)
		acc += gi
		gc[i] = acc
	}
	// With A[i,j] = beta_i·(k_i·k_j)·exp(gc_i-gc_j) for j < i, forward
	// substitution on tri = -A turns I + tri into (I + A)⁻¹.
	for i := range n {
		_, ki, _, _, bi := a.token(start+i, h)
		for j := range i {
			_, kj, _, _, _ := a.token(start+j, h)
			tri[i*n+j] = -bi * dot(ki, kj) * float32(math.Exp(float64(gc[i]-gc[j])))
		}
	}
	for i := 1; i < n; i++ {
		row := w.row[:i]
		copy(row, tri[i*n:i*n+i])
		for j := range i {
			sum := row[j]
			for m := j + 1; m < i; m++ {
				sum += row[m] * tri[m*n+j]
			}
			tri[i*n+j] = sum
		}
	}
	// u = (I+tri)·(beta·v), wk = (I+tri)·(beta·k·exp(gc)).
	for i := range n {
		ui, wi := u[i*vd:(i+1)*vd], wk[i*kd:(i+1)*kd]
		clear(ui)
		clear(wi)
		for j := 0; j <= i; j++ {
			coef := float32(1)
			if j < i {
				coef = tri[i*n+j]
			}
			_, kj, vj, _, bj := a.token(start+j, h)
			axpy(ui, vj, coef*bj)
			axpy(wi, kj, coef*bj*float32(math.Exp(float64(gc[j]))))
		}
	}
	// New values: u -= wk·S, using the state before this chunk.
	for i := range n {
		ui, wi := u[i*vd:(i+1)*vd], wk[i*kd:(i+1)*kd]
		for r, c := range wi {
			axpy(ui, S[r*vd:(r+1)*vd], -c)
		}
	}
	if a.out != nil {
		for i := range n {
			qi, _, _, _, _ := a.token(start+i, h)
			oi := a.outRow(start+i, h)
			clear(oi)
			decay := float32(math.Exp(float64(gc[i])))
			for r, c := range qi {
				axpy(oi, S[r*vd:(r+1)*vd], c*decay)
			}
			for j := 0; j <= i; j++ {
				_, kj, _, _, _ := a.token(start+j, h)
				axpy(oi, u[j*vd:(j+1)*vd], dot(qi, kj)*float32(math.Exp(float64(gc[i]-gc[j]))))
			}
		}
	}
	// S = exp(gc_last)·S + Σ_j exp(gc_last-gc_j)·k_j ⊗ u_j.
	last := gc[n-1]
	decay := float32(math.Exp(float64(last)))
	for i := range S {
		S[i] *= decay
	}
	for j := range n {
		_, kj, _, _, _ := a.token(start+j, h)
		f := float32(math.Exp(float64(last - gc[j])))
		uj := u[j*vd : (j+1)*vd]
		for r, c := range kj {
			axpy(S[r*vd:(r+1)*vd], uj, c*f)
		}
	}
}
