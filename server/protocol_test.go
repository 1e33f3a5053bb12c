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
