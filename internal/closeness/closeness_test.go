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
		relInf    bool // RelNorm is +Inf: a norm of infinite values means nothing
	}{
		{"equal", []float64{1, 2}, []float64{1, 2}, 0, false},
		{"close", []float64{1, 2.5}, []float64{1, 2}, 0.5, false},
		{"NaN got", []float64{nan, 2}, []float64{1, 2}, inf, true},
		{"NaN want", []float64{1, 2}, []float64{1, nan}, inf, true},
		{"NaN both", []float64{nan}, []float64{nan}, inf, true},
		{"Inf got", []float64{1, inf}, []float64{1, 2}, inf, true},
		{"Inf against -Inf", []float64{-inf}, []float64{inf}, inf, true},
		{"masked in both", []float64{1, -inf}, []float64{1.5, -inf}, 0.5, true},
		{"lengths", []float64{1}, []float64{1, 2}, inf, true},
	}
	for _, c := range cases {
		if d := MaxAbsDiff(c.got, c.want); d != c.diff {
			t.Errorf("%s: MaxAbsDiff = %g, want %g", c.name, d, c.diff)
		}
		if r := RelNorm(c.got, c.want); c.relInf != (r == inf) {
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
