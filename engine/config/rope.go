package config

import "math"

// YaRN is transformers' "yarn" RoPE scaling (modeling_rope_utils
// _compute_yarn_parameters): slow-rotating frequencies are divided by
// Factor, fast ones kept, a linear ramp blends those between, and cos and
// sin are scaled by an attention factor.
type YaRN struct {
	Factor               float64
	OriginalMaxPositions int     // the pre-training context the ramp is measured against
	BetaFast             float64 // rotations over that context above which a frequency is kept (32 when absent)
	BetaSlow             float64 // rotations below which it is interpolated (1 when absent)
	AttentionFactor      float64 // 0 when absent: derived from Factor, Mscale and MscaleAllDim
	Mscale, MscaleAllDim float64 // DeepSeek's form of the attention factor; 0 when absent
	NoTruncate           bool    // truncate: false keeps the ramp bounds fractional
}

// Scale is the factor applied to cos and sin: attention_factor when set,
// else mscale(factor, mscale)/mscale(factor, mscale_all_dim) when both are
// set, else mscale(factor) = 0.1·ln(factor) + 1 (1 for factor ≤ 1).
func (y *YaRN) Scale() float64 {
	if y.AttentionFactor != 0 {
		return y.AttentionFactor
	}
	mscale := func(m float64) float64 {
		if y.Factor <= 1 {
			return 1
		}
		return 0.1*m*math.Log(y.Factor) + 1
	}
	if y.Mscale != 0 && y.MscaleAllDim != 0 {
		return mscale(y.Mscale) / mscale(y.MscaleAllDim)
	}
	return mscale(1)
}

// RopeFrequencies returns the inverse frequencies of a RoPE over rotDim
// dimensions (one per rotated pair) and the factor that scales cos and sin:
// plain RoPE theta^(-2i/rotDim) with scale 1 when y is nil, else YaRN.
func RopeFrequencies(theta float64, rotDim int, y *YaRN) ([]float32, float32) {
	plain := make([]float64, rotDim/2)
	for i := range plain {
		plain[i] = math.Pow(theta, -2*float64(i)/float64(rotDim))
	}
	out := make([]float32, len(plain))
	if y == nil {
		for i, f := range plain {
			out[i] = float32(f)
		}
		return out, 1
	}
	// The pair index at which a frequency turns num rotations over the
	// original context: rotDim·ln(L/(num·2π)) / (2·ln θ).
	correction := func(num float64) float64 {
		return float64(rotDim) * math.Log(float64(y.OriginalMaxPositions)/(num*2*math.Pi)) / (2 * math.Log(theta))
	}
	low, high := correction(y.BetaFast), correction(y.BetaSlow)
	if !y.NoTruncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = max(low, 0), min(high, float64(rotDim-1))
	if low == high {
		high += 0.001 // as transformers does, to avoid dividing by zero
	}
	for i, f := range plain {
		interpolated := min(max((float64(i)-low)/(high-low), 0), 1)
		out[i] = float32(f/y.Factor*interpolated + f*(1-interpolated))
	}
	return out, float32(y.Scale())
}
