package engine

import (
	"fmt"
	"strings"

	"ddflash/engine/config"
	"ddflash/engine/safetensors"
	"ddflash/kernels"
)

// scaleSuffix names an FP8 weight's block scales: X.weight has X.weight_scale_inv
// (despite the name, the factor that multiplies the stored values).
const scaleSuffix = "_scale_inv"

// markQuantized flags the matrices that cfg's quantization_config stores
// in FP8: every linear layer's weight (the embedding is a lookup table, not
// a linear layer) except the modules it lists as not converted.
func markQuantized(specs []TensorSpec, cfg *config.Config, prefix string) {
	for i := range specs {
		s := &specs[i]
		module, isWeight := strings.CutSuffix(s.Name, ".weight")
		linear := isWeight && !s.ToF32 && len(s.Shape) == 2 && s.Name != prefix+"embed_tokens.weight"
		s.Quantized = linear && cfg.Quant.Quantized(module)
	}
}

// MarkQuantized flags the specs' matrices that cfg's quantization_config
// stores in FP8, for tensors a drafter loads from the target's checkpoint
// (the MTP head's).
func MarkQuantized(specs []TensorSpec, cfg *config.Config) { markQuantized(specs, cfg, "") }

// checkQuantized reports a tensor whose dtype disagrees with the
// quantization_config, and for an FP8 matrix a missing or misshapen scale
// tensor (marking it expected) or a tensor-parallel shard that splits a
// scale block.
func checkQuantized(ckpt *safetensors.Checkpoint, s TensorSpec, t safetensors.Tensor, expected map[string]bool) []string {
	module := strings.TrimSuffix(s.Name, ".weight")
	if !s.Quantized {
		if t.DType != "F8_E4M3" {
			return nil
		}
		return []string{fmt.Sprintf("%s: tensor %s: F8_E4M3, but config.json does not quantise it (no quantization_config, or %s is listed in modules_to_not_convert; ddflash reads FP8 only as block-scaled linear weights)", t.File, s.Name, module)}
	}
	if t.DType != "F8_E4M3" {
		return []string{fmt.Sprintf("%s: tensor %s: %s, but config.json's quantization_config stores %s in F8_E4M3 (list it in modules_to_not_convert if it is kept in %s)", t.File, s.Name, t.DType, module, t.DType)}
	}
	var problems []string
	name := s.Name + scaleSuffix
	expected[name] = true
	rows, cols := kernels.ScaleBlocks(s.Shape[0], s.Shape[1])
	switch st, ok := ckpt.Tensor(name); {
	case !ok:
		problems = append(problems, fmt.Sprintf("tensor %s: missing from checkpoint %s (the FP8 weight %s needs its block scales)", name, ckpt.Dir, s.Name))
	case len(st.Shape) != 2 || st.Shape[0] != rows || st.Shape[1] != cols:
		problems = append(problems, fmt.Sprintf("%s: tensor %s: shape %v, the %v weight's %d×%d blocks need [%d, %d]", st.File, name, st.Shape, s.Shape, kernels.FP8Block, kernels.FP8Block, rows, cols))
	case st.DType != "F32" && st.DType != "BF16":
		problems = append(problems, fmt.Sprintf("%s: tensor %s: dtype %s, want F32 or BF16 block scales", st.File, name, st.DType))
	}
	if !blockAligned(s) {
		problems = append(problems, fmt.Sprintf("tensor %s: this tensor-parallel shard (rows %v, columns %v) splits its %d×%d FP8 scale blocks: choose a TP degree whose shards are multiples of %d", s.Name, s.Rows, s.Cols, kernels.FP8Block, kernels.FP8Block, kernels.FP8Block))
	}
	return problems
}

// blockAligned says whether every row span and the column span of a
// shard start and end on scale block edges (or at the matrix's end).
func blockAligned(s TensorSpec) bool {
	aligned := func(sp Span, dim int) bool {
		edge := func(i int) bool { return i%kernels.FP8Block == 0 || i == dim }
		return edge(sp.From) && edge(sp.To)
	}
	for _, r := range s.Rows {
		if !aligned(r, s.Shape[0]) {
			return false
		}
	}
	return aligned(s.Cols, s.Shape[1])
}

// unexpectedScaleHint explains a stray scale tensor: its weight is not
// quantised by config.json.
func unexpectedScaleHint(name string) string {
	weight, ok := strings.CutSuffix(name, scaleSuffix)
	if !ok {
		return ""
	}
	return fmt.Sprintf(" (block scales, but config.json does not quantise %s: is it listed in quantization_config.modules_to_not_convert, or is quantization_config missing?)", weight)
}

// uploadFP8 uploads the spec's shard of an FP8 weight and of its scales
// (checked block-aligned), the scales as F32.
func uploadFP8(b kernels.Backend, ckpt *safetensors.Checkpoint, t safetensors.Tensor, s TensorSpec) (kernels.Buffer, error) {
	q := take(t.Data, s, 1)
	st := scaleSpec(s)
	scaleTensor, _ := ckpt.Tensor(st.Name)
	scales, err := scaleTensor.Float32s()
	if err != nil {
		return nil, err
	}
	scales = take(scales, st, 1)
	rows, cols := s.Shape[0], s.Shape[1]
	if s.Rows != nil {
		rows = 0
		for _, r := range s.Rows {
			rows += r.Len()
		}
	}
	if s.Cols != (Span{}) {
		cols = s.Cols.Len()
	}
	qb, err := b.Alloc(kernels.F8E4M3, len(q))
	if err != nil {
		return nil, err
	}
	sb, err := b.Alloc(kernels.F32, len(scales))
	if err != nil {
		b.Free(qb)
		return nil, err
	}
	w, err := kernels.NewBlockScaled(qb, sb, rows, cols)
	if err == nil {
		err = b.Upload(qb, 0, q)
	}
	if err == nil {
		err = b.UploadF32(sb, 0, scales)
	}
	if err != nil {
		b.Free(qb)
		b.Free(sb)
		return nil, err
	}
	return w, nil
}

// scaleSpec is the spec of an FP8 weight's scale tensor, with the weight
// shard's block-aligned spans in units of blocks.
func scaleSpec(s TensorSpec) TensorSpec {
	blocks := func(sp Span) Span {
		return Span{sp.From / kernels.FP8Block, (sp.To + kernels.FP8Block - 1) / kernels.FP8Block}
	}
	rows, cols := kernels.ScaleBlocks(s.Shape[0], s.Shape[1])
	st := TensorSpec{Name: s.Name + scaleSuffix, Shape: []int{rows, cols}}
	for _, r := range s.Rows {
		st.Rows = append(st.Rows, blocks(r))
	}
	if s.Cols != (Span{}) {
		st.Cols = blocks(s.Cols)
	}
	return st
}
