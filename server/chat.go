package server

import (
	"bytes"
	"encoding/json"
	"net/http"

	"ddflash/tokenizer"
)

// chatPrompt are the fields a chat prompt is rendered from (chat
// completions and /tokenize share them).
type chatPrompt struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"` // e.g. {"enable_thinking": false}
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

// render applies the model's chat template and encodes the result.
func (c *chatPrompt) render(m *Model) ([]int32, error) {
	if m.Tokenizer.ChatTemplate == nil {
		return nil, badRequest("messages", "this model has no chat template: use /v1/completions with a prompt")
	}
	var msgs []struct {
		Role *string `json:"role"`
	}
	if err := json.Unmarshal(c.Messages, &msgs); err != nil || len(msgs) == 0 {
		return nil, badRequest("messages", "messages: want a non-empty array of {\"role\", \"content\"} objects")
	}
	for i, msg := range msgs {
		if msg.Role == nil {
			return nil, badRequest("messages", "messages[%d]: the role is missing", i)
		}
	}
	req := tokenizer.ChatRequest{Messages: c.Messages, Tools: c.Tools, AddGenerationPrompt: true, Variables: c.ChatTemplateKwargs}
	if c.AddGenerationPrompt != nil {
		req.AddGenerationPrompt = *c.AddGenerationPrompt
	}
	if isJSONNull(req.Variables) {
		req.Variables = nil
	}
	text, err := m.Tokenizer.ChatTemplate.Render(req)
	if err != nil {
		return nil, badRequest("messages", "%v", err)
	}
	return m.Tokenizer.Encode(text), nil
}

func isJSONNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// chatRequest is POST /v1/chat/completions.
type chatRequest struct {
	samplingFields
	chatPrompt
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int64          `json:"top_logprobs"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
}

func (s *Server) chatRequest(r *http.Request, m *Model) (*genRequest, error) {
	var req chatRequest
	if err := s.readRequest(r, &req); err != nil {
		return nil, err
	}
	if err := checkToolChoice(req.ToolChoice); err != nil {
		return nil, err
	}
	logprobs := -1
	switch {
	case req.TopLogprobs != nil && !req.Logprobs:
		return nil, badRequest("top_logprobs", "top_logprobs needs logprobs: true")
	case req.TopLogprobs != nil:
		if err := checkLogprobs("top_logprobs", *req.TopLogprobs); err != nil {
			return nil, err
		}
		logprobs = int(*req.TopLogprobs)
	case req.Logprobs:
		logprobs = 0
	}
	ids, err := req.render(m)
	if err != nil {
		return nil, err
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	return req.build(m.Engine.Context, ids, maxTokens, 0, logprobs)
}

// checkToolChoice accepts what needs no tool-call parsing: tools may be
// rendered into the prompt, and calls come back as text.
func checkToolChoice(raw json.RawMessage) error {
	if isJSONNull(raw) {
		return nil
	}
	var choice string
	if json.Unmarshal(raw, &choice) != nil || (choice != "auto" && choice != "none") {
		return badRequest("tool_choice", "tool_choice: only \"auto\" and \"none\" are supported (tool calls are returned as text)")
	}
	return nil
}

// chatAPI shapes /v1/chat/completions responses.
type chatAPI struct{ tok *tokenizer.Tokenizer }

func newChatAPI(m *Model) endpoint { return chatAPI{m.Tokenizer.Tokenizer} }

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *chatMessage  `json:"message,omitempty"` // responses
	Delta        *chatMessage  `json:"delta,omitempty"`   // streamed chunks
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopReason   *string       `json:"stop_reason,omitempty"`
}

type chatMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatTokenLogprob struct {
	chatTopLogprob
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"` // the UTF-8 bytes of Token, as numbers
}

func (chatAPI) idPrefix() string { return "chatcmpl-" }

func (chatAPI) object(stream bool) string {
	if stream {
		return "chat.completion.chunk"
	}
	return "chat.completion"
}

// opening announces the assistant's role, as OpenAI's first chunk does.
func (chatAPI) opening() any {
	empty := ""
	return chatChoice{Delta: &chatMessage{Role: "assistant", Content: &empty}}
}

func (a chatAPI) choice(d delta, res outcome, stream bool) any {
	c := chatChoice{FinishReason: nonEmpty(res.finish), StopReason: nonEmpty(res.stopReason)}
	switch {
	case !stream:
		c.Message = &chatMessage{Role: "assistant", Content: &d.text}
	case d.text != "":
		c.Delta = &chatMessage{Content: &d.text}
	default:
		c.Delta = &chatMessage{}
	}
	if len(d.tokens) > 0 && d.tokens[0].lp != nil {
		c.Logprobs = &chatLogprobs{Content: []chatTokenLogprob{}}
		for _, t := range d.tokens {
			entry := chatTokenLogprob{chatTopLogprob: a.logprob(t.id, t.lp.Logprob), TopLogprobs: []chatTopLogprob{}}
			for _, alt := range t.lp.Top {
				entry.TopLogprobs = append(entry.TopLogprobs, a.logprob(alt.ID, alt.Logprob))
			}
			c.Logprobs.Content = append(c.Logprobs.Content, entry)
		}
	}
	return c
}

func (a chatAPI) logprob(id int32, lp float64) chatTopLogprob {
	text := tokenText(a.tok, id)
	b := make([]int, len(text))
	for i := range len(text) {
		b[i] = int(text[i])
	}
	return chatTopLogprob{Token: text, Logprob: lp, Bytes: b}
}
