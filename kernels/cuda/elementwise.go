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
