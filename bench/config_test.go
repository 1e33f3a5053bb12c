package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseModes(t *testing.T) {
	modes, err := ParseModes("b15, linear,auto,b8,adaptive")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range modes {
		names = append(names, m.Name)
	}
	if want := []string{"auto", "b15", "linear", "b8", "adaptive"}; !slices.Equal(names, want) {
		t.Errorf("order %v, want the baseline first then as given: %v", names, want)
	}
	if modes[1] != (Mode{Name: "b15", Kind: "ddtree", Budget: 15}) {
		t.Errorf("b15 = %+v", modes[1])
	}
	if modes[4] != (Mode{Name: "adaptive", Kind: "adaptive", Budget: AdaptiveBudget}) {
		t.Errorf("adaptive = %+v", modes[4])
	}
	if m, err := ParseMode("b8-nocache"); err != nil || m != (Mode{Name: "b8-nocache", Kind: "ddtree", Budget: 8, NoPrefixCache: true}) {
		t.Errorf("b8-nocache = %+v, %v", m, err)
	}
	for name, want := range map[string]Mode{
		"dflash2":         {Name: "dflash2", Kind: "linear", Drafter: DFlash2Drafter},
		"d2b8":            {Name: "d2b8", Kind: "ddtree", Budget: 8, Drafter: DFlash2Drafter},
		"mtp4":            {Name: "mtp4", Kind: "linear", Budget: 4, Drafter: MTPDrafter},
		"adaptive-mtp":    {Name: "adaptive-mtp", Kind: "adaptive", Budget: AdaptiveBudget, Drafter: ChoiceDrafters},
		"b4-d4":           {Name: "b4-d4", Kind: "ddtree", Budget: 4, Depth: 4},
		"linear-d8":       {Name: "linear-d8", Kind: "linear", Depth: 8},
		"adaptive-d6":     {Name: "adaptive-d6", Kind: "adaptive", Budget: AdaptiveBudget, Depth: 6},
		"adaptive-mtp-d4": {Name: "adaptive-mtp-d4", Kind: "adaptive", Budget: AdaptiveBudget, Drafter: ChoiceDrafters, Depth: 4},
		"b8-d3-nocache":   {Name: "b8-d3-nocache", Kind: "ddtree", Budget: 8, Depth: 3, NoPrefixCache: true},
	} {
		if m, err := ParseMode(name); err != nil || m != want {
			t.Errorf("%s = %+v, %v; want %+v", name, m, err, want)
		}
	}
	for _, bad := range []string{"", "b0", "b", "b-3", "b08", "tree", "auto,auto", "-nocache", "auto-nocache-nocache", "d2b", "d2b0", "d2", "d2linear", "mtp", "mtp0", "mtp9", "mtp03",
		"b4-d0", "b4-d", "b4-d04", "b4-dx", "auto-d4", "mtp3-d2", "d2b8-d4", "dflash2-d4", "adaptive-mtp-d0", "b4-nocache-d4"} {
		if _, err := ParseModes(bad); err == nil {
			t.Errorf("ParseModes(%q) accepted", bad)
		}
	}
}

func TestParseWeightsAndConfigNames(t *testing.T) {
	w, err := ParseWeights("fp8, checkpoint")
	if err != nil || !slices.Equal(w, []string{"", WeightsFP8}) {
		t.Errorf("ParseWeights = %q, %v; want the checkpoint's first", w, err)
	}
	for _, bad := range []string{"", "bf16", "fp8,fp8", "checkpoint,checkpoint"} {
		if _, err := ParseWeights(bad); err == nil || !strings.Contains(err.Error(), "--weights") {
			t.Errorf("ParseWeights(%q): error %v, want one naming --weights", bad, err)
		}
	}
	b15 := Mode{Name: "b15", Kind: "ddtree", Budget: 15}
	for _, c := range []struct {
		config Config
		name   string
	}{
		{Config{TP: 1, Mode: b15}, "tp1-b15"},
		{Config{TP: 2, Weights: WeightsFP8, Mode: b15}, "tp2-fp8-b15"},
	} {
		if got := c.config.Name(); got != c.name {
			t.Errorf("%+v: name %q, want %q", c.config, got, c.name)
		}
	}
	plan := &Plan{TP: []int{1, 2}, Modes: []Mode{{Name: "auto", Kind: "auto"}, b15}, Weights: w}
	var names []string
	for _, c := range plan.Configs() {
		names = append(names, c.Name())
	}
	if want := []string{"tp1-auto", "tp1-fp8-auto", "tp1-b15", "tp1-fp8-b15", "tp2-auto", "tp2-fp8-auto", "tp2-b15", "tp2-fp8-b15"}; !slices.Equal(names, want) {
		t.Errorf("configurations %v, want %v (a mode's weights together)", names, want)
	}
	one := &Plan{TP: []int{1}, Modes: []Mode{b15}, Weights: w}
	if err := (&OpenAI{}).Validate(one); err == nil || !strings.Contains(err.Error(), "--weights") {
		t.Errorf("a server given FP8 weights: %v", err)
	}
	if one.Weights = nil; (&OpenAI{}).Validate(one) != nil {
		t.Error("a server refused its own weights")
	}
}

func TestParseInts(t *testing.T) {
	if v, err := ParseInts("tp", "1, 2,8"); err != nil || !slices.Equal(v, []int{1, 2, 8}) {
		t.Errorf("ParseInts = %v, %v", v, err)
	}
	for _, bad := range []string{"", "0", "-1", "x", "1,1"} {
		if _, err := ParseInts("tp", bad); err == nil || !strings.Contains(err.Error(), "--tp") {
			t.Errorf("ParseInts(%q): error %v, want one naming --tp", bad, err)
		}
	}
}

func TestLoadWorkloadsFromJSONL(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mt-bench.jsonl")
	data := `{"turns": ["Compose a travel blog post.", "Rewrite it in limericks."]}

{"turns": ["What is 2+2?"], "category": "math"}
{"turns": ["third"]}
`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	ws, err := LoadWorkloads("fibonacci,"+path, 2)
	if err != nil {
		t.Fatal(err)
	}
	w := ws[1]
	if w.Name != "mt_bench" || len(w.Conversations) != 2 || w.Turns() != 3 || w.Conversations[0][1] != "Rewrite it in limericks." {
		t.Errorf("workload %+v", w)
	}
	if info := w.Info(); info.Conversations != 2 || info.Turns != 3 || len(info.SHA256) != 64 {
		t.Errorf("info %+v", info)
	}
	if got := w.passConversations(5); len(got) != 5 || got[2][0] != w.Conversations[0][0] {
		t.Errorf("5 in flight over 2 conversations: %v", got)
	}
	// The limit cuts built-in workloads too, and a system prompt is part of the hash.
	mt, err := LoadWorkloads("multiturn", 1)
	if err != nil {
		t.Fatal(err)
	}
	full, _ := LoadWorkloads("multiturn", 0)
	if len(mt[0].Conversations) != 1 || len(full[0].Conversations) != 4 || mt[0].System == "" || mt[0].Info().SHA256 == full[0].Info().SHA256 {
		t.Errorf("multiturn cut to 1: %d conversations (full %d), system %d bytes", len(mt[0].Conversations), len(full[0].Conversations), len(mt[0].System))
	}
	noSystem := *mt[0]
	noSystem.System = ""
	if noSystem.Info().SHA256 == mt[0].Info().SHA256 {
		t.Error("the system prompt does not change the workload's hash")
	}

	for name, body := range map[string]string{
		"bad json":    "{\"turns\": [\"a\"]}\n{turns}\n",
		"no turns":    "{\"prompt\": \"a\"}\n",
		"empty turn":  "{\"turns\": [\"a\", \" \"]}\n",
		"empty file":  "\n\n",
		"turns typed": "{\"turns\": \"a\"}\n",
	} {
		p := filepath.Join(dir, "w.jsonl")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadWorkloads(p, 0); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v, want one naming the file", name, err)
		}
	}
	if _, err := LoadWorkloads("fibonacci,nosuch", 0); err == nil || !strings.Contains(err.Error(), "fibonacci, math, prose, chat") {
		t.Errorf("unknown workload: %v", err)
	}
	if _, err := LoadWorkloads("chat,chat", 0); err == nil {
		t.Error("a workload listed twice was accepted")
	}
}
