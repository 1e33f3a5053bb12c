package models

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/internal/closeness"
	"ddflash/kernels/cpu"
)

// The default pair as committed (the test reads the repository's files
// directly; DefaultPair extracts the same bytes).
const targetDir, draftDir = "default/target", "default/draft"

// loadPair loads the trained pair in dir (default or demo: its target/ and
// draft/) for spec.
func loadPair(t *testing.T, dir string, spec engine.SpecOptions) *engine.Engine {
	t.Helper()
	b := cpu.New(0)
	verify, err := dflash.VerifyTokens(dir+"/draft", spec)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(b, dir+"/target", engine.Options{VerifyTokens: verify})
	if err != nil {
		t.Fatal(err)
	}
	if spec.Mode != engine.SpecAuto {
		if err := dflash.Attach(e, dir+"/draft", spec); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// TestDefaultTargetMatchesTrainingModel compares the engine's logits on
// held-out text with the float64 forward of the PyTorch code the target was
// trained with (models/testdata/golden-default.json, tools/reference/make_default_goldens.py).
func TestDefaultTargetMatchesTrainingModel(t *testing.T) {
	data, err := os.ReadFile("testdata/golden-default.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		IDs    []int32     `json:"ids"`
		Logits [][]float64 `json:"logits"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	e := loadPair(t, "default", engine.SpecOptions{})
	worst := 0.0
	for n := 1; n <= len(g.IDs); n++ {
		// One forward per prefix gives the last position's logits; the
		// engine only reports those.
		got, err := e.Generate(context.Background(), engine.Request{Prompt: g.IDs[:n], MaxTokens: 1, Sampling: engine.SamplingParams{Logprobs: 1}})
		if err != nil {
			t.Fatal(err)
		}
		want := g.Logits[n-1]
		// The engine reports log-probabilities: compare log-softmax of the reference.
		m := math.Inf(-1)
		for _, v := range want[:e.ValidVocab] {
			m = math.Max(m, v)
		}
		sum := 0.0
		for _, v := range want[:e.ValidVocab] {
			sum += math.Exp(v - m)
		}
		lp := got.Logprobs[0]
		ref := want[lp.ID] - m - math.Log(sum)
		worst = max(worst, closeness.MaxAbsDiff([]float64{lp.Logprob}, []float64{ref}))
		if best := argmax(want[:e.ValidVocab]); int32(best) != lp.Top[0].ID && !closeness.Near(want[best], want[lp.Top[0].ID], 1e-4) {
			t.Fatalf("position %d: engine's top token %d, reference's %d", n-1, lp.Top[0].ID, best)
		}
	}
	// F32 activations against float64 with the same BF16 weights.
	if worst > 1e-3 {
		t.Fatalf("log-probabilities differ from the training model by up to %g", worst)
	}
	t.Logf("max |Δ log-prob| over %d positions: %.2e", len(g.IDs), worst)
}

func argmax(v []float64) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// evalSet is a pair's eval.json (tools/train/evaluate.py): held-out
// prompts, the training code's greedy continuations and its linear τ.
type evalSet struct {
	Summary struct {
		MeanTau float64 `json:"mean_tau"`
	} `json:"summary"`
	Prompts []struct {
		PromptIDs []int32 `json:"prompt_ids"`
		GreedyIDs []int32 `json:"greedy_ids"`
		Text      string  `json:"prompt_text"`
	} `json:"prompts"`
}

func readEvalSet(t *testing.T, dir string) evalSet {
	t.Helper()
	data, err := os.ReadFile(dir + "/eval.json")
	if err != nil {
		t.Fatal(err)
	}
	var ev evalSet
	if err := json.Unmarshal(data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

// trainedPairs are the committed pairs: the embedded tiny default, whose
// target loops (which inflates τ), and the memory-bound demo pair that
// `make run` measures; each with the least linear τ over 96 and over the
// first 32 new tokens it must reach.
var trainedPairs = []struct {
	dir              string
	minTau, minTau32 float64
}{
	{"default", 5.0, 4.0},
	{"demo", 4.5, 3.5},
}

// TestPairAcceptance measures, with the Go engine at temperature 0 on each
// pair's held-out prompts, the acceptance length τ (tokens per target
// forward after the prefill token) of linear DFlash over 96 and over the
// first 32 new tokens, and of DDTree at budget 32; greedy outputs must equal
// the training code's continuations, linear τ the training code's within
// 0.1, and every speculative output the autoregressive one. The
// distinct-4-gram share is reported beside τ, and so is τ of DDTree b4
// drafting a 5-row block (--draft-depth 4), make run's cheap draft.
func TestPairAcceptance(t *testing.T) {
	for _, pair := range trainedPairs {
		t.Run(pair.dir, func(t *testing.T) {
			ev := readEvalSet(t, pair.dir)
			// tau runs 96 new tokens per prompt and returns the mean over
			// prompts of τ over the first 96 and the first 32 tokens (the
			// rounds that produced them, as tools/train/evaluate.py counts).
			tau := func(spec engine.SpecOptions) (tau96, tau32 float64, outs [][]int32) {
				e := loadPair(t, pair.dir, spec)
				defer e.Close()
				for _, p := range ev.Prompts {
					res, err := e.Generate(context.Background(), engine.Request{Prompt: p.PromptIDs, MaxTokens: 96, IgnoreEOS: true})
					if err != nil {
						t.Fatal(err)
					}
					outs = append(outs, res.Tokens)
					if st := res.Stats.SpecStats; st != nil {
						lengths := truncate(st.AcceptanceLengths, len(res.Tokens)-1)
						tau96 += tauOver(lengths, 96) / float64(len(ev.Prompts))
						tau32 += tauOver(lengths, 32) / float64(len(ev.Prompts))
					}
				}
				return tau96, tau32, outs
			}
			_, _, auto := tau(engine.SpecOptions{})
			same := 0
			for i, p := range ev.Prompts {
				if slices.Equal(auto[i], p.GreedyIDs) {
					same++
				}
			}
			if same < len(ev.Prompts)*9/10 {
				t.Errorf("only %d of %d greedy continuations equal the training code's", same, len(ev.Prompts))
			}
			linear, first32, linOut := tau(engine.SpecOptions{Mode: engine.SpecLinear})
			tree, _, treeOut := tau(engine.SpecOptions{Mode: engine.SpecTree, Budget: 32})
			short, _, shortOut := tau(engine.SpecOptions{Mode: engine.SpecTree, Budget: 4, DraftDepth: 4})
			for i := range auto {
				for _, o := range []struct {
					name string
					out  []int32
				}{{"linear", linOut[i]}, {"ddtree b32", treeOut[i]}, {"ddtree b4 depth 4", shortOut[i]}} {
					if !slices.Equal(o.out, auto[i]) {
						t.Fatalf("prompt %d: %s output differs from autoregressive", i, o.name)
					}
				}
			}
			t.Logf("τ linear %.2f (first 32: %.2f; training code's %.2f), ddtree b32 %.2f, b4 drafting 5 rows %.2f; distinct 4-gram share %.3f; %d/%d continuations equal the training code's",
				linear, first32, ev.Summary.MeanTau, tree, short, distinct4gramShare(auto), same, len(ev.Prompts))
			if linear < pair.minTau || first32 < pair.minTau32 {
				t.Errorf("linear τ %.2f over 96 tokens (want ≥ %.1f), %.2f over 32 (want ≥ %.1f)", linear, pair.minTau, first32, pair.minTau32)
			}
			if math.Abs(linear-ev.Summary.MeanTau) > 0.1 {
				t.Errorf("linear τ %.2f, the training code's %.2f", linear, ev.Summary.MeanTau)
			}
			if tree <= linear {
				t.Errorf("DDTree b32 τ %.2f is not above linear %.2f", tree, linear)
			}
		})
	}
}

// truncate cuts per-round lengths so they add up to the tokens actually
// emitted (the last round may have accepted past max tokens).
func truncate(lengths []int, total int) []int {
	out := make([]int, 0, len(lengths))
	for _, l := range lengths {
		l = min(l, total)
		out = append(out, l)
		total -= l
	}
	return out
}

// tauOver is τ over the verify rounds that produced the first n new tokens
// (the prefill produces the first): tokens those rounds produced / rounds.
func tauOver(lengths []int, n int) float64 {
	done, rounds := 0, 0
	for _, l := range lengths {
		if done >= n-1 {
			break
		}
		done += l
		rounds++
	}
	return float64(done) / float64(rounds)
}

// distinct4gramShare is the share of distinct 4-grams among all 4-grams of the outputs.
func distinct4gramShare(outs [][]int32) float64 {
	seen := map[string]bool{}
	total := 0
	for _, o := range outs {
		for i := 0; i+4 <= len(o); i++ {
			seen[fmt.Sprint(o[i:i+4])] = true
			total++
		}
	}
	return float64(len(seen)) / float64(total)
}

// TestDefaultPairExtracts checks the embedded copy: DefaultPair writes the
// same files the repository holds, and loads.
func TestDefaultPairExtracts(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	target, draft, err := DefaultPair()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want string }{{target, targetDir}, {draft, draftDir}} {
		for _, f := range []string{"config.json", "model.safetensors"} {
			a, err := os.ReadFile(c.got + "/" + f)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(c.want + "/" + f)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a, b) {
				t.Fatalf("extracted %s/%s differs from the repository's", c.got, f)
			}
		}
	}
	again, _, err := DefaultPair()
	if err != nil || again != target {
		t.Fatalf("second call: %q, %v; want the cached %q", again, err, target)
	}
}

// TestHeldoutWorkload: each pair's heldout.jsonl, the bench workload of
// its own domain (`ddflash bench --raw --workloads models/demo/heldout.jsonl`),
// holds exactly eval.json's held-out prompt texts, one single-turn
// conversation each.
func TestHeldoutWorkload(t *testing.T) {
	for _, pair := range trainedPairs {
		ev := readEvalSet(t, pair.dir)
		f, err := os.Open(pair.dir + "/heldout.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		dec := json.NewDecoder(f)
		for dec.More() {
			var conv struct{ Turns []string }
			if err := dec.Decode(&conv); err != nil {
				t.Fatal(err)
			}
			if len(conv.Turns) != 1 {
				t.Fatalf("%s: conversation %d has %d turns, want 1", pair.dir, len(got), len(conv.Turns))
			}
			got = append(got, conv.Turns[0])
		}
		f.Close()
		if len(got) != len(ev.Prompts) {
			t.Fatalf("%s: %d conversations, eval.json has %d prompts", pair.dir, len(got), len(ev.Prompts))
		}
		for i, p := range ev.Prompts {
			if got[i] != p.Text {
				t.Errorf("%s: conversation %d: %q, eval.json %q", pair.dir, i, got[i], p.Text)
			}
		}
	}
}
