package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"ddflash/engine"
)

// smallBodyLimit makes oversized bodies cheap to send.
const smallBodyLimit = 4096

// strictServer is a second server over h's model with a small body limit.
func strictServer(h *harness) *Server {
	s := New(Options{ModelName: testModel, MaxBodyBytes: smallBodyLimit})
	s.attach(h.model)
	return s
}

// TestMalformedRequests sends broken and invalid requests; each must get
// its OpenAI-shaped error with the right status and, where one field is to
// blame, that field as param.
func TestMalformedRequests(t *testing.T) {
	h := serveTiny(t, harnessOptions{})
	srv := strictServer(h)
	long := make([]string, 300)
	for i := range long {
		long[i] = "65"
	}
	cases := []struct {
		path, body   string
		status       int
		param, inMsg string
	}{
		{"/v1/completions", `{"prompt": "x",`, 400, "", "not valid JSON"},
		{"/v1/completions", ``, 400, "", "empty"},
		{"/v1/completions", `[1, 2]`, 400, "", "JSON object"},
		{"/v1/completions", `{"prompt": "x"} {}`, 400, "", "after its JSON object"},
		{"/v1/completions", "{\"prompt\": \"\xff\xfe\"}", 400, "", "UTF-8"},
		{"/v1/completions", `{"prompt": "x", "max_tokens": "ten"}`, 400, "max_tokens", "integer"},
		{"/v1/completions", `{"prompt": "x", "max_tokens": 1e30}`, 400, "max_tokens", ""},
		{"/v1/completions", `{"prompt": "x", "max_tokens": 99999999999999999999}`, 400, "max_tokens", ""},
		{"/v1/completions", `{"prompt": "x", "max_tokens": 1000000}`, 400, "max_tokens", "1000000"},
		{"/v1/completions", `{"prompt": "x", "max_tokens": -1}`, 400, "max_tokens", "at least 1"},
		{"/v1/completions", `{"prompt": "x", "temperature": "hot"}`, 400, "temperature", "number"},
		{"/v1/completions", `{"prompt": "x", "temperature": 2.5}`, 400, "temperature", ""},
		{"/v1/completions", `{"prompt": "x", "top_p": 0}`, 400, "top_p", ""},
		{"/v1/completions", `{"prompt": "x", "top_k": -2}`, 400, "top_k", ""},
		{"/v1/completions", `{"prompt": "x", "logprobs": 21}`, 400, "logprobs", "0..20"},
		{"/v1/completions", `{"prompt": "x", "n": 0}`, 400, "n", "1..16"},
		{"/v1/completions", `{"prompt": "x", "n": 17}`, 400, "n", "1..16"},
		{"/v1/completions", `{"prompt": "x", "n": 2, "best_of": 3}`, 400, "best_of", "equal to n"},
		{"/v1/completions", `{"prompt": "x", "best_of": 3}`, 400, "best_of", ""},
		{"/v1/completions", `{"prompt": "x", "echo": true}`, 400, "echo", ""},
		{"/v1/completions", `{"prompt": "x", "presence_penalty": 2.5}`, 400, "presence_penalty", "-2 to 2"},
		{"/v1/completions", `{"prompt": "x", "frequency_penalty": -3}`, 400, "frequency_penalty", "-2 to 2"},
		{"/v1/completions", `{"prompt": "x", "repetition_penalty": 0}`, 400, "repetition_penalty", ""},
		{"/v1/completions", `{"prompt": "x", "min_p": 1.5}`, 400, "min_p", ""},
		{"/v1/completions", `{"prompt": "x", "logit_bias": {"abc": 1}}`, 400, "logit_bias", "token id"},
		{"/v1/completions", `{"prompt": "x", "logit_bias": {"99999": 1}}`, 400, "logit_bias", "token id"},
		{"/v1/completions", `{"prompt": "x", "logit_bias": {"5": 101}}`, 400, "logit_bias", "-100 to 100"},
		{"/v1/completions", `{"prompt": "x", "stop_token_ids": [-1]}`, 400, "stop_token_ids", "token id"},
		{"/v1/completions", `{"prompt": "x", "max_tokens": 4, "min_tokens": 5}`, 400, "min_tokens", ""},
		{"/v1/completions", `{"prompt": "x", "stop": 5}`, 400, "stop", ""},
		{"/v1/completions", `{"prompt": "x", "stream_options": {"include_usage": true}}`, 400, "stream_options", "stream"},
		{"/v1/completions", `{"max_tokens": 3}`, 400, "prompt", "required"},
		{"/v1/completions", `{"prompt": ""}`, 400, "prompt", "empty"},
		{"/v1/completions", `{"prompt": ["a", "b"]}`, 400, "prompt", "one prompt"},
		{"/v1/completions", `{"prompt": [1.5]}`, 400, "prompt", ""},
		{"/v1/completions", `{"prompt": [99999]}`, 400, "", "vocabulary"},
		{"/v1/completions", `{"prompt": [-1]}`, 400, "", "vocabulary"},
		{"/v1/completions", `{"prompt": [` + strings.Join(long, ",") + `]}`, 400, "", "300 tokens"},
		{"/v1/completions", `{"prompt": "` + strings.Repeat("x", smallBodyLimit) + `"}`, 413, "", "4096 bytes"},
		{"/v1/completions", `{"model": "gpt-4", "prompt": "x"}`, 404, "model", "gpt-4"},
		{"/v1/chat/completions", `{"max_tokens": 3}`, 400, "messages", ""},
		{"/v1/chat/completions", `{"messages": "hello"}`, 400, "messages", ""},
		{"/v1/chat/completions", `{"messages": []}`, 400, "messages", ""},
		{"/v1/chat/completions", `{"messages": [{"content": "hi"}]}`, 400, "messages", "role"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}`, 400, "top_logprobs", "logprobs"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}`, 400, "tool_choice", "needs tools"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes"}`, 400, "tool_choice", ""},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tools": [` + weatherTool + `], "tool_choice": {"type": "function", "function": {"name": "nope"}}}`, 400, "tool_choice", "nope"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}], "tools": [` + weatherTool + `]}`, 400, "messages", "messages[1].tool_calls[0].function.arguments"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}`, 400, "response_format", "xml"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "pattern": "^a"}}}}`, 400, "response_format", `"pattern"`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "properties": {"x": {"anyOf": []}}}}}}`, 400, "response_format", `"anyOf" (at schema.properties.x)`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]}`, 400, "messages", ""},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}`, 400, "max_tokens", ""},
		{"/tokenize", `{"prompt": "x", "messages": []}`, 400, "prompt", "exactly one"},
		{"/detokenize", `{"tokens": [-5]}`, 400, "tokens", "vocabulary"},
		{"/detokenize", `{"tokens": "abc"}`, 400, "tokens", ""},
		{"/v2/nothing", `{}`, 404, "", "no route"},
	}
	for _, c := range cases {
		rec := serve(srv, "POST", c.path, c.body, "")
		e := rec.err
		if rec.status != c.status || e.Message == "" || e.Type == "" || !strings.Contains(e.Message, c.inMsg) || deref(e.Param) != c.param {
			t.Errorf("POST %s %.80q: %d %s, want %d with param %q and %q in the message", c.path, c.body, rec.status, rec.body, c.status, c.param, c.inMsg)
		}
	}
	if rec := serve(srv, "GET", "/v1/completions", "", ""); rec.status != http.StatusMethodNotAllowed || rec.err.Message == "" {
		t.Errorf("GET /v1/completions: %d %s", rec.status, rec.body)
	}
	waitIdle(t, h.model.Scheduler)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestErrorsThroughTheClient checks that the official client reads the
// errors: status, code and a message that says what to fix.
func TestErrorsThroughTheClient(t *testing.T) {
	h := serveTiny(t, harnessOptions{})
	long := make([]int64, 300)
	cases := []struct {
		params openai.CompletionNewParams
		status int
		code   string
		inMsg  []string
	}{
		{openai.CompletionNewParams{Model: "no-such-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}},
			404, "model_not_found", []string{"no-such-model", testModel}},
		{openai.CompletionNewParams{Model: testModel, Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: long}},
			400, "context_length_exceeded", []string{"300", fmt.Sprint(testContext)}},
		{openai.CompletionNewParams{Model: testModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, N: openai.Int(30)},
			400, "", []string{"n 30"}},
	}
	for _, c := range cases {
		_, err := h.client.Completions.New(context.Background(), c.params)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != c.status || apiErr.Code != c.code {
			t.Errorf("%+v: %v, want status %d code %q", c.params, err, c.status, c.code)
			continue
		}
		for _, s := range c.inMsg {
			if !strings.Contains(apiErr.Message, s) {
				t.Errorf("message %q lacks %q", apiErr.Message, s)
			}
		}
	}
}

// TestQueueFull fills the queue of a scheduler that is not stepping and
// checks the 429; the queued requests are then cancelled and the
// scheduler started, and every resource must come back.
func TestQueueFull(t *testing.T) {
	e := newEngine(t, engine.SpecOptions{}, 1)
	_, _, tok := modelDirs(t)
	sched := engine.NewScheduler(e, engine.SchedulerOptions{MaxRunning: 1, MaxQueue: 2})
	srv := New(Options{ModelName: testModel})
	srv.attach(&Model{Engine: e, Scheduler: sched, Tokenizer: tok})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	queued, cancel := context.WithCancel(context.Background())
	for range 2 {
		if _, err := sched.Submit(queued, engine.Request{Prompt: []int32{1, 2}, MaxTokens: 4}); err != nil {
			t.Fatal(err)
		}
	}
	client := newClient(ts.URL, "")
	_, err := client.Completions.New(context.Background(), completionParams("the", 4))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" || !strings.Contains(apiErr.Message, "retry") {
		t.Fatalf("a full queue: %v, want 429 queue_full", err)
	}
	cancel()
	running, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sched.Run(running); close(done) }()
	waitIdle(t, sched)
	stop()
	<-done
}

// FuzzRequest posts arbitrary bodies to every endpoint. No input may crash
// the server or earn a 5xx; a 4xx must carry an error message; a 200 must
// be JSON or a well-formed event stream.
func FuzzRequest(f *testing.F) {
	h := serveTiny(f, harnessOptions{sched: engine.SchedulerOptions{MaxRunning: 2, MaxQueue: 64}})
	srv := strictServer(h)
	paths := []string{"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}
	for _, seed := range []struct {
		path uint8
		body string
	}{
		{0, `{"prompt": "the fox", "max_tokens": 3, "temperature": 0}`},
		{0, `{"prompt": [1, 2, 3], "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}, "logprobs": 2}`},
		{0, `{"prompt": "a", "stop": ["b", ""], "max_tokens": 5, "seed": -7, "top_k": 3, "top_p": 0.5}`},
		{1, `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true, "logprobs": true, "top_logprobs": 1}`},
		{1, `{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 1}`},
		{2, `{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": false}}`},
		{3, `{"tokens": [1, 2, 300, 301]}`},
		{0, `{"prompt": "x", "max_tokens": 1e400}`},
		{1, `{"messages": [{"role": null}]}`},
		{0, "\x00\x01"},
	} {
		f.Add(seed.path, seed.body)
	}
	f.Fuzz(func(t *testing.T, path uint8, body string) {
		rec := serve(srv, "POST", paths[int(path)%len(paths)], body, "")
		switch {
		case rec.status >= 500 || rec.status < 200:
			t.Fatalf("%q: status %d: %s", body, rec.status, rec.body)
		case rec.status >= 400:
			if rec.err.Message == "" || rec.err.Type == "" {
				t.Fatalf("%q: %d without an error message: %s", body, rec.status, rec.body)
			}
		case strings.HasPrefix(rec.body, "data: "):
			checkEventStream(t, rec.body)
		case !json.Valid([]byte(rec.body)):
			t.Fatalf("%q: 200 with a body that is not JSON: %s", body, rec.body)
		}
	})
}

// checkEventStream checks SSE framing: JSON data events, no error event,
// and [DONE] last.
func checkEventStream(t *testing.T, stream string) {
	t.Helper()
	events := strings.Split(strings.TrimSuffix(stream, "\n\n"), "\n\n")
	for i, ev := range events {
		data, ok := strings.CutPrefix(ev, "data: ")
		switch {
		case !ok:
			t.Fatalf("event %d is not a data line: %q", i, ev)
		case i == len(events)-1:
			if data != "[DONE]" {
				t.Fatalf("the stream ends with %q, not [DONE]", data)
			}
		case !json.Valid([]byte(data)) || strings.HasPrefix(data, `{"error"`):
			t.Fatalf("event %d: %s", i, data)
		}
	}
}
