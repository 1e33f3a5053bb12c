package dflash

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/internal/closeness"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

// tinyPair writes a random tiny target and a matching drafter and loads both.
func tinyPair(t *testing.T, seed uint64, spec engine.SpecOptions) *engine.Engine {
	return tinyPairWith(t, seed, spec, testmodel.DraftOptions{Window: 24})
}

// tinyPairWith is tinyPair with drafter options (target and seed are set
// here), with room for two sequences (a test's incremental and fresh sessions).
func tinyPairWith(t *testing.T, seed uint64, spec engine.SpecOptions, draft testmodel.DraftOptions) *engine.Engine {
	t.Helper()
	target, draftDir := writePair(t, "tiny", seed, "", draft)
	verify, err := VerifyTokens(draftDir, spec)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(cpu.New(2), target, engine.Options{VerifyTokens: verify, PageSize: 4, MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := Attach(e, draftDir, spec); err != nil {
		t.Fatal(err)
	}
	return e
}

// writePair writes a random preset target in dtype and a matching drafter
// (draft's target and seed are set here) and returns their directories.
func writePair(t testing.TB, preset string, seed uint64, dtype string, draft testmodel.DraftOptions) (target, draftDir string) {
	t.Helper()
	p := mustPreset(t, preset)
	dir := t.TempDir()
	target, draftDir = dir+"/target", dir+"/draft"
	if err := testmodel.Write(target, testmodel.Options{Preset: p, Seed: seed, DType: dtype}); err != nil {
		t.Fatal(err)
	}
	draft.Target, draft.Seed = p, seed
	if err := testmodel.WriteDrafter(draftDir, draft); err != nil {
		t.Fatal(err)
	}
	return target, draftDir
}

// layout is a drafter's layer_types in order, named for test messages.
type layout struct {
	name  string
	types []string
}

// drafterLayouts are the layouts the drafter tests run on: z-lab's
// published Qwen3.6-27B drafter (4 sliding + 1 full, read from its config in
// testdata), 2 + 1, 1 + 1 (testmodel's default), full and sliding layers
// alternating, all sliding and all full. The TP test runs the first two.
func drafterLayouts(t testing.TB) []layout {
	const S, F = "sliding_attention", "full_attention"
	return []layout{
		{"published", publishedLayerTypes(t)},
		{"2+1", []string{S, S, F}},
		{"1+1", []string{S, F}},
		{"alternating", []string{F, S, F, S}},
		{"all sliding", []string{S, S, S}},
		{"all full", []string{F, F}},
	}
}

// publishedLayerTypes reads layer_types from the published Qwen3.6-27B-DFlash
// config (testdata/SOURCES.md).
func publishedLayerTypes(t testing.TB) []string {
	t.Helper()
	var cfg struct {
		LayerTypes []string `json:"layer_types"`
	}
	readJSON(t, "testdata/qwen3.6-27b-dflash.config.subset.json", &cfg)
	return cfg.LayerTypes
}

func randomFeatures(rng *rand.Rand, n int) []float32 {
	f := make([]float32, n)
	for i := range f {
		f[i] = float32(rng.NormFloat64())
	}
	return f
}

// TestDraftCacheHoldsOnlyCommittedContext drafts in rounds (context arriving
// a few rows at a time, each round's block K/V written past the context) and
// checks each round equals a fresh session given the whole context at once:
// no block K/V of an earlier round leaks into a later one.
func TestDraftCacheHoldsOnlyCommittedContext(t *testing.T) {
	for _, l := range drafterLayouts(t) {
		e := tinyPairWith(t, 2, engine.SpecOptions{Mode: engine.SpecLinear}, testmodel.DraftOptions{LayerTypes: l.types, Window: 12})
		d := e.Drafter.(*Drafter)
		width := len(d.TapLayers()) * e.Model.Cfg.HiddenSize
		rng := rand.New(rand.NewPCG(1, 2))
		// 40 rows of context: with window 12 the sliding layers' window
		// matters and their rings wrap.
		all := randomFeatures(rng, 40*width)
		inc, err := d.NewSession(nil)
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, rows := range []int{7, 1, 16, 3, 13} {
			anchor := int32(rng.IntN(290))
			got, err := inc.Draft(all[done*width:(done+rows)*width], anchor)
			if err != nil {
				t.Fatal(err)
			}
			done += rows
			fresh, err := d.NewSession(nil)
			if err != nil {
				t.Fatal(err)
			}
			want, err := fresh.Draft(all[:done*width], anchor)
			fresh.Close()
			if err != nil {
				t.Fatal(err)
			}
			if diff := closeness.MaxAbsDiff(got, want); diff > 1e-5 {
				t.Fatalf("%s layout, after %d context rows: incremental draft differs from fresh by %g", l.name, done, diff)
			}
		}
		inc.Close()
		e.Close()
	}
}

// TestSlidingRingsMatchFullCache drafts over a context five times the
// sliding window, in rounds of varied sizes (one longer than the window),
// with the sliding layers in per-session rings and, as the reference, in
// the paged cache over the whole context, for each layout with sliding
// layers: the logits must agree bit for bit (attention depends only on the
// keys a row sees, in order), and each sliding layer's ring must hold
// RingTokens per session.
func TestSlidingRingsMatchFullCache(t *testing.T) {
	const window = 12
	for _, l := range drafterLayouts(t) {
		if !slices.Contains(l.types, "sliding_attention") {
			continue
		}
		checkRingsMatchFullCache(t, l, window)
	}
}

func checkRingsMatchFullCache(t *testing.T, l layout, window int) {
	target, dir := writePair(t, "tiny", 4, "", testmodel.DraftOptions{LayerTypes: l.types, Window: window})
	e, err := engine.Load(cpu.New(2), target, engine.Options{PageSize: 4, MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ringed, err := LoadDrafter(dir, e.Model, Options{PageSize: 4, Sequences: 2, Context: e.Context})
	if err != nil {
		t.Fatal(err)
	}
	defer ringed.Close()
	paged, err := LoadDrafter(dir, e.Model, Options{PageSize: 4, Sequences: 1, Context: e.Context, pagedSliding: true})
	if err != nil {
		t.Fatal(err)
	}
	defer paged.Close()
	if ringed.ring == nil || paged.ring != nil {
		t.Fatalf("%s layout: ring caches: %v with rings, %v without: want one and none", l.name, ringed.ring != nil, paged.ring != nil)
	}
	kvDim := ringed.Cfg.NumKVHeads * ringed.Cfg.HeadDim
	for i := range ringed.Cfg.NumSliding() {
		k, _ := ringed.ring.Layer(0, i)
		if want := 2 * ringed.Cfg.RingTokens(4, e.Context) * kvDim; k.Len() != want {
			t.Errorf("%s layout: ring layer %d of %d elements, want two sessions' RingTokens × kvDim = %d", l.name, i, k.Len(), want)
		}
	}
	width := len(ringed.TapLayers()) * e.Model.Cfg.HiddenSize
	rng := rand.New(rand.NewPCG(5, 6))
	all := randomFeatures(rng, 5*window*width)
	sessions := []engine.DraftSession{}
	for _, d := range []*Drafter{ringed, paged} {
		s, err := d.NewSession(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sessions = append(sessions, s)
	}
	done := 0
	for _, rows := range []int{3, 1, 17, 2, 7, 11, 5, 1, 13} {
		anchor := int32(rng.IntN(290))
		var out [2][]float32
		for i, s := range sessions {
			if out[i], err = s.Draft(all[done*width:(done+rows)*width], anchor); err != nil {
				t.Fatal(err)
			}
		}
		done += rows
		if !slices.Equal(out[0], out[1]) {
			t.Fatalf("%s layout, after %d context rows (window %d): ring draft differs from the full-cache draft", l.name, done, window)
		}
	}
	if done < 5*window {
		t.Fatalf("the rounds cover %d rows, want at least %d", done, 5*window)
	}
}

// TestRealDrafterIsLossless runs the real drafter forward (random weights,
// so acceptance is rare but every path runs) in each spec mode, for each
// drafter layout, and compares the output with autoregressive decoding.
// The sliding window (12) is smaller than the sequences, so rings wrap.
func TestRealDrafterIsLossless(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i, l := range drafterLayouts(t) {
		seed := uint64(i + 1)
		prompt := make([]int32, 1+rng.IntN(30))
		for i := range prompt {
			prompt[i] = int32(rng.IntN(290))
		}
		req := engine.Request{Prompt: prompt, MaxTokens: 48}
		want, err := tinyPair(t, seed, engine.SpecOptions{}).Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, spec := range []engine.SpecOptions{
			{Mode: engine.SpecLinear},
			{Mode: engine.SpecTree, Budget: 4, Rollback: mamba.Snapshot},
			{Mode: engine.SpecTree, Budget: 32},
			{Mode: engine.SpecLinear, DraftDepth: 5},
			{Mode: engine.SpecTree, Budget: 8, DraftDepth: 3},
		} {
			// Every other run uses a YaRN-scaled drafter.
			draft := testmodel.DraftOptions{LayerTypes: l.types, Window: 12, YaRN: float64(2 * (seed % 2))}
			got, err := tinyPairWith(t, seed, spec, draft).Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tokens, want.Tokens) {
				t.Fatalf("%s layout, seed %d %v b%d depth %d: output differs from autoregressive\n got %v\nwant %v", l.name, seed, spec.Mode, spec.Budget, spec.DraftDepth, got.Tokens, want.Tokens)
			}
		}
	}
}

// TestShortBlockEqualsShortCheckpoint drafts in rounds with a session of a
// shorter block than its drafter's (NewBlockSession) and, as the
// reference, with the same weights under a config whose block_size is that
// block: the proposals must agree bit for bit, in every layout, with a
// sliding window shorter than the block so the sliding mask's stride
// matters. Asking for no mask or a longer block than the drafter's fails.
func TestShortBlockEqualsShortCheckpoint(t *testing.T) {
	const block, window = 6, 4
	for _, l := range drafterLayouts(t) {
		target, longDir := writePair(t, "tiny", 5, "", testmodel.DraftOptions{LayerTypes: l.types, Window: window})
		shortDir := t.TempDir()
		if err := testmodel.WriteDrafter(shortDir, testmodel.DraftOptions{Target: mustPreset(t, "tiny"), Seed: 5, LayerTypes: l.types, Window: window, BlockSize: block}); err != nil {
			t.Fatal(err)
		}
		e, err := engine.Load(cpu.New(2), target, engine.Options{PageSize: 4, MaxSeqs: 2})
		if err != nil {
			t.Fatal(err)
		}
		long, err := LoadDrafter(longDir, e.Model, Options{Sequences: 2})
		if err != nil {
			t.Fatal(err)
		}
		short, err := LoadDrafter(shortDir, e.Model, Options{Sequences: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []int{1, 17} {
			if _, err := long.NewBlockSession(nil, bad); err == nil {
				t.Fatalf("a block of %d rows from a 16-row drafter: no error", bad)
			}
		}
		got, err := long.NewBlockSession(nil, block)
		if err != nil {
			t.Fatal(err)
		}
		want, err := short.NewSession(nil)
		if err != nil {
			t.Fatal(err)
		}
		width := len(long.TapLayers()) * e.Model.Cfg.HiddenSize
		rng := rand.New(rand.NewPCG(5, 6))
		for _, rows := range []int{7, 1, 5, 3} {
			features, anchor := randomFeatures(rng, rows*width), int32(rng.IntN(290))
			g, err := got.Draft(features, anchor)
			if err != nil {
				t.Fatal(err)
			}
			w, err := want.Draft(features, anchor)
			if err != nil {
				t.Fatal(err)
			}
			if len(g) != (block-1)*e.Model.Cfg.VocabSize || !slices.Equal(g, w) {
				t.Fatalf("%s layout: a %d-row block of a 16-row drafter differs from a %d-row drafter's (%d values, want %d)", l.name, block, block, len(g), len(w))
			}
		}
		got.Close()
		want.Close()
		long.Close()
		short.Close()
		e.Close()
	}
}

func mustPreset(t testing.TB, name string) testmodel.Preset {
	t.Helper()
	p, err := testmodel.PresetByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
