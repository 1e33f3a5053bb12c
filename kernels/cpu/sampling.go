package cpu

import "math"

// hostKernels are the kernels the host-side helpers below use: the SIMD set
// when the build and the CPU have it.
var hostKernels = func() kernelSet {
	if kern, ok := simdKernels(); ok {
		return kern
	}
	return portableKernels
}()

// ExpWeights sets w[i] = exp((x[i] − top)·scale) and returns Σ w[i] summed
// in float64: a sampler's softmax weights (top the row's maximum, scale the
// inverse temperature; -Inf weighs 0). The AVX-512 kernel uses the
// attention softmax's exp (Cephes' expf, within a few float32 ulps); the
// portable one rounds float64 exponentials to float32.
func ExpWeights(w, x []float32, top, scale float32) float64 {
	return hostKernels.expWeights(w[:len(x)], x, top, scale)
}

func expWeightsPortable(w, x []float32, top, scale float32) float64 {
	total := 0.0
	for i, v := range x {
		w[i] = float32(math.Exp(float64((v - top) * scale)))
		total += float64(w[i])
	}
	return total
}
