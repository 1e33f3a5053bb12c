package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Mode is one decoding method of a sweep: auto (autoregressive, the
// baseline), linear (the DFlash chain), bN (a DDTree with N nodes),
// adaptive (each step's tree size, autoregressive included, chosen from
// measured cost and predicted acceptance); dflash2 and d2bN are linear and
// bN with the sweep's DFlash2 drafter, mtpN the chain of N steps of the
// target's own MTP head, adaptive-mtp adaptive choosing between the DFlash
// drafter and the MTP head every step. A DFlash mode may end in -dK
// (b4-d4, linear-d8): its drafts run a block of K+1 rows, K tokens deep,
// instead of the drafter's whole block (engine.SpecOptions.DraftDepth).
type Mode struct {
	Name string // as on the command line and in file names: auto, linear, b15, adaptive, mtp3
	Kind string // auto, linear, ddtree or adaptive
	// Budget is the nodes verified per step beyond the root: DDTree nodes
	// (adaptive: the most), an MTP chain's steps; 0 for auto and a DFlash
	// chain (its drafter's block size decides).
	Budget int
	// Drafter names the drafter the mode speculates with: "" for the
	// sweep's DFlash drafter (--draft), DFlash2Drafter, MTPDrafter or
	// ChoiceDrafters.
	Drafter string
	// Depth caps a DFlash draft at Depth tokens (-dK); 0: the sweep's
	// --draft-depth.
	Depth int
	// NoPrefixCache runs the mode with the engine's prefix cache off (a
	// name ending in NoCacheSuffix), to compare with the same mode with it.
	NoPrefixCache bool
}

// NoCacheSuffix marks a mode run without the prefix cache: auto-nocache.
const NoCacheSuffix = "-nocache"

// The drafters a mode may name besides the sweep's DFlash drafter.
const (
	DFlash2Drafter = "dflash2" // the sweep's DFlash2 drafter (--draft2)
	MTPDrafter     = "mtp"     // the target checkpoint's own MTP head
	// ChoiceDrafters is the choice, per request and step, between the
	// DFlash drafter and the MTP head (ChoiceMTPSteps steps), as
	// --spec adaptive --with-mtp makes it.
	ChoiceDrafters = "dflash+mtp"
)

// ChoiceMTPSteps is the MTP head's steps in the adaptive-mtp mode (SGLang's
// default for Qwen3.5/3.6 MTP).
const ChoiceMTPSteps = 3

// ParseMode reads auto, linear, bN (N ≥ 1), adaptive, adaptive-mtp,
// dflash2, d2bN or mtpN (1 ≤ N ≤ MaxMTPSteps); linear, bN, adaptive and
// adaptive-mtp optionally followed by -dK (K ≥ 1), and each by NoCacheSuffix.
func ParseMode(s string) (Mode, error) {
	base, off := strings.CutSuffix(s, NoCacheSuffix)
	depth := 0
	if i := strings.LastIndex(base, "-d"); i > 0 {
		n, err := strconv.Atoi(base[i+2:])
		if err != nil || n < 1 || base[i+2:] != strconv.Itoa(n) {
			return Mode{}, fmt.Errorf("mode %q: -dK wants a draft depth K of at least 1", s)
		}
		base, depth = base[:i], n
	}
	m, err := parseBaseMode(base)
	if err != nil {
		return Mode{}, fmt.Errorf("mode %q: want auto, linear, bN for a DDTree of N nodes (b8, b15, ...), adaptive, adaptive-mtp (choosing between the DFlash drafter and the MTP head), dflash2 or d2bN (the DFlash2 drafter linear or as a DDTree of N nodes) or mtpN for N steps of the MTP head (mtp1..mtp%d); linear, bN, adaptive and adaptive-mtp optionally followed by -dK (DFlash drafts K tokens deep), each by %s", s, MaxMTPSteps, NoCacheSuffix)
	}
	if depth > 0 && (m.Kind == "auto" || (m.Drafter != "" && m.Drafter != ChoiceDrafters)) {
		return Mode{}, fmt.Errorf("mode %q: -dK cuts a DFlash drafter's block; %s drafts no such block", s, base)
	}
	m.Name, m.NoPrefixCache, m.Depth = s, off, depth
	return m, nil
}

// AdaptiveBudget is the largest tree the adaptive mode may choose.
const AdaptiveBudget = 32

// MaxMTPSteps is the most steps an mtpN mode runs the MTP head (mtp.MaxSteps).
const MaxMTPSteps = 8

// baseline reports whether the mode is the sweep's baseline: autoregressive
// decoding with the engine's prefix cache as configured.
func (m Mode) baseline() bool { return m.Kind == "auto" && !m.NoPrefixCache }

func parseBaseMode(s string) (Mode, error) {
	switch s {
	case "auto", "linear":
		return Mode{Name: s, Kind: s}, nil
	case "adaptive":
		return Mode{Name: s, Kind: s, Budget: AdaptiveBudget}, nil
	case "adaptive-mtp":
		return Mode{Name: s, Kind: "adaptive", Budget: AdaptiveBudget, Drafter: ChoiceDrafters}, nil
	case DFlash2Drafter:
		return Mode{Name: s, Kind: "linear", Drafter: DFlash2Drafter}, nil
	}
	for _, c := range []struct {
		prefix, kind, drafter string
		most                  int
	}{{"b", "ddtree", "", math.MaxInt}, {"d2b", "ddtree", DFlash2Drafter, math.MaxInt}, {"mtp", "linear", MTPDrafter, MaxMTPSteps}} {
		if rest, ok := strings.CutPrefix(s, c.prefix); ok {
			if n, err := strconv.Atoi(rest); err == nil && n >= 1 && n <= c.most && rest == strconv.Itoa(n) {
				return Mode{Name: s, Kind: c.kind, Budget: n, Drafter: c.drafter}, nil
			}
		}
	}
	return Mode{}, errors.New("unknown mode")
}

// ParseModes reads a comma-separated list of modes. The baseline (auto) is
// moved first so that every other mode's speedup can be computed as soon as
// its runs finish.
func ParseModes(s string) ([]Mode, error) {
	var modes []Mode
	for _, f := range splitList(s) {
		m, err := ParseMode(f)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(modes, func(o Mode) bool { return o.Name == m.Name }) {
			return nil, fmt.Errorf("mode %s is listed twice", m.Name)
		}
		modes = append(modes, m)
	}
	if len(modes) == 0 {
		return nil, fmt.Errorf("no modes given: list some, e.g. --modes auto,linear,b15")
	}
	slices.SortStableFunc(modes, func(a, b Mode) int {
		return boolInt(b.Kind == "auto") - boolInt(a.Kind == "auto")
	})
	return modes, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ParseInts reads a comma-separated list of distinct positive integers.
func ParseInts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--%s: %q is not a positive integer", flag, f)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("--%s: %d is listed twice", flag, n)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--%s: give at least one value", flag)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Weights the sweep can run besides the checkpoint's own (""): "fp8", the
// checkpoint quantised to block-scaled FP8 as ddflash quantize writes it.
const WeightsFP8 = "fp8"

// ParseWeights reads a comma-separated list of checkpoint (the model's own
// weights, returned as "") and fp8. The checkpoint is moved first: the
// other weights' runs are compared with its runs.
func ParseWeights(s string) ([]string, error) {
	var out []string
	for _, f := range splitList(s) {
		w := f
		switch f {
		case "checkpoint":
			w = ""
		case WeightsFP8:
		default:
			return nil, fmt.Errorf("--weights: %q: want checkpoint (the model's own weights) or fp8 (quantised at load)", f)
		}
		if slices.Contains(out, w) {
			return nil, fmt.Errorf("--weights: %s is listed twice", f)
		}
		out = append(out, w)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--weights: give at least one of checkpoint, fp8")
	}
	slices.SortStableFunc(out, func(a, b string) int { return boolInt(b == "") - boolInt(a == "") })
	return out, nil
}

// Config is one configuration of a sweep, with one result file: a TP
// degree, the weights ("" for the checkpoint's own) and a decoding mode.
type Config struct {
	TP      int
	Weights string
	Mode    Mode
}

// Name names a configuration's files: tp1-auto, tp1-b15, tp1-fp8-auto, ...
func (c Config) Name() string {
	if c.Weights == "" {
		return fmt.Sprintf("tp%d-%s", c.TP, c.Mode.Name)
	}
	return fmt.Sprintf("tp%d-%s-%s", c.TP, c.Weights, c.Mode.Name)
}

// RunKey identifies one run inside a configuration: a workload at one
// output length and concurrency.
type RunKey struct {
	Workload    string `json:"workload"`
	MaxTokens   int    `json:"max_tokens"`
	Concurrency int    `json:"concurrency"`
}

func (k RunKey) String() string {
	return fmt.Sprintf("%s-%dtok-c%d", k.Workload, k.MaxTokens, k.Concurrency)
}

// Plan is a sweep: the Cartesian product of its axes. Each (TP, weights,
// mode) triple is a configuration with one result file; each (max tokens, workload,
// concurrency) triple is a run inside it.
type Plan struct {
	TP    []int
	Modes []Mode
	// Weights lists the weights each (TP, mode) pair runs with ("" for the
	// checkpoint's own; empty means only those). The runs of one pair's
	// weights are measured interleaved, pass by pass, so that their ratio
	// holds on a machine whose load changes.
	Weights     []string
	Workloads   []*Workload
	MaxTokens   []int
	Concurrency []int
	Repeats     int // measured passes over each run's requests
	Warmup      int // unmeasured requests before each run
}

// Runs lists every configuration's runs in the order they execute.
func (p *Plan) Runs() []RunKey {
	var keys []RunKey
	for _, mt := range p.MaxTokens {
		for _, w := range p.Workloads {
			for _, c := range p.Concurrency {
				keys = append(keys, RunKey{Workload: w.Name, MaxTokens: mt, Concurrency: c})
			}
		}
	}
	return keys
}

// Workload finds a workload of the plan by name.
func (p *Plan) Workload(name string) *Workload {
	i := slices.IndexFunc(p.Workloads, func(w *Workload) bool { return w.Name == name })
	if i < 0 {
		return nil
	}
	return p.Workloads[i]
}

// WeightsList is Weights, or the checkpoint's own alone when it is empty.
func (p *Plan) WeightsList() []string {
	if len(p.Weights) == 0 {
		return []string{""}
	}
	return p.Weights
}

// Configs lists the plan's configurations in the order they run, a (TP,
// mode) pair's weights together.
func (p *Plan) Configs() []Config {
	var out []Config
	for _, tp := range p.TP {
		for _, m := range p.Modes {
			for _, w := range p.WeightsList() {
				out = append(out, Config{TP: tp, Weights: w, Mode: m})
			}
		}
	}
	return out
}
