package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"ddflash/bench"
	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/fp8"
	"ddflash/engine/gpu"
	"ddflash/mamba"
	"ddflash/mtp"
	"ddflash/tokenizer"
)

func init() {
	register("bench", "benchmark sweeps over decoding modes; 'bench verify DIR', 'bench report DIR'", runBench)
}

func runBench(args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "verify":
			return runBenchVerify(args[1:])
		case "report":
			return runBenchReport(args[1:])
		}
	}
	return runBenchSweep(args)
}

func runBenchSweep(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: ddflash bench [flags]             run or resume a sweep
       ddflash bench verify DIR         re-check every result file; say what to rerun
       ddflash bench report [--out PREFIX] DIR...   markdown, CSV, SVG and benchstat output

A sweep measures every (--tp, --weights, --modes) configuration on every
(--max-tokens, --workloads, --concurrency) run, in-process on --model/--draft
or against an OpenAI-compatible server with --url. Each finished run is saved
at once (DIR/tp1-b15.json, DIR/tp1-fp8-b15.json); failed runs go to
DIR/tp1-b15.failure.json.`)
		fs.PrintDefaults()
	}
	// The model flags, less --spec, --budget, --max-budget, --mtp-steps and
	// --tp: a sweep's modes and degrees set those.
	var mf modelFlags
	all := flag.NewFlagSet("", flag.ContinueOnError)
	mf.register(all)
	all.VisitAll(func(f *flag.Flag) {
		if !slices.Contains([]string{"spec", "budget", "max-budget", "mtp-steps", "tp"}, f.Name) {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	mf.registerCacheDtypes(fs)
	modes := fs.String("modes", "auto,linear,b8,b12,b15,b16,b32,b64", "decoding modes: auto (the baseline), linear (DFlash chain), bN (DDTree, N nodes), adaptive (tree size chosen every step, up to 32 nodes), dflash2 and d2bN (linear and bN with the --draft2 drafter), mtpN (the target's own MTP head, N steps; needs no --draft)")
	draft2 := fs.String("draft2", "", "in-process: a DFlash2 drafter directory for the dflash2 and d2bN modes, measured beside --draft's")
	tps := fs.String("tp", "1", "tensor-parallel degrees (in-process: each loads the target split over that many ranks; with --url, a label)")
	weights := fs.String("weights", "checkpoint", "in-process: the target's weights, checkpoint (its own) and/or fp8 (quantised to block-scaled FP8 at load, as ddflash quantize writes it, into a temporary directory); several are loaded together and their runs interleaved pass by pass, and report compares each with the checkpoint's")
	maxTokens := fs.String("max-tokens", "256,1024", "output lengths")
	workloads := fs.String("workloads", "fibonacci,math,prose,chat", "built-in workloads and/or z-lab .jsonl files of {\"turns\": [...]}")
	numPrompts := fs.Int("num-prompts", 0, "use each workload's first N conversations (0: all)")
	concurrency := fs.String("concurrency", "1", "requests in flight")
	repeats := fs.Int("repeats", 3, "measured passes over each run's requests")
	warmup := fs.Int("warmup", 1, "unmeasured requests before each run")
	out := fs.String("out", "bench_results", "results directory")
	resume := fs.Bool("resume", false, "continue the sweep in --out, skipping finished runs")
	interleave := fs.Bool("interleave", false, "measure run by run, the modes' passes in turn (each mode reopened for its pass), so that a machine's changing load falls on every mode alike")
	thinking := fs.Bool("thinking", false, "enable_thinking for the chat template (recorded; it changes acceptance)")
	raw := fs.Bool("raw", false, "send each conversation as plain text for completion, not through the chat template (base models such as the default pair; /v1/completions with --url)")
	ignoreEOS := fs.Bool("ignore-eos", true, "generate max tokens even past end-of-sequence")
	temperature := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	seed := fs.Uint64("seed", 0, "sampling seed")
	timeout := fs.Duration("request-timeout", 10*time.Minute, "fail a request that takes longer")
	url := fs.String("url", "", "benchmark this OpenAI-compatible server (ddflash, vLLM, SGLang) instead of loading --model")
	servedModel := fs.String("served-model", "", "with --url: the model name to request (default: the server's first)")
	apiKey := fs.String("api-key", os.Getenv("OPENAI_API_KEY"), "with --url: bearer token (default $OPENAI_API_KEY)")
	prefixSlots := fs.Int("prefix-cache-slots", 0, "in-process: GDN checkpoints of the engine's prefix cache (0: none); modes ending in -nocache run with it off, e.g. --modes auto,auto-nocache")
	gpuMem := fs.String("gpu-mem", "", "in-process: size each degree's engine by serve's memory plan in this memory, e.g. 64GiB (on --device cuda the GPU's by default; on the CPU, without it, room for the largest concurrency at full context)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommands: verify, report)", fs.Arg(0))
	}
	plan, err := parsePlan(*modes, *tps, *maxTokens, *workloads, *concurrency, *numPrompts, *repeats, *warmup)
	if err != nil {
		return err
	}
	if plan.Weights, err = bench.ParseWeights(*weights); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var backend bench.Backend
	if *url != "" {
		if backend, err = bench.NewOpenAI(ctx, *url, *servedModel, *apiKey); err != nil {
			return err
		}
	} else {
		var ip *bench.InProcess
		var cleanup func()
		if ip, cleanup, err = inProcessBackend(&mf, *draft2, plan, fs, *gpuMem, *prefixSlots); err != nil {
			return err
		}
		defer cleanup()
		backend = ip
	}
	sum, err := bench.Sweep(ctx, bench.Options{
		Plan: plan, Backend: backend, Store: bench.Store{Dir: *out}, Resume: *resume, Interleave: *interleave,
		Argv:     append([]string{"ddflash", "bench"}, args...),
		ModelDir: mf.model, DraftDir: mf.draft, DFlash2Dir: *draft2,
		Temperature: *temperature, Seed: *seed, IgnoreEOS: *ignoreEOS, Thinking: *thinking, Raw: *raw,
		RequestTimeout: *timeout, GPUs: bench.NVML(), Log: os.Stderr,
	})
	if sum != nil {
		fmt.Fprintf(os.Stderr, "%d run(s) measured, %d already done; results in %s (ddflash bench report %s)\n", sum.Saved, sum.Skipped, *out, *out)
	}
	return err
}

func parsePlan(modes, tps, maxTokens, workloads, concurrency string, numPrompts, repeats, warmup int) (*bench.Plan, error) {
	if repeats < 1 || warmup < 0 || numPrompts < 0 {
		return nil, fmt.Errorf("--repeats %d, --warmup %d, --num-prompts %d: want repeats ≥ 1 and the others ≥ 0", repeats, warmup, numPrompts)
	}
	p := &bench.Plan{Repeats: repeats, Warmup: warmup}
	var err error
	if p.Modes, err = bench.ParseModes(modes); err != nil {
		return nil, err
	}
	if p.TP, err = bench.ParseInts("tp", tps); err != nil {
		return nil, err
	}
	if p.MaxTokens, err = bench.ParseInts("max-tokens", maxTokens); err != nil {
		return nil, err
	}
	if p.Concurrency, err = bench.ParseInts("concurrency", concurrency); err != nil {
		return nil, err
	}
	if p.Workloads, err = bench.LoadWorkloads(workloads, numPrompts); err != nil {
		return nil, err
	}
	return p, nil
}

// benchSizing sizes an in-process engine for running requests as serve
// does, by the memory plan (planEngine, Plan.EngineOptions) in gpuMem or,
// on a GPU, the GPU's memory; on the CPU without gpuMem, with room for
// running requests at full context (a plan would take the host's memory).
func benchSizing(mf *modelFlags, fs *flag.FlagSet, running int, gpuMem string, prefixSlots int) (engine.Options, error) {
	if gpuMem == "" && mf.device == "cpu" {
		sizing, err := mf.unplannedSizing(running)
		sizing.PrefixSlots = prefixSlots
		return sizing, err
	}
	var memory planFlags
	memory.kvDtype, memory.convDtype, memory.ssmDtype = mf.kvDtype, mf.convDtype, mf.ssmDtype
	memory.prefixSlots = prefixSlots
	_, p, err := planEngine(mf, memory, fs, running, func() (gpu.Device, error) { return planDevice(gpuMem, mf.device) })
	if err != nil {
		return engine.Options{}, err
	}
	if err := p.Fits(); err != nil {
		return engine.Options{}, err
	}
	return p.EngineOptions()
}

// inProcessBackend loads the target (by default the embedded pair) once
// per degree and weights, sized for the sweep's largest verify and
// concurrency, with the drafter attached when a mode speculates; the sweep
// then switches the spec mode between configurations. FP8 weights are the
// target quantised into a temporary directory, which cleanup removes.
func inProcessBackend(mf *modelFlags, draft2 string, plan *bench.Plan, fs *flag.FlagSet, gpuMem string, prefixSlots int) (*bench.InProcess, func(), error) {
	ip, q, err := newInProcess(mf, draft2, plan, fs, gpuMem, prefixSlots)
	return ip, q.remove, err
}

// quantized is the FP8 form of a checkpoint, written on first use.
type quantized struct {
	from, dir string
	err       error
}

func (q *quantized) path() (string, error) {
	if q.dir == "" && q.err == nil {
		q.dir, q.err = os.MkdirTemp("", "ddflash-bench-fp8-")
		if q.err == nil {
			q.err = fp8.QuantizeCheckpoint(q.from, q.dir)
		}
	}
	return q.dir, q.err
}

func (q *quantized) remove() {
	if q.dir != "" {
		os.RemoveAll(q.dir)
	}
}

func newInProcess(mf *modelFlags, draft2 string, plan *bench.Plan, fs *flag.FlagSet, gpuMem string, prefixSlots int) (*bench.InProcess, *quantized, error) {
	q := &quantized{}
	if err := mf.resolveDefault(); err != nil {
		return nil, q, err
	}
	q.from = mf.model
	rollback, err := mamba.ParseStrategy(mf.rollback)
	if err != nil {
		return nil, q, err
	}
	dirs := map[string]string{"": mf.draft, bench.DFlash2Drafter: draft2}
	verifyTokens, planned, err := sizeForModes(mf, dirs, plan.Modes)
	if err != nil {
		return nil, q, err
	}
	models := map[*engine.Engine]string{}
	tok, err := tokenizer.LoadDir(mf.model)
	if err != nil {
		return nil, q, err
	}
	load := func(tp int, weights string) (*engine.Engine, error) {
		target := *mf
		target.tp, target.draft = tp, planned
		if weights == bench.WeightsFP8 {
			dir, err := q.path()
			if err != nil {
				return nil, fmt.Errorf("quantise %s to FP8: %w", q.from, err)
			}
			target.model = dir
		}
		sizing, err := benchSizing(&target, fs, slices.Max(plan.Concurrency), gpuMem, prefixSlots)
		if err != nil {
			return nil, err
		}
		// The engine attaches no drafter: drafterFor loads each at its
		// first mode.
		sizing.VerifyTokens, target.spec, target.withMTP = verifyTokens, "auto", false
		e, err := target.load(sizing)
		if err == nil {
			models[e] = target.model
		}
		return e, err
	}
	return &bench.InProcess{Load: load, Drafter: drafterFor(dirs, models), Prompter: bench.ChatPrompter{Dir: tok},
		Rollback: rollback, DraftDepth: mf.draftDepth, Threads: mf.threads, Device: mf.device, Log: os.Stderr}, q, nil
}

// sizeForModes returns the most tokens one verify of the sweep's modes
// feeds the target, and sets mf's spec flags to plan memory for them (see
// benchSizing): a DDTree of that size over the drafter it returns (the
// DFlash drafter when a mode runs it, else the DFlash2 one), the DFlash2
// drafter beside the DFlash one when modes run both (mf.besideDrafts), and
// the MTP head beside them when a mode runs the head, over the head alone
// when only mtpN modes speculate. dirs are the DFlash drafters'
// directories by Mode.Drafter.
func sizeForModes(mf *modelFlags, dirs map[string]string, modes []bench.Mode) (verify int, planned string, err error) {
	mtpSteps := 0
	var used []string // the DFlash drafters' directories the modes run
	for _, m := range modes {
		switch {
		case m.Kind == "auto":
			continue
		case m.Drafter == bench.MTPDrafter:
			mtpSteps = max(mtpSteps, m.Budget)
			verify = max(verify, m.Budget+1)
			continue
		case m.Drafter == bench.ChoiceDrafters:
			mtpSteps = max(mtpSteps, bench.ChoiceMTPSteps)
			m.Drafter = "" // and the DFlash drafter's tree
		}
		switch {
		case dirs[m.Drafter] == "" && m.Drafter == bench.DFlash2Drafter:
			return 0, "", fmt.Errorf("mode %s runs a DFlash2 drafter: give --draft2 DIR", m.Name)
		case dirs[m.Drafter] == "":
			return 0, "", fmt.Errorf("mode %s speculates and needs a drafter: give --draft DIR, or --modes auto or mtpN", m.Name)
		}
		cfg, err := dflash.LoadConfig(dirs[m.Drafter])
		if err != nil {
			return 0, "", err
		}
		// A tree of block-1 nodes needs as many verify tokens as the chain.
		verify = max(verify, m.Budget+1, cfg.BlockSize)
		if planned == "" || m.Drafter == "" {
			planned = dirs[m.Drafter]
		}
		if !slices.Contains(used, dirs[m.Drafter]) {
			used = append(used, dirs[m.Drafter])
		}
	}
	mf.besideDrafts = slices.DeleteFunc(used, func(dir string) bool { return dir == planned })
	mf.spec, mf.budget, mf.mtpSteps, mf.withMTP = "auto", 0, 0, false
	switch {
	case planned != "" && mtpSteps > 0: // both, as --with-mtp plans them
		mf.spec, mf.maxBudget, mf.mtpSteps, mf.withMTP = "adaptive", verify-1, mtpSteps, true
	case planned != "":
		mf.spec, mf.budget = "ddtree", verify-1
	case mtpSteps > 0:
		mf.spec, mf.budget, mf.mtpSteps = "mtp-ddtree", verify-1, mtpSteps
	}
	return verify, planned, nil
}

// drafterFor returns bench.InProcess's Drafter hook: each speculative mode's
// drafter on an engine, loaded at the first mode that runs it. DFlash and
// DFlash2 drafters come from dirs (by Mode.Drafter), the MTP head from the
// engine's own checkpoint (models[e]), one head per engine whatever the
// step counts of its chains; adaptive-mtp's choice is between the engine's
// DFlash drafter and a chain of that head.
func drafterFor(dirs map[string]string, models map[*engine.Engine]string) func(*engine.Engine, bench.Mode) (engine.Drafter, error) {
	type key struct {
		e       *engine.Engine
		drafter string
		steps   int // an MTP chain's
	}
	drafters := map[key]engine.Drafter{}
	heads := map[*engine.Engine]*mtp.Head{}
	var get func(e *engine.Engine, drafter string, steps int) (engine.Drafter, error)
	get = func(e *engine.Engine, drafter string, steps int) (engine.Drafter, error) {
		k := key{e, drafter, steps}
		if d, ok := drafters[k]; ok {
			return d, nil
		}
		var d engine.Drafter
		switch drafter {
		case bench.MTPDrafter:
			h := heads[e]
			if h == nil {
				var err error
				if h, err = mtp.LoadFor(e, models[e]); err != nil {
					return nil, err
				}
				heads[e] = h
			}
			chain, err := h.Drafter(steps)
			if err != nil {
				return nil, err
			}
			d = chain
		case bench.ChoiceDrafters:
			dfl, err := get(e, "", 0)
			if err != nil {
				return nil, err
			}
			head, err := get(e, bench.MTPDrafter, bench.ChoiceMTPSteps)
			if err != nil {
				return nil, err
			}
			d = engine.NewChoiceDrafter(dfl, head)
		default:
			loaded, err := dflash.Load(e, dirs[drafter])
			if err != nil {
				return nil, err
			}
			d = loaded
		}
		drafters[k] = d
		return d, nil
	}
	return func(e *engine.Engine, m bench.Mode) (engine.Drafter, error) {
		steps := 0
		if m.Drafter == bench.MTPDrafter {
			steps = m.Budget
		}
		return get(e, m.Drafter, steps)
	}
}

func runBenchVerify(args []string) error {
	fs := flag.NewFlagSet("bench verify", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ddflash bench verify DIR\n\nRe-checks every result and failure file in DIR (schema, checksum, completeness,\nvalidity, traces) and says which configurations to rerun; exits 1 if any.")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("give one results directory")
	}
	v, err := bench.Verify(fs.Arg(0))
	if err != nil {
		return err
	}
	v.Print(os.Stdout)
	if !v.OK() {
		return fmt.Errorf("%s: not every configuration is complete and valid (see above)", fs.Arg(0))
	}
	return nil
}

func runBenchReport(args []string) error {
	fs := flag.NewFlagSet("bench report", flag.ContinueOnError)
	out := fs.String("out", "", "write PREFIX.md, PREFIX.csv, PREFIX.svg and PREFIX.bench.txt (default: FIRST_DIR/report)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ddflash bench report [--out PREFIX] DIR...\n\nTabulates the valid results of one or more results directories (side by side:\none per server) and prints the markdown table. Compare passes with\n'benchstat -col /mode PREFIX.bench.txt'.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("give at least one results directory")
	}
	res, err := bench.LoadResults(fs.Args())
	if err != nil {
		return err
	}
	if len(res.Rows) == 0 {
		return fmt.Errorf("no valid results in %v (run 'ddflash bench verify DIR' to see why)", fs.Args())
	}
	prefix := *out
	if prefix == "" {
		prefix = filepath.Join(fs.Arg(0), "report")
	}
	if err := writeReport(prefix, res); err != nil {
		return err
	}
	res.Markdown(os.Stdout)
	fmt.Fprintf(os.Stderr, "wrote %s.md, .csv, .svg and .bench.txt\n", prefix)
	return nil
}

func writeReport(prefix string, res *bench.Results) error {
	for ext, write := range map[string]func(*os.File) error{
		".md":        func(f *os.File) error { res.Markdown(f); return nil },
		".csv":       func(f *os.File) error { return res.CSV(f) },
		".svg":       func(f *os.File) error { return res.SVG(f) },
		".bench.txt": func(f *os.File) error { res.Benchstat(f); return nil },
	} {
		f, err := os.Create(prefix + ext)
		if err != nil {
			return err
		}
		if err := write(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}
