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
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Options configure a sweep.
type Options struct {
	Plan    *Plan
	Backend Backend
	Store   Store
	Resume  bool
	Argv    []string // the command line, recorded and used in rerun advice
	// ModelDir, DraftDir and DFlash2Dir (the dflash2 and d2bN modes'
	// drafter) are hashed into every record; empty for a remote server
	// whose checkpoint is not at hand.
	ModelDir, DraftDir, DFlash2Dir string
	Temperature                    float64
	Seed                           uint64
	IgnoreEOS                      bool
	Thinking                       bool
	Raw                            bool          // prompts as plain text (Request.Raw)
	RequestTimeout                 time.Duration // 0: none
	GPUs                           GPUReader
	Log                            io.Writer // progress and one line per saved run
	// Interleave measures run by run, the configurations' passes in turn
	// (see interleaved), rather than configuration by configuration.
	Interleave bool
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
	s := &sweeper{o: o, records: map[string]*Record{}, baselines: map[Config]*Record{}}
	if err := s.prepare(); err != nil {
		return nil, err
	}
	for _, g := range s.groups() {
		if err := s.group(ctx, g); err != nil {
			return &s.sum, err
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
	records   map[string]*Record // by configuration, as on disk
	baselines map[Config]*Record // the auto record by baselineKey
	progress  *progress
	sum       Summary
}

func now() time.Time { return time.Now().UTC() }

// configs names the plan's configurations.
func (s *sweeper) configs() []string {
	var names []string
	for _, c := range s.o.Plan.Configs() {
		names = append(names, c.Name())
	}
	return names
}

// baselineKey keys a configuration's autoregressive baseline: the same TP
// degree and weights.
func baselineKey(c Config) Config { return Config{TP: c.TP, Weights: c.Weights} }

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
	sw, err := st.ReadManifest()
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
	want := &Manifest{Schema: ManifestSchema, Created: now(), Argv: s.o.Argv, Configs: s.configs(), Plan: plan.Runs()}
	if sw != nil && (!slices.Equal(sw.Configs, want.Configs) || !slices.Equal(sw.Plan, want.Plan)) {
		return fmt.Errorf("%s holds a different sweep (started as: %s); resume it with the same modes, TP degrees, workloads, lengths and concurrency, or choose another --out",
			st.Dir, strings.Join(sw.Argv, " "))
	}
	if s.base, err = s.baseSetup(); err != nil {
		return err
	}
	if sw == nil {
		if err := st.WriteManifest(want); err != nil {
			return err
		}
	}
	total, runs := 0.0, 0
	for _, c := range plan.Configs() {
		name := c.Name()
		rec, err := st.ReadRecord(name)
		if err != nil {
			return fmt.Errorf("%w\ndelete that file to measure the configuration again", err)
		}
		if rec != nil {
			if diff := setupDiff(rec.Setup, s.setup(c)); len(diff) > 0 {
				return fmt.Errorf("%s was measured with a different setup (%s differ); resuming would mix incomparable numbers: use another --out, or delete it to measure again",
					st.resultPath(name), strings.Join(diff, ", "))
			}
			s.records[name] = rec
			if c.Mode.baseline() {
				s.baselines[baselineKey(c)] = rec
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
	for _, c := range []struct {
		dir string
		dst **Checkpoint
	}{{s.o.DraftDir, &set.Drafter}, {s.o.DFlash2Dir, &set.DFlash2}} {
		if c.dir != "" {
			if *c.dst, err = HashCheckpoint(c.dir); err != nil {
				return set, err
			}
		}
	}
	for _, w := range s.o.Plan.Workloads {
		set.Workloads = append(set.Workloads, w.Info())
	}
	set.Plan = s.o.Plan.Runs()
	return set, nil
}

// setup is a configuration's full setup: the shared part and its knobs.
func (s *sweeper) setup(c Config) Setup {
	set := s.base
	k := s.o.Backend.Knobs(c)
	k.Temperature, k.Seed, k.IgnoreEOS, k.EnableThinking, k.RawPrompts = s.o.Temperature, s.o.Seed, s.o.IgnoreEOS, s.o.Thinking, s.o.Raw
	k.Repeats, k.Warmup = s.o.Plan.Repeats, s.o.Plan.Warmup
	set.Knobs = k
	return set
}

// setupDiff lists the fields (as JSON paths) in which two setups differ,
// ignoring checkpoint paths: a model moved off tmpfs is the same model.
func setupDiff(a, b Setup) []string {
	norm := func(s Setup) any {
		for _, c := range []**Checkpoint{&s.Model, &s.Drafter, &s.DFlash2} {
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
	keys := maps.Clone(am)
	maps.Copy(keys, bm)
	for _, k := range slices.Sorted(maps.Keys(keys)) {
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

// groups splits the plan's configurations into those measured together,
// their runs' passes in turn: a (TP, mode) pair's weights variants, or with
// Interleave every configuration of a TP degree.
func (s *sweeper) groups() [][]Config {
	configs, size := s.o.Plan.Configs(), len(s.o.Plan.WeightsList())
	if s.o.Interleave {
		size *= len(s.o.Plan.Modes)
	}
	var out [][]Config
	for i := 0; i < len(configs); i += size {
		out = append(out, configs[i:i+size])
	}
	return out
}

// member is a configuration of a group being measured.
type member struct {
	c    Config
	rec  *Record // nil until its first run is saved
	fail *Failure
}

// group measures the unfinished runs of a group's configurations run by
// run, the passes of each run in turn across them (every configuration's
// first pass, then every second pass, ..., each round starting one
// configuration further on), each configuration opened for its pass. On a
// machine whose load changes while the sweep runs, every configuration of
// a run meets the same load, so their ratios hold. Each finished run is
// saved at once.
func (s *sweeper) group(ctx context.Context, cs []Config) error {
	var members []*member
	for _, c := range cs {
		m := &member{c: c, rec: s.records[c.Name()]}
		if slices.ContainsFunc(s.o.Plan.Runs(), func(k RunKey) bool { return !m.rec.has(k) }) {
			m.fail = &Failure{Head: Head{Schema: FailureSchema, Config: c.Name(), Setup: s.setup(c), Argv: s.o.Argv}}
			members = append(members, m)
		}
	}
	for _, key := range s.o.Plan.Runs() {
		var cells []*cell
		for _, m := range members {
			if !m.rec.has(key) {
				cells = append(cells, &cell{m: m})
			}
		}
		start := s.progress.position()
		for pass := range s.o.Plan.Repeats {
			// Each pass starts with the next configuration: whatever a
			// configuration leaves behind falls on every other one alike.
			for i := range cells {
				if err := s.cellPass(ctx, key, cells[(pass+i)%len(cells)]); err != nil {
					s.progress.finish(start + float64(len(cells))*s.runUnits(key))
					return err
				}
			}
		}
		for i, c := range cells {
			s.progress.finish(start + float64(i+1)*s.runUnits(key))
			var run *measuredRun
			rf := c.failure
			if rf == nil {
				run, rf = c.run.finish()
			}
			if err := s.record(c.m, run, rf); err != nil {
				return err
			}
		}
	}
	for _, m := range members {
		if len(m.fail.Failures) == 0 {
			if err := s.o.Store.ClearFailure(m.c.Name()); err != nil {
				return err
			}
		}
	}
	return nil
}

// cell is one configuration's run in a group: in progress, or failed.
type cell struct {
	m       *member
	run     *measuring
	failure *RunFailure
}

// cellPass opens the cell's configuration and measures its next pass,
// warming up first on its first. A cell that failed is skipped; err is set
// only when the sweep must stop (interrupted).
func (s *sweeper) cellPass(ctx context.Context, key RunKey, c *cell) error {
	if c.failure != nil || (c.run != nil && c.run.firstErr != nil) {
		return nil
	}
	s.progress.begin(c.m.c.Name() + " " + key.String())
	t, err := s.o.Backend.Open(c.m.c)
	if err != nil {
		c.failure = &RunFailure{RunKey: key, At: now(), Error: err.Error()}
		return nil
	}
	defer t.Close()
	if c.run == nil {
		if c.run, c.failure, err = s.startRun(ctx, t, key); c.run == nil {
			return err
		}
	}
	return c.run.pass(ctx, t)
}

// record writes a member's run: its trace and record, or its failure.
func (s *sweeper) record(m *member, run *measuredRun, rf *RunFailure) error {
	if rf != nil {
		return s.failed(m.fail, *rf)
	}
	name, key := m.c.Name(), run.RunKey
	var err error
	if run.Trace, err = s.o.Store.WriteTrace(name, key, run.trace); err != nil {
		return err
	}
	if m.rec == nil {
		m.rec = &Record{Head: Head{Schema: ResultSchema, Config: name, Setup: m.fail.Setup}, Created: now()}
	}
	if err := s.save(m.rec, m.c, run); err != nil {
		return err
	}
	s.sum.Saved++
	s.progress.printf("saved %s %s: %.1f tok/s%s%s%s", name, key, run.Metrics.OutputThroughput, tauText(run.Metrics.AcceptanceLength), scheduleText(run.Metrics.SpecDecode), s.weightsText(m.c, &run.Run))
	return nil
}

// weightsText compares a run with other than the checkpoint's weights with
// the same configuration's run on the checkpoint's weights (TPOT ratio).
func (s *sweeper) weightsText(c Config, run *Run) string {
	if c.Weights == "" {
		return ""
	}
	base := s.records[Config{TP: c.TP, Mode: c.Mode}.Name()]
	if base == nil {
		return ""
	}
	i := slices.IndexFunc(base.Runs, func(b Run) bool { return b.RunKey == run.RunKey })
	if i < 0 {
		return ""
	}
	return ", " + optFloat(speedup(&base.Runs[i].Metrics, &run.Metrics), "%.2fx") + " the checkpoint's weights' decode speed"
}

func tauText(tau *float64) string {
	if tau == nil {
		return ""
	}
	return fmt.Sprintf(", τ %.2f", *tau)
}

// scheduleText is the adaptive probe schedule's part of a run's line: its
// probes, those that resumed drafting, and the back-off where the run ended.
func scheduleText(c *SpecCounter) string {
	if c == nil || c.Schedule == nil {
		return ""
	}
	s := c.Schedule
	return fmt.Sprintf(", %d probes (%d resumed drafting), %d stops, relapses %d", s.Probes, s.Resumes, s.Stops, s.Relapses)
}

// failed adds a run failure to the configuration's failure file.
func (s *sweeper) failed(f *Failure, rf RunFailure) error {
	f.Failures = append(f.Failures, rf)
	f.Updated = now()
	s.sum.Failed = append(s.sum.Failed, fmt.Sprintf("%s %s: %s", f.Config, rf.RunKey, rf.Error))
	s.progress.printf("FAILED %s %s: %s", f.Config, rf.RunKey, rf.Error)
	return s.o.Store.WriteFailure(f)
}

// save adds a run to the record, with its speedup over the baseline (the
// same degree and weights' autoregressive run), and writes the record.
func (s *sweeper) save(rec *Record, c Config, run *measuredRun) error {
	if c.Mode.baseline() {
		s.baselines[baselineKey(c)] = rec
		run.Metrics.Speedup = speedup(&run.Metrics, &run.Metrics)
	} else if base := s.baselines[baselineKey(c)]; base != nil {
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
