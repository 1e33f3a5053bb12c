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

// TestLayerStep compares the step-time benchmark's step (one attention and
// one GDN layer with their MLPs at Qwen3.6-27B's shapes, random weights,
// 4096 cached tokens in an F32 KV cache) with the CPU backend, with bf16
// and FP8 block-scaled linear layers, for decode and tree verifies of 9 and
// 17 rows (bf16: the gemv kernel, then cuBLASLt; FP8: the warp-per-row,
// then the tiled kernel).
func TestLayerStep(t *testing.T) {
	checkLayerStep(t, gpu(t), []layerStepCase{
		{"qwen36", qwen36, kernels.BF16, 4096, []int{1, 9, 17}},
		{"qwen36-fp8", qwen36, kernels.F8E4M3, 4096, []int{1, 9, 17}},
	})
}

// TestKernelResources prints every kernel's registers, local memory, shared
// memory and occupancy on this GPU, with cuBLASLt's version and heuristic
// misses; after the tests above on the same backend, the occupancy is at
// the block sizes their launches used.
func TestKernelResources(t *testing.T) { checkKernelResources(t, gpu(t)) }

// TestAttentionLong runs the tiled attention kernels (F32 and BF16 caches,
// the latter on tensor cores) at Qwen3.6-27B's heads
// (24 sharing 4 KV heads, head dim 256) over 32K cached keys against the
// CPU backend: a decode row (split keys and merge), a 17-row DDTree-16
// verify, and the two with a windowed row in one launch.
func TestAttentionLong(t *testing.T) {
	be := gpu(t)
	const keys = 32 << 10
	for _, seqs := range [][]longAttnSeq{
		{{rows: 1, prefix: keys - 1}},
		{{rows: len(tree16), prefix: keys - len(tree16), parents: tree16}},
		{{rows: len(tree16), prefix: keys - len(tree16), parents: tree16}, {rows: 1, prefix: keys / 2}, {rows: 1, prefix: keys - 1, window: 4096}},
	} {
		for _, cache := range []kernels.DType{kernels.F32, kernels.BF16} {
			n := checkLongAttention(t, be, qwen36Attn, cache, seqs)
			t.Logf("%v cache, %d sequences, %d rows: %d key splits on %d SMs", cache, len(seqs), seqs[0].rows, n, be.sms)
		}
	}
}

// TestGDNChunkedModel runs chunked GDN prefill at Qwen3.6-27B's widths (16
// key heads, 48 value heads, 128 × 128) over 1024 tokens (16 chunks of 64)
// against the CPU backend.
func TestGDNChunkedModel(t *testing.T) {
	checkGDNChunked(t, gpu(t), qwen36.gdn, 1024)
}
