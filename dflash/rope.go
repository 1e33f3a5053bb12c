package dflash

import "ddflash/engine/config"

// RopeFrequencies returns the drafter's RoPE inverse frequencies (one per
// rotated pair of the head dimension) and the factor that scales cos and sin:
// plain RoPE with theta, or YaRN (transformers' "yarn" rope type) when the
// config scales positions.
func (c *Config) RopeFrequencies() (invFreq []float32, scale float32) {
	return config.RopeFrequencies(c.RopeTheta, c.HeadDim, c.YaRN)
}
