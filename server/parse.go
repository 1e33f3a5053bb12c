package server

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Parsers say how chat output is split into reasoning, content and tool
// calls, as vLLM's --reasoning-parser and --tool-call-parser do.
type Parsers struct {
	Reasoning string // ReasoningQwen3, ParserNone, or "" for auto
	ToolCalls string // ToolCallsQwen3Coder, ParserNone, or "" for auto
}

// Parser names. Auto ("") turns each parser on for a request whose rendered
// prompt uses its tags (the checkpoint's template has them).
const (
	ParserNone          = "none"
	ReasoningQwen3      = "qwen3"
	ToolCallsQwen3Coder = "qwen3_coder"
)

// Check validates parser names (from flags).
func (p Parsers) Check() error {
	if p.Reasoning != "" && p.Reasoning != ReasoningQwen3 && p.Reasoning != ParserNone {
		return fmt.Errorf("reasoning parser %q: want %s or %s", p.Reasoning, ReasoningQwen3, ParserNone)
	}
	if p.ToolCalls != "" && p.ToolCalls != ToolCallsQwen3Coder && p.ToolCalls != ParserNone {
		return fmt.Errorf("tool-call parser %q: want %s or %s", p.ToolCalls, ToolCallsQwen3Coder, ParserNone)
	}
	return nil
}

// Qwen3's tags.
const (
	thinkOpen     = "<think>"
	thinkClose    = "</think>"
	toolCallOpen  = "<tool_call>"
	toolCallClose = "</tool_call>"
	functionOpen  = "<function="
	functionClose = "</function>"
	paramOpen     = "<parameter="
	paramClose    = "</parameter>"
)

// parsed is a piece of a chat reply, split.
type parsed struct {
	content, reasoning string
	calls              []toolCallDelta
}

func (p *parsed) add(o parsed) {
	p.content += o.content
	p.reasoning += o.reasoning
	p.calls = append(p.calls, o.calls...)
}

func (p parsed) empty() bool { return p.content == "" && p.reasoning == "" && len(p.calls) == 0 }

// toolCallDelta is part of a tool call: the first for a call carries its id
// and name, later ones fragments of its JSON arguments.
type toolCallDelta struct {
	index    int
	id, name string
	args     string
}

// mergeCalls joins a call's deltas into one entry per call.
func mergeCalls(deltas []toolCallDelta) []toolCallDelta {
	var calls []toolCallDelta
	for _, d := range deltas {
		if d.index == len(calls) {
			calls = append(calls, toolCallDelta{index: d.index, id: d.id, name: d.name})
		}
		calls[d.index].args += d.args
	}
	return calls
}

// paramTypes are each tool's parameters' JSON schema types, by function
// name: the model writes values as text, and these say how to type them.
type paramTypes map[string]map[string]string

// parserState is where a chatParser is in the reply.
type parserState int

const (
	inReasoning parserState = iota
	inContent
	inCallHead   // after <tool_call>: <function=NAME>
	inCallParams // parameters, then </function>
	inCallTail   // </tool_call>
)

// chatParser splits streamed reply text as vLLM's qwen3 reasoning parser
// and qwen3_coder tool-call parser do. Text that may be the start of a tag
// is held back until it is known, so a partial tag never reaches content.
type chatParser struct {
	state     parserState
	reasoning bool       // <think> may open the reply
	tools     paramTypes // nil: tool calls stay text
	buf       string     // text not yet classified
	started   bool       // the current part (reasoning or content) has begun
	trimLead  bool       // drop the blank lines that open the content (after </think>)
	calls     int        // tool calls begun
	params    int        // parameters of the current call
	function  string
	gap       string // the blank space before a <tool_call>, kept if it is no call
}

// newChatParser starts a parser. thinking says the prompt opened a <think>
// block; reasoning turns the reasoning parser on at all.
func newChatParser(reasoning, thinking bool, tools paramTypes) *chatParser {
	p := &chatParser{state: inContent, reasoning: reasoning, tools: tools}
	if reasoning && thinking {
		p.state = inReasoning
	}
	return p
}

// add takes the next text and returns what is now known.
func (p *chatParser) add(text string) parsed {
	p.buf += text
	var out parsed
	for p.step(&out, false) {
	}
	return out
}

// finish returns everything still held: the reply has ended.
func (p *chatParser) finish() parsed {
	var out parsed
	for p.step(&out, true) {
	}
	switch p.state {
	case inReasoning:
		out.reasoning += p.buf
	case inContent:
		if p.calls > 0 {
			p.buf = strings.TrimRight(p.buf, " \n") // nothing may follow calls but blank space
		}
		p.emitContent(&out, p.buf)
	case inCallHead:
		p.emitContent(&out, p.gap+toolCallOpen+p.buf) // not a call after all
	case inCallParams:
		out.calls = append(out.calls, toolCallDelta{index: p.calls - 1, args: p.closeArgs()})
	}
	p.buf = ""
	return out
}

// step consumes what it can from buf and reports whether to go on.
func (p *chatParser) step(out *parsed, final bool) bool {
	switch p.state {
	case inReasoning:
		if !p.started {
			if !final && len(p.buf) < len(thinkOpen) && strings.HasPrefix(thinkOpen, p.buf) {
				return false
			}
			p.buf = strings.TrimPrefix(p.buf, thinkOpen) // a model that opens the block itself
			p.started = true
		}
		if i := strings.Index(p.buf, thinkClose); i >= 0 {
			out.reasoning += strings.TrimRight(p.buf[:i], "\n")
			p.buf, p.state, p.started, p.trimLead = p.buf[i+len(thinkClose):], inContent, false, true
			return true
		}
		if !final {
			keep := heldTag(p.buf, thinkClose)
			out.reasoning += p.buf[:len(p.buf)-keep]
			p.buf = p.buf[len(p.buf)-keep:]
		}
		return false
	case inContent:
		if p.reasoning && !p.started && p.calls == 0 {
			trimmed := strings.TrimLeft(p.buf, " \n")
			if strings.HasPrefix(trimmed, thinkOpen) {
				p.buf, p.state = trimmed[len(thinkOpen):], inReasoning
				return true
			}
			if !final && len(trimmed) < len(thinkOpen) && strings.HasPrefix(thinkOpen, trimmed) {
				return false // may still open a <think> block
			}
		}
		if p.tools == nil {
			p.emitContent(out, p.buf)
			p.buf = ""
			return false
		}
		if i := strings.Index(p.buf, toolCallOpen); i >= 0 {
			before := strings.TrimRight(p.buf[:i], " \n")
			p.emitContent(out, before)
			p.gap = p.buf[len(before):i]
			p.buf, p.state = p.buf[i+len(toolCallOpen):], inCallHead
			return true
		}
		if !final {
			keep := heldTag(p.buf, toolCallOpen)
			p.emitContent(out, p.buf[:len(p.buf)-keep])
			p.buf = p.buf[len(p.buf)-keep:]
		}
		return false
	case inCallHead:
		head := strings.TrimLeft(p.buf, " \n")
		if len(head) < len(functionOpen) || !strings.Contains(head, ">") {
			return false
		}
		if !strings.HasPrefix(head, functionOpen) {
			p.state = inContent // not a call: keep the text
			p.emitContent(out, p.gap+toolCallOpen+p.buf)
			p.buf = ""
			return false
		}
		end := strings.IndexByte(head, '>')
		p.function = strings.TrimSpace(head[len(functionOpen):end])
		p.buf, p.state, p.params = head[end+1:], inCallParams, 0
		out.calls = append(out.calls, toolCallDelta{index: p.calls, id: "call_" + rand.Text()[:24], name: p.function})
		p.calls++
		return true
	case inCallParams:
		body := strings.TrimLeft(p.buf, " \n")
		switch {
		case strings.HasPrefix(body, functionClose):
			out.calls = append(out.calls, toolCallDelta{index: p.calls - 1, args: p.closeArgs()})
			p.buf, p.state = body[len(functionClose):], inCallTail
			return true
		case strings.HasPrefix(body, paramOpen):
			end := strings.Index(body, paramClose)
			gt := strings.IndexByte(body, '>')
			if end < 0 || gt > end {
				return false
			}
			name := strings.TrimSpace(body[len(paramOpen):gt])
			value := strings.TrimPrefix(body[gt+1:end], "\n")
			value = strings.TrimSuffix(value, "\n")
			sep := ", "
			if p.params == 0 {
				sep = "{"
			}
			p.params++
			key, _ := json.Marshal(name)
			out.calls = append(out.calls, toolCallDelta{index: p.calls - 1, args: sep + string(key) + ": " + p.typed(name, value)})
			p.buf = body[end+len(paramClose):]
			return true
		case len(body) < len(paramOpen) && (strings.HasPrefix(paramOpen, body) || strings.HasPrefix(functionClose, body)):
			return false
		}
		// Not the format: end the call here and go on looking for its close.
		out.calls = append(out.calls, toolCallDelta{index: p.calls - 1, args: p.closeArgs()})
		p.state = inCallTail
		return true
	case inCallTail:
		if i := strings.Index(p.buf, toolCallClose); i >= 0 {
			p.buf, p.state = p.buf[i+len(toolCallClose):], inContent
			return true
		}
		return false
	}
	return false
}

// emitContent adds content, dropping the blank lines that open it after
// a reasoning block.
func (p *chatParser) emitContent(out *parsed, text string) {
	if p.trimLead {
		text = strings.TrimLeft(text, " \n")
	}
	if text != "" {
		p.started, p.trimLead = true, false
		out.content += text
	}
}

// closeArgs ends the current call's arguments object.
func (p *chatParser) closeArgs() string {
	if p.params == 0 {
		return "{}"
	}
	return "}"
}

// typed is a parameter's value as JSON, typed by the function's schema as
// vLLM's qwen3_coder parser types it: text that does not parse as the
// schema's type stays a string.
func (p *chatParser) typed(param, value string) string {
	asString := func() string {
		b, _ := json.Marshal(value)
		return string(b)
	}
	if strings.ToLower(value) == "null" {
		return "null"
	}
	switch p.tools[p.function][param] {
	case "integer", "int":
		if _, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64); err == nil {
			return strings.TrimSpace(value)
		}
	case "number", "float":
		if v := strings.TrimSpace(value); json.Valid([]byte(v)) {
			if _, err := strconv.ParseFloat(v, 64); err == nil {
				return v
			}
		}
	case "boolean", "bool":
		switch v := strings.ToLower(strings.TrimSpace(value)); v {
		case "true", "false":
			return v
		}
	case "object", "array", "dict", "list":
		var compact bytes.Buffer
		if json.Compact(&compact, []byte(value)) == nil {
			return compact.String()
		}
	}
	return asString()
}

// heldTag is how many bytes at the end of text to hold back because they
// may be the start of tag, with the blank space before it.
func heldTag(text, tag string) int {
	for n := min(len(tag)-1, len(text)); n > 0; n-- {
		if strings.HasSuffix(text, tag[:n]) {
			return n + trailingSpace(text[:len(text)-n])
		}
	}
	return trailingSpace(text)
}

func trailingSpace(s string) int { return len(s) - len(strings.TrimRight(s, " \n")) }

// paramTypesOf are the tools' parameter types, by function.
func paramTypesOf(specs []toolSpec) paramTypes {
	types := paramTypes{}
	for _, spec := range specs {
		types[spec.name] = spec.types
	}
	return types
}

// schemaType is a JSON schema "type": a name, or the first non-null name
// of a list.
func schemaType(raw json.RawMessage) string {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one
	}
	var many []string
	_ = json.Unmarshal(raw, &many)
	for _, t := range many {
		if t != "null" {
			return t
		}
	}
	return ""
}
