package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// measuredRun is a valid run with its trace, not yet written.
type measuredRun struct {
	Run
	trace []TraceRequest
}

// runResult is one target's outcome of a run: a valid run, or a failure.
type runResult struct {
	run     *measuredRun
	failure *RunFailure
}

// runs measures one run on each target, their passes interleaved (every
// target's warmup, then every target's first pass, and so on), so that the
// targets' ratios hold while the machine's load changes. A target's run that
// cannot be measured gets a failure; err is set only when the sweep must
// stop (interrupted).
func (s *sweeper) runs(ctx context.Context, targets []Target, key RunKey) ([]runResult, error) {
	plan := s.o.Plan
	convs := plan.Workload(key.Workload).passConversations(key.Concurrency)
	requested := plan.Repeats * s.requests(key)
	type state struct {
		t        Target
		before   *SpecCounter
		run      *measuredRun
		tel      Telemetry
		passes   []pass
		firstErr error
		result   runResult
	}
	states := make([]*state, len(targets))
	for i, t := range targets {
		states[i] = &state{t: t}
	}
	failure := func(err error, completed, failed int) *RunFailure {
		return &RunFailure{RunKey: key, At: now(), Error: err.Error(), Requested: requested, Completed: completed, Failed: failed}
	}
	measuring := func(st *state) bool { return st.result.failure == nil && st.firstErr == nil }
	for _, st := range states {
		for range plan.Warmup {
			if _, err := s.generate(ctx, st.t, []Message{{Role: "user", Content: convs[0][0]}}, key.MaxTokens); err != nil {
				if ctx.Err() != nil {
					return nil, interrupted(ctx)
				}
				st.result.failure = failure(fmt.Errorf("warmup request: %w", err), 0, 0)
				break
			}
			s.progress.add(float64(key.MaxTokens))
		}
	}
	for _, st := range states {
		if !measuring(st) {
			continue
		}
		var err error
		if st.before, err = st.t.SpecCounters(ctx); err != nil {
			st.result.failure = failure(fmt.Errorf("read spec-decode counters: %w", err), 0, 0)
			continue
		}
		st.run = &measuredRun{Run: Run{RunKey: key, EnableThinking: s.o.Thinking, Started: now(), Requested: requested}}
		st.tel.Before, st.tel.Note = telemetry(s.o.GPUs)
	}
	for p := range plan.Repeats {
		for _, st := range states {
			if !measuring(st) {
				continue // the run has failed; more passes would only wait on the same fault
			}
			ps, nfailed, err := s.pass(ctx, st.t, convs, key)
			if ctx.Err() != nil {
				return nil, interrupted(ctx)
			}
			st.run.Failed += nfailed
			st.run.Completed += len(ps.reqs)
			st.firstErr = err
			if ps.specAfter, err = st.t.SpecCounters(ctx); err != nil && st.firstErr == nil {
				st.firstErr = fmt.Errorf("read spec-decode counters: %w", err)
			}
			for i := range ps.reqs {
				ps.reqs[i].pass = p
			}
			st.passes = append(st.passes, ps)
		}
	}
	results := make([]runResult, len(states))
	for i, st := range states {
		if st.result.failure == nil {
			st.tel.After, _ = telemetry(s.o.GPUs)
			st.result = finishRun(st.run, st.passes, st.before, st.firstErr, st.tel, requested, failure)
		}
		results[i] = st.result
	}
	return results, nil
}

// finishRun computes a run's metrics from its passes, or the failure that
// makes it no result.
func finishRun(run *measuredRun, passes []pass, before *SpecCounter, firstErr error, tel Telemetry, requested int, failure func(error, int, int) *RunFailure) runResult {
	if firstErr != nil || run.Completed != requested {
		if firstErr == nil {
			firstErr = errors.New("requests went missing")
		}
		return runResult{failure: failure(fmt.Errorf("%d of %d requests completed, %d failed; first error: %w", run.Completed, requested, run.Failed, firstErr), run.Completed, run.Failed)}
	}
	run.Metrics, run.Samples = computeMetrics(passes, before)
	if tput := run.Metrics.OutputThroughput; !(tput > 0) || math.IsInf(tput, 0) {
		return runResult{failure: failure(fmt.Errorf("output throughput %v tok/s: nothing was generated", tput), run.Completed, 0)}
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
	run.Telemetry = tel
	return runResult{run: run}
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
	slots := make(chan struct{}, key.Concurrency)
	start := time.Now()
	for ci, conv := range convs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			var msgs []Message
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
