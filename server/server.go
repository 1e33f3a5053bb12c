// Package server is ddflash's OpenAI-compatible HTTP server: completions
// and chat completions (with SSE streaming), models, tokenize/detokenize,
// render (vLLM's, for routers), health and Prometheus metrics, over the
// engine's continuous-batching scheduler.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"mime"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"ddflash/engine"
	"ddflash/tokenizer"
)

// DefaultMaxBodyBytes bounds request bodies: room for a full context of
// token ids written as JSON.
const DefaultMaxBodyBytes = 16 << 20

// Options configure a server.
type Options struct {
	ModelName    string // the served model name; requests naming another get 404
	APIKey       string // when set, every endpoint but /health and /metrics needs "Authorization: Bearer KEY"
	MaxBodyBytes int64  // 0 means DefaultMaxBodyBytes
	Logger       *slog.Logger
	Timeouts     Timeouts
	// Addr is the address the server listens on, as given (a name counts). Without an API key, a
	// request's Host must name it (or loopback, or AllowedHosts), and its
	// Origin, when it has one, must be the server's own (or in
	// AllowedOrigins): so web pages cannot drive a keyless server through
	// the user's browser (cross-site requests, DNS rebinding).
	Addr           string
	AllowedHosts   []string // extra Host names, e.g. a reverse proxy's public name; "*" allows any
	AllowedOrigins []string // extra origins ("https://ui.example.com"), answered with CORS headers; "*" allows any
	// KVEvents, when set, is the KV events publisher (package kvevents)
	// whose counts /metrics shows.
	KVEvents EventCounts
}

// EventCounts are a KV events publisher's counts.
type EventCounts interface {
	Published() uint64
	Dropped() uint64
}

// Timeouts bound how long one connection may take; zero means no bound.
type Timeouts struct {
	ReadHeader time.Duration // to read a request's headers
	Read       time.Duration // to read a whole request, body included
	// Write bounds a response: a non-streaming generation that would run
	// longer is stopped and answered 504. A stream may run as long as it
	// needs, but each of its writes must complete within Write (a client
	// that stops reading is dropped).
	Write time.Duration
	Idle  time.Duration // a kept-alive connection waiting for its next request
}

// DefaultTimeouts are serve's defaults. The write timeout is the OpenAI
// Python client's own default request timeout.
var DefaultTimeouts = Timeouts{ReadHeader: 10 * time.Second, Read: time.Minute, Write: 10 * time.Minute, Idle: 2 * time.Minute}

// Model is what the server serves once loaded.
type Model struct {
	Engine    *engine.Engine
	Scheduler *engine.Scheduler
	Tokenizer *tokenizer.Dir
	// Defaults are the checkpoint's sampling defaults (generation_config.json)
	// for requests that leave them out; zero: OpenAI's.
	Defaults engine.GenerationConfig
	// Parsers split chat output into reasoning, content and tool calls.
	Parsers Parsers
	// submit, when set, stands in for Scheduler.Submit (tests script the
	// model's output with it).
	submit func(context.Context, engine.Request) (tokenStream, error)
}

// Server answers the HTTP API. It answers from the moment it is created:
// until Run attaches a model, /health and the model endpoints say 503.
type Server struct {
	opts    Options
	log     *slog.Logger
	model   atomic.Pointer[Model]
	stopped atomic.Bool // the engine ran and has stopped
	metrics *metrics
	routes  map[string]route // by path
	created int64
	origin  originPolicy
}

// HTTPServer is an http.Server for s with its timeouts.
func (s *Server) HTTPServer() *http.Server {
	t := s.opts.Timeouts
	return &http.Server{Handler: s, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
}

// New makes a server that is still loading.
func New(opts Options) *Server {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{opts: opts, log: opts.Logger, created: time.Now().Unix(), origin: newOriginPolicy(opts)}
	s.metrics = newMetrics(opts.ModelName, s.schedulerState, opts.KVEvents)
	s.routes = map[string]route{
		"/health":                     {http.MethodGet, s.health},
		"/metrics":                    {http.MethodGet, promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}).ServeHTTP},
		"/v1/models":                  {http.MethodGet, s.needsModel(s.answer(s.listModels))},
		"/v1/completions":             {http.MethodPost, s.needsModel(s.generator(s.completionRequest, newCompletionAPI))},
		"/v1/chat/completions":        {http.MethodPost, s.needsModel(s.generator(s.chatRequest, newChatAPI))},
		"/v1/completions/render":      {http.MethodPost, s.needsModel(s.answer(s.renderCompletion))},
		"/v1/chat/completions/render": {http.MethodPost, s.needsModel(s.answer(s.renderChat))},
		"/tokenize":                   {http.MethodPost, s.needsModel(s.answer(s.tokenize))},
		"/detokenize":                 {http.MethodPost, s.needsModel(s.answer(s.detokenize))},
	}
	return s
}

// Run serves m: it runs m's scheduler until ctx is done, and the server
// answers requests with it meanwhile. /health says 503 again after Run returns.
func (s *Server) Run(ctx context.Context, m *Model) {
	s.attach(m)
	defer func() {
		s.stopped.Store(true)
		s.model.Store(nil)
	}()
	m.Scheduler.Run(ctx)
}

func (s *Server) attach(m *Model) {
	s.metrics.setCacheConfig(m.Engine)
	if m.Engine.Drafter != nil && m.Engine.Spec.Mode != engine.SpecAuto {
		s.metrics.specPositions(m.Engine.Drafter.BlockSize() - 1)
	}
	s.model.Store(m)
}

func (s *Server) schedulerState() (engine.SchedulerState, engine.SpecOptions, bool) {
	m := s.model.Load()
	if m == nil {
		return engine.SchedulerState{}, engine.SpecOptions{}, false
	}
	return m.Scheduler.State(), m.Engine.Spec, true
}

type route struct {
	method  string
	handler http.HandlerFunc
}

// ServeHTTP routes a request after the origin, API key, content type and
// body-size checks.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v) // net/http's own way to drop a connection
			}
			s.fail(w, &engine.PanicError{Value: v, Stack: debug.Stack()})
		}
	}()
	if s.origin.preflight(w, r) {
		return
	}
	if r.URL.Path != "/health" {
		if err := s.origin.check(w, r); err != nil {
			writeError(w, err)
			return
		}
		if !keyless(r.URL.Path) && !s.authorized(r) {
			writeError(w, newError(http.StatusUnauthorized, invalidRequest, "invalid_api_key", "",
				"missing or wrong API key: send the header \"Authorization: Bearer KEY\""))
			return
		}
	}
	rt, ok := s.routes[r.URL.Path]
	switch {
	case !ok:
		writeError(w, newError(http.StatusNotFound, notFound, "not_found", "", "no route %s %s", r.Method, r.URL.Path))
	case r.Method != rt.method:
		w.Header().Set("Allow", rt.method)
		writeError(w, newError(http.StatusMethodNotAllowed, invalidRequest, "method_not_allowed", "",
			"%s takes %s, not %s", r.URL.Path, rt.method, r.Method))
	case r.Method == http.MethodPost && !isJSON(r.Header.Get("Content-Type")):
		writeError(w, newError(http.StatusUnsupportedMediaType, invalidRequest, "unsupported_media_type", "",
			"the request body must be JSON, sent with the header \"Content-Type: application/json\""))
	default:
		r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
		rt.handler(w, r)
	}
}

// keyless reports whether a path answers without the API key: the probes
// and the metrics that a router or load balancer reads, which can send no
// key (vLLM checks its key on /v1/* paths only). The API stays behind it,
// and so do /tokenize and /detokenize.
func keyless(path string) bool { return path == "/health" || path == "/metrics" }

// isJSON reports whether a Content-Type header says JSON.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// authorized compares the bearer token in constant time (of digests, so
// that not even the key's length leaks).
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.APIKey == "" {
		return true
	}
	given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	want, got := sha256.Sum256([]byte(s.opts.APIKey)), sha256.Sum256([]byte(given))
	return ok && subtle.ConstantTimeCompare(want[:], got[:]) == 1
}

var (
	errLoading = newError(http.StatusServiceUnavailable, unavailable, "", "", "Loading model: retry when /health answers 200")
	errStopped = newError(http.StatusServiceUnavailable, unavailable, "", "", "the engine has stopped: the server is shutting down")
)

// notServing says why no model is served, or returns nil.
func (s *Server) notServing() *apiError {
	switch {
	case s.model.Load() != nil:
		return nil
	case s.stopped.Load():
		return errStopped
	}
	return errLoading
}

// modelHandler is a handler that needs the loaded model.
type modelHandler func(w http.ResponseWriter, r *http.Request, m *Model)

func (s *Server) needsModel(h modelHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		m := s.model.Load()
		if m == nil {
			writeError(w, s.notServing())
			return
		}
		h(w, r, m)
	}
}

// answer makes a handler that answers with one JSON object.
func (s *Server) answer(h func(*http.Request, *Model) (any, error)) modelHandler {
	return func(w http.ResponseWriter, r *http.Request, m *Model) {
		v, err := h(r, m)
		if err != nil {
			s.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// generator makes a handler that runs the generation parse reads from a
// request and answers in the shape of api.
func (s *Server) generator(parse func(*http.Request, *Model) (*genRequest, error), api func(*Model) endpoint) modelHandler {
	return func(w http.ResponseWriter, r *http.Request, m *Model) {
		g, err := parse(r, m)
		if err == nil {
			err = checkStops(g.stops)
		}
		if err != nil {
			s.fail(w, err)
			return
		}
		if !g.stream && s.opts.Timeouts.Write > 0 {
			ctx, cancel := s.generationDeadline(w, r)
			defer cancel()
			r = r.WithContext(ctx)
		}
		s.respond(w, r, m, g, api(m))
	}
}

// answerTime is what a non-streaming generation leaves of the write
// timeout to send its answer.
const answerTime = 10 * time.Second

// generationDeadline bounds a non-streaming generation by the write timeout,
// and moves the connection's write deadline past it, so that the generation
// is stopped (rather than left to run for a client that can no longer be
// answered) and the client is told why.
func (s *Server) generationDeadline(w http.ResponseWriter, r *http.Request) (context.Context, context.CancelFunc) {
	limit := s.opts.Timeouts.Write
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(limit + answerTime))
	return context.WithTimeoutCause(r.Context(), limit, newError(http.StatusGatewayTimeout, serverError, "timeout", "",
		"the generation ran past the server's write timeout of %v: stream it (\"stream\": true), ask for fewer tokens, or raise the server's --write-timeout", limit))
}

// health is 200 while a model is served and 503 before (loading) and after.
func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	if err := s.notServing(); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// modelCard is a /v1/models entry, as vLLM writes it, except that root
// is the served name too: where the weights lie is none of a client's business.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

func (s *Server) listModels(_ *http.Request, m *Model) (any, error) {
	card := modelCard{ID: s.opts.ModelName, Object: "model", Created: s.created, OwnedBy: "ddflash",
		Root: s.opts.ModelName, MaxModelLen: m.Engine.Context}
	return map[string]any{"object": "list", "data": []modelCard{card}}, nil
}

// checkModel accepts the served model's name, or none.
func (s *Server) checkModel(name string) error {
	if name != "" && name != s.opts.ModelName {
		return newError(http.StatusNotFound, notFound, "model_not_found", "model",
			"the model %q does not exist: this server serves %q", name, s.opts.ModelName)
	}
	return nil
}
