package server

import (
	"context"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"ddflash/engine"
	"ddflash/mamba"
)

// TestRealEngineEndToEnd serves the tiny model under DDTree speculation
// with Qwen3.6's template and asks through the official client for two
// greedy, penalised and biased choices, streamed and not. The prompt opens
// a think block, so the whole reply is reasoning; each choice's reasoning
// must be the autoregressive engine's output for the same request
// (speculation is lossless, penalties and bias included).
func TestRealEngineEndToEnd(t *testing.T) {
	tok := qwenTokenizer(t)
	h := serveTiny(t, harnessOptions{tok: tok, spec: engine.SpecOptions{Mode: engine.SpecTree, Budget: 4, Rollback: mamba.Snapshot},
		sched: engine.SchedulerOptions{MaxRunning: 2}})
	var rendered tokenizeResponse
	postJSON(t, h, "/tokenize", `{"messages": [{"role": "user", "content": "the quick brown fox"}]}`, http.StatusOK, &rendered)
	const maxTokens = 12
	sampling := engine.SamplingParams{PresencePenalty: 0.5, FrequencyPenalty: 0.25, RepetitionPenalty: 1.3, LogitBias: map[int32]float32{40: 3, 41: -100}}
	ref := referenceRun(t, engine.Request{Prompt: rendered.Tokens, MaxTokens: maxTokens, Sampling: sampling})
	want, err := tok.Decode(ref.Tokens, true)
	if err != nil || want == "" {
		t.Fatalf("the reference reply %q: %v", want, err)
	}
	p := openai.ChatCompletionNewParams{Model: testModel, N: openai.Int(2), Temperature: openai.Float(0), MaxTokens: openai.Int(maxTokens),
		PresencePenalty: openai.Float(0.5), FrequencyPenalty: openai.Float(0.25), LogitBias: map[string]int64{"40": 3, "41": -100},
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("the quick brown fox")}}
	for _, stream := range []bool{false, true} {
		resp := chatOnce(t, h, p, stream, option.WithJSONSet("repetition_penalty", 1.3))
		if len(resp.Choices) != 2 {
			t.Fatalf("stream %v: %d choices", stream, len(resp.Choices))
		}
		for i, c := range resp.Choices {
			if got := reasoningOf(c.Message.JSON.ExtraFields); got != want || c.Message.Content != "" || string(c.FinishReason) != ref.FinishReason {
				t.Errorf("stream %v, choice %d: reasoning %q content %q finish %q; the engine alone: %q (%s)", stream, i, got, c.Message.Content, c.FinishReason, want, ref.FinishReason)
			}
		}
	}
	// Completions take n too.
	prompt := "the quick brown fox"
	ref = referenceRun(t, engine.Request{Prompt: tok.Encode(prompt), MaxTokens: maxTokens})
	if want, err = tok.Decode(ref.Tokens, true); err != nil {
		t.Fatal(err)
	}
	cp := completionParams(prompt, maxTokens)
	cp.N = openai.Int(2)
	resp, err := h.client.Completions.New(context.Background(), cp)
	if err != nil {
		t.Fatal(err)
	}
	streamedTexts := map[int64]string{}
	s := h.client.Completions.NewStreaming(context.Background(), cp)
	for s.Next() {
		for _, c := range s.Current().Choices {
			streamedTexts[c.Index] += c.Text
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 2 || len(streamedTexts) != 2 {
		t.Fatalf("completions: %d choices, %d streamed", len(resp.Choices), len(streamedTexts))
	}
	for i, c := range resp.Choices {
		if c.Index != int64(i) || c.Text != want || streamedTexts[int64(i)] != want {
			t.Errorf("completion choice %d: %q, streamed %q, want %q", i, c.Text, streamedTexts[int64(i)], want)
		}
	}
	waitIdle(t, h.model.Scheduler)
}
