package cpu

import (
	"container/heap"
	"fmt"
	"math"
	"sort"

	"ddflash/kernels"
	"ddflash/kernels/rowmath"
)

func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

func sigmoid(x float32) float32 { return 1 / (1 + float32(math.Exp(float64(-x)))) }

// Embedding gathers rows of table (any float dtype) into the F32 out.
func (be *Backend) Embedding(out, table, ids kernels.Buffer, n, dim int) {
	o := f32s("Embedding out", out, n*dim)
	idv := i32s("Embedding ids", ids, n)
	tab := asBuffer(table)
	rows := tab.Len() / max(dim, 1)
	for i, id := range idv {
		if id < 0 || int(id) >= rows {
			panic(fmt.Sprintf("cpu: Embedding id %d at %d is outside the table's %d rows", id, i, rows))
		}
		src := int(id) * dim
		dst := o[i*dim : (i+1)*dim]
		switch tab.dt {
		case kernels.F32:
			copy(dst, tab.f32[src:src+dim])
		case kernels.BF16, kernels.F16:
			widenInto(dst, tab.u16[src:src+dim], tab.dt)
		default:
			panic(fmt.Sprintf("cpu: Embedding table must be a float buffer, got %v", tab.dt))
		}
	}
}

// Add computes out = a + b elementwise.
func (be *Backend) Add(out, a, b kernels.Buffer, n int) {
	o, av, bv := f32s("Add out", out, n), f32s("Add a", a, n), f32s("Add b", b, n)
	for i := range o {
		o[i] = av[i] + bv[i]
	}
}

// invRMS returns rsqrt(mean(x²)+eps), accumulated in float64.
func invRMS(x []float32, eps float32) float32 {
	// Four partial sums: one chain of dependent adds would cost more than
	// the rest of the norm.
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		v := x[i : i+4]
		s0 += float64(v[0]) * float64(v[0])
		s1 += float64(v[1]) * float64(v[1])
		s2 += float64(v[2]) * float64(v[2])
		s3 += float64(v[3]) * float64(v[3])
	}
	for _, v := range x[i:] {
		s0 += float64(v) * float64(v)
	}
	ss := (s0 + s1) + (s2 + s3)
	return float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
}

// RMSNorm normalises rows; w is (1+w) when unitOffset.
func (be *Backend) RMSNorm(out, x, w kernels.Buffer, rows, dim int, eps float32, unitOffset bool) {
	o, xv := f32s("RMSNorm out", out, rows*dim), f32s("RMSNorm x", x, rows*dim)
	wv := widened("RMSNorm w", w, dim)
	offset := float32(0)
	if unitOffset {
		offset = 1
	}
	be.pool.parallelFor(rows, dim, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, or := xv[r*dim:(r+1)*dim], o[r*dim:(r+1)*dim]
			inv := invRMS(xr, eps)
			for i, v := range xr {
				or[i] = v * inv * (offset + wv[i])
			}
		}
	})
}

// AddRMSNorm adds delta into x, then writes RMSNorm(x) to out.
func (be *Backend) AddRMSNorm(x, delta, out, w kernels.Buffer, rows, dim int, eps float32, unitOffset bool) {
	be.Add(x, x, delta, rows*dim)
	be.RMSNorm(out, x, w, rows, dim, eps, unitOffset)
}

// GatedRMSNorm computes RMSNorm(x)·w·silu(z) per row.
func (be *Backend) GatedRMSNorm(out, x, z, w kernels.Buffer, rows, dim int, eps float32) {
	o, xv := f32s("GatedRMSNorm out", out, rows*dim), f32s("GatedRMSNorm x", x, rows*dim)
	zv := f32s("GatedRMSNorm z", z, rows*dim)
	wv := widened("GatedRMSNorm w", w, dim)
	be.pool.parallelFor(rows, dim, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, zr, or := xv[r*dim:(r+1)*dim], zv[r*dim:(r+1)*dim], o[r*dim:(r+1)*dim]
			inv := invRMS(xr, eps)
			for i, v := range xr {
				or[i] = v * inv * wv[i]
			}
			be.kern.swiglu(or, zr, or)
		}
	})
}

// L2Norm scales each row to unit length (then by scale), in place.
func (be *Backend) L2Norm(x kernels.Buffer, rows, dim int, eps, scale float32) {
	xv := f32s("L2Norm x", x, rows*dim)
	for r := range rows {
		xr := xv[r*dim : (r+1)*dim]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		f := float32(1/math.Sqrt(ss+float64(eps))) * scale
		for i := range xr {
			xr[i] *= f
		}
	}
}

// GDNConvInputs runs CausalConv (and ConvCommit) per sequence, GDNGates,
// and splits the convolved rows with Copy and L2Norm: the unfused ops.
func (be *Backend) GDNConvInputs(q, k, v, a, b, x, convW, aLog, dtBias kernels.Buffer, seqs []kernels.GDNConvSeq, K int, s kernels.GDNShape, eps, qScale float32) {
	qk, vd := s.KeyHeads*s.KeyDim, s.ValueHeads*s.ValueDim
	width, T := 2*qk+vd, 0
	for _, sq := range seqs {
		T += sq.Rows
	}
	tmp, convOut := be.temps.get(T * width)
	defer be.temps.put(tmp)
	conv := &buffer{dt: kernels.F32, f32: convOut}
	r0 := 0
	for _, sq := range seqs {
		xs := be.Slice(x, r0*width, sq.Rows*width)
		state := be.slotState("GDNConvInputs", sq.State, sq.SlotAt, (K-1)*width)
		be.CausalConv(be.Slice(conv, r0*width, sq.Rows*width), xs, state, convW, sq.Parents, sq.Rows, width, K)
		if sq.Commit {
			be.ConvCommit(state, xs, sq.Parents, sq.Rows-1, width, K)
		}
		r0 += sq.Rows
	}
	be.GDNGates(a, b, aLog, dtBias, T, s.ValueHeads)
	be.Copy(q, conv, T, qk, qk, width)
	be.Copy(k, be.Slice(conv, qk, conv.Len()-qk), T, qk, qk, width)
	be.Copy(v, be.Slice(conv, 2*qk, conv.Len()-2*qk), T, vd, vd, width)
	be.L2Norm(q, T*s.KeyHeads, s.KeyDim, eps, qScale)
	be.L2Norm(k, T*s.KeyHeads, s.KeyDim, eps, 1)
}

// slotState is a sequence's state: state, or with slotAt (one I32) the
// slotAt[0]-th of the n-element states state holds.
func (be *Backend) slotState(op string, state, slotAt kernels.Buffer, n int) kernels.Buffer {
	if slotAt == nil {
		return state
	}
	slot := int(i32s(op+" slot", slotAt, 1)[0])
	if slot < 0 || (slot+1)*n > state.Len() {
		panic(fmt.Sprintf("cpu: %s slot %d outside the %d states of %d elements", op, slot, state.Len()/n, n))
	}
	return be.Slice(state, slot*n, n)
}

// RoPE rotates the first rotDim dims of every head, NeoX style, in place.
// Angles are computed in float64 so that large positions stay exact.
func (be *Backend) RoPE(x, positions, invFreq kernels.Buffer, rows, heads, headDim, rotDim int, scale float32) {
	if rotDim%2 != 0 || rotDim > headDim {
		panic(fmt.Sprintf("cpu: RoPE rotDim %d must be even and at most headDim %d", rotDim, headDim))
	}
	xv := f32s("RoPE x", x, rows*heads*headDim)
	pos := i32s("RoPE positions", positions, rows)
	half := rotDim / 2
	freq := f32s("RoPE invFreq", invFreq, half)
	cos, sin := make([]float32, half), make([]float32, half)
	for r := range rows {
		for i := range half {
			s, c := math.Sincos(float64(pos[r]) * float64(freq[i]))
			cos[i], sin[i] = float32(c)*scale, float32(s)*scale
		}
		for h := range heads {
			d := xv[(r*heads+h)*headDim:]
			for i := range half {
				x1, x2 := d[i], d[i+half]
				d[i] = x1*cos[i] - x2*sin[i]
				d[i+half] = x2*cos[i] + x1*sin[i]
			}
		}
	}
}

// AttnInputs splits qg into q and gate (when given), normalises and
// rotates q and k in place, then writes k and v to the caches: the
// unfused ops.
func (be *Backend) AttnInputs(q, qg, gate, k, v, qNorm, kNorm, positions, invFreq, kCache, vCache, slots kernels.Buffer, rows int, s kernels.AttnInputShape) {
	if qg != nil {
		hd := s.HeadDim
		be.Copy(q, qg, rows*s.Heads, hd, hd, 2*hd)
		be.Copy(gate, be.Slice(qg, hd, qg.Len()-hd), rows*s.Heads, hd, hd, 2*hd)
	}
	be.RMSNorm(q, q, qNorm, rows*s.Heads, s.HeadDim, s.Eps, true)
	be.RMSNorm(k, k, kNorm, rows*s.KVHeads, s.HeadDim, s.Eps, true)
	be.RoPE(q, positions, invFreq, rows, s.Heads, s.HeadDim, s.RotDim, s.RoPEScale)
	be.RoPE(k, positions, invFreq, rows, s.KVHeads, s.HeadDim, s.RotDim, s.RoPEScale)
	be.WriteKV(kCache, vCache, k, v, slots, rows, s.KVHeads*s.HeadDim)
}

// SwiGLU computes out = silu(gate)·up.
func (be *Backend) SwiGLU(out, gate, up kernels.Buffer, n int) {
	o, g, u := f32s("SwiGLU out", out, n), f32s("SwiGLU gate", gate, n), f32s("SwiGLU up", up, n)
	be.pool.parallelFor(n, 1, func(lo, hi int) {
		be.kern.swiglu(o[lo:hi], g[lo:hi], u[lo:hi])
	})
}

// MulSigmoid computes x = x·sigmoid(gate).
func (be *Backend) MulSigmoid(x, gate kernels.Buffer, n int) {
	xv, g := f32s("MulSigmoid x", x, n), f32s("MulSigmoid gate", gate, n)
	be.pool.parallelFor(n, 1, func(lo, hi int) {
		be.kern.mulSigmoid(xv[lo:hi], g[lo:hi])
	})
}

// GroupedConv runs DFlash2's block-local convolution with static and
// per-group dynamic taps (see kernels.Backend).
func (be *Backend) GroupedConv(out, x, base, delta kernels.Buffer, rows, dim, taps, groupSize, deltaStride int) {
	groups := dim / groupSize
	o, xv := f32s("GroupedConv out", out, rows*dim), f32s("GroupedConv x", x, rows*dim)
	bv := f32s("GroupedConv base", base, taps*dim)
	dv := f32s("GroupedConv delta", delta, max(0, (rows-1)*deltaStride+taps*groups))
	be.pool.parallelFor(rows, taps*dim, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := o[i*dim : (i+1)*dim]
			clear(row)
			for t := 0; t < taps && t <= i; t++ {
				src, w, dyn := xv[(i-t)*dim:(i-t+1)*dim], bv[t*dim:(t+1)*dim], dv[i*deltaStride+t*groups:]
				for c := range row {
					row[c] += (w[c] + dyn[c/groupSize]) * src[c]
				}
			}
		}
	})
}

// LogSoftmax replaces each row by its log-probabilities (log-sum-exp in float64).
func (be *Backend) LogSoftmax(x kernels.Buffer, rows, n int) {
	xv := f32s("LogSoftmax x", x, rows*n)
	be.pool.parallelFor(rows, n, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr := xv[r*n : (r+1)*n]
			top := float32(math.Inf(-1))
			for _, v := range xr {
				top = max(top, v)
			}
			var sum float64
			for _, v := range xr {
				sum += math.Exp(float64(v - top))
			}
			shift := top + float32(math.Log(sum))
			for i := range xr {
				xr[i] -= shift
			}
		}
	})
}

// TopK writes each row's k largest values in descending order (ties: lower
// index first) and their indices.
func (be *Backend) TopK(vals, idx, x kernels.Buffer, rows, n, k int) {
	if k > n {
		panic(fmt.Sprintf("cpu: TopK k=%d exceeds the row length %d", k, n))
	}
	xv := f32s("TopK x", x, rows*n)
	vv, iv := f32s("TopK vals", vals, rows*k), i32s("TopK idx", idx, rows*k)
	be.pool.parallelFor(rows, n, func(lo, hi int) {
		best := make(candidates, 0, k)
		for r := lo; r < hi; r++ {
			best = best[:0]
			row := xv[r*n : (r+1)*n]
			for i := 0; i < len(row); i++ {
				if k > 0 && len(best) == k { // skip to an entry above the weakest kept (an equal one has a higher index)
					if i += rowmath.NextAtLeast(row[i:], math.Nextafter32(best[0].val, float32(math.Inf(1)))); i == len(row) {
						break
					}
				}
				c := candidate{row[i], int32(i)}
				switch {
				case len(best) < k:
					heap.Push(&best, c)
				case k > 0 && c.beats(best[0]):
					best[0] = c
					heap.Fix(&best, 0)
				}
			}
			sort.Slice(best, func(a, b int) bool { return best[a].beats(best[b]) })
			for j, c := range best {
				vv[r*k+j], iv[r*k+j] = c.val, c.idx
			}
		}
	})
}

type candidate struct {
	val float32
	idx int32
}

// beats orders by value, then by lower index.
func (c candidate) beats(o candidate) bool {
	return c.val > o.val || (c.val == o.val && c.idx < o.idx)
}

// candidates is a min-heap whose root is the weakest kept candidate.
type candidates []candidate

func (h candidates) Len() int           { return len(h) }
func (h candidates) Less(a, b int) bool { return h[b].beats(h[a]) }
func (h candidates) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *candidates) Push(x any)        { *h = append(*h, x.(candidate)) }
func (h *candidates) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
