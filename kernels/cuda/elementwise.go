//go:build cgo

package cuda

import "ddflash/kernels"

// Embedding gathers rows of table (any float dtype) into the F32 out; an id
// outside the table traps (reported by the next Sync).
func (be *Backend) Embedding(out, table, ids kernels.Buffer, n, dim int) {
	o, idv := f32s("Embedding out", out, n*dim), i32s("Embedding ids", ids, n)
	tab, variant := weights("Embedding table", table, 0)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("embedding"+variant, be.gridFor(n*dim, 256), d1(256), 0,
		o, tab, idv, i32(n), i32(dim), int64(tab.n/max(dim, 1)))
}

// Add computes out = a + b elementwise.
func (be *Backend) Add(out, a, b kernels.Buffer, n int) {
	o, av, bv := f32s("Add out", out, n), f32s("Add a", a, n), f32s("Add b", b, n)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("add_f32", be.gridFor(n, 256), d1(256), 0, o, av, bv, int64(n))
}

// SwiGLU computes out = silu(gate)·up.
func (be *Backend) SwiGLU(out, gate, up kernels.Buffer, n int) {
	o, g, u := f32s("SwiGLU out", out, n), f32s("SwiGLU gate", gate, n), f32s("SwiGLU up", up, n)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("swiglu", be.gridFor(n, 256), d1(256), 0, o, g, u, int64(n))
}

// MulSigmoid computes x = x·sigmoid(gate).
func (be *Backend) MulSigmoid(x, gate kernels.Buffer, n int) {
	xv, g := f32s("MulSigmoid x", x, n), f32s("MulSigmoid gate", gate, n)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("mul_sigmoid", be.gridFor(n, 256), d1(256), 0, xv, g, int64(n))
}

// GroupedConv runs DFlash2's block-local convolution with static and
// per-group dynamic taps (see kernels.Backend).
func (be *Backend) GroupedConv(out, x, base, delta kernels.Buffer, rows, dim, taps, groupSize, deltaStride int) {
	o, xv := f32s("GroupedConv out", out, rows*dim), f32s("GroupedConv x", x, rows*dim)
	bv := f32s("GroupedConv base", base, taps*dim)
	dv := f32s("GroupedConv delta", delta, max(0, (rows-1)*deltaStride+taps*(dim/groupSize)))
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("grouped_conv", be.gridFor(rows*dim, 256), d1(256), 0,
		o, xv, bv, dv, i32(rows), i32(dim), i32(taps), i32(groupSize), i32(deltaStride))
}
