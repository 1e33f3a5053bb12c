package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"ddflash/engine/config"
	"ddflash/kernels"
	"ddflash/mamba"
	"ddflash/tokenizer"
)

// DefaultPageSize is the KV tokens per page when Options leave it 0.
const DefaultPageSize = 16

// Options sizes an engine's caches.
type Options struct {
	Context      int // longest sequence (prompt + output); 0 means the model's max positions
	MaxSeqs      int // GDN state slots, i.e. sequences in flight; 0 means 1
	PageSize     int // KV tokens per page; 0 means DefaultPageSize
	KVTokens     int // KV cache capacity in tokens; 0 means MaxSeqs × (Context + VerifyTokens)
	PrefillChunk int // longest prefill forward (rounded down to 64-token GDN chunks, at least one); 0 means 512
	// KVDType is the KV cache's storage dtype: F32 (the zero value) or BF16.
	KVDType kernels.DType
	// ConvDType is the GDN conv state's storage dtype: F32 (the zero
	// value) or BF16.
	ConvDType kernels.DType
	// SSMDType is the GDN recurrent state's storage dtype (that of its
	// rollback states too): SSMFromConfig, the zero value, follows
	// config.json's mamba_ssm_dtype.
	SSMDType SSMDType
	// VerifyTokens is the most tokens one speculative verify writes to the
	// KV cache (the block, or the tree budget plus its root); 0 without
	// speculation. A tree's nodes sit past the sequence's end until commit.
	VerifyTokens int
	// PrefixSlots is how many GDN checkpoints the prefix cache may hold, in
	// state slots beside MaxSeqs; 0 turns the prefix cache off. Its KV
	// pages come out of KVTokens (see prefix.go).
	PrefixSlots int
	// PrefixInterval, with the prefix cache, also checkpoints a prompt every
	// this many KV pages (rounded up to whole GDN chunks), so that prompts
	// that share only part of another's prefix can reuse it; 0 checkpoints
	// only each prompt's end.
	PrefixInterval int
}

// SSMDType chooses the GDN recurrent state's storage dtype.
type SSMDType uint8

const (
	SSMFromConfig SSMDType = iota // config.json's mamba_ssm_dtype (float32 when absent)
	SSMF32
	SSMBF16
)

// resolve is the storage dtype the choice gives with cfg. A BF16 state is
// rounded after every token (kernels.Backend.GDNRecurrence), on every path.
func (d SSMDType) resolve(cfg *config.Config) (kernels.DType, error) {
	switch d {
	case SSMF32:
		return kernels.F32, nil
	case SSMBF16:
		return kernels.BF16, nil
	case SSMFromConfig:
		switch cfg.SSMDtype {
		case "float32", "":
			return kernels.F32, nil
		case "bfloat16":
			return kernels.BF16, nil
		}
		return 0, fmt.Errorf("config mamba_ssm_dtype %s: the engine keeps the GDN recurrent state in float32 or bfloat16", cfg.SSMDtype)
	}
	return 0, fmt.Errorf("recurrent state dtype %d: want SSMFromConfig, SSMF32 or SSMBF16", d)
}

// Engine is a loaded model with its caches.
type Engine struct {
	Model *Model
	// ValidVocab is the number of real token ids; logits beyond are padding.
	ValidVocab int
	// EOS lists the token ids that end generation.
	EOS []int32
	// Tokenizer is the checkpoint's tokenizer, nil when it ships none.
	Tokenizer *tokenizer.Dir
	// Generation is the checkpoint's generation_config.json, nil when it
	// ships none. Its eos ids are already in EOS; its sampling defaults are
	// for the server to apply to requests that leave them out.
	Generation *GenerationConfig
	Context    int
	// Drafter and Spec enable speculative decoding (Spec.Mode != SpecAuto).
	Drafter Drafter
	Spec    SpecOptions
	// DeviceTaps keeps a drafting request's tapped rows on the device from
	// its first decoding step on, handed to its session there (TapAbsorber)
	// instead of brought home and sent back up with the next draft. New
	// sets it where the model's backend records steps (kernels.Replayer: a
	// GPU, where they cross a bus); prompt rows still come home, for the
	// prefix cache and the first draft.
	DeviceTaps bool
	opts       Options
	prefix     *prefixCache // nil without prefix slots
	// prefixOff stops looking up and storing prefixes (SetPrefixCache).
	prefixOff bool
	// cacheEvents receives the prefix cache's changes (SetCacheEvents).
	cacheEvents func(CacheEvent)
	contexts    contextPool
	verifies    verifyPool
}

// Load reads a checkpoint directory and allocates caches on b.
func Load(b kernels.Backend, dir string, opts Options) (*Engine, error) {
	return LoadParallel([]kernels.Backend{b}, dir, opts)
}

// LoadParallel reads a checkpoint directory split over tensor-parallel ranks,
// one per backend (see tp.go), connected by the backends' own communicator
// (NCCL between GPUs) or else through host memory (LocalComm).
func LoadParallel(backends []kernels.Backend, dir string, opts Options) (*Engine, error) {
	cfg, err := config.Load(dir)
	if err != nil {
		return nil, err
	}
	if _, err := splitConfig(cfg, len(backends)); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	shards, err := loadShards(backends, dir, cfg)
	if err != nil {
		return nil, err
	}
	tok, valid, eos, err := loadTokenizer(dir, cfg)
	if err != nil {
		return nil, err
	}
	gen, found, err := LoadGenerationConfig(dir)
	if err != nil {
		return nil, err
	}
	for _, id := range gen.EOS {
		if id < 0 || int(id) >= valid {
			return nil, fmt.Errorf("%s: generation_config.json: eos_token_id %d outside the vocabulary 0..%d", dir, id, valid-1)
		}
		if !slices.Contains(eos, id) {
			eos = append(eos, id)
		}
	}
	comm, err := connect(backends)
	if err != nil {
		return nil, err
	}
	e, err := New(cfg, shards, comm, valid, eos, opts)
	if err != nil {
		return nil, err
	}
	e.Tokenizer = tok
	if found {
		e.Generation = &gen
	}
	return e, nil
}

// New builds an engine from loaded weights, one shard per tensor-parallel
// rank (comm connects them; nil for one rank).
func New(cfg *config.Config, shards []Shard, comm Comm, validVocab int, eos []int32, opts Options) (*Engine, error) {
	if opts.Context <= 0 || opts.Context > cfg.MaxPositions {
		opts.Context = cfg.MaxPositions
	}
	opts.MaxSeqs = max(opts.MaxSeqs, 1)
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.KVTokens <= 0 {
		opts.KVTokens = opts.MaxSeqs * (opts.Context + opts.VerifyTokens)
	}
	if opts.PrefillChunk <= 0 {
		opts.PrefillChunk = 512
	}
	ssm, err := opts.SSMDType.resolve(cfg)
	if err != nil {
		return nil, err
	}
	rc, err := splitConfig(cfg, len(shards))
	if err != nil {
		return nil, err
	}
	kvShards := make([]KVShard, len(shards))
	stateShards := make([]mamba.Shard, len(shards))
	for i, sh := range shards {
		kvShards[i] = KVShard{B: sh.B, KVDim: KVDim(rc), DType: opts.KVDType}
		stateShards[i] = mamba.Shard{B: sh.B, Shape: StateShape(rc), ConvDType: opts.ConvDType, SSMDType: ssm}
	}
	pages := (opts.KVTokens + opts.PageSize - 1) / opts.PageSize
	kv, err := NewKVCache(kvShards, cfg.NumFull(), opts.PageSize, pages)
	if err != nil {
		return nil, err
	}
	states, err := mamba.NewPool(stateShards, opts.MaxSeqs+max(opts.PrefixSlots, 0))
	if err != nil {
		kv.Close()
		return nil, err
	}
	m, err := NewModel(cfg, shards, kv, states, comm)
	if err != nil {
		kv.Close()
		states.Close()
		return nil, err
	}
	m.ValidVocab = validVocab
	e := &Engine{Model: m, ValidVocab: validVocab, EOS: eos, Context: opts.Context, opts: opts}
	_, e.DeviceTaps = m.Backend().(kernels.Replayer)
	if opts.PrefixSlots > 0 {
		e.prefix = newPrefixCache(opts.PageSize, opts.PrefixSlots, opts.PrefixInterval)
	}
	return e, nil
}

// MaxSeqs is the number of sequences the engine runs at once (its state
// slots, less the prefix cache's checkpoints).
func (e *Engine) MaxSeqs() int { return e.opts.MaxSeqs }

// Close releases everything the engine allocated on its backends: the
// model, its caches and scratch, and the drafter when it can be closed.
// The engine must not be used afterwards.
func (e *Engine) Close() {
	if d, ok := e.Drafter.(interface{ Close() }); ok {
		d.Close()
	}
	e.Drafter = nil
	e.verifies.close()
	e.Model.Close()
}

// Request is one generation.
type Request struct {
	Prompt    []int32
	MaxTokens int
	Sampling  SamplingParams
	IgnoreEOS bool
	// StopTokenIDs end generation like the engine's EOS ids (kept in the output).
	StopTokenIDs []int32
	// MinTokens: EOS and stop tokens cannot be chosen before this many tokens.
	MinTokens int
	// Constraint, when set, restricts which tokens may come next
	// (grammar-constrained decoding); nil means none.
	Constraint Constraint
}

// Constraint restricts the tokens that may follow an output prefix, for
// grammar-constrained decoding (tool_choice, response_format). It must depend
// only on the prefix it is given, so a speculative tree node can be checked
// along its own path; implementations may cache per prefix.
type Constraint interface {
	// Mask sets to -Inf the logits of the tokens that may not follow output
	// (every token this request has generated so far, in order, including a
	// speculative path's). Row covers the valid vocabulary.
	Mask(output []int32, row []float32)
}

// Finish reasons, as in the OpenAI API.
const (
	FinishStop   = "stop"   // an end-of-sequence token
	FinishLength = "length" // max tokens or the context limit
)

// Result is a finished generation.
type Result struct {
	Tokens       []int32        `json:"tokens"`
	Logprobs     []StepLogprobs `json:"logprobs,omitempty"`
	FinishReason string         `json:"finish_reason"`
	Stats        Stats          `json:"stats"`
}

// Stats describes where a generation's time went.
type Stats struct {
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"` // prompt tokens reused from the prefix cache
	OutputTokens int     `json:"output_tokens"`
	PrefillMs    float64 `json:"prefill_ms"`
	DecodeMs     float64 `json:"decode_ms"`
	DecodeTokS   float64 `json:"decode_tok_s"`
	*SpecStats
}

// ErrPromptTooLong is returned when a prompt does not fit the context.
var ErrPromptTooLong = errors.New("prompt too long")

// CheckRequest validates a request against the engine's limits.
func (e *Engine) CheckRequest(r Request) error {
	switch {
	case len(r.Prompt) == 0:
		return errors.New("empty prompt: give at least one token")
	case len(r.Prompt) >= e.Context:
		return fmt.Errorf("%w: the prompt has %d tokens and the context holds %d (prompt plus at least one new token)", ErrPromptTooLong, len(r.Prompt), e.Context)
	case r.MaxTokens < 1:
		return fmt.Errorf("max tokens %d: want at least 1", r.MaxTokens)
	case r.MinTokens < 0 || r.MinTokens > r.MaxTokens:
		return fmt.Errorf("min tokens %d: want 0..max tokens (%d)", r.MinTokens, r.MaxTokens)
	}
	if err := r.Sampling.Validate(); err != nil {
		return err
	}
	inVocab := func(what string, t int32) error {
		if t < 0 || int(t) >= e.ValidVocab {
			return fmt.Errorf("%s token id %d outside the vocabulary 0..%d", what, t, e.ValidVocab-1)
		}
		return nil
	}
	for _, t := range r.Prompt {
		if err := inVocab("prompt", t); err != nil {
			return err
		}
	}
	for _, t := range r.StopTokenIDs {
		if err := inVocab("stop", t); err != nil {
			return err
		}
	}
	for t := range r.Sampling.LogitBias {
		if err := inVocab("logit_bias", t); err != nil {
			return err
		}
	}
	return nil
}

// Generate runs one request to completion: plain autoregressive decoding,
// or speculative decoding with the engine's drafter when e.Spec asks for it.
// (The Scheduler streams tokens as they are produced.) With the prefix
// cache, it then runs the request's checkpoint prefill (see prefix.go)
// before it returns.
func (e *Engine) Generate(ctx context.Context, r Request) (*Result, error) {
	j, err := e.newJob(r)
	if err != nil {
		return nil, err
	}
	// The job's slot and pages are free again before its checkpoint prefill.
	if err := func() error { defer j.close(); return e.run(ctx, j) }(); err != nil {
		return nil, err
	}
	e.checkpointReply(ctx, r.Prompt, j.result().Tokens)
	return j.result(), nil
}

// run steps one job alone until it is done.
func (e *Engine) run(ctx context.Context, j *job) error {
	for !j.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		in, err := j.prepare(e.opts.PrefillChunk)
		if err != nil {
			return err
		}
		out, err := e.forwardBatch([]*job{j}, []SeqInput{in}, j.taps())
		if err != nil {
			return err
		}
		if err := j.complete(&out[0]); err != nil {
			return err
		}
	}
	return nil
}

// output chooses a request's tokens, collects them and decides when it is finished.
type output struct {
	e       *Engine
	r       Request
	proc    *processors
	sampler *Sampler
	res     *Result
}

func newOutput(e *Engine, r Request) *output {
	o := &output{e: e, r: r, sampler: NewSampler(r.Sampling, e.ValidVocab),
		res: &Result{Stats: Stats{PromptTokens: len(r.Prompt)}}}
	o.proc = newProcessors(&o.r, e.EOS, e.ValidVocab)
	return o
}

// maxDeviceTop is the largest top-k whose candidates the device moves
// instead of the rows.
const maxDeviceTop = 256

// deviceTop is how many best logits per row the device may reduce the next
// rows to (SeqInput.Top; 0: whole rows): when the next tokens depend on the
// raw logits' best few alone: greedy (1) or top-k sampling (k), with no
// logprobs and no processor active from the next position on (once
// inactive, processors stay so).
func (o *output) deviceTop() int {
	p := o.r.Sampling
	switch {
	case p.Logprobs > 0 || o.proc.active(len(o.res.Tokens)):
		return 0
	case p.Greedy():
		return 1
	case p.TopK > 0 && p.TopK <= maxDeviceTop && p.TopK < o.e.ValidVocab:
		return p.TopK
	}
	return 0
}

// rowLogits is logit row i of a step's output, nil when the device reduced it.
func (o *output) rowLogits(out *SeqOutput, i int) []float32 {
	if out.Logits == nil {
		return nil
	}
	V := o.e.Model.Cfg.VocabSize
	return out.Logits[i*V : (i+1)*V]
}

// choose picks the token at logit row i of a step's output: the token after
// the output so far followed by path (the drafted tokens from a verify's
// root to that row's node).
func (o *output) choose(out *SeqOutput, i int, path []int32) (int32, error) {
	var tok int32
	var err error
	if k := out.Top; k > 0 {
		tok, err = o.sampler.SampleTop(out.TopLogits[i*k:(i+1)*k], out.TopIDs[i*k:(i+1)*k])
	} else {
		tok, err = o.sampler.Sample(o.proc.apply(o.rowLogits(out, i), o.res.Tokens, path))
	}
	if err != nil {
		return 0, fmt.Errorf("after %d output tokens: %w", len(o.res.Tokens)+len(path), err)
	}
	return tok, nil
}

// emit appends a token chosen from logits and reports whether generation is over.
func (o *output) emit(tok int32, logits []float32) bool {
	if o.r.Sampling.Logprobs > 0 {
		o.res.Logprobs = append(o.res.Logprobs, o.sampler.Logprobs(logits, tok, o.r.Sampling.Logprobs))
	}
	o.res.Tokens = append(o.res.Tokens, tok)
	o.proc.emitted(tok)
	o.res.FinishReason = o.e.finished(o.r, o.res.Tokens)
	return o.res.FinishReason != ""
}

func (o *output) finish(decode time.Duration) *Result {
	st := &o.res.Stats
	st.OutputTokens = len(o.res.Tokens)
	st.DecodeMs = ms(decode)
	if st.DecodeMs > 0 {
		st.DecodeTokS = float64(st.OutputTokens-1) / (st.DecodeMs / 1000)
	}
	return o.res
}

// finished says why generation stops after the latest token, or "": an
// end-of-sequence token (unless ignored) or a stop token id, max tokens, or
// a sequence that fills the context.
func (e *Engine) finished(r Request, out []int32) string {
	last := out[len(out)-1]
	if slices.Contains(r.StopTokenIDs, last) || (!r.IgnoreEOS && slices.Contains(e.EOS, last)) {
		return FinishStop
	}
	if len(out) >= r.MaxTokens || len(r.Prompt)+len(out) >= e.Context {
		return FinishLength
	}
	return ""
}

// sequence is one request's cache state.
type sequence struct {
	kv   SeqKV
	slot int
	len  int // tokens in the caches
}

func (e *Engine) newSequence() (*sequence, error) {
	slot, err := e.Model.States.Acquire()
	if err != nil {
		return nil, err
	}
	return &sequence{slot: slot}, nil
}

func (e *Engine) release(s *sequence) {
	e.Model.KV.Truncate(&s.kv, 0)
	e.Model.States.Release(s.slot)
}

// verifyPool holds the engine's verify scratches: one per request that
// drafts (claimVerify, at its first draft; given back as it ends), made
// when the claims outnumber them and kept for later requests, so that a
// request allocates no scratch. A step hands its k-th verifying sequence
// the k-th scratch whatever its state slot (assignVerifies): the verify
// steps and commits recorded on them (a GPU's graphs, keyed by the scratch:
// stepShape) read the slots at run time and replay for any requests in any
// slots instead of being recorded again. The planner counts rollback
// memory for every running request, so a scratch per drafting request
// stays within it.
type verifyPool struct {
	claims  int
	scratch []*mamba.Verify
}

// claimVerify claims a verify scratch for a request that drafts, making
// one when every scratch is claimed, and making them all again when the
// engine's speculation changed to one they do not serve (more verify
// tokens, another rollback: bench switches modes; a scratch holds nothing
// between steps).
func (e *Engine) claimVerify() error {
	p := &e.verifies
	need := e.Spec.VerifyTokens(e.Drafter.BlockSize())
	if slices.ContainsFunc(p.scratch, func(v *mamba.Verify) bool { return v.MaxTokens() < need || v.Strategy() != e.Spec.Rollback }) {
		p.close()
	}
	for len(p.scratch) <= p.claims {
		v, err := mamba.NewVerify(e.Model.States, e.Spec.Rollback, need)
		if err != nil {
			return err
		}
		p.scratch = append(p.scratch, v)
	}
	p.claims++
	return nil
}

// assignVerifies gives the step's k-th verifying input (one whose job's
// proposal goes beyond its root: job.verifies) the k-th scratch, to verify
// and then commit in.
func (e *Engine) assignVerifies(jobs []*job, inputs []SeqInput) {
	k := 0
	for i, j := range jobs {
		if !j.verifies() {
			continue
		}
		j.verify = e.verifies.scratch[k]
		inputs[i].Spec = j.verify
		k++
	}
}

func (p *verifyPool) close() {
	for _, v := range p.scratch {
		v.Close()
	}
	p.scratch = nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
