package bench

import (
	"context"
	"strings"
	"time"
)

// Message is one chat turn.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one generation: the conversation so far, ending with a user turn.
type Request struct {
	Messages       []Message
	MaxTokens      int
	Temperature    float64
	Seed           uint64
	IgnoreEOS      bool
	EnableThinking bool
	// Raw sends the conversation as one plain-text document for completion
	// (RawText; base models, /v1/completions) instead of through the chat
	// template.
	Raw bool
}

// RawText is a conversation as one document: its turns' texts joined by
// newlines, the model's earlier replies included.
func RawText(msgs []Message) string {
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		parts[i] = m.Content
	}
	return strings.Join(parts, "\n")
}

// Chunk is one streamed piece of output.
type Chunk struct {
	At     time.Duration // since the request was sent
	Tokens int           // tokens in the chunk; 0 when the server did not say
}

// Response is what a target measured for one request.
type Response struct {
	Chunks       []Chunk
	E2E          time.Duration
	Tokens       []int32 // output token ids; nil when the server sends none
	Text         string  // the reply, which the next turn of a conversation includes
	PromptTokens int
	CachedTokens int // prompt tokens the server's prefix cache supplied (usage.prompt_tokens_details)
	OutputTokens int
	Finish       string
	Spec         *SpecStat
}

// Target serves one configuration's requests; it must be safe for
// concurrent Generate calls.
type Target interface {
	Generate(ctx context.Context, r Request) (*Response, error)
	// SpecCounters returns the cumulative spec-decode counters, or nil when
	// the target has none (no speculation, or a server without them).
	SpecCounters(ctx context.Context) (*SpecCounter, error)
	Close() error
}

// Backend opens a Target per configuration.
type Backend interface {
	Info() BackendInfo
	// Validate rejects plans the backend cannot run.
	Validate(p *Plan) error
	// Knobs returns the backend's own settings for a configuration; the
	// sweep adds the sampling and plan knobs.
	Knobs(c Config) Knobs
	Open(c Config) (Target, error)
}
