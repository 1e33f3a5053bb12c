//go:build cgo

package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"ddflash/internal/closeness"
	"ddflash/internal/half"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// RelNorm is relNorm for the external test package (model_test.go).
var RelNorm = relNorm

// relNorm is ‖got − want‖ / ‖want‖, +Inf on NaN or Inf so that every bound fails.
func relNorm(got, want []float32) float64 { return closeness.RelNorm(got, want) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func randomF32(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}

// encode rounds values to dt and returns their little-endian bytes.
func encode(dt kernels.DType, v []float32) []byte {
	out := make([]byte, 0, len(v)*dt.Size())
	for _, f := range v {
		switch dt {
		case kernels.BF16:
			out = binary.LittleEndian.AppendUint16(out, half.Float32ToBF16(f))
		case kernels.F16:
			out = binary.LittleEndian.AppendUint16(out, half.Float32ToF16(f))
		default:
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(f))
		}
	}
	return out
}

// checkMatMul compares MatMul on be with the CPU backend for every weight
// dtype and for row counts on both paths: the kernel (up to gemvMaxRows)
// and, with BF16 weights, cuBLASLt on split activations.
func checkMatMul(t *testing.T, be *Backend, n, k int) {
	if be.blas == nil {
		t.Logf("every size runs the kernel: %v", be.blasErr)
	}
	ref := cpu.New(0)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
		for _, m := range []int{1, gemvMaxRows, gemvMaxRows + 9, 65} {
			x, w := randomF32(rng, m*k), randomF32(rng, n*k)
			got := matmulOn(t, be, dt, x, w, m, n, k)
			want := matmulOn(t, ref, dt, x, w, m, n, k)
			// Both sum exact products in F32, in different orders: about
			// u·√k relative each. Rounding x to bf16 instead would give
			// about 2^-9/√3 ≈ 1e-3.
			if d := relNorm(got, want); d > 5e-5 {
				t.Errorf("MatMul %v m=%d n=%d k=%d: ‖got−cpu‖/‖cpu‖ = %.2g", dt, m, n, k, d)
			}
		}
	}
}

func matmulOn(t *testing.T, be kernels.Backend, dt kernels.DType, x, w []float32, m, n, k int) []float32 {
	t.Helper()
	xb, wb, ob := mustAlloc(t, be, kernels.F32, len(x)), mustAlloc(t, be, dt, len(w)), mustAlloc(t, be, kernels.F32, m*n)
	must(t, be.UploadF32(xb, 0, x))
	must(t, be.Upload(wb, 0, encode(dt, w)))
	be.MatMul(ob, xb, wb, m, n, k)
	out := make([]float32, m*n)
	must(t, be.DownloadF32(ob, 0, out))
	return out
}

func mustAlloc(t *testing.T, be kernels.Backend, dt kernels.DType, n int) kernels.Buffer {
	t.Helper()
	b, err := be.Alloc(dt, n)
	must(t, err)
	t.Cleanup(func() { be.Free(b) })
	return b
}

// checkGraphReplay captures a few ops and replays the graph on new inputs:
// it must compute what the ops compute when issued directly.
func checkGraphReplay(t *testing.T, be *Backend) {
	const n = 4096
	rng := rand.New(rand.NewPCG(7, 8))
	a, b, out := mustAlloc(t, be, kernels.F32, n), mustAlloc(t, be, kernels.F32, n), mustAlloc(t, be, kernels.F32, n)
	step := func() {
		be.SwiGLU(out, a, b, n)
		be.Add(out, out, a, n)
	}
	upload := func(av, bv []float32) {
		must(t, be.UploadF32(a, 0, av))
		must(t, be.UploadF32(b, 0, bv))
	}
	read := func() []float32 {
		got := make([]float32, n)
		must(t, be.DownloadF32(out, 0, got))
		return got
	}
	must(t, be.BeginCapture())
	step()
	g, err := be.EndCapture()
	must(t, err)
	defer g.Close()
	for range 2 { // replays see each new upload
		av, bv := randomF32(rng, n), randomF32(rng, n)
		upload(av, bv)
		step()
		want := read()
		be.Fill(out, float32(math.NaN()))
		must(t, be.Launch(g))
		if d := relNorm(read(), want); d != 0 {
			t.Errorf("graph replay differs from eager ops: %g", d)
		}
	}
}

// checkKernelResources reads every kernel's resources (cuFuncGetAttribute)
// and, after an Add of 256-thread blocks, its occupancy
// (cuOccupancyMaxActiveBlocksPerMultiprocessor), and prints the report with
// cuBLASLt's version and heuristic misses (to $DDFLASH_KERNEL_TABLE too).
func checkKernelResources(t *testing.T, be *Backend) {
	const n = 1000
	a := mustAlloc(t, be, kernels.F32, n)
	be.Fill(a, 1)
	be.Add(a, a, a, n)
	must(t, be.Sync())
	rs, err := be.kernelResources()
	must(t, err)
	if len(rs) != len(KernelNames()) {
		t.Fatalf("%d kernels reported, %d in the PTX", len(rs), len(KernelNames()))
	}
	for _, r := range rs {
		if r.regs <= 0 || r.maxThreads < 32 || r.localBytes < 0 || r.sharedBytes < 0 {
			t.Errorf("%s: implausible attributes %+v", r.name, r)
		}
		if r.block > r.maxThreads {
			t.Errorf("%s: launched with %d threads a block, above its maximum %d", r.name, r.block, r.maxThreads)
		}
		if r.block > 0 && (r.blocksPerSM < 1 || !(r.occupancy > 0 && r.occupancy <= 1)) {
			t.Errorf("%s: %d threads a block, %d blocks per SM, occupancy %g", r.name, r.block, r.blocksPerSM, r.occupancy)
		}
		if r.name == "add_f32" && r.block != 256 {
			t.Errorf("add_f32: launch recorded with %d threads a block, want 256", r.block)
		}
	}
	report := be.resourceReport(rs)
	t.Log("\n" + report)
	if path := os.Getenv("DDFLASH_KERNEL_TABLE"); path != "" {
		must(t, os.WriteFile(path, []byte(report), 0o644))
	}
}

// layerStepCase is a layer step to compare with the CPU backend: its
// shapes, linear-layer dtype, cached tokens and row counts.
type layerStepCase struct {
	name    string
	s       layerShape
	linear  kernels.DType
	context int
	rows    []int
}

// checkLayerStep runs each case's step on the CPU backend and on be (the
// same random weights and inputs) and compares what the step adds to the
// residual stream.
func checkLayerStep(t *testing.T, be *Backend, cases []layerStepCase) {
	for _, c := range cases {
		var out [2][][]float32 // [backend][rows]
		for i, b := range []kernels.Backend{cpu.New(0), be} {
			h := &stepHarness{tb: t, be: b, rng: rand.New(rand.NewPCG(1, 2))}
			w := newLayerWeights(h, c.s, c.linear)
			for _, r := range c.rows {
				l := newLayerStep(h, w, c.s, r, c.context)
				before, after := make([]float32, r*c.s.hidden), make([]float32, r*c.s.hidden)
				must(t, b.DownloadF32(l.x, 0, before))
				l.run()
				must(t, b.DownloadF32(l.x, 0, after))
				for j := range after {
					after[j] -= before[j] // what the two layers add to the residual stream
				}
				out[i] = append(out[i], after)
				l.free()
			}
			w.free(b)
		}
		for j, r := range c.rows {
			if d := relNorm(out[1][j], out[0][j]); !(d < 1e-4) {
				t.Errorf("%s rows %d: the step's residual update differs, ‖%s−cpu‖/‖cpu‖ = %.2g", c.name, r, be.name, d)
			} else {
				t.Logf("%s rows %d: residual update ‖%s−cpu‖/‖cpu‖ = %.2g", c.name, r, be.name, d)
			}
		}
	}
}
