package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

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
	text, err := c.renderText(m)
	if err != nil {
		return nil, err
	}
	return m.Tokenizer.Encode(text), nil
}

// renderText applies the model's chat template.
func (c *chatPrompt) renderText(m *Model) (string, error) {
	if m.Tokenizer.ChatTemplate == nil {
		return "", badRequest("messages", "this model has no chat template: use /v1/completions with a prompt")
	}
	messages, err := normalizeMessages(c.Messages)
	if err != nil {
		return "", err
	}
	req := tokenizer.ChatRequest{Messages: messages, Tools: c.Tools, AddGenerationPrompt: true, Variables: c.ChatTemplateKwargs}
	if c.AddGenerationPrompt != nil {
		req.AddGenerationPrompt = *c.AddGenerationPrompt
	}
	if isJSONNull(req.Variables) {
		req.Variables = nil
	}
	text, err := m.Tokenizer.ChatTemplate.Render(req)
	if err != nil {
		return "", badRequest("messages", "%v", err)
	}
	return text, nil
}

// normalizeMessages rewrites OpenAI client messages into what chat
// templates expect, as vLLM does: a tool call's arguments, which clients
// send as a JSON string, become the object it holds, and an assistant
// message's "reasoning" is also its "reasoning_content".
func normalizeMessages(raw json.RawMessage) (json.RawMessage, error) {
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) == 0 {
		return nil, badRequest("messages", "messages: want a non-empty array of {\"role\", \"content\"} objects")
	}
	for i, msg := range msgs {
		if isJSONNull(msg["role"]) {
			return nil, badRequest("messages", "messages[%d]: the role is missing", i)
		}
		if r, ok := msg["reasoning"]; ok && isJSONNull(msg["reasoning_content"]) {
			msg["reasoning_content"] = r
		}
		if isJSONNull(msg["tool_calls"]) {
			continue
		}
		var calls []map[string]json.RawMessage
		if err := json.Unmarshal(msg["tool_calls"], &calls); err != nil {
			return nil, badRequest("messages", "messages[%d].tool_calls: want an array of {\"id\", \"type\", \"function\"} objects", i)
		}
		for j, call := range calls {
			var fn map[string]json.RawMessage
			if err := json.Unmarshal(call["function"], &fn); err != nil {
				return nil, badRequest("messages", "messages[%d].tool_calls[%d].function: want an object with name and arguments", i, j)
			}
			var args string
			if json.Unmarshal(fn["arguments"], &args) != nil {
				continue // an object already, or absent
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(args), &obj); err != nil || obj == nil {
				return nil, badRequest("messages", "messages[%d].tool_calls[%d].function.arguments: want a JSON object (as a string or an object)", i, j)
			}
			fn["arguments"] = json.RawMessage(args)
			call["function"], _ = json.Marshal(fn)
		}
		msg["tool_calls"], _ = json.Marshal(calls)
	}
	return json.Marshal(msgs)
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
	ResponseFormat      json.RawMessage `json:"response_format"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
}

func (s *Server) chatRequest(r *http.Request, m *Model) (*genRequest, error) {
	var req chatRequest
	if err := s.readRequest(r, &req); err != nil {
		return nil, err
	}
	choice, err := readToolChoice(req.ToolChoice, req.Tools)
	if err != nil {
		return nil, err
	}
	choice.parallel = req.ParallelToolCalls == nil || *req.ParallelToolCalls
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
	text, err := req.renderText(m)
	if err != nil {
		return nil, err
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	g, err := req.build(m, m.Tokenizer.Encode(text), maxTokens, 0, logprobs)
	if err != nil {
		return nil, err
	}
	reasoning := m.Parsers.Reasoning == ReasoningQwen3 || m.Parsers.Reasoning == "" && strings.Contains(text, thinkOpen)
	thinking := reasoning && strings.HasSuffix(strings.TrimRight(text, " \n"), thinkOpen)
	var tools paramTypes
	if choice.mode != toolsNone && (m.Parsers.ToolCalls == ToolCallsQwen3Coder || m.Parsers.ToolCalls == "" && strings.Contains(text, toolCallOpen)) {
		tools = paramTypesOf(choice.all)
	}
	g.newParser = func() *chatParser { return newChatParser(reasoning, thinking, tools) }
	var shape grammar
	switch format, err := readResponseFormat(req.ResponseFormat); {
	case err != nil:
		return nil, err
	case format != nil && choice.constrains():
		return nil, badRequest("response_format", "response_format cannot be combined with tool_choice %q: the reply is a tool call", choice.mode)
	case format != nil:
		shape = format
	case choice.constrains():
		if tools == nil {
			return nil, badRequest("tool_choice", "tool_choice %q needs the qwen3_coder tool-call parser (serve --tool-call-parser) and a template that renders tools", choice.mode)
		}
		shape = choice.grammar()
	}
	if shape != nil {
		g.req.Constraint = newConstraint(m, shape, thinking, g.req)
	}
	return g, nil
}

// chatAPI shapes /v1/chat/completions responses.
type chatAPI struct{ tok *tokenizer.Tokenizer }

func newChatAPI(m *Model) endpoint { return chatAPI{m.Tokenizer.Tokenizer} }

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *chatMessage  `json:"message,omitempty"` // responses
	Delta        *chatDelta    `json:"delta,omitempty"`   // streamed chunks
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopReason   any           `json:"stop_reason,omitempty"` // see outcome.stopReason
}

// chatMessage is a reply (nil content: none, as when the reply calls tools).
type chatMessage struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

// chatDelta is part of a streamed reply.
type chatDelta struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

type toolCall struct {
	Index    *int         `json:"index,omitempty"` // streamed deltas only
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"` // JSON text
}

// toolCalls shapes call deltas for the response (stream: the delta shape,
// where a call's first entry has its id and name and later ones carry
// argument fragments).
func toolCalls(deltas []toolCallDelta, stream bool) []toolCall {
	var out []toolCall
	for _, d := range deltas {
		c := toolCall{Function: toolFunction{Name: d.name, Arguments: d.args}}
		if d.id != "" {
			c.ID, c.Type = d.id, "function"
		}
		if stream {
			c.Index = &d.index
		}
		out = append(out, c)
	}
	return out
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
func (chatAPI) opening(index int) any {
	empty := ""
	return chatChoice{Index: index, Delta: &chatDelta{Role: "assistant", Content: &empty}}
}

func (a chatAPI) choice(d delta, res outcome, stream bool) any {
	c := chatChoice{Index: res.index, FinishReason: nonEmpty(res.finish), StopReason: res.stopReason}
	if stream {
		c.Delta = &chatDelta{Content: nonEmpty(d.split.content), ReasoningContent: nonEmpty(d.split.reasoning), ToolCalls: toolCalls(d.split.calls, true)}
	} else {
		calls := mergeCalls(d.split.calls)
		c.Message = &chatMessage{Role: "assistant", Content: &d.split.content, ReasoningContent: nonEmpty(d.split.reasoning), ToolCalls: toolCalls(calls, false)}
		if d.split.content == "" && (len(calls) > 0 || d.split.reasoning != "") {
			c.Message.Content = nil
		}
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
