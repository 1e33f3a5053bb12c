package server

import (
	"encoding/json"
	"math"
	"slices"
	"sort"
	"sync"

	"ddflash/engine"
	"ddflash/tokenizer"
)

// Tool choices.
const (
	toolsAuto     = "auto"
	toolsNone     = "none"
	toolsRequired = "required"
	toolsNamed    = "function"
)

// toolChoice is a request's tool_choice with the tools it may call.
type toolChoice struct {
	mode      string
	all       []toolSpec // the request's tools
	functions []toolSpec // the callable ones (named: just that one)
	parallel  bool       // several calls in one reply (when constrained)
}

// toolSpec is what a call of one function must look like.
type toolSpec struct {
	name     string
	types    map[string]string  // each parameter's JSON schema type
	params   map[string]*schema // a parameter's value grammar: JSON of a schema; for a string, free text (nil) or stringChoices
	keys     []string           // the parameters, sorted; nil: any name
	required []string
}

func (c toolChoice) constrains() bool { return c.mode == toolsRequired || c.mode == toolsNamed }

// readToolChoice reads tool_choice (default: auto with tools, else none).
func readToolChoice(raw, tools json.RawMessage) (toolChoice, error) {
	specs, err := toolSpecs(tools)
	if err != nil {
		return toolChoice{}, err
	}
	c := toolChoice{mode: toolsNone, all: specs, functions: specs}
	if len(specs) > 0 {
		c.mode = toolsAuto
	}
	if isJSONNull(raw) {
		return c, nil
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	switch {
	case json.Unmarshal(raw, &c.mode) == nil:
		if !slices.Contains([]string{toolsAuto, toolsNone, toolsRequired}, c.mode) {
			return c, badRequest("tool_choice", "tool_choice %q: want \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", c.mode)
		}
	case json.Unmarshal(raw, &named) == nil && named.Type == "function" && named.Function.Name != "":
		c.mode = toolsNamed
		i := slices.IndexFunc(specs, func(s toolSpec) bool { return s.name == named.Function.Name })
		if i < 0 {
			return c, badRequest("tool_choice", "tool_choice names the function %q, which is not among the tools", named.Function.Name)
		}
		c.functions = specs[i : i+1]
	default:
		return c, badRequest("tool_choice", "tool_choice: want \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")
	}
	if c.constrains() && len(specs) == 0 {
		return c, badRequest("tool_choice", "tool_choice %q needs tools", c.mode)
	}
	return c, nil
}

// toolSpecs reads the request's tools: OpenAI's
// [{"type": "function", "function": {"name", "parameters"}}].
func toolSpecs(raw json.RawMessage) ([]toolSpec, error) {
	if isJSONNull(raw) {
		return nil, nil
	}
	var tools []struct {
		Type     string `json:"type"`
		Function *struct {
			Name       string `json:"name"`
			Parameters struct {
				Properties map[string]json.RawMessage `json:"properties"`
				Required   []string                   `json:"required"`
			} `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, badRequest("tools", "tools: want an array of {\"type\": \"function\", \"function\": {\"name\", \"parameters\"}}")
	}
	var specs []toolSpec
	for i, t := range tools {
		if t.Function == nil || t.Function.Name == "" {
			return nil, badRequest("tools", "tools[%d]: want {\"type\": \"function\", \"function\": {\"name\", ...}}", i)
		}
		spec := toolSpec{name: t.Function.Name, required: t.Function.Parameters.Required, params: map[string]*schema{}, types: map[string]string{}}
		for name, prop := range t.Function.Parameters.Properties {
			spec.keys = append(spec.keys, name)
			spec.types[name] = schemaType(typeOf(prop))
			if spec.types[name] == "string" {
				spec.params[name] = stringChoices(prop) // free text unless the schema lists the values
				continue
			}
			// A schema constrained decoding cannot enforce leaves the value free.
			spec.params[name], _ = compileSchema(prop, name)
		}
		sort.Strings(spec.keys)
		specs = append(specs, spec)
	}
	return specs, nil
}

// stringChoices is the value grammar of a string parameter whose schema
// lists its values (enum or const): one of those strings as written, for
// qwen3_coder writes string values unquoted. It is nil, free text, when the
// schema lists no string values.
func stringChoices(prop json.RawMessage) *schema {
	var listed struct {
		Enum  []json.RawMessage `json:"enum"`
		Const json.RawMessage   `json:"const"`
	}
	_ = json.Unmarshal(prop, &listed)
	values := listed.Enum
	if listed.Const != nil {
		values = []json.RawMessage{listed.Const}
	}
	var choices []string
	for _, v := range values {
		var s string
		if json.Unmarshal(v, &s) == nil {
			choices = append(choices, s)
		}
	}
	if choices == nil {
		return nil
	}
	return &schema{enum: choices}
}

func typeOf(prop json.RawMessage) json.RawMessage {
	var p struct {
		Type json.RawMessage `json:"type"`
	}
	_ = json.Unmarshal(prop, &p)
	return p.Type
}

// grammar is the replies that call the allowed tools: only calls, in the
// qwen3_coder form, one or (parallel) several.
func (c toolChoice) grammar() grammar { return toolCallsGrammar(c) }

type toolCallsGrammar toolChoice

// readResponseFormat reads response_format: nil for text.
func readResponseFormat(raw json.RawMessage) (grammar, error) {
	if isJSONNull(raw) {
		return nil, nil
	}
	var f struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, badRequest("response_format", "response_format: want {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}")
	}
	switch f.Type {
	case "text":
		return nil, nil
	case "json_object":
		return jsonReply{&schema{types: []string{"object"}}}, nil
	case "json_schema":
		if f.JSONSchema == nil || isJSONNull(f.JSONSchema.Schema) {
			return nil, badRequest("response_format", "response_format json_schema: want {\"json_schema\": {\"name\", \"schema\"}}")
		}
		s, err := compileSchema(f.JSONSchema.Schema, "schema")
		if err != nil {
			return nil, badRequest("response_format", "response_format json_schema: %v", err)
		}
		return jsonReply{s}, nil
	}
	return nil, badRequest("response_format", "response_format type %q: want text, json_object or json_schema", f.Type)
}

// grammarConstraint masks the tokens that would take a reply outside its
// grammar. It holds no state between calls, so every speculative path is
// checked on its own.
type grammarConstraint struct {
	g     grammar
	vocab *vocabBytes
	stops []int32 // tokens allowed (only) once the reply is complete
}

// newConstraint constrains g's replies to shape (after the reasoning, when
// the prompt opened a <think> block).
func newConstraint(m *Model, shape grammar, thinking bool, r engine.Request) *grammarConstraint {
	if thinking {
		shape = afterThinking{shape}
	}
	return &grammarConstraint{g: shape, vocab: vocabOf(m.Tokenizer.Tokenizer), stops: slices.Concat(m.Engine.EOS, r.StopTokenIDs)}
}

// Mask parses the reply so far once, then tries each token's bytes on a
// copy of that parser: O(vocabulary × token length) per step, whatever the
// reply's length. Tokens are tried in groups by first byte: where the
// grammar fixes what comes next, most groups fail on that byte alone.
func (c *grammarConstraint) Mask(output []int32, row []float32) {
	reply := newParser(c.g)
	for _, id := range output {
		reply.feed(c.vocab.bytes(id))
	}
	complete := reply.complete()
	stopLogits := make([]float32, len(c.stops))
	for i, id := range c.stops {
		if int(id) < len(row) {
			stopLogits[i] = row[id]
		}
	}
	allowed := 0
	var afterFirst, token parser
	for first, group := range c.vocab.byFirst {
		reply.forkInto(&afterFirst)
		firstOK := afterFirst.feed([]byte{byte(first)})
		for _, id := range group {
			if int(id) >= len(row) {
				continue
			}
			ok := firstOK && !slices.Contains(c.stops, id)
			if b := c.vocab.table[id]; ok && len(b) > 1 {
				afterFirst.forkInto(&token)
				ok = token.feed(b[1:])
			}
			if ok {
				allowed++
			} else {
				row[id] = float32(math.Inf(-1))
			}
		}
	}
	for i, id := range c.stops {
		if int(id) < len(row) {
			row[id] = float32(math.Inf(-1))
			if complete {
				row[id] = stopLogits[i]
				allowed++
			}
		}
	}
	for id := range row {
		if c.vocab.bytes(int32(id)) == nil && !slices.Contains(c.stops, int32(id)) {
			row[id] = float32(math.Inf(-1)) // special tokens no grammar allows
		}
	}
	if allowed == 0 {
		// Nothing can follow (the stop tokens are out of the row): let
		// the stop tokens end the reply rather than sample from nothing.
		for i, id := range c.stops {
			if int(id) < len(row) {
				row[id] = stopLogits[i]
			}
		}
	}
}

// vocabBytes are each token's bytes, nil for special tokens (which no
// grammar allows), computed once per tokenizer, with the ids of the
// non-special tokens grouped by their first byte.
type vocabBytes struct {
	table   [][]byte
	byFirst [256][]int32
}

func (v *vocabBytes) bytes(id int32) []byte {
	if id < 0 || int(id) >= len(v.table) {
		return nil
	}
	return v.table[id]
}

var vocabs sync.Map // *tokenizer.Tokenizer → *vocabBytes

func vocabOf(tok *tokenizer.Tokenizer) *vocabBytes {
	if v, ok := vocabs.Load(tok); ok {
		return v.(*vocabBytes)
	}
	v := &vocabBytes{table: make([][]byte, tok.VocabSize())}
	for id := range v.table {
		if tok.IsSpecial(int32(id)) {
			continue
		}
		if b, err := tok.TokenBytes(int32(id)); err == nil && len(b) > 0 {
			v.table[id] = b
			v.byFirst[b[0]] = append(v.byFirst[b[0]], int32(id))
		}
	}
	actual, _ := vocabs.LoadOrStore(tok, v)
	return actual.(*vocabBytes)
}
