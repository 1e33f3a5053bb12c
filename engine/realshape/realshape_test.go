// Package realshape tests the engine at Qwen3.6-27B's own shapes: the
// qwen36-shapes test preset (hidden 5120, 24×256 gated attention heads over
// 4 KV heads, GDN 16 key / 48 value heads × 128, MLP 17,408, vocabulary
// 248,320; one GDN and one attention layer). Its checkpoint is 6.6 GB, so it
// is regenerated from its seed rather than committed, and the test has this
// package to itself: it runs the checkpoint on the CPU backend and on the
// CUDA backend's CPU emulation, one after the other.
package realshape

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/internal/closeness"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// shapesGolden is testdata/qwen36-shapes.json, written by
// tools/reference/make_shapes_golden.py from the float64 reference.
type shapesGolden struct {
	SHA256    string      `json:"model_safetensors_sha256"`
	IDs       []int32     `json:"ids"`
	Columns   []int       `json:"columns"`
	Logits    [][]float64 `json:"logits"` // [position][column]
	LogSumExp []float64   `json:"logsumexp"`
	Argmax    []int       `json:"argmax"`
	Max       []float64   `json:"max"`
}

// backend is a backend TestQwen36Shapes runs the golden sequence on.
type backend struct {
	name string
	open func(t *testing.T) kernels.Backend
}

// backends: the CPU backend here, the CUDA backend on its CPU emulation
// where cgo builds it (emulated_test.go).
var backends = []backend{{"cpu", func(*testing.T) kernels.Backend { return cpu.New(0) }}}

// TestQwen36Shapes regenerates the bf16 qwen36-shapes checkpoint from seed
// 1, checks that it is byte for byte the one the reference read (SHA-256),
// and on each backend runs the sequence in one forward and compares, at
// every position, the sampled logits, the log-sum-exp over the whole
// vocabulary and the argmax with the float64 reference. Bound as in the
// tiny golden test: F32 activations against float64 with the same bf16
// weights, 1e-4 of the values' scale.
func TestQwen36Shapes(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and runs a 6.6 GB checkpoint (minutes on 2 cores)")
	}
	var g shapesGolden
	data, err := os.ReadFile("testdata/qwen36-shapes.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	p, err := testmodel.PresetByName("qwen36-shapes")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: "bf16"}); err != nil {
		t.Fatal(err)
	}
	releaseMemory() // the written tensors, before the loader copies the file
	if sum := fileSHA256(t, filepath.Join(dir, "model.safetensors")); sum != g.SHA256 {
		t.Fatalf("regenerated checkpoint has SHA-256 %s, the reference read %s: testmodel's output changed; rerun tools/reference/make_shapes_golden.py", sum, g.SHA256)
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			checkGolden(t, b.open(t), dir, &g)
			releaseMemory() // one backend's weights at a time
		})
	}
}

// checkGolden loads the checkpoint in dir on be, runs g's sequence in one
// forward and compares every position with g.
func checkGolden(t *testing.T, be kernels.Backend, dir string, g *shapesGolden) {
	e, err := engine.Load(be, dir, engine.Options{PageSize: 16, Context: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// The real tokenizer's ids fill all but 243 of the 248,320 LM-head rows;
	// this checkpoint's test tokenizer uses a few hundred, and the rest
	// would be padding the engine never scores. Score every row, as the
	// golden does, so the head runs at its real size.
	e.Model.ValidVocab = e.Model.Cfg.VocabSize
	slot, err := e.Model.States.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	var kv engine.SeqKV
	if err := e.Model.KV.Reserve(&kv, len(g.IDs)); err != nil {
		t.Fatal(err)
	}
	out, err := e.Model.Forward([]engine.SeqInput{{Tokens: g.IDs, KV: &kv, Slot: slot, Logits: engine.AllRows}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	V := e.Model.Cfg.VocabSize
	if len(out[0].Logits) != len(g.IDs)*V || len(g.Logits) != len(g.IDs) {
		t.Fatalf("%d logits for %d positions of %d; golden has %d rows", len(out[0].Logits), len(g.IDs), V, len(g.Logits))
	}
	for pos, want := range g.Logits {
		row := out[0].Logits[pos*V : (pos+1)*V]
		got := make([]float32, len(g.Columns))
		for i, c := range g.Columns {
			got[i] = row[c]
		}
		scale := closeness.Scale(want)
		d := closeness.MaxAbsDiff(got, want)
		lse := closeness.MaxAbsDiff([]float64{logSumExp(row)}, []float64{g.LogSumExp[pos]})
		best := argmax(row)
		if d > 1e-4*scale || lse > 1e-4*scale || best != g.Argmax[pos] && !closeness.Near(float64(row[best]), g.Max[pos], 1e-4*scale) {
			t.Errorf("position %d: sampled logits differ by %.3g, log-sum-exp by %.3g (scale %.3g); argmax %d, reference %d",
				pos, d, lse, scale, best, g.Argmax[pos])
		} else {
			t.Logf("position %d: max |Δ logit| %.2e, |Δ log-sum-exp| %.2e at scale %.1f", pos, d, lse, scale)
		}
	}
}

// releaseMemory returns the Go heap's free memory to the OS, so that the
// test's peak stays near one copy of the checkpoint.
func releaseMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// logSumExp is log Σ exp(v) in float64; NaN if any value is.
func logSumExp(v []float32) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = max(m, float64(x))
	}
	sum := 0.0
	for _, x := range v {
		sum += math.Exp(float64(x) - m)
	}
	return m + math.Log(sum)
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
