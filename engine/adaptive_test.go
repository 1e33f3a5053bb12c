package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"ddflash/adaptive"
	"ddflash/mamba"
)

// adaptiveEngine is specEngine with a tree of up to budget nodes whose size
// the policy chooses every step.
func adaptiveEngine(t *testing.T, seed uint64, autoregressive bool, rollback mamba.Strategy, next func([]int32) int32, noise float64, ctxLen int, opts Options) (*Engine, *adaptive.Policy) {
	e := specEngineBlock(t, "tiny", seed, specCase{SpecTree, 32, rollback}, next, noise, ctxLen, 16, opts)
	p := &adaptive.Policy{Autoregressive: autoregressive}
	e.Spec.Policy = p
	return e, p
}

// TestAdaptiveGreedyIsLossless compares the adaptive budget (always
// speculating, and free to decode autoregressively) with autoregressive
// decoding: drafts from perfect to useless, both rollbacks, max tokens
// inside a block, the context limit, and seeded sampling. The policy only
// chooses which proposal is verified, so the output must not change.
func TestAdaptiveGreedyIsLossless(t *testing.T) {
	const ctxLen = 64
	rng := rand.New(rand.NewPCG(21, 22))
	type job struct {
		prompt    []int32
		maxTokens int
		noise     float64
		temp      float64
	}
	jobs := []job{
		{randomTokens(rng, 5, 290), 40, 0, 0},
		{randomTokens(rng, 9, 290), 40, 0.3, 0},
		{randomTokens(rng, 12, 290), 9, 0.5, 0},
		{randomTokens(rng, 50, 290), 30, 0.1, 0}, // runs into the context limit
		{randomTokens(rng, 3, 290), 45, 1, 0},    // useless drafts
		{randomTokens(rng, 4, 290), 40, 0.2, 0.9},
	}
	for ji, j := range jobs {
		req := Request{Prompt: j.prompt, MaxTokens: j.maxTokens, Sampling: SamplingParams{Temperature: j.temp, Seed: 3}}
		want, err := newTestEngine(t, "tiny", 3, Options{Context: ctxLen}).Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, autoregressive := range []bool{false, true} {
			for _, rb := range []mamba.Strategy{mamba.Replay, mamba.Snapshot} {
				name := fmt.Sprintf("job %d autoregressive=%v %v", ji, autoregressive, rb)
				e, p := adaptiveEngine(t, 3, autoregressive, rb, pathOracle(concat(j.prompt, want.Tokens)), j.noise, ctxLen, Options{})
				got, err := e.Generate(context.Background(), req)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !slices.Equal(got.Tokens, want.Tokens) || got.FinishReason != want.FinishReason {
					t.Fatalf("%s: output differs from autoregressive\n got %v (%s)\nwant %v (%s)", name, got.Tokens, got.FinishReason, want.Tokens, want.FinishReason)
				}
				st := got.Stats.SpecStats
				if st.Policy == nil || st.Policy.Mode != p.Name() || st.Mode != p.Name() || len(st.Policy.StepMs) < 2 {
					t.Fatalf("%s: stats %+v: want the policy's snapshot with a measured curve", name, st)
				}
				if j.noise == 1 && !(st.TreeNodes < 32) {
					t.Errorf("%s: useless drafts still got %.1f nodes a step: the calibration did not learn", name, st.TreeNodes)
				}
			}
		}
	}
}

// TestAdaptiveResumesDrafting starts a request where the policy has seen
// drafts not pay: after its first decoding step (where its schedule
// starts) it decodes autoregressively until the engine's next probe (a
// probe interval after the stop, 5 steps at the preset cost), then its
// probe draft takes in those steps' hidden states at once and, with
// perfect drafts, pays, so it drafts on.
// The output stays the autoregressive one.
func TestAdaptiveResumesDrafting(t *testing.T) {
	const ctxLen = 64
	prompt := randomTokens(rand.New(rand.NewPCG(5, 6)), 6, 290)
	req := Request{Prompt: prompt, MaxTokens: 40}
	want, err := newTestEngine(t, "tiny", 3, Options{Context: ctxLen}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	e, p := adaptiveEngine(t, 3, true, mamba.Replay, pathOracle(concat(prompt, want.Tokens)), 0, ctxLen, Options{})
	// Preset costs that this run's own measurements cannot move (a full
	// window each, the plain step's longest, far below them): a flat step
	// and a drafter at 0.625 of one, so a draft that wins nothing loses
	// 0.625 steps and the probe interval is 20 steps (the first probe after
	// a full window of drafts comes a quarter of it, 5 steps, on); perfect
	// drafts pay.
	for range 64 {
		p.Cost.ObserveStep(1, 1, time.Microsecond)
		p.Cost.ObserveStep(1, 33, time.Microsecond)
		p.Cost.ObserveDraft(625*time.Nanosecond, true)
	}
	b := p.StartBackoff(1)
	for range 8 { // a window of hopeless drafts: the engine's drafts do not pay
		p.Allot([]adaptive.Draft{{Probs: []float64{1e-4}, Depths: []int32{1}}}, adaptive.Rest{}, []*adaptive.Backoff{&b})
	}
	got, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Tokens, want.Tokens) {
		t.Fatalf("output differs from autoregressive\n got %v\nwant %v", got.Tokens, want.Tokens)
	}
	lengths := got.Stats.SpecStats.AcceptanceLengths
	if len(lengths) < 7 || slices.Max(lengths[:6]) != 1 || lengths[6] < 2 {
		t.Errorf("steps' committed tokens %v: want 1 + 5 autoregressive steps, then accepted drafts", lengths)
	}
}

// TestAdaptiveSchedulerIsLossless batches concurrent greedy requests under
// the adaptive policy, which allots the verify rows across them, and
// compares each output with the request run alone.
func TestAdaptiveSchedulerIsLossless(t *testing.T) {
	const seed, ctxLen = 8, 128
	rng := rand.New(rand.NewPCG(13, 14))
	reqs, answers := randomRequests(t, newTestEngine(t, "tiny", seed, Options{Context: ctxLen}), rng, 12, 40, 50)
	for _, autoregressive := range []bool{false, true} {
		e, p := adaptiveEngine(t, seed, autoregressive, mamba.Replay, pathOracle(answers...), 0.4, ctxLen, Options{MaxSeqs: 4, PrefillChunk: 16})
		s := runScheduler(t, e, SchedulerOptions{StepPrefill: 24})
		for i, st := range submitAll(t, s, reqs) {
			res, err := st.Wait()
			if err != nil {
				t.Fatalf("%s request %d: %v", p.Name(), i, err)
			}
			if want := answers[i][len(reqs[i].Prompt):]; !slices.Equal(res.Tokens, want) {
				t.Fatalf("%s request %d: batched output differs from alone\n got %v\nwant %v", p.Name(), i, res.Tokens, want)
			}
		}
		waitIdle(t, s)
		if c := p.Calibration.Report(); c.Steps == 0 || len(c.Depths) == 0 {
			t.Errorf("%s: no calibration after serving: %+v", p.Name(), c)
		}
	}
}

func TestAdaptiveNeedsATree(t *testing.T) {
	e, _ := adaptiveEngine(t, 1, true, mamba.Replay, pathOracle(), 0, 32, Options{})
	e.Spec.Mode = SpecLinear
	if _, err := e.Generate(context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 4}); err == nil || !strings.Contains(err.Error(), "needs spec mode ddtree") {
		t.Errorf("an adaptive policy on the linear chain: %v", err)
	}
}

// TestVerifyBucket: where steps are recorded, a cut draft verifies its
// rows rounded up to a power of two, never more nodes than were drafted,
// and a draft cut to nothing stays a plain step.
func TestVerifyBucket(t *testing.T) {
	for _, c := range []struct{ nodes, drafted, want int }{
		{0, 16, 0}, {1, 16, 1}, {2, 16, 3}, {3, 16, 3}, {4, 16, 7}, {7, 16, 7},
		{8, 16, 15}, {15, 16, 15}, {16, 16, 16}, {9, 12, 12}, {5, 5, 5}, {2, 2, 2},
	} {
		if got := verifyBucket(c.nodes, c.drafted); got != c.want {
			t.Errorf("verifyBucket(%d of %d drafted) = %d, want %d", c.nodes, c.drafted, got, c.want)
		}
	}
}
