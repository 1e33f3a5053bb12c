package mtp

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/internal/closeness"
	"ddflash/internal/enginetest"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

const goldenDir = "../engine/testdata/golden-mtp"

// load loads the checkpoint in dir with its MTP head attached for spec,
// steps proposals per draft, with room for two sequences.
func load(t testing.TB, dir string, steps int, spec engine.SpecOptions) *engine.Engine {
	t.Helper()
	e, err := engine.Load(cpu.New(2), dir, engine.Options{VerifyTokens: spec.VerifyTokens(steps + 1), PageSize: 4, MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := Attach(e, dir, steps, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// writeTiny writes a random tiny target in dtype with an MTP head.
func writeTiny(t testing.TB, seed uint64, dtype string) string {
	t.Helper()
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: seed, DType: dtype, MTP: true}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDraftMatchesFloat64Reference drafts with the MTP head of the golden
// checkpoint (engine/testdata/golden-mtp, written by ddflash testmodel
// --mtp) and compares each step's logits and greedy token with the float64
// reference written from the published forward (tools/reference/mtp.py).
func TestDraftMatchesFloat64Reference(t *testing.T) {
	var g struct {
		Steps      int `json:"steps"`
		ValidVocab int `json:"valid_vocab"`
		Cases      []struct {
			IDs    []int32     `json:"ids"`
			Anchor int32       `json:"anchor"`
			Tokens []int32     `json:"tokens"`
			Logits [][]float64 `json:"logits"`
		} `json:"cases"`
	}
	data, err := os.ReadFile(goldenDir + "/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	e := load(t, goldenDir, g.Steps, engine.SpecOptions{Mode: engine.SpecLinear})
	if e.ValidVocab != g.ValidVocab {
		t.Fatalf("valid vocabulary %d, the golden's argmax ran over %d", e.ValidVocab, g.ValidVocab)
	}
	d := e.Drafter.(*Drafter)
	V := e.Model.Cfg.VocabSize
	for _, c := range g.Cases {
		sess, err := d.NewSession(c.IDs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sess.(engine.TokenDraftSession).DraftTokens(enginetest.TappedFeatures(t, e, c.IDs, d.TapLayers()), c.IDs, c.Anchor)
		sess.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(c.Logits)*V {
			t.Fatalf("%d logits from the head, the golden has %d rows of %d", len(got), len(c.Logits), V)
		}
		// The engine masks the padding ids past the valid vocabulary.
		var gotValid []float32
		var want []float64
		for k, row := range c.Logits {
			gotValid = append(gotValid, got[k*V:k*V+e.ValidVocab]...)
			want = append(want, row[:e.ValidVocab]...)
		}
		worst, scale := closeness.MaxAbsDiff(gotValid, want), closeness.Scale(want)
		// F32 activations (target and head) against float64, same BF16 weights.
		if worst > 1e-4*scale {
			t.Fatalf("%d committed tokens: MTP logits differ from the float64 reference by %g (scale %g)", len(c.IDs), worst, scale)
		}
		for k, tok := range c.Tokens {
			if g := int32(engine.Argmax(got[k*V : k*V+e.ValidVocab])); g != tok {
				t.Errorf("%d committed tokens, step %d: greedy token %d, reference %d", len(c.IDs), k+1, g, tok)
			}
		}
		t.Logf("%d committed tokens: max |Δ logit| %.2e at scale %.1f", len(c.IDs), worst, scale)
	}
}

// TestCacheHoldsOnlyCommittedPositions drafts in rounds (committed rows
// arriving a few at a time, each round's later steps writing K/V past
// them) and checks each round equals a fresh session given every committed
// row at once: no speculative step's K/V leaks into a later round, and each
// round pairs its rows with the right tokens.
func TestCacheHoldsOnlyCommittedPositions(t *testing.T) {
	e := load(t, writeTiny(t, 3, "f32"), 5, engine.SpecOptions{Mode: engine.SpecLinear})
	d := e.Drafter.(*Drafter)
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]int32, 40)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(e.ValidVocab))
	}
	features := enginetest.TappedFeatures(t, e, tokens, d.TapLayers())
	H := e.Model.Cfg.HiddenSize
	inc, err := d.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer inc.Close()
	done := 0
	for _, rows := range []int{7, 1, 16, 3, 12} {
		anchor := tokens[done+rows] // the token after the round's rows
		if done+rows == len(tokens) {
			anchor = 5
		}
		got, err := inc.(engine.TokenDraftSession).DraftTokens(features[done*H:(done+rows)*H], tokens[done:done+rows], anchor)
		if err != nil {
			t.Fatal(err)
		}
		done += rows
		fresh, err := d.NewSession(nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := fresh.(engine.TokenDraftSession).DraftTokens(features[:done*H], tokens[:done], anchor)
		fresh.Close()
		if err != nil {
			t.Fatal(err)
		}
		if diff := closeness.MaxAbsDiff(got, want); diff > 1e-5 {
			t.Fatalf("after %d committed rows: incremental draft differs from fresh by %g", done, diff)
		}
	}
	if _, err := inc.Draft(features[:H], 1); err == nil || !strings.Contains(err.Error(), "tokens") {
		t.Errorf("Draft without tokens: %v, want an error naming the missing tokens", err)
	}
}

// TestMTPIsLossless decodes with the MTP head (random weights: acceptance
// is rare, but every path runs) as a chain of 1, 3 and 8 steps and as a
// DDTree, on f32 and FP8 checkpoints, greedily and sampled, and compares
// the output with autoregressive decoding. (Sampled runs match token for
// token: the walk draws one sample per visited node, in position order,
// with the same seeded random numbers as autoregressive decoding.)
func TestMTPIsLossless(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dtype := range []string{"f32", "fp8"} {
		dir := writeTiny(t, 5, dtype)
		base, err := engine.Load(cpu.New(2), dir, engine.Options{PageSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer base.Close()
		for _, temp := range []float64{0, 0.9} {
			prompt := make([]int32, 1+rng.IntN(30))
			for i := range prompt {
				prompt[i] = int32(rng.IntN(base.ValidVocab))
			}
			req := engine.Request{Prompt: prompt, MaxTokens: 40, Sampling: engine.SamplingParams{Temperature: temp, Seed: 7}}
			want, err := base.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				steps int
				spec  engine.SpecOptions
			}{
				{1, engine.SpecOptions{Mode: engine.SpecLinear}},
				{3, engine.SpecOptions{Mode: engine.SpecLinear, Rollback: mamba.Snapshot}},
				{8, engine.SpecOptions{Mode: engine.SpecLinear}},
				{4, engine.SpecOptions{Mode: engine.SpecTree, Budget: 8}},
			} {
				got, err := load(t, dir, c.steps, c.spec).Generate(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got.Tokens, want.Tokens) {
					t.Fatalf("%s, T %g, %d steps, %v: output differs from autoregressive\n got %v\nwant %v", dtype, temp, c.steps, c.spec.Mode, got.Tokens, want.Tokens)
				}
			}
		}
	}
}

// TestSchedulerBatchesMTPRequests runs requests through the scheduler at
// once (their verifies batched, each drafting in its own session): each
// output equals the request decoded alone autoregressively.
func TestSchedulerBatchesMTPRequests(t *testing.T) {
	dir := writeTiny(t, 6, "f32")
	base, err := engine.Load(cpu.New(2), dir, engine.Options{PageSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	spec := engine.SpecOptions{Mode: engine.SpecLinear}
	e, err := engine.Load(cpu.New(2), dir, engine.Options{VerifyTokens: spec.VerifyTokens(4), PageSize: 4, MaxSeqs: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := Attach(e, dir, 3, spec); err != nil {
		t.Fatal(err)
	}
	s := engine.NewScheduler(e, engine.SchedulerOptions{})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { stop(); <-done }()
	rng := rand.New(rand.NewPCG(5, 6))
	var reqs []engine.Request
	var streams []*engine.Stream
	for i := range 3 {
		prompt := make([]int32, 3+rng.IntN(20))
		for j := range prompt {
			prompt[j] = int32(rng.IntN(e.ValidVocab))
		}
		req := engine.Request{Prompt: prompt, MaxTokens: 20 + 5*i, IgnoreEOS: true}
		st, err := s.Submit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		reqs, streams = append(reqs, req), append(streams, st)
	}
	for i, st := range streams {
		got, err := st.Wait()
		if err != nil {
			t.Fatal(err)
		}
		want, err := base.Generate(context.Background(), reqs[i])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) || got.Stats.SpecStats == nil || got.Stats.Mode != "linear" {
			t.Fatalf("request %d: batched MTP output differs from autoregressive (stats %+v)\n got %v\nwant %v", i, got.Stats.SpecStats, got.Tokens, want.Tokens)
		}
	}
}

// TestLoadRefusesHeadlessCheckpoint: a checkpoint without mtp.* (config
// mtp_num_hidden_layers 0) cannot draft with its head.
func TestLoadRefusesHeadlessCheckpoint(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(cpu.New(1), dir, engine.Options{VerifyTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := Attach(e, dir, 3, engine.SpecOptions{Mode: engine.SpecLinear}); err == nil || !strings.Contains(err.Error(), "mtp_num_hidden_layers 0") {
		t.Errorf("Attach on a checkpoint without an MTP head: %v", err)
	}
}

// TestTensorParallelDraftsMatch drafts with the head of a target split over
// two ranks (the head whole on rank 0, scored through the split LM head)
// and over one: the logits agree to F32 rounding.
func TestTensorParallelDraftsMatch(t *testing.T) {
	dir := writeTiny(t, 7, "f32")
	tokens := []int32{4, 80, 15, 16, 23, 42, 108, 7, 9, 200, 31}
	var drafts [][]float32
	for _, ranks := range [][]kernels.Backend{{cpu.New(2)}, {cpu.New(1), cpu.New(1)}} {
		e, err := engine.LoadParallel(ranks, dir, engine.Options{PageSize: 4, VerifyTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := Attach(e, dir, 3, engine.SpecOptions{Mode: engine.SpecLinear}); err != nil {
			t.Fatal(err)
		}
		d := e.Drafter.(*Drafter)
		s, err := d.NewSession(nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.(engine.TokenDraftSession).DraftTokens(enginetest.TappedFeatures(t, e, tokens, d.TapLayers()), tokens, 77)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		drafts = append(drafts, got)
	}
	if diff, scale := closeness.MaxAbsDiff(drafts[1], drafts[0]), closeness.Scale(drafts[0]); diff > 1e-5*scale {
		t.Fatalf("TP 2 draft logits differ from TP 1's by %g (scale %g)", diff, scale)
	}
}
