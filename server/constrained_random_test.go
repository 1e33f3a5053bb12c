package server

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"ddflash/engine"
	"ddflash/engine/testmodel"
)

// TestToolChoiceRequiredRandomModel asks a random-weight model (the tiny
// preset with room for the tools' prompt, on its byte-level tokenizer) for
// a required call of a tool whose one required parameter is a string enum,
// through the official client, greedy and sampled: the grammar must lead
// even this model to a complete call whose arguments satisfy the schema,
// ended as tool_calls within 256 tokens (a free-text enum value or
// unbounded white space lets it run to the length limit instead). Every
// part of such a call is bounded, so this holds for any model.
func TestToolChoiceRequiredRandomModel(t *testing.T) {
	h := serveTinyLong(t)
	modes := []string{"fast", "slow", "balanced"}
	tool := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "set_mode", Description: openai.String("Set the mode"),
		Parameters: shared.FunctionParameters{"type": "object", "required": []string{"mode"}, "properties": map[string]any{
			"mode":    map[string]any{"type": "string", "enum": modes},
			"verbose": map[string]any{"type": "boolean"},
		}}})
	const maxTokens = 256
	for _, sampling := range []struct {
		temperature float64
		seed        int64
	}{{0, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}} {
		t.Run(fmt.Sprintf("temperature %g seed %d", sampling.temperature, sampling.seed), func(t *testing.T) {
			resp, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:             testModel,
				Messages:          []openai.ChatCompletionMessageParamUnion{openai.UserMessage("the fox jumps over the lazy dog")},
				Tools:             []openai.ChatCompletionToolUnionParam{tool},
				ToolChoice:        openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
				ParallelToolCalls: openai.Bool(false), // one call: with several, their number is the model's
				MaxTokens:         openai.Int(maxTokens), Temperature: openai.Float(sampling.temperature), Seed: openai.Int(sampling.seed),
			}, option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false}))
			if err != nil {
				t.Fatal(err)
			}
			choice := resp.Choices[0]
			if choice.FinishReason != "tool_calls" || len(choice.Message.ToolCalls) == 0 || resp.Usage.CompletionTokens > maxTokens {
				t.Fatalf("finish %q after %d tokens with calls %+v; want tool_calls within %d", choice.FinishReason, resp.Usage.CompletionTokens, choice.Message.ToolCalls, maxTokens)
			}
			// The content is the white space before and after the call: two runs.
			if content := choice.Message.Content; strings.TrimLeft(content, " \t\r\n") != "" || len(content) > 2*8 {
				t.Errorf("content %q beside the call, want at most 8 bytes of white space before it and after it", content)
			}
			for _, call := range choice.Message.ToolCalls {
				var args map[string]any
				if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
					t.Fatalf("arguments %q: %v", call.Function.Arguments, err)
				}
				mode, _ := args["mode"].(string)
				valid := call.Function.Name == "set_mode" && slices.Contains(modes, mode)
				for key, value := range args {
					_, isBool := value.(bool)
					valid = valid && (key == "mode" || key == "verbose" && isBool)
				}
				if !valid {
					t.Errorf("call %s(%s) does not satisfy the schema", call.Function.Name, call.Function.Arguments)
				}
			}
		})
	}
}

// TestJSONReplyRandomModelBoundsWhitespace asks the random-weight model for
// sampled json_schema replies whose values are enums and booleans: each
// must be complete JSON of the schema within max_tokens, without a run of
// more than 8 bytes of white space (the documented bound, maxBlank).
func TestJSONReplyRandomModelBoundsWhitespace(t *testing.T) {
	h := serveTinyLong(t)
	format := shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "choice", Schema: map[string]any{"type": "object", "additionalProperties": false,
		"required": []string{"colour", "sure"}, "properties": map[string]any{
			"colour": map[string]any{"enum": []string{"red", "blue"}},
			"sure":   map[string]any{"type": "boolean"},
		}}}
	for seed := range int64(4) {
		resp, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:          testModel,
			Messages:       []openai.ChatCompletionMessageParamUnion{openai.UserMessage("the fox")},
			ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{JSONSchema: format}},
			MaxTokens:      openai.Int(256), Temperature: openai.Float(1), Seed: openai.Int(seed),
		}, option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false}))
		if err != nil {
			t.Fatal(err)
		}
		reply := resp.Choices[0].Message.Content
		var got struct {
			Colour *string
			Sure   *bool
		}
		if err := json.Unmarshal([]byte(reply), &got); err != nil || got.Colour == nil || got.Sure == nil || resp.Choices[0].FinishReason != "stop" {
			t.Errorf("seed %d: reply %q (%s): %v", seed, reply, resp.Choices[0].FinishReason, err)
		}
		if blanks := longestBlankRun(reply); blanks > 8 {
			t.Errorf("seed %d: %d bytes of white space in a row in %q", seed, blanks, reply)
		}
	}
}

// serveTinyLong serves the tiny preset with a 2,048-token context (same
// byte-level tokenizer, the Qwen3.6 chat template), room for a prompt that
// lists tools.
func serveTinyLong(t *testing.T) *harness {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	p.MaxPositions = 2048 // a tool's description makes a prompt of ~1,000 byte-level tokens
	dir := filepath.Join(t.TempDir(), "tiny-2k")
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: testSeed}); err != nil {
		t.Fatal(err)
	}
	return serveTiny(t, harnessOptions{tok: qwenTokenizer(t), target: dir, context: p.MaxPositions, spec: engine.SpecOptions{Mode: engine.SpecAuto}})
}

// longestBlankRun is the most bytes of JSON white space in a row in s.
func longestBlankRun(s string) int {
	longest, run := 0, 0
	for i := range len(s) {
		run++
		if !isBlank(s[i]) {
			run = 0
		}
		longest = max(longest, run)
	}
	return longest
}
