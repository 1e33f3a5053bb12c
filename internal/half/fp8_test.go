package half

import (
	"math"
	"math/rand/v2"
	"testing"
)

// e4m3Value decodes an E4M3 byte in float64 from the definition: bias 7,
// subnormals at exponent 0, NaN at S.1111.111, no infinities.
func e4m3Value(b uint8) float64 {
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	exp, mant := int(b>>3)&0xf, float64(b&7)
	switch {
	case b&0x7f == 0x7f:
		return math.NaN()
	case exp == 0:
		return sign * mant / 8 * math.Pow(2, -6)
	}
	return sign * (1 + mant/8) * math.Pow(2, float64(exp-7))
}

func TestE4M3DecodingMatchesDefinition(t *testing.T) {
	for b := range 256 {
		want := e4m3Value(uint8(b))
		got := float64(E4M3ToFloat32(uint8(b)))
		if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("E4M3 %#02x: got %g, want %g", b, got, want)
		}
		if !math.IsNaN(want) {
			if viaHalf := float64(F16ToFloat32(E4M3ToF16(uint8(b)))) * 256; viaHalf != want {
				t.Fatalf("E4M3 %#02x through half: got %g, want %g", b, viaHalf, want)
			}
		}
	}
}

func TestE4M3EncodingRoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	values := []float32{0, 1, -2, 0.1, 448, 449, 464, 1e6, -1e6, 1.0 / 512, 1.0 / 1024, 3.0 / 1024, 1.0 / 64, 1 + 1.0/16, 1 + 3.0/16}
	for range 20000 {
		values = append(values, math.Float32frombits(rng.Uint32()), float32(rng.NormFloat64()*100))
	}
	for _, x := range values {
		b := Float32ToE4M3(x)
		got := e4m3Value(b)
		if math.IsNaN(float64(x)) {
			if !math.IsNaN(got) {
				t.Fatalf("E4M3(NaN) = %#02x, not NaN", b)
			}
			continue
		}
		if math.IsNaN(got) {
			t.Fatalf("E4M3(%g) = NaN", x)
		}
		if math.Abs(float64(x)) >= E4M3Max {
			if math.Abs(got) != E4M3Max || math.Signbit(got) != math.Signbit(float64(x)) {
				t.Fatalf("E4M3(%g) = %g, want saturation at ±448", x, got)
			}
			continue
		}
		errGot := math.Abs(float64(x) - got)
		for _, n := range []uint8{b - 1, b + 1} {
			v := e4m3Value(n)
			if math.IsNaN(v) || math.Signbit(v) != math.Signbit(got) || n&0x80 != b&0x80 {
				continue
			}
			errN := math.Abs(float64(x) - v)
			if errN < errGot || (errN == errGot && n&1 == 0) {
				t.Fatalf("E4M3(%g) = %#02x (%g), but %#02x (%g) is nearer or the even tie", x, b, got, n, v)
			}
		}
	}
}
