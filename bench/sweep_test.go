package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/fp8"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
	"ddflash/tokenizer"
)

// tinyPair writes the random tiny target and its drafter.
func tinyPair(t *testing.T) (model, draft string) {
	t.Helper()
	dir := t.TempDir()
	model, draft = filepath.Join(dir, "tiny"), filepath.Join(dir, "tiny-dflash")
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if err := testmodel.Write(model, testmodel.Options{Preset: p, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	return model, draft
}

// inProcess loads the pair as the bench command does: sized for a tree of
// maxBudget nodes (at least the chain) and seqs requests in flight, split
// over each configuration's tensor-parallel ranks.
func inProcess(t *testing.T, model, draft string, maxBudget, seqs int) *InProcess {
	return inProcessWeights(t, map[string]string{"": model}, draft, maxBudget, seqs)
}

// inProcessWeights is inProcess with the target's checkpoint per weights.
func inProcessWeights(t *testing.T, models map[string]string, draft string, maxBudget, seqs int) *InProcess {
	t.Helper()
	cfg, err := dflash.LoadConfig(draft)
	if err != nil {
		t.Fatal(err)
	}
	spec := engine.SpecOptions{Mode: engine.SpecTree, Budget: max(maxBudget, cfg.BlockSize-1), Rollback: mamba.Replay}
	load := func(tp int, weights string) (*engine.Engine, error) {
		backends := make([]kernels.Backend, tp)
		for i := range backends {
			backends[i] = cpu.New(1)
		}
		e, err := engine.LoadParallel(backends, models[weights], engine.Options{MaxSeqs: seqs, VerifyTokens: spec.Budget + 1})
		if err != nil {
			return nil, err
		}
		return e, dflash.Attach(e, draft, spec)
	}
	tok, err := tokenizer.LoadDir(models[""])
	if err != nil {
		t.Fatal(err)
	}
	return &InProcess{Load: load, Prompter: ChatPrompter{Dir: tok}, Rollback: mamba.Replay, Threads: 1, Device: "cpu"}
}

func tinyPlan(t *testing.T, modes string) *Plan {
	return testPlan(t, modes, "fibonacci,chat", []int{10}, []int{1, 2}, 1)
}

// TestInProcessSweepIsLosslessAndResumable sweeps the tiny pair in every
// kind of mode: greedy speculation must reproduce the baseline's tokens
// exactly (same outputs hash), spec runs carry acceptance and speedup, and
// a resumed sweep finds nothing left to do.
func TestInProcessSweepIsLosslessAndResumable(t *testing.T) {
	model, draft := tinyPair(t)
	backend := inProcess(t, model, draft, 6, 2)
	plan := tinyPlan(t, "auto,linear,b6")
	dir := t.TempDir()
	opts := Options{Plan: plan, Backend: backend, Store: Store{Dir: dir}, ModelDir: model, DraftDir: draft, IgnoreEOS: true, GPUs: &fakeGPUs{}}
	sum, err := Sweep(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Saved != 3*4 || sum.Skipped != 0 {
		t.Fatalf("summary %+v", sum)
	}
	st := Store{Dir: dir}
	auto, err := st.ReadRecord("tp1-auto")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tp1-linear", "tp1-b6"} {
		rec, err := st.ReadRecord(name)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.Complete || len(rec.Runs) != 4 || rec.Setup.Model.SHA256 != auto.Setup.Model.SHA256 || rec.Setup.Knobs.BlockSize != 16 {
			t.Fatalf("%s: complete %v, %d runs, setup %+v", name, rec.Complete, len(rec.Runs), rec.Setup.Knobs)
		}
		for i, run := range rec.Runs {
			base := auto.Runs[i]
			if run.RunKey != base.RunKey || run.OutputsSHA256 != base.OutputsSHA256 || run.OutputTokens != base.OutputTokens {
				t.Errorf("%s %s: outputs differ from the baseline's (%s vs %s)", name, run.RunKey, run.OutputsSHA256, base.OutputsSHA256)
			}
			m := run.Metrics
			if m.AcceptanceLength == nil || *m.AcceptanceLength < 1 || m.SpecDecode == nil || m.SpecDecode.Drafts == 0 {
				t.Errorf("%s %s: no acceptance: %+v", name, run.RunKey, m)
			}
			if s := speedup(&base.Metrics, &m); m.Speedup == nil || *m.Speedup != *s {
				t.Errorf("%s %s: speedup %v, want baseline TPOT / TPOT = %v", name, run.RunKey, m.Speedup, *s)
			}
		}
	}
	for _, run := range auto.Runs {
		if run.Metrics.AcceptanceLength != nil || run.Metrics.Speedup == nil || *run.Metrics.Speedup != 1 {
			t.Errorf("baseline %s: acceptance %v, speedup %v", run.RunKey, run.Metrics.AcceptanceLength, run.Metrics.Speedup)
		}
		if run.Requested != run.Completed || run.InputTokens == 0 {
			t.Errorf("baseline %s: %+v", run.RunKey, run)
		}
	}
	if v, err := Verify(dir); err != nil || !v.OK() || len(v.Findings) != 3 {
		t.Errorf("verify: %+v, %v", v, err)
	}

	before, _ := os.ReadFile(filepath.Join(dir, "tp1-b6.json"))
	opts.Resume = true
	sum, err = Sweep(context.Background(), opts)
	after, _ := os.ReadFile(filepath.Join(dir, "tp1-b6.json"))
	if err != nil || sum.Saved != 0 || sum.Skipped != 12 || string(before) != string(after) {
		t.Errorf("resume of a finished sweep: %+v, %v (record rewritten: %v)", sum, err, string(before) != string(after))
	}
}

// TestInProcessTensorParallelSweep sweeps TP 1, 2 and 3 on the tiny pair:
// TP 2 reproduces TP 1's outputs exactly in every mode, and TP 3, which does
// not divide the model's heads, is a recorded failure naming why, while the
// other degrees' results are kept.
func TestInProcessTensorParallelSweep(t *testing.T) {
	model, draft := tinyPair(t)
	plan := testPlan(t, "auto,b6", "fibonacci", []int{10}, []int{1}, 1)
	plan.TP = []int{1, 2, 3}
	dir := t.TempDir()
	sum, err := Sweep(context.Background(), Options{Plan: plan, Backend: inProcess(t, model, draft, 6, 1), Store: Store{Dir: dir}, IgnoreEOS: true, GPUs: &fakeGPUs{}})
	if err == nil || sum.Saved != 4 || len(sum.Failed) != 2 {
		t.Fatalf("sweep: %v, %+v", err, sum)
	}
	for _, f := range sum.Failed {
		if !strings.Contains(f, "--tp 3 does not divide the 4 attention heads") {
			t.Errorf("failure %q does not say why TP 3 cannot run", f)
		}
	}
	st := Store{Dir: dir}
	for _, mode := range []string{"auto", "b6"} {
		one, err := st.ReadRecord("tp1-" + mode)
		if err != nil {
			t.Fatal(err)
		}
		two, err := st.ReadRecord("tp2-" + mode)
		if err != nil {
			t.Fatal(err)
		}
		if two.Setup.Knobs.TP != 2 || len(two.Runs) != len(one.Runs) {
			t.Fatalf("tp2-%s: knobs %+v, %d runs", mode, two.Setup.Knobs, len(two.Runs))
		}
		for i := range one.Runs {
			if two.Runs[i].OutputsSHA256 != one.Runs[i].OutputsSHA256 {
				t.Errorf("%s %s: TP 2 outputs differ from TP 1", mode, one.Runs[i].RunKey)
			}
		}
	}
}

func TestInProcessRefusesWhatItCannotRun(t *testing.T) {
	model, _ := tinyPair(t)
	tok, err := tokenizer.LoadDir(model)
	if err != nil {
		t.Fatal(err)
	}
	noDrafter := &InProcess{Prompter: ChatPrompter{Dir: tok}, Load: func(int, string) (*engine.Engine, error) {
		return engine.Load(cpu.New(1), model, engine.Options{})
	}}
	if _, err := noDrafter.Open(Config{TP: 1, Mode: Mode{Name: "b4", Kind: "ddtree", Budget: 4}}); err == nil || !strings.Contains(err.Error(), "--draft") {
		t.Errorf("a spec mode without a drafter: %v", err)
	}
}

// TestPromptTooLongIsAFailure: a workload that does not fit the context is
// a failed run with the engine's reason, not a silent hole.
func TestPromptTooLongIsAFailure(t *testing.T) {
	model, draft := tinyPair(t)
	dir := t.TempDir()
	long := filepath.Join(dir, "long.jsonl")
	if err := os.WriteFile(long, []byte(`{"turns": ["`+strings.Repeat("very long prompt ", 40)+`"]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plan := tinyPlan(t, "auto")
	var err error
	if plan.Workloads, err = LoadWorkloads("fibonacci,"+long, 0); err != nil {
		t.Fatal(err)
	}
	plan.Concurrency = []int{1}
	out := filepath.Join(dir, "out")
	sum, err := Sweep(context.Background(), Options{Plan: plan, Backend: inProcess(t, model, draft, 4, 1), Store: Store{Dir: out}, GPUs: &fakeGPUs{}})
	if err == nil || len(sum.Failed) != 1 || !strings.Contains(sum.Failed[0], "prompt too long") || sum.Saved != 1 {
		t.Fatalf("sweep: %v, %+v", err, sum)
	}
	rec, rerr := Store{Dir: out}.ReadRecord("tp1-auto")
	if rerr != nil || len(rec.Runs) != 1 || rec.Complete {
		t.Errorf("the valid run should be saved and the record incomplete: %+v, %v", rec, rerr)
	}
}

// TestChatPrompterRaw: a raw request encodes the conversation's text joined
// by newlines, with no chat template around it.
func TestChatPrompterRaw(t *testing.T) {
	model, _ := tinyPair(t)
	tok, err := tokenizer.LoadDir(model)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "the fox"}, {Role: "assistant", Content: " ran"}, {Role: "user", Content: "away"}}
	got, err := ChatPrompter{Dir: tok}.Prompt(Request{Messages: msgs, Raw: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := tok.Encode("the fox\n ran\naway"); !slices.Equal(got, want) {
		t.Errorf("raw prompt %v, want %v", got, want)
	}
	chat, err := ChatPrompter{Dir: tok}.Prompt(Request{Messages: msgs})
	if err != nil || len(chat) <= len(got) {
		t.Errorf("chat prompt of %d tokens (%v): the template should wrap the turns", len(chat), err)
	}
}

// TestInProcessAdaptiveSweepIsLossless sweeps the adaptive mode against the
// baseline, alone and batched: its greedy outputs must be the baseline's
// (verify checks it), and its record says what it is.
func TestInProcessAdaptiveSweepIsLossless(t *testing.T) {
	model, draft := tinyPair(t)
	dir := t.TempDir()
	_, err := Sweep(context.Background(), Options{Plan: tinyPlan(t, "auto,adaptive"), Backend: inProcess(t, model, draft, AdaptiveBudget, 2),
		Store: Store{Dir: dir}, IgnoreEOS: true, GPUs: &fakeGPUs{}})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := Verify(dir); err != nil || !v.OK() || len(v.Findings) != 2 {
		t.Fatalf("verify: %+v, %v", v, err)
	}
	rec, err := Store{Dir: dir}.ReadRecord("tp1-adaptive")
	if err != nil {
		t.Fatal(err)
	}
	if k := rec.Setup.Knobs; k.Spec != "adaptive" || k.Budget != AdaptiveBudget || len(rec.Runs) != 4 {
		t.Fatalf("knobs %+v, %d runs", k, len(rec.Runs))
	}
	res, err := LoadResults([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Rows {
		if row.Config == "tp1-adaptive" && (row.Lossless == nil || !*row.Lossless) {
			t.Errorf("%s: lossless %v, want compared and true", row.Run.RunKey, row.Lossless)
		}
	}
}

// loggedBackend records which configuration served each request, in order.
type loggedBackend struct {
	*InProcess
	mu  sync.Mutex
	log []string
}

type loggedTarget struct {
	Target
	b    *loggedBackend
	name string
}

func (b *loggedBackend) Open(c Config) (Target, error) {
	t, err := b.InProcess.Open(c)
	return &loggedTarget{Target: t, b: b, name: c.Name()}, err
}

func (t *loggedTarget) Generate(ctx context.Context, r Request) (*Response, error) {
	t.b.mu.Lock()
	t.b.log = append(t.b.log, t.name)
	t.b.mu.Unlock()
	return t.Target.Generate(ctx, r)
}

// TestInProcessWeightsInterleave sweeps the tiny pair on its own weights
// and on their FP8 form: each mode's two configurations take turns pass by
// pass, FP8 speculation is lossless against the FP8 baseline (whose
// outputs are not the checkpoint's), and the report compares every FP8 run
// with the checkpoint's.
func TestInProcessWeightsInterleave(t *testing.T) {
	model, draft := tinyPair(t)
	quantized := filepath.Join(t.TempDir(), "fp8")
	if err := fp8.QuantizeCheckpoint(model, quantized); err != nil {
		t.Fatal(err)
	}
	backend := &loggedBackend{InProcess: inProcessWeights(t, map[string]string{"": model, WeightsFP8: quantized}, draft, 6, 1)}
	plan := testPlan(t, "auto,b6", "fibonacci", []int{10}, []int{1}, 2)
	var err error
	if plan.Weights, err = ParseWeights("fp8,checkpoint"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sum, err := Sweep(context.Background(), Options{Plan: plan, Backend: backend, Store: Store{Dir: dir}, IgnoreEOS: true, GPUs: &fakeGPUs{}})
	if err != nil || sum.Saved != 4 {
		t.Fatalf("sweep: %v, %+v", err, sum)
	}
	requests := len(plan.Workloads[0].passConversations(1)) // one turn each
	var want []string
	for _, mode := range []string{"auto", "b6"} {
		names := []string{"tp1-" + mode, "tp1-fp8-" + mode}
		for pass := range plan.Repeats {
			for _, name := range rotated(names, pass) {
				if pass == 0 {
					want = append(want, name) // the warmup
				}
				for range requests {
					want = append(want, name)
				}
			}
		}
	}
	if !slices.Equal(backend.log, want) {
		t.Errorf("requests went to\n%v\nwant them interleaved pass by pass, each pass starting one further on:\n%v", backend.log, want)
	}
	st := Store{Dir: dir}
	auto, err := st.ReadRecord("tp1-auto")
	if err != nil {
		t.Fatal(err)
	}
	fp8Auto, err := st.ReadRecord("tp1-fp8-auto")
	if err != nil {
		t.Fatal(err)
	}
	if auto.Setup.Knobs.Weights != "" || fp8Auto.Setup.Knobs.Weights != WeightsFP8 {
		t.Errorf("weights knobs %q and %q", auto.Setup.Knobs.Weights, fp8Auto.Setup.Knobs.Weights)
	}
	if auto.Runs[0].OutputsSHA256 == fp8Auto.Runs[0].OutputsSHA256 {
		t.Fatal("FP8 weights gave the checkpoint's outputs: the test cannot tell which baseline speculation is checked against")
	}
	if v, err := Verify(dir); err != nil || !v.OK() || len(v.Findings) != 4 {
		t.Errorf("verify: %+v, %v", v, err)
	}
	res, err := LoadResults([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Rows {
		if row.Knobs.Spec != "auto" && (row.Lossless == nil || !*row.Lossless) {
			t.Errorf("%s: lossless %v, want compared with its own weights' baseline and true", row.Config, row.Lossless)
		}
		if row.Knobs.Weights == "" {
			if row.VsCheckpoint != nil {
				t.Errorf("%s: compared with itself", row.Config)
			}
			continue
		}
		base := slices.IndexFunc(res.Rows, func(b Row) bool { return b.Knobs.Weights == "" && b.Knobs.Mode == row.Knobs.Mode })
		want := res.Rows[base].Run.Metrics.TPOT.Mean / row.Run.Metrics.TPOT.Mean
		if row.VsCheckpoint == nil || *row.VsCheckpoint != want {
			t.Errorf("%s: vs checkpoint %v, want the checkpoint's TPOT / TPOT = %v", row.Config, row.VsCheckpoint, want)
		}
	}
	var md strings.Builder
	res.Markdown(&md)
	if !strings.Contains(md.String(), "| TP | weights | mode |") || !strings.Contains(md.String(), "| 1 | fp8 | b6 |") {
		t.Errorf("markdown lacks the weights column:\n%s", md.String())
	}
}

// rotated is names starting at names[k mod len(names)], wrapping around.
func rotated(names []string, k int) []string {
	k %= len(names)
	return slices.Concat(names[k:], names[:k])
}

// openLog records the configurations a backend opens, in order.
type openLog struct {
	Backend
	opened []string
}

func (o *openLog) Open(c Config) (Target, error) {
	o.opened = append(o.opened, c.Mode.Name)
	return o.Backend.Open(c)
}

// TestInterleavedSweep measures every run's passes in turn across the
// modes, reopening each mode for its pass; the adaptive policy and the
// spec-decode counters carry across the openings, so the records match a
// sequential sweep's: complete, lossless, with acceptance counted.
func TestInterleavedSweep(t *testing.T) {
	model, draft := tinyPair(t)
	dir := t.TempDir()
	plan := testPlan(t, "auto,b4,adaptive", "fibonacci", []int{10}, []int{1, 2}, 2)
	backend := &openLog{Backend: inProcess(t, model, draft, AdaptiveBudget, 2)}
	if _, err := Sweep(context.Background(), Options{Plan: plan, Backend: backend, Store: Store{Dir: dir}, IgnoreEOS: true, GPUs: &fakeGPUs{}, Interleave: true}); err != nil {
		t.Fatal(err)
	}
	// Two runs (concurrency 1 and 2), two passes each, the modes in turn,
	// the second pass starting with the second mode.
	turn := []string{"auto", "b4", "adaptive"}
	if want := slices.Concat(turn, rotated(turn, 1), turn, rotated(turn, 1)); !slices.Equal(backend.opened, want) {
		t.Errorf("opened %v, want %v", backend.opened, want)
	}
	if v, err := Verify(dir); err != nil || !v.OK() || len(v.Findings) != 3 {
		t.Fatalf("verify: %+v, %v", v, err)
	}
	res, err := LoadResults([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Rows {
		if row.Config == "tp1-auto" {
			continue
		}
		if row.Lossless == nil || !*row.Lossless || row.Run.Metrics.AcceptanceLength == nil || row.Run.Completed != 2*row.Run.RunKey.Concurrency {
			t.Errorf("%s %s: lossless %v, τ %v, %d requests", row.Config, row.Run.RunKey, row.Lossless, row.Run.Metrics.AcceptanceLength, row.Run.Completed)
		}
	}
}

// TestInProcessSweepRunsDFlash2Modes sweeps the tiny pair's drafter beside
// a DFlash2 drafter of another block size (8): the dflash2 and d2bN modes
// run the DFlash2 drafter (its block size in their knobs, its checkpoint
// in every record), losslessly, while linear keeps the pair's drafter; a
// plan with a DFlash2 mode and no DFlash2 drafter is refused.
func TestInProcessSweepRunsDFlash2Modes(t *testing.T) {
	model, draft := tinyPair(t)
	draft2 := filepath.Join(t.TempDir(), "tiny-dflash2")
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft2, testmodel.DraftOptions{Target: p, Seed: 4, BlockSize: 8, DFlash2: true}); err != nil {
		t.Fatal(err)
	}
	backend := inProcess(t, model, draft, 6, 1)
	dflash2 := map[*engine.Engine]engine.Drafter{}
	own := map[*engine.Engine]engine.Drafter{}
	backend.Drafter = func(e *engine.Engine, m Mode) (engine.Drafter, error) {
		if _, ok := own[e]; !ok {
			own[e] = e.Drafter // the one Load attached: the pair's
		}
		if m.Drafter != DFlash2Drafter {
			return own[e], nil
		}
		if dflash2[e] == nil {
			d, err := dflash.Load(e, draft2)
			if err != nil {
				return nil, err
			}
			dflash2[e] = d
		}
		return dflash2[e], nil
	}
	plan := testPlan(t, "auto,linear,dflash2,d2b6", "fibonacci", []int{10}, []int{1}, 1)
	dir := t.TempDir()
	opts := Options{Plan: plan, Backend: backend, Store: Store{Dir: dir}, ModelDir: model, DraftDir: draft, DFlash2Dir: draft2, IgnoreEOS: true, GPUs: &fakeGPUs{}}
	if _, err := Sweep(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	st := Store{Dir: dir}
	auto, err := st.ReadRecord("tp1-auto")
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]int{"tp1-linear": 16, "tp1-dflash2": 8, "tp1-d2b6": 8} {
		rec, err := st.ReadRecord(name)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Setup.Knobs.BlockSize != block || rec.Setup.DFlash2 == nil || rec.Setup.DFlash2.SHA256 == "" {
			t.Fatalf("%s: block size %d (want %d), DFlash2 drafter %+v", name, rec.Setup.Knobs.BlockSize, block, rec.Setup.DFlash2)
		}
		for i, run := range rec.Runs {
			if run.OutputsSHA256 != auto.Runs[i].OutputsSHA256 {
				t.Errorf("%s %s: outputs differ from the baseline's", name, run.RunKey)
			}
		}
	}
	opts.Backend, opts.Store = inProcess(t, model, draft, 6, 1), Store{Dir: t.TempDir()}
	if _, err := Sweep(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "--draft2") {
		t.Fatalf("a DFlash2 mode without a DFlash2 drafter: %v", err)
	}
}

// closeCounted is a drafter that counts its Closes.
type closeCounted struct {
	engine.Drafter
	closes int
}

func (c *closeCounted) Close() {
	c.closes++
	c.Drafter.(interface{ Close() }).Close()
}

// TestInProcessClosesEveryDrafter: when the next degree's engine loads, the
// previous one's drafters, the one Load attached and each the Drafter hook
// gave (here a DFlash2 drafter, the engine's when its engine closes), are
// closed once each.
func TestInProcessClosesEveryDrafter(t *testing.T) {
	model, draft := tinyPair(t)
	draft2 := filepath.Join(t.TempDir(), "tiny-dflash2")
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft2, testmodel.DraftOptions{Target: p, Seed: 4, BlockSize: 8, DFlash2: true}); err != nil {
		t.Fatal(err)
	}
	backend := inProcess(t, model, draft, 6, 1)
	drafters := map[*engine.Engine]map[string]*closeCounted{}
	var engines []*engine.Engine // in load order: TP 1's, then TP 2's
	load := backend.Load
	backend.Load = func(tp int, weights string) (*engine.Engine, error) {
		e, err := load(tp, weights)
		if err == nil {
			own := &closeCounted{Drafter: e.Drafter}
			e.Drafter, engines = own, append(engines, e)
			drafters[e] = map[string]*closeCounted{"": own}
		}
		return e, err
	}
	backend.Drafter = func(e *engine.Engine, m Mode) (engine.Drafter, error) {
		ds := drafters[e]
		if ds[m.Drafter] == nil {
			d, err := dflash.Load(e, draft2)
			if err != nil {
				return nil, err
			}
			ds[m.Drafter] = &closeCounted{Drafter: d}
		}
		return ds[m.Drafter], nil
	}
	plan := testPlan(t, "auto,linear,dflash2", "fibonacci", []int{4}, []int{1}, 1)
	plan.TP = []int{1, 2}
	if _, err := Sweep(context.Background(), Options{Plan: plan, Backend: backend, Store: Store{Dir: t.TempDir()}, IgnoreEOS: true, GPUs: &fakeGPUs{}}); err != nil {
		t.Fatal(err)
	}
	if len(engines) != 2 {
		t.Fatalf("%d engines loaded, want 2", len(engines))
	}
	for i, e := range engines {
		for name, d := range drafters[e] {
			if want := 1 - i; d.closes != want { // TP 2's engine is still open
				t.Errorf("TP %d engine's drafter %q: closed %d times, want %d", i+1, name, d.closes, want)
			}
		}
	}
}
