package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"ddflash/engine"
)

// generation is one request running in the scheduler.
type generation struct {
	g      *genRequest
	stream *engine.Stream
	ctx    context.Context
	cancel context.CancelFunc
	timer  *requestTimer
	out    *textOut
	res    outcome
}

// outcome is how a generation ended.
type outcome struct {
	finish                         string // stop or length
	stopReason                     string // the stop string that matched, if one did
	promptTokens, completionTokens int
}

func (o outcome) usage() *usage {
	return &usage{PromptTokens: o.promptTokens, CompletionTokens: o.completionTokens, TotalTokens: o.promptTokens + o.completionTokens}
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// start submits g. ctx is the client's: when it ends, so does the request,
// and the scheduler frees its KV pages and state slot at its next step.
func (s *Server) start(ctx context.Context, m *Model, g *genRequest) (*generation, error) {
	timer := s.metrics.startRequest()
	ctx, cancel := context.WithCancel(ctx)
	st, err := m.Scheduler.Submit(ctx, g.req)
	if err != nil {
		cancel()
		return nil, submitError(err)
	}
	return &generation{g: g, stream: st, ctx: ctx, cancel: cancel, timer: timer,
		out: newTextOut(m.Tokenizer.Tokenizer, g.stops), res: outcome{promptTokens: len(g.req.Prompt)}}, nil
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
		d, err := gen.add(ev)
		if err == nil {
			err = gen.emit(emit, d)
		}
		if err != nil {
			return gen.abort(err)
		}
		if gen.out.stopped != "" {
			return gen.end(engine.FinishStop, nil), nil
		}
	}
	res, err := gen.stream.Wait()
	if err != nil {
		return gen.abort(err)
	}
	finish := res.FinishReason
	if err := gen.emit(emit, gen.out.finish()); err != nil {
		return gen.abort(err)
	}
	if gen.out.stopped != "" {
		finish = engine.FinishStop
	}
	return gen.end(finish, res.Stats.SpecStats), nil
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
	return d, nil
}

// emit passes on a delta that carries something the client sees.
func (gen *generation) emit(emit func(delta) error, d delta) error {
	if d.text == "" && (!gen.g.logprobs || len(d.tokens) == 0) {
		return nil
	}
	return emit(d)
}

func (gen *generation) end(finish string, spec *engine.SpecStats) outcome {
	gen.res.finish, gen.res.stopReason = finish, gen.out.stopped
	gen.timer.end(finish, gen.res.promptTokens, gen.res.completionTokens, spec)
	return gen.res
}

// abort ends a generation that will not complete. A client that went away
// is not an error worth answering; anything else is the engine's failure.
func (gen *generation) abort(err error) (outcome, error) {
	defer gen.cancel()
	gen.timer.end("abort", gen.res.promptTokens, gen.res.completionTokens, nil)
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

// endpoint shapes one API's responses.
type endpoint interface {
	idPrefix() string
	object(stream bool) string
	// choice is the single choice of a response (stream false) or of a
	// streamed chunk; finish is empty until the last chunk.
	choice(d delta, res outcome, stream bool) any
	// opening is the chunk a stream starts with, or nil.
	opening() any
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

// respond runs g and answers with one JSON response or an SSE stream.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, m *Model, g *genRequest, api endpoint) {
	gen, err := s.start(r.Context(), m, g)
	if err != nil {
		writeError(w, err)
		return
	}
	env := envelope{ID: api.idPrefix() + rand.Text(), Object: api.object(g.stream), Created: time.Now().Unix(), Model: s.opts.ModelName}
	if !g.stream {
		var all delta
		res, err := gen.each(func(d delta) error {
			all.text += d.text
			all.tokens = append(all.tokens, d.tokens...)
			return nil
		})
		if err != nil {
			s.fail(w, err)
			return
		}
		env.Choices, env.Usage = []any{api.choice(all, res, false)}, res.usage()
		writeJSON(w, http.StatusOK, env)
		return
	}
	sse := startSSE(w, s.opts.Timeouts.Write)
	chunk := func(choice any) error {
		env.Choices = []any{choice}
		return sse.send(env)
	}
	if first := api.opening(); first != nil {
		if err := chunk(first); err != nil {
			_, _ = gen.abort(err)
			return
		}
	}
	res, err := gen.each(func(d delta) error { return chunk(api.choice(d, outcome{}, true)) })
	if err == nil {
		err = chunk(api.choice(delta{}, res, true))
	}
	if err == nil && g.includeUsage {
		env.Choices, env.Usage = []any{}, res.usage()
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
