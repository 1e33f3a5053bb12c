package bench

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// Schema versions the record files. A reader refuses other versions.
const (
	ResultSchema   = "ddflash.bench.result/v1"
	FailureSchema  = "ddflash.bench.failure/v1"
	ManifestSchema = "ddflash.bench.sweep/v1"
)

// Record is one configuration's result file (tp1-b15.json). It is rewritten
// after every run, so Runs grows until Complete. SHA256 covers the canonical
// encoding of everything else.
type Record struct {
	Head
	Created  time.Time `json:"created"`
	Updated  time.Time `json:"updated"`
	Runs     []Run     `json:"runs"`
	Complete bool      `json:"complete"`
	SHA256   string    `json:"sha256"`
}

// Head starts every configuration file: what it is, for which setup, and
// the command line that wrote it.
type Head struct {
	Schema string   `json:"schema"`
	Config string   `json:"config"`
	Setup  Setup    `json:"setup"`
	Argv   []string `json:"argv"`
}

// Setup is what makes results comparable: resuming a configuration needs
// the same setup (model paths aside: a model moved off tmpfs is the same model).
type Setup struct {
	Binary  Binary      `json:"binary"`
	Host    Host        `json:"host"`
	Backend BackendInfo `json:"backend"`
	Model   *Checkpoint `json:"model"`
	Drafter *Checkpoint `json:"drafter"`
	// DFlash2 is the DFlash2 drafter of the dflash2 and d2bN modes.
	DFlash2   *Checkpoint    `json:"dflash2_drafter,omitempty"`
	Knobs     Knobs          `json:"knobs"`
	Workloads []WorkloadInfo `json:"workloads"`
	Plan      []RunKey       `json:"plan"`
}

// Binary identifies the program that measured.
type Binary struct {
	Version    string `json:"version"`
	Commit     string `json:"commit"`
	CommitTime string `json:"commit_time"`
	Modified   bool   `json:"modified"`
	GoVersion  string `json:"go_version"`
	SHA256     string `json:"sha256"` // of the executable: "same binary" exactly
}

// Host is the machine that measured.
type Host struct {
	Hostname string    `json:"hostname"`
	OS       string    `json:"os"`
	Arch     string    `json:"arch"`
	CPU      string    `json:"cpu"`
	Cores    int       `json:"cores"`
	GPUs     []GPUInfo `json:"gpus"`
	Driver   string    `json:"gpu_driver"`
	GPUNote  string    `json:"gpu_note"` // why there is no GPU data, when there is none
}

// GPUInfo is a GPU's fixed description.
type GPUInfo struct {
	Index     int    `json:"index"`
	Name      string `json:"name"`
	UUID      string `json:"uuid"`
	MemoryMiB uint64 `json:"memory_mib"`
}

// BackendInfo says what served the requests.
type BackendInfo struct {
	Kind        string `json:"kind"` // "in-process" or "openai"
	URL         string `json:"url"`
	ServedModel string `json:"served_model"`
}

// Checkpoint is a model directory's content hash.
type Checkpoint struct {
	Path   string    `json:"path"`
	SHA256 string    `json:"sha256"` // over the files' names and hashes
	Files  []FileSum `json:"files"`
}

// FileSum is one checkpoint file.
type FileSum struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Knobs are every setting that shapes the measurement.
type Knobs struct {
	TP   int    `json:"tp"`
	Mode string `json:"mode"` // the mode's name: auto, linear, b15
	// Weights is "" for the checkpoint's own weights, fp8 for the
	// checkpoint quantised at load (Plan.Weights).
	Weights string `json:"weights,omitempty"`
	Spec    string `json:"spec"` // auto, linear, ddtree or adaptive
	// Drafter is the mode's Drafter: "" for the DFlash drafter (--draft),
	// dflash2 or mtp.
	Drafter string `json:"drafter,omitempty"`
	// Budget is the nodes verified per step beyond the root: the tree budget,
	// the chain's drafts for linear (block size - 1), 0 for the baseline.
	Budget         int     `json:"budget"`
	BlockSize      int     `json:"block_size"`
	Rollback       string  `json:"rollback"`
	Context        int     `json:"context"`
	MaxRunning     int     `json:"max_running"`
	Threads        int     `json:"threads"`
	Device         string  `json:"device"`
	Temperature    float64 `json:"temperature"`
	Seed           uint64  `json:"seed"`
	IgnoreEOS      bool    `json:"ignore_eos"`
	EnableThinking bool    `json:"enable_thinking"`
	RawPrompts     bool    `json:"raw_prompts,omitempty"` // plain-text completions, no chat template
	Repeats        int     `json:"repeats"`
	Warmup         int     `json:"warmup"`
}

// WorkloadInfo describes a workload's text by hash.
type WorkloadInfo struct {
	Name          string `json:"name"`
	Source        string `json:"source"`
	Conversations int    `json:"conversations"`
	Turns         int    `json:"turns"`
	SHA256        string `json:"sha256"`
}

// Run is one finished, valid run: a workload at one output length and
// concurrency, Repeats passes over its requests.
type Run struct {
	RunKey
	EnableThinking bool      `json:"enable_thinking"`
	Started        time.Time `json:"started"`
	DurationS      float64   `json:"duration_s"` // measured passes only
	Requested      int       `json:"requested"`
	Completed      int       `json:"completed"`
	Failed         int       `json:"failed"`
	InputTokens    int       `json:"total_input_tokens"`
	OutputTokens   int       `json:"total_output_tokens"`
	// TokenCounts says where per-chunk token counts came from: "exact", or
	// "estimated" when an OpenAI server streamed no token ids.
	TokenCounts   string     `json:"token_counts"`
	OutputsSHA256 string     `json:"outputs_sha256"` // of every request's output, in order
	Metrics       Metrics    `json:"metrics"`
	Samples       []Sample   `json:"samples"` // one per pass
	Telemetry     Telemetry  `json:"telemetry"`
	Trace         *TraceFile `json:"trace"`
}

// Metrics are named as vLLM, SGLang and z-lab name them (docs/anchors.md §2.8).
type Metrics struct {
	OutputThroughput      float64      `json:"output_throughput"`
	PerUserTokS           float64      `json:"per_user_tok_s"`
	TTFT                  Dist         `json:"ttft_ms"`
	LaterTurnsTTFT        Dist         `json:"ttft_later_turns_ms"`   // turns after a conversation's first
	PrefixCacheHitRate    *float64     `json:"prefix_cache_hit_rate"` // cached prompt tokens / prompt tokens
	TPOT                  Dist         `json:"tpot_ms"`
	ITLChunk              Dist         `json:"itl_chunk_ms"`
	ITLToken              Dist         `json:"itl_token_ms"`
	E2E                   Dist         `json:"e2el_ms"`
	SlotUse               *float64     `json:"slot_use"` // requests' e2e over concurrency × passes' wall: under 1, slots idled in passes' tails
	AcceptanceLength      *float64     `json:"acceptance_length"`
	AcceptanceRate        *float64     `json:"acceptance_rate"`
	PerPositionAcceptance []float64    `json:"per_position_acceptance"`
	Speedup               *float64     `json:"speedup"`
	SpecDecode            *SpecCounter `json:"spec_decode"`
}

// Dist summarizes one latency over requests (or chunks), in milliseconds.
type Dist struct {
	N      int     `json:"n"`
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
	Std    float64 `json:"std"`
	P90    float64 `json:"p90"`
	P99    float64 `json:"p99"`
}

// SpecCounter counts speculative decoding as vLLM's spec_decode metrics do.
type SpecCounter struct {
	Drafts              int64   `json:"num_drafts"` // verify steps
	DraftTokens         int64   `json:"num_draft_tokens"`
	AcceptedTokens      int64   `json:"num_accepted_tokens"`
	AcceptedPerPosition []int64 `json:"num_accepted_tokens_per_pos"`
	// Schedule is the adaptive policy's probe schedule (--spec adaptive),
	// from ddflash's own counters; nil for other modes and servers.
	Schedule *ScheduleCounter `json:"schedule,omitempty"`
}

// ScheduleCounter counts what the adaptive policy's probe schedule did:
// probes drafted, probes that resumed drafting, and drafting requests that
// stopped; Relapses is its back-off at the reading (a level, not a count).
// Where speculation pays, many probes with few resumes and relapses at or
// past the back-off's cap (6) say the policy decoded plainly where it
// should have drafted.
type ScheduleCounter struct {
	Probes   int64 `json:"num_probes"`
	Resumes  int64 `json:"num_probe_resumes"`
	Stops    int64 `json:"num_drafting_stops"`
	Relapses int64 `json:"probe_relapses"`
}

// Sample is one measured pass, the unit benchstat compares.
type Sample struct {
	OutputThroughput float64  `json:"output_throughput"`
	TPOTMs           float64  `json:"tpot_ms"`
	TTFTMs           float64  `json:"ttft_ms"`
	AcceptanceLength *float64 `json:"acceptance_length"`
}

// Telemetry is the GPUs' state when the run started and ended.
type Telemetry struct {
	Before []GPUState `json:"before"`
	After  []GPUState `json:"after"`
	Note   string     `json:"note"` // why there is none
}

// GPUState is one NVML reading.
type GPUState struct {
	Index         int     `json:"index"`
	SMClockMHz    uint32  `json:"sm_clock_mhz"`
	MemClockMHz   uint32  `json:"mem_clock_mhz"`
	TemperatureC  uint32  `json:"temperature_c"`
	PowerW        float64 `json:"power_w"`
	PowerLimitW   float64 `json:"power_limit_w"`
	MemoryUsedMiB uint64  `json:"memory_used_mib"`
}

// TraceFile points at a run's per-request traces (zstd JSON lines).
type TraceFile struct {
	File   string `json:"file"` // relative to the results directory
	SHA256 string `json:"sha256"`
}

// Failure is a configuration's failure file (tp1-b8.failure.json): the runs
// that could not be measured, and why. Failed runs never enter a Record.
type Failure struct {
	Head
	Updated  time.Time    `json:"updated"`
	Failures []RunFailure `json:"failures"`
	SHA256   string       `json:"sha256"`
}

// RunFailure is one run that failed.
type RunFailure struct {
	RunKey
	At        time.Time `json:"at"`
	Error     string    `json:"error"`
	Requested int       `json:"requested"`
	Completed int       `json:"completed"`
	Failed    int       `json:"failed"`
}

// Manifest is the results directory's sweep.json: the configurations
// the sweep asked for, so that verify notices one that left no file at all.
type Manifest struct {
	Schema  string    `json:"schema"`
	Created time.Time `json:"created"`
	Argv    []string  `json:"argv"`
	Configs []string  `json:"configs"`
	Plan    []RunKey  `json:"plan"`
	SHA256  string    `json:"sha256"`
}

// sealed is a file with a schema name and a self-checksum.
type sealed interface {
	schema() (want, got string)
	sum() *string
}

func (r *Record) schema() (string, string)   { return ResultSchema, r.Schema }
func (r *Record) sum() *string               { return &r.SHA256 }
func (f *Failure) schema() (string, string)  { return FailureSchema, f.Schema }
func (f *Failure) sum() *string              { return &f.SHA256 }
func (s *Manifest) schema() (string, string) { return ManifestSchema, s.Schema }
func (s *Manifest) sum() *string             { return &s.SHA256 }

// checksum is the sha256 of v's canonical JSON with its own sum cleared.
func checksum(v sealed) (string, error) {
	saved := *v.sum()
	*v.sum() = ""
	data, err := json.Marshal(v)
	*v.sum() = saved
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:]), nil
}

// seal sets v's checksum and returns the file content.
func seal(v sealed) ([]byte, error) {
	sum, err := checksum(v)
	if err != nil {
		return nil, err
	}
	*v.sum() = sum
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// errChecksum marks a file whose content does not match its checksum.
var errChecksum = errors.New("checksum mismatch: the file was edited or corrupted after it was written")

// readSealed reads a sealed file strictly: complete JSON, no unknown
// fields, the expected schema, a matching checksum.
func readSealed(path string, v sealed) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	want, _ := v.schema()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("not a valid %s file (truncated or damaged?): %v", want, err)
	}
	if dec.More() {
		return fmt.Errorf("not a valid %s file: data after the JSON object", want)
	}
	if _, got := v.schema(); got != want {
		return fmt.Errorf("schema %q: want %q", got, want)
	}
	sum, err := checksum(v)
	if err != nil {
		return err
	}
	if *v.sum() != sum {
		return errChecksum
	}
	return nil
}
