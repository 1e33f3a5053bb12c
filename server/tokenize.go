package server

import (
	"net/http"
)

// tokenizeRequest is POST /tokenize (vLLM's shape): a prompt, or chat
// messages rendered with the chat template.
type tokenizeRequest struct {
	Model  string  `json:"model"`
	Prompt *string `json:"prompt"`
	chatPrompt
	// AddSpecialTokens is accepted for vLLM clients; Qwen tokenizers add
	// no BOS or EOS, so it changes nothing.
	AddSpecialTokens *bool `json:"add_special_tokens"`
}

type tokenizeResponse struct {
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Tokens      []int32 `json:"tokens"`
}

func (r *tokenizeRequest) model() string { return r.Model }

func (s *Server) tokenize(r *http.Request, m *Model) (any, error) {
	var req tokenizeRequest
	if err := s.readRequest(r, &req); err != nil {
		return nil, err
	}
	var ids []int32
	switch {
	case (req.Prompt == nil) == (req.Messages == nil):
		return nil, badRequest("prompt", "give exactly one of prompt and messages")
	case req.Prompt != nil:
		ids = m.Tokenizer.Encode(*req.Prompt)
	default:
		var err error
		if ids, err = req.render(m); err != nil {
			return nil, err
		}
	}
	return tokenizeResponse{Count: len(ids), MaxModelLen: m.Engine.Context, Tokens: append([]int32{}, ids...)}, nil
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int32 `json:"tokens"`
}

func (r *detokenizeRequest) model() string { return r.Model }

func (s *Server) detokenize(r *http.Request, m *Model) (any, error) {
	var req detokenizeRequest
	if err := s.readRequest(r, &req); err != nil {
		return nil, err
	}
	text, err := m.Tokenizer.Decode(req.Tokens, false)
	if err != nil {
		return nil, badRequest("tokens", "%v", err)
	}
	return map[string]string{"prompt": text}, nil
}
