//go:build cuda

package cuda

import (
	"sync"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/kerneltest"
)

// These tests need an NVIDIA GPU: go test -tags cuda ./kernels/cuda
// (scripts/gpu-check.sh runs them with the step-time benchmark).

var (
	gpuOnce    sync.Once
	gpuBackend *Backend
	gpuErr     error
)

// gpu returns the GPU backend, opened once for the whole test binary (each
// open JIT-compiles the kernels).
func gpu(t testing.TB) *Backend {
	t.Helper()
	gpuOnce.Do(func() { gpuBackend, gpuErr = open(0) })
	if gpuErr != nil {
		t.Fatalf("CUDA backend: %v", gpuErr)
	}
	return gpuBackend
}

// TestConformance runs the backend-agnostic op suite on the GPU.
func TestConformance(t *testing.T) {
	be := gpu(t)
	t.Log(be.Name())
	kerneltest.Run(t, func() kernels.Backend { return be })
}

// TestMatMulAgainstCPU compares both MatMul paths with the CPU backend at a
// model width.
func TestMatMulAgainstCPU(t *testing.T) { checkMatMul(t, gpu(t), 1000, 5120) }

// TestGraphReplay captures a few ops and replays them on new inputs.
func TestGraphReplay(t *testing.T) { checkGraphReplay(t, gpu(t)) }

// TestKernelResources prints every kernel's registers, local memory, shared
// memory and occupancy on this GPU, with cuBLASLt's version and heuristic
// misses; after the tests above on the same backend, the occupancy is at
// the block sizes their launches used.
func TestKernelResources(t *testing.T) { checkKernelResources(t, gpu(t)) }
