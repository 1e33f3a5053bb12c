package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExpWeights checks every kernel set's softmax weights against float64:
// rows of several lengths (vector tails and whole blocks) and -Inf entries,
// which must weigh exactly 0. Bound: 8u relative per weight on the float32
// argument, and the sum within 1e-6 relative of the float64 sum.
func TestExpWeights(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, set := range kernelVariants() {
		for _, n := range []int{1, 15, 16, 17, 256, 1000, 4099} {
			x := make([]float32, n)
			top := float32(math.Inf(-1))
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 6)
				if rng.IntN(10) == 0 {
					x[i] = float32(math.Inf(-1))
				}
				top = max(top, x[i])
			}
			const scale = 1 / 0.7
			w := make([]float32, n)
			got := set.expWeights(w, x, top, scale)
			want := 0.0
			for i, v := range x {
				e := math.Exp(float64((v - top) * scale))
				want += e
				if math.Abs(float64(w[i])-e) > 8*e/(1<<24) || (e == 0 && w[i] != 0) {
					t.Fatalf("%s n=%d: w[%d] = exp((%g−%g)·%g) = %g, want %g", set.name, n, i, v, top, scale, w[i], e)
				}
			}
			if !(math.Abs(got-want) <= 1e-6*want) {
				t.Fatalf("%s n=%d: sum %g, want %g", set.name, n, got, want)
			}
		}
	}
}
