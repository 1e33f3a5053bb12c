package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"ddflash/engine"
)

// browserRequest builds a request with the given headers (Host included).
func browserRequest(t *testing.T, method, url, body string, header map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	return req
}

// TestHostAndOrigin sends requests as a browser would, over the network, to
// a keyless server on loopback: a DNS-rebinding Host and a foreign Origin
// are refused, the server's own names and origin pass, and so do the
// allow-listed ones of a server configured for a reverse proxy.
func TestHostAndOrigin(t *testing.T) {
	h := serveTiny(t, harnessOptions{server: Options{AllowedHosts: []string{"api.example.com"}, AllowedOrigins: []string{"https://ui.example.com"}}})
	port := h.url[strings.LastIndex(h.url, ":")+1:]
	const completion = `{"prompt": "the", "max_tokens": 1}`
	cases := []struct {
		name   string
		header map[string]string
		status int
		code   string
	}{
		{"rebinding Host", map[string]string{"Host": "attacker.example:" + port}, 403, "forbidden_host"},
		{"rebinding Host, no port", map[string]string{"Host": "evil.test"}, 403, "forbidden_host"},
		{"foreign Origin", map[string]string{"Origin": "https://attacker.example"}, 403, "forbidden_origin"},
		{"sandboxed page", map[string]string{"Origin": "null"}, 403, "forbidden_origin"},
		{"another local port", map[string]string{"Origin": "http://127.0.0.1:1"}, 403, "forbidden_origin"},
		{"rebinding Host with its own Origin", map[string]string{"Host": "attacker.example:" + port, "Origin": "http://attacker.example:" + port}, 403, "forbidden_host"},
		{"no Origin (an API client)", nil, 200, ""},
		{"same origin", map[string]string{"Origin": h.url}, 200, ""},
		{"localhost", map[string]string{"Host": "localhost:" + port, "Origin": "http://localhost:" + port}, 200, ""},
		{"IPv6 loopback", map[string]string{"Host": "[::1]:" + port}, 200, ""},
		{"allowed Host", map[string]string{"Host": "API.example.com"}, 200, ""},
		{"allowed Origin", map[string]string{"Origin": "https://ui.example.com"}, 200, ""},
	}
	for _, c := range cases {
		for _, path := range []string{"/v1/models", "/v1/completions"} {
			method := http.MethodGet
			if path == "/v1/completions" {
				method = http.MethodPost
			}
			resp, err := http.DefaultClient.Do(browserRequest(t, method, h.url+path, completion, c.header))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || (c.code != "" && !strings.Contains(string(body), `"code":"`+c.code+`"`)) {
				t.Errorf("%s, %s %s: %d %s, want %d %s", c.name, method, path, resp.StatusCode, body, c.status, c.code)
			}
			cors, want := resp.Header.Get("Access-Control-Allow-Origin"), ""
			if c.header["Origin"] == "https://ui.example.com" {
				want = c.header["Origin"]
			}
			if cors != want {
				t.Errorf("%s: Access-Control-Allow-Origin %q", c.name, cors)
			}
		}
	}
	// /health answers whoever asks: a load balancer's probe names no host of ours.
	if resp, err := http.DefaultClient.Do(browserRequest(t, "GET", h.url+"/health", "", map[string]string{"Host": "10.0.0.7"})); err != nil || resp.StatusCode != 200 {
		t.Errorf("health with a foreign Host: %v %v", resp, err)
	}

	// A browser's preflight before a cross-origin JSON POST.
	for origin, want := range map[string]int{"https://ui.example.com": 204, "https://attacker.example": 403} {
		req := browserRequest(t, http.MethodOptions, h.url+"/v1/chat/completions", "", map[string]string{
			"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		allowed := resp.Header.Get("Access-Control-Allow-Headers")
		if resp.StatusCode != want || (want == 204 && (resp.Header.Get("Access-Control-Allow-Origin") != origin || !strings.Contains(allowed, "x-stainless-os"))) {
			t.Errorf("preflight from %s: %d, headers %v", origin, resp.StatusCode, resp.Header)
		}
	}
}

// TestHostPolicy checks which Host headers name the server, by listen address.
func TestHostPolicy(t *testing.T) {
	cases := []struct {
		addr    string
		allowed []string
		host    string
		want    bool
	}{
		{"127.0.0.1:8000", nil, "127.0.0.1:8000", true},
		{"127.0.0.1:8000", nil, "127.3.4.5", true},
		{"127.0.0.1:8000", nil, "localhost:8000", true},
		{"127.0.0.1:8000", nil, "app.localhost", true},
		{"127.0.0.1:8000", nil, "localhost.:8000", true},
		{"127.0.0.1:8000", nil, "", true},
		{"127.0.0.1:8000", nil, "localhost.attacker.example", false},
		{"127.0.0.1:8000", nil, "192.168.1.5:8000", false},
		{"127.0.0.1:8000", nil, "attacker.example:8000", false},
		{"127.0.0.1:8000", []string{"proxy.example:443"}, "proxy.example", true},
		{"127.0.0.1:8000", []string{"*"}, "anything.example", true},
		{"[::1]:8000", nil, "[::1]:8000", true},
		{"192.168.1.5:8000", nil, "192.168.1.5:8000", true},
		{"192.168.1.5:8000", nil, "192.168.1.6:8000", false},
		{"0.0.0.0:8000", nil, "192.168.1.6:8000", true},
		{"0.0.0.0:8000", nil, "box.lan:8000", false},
		{":8000", nil, "[fe80::1]:8000", true},
		{"box.lan:8000", nil, "BOX.lan:8000", true},
	}
	for _, c := range cases {
		p := newOriginPolicy(Options{Addr: c.addr, AllowedHosts: c.allowed})
		if got := p.hostAllowed(c.host); got != c.want {
			t.Errorf("listening on %s (allowed %v): Host %q allowed %v, want %v", c.addr, c.allowed, c.host, got, c.want)
		}
	}
}

// TestAPIKeyLiftsHostChecks: with a key, a foreign Host or Origin is no
// risk (browsers never send the key for a page), and the key decides.
func TestAPIKeyLiftsHostChecks(t *testing.T) {
	h := serveTiny(t, harnessOptions{apiKey: "k"})
	for _, c := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer k", 200}} {
		foreign := map[string]string{"Host": "attacker.example", "Origin": "https://attacker.example", "Authorization": c.auth}
		resp, err := http.DefaultClient.Do(browserRequest(t, "GET", h.url+"/v1/models", "", foreign))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%q with a foreign Host and Origin: %d, want %d", c.auth, resp.StatusCode, c.want)
		}
	}
}

// TestJSONBodiesOnly: a form or text/plain body (what a web page can post
// without a preflight) is refused with 415 before it is read.
func TestJSONBodiesOnly(t *testing.T) {
	h := serveTiny(t, harnessOptions{})
	for ct, want := range map[string]int{
		"":                                  415,
		"text/plain":                        415,
		"application/x-www-form-urlencoded": 415,
		"multipart/form-data; boundary=x":   415,
		"application/jsonx":                 415,
		"application/json":                  200,
		"Application/JSON; charset=utf-8":   200,
	} {
		req, _ := http.NewRequest("POST", h.url+"/tokenize", strings.NewReader(`{"prompt": "the fox"}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 415 && !strings.Contains(string(body), "application/json")) {
			t.Errorf("Content-Type %q: %d %s, want %d", ct, resp.StatusCode, body, want)
		}
	}
}

// TestStopLimitsOverHTTP: too many or too long stop strings are a 400 that
// names the limit, as the official client reads it.
func TestStopLimitsOverHTTP(t *testing.T) {
	h := serveTiny(t, harnessOptions{})
	many := make([]string, maxStops+1)
	for i := range many {
		many[i] = fmt.Sprintf("<%d>", i)
	}
	for _, stops := range [][]string{many, {strings.Repeat("ab", maxStopBytes)}} {
		p := completionParams("the fox", 4)
		p.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: stops}
		_, err := h.client.Completions.New(context.Background(), p)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "stop" || !strings.Contains(apiErr.Message, "limit is") {
			t.Errorf("%d stops of up to %d bytes: %v", len(stops), len(stops[len(stops)-1]), err)
		}
	}
	p := completionParams("the fox", 4)
	p.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: many[:maxStops]}
	if _, err := h.client.Completions.New(context.Background(), p); err != nil {
		t.Errorf("%d stops: %v", maxStops, err)
	}
}

// poisonedDrafter wraps a drafter: requests whose prompt starts with the
// poison token panic in their first draft, with a message that holds a
// local path (which no client may see); requests whose prompt starts with
// the gate token wait in their first draft until the gate opens.
type poisonedDrafter struct {
	engine.Drafter
	poison, gated int32
	gate          chan struct{} // closed to open
	entered       chan struct{} // told when a gated request waits
}

func (d *poisonedDrafter) NewSession(prompt []int32) (engine.DraftSession, error) {
	s, err := d.Drafter.NewSession(prompt)
	return &poisonedSession{DraftSession: s, d: d, first: prompt[0]}, err
}

type poisonedSession struct {
	engine.DraftSession
	d      *poisonedDrafter
	first  int32
	drafts int
}

const secretPath = "/srv/secret-models/qwen/model-00001.safetensors"

func (s *poisonedSession) Draft(features []float32, anchor int32) ([]float32, error) {
	if s.drafts++; s.drafts == 1 {
		switch s.first {
		case s.d.poison:
			panic("index out of range reading " + secretPath)
		case s.d.gated:
			s.d.entered <- struct{}{}
			<-s.d.gate
		}
	}
	return s.DraftSession.Draft(features, anchor)
}

// lockedBuffer is a log destination for a server running in other goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// panicHarness serves the tiny model with speculation and the poisoned
// drafter; gated prompts start with " dog", poisoned ones with " fox".
func panicHarness(t *testing.T, o harnessOptions) (*harness, *poisonedDrafter, *lockedBuffer) {
	_, _, tok := modelDirs(t)
	d := &poisonedDrafter{poison: tok.Encode(" fox")[0], gated: tok.Encode(" dog")[0], gate: make(chan struct{}), entered: make(chan struct{}, 4)}
	if d.poison == d.gated || d.poison == tok.Encode("the")[0] || d.gated == tok.Encode("the")[0] {
		t.Fatal("the poison and gate tokens must start no other test prompt")
	}
	var log lockedBuffer
	o.spec, o.sched = specModes[2], engine.SchedulerOptions{MaxRunning: 2}
	o.server.Logger = slog.New(slog.NewTextHandler(&log, nil))
	o.engine = func(e *engine.Engine) { d.Drafter = e.Drafter; e.Drafter = d }
	return serveTiny(t, o), d, &log
}

// TestPanicFailsOneRequest makes the engine panic while it serves one
// request, plain and streamed, through the official client: that request
// gets a 500 that says nothing of the panic, the log has it all, every KV
// page and state slot comes back, and the next request is answered right.
// A panic in a handler is answered the same way.
func TestPanicFailsOneRequest(t *testing.T) {
	h, _, log := panicHarness(t, harnessOptions{})
	_, _, tok := modelDirs(t)
	ctx := context.Background()
	before := h.model.Scheduler.State()
	clean := func(what, msg string) {
		for _, leak := range []string{"secret", "index out of range", "panic", "goroutine"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s: the client was told %q", what, msg)
			}
		}
	}

	_, err := h.client.Completions.New(ctx, completionParams(" fox jumps", 8))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 500 || apiErr.Code != "internal_error" {
		t.Fatalf("poisoned completion: %v, want a 500", err)
	}
	clean("plain", apiErr.Message+apiErr.RawJSON())

	st := h.client.Completions.NewStreaming(ctx, completionParams(" fox and the dog", 8))
	for st.Next() {
	}
	if err := st.Err(); err == nil || !strings.Contains(err.Error(), "log has the details") {
		t.Errorf("poisoned stream: %v, want the server's error event", err)
	} else {
		clean("streamed", err.Error())
	}
	if !strings.Contains(log.String(), secretPath) || !strings.Contains(log.String(), "stack=") {
		t.Errorf("the server log lacks the panic and its stack:\n%s", log.String())
	}

	waitIdle(t, h.model.Scheduler)
	if after := h.model.Scheduler.State(); after != before {
		t.Errorf("scheduler state %+v after the panics, %+v before", after, before)
	}
	prompt := "the quick brown"
	want := referenceAnswer(t, tok.Encode(prompt), 12)
	got, err := h.client.Completions.New(ctx, completionParams(prompt, 12))
	if err != nil || got.Choices[0].Text != want.text {
		t.Fatalf("after the panics: %v %+v, want %q", err, got, want.text)
	}

	h.srv.routes["/boom"] = route{http.MethodGet, func(http.ResponseWriter, *http.Request) { panic("open " + secretPath) }}
	rec := serve(h.srv, "GET", "/boom", "", "")
	if rec.status != 500 || rec.err.Message == "" {
		t.Errorf("handler panic: %d %s", rec.status, rec.body)
	}
	clean("handler", rec.body)
	if _, err := h.client.Models.List(ctx); err != nil {
		t.Errorf("after a handler panic: %v", err)
	}
}

// TestModelsNameNoPath: /v1/models names the served model, never where its
// files are.
func TestModelsNameNoPath(t *testing.T) {
	h := serveTiny(t, harnessOptions{})
	target, _, _ := modelDirs(t)
	resp, err := http.Get(h.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	models, err := h.client.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if root := models.Data[0].JSON.ExtraFields["root"].Raw(); root != mustJSON(testModel) || strings.Contains(string(body), target) || strings.Contains(string(body), "/tmp") {
		t.Errorf("models: %s", body)
	}
}

// TestInternalErrorsSayNothing: an error that is not an API error (a
// loader's, with its file path) is a plain 500.
func TestInternalErrorsSayNothing(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("open %s: permission denied", secretPath),
		&engine.PanicError{Value: "runtime error: " + secretPath},
		fmt.Errorf("engine step: %w", errors.New(secretPath)),
	} {
		e := asAPIError(err)
		if e.Status != 500 || strings.Contains(e.Message, "secret") || strings.Contains(e.Message, "runtime") {
			t.Errorf("%v answered as %d %q", err, e.Status, e.Message)
		}
	}
	if e := asAPIError(badRequest("stop", "x")); e.Status != 400 || e.Message != "x" {
		t.Errorf("an API error changed on the way: %+v", e)
	}
}

// TestStreamOutlivesWriteTimeout holds a stream's generation for three
// write timeouts: the stream must still complete, since only each write
// is bounded, not the response.
func TestStreamOutlivesWriteTimeout(t *testing.T) {
	const limit = 200 * time.Millisecond
	h, d, _ := panicHarness(t, harnessOptions{server: Options{Timeouts: Timeouts{Write: limit}}})
	_, _, tok := modelDirs(t)
	prompt := " dog runs"
	want := referenceAnswer(t, tok.Encode(prompt), 10)
	go func() {
		<-d.entered
		time.Sleep(3 * limit)
		close(d.gate)
	}()
	got, err := streamCompletion(context.Background(), h.client, completionParams(prompt, 10))
	if err != nil || got.text != want.text {
		t.Fatalf("stream held past the write timeout: %v, %q, want %q", err, got.text, want.text)
	}
}

// TestGenerationPastWriteTimeout holds a non-streaming generation past the
// write timeout: the client gets a 504 that says what to do, and the
// request's pages and slot come back.
func TestGenerationPastWriteTimeout(t *testing.T) {
	const limit = 200 * time.Millisecond
	h, d, _ := panicHarness(t, harnessOptions{server: Options{Timeouts: Timeouts{Write: limit}}})
	defer func() {
		close(d.gate)
		waitIdle(t, h.model.Scheduler)
	}()
	_, err := h.client.Completions.New(context.Background(), completionParams(" dog runs", 10))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 504 || !strings.Contains(apiErr.Message, "write timeout") || !strings.Contains(apiErr.Message, "stream") {
		t.Fatalf("generation past the write timeout: %v, want a 504", err)
	}
}

// TestReadAndIdleTimeouts: a body that stops arriving is answered 408 after
// the read timeout, and an idle kept-alive connection is closed.
func TestReadAndIdleTimeouts(t *testing.T) {
	const limit = 200 * time.Millisecond
	h := serveTiny(t, harnessOptions{server: Options{Timeouts: Timeouts{Read: limit, Idle: limit}}})
	addr := strings.TrimPrefix(h.url, "http://")

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /tokenize HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ", addr)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("stalled body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "read timeout") {
		t.Errorf("stalled body: %d %s, want 408", resp.StatusCode, body)
	}

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_ = idle.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(idle, "GET /health HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	r := bufio.NewReader(idle)
	resp, err = http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	_, _ = io.ReadAll(resp.Body)
	time.Sleep(3 * limit)
	if n, err := r.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("idle connection after the idle timeout: read %d, %v; want it closed", n, err)
	}
}
