package server

import (
	"encoding/json"
	"math"
	"slices"
	"testing"

	"ddflash/tokenizer"
)

// TestGrammars checks prefixes against the grammars constrained decoding
// uses: a valid reply must be viable at every byte and complete at its
// end; an invalid one must stop being viable where it goes wrong.
func TestGrammars(t *testing.T) {
	person, err := compileSchema(json.RawMessage(`{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
		"tags": {"type": "array", "items": {"enum": ["a", "b"]}}}, "required": ["name", "age"], "additionalProperties": false}`), "schema")
	if err != nil {
		t.Fatal(err)
	}
	object := jsonReply{&schema{types: []string{"object"}}}
	choice, err := readToolChoice(json.RawMessage(`"required"`), json.RawMessage(`[`+weatherTool+`]`))
	if err != nil {
		t.Fatal(err)
	}
	choice.parallel = true
	single := choice
	single.parallel = false
	cases := []struct {
		name  string
		g     grammar
		reply string
		valid bool
	}{
		{"object", object, `{"a": [1, 2.5e3, -0.5], "b": {"c": null, "d": true}, "e": "x\"\u00e9"}`, true},
		{"empty object", object, `{}`, true},
		{"not an object", object, `[1]`, false},
		{"trailing text", object, `{} x`, false},
		{"bad number", object, `{"a": 01}`, false},
		{"trailing comma", object, `{"a": 1,}`, false},
		{"person", jsonReply{person}, `{"name": "Ann", "age": 31, "tags": ["a", "b"]}`, true},
		{"person, other order", jsonReply{person}, `{"age": 31, "name": "Ann"}`, true},
		{"person missing age", jsonReply{person}, `{"name": "Ann"}`, false},
		{"person age not integer", jsonReply{person}, `{"name": "Ann", "age": 3.5}`, false},
		{"person unknown key", jsonReply{person}, `{"name": "Ann", "job": 1}`, false},
		{"person duplicate key", jsonReply{person}, `{"name": "Ann", "name": "Bo", "age": 1}`, false},
		{"person tag not in enum", jsonReply{person}, `{"name": "A", "age": 1, "tags": ["c"]}`, false},
		{"endless blank", object, `{` + string(make([]byte, 0)) + "                    " + `}`, false},
		{"tool call", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", true},
		{"two tool calls", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>", true},
		{"two calls, not parallel", single.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>\n<tool_call>", false},
		{"text before the call", choice.grammar(), "Sure. <tool_call>", false},
		{"unknown function", choice.grammar(), "<tool_call>\n<function=get_time>\n", false},
		{"unknown parameter", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=town>\n", false},
		{"required parameter missing", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>", false},
		{"integer parameter", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=days>\nthree", false},
		{"after thinking", afterThinking{object}, "hmm, {not json} here\n</think>\n\n{\"a\": 1}", true},
		{"json before thinking ends", afterThinking{object}, "{\"a\": 1}", false},
	}
	for _, c := range cases {
		b := []byte(c.reply)
		for i := 0; i < len(b); i++ {
			if viable, _ := check(c.g, b[:i]); !viable {
				if c.valid {
					t.Errorf("%s: the valid reply is not viable at %q", c.name, b[:i])
				}
				goto next
			}
		}
		if viable, complete := check(c.g, b); c.valid != (viable && complete) {
			t.Errorf("%s: %q viable %v complete %v, want valid %v", c.name, c.reply, viable, complete, c.valid)
		}
	next:
	}
}

// FuzzGrammarCheck feeds arbitrary bytes to every grammar: a constraint
// runs on the scheduler's goroutine, so checking must never panic, and a
// prefix of a viable reply must be viable too.
func FuzzGrammarCheck(f *testing.F) {
	person, err := compileSchema(json.RawMessage(`{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}},
		"b": {"enum": [1, "x", null]}}, "required": ["a"], "additionalProperties": false}`), "schema")
	if err != nil {
		f.Fatal(err)
	}
	choice, err := readToolChoice(json.RawMessage(`"required"`), json.RawMessage(`[`+weatherTool+`]`))
	if err != nil {
		f.Fatal(err)
	}
	grammars := []grammar{jsonReply{person}, jsonReply{&schema{types: []string{"object"}}}, choice.grammar(), afterThinking{jsonReply{person}}}
	for _, seed := range []string{`{"a": [1, -2.5e+3], "b": "x"}`, `{"a": []}`, "<tool_call>\n<function=get_weather>\n<parameter=days>\n-0\n</parameter>\n", "x</think> {\"a\": [0]}", `{"\u00e9": "\\u12`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, g := range grammars {
			viable, complete := check(g, b)
			if complete && !viable {
				t.Errorf("%q complete but not viable", b)
			}
			if viable && len(b) > 0 {
				if v, _ := check(g, b[:len(b)-1]); !v {
					t.Errorf("%q viable, its prefix not", b)
				}
			}
		}
	})
}

// maskEachToken is the reference mask: every token checked on its own.
func maskEachToken(c *grammarConstraint, tok *tokenizer.Dir, reply string, row []float32) {
	_, complete := check(c.g, []byte(reply))
	for id := range row {
		b, err := tok.TokenBytes(int32(id))
		ok := false
		switch {
		case slices.Contains(c.stops, int32(id)):
			ok = complete
		case err == nil && !tok.IsSpecial(int32(id)):
			ok, _ = check(c.g, append([]byte(reply), b...))
		}
		if !ok {
			row[id] = float32(math.Inf(-1))
		}
	}
}

func personConstraint(t testing.TB, tok *tokenizer.Dir) *grammarConstraint {
	person, err := compileSchema(json.RawMessage(`{"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}, "additionalProperties": false}`), "schema")
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.TokenID("<|im_end|>")
	return &grammarConstraint{g: jsonReply{person}, vocab: vocabOf(tok.Tokenizer), stops: []int32{eos}}
}

// maskReplies are prefixes inside and after a constrained reply.
var maskReplies = []string{"", `{"na`, `{"name": "a b`, `{"n": 1`, `{"n": 12, "name": "x"}`}

// TestMaskMatchesEachToken checks the constraint's mask, which skips
// tokens by first byte, against checking every token of the tiny
// vocabulary on its own.
func TestMaskMatchesEachToken(t *testing.T) {
	_, _, tok := modelDirs(t)
	c := personConstraint(t, tok)
	for _, reply := range maskReplies {
		got, want := make([]float32, tok.VocabSize()), make([]float32, tok.VocabSize())
		c.Mask(tok.Encode(reply), got)
		maskEachToken(c, tok, reply, want)
		if !slices.Equal(got, want) {
			t.Errorf("after %q: mask %v, want %v", reply, got, want)
		}
		if !slices.ContainsFunc(want, func(v float32) bool { return !math.IsInf(float64(v), -1) }) {
			t.Errorf("after %q nothing is allowed", reply)
		}
	}
}

// BenchmarkConstraintMask compares the grouped mask with checking each
// token, over the tiny vocabulary (report the ratio of the two).
func BenchmarkConstraintMask(b *testing.B) {
	_, _, tok := modelDirs(b)
	c := personConstraint(b, tok)
	row := make([]float32, tok.VocabSize())
	outputs := make([][]int32, len(maskReplies))
	for i, r := range maskReplies {
		outputs[i] = tok.Encode(r)
	}
	b.Run("grouped", func(b *testing.B) {
		for b.Loop() {
			for _, out := range outputs {
				c.Mask(out, row)
			}
		}
	})
	b.Run("each-token", func(b *testing.B) {
		for b.Loop() {
			for _, r := range maskReplies {
				maskEachToken(c, tok, r, row)
			}
		}
	})
}
