package server

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ddflash/engine"
	"ddflash/kernels"
)

// metrics are the server's Prometheus series. Names follow vLLM's so that
// existing dashboards and `vllm bench serve` read them unchanged; ddflash:
// series add what speculation over a tree needs. Every series carries the
// served model's name as model_name, as vLLM's do.
type metrics struct {
	reg *prometheus.Registry

	promptTokens, generationTokens prometheus.Counter
	// Prefix cache, in prompt tokens as vLLM counts them: looked up, and
	// of those supplied by the cache.
	prefixQueries, prefixHits prometheus.Counter
	finished                  *prometheus.CounterVec // finished_reason
	ttft, itl, tpot, e2e      prometheus.Histogram

	// Speculative decoding, counted as vLLM counts them: a draft is one
	// verify step, draft tokens are the proposed tokens (tree nodes, root
	// excluded), and per position means tree depth.
	drafts, draftTokens, accepted prometheus.Counter
	acceptedPerPos                *prometheus.CounterVec // position
	acceptLength                  prometheus.Histogram

	// cacheConfig is vLLM's info series (value 1, facts in labels), set
	// once the model is loaded: the llm-d EPP's prefix scorer reads the
	// block size and the number of blocks from it.
	cacheConfig *prometheus.GaugeVec
}

// cacheConfigLabels are vllm:cache_config_info's labels.
var cacheConfigLabels = []string{"block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching"}

// latencyBuckets span 1 ms to about 17 minutes.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 21)

func newMetrics(modelName string, state func() (engine.SchedulerState, engine.SpecOptions, bool), kvEvents EventCounts) *metrics {
	reg := prometheus.NewRegistry()
	r := prometheus.WrapRegistererWith(prometheus.Labels{"model_name": modelName}, reg)
	f := factory{r}
	m := &metrics{
		reg:              reg,
		promptTokens:     f.counter("vllm:prompt_tokens_total", "Prompt tokens of finished requests."),
		generationTokens: f.counter("vllm:generation_tokens_total", "Generated tokens."),
		prefixQueries:    f.counter("vllm:prefix_cache_queries_total", "Prompt tokens of finished requests looked up in the prefix cache."),
		prefixHits:       f.counter("vllm:prefix_cache_hits_total", "Prompt tokens of finished requests reused from the prefix cache."),
		finished: f.counterVec("vllm:request_success_total", "Requests ended, by finish reason (stop, length, abort).",
			"finished_reason"),
		ttft:        f.histogram("vllm:time_to_first_token_seconds", "Time from request submission to its first token.", latencyBuckets),
		itl:         f.histogram("vllm:inter_token_latency_seconds", "Time between a request's outputs; one output holds every token a verify step accepted.", latencyBuckets),
		tpot:        f.histogram("vllm:request_time_per_output_token_seconds", "Per request: (latency - time to first token) / (output tokens - 1).", latencyBuckets),
		e2e:         f.histogram("vllm:e2e_request_latency_seconds", "Time from request submission to its end.", latencyBuckets),
		drafts:      f.counter("vllm:spec_decode_num_drafts_total", "Speculative verify steps."),
		draftTokens: f.counter("vllm:spec_decode_num_draft_tokens_total", "Tokens proposed for verification (tree nodes, root excluded)."),
		accepted:    f.counter("vllm:spec_decode_num_accepted_tokens_total", "Proposed tokens the target accepted."),
		acceptedPerPos: f.counterVec("vllm:spec_decode_num_accepted_tokens_per_pos_total",
			"Verify steps that accepted a token at this position (tree depth - 1).", "position"),
		acceptLength: f.histogram("ddflash:spec_decode_acceptance_length",
			"Tokens committed per verify step: accepted drafts plus the bonus token. _sum/_count over an interval is the mean acceptance length.",
			prometheus.LinearBuckets(1, 1, 16)),
		cacheConfig: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:cache_config_info",
			Help: "The KV cache's configuration, in labels (value 1): block_size is the tokens per KV page, num_gpu_blocks the pages."}, cacheConfigLabels),
	}
	r.MustRegister(m.cacheConfig)
	gauge := func(name, help string, v func(engine.SchedulerState, engine.SpecOptions) float64) {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			st, spec, ok := state()
			if !ok {
				return 0
			}
			return v(st, spec)
		}))
	}
	gauge("vllm:num_requests_running", "Requests decoding.", func(s engine.SchedulerState, _ engine.SpecOptions) float64 {
		return float64(s.Running)
	})
	gauge("vllm:num_requests_waiting", "Requests queued for admission.", func(s engine.SchedulerState, _ engine.SpecOptions) float64 {
		return float64(s.Queued)
	})
	gauge("vllm:kv_cache_usage_perc", "Share of the binding cache pool in use by requests (0-1): KV pages or request state slots (of --max-running-requests), whichever is fuller. "+
		"As in vLLM, prefix-cache pages no request holds are not in use: a request that needs them evicts them.", func(s engine.SchedulerState, _ engine.SpecOptions) float64 {
		return cacheUsage(s)
	})
	gauge("ddflash:state_slot_usage_perc", "Share of GDN state slots in use (1 = all).", func(s engine.SchedulerState, _ engine.SpecOptions) float64 {
		return usedShare(s.FreeSlots, s.TotalSlots)
	})
	gauge("ddflash:prefix_cache_checkpoints", "GDN checkpoints (cached prefixes a request can start from) the prefix cache holds.", func(s engine.SchedulerState, _ engine.SpecOptions) float64 {
		return float64(s.PrefixCheckpoints)
	})
	gauge("ddflash:spec_decode_tree_budget", "DDTree nodes verified per step (root excluded); 0 unless --spec ddtree.", func(_ engine.SchedulerState, spec engine.SpecOptions) float64 {
		if spec.Mode != engine.SpecTree {
			return 0
		}
		return float64(spec.Budget)
	})
	r.MustRegister(adaptiveCollector{state})
	eventCounter := func(name, help string, count func(EventCounts) uint64) {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 {
			if kvEvents == nil {
				return 0
			}
			return float64(count(kvEvents))
		}))
	}
	eventCounter("ddflash:kv_events_published_total", "KV events (vLLM's format: blocks stored and removed) published on --kv-events-endpoint.",
		EventCounts.Published)
	eventCounter("ddflash:kv_events_dropped_total", "KV events dropped for want of room: the publisher's queue, or a slow subscriber's (once per subscriber).",
		EventCounts.Dropped)
	return m
}

// cacheUsage is the share of the fuller of the two pools a request needs,
// KV pages and state slots (a hybrid model's GDN state: one per running
// request), that requests hold. Pages only the prefix cache holds count as
// free, as vLLM counts its cached blocks that no request references.
func cacheUsage(s engine.SchedulerState) float64 {
	pages := usedShare(s.FreePages+s.IdlePrefixPages, s.TotalPages)
	slots := usedShare(s.MaxRunning-s.Running, s.MaxRunning)
	return max(pages, slots)
}

func usedShare(free, total int) float64 {
	if total == 0 {
		return 0
	}
	return float64(total-free) / float64(total)
}

// factory registers metrics on one registerer.
type factory struct{ r prometheus.Registerer }

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.r.MustRegister(c)
	return c
}

func (f factory) counterVec(name, help, label string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	f.r.MustRegister(c)
	return c
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	f.r.MustRegister(h)
	return h
}

// setCacheConfig fills vllm:cache_config_info from the engine's caches.
func (m *metrics) setCacheConfig(e *engine.Engine) {
	kv := e.Model.KV
	dtype := "float32"
	if kv.Shard(0).DType == kernels.BF16 {
		dtype = "bfloat16"
	}
	m.cacheConfig.Reset()
	m.cacheConfig.WithLabelValues(strconv.Itoa(kv.PageSize()), strconv.Itoa(kv.Pages()), dtype,
		pythonBool(e.PrefixCaching())).Set(1)
}

// pythonBool writes a boolean label as vLLM's (Python's) do.
func pythonBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// specPositions makes every position series exist from the start, as vLLM
// does, so that a dashboard sees zeros rather than gaps.
func (m *metrics) specPositions(depth int) {
	for i := 0; i < depth; i++ {
		m.acceptedPerPos.WithLabelValues(strconv.Itoa(i))
	}
}

// requestTimer records one request's latencies as its outputs arrive.
type requestTimer struct {
	m                  *metrics
	start, first, last time.Time
	outputs            int
}

func (m *metrics) startRequest() *requestTimer { return &requestTimer{m: m, start: time.Now()} }

// output notes that a step delivered tokens to the request.
func (t *requestTimer) output() {
	now := time.Now()
	if t.outputs == 0 {
		t.first = now
		t.m.ttft.Observe(now.Sub(t.start).Seconds())
	} else {
		t.m.itl.Observe(now.Sub(t.last).Seconds())
	}
	t.last = now
	t.outputs++
}

// end records a request that finished (reason stop or length) or was
// aborted, with its token counts (prompt, cached and output) and, when it
// ran to its end inside the engine, its speculation statistics.
func (t *requestTimer) end(reason string, res outcome, spec *engine.SpecStats) {
	m := t.m
	now := time.Now()
	promptTokens, outputTokens := res.promptTokens, res.completionTokens
	m.finished.WithLabelValues(reason).Inc()
	m.promptTokens.Add(float64(promptTokens))
	m.prefixQueries.Add(float64(promptTokens))
	m.prefixHits.Add(float64(res.cachedTokens))
	m.generationTokens.Add(float64(outputTokens))
	m.e2e.Observe(now.Sub(t.start).Seconds())
	if outputTokens > 1 && t.outputs > 0 {
		m.tpot.Observe(now.Sub(t.first).Seconds() / float64(outputTokens-1))
	}
	if spec == nil {
		return
	}
	m.drafts.Add(float64(spec.VerifySteps))
	m.draftTokens.Add(float64(spec.DraftTokens))
	m.accepted.Add(float64(spec.AcceptedTokens))
	// AcceptedPerPosition[k] counts the steps that accepted more than k
	// drafts, so the steps that accepted exactly k are the difference.
	atLeast := append([]int{spec.VerifySteps}, spec.AcceptedPerPosition...)
	for k := range atLeast {
		exactly := atLeast[k]
		if k+1 < len(atLeast) {
			exactly -= atLeast[k+1]
		}
		for range exactly {
			m.acceptLength.Observe(float64(k + 1))
		}
	}
	for pos, n := range spec.AcceptedPerPosition {
		m.acceptedPerPos.WithLabelValues(strconv.Itoa(pos)).Add(float64(n))
	}
}
