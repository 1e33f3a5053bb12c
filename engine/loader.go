package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"ddflash/engine/config"
	"ddflash/engine/safetensors"
	"ddflash/kernels"
)

// Text-model tensor prefixes: multimodal checkpoints (Qwen3_5ForConditionalGeneration)
// nest the text model under model.language_model., text-only ones under model..
var textPrefixes = []string{"model.language_model.", "model."}

// Tensors outside the text model that a text-only engine does not load.
var skippedPrefixes = []string{"model.visual.", "mtp."}

// maxReported caps how many checkpoint problems one error lists.
const maxReported = 20

// TensorSpec is one tensor a model requires and where it goes.
type TensorSpec struct {
	Name  string
	Shape []int
	ToF32 bool // convert to F32 on upload (norms, conv kernel, GDN gate parameters)
	Dst   *kernels.Buffer
}

// LoadWeights uploads the text model of the checkpoint in dir to b. Every
// required tensor is checked for presence, dtype and shape before anything is
// allocated. Matrices keep their checkpoint dtype; norm weights, the conv
// kernel, A_log and dt_bias become F32.
func LoadWeights(b kernels.Backend, dir string, cfg *config.Config) (*Weights, error) {
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ckpt.Close()

	prefix, err := detectPrefix(ckpt)
	if err != nil {
		return nil, err
	}
	w := &Weights{Layers: make([]LayerWeights, cfg.NumLayers)}
	if err := LoadTensors(b, ckpt, expectedTensors(cfg, prefix, w), prefix); err != nil {
		return nil, err
	}
	if cfg.TieWordEmbeddings {
		w.LMHead = w.Embed
	}
	return w, nil
}

// LoadTensors checks every spec against the checkpoint (presence, dtype,
// shape; tensors under prefix that no spec names are reported too), then
// uploads each tensor to b and stores the buffer in its spec's Dst.
func LoadTensors(b kernels.Backend, ckpt *safetensors.Checkpoint, specs []TensorSpec, prefix string) error {
	if err := checkTensors(ckpt, specs, prefix); err != nil {
		return err
	}
	var loaded []kernels.Buffer
	for _, s := range specs {
		t, _ := ckpt.Tensor(s.Name)
		buf, err := upload(b, t, s.ToF32)
		if err != nil {
			for _, l := range loaded {
				b.Free(l)
			}
			return fmt.Errorf("load %s from %s: %w", s.Name, t.File, err)
		}
		loaded = append(loaded, buf)
		*s.Dst = buf
	}
	return nil
}

func detectPrefix(ckpt *safetensors.Checkpoint) (string, error) {
	for _, p := range textPrefixes {
		if _, ok := ckpt.Tensor(p + "embed_tokens.weight"); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("checkpoint %s: no embed_tokens.weight under %s (is this a Qwen3.5/3.6 text checkpoint?)",
		ckpt.Dir, strings.Join(textPrefixes, " or "))
}

// expectedTensors lists every tensor cfg requires (qwen36-model.md §7), each
// pointing at its field of w.
func expectedTensors(cfg *config.Config, prefix string, w *Weights) []TensorSpec {
	h := cfg.HiddenSize
	specs := []TensorSpec{
		{Name: prefix + "embed_tokens.weight", Shape: []int{cfg.VocabSize, h}, Dst: &w.Embed},
		{Name: prefix + "norm.weight", Shape: []int{h}, ToF32: true, Dst: &w.FinalNorm},
	}
	if !cfg.TieWordEmbeddings {
		specs = append(specs, TensorSpec{Name: "lm_head.weight", Shape: []int{cfg.VocabSize, h}, Dst: &w.LMHead})
	}
	for i, kind := range cfg.Layers {
		l := &w.Layers[i]
		l.Kind = kind
		p := fmt.Sprintf("%slayers.%d.", prefix, i)
		add := func(name string, toF32 bool, dst *kernels.Buffer, shape ...int) {
			specs = append(specs, TensorSpec{Name: p + name, Shape: shape, ToF32: toF32, Dst: dst})
		}
		add("input_layernorm.weight", true, &l.InputNorm, h)
		add("post_attention_layernorm.weight", true, &l.PostNorm, h)
		add("mlp.gate_proj.weight", false, &l.Gate, cfg.IntermediateSize, h)
		add("mlp.up_proj.weight", false, &l.Up, cfg.IntermediateSize, h)
		add("mlp.down_proj.weight", false, &l.Down, h, cfg.IntermediateSize)
		switch kind {
		case config.Full:
			qWidth := cfg.NumHeads * cfg.HeadDim
			if cfg.AttnOutputGate {
				qWidth *= 2
			}
			kvWidth := cfg.NumKVHeads * cfg.HeadDim
			add("self_attn.q_proj.weight", false, &l.QProj, qWidth, h)
			add("self_attn.k_proj.weight", false, &l.KProj, kvWidth, h)
			add("self_attn.v_proj.weight", false, &l.VProj, kvWidth, h)
			add("self_attn.o_proj.weight", false, &l.OProj, h, cfg.NumHeads*cfg.HeadDim)
			add("self_attn.q_norm.weight", true, &l.QNorm, cfg.HeadDim)
			add("self_attn.k_norm.weight", true, &l.KNorm, cfg.HeadDim)
		case config.Linear:
			add("linear_attn.in_proj_qkv.weight", false, &l.InProjQKV, cfg.ConvDim(), h)
			add("linear_attn.in_proj_z.weight", false, &l.InProjZ, cfg.ValueDim(), h)
			add("linear_attn.in_proj_b.weight", false, &l.InProjB, cfg.LinearValueHeads, h)
			add("linear_attn.in_proj_a.weight", false, &l.InProjA, cfg.LinearValueHeads, h)
			add("linear_attn.conv1d.weight", true, &l.Conv, cfg.ConvDim(), 1, cfg.ConvKernel)
			add("linear_attn.dt_bias", true, &l.DtBias, cfg.LinearValueHeads)
			add("linear_attn.A_log", true, &l.ALog, cfg.LinearValueHeads)
			add("linear_attn.norm.weight", true, &l.Norm, cfg.LinearValueDim)
			add("linear_attn.out_proj.weight", false, &l.OutProj, h, cfg.ValueDim())
		}
	}
	return specs
}

// checkTensors reports every missing or misshapen tensor, and any unexpected
// tensor under prefix (a sign that the config does not describe this
// checkpoint, e.g. more layers or biases). safetensors.Open has already
// rejected unsupported dtypes.
func checkTensors(ckpt *safetensors.Checkpoint, specs []TensorSpec, prefix string) error {
	var problems []string
	expected := make(map[string]bool, len(specs))
	for _, s := range specs {
		expected[s.Name] = true
		t, ok := ckpt.Tensor(s.Name)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("tensor %s: missing from checkpoint %s", s.Name, ckpt.Dir))
		case !slices.Equal(t.Shape, s.Shape):
			problems = append(problems, fmt.Sprintf("%s: tensor %s: shape %v, config.json implies %v", t.File, s.Name, t.Shape, s.Shape))
		}
	}
	for _, name := range ckpt.Names() {
		if expected[name] || !strings.HasPrefix(name, prefix) || hasAnyPrefix(name, skippedPrefixes) {
			continue
		}
		t, _ := ckpt.Tensor(name)
		problems = append(problems, fmt.Sprintf("%s: tensor %s: not part of the model config.json describes", t.File, name))
	}
	if len(problems) == 0 {
		return nil
	}
	more := ""
	if len(problems) > maxReported {
		more = fmt.Sprintf("\n  ... and %d more", len(problems)-maxReported)
		problems = problems[:maxReported]
	}
	return errors.New("checkpoint does not match config.json:\n  " + strings.Join(problems, "\n  ") + more)
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// upload copies t to a new buffer, in its own dtype or converted to F32.
func upload(b kernels.Backend, t safetensors.Tensor, toF32 bool) (kernels.Buffer, error) {
	if toF32 {
		vals, err := t.Float32s()
		if err != nil {
			return nil, err
		}
		buf, err := b.Alloc(kernels.F32, len(vals))
		if err != nil {
			return nil, err
		}
		if err := b.UploadF32(buf, 0, vals); err != nil {
			b.Free(buf)
			return nil, err
		}
		return buf, nil
	}
	dt := map[string]kernels.DType{"F32": kernels.F32, "BF16": kernels.BF16, "F16": kernels.F16}[t.DType]
	buf, err := b.Alloc(dt, t.Elements())
	if err != nil {
		return nil, err
	}
	if err := b.Upload(buf, 0, t.Data); err != nil {
		b.Free(buf)
		return nil, err
	}
	return buf, nil
}
