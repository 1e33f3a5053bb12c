package kerneltest

import (
	"fmt"
	"math"
	"slices"

	"ddflash/kernels"
)

// normTol bounds the norms: the mean of squares over dim elements carries a
// relative error of at most dim·u, a handful more roundings follow.
func normTol(dim int) tolerance { return tolerance{1e-30, float64(dim+16) * f32Unit} }

// testRMSNorm covers both weight conventions, F32 and BF16 weights, and out
// aliasing x. Scale: the element's magnitude.
func testRMSNorm(h *harness) {
	const rows, dim, eps = 3, 37, 1e-6
	for _, unitOffset := range []bool{true, false} {
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			x := h.normal(rows*dim, 2)
			w, wv := h.weights(dt, h.normal(dim, 0.5))
			xb := h.f32(x)
			h.be.RMSNorm(xb, xb, w, rows, dim, eps, unitOffset)
			want := make([]float64, rows*dim)
			for r := range rows {
				inv := refRMS(x[r*dim:(r+1)*dim], eps)
				for i := range dim {
					f := wv[i]
					if unitOffset {
						f += 1
					}
					want[r*dim+i] = float64(x[r*dim+i]) * inv * f
				}
			}
			h.expectClose(fmt.Sprintf("RMSNorm unitOffset=%v w %v", unitOffset, dt), h.read(xb, rows*dim), want, nil, normTol(dim))
		}
	}
}

// testAddRMSNorm checks the fused residual add and norm: x must hold x+delta
// rounded to F32, out RMSNorm of that, and both equal what Add and RMSNorm
// give on the same backend, bit for bit.
func testAddRMSNorm(h *harness) {
	const rows, dim, eps = 3, 300, 1e-6
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		x, delta := h.normal(rows*dim, 2), h.normal(rows*dim, 1)
		w, wv := h.weights(dt, h.normal(dim, 0.5))
		xb, out := h.f32(x), h.alloc(kernels.F32, rows*dim)
		h.be.AddRMSNorm(xb, h.f32(delta), out, w, rows, dim, eps, true)
		sum, want := make([]float32, rows*dim), make([]float64, rows*dim)
		for i := range sum {
			sum[i] = x[i] + delta[i]
		}
		for r := range rows {
			inv := refRMS(sum[r*dim:(r+1)*dim], eps)
			for i := range dim {
				want[r*dim+i] = float64(sum[r*dim+i]) * inv * (1 + wv[i])
			}
		}
		name := fmt.Sprintf("AddRMSNorm w %v", dt)
		gotX, gotOut := h.read(xb, rows*dim), h.read(out, rows*dim)
		for i := range sum {
			if gotX[i] != sum[i] {
				h.t.Errorf("%s: x[%d] = %v, want x+delta = %v", name, i, gotX[i], sum[i])
				break
			}
		}
		h.expectClose(name, gotOut, want, nil, normTol(dim))
		// The unfused ops on this backend.
		xb2, out2 := h.f32(x), h.alloc(kernels.F32, rows*dim)
		h.be.Add(xb2, xb2, h.f32(delta), rows*dim)
		h.be.RMSNorm(out2, xb2, w, rows, dim, eps, true)
		if sep := h.read(out2, rows*dim); !slices.Equal(sep, gotOut) {
			h.t.Errorf("%s: differs from Add then RMSNorm on the same backend", name)
		}
	}
}

// testGatedRMSNorm checks RMSNorm(x)·w·silu(z) with a plain weight.
func testGatedRMSNorm(h *harness) {
	const rows, dim, eps = 4, 35, 1e-6
	x, z := h.normal(rows*dim, 1), h.normal(rows*dim, 3)
	w, wv := h.weights(kernels.F32, h.normal(dim, 1))
	out := h.alloc(kernels.F32, rows*dim)
	h.be.GatedRMSNorm(out, h.f32(x), h.f32(z), w, rows, dim, eps)
	want := make([]float64, rows*dim)
	for r := range rows {
		inv := refRMS(x[r*dim:(r+1)*dim], eps)
		for i := range dim {
			j := r*dim + i
			want[j] = float64(x[j]) * inv * wv[i] * silu64(float64(z[j]))
		}
	}
	h.expectClose("GatedRMSNorm", h.read(out, rows*dim), want, nil, normTol(dim))
}

// testL2Norm checks x·rsqrt(Σx²+eps)·scale in place, on a view.
func testL2Norm(h *harness) {
	const rows, dim, eps, scale = 5, 13, 1e-6, 0.25
	x := h.normal(rows*dim+2, 3)
	xb := h.f32(x)
	h.be.L2Norm(h.be.Slice(xb, 2, rows*dim), rows, dim, eps, scale)
	want := widen(x)
	for r := range rows {
		row := x[2+r*dim : 2+(r+1)*dim]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		for i, v := range row {
			want[2+r*dim+i] = float64(v) / math.Sqrt(ss+eps) * scale
		}
	}
	h.expectClose("L2Norm", h.read(xb, rows*dim+2), want, nil, normTol(dim))
}

// testRoPE rotates the first rotDim of headDim dims with NeoX pairing, at
// plain theta frequencies and a unit scale, then at random frequencies with
// a YaRN-style scale. Bound: an angle computed in float32 is off by about
// 4u·pos, which moves each output by at most that times |x_i|+|x_{i+h}|.
func testRoPE(h *harness) {
	const rows, heads, headDim, rotDim, theta = 4, 3, 14, 6, 10000.0
	half := rotDim / 2
	plain := make([]float32, half)
	for i := range plain {
		plain[i] = float32(math.Pow(theta, -2*float64(i)/rotDim))
	}
	random := make([]float32, half)
	for i := range random {
		random[i] = float32(h.rng.Float64())
	}
	for _, c := range []struct {
		freq  []float32
		scale float32
	}{{plain, 1}, {random, 1.1386}} {
		checkRoPE(h, c.freq, c.scale, rows, heads, headDim, rotDim)
	}
}

func checkRoPE(h *harness, freq []float32, ropeScale float32, rows, heads, headDim, rotDim int) {
	x := h.normal(rows*heads*headDim, 1)
	pos := []int32{0, 1, 777, int32(h.rng.IntN(4096))}
	xb := h.f32(x)
	h.be.RoPE(xb, h.i32(pos), h.f32(freq), rows, heads, headDim, rotDim, ropeScale)
	want, scale := widen(x), make([]float64, len(x))
	half := rotDim / 2
	for r := range rows {
		for hd := range heads {
			base := (r*heads + hd) * headDim
			for i := range half {
				a := float64(pos[r]) * float64(freq[i])
				c, sn := float64(ropeScale)*math.Cos(a), float64(ropeScale)*math.Sin(a)
				x1, x2 := float64(x[base+i]), float64(x[base+i+half])
				want[base+i] = x1*c - x2*sn
				want[base+i+half] = x2*c + x1*sn
				s := (math.Abs(x1) + math.Abs(x2)) * (1 + float64(pos[r])) * float64(ropeScale)
				scale[base+i], scale[base+i+half] = s, s
			}
		}
	}
	h.expectClose("RoPE", h.read(xb, len(x)), want, scale, tolerance{1e-30, 8 * f32Unit})
}

// testAttnInputs checks the fused q/k norm, RoPE and KV write against the
// unfused RMSNorm, RoPE and WriteKV on the same backend (each checked
// against float64 references above), with F32 and BF16 caches and BF16
// norm weights, a partial rotation and scattered slots, q given alone or
// in q_proj's gated layout (split by two Copy calls when unfused): q, k
// and the cache rows must agree to a few F32 roundings (a BF16 cache: to
// one bf16 rounding, which an F32 rounding of k may tip), the gates
// exactly.
func testAttnInputs(h *harness) {
	const rows, slots = 3, 10
	s := kernels.AttnInputShape{Heads: 4, KVHeads: 2, HeadDim: 40, RotDim: 24, Eps: 1e-6, RoPEScale: 1.1}
	qDim, kvDim := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	freq := h.uniform(s.RotDim/2, 0, 1)
	pos, at := []int32{0, 5, 3001}, []int32{7, 2, 9}
	q, k, v := h.normal(rows*qDim, 2), h.normal(rows*kvDim, 2), h.normal(rows*kvDim, 1)
	qg := h.normal(2*rows*qDim, 2) // per head [query | gate]
	qNorm, _ := h.weights(kernels.BF16, h.normal(s.HeadDim, 0.3))
	kNorm, _ := h.weights(kernels.BF16, h.normal(s.HeadDim, 0.3))
	hd := s.HeadDim
	for _, c := range []struct {
		cache kernels.DType
		gated bool
	}{{kernels.F32, false}, {kernels.BF16, false}, {kernels.F32, true}} {
		cdt := c.cache
		run := func(fused bool) (qOut, gate, kOut, kc, vc []float32) {
			qb, kb := h.f32(q), h.f32(k)
			var qgb, gateb kernels.Buffer
			if c.gated {
				qgb, gateb = h.f32(qg), h.alloc(kernels.F32, rows*qDim)
			}
			kCache, vCache := h.alloc(cdt, slots*kvDim), h.alloc(cdt, slots*kvDim)
			h.be.Fill(kCache, 0)
			h.be.Fill(vCache, 0)
			posb, freqb, slotb := h.i32(pos), h.f32(freq), h.i32(at)
			if fused {
				h.be.AttnInputs(qb, qgb, gateb, kb, h.f32(v), qNorm, kNorm, posb, freqb, kCache, vCache, slotb, rows, s)
			} else {
				if c.gated {
					h.be.Copy(qb, qgb, rows*s.Heads, hd, hd, 2*hd)
					h.be.Copy(gateb, h.be.Slice(qgb, hd, 2*rows*qDim-hd), rows*s.Heads, hd, hd, 2*hd)
				}
				h.be.RMSNorm(qb, qb, qNorm, rows*s.Heads, s.HeadDim, s.Eps, true)
				h.be.RMSNorm(kb, kb, kNorm, rows*s.KVHeads, s.HeadDim, s.Eps, true)
				h.be.RoPE(qb, posb, freqb, rows, s.Heads, s.HeadDim, s.RotDim, s.RoPEScale)
				h.be.RoPE(kb, posb, freqb, rows, s.KVHeads, s.HeadDim, s.RotDim, s.RoPEScale)
				h.be.WriteKV(kCache, vCache, kb, h.f32(v), slotb, rows, kvDim)
			}
			if c.gated {
				gate = h.read(gateb, rows*qDim)
			}
			return h.read(qb, rows*qDim), gate, h.read(kb, rows*kvDim), h.read(kCache, slots*kvDim), h.read(vCache, slots*kvDim)
		}
		gq, gg, gk, gkc, gvc := run(true)
		wq, wg, wk, wkc, wvc := run(false)
		tight, cacheTol := tolerance{1e-30, 4 * f32Unit}, tolerance{1e-30, 4 * f32Unit}
		if cdt == kernels.BF16 {
			cacheTol.rtol = 1.0 / 256
		}
		name := fmt.Sprintf("AttnInputs %v cache gated=%v", cdt, c.gated)
		h.expectClose(name+" q", gq, widen(wq), nil, tight)
		h.expectEqual(name+" gate", gg, wg)
		h.expectClose(name+" k", gk, widen(wk), nil, tight)
		h.expectClose(name+" k cache", gkc, widen(wkc), nil, cacheTol)
		h.expectClose(name+" v cache", gvc, widen(wvc), nil, tolerance{})
	}
}

// testSwiGLU includes gates far into both tails, where a naive exp overflows.
func testSwiGLU(h *harness) {
	gate, up := h.normal(41, 4), h.normal(41, 1)
	gate[0], gate[1] = -120, 95
	out := h.alloc(kernels.F32, len(gate))
	h.be.SwiGLU(out, h.f32(gate), h.f32(up), len(gate))
	want := make([]float64, len(gate))
	for i := range want {
		want[i] = silu64(float64(gate[i])) * float64(up[i])
	}
	h.expectClose("SwiGLU", h.read(out, len(gate)), want, nil, tolerance{1e-30, 8 * f32Unit})
}

// testGroupedConv checks DFlash2's block-local convolution against a
// float64 reference: more rows than taps (so the block's first rows see
// fewer), delta rows with a stride beyond one side's taps (as DFlash2's
// [2, taps, groups] rows are read), and an odd width.
func testGroupedConv(h *harness) {
	for _, c := range []struct{ rows, dim, taps, groupSize int }{{7, 48, 3, 16}, {5, 9, 2, 3}, {1, 16, 2, 4}} {
		groups, stride := c.dim/c.groupSize, 2*c.taps*c.dim/c.groupSize+1
		x, base, delta := h.normal(c.rows*c.dim, 1), h.normal(c.taps*c.dim, 1), h.normal(c.rows*stride, 0.5)
		out := h.alloc(kernels.F32, c.rows*c.dim)
		h.be.GroupedConv(out, h.f32(x), h.f32(base), h.f32(delta), c.rows, c.dim, c.taps, c.groupSize, stride)
		want, scale := make([]float64, c.rows*c.dim), make([]float64, c.rows*c.dim)
		for i := range c.rows {
			for ch := range c.dim {
				for t := 0; t <= i && t < c.taps; t++ {
					w := float64(base[t*c.dim+ch]) + float64(delta[i*stride+t*groups+ch/c.groupSize])
					term := w * float64(x[(i-t)*c.dim+ch])
					want[i*c.dim+ch] += term
					scale[i*c.dim+ch] += math.Abs(term)
				}
			}
		}
		h.expectClose(fmt.Sprintf("GroupedConv %+v", c), h.read(out, len(want)), want, scale, tolerance{1e-30, 8 * f32Unit})
	}
}

// testMulSigmoid checks x·sigmoid(gate) in place, tails included.
func testMulSigmoid(h *harness) {
	x, gate := h.normal(23, 1), h.normal(23, 4)
	gate[0], gate[1] = -200, 150
	xb := h.f32(x)
	h.be.MulSigmoid(xb, h.f32(gate), len(x))
	want := make([]float64, len(x))
	for i := range want {
		want[i] = float64(x[i]) * sigmoid64(float64(gate[i]))
	}
	h.expectClose("MulSigmoid", h.read(xb, len(x)), want, nil, tolerance{1e-30, 8 * f32Unit})
}
