package server

import (
	"net/http"
)

// rendered is one prompt as vLLM's render endpoints answer it (a subset of
// its GenerateRequest): the token ids a generation of the same request
// would be given. A router tokenizes with it (the llm-d EPP, to match
// prompts to the replicas' cached prefixes).
type rendered struct {
	TokenIDs []int32 `json:"token_ids"`
	Model    string  `json:"model"`
}

// renderCompletion is POST /v1/completions/render: a completions request's
// body, read and checked as /v1/completions reads it, answered with an
// array of one prompt per prompt (this server takes one).
func (s *Server) renderCompletion(r *http.Request, m *Model) (any, error) {
	g, err := s.completionRequest(r, m)
	if err == nil {
		err = checkRendered(m, g)
	}
	if err != nil {
		return nil, err
	}
	return []rendered{{TokenIDs: g.req.Prompt, Model: s.opts.ModelName}}, nil
}

// renderChat is POST /v1/chat/completions/render: a chat request's body,
// rendered with the chat template as /v1/chat/completions renders it.
func (s *Server) renderChat(r *http.Request, m *Model) (any, error) {
	g, err := s.chatRequest(r, m)
	if err == nil {
		err = checkRendered(m, g)
	}
	if err != nil {
		return nil, err
	}
	return rendered{TokenIDs: g.req.Prompt, Model: s.opts.ModelName}, nil
}

// checkRendered refuses what the generation would refuse once parsed: a
// prompt that is no token ids of the model's, say.
func checkRendered(m *Model, g *genRequest) error {
	if err := checkStops(g.stops); err != nil {
		return err
	}
	if err := m.Engine.CheckRequest(g.req); err != nil {
		return submitError(err)
	}
	return nil
}
