package cpu

import "ddflash/kernels"

// kernelSet holds the inner loops that a SIMD build replaces: MatMul's
// loops over one tile of weight rows, and the activations (a scalar exp
// costs about as much as a whole verify block's matmul work per element).
// The portable set is always available and always tested.
type kernelSet struct {
	name string
	// rows4 sets out[i*outStride+r] = x_i·w_r for the m rows x_i of x [m,k]
	// and the four float32 rows w_r of tile [4,k].
	rows4 func(out []float32, outStride int, x []float32, m, k int, tile []float32)
	// rows4BF16 is rows4 for one x row and bfloat16 weights, widened on the
	// fly (decode streams each weight once, so widening into a buffer first
	// would cost a second pass).
	rows4BF16 func(out []float32, x []float32, k int, tile []uint16)
	// widen converts BF16 or F16 weights to float32.
	widen func(dst []float32, src []uint16, dt kernels.DType)
	// swiglu sets out[i] = silu(gate[i])·up[i]; out may alias gate or up.
	swiglu func(out, gate, up []float32)
	// silu sets x[i] = silu(x[i]).
	silu func(x []float32)
	// mulSigmoid sets x[i] *= sigmoid(gate[i]).
	mulSigmoid func(x, gate []float32)
	// deltaStep applies one token to one head's GDN state (see deltaStepPortable).
	deltaStep func(S, q, k, v []float32, g, beta float32, out, delta []float32)
	// attend computes one query head's softmax attention over the given
	// cache slots (see attendHead).
	attend func(out, q, kc, vc []float32, slots []int, scores []float32, kvDim, kvOff int, scale float32)
}

var portableKernels = kernelSet{
	name:       "portable",
	rows4:      rows4Portable,
	rows4BF16:  rows4BF16Portable,
	widen:      widenInto,
	swiglu:     swigluPortable,
	silu:       siluPortable,
	mulSigmoid: mulSigmoidPortable,
	deltaStep:  deltaStepPortable,
	attend:     attendHead,
}

func swigluPortable(out, gate, up []float32) {
	gate, up = gate[:len(out)], up[:len(out)]
	for i := range out {
		out[i] = silu(gate[i]) * up[i]
	}
}

func siluPortable(x []float32) {
	for i, v := range x {
		x[i] = silu(v)
	}
}

func mulSigmoidPortable(x, gate []float32) {
	gate = gate[:len(x)]
	for i := range x {
		x[i] *= sigmoid(gate[i])
	}
}
