//go:build cgo

package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"fmt"
	"log"
)

// cudaDataType values (library_types.h).
const cudaR16BF = 14

// ltWorkspace is the cuBLASLt workspace: NVIDIA recommends 32 MiB on Hopper.
const ltWorkspace = 32 << 20

// blas is a cuBLASLt handle with its workspace and the plans (layouts and
// algorithm) of the matmul shapes seen so far.
type blas struct {
	be        *Backend
	handle    C.cublasLtHandle_t
	workspace allocation
	plans     map[[4]int]C.ddLtPlan // by (m, n, k, alignment of A); nil: no algorithm
	misses    []string              // the shapes cuBLASLt had no algorithm for, as logged
}

// newBlas opens cuBLASLt, or says why it cannot: MatMul then runs its own
// kernel for every size.
func newBlas(be *Backend) (*blas, error) {
	var msg [512]C.char
	libMu.Lock()
	r := C.dd_lt_open(&msg[0], C.size_t(len(msg)))
	libMu.Unlock()
	if r != 0 {
		return nil, fmt.Errorf("%s", C.GoString(&msg[0]))
	}
	b := &blas{be: be, plans: map[[4]int]C.ddLtPlan{}}
	if err := ltError("cublasLtCreate", C.dd_lt_create(be.ctx, &b.handle)); err != nil {
		return nil, err
	}
	var p C.CUdeviceptr
	be.counts.Allocs++
	if err := check("cuMemAlloc for the cuBLASLt workspace", C.dd_mem_alloc(be.ctx, &p, ltWorkspace)); err != nil {
		C.dd_lt_destroy(be.ctx, b.handle)
		return nil, err
	}
	b.workspace = allocation{p, ltWorkspace}
	return b, nil
}

func (b *blas) close() {
	for _, p := range b.plans {
		C.dd_lt_plan_free(p)
	}
	b.workspace.free(b.be)
	C.dd_lt_destroy(b.be.ctx, b.handle)
}

func ltError(op string, s C.cublasStatus_t) error {
	if s == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s", op, C.GoString(C.dd_lt_status_name(s)))
}

// plan returns the plan for D[m rows, n] = B[m, k]·A[n, k]ᵀ with bf16 A
// (at address a) and B, or nil when cuBLASLt has no algorithm for it.
// cuBLASLt assumes 256-byte aligned matrices unless told otherwise, so the
// plan depends on A's alignment (B and D are scratch, 256-byte aligned).
func (b *blas) plan(m, n, k int, a devPtr) (C.ddLtPlan, error) {
	align := 256
	for a%devPtr(align) != 0 {
		align /= 2
	}
	key := [4]int{m, n, k, align}
	if p, ok := b.plans[key]; ok {
		return p, nil
	}
	var p C.ddLtPlan
	var found C.int
	s := C.dd_lt_plan(b.be.ctx, b.handle, cudaR16BF, cudaR16BF, C.uint64_t(m), C.uint64_t(n), C.uint64_t(k),
		C.uint32_t(align), ltWorkspace, &p, &found)
	if err := ltError("cublasLtMatmulAlgoGetHeuristic", s); err != nil {
		return nil, err
	}
	b.plans[key] = p // nil when not found
	if p == nil {
		// Logged once per shape (plans are cached): the fallback kernel is
		// correct but slower, and a miss must never pass unseen.
		miss := fmt.Sprintf("m=%d n=%d k=%d, A aligned to %d bytes", m, n, k, align)
		b.misses = append(b.misses, miss)
		log.Printf("cuda: cuBLASLt has no algorithm for the bf16 GEMM %s: MatMul runs its own kernel for it", miss)
	}
	return p, nil
}

// version is cuBLASLt's, as major.minor.patch.
func (b *blas) version() string {
	v := int(C.dd_lt_version())
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
}

// matmul queues the planned GEMM: d (F32) from the weights a and activations x.
func (b *blas) matmul(p C.ddLtPlan, a, x, d devPtr) error {
	if !b.be.capturing {
		b.be.counts.Launches++
	}
	s := C.dd_lt_matmul(b.be.ctx, b.handle, p, C.CUdeviceptr(a), C.CUdeviceptr(x), C.CUdeviceptr(d),
		b.workspace.ptr, ltWorkspace, b.be.stream)
	return ltError("cublasLtMatmul", s)
}
