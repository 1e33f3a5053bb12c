package engine

import (
	"ddflash/internal/closeness"
	"math"
	"testing"
)

// referenceDistribution computes the sampling distribution the slow, obvious
// way: full softmax at temperature, keep the k most likely, renormalise, keep
// the smallest prefix whose mass reaches p, renormalise.
func referenceDistribution(logits []float64, temp float64, k int, p float64) map[int]float64 {
	type tp struct {
		id int
		p  float64
	}
	var items []tp
	sum := 0.0
	for i, l := range logits {
		w := math.Exp(l / temp)
		items = append(items, tp{i, w})
		sum += w
	}
	// selection sort by probability, ties by id: small inputs only
	for i := range items {
		for j := i + 1; j < len(items); j++ {
			if items[j].p > items[i].p {
				items[i], items[j] = items[j], items[i]
			}
		}
	}
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

func TestSamplerDistributionMatchesReference(t *testing.T) {
	logits := []float32{1.5, -0.3, 2.2, 0.7, 2.2, -4, 0.1, 9 /* padding row */}
	valid := 7
	cases := []struct {
		name string
		temp float64
		k    int
		p    float64
	}{
		{"plain", 1, 0, 1},
		{"hot", 2.5, 0, 0},
		{"cold", 0.3, 0, 1},
		{"topk", 1, 3, 1},
		{"topp", 1, 0, 0.7},
		{"both", 0.8, 4, 0.9},
		{"k1", 1, 1, 1},
	}
	ref64 := make([]float64, valid)
	for i := range ref64 {
		ref64[i] = float64(logits[i])
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewSampler(SamplingParams{Temperature: c.temp, TopK: c.k, TopP: c.p}, valid)
			got := s.Distribution(logits)
			want := referenceDistribution(ref64, c.temp, c.k, c.p)
			if len(got) != len(want) {
				t.Fatalf("kept %d tokens, want %d (%v vs %v)", len(got), len(want), got, want)
			}
			for _, g := range got {
				if g.ID >= int32(valid) {
					t.Fatalf("padding id %d kept", g.ID)
				}
				if !closeness.Near(math.Exp(g.Logprob), want[int(g.ID)], 1e-12) {
					t.Errorf("p(%d) = %.15f, want %.15f", g.ID, math.Exp(g.Logprob), want[int(g.ID)])
				}
			}
		})
	}
}

func TestSamplerDrawFrequencies(t *testing.T) {
	logits := []float32{0.2, 1.0, -0.5, 0.6}
	s := NewSampler(SamplingParams{Temperature: 1, Seed: 7}, len(logits))
	dist := s.Distribution(logits)
	const n = 200000
	counts := map[int32]int{}
	for i := 0; i < n; i++ {
		counts[s.Draw(dist)]++
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
			out = append(out, s.Sample(logits))
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

func TestGreedyIgnoresPaddingAndBreaksTiesLow(t *testing.T) {
	s := NewSampler(SamplingParams{}, 4)
	if got := s.Sample([]float32{1, 3, 3, 2, 100}); got != 1 {
		t.Fatalf("greedy picked %d, want 1 (first of the tied maxima, padding excluded)", got)
	}
}

func TestLogprobs(t *testing.T) {
	logits := []float32{1, 2, 3, 50}
	s := NewSampler(SamplingParams{}, 3)
	lp := s.Logprobs(logits, 1, 2)
	z := math.Log(math.Exp(1) + math.Exp(2) + math.Exp(3))
	if !closeness.Near(lp.Logprob, 2-z, 1e-9) {
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
