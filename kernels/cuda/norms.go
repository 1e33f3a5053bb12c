//go:build cgo

package cuda

import (
	"fmt"

	"ddflash/kernels"
)

// rowThreads is the block size of a kernel that reduces rows of n elements
// with one block per row: a warp per 32 elements, at most limit threads.
func rowThreads(n, limit int) dim3 { return d1(min(max((n+31)/32*32, 32), limit)) }

// RMSNorm normalises rows; w is (1+w) when unitOffset.
func (be *Backend) RMSNorm(out, x, w kernels.Buffer, rows, dim int, eps float32, unitOffset bool) {
	o, xv := f32s("RMSNorm out", out, rows*dim), f32s("RMSNorm x", x, rows*dim)
	wv, variant := weights("RMSNorm w", w, dim)
	offset := float32(0)
	if unitOffset {
		offset = 1
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("rmsnorm"+variant, d1(rows), rowThreads(dim, 256), 0, o, xv, wv, i32(dim), eps, offset)
}

// AddRMSNorm adds delta into x, then writes RMSNorm(x) to out: one launch
// for the residual add and the next norm.
func (be *Backend) AddRMSNorm(x, delta, out, w kernels.Buffer, rows, dim int, eps float32, unitOffset bool) {
	xv, dv := f32s("AddRMSNorm x", x, rows*dim), f32s("AddRMSNorm delta", delta, rows*dim)
	o := f32s("AddRMSNorm out", out, rows*dim)
	wv, variant := weights("AddRMSNorm w", w, dim)
	offset := float32(0)
	if unitOffset {
		offset = 1
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("add_rmsnorm"+variant, d1(rows), rowThreads(dim, 256), 0, xv, dv, o, wv, i32(dim), eps, offset)
}

// GatedRMSNorm computes RMSNorm(x)·w·silu(z) per row.
func (be *Backend) GatedRMSNorm(out, x, z, w kernels.Buffer, rows, dim int, eps float32) {
	o, xv := f32s("GatedRMSNorm out", out, rows*dim), f32s("GatedRMSNorm x", x, rows*dim)
	zv := f32s("GatedRMSNorm z", z, rows*dim)
	wv, variant := weights("GatedRMSNorm w", w, dim)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("gated_rmsnorm"+variant, d1(rows), rowThreads(dim, 256), 0, o, xv, zv, wv, i32(dim), eps)
}

// L2Norm scales each row to unit length (then by scale), in place.
func (be *Backend) L2Norm(x kernels.Buffer, rows, dim int, eps, scale float32) {
	xv := f32s("L2Norm x", x, rows*dim)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("l2norm", d1(rows), rowThreads(dim, 256), 0, xv, i32(dim), eps, scale)
}

// RoPE rotates the first rotDim dims of every head, NeoX style, in place;
// angles in double as on the CPU.
func (be *Backend) RoPE(x, positions, invFreq kernels.Buffer, rows, heads, headDim, rotDim int, scale float32) {
	if rotDim%2 != 0 || rotDim > headDim {
		panic(fmt.Sprintf("cuda: RoPE rotDim %d must be even and at most headDim %d", rotDim, headDim))
	}
	xv := f32s("RoPE x", x, rows*heads*headDim)
	pos := i32s("RoPE positions", positions, rows)
	freq := f32s("RoPE invFreq", invFreq, rotDim/2)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("rope", be.gridFor(rows*rotDim/2, 128), d1(128), 0,
		xv, pos, freq, i32(rows), i32(heads), i32(headDim), i32(rotDim/2), scale)
}
