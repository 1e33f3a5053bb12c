package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"ddflash/internal/closeness"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

// longGolden is testdata/long-h256.json, written by
// tools/reference/make_long_golden.py from the float64 reference.
type longGolden struct {
	SHA256             string      `json:"model_safetensors_sha256"`
	Prompt             []int32     `json:"prompt"`
	Positions          []int       `json:"positions"`
	PromptLogits       [][]float64 `json:"prompt_logits"`
	Continuation       []int32     `json:"continuation"`
	ContinuationLogits [][]float64 `json:"continuation_logits"`
}

// TestLongContext prefills a 32,768-token prompt in the engine's chunks on
// long-h256 (Qwen3.6's head dims: one attention layer of 256-wide heads, one
// GDN layer of 128-wide heads, 3 value heads per key head), compares the
// logits at sampled prompt positions and at decode steps after it with the
// float64 reference, then checks that linear and DDTree speculative
// decoding at that depth reproduce autoregressive decoding token for token.
func TestLongContext(t *testing.T) {
	if testing.Short() {
		t.Skip("prefills 32,768 tokens several times")
	}
	var g longGolden
	data, err := os.ReadFile("testdata/long-h256.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	dir := writeTestModel(t, "long-h256", 1, "bf16")
	weights, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(weights); hex.EncodeToString(sum[:]) != g.SHA256 {
		t.Fatalf("regenerated checkpoint differs from the one the reference read: rerun tools/reference/make_long_golden.py")
	}
	ctxLen := len(g.Prompt) + 64
	e, err := Load(cpu.New(2), dir, Options{Context: ctxLen, VerifyTokens: 33})
	if err != nil {
		t.Fatal(err)
	}
	V, valid := e.Model.Cfg.VocabSize, e.ValidVocab
	// The reference scores every row; the engine only the real ids, and
	// gives the padding ids -Inf.
	check := func(what string, got []float32, want []float64) {
		t.Helper()
		if d, scale := closeness.MaxAbsDiff(got[:valid], want[:valid]), closeness.Scale(want[:valid]); d > 1e-4*scale {
			t.Errorf("%s: logits differ from the float64 reference by %.3g (scale %.3g)", what, d, scale)
		}
		if i := slices.IndexFunc(got[valid:], func(x float32) bool { return !math.IsInf(float64(x), -1) }); i >= 0 {
			t.Errorf("%s: padding id %d has logit %g, want -Inf", what, valid+i, got[valid+i])
		}
	}

	s, err := e.newSequence()
	if err != nil {
		t.Fatal(err)
	}
	next := 0 // the next sampled position to check
	for start := 0; start < len(g.Prompt); start += e.opts.PrefillChunk {
		chunk := g.Prompt[start:min(start+e.opts.PrefillChunk, len(g.Prompt))]
		rows := NoRows
		if next < len(g.Positions) && g.Positions[next] < start+len(chunk) {
			rows = AllRows
		}
		out, err := e.forward(s, SeqInput{Tokens: chunk, Logits: rows}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for ; next < len(g.Positions) && g.Positions[next] < start+len(chunk); next++ {
			r := g.Positions[next] - start
			check(fmt.Sprintf("prompt position %d", g.Positions[next]), out.Logits[r*V:(r+1)*V], g.PromptLogits[next])
		}
	}
	if next != len(g.Positions) {
		t.Fatalf("checked %d of %d sampled positions", next, len(g.Positions))
	}
	for i, tok := range g.Continuation {
		logits, err := e.step(s, tok)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("decode step %d", i), logits, g.ContinuationLogits[i])
	}
	e.release(s)

	req := Request{Prompt: g.Prompt, MaxTokens: 40}
	ar, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []specCase{{SpecLinear, 0, mamba.Replay}, {SpecTree, 16, mamba.Snapshot}} {
		setOracleDrafter(e, 1, c, pathOracle(concat(g.Prompt, ar.Tokens)), 0.3, 16)
		got, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		if !slices.Equal(got.Tokens, ar.Tokens) || got.FinishReason != ar.FinishReason {
			t.Fatalf("%v after %d tokens: spec output differs from autoregressive\n got %v (%s)\nwant %v (%s)",
				c, len(g.Prompt), got.Tokens, got.FinishReason, ar.Tokens, ar.FinishReason)
		}
		if got.Stats.AcceptanceLength <= 1.5 {
			t.Errorf("%v: oracle drafts accepted only τ=%.2f: the test does not exercise acceptance", c, got.Stats.AcceptanceLength)
		}
	}
}
