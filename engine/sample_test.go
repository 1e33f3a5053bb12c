package engine

import (
	"ddflash/internal/closeness"
	"ddflash/internal/testrand"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// referenceDistribution computes the sampling distribution the slow, obvious
// way, in float64: softmax at temperature, drop tokens under minP × the top
// probability, keep the k most likely (ties: lower id), renormalise, keep
// the smallest prefix whose mass reaches p, renormalise. -Inf logits are
// never kept.
func referenceDistribution(logits []float64, temp float64, k int, p, minP float64) map[int]float64 {
	type tp struct {
		id int
		p  float64
	}
	var items []tp
	top := math.Inf(-1)
	for _, l := range logits {
		top = math.Max(top, l)
	}
	for i, l := range logits {
		if w := math.Exp((l - top) / temp); w > 0 && w >= minP {
			items = append(items, tp{i, w})
		}
	}
	sort.SliceStable(items, func(a, b int) bool { return items[a].p > items[b].p })
	if k > 0 && k < len(items) {
		items = items[:k]
	}
	mass := 0.0
	for _, it := range items {
		mass += it.p
	}
	if p > 0 && p < 1 {
		cum := 0.0
		for i, it := range items {
			cum += it.p / mass
			if cum >= p {
				items = items[:i+1]
				break
			}
		}
	}
	total := 0.0
	for _, it := range items {
		total += it.p
	}
	out := map[int]float64{}
	for _, it := range items {
		out[it.id] = it.p / total
	}
	return out
}

// expectDistribution compares a sampler's distribution with the reference:
// the same tokens (those the reference gives at least 1e-30: float32
// weights underflow below that) with probabilities within 1e-6 relative
// plus 1e-7 per nat of log-probability (the full-row path weighs in
// float32, where the exponent's argument is rounded).
func expectDistribution(t *testing.T, got []TokenLogprob, want map[int]float64, valid int) {
	t.Helper()
	seen := map[int]bool{}
	for i, g := range got {
		if g.ID < 0 || g.ID >= int32(valid) {
			t.Fatalf("id %d outside the valid vocabulary", g.ID)
		}
		if i > 0 && g.Logprob > got[i-1].Logprob+1e-6 {
			t.Fatalf("distribution not sorted at %d", i)
		}
		w, ok := want[int(g.ID)]
		if d := math.Abs(math.Exp(g.Logprob) - w); !ok || !(d <= w*(1e-6+1e-7*math.Abs(math.Log(w)))+1e-30) {
			t.Fatalf("p(%d) = %.15f, want %.15f (kept by the reference: %v)", g.ID, math.Exp(g.Logprob), w, ok)
		}
		seen[int(g.ID)] = true
	}
	for id, w := range want {
		if w >= 1e-30 && !seen[id] {
			t.Fatalf("token %d (p = %g) not kept", id, w)
		}
	}
}

func TestSamplerDistributionMatchesReference(t *testing.T) {
	logits := []float32{1.5, -0.3, 2.2, 0.7, 2.2, -4, 0.1, 9 /* padding row */}
	valid := 7
	cases := []struct {
		name string
		temp float64
		k    int
		p    float64
		minP float64
	}{
		{"plain", 1, 0, 1, 0},
		{"hot", 2.5, 0, 0, 0},
		{"cold", 0.3, 0, 1, 0},
		{"topk", 1, 3, 1, 0},
		{"topp", 1, 0, 0.7, 0},
		{"both", 0.8, 4, 0.9, 0},
		{"k1", 1, 1, 1, 0},
		{"minp", 1, 0, 1, 0.2},
		{"minp-cold", 0.5, 0, 0.95, 0.05},
	}
	ref64 := make([]float64, valid)
	for i := range ref64 {
		ref64[i] = float64(logits[i])
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewSampler(SamplingParams{Temperature: c.temp, TopK: c.k, TopP: c.p, MinP: c.minP}, valid)
			expectDistribution(t, s.Distribution(logits), referenceDistribution(ref64, c.temp, c.k, c.p, c.minP), valid)
		})
	}
}

// TestSamplerSelectionMatchesReference covers rows long enough for the
// quickselect of top-p to partition, with many tied logits (ties go to the
// lower id), masked (-Inf) entries and every combination of the filters.
func TestSamplerSelectionMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n, valid = 3000, 2990
	for trial := range 40 {
		logits := make([]float32, n)
		ref := make([]float64, valid)
		for i := range logits {
			logits[i] = float32(math.Round(rng.NormFloat64()*12) / 4) // many ties
			if rng.IntN(50) == 0 {
				logits[i] = float32(math.Inf(-1))
			}
			if i < valid {
				ref[i] = float64(logits[i])
			}
		}
		p := SamplingParams{
			Temperature: []float64{0.3, 0.7, 1, 1.6}[trial%4],
			TopK:        []int{0, 0, 1, 20, 700, n}[trial%6],
			TopP:        []float64{0, 0.5, 0.9, 0.99, 1}[trial%5],
			MinP:        []float64{0, 0, 0.001, 0.1}[trial/10],
		}
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			got := NewSampler(p, valid).Distribution(logits)
			expectDistribution(t, got, referenceDistribution(ref, p.Temperature, p.TopK, p.TopP, p.MinP), valid)
		})
	}
}

// TestSamplerLargeNucleusMatchesReference covers top-p over rows long
// enough that the nucleus exceeds topPBoundary (the tokens above the
// bracket drawn from the dense weights), in the short pass too: flat
// (T = 2), peaked (T = 1) and a temperature so high that the first
// histogram puts the whole row in one bucket. The distribution is checked
// against the float64 reference, then 2,000 draws by chi-square.
func TestSamplerLargeNucleusMatchesReference(t *testing.T) {
	logits := testrand.LanguageModelRow(rand.New(rand.NewPCG(7, 8)), 30000)
	for _, p := range []SamplingParams{
		{Temperature: 2, TopP: 0.9},
		{Temperature: 1, TopP: 0.95},
		{Temperature: 1000, TopP: 0.6},
	} {
		p.Seed = 9
		expectSamplerMatchesReference(t, p, logits, 2000)
	}
}

// expectSamplerMatchesReference checks a sampler's distribution over
// logits against the float64 reference, then draws samples from it and
// tests the counts by chi-square at the 0.1% level.
func expectSamplerMatchesReference(t *testing.T, p SamplingParams, logits []float32, samples int) {
	t.Helper()
	ref := make([]float64, len(logits))
	for i, l := range logits {
		ref[i] = float64(l)
	}
	want := referenceDistribution(ref, p.Temperature, p.TopK, p.TopP, p.MinP)
	s := NewSampler(p, len(logits))
	expectDistribution(t, s.Distribution(logits), want, len(logits))
	counts := map[int]int{}
	for range samples {
		counts[int(mustSample(t, s, logits))]++
	}
	chi, df, crit := chiSquare(want, counts, samples)
	if chi > crit {
		t.Errorf("%+v: chi-square %.1f with %d dof exceeds the 0.1%% critical value %.1f", p, chi, df, crit)
	}
	t.Logf("%+v: %d kept, chi-square %.1f with %d dof (critical %.1f)", p, len(want), chi, df, crit)
}

// TestSamplerFullVocabularyChiSquare draws from a 248,320-token row (the
// real vocabulary) plain, with top-p, min-p and top-k, and tests the counts against the
// float64 reference with a chi-square goodness-of-fit test at the 0.1%
// level (fixed seed; rare outcomes pooled), after checking the sampler's
// probabilities themselves against the reference.
func TestSamplerFullVocabularyChiSquare(t *testing.T) {
	if testing.Short() {
		// 21,000 draws over the whole vocabulary: seconds of CPU with either
		// kernel set, whose every kernel kernels/rowmath tests against
		// float64 in each build; TestSamplerLargeNucleusMatchesReference
		// covers the large-nucleus path in the short pass.
		t.Skip("-short: 21,000 draws over the whole vocabulary run in the full pass")
	}
	logits := testrand.LanguageModelRow(rand.New(rand.NewPCG(11, 12)), 248320)
	for _, p := range []SamplingParams{
		{Temperature: 1},
		{Temperature: 1, TopP: 0.95},
		{Temperature: 2, TopP: 0.9}, // a flat nucleus: the top-p bound is found by the finer pass
		{Temperature: 1, TopP: 0.95, MinP: 0.02},
		{Temperature: 0.8, TopK: 50, MinP: 0.1},
		{Temperature: 1.3, MinP: 0.001},
	} {
		p.Seed = 3
		expectSamplerMatchesReference(t, p, logits, 3000)
	}
}

// chiSquare is Pearson's statistic of counts against exact probabilities,
// with outcomes expected fewer than 5 times pooled; it fails on an outcome
// the distribution never produces by returning +Inf.
func chiSquare[K comparable](exact map[K]float64, counts map[K]int, samples int) (chi float64, df int, crit float64) {
	df = -1
	pooledExp, pooledObs := 0.0, 0
	for k, prob := range exact {
		exp := prob * float64(samples)
		if exp < 5 {
			pooledExp += exp
			pooledObs += counts[k]
			continue
		}
		d := float64(counts[k]) - exp
		chi += d * d / exp
		df++
	}
	if pooledExp > 0 {
		d := float64(pooledObs) - pooledExp
		chi += d * d / pooledExp
		df++
	}
	for k := range counts {
		if _, ok := exact[k]; !ok {
			return math.Inf(1), df, chiSquareCritical(max(df, 1))
		}
	}
	return chi, df, chiSquareCritical(max(df, 1))
}

func TestSamplerDrawFrequencies(t *testing.T) {
	logits := []float32{0.2, 1.0, -0.5, 0.6}
	s := NewSampler(SamplingParams{Temperature: 1, Seed: 7}, len(logits))
	dist := s.Distribution(logits)
	const n = 200000
	counts := map[int32]int{}
	for i := 0; i < n; i++ {
		counts[mustSample(t, s, logits)]++
	}
	// Pearson chi-square with 3 degrees of freedom: 16.27 is the 0.1% critical value.
	chi := 0.0
	for _, d := range dist {
		exp := n * math.Exp(d.Logprob)
		diff := float64(counts[d.ID]) - exp
		chi += diff * diff / exp
	}
	if chi > 16.27 {
		t.Fatalf("chi-square %.2f over the 0.1%% critical value 16.27: counts %v, dist %v", chi, counts, dist)
	}
}

func TestSamplerSeedDeterminism(t *testing.T) {
	logits := []float32{0.1, 0.3, 0.2, 0.25, 0.15}
	draw := func(seed uint64) []int32 {
		s := NewSampler(SamplingParams{Temperature: 1, Seed: seed}, len(logits))
		var out []int32
		for i := 0; i < 64; i++ {
			out = append(out, mustSample(t, s, logits))
		}
		return out
	}
	a, b, c := draw(42), draw(42), draw(43)
	same := func(x, y []int32) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Fatal("same seed gave different tokens")
	}
	if same(a, c) {
		t.Fatal("different seeds gave the same 64 tokens")
	}
}

// TestSamplerSpecialValues pins down non-finite logits: NaN counts as -Inf
// (never drawn, the rest sampled as if it were absent), a +Inf logit is a
// certainty (the first one, as greedy), a temperature whose inverse
// overflows float32 is greedy, and log-probabilities stay NaN-free.
func TestSamplerSpecialValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	withNaN := []float32{nan, 0.5, nan, 1.5, -1, nan, 0.2}
	ref := []float64{math.Inf(-1), 0.5, math.Inf(-1), 1.5, -1, math.Inf(-1), 0.2}
	for _, p := range []SamplingParams{{Temperature: 1}, {Temperature: 0.7, TopP: 0.8}, {Temperature: 1, TopK: 2}, {Temperature: 1, MinP: 0.3}} {
		expectDistribution(t, NewSampler(p, len(withNaN)).Distribution(withNaN), referenceDistribution(ref, p.Temperature, p.TopK, p.TopP, p.MinP), len(withNaN))
	}
	if got := mustSample(t, NewSampler(SamplingParams{}, len(withNaN)), withNaN); got != 3 {
		t.Fatalf("greedy over NaN picked %d, want 3", got)
	}
	withInf := []float32{1, inf, 3, inf}
	for _, p := range []SamplingParams{{}, {Temperature: 1}, {Temperature: 1, TopP: 0.5, MinP: 0.1}, {Temperature: 1e-40}} {
		if got := mustSample(t, NewSampler(p, len(withInf)), withInf); got != 1 {
			t.Fatalf("%+v: picked %d, want 1 (the first +Inf)", p, got)
		}
	}
	if got := mustSample(t, NewSampler(SamplingParams{Temperature: 1e-40}, 3), []float32{1, 3, 2}); got != 1 {
		t.Fatalf("temperature 1e-40 picked %d, want the argmax 1", got)
	}
	lp := NewSampler(SamplingParams{}, len(withInf)).Logprobs(withInf, 1, 3)
	if lp.Logprob != 0 || len(lp.Top) != 3 || lp.Top[0] != (TokenLogprob{1, 0}) || lp.Top[1] != (TokenLogprob{3, 0}) || !math.IsInf(lp.Top[2].Logprob, -1) {
		t.Fatalf("logprobs with +Inf logits: %+v", lp)
	}
	if _, err := NewSampler(SamplingParams{Temperature: 1}, 3).Sample([]float32{nan, nan, float32(math.Inf(-1))}); err != ErrNoToken {
		t.Fatalf("a row of NaN and -Inf: error %v, want ErrNoToken", err)
	}
}

func TestGreedyIgnoresPaddingAndBreaksTiesLow(t *testing.T) {
	s := NewSampler(SamplingParams{}, 4)
	if got := mustSample(t, s, []float32{1, 3, 3, 2, 100}); got != 1 {
		t.Fatalf("greedy picked %d, want 1 (first of the tied maxima, padding excluded)", got)
	}
}

func TestLogprobs(t *testing.T) {
	logits := []float32{1, 2, 3, 50}
	s := NewSampler(SamplingParams{}, 3)
	lp := s.Logprobs(logits, 1, 2)
	z := math.Log(math.Exp(1) + math.Exp(2) + math.Exp(3))
	if !closeness.Near(lp.Logprob, 2-z, 1e-6) {
		t.Fatalf("chosen logprob %g, want %g", lp.Logprob, 2-z)
	}
	if len(lp.Top) != 2 || lp.Top[0].ID != 2 || lp.Top[1].ID != 1 {
		t.Fatalf("top = %+v, want ids 2 then 1", lp.Top)
	}
}

func TestSamplingParamsValidate(t *testing.T) {
	bad := []SamplingParams{
		{Temperature: -1}, {Temperature: math.NaN()}, {TopK: -2}, {TopP: 1.5}, {Logprobs: 21},
	}
	for _, p := range bad {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if err := (SamplingParams{Temperature: 0.7, TopK: 5, TopP: 0.9, Logprobs: 3}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func mustSample(t testing.TB, s *Sampler, logits []float32) int32 {
	t.Helper()
	tok, err := s.Sample(logits)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
