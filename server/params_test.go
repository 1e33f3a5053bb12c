package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"ddflash/engine"
)

// TestToolChoiceConstrains asks for a call (required, and by name) of a
// model whose script chats first: decoding is constrained, so the reply is
// a valid call of the allowed function all the same. Speculative decoding
// applies the same mask along each draft path (see the sampling branch's
// engine tests).
func TestToolChoiceConstrains(t *testing.T) {
	chatty := func(engine.Request, string) string {
		return "ok\n</think>\n\nI will call it now. <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\nsoon\n</parameter>\n</function>\n</tool_call> Done!"
	}
	h, _ := serveScripted(t, chatty, nil)
	for _, choice := range []openai.ChatCompletionToolChoiceOptionUnionParam{
		{OfAuto: openai.String("required")},
		openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}),
	} {
		for _, stream := range []bool{false, true} {
			p := openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(300), ToolChoice: choice,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather?")},
				Tools:    []openai.ChatCompletionToolUnionParam{weatherToolParam(t)}}
			resp := chatOnce(t, h, p, stream)
			c := resp.Choices[0]
			if c.FinishReason != "tool_calls" || c.Message.Content != "" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "get_weather" {
				t.Fatalf("stream %v: finish %q content %q calls %+v", stream, c.FinishReason, c.Message.Content, c.Message.ToolCalls)
			}
			// days is an integer: "soon" cannot be written, and whatever the
			// model writes instead must be one.
			var args map[string]any
			if err := json.Unmarshal([]byte(c.Message.ToolCalls[0].Function.Arguments), &args); err != nil || args["city"] != "Paris" {
				t.Errorf("arguments %s (%v)", c.Message.ToolCalls[0].Function.Arguments, err)
			}
			if days, ok := args["days"]; ok {
				if d, isNumber := days.(float64); !isNumber || d != math.Trunc(d) {
					t.Errorf("days %v is not an integer", days)
				}
			}
		}
	}
}

// TestResponseFormat asks a model that wraps its JSON in prose for
// json_object and json_schema replies: what comes back parses and fits the
// schema.
func TestResponseFormat(t *testing.T) {
	prose := func(engine.Request, string) string {
		return "thinking\n</think>\n\nHere you go: {\"name\": \"Ann\", \"age\": 31, \"city\": \"Oslo\"} Anything else?"
	}
	h, _ := serveScripted(t, prose, nil)
	schema := map[string]any{"type": "object", "additionalProperties": false, "required": []string{"name", "age"},
		"properties": map[string]any{"name": map[string]any{"type": "string"}, "age": map[string]any{"type": "integer"}}}
	for _, c := range []struct {
		format openai.ChatCompletionNewParamsResponseFormatUnion
		want   string
	}{
		{openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}, `{"name": "Ann", "age": 31, "city": "Oslo"}`},
		{openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Schema: schema, Strict: openai.Bool(true)}}}, `{"name": "Ann", "age": 31}`},
	} {
		for _, stream := range []bool{false, true} {
			p := openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(200), ResponseFormat: c.format,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Who?")}}
			resp := chatOnce(t, h, p, stream)
			if got := resp.Choices[0]; got.FinishReason != "stop" || reasoningOf(got.Message.JSON.ExtraFields) != "thinking" {
				t.Errorf("finish %q, reasoning %q", got.FinishReason, reasoningOf(got.Message.JSON.ExtraFields))
			}
			assertJSONEqual(t, resp.Choices[0].Message.Content, c.want)
		}
	}
}

// TestChoices asks for n = 3 choices, streamed and not: each is its own
// engine request with its own seed, and comes back under its index.
func TestChoices(t *testing.T) {
	bySeed := func(r engine.Request, _ string) string {
		return fmt.Sprintf("reason %d\n</think>\n\nanswer %d", r.Sampling.Seed, r.Sampling.Seed)
	}
	h, sm := serveScripted(t, bySeed, nil)
	for _, stream := range []bool{false, true} {
		sm.mu.Lock()
		sm.requests = nil
		sm.mu.Unlock()
		p := openai.ChatCompletionNewParams{Model: testModel, N: openai.Int(3), Seed: openai.Int(40), MaxTokens: openai.Int(50),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Pick.")}}
		resp := chatOnce(t, h, p, stream)
		if len(resp.Choices) != 3 {
			t.Fatalf("stream %v: %d choices", stream, len(resp.Choices))
		}
		for i, c := range resp.Choices {
			seed := 40 + i
			if c.Index != int64(i) || c.Message.Content != fmt.Sprintf("answer %d", seed) || reasoningOf(c.Message.JSON.ExtraFields) != fmt.Sprintf("reason %d", seed) || c.FinishReason != "stop" {
				t.Errorf("stream %v: choice %d: %+v", stream, i, c)
			}
		}
		if n := len(sm.requests); n != 3 {
			t.Errorf("%d engine requests, want 3", n)
		}
	}
}

// TestSamplingFieldsReachTheEngine checks that every sampling field a
// client sends arrives in the engine request, and that fields left out
// take the checkpoint's generation_config defaults.
func TestSamplingFieldsReachTheEngine(t *testing.T) {
	temp, topP, topK := 0.6, 0.95, 20
	h, sm := serveScripted(t, func(engine.Request, string) string { return "ok" }, func(m *Model) {
		m.Defaults = engine.GenerationConfig{Temperature: &temp, TopP: &topP, TopK: &topK}
	})
	last := func() engine.Request {
		sm.mu.Lock()
		defer sm.mu.Unlock()
		return sm.requests[len(sm.requests)-1]
	}
	_, err := h.client.Completions.New(context.Background(), openai.CompletionNewParams{Model: testModel,
		Prompt:           openai.CompletionNewParamsPromptUnion{OfString: openai.String("the fox")},
		PresencePenalty:  openai.Float(0.5),
		FrequencyPenalty: openai.Float(-0.25),
		LogitBias:        map[string]int64{"7": -100, "9": 5},
		Seed:             openai.Int(11),
		MaxTokens:        openai.Int(9),
		Temperature:      openai.Float(0.9),
	}, option.WithJSONSet("min_p", 0.1), option.WithJSONSet("repetition_penalty", 1.2), option.WithJSONSet("stop_token_ids", []int{3, 4}),
		option.WithJSONSet("min_tokens", 2), option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	r := last()
	sp := r.Sampling
	if sp.PresencePenalty != 0.5 || sp.FrequencyPenalty != -0.25 || sp.MinP != 0.1 || sp.RepetitionPenalty != 1.2 || sp.Seed != 11 ||
		sp.Temperature != 0.9 || sp.TopP != topP || sp.TopK != topK || len(sp.LogitBias) != 2 || sp.LogitBias[7] != -100 || sp.LogitBias[9] != 5 {
		t.Errorf("sampling %+v", sp)
	}
	if r.MaxTokens != 9 || r.MinTokens != 2 || !r.IgnoreEOS || fmt.Sprint(r.StopTokenIDs) != "[3 4]" {
		t.Errorf("request: max %d min %d ignore_eos %v stop ids %v", r.MaxTokens, r.MinTokens, r.IgnoreEOS, r.StopTokenIDs)
	}
	// max_completion_tokens wins over max_tokens; defaults fill what is left out.
	_, err = h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: testModel,
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		MaxTokens:           openai.Int(30),
		MaxCompletionTokens: openai.Int(7)})
	if err != nil {
		t.Fatal(err)
	}
	if r := last(); r.MaxTokens != 7 || r.Sampling.Temperature != temp || r.Sampling.TopP != topP || r.Sampling.TopK != topK || r.Sampling.MinP != 0 {
		t.Errorf("chat request: max %d sampling %+v", r.MaxTokens, r.Sampling)
	}
}

// TestUnknownFieldsIgnored sends fields this server does not know: the
// request is served, and each name is logged once.
func TestUnknownFieldsIgnored(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	h, _ := serveScripted(t, func(engine.Request, string) string { return "ok" }, nil)
	h.srv.log = slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	body := `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "frobnicate_test_field": 1, "prediction": {"type": "content"}}`
	for range 3 {
		postJSON(t, h, "/v1/chat/completions", body, http.StatusOK, nil)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"frobnicate_test_field", "prediction"} {
		if n := strings.Count(buf.String(), "field="+name); n != 1 {
			t.Errorf("%s logged %d times: %s", name, n, buf.String())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestThinkingOff renders with enable_thinking false: the reply has no
// reasoning field at all.
func TestThinkingOff(t *testing.T) {
	h, _ := serveScripted(t, func(engine.Request, string) string { return "Hello there." }, nil)
	var resp struct {
		Choices []struct {
			Message map[string]json.RawMessage `json:"message"`
		} `json:"choices"`
	}
	postJSON(t, h, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": false}}`, http.StatusOK, &resp)
	msg := resp.Choices[0].Message
	if _, has := msg["reasoning_content"]; has || string(msg["content"]) != `"Hello there."` {
		t.Errorf("message %s", msg)
	}
}
