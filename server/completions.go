package server

import (
	"net/http"

	"ddflash/tokenizer"
)

// completionRequest is POST /v1/completions.
type completionRequest struct {
	samplingFields
	Prompt   *prompt `json:"prompt"`
	Logprobs *int64  `json:"logprobs"`
	// Accepted at their no-op values only.
	Echo   bool   `json:"echo"`
	BestOf *int64 `json:"best_of"`
	Suffix string `json:"suffix"`
}

// defaultCompletionTokens is max_tokens when a completion request gives
// none, as in OpenAI's legacy API and vLLM.
const defaultCompletionTokens = 16

func (s *Server) completionRequest(r *http.Request, m *Model) (*genRequest, error) {
	var req completionRequest
	if err := s.readRequest(r, &req); err != nil {
		return nil, err
	}
	switch {
	case req.Prompt == nil:
		return nil, badRequest("prompt", "prompt is required: a string or an array of token ids")
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported: leave it out")
	case req.BestOf != nil && (req.N == nil && *req.BestOf != 1 || req.N != nil && *req.BestOf != *req.N):
		return nil, badRequest("best_of", "best_of %d: only best_of equal to n is supported", *req.BestOf)
	case req.Suffix != "":
		return nil, badRequest("suffix", "suffix is not supported: leave it out")
	}
	ids := req.Prompt.tokens
	if req.Prompt.text != nil {
		ids = m.Tokenizer.Encode(*req.Prompt.text)
	}
	logprobs := -1
	if req.Logprobs != nil {
		if err := checkLogprobs("logprobs", *req.Logprobs); err != nil {
			return nil, err
		}
		logprobs = int(*req.Logprobs)
	}
	return req.build(m, ids, req.MaxTokens, defaultCompletionTokens, logprobs)
}

// completionAPI shapes /v1/completions responses.
type completionAPI struct{ tok *tokenizer.Tokenizer }

func newCompletionAPI(m *Model) endpoint { return completionAPI{m.Tokenizer.Tokenizer} }

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	StopReason   any                 `json:"stop_reason,omitempty"` // vLLM's: the stop string or stop token id that ended the output
}

// completionLogprobs is the legacy logprobs shape: parallel arrays.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (completionAPI) idPrefix() string   { return "cmpl-" }
func (completionAPI) object(bool) string { return "text_completion" }
func (completionAPI) opening(int) any    { return nil }
func (a completionAPI) choice(d delta, res outcome, _ bool) any {
	c := completionChoice{Index: res.index, Text: d.text, FinishReason: nonEmpty(res.finish), StopReason: res.stopReason}
	if len(d.tokens) > 0 && d.tokens[0].lp != nil {
		c.Logprobs = &completionLogprobs{}
		for _, t := range d.tokens {
			top := map[string]float64{}
			for _, alt := range t.lp.Top {
				top[tokenText(a.tok, alt.ID)] = alt.Logprob
			}
			lp := c.Logprobs
			lp.Tokens = append(lp.Tokens, tokenText(a.tok, t.id))
			lp.TokenLogprobs = append(lp.TokenLogprobs, t.lp.Logprob)
			lp.TopLogprobs = append(lp.TopLogprobs, top)
			lp.TextOffset = append(lp.TextOffset, t.offset)
		}
	}
	return c
}

// tokenText is one token's text as logprobs report it (a character split
// over several tokens shows as U+FFFD in each).
func tokenText(tok *tokenizer.Tokenizer, id int32) string {
	text, err := tok.Decode([]int32{id}, false)
	if err != nil {
		return ""
	}
	return text
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
