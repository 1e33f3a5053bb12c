package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"ddflash/engine/safetensors"
	"ddflash/internal/testrand"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

// smallEngine loads the ~116M-parameter small preset in BF16 (the dtype of
// real checkpoints) for step-time benchmarks, on all cores.
func smallEngine(b *testing.B, opts Options) *Engine {
	b.Helper()
	e, err := Load(cpu.New(0), writeTestModel(b, "small", 1, "bf16"), opts)
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// verifyStep prepares a sequence with a 128-token context and returns a
// function that runs one target forward over n speculative tokens (n = 1 is
// a plain decode step), returning the taps' hidden states, rolled back each
// time.
func verifyStep(b *testing.B, e *Engine, n int, taps []int) func() {
	s, err := e.newSequence()
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	if _, _, err := e.prefill(s, randomTokens(rng, 128, 300), nil); err != nil {
		b.Fatal(err)
	}
	spec, err := mamba.NewVerify(e.Model.States, mamba.Replay, n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { spec.Close(); e.release(s) })
	tokens := randomTokens(rng, n, 300)
	return func() {
		if _, err := e.forward(s, SeqInput{Tokens: tokens, Logits: AllRows, Spec: spec}, taps); err != nil {
			b.Fatal(err)
		}
	}
}

func benchmarkVerify(b *testing.B, n int) {
	step := verifyStep(b, smallEngine(b, Options{Context: 1024, VerifyTokens: 65}), n, nil)
	b.ResetTimer()
	for range b.N {
		step()
	}
}

func BenchmarkSmallDecodeStep(b *testing.B) { benchmarkVerify(b, 1) }
func BenchmarkSmallVerify16(b *testing.B)   { benchmarkVerify(b, 16) }
func BenchmarkSmallVerify33(b *testing.B)   { benchmarkVerify(b, 33) }
func BenchmarkSmallVerify65(b *testing.B)   { benchmarkVerify(b, 65) }

// BenchmarkSmallTensorParallel times decode and 16-token verify steps of
// the small preset on one rank with two threads and on two ranks with one
// thread each, interleaved in one run, and reports TP 2 time / TP 1 time.
func BenchmarkSmallTensorParallel(b *testing.B) {
	dir := writeTestModel(b, "small", 1, "bf16")
	opts := Options{Context: 1024, VerifyTokens: 16}
	one, err := Load(cpu.New(2), dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	two := loadTP(b, dir, 2, opts)
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("rows%d", n), func(b *testing.B) {
			spent, _ := interleaved(b, verifyStep(b, one, n, nil), verifyStep(b, two, n, nil))
			b.ReportMetric(spent[0].Seconds()*1000/float64(b.N), "tp1-ms/step")
			b.ReportMetric(spent[1].Seconds()*1000/float64(b.N), "tp2-ms/step")
			b.ReportMetric(spent[1].Seconds()/spent[0].Seconds(), "tp2/tp1")
		})
	}
}

// BenchmarkSmallBatching runs 16 requests one after another and then all at
// once through the scheduler on the small preset, whose decode step is
// memory-bound on a CPU, and reports concurrent time / sequential time.
func BenchmarkSmallBatching(b *testing.B) {
	e := smallEngine(b, Options{Context: 256, MaxSeqs: 16})
	rng := rand.New(rand.NewPCG(3, 3))
	var reqs []Request
	for range 16 {
		reqs = append(reqs, Request{Prompt: randomTokens(rng, 16, 300), MaxTokens: 16, IgnoreEOS: true})
	}
	var sequential, concurrent time.Duration
	for range b.N {
		t0 := time.Now()
		for _, r := range reqs {
			if _, err := e.Generate(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
		sequential += time.Since(t0)
		s := NewScheduler(e, SchedulerOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		t1 := time.Now()
		var streams []*Stream
		for _, r := range reqs {
			st, err := s.Submit(context.Background(), r)
			if err != nil {
				b.Fatal(err)
			}
			streams = append(streams, st)
		}
		for _, st := range streams {
			if _, err := st.Wait(); err != nil {
				b.Fatal(err)
			}
		}
		concurrent += time.Since(t1)
		cancel()
		<-done
	}
	b.ReportMetric(concurrent.Seconds()/sequential.Seconds(), "concurrent/sequential")
}

// BenchmarkSampler chooses one token from a row of the real vocabulary
// (248,320 logits shaped like a language model's, see testrand.LanguageModelRow), as the
// scheduler does for every request at every step.
func BenchmarkSampler(b *testing.B) {
	const V = 248320
	logits := testrand.LanguageModelRow(rand.New(rand.NewPCG(1, 2)), V)
	for _, c := range []struct {
		name string
		p    SamplingParams
	}{
		{"greedy", SamplingParams{}},
		{"T1", SamplingParams{Temperature: 1}},
		{"T0.7-topk20", SamplingParams{Temperature: 0.7, TopK: 20}},
		{"T1-topp0.95", SamplingParams{Temperature: 1, TopP: 0.95}},
		{"T2-topp0.9", SamplingParams{Temperature: 2, TopP: 0.9}}, // a flat nucleus of about 170,000 tokens
		{"T1-minp0.05", SamplingParams{Temperature: 1, MinP: 0.05}},
		{"greedy-logprobs5", SamplingParams{Logprobs: 5}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := NewSampler(c.p, V)
			for b.Loop() {
				tok, err := s.Sample(logits)
				if err != nil {
					b.Fatal(err)
				}
				if c.p.Logprobs > 0 {
					s.Logprobs(logits, tok, c.p.Logprobs)
				}
			}
		})
	}
}

// BenchmarkSmallFP8 times decode and 16-token verify steps of the small
// preset with bf16 weights and with FP8 weights (the same model quantised),
// interleaved in one run, and reports bf16 time / FP8 time (the FP8
// speedup) and the weight bytes each step reads per second of it.
func BenchmarkSmallFP8(b *testing.B) {
	opts := Options{Context: 1024, VerifyTokens: 16}
	var engines [2]*Engine
	var bytes [2]int
	for i, dtype := range []string{"bf16", "fp8"} {
		dir := writeTestModel(b, "small", 1, dtype)
		bytes[i] = stepWeightBytes(b, dir)
		e, err := Load(cpu.New(0), dir, opts)
		if err != nil {
			b.Fatal(err)
		}
		engines[i] = e
	}
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("rows%d", n), func(b *testing.B) {
			spent, _ := interleaved(b, verifyStep(b, engines[0], n, nil), verifyStep(b, engines[1], n, nil))
			for i, dtype := range []string{"bf16", "fp8"} {
				b.ReportMetric(spent[i].Seconds()*1000/float64(b.N), dtype+"-ms/step")
				b.ReportMetric(float64(bytes[i])*float64(b.N)/spent[i].Seconds()/1e9, dtype+"-GB/s")
			}
			b.ReportMetric(spent[0].Seconds()/spent[1].Seconds(), "fp8-speedup")
		})
	}
}

// stepWeightBytes is the bytes of weights a forward pass reads: the whole
// checkpoint in dir but an untied embedding table, of which it reads a row
// per token.
func stepWeightBytes(b *testing.B, dir string) int {
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer ckpt.Close()
	names := ckpt.Names()
	untied := slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, "lm_head.weight") })
	total := 0
	for _, name := range names {
		if t, _ := ckpt.Tensor(name); !untied || !strings.HasSuffix(name, "embed_tokens.weight") {
			total += len(t.Data)
		}
	}
	return total
}

// BenchmarkDecodeTaps compares a decode step (one row) of the default
// pair's target with and without the hidden-state taps its drafter
// conditions on (4 of its 8 layers), interleaved: what an adaptive
// request's autoregressive steps pay to keep the drafter's context, the
// layer outputs the forward computes anyway, copied out.
func BenchmarkDecodeTaps(b *testing.B) {
	e, err := Load(cpu.New(1), "../models/default/target", Options{Context: 512, MaxSeqs: 2, VerifyTokens: 1})
	if err != nil {
		b.Fatal(err)
	}
	spent, _ := interleaved(b, verifyStep(b, e, 1, nil), verifyStep(b, e, 1, []int{1, 3, 5, 7}))
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "tapped/plain")
}

// interleaved runs b.N rounds of a then b and returns the time each took,
// in all and at least: an A/B ratio on a machine whose load changes while
// it runs (the least times are the runs that had the cores to themselves).
func interleaved(b *testing.B, a, c func()) (spent, least [2]time.Duration) {
	b.ResetTimer()
	for range b.N {
		for i, step := range [2]func(){a, c} {
			t0 := time.Now()
			step()
			d := time.Since(t0)
			spent[i] += d
			if least[i] == 0 || d < least[i] {
				least[i] = d
			}
		}
	}
	return spent, least
}

// BenchmarkPrefillScaling prefills prompts of 64 to 4,096 tokens (in the
// engine's 512-token forwards) on the small preset and reports ms per
// prompt token: apart from attention's term, which grows linearly with the
// position, the figure should stay flat as the prompt grows.
func BenchmarkPrefillScaling(b *testing.B) {
	e := smallEngine(b, Options{Context: 4096 + 64})
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{64, 256, 1024, 4096} {
		prompt := randomTokens(rng, n, 300)
		b.Run(fmt.Sprintf("tokens%d", n), func(b *testing.B) {
			for range b.N {
				s, err := e.newSequence()
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := e.prefill(s, prompt, nil); err != nil {
					b.Fatal(err)
				}
				e.release(s)
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N*n), "ms/token")
		})
	}
}
