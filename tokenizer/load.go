package tokenizer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// maxTokenID bounds ids read from a file so that a corrupt one cannot ask
// for a huge table; the largest vocabularies in use have about 260,000.
const maxTokenID = 1 << 22

// tokenizerJSON is the part of HF's tokenizer.json that ddflash reads.
type tokenizerJSON struct {
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         modelJSON       `json:"model"`
}

type modelJSON struct {
	Type                    string           `json:"type"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  json.RawMessage  `json:"merges"`
}

// component is a normalizer, pre-tokenizer, post-processor or decoder entry.
type component struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Pattern       struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
}

// Load reads a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse reads the contents of a tokenizer.json file. A configuration that
// ddflash does not implement is an error that names it.
func Parse(data []byte) (*Tokenizer, error) {
	var f tokenizerJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	if !isNull(f.Truncation) || !isNull(f.Padding) {
		return nil, errors.New("truncation and padding are not supported: set both to null")
	}
	t := &Tokenizer{}
	var err error
	if t.normalizers, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.preTokenizer, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if err := checkByteLevelOnly("post_processor", f.PostProcessor, true); err != nil {
		return nil, err
	}
	if err := checkByteLevelOnly("decoder", f.Decoder, false); err != nil {
		return nil, err
	}
	if err := t.buildModel(&f.Model); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if err := t.addTokens(f.AddedTokens); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	t.buildDecodeTable()
	return t, nil
}

func isNull(raw json.RawMessage) bool {
	trimmed := bytes.TrimSpace(raw)
	return len(trimmed) == 0 || string(trimmed) == "null"
}

func parseComponent(raw json.RawMessage) (*component, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

func parseNormalizer(raw json.RawMessage) ([]norm.Form, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, err
	}
	forms := map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}
	if form, ok := forms[c.Type]; ok {
		return []norm.Form{form}, nil
	}
	if c.Type != "Sequence" {
		return nil, fmt.Errorf("type %q is not supported (ddflash supports NFC, NFD, NFKC, NFKD and Sequence)", c.Type)
	}
	var out []norm.Form
	for _, sub := range c.Normalizers {
		inner, err := parseNormalizer(sub)
		if err != nil {
			return nil, err
		}
		out = append(out, inner...)
	}
	return out, nil
}

// parsePreTokenizer accepts Split steps followed by one ByteLevel step,
// alone or in a Sequence: the byte-level BPE model needs ByteLevel, and a
// Split after it would see byte-level characters, which ddflash does not do.
func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	c, err := parseComponent(raw)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, errors.New("null is not supported: ddflash needs a ByteLevel pre-tokenizer")
	}
	parts := []json.RawMessage{raw}
	if c.Type == "Sequence" {
		parts = c.PreTokenizers
	}
	var steps preTokenizer
	for i, part := range parts {
		c, err := parseComponent(part)
		if err != nil || c == nil {
			return nil, fmt.Errorf("step %d: %v", i, cmp.Or(err, errors.New("null")))
		}
		last := i == len(parts)-1
		switch {
		case c.Type == "Split" && !last:
			split, err := parseSplit(c)
			if err != nil {
				return nil, fmt.Errorf("step %d (Split): %w", i, err)
			}
			steps = append(steps, preTokenizeStep{split: split})
		case c.Type == "ByteLevel" && last:
			step := preTokenizeStep{prefixSpace: c.AddPrefixSpace}
			if c.UseRegex == nil || *c.UseRegex { // HF's default is true
				if step.split, err = newRegexSplitter(gpt2Pattern); err != nil {
					return nil, err
				}
			}
			steps = append(steps, step)
		default:
			return nil, fmt.Errorf("step %d has type %q: ddflash supports Split steps followed by one ByteLevel step", i, c.Type)
		}
	}
	return steps, nil
}

func parseSplit(c *component) (splitter, error) {
	if c.Behavior != "Isolated" || c.Invert {
		return nil, fmt.Errorf("behavior %q with invert=%v is not supported (ddflash supports Isolated, invert=false)", c.Behavior, c.Invert)
	}
	switch {
	case c.Pattern.Regex != nil && *c.Pattern.Regex == qwen2Pattern:
		return qwenSplitter{marksAreLetters: false}, nil
	case c.Pattern.Regex != nil && *c.Pattern.Regex == qwen35Pattern:
		return qwenSplitter{marksAreLetters: true}, nil
	case c.Pattern.Regex != nil:
		s, err := newRegexSplitter(*c.Pattern.Regex)
		if err != nil {
			return nil, fmt.Errorf("regex %q: %w", *c.Pattern.Regex, err)
		}
		return s, nil
	case c.Pattern.String != nil && *c.Pattern.String != "":
		return newRegexSplitter(regexp2.Escape(*c.Pattern.String))
	}
	return nil, errors.New("pattern must be a non-empty Regex or String")
}

// checkByteLevelOnly accepts a ByteLevel component (and null when allowed):
// the ByteLevel post-processor only adjusts offsets, and ByteLevel is the
// only decoder ddflash implements.
func checkByteLevelOnly(name string, raw json.RawMessage, nullOK bool) error {
	c, err := parseComponent(raw)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", name, err)
	case c == nil && nullOK, c != nil && c.Type == "ByteLevel":
		return nil
	case c == nil:
		return fmt.Errorf("%s: null is not supported: ddflash needs ByteLevel", name)
	}
	return fmt.Errorf("%s: type %q is not supported: ddflash supports ByteLevel", name, c.Type)
}

func (t *Tokenizer) buildModel(m *modelJSON) error {
	switch {
	case m.Type != "BPE":
		return fmt.Errorf("type %q is not supported: ddflash supports BPE", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return fmt.Errorf("dropout %v is not supported: ddflash encodes deterministically", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return errors.New("continuing_subword_prefix and end_of_word_suffix are not supported")
	case m.ByteFallback:
		return errors.New("byte_fallback is not supported")
	case len(m.Vocab) == 0:
		return errors.New("vocab is empty")
	}
	t.vocab = m.Vocab
	size := 0
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxTokenID {
			return fmt.Errorf("vocab token %q has id %d, outside 0..%d", tok, id, maxTokenID-1)
		}
		size = max(size, int(id)+1)
	}
	t.tokens = make([]string, size)
	for tok, id := range m.Vocab {
		t.tokens[id] = tok
	}

	model := &t.model
	for b := range 256 {
		model.byteIDs[b] = -1
		if id, ok := m.Vocab[string(byteRunes[b])]; ok {
			model.byteIDs[b] = id
		}
	}
	model.unkID = -1
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return fmt.Errorf("unk_token %q is not in the vocab", *m.UnkToken)
		}
		model.unkID, model.fuseUnk = id, m.FuseUnk
	}
	if m.IgnoreMerges {
		model.ignoreMerges = true
		model.wholeWords = make(map[string]int32)
		for tok, id := range m.Vocab {
			if raw, ok := byteLevelBytes(tok); ok {
				model.wholeWords[string(raw)] = id
			}
		}
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return err
	}
	model.merges = make(map[uint64]merge, len(pairs))
	for rank, p := range pairs {
		left, okL := m.Vocab[p[0]]
		right, okR := m.Vocab[p[1]]
		merged, okM := m.Vocab[p[0]+p[1]]
		if !okL || !okR || !okM {
			return fmt.Errorf("merge %d (%q %q) uses a token that is not in the vocab", rank, p[0], p[1])
		}
		// A repeated pair keeps its last rank, as in HF's merge map.
		model.merges[pairKey(left, right)] = merge{rank: int32(rank), id: merged}
	}
	return nil
}

// parseMerges accepts both spellings of merges: pairs ([["a","b"], ...]) and
// "a b" strings, skipping a leading "#version" line as HF does.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var pairs [][2]string
	var lists [][]string
	if err := json.Unmarshal(raw, &lists); err == nil {
		for i, l := range lists {
			if len(l) != 2 {
				return nil, fmt.Errorf("merge %d has %d tokens, want 2", i, len(l))
			}
			pairs = append(pairs, [2]string{l[0], l[1]})
		}
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, errors.New("merges must be a list of [left, right] pairs or of \"left right\" strings")
	}
	for _, line := range lines {
		if strings.HasPrefix(line, "#version") {
			continue
		}
		parts := strings.Split(line, " ")
		if len(parts) != 2 {
			return nil, fmt.Errorf("merge %d (%q) is not two tokens separated by one space", len(pairs), line)
		}
		pairs = append(pairs, [2]string{parts[0], parts[1]})
	}
	return pairs, nil
}

// addTokens registers added_tokens. HF does not read their ids from the
// file: a token takes its vocabulary id when the model has it, otherwise the
// next id after the largest added one (at least the vocabulary's size), in
// file order. A file whose ids disagree would encode differently in HF from
// what it says, so it is rejected.
func (t *Tokenizer) addTokens(added []addedToken) error {
	modelSize := int32(len(t.vocab))
	largest := int32(-1)
	var raw, normalized []addedPattern
	for i := range added {
		tok := &added[i]
		if tok.Content == "" {
			return fmt.Errorf("token %d has empty content", tok.ID)
		}
		want, ok := t.vocab[tok.Content]
		switch {
		case ok:
		case largest < 0 || largest < modelSize:
			want = modelSize
		default:
			want = largest + 1
		}
		if tok.ID != want {
			return fmt.Errorf("%q has id %d but Hugging Face gives it id %d (the next free id in file order)", tok.Content, tok.ID, want)
		}
		largest = max(largest, want)
		if int(tok.ID) >= len(t.tokens) {
			t.tokens = append(t.tokens, make([]string, int(tok.ID)+1-len(t.tokens))...)
		}
		t.tokens[tok.ID] = tok.Content
		t.vocab[tok.Content] = tok.ID
		if tok.Normalized {
			normalized = append(normalized, addedPattern{t.normalize(tok.Content), tok})
		} else {
			raw = append(raw, addedPattern{tok.Content, tok})
		}
	}
	t.special = make([]bool, len(t.tokens))
	for _, tok := range added {
		t.special[tok.ID] = tok.Special
	}
	t.rawAdded = newAddedMatcher(raw)
	t.normAdded = newAddedMatcher(normalized)
	return nil
}

// buildDecodeTable stores what every id decodes to.
func (t *Tokenizer) buildDecodeTable() {
	t.bytesFrom = make([]uint32, len(t.tokens)+1)
	for id, tok := range t.tokens {
		raw, ok := byteLevelBytes(tok)
		if !ok {
			raw = []byte(tok)
		}
		t.bytes = append(t.bytes, raw...)
		t.bytesFrom[id+1] = uint32(len(t.bytes))
	}
}
