// Package bench is ddflash's benchmark harness: sweeps over decoding modes,
// TP degrees, output lengths, workloads and concurrency, in-process or
// against an OpenAI-compatible server, whose results cannot lie. Every
// finished run is saved at once and atomically, a killed sweep resumes where
// it stopped, failed runs are written as failures (never as results), and
// every file carries a checksum that verify re-checks.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Options configure a sweep.
type Options struct {
	Plan    *Plan
	Backend Backend
	Store   Store
	Resume  bool
	Argv    []string // the command line, recorded and used in rerun advice
	// ModelDir and DraftDir are hashed into every record; empty for a
	// remote server whose checkpoint is not at hand.
	ModelDir, DraftDir string
	Temperature        float64
	Seed               uint64
	IgnoreEOS          bool
	Thinking           bool
	RequestTimeout     time.Duration // 0: none
	GPUs               GPUReader
	Log                io.Writer // progress and one line per saved run
}

// Summary is what a sweep did.
type Summary struct {
	Saved, Skipped int      // runs measured now, runs found done
	Failed         []string // "config run: error", one per failed run
}

// Sweep runs every configuration's unfinished runs. It returns an error
// when a run failed (after finishing the others), when the results
// directory belongs to a different sweep, or when ctx is cancelled.
func Sweep(ctx context.Context, o Options) (*Summary, error) {
	if err := o.Backend.Validate(o.Plan); err != nil {
		return nil, err
	}
	s := &sweeper{o: o, records: map[string]*Record{}, baselines: map[int]*Record{}}
	if err := s.prepare(); err != nil {
		return nil, err
	}
	for _, tp := range o.Plan.TP {
		for _, m := range o.Plan.Modes {
			if err := s.config(ctx, tp, m); err != nil {
				return &s.sum, err
			}
		}
	}
	if n := len(s.sum.Failed); n > 0 {
		return &s.sum, fmt.Errorf("%d run(s) failed and were written as *.failure.json, not as results:\n  %s\nfix the cause, then rerun with --resume",
			n, strings.Join(s.sum.Failed, "\n  "))
	}
	return &s.sum, nil
}

type sweeper struct {
	o         Options
	base      Setup              // the setup shared by every configuration
	created   time.Time          // of the sweep
	records   map[string]*Record // by configuration, as on disk
	baselines map[int]*Record    // the auto record per TP degree
	progress  *progress
	sum       Summary
}

func now() time.Time { return time.Now().UTC() }

// configs lists the plan's configurations with their modes.
func (s *sweeper) configs() []string {
	var names []string
	for _, tp := range s.o.Plan.TP {
		for _, m := range s.o.Plan.Modes {
			names = append(names, ConfigName(tp, m))
		}
	}
	return names
}

// prepare checks the results directory against the plan, reads what a
// previous invocation left, describes the environment and sizes the progress.
func (s *sweeper) prepare() error {
	st, plan := s.o.Store, s.o.Plan
	if err := os.MkdirAll(st.Dir, 0o755); err != nil {
		return err
	}
	if err := st.RemoveTemps(); err != nil {
		return err
	}
	sw, err := st.ReadSweep()
	if err != nil {
		return fmt.Errorf("%w; move the directory aside and start again, or choose another --out", err)
	}
	results, failures, err := st.Entries()
	if err != nil {
		return err
	}
	if !s.o.Resume && (sw != nil || len(results)+len(failures) > 0) {
		return fmt.Errorf("%s already holds a sweep: pass --resume to continue it, or choose another --out", st.Dir)
	}
	want := &Sweep{Schema: SweepSchema, Created: now(), Argv: s.o.Argv, Configs: s.configs(), Plan: plan.Runs()}
	if sw != nil {
		if !slices.Equal(sw.Configs, want.Configs) || !slices.Equal(sw.Plan, want.Plan) {
			return fmt.Errorf("%s holds a different sweep (started as: %s); resume it with the same modes, TP degrees, workloads, lengths and concurrency, or choose another --out",
				st.Dir, strings.Join(sw.Argv, " "))
		}
		want = sw
	} else if err := st.WriteSweep(want); err != nil {
		return err
	}
	s.created = want.Created
	if s.base, err = s.baseSetup(); err != nil {
		return err
	}
	total, runs := 0.0, 0
	for _, tp := range plan.TP {
		for _, m := range plan.Modes {
			name := ConfigName(tp, m)
			rec, err := st.ReadRecord(name)
			if err != nil {
				return fmt.Errorf("%w\ndelete that file to measure the configuration again", err)
			}
			if rec != nil {
				if diff := setupDiff(rec.Setup, s.setup(tp, m)); len(diff) > 0 {
					return fmt.Errorf("%s was measured with a different setup (%s differ); resuming would mix incomparable numbers: use another --out, or delete it to measure again",
						st.resultPath(name), strings.Join(diff, ", "))
				}
				s.records[name] = rec
				if m.Kind == "auto" {
					s.baselines[tp] = rec
				}
			}
			for _, key := range plan.Runs() {
				if rec.has(key) {
					s.sum.Skipped++
					continue
				}
				total += s.runUnits(key)
				runs++
			}
		}
	}
	s.progress = newProgress(s.o.Log, total, runs)
	return nil
}

// baseSetup describes what every configuration shares.
func (s *sweeper) baseSetup() (Setup, error) {
	var set Setup
	var err error
	if set.Binary, err = ReadBinary(); err != nil {
		return set, err
	}
	set.Host = ReadHost(s.o.GPUs)
	set.Backend = s.o.Backend.Info()
	if s.o.ModelDir != "" {
		if set.Model, err = HashCheckpoint(s.o.ModelDir); err != nil {
			return set, err
		}
	}
	if s.o.DraftDir != "" {
		if set.Drafter, err = HashCheckpoint(s.o.DraftDir); err != nil {
			return set, err
		}
	}
	for _, w := range s.o.Plan.Workloads {
		set.Workloads = append(set.Workloads, w.Info())
	}
	set.Plan = s.o.Plan.Runs()
	return set, nil
}

// setup is a configuration's full setup: the shared part and its knobs.
func (s *sweeper) setup(tp int, m Mode) Setup {
	set := s.base
	k := s.o.Backend.Knobs(tp, m)
	k.Temperature, k.Seed, k.IgnoreEOS, k.EnableThinking = s.o.Temperature, s.o.Seed, s.o.IgnoreEOS, s.o.Thinking
	k.Repeats, k.Warmup = s.o.Plan.Repeats, s.o.Plan.Warmup
	set.Knobs = k
	return set
}

// setupDiff lists the fields (as JSON paths) in which two setups differ,
// ignoring checkpoint paths: a model moved off tmpfs is the same model.
func setupDiff(a, b Setup) []string {
	norm := func(s Setup) any {
		for _, c := range []**Checkpoint{&s.Model, &s.Drafter} {
			if *c != nil {
				cp := **c
				cp.Path = ""
				*c = &cp
			}
		}
		data, _ := json.Marshal(s) // a Setup holds no unencodable values
		var v any
		_ = json.Unmarshal(data, &v)
		return v
	}
	var out []string
	diffJSON("setup", norm(a), norm(b), &out)
	return out
}

func diffJSON(path string, a, b any, out *[]string) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if !reflect.DeepEqual(a, b) {
			*out = append(*out, path)
		}
		return
	}
	keys := map[string]bool{}
	for k := range am {
		keys[k] = true
	}
	for k := range bm {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		diffJSON(path+"."+k, am[k], bm[k], out)
	}
}

// has reports whether the record holds a run; a nil record holds none.
func (r *Record) has(key RunKey) bool {
	return r != nil && slices.ContainsFunc(r.Runs, func(run Run) bool { return run.RunKey == key })
}

// requests is the number of requests one pass of a run sends.
func (s *sweeper) requests(key RunKey) int {
	n := 0
	for _, c := range s.o.Plan.Workload(key.Workload).passConversations(key.Concurrency) {
		n += len(c)
	}
	return n
}

// runUnits is a run's planned work in output tokens, warmup included.
func (s *sweeper) runUnits(key RunKey) float64 {
	return float64((s.o.Plan.Warmup + s.o.Plan.Repeats*s.requests(key)) * key.MaxTokens)
}

// config measures a configuration's unfinished runs, saving each at once.
func (s *sweeper) config(ctx context.Context, tp int, m Mode) error {
	name := ConfigName(tp, m)
	rec := s.records[name]
	var todo []RunKey
	for _, key := range s.o.Plan.Runs() {
		if !rec.has(key) {
			todo = append(todo, key)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	setup := s.setup(tp, m)
	fail := &Failure{Schema: FailureSchema, Config: name, Setup: setup, Argv: s.o.Argv}
	target, err := s.o.Backend.Open(tp, m)
	if err != nil {
		for _, key := range todo {
			s.progress.finish(s.progress.position() + s.runUnits(key))
			if err := s.failed(fail, RunFailure{RunKey: key, At: now(), Error: err.Error()}); err != nil {
				return err
			}
		}
		return nil
	}
	defer target.Close()
	for _, key := range todo {
		label := name + " " + key.String()
		s.progress.begin(label)
		end := s.progress.position() + s.runUnits(key)
		run, rf, err := s.run(ctx, target, key)
		s.progress.finish(end)
		if err != nil {
			return err
		}
		if rf != nil {
			if err := s.failed(fail, *rf); err != nil {
				return err
			}
			continue
		}
		if run.Trace, err = s.o.Store.WriteTrace(name, key, run.trace); err != nil {
			return err
		}
		if rec == nil {
			rec = &Record{Schema: ResultSchema, Config: name, Setup: setup, Created: now()}
		}
		if err := s.save(rec, tp, m, run); err != nil {
			return err
		}
		s.sum.Saved++
		s.progress.printf("saved %s %s: %.1f tok/s%s", name, key, run.Metrics.OutputThroughput, tauText(run.Metrics.AcceptanceLength))
	}
	if len(fail.Failures) == 0 {
		return s.o.Store.ClearFailure(name)
	}
	return nil
}

func tauText(tau *float64) string {
	if tau == nil {
		return ""
	}
	return fmt.Sprintf(", τ %.2f", *tau)
}

// failed adds a run failure to the configuration's failure file.
func (s *sweeper) failed(f *Failure, rf RunFailure) error {
	f.Failures = append(f.Failures, rf)
	f.Updated = now()
	s.sum.Failed = append(s.sum.Failed, fmt.Sprintf("%s %s: %s", f.Config, rf.RunKey, rf.Error))
	s.progress.printf("FAILED %s %s: %s", f.Config, rf.RunKey, rf.Error)
	return s.o.Store.WriteFailure(f)
}

// save adds a run to the record, with its speedup over the baseline, and
// writes the record.
func (s *sweeper) save(rec *Record, tp int, m Mode, run *measuredRun) error {
	if m.Kind == "auto" {
		s.baselines[tp] = rec
		run.Metrics.Speedup = speedup(&run.Metrics, &run.Metrics)
	} else if base := s.baselines[tp]; base != nil {
		if i := slices.IndexFunc(base.Runs, func(b Run) bool { return b.RunKey == run.RunKey }); i >= 0 {
			run.Metrics.Speedup = speedup(&base.Runs[i].Metrics, &run.Metrics)
		}
	}
	rec.Runs = append(rec.Runs, run.Run)
	order := s.o.Plan.Runs()
	slices.SortFunc(rec.Runs, func(a, b Run) int {
		return cmp.Compare(slices.Index(order, a.RunKey), slices.Index(order, b.RunKey))
	})
	rec.Argv, rec.Updated = s.o.Argv, now()
	rec.Complete = len(rec.Runs) == len(order)
	s.records[rec.Config] = rec
	return s.o.Store.WriteRecord(rec)
}

// measuredRun is a valid run with its trace, not yet written.
type measuredRun struct {
	Run
	trace []TraceRequest
}

// run measures one run. A run that cannot be measured returns a failure;
// err is set only when the sweep must stop (interrupted).
func (s *sweeper) run(ctx context.Context, t Target, key RunKey) (*measuredRun, *RunFailure, error) {
	plan := s.o.Plan
	convs := plan.Workload(key.Workload).passConversations(key.Concurrency)
	requested := plan.Repeats * s.requests(key)
	failure := func(err error, completed, failed int) *RunFailure {
		return &RunFailure{RunKey: key, At: now(), Error: err.Error(), Requested: requested, Completed: completed, Failed: failed}
	}
	for range plan.Warmup {
		if _, err := s.generate(ctx, t, []Message{{Role: "user", Content: convs[0][0]}}, key.MaxTokens); err != nil {
			if ctx.Err() != nil {
				return nil, nil, interrupted(ctx)
			}
			return nil, failure(fmt.Errorf("warmup request: %w", err), 0, 0), nil
		}
		s.progress.add(float64(key.MaxTokens))
	}
	before, err := t.SpecCounters(ctx)
	if err != nil {
		return nil, failure(fmt.Errorf("read spec-decode counters: %w", err), 0, 0), nil
	}
	run := &measuredRun{Run: Run{RunKey: key, EnableThinking: s.o.Thinking, Started: now(), Requested: requested}}
	var tel Telemetry
	tel.Before, tel.Note = telemetry(s.o.GPUs)
	var passes []pass
	var firstErr error
	for p := range plan.Repeats {
		ps, nfailed, err := s.pass(ctx, t, convs, key)
		if ctx.Err() != nil {
			return nil, nil, interrupted(ctx)
		}
		run.Failed += nfailed
		run.Completed += len(ps.reqs)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if ps.specAfter, err = t.SpecCounters(ctx); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("read spec-decode counters: %w", err)
		}
		for i := range ps.reqs {
			ps.reqs[i].pass = p
		}
		passes = append(passes, ps)
	}
	tel.After, _ = telemetry(s.o.GPUs)
	if firstErr != nil || run.Completed != requested {
		if firstErr == nil {
			firstErr = errors.New("requests went missing")
		}
		return nil, failure(fmt.Errorf("%d of %d requests completed, %d failed; first error: %w", run.Completed, requested, run.Failed, firstErr), run.Completed, run.Failed), nil
	}
	run.Metrics, run.Samples = computeMetrics(passes, before)
	if tput := run.Metrics.OutputThroughput; !(tput > 0) || math.IsInf(tput, 0) {
		return nil, failure(fmt.Errorf("output throughput %v tok/s: nothing was generated", tput), run.Completed, 0), nil
	}
	var all []measured
	for _, p := range passes {
		all = append(all, p.reqs...)
		run.DurationS += p.wall.Seconds()
	}
	run.TokenCounts = "exact"
	for _, m := range all {
		run.InputTokens += m.resp.PromptTokens
		run.OutputTokens += m.resp.OutputTokens
		if m.resp.Chunks[0].Tokens == 0 {
			run.TokenCounts = "estimated"
		}
		run.trace = append(run.trace, traceRequest(m))
	}
	run.OutputsSHA256 = outputsHash(all)
	run.Telemetry = tel
	return run, nil, nil
}

func interrupted(ctx context.Context) error {
	return fmt.Errorf("interrupted (%v): the run in progress was dropped, finished runs are saved; continue with --resume", context.Cause(ctx))
}

func traceRequest(m measured) TraceRequest {
	r := m.resp
	t := TraceRequest{
		Pass: m.pass, Conversation: m.conversation, Turn: m.turn, StartMs: millis(m.start),
		TTFTMs: millis(m.ttft()), E2EMs: millis(r.E2E), PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens,
		Finish: r.Finish, Tokens: r.Tokens, Text: r.Text, Spec: r.Spec,
	}
	for _, c := range r.Chunks {
		t.Chunks = append(t.Chunks, TraceChunk{Ms: millis(c.At), Tokens: c.Tokens})
	}
	return t
}

// pass sends every conversation once, at most concurrency at a time, each
// conversation's turns in order. It returns the successful requests in
// order, the number that failed or were never sent after a failed turn, and
// the first error.
func (s *sweeper) pass(ctx context.Context, t Target, convs [][]string, key RunKey) (pass, int, error) {
	var (
		mu       sync.Mutex
		reqs     []measured
		failed   int
		firstErr error
		wg       sync.WaitGroup
	)
	slots := make(chan struct{}, key.Concurrency)
	start := time.Now()
	for ci, conv := range convs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			var msgs []Message
			for turn, text := range conv {
				msgs = append(msgs, Message{Role: "user", Content: text})
				sent := time.Since(start)
				resp, err := s.generate(ctx, t, msgs, key.MaxTokens)
				s.progress.add(float64(key.MaxTokens))
				mu.Lock()
				if err != nil {
					failed += len(conv) - turn
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				reqs = append(reqs, measured{conversation: ci, turn: turn, start: sent, resp: resp})
				mu.Unlock()
				msgs = append(msgs, Message{Role: "assistant", Content: resp.Text})
			}
		})
	}
	wg.Wait()
	slices.SortFunc(reqs, func(a, b measured) int {
		return cmp.Or(cmp.Compare(a.conversation, b.conversation), cmp.Compare(a.turn, b.turn))
	})
	return pass{wall: time.Since(start), reqs: reqs}, failed, firstErr
}

// generate sends one request and rejects an empty answer.
func (s *sweeper) generate(ctx context.Context, t Target, msgs []Message, maxTokens int) (*Response, error) {
	if s.o.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.o.RequestTimeout)
		defer cancel()
	}
	resp, err := t.Generate(ctx, Request{
		Messages: msgs, MaxTokens: maxTokens, Temperature: s.o.Temperature, Seed: s.o.Seed,
		IgnoreEOS: s.o.IgnoreEOS, EnableThinking: s.o.Thinking,
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Chunks) == 0 || resp.OutputTokens == 0 {
		return nil, errors.New("empty completion: the server answered but streamed no tokens")
	}
	return resp, nil
}
