package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"ddflash/engine/config"
)

// vocabInfo returns the number of real token ids (the tokenizer's size; the
// embedding may have padding rows beyond it) and the end-of-sequence ids.
func vocabInfo(dir string, cfg *config.Config) (int, []int32, error) {
	eos := make([]int32, 0, len(cfg.EOSTokenIDs))
	for _, id := range cfg.EOSTokenIDs {
		eos = append(eos, int32(id))
	}
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return cfg.VocabSize, eos, nil
	}
	if err != nil {
		return 0, nil, err
	}
	var tj struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
		AddedTokens []struct {
			ID int `json:"id"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(data, &tj); err != nil {
		return 0, nil, fmt.Errorf("%s: %w", filepath.Join(dir, "tokenizer.json"), err)
	}
	n := 0
	for _, id := range tj.Model.Vocab {
		n = max(n, id+1)
	}
	for _, t := range tj.AddedTokens {
		n = max(n, t.ID+1)
	}
	if n == 0 || n > cfg.VocabSize {
		return 0, nil, fmt.Errorf("tokenizer.json has %d ids but the model's vocab_size is %d", n, cfg.VocabSize)
	}
	return n, eos, nil
}
