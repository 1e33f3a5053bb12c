package adaptive

import (
	"sync"
	"time"
)

// Choice is the choice among an engine's drafters (--spec adaptive with
// several loaded, such as the target's MTP head and a DFlash drafter), made
// as budgets are: per request and step, from each drafter's own measured
// draft cost and calibrated acceptance. A request drafts with the drafter
// whose recent drafts for it are expected to gain the batch the most (as
// ExpectedGain judges a draft: its tokens per step time, the draft's time
// counted); the others wait, their context kept for their next draft, and
// each is tried again every ReprobeSteps of the request's drafts, so that
// a drafter that starts to do better is seen. Only the proposal changes, so
// decoding stays as lossless as with one drafter.
type Choice struct {
	Drafters []DrafterStats
}

// NewChoice returns the choice among n drafters.
func NewChoice(n int) *Choice { return &Choice{Drafters: make([]DrafterStats, n)} }

// DrafterStats is one drafter's calibration and draft cost. Safe for
// concurrent use.
type DrafterStats struct {
	Calibration Calibration

	mu    sync.Mutex
	draft samples // steady drafts' times, ms
}

// ObserveDraft records one of the drafter's drafts that took d; as
// CostModel.ObserveDraft, only steady ones say what drafting costs.
func (d *DrafterStats) ObserveDraft(took time.Duration, steady bool) {
	if !steady {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.draft.add(millis(took))
}

// DraftMs is the drafter's estimated draft time, 0 before a steady draft.
func (d *DrafterStats) DraftMs() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.draft.estimate()
}

// ReprobeSteps is how many of a request's drafts may pass before each
// drafter not chosen meanwhile drafts for it again.
const ReprobeSteps = 16

// ChoiceState is one request's view of its drafters: each one's recent
// drafts for it and the request's drafts since it last drafted.
type ChoiceState struct {
	recent [][]draft // per drafter, its latest drafts (at most recentDrafts)
	since  []int
}

// draft is a draft tree's raw path probabilities and depths, in tree order.
type draft struct {
	probs  []float64
	depths []int32
}

// NewState starts a request's state: no drafter has drafted for it.
func (c *Choice) NewState() *ChoiceState {
	n := len(c.Drafters)
	return &ChoiceState{recent: make([][]draft, n), since: make([]int, n)}
}

// Choose returns the drafter a request drafts with next, in a batch of
// seqs sequences (itself included) with the step times and commit cost
// given (Policy.StepCosts): first each drafter once, in order; then one
// not chosen for ReprobeSteps drafts; else the one of the highest
// ExpectedGain over its recent drafts, calibrated by its own calibration,
// with its own draft time. Ties go to the first.
func (c *Choice) Choose(s *ChoiceState, seqs int, stepMs func(rows int) float64, commitMs float64) int {
	for i, r := range s.recent {
		if len(r) == 0 || s.since[i] >= ReprobeSteps {
			return i
		}
	}
	best, bestGain := 0, 0.0
	for i := range c.Drafters {
		d := &c.Drafters[i]
		calibrated := make([][]float64, len(s.recent[i]))
		for k, r := range s.recent[i] {
			calibrated[k] = d.Calibration.Calibrate(r.probs, r.depths)
		}
		gain := ExpectedGain(calibrated, plainBatch(seqs-1), stepMs, commitMs, d.DraftMs())
		if i == 0 || gain > bestGain {
			best, bestGain = i, gain
		}
	}
	return best
}

// Drafted records that drafter i drafted for the request a tree of these
// raw path probabilities and depths (in tree order).
func (s *ChoiceState) Drafted(i int, probs []float64, depths []int32) {
	s.recent[i] = append(s.recent[i], draft{probs: probs, depths: depths})
	s.recent[i] = s.recent[i][max(0, len(s.recent[i])-recentDrafts):]
	for k := range s.since {
		s.since[k]++
	}
	s.since[i] = 0
}

// StepCosts are the step time by rows in a batch of seqs sequences and a
// speculating request's commit cost, as Allot weighs them.
func (p *Policy) StepCosts(seqs int) (func(rows int) float64, float64) {
	costs, stepMs := p.batchCosts(seqs)
	return stepMs, costs.CommitMs
}
