package server

import (
	"context"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"ddflash/engine"
	"ddflash/kvevents"
	"ddflash/kvevents/kveventstest"
)

// scrapeFamilies reads /metrics without a key, as the llm-d EPP's scraper
// does, with Prometheus' own parser.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics without a key: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// protocolSample is a family's one sample, checked against the type the
// model-server protocol gives it; it fails unless the family has exactly
// one sample, labelled with the served model's name.
func protocolSample(t *testing.T, families map[string]*dto.MetricFamily, name string, typ dto.MetricType) *dto.Metric {
	t.Helper()
	f := families[name]
	switch {
	case f == nil:
		t.Fatalf("%s is missing", name)
	case f.GetType() != typ:
		t.Fatalf("%s is a %v, want a %v", name, f.GetType(), typ)
	case len(f.GetMetric()) != 1:
		t.Fatalf("%s has %d samples, want 1", name, len(f.GetMetric()))
	}
	m := f.GetMetric()[0]
	if labelValue(m, "model_name") != testModel {
		t.Errorf("%s: model_name %q, want %q", name, labelValue(m, "model_name"), testModel)
	}
	return m
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestModelServerProtocolMetrics is the contract the Gateway API Inference
// Extension's model-server protocol (and the llm-d EPP reading it) sets for
// /metrics: with an API key set, the scrape needs none; the queue and
// running gauges; vllm:kv_cache_usage_perc a 0-1 fraction; and
// vllm:cache_config_info's block_size and num_gpu_blocks labels, value 1.
// Pages that only the prefix cache holds are not in use: once the requests
// are done, usage is 0 though the cache holds their prefixes.
func TestModelServerProtocolMetrics(t *testing.T) {
	h := serveTiny(t, harnessOptions{apiKey: "k", sched: engine.SchedulerOptions{MaxRunning: 2}, prefixSlots: 2})
	kv := h.model.Engine.Model.KV
	check := func(when string) map[string]*dto.MetricFamily {
		families := scrapeFamilies(t, h.url)
		for _, name := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running"} {
			if v := protocolSample(t, families, name, dto.MetricType_GAUGE).GetGauge().GetValue(); v != 0 {
				t.Errorf("%s: %s = %v, want 0", when, name, v)
			}
		}
		if v := protocolSample(t, families, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE).GetGauge().GetValue(); v != 0 {
			t.Errorf("%s: vllm:kv_cache_usage_perc = %v, want 0 (a 0-1 fraction of the pool requests hold)", when, v)
		}
		info := protocolSample(t, families, "vllm:cache_config_info", dto.MetricType_GAUGE)
		blockSize, err1 := strconv.Atoi(labelValue(info, "block_size"))
		blocks, err2 := strconv.Atoi(labelValue(info, "num_gpu_blocks"))
		if err1 != nil || err2 != nil || blockSize != kv.PageSize() || blocks != kv.Pages() || info.GetGauge().GetValue() != 1 {
			t.Errorf("%s: vllm:cache_config_info %v = %v, want block_size %d, num_gpu_blocks %d, value 1",
				when, info.GetLabel(), info.GetGauge().GetValue(), kv.PageSize(), kv.Pages())
		}
		if p := labelValue(info, "enable_prefix_caching"); p != "True" {
			t.Errorf("%s: enable_prefix_caching %q, want True", when, p)
		}
		return families
	}
	check("idle")

	// Under load (three clients for two slots), every scrape stays in range.
	rng := rand.New(rand.NewPCG(5, 6))
	var wg sync.WaitGroup
	for range 3 {
		prompt := make([]int64, 150)
		for i := range prompt {
			prompt[i] = int64(rng.IntN(256))
		}
		wg.Go(func() {
			if _, err := h.client.Completions.New(context.Background(), openai.CompletionNewParams{Model: testModel,
				Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: prompt},
				MaxTokens: openai.Int(64), Temperature: openai.Float(0)}); err != nil {
				t.Error(err)
			}
		})
	}
	busy := make(chan struct{})
	go func() { wg.Wait(); close(busy) }()
	for done := false; !done; {
		select {
		case <-busy:
			done = true
		default:
		}
		families := scrapeFamilies(t, h.url)
		usage := protocolSample(t, families, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE).GetGauge().GetValue()
		running := protocolSample(t, families, "vllm:num_requests_running", dto.MetricType_GAUGE).GetGauge().GetValue()
		waiting := protocolSample(t, families, "vllm:num_requests_waiting", dto.MetricType_GAUGE).GetGauge().GetValue()
		if usage < 0 || usage > 1 || running < 0 || running > 2 || waiting < 0 || waiting > 3 {
			t.Fatalf("under load: usage %v, running %v, waiting %v: want usage in [0, 1], running 0..2 (2 slots), waiting 0..3", usage, running, waiting)
		}
	}
	waitQuietServer(t, h.model.Scheduler)
	if st := h.model.Scheduler.State(); st.PrefixPages == 0 || st.FreePages == st.TotalPages {
		t.Fatalf("the prefix cache holds no pages after a 150-token prompt: %+v", st)
	}
	check("requests done, the prefix cache holding pages")
}

// waitQuietServer waits until the scheduler runs no request and no
// checkpoint prefill (the prefix cache may still hold pages and slots).
func waitQuietServer(t *testing.T, s *engine.Scheduler) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := s.State(); st.Running > 0 || st.Queued > 0 || st.Checkpointing > 0; st = s.State() {
		if time.Now().After(deadline) {
			t.Fatalf("the scheduler is still busy: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRender checks vLLM's render endpoints, which a router tokenizes
// with, against an independent rendering (the tokenizer on the ChatML text
// written out by hand), against /tokenize, and against the prompt tokens a
// generation of the same body reports; and that a malformed body gets a
// 400 naming its field.
func TestRender(t *testing.T) {
	h := serveTiny(t, harnessOptions{})
	_, _, tok := modelDirs(t)
	const text = "the farmer walks to the field in the morning"
	messages := `[{"role": "system", "content": "the farmer walks"}, {"role": "user", "content": "the dog sleeps in the sun"}]`
	type usageOnly struct {
		Usage usage `json:"usage"`
	}
	for _, c := range []struct {
		name, path, body, tokenize string
		want                       []int32
	}{
		{"text prompt", "/v1/completions", `{"prompt": "` + text + `", "max_tokens": 2}`, `{"prompt": "` + text + `"}`, tok.Encode(text)},
		{"chat", "/v1/chat/completions", `{"messages": ` + messages + `, "max_tokens": 2, "stream": false}`, `{"messages": ` + messages + `}`,
			tok.Encode(chatML([2]string{"system", "the farmer walks"}, [2]string{"user", "the dog sleeps in the sun"}))},
	} {
		var got rendered
		if c.path == "/v1/completions" {
			var all []rendered
			postJSON(t, h, c.path+"/render", c.body, http.StatusOK, &all)
			if len(all) != 1 {
				t.Fatalf("%s: %d rendered prompts, want 1", c.name, len(all))
			}
			got = all[0]
		} else {
			postJSON(t, h, c.path+"/render", c.body, http.StatusOK, &got)
		}
		var tokenized tokenizeResponse
		postJSON(t, h, "/tokenize", c.tokenize, http.StatusOK, &tokenized)
		var generated usageOnly
		postJSON(t, h, c.path, c.body, http.StatusOK, &generated)
		if !slices.Equal(got.TokenIDs, c.want) || !slices.Equal(tokenized.Tokens, c.want) || generated.Usage.PromptTokens != len(c.want) || got.Model != testModel {
			t.Errorf("%s: rendered %v (model %q), /tokenize %v, a generation's prompt_tokens %d; want %v",
				c.name, got.TokenIDs, got.Model, tokenized.Tokens, generated.Usage.PromptTokens, c.want)
		}
	}
	// A prompt of token ids renders as itself.
	var ids []rendered
	postJSON(t, h, "/v1/completions/render", `{"prompt": [5, 6, 7]}`, http.StatusOK, &ids)
	if len(ids) != 1 || !slices.Equal(ids[0].TokenIDs, []int32{5, 6, 7}) {
		t.Errorf("token prompt rendered as %+v", ids)
	}

	for _, c := range []struct{ path, body, param string }{
		{"/v1/completions/render", `{}`, "prompt"},
		{"/v1/completions/render", `{"prompt": 5}`, "prompt"},
		{"/v1/completions/render", `{"prompt": "x", "max_tokens": "many"}`, "max_tokens"},
		{"/v1/completions/render", `{"prompt": "x", "model": "another"}`, "model"},
		{"/v1/chat/completions/render", `{"messages": "hello"}`, "messages"},
		{"/v1/chat/completions/render", `{"messages": [{"content": "hello"}]}`, "messages"},
		{"/v1/chat/completions/render", `{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}`, "top_logprobs"},
	} {
		rec := serve(h.srv, "POST", c.path, c.body, "")
		want := http.StatusBadRequest
		if c.param == "model" {
			want = http.StatusNotFound // as the generation answers a model it does not serve
		}
		if rec.status != want || rec.err.Param == nil || *rec.err.Param != c.param {
			t.Errorf("%s %s: %d %s, want %d naming %q", c.path, c.body, rec.status, rec.body, want, c.param)
		}
	}
}

// TestKVEventsAdvertiseResumablePrefixes serves with a KV events publisher
// and the prefix cache's two checkpoints, runs conversations that overflow
// them, and follows the events on a SUB socket as the llm-d router does:
// after each request, the blocks advertised are exactly the pages the
// cache holds (nothing evicted is still advertised), and every advertised
// prefix, sent again with one more token, is served from the cache
// (vllm:prefix_cache_hits_total rises by its length, within a page).
func TestKVEventsAdvertiseResumablePrefixes(t *testing.T) {
	pub, err := kvevents.Listen("tcp://127.0.0.1:0", "kv@127.0.0.1@"+testModel, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	h := serveTiny(t, harnessOptions{sched: engine.SchedulerOptions{MaxRunning: 1}, prefixSlots: 2,
		server: Options{KVEvents: pub}, engine: func(e *engine.Engine) { e.SetCacheEvents(pub.Publish) }})
	pageSize := h.model.Engine.Model.KV.PageSize()
	sub := kveventstest.Subscribe(t, "tcp://"+pub.Addr().String(), "kv@")
	index := kveventstest.NewIndex()
	received, removed, resent := 0, 0, 0
	// sync publishes a probe (the removal of a block never stored, which a
	// router ignores) once the engine is quiet, and reads up to it: then
	// every event of the requests before has arrived.
	probe := uint64(1) << 62
	sync := func() {
		t.Helper()
		waitQuietServer(t, h.model.Scheduler)
		probe++
		pub.Publish(engine.CacheEvent{Kind: engine.BlocksRemoved, Blocks: []uint64{probe}})
		for {
			m := sub.Next(t, 5*time.Second)
			if m.Topic != "kv@127.0.0.1@"+testModel {
				t.Fatalf("topic %q", m.Topic)
			}
			for _, ev := range m.Events {
				received++
				if ev.Kind == "BlockRemoved" && ev.Hashes[0] >= 1<<62 {
					if ev.Hashes[0] == probe {
						return
					}
					continue // an earlier probe, sent before the subscription took
				}
				if ev.Kind == "BlockRemoved" {
					removed++
				}
				if ev.Kind == "BlockStored" && (ev.BlockSize != pageSize || ev.Medium != "GPU" || ev.GroupIdx != 0 || ev.SpecKind != "full_attention") {
					t.Fatalf("stored blocks of %d tokens, medium %q, group %d, kind %q", ev.BlockSize, ev.Medium, ev.GroupIdx, ev.SpecKind)
				}
				if err := index.Apply(ev); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// The subscription takes a moment: probe until something arrives.
	for {
		probe++
		pub.Publish(engine.CacheEvent{Kind: engine.BlocksRemoved, Blocks: []uint64{probe}})
		if _, ok := sub.Receive(t, 50*time.Millisecond); ok {
			break
		}
	}
	sync()

	complete := func(prompt []int32, maxTokens int) openai.Completion {
		t.Helper()
		c, err := h.client.Completions.New(context.Background(), openai.CompletionNewParams{Model: testModel,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toInt64(prompt)},
			MaxTokens: openai.Int(int64(maxTokens)), Temperature: openai.Float(0)})
		if err != nil {
			t.Fatal(err)
		}
		return *c
	}
	rng := rand.New(rand.NewPCG(21, 22))
	random := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(rng.IntN(256))
		}
		return out
	}
	conversations := [][]int32{random(70), random(90), random(75)}
	for round := range 6 {
		i := round % len(conversations)
		complete(conversations[i], 8)
		conversations[i] = append(conversations[i], random(28)...) // the next turn
		sync()
		if held := h.model.Scheduler.State().PrefixPages; held != index.Blocks() {
			t.Fatalf("round %d: the cache holds %d pages, the events advertise %d", round, held, index.Blocks())
		}
		for _, p := range index.Prefixes() {
			before := scrape(t, h)["vllm:prefix_cache_hits_total"]
			c := complete(append(slices.Clone(p), int32(rng.IntN(256))), 1)
			cached := int(c.Usage.PromptTokensDetails.CachedTokens)
			rise := scrape(t, h)["vllm:prefix_cache_hits_total"] - before
			if cached > len(p) || cached <= len(p)-pageSize || rise != float64(cached) {
				t.Fatalf("round %d: an advertised prefix of %d tokens, sent again, reused %d (hits rose by %v); want it within a page", round, len(p), cached, rise)
			}
			resent++
			sync()
		}
	}
	if removed == 0 || resent == 0 {
		t.Fatalf("%d blocks removed, %d prefixes sent again: the test exercised too little", removed, resent)
	}
	t.Logf("%d events received, %d blocks removed, %d advertised prefixes sent again", received, removed, resent)
	if m := scrape(t, h); m["ddflash:kv_events_published_total"] < float64(received) || m["ddflash:kv_events_dropped_total"] != 0 {
		t.Errorf("published %v dropped %v, the subscriber received %d", m["ddflash:kv_events_published_total"], m["ddflash:kv_events_dropped_total"], received)
	}
}
