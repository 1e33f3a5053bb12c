package half

import (
	"math"
	"math/rand/v2"
	"testing"
)

// binaryValue decodes a 16-bit IEEE-style float with expBits exponent bits
// in float64, from the definition.
func binaryValue(h uint16, expBits int) float64 {
	mantBits := 15 - expBits
	bias := 1<<(expBits-1) - 1
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>mantBits) & (1<<expBits - 1)
	mant := float64(int(h) & (1<<mantBits - 1))
	switch exp {
	case 0: // subnormal
		return sign * mant * math.Pow(2, float64(1-bias-mantBits))
	case 1<<expBits - 1:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + mant/float64(int(1)<<mantBits)) * math.Pow(2, float64(exp-bias))
}

func halfValue(h uint16) float64 { return binaryValue(h, 5) }
func bf16Value(h uint16) float64 { return binaryValue(h, 8) }

func TestHalfDecodingMatchesDefinition(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		want := halfValue(uint16(h))
		if got := float64(F16ToFloat32(uint16(h))); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("F16 %#04x: got %g, want %g", h, got, want)
		}
		want = bf16Value(uint16(h))
		if got := float64(BF16ToFloat32(uint16(h))); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("BF16 %#04x: got %g, want %g", h, got, want)
		}
	}
}

// nearest checks that h is a correctly rounded encoding of x: no other
// finite neighbour is closer, and ties go to the even pattern.
func nearest(t *testing.T, kind string, x float32, h uint16, value func(uint16) float64) {
	t.Helper()
	got := value(h)
	if math.IsNaN(float64(x)) {
		if !math.IsNaN(got) {
			t.Fatalf("%s(NaN) = %#04x, not a NaN", kind, h)
		}
		return
	}
	if math.IsInf(got, 0) && !math.IsInf(float64(x), 0) {
		// Overflow is right only from halfway past the largest finite value.
		largest, below := math.Abs(value(h-1)), math.Abs(value(h-2))
		if math.Abs(float64(x)) < largest+(largest-below)/2 {
			t.Fatalf("%s(%g) overflowed to Inf", kind, x)
		}
		return
	}
	errGot := math.Abs(float64(x) - got)
	for _, n := range []uint16{h - 1, h + 1} {
		v := value(n)
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Signbit(v) != math.Signbit(got) {
			continue
		}
		errN := math.Abs(float64(x) - v)
		if errN < errGot || (errN == errGot && n&1 == 0 && !math.IsInf(got, 0)) {
			t.Fatalf("%s(%g) = %#04x (%g), but %#04x (%g) is nearer or the even tie", kind, x, h, got, n, v)
		}
	}
}

func TestEncodingRoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	values := []float32{0, 1, -2, 0.1, 65504, 65519, 65520, 1e-8, 5.96e-8, 3e-8, -3e-5, 1e30, float32(math.NaN()), float32(math.Inf(-1))}
	for i := 0; i < 20000; i++ {
		// Random bit patterns cover every exponent; random mid-size values cover typical weights.
		values = append(values, math.Float32frombits(rng.Uint32()), float32(rng.NormFloat64()))
	}
	// Exact ties between adjacent halves and bfloat16s.
	values = append(values, 1+1.0/2048, 1+3.0/2048, 1+1.0/256, 1+3.0/256)
	for _, x := range values {
		nearest(t, "F16", x, Float32ToF16(x), halfValue)
		nearest(t, "BF16", x, Float32ToBF16(x), bf16Value)
	}
}
