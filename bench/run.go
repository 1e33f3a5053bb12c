package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
)

// measuredRun is a valid run with its trace, not yet written.
type measuredRun struct {
	Run
	trace []TraceRequest
}

// measuring is a run in progress: warmed up, with the passes so far.
type measuring struct {
	s         *sweeper
	key       RunKey
	convs     [][]string
	requested int
	run       *measuredRun
	tel       Telemetry
	before    *SpecCounter
	passes    []pass
	firstErr  error
}

func (r *measuring) failure(err error, completed, failed int) *RunFailure {
	return &RunFailure{RunKey: r.key, At: now(), Error: err.Error(), Requested: r.requested, Completed: completed, Failed: failed}
}

// startRun sends a run's warmup requests and reads the counters its
// passes start from. A run that cannot start returns a failure; err is set
// only when the sweep must stop (interrupted).
func (s *sweeper) startRun(ctx context.Context, t Target, key RunKey) (*measuring, *RunFailure, error) {
	plan := s.o.Plan
	r := &measuring{s: s, key: key, convs: plan.Workload(key.Workload).passConversations(key.Concurrency), requested: plan.Repeats * s.requests(key)}
	for range plan.Warmup {
		if _, err := s.generate(ctx, t, []Message{{Role: "user", Content: r.convs[0][0]}}, key.MaxTokens); err != nil {
			if ctx.Err() != nil {
				return nil, nil, interrupted(ctx)
			}
			return nil, r.failure(fmt.Errorf("warmup request: %w", err), 0, 0), nil
		}
		s.progress.add(float64(key.MaxTokens))
	}
	var err error
	if r.before, err = t.SpecCounters(ctx); err != nil {
		return nil, r.failure(fmt.Errorf("read spec-decode counters: %w", err), 0, 0), nil
	}
	r.run = &measuredRun{Run: Run{RunKey: key, EnableThinking: s.o.Thinking, Started: now(), Requested: r.requested}}
	r.tel.Before, r.tel.Note = telemetry(s.o.GPUs)
	return r, nil, nil
}

// pass measures one pass of the run on t; a failed request sets firstErr.
// err is set only when the sweep must stop (interrupted).
func (r *measuring) pass(ctx context.Context, t Target) error {
	ps, nfailed, err := r.s.pass(ctx, t, r.convs, r.key)
	if ctx.Err() != nil {
		return interrupted(ctx)
	}
	r.run.Failed += nfailed
	r.run.Completed += len(ps.reqs)
	if err != nil && r.firstErr == nil {
		r.firstErr = err
	}
	if ps.specAfter, err = t.SpecCounters(ctx); err != nil && r.firstErr == nil {
		r.firstErr = fmt.Errorf("read spec-decode counters: %w", err)
	}
	for i := range ps.reqs {
		ps.reqs[i].pass = len(r.passes)
	}
	r.passes = append(r.passes, ps)
	return nil
}

// finish computes the run's metrics from its passes, or says why it failed.
func (r *measuring) finish() (*measuredRun, *RunFailure) {
	run, passes := r.run, r.passes
	r.tel.After, _ = telemetry(r.s.o.GPUs)
	if r.firstErr != nil || run.Completed != r.requested {
		if r.firstErr == nil {
			r.firstErr = errors.New("requests went missing")
		}
		return nil, r.failure(fmt.Errorf("%d of %d requests completed, %d failed; first error: %w", run.Completed, r.requested, run.Failed, r.firstErr), run.Completed, run.Failed)
	}
	run.Metrics, run.Samples = computeMetrics(passes, r.key.Concurrency, r.before)
	if tput := run.Metrics.OutputThroughput; !(tput > 0) || math.IsInf(tput, 0) {
		return nil, r.failure(fmt.Errorf("output throughput %v tok/s: nothing was generated", tput), run.Completed, 0)
	}
	var all []measured
	for _, p := range passes {
		all = append(all, p.reqs...)
		run.DurationS += p.wall.Seconds()
	}
	run.TokenCounts = "exact"
	for _, m := range all {
		run.InputTokens += m.resp.PromptTokens
		run.OutputTokens += m.resp.OutputTokens
		if m.resp.Chunks[0].Tokens == 0 {
			run.TokenCounts = "estimated"
		}
		run.trace = append(run.trace, traceRequest(m))
	}
	run.OutputsSHA256 = outputsHash(all)
	run.Telemetry = r.tel
	return run, nil
}

func interrupted(ctx context.Context) error {
	return fmt.Errorf("interrupted (%v): the run in progress was dropped, finished runs are saved; continue with --resume", context.Cause(ctx))
}

func traceRequest(m measured) TraceRequest {
	r := m.resp
	t := TraceRequest{
		Pass: m.pass, Conversation: m.conversation, Turn: m.turn, StartMs: millis(m.start),
		TTFTMs: millis(m.ttft()), E2EMs: millis(r.E2E), PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens,
		Finish: r.Finish, Tokens: r.Tokens, Text: r.Text, Spec: r.Spec,
	}
	for _, c := range r.Chunks {
		t.Chunks = append(t.Chunks, TraceChunk{Ms: millis(c.At), Tokens: c.Tokens})
	}
	return t
}

// pass sends every conversation once, at most concurrency at a time, each
// conversation's turns in order. It returns the successful requests in
// order, the number that failed or were never sent after a failed turn, and
// the first error.
func (s *sweeper) pass(ctx context.Context, t Target, convs [][]string, key RunKey) (pass, int, error) {
	var (
		mu       sync.Mutex
		reqs     []measured
		failed   int
		firstErr error
		wg       sync.WaitGroup
	)
	// The garbage of what ran before (another mode's pass, interleaved) is
	// collected now, not on this pass's time.
	runtime.GC()
	slots := make(chan struct{}, key.Concurrency)
	start := time.Now()
	for ci, conv := range convs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			var msgs []Message
			if system := s.o.Plan.Workload(key.Workload).System; system != "" {
				msgs = append(msgs, Message{Role: "system", Content: system})
			}
			for turn, text := range conv {
				msgs = append(msgs, Message{Role: "user", Content: text})
				sent := time.Since(start)
				resp, err := s.generate(ctx, t, msgs, key.MaxTokens)
				s.progress.add(float64(key.MaxTokens))
				mu.Lock()
				if err != nil {
					failed += len(conv) - turn
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				reqs = append(reqs, measured{conversation: ci, turn: turn, start: sent, resp: resp})
				mu.Unlock()
				msgs = append(msgs, Message{Role: "assistant", Content: resp.Text})
			}
		})
	}
	wg.Wait()
	slices.SortFunc(reqs, func(a, b measured) int {
		return cmp.Or(cmp.Compare(a.conversation, b.conversation), cmp.Compare(a.turn, b.turn))
	})
	return pass{wall: time.Since(start), reqs: reqs}, failed, firstErr
}

// generate sends one request and rejects an empty answer.
func (s *sweeper) generate(ctx context.Context, t Target, msgs []Message, maxTokens int) (*Response, error) {
	if s.o.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.o.RequestTimeout)
		defer cancel()
	}
	resp, err := t.Generate(ctx, Request{
		Messages: msgs, MaxTokens: maxTokens, Temperature: s.o.Temperature, Seed: s.o.Seed,
		IgnoreEOS: s.o.IgnoreEOS, EnableThinking: s.o.Thinking, Raw: s.o.Raw,
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Chunks) == 0 || resp.OutputTokens == 0 {
		return nil, errors.New("empty completion: the server answered but streamed no tokens")
	}
	return resp, nil
}
