//go:build !(goexperiment.simd && amd64)

package cpu

// simdKernels reports that this build has no SIMD kernels (build with
// GOEXPERIMENT=simd on amd64 for the AVX-512 and AVX2 ones).
func simdKernels() []kernelSet { return nil }
