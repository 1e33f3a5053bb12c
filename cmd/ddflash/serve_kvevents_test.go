package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"ddflash/kvevents/kveventstest"
)

// TestServeKVEvents runs serve with --kv-events-endpoint and the prefix
// cache, sends prompts until a subscriber (connected once serve answers)
// receives their blocks on the default topic, and reads the published
// count from /metrics without the API key.
func TestServeKVEvents(t *testing.T) {
	target, _ := tinyModelDirs(t)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eventsAddr := probe.Addr().String()
	probe.Close()
	ctx, cancel := context.WithCancel(context.Background())
	base, done := startServe(ctx, t, []string{"--model", target, "--gpu-mem", "1GiB", "--addr", "127.0.0.1:0", "--threads", "1", "--api-key", "k",
		"--prefix-cache-slots", "2", "--kv-events-endpoint", "tcp://" + eventsAddr}, nil)
	sub := kveventstest.Subscribe(t, "tcp://"+eventsAddr, "kv@")
	rng := rand.New(rand.NewPCG(1, 2))
	var stored *kveventstest.Message
	for attempt := 0; stored == nil && attempt < 50; attempt++ {
		prompt := make([]string, 70)
		for i := range prompt {
			prompt[i] = fmt.Sprint(rng.IntN(256))
		}
		req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(`{"prompt": [`+strings.Join(prompt, ",")+`], "max_tokens": 1}`))
		req.Header.Set("Authorization", "Bearer k")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %v %v", resp, err)
		}
		resp.Body.Close()
		for {
			m, ok := sub.Receive(t, 100*time.Millisecond)
			if !ok {
				break
			}
			if len(m.Events) > 0 && m.Events[0].Kind == "BlockStored" {
				stored = &m
				break
			}
		}
	}
	if stored == nil {
		t.Fatal("no BlockStored event arrived")
	}
	if ev := stored.Events[0]; stored.Topic != "kv@127.0.0.1:0@tiny" || len(ev.Tokens) != 64 || len(ev.Hashes)*ev.BlockSize != 64 || ev.Parent != 0 {
		t.Errorf("stored: topic %q, %d blocks of %d tokens with %d tokens, parent %d; want kv@127.0.0.1:0@tiny, the prompt's 64-token chunk, no parent",
			stored.Topic, len(ev.Hashes), ev.BlockSize, len(ev.Tokens), ev.Parent)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	const counter = `ddflash:kv_events_published_total{model_name="tiny"} `
	_, count, _ := strings.Cut(string(body), counter)
	if resp.StatusCode != http.StatusOK || count == "" || strings.HasPrefix(count, "0\n") {
		t.Errorf("/metrics without a key: %d, %s%.10s", resp.StatusCode, counter, count)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve after shutdown: %v", err)
	}
}
