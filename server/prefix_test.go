package server

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/openai/openai-go/v3"

	"ddflash/engine"
)

// TestPrefixCacheUsageAndMetrics sends the turns of a conversation (token
// prompts, each extending the last) to a server with the prefix cache on,
// plain and streamed, and checks each answer against the engine without the
// cache, usage.prompt_tokens_details.cached_tokens against the reuse the
// cache must make (the previous prompt's whole 64-token GDN chunks), and
// the prefix-cache series on /metrics against the usage the clients saw.
func TestPrefixCacheUsageAndMetrics(t *testing.T) {
	h := serveTiny(t, harnessOptions{sched: engine.SchedulerOptions{MaxRunning: 1}, prefixSlots: 2})
	rng := rand.New(rand.NewPCG(41, 42))
	ctx := context.Background()
	var prompt []int32
	var prev int
	var queried, hits float64
	for turn := range 3 {
		for range 70 - 20*turn {
			prompt = append(prompt, int32(rng.IntN(256)))
		}
		want := referenceAnswer(t, prompt, 8)
		params := openai.CompletionNewParams{
			Model:     testModel,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toInt64(prompt)},
			MaxTokens: openai.Int(8), Temperature: openai.Float(0),
		}
		cached := int64(prev / 64 * 64)
		got, err := h.client.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if got.Choices[0].Text != want.text {
			t.Errorf("turn %d: %q, without the cache %q", turn, got.Choices[0].Text, want.text)
		}
		checkUsage(t, got.Usage, len(prompt), len(want.tokens))
		if c := got.Usage.PromptTokensDetails.CachedTokens; c != cached {
			t.Errorf("turn %d (%d prompt tokens): cached_tokens %d, want %d", turn, len(prompt), c, cached)
		}
		// The same prompt again, streamed: its whole chunks are cached now,
		// and at least one token is always prefilled.
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		s, err := streamCompletion(ctx, h.client, params)
		if err != nil {
			t.Fatal(err)
		}
		again := int64((len(prompt) - 1) / 64 * 64)
		if s.text != want.text || s.usage.PromptTokensDetails.CachedTokens != again {
			t.Errorf("turn %d streamed: %q cached %d, want %q cached %d", turn, s.text, s.usage.PromptTokensDetails.CachedTokens, want.text, again)
		}
		queried += 2 * float64(len(prompt))
		hits += float64(cached + again)
		prompt = append(prompt, want.tokens...)
		prev = len(prompt) - len(want.tokens)
	}
	m := scrape(t, h)
	if m["vllm:prefix_cache_queries_total"] != queried || m["vllm:prefix_cache_hits_total"] != hits || hits == 0 {
		t.Errorf("prefix cache queries %v hits %v, want %v and %v", m["vllm:prefix_cache_queries_total"], m["vllm:prefix_cache_hits_total"], queried, hits)
	}
	if c := m["ddflash:prefix_cache_checkpoints"]; c < 1 || c > 2 {
		t.Errorf("checkpoints gauge %v, want 1 or 2 (the cache holds 2)", c)
	}
}
