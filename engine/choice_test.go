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
// autoregressive and most drafts come from the good drafter (after a first
// request, which measures the costs); the bad one drafts for a request only
// in its trials until it is retired (its first draft and one reprobe, where
// without retirement a third comes after 2·ReprobeSteps drafts).
func TestAdaptiveChoosesTheBetterDrafter(t *testing.T) {
	const ctxLen = 256
	prompt := randomTokens(rand.New(rand.NewPCG(7, 8)), 6, 290)
	for _, c := range []struct {
		goodFirst bool
		temp      float64
	}{{true, 0}, {false, 0}, {false, 0.9}} {
		req := Request{Prompt: prompt, MaxTokens: 200, IgnoreEOS: true, Sampling: SamplingParams{Temperature: c.temp, Seed: 3}}
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
		e.Drafter = NewChoiceDrafter(drafters...)
		// Preset costs under which good drafts pay (a flat step of 1 ms, a
		// draft of 0.1 ms), so the policy does not stop drafting on the
		// loaded machine's times.
		for range 64 {
			p.Cost.ObserveStep(1, 1, time.Millisecond)
			p.Cost.ObserveStep(1, 33, time.Millisecond)
			p.Cost.ObserveDraft(100*time.Microsecond, true)
		}
		if _, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 4}); err != nil {
			t.Fatal(err)
		}
		good.drafts, bad.drafts = 0, 0
		got, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("%+v: output differs from autoregressive\n got %v\nwant %v", c, got.Tokens, want.Tokens)
		}
		// Without retirement the bad drafter's third trial would come at the
		// request's draft 2·(ReprobeSteps+1)+1 at the latest.
		if good.drafts+bad.drafts <= 2*(adaptive.ReprobeSteps+1) || bad.drafts > adaptive.RetireAfter {
			t.Errorf("%+v: %d drafts by the good drafter, %d by the bad one", c, good.drafts, bad.drafts)
		}
		t.Logf("%+v: %d drafts by the good drafter, %d by the bad one; τ %.2f", c, good.drafts, bad.drafts, got.Stats.SpecStats.AcceptanceLength)
	}
}
