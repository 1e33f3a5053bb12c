package server

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"ddflash/engine"
)

// TestLoad keeps 64 streaming clients busy on loopback for a few seconds
// (DDFLASH_SERVE_LOAD=30s for the long run) against a DDTree server and
// reports throughput and latency. Every request must succeed and the
// resources must all come back.
func TestLoad(t *testing.T) {
	const clients = 64
	duration := 3 * time.Second
	if v := os.Getenv("DDFLASH_SERVE_LOAD"); v != "" {
		var err error
		if duration, err = time.ParseDuration(v); err != nil {
			t.Fatalf("DDFLASH_SERVE_LOAD=%q: want a duration such as 30s", v)
		}
	}
	h := serveTiny(t, harnessOptions{
		spec:  engine.SpecOptions{Mode: engine.SpecTree, Budget: 4},
		sched: engine.SchedulerOptions{MaxRunning: 16, MaxQueue: clients},
	})
	type sample struct {
		latency, ttft time.Duration
		tokens        int
	}
	var mu sync.Mutex
	var samples []sample
	errs := 0
	deadline := time.Now().Add(duration)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 77))
			for time.Now().Before(deadline) {
				p := completionParams(randomPrompt(rng, 1, 20), 4+rng.IntN(28))
				p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
				began := time.Now()
				var ttft time.Duration
				s := h.client.Completions.NewStreaming(context.Background(), p)
				var tokens int64
				for s.Next() {
					if ttft == 0 {
						ttft = time.Since(began)
					}
					tokens = max(tokens, s.Current().Usage.CompletionTokens)
				}
				mu.Lock()
				if err := s.Err(); err != nil {
					errs++
					t.Errorf("client %d: %v", c, err)
				} else {
					samples = append(samples, sample{time.Since(began), ttft, int(tokens)})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if errs > 0 || len(samples) == 0 {
		t.Fatalf("%d errors, %d requests done", errs, len(samples))
	}
	var latencies, ttfts []time.Duration
	tokens := 0
	for _, s := range samples {
		latencies, ttfts, tokens = append(latencies, s.latency), append(ttfts, s.ttft), tokens+s.tokens
	}
	t.Logf("%d clients, %v: %d requests, %d tokens, %.0f tok/s, %.1f req/s; latency p50 %v p90 %v p99 %v; TTFT p50 %v p99 %v",
		clients, elapsed.Round(time.Millisecond), len(samples), tokens, float64(tokens)/elapsed.Seconds(), float64(len(samples))/elapsed.Seconds(),
		percentile(latencies, 50), percentile(latencies, 90), percentile(latencies, 99), percentile(ttfts, 50), percentile(ttfts, 99))
	waitIdle(t, h.model.Scheduler)
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(100 * time.Microsecond)
}
