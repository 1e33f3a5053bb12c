// Package fp8 writes the FP8 checkpoint layout of Qwen's -FP8 models from
// unquantised weights: every linear layer's weight [out, in] becomes
// F8_E4M3 values plus weight_scale_inv [ceil(out/128), ceil(in/128)] (F32),
// one scale per 128×128 block, absmax/448, so that w ≈ q·scale.
package fp8

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"ddflash/engine/config"
	"ddflash/engine/safetensors"
	"ddflash/internal/half"
	"ddflash/kernels"
)

// minScale keeps an all-zero block's scale positive (its values stay 0).
const minScale = 1e-12

// QuantizeBlocks quantises the row-major matrix w [rows, cols]: per
// 128×128 block, scale = max|w|/448 and q = E4M3(w/scale) (round to
// nearest even). It returns the E4M3 bytes and the scales, row-major by block.
func QuantizeBlocks(w []float32, rows, cols int) ([]byte, []float32) {
	br, bc := kernels.ScaleBlocks(rows, cols)
	scales := make([]float32, br*bc)
	for i, v := range w {
		b := (i/cols/kernels.FP8Block)*bc + (i%cols)/kernels.FP8Block
		scales[b] = max(scales[b], float32(math.Abs(float64(v))))
	}
	for b := range scales {
		scales[b] = max(scales[b]/half.E4M3Max, minScale)
	}
	q := make([]byte, len(w))
	for i, v := range w {
		s := scales[(i/cols/kernels.FP8Block)*bc+(i%cols)/kernels.FP8Block]
		q[i] = half.Float32ToE4M3(v / s)
	}
	return q, scales
}

// Linear says whether a checkpoint tensor is a linear layer's weight, the
// only kind FP8 checkpoints quantise: a 2-D X.weight other than an embedding.
func Linear(t safetensors.Tensor) bool {
	return strings.HasSuffix(t.Name, ".weight") && len(t.Shape) == 2 && !strings.HasSuffix(t.Name, "embed_tokens.weight")
}

// Convert returns the tensors with every linear weight that q quantises
// replaced by its F8_E4M3 values and F32 weight_scale_inv, the others as
// they are.
func Convert(tensors []safetensors.Tensor, q *config.Quantization) ([]safetensors.Tensor, error) {
	var out []safetensors.Tensor
	for _, t := range tensors {
		module := strings.TrimSuffix(t.Name, ".weight")
		if !Linear(t) || !q.Quantized(module) {
			out = append(out, t)
			continue
		}
		vals, err := t.Float32s()
		if err != nil {
			return nil, err
		}
		values, scales := QuantizeBlocks(vals, t.Shape[0], t.Shape[1])
		br, bc := kernels.ScaleBlocks(t.Shape[0], t.Shape[1])
		raw := make([]byte, 0, 4*len(scales))
		for _, s := range scales {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(s))
		}
		out = append(out,
			safetensors.Tensor{Name: t.Name, DType: "F8_E4M3", Shape: t.Shape, Data: values},
			safetensors.Tensor{Name: t.Name + "_scale_inv", DType: "F32", Shape: []int{br, bc}, Data: raw})
	}
	return out, nil
}

// QwenNotConverted lists modules_to_not_convert as Qwen writes it for a
// text model with these layers under prefix (model.language_model.): the
// vision tower, lm_head and the embedding, then per layer its norms and,
// for Gated DeltaNet layers, A_log, conv1d, dt_bias and the small
// in_proj_a/in_proj_b (and in_proj_ba, their fused name elsewhere), and
// the MTP head's fc.
func QwenNotConverted(layers []config.LayerKind, prefix string) []string {
	names := []string{"visual", "model.visual", "lm_head", "model.embed_tokens", "mtp.fc"}
	for i, kind := range layers {
		p := fmt.Sprintf("%slayers.%d.", prefix, i)
		names = append(names, p+"input_layernorm", p+"post_attention_layernorm")
		if kind == config.Full {
			names = append(names, p+"self_attn.k_norm", p+"self_attn.q_norm")
			continue
		}
		for _, m := range []string{"A_log", "conv1d", "dt_bias", "in_proj_ba", "in_proj_b", "in_proj_a", "norm"} {
			names = append(names, p+"linear_attn."+m)
		}
	}
	return names
}

// ConfigJSON is quantization_config as Qwen's FP8 checkpoints write it.
func ConfigJSON(notConverted []string) map[string]any {
	return map[string]any{
		"activation_scheme":      "dynamic",
		"fmt":                    "e4m3",
		"quant_method":           "fp8",
		"modules_to_not_convert": notConverted,
		"weight_block_size":      []int{kernels.FP8Block, kernels.FP8Block},
	}
}
