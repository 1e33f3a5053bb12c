package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/mamba"
)

// paddedEngine is a tiny engine whose vocabulary has padding rows beyond
// its valid real ids.
func paddedEngine(t *testing.T) (e *Engine, V, valid int) {
	e = newTestEngine(t, "tiny", 4, Options{Context: 64})
	V, valid = e.Model.Cfg.VocabSize, e.ValidVocab
	if valid >= V {
		t.Fatalf("the preset has no padding ids (%d of %d)", valid, V)
	}
	return e, V, valid
}

// TestDeviceTopMatchesHost: rows reduced on the device (SeqInput.Top) give
// the host's best logits of the same rows over the real token ids, in
// order (ties: the lower id), with their values: the argmax for Top 1.
func TestDeviceTopMatchesHost(t *testing.T) {
	e, V, valid := paddedEngine(t)
	prompt := randomTokens(rand.New(rand.NewPCG(4, 5)), 9, valid)
	run := func(top int) *SeqOutput {
		s, err := e.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer e.release(s)
		out, err := e.forward(s, SeqInput{Tokens: prompt, Logits: AllRows, Top: top}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	full := run(0)
	for _, k := range []int{1, 7} {
		reduced := run(k)
		if reduced.Logits != nil || reduced.Top != k || len(reduced.TopIDs) != k*len(prompt) || len(reduced.TopLogits) != k*len(prompt) {
			t.Fatalf("top %d: %d logits, %d ids and %d values; want none, %d and %d", k, len(reduced.Logits), len(reduced.TopIDs), len(reduced.TopLogits), k*len(prompt), k*len(prompt))
		}
		for i := range prompt {
			row := full.Logits[i*V : i*V+valid]
			if got, want := reduced.TopIDs[i*k], int32(Argmax(row)); got != want {
				t.Errorf("row %d: device argmax %d, host %d", i, got, want)
			}
			want := selectTopK(nil, row, k, noFloor)
			slices.SortFunc(want, byRank)
			for j, c := range want {
				if reduced.TopIDs[i*k+j] != c.id || reduced.TopLogits[i*k+j] != c.logit {
					t.Errorf("row %d rank %d: device %d (%g), host %d (%g)", i, j, reduced.TopIDs[i*k+j], reduced.TopLogits[i*k+j], c.id, c.logit)
				}
			}
		}
	}
}

// TestGreedyDeviceArgmaxEqualsFullRows: greedy decoding that moves argmaxes
// (the default) and greedy decoding that moves whole rows (logprobs on)
// produce the same tokens, autoregressive and speculative.
func TestGreedyDeviceArgmaxEqualsFullRows(t *testing.T) {
	const ctxLen, seed = 64, 6
	prompt := randomTokens(rand.New(rand.NewPCG(6, 7)), 5, 290)
	ar := newTestEngine(t, specTarget(seed), seed, Options{Context: ctxLen})
	want, err := ar.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Logprobs: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r    Request
		want int
	}{
		{Request{Prompt: prompt, MaxTokens: 30}, 1},
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Logprobs: 1}}, 0},
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Temperature: 1}}, 0},
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Temperature: 1, TopK: 5, TopP: 0.9}}, 5},
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Temperature: 1, TopK: 5, Logprobs: 2}}, 0},
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Temperature: 1, TopK: maxDeviceTop + 1}}, 0},
		{Request{Prompt: prompt, MaxTokens: 30, MinTokens: 2}, 0}, // EOS masked at first
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{PresencePenalty: 1}}, 0},
	} {
		j, err := ar.newJob(c.r)
		if err != nil {
			t.Fatal(err)
		}
		in, err := j.prepare(512)
		j.close()
		if err != nil || in.Top != c.want {
			t.Fatalf("%+v: device top %d (err %v), want %d", c.r, in.Top, err, c.want)
		}
	}
	engines := map[string]*Engine{"auto": ar,
		"linear": specEngine(t, seed, specCase{SpecLinear, 0, mamba.Replay}, pathOracle(concat(prompt, want.Tokens)), 0.2, ctxLen),
		"ddtree": specEngine(t, seed, specCase{SpecTree, 8, mamba.Snapshot}, pathOracle(concat(prompt, want.Tokens)), 0.2, ctxLen)}
	for name, e := range engines {
		got, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 30})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Errorf("%s: argmax path %v, full rows %v", name, got.Tokens, want.Tokens)
		}
	}
}

// TestSampledDeviceTopEqualsFullRows: top-k sampling from the candidates
// the device moves (the default) and from whole rows (logprobs on) draws
// the same tokens for the same seed, autoregressive and speculative, with
// min-p and top-p on top of top-k.
func TestSampledDeviceTopEqualsFullRows(t *testing.T) {
	const ctxLen, seed = 64, 7
	prompt := randomTokens(rand.New(rand.NewPCG(8, 9)), 5, 290)
	engines := map[string]*Engine{"auto": newTestEngine(t, specTarget(seed), seed, Options{Context: ctxLen}),
		"linear": specEngine(t, seed, specCase{SpecLinear, 0, mamba.Replay}, pathOracle(), 0.2, ctxLen),
		"ddtree": specEngine(t, seed, specCase{SpecTree, 8, mamba.Snapshot}, pathOracle(), 0.2, ctxLen)}
	for name, e := range engines {
		for _, p := range []SamplingParams{{Temperature: 1.2, TopK: 12, Seed: 5}, {Temperature: 0.8, TopK: 40, TopP: 0.9, MinP: 0.02, Seed: 6}} {
			reduced, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 24, IgnoreEOS: true, Sampling: p})
			if err != nil {
				t.Fatal(err)
			}
			p.Logprobs = 1
			full, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 24, IgnoreEOS: true, Sampling: p})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(reduced.Tokens, full.Tokens) {
				t.Errorf("%s %+v: device candidates %v, full rows %v", name, p, reduced.Tokens, full.Tokens)
			}
		}
	}
}

// TestPaddingRowsAreNotScored: the LM head scores the real token ids only.
// Their logits are bit-identical to scoring every row, one row or many at
// once, and the padding ids' logits are -Inf.
func TestPaddingRowsAreNotScored(t *testing.T) {
	e, V, valid := paddedEngine(t)
	prompt := randomTokens(rand.New(rand.NewPCG(6, 5)), 9, valid)
	run := func(scored int) (rows, last []float32) {
		e.Model.ValidVocab = scored
		defer func() { e.Model.ValidVocab = valid }()
		s, err := e.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer e.release(s)
		out, err := e.forward(s, SeqInput{Tokens: prompt, Logits: AllRows}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if last, err = e.step(s, prompt[0]); err != nil {
			t.Fatal(err)
		}
		return out.Logits, last
	}
	allRows, allLast := run(V)
	rows, last := run(valid)
	for name, c := range map[string][2][]float32{"prompt rows": {rows, allRows}, "decode row": {last, allLast}} {
		got, want := c[0], c[1]
		for i := range len(want) / V {
			row := got[i*V : (i+1)*V]
			if !slices.Equal(row[:valid], want[i*V:i*V+valid]) {
				t.Errorf("%s: row %d: the real ids' logits differ from scoring every row", name, i)
			}
			for id, x := range row[valid:] {
				if !math.IsInf(float64(x), -1) {
					t.Fatalf("%s: row %d: padding id %d has logit %g, want -Inf", name, i, valid+id, x)
				}
			}
		}
	}
}
