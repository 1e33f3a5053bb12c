package server

import (
	"encoding/json"
	"net/http"
	"testing"

	"ddflash/engine"
	"ddflash/mamba"
)

// TestConstrainedRealEngine asks the tiny model, under DDTree speculation,
// for a json_schema reply: the engine applies the grammar's mask along each
// draft path, so the greedy reply is valid JSON of the schema and the same
// tokens as the autoregressive engine under the same constraint. (Needs the
// engine to honour Request.Constraint: the sampling branch.)
func TestConstrainedRealEngine(t *testing.T) {
	tok := qwenTokenizer(t)
	h := serveTiny(t, harnessOptions{tok: tok, spec: engine.SpecOptions{Mode: engine.SpecTree, Budget: 4, Rollback: mamba.Snapshot}})
	const format = `{"type": "json_schema", "json_schema": {"name": "colour", "schema": {"type": "object", "additionalProperties": false,
		"required": ["c"], "properties": {"c": {"enum": ["red", "blue"]}}}}}`
	body := `{"messages": [{"role": "user", "content": "the fox"}], "temperature": 0, "max_tokens": 150,
		"chat_template_kwargs": {"enable_thinking": false}, "response_format": ` + format + `}`
	var resp struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	postJSON(t, h, "/v1/chat/completions", body, http.StatusOK, &resp)
	var got struct{ C string }
	if err := json.Unmarshal([]byte(resp.Choices[0].Message.Content), &got); err != nil || got.C != "red" && got.C != "blue" || resp.Choices[0].FinishReason != "stop" {
		t.Fatalf("reply %q (%s): %v", resp.Choices[0].Message.Content, resp.Choices[0].FinishReason, err)
	}
	var rendered tokenizeResponse
	postJSON(t, h, "/tokenize", `{"messages": [{"role": "user", "content": "the fox"}], "chat_template_kwargs": {"enable_thinking": false}}`, http.StatusOK, &rendered)
	shape, err := readResponseFormat(json.RawMessage(format))
	if err != nil {
		t.Fatal(err)
	}
	r := engine.Request{Prompt: rendered.Tokens, MaxTokens: 150}
	r.Constraint = newConstraint(h.model, shape, false, r)
	ref := referenceRun(t, r)
	want, _ := tok.Decode(ref.Tokens, true)
	if want != resp.Choices[0].Message.Content {
		t.Errorf("speculative reply %q, autoregressive %q", resp.Choices[0].Message.Content, want)
	}
}
