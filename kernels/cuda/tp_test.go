//go:build cgo

package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/kernels/cuda"
)

// Tensor parallelism over GPUs connected by NCCL, against the CPU backend's
// tensor parallelism (ranks in host memory) and one rank: on the CPU
// emulation here (its devices connected by the emulation's NCCL), on GPUs
// by model_gpu_test.go.

// TestEmulatedTensorParallel runs the checks over 2, 4 and 8 emulated GPUs
// when DDFLASH_LIBCUDA names the CPU emulation (a child of TestEmulator).
func TestEmulatedTensorParallel(t *testing.T) {
	if os.Getenv("DDFLASH_LIBCUDA") == "" {
		t.Skip("runs as a child of TestEmulator")
	}
	gpus := make([]kernels.Backend, 8)
	for i := range gpus {
		var err error
		gpus[i], err = cuda.New(i)
		must(t, err)
	}
	for _, n := range []int{1, 3} { // one rank: what a one-GPU machine checks (model_gpu_test.go)
		t.Run(fmt.Sprintf("Comm%d", n), func(t *testing.T) { checkNCCLComm(t, gpus[:n]) })
	}
	for _, tp := range []int{2, 4, 8} {
		t.Run(fmt.Sprintf("tp%d", tp), func(t *testing.T) { checkTensorParallel(t, gpus[:tp]) })
	}
	t.Run("WithoutNCCL", func(t *testing.T) {
		t.Setenv("DDFLASH_LIBNCCL", filepath.Join(t.TempDir(), "libnccl.so.2"))
		checkRefusedWithoutNCCL(t, gpus[:2])
	})
}

// checkNCCLComm runs the collectives the engine uses over the ranks, each
// queued between kernels on its rank's stream: all-gather, all-reduce (in
// place; bit-identical to adding the ranks' values in rank order, as the CPU
// backend's LocalComm does, on every rank) and broadcast from the last rank.
func checkNCCLComm(t *testing.T, gpus []kernels.Backend) {
	const n = 37
	comm, err := gpus[0].(kernels.Connector).Connect(gpus)
	must(t, err)
	defer comm.(interface{ Close() }).Close()
	rng := rand.New(rand.NewPCG(8, 1))
	inputs := make([][]float32, len(gpus))
	for r := range inputs {
		inputs[r] = make([]float32, n)
		for i := range inputs[r] {
			inputs[r][i] = float32(rng.NormFloat64()) * 1e3
		}
	}
	wantSum := slices.Clone(inputs[0])
	for _, in := range inputs[1:] {
		for i, v := range in {
			wantSum[i] += v
		}
	}
	var wantGathered []float32
	for _, in := range inputs {
		for _, v := range in {
			wantGathered = append(wantGathered, 4*v)
		}
	}
	root := len(gpus) - 1
	results := make([][3][]float32, len(gpus))
	errs := make([]error, len(gpus))
	var wg sync.WaitGroup
	for r, b := range gpus {
		wg.Go(func() {
			var err error
			check := func(e error) { err = errors.Join(err, e) }
			buf, e := b.Alloc(kernels.F32, n)
			check(e)
			gathered, e := b.Alloc(kernels.F32, len(gpus)*n)
			check(e)
			doubled, e := b.Alloc(kernels.F32, n)
			check(e)
			if err != nil {
				errs[r] = err
				return
			}
			defer b.Free(buf)
			defer b.Free(gathered)
			defer b.Free(doubled)
			// A kernel queued just before the all-gather doubles its input and
			// one queued just after it doubles its output: the collective
			// must run in stream order between them.
			check(b.UploadF32(buf, 0, inputs[r]))
			b.Add(doubled, buf, buf, n)
			check(comm.AllGather(r, gathered, doubled, n))
			b.Add(gathered, gathered, gathered, len(gpus)*n)
			check(comm.AllReduceSum(r, buf, n))
			sum, all := make([]float32, n), make([]float32, len(gpus)*n)
			check(b.DownloadF32(buf, 0, sum))
			check(b.DownloadF32(gathered, 0, all))
			check(b.UploadF32(buf, 0, inputs[r]))
			check(comm.Broadcast(r, root, buf, n))
			bc := make([]float32, n)
			check(b.DownloadF32(buf, 0, bc))
			results[r], errs[r] = [3][]float32{sum, all, bc}, err
		})
	}
	wg.Wait()
	for r, res := range results {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if !slices.Equal(res[0], wantSum) {
			t.Errorf("rank %d: all-reduce %v, want the rank-order sum %v", r, res[0][:3], wantSum[:3])
		}
		if !slices.Equal(res[1], wantGathered) {
			t.Errorf("rank %d: all-gather differs from 4 × the ranks' inputs in rank order", r)
		}
		if !slices.Equal(res[2], inputs[root]) {
			t.Errorf("rank %d: broadcast from rank %d differs", r, root)
		}
	}
}

// checkTensorParallel splits the tp8 preset over the GPUs given: the logits
// of a prefill and decode steps agree with the CPU backend's at the same
// degree and with one CPU rank to the CUDA conformance tolerance, and
// greedy output, autoregressive and DDTree with a drafter (whose proposals
// are scored through the broadcast to every rank's LM-head slice), equals
// both.
func checkTensorParallel(t *testing.T, gpus []kernels.Backend) {
	tp := len(gpus)
	p, err := testmodel.PresetByName("tp8")
	must(t, err)
	dir := t.TempDir()
	target, draft := dir+"/target", dir+"/draft"
	must(t, testmodel.Write(target, testmodel.Options{Preset: p, Seed: uint64(tp), DType: "bf16"}))
	must(t, testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: uint64(tp), DType: "bf16"}))
	cpuRanks := func(n int) []kernels.Backend {
		ranks := make([]kernels.Backend, n)
		for i := range ranks {
			ranks[i] = cpu.New(1)
		}
		return ranks
	}
	rng := rand.New(rand.NewPCG(uint64(tp), 3))
	prompt := make([]int32, 29)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(300))
	}
	steps := []int32{5, 17, 101, 3}
	got := modelLogits(t, gpus, target, prompt, steps)
	for _, ref := range []struct {
		name  string
		ranks []kernels.Backend
	}{{fmt.Sprintf("the CPU backend at TP %d", tp), cpuRanks(tp)}, {"one CPU rank", cpuRanks(1)}} {
		want := modelLogits(t, ref.ranks, target, prompt, steps)
		for i := range want {
			if d := cuda.RelNorm(got[i], want[i]); d > 1e-4 {
				t.Errorf("forward %d: ‖got−want‖/‖want‖ = %.2g against %s", i, d, ref.name)
			}
		}
	}
	for _, spec := range []engine.SpecOptions{{Mode: engine.SpecAuto}, {Mode: engine.SpecTree, Budget: 8}} {
		want := generateTP(t, cpuRanks(1), target, draft, spec, prompt)
		for _, run := range []struct {
			name  string
			ranks []kernels.Backend
		}{{"the CPU backend", cpuRanks(tp)}, {"NCCL", gpus}} {
			got := generateTP(t, run.ranks, target, draft, spec, prompt)
			if !slices.Equal(got.Tokens, want.Tokens) {
				t.Errorf("%v: TP %d over %s differs from one CPU rank\n got %v\nwant %v", spec.Mode, tp, run.name, got.Tokens, want.Tokens)
			}
			// The same draft logits propose the same trees: a drafter scored
			// on stale hidden states would only lower acceptance.
			if spec.Mode != engine.SpecAuto && got.Stats.AcceptanceLength != want.Stats.AcceptanceLength {
				t.Errorf("%v: TP %d over %s accepts %.3f tokens a step, one CPU rank %.3f", spec.Mode, tp, run.name, got.Stats.AcceptanceLength, want.Stats.AcceptanceLength)
			}
		}
	}
}

// generateTP decodes 16 tokens greedily over ranks, with the drafter unless
// spec is SpecAuto.
func generateTP(t *testing.T, ranks []kernels.Backend, target, draft string, spec engine.SpecOptions, prompt []int32) *engine.Result {
	t.Helper()
	const maxTokens = 16
	opts := engine.Options{Context: 96}
	var err error
	if spec.Mode != engine.SpecAuto {
		opts.VerifyTokens, err = dflash.VerifyTokens(draft, spec)
		must(t, err)
	}
	e, err := engine.LoadParallel(ranks, target, opts)
	must(t, err)
	defer e.Close()
	if spec.Mode != engine.SpecAuto {
		must(t, dflash.Attach(e, draft, spec))
	}
	res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true})
	must(t, err)
	return res
}

// checkRefusedWithoutNCCL: with no NCCL library to load, loading a model
// over two GPUs fails and names the library, rather than falling back to
// copies through host memory.
func checkRefusedWithoutNCCL(t *testing.T, gpus []kernels.Backend) {
	p, err := testmodel.PresetByName("tp8")
	must(t, err)
	dir := t.TempDir()
	must(t, testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: "bf16"}))
	e, err := engine.LoadParallel(gpus, dir, engine.Options{Context: 64})
	if err == nil {
		e.Close()
		t.Fatal("loaded over 2 GPUs without NCCL, want a refusal")
	}
	for _, want := range []string{"libnccl.so.2", "NCCL", "tensor parallelism"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
