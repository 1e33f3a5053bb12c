package engine

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"ddflash/engine/testmodel"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

// smallEngine loads the ~116M-parameter small preset in BF16 (the dtype of
// real checkpoints) for step-time benchmarks.
func smallEngine(b *testing.B, opts Options) *Engine {
	b.Helper()
	p, err := testmodel.PresetByName("small")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: "bf16"}); err != nil {
		b.Fatal(err)
	}
	e, err := Load(cpu.New(0), dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// benchmarkVerify times one target forward over n speculative tokens after
// a 128-token context (n = 1 is a plain decode step), rolled back each time.
func benchmarkVerify(b *testing.B, n int) {
	e := smallEngine(b, Options{Context: 1024, VerifyTokens: 65})
	s, err := e.newSequence()
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	if _, _, err := e.prefill(s, randomTokens(rng, 128, 300), nil); err != nil {
		b.Fatal(err)
	}
	spec, err := mamba.NewVerify(e.Model.b, e.Model.States.Shape(), mamba.Replay, n)
	if err != nil {
		b.Fatal(err)
	}
	tokens := randomTokens(rng, n, 300)
	b.ResetTimer()
	for range b.N {
		if _, err := e.forward(s, SeqInput{Tokens: tokens, Logits: AllRows, Spec: spec}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSmallDecodeStep(b *testing.B) { benchmarkVerify(b, 1) }
func BenchmarkSmallVerify16(b *testing.B)   { benchmarkVerify(b, 16) }
func BenchmarkSmallVerify33(b *testing.B)   { benchmarkVerify(b, 33) }
func BenchmarkSmallVerify65(b *testing.B)   { benchmarkVerify(b, 65) }

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
