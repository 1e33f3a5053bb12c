package planner

import (
	"fmt"
	"strings"

	"ddflash/mamba"
)

// Mode is whose memory rules the plan follows.
type Mode int

const (
	// ModeDDFlash is ddflash's own allocation.
	ModeDDFlash Mode = iota
	// ModeSGLang reproduces how SGLang sizes its pools (docs/cache-sizing.md).
	ModeSGLang
)

// Spec is the decoding mode.
type Spec int

const (
	// SpecAutoregressive decodes one token per step, without a drafter ("auto").
	SpecAutoregressive Spec = iota
	// SpecLinear verifies one DFlash block (a chain) per step.
	SpecLinear
	// SpecDDTree verifies a DDTree of Budget nodes plus the root per step.
	SpecDDTree
)

// DType is an element type of a cache.
type DType struct {
	Name  string
	Bytes int
}

// The dtypes caches can use.
var (
	FP32 = DType{"fp32", 4}
	BF16 = DType{"bf16", 2}
	FP16 = DType{"fp16", 2}
	FP8  = DType{"fp8", 1}
)

var dtypeAliases = map[string]DType{
	"fp32": FP32, "float32": FP32, "f32": FP32,
	"bf16": BF16, "bfloat16": BF16,
	"fp16": FP16, "float16": FP16, "f16": FP16, "half": FP16,
	"fp8": FP8, "fp8_e4m3": FP8, "fp8_e5m2": FP8,
}

// ParseDType reads a dtype name; fp8 is allowed only where allowFP8 is set
// (the KV cache, not the recurrent state).
func ParseDType(s string, allowFP8 bool) (DType, error) {
	d, ok := dtypeAliases[strings.ToLower(s)]
	if !ok || (d == FP8 && !allowFP8) {
		want := "fp32, bf16 or fp16"
		if allowFP8 {
			want = "bf16, fp16, fp8 or fp32"
		}
		return DType{}, fmt.Errorf("dtype %q: want %s", s, want)
	}
	return d, nil
}

var (
	modeNames = []string{ModeDDFlash: "ddflash", ModeSGLang: "sglang"}
	specNames = []string{SpecAutoregressive: "auto", SpecLinear: "linear", SpecDDTree: "ddtree"}
)

func (m Mode) String() string { return modeNames[m] }
func (s Spec) String() string { return specNames[s] }

// The enums and dtypes appear by name in JSON.
func (m Mode) MarshalText() ([]byte, error)  { return []byte(m.String()), nil }
func (s Spec) MarshalText() ([]byte, error)  { return []byte(s.String()), nil }
func (d DType) MarshalText() ([]byte, error) { return []byte(d.Name), nil }

func parseName(kind, s string, names []string) (int, error) {
	for i, n := range names {
		if strings.EqualFold(s, n) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%s %q: want one of %s", kind, s, strings.Join(names, ", "))
}

// ParseMode reads "ddflash" or "sglang".
func ParseMode(s string) (Mode, error) {
	i, err := parseName("compat mode", s, modeNames)
	return Mode(i), err
}

// ParseSpec reads "auto" (autoregressive), "linear" or "ddtree".
func ParseSpec(s string) (Spec, error) {
	i, err := parseName("spec mode", s, specNames)
	return Spec(i), err
}

// Knobs are the planner's inputs besides the model configs. Zero values take
// the defaults named on each field.
type Knobs struct {
	Mode Mode `json:"mode"`

	GPUTotal int64 `json:"gpu_total"` // bytes
	GPUFree  int64 `json:"gpu_free"`  // bytes free before loading; 0: all but the CUDA context

	// MemFraction is, in ddflash mode, the share of GPU memory for weights and
	// caches (default 0.90, the rest is the runtime reserve); in SGLang mode
	// it is --mem-fraction-static (default: SGLang's automatic rule).
	MemFraction float64 `json:"mem_fraction"`
	Reserve     int64   `json:"reserve"` // ddflash mode: runtime reserve in bytes; overrides MemFraction

	KVDtype   DType `json:"kv_dtype"`   // default: CheckpointDType
	SSMDtype  DType `json:"ssm_dtype"`  // default: the config's mamba_ssm_dtype (fp32)
	ConvDtype DType `json:"conv_dtype"` // default: CheckpointDType (SGLang mode: bf16)

	MaxRunningRequests int  `json:"max_running_requests"` // required
	Spec               Spec `json:"spec"`
	Budget             int  `json:"budget"` // DDTree nodes per step; default block_size-1
	// MTPSteps > 0 drafts with the target's own MTP head, applied this many
	// times per draft, instead of a DFlash drafter.
	MTPSteps    int            `json:"mtp_steps,omitempty"`
	TP          int            `json:"tp"`           // tensor-parallel degree; default 1
	Context     int            `json:"context"`      // tokens per request (prompt + output); default 4096
	Rollback    mamba.Strategy `json:"rollback"`     // ddflash mode; SGLang always snapshots
	PrefixSlots int            `json:"prefix_slots"` // ddflash mode: extra state slots kept for prefix caching

	// SGLang mode only.
	MaxMambaCacheSize    int     `json:"max_mamba_cache_size,omitempty"`    // 0: SGLang's ratio rule
	MambaFullMemoryRatio float64 `json:"mamba_full_memory_ratio,omitempty"` // default 0.9
	DisableRadixCache    bool    `json:"disable_radix_cache,omitempty"`
}

// Defaults for zero knobs.
const (
	DefaultContext        = 4096
	DefaultMemFraction    = 0.90
	defaultMambaFullRatio = 0.9
)

// ReportedMambaCacheSize is the --max-mamba-cache-size of the reported
// deployment (docs/cache-sizing.md §6.3): no SGLang rule gives 24 slots there, so
// it was set by hand. `ddflash plan --compat sglang` starts from it.
const ReportedMambaCacheSize = 24

// freeBeforeLoad is the memory free before ddflash or SGLang starts.
func (k Knobs) freeBeforeLoad() int64 {
	if k.GPUFree == 0 {
		return k.GPUTotal
	}
	return k.GPUFree
}

// CheckpointDType is the dtype the KV cache and the conv state take by
// default: the checkpoint's activation dtype, as vLLM's and SGLang's "auto".
// That is fp32 for a float32 checkpoint and bf16 otherwise: for bfloat16
// checkpoints, for FP8 ones (Qwen's -FP8 releases quantise the linear
// weights only; config.json's dtype, bfloat16, is the activations') and for
// float16 ones, whose activations the engine keeps in bf16, not fp16.
func CheckpointDType(t *Target) DType {
	if dtypeBytes(t.Config.Dtype) == 4 {
		return FP32
	}
	return BF16
}

// withCacheDefaults fills the zero cache dtypes: the KV cache and conv
// state in the checkpoint's dtype (SGLang's conv state in bf16 whatever the
// checkpoint, its SGLANG_MAMBA_CONV_DTYPE default), the recurrent state in
// config.json's mamba_ssm_dtype.
func (k Knobs) withCacheDefaults(t *Target) Knobs {
	if k.KVDtype == (DType{}) {
		k.KVDtype = CheckpointDType(t)
	}
	if k.ConvDtype == (DType{}) {
		k.ConvDtype = CheckpointDType(t)
		if k.Mode == ModeSGLang {
			k.ConvDtype = BF16
		}
	}
	if k.SSMDtype == (DType{}) {
		k.SSMDtype = dtypeAliases[t.Config.SSMDtype] // the config parser admits only float32, bfloat16 and float16
	}
	return k
}

// withDefaults fills zero knobs and rejects impossible ones.
func (k Knobs) withDefaults(t *Target) (Knobs, error) {
	if k.TP == 0 {
		k.TP = 1
	}
	if k.Context == 0 {
		k.Context = DefaultContext
	}
	k = k.withCacheDefaults(t)
	if k.MambaFullMemoryRatio == 0 {
		k.MambaFullMemoryRatio = defaultMambaFullRatio
	}
	checks := []struct {
		bad bool
		msg string
	}{
		{k.GPUTotal <= 0, "GPU memory is unknown: pass --gpu NAME or --gpu-mem SIZE"},
		{k.GPUFree < 0 || k.GPUFree > k.GPUTotal, fmt.Sprintf("free GPU memory %s is outside [0, total %s]", FormatBytes(k.GPUFree), FormatBytes(k.GPUTotal))},
		{k.MaxRunningRequests < 1, "--max-running-requests must be at least 1"},
		{k.TP < 1, "--tp must be at least 1"},
		{k.Context < 1, "--context must be at least 1 token"},
		{k.Budget < 0, "--budget must not be negative"},
		{k.MTPSteps < 0, "--mtp-steps must not be negative"},
		{k.PrefixSlots < 0, "prefix-cache slots must not be negative"},
		{k.Reserve < 0 || k.Reserve >= k.GPUTotal, "--reserve must be between 0 and the GPU's memory"},
		{k.MemFraction < 0 || k.MemFraction > 1, fmt.Sprintf("memory fraction %g is outside (0, 1]", k.MemFraction)},
		{k.MaxMambaCacheSize < 0, "--max-mamba-cache-size must not be negative"},
		{k.MambaFullMemoryRatio <= 0, "--mamba-full-memory-ratio must be positive"},
	}
	for _, c := range checks {
		if c.bad {
			return k, fmt.Errorf("%s", c.msg)
		}
	}
	return k, nil
}
