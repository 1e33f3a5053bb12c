//go:build cgo

package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/kernels/cuda"
)

// Whole-model checks against the CPU backend, run on the GPU by
// model_gpu_test.go (build tag cuda) and on the CPU emulation of the driver
// by TestEmulatedModel (a child of TestEmulator in emu_test.go).

// TestEmulatedModel runs the model checks on the tiny preset when
// DDFLASH_LIBCUDA names the CPU emulation.
func TestEmulatedModel(t *testing.T) {
	if os.Getenv("DDFLASH_LIBCUDA") == "" {
		t.Skip("runs as a child of TestEmulator")
	}
	be, err := cuda.New(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("Logits", func(t *testing.T) { checkModelLogits(t, be, "tiny") })
	t.Run("LogitsH256", func(t *testing.T) { checkModelLogits(t, be, "tiny-h256") })
	t.Run("Spec", func(t *testing.T) { checkSpecGeneration(t, be) })
}

// checkModelLogits runs a random bf16 model of the preset on be and on the
// CPU backend: a prefill of the prompt, then decode steps, comparing every
// logit row.
func checkModelLogits(t *testing.T, be kernels.Backend, preset string) {
	p, err := testmodel.PresetByName(preset)
	must(t, err)
	dir := t.TempDir()
	must(t, testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: "bf16"}))
	rng := rand.New(rand.NewPCG(11, 12))
	prompt := make([]int32, 37)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(250))
	}
	steps := []int32{5, 17, 101, 3}
	want := modelLogits(t, cpu.New(0), dir, prompt, steps)
	got := modelLogits(t, be, dir, prompt, steps)
	for i := range want {
		// F32 activations and exactly widened weights on both: the
		// difference is accumulation order through every layer.
		if d := cuda.RelNorm(got[i], want[i]); d > 1e-4 {
			t.Errorf("%s forward %d: ‖got−cpu‖/‖cpu‖ = %.2g", preset, i, d)
		}
	}
}

// modelLogits prefills prompt in one forward (all rows' logits), then feeds
// steps one token at a time; it returns each forward's logits.
func modelLogits(t *testing.T, be kernels.Backend, dir string, prompt, steps []int32) [][]float32 {
	t.Helper()
	e, err := engine.Load(be, dir, engine.Options{PageSize: 16, Context: len(prompt) + len(steps) + 1})
	must(t, err)
	slot, err := e.Model.States.Acquire()
	must(t, err)
	var kv engine.SeqKV
	var out [][]float32
	forward := func(tokens []int32, start int, rows engine.LogitRows) {
		must(t, e.Model.KV.Reserve(&kv, start+len(tokens)))
		res, err := e.Model.Forward([]engine.SeqInput{{Tokens: tokens, Start: start, KV: &kv, Slot: slot, Logits: rows}}, nil)
		must(t, err)
		out = append(out, res[0].Logits)
	}
	forward(prompt, 0, engine.AllRows)
	for i, tok := range steps {
		forward([]int32{tok}, len(prompt)+i, engine.LastRow)
	}
	return out
}

// checkSpecGeneration decodes greedily with a random DFlash drafter in
// linear and DDTree modes on be: the output must equal the CPU backend's
// (greedy speculative decoding reproduces the target's greedy tokens, and
// both backends compute the same logits to F32 rounding).
func checkSpecGeneration(t *testing.T, be kernels.Backend) {
	p, err := testmodel.PresetByName("tiny")
	must(t, err)
	dir := t.TempDir()
	target, draft := dir+"/target", dir+"/draft"
	must(t, testmodel.Write(target, testmodel.Options{Preset: p, Seed: 3, DType: "bf16"}))
	must(t, testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: 3, DType: "bf16"}))
	prompt := []int32{12, 40, 7, 99, 3, 250, 18}
	for _, spec := range []engine.SpecOptions{
		{Mode: engine.SpecLinear},
		{Mode: engine.SpecTree, Budget: 8},
		{Mode: engine.SpecTree, Budget: 16},
	} {
		t.Run(fmt.Sprintf("%v-%d", spec.Mode, spec.Budget), func(t *testing.T) {
			want := generate(t, cpu.New(0), target, draft, spec, prompt)
			got := generate(t, be, target, draft, spec, prompt)
			if !slices.Equal(got, want) {
				t.Errorf("tokens differ from the CPU backend's\n got %v\nwant %v", got, want)
			}
		})
	}
}

func generate(t *testing.T, be kernels.Backend, target, draft string, spec engine.SpecOptions, prompt []int32) []int32 {
	t.Helper()
	const maxTokens = 24
	verify, err := dflash.VerifyTokens(draft, spec)
	must(t, err)
	e, err := engine.Load(be, target, engine.Options{Context: len(prompt) + maxTokens + 1, VerifyTokens: verify})
	must(t, err)
	must(t, dflash.Attach(e, draft, spec))
	res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true})
	must(t, err)
	return res.Tokens
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
