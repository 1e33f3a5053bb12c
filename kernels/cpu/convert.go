package cpu

import (
	"math"

	"ddflash/kernels"
)

// bf16ToF32 widens a bfloat16 bit pattern: its bits are the top half of a float32.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// f16ToF32 widens an IEEE half-precision bit pattern, subnormals, infinities and NaN included.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp != 0: // normal: rebias 15 → 127
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: mant · 2^-24.
	v := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// widenInto converts BF16 or F16 bit patterns to float32.
func widenInto(dst []float32, src []uint16, dt kernels.DType) {
	src = src[:len(dst)]
	if dt == kernels.BF16 {
		for i, h := range src {
			dst[i] = bf16ToF32(h)
		}
		return
	}
	for i, h := range src {
		dst[i] = f16ToF32(h)
	}
}
