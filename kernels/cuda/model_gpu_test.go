//go:build cuda

package cuda_test

import (
	"fmt"
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

// TestDFlash2 compares a DFlash2 drafter's logits and selector lattice
// with the CPU backend's and checks its DDTree decoding, on the GPU.
func TestDFlash2(t *testing.T) { checkDFlash2(t, gpu(t)) }

// TestMTP compares MTP-head drafts with the CPU backend's, round by round,
// and checks greedy MTP chains and trees equal autoregressive decoding, on
// the GPU.
func TestMTP(t *testing.T) { checkMTP(t, gpu(t)) }

// TestSpecLosslessBF16State: with a BF16 recurrent state, greedy DFlash and
// DDTree decoding equal autoregressive decoding on the GPU.
func TestSpecLosslessBF16State(t *testing.T) { checkSpecLosslessBF16State(t, gpu(t)) }

// TestTensorParallel connects the GPUs here (up to 8) through NCCL and runs
// the collectives on all of them (on one GPU a one-rank communicator, which
// still checks the binding against the real libnccl.so.2), then tensor
// parallelism at each degree of 2, 4 and 8 the GPUs allow against the CPU
// backend.
func TestTensorParallel(t *testing.T) {
	gpus := []kernels.Backend{gpu(t)}
	for i := len(gpus); i < 8; i++ {
		be, err := cuda.New(i)
		if err != nil {
			t.Logf("GPU %d: %v", i, err)
			break
		}
		gpus = append(gpus, be)
	}
	t.Run("Comm", func(t *testing.T) { checkNCCLComm(t, gpus) })
	for _, tp := range []int{2, 4, 8} {
		if tp > len(gpus) {
			t.Logf("TP %d needs %d GPUs, %d here: not checked", tp, tp, len(gpus))
			continue
		}
		t.Run(fmt.Sprintf("tp%d", tp), func(t *testing.T) { checkTensorParallel(t, gpus[:tp]) })
	}
}
