package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"ddflash/adaptive"
	"ddflash/mamba"
)

// TestAdaptiveChoosesTheBetterDrafter runs --spec adaptive over a choice
// of two drafters: one proposing the target's own tokens, and one as
// confident whose proposals are always wrong (random), with a smaller
// block and other tapped layers, as an MTP head beside a DFlash drafter.
// Whichever is listed first, greedy and seeded sampled output stays
// autoregressive, every request drafts with one drafter only, and once
// both have decoded two requests the good one (several tokens a step
// against one) gets every request but the exploring ones (every
// adaptive.ExploreEvery-th goes to the drafters in turn).
func TestAdaptiveChoosesTheBetterDrafter(t *testing.T) {
	const ctxLen = 256
	prompt := randomTokens(rand.New(rand.NewPCG(7, 8)), 6, 290)
	for _, c := range []struct {
		goodFirst bool
		temp      float64
	}{{true, 0}, {false, 0.9}} {
		req := Request{Prompt: prompt, MaxTokens: 64, IgnoreEOS: true, Sampling: SamplingParams{Temperature: c.temp, Seed: 3}}
		want, err := newTestEngine(t, "tiny", 3, Options{Context: ctxLen}).Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		e, p := adaptiveEngine(t, 3, true, mamba.Replay, pathOracle(concat(prompt, want.Tokens)), 0, ctxLen, Options{})
		good := e.Drafter.(*oracleDrafter)
		good.block = 6
		bad := *good
		bad.noise, bad.block, bad.rng, bad.taps = 1, 4, rand.New(rand.NewPCG(5, 5)), []int{e.Model.Cfg.NumLayers - 1}
		drafters := []Drafter{good, &bad}
		if !c.goodFirst {
			slices.Reverse(drafters)
		}
		choice := NewChoiceDrafter(drafters...)
		e.Drafter = choice
		// Preset costs under which good drafts pay (a flat step of 1 ms, a
		// draft of 0.1 ms), so the policy does not stop drafting on the
		// loaded machine's times.
		for range 64 {
			p.Cost.ObserveStep(1, 1, time.Millisecond)
			p.Cost.ObserveStep(1, 33, time.Millisecond)
			p.Cost.ObserveDraft(100*time.Microsecond, true)
		}
		const warmup, requests = 4, 3 * adaptive.ExploreEvery
		var goodRequests, badRequests int
		for k := range warmup + requests {
			good.drafts, bad.drafts = 0, 0
			got, err := e.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tokens, want.Tokens) {
				t.Fatalf("%+v, request %d: output differs from autoregressive\n got %v\nwant %v", c, k, got.Tokens, want.Tokens)
			}
			// (The first request also times two drafts of each drafter.)
			if k > 0 && good.drafts > 0 && bad.drafts > 0 {
				t.Fatalf("%+v, request %d: %d drafts by the good drafter and %d by the bad one: a request drafts with one", c, k, good.drafts, bad.drafts)
			}
			if k >= warmup && good.drafts > 0 {
				goodRequests++
			} else if k >= warmup {
				badRequests++
			}
		}
		// Of 3·ExploreEvery requests, 3 explore, half of them the bad drafter's.
		if badRequests > 2 {
			t.Errorf("%+v: after the warm-up %d requests drafted with the good drafter and %d with the bad one", c, goodRequests, badRequests)
		}
		t.Logf("%+v: after the warm-up %d requests with the good drafter, %d with the bad one", c, goodRequests, badRequests)
	}
}
