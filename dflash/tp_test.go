package dflash

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/internal/closeness"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// TestTensorParallelDrafter: with the target split over ranks, the drafter
// (on rank 0, scoring through the vocabulary-parallel LM head) drafts the
// same logits as with one rank, to fp32 rounding, and greedy speculative
// output in every mode equals one rank's autoregressive output; for the
// published drafter layout and 2 + 1, with a window (12) the sequence
// outgrows, and a DFlash2 drafter in the 2 + 1 layout.
func TestTensorParallelDrafter(t *testing.T) {
	for _, l := range drafterLayouts(t)[:2] {
		checkTensorParallelDrafter(t, l.name, testmodel.DraftOptions{LayerTypes: l.types, Window: 12})
	}
	l := drafterLayouts(t)[1]
	checkTensorParallelDrafter(t, "DFlash2 "+l.name, testmodel.DraftOptions{LayerTypes: l.types, Window: 12, DFlash2: true})
}

func checkTensorParallelDrafter(t *testing.T, name string, opts testmodel.DraftOptions) {
	target, draftDir := writePair(t, "tp8", 4, "bf16", opts)
	load := func(tp int, spec engine.SpecOptions) *engine.Engine {
		backends := make([]kernels.Backend, tp)
		for i := range backends {
			backends[i] = cpu.New(1)
		}
		verify, err := VerifyTokens(draftDir, spec)
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.LoadParallel(backends, target, engine.Options{Context: 128, VerifyTokens: verify, PageSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		if spec.Mode != engine.SpecAuto {
			if err := Attach(e, draftDir, spec); err != nil {
				t.Fatal(err)
			}
		}
		return e
	}
	linear := engine.SpecOptions{Mode: engine.SpecLinear}
	one, four := load(1, linear), load(4, linear)
	rng := rand.New(rand.NewPCG(8, 8))
	features := randomFeatures(rng, 11*len(one.Drafter.TapLayers())*one.Model.Cfg.HiddenSize)
	draft := func(e *engine.Engine) []float32 {
		s, err := e.Drafter.NewSession(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		logits, err := s.Draft(features, 17)
		if err != nil {
			t.Fatal(err)
		}
		return logits
	}
	want, got := draft(one), draft(four)
	if diff, scale := closeness.MaxAbsDiff(got, want), closeness.Scale(want); diff > 2e-5*scale {
		t.Fatalf("%s layout: TP 4 draft logits differ from one rank by %.3g (scale %.3g)", name, diff, scale)
	}

	req := engine.Request{Prompt: []int32{5, 80, 33, 140, 7}, MaxTokens: 40}
	ar, err := load(1, engine.SpecOptions{}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []engine.SpecOptions{linear, {Mode: engine.SpecTree, Budget: 16}} {
		for _, tp := range []int{2, 8} {
			res, err := load(tp, spec).Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Tokens, ar.Tokens) {
				t.Fatalf("%s layout, %s at TP %d: output differs from one rank's autoregressive\n got %v\nwant %v", name, spec.Mode, tp, res.Tokens, ar.Tokens)
			}
		}
	}
}
