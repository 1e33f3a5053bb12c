package dflash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels/cpu"
)

// benchModes are the decoding modes compared in one run.
var benchModes = []engine.SpecOptions{
	{Mode: engine.SpecAuto},
	{Mode: engine.SpecLinear},
	{Mode: engine.SpecTree, Budget: 8},
	{Mode: engine.SpecTree, Budget: 16},
	{Mode: engine.SpecTree, Budget: 32},
	{Mode: engine.SpecTree, Budget: 64},
}

func modeName(s engine.SpecOptions) string {
	if s.Mode == engine.SpecTree {
		return fmt.Sprintf("b%d", s.Budget)
	}
	return s.Mode.String()
}

// benchmarkPair generates greedily with each mode on one target/drafter pair
// and reports decode tok/s and the acceptance length τ, so the modes are
// compared as ratios within one run.
func benchmarkPair(b *testing.B, target, draft string, prompt []int32, maxTokens int) {
	for _, spec := range benchModes {
		b.Run(modeName(spec), func(b *testing.B) {
			be := cpu.New(0)
			verify, err := VerifyTokens(draft, spec)
			if err != nil {
				b.Fatal(err)
			}
			e, err := engine.Load(be, target, engine.Options{Context: len(prompt) + maxTokens + 1, VerifyTokens: verify})
			if err != nil {
				b.Fatal(err)
			}
			if spec.Mode != engine.SpecAuto {
				if err := Attach(e, draft, spec); err != nil {
					b.Fatal(err)
				}
			}
			var tokens int
			var decodeMs, tau float64
			b.ResetTimer()
			for range b.N {
				res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true})
				if err != nil {
					b.Fatal(err)
				}
				tokens += res.Stats.OutputTokens - 1
				decodeMs += res.Stats.DecodeMs
				if res.Stats.SpecStats != nil {
					tau += res.Stats.AcceptanceLength / float64(b.N)
				}
			}
			b.ReportMetric(float64(tokens)/(decodeMs/1000), "tok/s")
			if spec.Mode != engine.SpecAuto {
				b.ReportMetric(tau, "tau")
			}
		})
	}
}

// BenchmarkSpecSmallRandom runs the ~116M-parameter small preset with a
// random drafter: τ stays near 1, so this measures what speculation costs
// when drafts are never accepted (verify width, drafting, rollback).
func BenchmarkSpecSmallRandom(b *testing.B) {
	target, draft := writePair(b, "small", 1, "bf16", testmodel.DraftOptions{DType: "bf16"})
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(300))
	}
	benchmarkPair(b, target, draft, prompt, 32)
}

// BenchmarkSpecDefaultPair runs the embedded default pair (the trained tiny
// target and its drafter) on a held-out-style prompt: real acceptance, so
// the ratios show what speculation buys on this CPU.
func BenchmarkSpecDefaultPair(b *testing.B) {
	const target, draft = "../models/default/target", "../models/default/draft"
	e, err := engine.Load(cpu.New(1), target, engine.Options{})
	if err != nil {
		b.Fatal(err)
	}
	prompt := e.Tokenizer.Encode("And it came to pass, when the king heard the words of the book of the law, that he rent his clothes.\n")
	benchmarkPair(b, target, draft, prompt, 128)
}
