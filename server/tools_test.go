package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/respjson"
	"github.com/openai/openai-go/v3/shared"

	"ddflash/engine"
)

// weatherTool is a tool with typed parameters, as a client sends it.
const weatherTool = `{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
 "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
 "required": ["city"]}}}`

func weatherToolParam(t *testing.T) openai.ChatCompletionToolUnionParam {
	var tool struct {
		Function struct {
			Name        string         `json:"name"`
			Description string         `json:"description"`
			Parameters  map[string]any `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal([]byte(weatherTool), &tool); err != nil {
		t.Fatal(err)
	}
	return openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: tool.Function.Name,
		Description: openai.String(tool.Function.Description), Parameters: tool.Function.Parameters})
}

// The scripted replies of the tool loop: the model reasons, says a word,
// calls the tool, and after the tool's answer replies in text.
const (
	callReply = "The user wants the weather.\n</think>\n\nLet me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" +
		"<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>"
	answerReply = "Sunny, so no umbrella.\n</think>\n\nIt will be sunny in Paris."
)

// toolLoopReply scripts the loop: the first turn calls, the second answers.
func toolLoopReply(_ engine.Request, prompt string) string {
	if strings.Contains(prompt, "<tool_response>") {
		return answerReply
	}
	return callReply
}

// TestToolLoop runs a whole tool-calling loop through the official client,
// non-streaming and streaming: call → tool result → answer. The second
// turn's prompt must be the Qwen3.6 template's rendering of the history,
// with the arguments the client sent back as a JSON string.
func TestToolLoop(t *testing.T) {
	h, sm := serveScripted(t, toolLoopReply, nil)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p := openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(200),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris?")},
				Tools:    []openai.ChatCompletionToolUnionParam{weatherToolParam(t)}}
			first := chatOnce(t, h, p, stream)
			msg := first.Choices[0].Message
			if first.Choices[0].FinishReason != "tool_calls" || msg.Content != "Let me look." || len(msg.ToolCalls) != 1 {
				t.Fatalf("first turn: finish %q, content %q, %d calls", first.Choices[0].FinishReason, msg.Content, len(msg.ToolCalls))
			}
			if got := reasoningOf(msg.JSON.ExtraFields); got != "The user wants the weather." {
				t.Errorf("reasoning %q", got)
			}
			call := msg.ToolCalls[0]
			if call.ID == "" || call.Type != "function" || call.Function.Name != "get_weather" {
				t.Errorf("call %+v", call)
			}
			assertJSONEqual(t, call.Function.Arguments, `{"city": "Paris", "days": 3, "metric": true}`)

			p.Messages = append(p.Messages, msg.ToParam(), openai.ToolMessage("sunny, 24 C", call.ID))
			second := chatOnce(t, h, p, stream)
			if c := second.Choices[0]; c.FinishReason != "stop" || c.Message.Content != "It will be sunny in Paris." || len(c.Message.ToolCalls) != 0 {
				t.Errorf("second turn: %q %q %d calls", c.FinishReason, c.Message.Content, len(c.Message.ToolCalls))
			}
			sm.mu.Lock()
			last := sm.requests[len(sm.requests)-1]
			sm.mu.Unlock()
			prompt, _ := sm.tok.Decode(last.Prompt, false)
			// The turn after the last user query keeps its (here empty) think block.
			wantHistory := "<|im_start|>assistant\n<think>\n\n</think>\n\nLet me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" +
				"<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call><|im_end|>\n" +
				"<|im_start|>user\n<tool_response>\nsunny, 24 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
			if !strings.HasSuffix(prompt, wantHistory) {
				t.Errorf("second prompt ends\n%q\nwant\n%q", prompt[max(0, len(prompt)-len(wantHistory)):], wantHistory)
			}
		})
	}
}

// chatOnce runs a chat completion, streamed (and accumulated as clients
// do) or not. A streamed one must never show a tag in its content.
func chatOnce(t *testing.T, h *harness, p openai.ChatCompletionNewParams, stream bool, opts ...option.RequestOption) *openai.ChatCompletion {
	t.Helper()
	ctx := context.Background()
	if !stream {
		resp, err := h.client.Chat.Completions.New(ctx, p, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	s := h.client.Chat.Completions.NewStreaming(ctx, p, opts...)
	var acc openai.ChatCompletionAccumulator
	reasoning := map[int64]string{}
	for s.Next() {
		chunk := s.Current()
		acc.AddChunk(chunk)
		for _, c := range chunk.Choices {
			if strings.Contains(c.Delta.Content, "<") {
				t.Errorf("a tag leaked into streamed content: %q", c.Delta.Content)
			}
			reasoning[c.Index] += reasoningOf(c.Delta.JSON.ExtraFields)
			for _, call := range c.Delta.ToolCalls {
				if call.Function.Name != "" && call.ID == "" {
					t.Errorf("a streamed call's name came without its id: %+v", call)
				}
			}
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range acc.Choices {
		// The accumulator does not know reasoning_content: put it back
		// where a non-streamed reply has it.
		if r := reasoning[int64(i)]; r != "" {
			raw, _ := json.Marshal(r)
			acc.Choices[i].Message.JSON.ExtraFields = map[string]respjson.Field{"reasoning_content": respjson.NewField(string(raw))}
		}
	}
	return &acc.ChatCompletion
}

// reasoningOf reads reasoning_content from a reply's extra fields.
func reasoningOf(extra map[string]respjson.Field) string {
	f, ok := extra["reasoning_content"]
	if !ok {
		return ""
	}
	var s string
	_ = json.Unmarshal([]byte(f.Raw()), &s)
	return s
}

func assertJSONEqual(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Errorf("JSON %s, want %s", gb, wb)
	}
}

// TestHistoryRenders checks, through /tokenize, that history from OpenAI
// clients renders as the Qwen3.6 template expects: arguments sent as a
// JSON string render like the object they hold, and an assistant turn's
// "reasoning" (or "reasoning_content") renders in its think block.
func TestHistoryRenders(t *testing.T) {
	h, sm := serveScripted(t, toolLoopReply, nil)
	render := func(messages string) string {
		t.Helper()
		var got tokenizeResponse
		postJSON(t, h, "/tokenize", `{"messages": `+messages+`, "tools": [`+weatherTool+`]}`, 200, &got)
		text, err := sm.tok.Decode(got.Tokens, false)
		if err != nil {
			t.Fatal(err)
		}
		return text
	}
	const user = `{"role": "user", "content": "Weather in Paris?"}`
	const tool = `{"role": "tool", "tool_call_id": "c1", "content": "sunny"}`
	asString := render(`[` + user + `, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}"}}]}, ` + tool + `]`)
	asObject := render(`[` + user + `, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]}, ` + tool + `]`)
	if asString != asObject || !strings.Contains(asString, "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>") {
		t.Errorf("string arguments render as\n%q\nobject arguments as\n%q", asString, asObject)
	}
	for _, field := range []string{"reasoning", "reasoning_content"} {
		got := render(`[` + user + `, {"role": "assistant", "content": "Sunny.", "` + field + `": "It is July."}]`)
		if !strings.HasSuffix(got, "<|im_start|>assistant\n<think>\nIt is July.\n</think>\n\nSunny.<|im_end|>\n<|im_start|>assistant\n<think>\n") {
			t.Errorf("%s: rendered as %q", field, got[max(0, len(got)-120):])
		}
	}
}
