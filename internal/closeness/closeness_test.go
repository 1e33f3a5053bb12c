package closeness

import (
	"math"
	"testing"
)

func TestGarbageIsInfinitelyFar(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		name      string
		got, want []float64
		diff      float64
	}{
		{"equal", []float64{1, 2}, []float64{1, 2}, 0},
		{"close", []float64{1, 2.5}, []float64{1, 2}, 0.5},
		{"NaN got", []float64{nan, 2}, []float64{1, 2}, inf},
		{"NaN want", []float64{1, 2}, []float64{1, nan}, inf},
		{"Inf got", []float64{1, inf}, []float64{1, 2}, inf},
		{"Inf both", []float64{inf}, []float64{inf}, inf},
		{"lengths", []float64{1}, []float64{1, 2}, inf},
	}
	for _, c := range cases {
		if d := MaxAbsDiff(c.got, c.want); d != c.diff {
			t.Errorf("%s: MaxAbsDiff = %g, want %g", c.name, d, c.diff)
		}
		if r := RelNorm(c.got, c.want); (c.diff == inf) != (r == inf) {
			t.Errorf("%s: RelNorm = %g", c.name, r)
		}
	}
	if s := Scale([]float32{float32(nan), -3, 2}); s != 3 {
		t.Errorf("Scale ignores NaN: got %g, want 3", s)
	}
	if s := Scale([]float64{0.5}); s != 1 {
		t.Errorf("Scale floor: got %g, want 1", s)
	}
	if Near(nan, nan, 1) || Near(1, nan, 1) || !Near(1, 1.5, 0.5) {
		t.Error("Near must be false on NaN and true within tol")
	}
}
