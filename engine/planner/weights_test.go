package planner

import (
	"math"
	"testing"

	"ddflash/engine/config"
)

// TestFP8TextWeights: Qwen3.6-27B-FP8 (the preset is its config.json) holds
// 29.47 GB of text weights (27.45 GiB: its FP8 linear layers, F32 block
// scales and the bf16 rest), and the bytes saved against bf16 become KV
// tokens. The bf16 model keeps its params × 2.
func TestFP8TextWeights(t *testing.T) {
	fp8, err := LoadTarget("qwen3.6-27b-fp8")
	if err != nil {
		t.Fatal(err)
	}
	if fp8.Config.Quant == nil {
		t.Fatal("the FP8 preset has no quantization")
	}
	if got := float64(textBytes(fp8.Config)); math.Abs(got/29.47e9-1) > 0.001 {
		t.Errorf("FP8 text weights %.4g bytes, want 29.47e9 within 0.1%%", got)
	}
	bf16 := qwen(t)
	if got, want := textBytes(bf16.Target.Config), int64(qwenTextPar)*2; got != want {
		t.Errorf("bf16 text weights %d bytes, want params × 2 = %d", got, want)
	}
	for _, tp := range []int{1, 2} {
		k := Knobs{Mode: ModeDDFlash, GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, Budget: 15, TP: tp}
		pb := mustPlan(t, bf16, k)
		pf := mustPlan(t, Models{Target: fp8, Drafter: bf16.Drafter}, k)
		saved := pb.Bytes.TargetWeights - pf.Bytes.TargetWeights
		if want := (textBytes(bf16.Target.Config) - textBytes(fp8.Config)) / int64(tp); math.Abs(float64(saved-want)) > float64(tp) {
			t.Errorf("TP %d: rank weights shrink by %d bytes, want %d", tp, saved, want)
		}
		perToken := pf.Bytes.PerKVToken + pf.Bytes.DraftKVPerToken
		if gained := pf.KVTokens - pb.KVTokens; gained < saved/perToken-1 || gained > saved/perToken+1 {
			t.Errorf("TP %d: %d more KV tokens, want the saved %d bytes / %d per token", tp, gained, saved, perToken)
		}
	}
}

// TestQuantizedMatricesMatchTheLoader: the planner's matrices are exactly
// the ones the real FP8 config quantises: all but lm_head, in_proj_a and
// in_proj_b (qwen3.6-27b-fp8's modules_to_not_convert).
func TestQuantizedMatricesMatchTheLoader(t *testing.T) {
	fp8, err := LoadTarget("qwen3.6-27b-fp8")
	if err != nil {
		t.Fatal(err)
	}
	c := fp8.Config
	kept := 0
	for _, m := range linearMatrices(c) {
		if !c.Quant.Quantized(m.module) {
			kept++
		}
	}
	if want := 1 + 2*c.NumLinear(); kept != want {
		t.Errorf("%d linear layers stay bf16, want lm_head and 2 per GDN layer = %d", kept, want)
	}
	var unquantised config.Config = *c
	unquantised.Quant = nil
	if textBytes(&unquantised) != textParams(c)*2 {
		t.Error("without quantization_config the FP8 preset is not params × 2")
	}
}
