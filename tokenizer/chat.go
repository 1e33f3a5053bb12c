package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ardanlabs/jinja"
)

// ChatTemplate renders a checkpoint's Jinja chat template the way
// transformers' apply_chat_template does. Request JSON keeps its key order
// all the way into the template, so that filters such as tojson print
// objects as the client wrote them, as HF's renderer does.
type ChatTemplate struct {
	template      *jinja.Template
	specialTokens map[string]string
}

// NewChatTemplate compiles a chat template. specialTokens are the
// tokenizer's named tokens (bos_token, eos_token, ...), which transformers
// passes to every template; nil for none.
func NewChatTemplate(source string, specialTokens map[string]string) (*ChatTemplate, error) {
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("compile chat template: %w", err)
	}
	return &ChatTemplate{template: tmpl, specialTokens: specialTokens}, nil
}

// ChatRequest is what a chat template is rendered with.
type ChatRequest struct {
	Messages            json.RawMessage // JSON array of message objects, as in an OpenAI request
	Tools               json.RawMessage // JSON array of tool objects; empty or null for none
	AddGenerationPrompt bool
	EnableThinking      *bool           // nil leaves the template's default
	Variables           json.RawMessage // JSON object of further template variables (chat_template_kwargs); may be empty
}

// Render returns the prompt text.
func (c *ChatTemplate) Render(req ChatRequest) (string, error) {
	vars := make(map[string]jinja.Value, len(c.specialTokens)+4)
	for name, content := range c.specialTokens {
		vars[name] = jinja.NewString(content)
	}
	if len(req.Variables) > 0 {
		extra, err := decodeJSONOf(req.Variables, "chat template variables must be a JSON object", jinja.Value.IsDict)
		if err != nil {
			return "", err
		}
		dict := extra.AsDict()
		for _, name := range dict.Keys {
			if name == "messages" || name == "tools" || name == "add_generation_prompt" {
				return "", fmt.Errorf("chat template variables cannot set %q", name)
			}
			vars[name] = dict.Data[name]
		}
	}
	messages, err := decodeJSONOf(req.Messages, "chat messages must be a JSON array", jinja.Value.IsList)
	if err != nil {
		return "", err
	}
	vars["messages"] = messages
	vars["tools"] = jinja.None()
	if len(req.Tools) > 0 {
		isListOrNull := func(v jinja.Value) bool { return v.IsList() || v.IsNone() }
		if vars["tools"], err = decodeJSONOf(req.Tools, "chat tools must be a JSON array", isListOrNull); err != nil {
			return "", err
		}
	}
	vars["add_generation_prompt"] = jinja.NewBool(req.AddGenerationPrompt)
	if req.EnableThinking != nil {
		vars["enable_thinking"] = jinja.NewBool(*req.EnableThinking)
	}
	out, err := c.template.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// decodeJSONOf decodes JSON that must be of the kind isKind accepts; what
// says what was expected.
func decodeJSONOf(data []byte, what string, isKind func(jinja.Value) bool) (jinja.Value, error) {
	v, err := decodeJSONValue(data)
	if err == nil && !isKind(v) {
		err = errors.New("got another JSON type")
	}
	if err != nil {
		return jinja.Value{}, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

// decodeJSONValue converts JSON to a template value, keeping object keys in
// their written order and integers apart from floats.
func decodeJSONValue(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Value{}, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			var items []jinja.Value
			for dec.More() {
				item, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, item)
			}
			_, err := dec.Token() // ]
			return jinja.NewList(items), err
		}
		obj := jinja.NewDict()
		for dec.More() {
			key, err := dec.Token()
			if err != nil {
				return jinja.Value{}, err
			}
			val, err := decodeValue(dec)
			if err != nil {
				return jinja.Value{}, err
			}
			obj.AsDict().Set(key.(string), val)
		}
		_, err := dec.Token() // }
		return obj, err
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return jinja.FromGoValue(t), nil
	case bool:
		return jinja.NewBool(t), nil
	}
	return jinja.None(), nil
}
