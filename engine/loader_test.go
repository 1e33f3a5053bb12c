package engine

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ddflash/engine/config"
	"ddflash/engine/safetensors"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
)

// recordingBackend keeps uploaded bytes so tests can compare them with the
// checkpoint. Only the memory methods are implemented; any op panics.
type recordingBackend struct {
	kernels.Backend
	allocs, freed int
	uploads       int
	failUpload    int // when > 0, the failUpload-th upload fails (a full device)
}

type hostBuffer struct {
	dt   kernels.DType
	data []byte
}

func (h *hostBuffer) DType() kernels.DType { return h.dt }
func (h *hostBuffer) Len() int             { return len(h.data) / h.dt.Size() }

func (r *recordingBackend) Name() string { return "recording" }

func (r *recordingBackend) Alloc(dt kernels.DType, n int) (kernels.Buffer, error) {
	r.allocs++
	return &hostBuffer{dt: dt, data: make([]byte, n*dt.Size())}, nil
}

func (r *recordingBackend) Free(kernels.Buffer) { r.freed++ }

func (r *recordingBackend) upload() error {
	r.uploads++
	if r.uploads == r.failUpload {
		return errors.New("device out of memory")
	}
	return nil
}

func (r *recordingBackend) Upload(b kernels.Buffer, off int, src []byte) error {
	if err := r.upload(); err != nil {
		return err
	}
	h := b.(*hostBuffer)
	copy(h.data[off*h.dt.Size():], src)
	return nil
}

func (r *recordingBackend) UploadF32(b kernels.Buffer, off int, src []float32) error {
	if err := r.upload(); err != nil {
		return err
	}
	h := b.(*hostBuffer)
	for i, v := range src {
		binary.LittleEndian.PutUint32(h.data[4*(off+i):], math.Float32bits(v))
	}
	return nil
}

func writeTiny(t *testing.T, dtype string, shards int) string {
	t.Helper()
	dir := t.TempDir()
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 7, DType: dtype, Shards: shards}); err != nil {
		t.Fatalf("write tiny model: %v", err)
	}
	return dir
}

func loadConfig(t *testing.T, dir string) *config.Config {
	t.Helper()
	cfg, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// f32Values decodes a checkpoint tensor to float32 by hand (F32 or BF16).
func f32Values(t *testing.T, tensor safetensors.Tensor) []float32 {
	t.Helper()
	switch tensor.DType {
	case "F32":
		out := make([]float32, len(tensor.Data)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(tensor.Data[4*i:]))
		}
		return out
	case "BF16":
		out := make([]float32, len(tensor.Data)/2)
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(tensor.Data[2*i:])) << 16)
		}
		return out
	}
	t.Fatalf("tensor %s: unexpected dtype %s", tensor.Name, tensor.DType)
	return nil
}

func hostF32(t *testing.T, b kernels.Buffer) []float32 {
	t.Helper()
	h := b.(*hostBuffer)
	if h.dt != kernels.F32 {
		t.Fatalf("buffer dtype %v, want F32", h.dt)
	}
	out := make([]float32, len(h.data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(h.data[4*i:]))
	}
	return out
}

func TestLoadWeightsTinyModel(t *testing.T) {
	for _, tc := range []struct {
		dtype  string
		shards int
		wantDT kernels.DType
	}{
		{"f32", 1, kernels.F32},
		{"bf16", 1, kernels.BF16},
		{"f32", 3, kernels.F32},
		{"bf16", 4, kernels.BF16},
	} {
		t.Run(fmt.Sprintf("%s/%d-shards", tc.dtype, tc.shards), func(t *testing.T) {
			dir := writeTiny(t, tc.dtype, tc.shards)
			cfg := loadConfig(t, dir)
			be := &recordingBackend{}
			w, err := LoadWeights(be, dir, cfg)
			if err != nil {
				t.Fatalf("LoadWeights: %v", err)
			}
			ckpt, err := safetensors.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ckpt.Close()
			if be.allocs != len(ckpt.Names()) {
				t.Errorf("allocated %d buffers for %d checkpoint tensors", be.allocs, len(ckpt.Names()))
			}
			get := func(name string) safetensors.Tensor {
				tensor, ok := ckpt.Tensor("model.language_model." + name)
				if !ok {
					tensor, ok = ckpt.Tensor(name)
				}
				if !ok {
					t.Fatalf("checkpoint lacks %s", name)
				}
				return tensor
			}
			// Matrices keep the checkpoint's bytes and dtype.
			matrices := map[string]kernels.Buffer{
				"embed_tokens.weight":                     w.Embed,
				"lm_head.weight":                          w.LMHead,
				"layers.3.self_attn.q_proj.weight":        w.Layers[3].QProj,
				"layers.3.self_attn.o_proj.weight":        w.Layers[3].OProj,
				"layers.0.linear_attn.in_proj_qkv.weight": w.Layers[0].InProjQKV,
				"layers.2.linear_attn.out_proj.weight":    w.Layers[2].OutProj,
				"layers.1.mlp.down_proj.weight":           w.Layers[1].Down,
			}
			for name, buf := range matrices {
				h := buf.(*hostBuffer)
				if h.dt != tc.wantDT || !slices.Equal(h.data, get(name).Data) {
					t.Errorf("%s: uploaded %v data differs from the checkpoint's %s", name, h.dt, get(name).DType)
				}
			}
			// Norms, conv and gate parameters are converted to F32 exactly.
			vectors := map[string]kernels.Buffer{
				"norm.weight":                              w.FinalNorm,
				"layers.3.self_attn.k_norm.weight":         w.Layers[3].KNorm,
				"layers.1.input_layernorm.weight":          w.Layers[1].InputNorm,
				"layers.1.linear_attn.conv1d.weight":       w.Layers[1].Conv,
				"layers.1.linear_attn.A_log":               w.Layers[1].ALog,
				"layers.2.linear_attn.dt_bias":             w.Layers[2].DtBias,
				"layers.0.linear_attn.norm.weight":         w.Layers[0].Norm,
				"layers.0.post_attention_layernorm.weight": w.Layers[0].PostNorm,
			}
			for name, buf := range vectors {
				if got, want := hostF32(t, buf), f32Values(t, get(name)); !slices.Equal(got, want) {
					t.Errorf("%s: uploaded F32 values differ from the checkpoint", name)
				}
			}
			if w.Layers[1].Conv.Len() != cfg.ConvDim()*cfg.ConvKernel {
				t.Errorf("conv buffer has %d elements, want %d", w.Layers[1].Conv.Len(), cfg.ConvDim()*cfg.ConvKernel)
			}
			for i, l := range w.Layers {
				full := l.QProj != nil && l.KProj != nil && l.VProj != nil && l.OProj != nil && l.QNorm != nil && l.KNorm != nil
				linear := l.InProjQKV != nil && l.InProjZ != nil && l.InProjA != nil && l.InProjB != nil &&
					l.Conv != nil && l.DtBias != nil && l.ALog != nil && l.Norm != nil && l.OutProj != nil
				if l.Kind != cfg.Layers[i] || (l.Kind == config.Full && !full) || (l.Kind == config.Linear && !linear) {
					t.Errorf("layer %d (%v): mixer buffers not all set", i, l.Kind)
				}
			}
		})
	}
}

// rewriteCheckpoint replaces the checkpoint in dir by edit(tensors), written
// as one model.safetensors.
func rewriteCheckpoint(t *testing.T, dir string, edit func([]safetensors.Tensor) []safetensors.Tensor) {
	t.Helper()
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var tensors []safetensors.Tensor
	for _, name := range ckpt.Names() {
		tensor, _ := ckpt.Tensor(name)
		tensor.Data = slices.Clone(tensor.Data)
		tensors = append(tensors, tensor)
	}
	ckpt.Close()
	old, _ := filepath.Glob(filepath.Join(dir, "model*.safetensors*"))
	for _, f := range old {
		os.Remove(f)
	}
	if err := safetensors.WriteCheckpoint(dir, edit(tensors), 1, nil); err != nil {
		t.Fatal(err)
	}
}

func without(names ...string) func([]safetensors.Tensor) []safetensors.Tensor {
	return func(ts []safetensors.Tensor) []safetensors.Tensor {
		return slices.DeleteFunc(ts, func(t safetensors.Tensor) bool { return slices.Contains(names, t.Name) })
	}
}

func with(extra ...safetensors.Tensor) func([]safetensors.Tensor) []safetensors.Tensor {
	return func(ts []safetensors.Tensor) []safetensors.Tensor { return append(ts, extra...) }
}

func f32Tensor(name string, shape ...int) safetensors.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return safetensors.Tensor{Name: name, DType: "F32", Shape: shape, Data: make([]byte, 4*n)}
}

// editJSON rewrites a JSON object file (config.json, the index or a
// safetensors header) through edit.
func editJSON(t *testing.T, raw []byte, edit func(map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// editHeader rewrites the JSON header of the safetensors file at path, keeping its data.
func editHeader(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	header := editJSON(t, raw[8:8+n], edit)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(append(out, header...), raw[8+n:]...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

const prefix = "model.language_model."

// TestLoadWeightsRejectsMismatches checks that each problem is reported with
// the file and tensor it concerns, before any buffer is allocated.
func TestLoadWeightsRejectsMismatches(t *testing.T) {
	shard1 := safetensors.ShardName(0, 3)
	for _, tc := range []struct {
		name    string
		shards  int
		corrupt func(t *testing.T, dir string)
		want    []string // fragments besides the ones corrupt returns through the directory
	}{
		{
			name: "missing tensor",
			corrupt: func(t *testing.T, dir string) {
				rewriteCheckpoint(t, dir, without(prefix+"layers.1.linear_attn.A_log"))
			},
			want: []string{prefix + "layers.1.linear_attn.A_log", "missing from checkpoint"},
		},
		{
			name: "every problem at once",
			corrupt: func(t *testing.T, dir string) {
				rewriteCheckpoint(t, dir, without(prefix+"layers.0.mlp.up_proj.weight", prefix+"layers.3.self_attn.k_norm.weight"))
			},
			want: []string{prefix + "layers.0.mlp.up_proj.weight", prefix + "layers.3.self_attn.k_norm.weight"},
		},
		{
			name: "wrong shape",
			corrupt: func(t *testing.T, dir string) {
				rewriteCheckpoint(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
					for i := range ts {
						if ts[i].Name == prefix+"layers.2.mlp.down_proj.weight" {
							ts[i].Shape = []int{128, 64} // transposed
						}
					}
					return ts
				})
			},
			want: []string{safetensors.SingleFile, prefix + "layers.2.mlp.down_proj.weight", "[128 64]", "[64 128]"},
		},
		{
			name: "tensor the config does not describe",
			corrupt: func(t *testing.T, dir string) {
				rewriteCheckpoint(t, dir, with(f32Tensor(prefix+"layers.4.input_layernorm.weight", 64)))
			},
			want: []string{safetensors.SingleFile, prefix + "layers.4.input_layernorm.weight", "not part of the model"},
		},
		{
			name:    "untied config without lm_head",
			corrupt: func(t *testing.T, dir string) { rewriteCheckpoint(t, dir, without("lm_head.weight")) },
			want:    []string{"lm_head.weight", "missing"},
		},
		{
			name:   "truncated shard",
			shards: 3,
			corrupt: func(t *testing.T, dir string) {
				path := filepath.Join(dir, shard1)
				st, _ := os.Stat(path)
				os.Truncate(path, st.Size()-2)
			},
			want: []string{shard1, "tensor ", "truncated"},
		},
		{
			name:   "index names a missing shard",
			shards: 3,
			corrupt: func(t *testing.T, dir string) {
				path := filepath.Join(dir, safetensors.IndexFile)
				raw, _ := os.ReadFile(path)
				os.WriteFile(path, editJSON(t, raw, func(m map[string]any) {
					m["weight_map"].(map[string]any)["lm_head.weight"] = "model-00004-of-00003.safetensors"
				}), 0o644)
			},
			want: []string{"lm_head.weight", "model-00004-of-00003.safetensors"},
		},
		{
			name:   "unknown dtype",
			shards: 3,
			corrupt: func(t *testing.T, dir string) {
				editHeader(t, filepath.Join(dir, shard1), func(h map[string]any) {
					h[prefix+"embed_tokens.weight"].(map[string]any)["dtype"] = "F8_E4M3"
				})
			},
			want: []string{shard1, prefix + "embed_tokens.weight", "F8_E4M3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTiny(t, "bf16", tc.shards)
			cfg := loadConfig(t, dir)
			tc.corrupt(t, dir)
			be := &recordingBackend{}
			_, err := LoadWeights(be, dir, cfg)
			if err == nil {
				t.Fatal("LoadWeights succeeded")
			}
			t.Log(err)
			for _, f := range append(tc.want, dir) {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("error does not mention %q:\n%v", f, err)
				}
			}
			if be.allocs != 0 {
				t.Errorf("%d buffers allocated before the error", be.allocs)
			}
		})
	}
}

func TestLoadWeightsLayouts(t *testing.T) {
	t.Run("text-only prefix model.", func(t *testing.T) {
		dir := writeTiny(t, "f32", 1)
		rewriteCheckpoint(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				ts[i].Name = strings.Replace(ts[i].Name, prefix, "model.", 1)
			}
			return ts
		})
		if _, err := LoadWeights(&recordingBackend{}, dir, loadConfig(t, dir)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("vision tower and MTP are skipped", func(t *testing.T) {
		dir := writeTiny(t, "f32", 1)
		rewriteCheckpoint(t, dir, with(f32Tensor("model.visual.patch_embed.proj.weight", 8, 4), f32Tensor("mtp.norm.weight", 64)))
		be := &recordingBackend{}
		if _, err := LoadWeights(be, dir, loadConfig(t, dir)); err != nil {
			t.Fatal(err)
		}
		ckpt, _ := safetensors.Open(dir)
		defer ckpt.Close()
		if be.allocs != len(ckpt.Names())-2 {
			t.Errorf("allocated %d buffers for %d text tensors", be.allocs, len(ckpt.Names())-2)
		}
	})
	t.Run("tied embeddings", func(t *testing.T) {
		dir := writeTiny(t, "f32", 1)
		rewriteCheckpoint(t, dir, without("lm_head.weight"))
		path := filepath.Join(dir, "config.json")
		raw, _ := os.ReadFile(path)
		os.WriteFile(path, editJSON(t, raw, func(m map[string]any) { m["tie_word_embeddings"] = true }), 0o644)
		w, err := LoadWeights(&recordingBackend{}, dir, loadConfig(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		if w.LMHead != w.Embed {
			t.Error("tied config: LMHead is not the embedding")
		}
	})
}

// TestLoadWeightsFreesOnUploadFailure: a failed upload releases every buffer
// allocated so far and names the tensor.
func TestLoadWeightsFreesOnUploadFailure(t *testing.T) {
	dir := writeTiny(t, "f32", 1)
	be := &recordingBackend{failUpload: 5}
	_, err := LoadWeights(be, dir, loadConfig(t, dir))
	if err == nil || !strings.Contains(err.Error(), "out of memory") || !strings.Contains(err.Error(), "from "+filepath.Join(dir, safetensors.SingleFile)) {
		t.Fatalf("err = %v, want the upload failure with the file named", err)
	}
	if be.allocs != 5 || be.freed != 5 {
		t.Errorf("allocated %d and freed %d buffers, want 5 and 5", be.allocs, be.freed)
	}
}
