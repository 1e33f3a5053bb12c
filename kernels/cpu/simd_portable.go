//go:build !(goexperiment.simd && amd64)

package cpu

// simdMatMul reports that this build has no SIMD kernels (build with
// GOEXPERIMENT=simd on amd64 for the AVX-512 ones).
func simdMatMul() (matmulKernels, bool) { return matmulKernels{}, false }
