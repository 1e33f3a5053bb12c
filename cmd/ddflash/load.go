package main

import (
	"flag"
	"fmt"
	"runtime"
	"strconv"

	"ddflash/adaptive"
	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/planner"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/kernels/device"
	"ddflash/mamba"
	"ddflash/models"
	"ddflash/mtp"
)

// modelFlags are the flags every command that runs the model shares.
type modelFlags struct {
	model, draft, spec, rollback, device string
	budget, context, threads, tp         int
	mtpSteps                             int // --mtp-steps: proposals per draft of the MTP head
	draftDepth                           int // --draft-depth: proposals per DFlash draft (0: its block)
	// withMTP (--with-mtp): --spec adaptive also loads the MTP head and
	// chooses between it and --draft's drafter per request and step.
	withMTP bool
	// The cache dtype flags of the commands that size an engine without
	// serve's memory flags (generate, bench; see registerCacheDtypes).
	kvDtype, convDtype, ssmDtype string
	// besideDrafts are DFlash drafters planned beside draft's (bench runs
	// --draft2's modes with --draft's): memory only, none is attached.
	besideDrafts []string

	// wrapBackend, when set, wraps each rank's backend (tests count allocations).
	wrapBackend func(kernels.Backend) kernels.Backend
	// autoBudget (--budget auto) lets a policy choose each step's tree, up to maxBudget nodes.
	autoBudget bool
	maxBudget  int
}

// budgetFlag parses --budget: a node count or auto.
type budgetFlag struct{ m *modelFlags }

func (b budgetFlag) String() string {
	if b.m == nil || b.m.autoBudget {
		return "auto"
	}
	return strconv.Itoa(b.m.budget)
}

func (b budgetFlag) Set(s string) error {
	if b.m.autoBudget = s == "auto"; b.m.autoBudget {
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want a node count or auto")
	}
	b.m.budget = n
	return nil
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.model, "model", "", "target model directory (Hugging Face layout; default: the embedded default model)")
	fs.StringVar(&m.draft, "draft", "", "DFlash or DFlash2 drafter directory (z-lab layout; DFlash2 is read from its config), for --spec linear|ddtree|adaptive (default with the default model: its drafter)")
	fs.StringVar(&m.spec, "spec", "auto", "decoding: auto (autoregressive), linear (DFlash chain), ddtree, adaptive (a DDTree whose size, autoregressive included, is chosen every step from measured cost and predicted acceptance), mtp (the chain of the checkpoint's own MTP head) or mtp-ddtree (a DDTree from the MTP head's steps)")
	fs.IntVar(&m.mtpSteps, "mtp-steps", 3, fmt.Sprintf("--spec mtp (and --with-mtp): proposals per draft, the MTP head applied this many times (1..%d)", mtp.MaxSteps))
	fs.BoolVar(&m.withMTP, "with-mtp", false, "--spec adaptive: also load the checkpoint's own MTP head (--mtp-steps steps) and draft, per request and step, with whichever of it and --draft's drafter is expected to commit more tokens per second")
	fs.IntVar(&m.draftDepth, "draft-depth", 0, "DFlash: tokens a draft proposes, a block of this many masks after the anchor instead of the drafter's block_size-1 (cheaper drafts on a CPU; acceptance changes); 0: the whole block")
	m.budget = 15
	fs.Var(budgetFlag{m}, "budget", "DDTree node budget B (non-root nodes per verify), or auto: chosen every step up to --max-budget")
	fs.IntVar(&m.maxBudget, "max-budget", 32, "the largest tree --budget auto and --spec adaptive choose")
	fs.StringVar(&m.rollback, "rollback", "replay", "GDN state rollback after partial acceptance: replay or snapshot")
	fs.IntVar(&m.context, "context", 0, "context length (default: the model's)")
	fs.IntVar(&m.threads, "threads", 0, "CPU threads, divided among --tp ranks (default: all cores)")
	fs.StringVar(&m.device, "device", "cpu", "compute backend: cpu or cuda (GPUs 0..tp-1), or cuda:N for one GPU")
	fs.IntVar(&m.tp, "tp", 1, "tensor-parallel ranks the target is split over (heads, MLP and vocabulary must divide)")
}

// resolveDefault points --model (and --draft) at the embedded default pair
// when no model is given.
func (m *modelFlags) resolveDefault() error {
	if m.model != "" {
		return nil
	}
	target, draft, err := models.DefaultPair()
	if err != nil {
		return err
	}
	m.model = target
	if m.draft == "" {
		m.draft = draft
	}
	return nil
}

// mtpSpecs are the --spec values that draft with the target's own MTP
// head, and the engine mode each verifies with.
var mtpSpecs = map[string]string{"mtp": "linear", "mtp-ddtree": "ddtree"}

// usesMTP reports whether --spec drafts with the target's MTP head.
func (m *modelFlags) usesMTP() bool { _, ok := mtpSpecs[m.spec]; return ok }

// specOptions parses the speculative-decoding flags.
func (m *modelFlags) specOptions() (engine.SpecOptions, error) {
	var policy *adaptive.Policy
	spec, label := m.spec, ""
	if m.withMTP && spec != "adaptive" {
		return engine.SpecOptions{}, fmt.Errorf("--with-mtp chooses between drafters under --spec adaptive, not %s", spec)
	}
	if _, ok := mtpSpecs[spec]; ok || m.withMTP {
		if m.mtpSteps < 1 || m.mtpSteps > mtp.MaxSteps {
			return engine.SpecOptions{}, fmt.Errorf("--mtp-steps %d: want 1..%d", m.mtpSteps, mtp.MaxSteps)
		}
	}
	if mode, ok := mtpSpecs[spec]; ok {
		spec, label = mode, m.spec
	}
	switch {
	case spec == "adaptive":
		spec, policy = "ddtree", &adaptive.Policy{Autoregressive: true}
	case m.autoBudget && spec == "ddtree":
		policy = &adaptive.Policy{}
	case m.autoBudget:
		return engine.SpecOptions{}, fmt.Errorf("--budget auto applies to --spec ddtree, not %s", spec)
	}
	mode, err := engine.ParseSpecMode(spec)
	if err != nil {
		return engine.SpecOptions{}, fmt.Errorf("%w, adaptive, mtp or mtp-ddtree", err)
	}
	rollback, err := mamba.ParseStrategy(m.rollback)
	if err != nil {
		return engine.SpecOptions{}, err
	}
	budget, flag := m.budget, "--budget"
	if policy != nil {
		budget, flag = m.maxBudget, "--max-budget"
	}
	if mode == engine.SpecTree && budget < 1 {
		return engine.SpecOptions{}, fmt.Errorf("%s %d: a tree needs at least one node", flag, budget)
	}
	if mode != engine.SpecAuto && m.draft == "" && label == "" {
		return engine.SpecOptions{}, fmt.Errorf("--spec %s needs a drafter: give --draft DIR", m.spec)
	}
	if m.draftDepth < 0 {
		return engine.SpecOptions{}, fmt.Errorf("--draft-depth %d: want 0 (the whole block) or a token count", m.draftDepth)
	}
	return engine.SpecOptions{Mode: mode, Budget: budget, Rollback: rollback, Policy: policy, Label: label, DraftDepth: m.draftDepth}, nil
}

// backends makes one backend per tensor-parallel rank: CPU ranks share the
// threads; CUDA ranks take GPUs 0..tp-1 (or the one GPU cuda:N names).
func (m *modelFlags) backends() ([]kernels.Backend, error) {
	if m.tp < 1 {
		return nil, fmt.Errorf("--tp %d: want at least 1", m.tp)
	}
	ranks := make([]kernels.Backend, m.tp)
	if m.device == "cpu" {
		threads := m.threads
		if threads <= 0 {
			threads = runtime.NumCPU()
		}
		for i := range ranks {
			ranks[i] = cpu.New(max(1, threads/m.tp))
		}
		return ranks, nil
	}
	if m.device != "cuda" && m.tp > 1 {
		return nil, fmt.Errorf("--device %s names one GPU; with --tp %d use --device cuda", m.device, m.tp)
	}
	for i := range ranks {
		name := m.device
		if name == "cuda" {
			name = fmt.Sprintf("cuda:%d", i)
		}
		b, err := device.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--device %s: %w", m.device, err)
		}
		ranks[i] = b
	}
	return ranks, nil
}

// load builds the engine (and drafter) the flags describe, sized by opts
// (sequences in flight, KV tokens, cache dtypes; the context and verify
// room come from the flags).
func (m *modelFlags) load(opts engine.Options) (*engine.Engine, error) {
	if err := m.resolveDefault(); err != nil {
		return nil, err
	}
	spec, err := m.specOptions()
	if err != nil {
		return nil, err
	}
	backends, err := m.backends()
	if err != nil {
		return nil, err
	}
	if m.wrapBackend != nil {
		for i, b := range backends {
			backends[i] = m.wrapBackend(b)
		}
	}
	if opts.Context == 0 {
		opts.Context = m.context
	}
	switch {
	case m.usesMTP():
		opts.VerifyTokens = spec.VerifyTokens(m.mtpSteps + 1)
	case spec.Mode != engine.SpecAuto:
		if opts.VerifyTokens, err = dflash.VerifyTokens(m.draft, spec); err != nil {
			return nil, err
		}
	}
	e, err := engine.LoadParallel(backends, m.model, opts)
	if err != nil {
		return nil, err
	}
	switch {
	case m.usesMTP():
		err = mtp.Attach(e, m.model, m.mtpSteps, spec)
	case spec.Mode != engine.SpecAuto:
		if err = dflash.Attach(e, m.draft, spec); err == nil && m.withMTP {
			err = chooseWithMTP(e, m.model, m.mtpSteps)
		}
	}
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// chooseWithMTP loads the MTP head of the engine's checkpoint (dir) and
// makes the engine choose between it, steps proposals per draft, and its
// drafter (--with-mtp).
func chooseWithMTP(e *engine.Engine, dir string, steps int) error {
	head, err := mtp.LoadFor(e, dir)
	if err != nil {
		return err
	}
	d, err := head.Drafter(steps)
	if err != nil {
		head.Close()
		return err
	}
	e.Drafter = engine.NewChoiceDrafter(e.Drafter, d)
	return nil
}

// registerCacheDtypes registers --kv-dtype, --conv-dtype and --ssm-dtype
// for generate and bench (serve and plan have them among the memory flags).
func (m *modelFlags) registerCacheDtypes(fs *flag.FlagSet) {
	fs.StringVar(&m.kvDtype, "kv-dtype", "", "KV cache dtype: bf16 or fp32 (default: the checkpoint's)")
	fs.StringVar(&m.convDtype, "conv-dtype", "", "conv state dtype: bf16 or fp32 (default: the checkpoint's)")
	fs.StringVar(&m.ssmDtype, "ssm-dtype", "", "GDN recurrent state dtype: fp32 or bf16 (default: the config's mamba_ssm_dtype)")
}

// unplannedSizing sizes an engine for sequences requests without a memory
// plan (generate, bench): the cache dtypes as the flags say, with plan's
// defaults (the checkpoint's dtype for the KV cache and the conv state, the
// config's mamba_ssm_dtype for the recurrent state).
func (m *modelFlags) unplannedSizing(sequences int) (engine.Options, error) {
	if err := m.resolveDefault(); err != nil {
		return engine.Options{}, err
	}
	target, err := planner.LoadTarget(m.model)
	if err != nil {
		return engine.Options{}, err
	}
	var k planner.Knobs
	if err := parseCacheDtypes(m.kvDtype, m.convDtype, m.ssmDtype, &k); err != nil {
		return engine.Options{}, err
	}
	opts, err := planner.EngineCacheDTypes(target, k)
	if err != nil {
		return engine.Options{}, err
	}
	opts.MaxSeqs = sequences
	return opts, nil
}
