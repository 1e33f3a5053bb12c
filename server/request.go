package server

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"ddflash/engine"
)

// decodeBody reads one JSON object into v, rejecting bodies over the size
// limit, invalid UTF-8 and trailing data. It returns the names of top-level
// fields v does not have: like vLLM, the server ignores them.
func decodeBody(r *http.Request, v any) (unknown []string, err error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, decodeError(err)
	}
	if !utf8.Valid(body) {
		return nil, badRequest("", "the request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		if err == io.EOF {
			return nil, badRequest("", "the request body is empty: send a JSON object")
		}
		return nil, decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badRequest("", "the request body has data after its JSON object")
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) == nil {
		known := knownFields(reflect.TypeOf(v))
		for name := range fields {
			if !known[strings.ToLower(name)] {
				unknown = append(unknown, name)
			}
		}
	}
	slices.Sort(unknown)
	return unknown, nil
}

// knownFieldSets caches knownFields by type.
var knownFieldSets sync.Map // reflect.Type → map[string]bool

// knownFields are the JSON names of a struct's fields, embedded structs'
// included (t may be a pointer to the struct), in lower case: encoding/json
// matches names regardless of case.
func knownFields(t reflect.Type) map[string]bool {
	if known, ok := knownFieldSets.Load(t); ok {
		return known.(map[string]bool)
	}
	known := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-":
			case f.Anonymous && name == "":
				walk(f.Type)
			case name != "":
				known[strings.ToLower(name)] = true
			case f.IsExported():
				known[strings.ToLower(f.Name)] = true
			}
		}
	}
	walk(t)
	knownFieldSets.Store(t, known)
	return known
}

// loggedFields are the unknown field names already logged (once each, so
// that a client sending one on every request does not flood the log).
var loggedFields sync.Map

// request is a request body; it names the model it is for.
type request interface{ model() string }

// readRequest decodes a request body and checks the model it names.
func (s *Server) readRequest(r *http.Request, v request) error {
	unknown, err := decodeBody(r, v)
	if err != nil {
		return err
	}
	for _, name := range unknown {
		if _, seen := loggedFields.LoadOrStore(name, true); !seen {
			s.log.Warn("ignoring a request field this server does not know (logged once per name)", "field", name, "path", r.URL.Path)
		}
	}
	return s.checkModel(v.model())
}

// samplingFields are the request fields completions and chat share.
type samplingFields struct {
	Model         string         `json:"model"`
	MaxTokens     *int64         `json:"max_tokens"`
	Temperature   *float64       `json:"temperature"`
	TopP          *float64       `json:"top_p"`
	Seed          *int64         `json:"seed"`
	Stop          stopList       `json:"stop"`
	N             *int64         `json:"n"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	User          string         `json:"user"` // accepted; OpenAI uses it for abuse monitoring

	PresencePenalty  *float64           `json:"presence_penalty"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"` // token id (as a string) → bias in [-100, 100]

	// Extensions, as vLLM and SGLang name them.
	TopK              *int64   `json:"top_k"` // -1 or 0 is off
	MinP              *float64 `json:"min_p"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	StopTokenIDs      []int64  `json:"stop_token_ids"`
	MinTokens         *int64   `json:"min_tokens"`
	IgnoreEOS         bool     `json:"ignore_eos"`
}

func (f *samplingFields) model() string { return f.Model }

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// stopList is "stop": a string, an array of strings, or null.
type stopList []string

func (s *stopList) UnmarshalJSON(data []byte) error {
	var one string
	if json.Unmarshal(data, &one) == nil {
		*s = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(data, &many); err != nil {
		return badRequest("stop", "stop: want a string or an array of strings")
	}
	*s = many
	return nil
}

// prompt is a completion prompt: text, or token ids. OpenAI also allows a
// batch of several; this server takes one prompt per request.
type prompt struct {
	text   *string
	tokens []int32
}

func (p *prompt) UnmarshalJSON(data []byte) error {
	var text string
	if json.Unmarshal(data, &text) == nil {
		p.text = &text
		return nil
	}
	if json.Unmarshal(data, &p.tokens) == nil {
		return nil
	}
	var texts []string
	var batches [][]int32
	n := -1
	if json.Unmarshal(data, &texts) == nil {
		n = len(texts)
		if n == 1 {
			p.text = &texts[0]
		}
	} else if json.Unmarshal(data, &batches) == nil {
		n = len(batches)
		if n == 1 {
			p.tokens = batches[0]
		}
	}
	switch {
	case n < 0:
		return badRequest("prompt", "prompt: want a string or an array of token ids (integers in the vocabulary)")
	case n != 1:
		return badRequest("prompt", "prompt: got a batch of %d prompts; this server takes one prompt per request", n)
	}
	return nil
}

// genRequest is a validated generation: the engine request and how its
// output is cut and reported.
type genRequest struct {
	req          engine.Request
	n            int // independent choices, each its own engine request
	stops        []string
	topLogprobs  int  // alternatives reported per token
	logprobs     bool // report the chosen tokens' log-probabilities
	stream       bool
	includeUsage bool
	// newParser, when set, splits each choice's text into content,
	// reasoning and tool calls (chat).
	newParser func() *chatParser
}

// maxChoices bounds n: each choice holds a scheduler slot.
const maxChoices = 16

// build validates the shared fields for a prompt on model m. defaultMax is
// the max_tokens used when the request gives none (0: all the context
// left). logprobs < 0 asks for none.
func (f *samplingFields) build(m *Model, promptIDs []int32, maxTokens *int64, defaultMax int, logprobs int) (*genRequest, error) {
	context := m.Engine.Context
	if len(promptIDs) == 0 {
		return nil, badRequest("prompt", "the prompt is empty: give at least one token")
	}
	room := context - len(promptIDs)
	if room < 1 {
		return nil, newError(http.StatusBadRequest, invalidRequest, "context_length_exceeded", "",
			"the prompt has %d tokens and the model's context holds %d (prompt plus at least one new token): shorten the prompt", len(promptIDs), context)
	}
	n := int64(min(defaultMax, room))
	if defaultMax <= 0 {
		n = int64(room)
	}
	if maxTokens != nil {
		n = *maxTokens
	}
	switch {
	case n < 1:
		return nil, badRequest("max_tokens", "max_tokens %d: want at least 1", n)
	case n > int64(room):
		return nil, newError(http.StatusBadRequest, invalidRequest, "context_length_exceeded", "max_tokens",
			"max_tokens %d is more than the %d tokens left in the model's context of %d after the %d-token prompt: lower max_tokens",
			n, room, context, len(promptIDs))
	}
	sp, err := f.sampling(m.Defaults, m.Tokenizer.VocabSize())
	if err != nil {
		return nil, err
	}
	g := &genRequest{
		req:    engine.Request{Prompt: promptIDs, MaxTokens: int(n), Sampling: sp, IgnoreEOS: f.IgnoreEOS},
		n:      1,
		stream: f.Stream,
	}
	if err := f.stopping(&g.req, m.Tokenizer.VocabSize()); err != nil {
		return nil, err
	}
	if f.N != nil {
		if *f.N < 1 || *f.N > maxChoices {
			return nil, badRequest("n", "n %d: want 1..%d choices", *f.N, maxChoices)
		}
		g.n = int(*f.N)
	}
	if logprobs >= 0 {
		g.logprobs, g.topLogprobs = true, logprobs
		g.req.Sampling.Logprobs = max(logprobs, 1) // the engine records the chosen token with its alternatives
	}
	for _, s := range f.Stop {
		if s != "" {
			g.stops = append(g.stops, s)
		}
	}
	if f.StreamOptions != nil {
		if !f.Stream {
			return nil, badRequest("stream_options", "stream_options is only allowed with stream: true")
		}
		g.includeUsage = f.StreamOptions.IncludeUsage
	}
	return g, nil
}

// stopping checks stop_token_ids and min_tokens into r.
func (f *samplingFields) stopping(r *engine.Request, vocab int) error {
	for _, id := range f.StopTokenIDs {
		if id < 0 || id >= int64(vocab) {
			return badRequest("stop_token_ids", "stop_token_ids: %d is not a token id (0..%d)", id, vocab-1)
		}
		r.StopTokenIDs = append(r.StopTokenIDs, int32(id))
	}
	if f.MinTokens != nil {
		if *f.MinTokens < 0 || *f.MinTokens > int64(r.MaxTokens) {
			return badRequest("min_tokens", "min_tokens %d: want 0..max_tokens (%d)", *f.MinTokens, r.MaxTokens)
		}
		r.MinTokens = int(*f.MinTokens)
	}
	return nil
}

// sampling checks the sampling fields against OpenAI's (and vLLM's)
// ranges. A field the request leaves out takes the checkpoint's
// generation_config default when it has one, as in vLLM.
func (f *samplingFields) sampling(defaults engine.GenerationConfig, vocab int) (engine.SamplingParams, error) {
	sp := engine.SamplingParams{Temperature: 1, TopP: 1, Seed: rand.Uint64()}
	temperature, topP, minP, repetition := orDefault(f.Temperature, defaults.Temperature), orDefault(f.TopP, defaults.TopP),
		orDefault(f.MinP, defaults.MinP), orDefault(f.RepetitionPenalty, defaults.RepetitionPenalty)
	topK := f.TopK
	if topK == nil && defaults.TopK != nil {
		k := int64(*defaults.TopK)
		topK = &k
	}
	if t := temperature; t != nil {
		if !(*t >= 0 && *t <= 2) {
			return sp, badRequest("temperature", "temperature %g: want a number from 0 (greedy) to 2", *t)
		}
		sp.Temperature = *t
	}
	if p := topP; p != nil {
		if !(*p > 0 && *p <= 1) {
			return sp, badRequest("top_p", "top_p %g: want a number in (0, 1]", *p)
		}
		sp.TopP = *p
	}
	if k := topK; k != nil {
		if *k < -1 || *k > math.MaxInt32 {
			return sp, badRequest("top_k", "top_k %d: want -1 or 0 (off) or a positive count", *k)
		}
		sp.TopK = int(max(*k, 0))
	}
	if p := minP; p != nil {
		if !(*p >= 0 && *p <= 1) {
			return sp, badRequest("min_p", "min_p %g: want a number in [0, 1]", *p)
		}
		sp.MinP = *p
	}
	if p := repetition; p != nil {
		if !(*p > 0 && *p <= 2) {
			return sp, badRequest("repetition_penalty", "repetition_penalty %g: want a number in (0, 2] (1 is none)", *p)
		}
		sp.RepetitionPenalty = *p
	}
	for _, pen := range []struct {
		name string
		v    *float64
		to   *float64
	}{{"presence_penalty", f.PresencePenalty, &sp.PresencePenalty}, {"frequency_penalty", f.FrequencyPenalty, &sp.FrequencyPenalty}} {
		if pen.v == nil {
			continue
		}
		if !(*pen.v >= -2 && *pen.v <= 2) {
			return sp, badRequest(pen.name, "%s %g: want a number from -2 to 2", pen.name, *pen.v)
		}
		*pen.to = *pen.v
	}
	if len(f.LogitBias) > 0 {
		sp.LogitBias = make(map[int32]float32, len(f.LogitBias))
		for key, bias := range f.LogitBias {
			id, err := strconv.ParseInt(key, 10, 32)
			if err != nil || id < 0 || id >= int64(vocab) {
				return sp, badRequest("logit_bias", "logit_bias: key %q is not a token id (0..%d)", key, vocab-1)
			}
			if !(bias >= -100 && bias <= 100) {
				return sp, badRequest("logit_bias", "logit_bias: %g for token %d: want a number from -100 to 100", bias, id)
			}
			sp.LogitBias[int32(id)] = float32(bias)
		}
	}
	if f.Seed != nil {
		sp.Seed = uint64(*f.Seed)
	}
	return sp, nil
}

// orDefault is the request's value, else the checkpoint's default (nil: neither).
func orDefault(given, fallback *float64) *float64 {
	if given != nil {
		return given
	}
	return fallback
}

// checkLogprobs validates a top-N count (the engine reports up to 20).
func checkLogprobs(param string, n int64) error {
	if n < 0 || n > 20 {
		return badRequest(param, "%s %d: want 0..20", param, n)
	}
	return nil
}
