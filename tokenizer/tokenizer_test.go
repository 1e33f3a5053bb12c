package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// tinyConfig is a minimal byte-level BPE tokenizer.json over the letters
// a-d, with random merges; tests mutate it.
func tinyConfig(rng *rand.Rand, merges int) (cfg map[string]any, ranks map[[2]string]int) {
	vocab := map[string]any{}
	tokens := []string{"a", "b", "c", "d"}
	for i, tok := range tokens {
		vocab[tok] = i
	}
	ranks = map[[2]string]int{}
	var list []any
	for len(list) < merges {
		pair := [2]string{tokens[rng.IntN(len(tokens))], tokens[rng.IntN(len(tokens))]}
		if _, dup := ranks[pair]; dup || len(pair[0]+pair[1]) > 12 {
			continue
		}
		ranks[pair] = len(list)
		list = append(list, pair[0]+" "+pair[1])
		if _, ok := vocab[pair[0]+pair[1]]; !ok { // two merges may make the same token
			vocab[pair[0]+pair[1]] = len(vocab)
			tokens = append(tokens, pair[0]+pair[1])
		}
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
	cfg = map[string]any{
		"truncation": nil, "padding": nil, "normalizer": nil,
		"added_tokens": []any{
			map[string]any{"id": len(vocab), "content": "<|end|>", "special": true},
		},
		"pre_tokenizer":  byteLevel,
		"post_processor": byteLevel,
		"decoder":        byteLevel,
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": list},
	}
	return cfg, ranks
}

func parseConfig(t *testing.T, cfg map[string]any) (*Tokenizer, error) {
	t.Helper()
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return Parse(data)
}

// referenceBPE is textbook BPE: merge the lowest-ranked adjacent pair,
// leftmost first, until no pair has a rank.
func referenceBPE(word string, ranks map[[2]string]int) []string {
	parts := strings.Split(word, "")
	for {
		best, at := -1, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[[2]string{parts[i], parts[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			return parts
		}
		parts = slices.Replace(parts, at, at+2, parts[at]+parts[at+1])
	}
}

func TestBPEMatchesReferenceMerges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 20 {
		cfg, ranks := tinyConfig(rng, 5+rng.IntN(60))
		tok, err := parseConfig(t, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for range 200 {
			word := make([]byte, 1+rng.IntN(40))
			for i := range word {
				word[i] = "abcd"[rng.IntN(4)]
			}
			var want []int32
			for _, piece := range referenceBPE(string(word), ranks) {
				id, _ := tok.TokenID(piece)
				want = append(want, id)
			}
			if got := tok.Encode(string(word)); !slices.Equal(got, want) {
				t.Fatalf("trial %d, %q: got %v, want %v", trial, word, got, want)
			}
		}
	}
}

func TestUnsupportedConfigurationsNameTheProblem(t *testing.T) {
	set := func(path string, value any) func(map[string]any) {
		return func(cfg map[string]any) {
			keys := strings.Split(path, ".")
			m := cfg
			for _, k := range keys[:len(keys)-1] {
				m = m[k].(map[string]any)
			}
			m[keys[len(keys)-1]] = value
		}
	}
	split := map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Isolated"}
	for _, c := range []struct {
		mutate func(map[string]any)
		want   string
	}{
		{set("normalizer", map[string]any{"type": "Lowercase"}), `normalizer: type "Lowercase" is not supported`},
		{set("pre_tokenizer", map[string]any{"type": "Metaspace"}), `type "Metaspace"`},
		{set("pre_tokenizer", split), `type "Split": ddflash supports Split steps followed by one ByteLevel step`},
		{set("pre_tokenizer", nil), "ddflash needs a ByteLevel pre-tokenizer"},
		{set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Removed"},
			map[string]any{"type": "ByteLevel"},
		}}), `behavior "Removed"`},
		{set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(`}, "behavior": "Isolated"},
			map[string]any{"type": "ByteLevel"},
		}}), `regex "("`},
		{set("decoder", map[string]any{"type": "WordPiece"}), `decoder: type "WordPiece"`},
		{set("decoder", nil), "decoder: null is not supported"},
		{set("post_processor", map[string]any{"type": "TemplateProcessing"}), `post_processor: type "TemplateProcessing"`},
		{set("model.type", "WordPiece"), `model: type "WordPiece"`},
		{set("model.dropout", 0.1), "dropout 0.1"},
		{set("model.byte_fallback", true), "byte_fallback"},
		{set("model.continuing_subword_prefix", "##"), "continuing_subword_prefix"},
		{set("model.unk_token", "<unk>"), `unk_token "<unk>" is not in the vocab`},
		{set("model.merges", []any{"a zz"}), `merge 0 ("a" "zz") uses a token that is not in the vocab`},
		{set("model.merges", []any{"a b c"}), "is not two tokens"},
		{set("model.merges", 5), "merges must be a list"},
		{set("model.merges", []any{[]any{"a", "b", "c"}}), "merge 0 has 3 tokens"},
		{set("model.vocab", map[string]any{}), "vocab is empty"},
		{set("model.vocab", map[string]any{"a": -1}), "outside"},
		{set("truncation", map[string]any{"max_length": 8}), "truncation and padding are not supported"},
		{set("added_tokens", []any{map[string]any{"id": 999, "content": "<x>"}}), `"<x>" has id 999 but Hugging Face gives it id`},
		{set("added_tokens", []any{map[string]any{"id": 0, "content": ""}}), "empty content"},
	} {
		cfg, _ := tinyConfig(rand.New(rand.NewPCG(3, 4)), 5)
		c.mutate(cfg)
		if _, err := parseConfig(t, cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want one containing %q", err, c.want)
		}
	}
	if _, err := Parse([]byte("{")); err == nil {
		t.Error("truncated JSON parsed")
	}
}

func TestDecodeRejectsUnknownIDs(t *testing.T) {
	cfg, _ := tinyConfig(rand.New(rand.NewPCG(5, 6)), 5)
	tok, err := parseConfig(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int32{-1, int32(tok.VocabSize()), 1 << 30} {
		if _, err := tok.Decode([]int32{0, id}, false); err == nil {
			t.Errorf("Decode accepted id %d", id)
		}
		if _, err := tok.NewStreamDecoder(false).Next(id); err == nil {
			t.Errorf("StreamDecoder accepted id %d", id)
		}
	}
	end, ok := tok.TokenID("<|end|>")
	if !ok || !tok.IsSpecial(end) {
		t.Fatalf("<|end|> is not a special token: %d %v", end, ok)
	}
	if s, ok := tok.Token(end); s != "<|end|>" || !ok {
		t.Errorf("Token(%d) = %q, %v", end, s, ok)
	}
	if _, ok := tok.Token(-1); ok {
		t.Error("Token(-1) found a token")
	}
	for skip, want := range map[bool]string{false: "ab<|end|>", true: "ab"} {
		if got, err := tok.Decode(append(tok.Encode("ab"), end), skip); err != nil || got != want {
			t.Errorf("skip special %v: got %q, %v; want %q", skip, got, err, want)
		}
	}
}

// TestStreamDecoderHoldsSplitCharacters sends "é" (C3 A9) as two byte
// tokens: nothing comes out until the character is complete.
func TestStreamDecoderHoldsSplitCharacters(t *testing.T) {
	tok := loadQwen3(t, false)
	lead, cont := tok.model.byteIDs[0xC3], tok.model.byteIDs[0xA9]
	stream := tok.NewStreamDecoder(false)
	if got, err := stream.Next(lead); got != "" || err != nil {
		t.Fatalf("after the lead byte: %q, %v", got, err)
	}
	if got, _ := stream.Next(cont); got != "é" {
		t.Fatalf("after the continuation byte: %q, want é", got)
	}
	stream.Next(lead)
	if got := stream.Flush(); got != "\uFFFD" {
		t.Errorf("flushing a lone lead byte gave %q, want U+FFFD", got)
	}
	if got := stream.Flush(); got != "" {
		t.Errorf("second flush gave %q", got)
	}
}

// TestEncodeReadsInvalidUTF8AsReplacement checks that invalid input is read
// the way HF's decoder would write it: one U+FFFD per maximal ill-formed part.
func TestEncodeReadsInvalidUTF8AsReplacement(t *testing.T) {
	tok := loadQwen3(t, false)
	for in, same := range map[string]string{
		"a\xe2\x82b":       "a\ufffdb",
		"\xff\xfe":         "\ufffd\ufffd",
		"\xf0\x9f\x98":     "\ufffd",
		"\xed\xa0\x80x":    "\ufffd\ufffd\ufffdx",
		"ok\xc3":           "ok\ufffd",
		"\xc0\x80\xe0\x80": "\ufffd\ufffd\ufffd\ufffd",
	} {
		if got, want := tok.Encode(in), tok.Encode(same); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want Encode(%q) = %v", in, got, same, want)
		}
	}
}

// TestConcurrentEncode shares one tokenizer (its word cache and scratch
// buffers) between goroutines.
func TestConcurrentEncode(t *testing.T) {
	tok := loadQwen3(t, false)
	texts := goldenTexts(t)[:400]
	want := make([][]int32, len(texts))
	for i, text := range texts {
		want[i] = tok.Encode(text)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range texts {
				k := (i + g*97) % len(texts)
				if got := tok.Encode(texts[k]); !slices.Equal(got, want[k]) {
					t.Errorf("goroutine %d, text %d: ids differ", g, k)
					return
				}
			}
		})
	}
	wg.Wait()
}
