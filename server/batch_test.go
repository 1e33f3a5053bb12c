package server

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"ddflash/engine"
)

// TestConcurrentStreamsMatchAlone runs 32 concurrent streaming clients with
// greedy requests against the server in every spec mode and compares each
// answer with the same request run alone on the reference engine.
func TestConcurrentStreamsMatchAlone(t *testing.T) {
	const clients = 32
	_, _, tok := modelDirs(t)
	rng := rand.New(rand.NewPCG(21, 22))
	type job struct {
		params openai.CompletionNewParams
		want   answer
	}
	jobs := make([]job, clients)
	for i := range jobs {
		prompt := randomPrompt(rng, 1, 40) // up to about 150 tokens: prefilled in chunks
		maxTokens := 1 + rng.IntN(48)
		p := completionParams(prompt, maxTokens)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		jobs[i] = job{p, referenceAnswer(t, tok.Encode(prompt), maxTokens)}
	}
	for _, spec := range specModes {
		t.Run(specName(spec), func(t *testing.T) {
			h := serveTiny(t, harnessOptions{spec: spec, sched: engine.SchedulerOptions{MaxRunning: 16, MaxQueue: clients, StepPrefill: 48}})
			var wg sync.WaitGroup
			for i, j := range jobs {
				wg.Go(func() {
					got, err := streamCompletion(context.Background(), h.client, j.params)
					switch {
					case err != nil:
						t.Errorf("client %d: %v", i, err)
					case got.text != j.want.text || got.finish != j.want.finish || got.usage.CompletionTokens != int64(len(j.want.tokens)):
						t.Errorf("client %d: got %q (%s, %d tokens), alone %q (%s, %d tokens)",
							i, got.text, got.finish, got.usage.CompletionTokens, j.want.text, j.want.finish, len(j.want.tokens))
					}
				})
			}
			wg.Wait()
			waitIdle(t, h.model.Scheduler)
		})
	}
}

// BenchmarkServerBatching serves 16 requests one after another and 16 at
// once, interleaved in each iteration so a busy machine slows both alike, and
// reports at-once time / one-by-one time (below 1: batching pays). The tiny
// model's weights sit in cache, so a CPU step costs nearly the same per row
// batched or not (about 0.65 with the SIMD kernels); on a model whose weights
// stream from memory a batched step reads them once for all rows, and pays
// far more. A wall-clock ratio is no unit test: it flakes on a loaded machine.
func BenchmarkServerBatching(b *testing.B) {
	const n, tokens = 16, 32
	h := serveTiny(b, harnessOptions{sched: engine.SchedulerOptions{MaxRunning: n}})
	rng := rand.New(rand.NewPCG(5, 6))
	params := make([]openai.CompletionNewParams, n)
	for i := range params {
		params[i] = completionParams(randomPrompt(rng, 4, 12), tokens)
	}
	run := func(p openai.CompletionNewParams) {
		got, err := h.client.Completions.New(context.Background(), p, option.WithJSONSet("ignore_eos", true))
		if err != nil {
			b.Error(err)
		} else if got.Usage.CompletionTokens != tokens {
			b.Errorf("%d tokens, want %d", got.Usage.CompletionTokens, tokens)
		}
	}
	var sequential, concurrent time.Duration
	for range b.N {
		start := time.Now()
		for _, p := range params {
			run(p)
		}
		sequential += time.Since(start)
		start = time.Now()
		var wg sync.WaitGroup
		for _, p := range params {
			wg.Go(func() { run(p) })
		}
		wg.Wait()
		concurrent += time.Since(start)
	}
	b.ReportMetric(concurrent.Seconds()/sequential.Seconds(), "at-once/one-by-one")
}

// TestDisconnectsFreeEverything mixes clients that disconnect mid-stream,
// clients that time out, bad requests and stop strings with normal ones,
// and checks that every KV page and state slot is back in the free pool.
func TestDisconnectsFreeEverything(t *testing.T) {
	h := serveTiny(t, harnessOptions{spec: engine.SpecOptions{Mode: engine.SpecTree, Budget: 8}, sched: engine.SchedulerOptions{MaxRunning: 4, MaxQueue: 64}})
	rng := rand.New(rand.NewPCG(9, 10))
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	count := func(what string) {
		mu.Lock()
		outcomes[what]++
		mu.Unlock()
	}
	for i := range 32 {
		p := completionParams(randomPrompt(rng, 2, 30), 60)
		timeout := time.Duration(1+rng.IntN(30)) * time.Millisecond
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ignoreEOS := option.WithJSONSet("ignore_eos", true)
			switch i % 4 {
			case 0: // disconnects after the first chunk
				s := h.client.Completions.NewStreaming(ctx, p, ignoreEOS)
				if s.Next() {
					cancel()
					count("disconnected")
				}
				s.Close()
			case 1: // gives up waiting
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				_, err := h.client.Completions.New(ctx, p, ignoreEOS)
				if errors.Is(err, context.DeadlineExceeded) {
					count("timed out")
				}
			case 2: // asks for the impossible
				p.MaxTokens = openai.Int(testContext)
				_, err := h.client.Completions.New(ctx, p)
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
					t.Errorf("max_tokens over the context: %v", err)
				}
			case 3: // stops at the first space, inside the engine's output
				p.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(" ")}
				if _, err := h.client.Completions.New(ctx, p, ignoreEOS); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if outcomes["disconnected"] == 0 || outcomes["timed out"] == 0 {
		t.Fatalf("outcomes %v: the test should see disconnects and timeouts", outcomes)
	}
	waitIdle(t, h.model.Scheduler)
	if aborted := scrape(t, h)[`vllm:request_success_total{finished_reason="abort"}`]; aborted == 0 {
		t.Errorf("no request counted as aborted")
	}
}
