package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
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
	reqs, answers := randomRequests(t, newTestEngine(t, "tiny", seed, Options{Context: ctxLen}), rng, 32, 60, 40)
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecLinear, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}, {SpecTree, 32, mamba.Replay}} {
		e := specEngineBlock(t, "tiny", seed, c, pathOracle(answers...), 0.2, ctxLen, 16, Options{MaxSeqs: 8, PrefillChunk: 16})
		s := runScheduler(t, e, SchedulerOptions{StepPrefill: 24})
		for i, st := range submitAll(t, s, reqs) {
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

// randomRequests makes n greedy requests of random prompts and lengths and
// their answers (prompt and output) from autoregressive decoding on ar.
func randomRequests(t *testing.T, ar *Engine, rng *rand.Rand, n, maxPrompt, maxTokens int) (reqs []Request, answers [][]int32) {
	t.Helper()
	for range n {
		r := Request{Prompt: randomTokens(rng, 1+rng.IntN(maxPrompt), 290), MaxTokens: 1 + rng.IntN(maxTokens)}
		res, err := ar.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
		answers = append(answers, concat(r.Prompt, res.Tokens))
	}
	return reqs, answers
}

// submitAll submits every request at once.
func submitAll(t *testing.T, s *Scheduler, reqs []Request) []*Stream {
	t.Helper()
	streams := make([]*Stream, len(reqs))
	for i, r := range reqs {
		var err error
		if streams[i], err = s.Submit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	return streams
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

// TestSchedulerLongAndShortShareThePool sizes the KV cache by a fixed
// token count (as a memory plan does), not by requests × context: a long
// request holds most pages while short ones come and go beside it, two at
// a time; a request that could never fit is refused naming both page
// counts; nothing deadlocks and every output equals autoregressive decoding.
func TestSchedulerLongAndShortShareThePool(t *testing.T) {
	const seed, ctxLen = 8, 256
	rng := rand.New(rand.NewPCG(21, 22))
	ar := newTestEngine(t, "tiny", seed, Options{Context: ctxLen})
	long := Request{Prompt: randomTokens(rng, 20, 290), MaxTokens: 100, IgnoreEOS: true}
	reqs := []Request{long}
	for range 6 {
		reqs = append(reqs, Request{Prompt: randomTokens(rng, 3, 290), MaxTokens: 10, IgnoreEOS: true})
	}
	var answers [][]int32
	for _, r := range reqs {
		res, err := ar.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, res.Tokens)
	}
	// Pages of 4: the long request's worst case is (120 + 16 verify) / 4 = 34
	// pages, a short one's (13 + 16) / 4 → 8, of 50.
	e := specEngineBlock(t, "tiny", seed, specCase{SpecLinear, 0, mamba.Replay}, pathOracle(), 1, ctxLen, 16, Options{MaxSeqs: 4, KVTokens: 200})
	s := runScheduler(t, e, SchedulerOptions{})
	if _, err := s.Submit(context.Background(), Request{Prompt: randomTokens(rng, 200, 290), MaxTokens: 40}); !errors.Is(err, ErrPromptTooLong) ||
		!strings.Contains(err.Error(), "needs 64 KV pages") || !strings.Contains(err.Error(), "has 50") {
		t.Fatalf("a request that can never fit: %v, want ErrPromptTooLong naming 64 and 50 pages", err)
	}
	streams := make([]*Stream, len(reqs))
	for i, r := range reqs {
		var err error
		if streams[i], err = s.Submit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	for i := len(reqs) - 1; i >= 0; i-- { // the short ones first
		res, err := streams[i].Wait()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Tokens, answers[i]) {
			t.Fatalf("request %d: output differs from autoregressive decoding", i)
		}
		if i == 1 {
			select {
			case <-streams[0].done:
				t.Fatal("the long request finished before the short ones: they did not run beside it")
			default:
			}
		}
	}
	waitIdle(t, s)
}

// TestVerifyScratchesFollowTheSpec switches one engine's speculation
// between batches, as bench does between modes: a budget of 8 alone (one
// verify scratch of 9 rows), a budget of 2 four at a time (three more
// scratches, of 3 rows), then a budget of 8 four at a time again, whose
// steps hand out every scratch: each must have been made again for 9 rows
// (claimVerify), and every output equals autoregressive decoding.
func TestVerifyScratchesFollowTheSpec(t *testing.T) {
	const seed, ctxLen = 5, 96
	rng := rand.New(rand.NewPCG(21, 22))
	reqs, answers := randomRequests(t, newTestEngine(t, "tiny", seed, Options{Context: ctxLen}), rng, 4, 20, 30)
	big, small := specCase{SpecTree, 8, mamba.Replay}, specCase{SpecTree, 2, mamba.Replay}
	e := specEngineBlock(t, "tiny", seed, big, pathOracle(answers...), 0.3, ctxLen, 16, Options{MaxSeqs: 4})
	check := func(phase string, i int, got []int32) {
		t.Helper()
		if want := answers[i][len(reqs[i].Prompt):]; !slices.Equal(got, want) {
			t.Fatalf("%s, request %d: %v, autoregressive %v", phase, i, got, want)
		}
	}
	res, err := e.Generate(context.Background(), reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	check("budget 8 alone", 0, res.Tokens)
	for _, c := range []specCase{small, big} {
		setOracleDrafter(e, seed, c, pathOracle(answers...), 0.3, 16)
		s := NewScheduler(e, SchedulerOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		for i, st := range submitAll(t, s, reqs) {
			res, err := st.Wait()
			if err != nil {
				t.Fatalf("%v, request %d: %v", c, i, err)
			}
			check(c.String(), i, res.Tokens)
		}
		waitIdle(t, s)
		cancel()
		<-done
	}
}
