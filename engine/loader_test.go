package engine

import (
	"encoding/binary"
	"math"
	"slices"
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
	allocs int
	freed  int
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

func (r *recordingBackend) Upload(b kernels.Buffer, off int, src []byte) error {
	h := b.(*hostBuffer)
	copy(h.data[off*h.dt.Size():], src)
	return nil
}

func (r *recordingBackend) UploadF32(b kernels.Buffer, off int, src []float32) error {
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
		t.Run(tc.dtype+"/"+string(rune('0'+tc.shards)), func(t *testing.T) {
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
