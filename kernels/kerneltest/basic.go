package kerneltest

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"ddflash/kernels"
)

var floatTypes = []kernels.DType{kernels.F32, kernels.BF16, kernels.F16}

// testBuffers checks zeroed allocation, uploads through nested Slice views
// and that out-of-range transfers are errors, not panics.
func testBuffers(h *harness) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16, kernels.I32} {
		b := h.alloc(dt, 7)
		if b.Len() != 7 || b.DType() != dt {
			h.t.Errorf("Alloc(%v, 7) gave a %v buffer of %d", dt, b.DType(), b.Len())
		}
		h.expectEqual(fmt.Sprintf("fresh %v buffer", dt), h.read(b, 7), make([]float32, 7))
	}

	parent := h.alloc(kernels.F32, 20)
	view := h.be.Slice(h.be.Slice(parent, 3, 15), 4, 9) // elements 7..15 of parent
	if view.Len() != 9 {
		h.t.Errorf("Slice(Slice(b, 3, 15), 4, 9).Len() = %d, want 9", view.Len())
	}
	data := h.normal(5, 1)
	if err := h.be.UploadF32(view, 2, data); err != nil {
		h.t.Fatalf("UploadF32 into a view: %v", err)
	}
	want := make([]float32, 20)
	copy(want[9:], data)
	h.expectEqual("parent after an upload through a view", h.read(parent, 20), want)
	h.expectEqual("view read back", h.download(h.be.Slice(view, 2, 5), 5), data)

	ids := h.alloc(kernels.I32, 6)
	raw := make([]byte, 8)
	binary.LittleEndian.PutUint32(raw, 4242)
	binary.LittleEndian.PutUint32(raw[4:], 17)
	if err := h.be.Upload(ids, 3, raw); err != nil {
		h.t.Fatalf("Upload of I32 bytes: %v", err)
	}
	h.expectEqual("I32 raw upload", h.read(ids, 6), []float32{0, 0, 0, 4242, 17, 0})

	if err := h.be.UploadF32(view, 7, data[:3]); err == nil {
		h.t.Errorf("UploadF32 of 3 elements at 7 into a 9-element view succeeded, want an error")
	}
	if err := h.be.DownloadF32(parent, 19, make([]float32, 2)); err == nil {
		h.t.Errorf("DownloadF32 of 2 elements at 19 from a 20-element buffer succeeded, want an error")
	}
	if err := h.be.Upload(ids, 0, raw[:3]); err == nil {
		h.t.Errorf("Upload of 3 bytes into an I32 buffer succeeded, want an error")
	}
}

// testCopy copies a strided block between views at offsets, for every dtype.
func testCopy(h *harness) {
	const rows, cols, srcStride, dstStride, srcOff, dstOff = 5, 7, 9, 11, 2, 3
	srcLen, dstLen := srcOff+(rows-1)*srcStride+cols, dstOff+(rows-1)*dstStride+cols+4
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16, kernels.I32} {
		src, srcVals := h.filled(dt, srcLen)
		dst, dstVals := h.filled(dt, dstLen)
		h.be.Copy(h.be.Slice(dst, dstOff, dstLen-dstOff), h.be.Slice(src, srcOff, srcLen-srcOff), rows, cols, dstStride, srcStride)
		want := append([]float32(nil), dstVals...)
		for r := range rows {
			for c := range cols {
				want[dstOff+r*dstStride+c] = srcVals[srcOff+r*srcStride+c]
			}
		}
		h.expectEqual(fmt.Sprintf("%v Copy", dt), h.read(dst, dstLen), want)
	}
}

// filled returns a buffer of n random values of dt (ids below 1<<16 for I32)
// and those values as float32.
func (h *harness) filled(dt kernels.DType, n int) (kernels.Buffer, []float32) {
	if dt == kernels.I32 {
		ids := make([]int32, n)
		vals := make([]float32, n)
		for i := range ids {
			ids[i] = int32(h.rng.IntN(1 << 16))
			vals[i] = float32(ids[i])
		}
		return h.i32(ids), vals
	}
	b, exact := h.weights(dt, h.normal(n, 1))
	vals := make([]float32, n)
	for i, v := range exact {
		vals[i] = float32(v)
	}
	return b, vals
}

// testFill fills a view of an F32 and of a BF16 buffer (with a value BF16
// must round) and checks the rest of the buffer is untouched.
func testFill(h *harness) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		b, data := h.stateOf(dt, h.normal(13, 1))
		const v = -2.51
		h.be.Fill(h.be.Slice(b, 4, 6), v)
		want := append([]float32(nil), data...)
		_, rounded := roundBF16(v)
		for i := 4; i < 10; i++ {
			want[i] = v
			if dt == kernels.BF16 {
				want[i] = float32(rounded)
			}
		}
		h.expectEqual(fmt.Sprintf("Fill of a %v view", dt), h.read(b, 13), want)
	}
}

// testEmbedding gathers rows of tables of every float dtype; widening is exact.
func testEmbedding(h *harness) {
	const rows, dim, n = 11, 37, 9
	for _, dt := range floatTypes {
		vals := h.normal(rows*dim, 1)
		for i := 0; i < dim; i++ { // a row of tiny values: F16 subnormals
			vals[2*dim+i] *= 1e-6
		}
		table, exact := h.weights(dt, vals)
		ids := make([]int32, n)
		want := make([]float64, 0, n*dim)
		for i := range ids {
			ids[i] = int32(h.rng.IntN(rows))
			if i == 1 {
				ids[i] = 2
			}
			want = append(want, exact[int(ids[i])*dim:int(ids[i]+1)*dim]...)
		}
		out := h.alloc(kernels.F32, n*dim)
		h.be.Embedding(out, table, h.i32(ids), n, dim)
		h.expectClose(fmt.Sprintf("Embedding %v", dt), h.read(out, n*dim), want, nil, tolerance{})
	}
}

// testMatMul checks out = x·wᵀ for every weight dtype and odd shapes, with x
// and out as views at offsets. Bound: the worst-case float32 summation error
// 2·k·u·Σ|x·w| (u the float32 unit roundoff), for any summation order.
func testMatMul(h *harness) {
	shapes := [][3]int{{1, 13, 37}, {1, 8, 48}, {3, 5, 1}, {16, 64, 128}, {17, 13, 37}, {2, 1, 200}, {5, 9, 16}}
	for _, dt := range floatTypes {
		for _, s := range shapes {
			m, n, k := s[0], s[1], s[2]
			x := h.normal(m*k+3, 1)
			w, wv := h.weights(dt, h.normal(n*k, 1))
			outBuf := h.alloc(kernels.F32, m*n+5)
			h.be.MatMul(h.be.Slice(outBuf, 5, m*n), h.be.Slice(h.f32(x), 3, m*k), w, m, n, k)
			want, scale := matmulReference(x[3:], wv, m, n, k)
			got := h.read(outBuf, m*n+5)[5:]
			h.expectClose(fmt.Sprintf("MatMul %v m=%d n=%d k=%d", dt, m, n, k), got, want, scale, tolerance{1e-30, 2 * float64(k) * f32Unit})
		}
	}
}

// testMatMulParts checks MatMulParts on parts of odd widths, views at
// offsets, decode-sized and larger m, aligned and odd k, one dtype and
// mixed dtypes (F8E4M3 stands for block-scaled FP8 weights): each part
// must equal MatMul on the same backend bit for bit, and the float64
// product within MatMul's bound.
func testMatMulParts(h *harness) {
	ns := []int{13, 8, 1, 21}
	for _, dts := range [][]kernels.DType{{kernels.F32, kernels.F32, kernels.F32, kernels.F32}, {kernels.BF16, kernels.BF16, kernels.BF16, kernels.BF16},
		{kernels.F16, kernels.F16, kernels.F16, kernels.F16}, {kernels.BF16, kernels.F32, kernels.BF16, kernels.F16},
		{kernels.F8E4M3, kernels.BF16, kernels.F8E4M3, kernels.F32}} {
		for _, mk := range [][2]int{{1, 48}, {3, 37}, {8, 64}, {11, 48}} {
			m, k := mk[0], mk[1]
			x := h.f32(h.normal(m*k+3, 1))
			xv := h.read(x, m*k+3)[3:]
			parts := make([]kernels.MatMulPart, len(ns))
			wv := make([][]float64, len(ns))
			for i, n := range ns {
				parts[i].N = n
				if dts[i] == kernels.F8E4M3 {
					parts[i].W, wv[i] = h.fp8Weights(n, k)
				} else {
					parts[i].W, wv[i] = h.weights(dts[i], h.normal(n*k, 1))
				}
				parts[i].Out = h.be.Slice(h.alloc(kernels.F32, m*n+1+i), 1+i, m*n)
			}
			h.be.MatMulParts(h.be.Slice(x, 3, m*k), m, k, parts)
			for i, p := range parts {
				name := fmt.Sprintf("MatMulParts %v m=%d k=%d part %d", dts, m, k, i)
				got := h.read(p.Out, m*p.N)
				want, scale := matmulReference(xv, wv[i], m, p.N, k)
				bound := 2 * float64(k) * f32Unit
				if dts[i] == kernels.F8E4M3 {
					bound += 2 * f32Unit // the dequantised weight's rounding (testMatMulFP8)
				}
				h.expectClose(name, got, want, scale, tolerance{1e-30, bound})
				sep := h.alloc(kernels.F32, m*p.N)
				h.be.MatMul(sep, h.be.Slice(x, 3, m*k), p.W, m, p.N, k)
				if !slices.Equal(h.read(sep, m*p.N), got) {
					h.t.Errorf("%s: differs from MatMul on the same backend", name)
				}
			}
		}
	}
}

// testMatMulGLU checks MatMulGLU for every weight dtype, decode-sized and
// larger m, aligned and odd k: it must equal two MatMuls and SwiGLU on the
// same backend bit for bit, and the float64 silu(x·gateᵀ)·(x·upᵀ) within
// MatMul's bound carried through silu (|silu'| < 1.1) and the product.
func testMatMulGLU(h *harness) {
	const n = 19
	for _, dt := range floatTypes {
		for _, mk := range [][2]int{{1, 48}, {5, 37}, {12, 64}} {
			m, k := mk[0], mk[1]
			x := h.f32(h.normal(m*k, 1))
			xv := h.read(x, m*k)
			gate, gv := h.weights(dt, h.normal(n*k, 1))
			up, uv := h.weights(dt, h.normal(n*k, 1))
			out, scratch := h.alloc(kernels.F32, m*n), h.alloc(kernels.F32, m*n)
			h.be.MatMulGLU(out, scratch, x, gate, up, m, n, k)
			name := fmt.Sprintf("MatMulGLU %v m=%d k=%d", dt, m, k)
			got := h.read(out, m*n)
			g, gs := matmulReference(xv, gv, m, n, k)
			u, us := matmulReference(xv, uv, m, n, k)
			want, scale := make([]float64, m*n), make([]float64, m*n)
			for i := range want {
				want[i] = silu64(g[i]) * u[i]
				scale[i] = 1.1*gs[i]*math.Abs(u[i]) + math.Abs(silu64(g[i]))*us[i] + math.Abs(want[i])
			}
			h.expectClose(name, got, want, scale, tolerance{1e-30, (2*float64(k) + 8) * f32Unit})
			sepOut, sepUp := h.alloc(kernels.F32, m*n), h.alloc(kernels.F32, m*n)
			h.be.MatMul(sepOut, x, gate, m, n, k)
			h.be.MatMul(sepUp, x, up, m, n, k)
			h.be.SwiGLU(sepOut, sepOut, sepUp, m*n)
			if !slices.Equal(h.read(sepOut, m*n), got) {
				h.t.Errorf("%s: differs from MatMul, MatMul and SwiGLU on the same backend", name)
			}
		}
	}
}

// matmulReference returns x·wᵀ in float64 and, per output, Σ|x·w|.
func matmulReference(x []float32, w []float64, m, n, k int) (want, scale []float64) {
	want, scale = make([]float64, m*n), make([]float64, m*n)
	for i := range m {
		for j := range n {
			for l := range k {
				p := float64(x[i*k+l]) * w[j*k+l]
				want[i*n+j] += p
				scale[i*n+j] += math.Abs(p)
			}
		}
	}
	return want, scale
}

// testAdd adds in place (out aliases a): exact up to one rounding.
func testAdd(h *harness) {
	const n = 37
	a, b := h.normal(n, 1), h.normal(n, 1)
	ab := h.f32(a)
	h.be.Add(ab, ab, h.f32(b), n)
	want := make([]float64, n)
	for i := range want {
		want[i] = float64(a[i]) + float64(b[i])
	}
	h.expectClose("Add", h.read(ab, n), want, nil, tolerance{0, f32Unit})
}
