package dflash

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ddflash/adaptive"
	"ddflash/engine"
	"ddflash/engine/config"
	"ddflash/engine/testmodel"
	"ddflash/internal/closeness"
	"ddflash/internal/enginetest"
	"ddflash/mamba"
)

// dflash2Block is one reference draft step of golden-dflash2.
type dflash2Block struct {
	Anchor     int           `json:"anchor"`
	Logits     [][]float64   `json:"logits"`
	Candidates [][]int32     `json:"candidates"`
	Scores     [][][]float64 `json:"scores"`
	Path       []int32       `json:"path"`
}

// TestDFlash2MatchesFloat64Reference runs draft steps of a random DFlash2
// drafter in the published layout (dflash/testdata/golden-dflash2, made by
// tools/reference/make_dflash2_golden.py from the published formulas) on
// golden-tiny's target, as published and with input_embedding_scale set
// (scaled/config.json, the same weights), and compares the unary logits,
// the selector's candidates and edge scores, and its greedy path with the
// float64 reference, within the drafter golden's tolerance.
func TestDFlash2MatchesFloat64Reference(t *testing.T) {
	const dir, target = "testdata/golden-dflash2", "../engine/testdata/golden-tiny"
	var g struct {
		IDs    []int32        `json:"ids"`
		Blocks []dflash2Block `json:"blocks"`
		Scaled struct {
			Blocks []dflash2Block `json:"blocks"`
		} `json:"scaled"`
	}
	readJSON(t, dir+"/golden.json", &g)
	scaled := filepath.Join(t.TempDir(), "scaled")
	if err := os.Mkdir(scaled, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{dir + "/scaled/config.json", dir + "/draft/model.safetensors"} {
		if err := os.WriteFile(filepath.Join(scaled, filepath.Base(f)), readFile(t, f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, variant := range []struct {
		draft  string
		blocks []dflash2Block
	}{{dir + "/draft", g.Blocks}, {scaled, g.Scaled.Blocks}} {
		e := loadPair(t, target, variant.draft)
		d := e.Drafter.(*Drafter)
		if d.Cfg.V2 == nil {
			t.Fatalf("%s was not read as a DFlash2 drafter", variant.draft)
		}
		for _, b := range variant.blocks {
			checkDFlash2Step(t, e, d, g.IDs, b)
		}
	}
}

// checkDFlash2Step drafts the golden step b and compares it.
func checkDFlash2Step(t *testing.T, e *engine.Engine, d *Drafter, ids []int32, b dflash2Block) {
	t.Helper()
	sess, err := d.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	got, err := sess.Draft(enginetest.TappedFeatures(t, e, ids[:b.Anchor], d.TapLayers()), ids[b.Anchor])
	if err != nil {
		t.Fatal(err)
	}
	lattice := sess.(engine.LatticeSession).Lattice()
	want := slices.Concat(b.Logits...)
	if len(got) != len(want) {
		t.Fatalf("anchor %d: %d logits, the reference has %d", b.Anchor, len(got), len(want))
	}
	// F32 activations (target and drafter) against float64, same BF16 weights.
	worst, scale := closeness.MaxAbsDiff(got, want), closeness.Scale(want)
	if worst > 1e-4*scale {
		t.Fatalf("anchor %d: unary logits differ from the float64 reference by %g (scale %g)", b.Anchor, worst, scale)
	}
	if len(lattice.Tokens) != len(b.Candidates) {
		t.Fatalf("anchor %d: %d lattice rows, want %d", b.Anchor, len(lattice.Tokens), len(b.Candidates))
	}
	var gotScores, wantScores []float64
	for row := range b.Candidates {
		if !slices.Equal(lattice.Tokens[row], b.Candidates[row]) {
			t.Fatalf("anchor %d, row %d: candidates %v, want %v", b.Anchor, row, lattice.Tokens[row], b.Candidates[row])
		}
		if len(lattice.Scores[row]) != len(b.Scores[row]) {
			t.Fatalf("anchor %d, row %d: %d predecessors, want %d", b.Anchor, row, len(lattice.Scores[row]), len(b.Scores[row]))
		}
		for p := range b.Scores[row] {
			gotScores = append(gotScores, lattice.Scores[row][p]...)
			wantScores = append(wantScores, b.Scores[row][p]...)
		}
	}
	worstScore, scoreScale := closeness.MaxAbsDiff(gotScores, wantScores), closeness.Scale(wantScores)
	if worstScore > 1e-4*scoreScale {
		t.Fatalf("anchor %d: edge scores differ from the float64 reference by %g (scale %g)", b.Anchor, worstScore, scoreScale)
	}
	if path := lattice.GreedyPath(); !slices.Equal(path, b.Path) {
		t.Fatalf("anchor %d: greedy path %v, want %v", b.Anchor, path, b.Path)
	}
	t.Logf("anchor %d: max |Δ logit| %.2e at scale %.1f, max |Δ score| %.2e at scale %.1f", b.Anchor, worst, scale, worstScore, scoreScale)
}

// TestParsePublishedDFlash2Config reads a published DFlash2 config.json
// (dflash/testdata/dflash2-config.json, z-lab's fixture): the DFlash2
// fields, and block_size and rope_theta where that layout keeps them.
func TestParsePublishedDFlash2Config(t *testing.T) {
	c, err := ParseConfig(readFile(t, "testdata/dflash2-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := V2Config{ConvKernelSize: 2, ConvGroupSize: 16, SelectorRank: 256, SelectorTopK: 16,
		OutputMultiplier: 0.19611613513818404, FinalLogitSoftcap: 20, InputEmbeddingScale: 1}
	if c.V2 == nil || *c.V2 != want {
		t.Fatalf("DFlash2 fields %+v, want %+v", c.V2, want)
	}
	if c.BlockSize != 16 || c.RopeTheta != 500000 || c.ConvGroups() != 416 || c.Causal == nil || *c.Causal {
		t.Fatalf("block %d, rope theta %g, %d conv groups, causal %v", c.BlockSize, c.RopeTheta, c.ConvGroups(), c.Causal)
	}
}

// TestDFlash2ConfigDetection checks when a config is DFlash2 and that a
// DFlash2 config without its sizes, or with sizes that cannot work, is
// refused with the field named; a DFlash config stays DFlash.
func TestDFlash2ConfigDetection(t *testing.T) {
	published := readFile(t, "testdata/dflash2-config.json")
	v1, err := ParseConfig(readFile(t, drafterPreset))
	if err != nil || v1.V2 != nil {
		t.Fatalf("the DFlash preset: %v, DFlash2 fields %+v", err, v1)
	}
	// The sizes alone make a drafter DFlash2, at the top level as well.
	c, err := ParseConfig(edit(t, published, map[string]any{"architectures": []string{"DFlashDraftModel"}, "dflash_config.selector_rank": nil, "selector_rank": 64}))
	if err != nil || c.V2 == nil || c.V2.SelectorRank != 64 {
		t.Fatalf("sizes without the architecture: %v, %+v", err, c)
	}
	for _, tc := range []struct {
		fields map[string]any
		want   string
	}{
		{map[string]any{"dflash_config.selector_top_k": nil}, "selector_top_k: missing"},
		{map[string]any{"dflash_config.conv_group_size": 24}, "conv_group_size: 24 does not divide hidden_size 6656"},
		{map[string]any{"dflash_config.conv_kernel_size": 0}, "conv_kernel_size: 0"},
		{map[string]any{"dflash_config.output_multiplier": -1}, "output_multiplier: -1"},
		{map[string]any{"dflash_config.block_size": nil}, "block_size: missing"},
		{map[string]any{"block_size": 8}, "dflash_config.block_size: 16, but block_size is 8"},
	} {
		_, err := ParseConfig(edit(t, published, tc.fields))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.fields, err, tc.want)
		}
	}
}

// TestDFlash2TensorLayoutIsPublished checks the names and shapes the
// loader asks for against a published DFlash2 checkpoint's safetensors
// header (dflash/testdata/dflash2-tensors.json) for its config.
func TestDFlash2TensorLayoutIsPublished(t *testing.T) {
	c, err := ParseConfig(readFile(t, "testdata/dflash2-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var published map[string]struct {
		Shape []int `json:"shape"`
	}
	readJSON(t, "testdata/dflash2-tensors.json", &published)
	d := &Drafter{Cfg: c, target: &engine.Model{Cfg: &config.Config{HiddenSize: c.HiddenSize}}, layers: make([]layerWeights, c.NumLayers)}
	specs := d.tensorSpecs()
	if len(specs) != len(published) {
		t.Errorf("the loader reads %d tensors, the checkpoint has %d", len(specs), len(published))
	}
	for _, s := range specs {
		p, ok := published[s.Name]
		if !ok {
			t.Errorf("the loader reads %s, which the checkpoint lacks", s.Name)
		} else if !slices.Equal(p.Shape, s.Shape) {
			t.Errorf("%s: the loader wants shape %v, the checkpoint has %v", s.Name, s.Shape, p.Shape)
		}
	}
}

// TestDFlash2IsLossless runs a random DFlash2 drafter (testmodel's
// published layout) linear and as a DDTree candidate source and compares
// the output with autoregressive decoding: greedy, and sampled at T = 0.8
// with the same seed (the walk samples node by node, so a lossless spec run
// draws the same tokens as autoregressive decoding). Random weights accept
// rarely; engine's TestProposalsFollowTheLattice shows that proposals are
// the lattice's. Last, two requests batched by the scheduler (a session
// and a lattice each) give their lone outputs.
func TestDFlash2IsLossless(t *testing.T) {
	prompt := []int32{3, 141, 59, 26, 5, 35, 89, 79, 32, 38}
	draft := testmodel.DraftOptions{DFlash2: true, LayerTypes: []string{"sliding", "sliding", "full"}, Window: 12, BlockSize: 8}
	for _, sampling := range []engine.SamplingParams{{}, {Temperature: 0.8, Seed: 7}} {
		req := engine.Request{Prompt: prompt, MaxTokens: 40, IgnoreEOS: true, Sampling: sampling}
		want, err := tinyPairWith(t, 11, engine.SpecOptions{}, draft).Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, spec := range []engine.SpecOptions{
			{Mode: engine.SpecLinear},
			{Mode: engine.SpecTree, Budget: 6, Rollback: mamba.Snapshot},
			{Mode: engine.SpecTree, Budget: 32},
			// The adaptive policy cuts the lattice tree to its prefixes by their scores.
			{Mode: engine.SpecTree, Budget: 16, Policy: &adaptive.Policy{Autoregressive: true}},
		} {
			got, err := tinyPairWith(t, 11, spec, draft).Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tokens, want.Tokens) {
				t.Fatalf("T=%g %v b%d: output differs from autoregressive\n got %v\nwant %v", sampling.Temperature, spec.Mode, spec.Budget, got.Tokens, want.Tokens)
			}
		}
	}
	e := tinyPairWith(t, 11, engine.SpecOptions{Mode: engine.SpecTree, Budget: 6}, draft)
	reqs := []engine.Request{
		{Prompt: prompt, MaxTokens: 30, IgnoreEOS: true},
		{Prompt: []int32{77, 8, 150, 2}, MaxTokens: 30, IgnoreEOS: true, Sampling: engine.SamplingParams{Temperature: 0.8, Seed: 3}},
	}
	var alone []*engine.Result
	for _, r := range reqs {
		res, err := e.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		alone = append(alone, res)
	}
	for i, res := range enginetest.Batched(t, e, reqs) {
		if !slices.Equal(res.Tokens, alone[i].Tokens) {
			t.Fatalf("request %d batched: %v, alone %v", i, res.Tokens, alone[i].Tokens)
		}
	}
}

// TestDFlash2WeightParams counts a published DFlash2 drafter's parameters
// against its checkpoint's tensors (dflash/testdata/dflash2-tensors.json).
func TestDFlash2WeightParams(t *testing.T) {
	c, err := ParseConfig(readFile(t, "testdata/dflash2-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var published map[string]struct {
		Shape []int64 `json:"shape"`
	}
	readJSON(t, "testdata/dflash2-tensors.json", &published)
	var want int64
	for _, tensor := range published {
		n := int64(1)
		for _, d := range tensor.Shape {
			n *= d
		}
		want += n
	}
	if got := c.WeightParams(); got != want {
		t.Fatalf("WeightParams %d, the checkpoint holds %d", got, want)
	}
}

// TestQwen38DFlash2Config reads the Qwen3.8-27B DFlash2 drafter's config
// (dflash/testdata/qwen3.8-27b-dflash2.config.json): DFlash2 with block 8,
// and it fits the Qwen3.5/3.6-27B architecture that Qwen3.8-27B shares
// (the qwen3.6-27b preset: hidden size, vocabulary, 64 layers for its taps).
func TestQwen38DFlash2Config(t *testing.T) {
	c, err := ParseConfig(readFile(t, "testdata/qwen3.8-27b-dflash2.config.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := V2Config{ConvKernelSize: 2, ConvGroupSize: 16, SelectorRank: 256, SelectorTopK: 16, OutputMultiplier: 1, InputEmbeddingScale: 1}
	if c.V2 == nil || *c.V2 != want || c.BlockSize != 8 || c.RopeTheta != 1e7 {
		t.Fatalf("DFlash2 fields %+v, block %d, rope theta %g", c.V2, c.BlockSize, c.RopeTheta)
	}
	target, err := config.Parse(readFile(t, targetPreset))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckTarget(target); err != nil {
		t.Fatal(err)
	}
}
