package dflash

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/adaptive"
	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/internal/enginetest"
	"ddflash/kernels"
	"ddflash/mamba"
)

// TestAbsorbEqualsDraftFeatures drafts in rounds with two sessions of one
// drafter: one given each round's rows as host features (Draft), the other
// given them as rows of a step's tap buffer on the backend, picked out by
// index with gaps as a tree's accepted path has them, after host rows in
// the first round as a prompt's (Absorb, then Draft with none). Their
// logits must agree bit for bit in every layout, with a round longer than
// the sliding window so the rings' kept rows matter.
func TestAbsorbEqualsDraftFeatures(t *testing.T) {
	for _, l := range drafterLayouts(t) {
		e := tinyPairWith(t, 6, engine.SpecOptions{Mode: engine.SpecLinear}, testmodel.DraftOptions{LayerTypes: l.types, Window: 12})
		d := e.Drafter.(*Drafter)
		b := e.Model.Backend()
		width := len(d.TapLayers()) * e.Model.Cfg.HiddenSize
		rng := rand.New(rand.NewPCG(7, 8))
		const tapRows = 20
		taps, err := b.Alloc(kernels.F32, tapRows*width)
		if err != nil {
			t.Fatal(err)
		}
		host, device := newSession(t, d), newSession(t, d)
		for round, rows := range [][]int32{{0, 1, 2}, {0}, {0, 2, 3, 6}, {1, 4, 5, 9, 10, 11}, seq(17), {3}} {
			step := randomFeatures(rng, tapRows*width)
			if err := b.UploadF32(taps, 0, step); err != nil {
				t.Fatal(err)
			}
			var prompt []float32
			if round == 0 {
				prompt = randomFeatures(rng, 5*width)
			}
			features := slices.Clone(prompt)
			for _, r := range rows {
				features = append(features, step[int(r)*width:int(r+1)*width]...)
			}
			anchor := int32(rng.IntN(290))
			want, err := host.Draft(features, anchor)
			if err != nil {
				t.Fatal(err)
			}
			if err := device.(engine.TapAbsorber).Absorb(prompt, taps, rows); err != nil {
				t.Fatal(err)
			}
			got, err := device.Draft(nil, anchor)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s layout, round %d (rows %v): the draft after Absorb differs from the draft given the same rows as features", l.name, round, rows)
			}
		}
		b.Free(taps)
		e.Close()
	}
}

func newSession(t *testing.T, d *Drafter) engine.DraftSession {
	t.Helper()
	s, err := d.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// seq is 0..n-1.
func seq(n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

// TestDeviceTapsDecodeAsHostTaps generates with the engine keeping taps on
// the device (Engine.DeviceTaps, here on the CPU backend) and bringing
// them home: the same tokens and the same acceptance lengths step by step,
// alone, batched (prompt chunks and verifies in one step, so a step keeps
// some sequences' taps and brings others' home), sampled, and under the
// adaptive policy (whose plain steps hand prompt rows over with a step's
// rows), all equal to autoregressive output where greedy.
func TestDeviceTapsDecodeAsHostTaps(t *testing.T) {
	prompt := []int32{12, 40, 7, 99, 3, 250, 18, 5, 61}
	reqs := []engine.Request{
		{Prompt: prompt, MaxTokens: 40, IgnoreEOS: true},
		{Prompt: []int32{77, 8, 150, 2}, MaxTokens: 30, IgnoreEOS: true, Sampling: engine.SamplingParams{Temperature: 0.8, Seed: 3}},
	}
	want, err := tinyPair(t, 9, engine.SpecOptions{}).Generate(context.Background(), reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []engine.SpecOptions{
		{Mode: engine.SpecLinear},
		{Mode: engine.SpecTree, Budget: 8},
		{Mode: engine.SpecTree, Budget: 6, Rollback: mamba.Snapshot},
	} {
		var runs [2][]*engine.Result // host taps, device taps
		for i, onDevice := range []bool{false, true} {
			e := tinyPair(t, 9, spec)
			e.DeviceTaps = onDevice
			for _, r := range reqs {
				res, err := e.Generate(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				runs[i] = append(runs[i], res)
			}
			runs[i] = append(runs[i], enginetest.Batched(t, e, reqs)...)
			e.Close()
		}
		for i := range runs[0] {
			host, device := runs[0][i], runs[1][i]
			if !slices.Equal(device.Tokens, host.Tokens) || !slices.Equal(device.Stats.SpecStats.AcceptanceLengths, host.Stats.SpecStats.AcceptanceLengths) {
				t.Fatalf("%v b%d, run %d: taps on the device gave %v (acceptance %v), brought home %v (%v)", spec.Mode, spec.Budget, i,
					device.Tokens, device.Stats.SpecStats.AcceptanceLengths, host.Tokens, host.Stats.SpecStats.AcceptanceLengths)
			}
		}
		for _, i := range []int{0, 2} { // the greedy request, alone and batched
			if !slices.Equal(runs[1][i].Tokens, want.Tokens) {
				t.Fatalf("%v b%d, run %d: %v, autoregressive %v", spec.Mode, spec.Budget, i, runs[1][i].Tokens, want.Tokens)
			}
		}
	}
	policy := &adaptive.Policy{Autoregressive: true}
	e := tinyPair(t, 9, engine.SpecOptions{Mode: engine.SpecTree, Budget: 8, Policy: policy})
	defer e.Close()
	e.DeviceTaps = true
	for range 2 {
		got, err := e.Generate(context.Background(), reqs[0])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("adaptive, taps on the device: %v, autoregressive %v", got.Tokens, want.Tokens)
		}
	}
}
