package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"ddflash/engine/gpu"
	"ddflash/engine/planner"
	"ddflash/mamba"
	"ddflash/mtp"
)

func init() {
	register("plan", "show how GPU memory splits between weights, KV cache, GDN states and rollback", runPlan)
}

// planFlags are the settings plan and tune share (and serve can reuse).
type planFlags struct {
	model, draft             string
	beside                   []string // drafters loaded beside draft (bench: --draft2's beside --draft's)
	gpuName, gpuMem, gpuFree string
	tp, maxRunning, budget   int
	context, prefixSlots     int
	mtpSteps                 int
	// withMTP plans the target's MTP head beside the DFlash drafter (serve
	// --with-mtp, bench's mtpN modes beside DFlash ones).
	withMTP                      bool
	spec, rollback, compat       string
	kvDtype, ssmDtype, convDtype string
	memFraction                  float64
	reserve                      string

	// SGLang's own knobs, valid with --compat sglang.
	memFractionStatic    float64
	maxMambaCacheSize    int
	mambaFullMemoryRatio float64
	disableRadixCache    bool
	noPrefixCache        bool
}

var sglangOnlyFlags = []string{"mem-fraction-static", "max-mamba-cache-size", "mamba-full-memory-ratio", "disable-radix-cache"}

func (f *planFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.model, "model", "qwen3.6-27b", "target model: "+strings.Join(planner.TargetPresets(), ", ")+", or a directory with config.json (plan: several, comma-separated, are compared side by side)")
	fs.StringVar(&f.draft, "draft", "qwen3.6-27b-dflash", "DFlash drafter: "+strings.Join(planner.DrafterPresets(), ", ")+", or a directory")
	fs.StringVar(&f.gpuName, "gpu", "", "GPU by name: "+strings.Join(gpu.PresetNames(), ", ")+" (default: the local GPU through NVML)")
	fs.StringVar(&f.gpuMem, "gpu-mem", "", "GPU memory instead of --gpu, e.g. 97887MiB or 80GB")
	fs.StringVar(&f.gpuFree, "gpu-free", "", "memory free before loading (default: all of it, or what NVML reports)")
	fs.IntVar(&f.tp, "tp", 1, "tensor-parallel degree; figures are per GPU (rank 0, the most loaded, under ddflash rules)")
	fs.IntVar(&f.maxRunning, "max-running-requests", 0, "requests running at once")
	fs.StringVar(&f.spec, "spec", "ddtree", "decoding: auto (autoregressive, no drafter), linear (DFlash chain), ddtree, mtp (the chain of the target's own MTP head, no DFlash drafter) or mtp-ddtree")
	fs.IntVar(&f.mtpSteps, "mtp-steps", 3, "--spec mtp: proposals per draft of the MTP head")
	fs.IntVar(&f.budget, "budget", 0, "DDTree nodes per step (default: drafter block_size-1)")
	fs.IntVar(&f.context, "context", planner.DefaultContext, "tokens per request, prompt and output")
	fs.StringVar(&f.rollback, "rollback", "", "GDN rollback: replay (ddflash default) or snapshot (per-token states, as SGLang)")
	fs.StringVar(&f.compat, "compat", "ddflash", "whose memory rules to follow: ddflash or sglang")
	f.registerMemory(fs)
	fs.Float64Var(&f.memFractionStatic, "mem-fraction-static", 0, "SGLang's --mem-fraction-static (default: its automatic rule)")
	fs.IntVar(&f.maxMambaCacheSize, "max-mamba-cache-size", planner.ReportedMambaCacheSize, "SGLang's Mamba slots; 24 is the reported deployment's setting, 0 SGLang's ratio rule")
	fs.Float64Var(&f.mambaFullMemoryRatio, "mamba-full-memory-ratio", 0.9, "SGLang's Mamba share of KV+Mamba memory, used by the ratio rule")
	fs.BoolVar(&f.disableRadixCache, "disable-radix-cache", false, "SGLang without prefix caching: one Mamba slot per request")
}

// registerMemory registers the cache and memory flags that serve shares
// with plan and tune, so that the serve line a plan prints runs as printed.
func (f *planFlags) registerMemory(fs *flag.FlagSet) {
	fs.IntVar(&f.prefixSlots, "prefix-cache-slots", 0, "GDN checkpoints the prefix cache keeps, each a state slot beside the running requests' (0: no prefix cache)")
	fs.BoolVar(&f.noPrefixCache, "no-prefix-cache", false, "turn the prefix cache off (as --prefix-cache-slots 0)")
	fs.StringVar(&f.kvDtype, "kv-dtype", "", "KV cache dtype: bf16, fp16, fp8 or fp32 (default: the checkpoint's)")
	fs.StringVar(&f.ssmDtype, "ssm-dtype", "", "recurrent state dtype: fp32, bf16 or fp16 (default: the config's mamba_ssm_dtype)")
	fs.StringVar(&f.convDtype, "conv-dtype", "", "conv state dtype: bf16, fp16 or fp32 (default: the checkpoint's)")
	fs.Float64Var(&f.memFraction, "mem-fraction", 0, fmt.Sprintf("share of GPU memory for weights and caches (ddflash default %.2f; with --compat sglang, SGLang's automatic rule)", planner.DefaultMemFraction))
	fs.StringVar(&f.reserve, "reserve", "", "runtime reserve for activations instead of --mem-fraction, e.g. 8GiB")
}

// planSetup is a resolved request for a plan: configs, GPU and knobs.
type planSetup struct {
	models             planner.Models
	knobs              planner.Knobs
	device             gpu.Device
	modelRef, draftRef string
	gpuMem             string // --gpu-mem when the memory came from it, for the serve line
}

// resolve turns flags into configs and knobs; fs tells which flags were set.
func (f *planFlags) resolve(fs *flag.FlagSet) (*planSetup, error) {
	s, err := f.resolveOn(fs, f.resolveGPU)
	if err == nil {
		s.gpuMem = f.gpuMem
	}
	return s, err
}

// resolveOn is resolve with the memory to plan in given by device.
func (f *planFlags) resolveOn(fs *flag.FlagSet, device func() (gpu.Device, error)) (*planSetup, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	s := &planSetup{modelRef: f.model}
	k := &s.knobs
	var err error
	if k.Mode, err = planner.ParseMode(f.compat); err != nil {
		return nil, err
	}
	sglang := k.Mode == planner.ModeSGLang
	for _, name := range sglangOnlyFlags {
		if set[name] && !sglang {
			return nil, fmt.Errorf("--%s is an SGLang knob: add --compat sglang", name)
		}
	}
	if set["reserve"] && sglang {
		return nil, errors.New("--reserve is ddflash's knob: SGLang's is --mem-fraction-static")
	}
	spec := f.spec
	if _, ok := mtpSpecs[spec]; ok || f.withMTP {
		k.MTPSteps = f.mtpSteps
		if k.MTPSteps < 1 || k.MTPSteps > mtp.MaxSteps {
			return nil, fmt.Errorf("--mtp-steps %d: want 1..%d", k.MTPSteps, mtp.MaxSteps)
		}
	}
	if mode, ok := mtpSpecs[spec]; ok {
		spec = mode
	}
	if k.Spec, err = planner.ParseSpec(spec); err != nil {
		return nil, fmt.Errorf("%w, mtp or mtp-ddtree", err)
	}
	if set["budget"] && k.Spec != planner.SpecDDTree {
		return nil, fmt.Errorf("--budget applies to --spec ddtree, not %s", k.Spec)
	}
	if err := f.resolveRollback(k, set["rollback"]); err != nil {
		return nil, err
	}
	if err := parseCacheDtypes(f.kvDtype, f.convDtype, f.ssmDtype, k); err != nil {
		return nil, err
	}
	if s.device, err = device(); err != nil {
		return nil, err
	}
	k.GPUTotal, k.GPUFree = s.device.Total, s.device.Free
	if f.reserve != "" {
		if k.Reserve, err = gpu.ParseSize(f.reserve); err != nil {
			return nil, fmt.Errorf("--reserve: %w", err)
		}
	}
	k.MemFraction = f.memFraction
	if set["mem-fraction-static"] {
		k.MemFraction = f.memFractionStatic
	}
	k.MaxRunningRequests, k.TP, k.Context, k.Budget = f.maxRunning, f.tp, f.context, f.budget
	if !f.noPrefixCache {
		k.PrefixSlots = f.prefixSlots
	}
	if sglang {
		k.MaxMambaCacheSize, k.MambaFullMemoryRatio, k.DisableRadixCache = f.maxMambaCacheSize, f.mambaFullMemoryRatio, f.disableRadixCache
	}
	if s.models.Target, err = planner.LoadTarget(f.model); err != nil {
		return nil, err
	}
	if k.Spec != planner.SpecAutoregressive && (k.MTPSteps == 0 || f.withMTP) {
		s.draftRef = f.draft
		if s.models.Drafter, err = planner.LoadDrafter(f.draft); err != nil {
			return nil, err
		}
		for _, dir := range f.beside {
			d, err := planner.LoadDrafter(dir)
			if err != nil {
				return nil, err
			}
			s.models.Beside = append(s.models.Beside, d)
		}
	}
	return s, nil
}

// parseCacheDtypes sets k's cache dtypes from the --kv-dtype, --conv-dtype
// and --ssm-dtype values; an empty one leaves its knob to the planner's
// default.
func parseCacheDtypes(kv, conv, ssm string, k *planner.Knobs) error {
	dtypes := []struct {
		flag     string
		allowFP8 bool
		dst      *planner.DType
	}{{kv, true, &k.KVDtype}, {conv, false, &k.ConvDtype}, {ssm, false, &k.SSMDtype}}
	for _, d := range dtypes {
		if d.flag == "" {
			continue
		}
		var err error
		if *d.dst, err = planner.ParseDType(d.flag, d.allowFP8); err != nil {
			return err
		}
	}
	return nil
}

func (f *planFlags) resolveRollback(k *planner.Knobs, explicit bool) error {
	k.Rollback = mamba.Replay
	if k.Mode == planner.ModeSGLang {
		k.Rollback = mamba.Snapshot
	}
	if !explicit {
		return nil
	}
	r, err := mamba.ParseStrategy(f.rollback)
	if err != nil {
		return err
	}
	if k.Mode == planner.ModeSGLang && r != mamba.Snapshot {
		return errors.New("--compat sglang models SGLang's per-token snapshots: drop --compat to plan ddflash's replay rollback")
	}
	k.Rollback = r
	return nil
}

// resolveGPU takes --gpu-mem, then --gpu, then the local GPU through NVML.
func (f *planFlags) resolveGPU() (gpu.Device, error) {
	var d gpu.Device
	var err error
	switch {
	case f.gpuMem != "" && f.gpuName != "":
		return d, errors.New("pass either --gpu or --gpu-mem, not both")
	case f.gpuMem != "":
		d.Name = "GPU"
		if d.Total, err = gpu.ParseSize(f.gpuMem); err != nil {
			return d, fmt.Errorf("--gpu-mem: %w", err)
		}
	case f.gpuName != "":
		if d, err = gpu.Preset(f.gpuName); err != nil {
			return d, err
		}
	default:
		if d, err = gpu.Local(0); err != nil {
			return d, fmt.Errorf("no --gpu or --gpu-mem, and the local GPU is unreadable: %w", err)
		}
	}
	if f.gpuFree != "" {
		if d.Free, err = gpu.ParseSize(f.gpuFree); err != nil {
			return d, fmt.Errorf("--gpu-free: %w", err)
		}
	}
	return d, nil
}

func runPlan(args []string) error { return planTo(os.Stdout, args) }

// planTo runs `ddflash plan` with its output going to w.
func planTo(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	var f planFlags
	f.register(fs)
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.maxRunning == 0 {
		return errors.New("--max-running-requests is required: how many requests run at once")
	}
	if models := strings.Split(f.model, ","); len(models) > 1 {
		if *asJSON {
			return errors.New("--json plans one --model at a time")
		}
		return comparePlans(w, &f, fs, models)
	}
	s, err := f.resolve(fs)
	if err != nil {
		return err
	}
	p, err := planner.Compute(s.models, s.knobs)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writePlanJSON(w, s, p); err != nil {
			return err
		}
	} else {
		writePlan(w, s, p)
		if s.knobs.Mode == planner.ModeSGLang && s.knobs.Spec != planner.SpecAutoregressive {
			writeReplayComparison(w, s)
		}
	}
	return p.Fits() // a plan that does not fit exits non-zero, after explaining itself
}

// comparePlans plans each model with the same flags and prints their
// figures side by side (Qwen3.8-27B beside Qwen3.6-27B, say).
func comparePlans(w io.Writer, f *planFlags, fs *flag.FlagSet, models []string) error {
	var plans []*planner.Plan
	var setup *planSetup
	for _, model := range models {
		one := *f
		one.model = model
		s, err := one.resolve(fs)
		if err != nil {
			return err
		}
		p, err := planner.Compute(s.models, s.knobs)
		if err != nil {
			return fmt.Errorf("%s: %w", model, err)
		}
		setup, plans = s, append(plans, p)
	}
	k := plans[0].Settings
	spec := k.Spec.String()
	if k.MTPSteps > 0 {
		spec = fmt.Sprintf("%s (MTP, %d steps)", spec, k.MTPSteps)
	}
	fmt.Fprintf(w, "%s, TP %d, %s rules, %d running requests, context %s, on %s (%s)\n\n", spec, k.TP, k.Mode,
		k.MaxRunningRequests, planner.FormatCount(int64(k.Context)), setup.device.Name, planner.FormatBytes(k.GPUTotal))
	rows := []struct {
		what  string
		value func(p *planner.Plan) string
	}{
		{"target weights", func(p *planner.Plan) string { return planner.FormatBytes(p.Bytes.TargetWeights) }},
		{"draft weights", func(p *planner.Plan) string { return planner.FormatBytes(p.Bytes.DraftWeights) }},
		{"KV cache per token", func(p *planner.Plan) string { return planner.FormatBytes(p.Bytes.PerKVToken) }},
		{"draft KV per token", func(p *planner.Plan) string { return planner.FormatBytes(p.Bytes.DraftKVPerToken) }},
		{"GDN state per slot", func(p *planner.Plan) string { return planner.FormatBytes(p.Bytes.PerStateSlot) }},
		{"KV tokens", func(p *planner.Plan) string { return planner.FormatCount(p.KVTokens) }},
		{"max running requests", func(p *planner.Plan) string { return fmt.Sprint(p.MaxRunning.Effective) }},
		{"fits", func(p *planner.Plan) string { return fmt.Sprint(p.Fits() == nil) }},
	}
	fmt.Fprintf(w, "%-22s", "")
	for _, m := range models {
		fmt.Fprintf(w, " %16s", m)
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "%-22s", r.what)
		for _, p := range plans {
			fmt.Fprintf(w, " %16s", r.value(p))
		}
		fmt.Fprintln(w)
	}
	return nil
}

func writePlanJSON(w io.Writer, s *planSetup, p *planner.Plan) error {
	out := struct {
		Model      string `json:"model"`
		Drafter    string `json:"drafter,omitempty"`
		GPU        string `json:"gpu"`
		Fits       bool   `json:"fits"`
		ServeFlags string `json:"flags"`
		*planner.Plan
	}{s.modelRef, s.draftRef, s.device.Name, p.Fits() == nil, serveFlags(s, p), p}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// writePlan prints the breakdown table.
func writePlan(w io.Writer, s *planSetup, p *planner.Plan) {
	k := p.Settings
	fmt.Fprintf(w, "%s\n\n", planHeadline(s, p))
	b := p.Bytes
	costs := []struct {
		what string
		n    int64
	}{
		{"KV cache per token", b.PerKVToken},
		{"draft KV per token", b.DraftKVPerToken},
		{"draft KV per request (sliding layers)", b.DraftKVPerRequest},
		{"GDN state per slot", b.PerStateSlot},
		{fmt.Sprintf("rollback per request (%s, %d tokens)", rollbackName(k), p.DraftTokens), b.RollbackPerRequest},
	}
	perGPU, rankNote := "per GPU", ""
	if k.TP > 1 && k.Mode == planner.ModeDDFlash {
		perGPU, rankNote = "per GPU (rank 0)", "  rank 0 holds the whole embedding and the drafter; the other ranks hold less\n"
	}
	fmt.Fprintln(w, "unit costs, "+perGPU)
	for _, c := range costs {
		if c.n > 0 {
			fmt.Fprintf(w, "  %-44s %12s\n", c.what, planner.FormatBytes(c.n))
		}
	}
	fmt.Fprintf(w, "\n%-46s %12s %7s\n", "memory, "+perGPU, "GiB", "share")
	for _, seg := range p.Memory {
		if seg.Bytes >= 1<<20 || seg.Bytes <= -1<<20 {
			fmt.Fprintf(w, "  %-44s %12.2f %6.1f%%\n", seg.Use, float64(seg.Bytes)/(1<<30), 100*float64(seg.Bytes)/float64(k.GPUTotal))
		}
	}
	fmt.Fprintf(w, "  %-44s %12.2f\n%s\n", "total", float64(k.GPUTotal)/(1<<30), rankNote)
	writeResult(w, p)
	fmt.Fprintf(w, "\n%s\n", serveFlags(s, p))
}

func planHeadline(s *planSetup, p *planner.Plan) string {
	k := p.Settings
	models := s.modelRef
	spec := k.Spec.String()
	switch {
	case k.MTPSteps > 0:
		models += " + its MTP head"
		spec = fmt.Sprintf("%s (MTP, %d steps)", spec, k.MTPSteps)
	case k.Spec != planner.SpecAutoregressive:
		models += " + " + s.draftRef
	}
	if k.Spec == planner.SpecDDTree {
		spec += fmt.Sprintf(" budget %d", k.Budget)
	}
	return fmt.Sprintf("%s on %s (%s), TP %d, %s rules\n%s, %s rollback, context %s, KV %s, ssm %s, conv %s, memory fraction %.3f",
		models, s.device.Name, planner.FormatBytes(k.GPUTotal), k.TP, k.Mode,
		spec, rollbackName(k), planner.FormatCount(int64(k.Context)), k.KVDtype.Name, k.SSMDtype.Name, k.ConvDtype.Name, p.MemFraction)
}

func rollbackName(k planner.Knobs) string {
	if k.Mode == planner.ModeSGLang {
		return mamba.Snapshot.String()
	}
	return k.Rollback.String()
}

// writeResult prints the numbers that decide concurrency, and the warnings.
func writeResult(w io.Writer, p *planner.Plan) {
	mr := p.MaxRunning
	fmt.Fprintf(w, "KV tokens             %s\n", planner.FormatCount(p.KVTokens))
	fmt.Fprintf(w, "state slots           %d (%d per request; rollback reserved for %d)\n", p.StateSlots, p.SlotsPerRequest, p.RollbackRequests)
	fmt.Fprintf(w, "max running requests  %d (requested %d, KV cap %s, slot cap %d)\n", mr.Effective, mr.Requested, planner.FormatCount(int64(mr.KVCap)), mr.SlotCap)
	if len(p.Warnings) == 0 {
		fmt.Fprintln(w, "warnings              none")
	}
	for _, warning := range p.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warning)
	}
}

// writeReplayComparison shows what ddflash's replay rollback gives for the
// same GPU and concurrency.
func writeReplayComparison(w io.Writer, s *planSetup) {
	k := s.knobs
	k.Mode, k.Rollback, k.MemFraction = planner.ModeDDFlash, mamba.Replay, 0
	p, err := planner.Compute(s.models, k)
	if err != nil {
		return // the comparison is a courtesy; the SGLang plan above stands
	}
	fmt.Fprintf(w, "\nddflash with replay rollback on the same GPU: %s KV tokens, %d running requests (rollback %s per request instead of %s)\n",
		planner.FormatCount(p.KVTokens), p.MaxRunning.Effective, planner.FormatBytes(p.Bytes.RollbackPerRequest),
		planner.FormatBytes(int64(p.DraftTokens)*p.Bytes.PerStateSlot))
}

// serveFlags are the flags that reproduce the plan: `ddflash serve` ones in
// ddflash mode, SGLang launch_server ones in SGLang mode.
func serveFlags(s *planSetup, p *planner.Plan) string {
	k := p.Settings
	var f []string
	add := func(name string, v any) { f = append(f, fmt.Sprintf("--%s %v", name, v)) }
	if k.Mode == planner.ModeSGLang {
		add("tp-size", k.TP)
		add("max-running-requests", k.MaxRunningRequests)
		add("context-length", k.Context)
		add("mem-fraction-static", fmt.Sprintf("%.3f", p.MemFraction))
		add("max-mamba-cache-size", p.StateSlots)
		add("mamba-ssm-dtype", map[string]string{"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[k.SSMDtype.Name])
		if p.DraftTokens > 0 {
			add("speculative-num-draft-tokens", p.DraftTokens)
		}
		return "sglang flags: " + strings.Join(f, " ")
	}
	add("model", s.modelRef)
	if s.gpuMem != "" {
		add("gpu-mem", s.gpuMem)
	}
	choice := k.MTPSteps > 0 && s.draftRef != "" // the head beside the drafter, planned as the choice's largest tree
	switch {
	case choice:
		add("draft", s.draftRef)
		add("spec", "adaptive --with-mtp")
		add("mtp-steps", k.MTPSteps)
		add("max-budget", k.Budget)
	case k.MTPSteps > 0:
		add("spec", map[planner.Spec]string{planner.SpecLinear: "mtp", planner.SpecDDTree: "mtp-ddtree"}[k.Spec])
		add("mtp-steps", k.MTPSteps)
	case k.Spec != planner.SpecAutoregressive:
		add("draft", s.draftRef)
		add("spec", k.Spec)
	default:
		add("spec", k.Spec)
	}
	if k.Spec == planner.SpecDDTree && !choice {
		add("budget", k.Budget)
	}
	add("tp", k.TP)
	add("max-running-requests", k.MaxRunningRequests)
	add("context", k.Context)
	if p.DraftTokens > 0 {
		add("rollback", k.Rollback)
	}
	add("kv-dtype", k.KVDtype.Name)
	add("ssm-dtype", k.SSMDtype.Name)
	add("conv-dtype", k.ConvDtype.Name)
	if k.Reserve > 0 {
		add("reserve", fmt.Sprintf("%dMiB", k.Reserve>>20))
	} else {
		add("mem-fraction", fmt.Sprintf("%.3f", p.MemFraction))
	}
	if k.PrefixSlots > 0 {
		add("prefix-cache-slots", k.PrefixSlots)
	}
	return "ddflash serve " + strings.Join(f, " ")
}
