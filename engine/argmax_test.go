package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/mamba"
)

// TestDeviceArgmaxMatchesHost: rows reduced on the device (SeqInput.Argmax)
// give the host argmax of the same rows over the real token ids.
func TestDeviceArgmaxMatchesHost(t *testing.T) {
	e := newTestEngine(t, "tiny", 4, Options{Context: 64})
	V, valid := e.Model.Cfg.VocabSize, e.ValidVocab
	if valid >= V {
		t.Fatalf("the preset has no padding ids (%d of %d): packing the real ids is untested", valid, V)
	}
	prompt := randomTokens(rand.New(rand.NewPCG(4, 5)), 9, valid)
	run := func(argmax bool) *SeqOutput {
		s, err := e.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer e.release(s)
		out, err := e.forward(s, SeqInput{Tokens: prompt, Logits: AllRows, Argmax: argmax}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	full, reduced := run(false), run(true)
	if reduced.Logits != nil || len(reduced.Argmax) != len(prompt) {
		t.Fatalf("reduced output: %d logits, %d argmaxes; want none and %d", len(reduced.Logits), len(reduced.Argmax), len(prompt))
	}
	for i, got := range reduced.Argmax {
		if want := int32(Argmax(full.Logits[i*V : i*V+valid])); got != want {
			t.Errorf("row %d: device argmax %d, host %d", i, got, want)
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
		want bool
	}{
		{Request{Prompt: prompt, MaxTokens: 30}, true},
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Logprobs: 1}}, false},
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{Temperature: 1}}, false},
		{Request{Prompt: prompt, MaxTokens: 30, MinTokens: 2}, false}, // EOS masked at first
		{Request{Prompt: prompt, MaxTokens: 30, Sampling: SamplingParams{PresencePenalty: 1}}, false},
	} {
		j, err := ar.newJob(c.r)
		if err != nil {
			t.Fatal(err)
		}
		in, err := j.prepare(512)
		j.close()
		if err != nil || in.Argmax != c.want {
			t.Fatalf("%+v: device argmax %v (err %v), want %v", c.r, in.Argmax, err, c.want)
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
