//go:build cgo

package cuda

import (
	"fmt"

	"ddflash/kernels"
)

// GDNGates turns a into g = -exp(aLog)·softplus(a+dtBias) and b into sigmoid(b).
func (be *Backend) GDNGates(a, b, aLog, dtBias kernels.Buffer, T, heads int) {
	av, bv := f32s("GDNGates a", a, T*heads), f32s("GDNGates b", b, T*heads)
	al, variant := weights("GDNGates aLog", aLog, heads)
	db, dbVariant := weights("GDNGates dtBias", dtBias, heads)
	if variant != dbVariant {
		panic(fmt.Sprintf("cuda: GDNGates aLog is %v and dtBias %v: the kernel needs one dtype", al.dt, db.dt))
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("gdn_gates"+variant, be.gridFor(T*heads, 256), d1(256), 0, av, bv, al, db, i32(T), i32(heads))
}

// maxGDNKeyDim is the largest key dim the recurrence kernel takes: 8 row
// groups of ROWS_PER_THREAD (32) rows, 256 threads, so that any register
// count the compiler picks fits the block.
const maxGDNKeyDim = 256

// gdnOperands checks a GDN op's inputs like the CPU backend does.
func gdnOperands(op string, out, q, k, v, g, beta kernels.Buffer, T int, shape kernels.GDNShape) []any {
	if shape.KeyHeads <= 0 || shape.ValueHeads%shape.KeyHeads != 0 {
		panic(fmt.Sprintf("cuda: %s shape %+v: ValueHeads must be a positive multiple of KeyHeads", op, shape))
	}
	if shape.KeyDim <= 0 || shape.KeyDim > maxGDNKeyDim || shape.ValueDim <= 0 {
		panic(fmt.Sprintf("cuda: %s shape %+v: the kernel supports key dims 1..%d", op, shape, maxGDNKeyDim))
	}
	qkDim, vDim := shape.KeyHeads*shape.KeyDim, shape.ValueHeads*shape.ValueDim
	var o any
	if out != nil {
		o = f32s(op+" out", out, T*vDim)
	}
	return []any{o, f32s(op+" q", q, T*qkDim), f32s(op+" k", k, T*qkDim), f32s(op+" v", v, T*vDim),
		f32s(op+" g", g, T*shape.ValueHeads), f32s(op+" beta", beta, T*shape.ValueHeads)}
}

// GDNRecurrence runs the gated delta rule token by token, as a chain or a tree.
func (be *Backend) GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, parents kernels.Buffer, T int, shape kernels.GDNShape) {
	args := gdnOperands("GDNRecurrence", out, q, k, v, g, beta, T, shape)
	sl := shape.StateLen()
	st, stBF16 := recurrentState("GDNRecurrence state", state, nil, sl)
	var final, nodes any
	if parents == nil {
		final, _ = recurrentState("GDNRecurrence stateOut", stateOut, st, sl)
	}
	if nodeStates != nil || parents != nil {
		nodes, _ = recurrentState("GDNRecurrence nodeStates", nodeStates, st, T*sl)
	}
	par := optI32s("GDNRecurrence parents", parents, T)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.gdnRecurrence(append(args, st, final, nodes, stBF16, par), T, shape)
}

// recurrentState checks an F32 or BF16 recurrent state of at least n
// elements, of like's dtype when like is set, and returns the kernels'
// state_bf16 flag.
func recurrentState(op string, state kernels.Buffer, like *buffer, n int) (*buffer, int32) {
	st, flag := convState(op, state, n)
	if like != nil && st.dt != like.dt {
		panic(fmt.Sprintf("cuda: %s is %v but the state is %v: the states must share one dtype", op, st.dt, like.dt))
	}
	return st, flag
}

// gdnChunk is GDN_CHUNK in gdn.cu; gdnChunkedMaxKeyDim keeps the chunked
// kernel's shared memory within the 48 KiB any GPU gives a block.
const (
	gdnChunk            = 16
	gdnChunkedMaxKeyDim = 128
)

// GDNChunked computes a chain without node states in the chunked WY form,
// in chunks of gdnChunk tokens whatever chunk asks for (the result is the
// same to F32 rounding); key dims above gdnChunkedMaxKeyDim run the token
// recurrence instead.
func (be *Backend) GDNChunked(out, q, k, v, g, beta, state, stateOut kernels.Buffer, T, chunk int, shape kernels.GDNShape) {
	if chunk <= 0 {
		panic(fmt.Sprintf("cuda: GDNChunked chunk %d must be positive", chunk))
	}
	args := gdnOperands("GDNChunked", out, q, k, v, g, beta, T, shape)
	sl := shape.StateLen()
	st, stBF16 := recurrentState("GDNChunked state", state, nil, sl)
	final, _ := recurrentState("GDNChunked stateOut", stateOut, st, sl)
	be.mu.Lock()
	defer be.mu.Unlock()
	if shape.KeyDim > gdnChunkedMaxKeyDim {
		be.gdnRecurrence(append(args, st, final, nil, stBF16, nil), T, shape)
		return
	}
	groups := (shape.KeyDim + 31) / 32
	grid := dim3{shape.ValueHeads, (shape.ValueDim + 31) / 32, 1}
	const c = gdnChunk
	smem := (3*c*shape.KeyDim + 2*c*c + 2*c + 32*c + 2*groups*c*32) * 4
	args = append(args, st, final, stBF16, i32(T), i32(shape.KeyHeads), i32(shape.ValueHeads), i32(shape.KeyDim), i32(shape.ValueDim))
	be.launch("gdn_chunked", grid, dim3{32, groups, 1}, smem, args...)
}

// gdnRecurrence launches gdn.cu's kernel: block (value head, 32 value
// columns), 32 threads per 32 key rows. With T = 0 a chain still copies
// state to stateOut.
func (be *Backend) gdnRecurrence(args []any, T int, shape kernels.GDNShape) {
	groups := (shape.KeyDim + 31) / 32
	grid := dim3{shape.ValueHeads, (shape.ValueDim + 31) / 32, 1}
	smem := (4*shape.KeyDim + 32*groups) * 4
	args = append(args, i32(T), i32(shape.KeyHeads), i32(shape.ValueHeads), i32(shape.KeyDim), i32(shape.ValueDim))
	be.launch("gdn_recurrence", grid, dim3{32, groups, 1}, smem, args...)
}
