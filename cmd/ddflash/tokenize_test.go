package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// tokenizeTestFile is a small byte-level BPE tokenizer.json with the chat tokens.
var tokenizeTestFile = filepath.Join("..", "..", "tokenizer", "testdata", "hand_b.tokenizer.json")

func runTokenizeOn(t *testing.T, input string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := tokenizeStreams(append([]string{"--tokenizer", tokenizeTestFile}, args...), strings.NewReader(input), &out)
	return out.String(), err
}

func TestTokenizeJSONLRoundTrip(t *testing.T) {
	input := "\"Hello <|im_start|>world\"\n\"\"\n\"tabs\\tand \\\"quotes\\\" <b>\"\n"
	ids, err := runTokenizeOn(t, input, "--jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(ids, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "[") || lines[1] != "[]" {
		t.Fatalf("ids output %q", ids)
	}
	plain, err := runTokenizeOn(t, input, "--jsonl", "--special-as-text")
	if err != nil || plain == ids {
		t.Errorf("--special-as-text gave the same ids or failed: %v", err)
	}
	text, err := runTokenizeOn(t, ids, "--jsonl", "--decode")
	if err != nil || text != input {
		t.Errorf("decoded %q, %v; want %q", text, err, input)
	}
	skipped, err := runTokenizeOn(t, ids, "--jsonl", "--decode", "--skip-special")
	if err != nil || !strings.HasPrefix(skipped, "\"Hello world\"\n") {
		t.Errorf("--skip-special decoded %q, %v", skipped, err)
	}
}

func TestTokenizeWholeInput(t *testing.T) {
	ids, err := runTokenizeOn(t, "two\nlines")
	if err != nil || !strings.HasPrefix(ids, "[") || !strings.HasSuffix(ids, "]\n") {
		t.Fatalf("ids %q, %v", ids, err)
	}
	if text, err := runTokenizeOn(t, ids, "--decode"); err != nil || text != "two\nlines" {
		t.Errorf("decoded %q, %v", text, err)
	}
}

func TestTokenizeErrors(t *testing.T) {
	for _, c := range []struct {
		input string
		args  []string
		want  string
	}{
		{"\"x\"\nnot json\n", []string{"--jsonl"}, "input line 2: want a JSON string"},
		{"[1, 2]\n[99999999]\n", []string{"--jsonl", "--decode"}, "input line 2: token id 99999999"},
		{"[1,", []string{"--decode"}, "want a JSON array of token ids"},
		{"", []string{"extra"}, `unexpected argument "extra"`},
		{"", []string{"--model", "somewhere"}, "give exactly one of --tokenizer FILE and --model DIR"},
	} {
		if _, err := runTokenizeOn(t, c.input, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v on %q: error %v, want one containing %q", c.args, c.input, err, c.want)
		}
	}
}
