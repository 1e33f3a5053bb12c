package planner

import (
	"fmt"
	"math"
)

// The step-time estimates README's CUDA section gives until scripts/gpu-check.sh has measured
// a GPU: a step takes at least its memory traffic over the GPU's bandwidth and at least its
// tensor-core work over the GPU's peak, whichever is longer (a roofline; each matrix of a
// verify is memory-bound anyway at these row counts). They assume replayed steps (one graph
// launch, so no launch cost) and kernels at the bandwidth floor, so real steps are slower by
// the kernels' efficiency, which only a GPU run measures.

// Speed is a GPU's datasheet rates.
type Speed struct {
	Name        string
	BytesPerSec float64 // memory bandwidth
	BF16FLOPs   float64 // dense bf16 tensor-core rate with F32 accumulation, per second
}

// Speeds are the GPUs README's table covers, from NVIDIA's datasheets.
var Speeds = []Speed{
	{Name: "H200", BytesPerSec: 4.8e12, BF16FLOPs: 989e12},
	{Name: "RTX PRO 6000", BytesPerSec: 1.792e12, BF16FLOPs: 503.8e12},
}

// StepTraffic is what one engine step moves and computes on the GPU.
type StepTraffic struct {
	Bytes float64 // read and written in device memory
	FLOPs float64 // tensor-core multiply-adds × 2
}

// Ms is the step's estimated time on a GPU.
func (s StepTraffic) Ms(g Speed) float64 {
	return 1e3 * math.Max(s.Bytes/g.BytesPerSec, s.FLOPs/g.BF16FLOPs)
}

// splitTerms is how many bf16 tensor-core products a matrix product above 8
// rows takes per weight: F32 activations are split exactly into two bf16
// terms (docs/cuda.md), FP8 weights included (widened to bf16 exactly).
const splitTerms = 2

// DecodeTraffic is one plain decoding step of one request at context tokens:
// every target weight but the embedding streams once (a decode row runs on
// CUDA cores, so no tensor-core work), the request's KV cache is read once,
// and each GDN layer's state is read and written.
func DecodeTraffic(p *Plan, t *Target, context int) StepTraffic {
	return StepTraffic{Bytes: float64(p.Bytes.TargetWeights-embedBytes(t.Config)) +
		float64(p.Bytes.PerKVToken)*float64(context) + 2*float64(p.Bytes.PerStateSlot)}
}

// TreeTraffic is one DDTree step of one request (draft, verify of budget+1
// rows, commit) with p's drafter: the drafter's weights and its LM-head
// scoring (the target's LM head, read a second time), the target's weights
// once for all rows (the tiled attention reads each KV tile once per block
// of rows), every tree node's GDN state written and its parent's read, and
// the commit's state read and write. Tensor-core work: the verify's rows and
// the drafter's block rows through their matrices, split into bf16 terms.
func TreeTraffic(p *Plan, m Models, context, budget int) (StepTraffic, error) {
	if m.Drafter == nil {
		return StepTraffic{}, fmt.Errorf("a DDTree step needs a drafter")
	}
	t := m.Target.Config
	lmHead := float64(t.VocabSize) * float64(t.HiddenSize) * float64(dtypeBytes(t.Dtype))
	rows, blockRows := float64(budget+1), float64(m.Drafter.BlockSize)
	bytes := float64(p.Bytes.TargetWeights-embedBytes(t)) + float64(p.Bytes.DraftWeights) + lmHead +
		float64(p.Bytes.PerKVToken+p.Bytes.DraftKVPerToken)*float64(context) + float64(p.Bytes.DraftKVPerRequest) +
		2*(rows+1)*float64(p.Bytes.PerStateSlot)
	var targetMACs float64
	for _, mat := range linearMatrices(t) {
		targetMACs += float64(mat.rows) * float64(mat.cols)
	}
	draftMACs := float64(m.Drafter.WeightParams()) + float64(t.VocabSize)*float64(t.HiddenSize)
	flops := 2 * splitTerms * (rows*targetMACs + blockRows*draftMACs)
	return StepTraffic{Bytes: bytes, FLOPs: flops}, nil
}
