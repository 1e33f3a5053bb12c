package tokenizer

import (
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// FuzzRoundTrip checks that decoding what Encode produced gives back the
// text, NFC-normalized and with invalid UTF-8 read as U+FFFD, for both Qwen
// pre-tokenizer patterns. Special tokens are encoded as text here; text
// holding a non-special added token (such as "<think>") is skipped, because
// HF normalizes on either side of it separately, which NFC of the whole
// text does not model. The seed corpus is in testdata/fuzz/FuzzRoundTrip.
func FuzzRoundTrip(f *testing.F) {
	toks := []*Tokenizer{loadQwen3(f, false), loadQwen3(f, true)}
	var plainAdded []string
	for _, p := range toks[0].rawAdded.patterns {
		if !p.token.Special {
			plainAdded = append(plainAdded, p.text)
		}
	}
	f.Fuzz(func(t *testing.T, text string) {
		for _, added := range plainAdded {
			if strings.Contains(text, added) {
				return
			}
		}
		valid, _ := appendLossy(nil, []byte(text), true)
		want := normalizeText(norm.NFC, string(valid))
		for _, tok := range toks {
			ids := tok.EncodeWith(text, EncodeOptions{SpecialAsText: true})
			got, err := tok.Decode(ids, false)
			if err != nil || got != want {
				t.Fatalf("decode(encode(%q)) = %q, %v; want %q", text, got, err, want)
			}
		}
	})
}
