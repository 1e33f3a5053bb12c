package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
)

// countingBackend counts the bytes its backend holds in buffers made by
// Alloc, and the peak, and the Frees of buffers it does not hold.
type countingBackend struct {
	kernels.Backend
	mu          sync.Mutex
	live, peak  int64
	held        map[kernels.Buffer]bool
	doubleFrees int
}

func (c *countingBackend) Alloc(dt kernels.DType, n int) (kernels.Buffer, error) {
	b, err := c.Backend.Alloc(dt, n)
	if err == nil {
		c.mu.Lock()
		c.live += int64(n * dt.Size())
		c.peak = max(c.peak, c.live)
		if c.held == nil {
			c.held = map[kernels.Buffer]bool{}
		}
		c.held[b] = true
		c.mu.Unlock()
	}
	return b, err
}

func (c *countingBackend) Free(b kernels.Buffer) {
	c.mu.Lock()
	if !c.held[b] {
		c.doubleFrees++
		c.mu.Unlock()
		return
	}
	delete(c.held, b)
	c.live -= int64(b.Len() * b.DType().Size())
	c.mu.Unlock()
	c.Backend.Free(b)
}

// TestServeAllocatesThePlan starts serve's engine from its memory plan (the
// same plan and load steps as serve) on a counting CPU backend, runs one
// full batch of speculative requests, and checks that the peak of all
// allocations is within 2 % (or 64 MiB) of what the plan assigns to
// weights, caches, state slots and rollback; Close returns all of it. Once
// per recurrent-state dtype.
func TestServeAllocatesThePlan(t *testing.T) {
	for _, ssm := range []string{"fp32", "bf16"} {
		t.Run(ssm, func(t *testing.T) { checkServeAllocatesThePlan(t, ssm) })
	}
}

func checkServeAllocatesThePlan(t *testing.T, ssmDtype string) {
	target, draft := tinyModelDirs(t)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var c serveConfig
	c.register(fs)
	if err := fs.Parse([]string{"--model", target, "--draft", draft, "--spec", "ddtree", "--budget", "4", "--gpu-mem", "1GiB",
		"--max-running-requests", "3", "--context", "256", "--kv-dtype", "bf16", "--ssm-dtype", ssmDtype, "--threads", "1"}); err != nil {
		t.Fatal(err)
	}
	counter := &countingBackend{}
	c.model.wrapBackend = func(b kernels.Backend) kernels.Backend { counter.Backend = b; return counter }
	sizing, p, err := c.plan(fs, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	model, err := c.load(sizing, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := model.Engine.Model.States.SSM(0, 0, 0).DType(), map[string]kernels.DType{"fp32": kernels.F32, "bf16": kernels.BF16}[ssmDtype]; got != want {
		t.Fatalf("--ssm-dtype %s allocated a %v recurrent state", ssmDtype, got)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { model.Scheduler.Run(ctx); close(done) }()
	var streams []*engine.Stream
	for i := range p.MaxRunning.Effective {
		st, err := model.Scheduler.Submit(context.Background(), engine.Request{Prompt: []int32{5, int32(i), 9, 4}, MaxTokens: 20, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	for _, st := range streams {
		if _, err := st.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	<-done
	planned := p.EngineBytes()
	slack := max(planned/50, 64<<20)
	if d := counter.peak - planned; d > slack || -d > slack {
		t.Errorf("allocated at most %d bytes, the plan assigns %d to weights, caches, states and rollback: %+d, want within %d", counter.peak, planned, d, slack)
	}
	if planned < 4*slack {
		t.Errorf("the plan assigns only %d bytes: the test needs a budget where the caches dominate the slack", planned)
	}
	model.Engine.Close()
	if counter.live != 0 {
		t.Errorf("%d bytes still allocated after Close", counter.live)
	}
	t.Logf("plan %d bytes, peak allocation %d (%+.3f%%)", planned, counter.peak, 100*float64(counter.peak-planned)/float64(planned))
}

// TestBenchSizingFollowsThePlan: given --gpu-mem, the in-process bench sizes
// each degree's engine by the same plan serve computes for those flags (and
// loads exactly its KV tokens and its recurrent-state dtype); on the CPU
// without it, by concurrency alone.
func TestBenchSizingFollowsThePlan(t *testing.T) {
	target, draft := tinyModelDirs(t)
	mf := modelFlags{model: target, draft: draft, spec: "ddtree", budget: 4, rollback: "replay", context: 256, device: "cpu", tp: 1, threads: 1, ssmDtype: "bf16"}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	got, err := benchSizing(&mf, fs, 3, "1GiB", 0)
	if err != nil {
		t.Fatal(err)
	}
	var c serveConfig
	c.register(fs)
	if err := fs.Parse([]string{"--model", target, "--draft", draft, "--spec", "ddtree", "--budget", "4", "--context", "256",
		"--max-running-requests", "3", "--gpu-mem", "1GiB", "--ssm-dtype", "bf16"}); err != nil {
		t.Fatal(err)
	}
	want, p, err := c.plan(fs, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || got.SSMDType != engine.SSMBF16 {
		t.Fatalf("bench sizing %+v, serve's %+v (both want a bf16 recurrent state)", got, want)
	}
	e, err := mf.load(got)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if kv := e.Model.KV; int64(kv.Pages()*kv.PageSize()) < p.KVTokens || int64((kv.Pages()-1)*kv.PageSize()) >= p.KVTokens {
		t.Errorf("engine KV of %d pages of %d tokens for a plan of %d tokens", kv.Pages(), kv.PageSize(), p.KVTokens)
	}
	want3 := engine.Options{MaxSeqs: 3, KVDType: kernels.F32, ConvDType: kernels.F32, SSMDType: engine.SSMBF16} // the f32 checkpoint's caches
	if unplanned, err := benchSizing(&mf, fs, 3, "", 0); err != nil || unplanned != want3 {
		t.Errorf("on the CPU without --gpu-mem: %+v, %v; want %+v", unplanned, err, want3)
	}
	mf.ssmDtype = "fp16"
	if _, err := benchSizing(&mf, fs, 3, "", 0); err == nil || !strings.Contains(err.Error(), "--ssm-dtype fp16") {
		t.Errorf("--ssm-dtype fp16: %v, want a refusal naming it", err)
	}
}

// TestWithMTPClosesBothDrafters loads --spec adaptive --with-mtp on a
// counting backend: closing the engine returns every byte, the MTP head's
// and the DFlash drafter's included, and closing the choice of drafters
// again (as a bench engine's drafters may be) frees nothing twice.
func TestWithMTPClosesBothDrafters(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	target, draft := filepath.Join(dir, "tiny"), filepath.Join(dir, "draft")
	if err := testmodel.Write(target, testmodel.Options{Preset: p, Seed: 3, MTP: true}); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	var m modelFlags
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	m.register(fs)
	if err := fs.Parse([]string{"--model", target, "--draft", draft, "--spec", "adaptive", "--with-mtp", "--threads", "1", "--context", "128"}); err != nil {
		t.Fatal(err)
	}
	counter := &countingBackend{}
	m.wrapBackend = func(b kernels.Backend) kernels.Backend { counter.Backend = b; return counter }
	opts, err := m.unplannedSizing(1)
	if err != nil {
		t.Fatal(err)
	}
	e, err := m.load(opts)
	if err != nil {
		t.Fatal(err)
	}
	choice, ok := e.Drafter.(*engine.ChoiceDrafter)
	if !ok || len(choice.Drafters) != 2 {
		t.Fatalf("--with-mtp attached %T, want a choice of two drafters", e.Drafter)
	}
	res, err := e.Generate(context.Background(), engine.Request{Prompt: []int32{5, 17, 99}, MaxTokens: 12, IgnoreEOS: true})
	if err != nil || len(res.Tokens) != 12 {
		t.Fatalf("generate: %v, %d tokens", err, len(res.Tokens))
	}
	e.Close()
	if counter.live != 0 {
		t.Fatalf("%d bytes still allocated after Close", counter.live)
	}
	choice.Close()
	if counter.doubleFrees != 0 {
		t.Errorf("closing the drafters again freed %d buffers twice", counter.doubleFrees)
	}
}
