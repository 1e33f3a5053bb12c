package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
)

// ErrQueueFull is returned by Submit when the wait queue is at its bound.
var ErrQueueFull = errors.New("the server is at capacity: the request queue is full, retry later")

// ErrShutdown fails requests still queued or running when the scheduler stops.
var ErrShutdown = errors.New("the engine is shutting down")

// SchedulerOptions bounds what the scheduler admits.
type SchedulerOptions struct {
	// MaxRunning caps requests decoding at once; 0 means one per GDN state slot.
	MaxRunning int
	// MaxQueue caps requests waiting for admission; 0 means 4×MaxRunning.
	MaxQueue int
	// StepPrefill caps prompt tokens fed per step over all requests, so a long
	// prompt is prefilled in chunks between other requests' decode steps; 0
	// means the engine's prefill chunk. Chunks end at 64-token GDN chunk
	// boundaries (see job.prefillEnd), so under a smaller cap a step still
	// feeds one request up to 63 tokens more.
	StepPrefill int
}

// Event is what one step produced for a request: one token, or several when
// a speculative verify accepted drafts.
type Event struct {
	Tokens   []int32
	Logprobs []StepLogprobs
	// CachedTokens is how many prompt tokens the prefix cache supplied.
	CachedTokens int
}

// PanicError is a failure from a panic: the scheduler's, for a request the
// engine panicked on. Its message holds the panic's value, which is for a
// server's log, not for clients.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// recovered turns a recovered panic value into a PanicError.
func recovered(v any) *PanicError { return &PanicError{Value: v, Stack: debug.Stack()} }

// guard runs f, which works on one request, and makes a panic in it that
// request's error.
func guard(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = recovered(v)
		}
	}()
	return f()
}

// eventBuffer is a Stream's channel capacity. The scheduler never blocks on
// a slow reader: while an event waits unread, new tokens are held back and go
// out together in the next one, and the last slot is kept for the final
// event. So a request's buffer is a constant, whatever its max tokens.
const eventBuffer = 2

// Stream is a submitted request: events as tokens are produced, then the result.
type Stream struct {
	events chan Event
	done   chan struct{}
	res    *Result
	err    error
}

// Events delivers the request's tokens as they are produced; it is closed
// when the request ends.
func (s *Stream) Events() <-chan Event { return s.events }

// Wait blocks until the request ends and returns its result. A request that
// failed or was cancelled after it started returns its partial result too.
func (s *Stream) Wait() (*Result, error) {
	<-s.done
	return s.res, s.err
}

// SchedulerState is a snapshot of the scheduler's load and free resources.
type SchedulerState struct {
	Running, Queued       int
	MaxRunning            int // SchedulerOptions.MaxRunning
	FreePages, TotalPages int
	FreeSlots, TotalSlots int
	// PrefixPages and PrefixCheckpoints are what the prefix cache holds;
	// IdlePrefixPages are those of its pages that no request holds.
	PrefixPages, PrefixCheckpoints, IdlePrefixPages int
	// Checkpointing counts checkpoint prefills waiting or running (not in
	// Running: they are no requests).
	Checkpointing int
}

// Scheduler batches requests: every step feeds each running request's next
// input (a prompt chunk, a token, or a speculative proposal with its own
// tree) to one target forward.
//
// KV policy: a request is admitted only when the pages for its whole worst
// case (prompt + max tokens + one verify) are free beyond what running
// requests may still claim, so a running request never runs out of KV; a
// request that could never fit is rejected by Submit.
type Scheduler struct {
	e        *Engine
	opts     SchedulerOptions
	incoming chan *pending

	mu      sync.Mutex
	state   SchedulerState
	queued  int // submitted and not yet admitted or ended: bounded by MaxQueue
	waiting []*pending
	// replies are finished requests' prompts and outputs waiting for a
	// checkpoint prefill (see prefix.go), newest last.
	replies [][]int32
}

type pending struct {
	ctx    context.Context
	req    Request
	stream *Stream
	job    *job
	pages  int // worst-case KV pages reserved at admission
	sent   int // tokens already delivered as events
	ended  bool
}

// NewScheduler makes a scheduler over the engine; call Run to start it.
func NewScheduler(e *Engine, opts SchedulerOptions) *Scheduler {
	slots := e.MaxSeqs()
	if opts.MaxRunning <= 0 || opts.MaxRunning > slots {
		opts.MaxRunning = slots
	}
	if opts.MaxQueue <= 0 {
		opts.MaxQueue = 4 * opts.MaxRunning
	}
	if opts.StepPrefill <= 0 {
		opts.StepPrefill = e.opts.PrefillChunk
	}
	s := &Scheduler{e: e, opts: opts, incoming: make(chan *pending, opts.MaxQueue)}
	s.state.TotalPages, s.state.FreePages = e.Model.KV.Pages(), e.Model.KV.FreePages()
	s.state.TotalSlots, s.state.FreeSlots = slots, e.freeSeqSlots()
	s.state.MaxRunning = opts.MaxRunning
	return s
}

// Options returns the scheduler's effective bounds.
func (s *Scheduler) Options() SchedulerOptions { return s.opts }

// State returns the latest snapshot of load and free resources.
func (s *Scheduler) State() SchedulerState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// worstCasePages is the KV a request may need: its whole sequence plus the
// tree nodes of one verify, which sit past the sequence until commit.
func (s *Scheduler) worstCasePages(r Request) int {
	e := s.e
	verify := 0
	if e.Spec.Mode != SpecAuto && e.Drafter != nil {
		verify = e.Spec.VerifyTokens(e.Drafter.BlockSize())
	}
	return e.Model.KV.PagesFor(min(len(r.Prompt)+r.MaxTokens, e.Context) + verify)
}

// Submit validates a request and queues it. ctx cancels it: queued or
// running, its KV pages and state slot are freed at the next step.
func (s *Scheduler) Submit(ctx context.Context, r Request) (*Stream, error) {
	if err := s.e.CheckRequest(r); err != nil {
		return nil, err
	}
	if need, total := s.worstCasePages(r), s.e.Model.KV.Pages(); need > total {
		return nil, fmt.Errorf("%w: prompt plus max tokens needs %d KV pages, the cache has %d", ErrPromptTooLong, need, total)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queued >= s.opts.MaxQueue {
		return nil, ErrQueueFull
	}
	p := &pending{ctx: ctx, req: r, stream: &Stream{events: make(chan Event, eventBuffer), done: make(chan struct{})}}
	s.queued++
	s.state.Queued = s.queued
	s.incoming <- p // never blocks: the channel holds MaxQueue
	return p.stream, nil
}

// dequeued counts n requests that left the queue (admitted or ended).
func (s *Scheduler) dequeued(n int) {
	s.mu.Lock()
	s.queued -= n
	s.mu.Unlock()
}

// Run steps until ctx is done, then fails what is left with ErrShutdown.
func (s *Scheduler) Run(ctx context.Context) {
	var running []*pending
	reserved := 0
	defer func() {
		queued := append(s.waiting, s.drain()...)
		for _, p := range append(running, queued...) {
			s.end(p, ErrShutdown)
		}
		s.dequeued(len(queued))
		s.waiting, s.replies = nil, nil
		s.publish(nil)
	}()
	for {
		if len(running) == 0 && len(s.waiting) == 0 && len(s.replies) == 0 {
			select {
			case <-ctx.Done():
				return
			case p := <-s.incoming:
				s.waiting = append(s.waiting, p)
			}
		}
		if ctx.Err() != nil {
			return
		}
		running, reserved = s.round(running, reserved)
		s.publish(running)
	}
}

// round admits what it can and runs one step. A panic that no single
// request's work can be blamed for (in the batched forward, say) fails every
// running request, which frees their pages and slots, and the scheduler
// goes on with the queue.
func (s *Scheduler) round(running []*pending, reserved int) (stillRunning []*pending, stillReserved int) {
	defer func() {
		if v := recover(); v != nil {
			err := recovered(v)
			// step filters running in place: a panic midway leaves every
			// live request in it, some twice, next to ended ones (end skips those).
			for _, p := range running {
				_ = guard(func() error { s.end(p, err); return nil })
			}
			stillRunning, stillReserved = nil, 0
		}
	}()
	s.waiting = append(s.waiting, s.drain()...)
	running, reserved = s.admit(running, reserved)
	running, reserved = s.step(running, reserved)
	return running, reserved
}

// drain takes every request waiting in the channel.
func (s *Scheduler) drain() []*pending {
	var out []*pending
	for {
		select {
		case p := <-s.incoming:
			out = append(out, p)
		default:
			return out
		}
	}
}

// admit starts waiting requests, first come first served, while slots and
// reservable KV pages last. Cancelled waiters are dropped.
func (s *Scheduler) admit(running []*pending, reserved int) ([]*pending, int) {
	before := len(s.waiting)
	defer func() { s.dequeued(before - len(s.waiting)) }()
	kept := s.waiting[:0]
	for i, p := range s.waiting {
		if err := p.ctx.Err(); err != nil {
			s.end(p, err)
			continue
		}
		need := s.worstCasePages(p.req)
		fits := func() bool { return len(running) < s.opts.MaxRunning && reserved+need <= s.e.Model.KV.Pages() }
		if !fits() {
			running, reserved = s.dropCheckpoints(running, reserved)
		}
		if !fits() {
			kept = append(kept, s.waiting[i:]...)
			break
		}
		var j *job
		err := guard(func() (err error) { j, err = s.e.newJob(p.req); return err })
		if err != nil {
			s.end(p, err)
			continue
		}
		p.job, p.pages = j, need
		reserved += need
		running = append(running, p)
	}
	s.waiting = kept
	return s.admitCheckpoints(running, reserved)
}

// admitCheckpoints starts checkpoint prefills, newest first, while no
// request waits and a slot and the pages are free. One that cannot start
// (its prefix is cached already, say) is dropped.
func (s *Scheduler) admitCheckpoints(running []*pending, reserved int) ([]*pending, int) {
	for len(s.replies) > 0 && len(s.waiting) == 0 && len(running) < s.opts.MaxRunning {
		tokens := s.replies[len(s.replies)-1]
		need := s.e.Model.KV.PagesFor(len(tokens))
		if reserved+need > s.e.Model.KV.Pages() {
			break
		}
		s.replies = s.replies[:len(s.replies)-1]
		var j *job
		if guard(func() error { j = s.e.newCheckpointJob(tokens); return nil }) != nil || j == nil {
			continue
		}
		p := &pending{ctx: context.Background(), job: j, pages: need,
			stream: &Stream{events: make(chan Event, eventBuffer), done: make(chan struct{})}}
		reserved += need
		running = append(running, p)
	}
	return running, reserved
}

// dropCheckpoints ends the running checkpoint prefills, for a request that
// needs their slots or pages.
func (s *Scheduler) dropCheckpoints(running []*pending, reserved int) ([]*pending, int) {
	kept := running[:0]
	for _, p := range running {
		if p.job.checkpointOnly {
			reserved -= s.end(p, nil)
		} else {
			kept = append(kept, p)
		}
	}
	return kept, reserved
}

// queueReply keeps a finished request's prompt and output for a checkpoint
// prefill; only the newest MaxRunning wait.
func (s *Scheduler) queueReply(p *pending) {
	if s.e.activePrefix() == nil || p.job.checkpointOnly {
		return
	}
	s.replies = append(s.replies, slices.Concat(p.req.Prompt, p.job.result().Tokens))
	if len(s.replies) > s.opts.MaxRunning {
		s.replies = s.replies[1:]
	}
}

// step runs one batched forward over the running requests and delivers
// their new tokens; finished, failed and cancelled requests leave.
func (s *Scheduler) step(running []*pending, reserved int) ([]*pending, int) {
	var batch []*pending
	var inputs []SeqInput
	var taps []int
	budget := s.opts.StepPrefill
	active := running[:0]
	for _, p := range running {
		if err := p.ctx.Err(); err != nil {
			reserved -= s.end(p, err)
			continue
		}
		active = append(active, p)
		if p.job.prefilling() && budget <= 0 {
			continue // its next chunk waits for a later step
		}
		var in SeqInput
		err := guard(func() (err error) { in, err = p.job.prepare(max(budget, 1)); return err })
		if err != nil {
			active = active[:len(active)-1]
			reserved -= s.end(p, err)
			continue
		}
		if p.job.prefilling() {
			budget -= len(in.Tokens)
		}
		batch, inputs = append(batch, p), append(inputs, in)
		if t := p.job.taps(); t != nil {
			taps = t
		}
	}
	running = active
	if len(batch) == 0 {
		return running, reserved
	}
	jobs := make([]*job, len(batch))
	for i, p := range batch {
		jobs[i] = p.job
	}
	outs, err := s.e.forwardBatch(jobs, inputs, taps)
	failed := map[*pending]error{}
	for i, p := range batch {
		if err == nil {
			if err := guard(func() error { return p.job.complete(&outs[i]) }); err != nil {
				failed[p] = err
			}
		} else {
			failed[p] = fmt.Errorf("engine step: %w", err)
		}
	}
	kept := running[:0]
	for _, p := range running {
		s.deliver(p, false)
		switch {
		case failed[p] != nil:
			reserved -= s.end(p, failed[p])
		case p.job.done():
			s.queueReply(p)
			reserved -= s.end(p, nil)
		default:
			kept = append(kept, p)
		}
	}
	return kept, reserved
}

// deliver sends the tokens produced since the last delivery, unless the
// reader has not taken the previous event yet (see eventBuffer) and this is
// not the request's final delivery.
func (s *Scheduler) deliver(p *pending, final bool) {
	res := p.job.result()
	if len(res.Tokens) == p.sent || (!final && len(p.stream.events) >= eventBuffer-1) {
		return
	}
	ev := Event{Tokens: res.Tokens[p.sent:], CachedTokens: res.Stats.CachedTokens}
	if len(res.Logprobs) > 0 {
		ev.Logprobs = res.Logprobs[p.sent:]
	}
	p.sent = len(res.Tokens)
	p.stream.events <- ev // never blocks: only this goroutine sends, and a slot is free
}

// end finishes a request with err (nil on success), delivers its last
// tokens, frees its resources at once and returns the KV pages it had
// reserved. A request that ran keeps its (partial) result even when it
// failed, so its statistics still count. Ending an ended request does nothing.
func (s *Scheduler) end(p *pending, err error) int {
	if p.ended {
		return 0
	}
	p.ended = true
	defer func() { // even if closing the job panics, the reader is told
		p.stream.err = err
		close(p.stream.events)
		close(p.stream.done)
	}()
	if p.job != nil {
		s.deliver(p, true)
		p.stream.res = p.job.result()
		p.job.close()
	}
	return p.pages
}

func (s *Scheduler) publish(running []*pending) {
	requests := 0
	for _, p := range running {
		if !p.job.checkpointOnly {
			requests++
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state.Running = requests
	s.state.Checkpointing = len(running) - requests + len(s.replies)
	s.state.Queued = s.queued
	s.state.FreePages = s.e.Model.KV.FreePages()
	s.state.FreeSlots = s.e.freeSeqSlots()
	s.state.IdlePrefixPages = s.e.Model.KV.IdleCachedPages()
	ps := s.e.PrefixStats()
	s.state.PrefixPages, s.state.PrefixCheckpoints = int(ps.Pages), int(ps.Checkpoints)
}
