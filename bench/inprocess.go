package bench

import (
	"context"
	"ddflash/adaptive"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"ddflash/engine"
	"ddflash/mamba"
	"ddflash/tokenizer"
)

// Prompter turns a request's conversation into prompt tokens and output
// tokens back into text (for the next turn).
type Prompter interface {
	Prompt(r Request) ([]int32, error)
	Text(tokens []int32) (string, error)
}

// ChatPrompter renders the checkpoint's chat template and encodes it.
type ChatPrompter struct{ Dir *tokenizer.Dir }

// Prompt renders the messages with the generation prompt and encodes the
// text; a raw request encodes RawText instead.
func (c ChatPrompter) Prompt(r Request) ([]int32, error) {
	if r.Raw {
		return c.Dir.Encode(RawText(r.Messages)), nil
	}
	if c.Dir.ChatTemplate == nil {
		return nil, errors.New("the model has no chat template (chat_template.jinja or tokenizer_config.json's chat_template): use --raw for a base model")
	}
	raw, err := json.Marshal(r.Messages)
	if err != nil {
		return nil, err
	}
	thinking := r.EnableThinking
	text, err := c.Dir.ChatTemplate.Render(tokenizer.ChatRequest{Messages: raw, AddGenerationPrompt: true, EnableThinking: &thinking})
	if err != nil {
		return nil, err
	}
	return c.Dir.Encode(text), nil
}

// Text decodes output tokens without special tokens.
func (c ChatPrompter) Text(tokens []int32) (string, error) { return c.Dir.Decode(tokens, true) }

// InProcess runs configurations on engines loaded in this process, one
// tensor-parallel degree at a time. Load must size each engine (sequences,
// verify tokens) for the largest configuration of the sweep and attach the
// drafter when any mode speculates; Open switches the engine's spec mode
// while no request is in flight.
type InProcess struct {
	Load     func(tp int) (*engine.Engine, error)
	Prompter Prompter
	Rollback mamba.Strategy
	Threads  int    // 0: all cores
	Device   string // the backend's name, for the record

	// The latest degree's engine (or why it failed to load): the previous
	// one is closed before the next loads, so one is in memory at a time.
	tp     int
	engine *engine.Engine
	err    error
}

// Info implements Backend.
func (p *InProcess) Info() BackendInfo { return BackendInfo{Kind: "in-process"} }

// engineFor returns the engine of a tensor-parallel degree, loading it on first use.
func (p *InProcess) engineFor(tp int) (*engine.Engine, error) {
	if p.tp == tp && (p.engine != nil || p.err != nil) {
		return p.engine, p.err
	}
	if p.engine != nil {
		p.engine.Close() // its device memory goes back before the next degree loads
	}
	p.engine, p.err = p.Load(tp)
	p.tp = tp
	return p.engine, p.err
}

// Validate implements Backend. Degrees are checked when their engine loads
// (a degree that does not divide the model becomes that configuration's
// recorded failure); here only what a loaded engine already tells.
func (p *InProcess) Validate(plan *Plan) error {
	if p.engine == nil {
		return nil
	}
	for _, m := range plan.Modes {
		if m.Kind != "auto" && p.engine.Drafter == nil {
			return fmt.Errorf("mode %s speculates and needs a drafter: give --draft DIR, or --modes auto", m.Name)
		}
	}
	return nil
}

// spec is a mode's decoding. The adaptive mode gets a fresh policy, which
// measures its cost curve at the configuration's first request.
func (p *InProcess) spec(m Mode) engine.SpecOptions {
	mode := map[string]engine.SpecMode{"auto": engine.SpecAuto, "linear": engine.SpecLinear, "ddtree": engine.SpecTree, "adaptive": engine.SpecTree}[m.Kind]
	o := engine.SpecOptions{Mode: mode, Budget: m.Budget, Rollback: p.Rollback}
	if m.Kind == "adaptive" {
		o.Policy = &adaptive.Policy{Autoregressive: true}
	}
	return o
}

// Knobs implements Backend. It loads the degree's engine to read its sizes;
// when that fails the knobs lack them and Open reports the error.
func (p *InProcess) Knobs(tp int, m Mode) Knobs {
	k := Knobs{TP: tp, Mode: m.Name, Spec: m.Kind, Budget: m.Budget, Threads: p.Threads, Device: p.Device}
	if k.Threads <= 0 {
		k.Threads = runtime.NumCPU()
	}
	e, err := p.engineFor(tp)
	if err != nil {
		return k
	}
	k.Context, k.MaxRunning = e.Context, e.MaxSeqs()
	if m.Kind != "auto" && e.Drafter != nil {
		k.Rollback = p.Rollback.String()
		k.BlockSize = e.Drafter.BlockSize()
	}
	if m.Kind == "linear" {
		k.Budget = k.BlockSize - 1
	}
	return k
}

// Open implements Backend: it sets the engine's spec mode and starts a scheduler.
func (p *InProcess) Open(tp int, m Mode) (Target, error) {
	e, err := p.engineFor(tp)
	if err != nil {
		return nil, err
	}
	if err := p.Validate(&Plan{TP: []int{tp}, Modes: []Mode{m}}); err != nil {
		return nil, err
	}
	e.Spec = p.spec(m)
	e.SetPrefixCache(!m.NoPrefixCache)
	ctx, cancel := context.WithCancel(context.Background())
	t := &engineTarget{p: p, sched: engine.NewScheduler(e, engine.SchedulerOptions{}), stop: cancel, done: make(chan struct{})}
	if m.Kind != "auto" {
		t.counts = &SpecCounter{}
	}
	go func() { t.sched.Run(ctx); close(t.done) }()
	return t, nil
}

type engineTarget struct {
	p     *InProcess
	sched *engine.Scheduler
	stop  context.CancelFunc
	done  chan struct{}

	mu     sync.Mutex
	counts *SpecCounter // nil in auto mode
}

func (t *engineTarget) Close() error {
	t.stop()
	<-t.done
	return nil
}

func (t *engineTarget) Generate(ctx context.Context, r Request) (*Response, error) {
	prompt, err := t.p.Prompter.Prompt(r)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	st, err := t.sched.Submit(ctx, engine.Request{
		Prompt: prompt, MaxTokens: r.MaxTokens, IgnoreEOS: r.IgnoreEOS,
		Sampling: engine.SamplingParams{Temperature: r.Temperature, TopP: 1, Seed: r.Seed},
	})
	if err != nil {
		return nil, err
	}
	var chunks []Chunk
	for ev := range st.Events() {
		chunks = append(chunks, Chunk{At: time.Since(start), Tokens: len(ev.Tokens)})
	}
	res, err := st.Wait()
	if err != nil {
		return nil, err
	}
	resp := &Response{
		Chunks: chunks, E2E: time.Since(start), Tokens: res.Tokens, PromptTokens: res.Stats.PromptTokens,
		CachedTokens: res.Stats.CachedTokens, OutputTokens: len(res.Tokens), Finish: res.FinishReason,
	}
	if resp.Text, err = t.p.Prompter.Text(res.Tokens); err != nil {
		return nil, err
	}
	if s := res.Stats.SpecStats; s != nil {
		resp.Spec = &SpecStat{AcceptanceLength: s.AcceptanceLength, VerifySteps: s.VerifySteps}
		t.count(s)
	}
	return resp, nil
}

func (t *engineTarget) count(s *engine.SpecStats) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.counts
	c.Drafts += int64(s.VerifySteps)
	c.DraftTokens += int64(s.DraftTokens)
	c.AcceptedTokens += int64(s.AcceptedTokens)
	for len(c.AcceptedPerPosition) < len(s.AcceptedPerPosition) {
		c.AcceptedPerPosition = append(c.AcceptedPerPosition, 0)
	}
	for i, n := range s.AcceptedPerPosition {
		c.AcceptedPerPosition[i] += int64(n)
	}
}

func (t *engineTarget) SpecCounters(context.Context) (*SpecCounter, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		return nil, nil
	}
	c := *t.counts
	c.AcceptedPerPosition = append([]int64(nil), c.AcceptedPerPosition...)
	return &c, nil
}
