//go:build cuda

package cuda_test

import (
	"sync"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cuda"
)

var (
	gpuOnce    sync.Once
	gpuBackend kernels.Backend
	gpuErr     error
)

func gpu(t *testing.T) kernels.Backend {
	t.Helper()
	gpuOnce.Do(func() { gpuBackend, gpuErr = cuda.New(0) })
	if gpuErr != nil {
		t.Fatalf("CUDA backend: %v", gpuErr)
	}
	return gpuBackend
}

// TestModelLogits compares whole-model logits of the tiny and small presets and
// their -h256 siblings,
// in bf16 and FP8, with the CPU backend's, on the GPU.
func TestModelLogits(t *testing.T) {
	for _, preset := range []string{"tiny", "small", "tiny-h256", "small-h256"} {
		for _, dtype := range []string{"bf16", "fp8"} {
			t.Run(preset+"-"+dtype, func(t *testing.T) { checkModelLogits(t, gpu(t), preset, dtype) })
		}
	}
}

// TestSpecGeneration compares greedy DFlash and DDTree decoding with the
// CPU backend's, on the GPU.
func TestSpecGeneration(t *testing.T) { checkSpecGeneration(t, gpu(t)) }

// TestDraftLogits compares a drafter in the published Qwen3.6-27B layout
// with the CPU backend's, round by round, on the GPU.
func TestDraftLogits(t *testing.T) { checkDraftLogits(t, gpu(t)) }

// TestSpecLosslessBF16State: with a BF16 recurrent state, greedy DFlash and
// DDTree decoding equal autoregressive decoding on the GPU.
func TestSpecLosslessBF16State(t *testing.T) { checkSpecLosslessBF16State(t, gpu(t)) }
