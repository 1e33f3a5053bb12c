package rowmath

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/internal/testrand"
)

// rowVariants are the row kernels this build can run: portable always,
// AVX-512 when the build and the CPU have it.
func rowVariants() []rowKernels {
	variants := []rowKernels{portableRows}
	if simd, ok := simdRows(); ok {
		variants = append(variants, simd)
	}
	return variants
}

// rowLengths cross the vector width, the sum blocks and SearchCumulative's chunks.
var rowLengths = []int{0, 1, 15, 16, 17, 255, 256, 257, 1000, 4099, 64*sumBlock + 33}

var negInf, posInf, nan = float32(math.Inf(-1)), float32(math.Inf(1)), float32(math.NaN())

// specialRow is a row of logits with ties, -Inf and NaN sprinkled in (and
// +Inf when withPosInf).
func specialRow(rng *rand.Rand, n int, withPosInf bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 6)
		switch rng.IntN(20) {
		case 0:
			x[i] = negInf
		case 1:
			x[i] = nan
		case 2:
			x[i] = float32(rng.IntN(3)) + 20 // ties at the top
		case 3:
			if withPosInf {
				x[i] = posInf
			}
		}
	}
	return x
}

// refMaxIndex is the definition: the first index of the largest non-NaN value.
func refMaxIndex(x []float32) int {
	best := -1
	for i, v := range x {
		if !math.IsNaN(float64(v)) && (best < 0 || v > x[best]) {
			best = i
		}
	}
	return best
}

// TestMaxAndNextAtLeast checks the maximum (ties: the lowest index) and the
// first entry at or above a bound against scalar definitions, NaN being
// neither, on rows with ties, ±Inf and NaN, and on all-NaN rows.
func TestMaxAndNextAtLeast(t *testing.T) {
	rng := testrand.Seeded(t, 21)
	for _, rows := range rowVariants() {
		for _, n := range rowLengths {
			for _, x := range [][]float32{specialRow(rng, n, false), specialRow(rng, n, true), constRow(n, nan), constRow(n, negInf)} {
				want := refMaxIndex(x)
				wantTop := negInf
				if want >= 0 {
					wantTop = x[want]
				}
				if got := rows.maxValue(x); got != wantTop {
					t.Fatalf("%s n=%d: max %g, want %g", rows.name, n, got, wantTop)
				}
				saved := hostRows
				hostRows = rows
				got := MaxIndex(x)
				hostRows = saved
				if got != want {
					t.Fatalf("%s n=%d: MaxIndex %d, want %d", rows.name, n, got, want)
				}
				for _, bound := range []float32{negInf, -3, 0, 5, 20, 21, posInf} {
					from := rng.IntN(n + 1)
					want := from
					for want < n && !(x[want] >= bound) {
						want++
					}
					if got := from + rows.nextAtLeast(x[from:], bound); got != want {
						t.Fatalf("%s n=%d: first ≥ %g from %d at %d, want %d", rows.name, n, bound, from, got, want)
					}
				}
			}
		}
	}
}

func constRow(n int, v float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = v
	}
	return x
}

// TestExpWeights checks every variant's softmax weights against float64
// exp: within 8 float32 ulps (relative) for arguments from minWeightArg
// up, the portable ones within one ulp (expWeight's promise), exactly 0
// below it and for -Inf and NaN; the sum within 1e-6
// (relative) of the float64 sum of the same weights, with and without the
// weights written.
func TestExpWeights(t *testing.T) {
	rng := testrand.Seeded(t, 10)
	for _, rows := range rowVariants() {
		for _, n := range rowLengths {
			for _, temp := range []float32{0.05, 0.7, 1, 3} {
				x := specialRow(rng, n, false)
				top := maxValuePortable(x)
				scale := 1 / temp
				w := make([]float32, n)
				got := rows.expWeights(w, x, top, scale)
				want := 0.0
				for i, v := range x {
					d := (v - top) * scale
					e := math.Exp(float64(d))
					if !(d >= minWeightArg) {
						e = 0
					}
					if !(math.Abs(float64(w[i])-e) <= 8*e/(1<<24)) {
						t.Fatalf("%s n=%d: w[%d] = exp((%g−%g)·%g) = %g, want %g", rows.name, n, i, v, top, scale, w[i], e)
					}
					if ulp := float64(math.Nextafter32(w[i], posInf) - w[i]); rows.name == portableRows.name && !(math.Abs(float64(w[i])-e) <= ulp) {
						t.Fatalf("portable n=%d: w[%d] = exp((%g−%g)·%g) = %g, want %g within one ulp", n, i, v, top, scale, w[i], e)
					}
					want += e
				}
				if !(math.Abs(got-want) <= 1e-6*want) {
					t.Fatalf("%s n=%d T=%g: sum %g, want %g", rows.name, n, temp, got, want)
				}
				if sum := rows.expWeights(nil, x, top, scale); sum != got {
					t.Fatalf("%s n=%d: sum without weights %g, with %g", rows.name, n, sum, got)
				}
			}
		}
	}
}

// TestAppendBetweenAndKeepAtLeast checks AppendBetween against the list of
// the entries at or above a bound (and of those in a window below it, or
// above it), NaN never among them and −0 equal to 0, and KeepAtLeast
// against the weights it must keep.
func TestAppendBetweenAndKeepAtLeast(t *testing.T) {
	rng := testrand.Seeded(t, 11)
	negZero := float32(math.Copysign(0, -1))
	for _, rows := range rowVariants() {
		for _, n := range rowLengths {
			x := specialRow(rng, n, true)
			for i := 0; i < n; i += 5 {
				x[i] = []float32{0, negZero}[rng.IntN(2)]
			}
			w := make([]float32, n)
			for i := range w {
				w[i] = float32(rng.Float64())
			}
			for _, bound := range []float32{negInf, -4, negZero, 0, 7, 20, posInf} {
				var ids []int32
				for i, v := range x {
					if v >= bound && v != posInf { // a +Inf bound excludes +Inf
						ids = append(ids, int32(i))
					}
				}
				prefix := []int32{-1, -2, -3}[:rng.IntN(4)] // appending keeps what dst holds
				if got := rows.appendBetween(slices.Clone(prefix), x, bound, posInf); !slices.Equal(got, append(prefix, ids...)) {
					t.Fatalf("%s n=%d: indices at or above %g: %v, want %v", rows.name, n, bound, got, append(prefix, ids...))
				}
				var between []int32
				for i, v := range x {
					if v >= bound-3 && v < bound {
						between = append(between, int32(i))
					}
				}
				if got := rows.appendBetween(nil, x, bound-3, bound); !slices.Equal(got, between) {
					t.Fatalf("%s n=%d: indices in [%g, %g): %v, want %v", rows.name, n, bound-3, bound, got, between)
				}
				between = between[:0]
				for i, v := range x {
					if v >= bound && v < bound+2 {
						between = append(between, int32(i))
					}
				}
				if got := rows.appendBetween(nil, x, bound, bound+2); !slices.Equal(got, between) {
					t.Fatalf("%s n=%d: indices in [%g, %g): %v, want %v", rows.name, n, bound, bound+2, got, between)
				}
				kept := slices.Clone(w)
				rows.keepAtLeast(kept, x, bound)
				for i, v := range x {
					want := w[i]
					if !(v >= bound) {
						want = 0
					}
					if kept[i] != want {
						t.Fatalf("%s n=%d: weight %d (logit %g) kept at or above %g: %g of %g", rows.name, n, i, v, bound, kept[i], w[i])
					}
				}
			}
		}
	}
}

// TestSearchCumulative checks the inverse cumulative weight against a
// float64 prefix sum: the returned index's prefix passes u and the one
// before does not, up to the rounding of the block sums; past the total
// it is len(w). Runs of zero weights are never picked.
func TestSearchCumulative(t *testing.T) {
	rng := testrand.Seeded(t, 12)
	for _, rows := range rowVariants() {
		saved := hostRows
		hostRows = rows
		for _, n := range rowLengths[1:] {
			w := make([]float32, n)
			for i := range w {
				if rng.IntN(3) > 0 {
					w[i] = float32(rng.ExpFloat64())
				}
			}
			prefix := make([]float64, n+1)
			for i, v := range w {
				prefix[i+1] = prefix[i] + float64(v)
			}
			total, slack := prefix[n], 1e-6*prefix[n]
			draws := 200
			if total == 0 { // nothing to draw: only the past-the-total case
				draws = 0
			}
			for range draws {
				u := rng.Float64() * total
				i := SearchCumulative(w, u)
				if i == n || w[i] == 0 || prefix[i+1] <= u-slack || prefix[i] > u+slack {
					t.Fatalf("%s n=%d: u=%g of %g picks %d", rows.name, n, u, total, i)
				}
			}
			if i := SearchCumulative(w, total*(1+1e-6)); i != n {
				t.Fatalf("%s n=%d: past the total picks %d, want %d", rows.name, n, i, n)
			}
		}
		hostRows = saved
	}
}

// BenchmarkRowKernels times each row kernel over a row of the real
// vocabulary (248,320 logits), per variant.
func BenchmarkRowKernels(b *testing.B) {
	const V = 248320
	rng := rand.New(rand.NewPCG(1, 2))
	x, w := make([]float32, V), make([]float32, V)
	for i := range x {
		x[i] = float32(1.5 * rng.NormFloat64())
	}
	top := maxValuePortable(x)
	ids := make([]int32, 0, V)
	var hist Histogram
	for _, rows := range rowVariants() {
		for _, k := range []struct {
			name string
			run  func()
		}{
			{"max", func() { rows.maxValue(x) }},
			{"nextAtLeast", func() { rows.nextAtLeast(x, top) }},
			{"expWeights", func() { rows.expWeights(w, x, top, 1) }},
			{"massHistogram", func() { rows.massHistogram(&hist, w, x, NewBuckets(top-88, top+1)) }},
			{"appendBetween", func() { rows.appendBetween(ids[:0], x, top-5, posInf) }},
			{"blockSums", func() {
				var sums [64]float64
				for lo := 0; lo < V; lo += 64 * sumBlock {
					chunk := w[lo:min(lo+64*sumBlock, V)]
					rows.blockSums(sums[:(len(chunk)+sumBlock-1)/sumBlock], chunk)
				}
			}},
		} {
			b.Run(rows.name+"/"+k.name, func(b *testing.B) {
				for b.Loop() {
					k.run()
				}
			})
		}
	}
}
