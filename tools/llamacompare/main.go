// Command llamacompare measures ddflash's CPU backend against llama.cpp on
// the same bf16 weights (scripts/llamacpp-compare.sh runs it): for each test
// model preset it writes the checkpoint, converts it to GGUF, checks that
// both engines decode the same greedy tokens, then times prefill and decode
// with the two engines' runs interleaved, and prints tok/s and ddflash/llama.cpp
// ratios as a Markdown table. llama.cpp runs in tools/llamacpp/worker.js
// (node-llama-cpp's prebuilt libllama).
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
	worker, workdir           string
}

func run() error {
	var presets, threads, prefill string
	var o options
	flag.StringVar(&presets, "presets", "small,mid", "test model presets, comma-separated")
	flag.StringVar(&threads, "threads", "1,2", "thread counts, comma-separated")
	flag.StringVar(&prefill, "prefill", "512,4096", "prompt lengths to time prefill on")
	flag.IntVar(&o.decode, "decode", 128, "decode steps to time (after a 16-token prompt)")
	flag.IntVar(&o.agree, "agree", 32, "greedy tokens that must agree (after a 64-token prompt)")
	flag.IntVar(&o.reps, "reps", 2, "interleaved repetitions of each measurement")
	flag.StringVar(&o.worker, "worker", "tools/llamacpp/worker.js", "the llama.cpp worker script")
	flag.StringVar(&o.workdir, "workdir", filepath.Join(os.TempDir(), "ddflash-llamacompare"), "where checkpoints and GGUF files are written (reused when present)")
	flag.Parse()
	o.presets, o.threads, o.prefill = split(presets), split(threads), split(prefill)
	w, err := startWorker(o.worker)
	if err != nil {
		return err
	}
	defer w.close()
	fmt.Printf("load average at start: %s", loadavg())
	fmt.Println("| preset | threads | workload | ddflash tok/s | llama.cpp tok/s | ddflash / llama.cpp |")
	fmt.Println("|---|---|---|---|---|---|")
	var failed []string
	for _, name := range o.presets {
		if err := comparePreset(w, name, o); err != nil {
			if !errors.Is(err, errDisagree) {
				return err
			}
			failed = append(failed, name+": "+err.Error())
		}
	}
	fmt.Printf("load average at end: %s", loadavg())
	if failed != nil {
		return fmt.Errorf("greedy outputs differ: %s", strings.Join(failed, "; "))
	}
	return nil
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

func comparePreset(w *worker, name string, o options) error {
	dir, ggufPath, err := prepare(name, o.workdir)
	if err != nil {
		return err
	}
	longest := 16 + o.decode
	for _, s := range o.prefill {
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("--prefill %q: %w", s, err)
		}
		longest = max(longest, n+1)
	}
	ctxLen := longest + 64
	for _, ts := range o.threads {
		threads, err := strconv.Atoi(ts)
		if err != nil {
			return fmt.Errorf("--threads %q: %w", ts, err)
		}
		e, err := engine.Load(cpu.New(threads), dir, engine.Options{Context: ctxLen})
		if err != nil {
			return err
		}
		var loaded map[string]any
		if err := w.call(map[string]any{"cmd": "load", "model": ggufPath, "threads": threads, "context": ctxLen, "batch": 512}, &loaded); err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(threads), 7))
		tokens := func(n int) []int32 {
			t := make([]int32, n)
			for i := range t {
				t[i] = int32(rng.IntN(e.ValidVocab))
			}
			return t
		}
		if err := checkAgreement(e, w, tokens(64), o.agree); err != nil {
			return err
		}
		for _, s := range o.prefill {
			n, _ := strconv.Atoi(s)
			prompt := tokens(n)
			d, l, err := interleave(o.reps, func() (float64, error) { return ddflashRun(e, prompt, 1, true) },
				func() (float64, error) { return llamaPrefill(w, prompt) })
			if err != nil {
				return err
			}
			row(name, threads, fmt.Sprintf("prefill %d", n), float64(n*o.reps), d, l)
		}
		prompt := tokens(16)
		d, l, err := interleave(o.reps, func() (float64, error) { return ddflashRun(e, prompt, o.decode+1, false) },
			func() (float64, error) { return llamaDecode(w, prompt, o.decode+1) })
		if err != nil {
			return err
		}
		row(name, threads, fmt.Sprintf("decode %d", o.decode), float64(o.decode*o.reps), d, l)
	}
	return nil
}

func row(preset string, threads int, workload string, tokens, ddMs, llamaMs float64) {
	dd, ll := tokens/(ddMs/1000), tokens/(llamaMs/1000)
	fmt.Printf("| %s | %d | %s | %.1f | %.1f | %.2f× |\n", preset, threads, workload, dd, ll, dd/ll)
}

// interleave runs a and b reps times each, alternating which goes first,
// and returns their total milliseconds.
func interleave(reps int, a, b func() (float64, error)) (aMs, bMs float64, err error) {
	for i := range reps {
		order := []*float64{&aMs, &bMs}
		fns := []func() (float64, error){a, b}
		if i%2 == 1 {
			slices.Reverse(order)
			slices.Reverse(fns)
		}
		for j, f := range fns {
			ms, err := f()
			if err != nil {
				return 0, 0, err
			}
			*order[j] += ms
		}
	}
	return aMs, bMs, nil
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

type generated struct {
	Tokens    []int32 `json:"tokens"`
	PrefillMs float64 `json:"prefillMs"`
	DecodeMs  float64 `json:"decodeMs"`
}

func llamaPrefill(w *worker, prompt []int32) (float64, error) {
	var r struct{ Ms float64 }
	err := w.call(map[string]any{"cmd": "prefill", "tokens": prompt}, &r)
	return r.Ms, err
}

func llamaDecode(w *worker, prompt []int32, n int) (float64, error) {
	var g generated
	err := w.call(map[string]any{"cmd": "generate", "tokens": prompt, "n": n}, &g)
	return g.DecodeMs, err
}

// nearTie is the largest gap, in nats, between ddflash's top two tokens at
// which llama.cpp may pick the second: llama.cpp rounds activations to
// bfloat16 before BF16 matmuls, which moves logits by a few hundredths.
const nearTie = 0.05

// checkAgreement decodes n greedy tokens with both engines. They must agree
// up to the end or up to a step where ddflash's two best tokens are within
// nearTie and llama.cpp took the other one (then the texts diverge legitimately).
func checkAgreement(e *engine.Engine, w *worker, prompt []int32, n int) error {
	res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true,
		Sampling: engine.SamplingParams{Logprobs: 2}})
	if err != nil {
		return err
	}
	var g generated
	if err := w.call(map[string]any{"cmd": "generate", "tokens": prompt, "n": n}, &g); err != nil {
		return err
	}
	same := 0
	for same < min(len(res.Tokens), len(g.Tokens)) && res.Tokens[same] == g.Tokens[same] {
		same++
	}
	if same == n {
		fmt.Fprintf(os.Stderr, "greedy agreement: %d tokens identical\n", n)
		return nil
	}
	if same < len(g.Tokens) {
		step := res.Logprobs[same]
		for _, alt := range step.Top {
			if alt.ID == g.Tokens[same] && step.Logprob-alt.Logprob <= nearTie {
				fmt.Fprintf(os.Stderr, "greedy agreement: %d tokens identical, then a near tie (ddflash's top two %.3f nats apart)\n", same, step.Logprob-alt.Logprob)
				return nil
			}
		}
	}
	return fmt.Errorf("%w at step %d: ddflash %v, llama.cpp %v", errDisagree, same, res.Tokens, g.Tokens)
}

// worker is the node process that runs llama.cpp.
type worker struct {
	cmd   *exec.Cmd
	stdin io.Closer
	in    *json.Encoder
	out   *bufio.Scanner
}

func startWorker(script string) (*worker, error) {
	cmd := exec.Command("node", script)
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
		return nil, fmt.Errorf("start the llama.cpp worker (node %s): %w", script, err)
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	return &worker{cmd: cmd, stdin: stdin, in: json.NewEncoder(stdin), out: sc}, nil
}

func (w *worker) call(msg map[string]any, answer any) error {
	if err := w.in.Encode(msg); err != nil {
		return fmt.Errorf("llama.cpp worker: %w", err)
	}
	if !w.out.Scan() {
		return fmt.Errorf("llama.cpp worker exited (%v)", w.out.Err())
	}
	var e struct{ Error string }
	if err := json.Unmarshal(w.out.Bytes(), &e); err != nil {
		return fmt.Errorf("llama.cpp worker answer %q: %w", w.out.Text(), err)
	}
	if e.Error != "" {
		return fmt.Errorf("llama.cpp worker: %s", e.Error)
	}
	return json.Unmarshal(w.out.Bytes(), answer)
}

func (w *worker) close() {
	w.stdin.Close() // the worker exits at the end of its input
	w.cmd.Wait()
}
