package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"ddflash/engine"
	"ddflash/tokenizer"
)

func completionParams(prompt string, maxTokens int) openai.CompletionNewParams {
	return openai.CompletionNewParams{
		Model:       testModel,
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:   openai.Int(int64(maxTokens)),
		Temperature: openai.Float(0),
	}
}

// streamCompletion collects a streamed completion: its text, the chunks'
// texts, the finish reason and the usage chunk.
type streamed struct {
	text, finish string
	chunks       []string
	usage        openai.CompletionUsage
	logprobs     []openai.CompletionChoiceLogprobs
}

func streamCompletion(ctx context.Context, c openai.Client, p openai.CompletionNewParams) (streamed, error) {
	var out streamed
	s := c.Completions.NewStreaming(ctx, p)
	for s.Next() {
		chunk := s.Current()
		if len(chunk.Choices) == 0 {
			out.usage = chunk.Usage
			continue
		}
		ch := chunk.Choices[0]
		out.text += ch.Text
		out.chunks = append(out.chunks, ch.Text)
		if ch.FinishReason != "" {
			out.finish = string(ch.FinishReason)
		}
		if ch.Logprobs.JSON.Tokens.Valid() {
			out.logprobs = append(out.logprobs, ch.Logprobs)
		}
	}
	return out, s.Err()
}

// TestCompletions compares completions (text and token prompts, plain and
// streamed) with the engine's own answers to the same requests.
func TestCompletions(t *testing.T) {
	h := serveTiny(t, harnessOptions{sched: engine.SchedulerOptions{MaxRunning: 2}})
	_, _, tok := modelDirs(t)
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	for i := range 4 {
		prompt := randomPrompt(rng, 1, 20)
		maxTokens := 1 + rng.IntN(30)
		want := referenceAnswer(t, tok.Encode(prompt), maxTokens)

		params := completionParams(prompt, maxTokens)
		if i%2 == 1 {
			ids := tok.Encode(prompt)
			params.Prompt = openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toInt64(ids)}
		}
		got, err := h.client.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		c := got.Choices[0]
		if c.Text != want.text || string(c.FinishReason) != want.finish {
			t.Errorf("prompt %q: got %q (%s), want %q (%s)", prompt, c.Text, c.FinishReason, want.text, want.finish)
		}
		checkUsage(t, got.Usage, len(tok.Encode(prompt)), len(want.tokens))
		if got.Model != testModel || got.Object != "text_completion" || !strings.HasPrefix(got.ID, "cmpl-") {
			t.Errorf("envelope: model %q object %q id %q", got.Model, got.Object, got.ID)
		}

		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		s, err := streamCompletion(ctx, h.client, params)
		if err != nil {
			t.Fatal(err)
		}
		if s.text != want.text || s.finish != want.finish {
			t.Errorf("prompt %q streamed: got %q (%s), want %q (%s)", prompt, s.text, s.finish, want.text, want.finish)
		}
		checkUsage(t, s.usage, len(tok.Encode(prompt)), len(want.tokens))
	}
}

func checkUsage(t *testing.T, u openai.CompletionUsage, prompt, completion int) {
	t.Helper()
	if u.PromptTokens != int64(prompt) || u.CompletionTokens != int64(completion) || u.TotalTokens != int64(prompt+completion) {
		t.Errorf("usage %d+%d=%d, want %d+%d", u.PromptTokens, u.CompletionTokens, u.TotalTokens, prompt, completion)
	}
}

func toInt64(ids []int32) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}

// chatML renders messages the way the tiny model's ChatML template does,
// written out by hand as the independent reference.
func chatML(msgs ...[2]string) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "<|im_start|>%s\n%s<|im_end|>\n", m[0], m[1])
	}
	return b.String() + "<|im_start|>assistant\n"
}

func TestChatCompletions(t *testing.T) {
	h := serveTiny(t, harnessOptions{spec: specModes[2], sched: engine.SchedulerOptions{MaxRunning: 2}})
	_, _, tok := modelDirs(t)
	ctx := context.Background()
	system, user := "the farmer walks", "the dog sleeps in the sun"
	prompt := tok.Encode(chatML([2]string{"system", system}, [2]string{"user", user}))
	params := openai.ChatCompletionNewParams{
		Model:       testModel,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(user)},
		MaxTokens:   openai.Int(24),
		Temperature: openai.Float(0),
	}
	want := referenceAnswer(t, prompt, 24)
	got, err := h.client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	c := got.Choices[0]
	if c.Message.Content != want.text || c.FinishReason != want.finish || c.Message.Role != "assistant" {
		t.Errorf("chat: got %q (%s, %s), want %q (%s)", c.Message.Content, c.FinishReason, c.Message.Role, want.text, want.finish)
	}
	if got.Object != "chat.completion" || !strings.HasPrefix(got.ID, "chatcmpl-") {
		t.Errorf("envelope: object %q id %q", got.Object, got.ID)
	}
	checkUsage(t, got.Usage, len(prompt), len(want.tokens))

	// Streamed, with usage; max_completion_tokens takes over max_tokens.
	params.MaxCompletionTokens = openai.Int(10)
	want = referenceAnswer(t, prompt, 10)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := h.client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	var roles []string
	for s.Next() {
		chunk := s.Current()
		acc.AddChunk(chunk)
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Role != "" {
			roles = append(roles, chunk.Choices[0].Delta.Role)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if text := acc.Choices[0].Message.Content; text != want.text || acc.Choices[0].FinishReason != want.finish {
		t.Errorf("streamed chat: got %q (%s), want %q (%s)", text, acc.Choices[0].FinishReason, want.text, want.finish)
	}
	if !slices.Equal(roles, []string{"assistant"}) {
		t.Errorf("roles announced %v, want one assistant", roles)
	}
	checkUsage(t, acc.Usage, len(prompt), len(want.tokens))
}

// TestChatTemplateKwargs serves a model whose template honours
// enable_thinking, as Qwen3's does, and checks through /tokenize and a chat
// completion that chat_template_kwargs reaches the template.
func TestChatTemplateKwargs(t *testing.T) {
	target, _, _ := modelDirs(t)
	dir := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json"} {
		data, err := os.ReadFile(filepath.Join(target, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const template = `{%- for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endfor %}` +
		`{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}`
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(template), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := serveTiny(t, harnessOptions{tok: tok}) // same vocabulary, another template

	hello := chatML([2]string{"user", "hello"})
	for _, c := range []struct {
		kwargs string
		want   string
	}{
		{``, hello},
		{`, "chat_template_kwargs": {"enable_thinking": true}`, hello},
		{`, "chat_template_kwargs": {"enable_thinking": false}`, hello + "<think>\n\n</think>\n\n"},
	} {
		body := `{"messages": [{"role": "user", "content": "hello"}]` + c.kwargs + `}`
		var got tokenizeResponse
		postJSON(t, h, "/tokenize", body, http.StatusOK, &got)
		if want := tok.Encode(c.want); !slices.Equal(got.Tokens, want) || got.Count != len(want) || got.MaxModelLen != testContext {
			t.Errorf("%s: tokenize gave %v (count %d), want %v", c.kwargs, got.Tokens, got.Count, want)
		}
	}
	var resp struct {
		Usage usage `json:"usage"`
	}
	postJSON(t, h, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": false}}`, http.StatusOK, &resp)
	if want := len(tok.Encode(hello + "<think>\n\n</think>\n\n")); resp.Usage.PromptTokens != want {
		t.Errorf("chat prompt has %d tokens, want %d", resp.Usage.PromptTokens, want)
	}
}

// postJSON posts body and decodes the answer, which must have status want.
func postJSON(t *testing.T, h *harness, path, body string, want int, out any) {
	t.Helper()
	resp, err := http.Post(h.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("POST %s %s: status %d, want %d: %s", path, body, resp.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("POST %s: %v: %s", path, err, data)
		}
	}
}

// TestLogprobs checks completion and chat logprobs against the engine's
// own, for the same greedy request.
func TestLogprobs(t *testing.T) {
	h := serveTiny(t, harnessOptions{spec: specModes[1], sched: engine.SchedulerOptions{MaxRunning: 2}})
	_, _, tok := modelDirs(t)
	ctx := context.Background()
	const prompt, n, top = "the quick brown fox", 12, 3
	ref := referenceRun(t, engine.Request{Prompt: tok.Encode(prompt), MaxTokens: n, Sampling: engine.SamplingParams{Logprobs: top}})

	params := completionParams(prompt, n)
	params.Logprobs = openai.Int(top)
	got, err := h.client.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	lp := got.Choices[0].Logprobs
	if len(lp.Tokens) != len(ref.Tokens) || len(lp.TokenLogprobs) != len(ref.Tokens) || len(lp.TopLogprobs) != len(ref.Tokens) {
		t.Fatalf("completion logprobs for %d tokens, want %d", len(lp.Tokens), len(ref.Tokens))
	}
	full, _ := tok.Decode(ref.Tokens, true)
	for i, step := range ref.Logprobs {
		if lp.Tokens[i] != decodeOne(t, tok, ref.Tokens[i]) || !near(lp.TokenLogprobs[i], step.Logprob) {
			t.Errorf("token %d: %q %g, want %q %g", i, lp.Tokens[i], lp.TokenLogprobs[i], decodeOne(t, tok, ref.Tokens[i]), step.Logprob)
		}
		// The legacy format keys alternatives by text: check those whose
		// text no other alternative shares.
		texts := map[string]int{}
		for _, alt := range step.Top {
			texts[decodeOne(t, tok, alt.ID)]++
		}
		for _, alt := range step.Top {
			text := decodeOne(t, tok, alt.ID)
			if v, ok := lp.TopLogprobs[i][text]; !ok || (texts[text] == 1 && !near(v, alt.Logprob)) {
				t.Errorf("token %d: top logprob of %q is %g (present %v), want %g", i, text, v, ok, alt.Logprob)
			}
		}
		// A token's text starts where the text of the tokens before it ends,
		// when they end on a whole, valid character.
		before, _ := tok.Decode(ref.Tokens[:i], true)
		if strings.HasPrefix(full, before) && !strings.HasSuffix(before, "\uFFFD") && lp.TextOffset[i] != int64(len(before)) {
			t.Errorf("token %d: text offset %d, want %d", i, lp.TextOffset[i], len(before))
		}
		if i > 0 && (lp.TextOffset[i] < lp.TextOffset[i-1] || lp.TextOffset[i] > int64(len(full))) {
			t.Errorf("token %d: text offset %d after %d, text length %d", i, lp.TextOffset[i], lp.TextOffset[i-1], len(full))
		}
	}

	// Streamed, the chunks' logprobs add up to the same list.
	s, err := streamCompletion(ctx, h.client, params)
	if err != nil {
		t.Fatal(err)
	}
	var streamedLP []float64
	for _, l := range s.logprobs {
		streamedLP = append(streamedLP, l.TokenLogprobs...)
	}
	if !slices.EqualFunc(streamedLP, lp.TokenLogprobs, near) {
		t.Errorf("streamed logprobs %v, want %v", streamedLP, lp.TokenLogprobs)
	}

	chat, err := h.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		MaxTokens: openai.Int(n), Temperature: openai.Float(0), Logprobs: openai.Bool(true), TopLogprobs: openai.Int(top),
	})
	if err != nil {
		t.Fatal(err)
	}
	ref = referenceRun(t, engine.Request{Prompt: tok.Encode(chatML([2]string{"user", "hello"})), MaxTokens: n, Sampling: engine.SamplingParams{Logprobs: top}})
	content := chat.Choices[0].Logprobs.Content
	if len(content) != len(ref.Tokens) {
		t.Fatalf("chat logprobs for %d tokens, want %d", len(content), len(ref.Tokens))
	}
	for i, step := range ref.Logprobs {
		c := content[i]
		if c.Token != decodeOne(t, tok, step.ID) || !near(c.Logprob, step.Logprob) || string(toBytes(c.Bytes)) != c.Token || len(c.TopLogprobs) != top {
			t.Errorf("chat token %d: %+v, want %q %g", i, c, decodeOne(t, tok, step.ID), step.Logprob)
			continue
		}
		for j, alt := range step.Top {
			if c.TopLogprobs[j].Token != decodeOne(t, tok, alt.ID) || !near(c.TopLogprobs[j].Logprob, alt.Logprob) {
				t.Errorf("chat token %d alternative %d: %+v, want %q %g", i, j, c.TopLogprobs[j], decodeOne(t, tok, alt.ID), alt.Logprob)
			}
		}
	}
}

func decodeOne(t *testing.T, tok *tokenizer.Dir, id int32) string {
	t.Helper()
	s, err := tok.Decode([]int32{id}, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func toBytes(v []int64) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

// near compares log-probabilities from a batched and a lone forward.
func near(a, b float64) bool { return math.Abs(a-b) < 1e-4 }

// TestStopStrings picks stop strings out of the reference answer (so that
// they straddle token boundaries) and checks that the output ends right
// before the first one, plainly and streamed, and that no streamed chunk
// ever showed a stop string.
func TestStopStrings(t *testing.T) {
	h := serveTiny(t, harnessOptions{spec: specModes[3], sched: engine.SchedulerOptions{MaxRunning: 2}})
	_, _, tok := modelDirs(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	tested := 0
	for tries := 0; tested < 4 && tries < 40; tries++ {
		prompt := randomPrompt(rng, 2, 12)
		full := referenceAnswer(t, tok.Encode(prompt), 40)
		runes := []rune(full.text)
		if len(runes) < 6 {
			continue
		}
		from := 1 + rng.IntN(len(runes)-4)
		stop := string(runes[from : from+1+rng.IntN(3)])
		if strings.ContainsRune(stop, '\uFFFD') {
			continue // a cut character decodes differently once cut
		}
		tested++
		want := full.text[:strings.Index(full.text, stop)]
		wantTokens := tokensUntil(t, tok, full.tokens, stop)

		params := completionParams(prompt, 40)
		params.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: []string{"never in the output \x01", stop}}
		got, err := h.client.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		c := got.Choices[0]
		if c.Text != want || c.FinishReason != "stop" || got.Usage.CompletionTokens != int64(wantTokens) {
			t.Errorf("stop %q: got %q (%s, %d tokens), want %q (stop, %d tokens)", stop, c.Text, c.FinishReason, got.Usage.CompletionTokens, want, wantTokens)
		}
		if reason := c.JSON.ExtraFields["stop_reason"].Raw(); reason != mustJSON(stop) {
			t.Errorf("stop_reason %s, want %s", reason, mustJSON(stop))
		}

		s, err := streamCompletion(ctx, h.client, params)
		if err != nil {
			t.Fatal(err)
		}
		if s.text != want || s.finish != "stop" {
			t.Errorf("stop %q streamed: got %q (%s), want %q", stop, s.text, s.finish, want)
		}
		for _, chunk := range s.chunks {
			if strings.Contains(chunk, stop) {
				t.Errorf("stop %q leaked in chunk %q", stop, chunk)
			}
		}
	}
	if tested < 4 {
		t.Fatalf("only %d usable answers to take stop strings from", tested)
	}
	waitIdle(t, h.model.Scheduler) // a stop string cancels the request in the engine
}

// TestStopTokenIDsSetStopReason stops a greedy completion on a token of its
// reference answer given in stop_token_ids: finish_reason is stop and
// stop_reason is that id (a JSON number, as vLLM answers), plainly and in
// the streamed final chunk, and the output ends with that token.
func TestStopTokenIDsSetStopReason(t *testing.T) {
	h := serveTiny(t, harnessOptions{spec: specModes[3], sched: engine.SchedulerOptions{MaxRunning: 2}})
	_, _, tok := modelDirs(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	tested := 0
	for tries := 0; tested < 3 && tries < 40; tries++ {
		prompt := randomPrompt(rng, 2, 12)
		full := referenceAnswer(t, tok.Encode(prompt), 30)
		at := -1 // the first output token from the third on that did not come before
		for i := 2; i < len(full.tokens) && at < 0; i++ {
			if !slices.Contains(full.tokens[:i], full.tokens[i]) {
				at = i
			}
		}
		if at < 0 {
			continue
		}
		tested++
		id := full.tokens[at]
		params := completionParams(prompt, 30)
		stopIDs := option.WithJSONSet("stop_token_ids", []int32{id})
		got, err := h.client.Completions.New(ctx, params, stopIDs)
		if err != nil {
			t.Fatal(err)
		}
		c := got.Choices[0]
		if c.FinishReason != "stop" || got.Usage.CompletionTokens != int64(at+1) {
			t.Errorf("stop token %d: finish %s after %d tokens, want stop after %d", id, c.FinishReason, got.Usage.CompletionTokens, at+1)
		}
		if reason := c.JSON.ExtraFields["stop_reason"].Raw(); reason != fmt.Sprint(id) {
			t.Errorf("stop token %d: stop_reason %s", id, reason)
		}
		s := h.client.Completions.NewStreaming(ctx, params, stopIDs)
		streamedReason := ""
		for s.Next() {
			if ch := s.Current().Choices; len(ch) > 0 && ch[0].FinishReason != "" {
				streamedReason = ch[0].JSON.ExtraFields["stop_reason"].Raw()
			}
		}
		if err := s.Err(); err != nil || streamedReason != fmt.Sprint(id) {
			t.Errorf("stop token %d streamed: stop_reason %s, %v", id, streamedReason, err)
		}
	}
	if tested < 3 {
		t.Fatalf("only %d usable answers to take stop tokens from", tested)
	}
}

// TestStopTokenID: which stops name their token in stop_reason. An
// end-of-sequence id stops as the model's end (no stop_reason, as vLLM)
// unless ignore_eos, even when stop_token_ids lists it too.
func TestStopTokenID(t *testing.T) {
	const eos, stop, other = 9, 4, 5
	for _, c := range []struct {
		finish    string
		last      int32
		ignoreEOS bool
		want      int32
		ok        bool
	}{
		{engine.FinishStop, stop, false, stop, true},
		{engine.FinishStop, eos, false, 0, false},
		{engine.FinishStop, eos, true, eos, true},
		{engine.FinishStop, other, false, 0, false},
		{engine.FinishLength, stop, false, 0, false},
	} {
		gen := &generation{g: &genRequest{req: engine.Request{StopTokenIDs: []int32{stop, eos}, IgnoreEOS: c.ignoreEOS}}, eos: []int32{eos}}
		if id, ok := gen.stopTokenID(c.finish, []int32{other, c.last}); id != c.want || ok != c.ok {
			t.Errorf("%+v: got %d, %v", c, id, ok)
		}
	}
}

// tokensUntil is how many tokens are generated up to the one that completes
// a stop string first.
func tokensUntil(t *testing.T, tok *tokenizer.Dir, ids []int32, stops ...string) int {
	t.Helper()
	for n := 1; n <= len(ids); n++ {
		text, _ := tok.Decode(ids[:n], true)
		if firstStop(text, stops) >= 0 {
			return n
		}
	}
	t.Fatalf("none of %q appears", stops)
	return 0
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestTokenizeAndModels(t *testing.T) {
	h := serveTiny(t, harnessOptions{})
	_, _, tok := modelDirs(t)
	text := "The fox said: \"It's 12 o'clock\" <|im_end|> and left."
	var got tokenizeResponse
	postJSON(t, h, "/tokenize", `{"model": "`+testModel+`", "prompt": `+mustJSON(text)+`}`, http.StatusOK, &got)
	if want := tok.Encode(text); !slices.Equal(got.Tokens, want) || got.Count != len(want) {
		t.Errorf("tokenize: %v, want %v", got.Tokens, want)
	}
	var back struct{ Prompt string }
	postJSON(t, h, "/detokenize", `{"tokens": `+mustJSON(got.Tokens)+`}`, http.StatusOK, &back)
	if back.Prompt != text {
		t.Errorf("detokenize: %q, want %q", back.Prompt, text)
	}

	models, err := h.client.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != testModel || models.Data[0].OwnedBy != "ddflash" {
		t.Fatalf("models: %+v", models.Data)
	}
	if n := models.Data[0].JSON.ExtraFields["max_model_len"].Raw(); n != fmt.Sprint(testContext) {
		t.Errorf("max_model_len %s, want %d", n, testContext)
	}
}

// TestHealthWhileLoading checks the loading window: /health and the model
// endpoints answer 503 until a model is attached, /metrics answers already.
func TestHealthWhileLoading(t *testing.T) {
	srv := New(Options{ModelName: testModel})
	for _, c := range []struct{ method, path string }{{"GET", "/health"}, {"GET", "/v1/models"}, {"POST", "/v1/completions"}, {"POST", "/tokenize"}} {
		rec := serve(srv, c.method, c.path, `{"prompt": "x"}`, "")
		if rec.status != http.StatusServiceUnavailable || rec.err.Type != unavailable || !strings.Contains(rec.err.Message, "Loading model") {
			t.Errorf("%s %s while loading: %d %+v", c.method, c.path, rec.status, rec.err)
		}
	}
	if rec := serve(srv, "GET", "/metrics", "", ""); rec.status != http.StatusOK || !strings.Contains(rec.body, "vllm:num_requests_running") {
		t.Errorf("metrics while loading: %d %s", rec.status, rec.body)
	}
	h := serveTiny(t, harnessOptions{})
	if rec := serve(h.srv, "GET", "/health", "", ""); rec.status != http.StatusOK {
		t.Errorf("health once loaded: %d %s", rec.status, rec.body)
	}
}

// recorded is a response served in-process.
type recorded struct {
	status int
	body   string
	err    apiError
}

// serve runs one request through the handler without a network.
func serve(h http.Handler, method, path, body, apiKey string) recorded {
	req, _ := http.NewRequest(method, path, strings.NewReader(body))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	return record(h, req)
}

// record serves req in-process.
func record(h http.Handler, req *http.Request) recorded {
	rec := &responseRecorder{header: http.Header{}}
	h.ServeHTTP(rec, req)
	out := recorded{status: rec.status, body: rec.body.String()}
	var e struct{ Error apiError }
	if json.Unmarshal(rec.body.Bytes(), &e) == nil {
		out.err = e.Error
	}
	return out
}

// responseRecorder is a minimal http.ResponseWriter that can flush (SSE).
type responseRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *responseRecorder) Header() http.Header { return r.header }
func (r *responseRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *responseRecorder) WriteHeader(s int) { r.status = s }
func (r *responseRecorder) Flush()            {}

func TestAPIKey(t *testing.T) {
	const key = "s3cret-key"
	h := serveTiny(t, harnessOptions{apiKey: key})
	if _, err := h.client.Models.List(context.Background()); err != nil {
		t.Fatalf("with the key: %v", err)
	}
	for _, wrong := range []string{"", "s3cret-ke", "s3cret-key2", "S3CRET-KEY"} {
		c := newClient(h.url, wrong)
		_, err := c.Completions.New(context.Background(), completionParams("the", 1), option.WithHeaderDel("Authorization"), option.WithHeader("Authorization", "Bearer "+wrong))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Message == "" || apiErr.Code != "invalid_api_key" {
			t.Errorf("key %q: %v", wrong, err)
		}
	}
	// A router's metrics scraper and a load balancer's probe send no key
	// (vLLM checks its key on /v1/* only); every API path needs it.
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/health", http.StatusOK}, {"GET", "/metrics", http.StatusOK},
		{"GET", "/v1/models", http.StatusUnauthorized}, {"POST", "/v1/completions", http.StatusUnauthorized},
		{"POST", "/v1/chat/completions", http.StatusUnauthorized}, {"POST", "/v1/completions/render", http.StatusUnauthorized},
		{"POST", "/v1/chat/completions/render", http.StatusUnauthorized}, {"POST", "/tokenize", http.StatusUnauthorized},
		{"POST", "/detokenize", http.StatusUnauthorized}, {"GET", "/v1/nowhere", http.StatusUnauthorized}, {"GET", "/nowhere", http.StatusUnauthorized},
	} {
		if rec := serve(h.srv, c.method, c.path, "{}", ""); rec.status != c.want {
			t.Errorf("%s %s without a key: %d, want %d", c.method, c.path, rec.status, c.want)
		}
	}
	if rec := serve(h.srv, "GET", "/metrics", "", key); rec.status != http.StatusOK {
		t.Errorf("GET /metrics with the key: %d", rec.status)
	}
}

// TestShutdownMidStream stops the engine under a streaming request: the
// client must get an error event (the status line went out long before),
// and /health must say 503 from then on.
func TestShutdownMidStream(t *testing.T) {
	h := serveTiny(t, harnessOptions{sched: engine.SchedulerOptions{MaxRunning: 1}})
	p := completionParams("the fox", testContext-8)
	s := h.client.Completions.NewStreaming(context.Background(), p, option.WithJSONSet("ignore_eos", true))
	if !s.Next() {
		t.Fatalf("no first chunk: %v", s.Err())
	}
	h.stop()
	for s.Next() {
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("stream after shutdown: %v, want the engine's shutdown error", err)
	}
	if rec := serve(h.srv, "GET", "/health", "", ""); rec.status != http.StatusServiceUnavailable || !strings.Contains(rec.err.Message, "stopped") {
		t.Errorf("health after shutdown: %d %s", rec.status, rec.body)
	}
}
