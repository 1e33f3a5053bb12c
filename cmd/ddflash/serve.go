package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"ddflash/engine"
	"ddflash/engine/gpu"
	"ddflash/engine/planner"
	"ddflash/kvevents"
	"ddflash/server"
)

func init() {
	register("serve", "serve an OpenAI-compatible API (completions, chat, streaming, metrics)", runServe)
}

func runServe(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, args, nil)
}

// serveConfig is serve's flags: the model's, the memory plan's (as plan
// takes them) and the server's own.
type serveConfig struct {
	model                        modelFlags
	memory                       planFlags // the cache and memory flags only
	addr, apiKey, name, memSize  string
	maxRunning, maxQueue, chunk  int
	prefixInterval               int
	maxBody                      int64
	timeouts                     server.Timeouts
	allowedHosts, allowedOrigins listFlag
	parsers                      server.Parsers
	generationConfig             string
	kvEventsEndpoint, kvTopic    string
}

// listFlag is a comma-separated flag value.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*l = append(*l, item)
		}
	}
	return nil
}

func (c *serveConfig) register(fs *flag.FlagSet) {
	c.model.register(fs)
	c.memory.registerMemory(fs)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8000", "listen address (loopback by default; elsewhere, set --api-key)")
	fs.StringVar(&c.apiKey, "api-key", os.Getenv("DDFLASH_API_KEY"), "require \"Authorization: Bearer KEY\" on every endpoint but /health and /metrics (default: $DDFLASH_API_KEY)")
	fs.StringVar(&c.name, "served-model-name", "", "model name in the API (default: the --model directory's name)")
	fs.IntVar(&c.maxRunning, "max-running-requests", 16, "requests decoding at once; the memory plan may lower it")
	fs.IntVar(&c.maxQueue, "max-queue", 0, "requests waiting for admission before 429 answers (default: 4 × running)")
	fs.IntVar(&c.chunk, "chunked-prefill-size", 0, "prompt tokens prefilled per step over all requests (default: the engine's prefill chunk, 512)")
	fs.IntVar(&c.prefixInterval, "prefix-checkpoint-interval", 0, "with --prefix-cache-slots, also checkpoint prompts every N KV pages (rounded up to 64-token GDN chunks), not only at their end")
	fs.Int64Var(&c.maxBody, "max-body-bytes", server.DefaultMaxBodyBytes, "largest request body")
	t, d := &c.timeouts, server.DefaultTimeouts
	fs.DurationVar(&t.Read, "read-timeout", d.Read, "time to read a whole request, body included (0: none)")
	fs.DurationVar(&t.Write, "write-timeout", d.Write, "longest non-streaming response, generation included (then 504); a stream has no limit, but each write must complete within it (0: none)")
	fs.DurationVar(&t.Idle, "idle-timeout", d.Idle, "how long a kept-alive connection may wait for its next request (0: none)")
	t.ReadHeader = d.ReadHeader
	fs.Var(&c.allowedHosts, "allowed-hosts", "without --api-key, Host names accepted besides the listen address and localhost, comma-separated (e.g. a reverse proxy's public name; * for any)")
	fs.Var(&c.allowedOrigins, "allowed-origins", "web origins that may call the server from a browser (CORS), comma-separated, e.g. https://ui.example.com (* for any)")
	fs.StringVar(&c.memSize, "gpu-mem", "", "memory to plan the caches in, e.g. 64GiB (default: this host's memory)")
	fs.StringVar(&c.parsers.Reasoning, "reasoning-parser", "", "split <think> blocks into reasoning_content: qwen3 or none (default: qwen3 when the chat template writes <think>)")
	fs.StringVar(&c.parsers.ToolCalls, "tool-call-parser", "", "parse tool calls into tool_calls: qwen3_coder or none (default: qwen3_coder when the chat template writes <tool_call>)")
	fs.StringVar(&c.generationConfig, "generation-config", "auto", "sampling defaults for requests that leave them out: auto (the model's generation_config.json) or none (OpenAI's)")
	fs.StringVar(&c.kvEventsEndpoint, "kv-events-endpoint", "", "publish the prefix cache's blocks as vLLM KV events on this ZMQ PUB endpoint, e.g. tcp://*:5557, for a prefix-aware router such as llm-d's (needs --prefix-cache-slots)")
	fs.StringVar(&c.kvTopic, "kv-events-topic", "", "the KV events' topic (default: kv@ADDR@SERVED-MODEL-NAME, as llm-d expects)")
}

// serve runs `ddflash serve` until ctx ends. ready, if set, is told the
// address once the server listens (before the model is loaded).
func serve(ctx context.Context, args []string, ready func(addr string)) error {
	return serveTo(ctx, args, ready, os.Stderr)
}

// serveTo is serve with its start-up plan and log going to stderr.
func serveTo(ctx context.Context, args []string, ready func(addr string), stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var c serveConfig
	c.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: flags only", fs.Arg(0))
	}
	if err := c.parsers.Check(); err != nil {
		return err
	}
	if c.generationConfig != "auto" && c.generationConfig != "none" {
		return fmt.Errorf("--generation-config %q: want auto or none", c.generationConfig)
	}
	if c.name == "" {
		c.name = filepath.Base(filepath.Clean(c.model.model))
		if c.model.model == "" {
			c.name = "ddflash-default"
		}
	}
	if err := c.model.resolveDefault(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	sizing, _, err := c.plan(fs, log, stderr)
	if err != nil {
		return err
	}

	var kvEvents *kvevents.Publisher
	opts := server.Options{ModelName: c.name, APIKey: c.apiKey, MaxBodyBytes: c.maxBody, Logger: log,
		Timeouts: c.timeouts, Addr: c.addr, AllowedHosts: c.allowedHosts, AllowedOrigins: c.allowedOrigins}
	if c.kvEventsEndpoint != "" {
		if c.kvTopic == "" {
			c.kvTopic = "kv@" + c.addr + "@" + c.name
		}
		if kvEvents, err = kvevents.Listen(c.kvEventsEndpoint, c.kvTopic, log); err != nil {
			return err
		}
		defer kvEvents.Close()
		opts.KVEvents = kvEvents
		log.Info("publishing KV events", "endpoint", c.kvEventsEndpoint, "topic", c.kvTopic)
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); c.apiKey == "" && !net.ParseIP(host).IsLoopback() {
		log.Warn("listening beyond loopback without --api-key: anyone who can reach this address can use the model", "addr", ln.Addr())
	}
	srv := server.New(opts)
	httpSrv := srv.HTTPServer()
	served := make(chan error, 1)
	go func() { served <- httpSrv.Serve(ln) }()
	log.Info("listening; /health answers 503 until the model is loaded", "addr", "http://"+ln.Addr().String())
	if ready != nil {
		ready(ln.Addr().String())
	}

	model, err := c.load(sizing, log)
	if err != nil {
		_ = httpSrv.Close()
		return err
	}
	if kvEvents != nil {
		if !model.Engine.PrefixCaching() {
			log.Warn("--kv-events-endpoint without the prefix cache (--prefix-cache-slots): no block will be published")
		}
		model.Engine.SetCacheEvents(kvEvents.Publish)
	}
	runCtx, stopEngine := context.WithCancel(context.Background())
	engineDone := make(chan struct{})
	go func() { srv.Run(runCtx, model); close(engineDone) }()
	sched := model.Scheduler.Options()
	log.Info("serving", "model", c.name, "spec", model.Engine.Spec.Name(), "max_running_requests", sched.MaxRunning,
		"max_queue", sched.MaxQueue, "context", model.Engine.Context)

	select {
	case <-ctx.Done():
	case err = <-served:
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = httpSrv.Shutdown(shutdownCtx) // lets running requests finish, for a while
	stopEngine()
	<-engineDone
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// plan computes the memory plan from the same flags and with the same
// function as `ddflash plan`, in the host's memory on the CPU backend (or
// --gpu-mem), checks that it fits, logs it and returns the engine sizing
// it plans: KV tokens, state slots (the requests that may run at once) and
// cache dtypes.
func (c *serveConfig) plan(fs *flag.FlagSet, log *slog.Logger, stderr io.Writer) (engine.Options, *planner.Plan, error) {
	s, p, err := planEngine(&c.model, c.memory, fs, c.maxRunning, c.device)
	if err != nil {
		return engine.Options{}, nil, err
	}
	s.gpuMem = c.memSize
	writePlan(stderr, s, p)
	if err := p.Fits(); err != nil {
		return engine.Options{}, nil, err
	}
	opts, err := p.EngineOptions()
	if err != nil {
		return engine.Options{}, nil, err
	}
	opts.PrefixInterval = c.prefixInterval
	if p.MaxRunning.Effective < c.maxRunning {
		log.Warn("the memory plan lowers --max-running-requests", "requested", c.maxRunning, "effective", p.MaxRunning.Effective)
	}
	log.Info("memory plan", "kv_tokens", p.KVTokens, "state_slots", p.StateSlots, "max_running_requests", p.MaxRunning.Effective,
		"kv_dtype", p.Settings.KVDtype.Name, "conv_dtype", p.Settings.ConvDtype.Name, "ssm_dtype", p.Settings.SSMDtype.Name,
		"context", p.Settings.Context, "flags", serveFlags(s, p))
	return opts, p, nil
}

// planEngine computes the memory plan for the model flags, maxRunning
// requests and the cache and memory flags in f, with plan's resolver and
// planner.Compute, in the memory device gives; fs tells which flags were set.
func planEngine(m *modelFlags, f planFlags, fs *flag.FlagSet, maxRunning int, device func() (gpu.Device, error)) (*planSetup, *planner.Plan, error) {
	spec, err := m.specOptions()
	if err != nil {
		return nil, nil, err
	}
	f.model, f.draft, f.beside, f.spec, f.rollback, f.compat = m.model, m.draft, m.besideDrafts, m.spec, m.rollback, "ddflash"
	f.tp, f.maxRunning, f.context, f.mtpSteps, f.withMTP = m.tp, maxRunning, m.context, m.mtpSteps, m.withMTP
	if m.spec == "adaptive" {
		f.spec = "ddtree" // planned for its largest tree
	}
	if spec.Mode == engine.SpecTree {
		f.budget = spec.Budget
	}
	s, err := f.resolveOn(fs, device)
	if err != nil {
		return nil, nil, err
	}
	if maxPos := s.models.Target.Config.MaxPositions; s.knobs.Context <= 0 || s.knobs.Context > maxPos {
		s.knobs.Context = maxPos
	}
	p, err := planner.Compute(s.models, s.knobs)
	return s, p, err
}

// device is the memory the caches are planned in (see planDevice).
func (c *serveConfig) device() (gpu.Device, error) { return planDevice(c.memSize, c.model.device) }

// planDevice is the memory a plan for serve or bench takes: gpuMem, rank
// 0's GPU on the CUDA backend, or this host's memory (total, and available
// now) on the CPU.
func planDevice(gpuMem, device string) (gpu.Device, error) {
	if gpuMem != "" {
		total, err := gpu.ParseSize(gpuMem)
		if err != nil {
			return gpu.Device{}, fmt.Errorf("--gpu-mem: %w", err)
		}
		return gpu.Device{Name: "--gpu-mem", Total: total}, nil
	}
	if device != "cpu" {
		index := 0 // rank 0's GPU: cuda means GPUs 0..tp-1
		if n, ok := strings.CutPrefix(device, "cuda:"); ok {
			var err error
			if index, err = strconv.Atoi(n); err != nil {
				return gpu.Device{}, fmt.Errorf("--device %s: want cpu, cuda or cuda:N", device)
			}
		}
		d, err := gpu.Local(index)
		if err != nil {
			return gpu.Device{}, fmt.Errorf("cannot read GPU %d's memory (%w): give --gpu-mem SIZE", index, err)
		}
		return d, nil
	}
	total, avail, err := hostMemory()
	if err != nil {
		return gpu.Device{}, fmt.Errorf("cannot read this host's memory (%w): give --gpu-mem SIZE", err)
	}
	return gpu.Device{Name: "host memory", Total: total, Free: avail}, nil
}

// hostMemory reads MemTotal and MemAvailable from /proc/meminfo.
func hostMemory() (total, avail int64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text()) // "MemTotal:  16318480 kB"
		if len(fields) != 3 || fields[2] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = kb << 10
		case "MemAvailable:":
			avail = kb << 10
		}
	}
	if total == 0 || avail == 0 || avail > total {
		return 0, 0, errors.New("/proc/meminfo lacks MemTotal or MemAvailable")
	}
	return total, avail, sc.Err()
}

// load builds the engine, its scheduler and the tokenizer.
func (c *serveConfig) load(sizing engine.Options, log *slog.Logger) (*server.Model, error) {
	e, err := c.model.load(sizing)
	if err != nil {
		return nil, err
	}
	if e.Tokenizer == nil {
		return nil, fmt.Errorf("serving text needs the model's tokenizer: %s has no tokenizer.json", c.model.model)
	}
	defaults := c.samplingDefaults(e.Generation, log)
	sched := engine.NewScheduler(e, engine.SchedulerOptions{MaxRunning: sizing.MaxSeqs, MaxQueue: c.maxQueue, StepPrefill: c.chunk})
	return &server.Model{Engine: e, Scheduler: sched, Tokenizer: e.Tokenizer, Defaults: defaults, Parsers: c.parsers}, nil
}

// samplingDefaults returns the sampling defaults of the model's
// generation_config.json as the engine read it (gen, nil when the model
// ships none) under --generation-config auto, and logs which are in force.
func (c *serveConfig) samplingDefaults(gen *engine.GenerationConfig, log *slog.Logger) engine.GenerationConfig {
	var g engine.GenerationConfig
	found := c.generationConfig == "auto" && gen != nil
	if found {
		g = *gen
	}
	g.EOS = nil // the engine's stop set; these are the sampling defaults only
	var inForce []any
	add := func(name string, v *float64) {
		if v != nil {
			inForce = append(inForce, name, *v)
		}
	}
	add("temperature", g.Temperature)
	add("top_p", g.TopP)
	if g.TopK != nil {
		inForce = append(inForce, "top_k", *g.TopK)
	}
	add("min_p", g.MinP)
	add("repetition_penalty", g.RepetitionPenalty)
	switch {
	case len(inForce) > 0:
		log.Info("sampling defaults from generation_config.json for requests that leave them out (--generation-config none: OpenAI's)", inForce...)
	case found:
		log.Info("generation_config.json sets no sampling defaults: requests that leave them out get OpenAI's (temperature 1, top_p 1)")
	default:
		log.Info("sampling defaults: OpenAI's (temperature 1, top_p 1)", "generation_config", c.generationConfig)
	}
	return g
}
