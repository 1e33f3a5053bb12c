package planner

import (
	"fmt"

	"ddflash/engine/config"
	"ddflash/kernels"
)

// textBytes is the size of the target's text weights as ddflash holds them:
// every parameter in the checkpoint dtype, except FP8 matrices (config.json's
// quantization_config), which take one byte per weight plus an F32 scale
// per 128×128 block.
func textBytes(c *config.Config) int64 {
	elem := int64(dtypeBytes(c.Dtype))
	total := textParams(c) * elem
	for _, m := range linearMatrices(c) {
		if c.Quant.Quantized(m.module) {
			rows, cols := kernels.ScaleBlocks(m.rows, m.cols)
			total += int64(m.rows)*int64(m.cols)*(1-elem) + 4*int64(rows*cols)
		}
	}
	return total
}

// embedBytes is the embedding's size (never quantised: it is a lookup table).
func embedBytes(c *config.Config) int64 {
	return int64(c.VocabSize) * int64(c.HiddenSize) * int64(dtypeBytes(c.Dtype))
}

// matrix is one linear layer's weight [rows, cols] and its module name.
type matrix struct {
	module     string
	rows, cols int
}

// linearMatrices lists the text model's linear layers, as textParams counts them.
func linearMatrices(c *config.Config) []matrix {
	h, hd := c.HiddenSize, c.HeadDim
	var out []matrix
	if !c.TieWordEmbeddings {
		out = append(out, matrix{"lm_head", c.VocabSize, h})
	}
	qOut := c.NumHeads * hd
	if c.AttnOutputGate {
		qOut *= 2
	}
	for i, kind := range c.Layers {
		add := func(name string, rows, cols int) {
			out = append(out, matrix{fmt.Sprintf("layers.%d.%s", i, name), rows, cols})
		}
		add("mlp.gate_proj", c.IntermediateSize, h)
		add("mlp.up_proj", c.IntermediateSize, h)
		add("mlp.down_proj", h, c.IntermediateSize)
		if kind == config.Full {
			add("self_attn.q_proj", qOut, h)
			add("self_attn.k_proj", c.NumKVHeads*hd, h)
			add("self_attn.v_proj", c.NumKVHeads*hd, h)
			add("self_attn.o_proj", h, c.NumHeads*hd)
			continue
		}
		add("linear_attn.in_proj_qkv", c.ConvDim(), h)
		add("linear_attn.in_proj_z", c.ValueDim(), h)
		add("linear_attn.in_proj_b", c.LinearValueHeads, h)
		add("linear_attn.in_proj_a", c.LinearValueHeads, h)
		add("linear_attn.out_proj", h, c.ValueDim())
	}
	return out
}

// mtpMatrices lists the linear layers of the MTP head Qwen3.5/3.6/3.8
// checkpoints ship (mtp.*, docs/mtp.md): fc over [embedding | hidden] and
// one gated full-attention decoder layer with its MLP.
func mtpMatrices(c *config.Config) []matrix {
	h, hd := c.HiddenSize, c.HeadDim
	qOut := c.NumHeads * hd
	if c.AttnOutputGate {
		qOut *= 2
	}
	p := "mtp.layers.0."
	return []matrix{
		{"mtp.fc", h, 2 * h},
		{p + "self_attn.q_proj", qOut, h},
		{p + "self_attn.k_proj", c.NumKVHeads * hd, h},
		{p + "self_attn.v_proj", c.NumKVHeads * hd, h},
		{p + "self_attn.o_proj", h, c.NumHeads * hd},
		{p + "mlp.gate_proj", c.IntermediateSize, h},
		{p + "mlp.up_proj", c.IntermediateSize, h},
		{p + "mlp.down_proj", h, c.IntermediateSize},
	}
}

// mtpBytes is the MTP head's weight bytes: its matrices (FP8 ones with
// their F32 block scales) and its norms (pre_fc_norm_embedding,
// pre_fc_norm_hidden, the layer's two, the final norm, q_norm and k_norm).
// Its embedding and LM head are the target's.
func mtpBytes(c *config.Config) int64 {
	elem := int64(dtypeBytes(c.Dtype))
	total := int64(5*c.HiddenSize+2*c.HeadDim) * elem
	for _, m := range mtpMatrices(c) {
		n := int64(m.rows) * int64(m.cols)
		if c.Quant.Quantized(m.module) {
			rows, cols := kernels.ScaleBlocks(m.rows, m.cols)
			total += n + 4*int64(rows*cols)
		} else {
			total += n * elem
		}
	}
	return total
}
