// Command llamacompare measures ddflash's CPU backend against llama.cpp on
// the same bf16 weights (scripts/llamacpp-compare.sh runs it): for each test
// model preset it writes the checkpoint, converts it to GGUF, checks that
// both engines decode the same greedy tokens, then times prefill and decode
// with the engines' runs interleaved, and prints tok/s and ratios as a
// Markdown table. llama.cpp (node-llama-cpp's prebuilt libllama) runs
// through its C API (tools/llamacpp/bench.c), the baseline of the ratios,
// and through node-llama-cpp's token loop (tools/llamacpp/worker.js). The
// C driver also measures the machine's read bandwidth, and the decode rows
// are repeated as GB/s of weights streamed and a share of it.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"ddflash/engine"
	"ddflash/engine/gguf"
	"ddflash/engine/safetensors"
	"ddflash/engine/testmodel"
	"ddflash/kernels/cpu"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "llamacompare:", err)
		os.Exit(1)
	}
}

type options struct {
	presets, threads, prefill []string
	decode, agree, reps       int
	probeMiB                  int
	workdir                   string
	// probe measures the read bandwidth at a thread count (cbench.bandwidth).
	probe func(threads int) (float64, error)
}

func run() error {
	var presets, threads, prefill, worker, cbench string
	var o options
	flag.StringVar(&presets, "presets", "small,mid", "test model presets, comma-separated")
	flag.StringVar(&threads, "threads", "1,2", "thread counts, comma-separated")
	flag.StringVar(&prefill, "prefill", "512,4096", "prompt lengths to time prefill on")
	flag.IntVar(&o.decode, "decode", 128, "decode steps to time (after a 16-token prompt)")
	flag.IntVar(&o.agree, "agree", 32, "greedy tokens that must agree (after a 64-token prompt)")
	flag.IntVar(&o.reps, "reps", 2, "interleaved repetitions of each measurement")
	flag.IntVar(&o.probeMiB, "probe-mib", 1024, "MiB the read-bandwidth probe sums")
	flag.StringVar(&cbench, "cbench", "tools/llamacpp/build/bench", "the llama.cpp C API driver (built by scripts/llamacpp-compare.sh)")
	flag.StringVar(&worker, "worker", "tools/llamacpp/worker.js", "the node-llama-cpp worker script; empty to leave the node path out")
	flag.StringVar(&o.workdir, "workdir", filepath.Join(os.TempDir(), "ddflash-llamacompare"), "where checkpoints and GGUF files are written (reused when present)")
	flag.Parse()
	o.presets, o.threads, o.prefill = split(presets), split(threads), split(prefill)
	c, err := startCBench(cbench)
	if err != nil {
		return err
	}
	defer c.close()
	o.probe = func(threads int) (float64, error) {
		gbs, _, err := c.bandwidth(o.probeMiB, threads)
		return gbs, err
	}
	llamas := []llama{c}
	if worker != "" {
		w, err := startWorker(worker)
		if err != nil {
			return err
		}
		defer w.close()
		llamas = append(llamas, w)
	}
	fmt.Printf("load average at start: %s", loadavg())
	// The probe runs on one thread too, whatever the thread counts compared:
	// how far one core's stream is from the machine's says how much a
	// second thread can add.
	probed := map[int]bool{}
	for _, ts := range append([]string{"1"}, o.threads...) {
		n, err := strconv.Atoi(ts)
		if err != nil {
			return fmt.Errorf("-threads %q: %w", ts, err)
		}
		if probed[n] {
			continue
		}
		probed[n] = true
		gbs, streams, err := c.bandwidth(o.probeMiB, n)
		if err != nil {
			return err
		}
		fmt.Printf("read bandwidth, %d thread(s) summing %d MiB on huge pages (best of 8 passes at 1, 2, 4 and 8 streams a thread: %d): %.1f GB/s\n", n, o.probeMiB, streams, gbs)
	}
	fmt.Println()
	header := "| preset | threads | workload | ddflash tok/s | llama.cpp C API tok/s |"
	rule := "|---|---|---|---|---|"
	if len(llamas) > 1 {
		header += " llama.cpp node tok/s |"
		rule += "---|"
	}
	fmt.Println(header + " ddflash / C API |")
	fmt.Println(rule + "---|")
	var failed []string
	var streams []stream
	for _, name := range o.presets {
		s, err := comparePreset(llamas, name, o)
		streams = append(streams, s...)
		if err != nil {
			if !errors.Is(err, errDisagree) {
				return err
			}
			failed = append(failed, name+": "+err.Error())
		}
	}
	fmt.Println()
	// The share is of the probe run beside the decode timings (the best of
	// one probe before each repetition): a virtual machine's bandwidth can
	// move by half within minutes (35 to 65 GB/s on a 2-vCPU VM), so a probe
	// taken once at the start can be the ceiling of another machine.
	fmt.Println("| preset | threads | weights / token | probe beside, GB/s | ddflash decode GB/s | share of probe | llama.cpp C API GB/s | share of probe |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, s := range streams {
		fmt.Printf("| %s | %d | %.0f MB | %.1f | %.1f | %.0f %% | %.1f | %.0f %% |\n", s.preset, s.threads, s.bytes/1e6,
			s.probe, s.ddflash, 100*s.ddflash/s.probe, s.llama, 100*s.llama/s.probe)
	}
	fmt.Printf("load average at end: %s", loadavg())
	if failed != nil {
		return fmt.Errorf("greedy outputs differ: %s", strings.Join(failed, "; "))
	}
	return nil
}

// stream is one decode measurement as bandwidth: the weights a decode step
// reads (decodeBytes) times tokens per second, in GB/s. Caches and recurrent state are left
// out, so this is a lower bound on the bytes moved.
type stream struct {
	preset         string
	threads        int
	bytes          float64
	ddflash, llama float64
	probe          float64 // the read bandwidth beside the decode runs, GB/s
}

func split(s string) []string { return strings.Split(s, ",") }

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown\n"
	}
	return string(b)
}

var errDisagree = errors.New("greedy tokens differ")

// prepare writes the preset's bf16 checkpoint and its GGUF conversion.
func prepare(name, workdir string) (dir, ggufPath string, err error) {
	p, err := testmodel.PresetByName(name)
	if err != nil {
		return "", "", err
	}
	dir, ggufPath = filepath.Join(workdir, name), filepath.Join(workdir, name+".gguf")
	if _, err := os.Stat(ggufPath); err == nil {
		return dir, ggufPath, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: "bf16"}); err != nil {
		return "", "", err
	}
	return dir, ggufPath, gguf.ConvertQwen35(dir, ggufPath)
}

// decodeBytes is the bytes of weights one decode step reads (see stream):
// the whole checkpoint but an untied embedding table, of which it reads a
// row (a tied one is the LM head, read whole).
func decodeBytes(dir string) (float64, error) {
	c, err := safetensors.Open(dir)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	names := c.Names()
	untied := slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, "lm_head.weight") })
	var total float64
	for _, name := range names {
		if t, _ := c.Tensor(name); !untied || !strings.HasSuffix(name, "embed_tokens.weight") {
			total += float64(len(t.Data))
		}
	}
	return total, nil
}

func comparePreset(llamas []llama, name string, o options) ([]stream, error) {
	dir, ggufPath, err := prepare(name, o.workdir)
	if err != nil {
		return nil, err
	}
	bytes, err := decodeBytes(dir)
	if err != nil {
		return nil, err
	}
	longest := 16 + o.decode
	for _, s := range o.prefill {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("-prefill %q: %w", s, err)
		}
		longest = max(longest, n+1)
	}
	ctxLen := longest + 64
	var streams []stream
	for _, ts := range o.threads {
		threads, _ := strconv.Atoi(ts)
		e, err := engine.Load(cpu.New(threads), dir, engine.Options{Context: ctxLen})
		if err != nil {
			return streams, err
		}
		for _, l := range llamas {
			if err := l.load(ggufPath, threads, ctxLen, 512); err != nil {
				return streams, err
			}
		}
		rng := rand.New(rand.NewPCG(uint64(threads), 7))
		tokens := func(n int) []int32 {
			t := make([]int32, n)
			for i := range t {
				t[i] = int32(rng.IntN(e.ValidVocab))
			}
			return t
		}
		agreePrompt := tokens(64)
		for _, l := range llamas {
			if err := checkAgreement(e, l, agreePrompt, o.agree); err != nil {
				return streams, err
			}
		}
		for _, s := range o.prefill {
			n, _ := strconv.Atoi(s)
			prompt := tokens(n)
			runs := []func() (float64, error){func() (float64, error) { return ddflashRun(e, prompt, 1, true) }}
			for _, l := range llamas {
				runs = append(runs, func() (float64, error) { return l.prefill(prompt) })
			}
			ms, err := interleave(o.reps, runs, nil)
			if err != nil {
				return streams, err
			}
			row(name, threads, fmt.Sprintf("prefill %d", n), float64(n*o.reps), ms)
		}
		prompt := tokens(16)
		runs := []func() (float64, error){func() (float64, error) { return ddflashRun(e, prompt, o.decode+1, false) }}
		for _, l := range llamas {
			runs = append(runs, func() (float64, error) {
				g, err := l.generate(prompt, o.decode+1)
				return g.DecodeMs, err
			})
		}
		probe := 0.0
		ms, err := interleave(o.reps, runs, func() error {
			gbs, err := o.probe(threads)
			probe = max(probe, gbs)
			return err
		})
		if err != nil {
			return streams, err
		}
		tps := row(name, threads, fmt.Sprintf("decode %d", o.decode), float64(o.decode*o.reps), ms)
		streams = append(streams, stream{preset: name, threads: threads, bytes: bytes,
			ddflash: tps[0] * bytes / 1e9, llama: tps[1] * bytes / 1e9, probe: probe})
	}
	return streams, nil
}

// row prints the tok/s of each engine (ddflash first, then the C API, then
// node) and ddflash's ratio to the C API, and returns the tok/s.
func row(preset string, threads int, workload string, tokens float64, ms []float64) []float64 {
	tps := make([]float64, len(ms))
	line := fmt.Sprintf("| %s | %d | %s |", preset, threads, workload)
	for i, m := range ms {
		tps[i] = tokens / (m / 1000)
		line += fmt.Sprintf(" %.1f |", tps[i])
	}
	fmt.Printf("%s %.2f× |\n", line, tps[0]/tps[1])
	return tps
}

// interleave runs each function reps times, rotating which goes first, and
// returns each one's total milliseconds; before, when not nil, runs before
// each repetition (untimed).
func interleave(reps int, runs []func() (float64, error), before func() error) ([]float64, error) {
	total := make([]float64, len(runs))
	for i := range reps {
		if before != nil {
			if err := before(); err != nil {
				return nil, err
			}
		}
		for j := range runs {
			k := (i + j) % len(runs)
			ms, err := runs[k]()
			if err != nil {
				return nil, err
			}
			total[k] += ms
		}
	}
	return total, nil
}

// ddflashRun generates n greedy tokens and returns the prefill or the decode milliseconds.
func ddflashRun(e *engine.Engine, prompt []int32, n int, prefill bool) (float64, error) {
	res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true})
	if err != nil {
		return 0, err
	}
	if prefill {
		return res.Stats.PrefillMs, nil
	}
	return res.Stats.DecodeMs, nil
}

// llama is one way of running llama.cpp: load a GGUF file, time a prefill,
// and generate n greedy tokens after a prompt, end-of-generation tokens
// included (as ddflash with IgnoreEOS); prefill time runs to the first
// token, decode time from there to the last (n-1 decode steps).
type llama interface {
	name() string
	load(gguf string, threads, context, batch int) error
	prefill(prompt []int32) (ms float64, err error)
	generate(prompt []int32, n int) (generated, error)
}

type generated struct {
	Tokens    []int32 `json:"tokens"`
	PrefillMs float64 `json:"prefillMs"`
	DecodeMs  float64 `json:"decodeMs"`
}

// nearTie is the largest gap, in nats, between ddflash's top two tokens at
// which llama.cpp may pick the second: llama.cpp rounds activations to
// bfloat16 before BF16 matmuls, which moves logits by a few hundredths.
const nearTie = 0.05

// checkAgreement decodes n greedy tokens with both engines. They must agree
// up to the end or up to a step where ddflash's two best tokens are within
// nearTie and llama.cpp took the other one (then the texts diverge legitimately).
func checkAgreement(e *engine.Engine, l llama, prompt []int32, n int) error {
	res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true,
		Sampling: engine.SamplingParams{Logprobs: 2}})
	if err != nil {
		return err
	}
	g, err := l.generate(prompt, n)
	if err != nil {
		return err
	}
	same := 0
	for same < min(len(res.Tokens), len(g.Tokens)) && res.Tokens[same] == g.Tokens[same] {
		same++
	}
	if same == n {
		fmt.Fprintf(os.Stderr, "greedy agreement with llama.cpp %s: %d tokens identical\n", l.name(), n)
		return nil
	}
	if same < len(g.Tokens) {
		step := res.Logprobs[same]
		for _, alt := range step.Top {
			if alt.ID == g.Tokens[same] && step.Logprob-alt.Logprob <= nearTie {
				fmt.Fprintf(os.Stderr, "greedy agreement with llama.cpp %s: %d tokens identical, then a near tie (ddflash's top two %.3f nats apart)\n",
					l.name(), same, step.Logprob-alt.Logprob)
				return nil
			}
		}
	}
	return fmt.Errorf("%w at step %d: ddflash %v, llama.cpp %s %v", errDisagree, same, res.Tokens, l.name(), g.Tokens)
}

// process is a child process answering one line per command line.
type process struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startProcess(name string, args ...string) (*process, error) {
	cmd := exec.Command(name, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", strings.Join(cmd.Args, " "), err)
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	return &process{cmd: cmd, stdin: stdin, out: sc}, nil
}

// call writes one command line and returns the answer line.
func (p *process) call(line []byte) (string, error) {
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		return "", fmt.Errorf("%s: %w", p.cmd.Path, err)
	}
	if !p.out.Scan() {
		return "", fmt.Errorf("%s exited (%v)", p.cmd.Path, p.out.Err())
	}
	return p.out.Text(), nil
}

func (p *process) close() {
	p.stdin.Close() // both drivers exit at the end of their input
	p.cmd.Wait()
}

// worker runs llama.cpp through node-llama-cpp (tools/llamacpp/worker.js),
// one JSON object per line each way.
type worker struct{ *process }

func startWorker(script string) (*worker, error) {
	p, err := startProcess("node", script)
	return &worker{p}, err
}

func (w *worker) name() string { return "node" }

func (w *worker) request(msg map[string]any, answer any) error {
	line, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	text, err := w.call(line)
	if err != nil {
		return fmt.Errorf("llama.cpp worker: %w", err)
	}
	var e struct{ Error string }
	if err := json.Unmarshal([]byte(text), &e); err != nil {
		return fmt.Errorf("llama.cpp worker answer %q: %w", text, err)
	}
	if e.Error != "" {
		return fmt.Errorf("llama.cpp worker: %s", e.Error)
	}
	return json.Unmarshal([]byte(text), answer)
}

func (w *worker) load(gguf string, threads, context, batch int) error {
	var loaded map[string]any
	return w.request(map[string]any{"cmd": "load", "model": gguf, "threads": threads, "context": context, "batch": batch}, &loaded)
}

func (w *worker) prefill(prompt []int32) (float64, error) {
	var r struct{ Ms float64 }
	err := w.request(map[string]any{"cmd": "prefill", "tokens": prompt}, &r)
	return r.Ms, err
}

func (w *worker) generate(prompt []int32, n int) (generated, error) {
	var g generated
	err := w.request(map[string]any{"cmd": "generate", "tokens": prompt, "n": n}, &g)
	return g, err
}

// cbench runs llama.cpp through its C API (tools/llamacpp/bench.c), one
// line of words each way.
type cbench struct{ *process }

func startCBench(path string) (*cbench, error) {
	p, err := startProcess(path)
	return &cbench{p}, err
}

func (c *cbench) name() string { return "C API" }

// numbers sends a command of words and parses the answer's words as numbers.
func (c *cbench) numbers(words ...any) ([]float64, error) {
	var line []byte
	for i, w := range words {
		if i > 0 {
			line = append(line, ' ')
		}
		line = fmt.Append(line, w)
	}
	text, err := c.call(line)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(text, "error") {
		return nil, fmt.Errorf("llama.cpp C driver: %s", text)
	}
	fields := strings.Fields(text)
	nums := make([]float64, len(fields))
	for i, f := range fields {
		if nums[i], err = strconv.ParseFloat(f, 64); err != nil {
			return nil, fmt.Errorf("llama.cpp C driver answer %q: %w", text, err)
		}
	}
	return nums, nil
}

// tokenWords spreads tokens into words for numbers.
func tokenWords(head []any, tokens []int32) []any {
	for _, t := range tokens {
		head = append(head, t)
	}
	return head
}

func (c *cbench) load(gguf string, threads, context, batch int) error {
	if strings.ContainsAny(gguf, " \n") {
		return fmt.Errorf("llama.cpp C driver: the GGUF path %q has a space", gguf)
	}
	text, err := c.call(fmt.Appendf(nil, "load %s %d %d %d", gguf, threads, context, batch))
	if err == nil && !strings.HasPrefix(text, "ok") {
		err = fmt.Errorf("llama.cpp C driver: %s", text)
	}
	return err
}

func (c *cbench) prefill(prompt []int32) (float64, error) {
	nums, err := c.numbers(tokenWords([]any{"prefill", len(prompt)}, prompt)...)
	if err != nil {
		return 0, err
	}
	return nums[0], nil
}

func (c *cbench) generate(prompt []int32, n int) (generated, error) {
	nums, err := c.numbers(tokenWords([]any{"generate", n, len(prompt)}, prompt)...)
	if err != nil {
		return generated{}, err
	}
	if len(nums) != 2+n {
		return generated{}, fmt.Errorf("llama.cpp C driver: %d numbers for %d tokens", len(nums), n)
	}
	g := generated{PrefillMs: nums[0], DecodeMs: nums[1]}
	for _, t := range nums[2:] {
		g.Tokens = append(g.Tokens, int32(t))
	}
	return g, nil
}

// bandwidth returns the read bandwidth in GB/s of threads summing mib MiB
// on huge pages, the best over 1, 2, 4 and 8 streams per thread, and the
// stream count that gave it.
func (c *cbench) bandwidth(mib, threads int) (gbs float64, streams int, err error) {
	nums, err := c.numbers("bandwidth", mib, threads)
	if err != nil {
		return 0, 0, err
	}
	if len(nums) != 2 {
		return 0, 0, fmt.Errorf("llama.cpp C driver: bandwidth gave %d numbers, want 2", len(nums))
	}
	return nums[0], int(nums[1]), nil
}
