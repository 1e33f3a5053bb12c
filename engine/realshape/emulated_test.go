//go:build cgo

package realshape

import (
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cuda"
	"ddflash/kernels/cuda/emulator"
)

// The CUDA backend, host code and kernels, on the CPU emulation of the
// driver and cuBLASLt (kernels/cuda/emulator): the golden forward at
// Qwen3.6-27B's shapes through every kernel the engine's forward launches.
func init() {
	backends = append(backends, backend{"cuda-emulation", openEmulatedCUDA})
}

func openEmulatedCUDA(t *testing.T) kernels.Backend {
	lib, err := emulator.Build(t.TempDir(), cuda.KernelNames())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DDFLASH_LIBCUDA", lib)
	t.Setenv("DDFLASH_LIBCUBLASLT", lib)
	be, err := cuda.New(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.(interface{ Close() }).Close)
	return be
}
