package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"ddflash/engine"
)

// tokenStream is a submitted request's output (an engine.Stream).
type tokenStream interface {
	Events() <-chan engine.Event
	Wait() (*engine.Result, error)
}

// generation is one request running in the scheduler.
type generation struct {
	g      *genRequest
	index  int // of its choice
	stream tokenStream
	parser *chatParser // nil: the text is not split
	eos    []int32     // the model's end-of-sequence ids
	ctx    context.Context
	cancel context.CancelFunc
	timer  *requestTimer
	out    *textOut
	res    outcome
}

// outcome is how a generation ended.
type outcome struct {
	index                          int    // of its choice
	finish                         string // stop, length or tool_calls
	stopReason                     any    // vLLM's: the stop string that matched or the stop_token_ids id that ended it; nil otherwise
	promptTokens, completionTokens int
	cachedTokens                   int // prompt tokens the prefix cache supplied
}

func (o outcome) usage() *usage {
	return &usage{PromptTokens: o.promptTokens, CompletionTokens: o.completionTokens, TotalTokens: o.promptTokens + o.completionTokens,
		PromptDetails: promptDetails{CachedTokens: o.cachedTokens}}
}

type usage struct {
	PromptTokens     int           `json:"prompt_tokens"`
	CompletionTokens int           `json:"completion_tokens"`
	TotalTokens      int           `json:"total_tokens"`
	PromptDetails    promptDetails `json:"prompt_tokens_details"`
}

// promptDetails is OpenAI's usage.prompt_tokens_details.
type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// start submits choice index of g. ctx is the client's: when it ends, so
// does the request, and the scheduler frees its KV pages and state slot at
// its next step.
func (s *Server) start(ctx context.Context, m *Model, g *genRequest, index int) (*generation, error) {
	timer := s.metrics.startRequest()
	ctx, cancel := context.WithCancel(ctx)
	req := g.req
	if index > 0 {
		req.Sampling.Seed += uint64(index) // independent choices, reproducible with a seed
	}
	submit := m.submit
	if submit == nil {
		submit = func(ctx context.Context, r engine.Request) (tokenStream, error) { return m.Scheduler.Submit(ctx, r) }
	}
	st, err := submit(ctx, req)
	if err != nil {
		cancel()
		return nil, submitError(err)
	}
	gen := &generation{g: g, index: index, stream: st, ctx: ctx, cancel: cancel, timer: timer, eos: modelEOS(m),
		out: newTextOut(m.Tokenizer.Tokenizer, g.stops), res: outcome{index: index, promptTokens: len(g.req.Prompt)}}
	if g.newParser != nil {
		gen.parser = g.newParser()
	}
	return gen, nil
}

// each hands the output to emit as steps produce it, and says how the
// generation ended. An error from emit (the client went away) aborts it.
func (gen *generation) each(emit func(delta) error) (outcome, error) {
	defer gen.cancel()
	for {
		var ev engine.Event
		var open bool
		select {
		case ev, open = <-gen.stream.Events():
		case <-gen.ctx.Done():
			return gen.abort(gen.ctx.Err())
		}
		if !open {
			break
		}
		gen.timer.output()
		gen.res.cachedTokens = ev.CachedTokens
		d, err := gen.add(ev)
		if err == nil {
			err = gen.emit(emit, d)
		}
		if err != nil {
			return gen.abort(err)
		}
		if gen.out.stopped != "" {
			if err := gen.emit(emit, gen.split(delta{}, true)); err != nil {
				return gen.abort(err)
			}
			return gen.end(engine.FinishStop, nil), nil
		}
	}
	res, err := gen.stream.Wait()
	if err != nil {
		return gen.abort(err)
	}
	finish := res.FinishReason
	if err := gen.emit(emit, gen.split(gen.out.finish(), true)); err != nil {
		return gen.abort(err)
	}
	if gen.out.stopped != "" {
		finish = engine.FinishStop
	} else if id, ok := gen.stopTokenID(finish, res.Tokens); ok {
		gen.res.stopReason = id
	}
	return gen.end(finish, res.Stats.SpecStats), nil
}

// stopTokenID is the request's stop_token_ids entry that ended the output,
// as vLLM reports it in stop_reason; an end-of-sequence id of the model
// (unless ignore_eos) is not one, whatever stop_token_ids says.
func (gen *generation) stopTokenID(finish string, tokens []int32) (int32, bool) {
	if finish != engine.FinishStop || len(tokens) == 0 {
		return 0, false
	}
	last, req := tokens[len(tokens)-1], gen.g.req
	if !slices.Contains(req.StopTokenIDs, last) || (!req.IgnoreEOS && slices.Contains(gen.eos, last)) {
		return 0, false
	}
	return last, true
}

// modelEOS is the engine's end-of-sequence ids (none for a scripted model).
func modelEOS(m *Model) []int32 {
	if m.Engine == nil {
		return nil
	}
	return m.Engine.EOS
}

// add decodes one step's tokens, up to a stop string.
func (gen *generation) add(ev engine.Event) (delta, error) {
	var d delta
	for i, id := range ev.Tokens {
		var lp *engine.StepLogprobs
		if gen.g.logprobs {
			step := ev.Logprobs[i]
			step.Top = step.Top[:min(len(step.Top), gen.g.topLogprobs)]
			lp = &step
		}
		part, err := gen.out.add(id, lp)
		if err != nil {
			return d, err
		}
		gen.res.completionTokens++
		d.text += part.text
		d.tokens = append(d.tokens, part.tokens...)
		if gen.out.stopped != "" {
			break
		}
	}
	return gen.split(d, false), nil
}

// split runs d's text through the chat parser, if there is one; last says
// the output has ended.
func (gen *generation) split(d delta, last bool) delta {
	if gen.parser == nil {
		return d
	}
	d.split = gen.parser.add(d.text)
	if last {
		d.split.add(gen.parser.finish())
	}
	return d
}

// emit passes on a delta that carries something the client sees.
func (gen *generation) emit(emit func(delta) error, d delta) error {
	visible := d.text != ""
	if gen.parser != nil {
		visible = !d.split.empty()
	}
	if !visible && (!gen.g.logprobs || len(d.tokens) == 0) {
		return nil
	}
	return emit(d)
}

func (gen *generation) end(finish string, spec *engine.SpecStats) outcome {
	if finish == engine.FinishStop && gen.parser != nil && gen.parser.calls > 0 {
		finish = finishToolCalls
	}
	gen.res.finish = finish
	if gen.out.stopped != "" {
		gen.res.stopReason = gen.out.stopped
	}
	gen.timer.end(finish, gen.res, spec)
	return gen.res
}

// abort ends a generation that will not complete. A client that went away
// is not an error worth answering; anything else is the engine's failure.
func (gen *generation) abort(err error) (outcome, error) {
	defer gen.cancel()
	gen.timer.end("abort", gen.res, nil)
	var limit *apiError
	if errors.As(context.Cause(gen.ctx), &limit) { // the server's own deadline
		return gen.res, limit
	}
	if errors.Is(err, errWrite) || (gen.ctx.Err() != nil && errors.Is(err, gen.ctx.Err())) {
		return gen.res, errClientGone
	}
	if errors.Is(err, engine.ErrShutdown) {
		return gen.res, submitError(err)
	}
	return gen.res, err // the engine's failure: logged, and answered as a plain 500
}

var errClientGone = errors.New("the client went away")

// finishToolCalls is OpenAI's finish_reason for a reply that calls tools.
const finishToolCalls = "tool_calls"

// endpoint shapes one API's responses.
type endpoint interface {
	idPrefix() string
	object(stream bool) string
	// choice is the single choice of a response (stream false) or of a
	// streamed chunk; finish is empty until the last chunk.
	choice(d delta, res outcome, stream bool) any
	// opening is the chunk a choice's stream starts with, or nil.
	opening(index int) any
}

// envelope is a response or a streamed chunk.
type envelope struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []any  `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

// respond runs g's choices and answers with one JSON response or an SSE
// stream.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, m *Model, g *genRequest, api endpoint) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel() // one choice failing ends the others
	gens := make([]*generation, g.n)
	for i := range gens {
		gen, err := s.start(ctx, m, g, i)
		if err != nil {
			cancel()
			for _, started := range gens[:i] {
				_, _ = started.abort(err)
			}
			writeError(w, err)
			return
		}
		gens[i] = gen
	}
	env := envelope{ID: api.idPrefix() + rand.Text(), Object: api.object(g.stream), Created: time.Now().Unix(), Model: s.opts.ModelName}
	if !g.stream {
		all := make([]delta, len(gens))
		results, err := runChoices(gens, func(i int, d delta) error {
			all[i].append(d)
			return nil
		})
		if err != nil {
			s.fail(w, err)
			return
		}
		for i, res := range results {
			env.Choices = append(env.Choices, api.choice(all[i], res, false))
		}
		env.Usage = totalUsage(results)
		writeJSON(w, http.StatusOK, env)
		return
	}
	sse := startSSE(w, s.opts.Timeouts.Write)
	var mu sync.Mutex // choices stream concurrently into one response
	chunk := func(choice any) error {
		mu.Lock()
		defer mu.Unlock()
		env.Choices = []any{choice}
		return sse.send(env)
	}
	for i := range gens {
		if first := api.opening(i); first != nil {
			if err := chunk(first); err != nil {
				for _, gen := range gens {
					_, _ = gen.abort(err)
				}
				return
			}
		}
	}
	results, err := runChoices(gens, func(i int, d delta) error { return chunk(api.choice(d, outcome{index: i}, true)) })
	for i := 0; err == nil && i < len(results); i++ {
		err = chunk(api.choice(delta{}, results[i], true))
	}
	if err == nil && g.includeUsage {
		env.Choices, env.Usage = []any{}, totalUsage(results)
		err = sse.send(env)
	}
	switch {
	case errors.Is(err, errClientGone):
		return
	case err != nil:
		s.logFailure("generation failed", err)
		_ = sse.send(struct {
			Error *apiError `json:"error"`
		}{asAPIError(err)}) // the status line is sent already: the error goes in the stream
	}
	_ = sse.done()
}

// runChoices runs each generation to its end, handing its output to emit
// with its index, and returns how each ended, or the first error (which
// cancels the rest).
func runChoices(gens []*generation, emit func(int, delta) error) ([]outcome, error) {
	results := make([]outcome, len(gens))
	errs := make([]error, len(gens))
	var wg sync.WaitGroup
	for i, gen := range gens {
		wg.Go(func() {
			results[i], errs[i] = gen.each(func(d delta) error { return emit(i, d) })
			if errs[i] != nil {
				for _, other := range gens {
					other.cancel()
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, errClientGone) {
			return results, err // the cause, not a choice it cancelled
		}
	}
	for _, err := range errs {
		if err != nil {
			return results, err
		}
	}
	return results, nil
}

// totalUsage counts the prompt once and every choice's tokens.
func totalUsage(results []outcome) *usage {
	u := results[0].usage()
	for _, res := range results[1:] {
		u.CompletionTokens += res.completionTokens
		u.TotalTokens += res.completionTokens
	}
	return u
}

// fail answers a non-streaming generation that did not complete.
func (s *Server) fail(w http.ResponseWriter, err error) {
	if errors.Is(err, errClientGone) {
		return
	}
	if e := asAPIError(err); e.Status >= 500 {
		s.logFailure("request failed", err)
	}
	writeError(w, err)
}

// sseWriter writes Server-Sent Events: one JSON object per data line.
type sseWriter struct {
	w            http.ResponseWriter
	rc           *http.ResponseController
	writeTimeout time.Duration // for each write: a stream as a whole has no deadline
}

var errWrite = errors.New("writing to the client failed")

func startSSE(w http.ResponseWriter, writeTimeout time.Duration) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // proxies must not hold tokens back
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout}
}

func (e *sseWriter) send(v any) error {
	var b bytes.Buffer
	b.WriteString("data: ")
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b.WriteByte('\n') // Encode ended the line; a blank line ends the event
	return e.write(b.Bytes())
}

func (e *sseWriter) done() error { return e.write([]byte("data: [DONE]\n\n")) }

func (e *sseWriter) write(b []byte) error {
	if e.writeTimeout > 0 {
		_ = e.rc.SetWriteDeadline(time.Now().Add(e.writeTimeout))
	}
	if _, err := e.w.Write(b); err != nil {
		return errWrite
	}
	if err := e.rc.Flush(); err != nil {
		return errWrite
	}
	return nil
}
