package cpu

import "ddflash/kernels"

// kernelSet holds the inner loops that a SIMD build replaces: MatMul's
// loops over tiles of weight rows, attention's softmax and value sums, the
// GDN and conv steps, and the activations (a scalar exp costs about as
// much as a whole verify block's matmul work per element).
// The portable set is always available and always tested.
type kernelSet struct {
	name string
	// rows4 sets out[i*outStride+j] = x_i·w_j for the m rows x_i of x [m,k]
	// and the float32 rows w_j of w, whole tiles of four. Each output is a
	// fixed function of its x row and weight row, whatever m is (the SIMD
	// kernel: one 16-lane FMA chain over k, then one fixed tree over the lanes).
	// next, when not nil, is the BF16 weights the caller reads after these:
	// the SIMD kernel prefetches them while it runs.
	rows4 func(out []float32, outStride int, x []float32, m, k int, w []float32, next []uint16)
	// rows4BF16 is rows4 for bfloat16 weight rows, widened in registers as
	// they are loaded (widening is exact: the outputs equal rows4's on the
	// widened rows, bit for bit).
	rows4BF16 func(out []float32, outStride int, x []float32, m, k int, w []uint16)
	// tileFP8 runs one tile of four FP8 weight rows (see fp8Tile).
	tileFP8 fp8Tile
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
	// accumRows adds Σ_r c[r]·b[r·stride : r·stride+len(out)] to out, over
	// r in order: the chunked GDN's products are all of this form.
	accumRows func(out, c, b []float32, stride int)
	// conv sets out[c] = Σ_j wT[j·len(out)+c]·window[j][c], summing over the
	// taps j in order.
	conv func(out []float32, window [][]float32, wT []float32)
	// scaledMax returns the largest x[j]·scale, −Inf for none (attention's
	// first pass).
	scaledMax func(x []float32, scale float32) float32
	// scaledExp sets x[j] = exp(x[j]·scale − top), each a fixed function
	// of x[j] (0 for x[j] = −Inf).
	scaledExp func(x []float32, scale, top float32)
	// mixRows adds Σ_u w[i·wStride+u]·v[u·vStride:][:vStride] to acc's row
	// i (stride accStride) and, unless sums is nil, Σ_u w[i·wStride+u] to
	// sums[i·16], for the nq rows i, over the n rows u in order: each
	// element gets accumRows' chain of FMAs (adds for the sums) whatever
	// the other rows (attention's values, the chunked GDN's state products).
	mixRows func(acc []float32, accStride int, w []float32, wStride, nq, n int, v []float32, vStride int, sums []float32)
}

var portableKernels = kernelSet{
	name:       "portable",
	rows4:      rows4Portable,
	rows4BF16:  rows4BF16Portable,
	tileFP8:    tileFP8Portable,
	widen:      widenInto,
	swiglu:     swigluPortable,
	silu:       siluPortable,
	mulSigmoid: mulSigmoidPortable,
	deltaStep:  deltaStepPortable,
	accumRows:  accumRowsPortable,
	conv:       convPortable,
	scaledMax:  scaledMaxPortable,
	scaledExp:  scaledExpPortable,
	mixRows:    mixRowsPortable,
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
