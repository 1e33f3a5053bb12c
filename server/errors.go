package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"ddflash/engine"
)

// apiError is an error answered in OpenAI's shape:
// {"error":{"message","type","param","code"}}. Code is a string, as in
// OpenAI's API (the official clients decode it as one).
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

// Error types, as OpenAI, vLLM and llama.cpp name them.
const (
	invalidRequest = "invalid_request_error"
	notFound       = "not_found_error"
	rateLimit      = "rate_limit_error"
	serverError    = "server_error"
	unavailable    = "unavailable_error"
)

func newError(status int, typ, code, param, format string, args ...any) *apiError {
	e := &apiError{Status: status, Type: typ, Message: fmt.Sprintf(format, args...)}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	return e
}

// badRequest is a 400 about one request field (param may be empty).
func badRequest(param, format string, args ...any) *apiError {
	return newError(http.StatusBadRequest, invalidRequest, "", param, format, args...)
}

// writeError answers err; anything not already an apiError is a 500.
func writeError(w http.ResponseWriter, err error) {
	e := asAPIError(err)
	writeJSON(w, e.Status, struct {
		Error *apiError `json:"error"`
	}{e})
}

// asAPIError is err as the client may see it. An error that is not already
// an apiError is the server's own failure; its text (a panic's value, a
// file's path) is for the server's log, and the client gets a plain 500.
func asAPIError(err error) *apiError {
	var e *apiError
	if errors.As(err, &e) {
		return e
	}
	return errInternal
}

var errInternal = newError(http.StatusInternalServerError, serverError, "internal_error", "",
	"the server failed while answering this request; its log has the details")

// logFailure logs a server-side failure with what the client is not told:
// the error's text and, for a panic, where it happened.
func (s *Server) logFailure(msg string, err error) {
	var p *engine.PanicError
	if errors.As(err, &p) {
		s.log.Error(msg, "error", err, "stack", string(p.Stack))
		return
	}
	s.log.Error(msg, "error", err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // a client that went away cannot be told anything
}

// submitError maps what Scheduler.Submit refuses to HTTP answers.
func submitError(err error) *apiError {
	switch {
	case errors.Is(err, engine.ErrQueueFull):
		return newError(http.StatusTooManyRequests, rateLimit, "queue_full", "", "%v", err)
	case errors.Is(err, engine.ErrPromptTooLong):
		return newError(http.StatusBadRequest, invalidRequest, "context_length_exceeded", "", "%v", err)
	case errors.Is(err, engine.ErrShutdown):
		return newError(http.StatusServiceUnavailable, unavailable, "", "", "%v", err)
	}
	// The rest are CheckRequest's validation errors: ids outside the
	// vocabulary, sampling parameters out of range.
	return badRequest("", "%v", err)
}

// decodeError explains why a request body could not be read into v.
func decodeError(err error) *apiError {
	var (
		timeout net.Error
		tooBig  *http.MaxBytesError
		syntax  *json.SyntaxError
		typeErr *json.UnmarshalTypeError
		field   *apiError
	)
	switch {
	case errors.As(err, &timeout) && timeout.Timeout():
		return newError(http.StatusRequestTimeout, invalidRequest, "timeout", "",
			"the request body did not arrive within the server's read timeout")
	case errors.As(err, &tooBig):
		return newError(http.StatusRequestEntityTooLarge, invalidRequest, "body_too_large", "",
			"the request body is over the server's limit of %d bytes", tooBig.Limit)
	case errors.As(err, &field):
		return field
	case errors.As(err, &syntax):
		return badRequest("", "the request body is not valid JSON: %v (at byte %d)", syntax, syntax.Offset)
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return badRequest("", "the request body must be a JSON object, not %s", typeErr.Value)
		}
		field := jsonPath(typeErr.Field)
		return badRequest(field, "%s: got %s, want %s", field, typeErr.Value, jsonKind(typeErr.Type.String()))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badRequest(name, "unknown or unsupported field %q: remove it", name)
	}
	return badRequest("", "the request body is not valid JSON: %v", err)
}

// jsonPath drops the names of embedded Go structs from a decoder's field
// path ("samplingFields.max_tokens"): request fields are snake_case, the
// embedded types camelCase.
func jsonPath(goPath string) string {
	parts := strings.Split(goPath, ".")
	kept := parts[:0]
	for _, p := range parts {
		if strings.ToLower(p) == p {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, ".")
}

// jsonKind names a Go type the way a client thinks of JSON values.
func jsonKind(goType string) string {
	goType = strings.TrimPrefix(goType, "*")
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer in range"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["):
		return "an object"
	}
	return "an object"
}
