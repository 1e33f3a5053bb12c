package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"ddflash/internal/closeness"
	"ddflash/kernels/cpu"
)

// golden is engine/testdata/golden-tiny/golden.json, written by
// tools/reference/make_golden.py from an independent float64 PyTorch forward.
type golden struct {
	Sequences []struct {
		IDs    []int32       `json:"ids"`
		Logits [][]float64   `json:"logits"` // [position][vocab]
		Hidden [][][]float64 `json:"hidden"` // [layer][position][hidden]
	} `json:"sequences"`
}

// TestGoldenLogits runs the committed BF16 tiny checkpoint and compares every
// position's logits and every layer's output with the float64 reference.
// The engine keeps activations in F32 and widens BF16 weights exactly, so
// the only difference is F32 rounding: bound 1e-4 relative to the values' scale.
func TestGoldenLogits(t *testing.T) { checkGolden(t, "testdata/golden-tiny") }

// TestGoldenLogitsFP8 runs golden-tiny in Qwen's FP8 layout (its linear
// layers block-quantised from the bf16 weights) against the float64
// reference on the dequantised weights, within the bf16 golden's bound:
// the engine widens each FP8 weight to the float32 of its dequantised
// value, one rounding of 2^-24 relative.
func TestGoldenLogitsFP8(t *testing.T) { checkGolden(t, "testdata/golden-tiny-fp8") }

// checkGolden compares the checkpoint in dir with its golden.json.
func checkGolden(t *testing.T, dir string) {
	t.Helper()
	g := readGolden(t, dir)
	e, err := Load(cpu.New(2), dir, Options{PageSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	layers := make([]int, e.Model.Cfg.NumLayers)
	for i := range layers {
		layers[i] = i
	}
	for si, seq := range g.Sequences {
		s, err := e.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Model.KV.Reserve(&s.kv, len(seq.IDs)); err != nil {
			t.Fatal(err)
		}
		out, err := e.Model.Forward([]SeqInput{{Tokens: seq.IDs, KV: &s.kv, Slot: s.slot, Logits: AllRows}}, layers)
		if err != nil {
			t.Fatal(err)
		}
		V, H := e.Model.Cfg.VocabSize, e.Model.Cfg.HiddenSize
		var flatLogits []float64
		for _, row := range seq.Logits {
			flatLogits = append(flatLogits, row...)
		}
		if d, scale := relDiff(out[0].Logits, flatLogits); d > 1e-4*scale {
			t.Errorf("sequence %d: logits differ by %g (scale %g)", si, d, scale)
		} else {
			t.Logf("sequence %d (%d tokens): max logit difference %.2e at scale %.2f", si, len(seq.IDs), d, scale)
		}
		if len(out[0].Logits) != len(seq.IDs)*V {
			t.Fatalf("sequence %d: %d logits, want %d", si, len(out[0].Logits), len(seq.IDs)*V)
		}
		if len(out[0].Features) != len(seq.IDs)*len(layers)*H {
			t.Fatalf("sequence %d: %d feature values, want %d rows of %d layers' hidden states", si, len(out[0].Features), len(seq.IDs), len(layers))
		}
		for l, hid := range seq.Hidden {
			var flat []float64
			for _, row := range hid {
				flat = append(flat, row...)
			}
			if len(flat) != len(seq.IDs)*H {
				t.Fatalf("golden hidden layer %d has %d values", l, len(flat))
			}
			// Layer l's hidden states, row by row out of the features' [rows, layers, hidden].
			got := make([]float32, 0, len(flat))
			for r := range seq.IDs {
				at := (r*len(layers) + l) * H
				got = append(got, out[0].Features[at:at+H]...)
			}
			if d, scale := relDiff(got, flat); d > 1e-4*scale {
				t.Errorf("sequence %d layer %d: hidden states differ by %g (scale %g)", si, l, d, scale)
			}
		}
		e.release(s)
	}
}

// TestGoldenYaRN runs golden-tiny's weights with the YaRN config of
// testdata/golden-yarn (a legacy rope_scaling block; see
// tools/reference/make_yarn_golden.py) and compares every position's logits
// with the float64 reference, which computes YaRN on its own.
func TestGoldenYaRN(t *testing.T) {
	g := readGolden(t, "testdata/golden-yarn")
	dir := t.TempDir()
	for _, f := range []struct{ from, to string }{
		{"testdata/golden-yarn/config.json", "config.json"},
		{"testdata/golden-tiny/model.safetensors", "model.safetensors"},
	} {
		abs, err := filepath.Abs(f.from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dir, f.to)); err != nil {
			t.Fatal(err)
		}
	}
	e, err := Load(cpu.New(2), dir, Options{PageSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if y := e.Model.Cfg.YaRN; y == nil || y.Factor != 4 || e.Model.Cfg.RopeTheta != 100 {
		t.Fatalf("config read as YaRN %+v, theta %g", y, e.Model.Cfg.RopeTheta)
	}
	for si, seq := range g.Sequences {
		s, err := e.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.forward(s, SeqInput{Tokens: seq.IDs, Logits: AllRows}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Concat(seq.Logits...)
		if d, scale := relDiff(out.Logits, want); d > 1e-4*scale {
			t.Errorf("sequence %d: logits differ by %g (scale %g)", si, d, scale)
		} else {
			t.Logf("sequence %d (%d tokens): max logit difference %.2e at scale %.2f", si, len(seq.IDs), d, scale)
		}
		e.release(s)
	}
}

// readGolden reads DIR/golden.json.
func readGolden(t *testing.T, dir string) golden {
	t.Helper()
	data, err := os.ReadFile(dir + "/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Sequences) == 0 {
		t.Fatalf("%s/golden.json has no sequences", dir)
	}
	return g
}

// relDiff returns the largest absolute difference (+Inf on NaN or Inf) and
// max(1, largest |want|).
func relDiff(got []float32, want []float64) (float64, float64) {
	return closeness.MaxAbsDiff(got, want), closeness.Scale(want)
}
