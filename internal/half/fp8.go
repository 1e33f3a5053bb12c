package half

import "math"

// E4M3Max is the largest finite float8 E4M3 value (the "fn" variant: no
// infinities, one NaN pattern per sign, 0x7f and 0xff).
const E4M3Max = 448

// E4M3ToF16 maps an E4M3 byte to the half-precision pattern whose value is
// the E4M3 value times 2^-8: sign to bit 15, exponent and mantissa under it.
// Half's exponent is one bit wider with bias 15 (E4M3's is 7), so every E4M3
// value, subnormals included, is exactly 2^8 times its image; kernels widen
// with the hardware half converter and fold 2^8 into the block scale. The
// NaN patterns map to ±480·2^-8 (checkpoints hold no NaNs).
func E4M3ToF16(b uint8) uint16 { return uint16(b&0x80)<<8 | uint16(b&0x7f)<<7 }

// E4M3ToFloat32 widens a float8 E4M3 value; 0x7f and 0xff are NaN.
func E4M3ToFloat32(b uint8) float32 {
	if b&0x7f == 0x7f {
		return float32(math.NaN())
	}
	return F16ToFloat32(E4M3ToF16(b)) * 256
}

// Float32ToE4M3 rounds to the nearest E4M3 value, ties to even, saturating
// at ±448 (the convention of FP8 checkpoints); NaN becomes 0x7f.
func Float32ToE4M3(f float32) uint8 {
	bits := math.Float32bits(f)
	sign := uint8(bits>>24) & 0x80
	abs := math.Float32frombits(bits & 0x7fffffff)
	switch {
	case abs != abs:
		return 0x7f
	case abs >= E4M3Max:
		return sign | 0x7e
	case abs < 1.0/64: // below the smallest normal (2^-6): subnormal unit 2^-9
		return sign | uint8(math.RoundToEven(float64(abs)*512))
	}
	// Normal: round the float32 mantissa to 3 bits; a carry into the
	// exponent is the right result, and 448 is not exceeded (abs < 448).
	e := int(bits>>23&0xff) - 127 + 7
	m := bits & 0x7fffff
	q := uint32(e)<<3 | m>>20
	rest := m & 0xfffff
	if rest > 0x80000 || (rest == 0x80000 && q&1 == 1) {
		q++
	}
	return sign | uint8(q)
}
