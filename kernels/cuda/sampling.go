//go:build cgo

package cuda

import (
	"fmt"

	"ddflash/kernels"
)

// topkThreads is TOPK_THREADS in sampling.cu.
const topkThreads = 256

// LogSoftmax replaces each row by its log-probabilities.
func (be *Backend) LogSoftmax(x kernels.Buffer, rows, n int) {
	xv := f32s("LogSoftmax x", x, rows*n)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("log_softmax", d1(rows), rowThreads(n, 1024), 0, xv, i32(n))
}

// TopK writes each row's k largest values in descending order (ties: lower
// index first) and their indices.
func (be *Backend) TopK(vals, idx, x kernels.Buffer, rows, n, k int) {
	if k > n {
		panic(fmt.Sprintf("cuda: TopK k=%d exceeds the row length %d", k, n))
	}
	xv := f32s("TopK x", x, rows*n)
	vv, iv := f32s("TopK vals", vals, rows*k), i32s("TopK idx", idx, rows*k)
	if k == 0 {
		return
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("topk", d1(rows), d1(topkThreads), 0, vv, iv, xv, i32(n), i32(k))
}

// TopKLSE reduces each of rows rows of x, ld elements apart, of which the
// first n are scored, to out [rows, 2k+1] (F32): the k largest values in
// descending order (ties: lower index first), their indices as floats, and
// the row's log-sum-exp.
func (be *Backend) TopKLSE(out, x kernels.Buffer, rows, n, ld, k int) {
	if k < 1 || k > n || n > ld || n > 1<<24 {
		panic(fmt.Sprintf("cuda: TopKLSE k=%d of n=%d columns (ld %d): need 1 <= k <= n <= ld and n <= 2^24", k, n, ld))
	}
	if rows == 0 {
		return
	}
	xv, ov := f32s("TopKLSE x", x, (rows-1)*ld+n), f32s("TopKLSE out", out, rows*(2*k+1))
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("topk_lse", d1(rows), d1(topkThreads), 0, ov, xv, i32(n), int64(ld), i32(k))
}
