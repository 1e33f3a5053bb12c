package server

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
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
		{"blank runs of 8", object, "{\n       " + `"a":` + "\t\t\t\t\t\t\t\t1\r\n}", true},
		{"a blank run of 9", object, `{"a":         1}`, false},
		{"a blank run of 9 before a call", choice.grammar(), "\n\n\n\n\n\n\n\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>", false},
		{"tool call", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", true},
		{"two tool calls", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>", true},
		{"two calls, not parallel", single.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>\n<tool_call>", false},
		{"text before the call", choice.grammar(), "Sure. <tool_call>", false},
		{"unknown function", choice.grammar(), "<tool_call>\n<function=get_time>\n", false},
		{"unknown parameter", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=town>\n", false},
		{"required parameter missing", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>", false},
		{"enum parameter", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>", true},
		{"enum parameter not listed", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=unit>\nkelvin\n</parameter>\n</function>\n</tool_call>", false},
		{"enum parameter quoted", choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=unit>\n\"celsius\"\n</parameter>\n</function>\n</tool_call>", false},
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
// runs on the scheduler's goroutine, so checking must never panic, the
// incremental parser must agree with the recursive-descent reference, and a
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
	numbers, err := compileSchema(json.RawMessage(`{"enum": [1, 12, 1.5, "1", [1, 2]]}`), "schema")
	if err != nil {
		f.Fatal(err)
	}
	parallel := choice
	parallel.parallel = true
	grammars := []grammar{jsonReply{person}, jsonReply{&schema{types: []string{"object"}}}, choice.grammar(), parallel.grammar(),
		afterThinking{jsonReply{person}}, jsonReply{numbers}, jsonReply{nil}}
	for _, seed := range []string{`{"a": [1, -2.5e+3], "b": "x"}`, `{"a": []}`, "<tool_call>\n<function=get_weather>\n<parameter=days>\n-0\n</parameter>\n", "x</think> {\"a\": [0]}", `{"\u00e9": "\\u12`,
		"<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n<\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=",
		"12", "1.5 ", `[1, 2]`, `"1"`, ` 0.5e-3`, "<tool_call>\n<function=get_weather>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, g := range grammars {
			viable, complete := check(g, b)
			if rv, rc := refCheck(g, b); rv != viable || rc != complete {
				t.Errorf("%q: the parser says viable %v complete %v, the reference %v %v", b, viable, complete, rv, rc)
			}
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

// maskEachToken is the reference mask: every token checked on its own,
// with the recursive-descent reference.
func maskEachToken(c *grammarConstraint, tok *tokenizer.Dir, reply string, row []float32) {
	_, complete := refCheck(c.g, []byte(reply))
	for id := range row {
		b, err := tok.TokenBytes(int32(id))
		ok := false
		switch {
		case slices.Contains(c.stops, int32(id)):
			ok = complete
		case err == nil && !tok.IsSpecial(int32(id)):
			ok, _ = refCheck(c.g, append([]byte(reply), b...))
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

// maskReparse is the mask as it was before the incremental parser: every
// vocabulary entry (grouped by first byte) re-reads the whole reply with
// the reference. BenchmarkConstraintMask measures against it.
func maskReparse(c *grammarConstraint, output []int32, row []float32) {
	var prefix []byte
	for _, id := range output {
		prefix = append(prefix, c.vocab.bytes(id)...)
	}
	scratch := slices.Clone(prefix)
	viable := func(b []byte) bool {
		scratch = append(scratch[:len(prefix)], b...)
		ok, _ := refCheck(c.g, scratch)
		return ok
	}
	for first, group := range c.vocab.byFirst {
		firstOK := viable([]byte{byte(first)})
		for _, id := range group {
			if !firstOK || !(len(c.vocab.table[id]) == 1 || viable(c.vocab.table[id])) {
				row[id] = float32(math.Inf(-1))
			}
		}
	}
}

// syntheticVocab is a vocabulary of n tokens: every single byte, then
// random 2–8-byte strings of JSON-ish text (Qwen3.6 has 248,320 entries).
func syntheticVocab(n int) *vocabBytes {
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \"{}[]:,.-_\n\\<>/="
	v := &vocabBytes{table: make([][]byte, n)}
	for id := range v.table {
		b := []byte{byte(id)}
		if id >= 256 {
			b = make([]byte, 2+rng.IntN(7))
			for i := range b {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		v.table[id] = b
		v.byFirst[b[0]] = append(v.byFirst[b[0]], int32(id))
	}
	return v
}

// BenchmarkConstraintMask compares one step's mask of a JSON-schema reply
// at Qwen3.6's vocabulary size (248,320 synthetic entries), incremental
// (the parser copied per token) against re-reading the reply per entry,
// after a short reply and inside a 1 KiB string; report the ratios.
func BenchmarkConstraintMask(b *testing.B) {
	person, err := compileSchema(json.RawMessage(`{"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}, "additionalProperties": false}`), "schema")
	if err != nil {
		b.Fatal(err)
	}
	const vocab = 248320
	c := &grammarConstraint{g: jsonReply{person}, vocab: syntheticVocab(vocab), stops: []int32{vocab - 1}}
	row := make([]float32, vocab)
	for _, reply := range []struct{ name, text string }{{"short", `{"na`}, {"1KiB", `{"n": 12, "name": "` + strings.Repeat("ab cd ", 171)}} {
		output := make([]int32, len(reply.text)) // single-byte tokens
		for i := range reply.text {
			output[i] = int32(reply.text[i])
		}
		b.Run("incremental/"+reply.name, func(b *testing.B) {
			for b.Loop() {
				c.Mask(output, row)
			}
		})
		b.Run("reparse/"+reply.name, func(b *testing.B) {
			for b.Loop() {
				maskReparse(c, output, row)
			}
		})
	}
}

// TestMaskMatchesReparse: at the synthetic 248,320-entry vocabulary, the
// incremental mask equals re-reading the reply for every entry.
func TestMaskMatchesReparse(t *testing.T) {
	if testing.Short() {
		t.Skip("re-reads a 248,320-entry vocabulary")
	}
	choice, err := readToolChoice(json.RawMessage(`"required"`), json.RawMessage(`[`+weatherTool+`]`))
	if err != nil {
		t.Fatal(err)
	}
	const vocab = 248320
	v := syntheticVocab(vocab)
	for _, c := range []struct {
		g     grammar
		reply string
	}{
		{choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"},
		{choice.grammar(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=d"},
		{jsonReply{&schema{types: []string{"object"}}}, `{"a": [1, 2.`},
	} {
		gc := &grammarConstraint{g: c.g, vocab: v, stops: []int32{vocab - 1}}
		output := make([]int32, len(c.reply))
		for i := range c.reply {
			output[i] = int32(c.reply[i])
		}
		got, want := make([]float32, vocab), make([]float32, vocab)
		gc.Mask(output, got)
		maskReparse(gc, output, want)
		want[vocab-1] = float32(math.Inf(-1)) // incomplete: the stop token is masked
		if !slices.Equal(got, want) {
			t.Errorf("after %q: the incremental mask differs from re-reading", c.reply)
		}
	}
}
