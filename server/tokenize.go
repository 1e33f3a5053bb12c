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

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request, m *Model) {
	var req tokenizeRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeError(w, err)
		return
	}
	var ids []int32
	var err error
	switch {
	case (req.Prompt == nil) == (req.Messages == nil):
		err = badRequest("prompt", "give exactly one of prompt and messages")
	case req.Prompt != nil:
		ids = m.Tokenizer.Encode(*req.Prompt)
	default:
		ids, err = req.render(m)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(ids), MaxModelLen: m.Engine.Context, Tokens: append([]int32{}, ids...)})
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int32 `json:"tokens"`
}

func (s *Server) detokenize(w http.ResponseWriter, r *http.Request, m *Model) {
	var req detokenizeRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeError(w, err)
		return
	}
	text, err := m.Tokenizer.Decode(req.Tokens, false)
	if err != nil {
		writeError(w, badRequest("tokens", "%v", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": text})
}
