package bench

import (
	"context"
	"ddflash/adaptive"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"time"

	"ddflash/engine"
	"ddflash/kernels"
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
// verify tokens) for the largest configuration of the sweep; Open gives the
// engine the mode's drafter and switches its spec mode while no request is
// in flight.
type InProcess struct {
	// Load loads the target split over tp ranks with weights ("" for the
	// checkpoint's own, or a Plan.Weights value).
	Load func(tp int, weights string) (*engine.Engine, error)
	// Drafter gives a speculative mode its drafter (Mode.Drafter) on an
	// engine Load returned. Every drafter it returns for an engine is
	// closed when the engine is (drafters sharing weights, such as an MTP
	// head's step counts, must tolerate a second Close). Nil: every mode
	// runs the drafter Load attached, and a mode naming another is refused.
	Drafter  func(e *engine.Engine, m Mode) (engine.Drafter, error)
	Prompter Prompter
	Rollback mamba.Strategy
	// DraftDepth caps a draft's proposals (engine.SpecOptions.DraftDepth;
	// 0: the drafter's whole block).
	DraftDepth int
	Threads    int    // 0: all cores
	Device     string // the backend's name, for the record
	// Log, when set, gets each pass's driver calls per target step on a
	// backend that counts them (CUDA): launches, allocations, transfers.
	Log io.Writer

	// The latest degree's engines by weights (or why one failed to load):
	// a degree's engines are closed before the next degree's load, so one
	// degree's are in memory at a time (all its weights: their runs
	// interleave).
	tp      int
	engines map[string]*loaded
	// Per configuration, what lives as long as its engine would in a
	// server, across the configuration's openings (a sweep opens it for
	// every pass): the adaptive mode's policy (its measured costs and
	// calibration) and the spec-decode counters.
	policies map[string]*adaptive.Policy
	counters map[string]*SpecCounter
}

type loaded struct {
	engine *engine.Engine
	err    error
	// drafters are the engine's drafters: the one Load attached and each
	// the Drafter hook gave.
	drafters []engine.Drafter
}

// drafter returns the drafter mode m runs with on the engine.
func (p *InProcess) drafter(l *loaded, m Mode) (engine.Drafter, error) {
	if p.Drafter == nil {
		return l.engine.Drafter, nil
	}
	d, err := p.Drafter(l.engine, m)
	if err == nil && !slices.Contains(l.drafters, d) {
		l.drafters = append(l.drafters, d)
	}
	return d, err
}

// close closes the engine and every drafter of it.
func (l *loaded) close() {
	if l.engine == nil {
		return
	}
	for _, d := range l.drafters {
		if c, ok := d.(interface{ Close() }); ok {
			c.Close()
		}
	}
	l.engine.Drafter = nil // closed above
	l.engine.Close()
}

// Info implements Backend.
func (p *InProcess) Info() BackendInfo { return BackendInfo{Kind: "in-process"} }

// engineFor returns the engine of a configuration's degree and weights,
// loading it on first use.
func (p *InProcess) engineFor(c Config) (*loaded, error) {
	if p.tp != c.TP {
		for _, l := range p.engines {
			l.close() // its device memory goes back before the next degree loads
		}
		p.tp, p.engines = c.TP, map[string]*loaded{}
	}
	l, ok := p.engines[c.Weights]
	if !ok {
		l = &loaded{}
		if l.engine, l.err = p.Load(c.TP, c.Weights); l.engine != nil && l.engine.Drafter != nil {
			l.drafters = []engine.Drafter{l.engine.Drafter}
		}
		p.engines[c.Weights] = l
	}
	return l, l.err
}

// Validate implements Backend. Degrees are checked when their engine loads
// (a degree that does not divide the model becomes that configuration's
// recorded failure); here only what a loaded engine already tells.
func (p *InProcess) Validate(plan *Plan) error {
	for _, m := range plan.Modes {
		if m.Kind == "auto" || p.Drafter != nil {
			continue
		}
		switch m.Drafter {
		case DFlash2Drafter:
			return fmt.Errorf("mode %s runs a DFlash2 drafter: give --draft2 DIR", m.Name)
		case MTPDrafter, ChoiceDrafters:
			return fmt.Errorf("mode %s runs the target's MTP head, which this backend does not load", m.Name)
		}
		for _, l := range p.engines {
			if l.engine != nil && l.engine.Drafter == nil {
				return fmt.Errorf("mode %s speculates and needs a drafter: give --draft DIR, or --modes auto", m.Name)
			}
		}
	}
	return nil
}

// spec is a configuration's decoding. The adaptive mode's policy is the
// configuration's own: it measures its cost curve at the configuration's
// first request and keeps learning across the configuration's openings.
func (p *InProcess) spec(c Config) engine.SpecOptions {
	m := c.Mode
	mode := map[string]engine.SpecMode{"auto": engine.SpecAuto, "linear": engine.SpecLinear, "ddtree": engine.SpecTree, "adaptive": engine.SpecTree}[m.Kind]
	o := engine.SpecOptions{Mode: mode, Budget: m.Budget, Rollback: p.Rollback, DraftDepth: p.draftDepth(m)}
	if m.Drafter == MTPDrafter {
		o.Label = MTPDrafter // SpecStats say which drafter proposed
	}
	if m.Kind == "adaptive" {
		o.Policy = cached(&p.policies, c.Name(), func() *adaptive.Policy { return &adaptive.Policy{Autoregressive: true} })
	}
	return o
}

// draftDepth is the mode's draft depth: its own (-dK), else the sweep's.
func (p *InProcess) draftDepth(m Mode) int {
	if m.Depth > 0 {
		return m.Depth
	}
	return p.DraftDepth
}

// cached returns the map's value for name, made by newValue on first use.
func cached[V any](m *map[string]*V, name string, newValue func() *V) *V {
	if *m == nil {
		*m = map[string]*V{}
	}
	v, ok := (*m)[name]
	if !ok {
		v = newValue()
		(*m)[name] = v
	}
	return v
}

// Knobs implements Backend. It loads the degree's engine to read its sizes;
// when that fails the knobs lack them and Open reports the error.
func (p *InProcess) Knobs(c Config) Knobs {
	m := c.Mode
	k := Knobs{TP: c.TP, Mode: m.Name, Spec: m.Kind, Drafter: m.Drafter, Budget: m.Budget, Weights: c.Weights, Threads: p.Threads, Device: p.Device}
	if k.Threads <= 0 {
		k.Threads = runtime.NumCPU()
	}
	l, err := p.engineFor(c)
	if err != nil {
		return k
	}
	k.Context, k.MaxRunning = l.engine.Context, l.engine.MaxSeqs()
	if m.Kind != "auto" {
		if d, err := p.drafter(l, m); err == nil && d != nil {
			k.Rollback, k.BlockSize = p.Rollback.String(), engine.DraftBlock(d, p.draftDepth(m))
		}
	}
	if m.Kind == "linear" {
		k.Budget = k.BlockSize - 1
	}
	return k
}

// Open implements Backend: it gives the engine the mode's drafter, sets its
// spec mode and starts a scheduler.
func (p *InProcess) Open(c Config) (Target, error) {
	l, err := p.engineFor(c)
	if err != nil {
		return nil, err
	}
	m, e := c.Mode, l.engine
	if err := p.Validate(&Plan{TP: []int{c.TP}, Modes: []Mode{m}}); err != nil {
		return nil, err
	}
	if m.Kind != "auto" {
		if e.Drafter, err = p.drafter(l, m); err != nil {
			return nil, err
		}
	}
	e.Spec = p.spec(c)
	e.SetPrefixCache(!m.NoPrefixCache)
	ctx, cancel := context.WithCancel(context.Background())
	t := &engineTarget{p: p, name: c.Name(), model: e.Model, sched: engine.NewScheduler(e, engine.SchedulerOptions{}), stop: cancel, done: make(chan struct{})}
	if dc, ok := e.Model.Backend().(driverCounter); ok && p.Log != nil {
		t.driver, t.counts0, t.steps0 = dc, dc.Counts(), e.Model.Steps
	}
	if m.Kind != "auto" {
		t.counts = cached(&p.counters, c.Name(), func() *SpecCounter { return &SpecCounter{} })
	}
	if pol := e.Spec.Policy; pol != nil && pol.Autoregressive {
		t.schedule = pol
	}
	go func() { t.sched.Run(ctx); close(t.done) }()
	return t, nil
}

// driverCounter is a backend that tallies its driver calls (CUDA's).
type driverCounter interface{ Counts() kernels.DriverCounts }

type engineTarget struct {
	p     *InProcess
	name  string
	model *engine.Model
	sched *engine.Scheduler
	// With a driverCounter, its reading and the steps run at Open.
	driver  driverCounter
	counts0 kernels.DriverCounts
	steps0  int64
	stop    context.CancelFunc
	done    chan struct{}

	mu     sync.Mutex
	counts *SpecCounter // nil in auto mode
	// schedule is the policy whose probe schedule SpecCounters reads
	// (--spec adaptive), else nil.
	schedule *adaptive.Policy
}

func (t *engineTarget) Close() error {
	t.stop()
	<-t.done
	if t.driver != nil {
		steps := t.model.Steps - t.steps0
		fmt.Fprintf(t.p.Log, "%s: driver calls per step (draft, forward and commit; %d steps): %v\n", t.name, steps,
			t.driver.Counts().Sub(t.counts0).Per(steps))
	}
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
	if t.schedule != nil {
		s := t.schedule.Snapshot().Schedule
		c.Schedule = &ScheduleCounter{Probes: int64(s.Probes), Resumes: int64(s.Resumes), Stops: int64(s.Stops), Relapses: int64(s.Relapses)}
	}
	return &c, nil
}
