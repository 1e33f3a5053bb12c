// Package half converts between float32 and the 16-bit float formats of
// model weights: bfloat16 and IEEE 754 half precision.
package half

import "math"

// BF16ToFloat32 widens a bfloat16 (the top half of a float32).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds to the nearest bfloat16, ties to even; NaN stays NaN.
func Float32ToBF16(f float32) uint16 {
	bits := math.Float32bits(f)
	if f != f {
		return uint16(bits>>16) | 0x40 // keep it a quiet NaN
	}
	bits += 0x7fff + (bits>>16)&1
	return uint16(bits >> 16)
}

// F16ToFloat32 widens an IEEE 754 half-precision value.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: value = mant · 2^-24, exact in float32.
	v := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// Float32ToF16 rounds to the nearest half-precision value, ties to even,
// overflowing to ±Inf.
func Float32ToF16(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	abs := bits & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00
	case abs >= 0x477ff000: // rounds to at least 65520: Inf
		return sign | 0x7c00
	case abs < 0x38800000: // below the smallest normal half (2^-14): subnormal or zero
		// Scale so the half's subnormal unit 2^-24 becomes 1, then round to even.
		v := float64(math.Float32frombits(abs)) * (1 << 24)
		return sign | uint16(math.RoundToEven(v))
	}
	// Normal: rebias the exponent and round the 23-bit mantissa to 10 bits.
	h := (abs - (127-15)<<23) >> 13
	rest := abs & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}
