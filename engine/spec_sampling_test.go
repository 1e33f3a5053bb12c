package engine

import (
	"context"
	"fmt"
	"math"
	"testing"

	"ddflash/mamba"
)

// exactDistribution enumerates every n-token continuation of the request's
// prompt with its probability under the processed per-step distribution
// (processors, then temperature, min-p, top-k, top-p), computed step by step
// on the target with the float64 references.
func exactDistribution(t *testing.T, e *Engine, r Request, n int) map[string]float64 {
	out := map[string]float64{}
	p := r.Sampling
	var walk func(prefix []int32, prob float64)
	walk = func(prefix []int32, prob float64) {
		if len(prefix) == n {
			out[fmt.Sprint(prefix)] += prob
			return
		}
		s, err := e.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		logits, _, err := e.prefill(s, concat(r.Prompt, prefix), nil)
		e.release(s)
		if err != nil {
			t.Fatal(err)
		}
		row := referenceProcess(logits, e.ValidVocab, r, e.EOS, prefix)
		for id, q := range referenceDistribution(row, p.Temperature, p.TopK, p.TopP, p.MinP) {
			walk(concat(prefix, []int32{int32(id)}), prob*q)
		}
	}
	walk(nil, 1)
	return out
}

// chiSquareCritical approximates the upper 0.1% point of the chi-square
// distribution with df degrees of freedom (Wilson–Hilferty; z = 3.0902).
func chiSquareCritical(df int) float64 {
	k := float64(df)
	c := 1 - 2/(9*k) + 3.0902*math.Sqrt(2/(9*k))
	return k * c * c * c
}

// TestSpecSamplingMatchesTarget draws many 3-token samples from
// autoregressive, linear and tree decoding, plain (temperature 0.8, top-k 3)
// and penalised (presence, frequency and repetition penalties, logit bias,
// min-p, top-p), and tests each histogram against the exact processed target
// distribution with a chi-square goodness-of-fit test at the 0.1%
// significance level (fixed seeds, so the test is deterministic). Outcomes
// expected fewer than 5 times are pooled. (Because the walk samples lazily,
// node by node, a spec run draws the same random numbers for the same
// distributions as autoregressive decoding; the test does not rely on that,
// it checks the distribution itself.)
func TestSpecSamplingMatchesTarget(t *testing.T) {
	const (
		seed    = 8
		samples = 2000
		n       = 3
	)
	prompt := []int32{17, 140, 9}
	ref := newTestEngine(t, "tiny", seed, Options{})
	oracle := greedyOracle(t, ref)
	for _, params := range []SamplingParams{
		{Temperature: 0.8, TopK: 3},
		{Temperature: 0.7, TopK: 5, TopP: 0.9, MinP: 0.1, PresencePenalty: 0.7, FrequencyPenalty: 0.5, RepetitionPenalty: 1.5,
			LogitBias: map[int32]float32{17: 1, 9: 0.8, 140: 0.5}},
	} {
		req := Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, Sampling: params}
		exact := exactDistribution(t, ref, req, n)
		for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecLinear, 0, mamba.Replay}, {SpecTree, 6, mamba.Snapshot}} {
			e := specEngineBlock(t, "tiny", seed, c, oracle, 0.3, 256, 4, Options{})
			counts := map[string]int{}
			var tau float64
			for i := 0; i < samples; i++ {
				r := req
				r.Sampling.Seed = uint64(i)
				res, err := e.Generate(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				counts[fmt.Sprint(res.Tokens)]++
				if res.Stats.SpecStats != nil {
					tau += res.Stats.AcceptanceLength / samples
				}
			}
			chi, df, crit := chiSquare(exact, counts, samples)
			if chi > crit {
				t.Errorf("%v %+v: chi-square %.1f with %d dof exceeds the 0.1%% critical value %.1f (an outcome outside the target's support gives +Inf)", c, params, chi, df, crit)
			} else {
				t.Logf("%v %+v: chi-square %.1f, %d dof (critical %.1f), %d outcomes, τ %.2f", c, params, chi, df, crit, len(exact), tau)
			}
		}
	}
}
