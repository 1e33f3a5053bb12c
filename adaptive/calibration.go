package adaptive

import (
	"math"
	"sync"
)

// A draft-tree node is accepted when the target picks every token on its
// path, so its acceptance probability is predicted by its path probability
// under the drafter (the product of the drafter's probabilities along the
// path: what DDTree ranks nodes by). Nodes of one depth are exclusive, so a
// verify's predicted chance of accepting at least d tokens is the sum over
// its depth-d nodes, and the predicted accepted tokens the sum over all
// nodes. Drafters are over- or under-confident, more so deeper, so each
// depth's predictions are scaled by observed/predicted acceptance, over
// about the last memory verify steps: how well a drafter guesses depends on
// the text, and an engine's traffic changes (a chat's calibration would
// otherwise hold back the drafts of a code request that follows it).

// prior is the pseudo-count of verify steps at which the calibration still
// trusts the drafter's own probabilities as much as the observations.
const prior = 1.0

// memory is how many recent verify steps the calibration weighs: each
// observation's weight decays by 1 − 1/memory per later one.
const memory = 256

// Calibration scales predicted acceptance per depth by what was observed.
// Safe for concurrent use.
type Calibration struct {
	mu                  sync.Mutex
	predicted, observed []float64 // per depth-1: decaying sums over verify steps (memory)
	steps               int
	absErr              float64 // Σ |calibrated prediction − accepted tokens|, each predicted before its step was seen
}

// DepthCalibration is one depth's totals.
type DepthCalibration struct {
	Depth     int     `json:"depth"`
	Predicted float64 `json:"predicted"` // drafter's path probabilities summed over verified depth-d nodes (decaying, as Observed)
	Observed  float64 `json:"observed"`  // verify steps that accepted at least d tokens, over about the last memory steps
}

// CalibrationReport is the calibration's state.
type CalibrationReport struct {
	Steps int `json:"steps"`
	// MeanAbsError is the mean absolute error, in tokens per verify step, of
	// the calibrated prediction of accepted tokens, each made before its step.
	MeanAbsError float64            `json:"mean_abs_error"`
	Depths       []DepthCalibration `json:"depths"`
}

// factor is depth's scale: (observed + prior) / (predicted + prior).
func (c *Calibration) factor(depth int) float64 {
	if depth-1 >= len(c.predicted) {
		return 1
	}
	return (c.observed[depth-1] + prior) / (c.predicted[depth-1] + prior)
}

// Calibrate returns the calibrated acceptance probability of each node
// (probs[i] at depths[i], depth ≥ 1), each clamped to [0, 1].
func (c *Calibration) Calibrate(probs []float64, depths []int32) []float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]float64, len(probs))
	for i, p := range probs {
		out[i] = math.Min(1, p*c.factor(int(depths[i])))
	}
	return out
}

// Observe records a verify: the drafter's path probabilities and depths of
// the verified nodes (root excluded) and the drafted tokens the target
// accepted.
func (c *Calibration) Observe(probs []float64, depths []int32, accepted int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	predicted := 0.0
	for i, p := range probs {
		predicted += math.Min(1, p*c.factor(int(depths[i])))
	}
	for d := range c.predicted {
		c.predicted[d] *= 1 - 1.0/memory
		c.observed[d] *= 1 - 1.0/memory
	}
	for i, p := range probs {
		c.grow(int(depths[i]))
		c.predicted[depths[i]-1] += p
	}
	c.grow(accepted)
	for d := 1; d <= accepted; d++ {
		c.observed[d-1]++
	}
	c.absErr += math.Abs(predicted - float64(accepted))
	c.steps++
}

// grow makes room for depths up to d.
func (c *Calibration) grow(d int) {
	for len(c.predicted) < d {
		c.predicted, c.observed = append(c.predicted, 0), append(c.observed, 0)
	}
}

// Report returns the per-depth totals and the error so far.
func (c *Calibration) Report() CalibrationReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := CalibrationReport{Steps: c.steps}
	if c.steps > 0 {
		r.MeanAbsError = c.absErr / float64(c.steps)
	}
	for d := range c.predicted {
		r.Depths = append(r.Depths, DepthCalibration{Depth: d + 1, Predicted: c.predicted[d], Observed: c.observed[d]})
	}
	return r
}
