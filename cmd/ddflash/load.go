package main

import (
	"flag"
	"fmt"
	"runtime"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/kernels/device"
	"ddflash/mamba"
	"ddflash/models"
)

// modelFlags are the flags every command that runs the model shares.
type modelFlags struct {
	model, draft, spec, rollback, device string
	budget, context, threads, tp         int

	// wrapBackend, when set, wraps each rank's backend (tests count allocations).
	wrapBackend func(kernels.Backend) kernels.Backend
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.model, "model", "", "target model directory (Hugging Face layout; default: the embedded default model)")
	fs.StringVar(&m.draft, "draft", "", "DFlash drafter directory (z-lab layout), for --spec linear|ddtree (default with the default model: its drafter)")
	fs.StringVar(&m.spec, "spec", "auto", "decoding: auto (autoregressive), linear (DFlash chain) or ddtree")
	fs.IntVar(&m.budget, "budget", 15, "DDTree node budget B (non-root nodes per verify)")
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

// specOptions parses the speculative-decoding flags.
func (m *modelFlags) specOptions() (engine.SpecOptions, error) {
	mode, err := engine.ParseSpecMode(m.spec)
	if err != nil {
		return engine.SpecOptions{}, err
	}
	rollback, err := mamba.ParseStrategy(m.rollback)
	if err != nil {
		return engine.SpecOptions{}, err
	}
	if mode == engine.SpecTree && m.budget < 1 {
		return engine.SpecOptions{}, fmt.Errorf("--budget %d: a tree needs at least one node", m.budget)
	}
	if mode != engine.SpecAuto && m.draft == "" {
		return engine.SpecOptions{}, fmt.Errorf("--spec %s needs a drafter: give --draft DIR", mode)
	}
	return engine.SpecOptions{Mode: mode, Budget: m.budget, Rollback: rollback}, nil
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
	if spec.Mode != engine.SpecAuto {
		if opts.VerifyTokens, err = dflash.VerifyTokens(m.draft, spec); err != nil {
			return nil, err
		}
	}
	e, err := engine.LoadParallel(backends, m.model, opts)
	if err != nil {
		return nil, err
	}
	if spec.Mode != engine.SpecAuto {
		if err := dflash.Attach(e, m.draft, spec); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// unplannedSizing sizes an engine for sequences requests without a memory
// plan (generate, bench): KV and conv state in bf16, as plan assumes by default.
func unplannedSizing(sequences int) engine.Options {
	return engine.Options{MaxSeqs: sequences, KVDType: kernels.BF16, ConvDType: kernels.BF16}
}
