package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// qwen3ChatTemplate returns the chat_template of the real Qwen3 tokenizer_config.json.
func qwen3ChatTemplate(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(qwen3Dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatalf("the Qwen3 tokenizer data is missing (%v): run `make deps`", err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil || cfg.ChatTemplate == "" {
		t.Fatalf("tokenizer_config.json has no chat_template: %v", err)
	}
	return cfg.ChatTemplate
}

// TestChatTemplateMatchesHF renders the Qwen3 template on conversations
// rendered by @huggingface/jinja (tools/goldens/generate.js).
func TestChatTemplateMatchesHF(t *testing.T) {
	tmpl, err := NewChatTemplate(qwen3ChatTemplate(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("testdata", "qwen3_chat.json"))
	if err != nil {
		t.Fatal(err)
	}
	var goldens []struct {
		Name                string          `json:"name"`
		Messages            json.RawMessage `json:"messages"`
		Tools               json.RawMessage `json:"tools"`
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
		EnableThinking      *bool           `json:"enable_thinking"`
		Output              string          `json:"output"`
	}
	if err := json.Unmarshal(data, &goldens); err != nil {
		t.Fatal(err)
	}
	if len(goldens) < 10 {
		t.Fatalf("only %d conversations", len(goldens))
	}
	for _, g := range goldens {
		got, err := tmpl.Render(ChatRequest{
			Messages: g.Messages, Tools: g.Tools, AddGenerationPrompt: g.AddGenerationPrompt, EnableThinking: g.EnableThinking,
		})
		if err != nil {
			t.Errorf("%s: %v", g.Name, err)
		} else if got != g.Output {
			t.Errorf("%s:\n got %q\nwant %q", g.Name, got, g.Output)
		}
	}
}

func TestChatTemplateVariables(t *testing.T) {
	tmpl, err := NewChatTemplate(`{{ bos_token }}|{{ messages[0].content }}|{{ flag }}|{{ enable_thinking }}|{{ tools is none }}`,
		map[string]string{"bos_token": "<s>"})
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	got, err := tmpl.Render(ChatRequest{
		Messages:       json.RawMessage(`[{"role": "user", "content": "hi"}]`),
		Variables:      json.RawMessage(`{"flag": 7, "enable_thinking": false}`),
		EnableThinking: &yes, // the explicit field wins over Variables
	})
	if want := "<s>|hi|7|True|True"; err != nil || got != want {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
}

func TestChatTemplateRejectsBadRequests(t *testing.T) {
	tmpl, err := NewChatTemplate(`{{ messages }}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		req  ChatRequest
		want string
	}{
		{"messages not an array", ChatRequest{Messages: json.RawMessage(`{"role": "user"}`)}, "messages must be a JSON array"},
		{"broken messages", ChatRequest{Messages: json.RawMessage(`[{"role": `)}, "messages must be a JSON array"},
		{"trailing data", ChatRequest{Messages: json.RawMessage(`[] []`)}, "messages must be a JSON array"},
		{"tools not an array", ChatRequest{Messages: json.RawMessage(`[]`), Tools: json.RawMessage(`"x"`)}, "tools must be a JSON array"},
		{"variables not an object", ChatRequest{Messages: json.RawMessage(`[]`), Variables: json.RawMessage(`[1]`)}, "variables must be a JSON object"},
		{"variables set messages", ChatRequest{Messages: json.RawMessage(`[]`), Variables: json.RawMessage(`{"messages": []}`)}, `cannot set "messages"`},
	} {
		if _, err := tmpl.Render(c.req); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := NewChatTemplate(`{% if %}`, nil); err == nil {
		t.Error("a broken template compiled")
	}
}
