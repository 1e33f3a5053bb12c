package server

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"unicode/utf8"

	"ddflash/engine"
)

// decodeBody reads one JSON object into v, rejecting unknown fields, bodies
// over the size limit, invalid UTF-8 and trailing data.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return decodeError(err)
	}
	if !utf8.Valid(body) {
		return badRequest("", "the request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if err == io.EOF {
			return badRequest("", "the request body is empty: send a JSON object")
		}
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("", "the request body has data after its JSON object")
	}
	return nil
}

// request is a request body; it names the model it is for.
type request interface{ model() string }

// readRequest decodes a request body and checks the model it names.
func (s *Server) readRequest(r *http.Request, v request) error {
	if err := decodeBody(r, v); err != nil {
		return err
	}
	return s.checkModel(v.model())
}

// samplingFields are the request fields completions and chat share.
type samplingFields struct {
	Model         string         `json:"model"`
	MaxTokens     *int64         `json:"max_tokens"`
	Temperature   *float64       `json:"temperature"`
	TopP          *float64       `json:"top_p"`
	TopK          *int64         `json:"top_k"` // extension (vLLM, SGLang): -1 or 0 is off
	Seed          *int64         `json:"seed"`
	Stop          stopList       `json:"stop"`
	N             *int64         `json:"n"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	User          string         `json:"user"`       // accepted; OpenAI uses it for abuse monitoring
	IgnoreEOS     bool           `json:"ignore_eos"` // extension (vLLM, SGLang)

	// OpenAI fields this server accepts only at their neutral values, so
	// that clients which always send them still work.
	PresencePenalty  *float64           `json:"presence_penalty"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"`
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
	stops        []string
	topLogprobs  int  // alternatives reported per token
	logprobs     bool // report the chosen tokens' log-probabilities
	stream       bool
	includeUsage bool
}

// build validates the shared fields for a prompt and a model context.
// defaultMax is the max_tokens used when the request gives none (0: all
// the context left). logprobs < 0 asks for none.
func (f *samplingFields) build(context int, promptIDs []int32, maxTokens *int64, defaultMax int, logprobs int) (*genRequest, error) {
	if err := f.checkNeutral(); err != nil {
		return nil, err
	}
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
	sp, err := f.sampling()
	if err != nil {
		return nil, err
	}
	g := &genRequest{
		req:    engine.Request{Prompt: promptIDs, MaxTokens: int(n), Sampling: sp, IgnoreEOS: f.IgnoreEOS},
		stream: f.Stream,
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

// sampling checks the sampling fields against OpenAI's ranges.
func (f *samplingFields) sampling() (engine.SamplingParams, error) {
	sp := engine.SamplingParams{Temperature: 1, TopP: 1, Seed: rand.Uint64()}
	if t := f.Temperature; t != nil {
		if !(*t >= 0 && *t <= 2) {
			return sp, badRequest("temperature", "temperature %g: want a number from 0 (greedy) to 2", *t)
		}
		sp.Temperature = *t
	}
	if p := f.TopP; p != nil {
		if !(*p > 0 && *p <= 1) {
			return sp, badRequest("top_p", "top_p %g: want a number in (0, 1]", *p)
		}
		sp.TopP = *p
	}
	if k := f.TopK; k != nil {
		if *k < -1 || *k > math.MaxInt32 {
			return sp, badRequest("top_k", "top_k %d: want -1 or 0 (off) or a positive count", *k)
		}
		sp.TopK = int(max(*k, 0))
	}
	if f.Seed != nil {
		sp.Seed = uint64(*f.Seed)
	}
	return sp, nil
}

// checkNeutral rejects OpenAI options this server does not implement when
// they are set to anything but their no-op value.
func (f *samplingFields) checkNeutral() error {
	switch {
	case f.N != nil && *f.N != 1:
		return badRequest("n", "n %d: this server returns one choice per request; send separate requests", *f.N)
	case f.PresencePenalty != nil && *f.PresencePenalty != 0:
		return badRequest("presence_penalty", "presence_penalty is not supported: leave it out or set it to 0")
	case f.FrequencyPenalty != nil && *f.FrequencyPenalty != 0:
		return badRequest("frequency_penalty", "frequency_penalty is not supported: leave it out or set it to 0")
	case len(f.LogitBias) > 0:
		return badRequest("logit_bias", "logit_bias is not supported: leave it out")
	}
	return nil
}

// checkLogprobs validates a top-N count (the engine reports up to 20).
func checkLogprobs(param string, n int64) error {
	if n < 0 || n > 20 {
		return badRequest(param, "%s %d: want 0..20", param, n)
	}
	return nil
}
