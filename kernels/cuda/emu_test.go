//go:build cgo

package cuda

import (
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/kernels/cuda/emulator"
	"ddflash/kernels/kerneltest"
)

// TestEmulator runs the backend, host code and kernels both, without a
// GPU: emu/driver.cc is a stand-in libcuda (and libcublasLt) that runs the
// kernels, compiled as C++, on the CPU. A child test process loads it
// through DDFLASH_LIBCUDA and runs the TestEmulated* tests: the
// kernels.Backend conformance suite, MatMul on both paths, split-key
// attention, graph capture and replay, the benchmark's layer step, whole
// tiny models against the CPU backend, the engine's recorded steps and
// their driver counts, and tensor parallelism over emulated GPUs connected
// by the emulation's NCCL. This checks the kernels' logic
// (indexing, masks, recurrences, top-k, the math) and the host code in CI;
// the PTX itself, races between threads and timing need the GPU run
// (scripts/gpu-check.sh).
func TestEmulator(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the CPU emulation (about 10 s)")
	}
	lib := buildEmulator(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEmulated", "-test.v")
	cmd.Env = append(os.Environ(), "DDFLASH_LIBCUDA="+lib, "DDFLASH_LIBCUBLASLT="+lib, "DDFLASH_LIBNCCL="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("emulated tests: %v\n%s", err, out)
	}
	for _, name := range []string{"TestEmulatedConformance", "TestEmulatedMatMul", "TestEmulatedMatMulFP8", "TestEmulatedAttention", "TestEmulatedGDNChunked", "TestEmulatedGraph", "TestEmulatedLayerStep", "TestEmulatedModel", "TestEmulatedTensorParallel", "TestEmulatedKernelResources", "TestEmulatedHeuristicMiss",
		"TestEmulatedCounts", "TestEmulatedGraphCuBLASLt", "TestEmulatedAttentionTable", "TestEmulatedTopKLSE", "TestEmulatedStep"} {
		if !strings.Contains(string(out), "--- PASS: "+name+" (") {
			t.Errorf("the child process did not pass %s:\n%s", name, out)
		}
	}
}

// buildEmulator builds the CPU emulation with every kernel of the embedded
// PTX and returns the library's path.
func buildEmulator(t *testing.T) string {
	t.Helper()
	lib, err := emulator.Build(t.TempDir(), KernelNames())
	must(t, err)
	return lib
}

// emulated opens the backend on the CPU emulation, in TestEmulator's child.
func emulated(t *testing.T) *Backend {
	t.Helper()
	if os.Getenv("DDFLASH_LIBCUDA") == "" {
		t.Skip("runs as a child of TestEmulator")
	}
	be, err := open(0)
	must(t, err)
	return be
}

func TestEmulatedConformance(t *testing.T) {
	be := emulated(t)
	kerneltest.Run(t, func() kernels.Backend { return be })
}

func TestEmulatedMatMul(t *testing.T) {
	be := emulated(t)
	if be.blas == nil {
		t.Fatal("the emulated cuBLASLt did not load")
	}
	checkMatMul(t, be, 24, 136)
}

// TestEmulatedMatMulFP8 runs MatMul on a block-scaled FP8 weight of
// Qwen3.6-27B's down projection shape [5120, 17408] (136 scale blocks per
// row) for decode and a verify block (the warp-per-row and the tiled
// kernel), against the CPU backend.
func TestEmulatedMatMulFP8(t *testing.T) {
	be := emulated(t)
	const n, k = 5120, 17408
	for _, m := range []int{1, 9} {
		var out [2][]float32
		for i, b := range []kernels.Backend{cpu.New(2), be} {
			h := &stepHarness{tb: t, be: b, rng: rand.New(rand.NewPCG(3, uint64(m)))}
			var bufs []kernels.Buffer
			w, x, o := h.fp8(n, k, &bufs), h.alloc(kernels.F32, m*k, 1, &bufs), h.alloc(kernels.F32, m*n, 0, &bufs)
			b.MatMul(o, x, w, m, n, k)
			out[i] = make([]float32, m*n)
			must(t, b.DownloadF32(o, 0, out[i]))
			for _, buf := range bufs {
				b.Free(buf)
			}
		}
		if d := relNorm(out[1], out[0]); !(d < 1e-5) {
			t.Errorf("m=%d: ‖emulated−cpu‖/‖cpu‖ = %.2g", m, d)
		}
	}
}

// TestEmulatedGDNChunked compares GDNChunked with the CPU backend where
// the conformance suite's small heads do not reach: at Qwen3.6-27B's
// widths (16 key heads, 48 value heads, 128 × 128) over 1024 tokens (16
// chunks of 64; about 5 CPU-s on the emulation), and at dims that are no
// multiple of 32 with a partial chunk.
func TestEmulatedGDNChunked(t *testing.T) {
	be := emulated(t)
	checkGDNChunked(t, be, qwen36.gdn, 1024)
	checkGDNChunked(t, be, kernels.GDNShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 72, ValueDim: 40}, 37)
}

func TestEmulatedGraph(t *testing.T) { checkGraphReplay(t, emulated(t)) }

func TestEmulatedKernelResources(t *testing.T) { checkKernelResources(t, emulated(t)) }

// TestEmulatedHeuristicMiss: when cuBLASLt has no algorithm for a GEMM,
// MatMul still matches the CPU backend (on its own kernel), and the miss is
// logged and reported.
func TestEmulatedHeuristicMiss(t *testing.T) {
	t.Setenv("DDFLASH_EMU_LT_NO_ALGORITHM", "1")
	be := emulated(t)
	var logged strings.Builder
	log.SetOutput(&logged)
	defer log.SetOutput(os.Stderr)
	const m, n, k = 12, 24, 64 // 2 bf16 terms of x: a 24-row GEMM
	rng := rand.New(rand.NewPCG(17, 18))
	x, w := randomF32(rng, m*k), randomF32(rng, n*k)
	got := matmulOn(t, be, kernels.BF16, x, w, m, n, k)
	want := matmulOn(t, cpu.New(0), kernels.BF16, x, w, m, n, k)
	if d := relNorm(got, want); !(d < 5e-5) {
		t.Errorf("MatMul on the fallback: ‖emulated−cpu‖/‖cpu‖ = %.2g", d)
	}
	const shape = "m=24 n=24 k=64"
	if !strings.Contains(logged.String(), "cuBLASLt has no algorithm for the bf16 GEMM "+shape) {
		t.Errorf("the miss was not logged; the log has %q", logged.String())
	}
	if len(be.blas.misses) != 1 || !strings.Contains(be.blas.misses[0], shape) {
		t.Errorf("misses %q, want one for %s", be.blas.misses, shape)
	}
	if report := be.resourceReport(nil); !strings.Contains(report, "heuristic misses: 1") {
		t.Errorf("the report does not count the miss:\n%s", report)
	}
}

// TestEmulatedLayerStep runs the step-time benchmark's step, decode and
// tree verify, at toy sizes and at Qwen3.6-27B's own shapes (random
// weights: every op of an attention and a GDN layer with their MLPs; with
// bf16 linear layers the verify rows go through cuBLASLt; FP8 block-scaled
// ones decode only), and compares what the step adds to the residual stream
// with the CPU backend.
func TestEmulatedLayerStep(t *testing.T) {
	be := emulated(t)
	toy := layerShape{
		hidden: 64, inter: 96, heads: 4, kvHeads: 2, headDim: 32, rotDim: 8,
		gdn: kernels.GDNShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 40, ValueDim: 36}, convK: 4, pageSize: 4,
	}
	// FP8 verify rows (the tiled kernel) at every one of these shapes would
	// cost the emulation half a minute: TestEmulatedMatMulFP8 runs them at
	// the largest.
	checkLayerStep(t, be, []layerStepCase{
		{"toy", toy, kernels.BF16, 13, []int{1, 9}},
		{"qwen36", qwen36, kernels.BF16, 100, []int{1, 9}},
		{"qwen36-fp8", qwen36, kernels.F8E4M3, 100, []int{1}},
	})
}

// TestEmulatedAttention checks the tiled attention kernels (F32 caches;
// BF16 caches on tensor cores) where the conformance suite's short
// sequences do not reach: head dim 256 with 32K cached keys, split across
// blocks and merged, against the CPU backend.
// The emulated driver imitates an H200 (132 SMs) for a decode row and an
// RTX PRO 6000 (188 SMs) for a tree verify and a windowed row in one
// launch; the tree's key splits differ between the two. (The emulation
// takes seconds per 32K-key launch; scripts/gpu-check.sh runs Qwen3.6-27B's
// heads with a 17-row tree on the GPU: TestAttentionLong.)
func TestEmulatedAttention(t *testing.T) {
	shape := kernels.AttnShape{NumHeads: 12, NumKVHeads: 2, HeadDim: 256, PageSize: 16, Scale: 1 / 16.0}
	const keys = 32 << 10
	decode := []longAttnSeq{{rows: 1, prefix: keys - 1}}
	verify := []longAttnSeq{
		{rows: 4, prefix: keys - 4, parents: []int{-1, 0, 0, 1}},
		{rows: 1, prefix: 20000, window: 4096},
	}
	splits := map[string]int{}
	for _, c := range []struct {
		gpu  string
		sms  int
		seqs []longAttnSeq
	}{{"H200", 132, decode}, {"RTX PRO 6000", 188, verify}} {
		t.Setenv("DDFLASH_EMU_GPU", c.gpu)
		be := emulated(t)
		if be.sms != c.sms {
			t.Fatalf("the emulated %s reports %d SMs, want %d", c.gpu, be.sms, c.sms)
		}
		for _, cache := range []kernels.DType{kernels.F32, kernels.BF16} {
			if n := checkLongAttention(t, be, shape, cache, c.seqs); n < 2 {
				t.Errorf("%s, %v cache: %d rows over %d keys run in %d split", c.gpu, cache, len(c.seqs), keys, n)
			}
		}
		splits[c.gpu] = longAttnSplits(be, shape, kernels.BF16, verify)
		be.Close()
	}
	if !(1 < splits["H200"] && splits["H200"] < splits["RTX PRO 6000"]) {
		t.Errorf("tree verify key splits %v: want more than one, and more on the GPU with more SMs", splits)
	}
}
