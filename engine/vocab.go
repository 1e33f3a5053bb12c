package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"ddflash/engine/config"
	"ddflash/tokenizer"
)

// loadTokenizer loads the checkpoint's tokenizer when it has one (nil
// otherwise) and returns the number of real token ids (the embedding may have
// padding rows beyond them) and the end-of-sequence ids: config.json's
// eos_token_id list plus tokenizer_config.json's eos_token.
func loadTokenizer(dir string, cfg *config.Config) (*tokenizer.Dir, int, []int32, error) {
	eos := make([]int32, 0, len(cfg.EOSTokenIDs)+1)
	for _, id := range cfg.EOSTokenIDs {
		eos = append(eos, int32(id))
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); errors.Is(err, fs.ErrNotExist) {
		return nil, cfg.VocabSize, eos, nil
	}
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		return nil, 0, nil, err
	}
	if n := tok.VocabSize(); n > cfg.VocabSize {
		return nil, 0, nil, fmt.Errorf("%s: tokenizer.json has %d ids but the model's vocab_size is %d", dir, n, cfg.VocabSize)
	}
	if tok.EOS.ID >= 0 && !slices.Contains(eos, tok.EOS.ID) {
		eos = append(eos, tok.EOS.ID)
	}
	return tok, tok.VocabSize(), eos, nil
}
