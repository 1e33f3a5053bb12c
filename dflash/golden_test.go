package dflash

import (
	"encoding/json"
	"math"
	"os"
	"testing"

	"ddflash/engine"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// TestDrafterMatchesFloat64Reference runs one draft step of the committed
// default pair (target features from the engine, then the drafter) and
// compares the per-position logits with tools/reference/make_draft_golden.py,
// which computes both the target's taps and the drafter in float64
// (tools/reference/qwen36.py and dflash.py, independent of this code).
func TestDrafterMatchesFloat64Reference(t *testing.T) {
	data, err := os.ReadFile("testdata/golden-default-draft.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Context []int32     `json:"context"`
		Anchor  int32       `json:"anchor"`
		Logits  [][]float64 `json:"logits"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	e := loadDefaultPair(t)
	d := e.Drafter.(*Drafter)
	features := tappedFeatures(t, e, g.Context, d.TapLayers())
	sess, err := d.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	got, err := sess.Draft(features, g.Anchor)
	if err != nil {
		t.Fatal(err)
	}
	V := e.Model.Cfg.VocabSize
	if len(g.Logits) != d.BlockSize()-1 || len(got) != len(g.Logits)*V {
		t.Fatalf("%d golden rows, %d logits from the drafter", len(g.Logits), len(got))
	}
	worst, scale := 0.0, 1.0
	for r, row := range g.Logits {
		for i, want := range row {
			worst = math.Max(worst, math.Abs(float64(got[r*V+i])-want))
			scale = math.Max(scale, math.Abs(want))
		}
	}
	// F32 activations (target and drafter) against float64, same BF16 weights.
	if worst > 1e-4*scale {
		t.Fatalf("drafter logits differ from the float64 reference by %g (scale %g)", worst, scale)
	}
	t.Logf("max |Δ logit| %.2e at scale %.1f over %d positions", worst, scale, len(g.Logits))
}

// loadDefaultPair loads the repository's trained default target and drafter.
func loadDefaultPair(t *testing.T) *engine.Engine {
	t.Helper()
	const target, draft = "../models/default/target", "../models/default/draft"
	spec := engine.SpecOptions{Mode: engine.SpecLinear}
	verify, err := VerifyTokens(draft, spec)
	if err != nil {
		t.Fatal(err)
	}
	b := cpuBackend()
	e, err := engine.Load(b, target, engine.Options{VerifyTokens: verify})
	if err != nil {
		t.Fatal(err)
	}
	if err := Attach(e, b, draft, spec); err != nil {
		t.Fatal(err)
	}
	return e
}

func cpuBackend() kernels.Backend { return cpu.New(0) }

// tappedFeatures runs the target over tokens and returns each token's tapped
// hidden states concatenated in tap order (the drafter's input rows).
func tappedFeatures(t *testing.T, e *engine.Engine, tokens []int32, taps []int) []float32 {
	t.Helper()
	m := e.Model
	slot, err := m.States.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer m.States.Release(slot)
	var kv engine.SeqKV
	if err := m.KV.Reserve(&kv, len(tokens)); err != nil {
		t.Fatal(err)
	}
	defer m.KV.Truncate(&kv, 0)
	out, err := m.Forward([]engine.SeqInput{{Tokens: tokens, KV: &kv, Slot: slot, Logits: engine.NoRows}}, taps)
	if err != nil {
		t.Fatal(err)
	}
	H := m.Cfg.HiddenSize
	var f []float32
	for r := range tokens {
		for _, l := range taps {
			f = append(f, out[0].Hidden[l][r*H:(r+1)*H]...)
		}
	}
	return f
}
