package engine

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

// collect reads a stream to its end: the tokens its events carried, and
// its result and error.
func collect(st *Stream) ([]int32, *Result, error) {
	var streamed []int32
	for ev := range st.Events() {
		streamed = append(streamed, ev.Tokens...)
	}
	res, err := st.Wait()
	return streamed, res, err
}

// TestSchedulerSurvivesRequestPanic makes the drafter panic for one request
// (its prompt starts with a poison token) while others decode beside it: that
// request alone fails with a PanicError, the others finish as they would
// alone, every page and slot comes back, and the scheduler goes on serving.
func TestSchedulerSurvivesRequestPanic(t *testing.T) {
	const poison = 7
	oracle := func(seq []int32) int32 {
		if seq[0] == poison {
			panic("drafter bug")
		}
		return 5
	}
	e := specEngineBlock(t, "tiny", 3, specCase{SpecTree, 8, mamba.Replay}, oracle, 0, 96, 8, Options{MaxSeqs: 4})
	s := runScheduler(t, e, SchedulerOptions{})
	good := []Request{
		{Prompt: []int32{11, 12, 13}, MaxTokens: 30, IgnoreEOS: true},
		{Prompt: []int32{21, 22}, MaxTokens: 25, IgnoreEOS: true},
	}
	var want [][]int32
	for _, r := range good { // alone first: the outputs to expect
		st, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		_, res, err := collect(st)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, res.Tokens)
	}
	before := s.State()

	bad, err := s.Submit(context.Background(), Request{Prompt: []int32{poison, 12, 13}, MaxTokens: 30, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	var streams []*Stream
	for _, r := range good {
		st, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	_, _, err = collect(bad)
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "drafter bug" || len(pe.Stack) == 0 {
		t.Fatalf("poisoned request: error %v, want the drafter's panic", err)
	}
	for i, st := range streams {
		streamed, res, err := collect(st)
		if err != nil || !slices.Equal(res.Tokens, want[i]) || !slices.Equal(streamed, want[i]) {
			t.Fatalf("request %d beside the panic: %v, tokens %v (streamed %v), want %v", i, err, res.Tokens, streamed, want[i])
		}
	}
	waitIdle(t, s)
	if after := s.State(); after != before {
		t.Fatalf("state after the panic %+v, before %+v", after, before)
	}
}

// panickyBackend panics in the next embedding lookup once armed: a fault
// inside the batched forward, which no single request can be blamed for.
type panickyBackend struct {
	kernels.Backend
	armed atomic.Bool
}

func (b *panickyBackend) Embedding(out, table, ids kernels.Buffer, n, dim int) {
	if b.armed.CompareAndSwap(true, false) {
		panic("kernel bug")
	}
	b.Backend.Embedding(out, table, ids, n, dim)
}

// TestSchedulerSurvivesForwardPanic panics inside the forward of a batch of
// two requests: both fail with a PanicError, their pages and slots return,
// and the same requests then run to the right answer.
func TestSchedulerSurvivesForwardPanic(t *testing.T) {
	b := &panickyBackend{Backend: cpu.New(2)}
	e := newTestEngineOn(t, b, "tiny", 4, Options{Context: 64, MaxSeqs: 2})
	reqs := []Request{{Prompt: []int32{3, 4, 5}, MaxTokens: 12}, {Prompt: []int32{9}, MaxTokens: 20}}
	var want [][]int32
	for _, r := range reqs {
		res, err := e.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, res.Tokens)
	}

	s := NewScheduler(e, SchedulerOptions{})
	submit := func() []*Stream {
		var out []*Stream
		for _, r := range reqs {
			st, err := s.Submit(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, st)
		}
		return out
	}
	b.armed.Store(true)
	failing := submit() // queued before Run, so that the first step batches both
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for i, st := range failing {
		var pe *PanicError
		if _, _, err := collect(st); !errors.As(err, &pe) || pe.Value != "kernel bug" {
			t.Fatalf("request %d in the panicking batch: error %v, want the kernel's panic", i, err)
		}
	}
	waitIdle(t, s)
	for i, st := range submit() {
		if _, res, err := collect(st); err != nil || !slices.Equal(res.Tokens, want[i]) {
			t.Fatalf("request %d after the panic: %v, tokens %v, want %v", i, err, res.Tokens, want[i])
		}
	}
	waitIdle(t, s)
}

// TestStreamBufferIsBounded submits a request for many tokens and reads
// nothing until it ends: the scheduler must not block on the reader, the
// channel holds no more than eventBuffer events, and together they carry
// every token.
func TestStreamBufferIsBounded(t *testing.T) {
	e := newTestEngine(t, "tiny", 2, Options{Context: 128})
	s := runScheduler(t, e, SchedulerOptions{})
	st, err := s.Submit(context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 100, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := cap(st.events); c != eventBuffer {
		t.Fatalf("event buffer of %d for 100 tokens, want %d", c, eventBuffer)
	}
	<-st.done // the request ends although nobody reads its events
	streamed, res, err := collect(st)
	if err != nil || len(res.Tokens) != 100 || !slices.Equal(streamed, res.Tokens) {
		t.Fatalf("error %v: streamed %v, result %v", err, streamed, res.Tokens)
	}
}

// sessionPanicDrafter panics in NewSession for prompts that start with
// poison: a fault while a request is being set up, after it took its slot.
type sessionPanicDrafter struct {
	Drafter
	poison int32
}

func (d sessionPanicDrafter) NewSession(prompt []int32) (DraftSession, error) {
	if prompt[0] == d.poison {
		panic("session bug")
	}
	return d.Drafter.NewSession(prompt)
}

// TestSchedulerFreesSlotWhenNewJobPanics: a panic while a request's job is
// set up (here in the drafter's NewSession, after the job took its state
// slot and KV) fails that request alone and gives back its slot and pages;
// the scheduler then serves the next request with every slot.
func TestSchedulerFreesSlotWhenNewJobPanics(t *testing.T) {
	const poison = 7
	e := specEngineBlock(t, "tiny", 3, specCase{SpecTree, 8, mamba.Replay}, func([]int32) int32 { return 5 }, 0, 96, 8, Options{MaxSeqs: 2})
	e.Drafter = sessionPanicDrafter{Drafter: e.Drafter, poison: poison}
	s := runScheduler(t, e, SchedulerOptions{})
	before := s.State()
	for range 3 { // more failures than slots: a leak would leave none
		st, err := s.Submit(context.Background(), Request{Prompt: []int32{poison, 1}, MaxTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		var pe *PanicError
		if _, _, err := collect(st); !errors.As(err, &pe) || pe.Value != "session bug" {
			t.Fatalf("poisoned request: error %v, want the session's panic", err)
		}
	}
	waitIdle(t, s)
	if after := s.State(); after != before {
		t.Fatalf("state after the panics %+v, before %+v", after, before)
	}
	st, err := s.Submit(context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 8, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, res, err := collect(st); err != nil || len(res.Tokens) != 8 {
		t.Fatalf("a request after the panics: %v, %v", res, err)
	}
}
