package cpu

import (
	"math"
	"testing"

	"ddflash/internal/testrand"
)

// TestActivations checks every kernel set's silu, swiglu and mulSigmoid
// against float64 over the whole useful range, the exp clamp points and
// NaN (which must propagate). Bound: 8u relative, plus 1e-30 absolute
// where e^-x overflows float32 and the result flushes to zero.
func TestActivations(t *testing.T) {
	sets := kernelVariants()
	rng := testrand.Seeded(t, 2)
	x := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-30, 88.5, -88.5, 89.5, -89.5, 103.9, -103.9, 104.5, -104.5, 300, -300, float32(math.NaN())}
	for len(x) < 1000 {
		x = append(x, float32(rng.Float64()*220-110))
	}
	up := make([]float32, len(x))
	for i := range up {
		up[i] = float32(rng.NormFloat64())
	}
	sigmoid64 := func(v float32) float64 { return 1 / (1 + math.Exp(-float64(v))) }
	for _, set := range sets {
		check := func(op string, got []float32, want func(i int) float64) {
			t.Helper()
			for i, g := range got {
				w := want(i)
				if math.IsNaN(w) != math.IsNaN(float64(g)) || math.Abs(float64(g)-w) > 8*math.Abs(w)/(1<<24)+1e-30 {
					t.Errorf("%s %s(x=%g) = %g, want %g", set.name, op, x[i], g, w)
				}
			}
		}
		silu := append([]float32(nil), x...)
		set.silu(silu)
		check("silu", silu, func(i int) float64 { return float64(x[i]) * sigmoid64(x[i]) })

		swiglu := make([]float32, len(x))
		set.swiglu(swiglu, x, up)
		check("swiglu", swiglu, func(i int) float64 { return float64(x[i]) * sigmoid64(x[i]) * float64(up[i]) })

		gated := append([]float32(nil), up...)
		set.mulSigmoid(gated, x)
		check("mulSigmoid", gated, func(i int) float64 { return float64(up[i]) * sigmoid64(x[i]) })
	}
}
