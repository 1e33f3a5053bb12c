package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Dir is the tokenizer of a Hugging Face model directory: tokenizer.json,
// the named tokens of tokenizer_config.json, and the chat template
// (chat_template.jinja, or tokenizer_config.json's chat_template).
type Dir struct {
	*Tokenizer
	EOS, BOS, Pad, Unk SpecialToken
	ChatTemplate       *ChatTemplate // nil when the checkpoint has none
}

// SpecialToken is a token named in tokenizer_config.json. ID is -1 and
// Content "" when the config does not name one.
type SpecialToken struct {
	Content string
	ID      int32
}

// tokenizerConfig is the part of tokenizer_config.json ddflash reads. Token
// fields are a string, null, or an object with "content".
type tokenizerConfig struct {
	EOS          json.RawMessage `json:"eos_token"`
	BOS          json.RawMessage `json:"bos_token"`
	Pad          json.RawMessage `json:"pad_token"`
	Unk          json.RawMessage `json:"unk_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// LoadDir loads the tokenizer of a model directory. tokenizer.json is
// required; tokenizer_config.json and chat_template.jinja are optional.
func LoadDir(dir string) (*Dir, error) {
	tok, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	d := &Dir{Tokenizer: tok}
	var cfg tokenizerConfig
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(cfgPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(data, &cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", cfgPath, err)
		}
	}
	specials := map[string]string{}
	for _, field := range []struct {
		name string
		raw  json.RawMessage
		dst  *SpecialToken
	}{{"eos_token", cfg.EOS, &d.EOS}, {"bos_token", cfg.BOS, &d.BOS}, {"pad_token", cfg.Pad, &d.Pad}, {"unk_token", cfg.Unk, &d.Unk}} {
		if *field.dst, err = d.specialToken(field.raw); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", cfgPath, field.name, err)
		}
		if field.dst.ID >= 0 {
			specials[field.name] = field.dst.Content
		}
	}
	source, err := chatTemplateSource(dir, cfg.ChatTemplate)
	if err != nil {
		return nil, err
	}
	if source != "" {
		if d.ChatTemplate, err = NewChatTemplate(source, specials); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
	}
	return d, nil
}

func (d *Dir) specialToken(raw json.RawMessage) (SpecialToken, error) {
	none := SpecialToken{ID: -1}
	if isNull(raw) {
		return none, nil
	}
	var content string
	if err := json.Unmarshal(raw, &content); err != nil {
		var obj struct {
			Content string `json:"content"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return none, errors.New("want a string, null or an object with \"content\"")
		}
		content = obj.Content
	}
	id, ok := d.TokenID(content)
	if !ok {
		return none, fmt.Errorf("%q is not a token of tokenizer.json", content)
	}
	return SpecialToken{Content: content, ID: id}, nil
}

// chatTemplateSource prefers chat_template.jinja, as transformers does, then
// tokenizer_config.json's chat_template: a string, or a list of named
// templates of which ddflash uses "default".
func chatTemplateSource(dir string, fromConfig json.RawMessage) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	if err == nil {
		return string(data), nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if isNull(fromConfig) {
		return "", nil
	}
	var source string
	if json.Unmarshal(fromConfig, &source) == nil {
		return source, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(fromConfig, &named); err != nil {
		return "", errors.New("tokenizer_config.json: chat_template must be a string or a list of {name, template}")
	}
	for _, t := range named {
		if t.Name == "default" {
			return t.Template, nil
		}
	}
	return "", errors.New("tokenizer_config.json: chat_template lists no template named \"default\"")
}
