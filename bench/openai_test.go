package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeServer is an OpenAI-compatible server on loopback that streams
// max_tokens tokens in chunks of three (as if each verify accepted two
// drafts) and counts them as vLLM's spec_decode metrics do.
type fakeServer struct {
	tokenIDs bool   // stream vLLM's token_ids
	strict   bool   // refuse the return_token_ids extension, as ddflash's own server does
	fail     string // "status", "empty" or "cut": how chat requests break

	mu                             sync.Mutex
	inFlight, maxInFlight, maxMsgs int
	thinking                       []bool
	prompts                        []string // raw prompts of /v1/completions
	drafts, draftTokens, accepted  int
	acceptedPos                    [2]int
	requests                       int
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
	case "/metrics":
		f.mu.Lock()
		defer f.mu.Unlock()
		fmt.Fprintf(w, "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n# TYPE vllm:spec_decode_num_drafts_total counter\n")
		fmt.Fprintf(w, "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"fake-model\"} %d.0\n", f.drafts)
		fmt.Fprintf(w, "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"fake-model\"} %d.0\n", f.draftTokens)
		fmt.Fprintf(w, "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"fake-model\"} %d.0\n", f.accepted)
		for i, n := range f.acceptedPos {
			fmt.Fprintf(w, "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"fake-model\",position=\"%d\"} %d.0\n", i, n)
		}
		fmt.Fprint(w, "vllm:num_requests_running{model_name=\"fake-model\"} 0.0\n")
	case "/v1/chat/completions", "/v1/completions":
		f.chat(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeServer) chat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string    `json:"model"`
		Messages  []Message `json:"messages"`
		Prompt    *string   `json:"prompt"`
		MaxTokens int       `json:"max_tokens"`
		Stream    bool      `json:"stream"`
		Kwargs    struct {
			EnableThinking bool `json:"enable_thinking"`
		} `json:"chat_template_kwargs"`
	}
	var raw map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	if _, ok := raw["return_token_ids"]; ok && f.strict {
		http.Error(w, `{"error":{"message":"unknown field \"return_token_ids\"","param":"return_token_ids"}}`, http.StatusBadRequest)
		return
	}
	data, _ := json.Marshal(raw)
	completion := r.URL.Path == "/v1/completions"
	if err := json.Unmarshal(data, &req); err != nil || !req.Stream || req.Model != "fake-model" || completion != (req.Prompt != nil) {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	f.maxMsgs = max(f.maxMsgs, len(req.Messages))
	f.thinking = append(f.thinking, req.Kwargs.EnableThinking)
	if completion {
		f.prompts = append(f.prompts, *req.Prompt)
	}
	f.requests++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	if f.fail == "status" {
		http.Error(w, `{"error":{"message":"KV cache too small: cannot schedule"}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(v any) {
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", data)
		w.(http.Flusher).Flush()
	}
	type choice = map[string]any
	if !completion {
		send(map[string]any{"choices": []choice{{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}}}})
	}
	n := req.MaxTokens
	if f.fail == "empty" {
		n = 0
	}
	for sent := 0; sent < n; sent += 3 {
		k := min(3, n-sent)
		ids := make([]int32, k)
		text := ""
		for i := range ids {
			ids[i] = int32(100 + sent + i)
			text += fmt.Sprintf("w%d ", sent+i)
		}
		c := choice{"index": 0, "delta": map[string]any{"content": text}, "finish_reason": nil}
		if completion {
			c = choice{"index": 0, "text": text, "finish_reason": nil}
		}
		if f.tokenIDs {
			c["token_ids"] = ids
		}
		send(map[string]any{"choices": []choice{c}})
		if f.fail == "cut" {
			return // the connection closes mid-request
		}
		f.mu.Lock()
		f.drafts++
		f.draftTokens += 4
		f.accepted += k - 1
		for p := range k - 1 {
			f.acceptedPos[p]++
		}
		f.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	send(map[string]any{"choices": []choice{{"index": 0, "delta": map[string]any{}, "finish_reason": "length"}}})
	send(map[string]any{"choices": []choice{}, "usage": map[string]any{"prompt_tokens": 20, "completion_tokens": n, "prompt_tokens_details": map[string]any{"cached_tokens": 5}}})
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// fakeGPUs stands in for NVML with one GPU that warms up by a degree per reading.
type fakeGPUs struct {
	mu   sync.Mutex
	temp uint32
}

func (g *fakeGPUs) Info() (GPUSet, error) {
	return GPUSet{GPUs: []GPUInfo{{Name: "NVIDIA H200", MemoryMiB: 143771}}, Driver: "580.65"}, nil
}

func (g *fakeGPUs) States() ([]GPUState, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.temp++
	return []GPUState{{SMClockMHz: 1980, TemperatureC: 40 + g.temp, PowerW: 350}}, nil
}

// testPlan is a one-warmup plan over the given modes and workloads.
func testPlan(t *testing.T, modes, workloads string, maxTokens, concurrency []int, repeats int) *Plan {
	t.Helper()
	ms, err := ParseModes(modes)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := LoadWorkloads(workloads, 0)
	if err != nil {
		t.Fatal(err)
	}
	return &Plan{TP: []int{1}, Modes: ms, Workloads: ws, MaxTokens: maxTokens, Concurrency: concurrency, Repeats: repeats, Warmup: 1}
}

// chatPlan is one mode on the three-turn chat, as a server runs it.
func chatPlan(t *testing.T, mode string, tp, maxTokens, concurrency, repeats int) *Plan {
	p := testPlan(t, mode, "chat", []int{maxTokens}, []int{concurrency}, repeats)
	p.TP = []int{tp}
	return p
}

// openFake serves f on loopback and connects to it.
func openFake(t *testing.T, f *fakeServer) (*OpenAI, string) {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	backend, err := NewOpenAI(context.Background(), srv.URL+"/v1/", "", "")
	if err != nil {
		t.Fatal(err)
	}
	return backend, srv.URL
}

func serverSweep(t *testing.T, f *fakeServer, plan *Plan, dir string) (*Summary, error) {
	t.Helper()
	backend, url := openFake(t, f)
	return Sweep(context.Background(), Options{
		Plan: plan, Backend: backend, Store: Store{Dir: dir}, Argv: []string{"ddflash", "bench", "--url", url},
		IgnoreEOS: true, RequestTimeout: 10 * time.Second, GPUs: &fakeGPUs{},
	})
}

func TestSweepAgainstAnOpenAIServer(t *testing.T) {
	f := &fakeServer{tokenIDs: true}
	dir := t.TempDir()
	// The built-in chat is one conversation of three turns; at concurrency
	// 2 it is sent twice at once, in each of 2 passes, after 1 warmup request.
	sum, err := serverSweep(t, f, chatPlan(t, "b15", 4, 12, 2, 2), dir)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Saved != 1 || len(sum.Failed) != 0 {
		t.Fatalf("summary %+v", sum)
	}
	rec, err := Store{Dir: dir}.ReadRecord("tp4-b15")
	if err != nil || rec == nil {
		t.Fatalf("record: %v", err)
	}
	if b := rec.Setup.Backend; b.Kind != "openai" || b.ServedModel != "fake-model" || !strings.HasPrefix(b.URL, "http://127.0.0.1:") {
		t.Errorf("backend %+v", b)
	}
	if k := rec.Setup.Knobs; k.TP != 4 || k.Mode != "b15" || k.Budget != 15 || !k.IgnoreEOS {
		t.Errorf("knobs %+v", k)
	}
	if h := rec.Setup.Host; len(h.GPUs) != 1 || h.Driver != "580.65" || h.GPUNote != "" {
		t.Errorf("host GPUs %+v", h)
	}
	run := rec.Runs[0]
	if run.Requested != 12 || run.Completed != 12 || run.OutputTokens != 12*12 || run.TokenCounts != "exact" || !rec.Complete {
		t.Errorf("run counts %+v", run)
	}
	m := run.Metrics
	if m.AcceptanceLength == nil || !near(*m.AcceptanceLength, 3) || !near(*m.AcceptanceRate, 0.5) || !slices.Equal(m.PerPositionAcceptance, []float64{1, 1}) {
		t.Errorf("acceptance %v %v %v, want τ 3, rate 0.5, [1 1]", m.AcceptanceLength, m.AcceptanceRate, m.PerPositionAcceptance)
	}
	if m.ITLChunk.N != 12*3 || !near(m.ITLToken.Mean*3, m.ITLChunk.Mean) {
		t.Errorf("itl: %d chunk gaps, token mean %v, chunk mean %v", m.ITLChunk.N, m.ITLToken.Mean, m.ITLChunk.Mean)
	}
	// The fake reports 5 of its 20 prompt tokens cached; 8 of the 12
	// requests are later turns of the chat.
	if h := m.PrefixCacheHitRate; h == nil || !near(*h, 0.25) || m.LaterTurnsTTFT.N != 8 {
		t.Errorf("prefix cache hit rate %v, %d later-turn TTFTs; want 0.25 and 8", h, m.LaterTurnsTTFT.N)
	}
	if len(run.Samples) != 2 || run.Samples[1].AcceptanceLength == nil {
		t.Errorf("samples %+v", run.Samples)
	}
	if tel := run.Telemetry; len(tel.Before) != 1 || len(tel.After) != 1 || tel.After[0].TemperatureC <= tel.Before[0].TemperatureC {
		t.Errorf("telemetry %+v", tel)
	}
	if f.maxInFlight != 2 || f.maxMsgs != 5 || slices.Contains(f.thinking, true) || f.requests != 13 {
		t.Errorf("server saw %d in flight, %d messages at most, thinking %v, %d requests; want 2, 5 (three turns with two replies), all false, 13",
			f.maxInFlight, f.maxMsgs, f.thinking, f.requests)
	}
	trace, err := Store{Dir: dir}.ReadTrace(run.Trace)
	if err != nil || len(trace) != 12 {
		t.Fatalf("trace: %d requests, %v", len(trace), err)
	}
	if tr := trace[0]; len(tr.Chunks) != 4 || tr.Chunks[0].Tokens != 3 || len(tr.Tokens) != 12 || !strings.HasPrefix(tr.Text, "w0 w1 w2") {
		t.Errorf("first traced request %+v", tr)
	}
}

// TestRawPromptsAreTextCompletions: with Raw, each turn goes to
// /v1/completions as one document (earlier turns and replies joined by
// newlines), the streamed text is read back, and the record says so.
func TestRawPromptsAreTextCompletions(t *testing.T) {
	f := &fakeServer{tokenIDs: true}
	dir := t.TempDir()
	backend, url := openFake(t, f)
	sum, err := Sweep(context.Background(), Options{
		Plan: chatPlan(t, "auto", 1, 3, 1, 1), Backend: backend, Store: Store{Dir: dir}, Argv: []string{"ddflash", "bench", "--raw", "--url", url},
		IgnoreEOS: true, Raw: true, GPUs: &fakeGPUs{},
	})
	if err != nil || sum.Saved != 1 {
		t.Fatalf("sweep: %v, %+v", err, sum)
	}
	chat := builtins[3].Conversations[0]
	reply := "w0 w1 w2 "
	want := []string{chat[0], chat[0], chat[0] + "\n" + reply + "\n" + chat[1], chat[0] + "\n" + reply + "\n" + chat[1] + "\n" + reply + "\n" + chat[2]}
	if !slices.Equal(f.prompts, want) { // the warmup request, then the measured conversation
		t.Errorf("raw prompts\n got %q\nwant %q", f.prompts, want)
	}
	rec, err := Store{Dir: dir}.ReadRecord("tp1-auto")
	if err != nil || !rec.Setup.Knobs.RawPrompts || rec.Runs[0].OutputTokens != 9 {
		t.Fatalf("record: %v, knobs %+v", err, rec.Setup.Knobs)
	}
}

// TestServerWithoutTokenIDsIsEstimated: a strict server refuses the
// return_token_ids extension once; the rest goes without it.
func TestServerWithoutTokenIDsIsEstimated(t *testing.T) {
	dir := t.TempDir()
	f := &fakeServer{strict: true}
	if _, err := serverSweep(t, f, chatPlan(t, "auto", 1, 9, 1, 1), dir); err != nil {
		t.Fatal(err)
	}
	rec, err := Store{Dir: dir}.ReadRecord("tp1-auto")
	if err != nil {
		t.Fatal(err)
	}
	run := rec.Runs[0]
	if run.TokenCounts != "estimated" || run.OutputTokens != 27 || !near(run.Metrics.ITLToken.Mean*3, run.Metrics.ITLChunk.Mean) {
		t.Errorf("run %+v", run)
	}
	if f.requests != 4 {
		t.Errorf("the server saw %d requests: want one refused with return_token_ids, then 4 without", f.requests)
	}
}

// TestBrokenServersYieldFailuresNeverResults covers the user's silent
// zero-tok/s results: a server that is up but cannot serve.
func TestBrokenServersYieldFailuresNeverResults(t *testing.T) {
	for _, c := range []struct{ fail, want string }{
		{"status", "500 Internal Server Error"},
		{"empty", "empty completion"},
		{"cut", "ended before data: [DONE]"},
	} {
		t.Run(c.fail, func(t *testing.T) {
			dir := t.TempDir()
			sum, err := serverSweep(t, &fakeServer{tokenIDs: true, fail: c.fail}, chatPlan(t, "b8", 1, 6, 1, 1), dir)
			if err == nil || !strings.Contains(err.Error(), c.want) || len(sum.Failed) != 1 {
				t.Fatalf("sweep error %v, summary %+v; want a failure mentioning %q", err, sum, c.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "tp1-b8.json")); !os.IsNotExist(err) {
				t.Errorf("a result file exists for a failed configuration (stat: %v)", err)
			}
			var fl Failure
			if err := readSealed(filepath.Join(dir, "tp1-b8.failure.json"), &fl); err != nil {
				t.Fatal(err)
			}
			if len(fl.Failures) != 1 || !strings.Contains(fl.Failures[0].Error, c.want) || fl.Setup.Knobs.Budget != 8 {
				t.Errorf("failure record %+v", fl)
			}
			v, err := Verify(dir)
			if err != nil || v.OK() || len(v.Findings) != 1 || !strings.Contains(v.Findings[0].Problem, c.want) {
				t.Errorf("verify: %+v, %v", v, err)
			}
		})
	}
}

func TestOpenAIBackendRejectsSweepsItCannotRun(t *testing.T) {
	o := &OpenAI{}
	modes, _ := ParseModes("auto,b15")
	if err := o.Validate(&Plan{TP: []int{1}, Modes: modes}); err == nil || !strings.Contains(err.Error(), "one --modes label") {
		t.Errorf("two modes against one server: %v", err)
	}
	modes, _ = ParseModes("auto-nocache")
	if err := o.Validate(&Plan{TP: []int{1}, Modes: modes}); err == nil || !strings.Contains(err.Error(), "--no-prefix-cache") {
		t.Errorf("a -nocache mode against a server: %v", err)
	}
	if _, err := NewOpenAI(context.Background(), "localhost:8000", "m", ""); err == nil {
		t.Error("a URL without a scheme was accepted")
	}
}

func TestParseSpecMetrics(t *testing.T) {
	text := `# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 60
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 1.2e1
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_created{model_name="m"} 1.7e9
vllm:num_requests_running{model_name="m"} 3.0
`
	schedule := `ddflash:adaptive_draft_seconds 0.002
ddflash:adaptive_probes_total 7
ddflash:adaptive_probe_resumes_total 2
ddflash:adaptive_drafting_stops_total 3
ddflash:adaptive_probe_relapses 1
`
	if c, err := parseSpecMetrics(strings.NewReader(text)); err != nil || c == nil || c.Schedule != nil {
		t.Fatalf("a server without a probe schedule: %+v, %v", c, err)
	}
	c, err := parseSpecMetrics(strings.NewReader(text + schedule))
	if err != nil || c == nil {
		t.Fatalf("parse: %v, %v", c, err)
	}
	want := SpecCounter{Drafts: 15, DraftTokens: 60, AcceptedTokens: 12, AcceptedPerPosition: []int64{8, 4}}
	if c.Drafts != want.Drafts || c.DraftTokens != want.DraftTokens || c.AcceptedTokens != want.AcceptedTokens || !slices.Equal(c.AcceptedPerPosition, want.AcceptedPerPosition) {
		t.Errorf("counters %+v, want %+v", *c, want)
	}
	if want := (ScheduleCounter{Probes: 7, Resumes: 2, Stops: 3, Relapses: 1}); c.Schedule == nil || *c.Schedule != want {
		t.Errorf("schedule %+v, want %+v", c.Schedule, want)
	}
	if c, err := parseSpecMetrics(strings.NewReader("sglang:gen_throughput 12.5\n")); c != nil || err != nil {
		t.Errorf("a server without spec counters: %+v, %v", c, err)
	}
}

// TestResumeRetriesFailedRuns: once the server is fixed, --resume measures
// the failed run and the failure file goes away.
func TestResumeRetriesFailedRuns(t *testing.T) {
	f := &fakeServer{tokenIDs: true, fail: "status"}
	backend, url := openFake(t, f)
	dir := t.TempDir()
	opts := Options{Plan: chatPlan(t, "b8", 1, 6, 1, 1), Backend: backend, Store: Store{Dir: dir},
		Argv: []string{"ddflash", "bench", "--url", url}, GPUs: &fakeGPUs{}}
	if _, err := Sweep(context.Background(), opts); err == nil {
		t.Fatal("the broken server's sweep succeeded")
	}
	f.mu.Lock()
	f.fail = ""
	f.mu.Unlock()
	opts.Resume = true
	if sum, err := Sweep(context.Background(), opts); err != nil || sum.Saved != 1 {
		t.Fatalf("resume after the fix: %+v, %v", sum, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tp1-b8.failure.json")); !os.IsNotExist(err) {
		t.Errorf("the failure file outlived the successful rerun (stat: %v)", err)
	}
	if v, err := Verify(dir); err != nil || !v.OK() {
		t.Errorf("verify after the rerun: %+v, %v", v, err)
	}
}
