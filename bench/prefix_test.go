package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"ddflash/engine"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
	"ddflash/tokenizer"
)

// TestInProcessPrefixCacheWorkload sweeps a multi-turn workload with a
// shared system prompt on an engine with the prefix cache, in mode auto and
// auto-nocache: the outputs are identical, the cached run reports the
// share of prompt tokens it reused and the other none, both measure the
// later turns' TTFT, and the report's prefix table shows the ratio.
func TestInProcessPrefixCacheWorkload(t *testing.T) {
	model, _ := tinyPair(t)
	tok, err := tokenizer.LoadDir(model)
	if err != nil {
		t.Fatal(err)
	}
	load := func(int, string) (*engine.Engine, error) {
		return engine.Load(cpu.New(1), model, engine.Options{MaxSeqs: 2, PrefixSlots: 4})
	}
	backend := &InProcess{Load: load, Prompter: ChatPrompter{Dir: tok}, Rollback: mamba.Replay, Threads: 1, Device: "cpu"}
	w := &Workload{Name: "shared", Source: "test", System: strings.Repeat("the farmer checks the gate before sunrise. ", 3),
		Conversations: [][]string{{"hi there", "and then?", "why?"}, {"the river", "the trees", "the town"}}}
	modes, err := ParseModes("auto,auto-nocache")
	if err != nil {
		t.Fatal(err)
	}
	plan := &Plan{TP: []int{1}, Modes: modes, Workloads: []*Workload{w}, MaxTokens: []int{6}, Concurrency: []int{2}, Repeats: 1}
	dir := t.TempDir()
	if _, err := Sweep(context.Background(), Options{Plan: plan, Backend: backend, Store: Store{Dir: dir}, ModelDir: model, IgnoreEOS: true, GPUs: &fakeGPUs{}}); err != nil {
		t.Fatal(err)
	}
	st := Store{Dir: dir}
	on, err := st.ReadRecord("tp1-auto")
	if err != nil {
		t.Fatal(err)
	}
	off, err := st.ReadRecord("tp1-auto-nocache")
	if err != nil {
		t.Fatal(err)
	}
	a, b := on.Runs[0], off.Runs[0]
	if a.OutputsSHA256 != b.OutputsSHA256 {
		t.Fatal("outputs differ with and without the prefix cache")
	}
	if hit := a.Metrics.PrefixCacheHitRate; hit == nil || *hit <= 0 || *hit >= 1 {
		t.Errorf("cached run's hit rate %v, want between 0 and 1", hit)
	}
	if hit := b.Metrics.PrefixCacheHitRate; hit == nil || *hit != 0 {
		t.Errorf("uncached run's hit rate %v, want 0", hit)
	}
	if a.Metrics.LaterTurnsTTFT.N != 4 || b.Metrics.LaterTurnsTTFT.N != 4 {
		t.Errorf("later-turn TTFTs measured %d and %d times, want 4 (2 conversations × 2 later turns)", a.Metrics.LaterTurnsTTFT.N, b.Metrics.LaterTurnsTTFT.N)
	}
	res, err := LoadResults([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	res.Markdown(&md)
	if !strings.Contains(md.String(), "Prefix cache") || !strings.Contains(md.String(), "| 1 | auto | shared | 6 | 2 |") {
		t.Errorf("report lacks the prefix table:\n%s", md.String())
	}
}
