// Package kerneltest is a conformance suite for kernels.Backend: it runs
// every op on random inputs of awkward sizes and compares the results with
// float64 reference implementations written here, independently of any
// backend. It uses only the kernels.Backend interface, so every backend
// (CPU, CUDA) runs the same checks.
//
// Inputs are drawn fresh per run. A failing test logs its seed; set
// KERNELTEST_SEED to that value to reproduce it.
package kerneltest

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"ddflash/kernels"
)

// Run runs the whole suite against the backend made by newBackend.
func Run(t *testing.T, newBackend func() kernels.Backend) {
	be := newBackend()
	for _, tc := range suite {
		t.Run(tc.name, func(t *testing.T) { tc.run(newHarness(t, be)) })
	}
}

var suite = []struct {
	name string
	run  func(h *harness)
}{
	{"Buffers", testBuffers},
	{"Copy", testCopy},
	{"Fill", testFill},
	{"Embedding", testEmbedding},
	{"MatMul", testMatMul},
	{"MatMulFP8", testMatMulFP8},
	{"MatMulParts", testMatMulParts},
	{"MatMulGLU", testMatMulGLU},
	{"Add", testAdd},
	{"RMSNorm", testRMSNorm},
	{"AttnInputs", testAttnInputs},
	{"AddRMSNorm", testAddRMSNorm},
	{"GatedRMSNorm", testGatedRMSNorm},
	{"L2Norm", testL2Norm},
	{"RoPE", testRoPE},
	{"SwiGLU", testSwiGLU},
	{"MulSigmoid", testMulSigmoid},
	{"GroupedConv", testGroupedConv},
	{"WriteKVAttention", testAttention},
	{"MoveKV", testMoveKV},
	{"CausalConv", testCausalConv},
	{"ConvCommit", testConvCommit},
	{"GDNGates", testGDNGates},
	{"GDNConvInputs", testGDNConvInputs},
	{"GDNRecurrenceChain", testGDNChain},
	{"GDNRecurrenceTree", testGDNTree},
	{"GDNRecurrences", testGDNRecurrences},
	{"GDNChunked", testGDNChunked},
	{"LogSoftmax", testLogSoftmax},
	{"TopK", testTopK},
}

// harness gives a test a backend, a seeded generator and buffer helpers;
// buffers it allocates are freed when the test ends.
type harness struct {
	t    *testing.T
	be   kernels.Backend
	rng  *rand.Rand
	bufs []kernels.Buffer
}

func newHarness(t *testing.T, be kernels.Backend) *harness {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KERNELTEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KERNELTEST_SEED=%q: want an unsigned integer: %v", s, err)
		}
		seed = v
	}
	h := &harness{t: t, be: be, rng: rand.New(rand.NewPCG(seed, 0x6b65726e656c))}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random inputs from seed %d: rerun with KERNELTEST_SEED=%d", seed, seed)
		}
		for _, b := range h.bufs {
			be.Free(b)
		}
	})
	return h
}

func (h *harness) alloc(dt kernels.DType, n int) kernels.Buffer {
	h.t.Helper()
	b, err := h.be.Alloc(dt, n)
	if err != nil {
		h.t.Fatalf("Alloc(%v, %d): %v", dt, n, err)
	}
	h.bufs = append(h.bufs, b)
	return b
}

// f32 uploads data into a new F32 buffer.
func (h *harness) f32(data []float32) kernels.Buffer {
	h.t.Helper()
	b := h.alloc(kernels.F32, len(data))
	if err := h.be.UploadF32(b, 0, data); err != nil {
		h.t.Fatalf("UploadF32: %v", err)
	}
	return b
}

// i32 uploads data into a new I32 buffer.
func (h *harness) i32(data []int32) kernels.Buffer {
	h.t.Helper()
	b := h.alloc(kernels.I32, len(data))
	if err := h.be.UploadI32(b, 0, data); err != nil {
		h.t.Fatalf("UploadI32: %v", err)
	}
	return b
}

// weights rounds data to dt, uploads it as raw bytes and returns the buffer
// and the exact values the device holds.
func (h *harness) weights(dt kernels.DType, data []float32) (kernels.Buffer, []float64) {
	h.t.Helper()
	exact := make([]float64, len(data))
	raw := make([]byte, len(data)*dt.Size())
	for i, v := range data {
		switch dt {
		case kernels.F32:
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
			exact[i] = float64(v)
		case kernels.BF16:
			bits, val := roundBF16(v)
			binary.LittleEndian.PutUint16(raw[2*i:], bits)
			exact[i] = val
		case kernels.F16:
			bits, val := roundF16(v)
			binary.LittleEndian.PutUint16(raw[2*i:], bits)
			exact[i] = val
		default:
			h.t.Fatalf("weights: %v is not a float dtype", dt)
		}
	}
	b := h.alloc(dt, len(data))
	if err := h.be.Upload(b, 0, raw); err != nil {
		h.t.Fatalf("Upload(%v): %v", dt, err)
	}
	return b, exact
}

// read returns n elements of b as float32. F32 buffers are downloaded; BF16,
// F16 and I32 buffers are widened on the device through Embedding (an I32
// buffer indexes a table holding 0, 1, 2, ...), so the suite needs no
// download path beyond DownloadF32 of F32 buffers.
func (h *harness) read(b kernels.Buffer, n int) []float32 {
	h.t.Helper()
	if b.DType() == kernels.I32 {
		return h.download(h.indexValues(b, n), n)
	}
	src := b
	if b.DType() != kernels.F32 {
		src = h.alloc(kernels.F32, n)
		h.be.Embedding(src, b, h.i32([]int32{0}), 1, n)
	}
	return h.download(src, n)
}

// indexValues maps the ids in b (each in [0, 1<<16)) to float32 values on the device.
func (h *harness) indexValues(b kernels.Buffer, n int) kernels.Buffer {
	const tableRows = 1 << 16
	table := make([]float32, tableRows)
	for i := range table {
		table[i] = float32(i)
	}
	out := h.alloc(kernels.F32, n)
	h.be.Embedding(out, h.f32(table), b, n, 1)
	return out
}

func (h *harness) download(b kernels.Buffer, n int) []float32 {
	h.t.Helper()
	if err := h.be.Sync(); err != nil {
		h.t.Fatalf("Sync: %v", err)
	}
	out := make([]float32, n)
	if err := h.be.DownloadF32(b, 0, out); err != nil {
		h.t.Fatalf("DownloadF32: %v", err)
	}
	return out
}

// normal returns n standard-normal float32 values times scale.
func (h *harness) normal(n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(h.rng.NormFloat64() * scale)
	}
	return out
}

// uniform returns n float32 values in [lo, hi).
func (h *harness) uniform(n int, lo, hi float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(lo + (hi-lo)*h.rng.Float64())
	}
	return out
}

// randomTree returns parents of a random tree over T nodes: parents[t] in [-1, t).
func (h *harness) randomTree(T int) []int32 {
	p := make([]int32, T)
	for t := range p {
		p[t] = int32(h.rng.IntN(t+1)) - 1
	}
	return p
}

// tolerance is the allowed error of one element: atol + rtol·scale, where
// scale is the element's magnitude or a norm chosen by the test.
type tolerance struct{ atol, rtol float64 }

// expectClose fails when |got[i]-want[i]| > atol + rtol·scale[i] (scale nil: |want[i]|).
func (h *harness) expectClose(what string, got []float32, want, scale []float64, tol tolerance) {
	h.t.Helper()
	if len(got) != len(want) {
		h.t.Fatalf("%s: got %d values, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range want {
		s := math.Abs(want[i])
		if scale != nil {
			s = scale[i]
		}
		diff := math.Abs(float64(got[i]) - want[i])
		if !(diff <= tol.atol+tol.rtol*s) { // also catches NaN
			if bad < 5 {
				h.t.Errorf("%s[%d] = %g, want %g (|Δ| %.3g > %.3g + %.3g·%.3g)", what, i, got[i], want[i], diff, tol.atol, tol.rtol, s)
			}
			bad++
		}
	}
	if bad > 5 {
		h.t.Errorf("%s: %d of %d values out of tolerance", what, bad, len(want))
	}
}

// expectEqual fails unless got and want are identical.
func (h *harness) expectEqual(what string, got, want []float32) {
	h.t.Helper()
	h.expectClose(what, got, widen(want), nil, tolerance{})
}

// widen converts float32 values to float64.
func widen(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// maxAbs is the largest magnitude in x (at least tiny, so it can scale a tolerance).
func maxAbs(x []float64) float64 {
	m := 1e-30
	for _, v := range x {
		m = max(m, math.Abs(v))
	}
	return m
}

// f32Unit is the unit roundoff of float32.
const f32Unit = 1.0 / (1 << 24)
