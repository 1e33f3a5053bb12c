// Package planner splits GPU memory between weights, the KV cache of the
// full-attention layers, Gated DeltaNet state slots and the memory speculative
// decoding needs to roll states back, before anything is loaded. One pure
// function, Compute, serves `ddflash plan`, `ddflash tune` and serve's
// start-up check.
package planner

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/config"
	"ddflash/kernels"
	"ddflash/mamba"
)

// cudaContextBytes is what the CUDA context and driver hold before any weight
// loads. Fitted, together with sglangOtherStaticBytes: the reported deployment
// (docs/cache-sizing.md §6) pins the memory SGLang had left for KV and Mamba to a
// 64 KiB window, and 607 MiB and 234 MiB are the whole-MiB pair nearest the
// doc's estimates (about 0.59 GiB and 0.25 GiB) that land in it.
const cudaContextBytes = 607 << 20

// Models are the configs a plan is made for.
type Models struct {
	Target  *Target
	Drafter *dflash.Config // nil for autoregressive decoding
	// Beside are more DFlash drafters loaded with Drafter (a bench sweep of
	// --draft's and --draft2's modes): their weights and KV are counted
	// too, each whole on rank 0. Only ddflash's rules load them.
	Beside []*dflash.Config
}

// Segment is one use of GPU memory, per rank.
type Segment struct {
	Use   string `json:"use"`
	Bytes int64  `json:"bytes"`
}

// MaxRunning is how many requests can run at once, and what limits it.
type MaxRunning struct {
	Requested int `json:"requested"`
	KVCap     int `json:"kv_cap"`   // requests of Context tokens the KV cache holds
	SlotCap   int `json:"slot_cap"` // requests the state slots allow
	Effective int `json:"effective"`
}

// Bytes are the unit costs, per rank.
type Bytes struct {
	PerKVToken         int64 `json:"per_kv_token"`
	PerStateSlot       int64 `json:"per_state_slot"`
	RollbackPerRequest int64 `json:"rollback_per_request"`
	DraftKVPerToken    int64 `json:"draft_kv_per_token"`
	DraftKVPerRequest  int64 `json:"draft_kv_per_request"` // sliding-window drafter layers
	TargetWeights      int64 `json:"target_weights"`
	DraftWeights       int64 `json:"draft_weights"`
}

// Plan is the memory split for one set of knobs. Memory sums to the GPU's
// total; every figure is per tensor-parallel rank.
type Plan struct {
	Settings         Knobs      `json:"settings"`
	DraftTokens      int        `json:"draft_tokens"` // D: tokens verified per step beyond the committed one
	MemFraction      float64    `json:"mem_fraction"`
	Bytes            Bytes      `json:"bytes"`
	CacheBudget      int64      `json:"cache_budget"` // for KV, state slots and rollback
	StateSlots       int        `json:"state_slots"`
	SlotsPerRequest  int        `json:"slots_per_request"`
	RollbackRequests int        `json:"rollback_requests"` // requests whose rollback memory is reserved
	KVTokens         int64      `json:"kv_tokens"`
	MaxRunning       MaxRunning `json:"max_running_requests"`
	Memory           []Segment  `json:"memory"`
	Warnings         []string   `json:"warnings"`

	shortfall string      // why nothing can run; empty when the plan fits
	state     mamba.Shape // GDN state geometry per rank
}

// Fits returns nil when at least one request of the planned context can run,
// and otherwise an error that says what to change.
func (p *Plan) Fits() error {
	if p.shortfall == "" {
		return nil
	}
	return errors.New(p.shortfall)
}

// rank is the per-GPU geometry under tensor parallelism.
type rank struct {
	state        mamba.Shape
	kvHeads      int // target KV heads per rank
	draftKVHeads int
}

// Compute plans the memory of one GPU rank.
func Compute(m Models, k Knobs) (*Plan, error) {
	if m.Target == nil {
		return nil, errors.New("planner: no target model")
	}
	k, err := k.withDefaults(m.Target)
	if err != nil {
		return nil, err
	}
	switch {
	case k.Spec != SpecAutoregressive && k.MTPSteps > 0:
		if m.Target.Config.MTPLayers < 1 {
			return nil, fmt.Errorf("--spec mtp needs the target's MTP head; %s has mtp_num_hidden_layers 0", m.Target.Name)
		}
		// With a DFlash drafter too, both are loaded (--with-mtp, a bench
		// of mtpN and DFlash modes).
		if m.Drafter != nil {
			if err := m.Drafter.CheckTarget(m.Target.Config); err != nil {
				return nil, err
			}
		}
	case k.Spec != SpecAutoregressive:
		if m.Drafter == nil {
			return nil, fmt.Errorf("--spec %s needs a DFlash drafter: pass --draft NAME|DIR", k.Spec)
		}
		if err := m.Drafter.CheckTarget(m.Target.Config); err != nil {
			return nil, err
		}
	default:
		m.Drafter, m.Beside, k.MTPSteps = nil, nil, 0 // autoregressive decoding loads no drafter
	}
	for _, d := range m.Beside {
		if err := d.CheckTarget(m.Target.Config); err != nil {
			return nil, err
		}
	}
	if len(m.Beside) > 0 && k.Mode == ModeSGLang {
		return nil, errors.New("SGLang loads one drafter: no drafters beside it")
	}
	r, err := splitRank(m, k.TP, k.Mode == ModeSGLang)
	if err != nil {
		return nil, err
	}
	p := &Plan{Settings: k, MaxRunning: MaxRunning{Requested: k.MaxRunningRequests}, state: r.state}
	p.unitCosts(m, k, r)
	if k.Mode == ModeSGLang {
		p.planSGLang(m, k)
	} else {
		p.planDDFlash(k)
	}
	p.limit(m.Target.Config.MaxPositions)
	return p, nil
}

// draftTokens is D: a linear block verifies block_size tokens (the anchor and
// block_size-1 drafts; an MTP chain: its steps); a DDTree verifies its
// budget plus the root.
func draftTokens(k Knobs, d *dflash.Config) int {
	block := k.MTPSteps + 1
	if d != nil {
		block = d.BlockSize
	}
	switch k.Spec {
	case SpecLinear:
		return block
	case SpecDDTree:
		if k.Budget == 0 {
			return block
		}
		return k.Budget + 1
	}
	return 0
}

func (p *Plan) unitCosts(m Models, k Knobs, r rank) {
	t := m.Target.Config
	p.DraftTokens = draftTokens(k, m.Drafter)
	if k.Spec == SpecDDTree {
		p.Settings.Budget = p.DraftTokens - 1
	}
	kvPerLayer := func(heads, headDim int) int64 { return int64(2 * heads * headDim * k.KVDtype.Bytes) }
	p.Bytes.PerKVToken = int64(t.NumFull()) * kvPerLayer(r.kvHeads, t.HeadDim)
	p.Bytes.PerStateSlot = mamba.SlotBytes(r.state, k.SSMDtype.Bytes, k.ConvDtype.Bytes)
	d := m.Drafter
	if k.Mode == ModeSGLang {
		// SGLang shards everything, the drafter too, and loads the vision
		// tower of a multimodal checkpoint.
		p.Bytes.TargetWeights = (textBytes(t) + m.Target.Vision.Params*int64(dtypeBytes(t.Dtype))) / int64(k.TP)
		if d != nil {
			p.Bytes.DraftWeights = d.WeightParams() * int64(dtypeBytes(d.Dtype)) / int64(k.TP)
		}
	} else {
		// ddflash replicates the embedding on every rank, splits the rest
		// (the LM head by vocabulary) and runs the drafter whole on rank 0,
		// the rank planned here.
		p.Bytes.TargetWeights = ddflashRankBytes(t, k.TP)
		for _, d := range append([]*dflash.Config{d}, m.Beside...) {
			if d != nil {
				p.Bytes.DraftWeights += d.WeightParams() * int64(dtypeBytes(d.Dtype))
			}
		}
	}
	if d == nil && k.MTPSteps == 0 {
		return
	}
	if d != nil {
		p.unitDraftCosts(d, k, r.draftKVHeads, kvPerLayer)
	}
	for _, d := range m.Beside {
		p.unitDraftCosts(d, k, d.NumKVHeads, kvPerLayer)
	}
	if k.MTPSteps > 0 {
		// The head's one attention layer pages every token; ddflash runs
		// it whole on rank 0, SGLang shards it like the target.
		weights, kv := mtpBytes(t), kvPerLayer(t.NumKVHeads, t.HeadDim)
		if k.Mode == ModeSGLang {
			weights, kv = weights/int64(k.TP), kvPerLayer(r.kvHeads, t.HeadDim)
		}
		p.Bytes.DraftWeights += weights
		p.Bytes.DraftKVPerToken += kv
	}
	rollback := k.Rollback
	if k.Mode == ModeSGLang {
		rollback = mamba.Snapshot
	}
	p.Bytes.RollbackPerRequest = rollbackBytes(rollback, r.state, k, p.DraftTokens)
}

// unitDraftCosts adds a DFlash drafter's KV costs, with kvHeads of its KV
// heads on the rank planned.
func (p *Plan) unitDraftCosts(d *dflash.Config, k Knobs, kvHeads int, kvPerLayer func(heads, headDim int) int64) {
	draftLayerToken := kvPerLayer(kvHeads, d.HeadDim)
	if k.Mode == ModeSGLang {
		// SGLang's draft pool keeps every drafter layer for every token.
		p.Bytes.DraftKVPerToken += int64(d.NumLayers) * draftLayerToken
	} else {
		// ddflash keeps a ring per request for the sliding layers (the
		// window and a block, in whole pages) and pages only the full layers.
		p.Bytes.DraftKVPerToken += int64(d.NumLayers-d.NumSliding()) * draftLayerToken
		p.Bytes.DraftKVPerRequest += int64(d.NumSliding()) * int64(d.RingTokens(engine.DefaultPageSize, k.Context)) * draftLayerToken
	}
}

// rollbackBytes is one request's rollback memory for a strategy.
func rollbackBytes(how mamba.Strategy, s mamba.Shape, k Knobs, draftTokens int) int64 {
	return how.RollbackBytes(s, k.SSMDtype.Bytes, k.ConvDtype.Bytes, draftTokens, k.Spec == SpecDDTree)
}

// ddflashRankBytes is the target weight bytes rank 0 holds under ddflash's
// tensor parallelism: the whole embedding, a 1/tp slice of everything else,
// including the LM head (its own slice even when tied, once tp > 1).
func ddflashRankBytes(c *config.Config, tp int) int64 {
	embed := embedBytes(c)
	rest := textBytes(c) - embed
	if tp == 1 {
		return textBytes(c)
	}
	if c.TieWordEmbeddings {
		rest += embed
	}
	return embed + rest/int64(tp)
}

// splitRank divides heads over TP ranks. KV heads are replicated when there
// are fewer of them than ranks, as SGLang and vLLM do. The drafter is split
// too when sharded (SGLang), else it stays whole on rank 0 (ddflash), whose
// LM head slices need the vocabulary to divide.
func splitRank(m Models, tp int, shardDrafter bool) (rank, error) {
	t := m.Target.Config
	var r rank
	var errs []error
	exact := func(what string, n int) int {
		if n%tp != 0 {
			errs = append(errs, fmt.Errorf("--tp %d does not divide the %d %s", tp, n, what))
		}
		return n / tp
	}
	kv := func(what string, n int) int {
		if (n >= tp && n%tp != 0) || (n < tp && tp%n != 0) {
			errs = append(errs, fmt.Errorf("--tp %d and the %d %s cannot be split evenly", tp, n, what))
		}
		return max(1, n/tp)
	}
	exact("attention heads", t.NumHeads)
	r.kvHeads = kv("KV heads", t.NumKVHeads)
	r.state = mamba.Shape{
		Layers:     t.NumLinear(),
		ConvDim:    t.ConvDim() / tp,
		ConvKernel: t.ConvKernel,
		GDN: kernels.GDNShape{
			KeyHeads:   exact("GDN key heads", t.LinearKeyHeads),
			ValueHeads: exact("GDN value heads", t.LinearValueHeads),
			KeyDim:     t.LinearKeyDim,
			ValueDim:   t.LinearValueDim,
		},
	}
	exact("MLP intermediate size", t.IntermediateSize)
	switch d := m.Drafter; {
	case !shardDrafter:
		exact("vocabulary rows", t.VocabSize)
		if d != nil {
			r.draftKVHeads = d.NumKVHeads
		}
	case d != nil:
		exact("drafter attention heads", d.NumHeads)
		r.draftKVHeads = kv("drafter KV heads", d.NumKVHeads)
	}
	return r, errors.Join(errs...)
}

// planDDFlash is ddflash's own allocation: one state slot per running request
// (plus any prefix-cache slots), rollback memory for every running request,
// and the rest of the budget as KV cache.
func (p *Plan) planDDFlash(k Knobs) {
	free := k.freeBeforeLoad()
	reserve := k.Reserve
	if reserve > 0 {
		p.MemFraction = 1 - float64(reserve)/float64(k.GPUTotal)
	} else {
		p.MemFraction = cmp.Or(k.MemFraction, DefaultMemFraction)
		reserve = k.GPUTotal - int64(float64(k.GPUTotal)*p.MemFraction)
	}
	b := p.Bytes
	p.CacheBudget = free - cudaContextBytes - reserve - b.TargetWeights - b.DraftWeights
	p.StateSlots = k.MaxRunningRequests + k.PrefixSlots
	p.SlotsPerRequest = 1
	p.RollbackRequests = k.MaxRunningRequests
	states := int64(p.StateSlots) * b.PerStateSlot
	rollback := int64(p.RollbackRequests) * b.RollbackPerRequest
	draftWindows := int64(k.MaxRunningRequests) * b.DraftKVPerRequest
	left := p.CacheBudget - states - rollback - draftWindows
	p.KVTokens = max(0, left/(b.PerKVToken+b.DraftKVPerToken))
	p.MaxRunning.SlotCap = p.StateSlots - k.PrefixSlots
	if left < 0 {
		p.shortfall = fmt.Sprintf("weights (%s), the runtime reserve (%s) and state and rollback memory for %d %s (%s) need %s more than this GPU has: %s",
			FormatBytes(b.TargetWeights+b.DraftWeights), FormatBytes(reserve), k.MaxRunningRequests, plural(k.MaxRunningRequests, "request"),
			FormatBytes(states+rollback+draftWindows), FormatBytes(-left), remedies(k, "lower the reserve"))
	}
	p.Memory = []Segment{
		{"CUDA context", cudaContextBytes},
		{"other processes", k.GPUTotal - free},
		{reserveUse, reserve},
		{"target weights", b.TargetWeights},
		{"draft weights", b.DraftWeights},
		{"KV cache", p.KVTokens * b.PerKVToken},
		{"draft KV cache", p.KVTokens*b.DraftKVPerToken + draftWindows},
		{"GDN state slots", int64(k.MaxRunningRequests) * b.PerStateSlot},
		{"prefix-cache checkpoints", int64(k.PrefixSlots) * b.PerStateSlot},
		{rollbackUse(k.Rollback), rollback},
	}
	p.closeMemory(k.GPUTotal)
}

const reserveUse = "runtime reserve (activations, workspace)"

// EngineBytes is what the plan assigns to the engine's own allocations:
// weights, caches, state slots and rollback (not the CUDA context, other
// processes, the runtime reserve for activations, or what is left).
func (p *Plan) EngineBytes() int64 {
	var n int64
	for _, seg := range p.Memory[:len(p.Memory)-1] { // the last one closes the sum
		switch seg.Use {
		case "CUDA context", "other processes", reserveUse:
		default:
			n += seg.Bytes
		}
	}
	return n
}

// closeMemory adds what is left of the GPU, so the segments sum to its total:
// a rounding remainder, or a negative shortfall when the plan does not fit.
func (p *Plan) closeMemory(total int64) {
	left := total - sumSegments(p.Memory)
	use := "unassigned"
	if left < 0 {
		use = "over budget"
	}
	p.Memory = append(p.Memory, Segment{use, left})
}

func rollbackUse(r mamba.Strategy) string {
	if r == mamba.Snapshot {
		return "rollback: per-token state snapshots"
	}
	return "rollback: replay inputs"
}

func sumSegments(s []Segment) int64 {
	var n int64
	for _, seg := range s {
		n += seg.Bytes
	}
	return n
}

// remedies lists what can make a plan fit, most specific first.
func remedies(k Knobs, first string) string {
	r := []string{first, "lower --max-running-requests"}
	if k.Mode == ModeDDFlash && k.Rollback == mamba.Snapshot && k.Spec != SpecAutoregressive {
		r = append(r, "use --rollback replay")
	}
	r = append(r, "raise --tp", "or use a larger GPU")
	return strings.Join(r, ", ")
}

// limit sets the effective concurrency, the shortfall and the warnings.
func (p *Plan) limit(maxPositions int) {
	k := p.Settings
	p.MaxRunning.KVCap = int(min(p.KVTokens/int64(k.Context), 1<<30))
	p.MaxRunning.Effective = min(k.MaxRunningRequests, p.MaxRunning.KVCap, p.MaxRunning.SlotCap)
	if p.shortfall == "" && p.KVTokens < int64(k.Context) {
		p.shortfall = fmt.Sprintf("the KV cache holds %s tokens, less than one request of %s tokens: %s",
			FormatCount(p.KVTokens), FormatCount(int64(k.Context)), remedies(k, "lower --context"))
	}
	if p.shortfall == "" && p.MaxRunning.Effective < 1 {
		p.shortfall = fmt.Sprintf("%d state slots at %d per request leave no room for a running request: raise --max-mamba-cache-size", p.StateSlots, p.SlotsPerRequest)
	}
	p.Warnings = p.warnings(maxPositions)
}

// EngineSSMDType is the engine's recurrent-state choice for d; false for
// a dtype the engine cannot store it in.
func EngineSSMDType(d DType) (engine.SSMDType, bool) {
	ssm, ok := map[DType]engine.SSMDType{FP32: engine.SSMF32, BF16: engine.SSMBF16}[d]
	return ssm, ok
}

// EngineOptions is the engine sizing the plan sets: its KV tokens, one
// state slot per running request, the context and the cache dtypes. It
// refuses what the engine cannot store (fp16 or fp8 caches and states);
// prefix-cache slots become the engine's checkpoints.
func (p *Plan) EngineOptions() (engine.Options, error) {
	k := p.Settings
	opts, err := engineDTypes(k)
	if err != nil {
		return engine.Options{}, err
	}
	opts.Context, opts.MaxSeqs, opts.KVTokens, opts.PrefixSlots = k.Context, p.MaxRunning.Effective, int(p.KVTokens), k.PrefixSlots
	return opts, nil
}

// EngineCacheDTypes is the engine's storage for the cache dtypes k names,
// each zero one taking its default for t as in a plan: engine options with
// only KVDType, ConvDType and SSMDType set, for an engine sized without a
// plan. It refuses what the engine cannot store.
func EngineCacheDTypes(t *Target, k Knobs) (engine.Options, error) {
	return engineDTypes(k.withCacheDefaults(t))
}

// engineDTypes is the engine's storage for k's cache dtypes.
func engineDTypes(k Knobs) (engine.Options, error) {
	storage := map[DType]kernels.DType{FP32: kernels.F32, BF16: kernels.BF16}
	kv, okKV := storage[k.KVDtype]
	conv, okConv := storage[k.ConvDtype]
	ssm, okSSM := EngineSSMDType(k.SSMDtype)
	switch {
	case !okKV:
		return engine.Options{}, fmt.Errorf("--kv-dtype %s: the engine stores the KV cache in bf16 or fp32", k.KVDtype.Name)
	case !okConv:
		return engine.Options{}, fmt.Errorf("--conv-dtype %s: the engine stores the conv state in bf16 or fp32", k.ConvDtype.Name)
	case !okSSM:
		return engine.Options{}, fmt.Errorf("--ssm-dtype %s: the engine keeps the GDN recurrent state in bf16 or fp32", k.SSMDtype.Name)
	}
	return engine.Options{KVDType: kv, ConvDType: conv, SSMDType: ssm}, nil
}
