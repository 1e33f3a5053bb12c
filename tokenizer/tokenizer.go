// Package tokenizer is ddflash's own implementation of Hugging Face
// byte-level BPE tokenizers (tokenizer.json), exact against HF's Rust
// tokenizers on Qwen2/Qwen3 and Qwen3.5/Qwen3.6 data, together with the
// checkpoint's chat template (chat.go) and the model-directory loader (dir.go).
//
// Encoding follows HF's pipeline: added tokens are cut out of the raw text,
// the pieces between them are normalized (NFC for Qwen), added tokens marked
// "normalized" are cut out of the normalized text, the rest is split into
// pre-tokens (a hand-written splitter for the Qwen patterns, a backtracking
// regex engine for any other pattern) and each pre-token's bytes are merged
// by BPE rank.
package tokenizer

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text to token ids and decodes ids to text. It is safe
// for concurrent use.
type Tokenizer struct {
	model        bpe
	normalizers  []norm.Form
	preTokenizer preTokenizer
	rawAdded     addedMatcher // added tokens matched before normalization
	normAdded    addedMatcher // added tokens with "normalized": matched after it

	vocab     map[string]int32 // every token, added ones included
	tokens    []string         // by id; "" for an unused id
	special   []bool           // by id
	bytes     []byte           // what each id decodes to, ...
	bytesFrom []uint32         // ... id i is bytes[bytesFrom[i]:bytesFrom[i+1]]

	scratch sync.Pool // *encodeScratch
}

type encodeScratch struct {
	rawSegments, segments []segment
	pieces, spare         []string
	bpe                   bpeScratch
}

// EncodeOptions changes how text is read.
type EncodeOptions struct {
	// SpecialAsText encodes special tokens written in the text (such as
	// "<|im_start|>") as ordinary text, as HF's split_special_tokens=True
	// does. Added tokens not marked special are still recognised.
	SpecialAsText bool
}

// Encode returns the ids of text, reading special tokens written in it as
// those tokens. Invalid UTF-8 is read as U+FFFD.
func (t *Tokenizer) Encode(text string) []int32 {
	return t.EncodeWith(text, EncodeOptions{})
}

// EncodeWith is Encode with options.
func (t *Tokenizer) EncodeWith(text string, opts EncodeOptions) []int32 {
	if !utf8.ValidString(text) {
		valid, _ := appendLossy(nil, []byte(text), true)
		text = string(valid)
	}
	sc, _ := t.scratch.Get().(*encodeScratch)
	if sc == nil {
		sc = new(encodeScratch)
	}
	defer t.scratch.Put(sc)

	parseSpecial := !opts.SpecialAsText
	var ids []int32
	sc.rawSegments = t.rawAdded.appendSegments(sc.rawSegments[:0], text, parseSpecial)
	for _, raw := range sc.rawSegments {
		if raw.id >= 0 {
			ids = append(ids, raw.id)
			continue
		}
		sc.segments = t.normAdded.appendSegments(sc.segments[:0], t.normalize(raw.text), parseSpecial)
		for _, seg := range sc.segments {
			if seg.id >= 0 {
				ids = append(ids, seg.id)
				continue
			}
			sc.pieces, sc.spare = t.preTokenizer.split(sc.spare, sc.pieces, seg.text)
			for _, piece := range sc.pieces {
				ids = t.model.appendWord(ids, piece, &sc.bpe)
			}
		}
	}
	return ids
}

func (t *Tokenizer) normalize(s string) string {
	if len(t.normalizers) == 0 || isASCII(s) {
		return s // every normalization form leaves ASCII unchanged
	}
	for _, f := range t.normalizers {
		s = normalizeText(f, s)
	}
	return s
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// Decode returns the text of ids as HF's ByteLevel decoder does: the bytes
// of the tokens, with invalid UTF-8 replaced by U+FFFD. skipSpecial leaves
// out tokens marked special. An id outside the vocabulary is an error.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	var raw []byte
	for _, id := range ids {
		b, keep, err := t.tokenBytes(id, skipSpecial)
		if err != nil {
			return "", err
		}
		if keep {
			raw = append(raw, b...)
		}
	}
	text, _ := appendLossy(nil, raw, true)
	return string(text), nil
}

// tokenBytes returns the bytes id decodes to, and whether to keep them.
func (t *Tokenizer) tokenBytes(id int32, skipSpecial bool) ([]byte, bool, error) {
	if id < 0 || int(id) >= len(t.tokens) || t.tokens[id] == "" {
		return nil, false, fmt.Errorf("token id %d is not in the vocabulary (ids 0..%d)", id, len(t.tokens)-1)
	}
	if skipSpecial && t.special[id] {
		return nil, false, nil
	}
	return t.bytes[t.bytesFrom[id]:t.bytesFrom[id+1]], true, nil
}

// TokenBytes returns the bytes id decodes to (a special token's: its text).
func (t *Tokenizer) TokenBytes(id int32) ([]byte, error) {
	b, _, err := t.tokenBytes(id, false)
	return b, err
}

// VocabSize is one more than the largest id, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of a token as spelled in tokenizer.json (added
// tokens such as "<|im_end|>" as written; vocabulary tokens in their
// byte-level spelling, "Ġthe" for " the").
func (t *Tokenizer) TokenID(token string) (int32, bool) {
	id, ok := t.vocab[token]
	return id, ok
}

// Token returns the tokenizer.json spelling of id.
func (t *Tokenizer) Token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(t.tokens) || t.tokens[id] == "" {
		return "", false
	}
	return t.tokens[id], true
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}
