package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
	"ddflash/tokenizer"
)

// The tests serve a random tiny target with a matching random drafter. A
// random drafter is rarely right, so speculation accepts little, but every
// path (drafting, tree verify, rollback) runs.
const (
	testModel   = "tiny-test"
	testContext = 256 // the tiny preset's max positions
	testSeed    = 5
)

var fixture struct {
	once            sync.Once
	target, drafter string
	tok             *tokenizer.Dir
	err             error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixture.target != "" {
		os.RemoveAll(filepath.Dir(fixture.target))
	}
	os.Exit(code)
}

// modelDirs writes the tiny target and drafter once per test binary.
func modelDirs(t testing.TB) (target, drafter string, tok *tokenizer.Dir) {
	t.Helper()
	fixture.once.Do(func() {
		root, err := os.MkdirTemp("", "ddflash-server-test-")
		if err != nil {
			fixture.err = err
			return
		}
		fixture.target, fixture.drafter = filepath.Join(root, "target"), filepath.Join(root, "drafter")
		p, err := testmodel.PresetByName("tiny")
		if err == nil {
			err = testmodel.Write(fixture.target, testmodel.Options{Preset: p, Seed: testSeed})
		}
		if err == nil {
			err = testmodel.WriteDrafter(fixture.drafter, testmodel.DraftOptions{Target: p, Seed: testSeed})
		}
		if err == nil {
			fixture.tok, err = tokenizer.LoadDir(fixture.target)
		}
		fixture.err = err
	})
	if fixture.err != nil {
		t.Fatal(fixture.err)
	}
	return fixture.target, fixture.drafter, fixture.tok
}

// newEngine loads the tiny target for seqs requests in flight, with the
// drafter attached unless spec is autoregressive.
func newEngine(t testing.TB, spec engine.SpecOptions, seqs int) *engine.Engine {
	t.Helper()
	target, _, _ := modelDirs(t)
	return loadEngine(t, target, spec, seqs)
}

// loadEngine loads the target in dir (with the tiny drafter for spec modes).
func loadEngine(t testing.TB, target string, spec engine.SpecOptions, seqs int) *engine.Engine {
	return loadEngineWith(t, target, spec, engine.Options{MaxSeqs: seqs})
}

// loadEngineWith is loadEngine with more of the engine's options; the
// page size and verify room are set here, and the context unless opts
// gives one.
func loadEngineWith(t testing.TB, target string, spec engine.SpecOptions, opts engine.Options) *engine.Engine {
	t.Helper()
	_, drafter, _ := modelDirs(t)
	b := cpu.New(2)
	if opts.Context == 0 {
		opts.Context = testContext
	}
	opts.PageSize = 8
	var err error
	if spec.Mode != engine.SpecAuto {
		if opts.VerifyTokens, err = dflash.VerifyTokens(drafter, spec); err != nil {
			t.Fatal(err)
		}
	}
	e, err := engine.Load(b, target, opts)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Mode != engine.SpecAuto {
		if err := dflash.Attach(e, drafter, spec); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

var specModes = []engine.SpecOptions{
	{Mode: engine.SpecAuto},
	{Mode: engine.SpecLinear, Rollback: mamba.Replay},
	{Mode: engine.SpecTree, Budget: 4, Rollback: mamba.Snapshot},
	{Mode: engine.SpecTree, Budget: 12, Rollback: mamba.Replay},
}

func specName(s engine.SpecOptions) string {
	if s.Mode == engine.SpecTree {
		return fmt.Sprintf("ddtree-B%d", s.Budget)
	}
	return s.Mode.String()
}

// harness is a server on loopback with its model and an official client.
type harness struct {
	srv    *Server
	model  *Model
	url    string
	client openai.Client
	stop   func() // stops the engine (the HTTP server stays up)
}

type harnessOptions struct {
	spec   engine.SpecOptions
	sched  engine.SchedulerOptions
	apiKey string
	tok    *tokenizer.Dir // default: the tiny model's
	target string         // a model sharing the tiny model's tokenizer; default: the tiny model
	server Options        // the server's options besides the model name and API key
	engine func(*engine.Engine)
	setup  func(*Model) // adjusts the model before it is served
	// prefixSlots turns the engine's prefix cache on with this many checkpoints.
	prefixSlots int
	context     int // the engine's context; default testContext
}

// serveTiny starts a server for the tiny model and waits until /health says 200.
func serveTiny(t testing.TB, o harnessOptions) *harness {
	t.Helper()
	target, _, tok := modelDirs(t)
	if o.tok != nil {
		tok = o.tok
	}
	if o.target != "" {
		target = o.target
	}
	e := loadEngineWith(t, target, o.spec, engine.Options{MaxSeqs: max(o.sched.MaxRunning, 1), PrefixSlots: o.prefixSlots, Context: o.context})
	if o.engine != nil {
		o.engine(e)
	}
	m := &Model{Engine: e, Scheduler: engine.NewScheduler(e, o.sched), Tokenizer: tok}
	if o.setup != nil {
		o.setup(m)
	}
	opts := o.server
	opts.ModelName, opts.APIKey = testModel, o.apiKey
	srv := New(opts)
	ts := httptest.NewUnstartedServer(srv)
	ts.Config = srv.HTTPServer()
	ts.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx, m); close(done) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(func() {
		ts.Close()
		stop()
	})
	waitHealthy(t, ts.URL)
	return &harness{srv: srv, model: m, url: ts.URL, client: newClient(ts.URL, o.apiKey), stop: stop}
}

func newClient(url, apiKey string) openai.Client {
	if apiKey == "" {
		apiKey = "unused"
	}
	return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey(apiKey), option.WithMaxRetries(0))
}

func waitHealthy(t testing.TB, url string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not become healthy: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitIdle waits until the scheduler reports every KV page and state slot free.
func waitIdle(t testing.TB, s *engine.Scheduler) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.State()
		if st.Running == 0 && st.Queued == 0 && st.FreePages == st.TotalPages && st.FreeSlots == st.TotalSlots {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resources not returned: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reference runs requests one at a time on its own autoregressive engine:
// greedy speculative decoding is lossless, so every mode must match it.
var reference struct {
	once sync.Once
	e    *engine.Engine
}

func referenceRun(t testing.TB, r engine.Request) *engine.Result {
	t.Helper()
	reference.once.Do(func() { reference.e = newEngine(t, engine.SpecOptions{}, 1) })
	res, err := reference.e.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// words are what test prompts are made of: the tiny tokenizer's merges
// come from text like this.
var words = strings.Fields("the quick brown fox jumps over lazy dog and sun morning farmer field sky rain evening model tokens draft target apples river trees town")

func randomPrompt(rng *rand.Rand, minWords, maxWords int) string {
	n := minWords + rng.IntN(maxWords-minWords+1)
	ws := make([]string, n)
	for i := range ws {
		ws[i] = words[rng.IntN(len(words))]
	}
	return strings.Join(ws, " ")
}

// answer is the reference answer to a greedy completion.
type answer struct {
	text   string
	tokens []int32
	finish string
}

func referenceAnswer(t testing.TB, prompt []int32, maxTokens int) answer {
	t.Helper()
	_, _, tok := modelDirs(t)
	res := referenceRun(t, engine.Request{Prompt: prompt, MaxTokens: maxTokens})
	text, err := tok.Decode(res.Tokens, true)
	if err != nil {
		t.Fatal(err)
	}
	return answer{text: text, tokens: res.Tokens, finish: res.FinishReason}
}
