// Package emulator builds the CPU emulation of the CUDA driver and
// cuBLASLt (kernels/cuda/emu/driver.cc), so that tests can run the CUDA
// backend, its host code and its kernels compiled as C++, without a GPU:
// point DDFLASH_LIBCUDA and DDFLASH_LIBCUBLASLT at the library Build
// returns before the backend opens.
package emulator

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Build compiles the emulation with the named kernels (every kernel of the
// embedded PTX: cuda.KernelNames) into dir and returns the library's path.
// It looks for driver.cc from the working directory up to the module root,
// as `go test` runs a package's tests in its source directory.
//
// The flags: -O2 with the build machine's instruction set, so that the
// kernels' fmaf is one instruction rather than a libm call (10× faster at
// Qwen3.6-27B's shapes); -ffp-contract=off, so that the compiler fuses no
// multiply-add the kernels do not ask for and the arithmetic stays the
// kernels' own.
func Build(dir string, kernels []string) (string, error) {
	src, err := driverSource()
	if err != nil {
		return "", err
	}
	table := make([]string, len(kernels))
	for i, name := range kernels {
		table[i] = "K(" + name + ")\n"
	}
	slices.Sort(table)
	if err := os.WriteFile(filepath.Join(dir, "table.inc"), []byte(strings.Join(table, "")), 0o644); err != nil {
		return "", err
	}
	cxx := "clang++-16"
	if _, err := exec.LookPath(cxx); err != nil {
		cxx = "c++"
	}
	lib := filepath.Join(dir, "libcuda-emu.so")
	cmd := exec.Command(cxx, "-std=c++17", "-O2", "-march=native", "-ffp-contract=off", "-w", "-shared", "-fPIC",
		"-DDDFLASH_EMU", "-I", dir, "-o", lib, src)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the CUDA emulation with %s: %v\n%s", cxx, err, out)
	}
	return lib, nil
}

// driverSource finds kernels/cuda/emu/driver.cc in the module that holds
// the working directory.
func driverSource() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "kernels", "cuda", "emu", "driver.cc"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory: cannot find the CUDA emulation's source")
		}
		dir = parent
	}
}
