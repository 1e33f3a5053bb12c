package dflash

import (
	"math"

	"ddflash/engine"
)

// RopeFrequencies returns the drafter's RoPE inverse frequencies (one per
// rotated pair of the head dimension) and the factor that scales cos and sin:
// plain RoPE with theta, or YaRN (transformers' "yarn" rope type) when the
// config scales positions.
func (c *Config) RopeFrequencies() (invFreq []float32, scale float32) {
	dim := c.HeadDim
	invFreq = engine.RopeFrequencies(c.RopeTheta, dim)
	y := c.YaRN
	if y == nil || y.Factor == 1 {
		return invFreq, 1
	}
	// Dimensions that rotate fewer than BetaSlow times over the original
	// context are interpolated (divided by the factor), those that rotate more
	// than BetaFast times are kept, and a linear ramp blends the ones between.
	correction := func(rotations float64) float64 {
		return float64(dim) * math.Log(float64(y.OriginalMaxPositions)/(rotations*2*math.Pi)) / (2 * math.Log(c.RopeTheta))
	}
	low := math.Max(math.Floor(correction(y.BetaFast)), 0)
	high := math.Min(math.Ceil(correction(y.BetaSlow)), float64(dim-1))
	if low == high {
		high += 0.001
	}
	for i, f := range invFreq {
		ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
		extrapolate := 1 - ramp
		invFreq[i] = float32(float64(f)/y.Factor*(1-extrapolate) + float64(f)*extrapolate)
	}
	scale = float32(y.AttentionFactor)
	if scale == 0 {
		scale = float32(0.1*math.Log(y.Factor) + 1)
	}
	return invFreq, scale
}
