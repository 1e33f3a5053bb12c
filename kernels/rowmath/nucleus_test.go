package rowmath

import (
	"cmp"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/internal/testrand"
)

// bucketRanges are [lo, hi) pairs: wide and narrow, across zero, a few
// ulps wide, and the widest finite one.
func bucketRanges(rng *rand.Rand) [][2]float32 {
	r := [][2]float32{{-88, 20}, {-3, -1}, {0, 1}, {-1e-3, 2e-3}, {-math.MaxFloat32, math.MaxFloat32}, {7, math.Nextafter32(math.Nextafter32(7, 8), 8)}}
	for range 20 {
		lo := float32(rng.NormFloat64() * 20)
		r = append(r, [2]float32{lo, lo + float32(rng.ExpFloat64()*math.Pow(10, float64(rng.IntN(8)-4)))})
	}
	return r
}

// inRange draws a value in [lo, hi): uniform, or an edge's neighbour.
func inRange(rng *rand.Rand, lo, hi float32, b Buckets) float32 {
	var v float32
	switch rng.IntN(3) {
	case 0:
		v = float32(float64(lo) + rng.Float64()*(float64(hi)-float64(lo)))
	case 1:
		v = b.Edge(rng.IntN(HistogramBuckets+1) - 1)
	default:
		v = math.Nextafter32(b.Edge(rng.IntN(HistogramBuckets+1)-1), negInf)
	}
	return min(max(v, lo), math.Nextafter32(hi, negInf))
}

// TestBuckets checks that a logit's bucket is its exact one,
// ⌊(hi − v)·4096/(hi − lo)⌋ in exact arithmetic, or next to it; that a
// lower logit never has a lower bucket; and that Edge(k) is the lowest
// logit with a bucket at most k: its bucket is, the float below it (if
// in range) has a higher one.
func TestBuckets(t *testing.T) {
	rng := testrand.Seeded(t, 30)
	for _, r := range bucketRanges(rng) {
		lo, hi := r[0], r[1]
		b := NewBuckets(lo, hi)
		if b.Edge(-1) != hi || b.Edge(HistogramBuckets-1) != lo {
			t.Fatalf("[%g, %g): edges of the ends %g, %g", lo, hi, b.Edge(-1), b.Edge(HistogramBuckets-1))
		}
		width := new(big.Float).Sub(big.NewFloat(float64(hi)), big.NewFloat(float64(lo)))
		var values []float32
		for range 2000 {
			values = append(values, inRange(rng, lo, hi, b))
		}
		slices.Sort(values)
		for i, v := range values {
			exact := new(big.Float).Sub(big.NewFloat(float64(hi)), big.NewFloat(float64(v)))
			exact.Mul(exact, big.NewFloat(HistogramBuckets)).Quo(exact, width)
			want, _ := exact.Int64()
			want = min(want, HistogramBuckets-1)
			got := b.of(v)
			if got < int(want)-1 || got > int(want)+1 {
				t.Fatalf("[%g, %g): bucket of %g is %d, exactly %d", lo, hi, v, got, want)
			}
			if i > 0 && got > b.of(values[i-1]) {
				t.Fatalf("[%g, %g): %g in bucket %d below %g's %d", lo, hi, v, got, values[i-1], b.of(values[i-1]))
			}
		}
		for range 200 {
			k := rng.IntN(HistogramBuckets)
			e := b.Edge(k)
			if !(e >= lo && e <= hi) || (e < hi && b.of(e) > k) {
				t.Fatalf("[%g, %g): edge %d at %g (bucket %d)", lo, hi, k, e, b.of(e))
			}
			if below := math.Nextafter32(e, negInf); e > lo && b.of(below) <= k {
				t.Fatalf("[%g, %g): edge %d at %g, but %g below it is in bucket %d", lo, hi, k, e, below, b.of(below))
			}
		}
	}
}

// TestMassHistogram checks every variant's histogram against the
// definition, entry by entry with Buckets.of in index order (so the sums
// are equal exactly): NaN, ±Inf and entries outside [lo, hi) in no bucket.
func TestMassHistogram(t *testing.T) {
	rng := testrand.Seeded(t, 31)
	var got, want Histogram
	for _, rows := range rowVariants() {
		for _, n := range rowLengths {
			x := specialRow(rng, n, true)
			w := make([]float32, n)
			for i := range w {
				w[i] = float32(rng.Float64())
			}
			for _, r := range [][2]float32{{-30, 23}, {-2, 3}, {20, 21}, {-math.MaxFloat32, math.MaxFloat32}} {
				b := NewBuckets(r[0], r[1])
				want = Histogram{}
				for i, v := range x {
					if v >= r[0] && v < r[1] {
						want.Mass[b.of(v)] += float64(w[i])
						want.Count[b.of(v)]++
					}
				}
				rows.massHistogram(&got, w, x, b)
				if got != want {
					for k := range want.Mass {
						if got.Mass[k] != want.Mass[k] || got.Count[k] != want.Count[k] {
							t.Fatalf("%s n=%d [%g, %g): bucket %d holds %g over %d, want %g over %d", rows.name, n, r[0], r[1], k, got.Mass[k], got.Count[k], want.Mass[k], want.Count[k])
						}
					}
				}
			}
		}
	}
}

// histogramCounts is what MassHistogram calls did: how many, and how many
// entries they put into buckets (the scalar adds; the other entries cost
// a compare).
type histogramCounts struct{ passes, binned int }

// countHistograms makes every MassHistogram call count into the result,
// until the test ends.
func countHistograms(t *testing.T) *histogramCounts {
	saved := hostRows
	t.Cleanup(func() { hostRows = saved })
	counts := new(histogramCounts)
	hostRows.massHistogram = func(h *Histogram, w, x []float32, b Buckets) {
		saved.massHistogram(h, w, x, b)
		counts.passes++
		for _, c := range h.Count {
			counts.binned += int(c)
		}
	}
	return counts
}

// TestFindNucleus checks the bracket against the definition of top-p's cut
// (the entries sorted best first, ties by lower index, their weights added
// in float64 until they reach target): the cut entry lies in [Lo, Hi), and
// Mass, Count and Between are those of the entries at or above Hi and in
// [Lo, Hi). At most maxBetween lie in the bracket unless they all share
// one logit. On rows of the real vocabulary shaped like a language
// model's, flat (T = 2, p = 0.9: a nucleus of about 170,000) or peaked,
// one pass over the row finds it, and where the nucleus is small (peaked)
// that pass bins only the entries whose weight can matter (at T = 1,
// p = 0.95 a tenth of the row on average, under 0.3 in 600 random rows,
// hence the bound of a half); a temperature that
// squeezes the whole row into one bucket of the first pass takes a few
// more passes.
func TestFindNucleus(t *testing.T) {
	rng := testrand.Seeded(t, 32)
	const maxBetween = 4096
	tied := make([]float32, 20000)
	for i := range tied {
		tied[i] = float32(rng.IntN(3))
	}
	cases := []struct {
		name      string
		x         []float32
		temp      float32
		p         float64
		maxPasses int
		maxBinned float64 // of the row
	}{
		{"lm T2 p0.9", testrand.LanguageModelRow(rng, 248320), 2, 0.9, 1, 1},
		{"lm T1 p0.95", testrand.LanguageModelRow(rng, 248320), 1, 0.95, 1, 0.5},
		{"lm T0.7 p0.5", testrand.LanguageModelRow(rng, 248320), 0.7, 0.5, 1, 0.2},
		{"lm T1000 p0.6", testrand.LanguageModelRow(rng, 248320), 1000, 0.6, nucleusPasses, nucleusPasses},
		{"special T1 p0.7", specialRow(rng, 50000, false), 1, 0.7, nucleusPasses, nucleusPasses},
		{"tied T1 p0.5", tied, 1, 0.5, nucleusPasses, nucleusPasses},
	}
	var h Histogram
	for _, c := range cases {
		counts := countHistograms(t)
		top := maxValuePortable(c.x)
		w := make([]float32, len(c.x))
		total := ExpWeights(w, c.x, top, 1/c.temp)
		target := c.p * total
		n := FindNucleus(&h, w, c.x, top, 1/c.temp, total, target, maxBetween)

		var order []int
		for i, v := range c.x {
			if v > negInf { // NaN and -Inf have no weight
				order = append(order, i)
			}
		}
		slices.SortFunc(order, func(a, b int) int {
			if c.x[a] != c.x[b] {
				return -cmp.Compare(c.x[a], c.x[b])
			}
			return a - b
		})
		cut, mass := 0, 0.0
		for ; cut < len(order); cut++ {
			if mass += float64(w[order[cut]]); mass >= target {
				break
			}
		}
		if v := c.x[order[cut]]; !(v >= n.Lo && v < n.Hi) {
			t.Fatalf("%s: the cut entry's logit %g outside [%g, %g)", c.name, v, n.Lo, n.Hi)
		}
		above, count, between := 0.0, 0, 0
		var logits []float32
		for i, v := range c.x {
			switch {
			case v >= n.Hi:
				above += float64(w[i])
				count++
			case v >= n.Lo:
				between++
				logits = append(logits, v)
			}
		}
		if count != n.Count || between != n.Between || !(math.Abs(above-n.Mass) <= 1e-12*total) || !(n.Mass < target) {
			t.Fatalf("%s: %d above with weight %g and %d between, want %d with %g (below the target %g) and %d", c.name, n.Count, n.Mass, n.Between, count, above, target, between)
		}
		if slices.Min(logits) != slices.Max(logits) && n.Between > maxBetween {
			t.Fatalf("%s: %d entries between %g and %g", c.name, n.Between, n.Lo, n.Hi)
		}
		if counts.passes > c.maxPasses || float64(counts.binned) > c.maxBinned*float64(len(c.x)) {
			t.Fatalf("%s: %d passes over the row putting %d of %d entries into buckets, want at most %d and %g of the row", c.name, counts.passes, counts.binned, len(c.x), c.maxPasses, c.maxBinned)
		}
		if c.maxPasses == 1 {
			// One pass bins only the entries whose weight can matter.
			floor := float32((total - target) / float64(2*len(c.x)))
			weighty := 0
			for _, v := range w {
				if v >= floor {
					weighty++
				}
			}
			if counts.binned > weighty {
				t.Fatalf("%s: %d entries binned, but only %d weigh at least (total − target)/(2·len) = %g", c.name, counts.binned, weighty, floor)
			}
		}
		t.Logf("%s: %d passes binning %d entries, %d above the bracket, %d in it", c.name, counts.passes, counts.binned, n.Count, n.Between)
	}
}
