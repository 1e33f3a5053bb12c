package dflash

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"ddflash/engine"
	"ddflash/internal/closeness"
	"ddflash/internal/enginetest"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// draftGolden is one draft step computed by an independent float64
// reference: the target's tapped hidden states (tools/reference/qwen36.py)
// fed to the drafter (tools/reference/dflash.py).
type draftGolden struct {
	target, draft string
	context       []int32
	anchor        int32
	logits        [][]float64 // rows 1..block-1 of the block
}

// TestDrafterMatchesFloat64Reference runs one draft step on the committed
// pairs (target features from the engine, then the drafter) and compares the
// per-position logits with the float64 references: the random golden-tiny
// pair (engine/testdata/golden-tiny, two anchors), golden-tiny's target with
// a random drafter in the published Qwen3.6-27B layout, as published and
// with is_causal false (dflash/testdata/golden-published-layout, two anchors
// each) and the trained
// default pair (dflash/testdata/golden-default-draft.json).
func TestDrafterMatchesFloat64Reference(t *testing.T) {
	goldens := slices.Concat(tinyDraftGoldens(t), publishedLayoutGoldens(t), []draftGolden{defaultDraftGolden(t)})
	for _, g := range goldens {
		e := loadPair(t, g.target, g.draft)
		d := e.Drafter.(*Drafter)
		sess, err := d.NewSession(nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sess.Draft(enginetest.TappedFeatures(t, e, g.context, d.TapLayers()), g.anchor)
		sess.Close()
		if err != nil {
			t.Fatal(err)
		}
		V := e.Model.Cfg.VocabSize
		if len(g.logits) != d.BlockSize()-1 || len(got) != len(g.logits)*V {
			t.Fatalf("%s: %d golden rows, %d logits from the drafter", g.draft, len(g.logits), len(got))
		}
		want := slices.Concat(g.logits...)
		worst, scale := closeness.MaxAbsDiff(got, want), closeness.Scale(want)
		// F32 activations (target and drafter) against float64, same BF16 weights.
		if worst > 1e-4*scale {
			t.Fatalf("%s, anchor at %d: drafter logits differ from the float64 reference by %g (scale %g)", g.draft, len(g.context), worst, scale)
		}
		t.Logf("%s, anchor at %d: max |Δ logit| %.2e at scale %.1f", g.draft, len(g.context), worst, scale)
	}
}

func tinyDraftGoldens(t *testing.T) []draftGolden {
	const dir = "../engine/testdata/golden-tiny"
	var g struct {
		Sequences []struct {
			IDs []int32 `json:"ids"`
		} `json:"sequences"`
		Draft struct {
			Sequence int `json:"sequence"`
			Blocks   []struct {
				Anchor int         `json:"anchor"`
				Logits [][]float64 `json:"logits"`
			} `json:"blocks"`
		} `json:"draft"`
	}
	readJSON(t, dir+"/golden.json", &g)
	ids := g.Sequences[g.Draft.Sequence].IDs
	var out []draftGolden
	for _, b := range g.Draft.Blocks {
		out = append(out, draftGolden{dir, dir + "/draft", ids[:b.Anchor], ids[b.Anchor], b.Logits})
	}
	return out
}

// publishedLayoutGoldens reads the draft steps of a random drafter with the
// layer layout of z-lab's Qwen3.6-27B-DFlash (4 sliding layers, window 8 here,
// then 1 full) on golden-tiny's target, after checking that its layout is
// the published config's; and the same drafter's steps with is_causal false
// (noncausal/config.json, the sliding layers' window on both sides).
func publishedLayoutGoldens(t *testing.T) []draftGolden {
	const dir, target = "testdata/golden-published-layout", "../engine/testdata/golden-tiny"
	cfg, err := LoadConfig(dir + "/draft")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, k := range cfg.Layers {
		kinds = append(kinds, k.String())
	}
	if published := publishedLayerTypes(t); !slices.Equal(kinds, published) {
		t.Fatalf("%s/draft has layers %v, the published drafter %v", dir, kinds, published)
	}
	type blocks []struct {
		Anchor int         `json:"anchor"`
		Logits [][]float64 `json:"logits"`
	}
	var g struct {
		IDs       []int32 `json:"ids"`
		Blocks    blocks  `json:"blocks"`
		NonCausal struct {
			Blocks blocks `json:"blocks"`
		} `json:"noncausal"`
	}
	readJSON(t, dir+"/golden.json", &g)
	noncausal := filepath.Join(t.TempDir(), "noncausal")
	if err := os.Mkdir(noncausal, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{dir + "/noncausal/config.json", dir + "/draft/model.safetensors"} {
		if err := os.WriteFile(filepath.Join(noncausal, filepath.Base(f)), readFile(t, f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out []draftGolden
	for _, b := range g.Blocks {
		out = append(out, draftGolden{target, dir + "/draft", g.IDs[:b.Anchor], g.IDs[b.Anchor], b.Logits})
	}
	for _, b := range g.NonCausal.Blocks {
		out = append(out, draftGolden{target, noncausal, g.IDs[:b.Anchor], g.IDs[b.Anchor], b.Logits})
	}
	return out
}

func defaultDraftGolden(t *testing.T) draftGolden {
	var g struct {
		Context []int32     `json:"context"`
		Anchor  int32       `json:"anchor"`
		Logits  [][]float64 `json:"logits"`
	}
	readJSON(t, "testdata/golden-default-draft.json", &g)
	return draftGolden{"../models/default/target", "../models/default/draft", g.Context, g.Anchor, g.Logits}
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// loadPair loads a committed target and drafter for linear speculation.
func loadPair(t *testing.T, target, draft string) *engine.Engine {
	t.Helper()
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
	if err := Attach(e, draft, spec); err != nil {
		t.Fatal(err)
	}
	return e
}

func cpuBackend() kernels.Backend { return cpu.New(0) }
