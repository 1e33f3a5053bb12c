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
	// Rows and Cols select a tensor-parallel shard of the tensor seen as a
	// matrix [Shape[0], rest]: the row spans, concatenated in order (nil:
	// every row), and within each row the column span (zero: every column).
	Rows []Span
	Cols Span
	// Quantized marks an FP8 matrix (config.json's quantization_config):
	// F8_E4M3 values with block scales in <module>.weight_scale_inv,
	// uploaded as a *kernels.BlockScaled (loader_fp8.go).
	Quantized bool
}

// Span is the half-open index range [From, To).
type Span struct{ From, To int }

// Len is the number of indices in the span.
func (s Span) Len() int { return s.To - s.From }

// LoadWeights uploads the text model of the checkpoint in dir to b. Every
// required tensor is checked for presence, dtype and shape before anything is
// allocated. Matrices keep their checkpoint dtype (FP8 ones with their block
// scales, see loader_fp8.go); norm weights, the conv kernel, A_log and
// dt_bias become F32.
func LoadWeights(b kernels.Backend, dir string, cfg *config.Config) (*Weights, error) {
	shards, err := loadShards([]kernels.Backend{b}, dir, cfg)
	if err != nil {
		return nil, err
	}
	return shards[0].W, nil
}

// loadShards uploads each tensor-parallel rank's share of the weights to that
// rank's backend (see tp.go for what is split and what is replicated).
func loadShards(backends []kernels.Backend, dir string, cfg *config.Config) ([]Shard, error) {
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ckpt.Close()

	prefix, err := detectPrefix(ckpt)
	if err != nil {
		return nil, err
	}
	var shards []Shard
	var loaded []func() // frees the ranks loaded so far, if a later one fails
	for r, b := range backends {
		sh := shard{rank: r, tp: len(backends)}
		w := &Weights{Layers: make([]LayerWeights, cfg.NumLayers)}
		specs := expectedTensors(cfg, prefix, w, sh)
		if err := LoadTensors(b, ckpt, specs, prefix); err != nil {
			for _, free := range loaded {
				free()
			}
			if len(backends) > 1 {
				err = fmt.Errorf("rank %d of %d: %w", r, len(backends), err)
			}
			return nil, err
		}
		loaded = append(loaded, func() {
			for _, s := range specs {
				b.Free(*s.Dst)
			}
		})
		if cfg.TieWordEmbeddings && sh.tp == 1 {
			w.LMHead = w.Embed
		}
		shards = append(shards, Shard{B: b, W: w})
	}
	return shards, nil
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
		buf, err := upload(b, ckpt, t, s)
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

// expectedTensors lists every tensor cfg requires (docs/qwen36-model.md §7), each
// pointing at its field of w, with the rows and columns that rank sh holds.
func expectedTensors(cfg *config.Config, prefix string, w *Weights, sh shard) []TensorSpec {
	h, hd := cfg.HiddenSize, cfg.HeadDim
	whole := sh.tp == 1
	vocab := sh.even(cfg.VocabSize, 1)
	specs := []TensorSpec{
		{Name: prefix + "embed_tokens.weight", Shape: []int{cfg.VocabSize, h}, Dst: &w.Embed},
		{Name: prefix + "norm.weight", Shape: []int{h}, ToF32: true, Dst: &w.FinalNorm},
	}
	switch {
	case !cfg.TieWordEmbeddings:
		specs = append(specs, TensorSpec{Name: "lm_head.weight", Shape: []int{cfg.VocabSize, h}, Dst: &w.LMHead, Rows: []Span{vocab}})
	case !whole: // tied: the replicated embedding stays whole, the head is a slice of it
		specs = append(specs, TensorSpec{Name: prefix + "embed_tokens.weight", Shape: []int{cfg.VocabSize, h}, Dst: &w.LMHead, Rows: []Span{vocab}})
	}
	heads := sh.even(cfg.NumHeads, hd)
	kvHeads := sh.kvHeads(cfg.NumKVHeads, hd)
	keys, values := sh.even(cfg.LinearKeyHeads, cfg.LinearKeyDim), sh.even(cfg.LinearValueHeads, cfg.LinearValueDim)
	valueHeads := sh.even(cfg.LinearValueHeads, 1)
	// in_proj_qkv rows and conv channels are [q | k | v]: this rank's heads of each.
	kd := cfg.KeyDim()
	qkv := []Span{keys, {kd + keys.From, kd + keys.To}, {2*kd + values.From, 2*kd + values.To}}
	mlp := sh.even(cfg.IntermediateSize, 1)
	for i, kind := range cfg.Layers {
		l := &w.Layers[i]
		l.Kind = kind
		p := fmt.Sprintf("%slayers.%d.", prefix, i)
		add := func(name string, toF32 bool, dst *kernels.Buffer, rows []Span, cols Span, shape ...int) {
			if whole {
				rows, cols = nil, Span{}
			}
			specs = append(specs, TensorSpec{Name: p + name, Shape: shape, ToF32: toF32, Dst: dst, Rows: rows, Cols: cols})
		}
		all := Span{}
		add("input_layernorm.weight", true, &l.InputNorm, nil, all, h)
		add("post_attention_layernorm.weight", true, &l.PostNorm, nil, all, h)
		add("mlp.gate_proj.weight", false, &l.Gate, []Span{mlp}, all, cfg.IntermediateSize, h)
		add("mlp.up_proj.weight", false, &l.Up, []Span{mlp}, all, cfg.IntermediateSize, h)
		add("mlp.down_proj.weight", false, &l.Down, nil, mlp, h, cfg.IntermediateSize)
		switch kind {
		case config.Full:
			qRows := heads
			qWidth := cfg.NumHeads * hd
			if cfg.AttnOutputGate { // per head [query | gate]
				qRows, qWidth = Span{2 * heads.From, 2 * heads.To}, 2*qWidth
			}
			kvWidth := cfg.NumKVHeads * hd
			add("self_attn.q_proj.weight", false, &l.QProj, []Span{qRows}, all, qWidth, h)
			add("self_attn.k_proj.weight", false, &l.KProj, []Span{kvHeads}, all, kvWidth, h)
			add("self_attn.v_proj.weight", false, &l.VProj, []Span{kvHeads}, all, kvWidth, h)
			add("self_attn.o_proj.weight", false, &l.OProj, nil, heads, h, cfg.NumHeads*hd)
			add("self_attn.q_norm.weight", true, &l.QNorm, nil, all, hd)
			add("self_attn.k_norm.weight", true, &l.KNorm, nil, all, hd)
		case config.Linear:
			add("linear_attn.in_proj_qkv.weight", false, &l.InProjQKV, qkv, all, cfg.ConvDim(), h)
			add("linear_attn.in_proj_z.weight", false, &l.InProjZ, []Span{values}, all, cfg.ValueDim(), h)
			add("linear_attn.in_proj_b.weight", false, &l.InProjB, []Span{valueHeads}, all, cfg.LinearValueHeads, h)
			add("linear_attn.in_proj_a.weight", false, &l.InProjA, []Span{valueHeads}, all, cfg.LinearValueHeads, h)
			add("linear_attn.conv1d.weight", true, &l.Conv, qkv, all, cfg.ConvDim(), 1, cfg.ConvKernel)
			add("linear_attn.dt_bias", true, &l.DtBias, []Span{valueHeads}, all, cfg.LinearValueHeads)
			add("linear_attn.A_log", true, &l.ALog, []Span{valueHeads}, all, cfg.LinearValueHeads)
			add("linear_attn.norm.weight", true, &l.Norm, nil, all, cfg.LinearValueDim)
			add("linear_attn.out_proj.weight", false, &l.OutProj, nil, values, h, cfg.ValueDim())
		}
	}
	markQuantized(specs, cfg, prefix)
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
		default:
			problems = append(problems, checkQuantized(ckpt, s, t, expected)...)
		}
	}
	for _, name := range ckpt.Names() {
		if expected[name] || !strings.HasPrefix(name, prefix) || hasAnyPrefix(name, skippedPrefixes) {
			continue
		}
		t, _ := ckpt.Tensor(name)
		problems = append(problems, fmt.Sprintf("%s: tensor %s: not part of the model config.json describes%s", t.File, name, unexpectedScaleHint(name)))
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

// upload copies the spec's shard of t to a new buffer, in t's dtype or
// converted to F32, or with its scales from ckpt for an FP8 weight.
func upload(b kernels.Backend, ckpt *safetensors.Checkpoint, t safetensors.Tensor, s TensorSpec) (kernels.Buffer, error) {
	if s.Quantized {
		return uploadFP8(b, ckpt, t, s)
	}
	if s.ToF32 {
		vals, err := t.Float32s()
		if err != nil {
			return nil, err
		}
		vals = take(vals, s, 1)
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
	dt := map[string]kernels.DType{"F32": kernels.F32, "BF16": kernels.BF16, "F16": kernels.F16, "F8_E4M3": kernels.F8E4M3}[t.DType]
	data := take(t.Data, s, dt.Size())
	buf, err := b.Alloc(dt, len(data)/dt.Size())
	if err != nil {
		return nil, err
	}
	if err := b.Upload(buf, 0, data); err != nil {
		b.Free(buf)
		return nil, err
	}
	return buf, nil
}

// take returns the shard the spec selects of a row-major tensor held as
// values (unit 1) or as raw bytes (unit: the element size). A shard that
// is the whole tensor (one rank) is data itself: copying a 248k-row
// embedding row by row costs gigabytes of garbage.
func take[T any](data []T, s TensorSpec, unit int) []T {
	if s.Rows == nil && s.Cols == (Span{}) {
		return data
	}
	width := len(data) / s.Shape[0]
	rowSpans := s.Rows
	if rowSpans == nil {
		rowSpans = []Span{{0, s.Shape[0]}}
	}
	cols := Span{s.Cols.From * unit, s.Cols.To * unit}
	if s.Cols == (Span{}) {
		cols = Span{0, width}
	}
	if len(rowSpans) == 1 && rowSpans[0] == (Span{0, s.Shape[0]}) && cols == (Span{0, width}) {
		return data
	}
	rows := 0
	for _, rs := range rowSpans {
		rows += rs.Len()
	}
	out := make([]T, 0, rows*cols.Len())
	for _, rs := range rowSpans {
		for r := rs.From; r < rs.To; r++ {
			out = append(out, data[r*width+cols.From:r*width+cols.To]...)
		}
	}
	return out
}
