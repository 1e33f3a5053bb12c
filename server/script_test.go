package server

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"ddflash/engine"
	"ddflash/tokenizer"
)

// scriptedModel stands in for the scheduler: each request's output is the
// text reply returns for it, encoded, a few tokens per event (as a
// speculative step delivers them), then an end-of-sequence token. A request
// with a Constraint gets the script's tokens where the constraint allows
// them: where it does not, the model skips ahead in the script to the next
// token it allows, and past the script takes the lowest allowed id, so a
// constrained reply must be what the constraint lets through.
type scriptedModel struct {
	tok   *tokenizer.Dir
	eos   int32
	reply func(r engine.Request, prompt string) string

	mu       sync.Mutex
	requests []engine.Request // every request submitted, in order
}

func (s *scriptedModel) submit(ctx context.Context, r engine.Request) (tokenStream, error) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
	prompt, err := s.tok.Decode(r.Prompt, false)
	if err != nil {
		return nil, err
	}
	script := s.tok.Encode(s.reply(r, prompt))
	st := &scriptStream{events: make(chan engine.Event, 8), done: make(chan struct{})}
	go st.run(ctx, s.decode(r, script))
	return st, nil
}

// decode is the tokens the model outputs for r.
func (s *scriptedModel) decode(r engine.Request, script []int32) []int32 {
	var out []int32
	row := make([]float32, s.tok.VocabSize())
	for len(out) < r.MaxTokens {
		if r.Constraint == nil {
			if len(script) == 0 {
				return append(out, s.eos)
			}
			out, script = append(out, script[0]), script[1:]
			continue
		}
		for i := range row {
			row[i] = 0
		}
		r.Constraint.Mask(out, row)
		for len(script) > 0 && math.IsInf(float64(row[script[0]]), -1) {
			script = script[1:]
		}
		next := s.eos
		switch {
		case len(script) > 0:
			next, script = script[0], script[1:]
		case math.IsInf(float64(row[s.eos]), -1):
			next = int32(slices.IndexFunc(row, func(v float32) bool { return !math.IsInf(float64(v), -1) }))
		}
		out = append(out, next)
		if next == s.eos {
			return out
		}
	}
	return out
}

// scriptStream delivers scripted tokens as an engine.Stream does.
type scriptStream struct {
	events chan engine.Event
	done   chan struct{}
	res    *engine.Result
	err    error
}

func (st *scriptStream) Events() <-chan engine.Event { return st.events }

func (st *scriptStream) Wait() (*engine.Result, error) {
	<-st.done
	return st.res, st.err
}

func (st *scriptStream) run(ctx context.Context, tokens []int32) {
	defer close(st.done)
	defer close(st.events)
	res := &engine.Result{FinishReason: engine.FinishLength}
	for i := 0; i < len(tokens); i += 3 {
		step := tokens[i:min(i+3, len(tokens))]
		select {
		case st.events <- engine.Event{Tokens: step}:
		case <-ctx.Done():
			st.res, st.err = res, ctx.Err()
			return
		}
		res.Tokens = append(res.Tokens, step...)
	}
	if len(tokens) > 0 && tokens[len(tokens)-1] == scriptEOS {
		res.FinishReason = engine.FinishStop
	}
	st.res = res
}

// scriptEOS is the tiny tokenizer's <|im_end|>, set by serveScripted.
var scriptEOS int32

// qwenTokenizer is the tiny model's tokenizer with Qwen3.6's chat template.
func qwenTokenizer(t testing.TB) *tokenizer.Dir {
	t.Helper()
	target, _, _ := modelDirs(t)
	dir := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json"} {
		copyFile(t, filepath.Join(target, f), filepath.Join(dir, f))
	}
	copyFile(t, filepath.Join("testdata", "qwen3.6-27b", "chat_template.jinja"), filepath.Join(dir, "chat_template.jinja"))
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// serveScripted serves the tiny model's tokenizer with the Qwen3.6
// template, its output scripted by reply.
func serveScripted(t testing.TB, reply func(r engine.Request, prompt string) string, setup func(*Model)) (*harness, *scriptedModel) {
	t.Helper()
	tok := qwenTokenizer(t)
	eos, ok := tok.TokenID("<|im_end|>")
	if !ok {
		t.Fatal("the tiny tokenizer has no <|im_end|>")
	}
	scriptEOS = eos
	sm := &scriptedModel{tok: tok, eos: eos, reply: reply}
	h := serveTiny(t, harnessOptions{tok: tok, setup: func(m *Model) {
		m.submit = sm.submit
		m.Engine.Context = 1 << 14 // the script is not held to the tiny model's 256 positions; Qwen3.6's tool prompt is longer
		if setup != nil {
			setup(m)
		}
	}})
	return h, sm
}
