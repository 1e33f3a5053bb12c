package server

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestChatParserSplits feeds replies to the parser whole and cut at every
// byte: the split must not depend on how the text arrives, and must be
// what vLLM's qwen3 and qwen3_coder parsers make of it.
func TestChatParserSplits(t *testing.T) {
	specs, err := toolSpecs(json.RawMessage(`[` + weatherTool + `]`))
	if err != nil {
		t.Fatal(err)
	}
	types := paramTypesOf(specs)
	cases := []struct {
		name               string
		thinking           bool
		tools              paramTypes
		reply              string
		content, reasoning string
		calls              []string // name + " " + arguments
	}{
		{"plain", false, nil, " hi <tool_call> there\n", " hi <tool_call> there\n", "", nil},
		{"reasoning", true, nil, "let me think\n</think>\n\nAnswer.", "Answer.", "let me think", nil},
		{"unfinished reasoning", true, nil, "still thinking <", "", "still thinking <", nil},
		{"model opens think", false, nil, "<think>\nhmm\n</think>\n\nOK", "OK", "\nhmm", nil},
		{"call", true, types, callReply, "Let me look.", "The user wants the weather.", []string{`get_weather {"city": "Paris", "days": 3, "metric": true}`}},
		{"two calls", false, types, "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>\n" +
			"<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\nten\n</parameter>\n</function>\n</tool_call>\n", "", "",
			[]string{`get_weather {"city": "Rome"}`, `get_weather {"city": "Oslo", "days": "ten"}`}},
		{"no parameters", false, types, "ok <tool_call>\n<function=now>\n</function>\n</tool_call>", "ok", "", []string{`now {}`}},
		{"cut short", false, types, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "", "", []string{`get_weather {}`}},
		{"not a call", false, types, "a <tool_call> b", "a <tool_call> b", "", nil},
		{"tools off", false, nil, callReply, callReply, "", nil},
	}
	for _, c := range cases {
		for cut := 0; cut <= len(c.reply); cut++ {
			p := newChatParser(true, c.thinking, c.tools)
			var got parsed
			if cut == 0 {
				got.add(p.add(c.reply))
			} else {
				for i := 0; i < len(c.reply); i += cut {
					got.add(p.add(c.reply[i:min(i+cut, len(c.reply))]))
				}
			}
			got.add(p.finish())
			var calls []string
			for _, call := range mergeCalls(got.calls) {
				var args any
				if err := json.Unmarshal([]byte(call.args), &args); err != nil {
					t.Errorf("%s (pieces of %d): arguments %q are not JSON", c.name, cut, call.args)
				}
				b, _ := json.Marshal(args)
				calls = append(calls, call.name+" "+string(b))
				if !strings.HasPrefix(call.id, "call_") {
					t.Errorf("%s: call id %q", c.name, call.id)
				}
			}
			want := make([]string, len(c.calls))
			for i, w := range c.calls {
				name, args, _ := strings.Cut(w, " ")
				var v any
				_ = json.Unmarshal([]byte(args), &v)
				b, _ := json.Marshal(v)
				want[i] = name + " " + string(b)
			}
			if got.content != c.content || got.reasoning != c.reasoning || strings.Join(calls, "|") != strings.Join(want, "|") {
				t.Errorf("%s (pieces of %d): content %q reasoning %q calls %q, want %q %q %q", c.name, cut, got.content, got.reasoning, calls, c.content, c.reasoning, want)
				break
			}
		}
	}
}
