package fp8_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"ddflash/engine/config"
	"ddflash/engine/fp8"
	"ddflash/engine/safetensors"
	"ddflash/engine/testmodel"
	"ddflash/internal/half"
	"ddflash/kernels"
)

// TestQuantizeBlocks: each 128×128 block's scale is its absmax / 448, its
// largest value maps to ±448, and every value is the nearest E4M3 multiple
// of the scale (within half a step of the format at that magnitude).
func TestQuantizeBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rows, cols := 200, 300
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()))
	}
	for i := range 128 { // an all-zero block edge row keeps a positive scale
		w[i] = 0
	}
	q, scales := fp8.QuantizeBlocks(w, rows, cols)
	br, bc := kernels.ScaleBlocks(rows, cols)
	if len(scales) != br*bc || br != 2 || bc != 3 {
		t.Fatalf("%d scales for blocks %d×%d", len(scales), br, bc)
	}
	absmax := make([]float32, br*bc)
	for i, v := range w {
		b := (i/cols/128)*bc + (i%cols)/128
		absmax[b] = max(absmax[b], float32(math.Abs(float64(v))))
	}
	for b, s := range scales {
		if s != max(absmax[b]/448, 1e-12) {
			t.Errorf("block %d: scale %g, absmax/448 = %g", b, s, absmax[b]/448)
		}
	}
	for i, v := range w {
		s := scales[(i/cols/128)*bc+(i%cols)/128]
		got := half.E4M3ToFloat32(q[i])
		if half.Float32ToE4M3(v/s) != q[i] || math.IsNaN(float64(got)) || math.Abs(float64(got)) > 448 {
			t.Fatalf("w[%d] = %g: byte %#x (%g·scale), not the nearest E4M3 of %g", i, v, q[i], got, v/s)
		}
	}
}

// TestQuantizeCheckpoint: quantising a bf16 test model gives exactly the
// tensors of the fp8 test model of the same seed (which quantises the
// same bf16 weights), a config whose quantization parses, and the other
// files copied.
func TestQuantizeCheckpoint(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	bf16, fp8Dir, out := filepath.Join(root, "bf16"), filepath.Join(root, "fp8"), filepath.Join(root, "out")
	for dir, dt := range map[string]string{bf16: "bf16", fp8Dir: "fp8"} {
		if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 3, DType: dt, Shards: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fp8.QuantizeCheckpoint(bf16, out); err != nil {
		t.Fatal(err)
	}
	if err := fp8.QuantizeCheckpoint(out, filepath.Join(root, "again")); err == nil {
		t.Error("quantised an FP8 checkpoint again")
	}
	cfg, err := config.Load(out)
	if err != nil || cfg.Quant == nil {
		t.Fatalf("config.json of the output: %v, quantization %v", err, cfg)
	}
	want, err := safetensors.Open(fp8Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	got, err := safetensors.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if len(got.Names()) != len(want.Names()) {
		t.Fatalf("%d tensors, the fp8 test model has %d", len(got.Names()), len(want.Names()))
	}
	for _, name := range want.Names() {
		w, _ := want.Tensor(name)
		g, ok := got.Tensor(name)
		if !ok || g.DType != w.DType || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("tensor %s differs from the fp8 test model's", name)
		}
	}
	for _, f := range []string{"tokenizer.json", "generation_config.json"} {
		a, _ := os.ReadFile(filepath.Join(bf16, f))
		b, err := os.ReadFile(filepath.Join(out, f))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s not copied: %v", f, err)
		}
	}
}
