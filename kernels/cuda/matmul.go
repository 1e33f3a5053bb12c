//go:build cgo

package cuda

import (
	"encoding/binary"
	"fmt"

	"ddflash/kernels"
)

const (
	// gemvMaxRows is the most rows MatMul runs on its own kernel (decode and
	// small verify blocks, where reading the weights is the whole cost);
	// more rows with BF16 weights go to cuBLASLt.
	gemvMaxRows = 8
	// matmulWarps is the block size of the matmul kernel in warps, one
	// weight row each.
	matmulWarps = 8
	// matmulRowsPerPass is MR in matmul.cu.
	matmulRowsPerPass = 8
)

// MatMul computes out[m,n] = x[m,k]·w[n,k]ᵀ with F32 accuracy (see the package doc).
func (be *Backend) MatMul(out, x, w kernels.Buffer, m, n, k int) {
	o, xv := f32s("MatMul out", out, m*n), f32s("MatMul x", x, m*k)
	if fp8, ok := w.(*kernels.BlockScaled); ok {
		be.matmulFP8(o, xv, fp8, m, n, k)
		return
	}
	wv, variant := weights("MatMul w", w, n*k)
	if m == 0 || n == 0 {
		return
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if m > gemvMaxRows && wv.dt == kernels.BF16 && be.blas != nil && k%8 == 0 && wv.addr()%16 == 0 {
		if be.matmulSplitBF16(o, xv, wv, m, n, k) {
			return
		}
	}
	grid := dim3{(n + matmulWarps - 1) / matmulWarps, min((m+matmulRowsPerPass-1)/matmulRowsPerPass, 65535), 1}
	be.launch("matmul"+variant, grid, d1(32*matmulWarps), 0, o, xv, wv, i32(m), i32(n), i32(k), gemvVec(xv, wv, k))
}

// gemvVec is the matmul kernel's vec argument: 1 when every lane can load
// 8 weights and 8 activations at once.
func gemvVec(x, w *buffer, k int) int32 {
	if k%8 == 0 && w.addr()%16 == 0 && x.addr()%16 == 0 {
		return 1
	}
	return 0
}

const (
	// maxMatMulParts is MAX_MATMUL_PARTS in matmul.cu.
	maxMatMulParts = 4
	// matmulPartLen and matmulPartsLen are the sizes of matmul.cu's
	// MatMulPart and MatMulParts.
	matmulPartLen  = 24
	matmulPartsLen = maxMatMulParts*matmulPartLen + 8
)

// MatMulParts runs every part's MatMul in one launch of the matmul kernel
// over their concatenated weight rows when m is decode-sized and the
// weights share one unscaled dtype; otherwise MatMul per part.
func (be *Backend) MatMulParts(x kernels.Buffer, m, k int, parts []kernels.MatMulPart) {
	if !be.matmulParts(x, m, k, parts, false) {
		for _, p := range parts {
			be.MatMul(p.Out, x, p.W, m, p.N, k)
		}
	}
}

// MatMulGLU runs the gate and up rows of each output in one warp and
// applies SwiGLU before storing (one launch, up untouched) where
// MatMulParts would use one launch; otherwise MatMulParts and SwiGLU.
func (be *Backend) MatMulGLU(out, up, x, gate, upW kernels.Buffer, m, n, k int) {
	parts := []kernels.MatMulPart{{W: gate, Out: out, N: n}, {W: upW, Out: up, N: n}}
	if !be.matmulParts(x, m, k, parts, true) {
		be.MatMulParts(x, m, k, parts)
		be.SwiGLU(out, out, up, m*n)
	}
}

// matmulParts launches matmul_parts (see matmul.cu) and reports true, or
// reports false, having queued nothing, when the parts do not fit it:
// more than gemvMaxRows rows, more than maxMatMulParts parts, FP8 or mixed
// weight dtypes.
func (be *Backend) matmulParts(x kernels.Buffer, m, k int, parts []kernels.MatMulPart, glu bool) bool {
	if m > gemvMaxRows || len(parts) > maxMatMulParts {
		return false
	}
	xv := f32s("MatMulParts x", x, m*k)
	desc := make([]byte, matmulPartsLen)
	variant, rows := "", 0
	for i, p := range parts {
		if _, ok := p.W.(*kernels.BlockScaled); ok {
			return false
		}
		w, v := weights("MatMulParts w", p.W, p.N*k)
		if variant != "" && v != variant {
			return false
		}
		variant = v
		d := desc[i*matmulPartLen:]
		binary.LittleEndian.PutUint64(d, uint64(w.addr()))
		binary.LittleEndian.PutUint64(d[8:], uint64(f32s("MatMulParts out", p.Out, m*p.N).addr()))
		binary.LittleEndian.PutUint32(d[16:], uint32(i32(p.N)))
		binary.LittleEndian.PutUint32(d[20:], uint32(gemvVec(xv, w, k)))
		rows += p.N
	}
	count := len(parts)
	if glu {
		count, rows = 1, parts[0].N
	}
	binary.LittleEndian.PutUint32(desc[maxMatMulParts*matmulPartLen:], uint32(count))
	if glu {
		binary.LittleEndian.PutUint32(desc[maxMatMulParts*matmulPartLen+4:], 1)
	}
	if m == 0 || rows == 0 {
		return true
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	grid := dim3{(rows + matmulWarps - 1) / matmulWarps, 1, 1}
	be.launch("matmul_parts"+variant, grid, d1(32*matmulWarps), 0, xv, desc, i32(m), i32(k))
	return true
}

// matmulSplitBF16 runs MatMul on cuBLASLt's bf16 tensor cores: x splits
// into bf16 terms stacked as [terms·m, k], one GEMM gives their partial
// products [terms·m, n] in F32, and sum_parts adds them. The products of
// the terms with the (exact) bf16 weights are exact; what the terms leave
// of x is below 2^-18·|x| with two terms and 2^-27·|x| with three. Two
// suffice when k >= 64: 2^-18 = 64u (u = 2^-24) is then within the k·u of
// the F32 accumulation itself. It reports false (having queued nothing)
// when cuBLASLt has no algorithm for the shape.
func (be *Backend) matmulSplitBF16(out, x, w *buffer, m, n, k int) bool {
	terms := splitTerms(k)
	plan, err := be.blas.plan(terms*m, n, k, w.addr())
	if err != nil {
		be.fail(err)
		return true
	}
	if plan == nil {
		return false
	}
	xsBytes := (terms*m*k*2 + 255) &^ 255
	tmp, err := be.scratchPtr(xsBytes + terms*m*n*4)
	if err != nil {
		be.fail(err)
		return true
	}
	xs, parts := tmp, tmp+devPtr(xsBytes)
	be.launch("split_bf16", be.gridFor(m*k, 256), d1(256), 0, xs, x, int64(m*k), i32(terms))
	if err := be.blas.matmul(plan, w.addr(), xs, parts); err != nil {
		be.fail(fmt.Errorf("cuda: MatMul m=%d n=%d k=%d on cuBLASLt: %w", m, n, k, err))
		return true
	}
	be.launch("sum_parts", be.gridFor(m*n, 256), d1(256), 0, out, parts, int64(m*n), i32(terms))
	return true
}

// splitTerms is how many bf16 terms an F32 activation splits into for a
// product over k (see matmulSplitBF16).
func splitTerms(k int) int {
	if k >= 64 {
		return 2
	}
	return 3
}

// matmulFP8 runs MatMul on block-scaled FP8 weights (matmul_fp8.cu): the
// warp-per-row kernel for decode-sized m, bf16 tensor cores on split
// activations for verify blocks and prefill.
func (be *Backend) matmulFP8(out, x *buffer, w *kernels.BlockScaled, m, n, k int) {
	if w.Rows != n || w.Cols != k {
		panic(fmt.Sprintf("cuda: MatMul n=%d k=%d on an FP8 weight [%d, %d]", n, k, w.Rows, w.Cols))
	}
	q := typed("MatMul fp8 values", w.Q, n*k, kernels.F8E4M3)
	br, bc := kernels.ScaleBlocks(n, k)
	scale := f32s("MatMul fp8 scales", w.Scale, br*bc)
	if m == 0 || n == 0 {
		return
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if m > gemvMaxRows {
		const tile = 64 // FP8_MMA_ROWS and FP8_MMA_COLS in matmul_fp8.cu
		grid := dim3{(n + tile - 1) / tile, (m + tile - 1) / tile, 1}
		be.launch("matmul_fp8_mma", grid, d1(128), 0, out, x, q, scale, i32(m), i32(n), i32(k), i32(splitTerms(k)))
		return
	}
	vec := int32(0)
	if k%16 == 0 && q.addr()%16 == 0 && x.addr()%16 == 0 {
		vec = 1
	}
	grid := dim3{(n + matmulWarps - 1) / matmulWarps, 1, 1}
	be.launch("matmul_fp8", grid, d1(32*matmulWarps), 0, out, x, q, scale, i32(m), i32(n), i32(k), vec)
}
