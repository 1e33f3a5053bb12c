package engine

import (
	"context"
	"fmt"
	"math"
	"testing"

	"ddflash/mamba"
)

// exactDistribution enumerates every n-token continuation of prompt with its
// probability under the sampler's per-step distribution (temperature, top-k),
// computed step by step on the target.
func exactDistribution(t *testing.T, e *Engine, p SamplingParams, prompt []int32, n int) map[string]float64 {
	out := map[string]float64{}
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
		logits, _, err := e.prefill(s, append(append([]int32{}, prompt...), prefix...), nil)
		e.release(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range NewSampler(p, e.ValidVocab).Distribution(logits) {
			walk(append(append([]int32{}, prefix...), c.ID), prob*math.Exp(c.Logprob))
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

// TestSpecSamplingMatchesTarget draws many 3-token samples at temperature
// 0.8 with top-k 3 from autoregressive, linear and tree decoding, and tests
// each histogram against the exact target distribution with a chi-square
// goodness-of-fit test at the 0.1% significance level (fixed seeds, so the
// test is deterministic). Outcomes expected fewer than 5 times are pooled.
// (Because the walk samples lazily, node by node, a spec run draws the same
// random numbers for the same distributions as autoregressive decoding; the
// test does not rely on that, it checks the distribution itself.)
func TestSpecSamplingMatchesTarget(t *testing.T) {
	const (
		seed    = 8
		samples = 2000
		n       = 3
	)
	prompt := []int32{17, 140, 9}
	params := SamplingParams{Temperature: 0.8, TopK: 3}
	ref := newTestEngine(t, "tiny", seed, Options{})
	exact := exactDistribution(t, ref, params, prompt, n)
	oracle := greedyOracle(t, ref)
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecLinear, 0, mamba.Replay}, {SpecTree, 6, mamba.Snapshot}} {
		e := specEngineBlock(t, "tiny", seed, c, oracle, 0.3, 256, 4, Options{})
		counts := map[string]int{}
		var tau float64
		for i := 0; i < samples; i++ {
			p := params
			p.Seed = uint64(i)
			res, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, Sampling: p})
			if err != nil {
				t.Fatal(err)
			}
			counts[fmt.Sprint(res.Tokens)]++
			if res.Stats.SpecStats != nil {
				tau += res.Stats.AcceptanceLength / samples
			}
		}
		chi, df := 0.0, -1
		pooledExp, pooledObs := 0.0, 0
		for k, prob := range exact {
			exp := prob * samples
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
				t.Fatalf("%v sampled %s, which the target distribution never produces", c, k)
			}
		}
		if crit := chiSquareCritical(df); chi > crit {
			t.Errorf("%v: chi-square %.1f with %d dof exceeds the 0.1%% critical value %.1f", c, chi, df, crit)
		} else {
			t.Logf("%v: chi-square %.1f, %d dof (critical %.1f), τ %.2f", c, chi, df, crit, tau)
		}
	}
}
