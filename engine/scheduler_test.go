package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"ddflash/mamba"
)

// runScheduler starts a scheduler and stops it when the test ends.
func runScheduler(t *testing.T, e *Engine, opts SchedulerOptions) *Scheduler {
	s := NewScheduler(e, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// TestSchedulerBatchesLosslessly runs 32 concurrent greedy requests (long
// prompts prefilled in chunks between other requests' steps) through the
// scheduler in every spec mode and compares each output with the same
// request run alone.
func TestSchedulerBatchesLosslessly(t *testing.T) {
	const seed, ctxLen = 6, 128
	rng := rand.New(rand.NewPCG(11, 12))
	var reqs []Request
	var answers [][]int32
	ar := newTestEngine(t, "tiny", seed, Options{Context: ctxLen})
	for i := 0; i < 32; i++ {
		r := Request{Prompt: randomTokens(rng, 1+rng.IntN(60), 290), MaxTokens: 1 + rng.IntN(40)}
		res, err := ar.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
		answers = append(answers, concat(r.Prompt, res.Tokens))
	}
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecLinear, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}, {SpecTree, 32, mamba.Replay}} {
		e := specEngineBlock(t, "tiny", seed, c, pathOracle(answers...), 0.2, ctxLen, 16, Options{MaxSeqs: 8, PrefillChunk: 16})
		s := runScheduler(t, e, SchedulerOptions{StepPrefill: 24})
		streams := make([]*Stream, len(reqs))
		for i, r := range reqs {
			var err error
			if streams[i], err = s.Submit(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
		for i, st := range streams {
			var streamed []int32
			for ev := range st.Events() {
				streamed = append(streamed, ev.Tokens...)
			}
			res, err := st.Wait()
			if err != nil {
				t.Fatalf("%v request %d: %v", c, i, err)
			}
			want := answers[i][len(reqs[i].Prompt):]
			if !slices.Equal(res.Tokens, want) || !slices.Equal(streamed, want) {
				t.Fatalf("%v request %d: batched output differs from alone\n got %v\nwant %v", c, i, res.Tokens, want)
			}
		}
		waitIdle(t, s)
	}
}

// waitIdle waits until the scheduler reports every page and slot free.
func waitIdle(t *testing.T, s *Scheduler) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.State()
		if st.Running == 0 && st.Queued == 0 && st.FreePages == st.TotalPages && st.FreeSlots == st.TotalSlots {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resources not returned: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSchedulerCancellationFreesEverything cancels requests while queued,
// prefilling and decoding, and checks that every KV page and state slot
// returns to the free pools and the survivors finish correctly.
func TestSchedulerCancellationFreesEverything(t *testing.T) {
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecTree, 16, mamba.Replay}} {
		e := specEngineBlock(t, "tiny", 3, c, func([]int32) int32 { return 5 }, 0, 200, 16, Options{MaxSeqs: 4, PrefillChunk: 8})
		s := runScheduler(t, e, SchedulerOptions{StepPrefill: 8, MaxQueue: 32})
		rng := rand.New(rand.NewPCG(1, 9))
		var wg sync.WaitGroup
		var mu sync.Mutex
		outcomes := map[string]int{}
		for i := 0; i < 24; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			if i%3 == 0 {
				ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
			}
			st, err := s.Submit(ctx, Request{Prompt: randomTokens(rng, 1+rng.IntN(100), 290), MaxTokens: 50, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				defer cancel()
				n := 0
				for range st.Events() {
					if n++; i%3 == 1 && n == 2 {
						cancel() // a client that disconnects mid-stream
					}
				}
				res, err := st.Wait()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && len(res.Tokens) == 50:
					outcomes["done"]++
				case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
					outcomes["cancelled"]++
				default:
					t.Errorf("request %d: result %v, error %v", i, res, err)
				}
			}(i)
		}
		wg.Wait()
		if outcomes["done"] == 0 || outcomes["cancelled"] == 0 {
			t.Fatalf("%v: outcomes %v: the test should see both finished and cancelled requests", c, outcomes)
		}
		waitIdle(t, s)
	}
}

func TestSchedulerBounds(t *testing.T) {
	e := newTestEngine(t, "tiny", 1, Options{Context: 64, KVTokens: 64, PageSize: 4})
	s := NewScheduler(e, SchedulerOptions{MaxQueue: 2}) // not running: requests stay queued
	ok := Request{Prompt: []int32{1, 2}, MaxTokens: 4}
	for i := 0; i < 2; i++ {
		if _, err := s.Submit(context.Background(), ok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Submit(context.Background(), ok); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third request: %v, want ErrQueueFull", err)
	}
	if _, err := s.Submit(context.Background(), Request{Prompt: make([]int32, 70), MaxTokens: 1}); !errors.Is(err, ErrPromptTooLong) {
		t.Fatalf("prompt over the context: %v, want ErrPromptTooLong", err)
	}
	if _, err := s.Submit(context.Background(), Request{Prompt: []int32{1}, MaxTokens: 0}); err == nil {
		t.Fatal("max tokens 0 accepted")
	}
}

// TestSchedulerQueueBoundWhileRunning: with one request running and
// MaxQueue waiting behind it, the next submission is refused.
func TestSchedulerQueueBoundWhileRunning(t *testing.T) {
	e := newTestEngine(t, "tiny", 2, Options{Context: 256})
	s := runScheduler(t, e, SchedulerOptions{MaxRunning: 1, MaxQueue: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := Request{Prompt: []int32{1, 2, 3}, MaxTokens: 250, IgnoreEOS: true}
	first, err := s.Submit(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	for s.State().Running == 0 {
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < 2; i++ {
		if _, err := s.Submit(ctx, long); err != nil {
			t.Fatalf("queued request %d: %v", i, err)
		}
	}
	if _, err := s.Submit(ctx, long); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("request beyond the queue bound: %v, want ErrQueueFull", err)
	}
	cancel()
	res, err := first.Wait()
	if !errors.Is(err, context.Canceled) || res == nil {
		t.Fatalf("cancelled request: result %v, error %v; want its partial result and context.Canceled", res, err)
	}
	waitIdle(t, s)
}
