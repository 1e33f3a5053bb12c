package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// OpenAI runs the workloads against an OpenAI-compatible server (ddflash,
// vLLM, SGLang) over streaming /v1/chat/completions. The server's launch
// fixes its decoding, so a sweep has one mode and one TP degree: labels of
// what the server runs. Acceptance comes from vLLM-style spec_decode
// counters on /metrics, when the server has them.
type OpenAI struct {
	base   string // without /v1
	model  string
	apiKey string
	client *http.Client
	// noTokenIDs is set once the server rejected vLLM's return_token_ids
	// extension (strict servers refuse unknown fields); requests then go
	// without it and token counts per chunk are estimated.
	noTokenIDs atomic.Bool
}

// NewOpenAI connects to url (with or without /v1). An empty model asks the
// server's /v1/models for the first one.
func NewOpenAI(ctx context.Context, url, model, apiKey string) (*OpenAI, error) {
	base := strings.TrimSuffix(strings.TrimRight(url, "/"), "/v1")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, fmt.Errorf("--url %q: want http://HOST:PORT or https://...", url)
	}
	o := &OpenAI{base: base, model: model, apiKey: apiKey, client: &http.Client{}}
	if model != "" {
		return o, nil
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := o.getJSON(ctx, "/v1/models", &list); err != nil {
		return nil, fmt.Errorf("ask %s for its model (or pass --served-model): %w", base, err)
	}
	if len(list.Data) == 0 {
		return nil, fmt.Errorf("%s/v1/models lists no model; pass --served-model", base)
	}
	o.model = list.Data[0].ID
	return o, nil
}

func (o *OpenAI) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, o.base+path, body)
	if err != nil {
		return nil, err
	}
	if o.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.apiKey)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// httpError describes a non-200 answer with the start of its body.
func httpError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	return fmt.Errorf("server answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
}

func (o *OpenAI) getJSON(ctx context.Context, path string, v any) error {
	req, err := o.newRequest(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return httpError(resp)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// Info implements Backend.
func (o *OpenAI) Info() BackendInfo {
	return BackendInfo{Kind: "openai", URL: o.base, ServedModel: o.model}
}

// Validate implements Backend.
func (o *OpenAI) Validate(p *Plan) error {
	if len(p.Modes) != 1 || len(p.TP) != 1 {
		return errors.New("--url: a server's decoding and TP degree are fixed when it starts, so give one --modes label and one --tp label per run (and one --out per server)")
	}
	if w := p.WeightsList(); len(w) != 1 || w[0] != "" {
		return errors.New("--url: a server's weights are fixed when it starts; --weights needs an in-process target (--model)")
	}
	if p.Modes[0].NoPrefixCache {
		return fmt.Errorf("--url: mode %s: a server's prefix cache is set when it starts; run one with --no-prefix-cache and label its mode without %s", p.Modes[0].Name, NoCacheSuffix)
	}
	return nil
}

// Knobs implements Backend; the server's own settings are not visible here.
func (o *OpenAI) Knobs(c Config) Knobs {
	return Knobs{TP: c.TP, Mode: c.Mode.Name, Spec: c.Mode.Kind, Drafter: c.Mode.Drafter, Budget: c.Mode.Budget}
}

// Open implements Backend.
func (o *OpenAI) Open(Config) (Target, error) { return o, nil }

// Close implements Target.
func (o *OpenAI) Close() error { return nil }

// chatChunk is the part of a streamed chat completion chunk the bench reads.
type chatChunk struct {
	Choices []struct {
		Text  string `json:"text"` // text completions
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
		TokenIDs     []int32 `json:"token_ids"` // vLLM's return_token_ids
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Generate implements Target.
func (o *OpenAI) Generate(ctx context.Context, r Request) (*Response, error) {
	tokenIDs := !o.noTokenIDs.Load()
	resp, start, err := o.post(ctx, r, tokenIDs)
	if err == nil && resp.StatusCode == http.StatusBadRequest && tokenIDs {
		rejected := httpError(resp)
		resp.Body.Close()
		if !strings.Contains(rejected.Error(), "return_token_ids") {
			return nil, rejected
		}
		o.noTokenIDs.Store(true)
		resp, start, err = o.post(ctx, r, false)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, httpError(resp)
	}
	return readStream(resp.Body, start)
}

// post sends a streaming chat completion request (a text completion of
// RawText when r.Raw); start is when.
func (o *OpenAI) post(ctx context.Context, r Request, tokenIDs bool) (resp *http.Response, start time.Time, err error) {
	fields := map[string]any{
		"model": o.model, "max_tokens": r.MaxTokens,
		"temperature": r.Temperature, "seed": r.Seed, "ignore_eos": r.IgnoreEOS,
		"stream": true, "stream_options": map[string]any{"include_usage": true},
	}
	path := "/v1/chat/completions"
	if r.Raw {
		path, fields["prompt"] = "/v1/completions", RawText(r.Messages)
	} else {
		fields["messages"] = r.Messages
		fields["chat_template_kwargs"] = map[string]any{"enable_thinking": r.EnableThinking}
	}
	if tokenIDs {
		fields["return_token_ids"] = true
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, start, err
	}
	req, err := o.newRequest(ctx, http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return nil, start, err
	}
	start = time.Now()
	resp, err = o.client.Do(req)
	return resp, start, err
}

// readStream reads a server-sent event stream of chat or text completion chunks.
func readStream(body io.Reader, start time.Time) (*Response, error) {
	out := &Response{}
	var text strings.Builder
	exact, done := true, false
	rd := bufio.NewReaderSize(body, 1<<16)
	for !done {
		line, err := rd.ReadString('\n')
		if err != nil && (err != io.EOF || line == "") {
			if err == io.EOF {
				return nil, errors.New("the stream ended before data: [DONE]: the server closed the connection mid-request")
			}
			return nil, err
		}
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data:")
		if !ok {
			continue // comments, event names, blank separators
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			done = true
			continue
		}
		var c chatChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return nil, fmt.Errorf("bad stream chunk %.200q: %v", data, err)
		}
		if c.Error != nil {
			return nil, fmt.Errorf("server error in stream: %s", c.Error.Message)
		}
		if c.Usage != nil {
			out.PromptTokens, out.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				out.CachedTokens = d.CachedTokens
			}
		}
		for _, ch := range c.Choices {
			piece := ch.Delta.ReasoningContent + ch.Delta.Reasoning + ch.Delta.Content + ch.Text
			if piece != "" || len(ch.TokenIDs) > 0 {
				out.Chunks = append(out.Chunks, Chunk{At: time.Since(start), Tokens: len(ch.TokenIDs)})
				exact = exact && len(ch.TokenIDs) > 0
				text.WriteString(piece)
				out.Tokens = append(out.Tokens, ch.TokenIDs...)
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				out.Finish = *ch.FinishReason
			}
		}
	}
	out.E2E, out.Text = time.Since(start), text.String()
	if out.Finish == "" {
		return nil, errors.New("the stream ended without a finish_reason")
	}
	if !exact {
		// Token counts per chunk are unknown: the metrics spread the usage
		// total over the chunks, and the outputs are compared by text.
		out.Tokens = nil
		for i := range out.Chunks {
			out.Chunks[i].Tokens = 0
		}
	}
	if out.OutputTokens == 0 {
		out.OutputTokens = len(out.Tokens)
	}
	return out, nil
}

// SpecCounters implements Target: the vLLM spec_decode counters from
// /metrics, or nil when the server exports none.
func (o *OpenAI) SpecCounters(ctx context.Context) (*SpecCounter, error) {
	req, err := o.newRequest(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %w", httpError(resp))
	}
	return parseSpecMetrics(resp.Body)
}

// parseSpecMetrics sums vLLM's spec_decode counters over their labels
// (several engines or models), per position for the per-position one, and
// reads a ddflash server's probe schedule (--spec adaptive) when it has one.
func parseSpecMetrics(r io.Reader) (*SpecCounter, error) {
	var c SpecCounter
	var schedule ScheduleCounter
	found, scheduled := false, false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "vllm:spec_decode_") && !strings.HasPrefix(line, "ddflash:adaptive_") {
			continue
		}
		name, labels, value, ok := promSample(line)
		if !ok {
			continue
		}
		n := int64(value)
		if field := scheduleField(&schedule, name); field != nil {
			*field += n
			scheduled = true
			continue
		}
		switch strings.TrimSuffix(name, "_total") {
		case "vllm:spec_decode_num_drafts":
			c.Drafts += n
		case "vllm:spec_decode_num_draft_tokens":
			c.DraftTokens += n
		case "vllm:spec_decode_num_accepted_tokens":
			c.AcceptedTokens += n
		case "vllm:spec_decode_num_accepted_tokens_per_pos":
			pos, err := strconv.Atoi(promLabel(labels, "position"))
			if err != nil || pos < 0 || pos > 1024 {
				continue
			}
			for len(c.AcceptedPerPosition) <= pos {
				c.AcceptedPerPosition = append(c.AcceptedPerPosition, 0)
			}
			c.AcceptedPerPosition[pos] += n
		default:
			continue
		}
		found = true
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, nil
	}
	if scheduled {
		c.Schedule = &schedule
	}
	return &c, nil
}

// scheduleField is the field of s that a ddflash probe-schedule metric
// feeds, or nil for any other metric.
func scheduleField(s *ScheduleCounter, name string) *int64 {
	switch name {
	case "ddflash:adaptive_probes_total":
		return &s.Probes
	case "ddflash:adaptive_probe_resumes_total":
		return &s.Resumes
	case "ddflash:adaptive_drafting_stops_total":
		return &s.Stops
	case "ddflash:adaptive_probe_relapses":
		return &s.Relapses
	}
	return nil
}

// promSample splits a Prometheus text sample: name{labels} value [timestamp].
func promSample(line string) (name, labels string, value float64, ok bool) {
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", 0, false
		}
		name, labels, rest = line[:i], line[i+1:j], line[j+1:]
	} else {
		sp := strings.IndexByte(line, ' ')
		if sp < 0 {
			return "", "", 0, false
		}
		name, rest = line[:sp], line[sp:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	return name, labels, v, err == nil
}

// promLabel returns a label's value from a name="value",... list.
func promLabel(labels, key string) string {
	for _, kv := range strings.Split(labels, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && k == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
