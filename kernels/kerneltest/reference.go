package kerneltest

import (
	"math"
)

// Float64 references, written as plain loops from the documented formulas.

// roundBF16 rounds v to bfloat16 (round to nearest, ties to even) and
// returns the bit pattern and its exact value.
func roundBF16(v float32) (uint16, float64) {
	bits := math.Float32bits(v)
	bits += 0x7fff + (bits>>16)&1
	h := uint16(bits >> 16)
	return h, float64(math.Float32frombits(uint32(h) << 16))
}

// roundF16 rounds v to IEEE half precision (nearest, ties to even; |v| must
// stay below 65504) and returns the bit pattern and its exact value.
func roundF16(v float32) (uint16, float64) {
	x := math.Abs(float64(v))
	var sign uint16
	if math.Signbit(float64(v)) {
		sign = 0x8000
	}
	// The spacing of halves near x: 2^(e-11) for x in [2^(e-1), 2^e), at least 2^-24.
	_, e := math.Frexp(x)
	quantum := math.Ldexp(1, max(e-11, -24))
	q := math.RoundToEven(x/quantum) * quantum
	if q == 0 {
		return sign, math.Copysign(0, float64(v))
	}
	var bits uint16
	if q < math.Ldexp(1, -14) { // subnormal: q = mant·2^-24
		bits = uint16(q / math.Ldexp(1, -24))
	} else {
		frac, exp := math.Frexp(q) // q = frac·2^exp, frac in [0.5, 1)
		mant := uint16((frac*2 - 1) * 1024)
		bits = uint16(exp-1+15)<<10 | mant
	}
	if sign != 0 {
		q = -q
	}
	return sign | bits, q
}

func silu64(x float64) float64    { return x / (1 + math.Exp(-x)) }
func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// softplus64 is torch's softplus with threshold 20.
func softplus64(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log(1 + math.Exp(x))
}

// refRMS returns 1/sqrt(mean(x²)+eps).
func refRMS(x []float32, eps float64) float64 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	return 1 / math.Sqrt(ss/float64(len(x))+eps)
}

// gdnState is one value head's recurrent state S [kd][vd] in float64.
type gdnState [][]float64

func newGDNState(kd, vd int, from []float32) gdnState {
	s := make(gdnState, kd)
	for i := range s {
		s[i] = make([]float64, vd)
		for j := range s[i] {
			s[i][j] = float64(from[i*vd+j])
		}
	}
	return s
}

// step applies one token: S = exp(g)·S; u = Sᵀk; S += k ⊗ beta·(v−u); returns Sᵀq.
func (s gdnState) step(q, k, v []float32, g, beta float32) []float64 {
	decay := math.Exp(float64(g))
	for i := range s {
		for j := range s[i] {
			s[i][j] *= decay
		}
	}
	vd := len(v)
	delta := make([]float64, vd)
	for j := range vd {
		var u float64
		for i := range s {
			u += s[i][j] * float64(k[i])
		}
		delta[j] = float64(beta) * (float64(v[j]) - u)
	}
	for i := range s {
		for j := range vd {
			s[i][j] += float64(k[i]) * delta[j]
		}
	}
	out := make([]float64, vd)
	for j := range vd {
		for i := range s {
			out[j] += s[i][j] * float64(q[i])
		}
	}
	return out
}

// roundToBF16 rounds every element to bfloat16, as a BF16 state stores it.
func (s gdnState) roundToBF16() {
	for _, row := range s {
		for j, v := range row {
			_, row[j] = roundBF16(float32(v))
		}
	}
}

// flat returns S row-major.
func (s gdnState) flat() []float64 {
	var out []float64
	for _, row := range s {
		out = append(out, row...)
	}
	return out
}
