package testmodel

import (
	"fmt"
	"regexp"
)

// qwenSplitPattern is the Qwen3.5 pre-tokenizer regex (docs/qwen36-model.md §8).
const qwenSplitPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// trainingSplit approximates qwenSplitPattern with Go's RE2 (no lookahead) to
// cut the sample text into words for learning merges. Merges only need to be
// valid pairs; an approximate split just changes which ones are learned.
var trainingSplit = regexp.MustCompile(`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+`)

// SpecialTokens are the added tokens, in id order after the BPE vocabulary.
var SpecialTokens = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// chatTemplate is plain ChatML with an optional generation prompt.
const chatTemplate = `{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}`

// sampleText is the corpus the merges are learned from.
const sampleText = `The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs into the forest.
In the morning the farmer walks to the field with his dog. He looks at the sky and thinks about the rain that will come in the evening.
A language model reads a sequence of tokens and predicts the next one. Speculative decoding lets a small draft model propose several tokens,
and the large target model checks them all in one forward pass. When the draft is right, the target accepts the tokens and the answer comes faster.
There are 3 apples, 12 oranges and 256 grapes on the table. She said: "It's the best day of the year!" and they're going to the market.
We'll see what the weather does tomorrow; I'd like to walk along the river where the water is clear and the trees are tall.
Questions, answers, and stories: the people in the town tell them to each other in the evening, when the work of the day is done.
The engine loads the weights, builds the cache, and then generates text one token at a time until it sees the end of the message.
`

// byteSymbols is GPT-2's byte-to-unicode map in vocabulary order: symbol i is
// token id i and stands for byte byteOrder[i].
func byteSymbols() (symbols [256]string, byteOrder [256]byte) {
	var printable []int
	for _, r := range [][2]int{{'!', '~'}, {0xA1, 0xAC}, {0xAE, 0xFF}} {
		for b := r[0]; b <= r[1]; b++ {
			printable = append(printable, b)
		}
	}
	isPrintable := map[int]bool{}
	for _, b := range printable {
		isPrintable[b] = true
	}
	i := 0
	for _, b := range printable {
		symbols[i], byteOrder[i] = string(rune(b)), byte(b)
		i++
	}
	shifted := 0
	for b := 0; b < 256; b++ {
		if !isPrintable[b] {
			symbols[i], byteOrder[i] = string(rune(256+shifted)), byte(b)
			shifted++
			i++
		}
	}
	return symbols, byteOrder
}

// bpe is a learned byte-level BPE vocabulary.
type bpe struct {
	vocab  map[string]int
	merges [][2]string
}

// learnBPE learns up to maxMerges merges from text: repeatedly the most
// frequent adjacent pair (ties broken by the pair's text, for determinism),
// stopping when no pair occurs twice.
func learnBPE(text string, maxMerges int) bpe {
	symbols, byteOrder := byteSymbols()
	var symbolOf [256]string
	for i, b := range byteOrder {
		symbolOf[b] = symbols[i]
	}
	vocab := map[string]int{}
	for i, s := range symbols {
		vocab[s] = i
	}
	wordCount := map[string]int{}
	for _, w := range trainingSplit.FindAllString(text, -1) {
		wordCount[w]++
	}
	type word struct {
		parts []string
		count int
	}
	words := make([]word, 0, len(wordCount))
	for w, n := range wordCount {
		parts := make([]string, len(w))
		for i := 0; i < len(w); i++ {
			parts[i] = symbolOf[w[i]]
		}
		words = append(words, word{parts, n})
	}
	var merges [][2]string
	for len(merges) < maxMerges {
		pairCount := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.parts); i++ {
				pairCount[[2]string{w.parts[i], w.parts[i+1]}] += w.count
			}
		}
		best, bestCount := [2]string{}, 1
		for p, n := range pairCount {
			if n > bestCount || (n == bestCount && n > 1 && p[0]+" "+p[1] < best[0]+" "+best[1]) {
				best, bestCount = p, n
			}
		}
		if bestCount < 2 {
			break
		}
		merged := best[0] + best[1]
		merges = append(merges, best)
		if _, ok := vocab[merged]; !ok {
			vocab[merged] = len(vocab)
		}
		for wi := range words {
			parts := words[wi].parts
			out := parts[:0]
			for i := 0; i < len(parts); i++ {
				if i+1 < len(parts) && parts[i] == best[0] && parts[i+1] == best[1] {
					out = append(out, merged)
					i++
				} else {
					out = append(out, parts[i])
				}
			}
			words[wi].parts = out
		}
	}
	return bpe{vocab: vocab, merges: merges}
}

// tokenizerFiles renders tokenizer.json and tokenizer_config.json for the
// learned vocabulary. It returns the id of each special token.
func tokenizerFiles(b bpe) (tokenizerJSON, configJSON []byte, specialIDs map[string]int, err error) {
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	specialIDs = map[string]int{}
	var added []map[string]any
	decoder := map[string]any{}
	for i, tok := range SpecialTokens {
		id := len(b.vocab) + i
		specialIDs[tok] = id
		added = append(added, map[string]any{
			"id": id, "content": tok, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true,
		})
		decoder[fmt.Sprint(id)] = map[string]any{
			"content": tok, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true,
		}
	}
	merges := make([][]string, len(b.merges))
	for i, m := range b.merges {
		merges[i] = []string{m[0], m[1]}
	}
	tok := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": added,
		"normalizer":   map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwenSplitPattern}, "behavior": "Isolated", "invert": false},
			byteLevel,
		}},
		"post_processor": byteLevel,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil,
			"continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": b.vocab, "merges": merges,
		},
	}
	if tokenizerJSON, err = marshalJSON(tok); err != nil {
		return nil, nil, nil, fmt.Errorf("encode tokenizer.json: %w", err)
	}
	cfg := map[string]any{
		"tokenizer_class":              "Qwen2Tokenizer",
		"add_bos_token":                false,
		"add_prefix_space":             false,
		"bos_token":                    nil,
		"eos_token":                    "<|im_end|>",
		"pad_token":                    "<|endoftext|>",
		"unk_token":                    nil,
		"errors":                       "replace",
		"model_max_length":             1 << 20,
		"clean_up_tokenization_spaces": false,
		"split_special_tokens":         false,
		"added_tokens_decoder":         decoder,
		"chat_template":                chatTemplate,
	}
	if configJSON, err = marshalJSON(cfg); err != nil {
		return nil, nil, nil, fmt.Errorf("encode tokenizer_config.json: %w", err)
	}
	return tokenizerJSON, configJSON, specialIDs, nil
}

// idCount is the number of token ids the tokenizer uses, special tokens included.
func (b bpe) idCount() int { return len(b.vocab) + len(SpecialTokens) }
