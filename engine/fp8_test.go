package engine

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ddflash/engine/safetensors"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

// TestLoadFP8Checkpoint loads testmodel's fp8 layout: exactly the linear
// layers outside modules_to_not_convert arrive as block-scaled FP8, holding
// the checkpoint's bytes and scales; everything else loads as in bf16.
func TestLoadFP8Checkpoint(t *testing.T) {
	dir := writeTiny(t, "fp8", 1)
	cfg := loadConfig(t, dir)
	if cfg.Quant == nil {
		t.Fatal("config.json of an fp8 test model has no quantization")
	}
	be := cpu.New(1)
	w, err := LoadWeights(be, dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	fp8 := 0
	for _, s := range expectedTensors(cfg, prefix, &Weights{Layers: make([]LayerWeights, cfg.NumLayers)}, shard{tp: 1}) {
		tensor, _ := ckpt.Tensor(s.Name)
		if !s.Quantized {
			if tensor.DType == "F8_E4M3" {
				t.Errorf("%s is F8_E4M3 but not loaded as FP8", s.Name)
			}
			continue
		}
		fp8++
		if tensor.DType != "F8_E4M3" {
			t.Errorf("%s: %s, expected as FP8", s.Name, tensor.DType)
		}
	}
	// 3 GDN layers × 3 projections + 1 attention layer × 4, plus 3 MLP matrices per layer.
	if want := 3*3 + 4 + 4*3; fp8 != want {
		t.Fatalf("%d FP8 matrices, want %d", fp8, want)
	}
	gate, ok := w.Layers[0].Gate.(*kernels.BlockScaled)
	if !ok {
		t.Fatalf("layer 0 gate_proj is a %T, want *kernels.BlockScaled", w.Layers[0].Gate)
	}
	if _, ok := w.Layers[0].InProjA.(*kernels.BlockScaled); ok {
		t.Fatal("in_proj_a (in modules_to_not_convert) loaded as FP8")
	}
	q, _ := ckpt.Tensor(prefix + "layers.0.mlp.gate_proj.weight")
	sc, _ := ckpt.Tensor(prefix + "layers.0.mlp.gate_proj.weight_scale_inv")
	wantScales, _ := sc.Float32s()
	wantValues, _ := q.Float32s()
	if got := download(t, be, gate.Q); !slices.Equal(got, wantValues) {
		t.Fatal("gate_proj values differ from the checkpoint's")
	}
	if got := download(t, be, gate.Scale); !slices.Equal(got, wantScales) {
		t.Fatalf("gate_proj scales %v, checkpoint %v", got, wantScales)
	}
}

func download(t *testing.T, be kernels.Backend, b kernels.Buffer) []float32 {
	t.Helper()
	out := make([]float32, b.Len())
	if err := be.DownloadF32(b, 0, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLoadFP8RejectsMismatches: every disagreement between the FP8
// checkpoint and its quantization_config names the tensor.
func TestLoadFP8RejectsMismatches(t *testing.T) {
	const gate = prefix + "layers.0.mlp.gate_proj.weight"
	const scale = gate + "_scale_inv"
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, dir string)
		want    []string
	}{
		{"scale missing", func(t *testing.T, dir string) { rewriteCheckpoint(t, dir, without(scale)) }, []string{scale, "missing"}},
		{"scale of the wrong shape", func(t *testing.T, dir string) {
			rewriteCheckpoint(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return append(without(scale)(ts), f32Tensor(scale, 2, 1))
			})
		}, []string{scale, "[2 1]", "[1, 1]"}},
		{"scale truncated", func(t *testing.T, dir string) {
			editHeader(t, filepath.Join(dir, safetensors.SingleFile), func(h map[string]any) {
				h[scale].(map[string]any)["shape"] = []int{1, 2}
			})
		}, []string{scale, "needs 8"}},
		{"scale of a wrong dtype", func(t *testing.T, dir string) {
			rewriteCheckpoint(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return append(without(scale)(ts), safetensors.Tensor{Name: scale, DType: "F8_E4M3", Shape: []int{1, 1}, Data: []byte{0x38}})
			})
		}, []string{scale, "F32 or BF16"}},
		{"quantised module listed in modules_to_not_convert", func(t *testing.T, dir string) {
			editConfig(t, dir, func(q map[string]any) {
				q["modules_to_not_convert"] = append(q["modules_to_not_convert"].([]any), strings.TrimSuffix(gate, ".weight"))
			})
		}, []string{gate, "F8_E4M3", "modules_to_not_convert"}},
		{"bf16 matrix the config quantises", func(t *testing.T, dir string) {
			editConfig(t, dir, func(q map[string]any) {
				q["modules_to_not_convert"] = []any{"lm_head"}
			})
		}, []string{prefix + "layers.0.linear_attn.in_proj_a.weight", "BF16", "modules_to_not_convert"}},
		{"no quantization_config", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "config.json")
			raw, _ := os.ReadFile(path)
			os.WriteFile(path, editJSON(t, raw, func(m map[string]any) { delete(m, "quantization_config") }), 0o644)
		}, []string{gate, "F8_E4M3", "no quantization_config"}},
		{"stray scale", func(t *testing.T, dir string) {
			rewriteCheckpoint(t, dir, with(f32Tensor(prefix+"layers.0.linear_attn.in_proj_a.weight_scale_inv", 1, 1)))
		}, []string{prefix + "layers.0.linear_attn.in_proj_a.weight_scale_inv", "block scales"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTiny(t, "fp8", 1)
			tc.corrupt(t, dir)
			_, err := Load(cpu.New(1), dir, Options{})
			if err == nil {
				t.Fatalf("loaded; want an error mentioning %q", tc.want)
			}
			for _, f := range tc.want {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("error %q does not mention %q", err, f)
				}
			}
		})
	}
}

// editConfig rewrites config.json's quantization_config through edit.
func editConfig(t *testing.T, dir string, edit func(q map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := editJSON(t, raw, func(m map[string]any) { edit(m["quantization_config"].(map[string]any)) })
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	var check map[string]any
	if err := json.Unmarshal(out, &check); err != nil {
		t.Fatal(err)
	}
}

// blocksPreset is tiny with widths that span several 128-wide scale blocks
// and end inside one (hidden 320, MLP 448, GDN value dim 192).
var blocksPreset = testmodel.Preset{
	Name: "fp8-blocks", Hidden: 320, Layers: 4, FullEvery: 4, Intermediate: 448,
	Heads: 4, KVHeads: 2, HeadDim: 64, PartialRotary: 0.25,
	LinearKeyHeads: 2, LinearValueHeads: 4, LinearHeadDim: 48, ConvKernel: 4,
	MaxPositions: 256, MaxMerges: 41, VocabSize: 320,
}

// TestFP8SpecGreedyIsLossless: with FP8 weights every spec mode is token
// for token autoregressive decoding (FP8 MatMul is batch-invariant).
func TestFP8SpecGreedyIsLossless(t *testing.T) {
	dir := writeFP8Model(t, blocksPreset, 4)
	rng := rand.New(rand.NewPCG(8, 9))
	const ctxLen = 96
	req := Request{Prompt: randomTokens(rng, 6, 290), MaxTokens: 40}
	want, err := loadTP(t, dir, 1, Options{Context: ctxLen}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []specCase{{SpecLinear, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}, {SpecTree, 32, mamba.Replay}} {
		e := loadTP(t, dir, 1, Options{Context: ctxLen, PageSize: 4, VerifyTokens: 33})
		e.Spec = SpecOptions{Mode: c.mode, Budget: c.budget, Rollback: c.rollback}
		e.Drafter = pathDrafter(e, concat(req.Prompt, want.Tokens))
		got, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("%v: FP8 spec output differs from autoregressive\n got %v\nwant %v", c, got.Tokens, want.Tokens)
		}
		if got.Stats.AcceptanceLength <= 1.5 {
			t.Fatalf("%v: τ %.2f: oracle drafts were hardly accepted", c, got.Stats.AcceptanceLength)
		}
	}
}

// tpBlocksPreset splits over two ranks into 128-aligned shards: every
// rank holds whole 128×128 scale blocks of every FP8 matrix.
var tpBlocksPreset = testmodel.Preset{
	Name: "fp8-tp2", Hidden: 256, Layers: 4, FullEvery: 4, Intermediate: 512,
	Heads: 4, KVHeads: 4, HeadDim: 64, PartialRotary: 0.25,
	LinearKeyHeads: 2, LinearValueHeads: 4, LinearHeadDim: 128, ConvKernel: 4,
	MaxPositions: 256, MaxMerges: 41, VocabSize: 320,
}

// TestFP8TensorParallel: FP8 weights and their scales split on the same
// block boundaries, so two ranks decode exactly what one does (greedy); a
// split inside a scale block is refused, naming the tensor.
func TestFP8TensorParallel(t *testing.T) {
	dir := writeFP8Model(t, tpBlocksPreset, 6)
	req := Request{Prompt: randomTokens(rand.New(rand.NewPCG(2, 3)), 7, 290), MaxTokens: 32}
	want, err := loadTP(t, dir, 1, Options{Context: 64}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := loadTP(t, dir, 2, Options{Context: 64}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Tokens, want.Tokens) {
		t.Fatalf("TP 2 output differs from one rank\n got %v\nwant %v", got.Tokens, want.Tokens)
	}

	unaligned := writeFP8Model(t, blocksPreset, 6)
	_, err = LoadParallel([]kernels.Backend{cpu.New(1), cpu.New(1)}, unaligned, Options{Context: 64})
	if err == nil || !strings.Contains(err.Error(), "mlp.gate_proj.weight") || !strings.Contains(err.Error(), "scale blocks") {
		t.Fatalf("TP 2 over 224-row MLP shards: error %v, want a refusal naming the tensor and the scale blocks", err)
	}
}

// writeFP8Model writes the preset in the FP8 layout and returns its directory.
func writeFP8Model(t *testing.T, p testmodel.Preset, seed uint64) string {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: seed, DType: "fp8"}); err != nil {
		t.Fatal(err)
	}
	return dir
}
