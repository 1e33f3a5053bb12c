//go:build !(goexperiment.simd && amd64)

package rowmath

// simdRows reports that this build has no SIMD row kernels.
func simdRows() (rowKernels, bool) { return rowKernels{}, false }
