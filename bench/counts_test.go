package bench

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"ddflash/engine"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
	"ddflash/tokenizer"
)

// matmulCounter is the CPU backend with a tally of its matrix products
// (MatMul, and the fused MatMulParts and MatMulGLU, one launch each on
// CUDA), standing in for the CUDA backend's tally of driver calls (Counts).
type matmulCounter struct {
	kernels.Backend
	matmuls atomic.Int64
}

func (b *matmulCounter) MatMul(out, x, w kernels.Buffer, m, n, k int) {
	b.matmuls.Add(1)
	b.Backend.MatMul(out, x, w, m, n, k)
}

func (b *matmulCounter) MatMulParts(x kernels.Buffer, m, k int, parts []kernels.MatMulPart) {
	b.matmuls.Add(1)
	b.Backend.MatMulParts(x, m, k, parts)
}

func (b *matmulCounter) MatMulGLU(out, up, x, gate, upW kernels.Buffer, m, n, k int) {
	b.matmuls.Add(1)
	b.Backend.MatMulGLU(out, up, x, gate, upW, m, n, k)
}

func (b *matmulCounter) Counts() kernels.DriverCounts {
	return kernels.DriverCounts{Launches: b.matmuls.Load()}
}

// TestInProcessLogsDriverCalls: on a backend that tallies its driver calls,
// every pass of an in-process sweep logs them per target step, and the
// figures are the tally's over the steps the pass ran.
func TestInProcessLogsDriverCalls(t *testing.T) {
	model, _ := tinyPair(t)
	be := &matmulCounter{Backend: cpu.New(1)}
	load := func(int, string) (*engine.Engine, error) { return engine.Load(be, model, engine.Options{}) }
	tok, err := tokenizer.LoadDir(model)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	backend := &InProcess{Load: load, Prompter: ChatPrompter{Dir: tok}, Rollback: mamba.Replay, Threads: 1, Device: "cpu", Log: &log}
	plan := testPlan(t, "auto", "fibonacci", []int{6}, []int{1}, 1)
	if _, err := Sweep(context.Background(), Options{Plan: plan, Backend: backend, Store: Store{Dir: t.TempDir()}, ModelDir: model, IgnoreEOS: true, GPUs: &fakeGPUs{}}); err != nil {
		t.Fatal(err)
	}
	// Every step of the tiny preset's forward (3 GDN layers, 1 attention
	// layer) runs per layer its input projections as one MatMulParts, its
	// output projection, the MLP's gate and up as one MatMulGLU and its down
	// projection, then the LM head: 4·4 + 1 = 17.
	line := regexp.MustCompile(`tp1-auto: driver calls per step \(draft, forward and commit; (\d+) steps\): (\d+) launches, 0 allocations`)
	passes := line.FindAllStringSubmatch(log.String(), -1)
	if len(passes) == 0 {
		t.Fatalf("no driver calls logged:\n%s", log.String())
	}
	for _, p := range passes {
		if steps, _ := strconv.Atoi(p[1]); steps < 6 || p[2] != "17" {
			t.Errorf("logged %q: want at least 6 steps (the output tokens) of 17 matrix products", p[0])
		}
	}
}
