//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"simd/archsimd"
	"unsafe"

	"ddflash/kernels/rowmath"
)

// scaledMaxAVX512 is scaledMaxPortable on 16-lane vectors (a max is exact,
// so the lanes' order does not matter); the tail lanes are padded with −Inf.
func scaledMaxAVX512(x []float32, scale float32) float32 {
	s, m := splat(scale), splat(float32(math.Inf(-1)))
	j := 0
	for ; j+16 <= len(x); j += 16 {
		m = m.Max(archsimd.LoadFloat32x16Slice(x[j:]).Mul(s))
	}
	if j < len(x) {
		var buf [16]float32
		for l := range buf {
			buf[l] = float32(math.Inf(-1))
		}
		copy(buf[:], x[j:])
		m = m.Max(archsimd.LoadFloat32x16(&buf).Mul(s))
	}
	var lanes [16]float32
	m.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	top := lanes[0]
	for _, v := range lanes[1:] {
		top = max(top, v)
	}
	return top
}

// scaledExpAVX512 is scaledExpPortable on 16-lane vectors (rowmath.Exp16: each
// lane a fixed function of its input), with −Inf inputs set to 0.
func scaledExpAVX512(x []float32, scale, top float32) {
	s, t, none := splat(scale), splat(top), splat(float32(math.Inf(-1)))
	for j := 0; j < len(x); j += 16 {
		n := min(16, len(x)-j)
		v := loadN(x[j:], n)
		storeN(rowmath.Exp16(v.Mul(s).Sub(t)).Masked(v.Greater(none)), x[j:], n)
	}
	archsimd.ClearAVXUpperBits()
}

// mixRowsAVX512 is mixRowsPortable with the rows in threes and the value
// lanes in panels of 128 (mix3x128, all 24 accumulators in registers: each
// value vector loaded feeds three FMAs, each weight broadcast eight); the
// lanes past the last panel, and the rows past the last three, go through
// accumRowsAVX512. Every element gets the same FMA chain either way, and
// every sum the same adds.
func mixRowsAVX512(acc []float32, accStride int, w []float32, wStride, nq, n int, v []float32, vStride int, sums []float32) {
	if n == 0 {
		return
	}
	panels := vStride / 128
	i := 0
	for ; panels > 0 && i+3 <= nq; i += 3 {
		_, _ = acc[(i+2)*accStride+vStride-1], w[(i+2)*wStride+n-1]
		_ = v[(n-1)*vStride+vStride-1]
		for p := range panels {
			var s unsafe.Pointer // the first panel also sums the weights
			if p == 0 && sums != nil {
				_ = sums[(i+2)*attnSumStride]
				s = unsafe.Pointer(&sums[i*attnSumStride])
			}
			mix3x128(unsafe.Pointer(&acc[i*accStride+p*128]), accStride, unsafe.Pointer(&w[i*wStride]), wStride, unsafe.Pointer(&v[p*128]), vStride, n, s)
		}
		if rest := panels * 128; rest < vStride {
			for r := i; r < i+3; r++ {
				accumRowsAVX512(acc[r*accStride+rest:r*accStride+vStride], w[r*wStride:r*wStride+n], v[rest:], vStride)
			}
		}
	}
	for ; i < nq; i++ {
		wi := w[i*wStride : i*wStride+n]
		accumRowsAVX512(acc[i*accStride:i*accStride+vStride], wi, v, vStride)
		addWeights(sums, i, wi)
	}
}

// mix3x128 adds Σ_u w_r[u]·v_u[0:128] to the 128 floats at acc + r·accStride
// for the three weight rows w_r (w + r·wStride floats) over the n value
// rows v_u (v + u·vStride floats), in order, and, when sums is not nil,
// Σ_u w_r[u] to the float at sums + 16·r (dot_amd64.s).
//
//go:noescape
func mix3x128(acc unsafe.Pointer, accStride int, w unsafe.Pointer, wStride int, v unsafe.Pointer, vStride, n int, sums unsafe.Pointer)
