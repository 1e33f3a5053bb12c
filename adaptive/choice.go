package adaptive

import (
	"sync"
	"time"
)

// Choice is the choice among an engine's drafters (--spec adaptive with
// several loaded, such as the target's MTP head and a DFlash drafter), made
// as budgets are: per request and step, from each drafter's own measured
// draft cost and calibrated acceptance. A request drafts with the drafter
// whose recent drafts are expected to speed the batch's steps up the most
// (ExpectedSpeedup: its tokens per step time, the draft's time counted):
// its latest drafts for the request, and while it has fewer than
// a window of those, its latest drafts for other requests (so that one
// unlucky draft for a request does not rule a drafter out for it); the
// others wait, their context kept for their next draft, and each is tried
// again every ReprobeSteps of the request's drafts, so that a drafter that
// starts to do better is seen. A trial (a drafter's first draft for a
// request, and each one ReprobeSteps later) starts its evidence afresh:
// until the drafter is chosen again it is judged by the trial's draft
// alone, since its older drafts are as old as its last chance and the
// chosen drafter's are fresh (judged by them, the demo pair's better
// drafter was chosen for a third of the drafts: docs/adaptive.md). Only the
// proposal changes, so decoding stays as lossless as with one drafter.
type Choice struct {
	Drafters []DrafterStats
}

// NewChoice returns the choice among n drafters.
func NewChoice(n int) *Choice { return &Choice{Drafters: make([]DrafterStats, n)} }

// DrafterStats is one drafter's calibration and draft cost. Safe for
// concurrent use.
type DrafterStats struct {
	Calibration Calibration

	mu     sync.Mutex
	draft  samples // steady drafts' times, ms
	recent []draft // its latest drafts for any request (at most recentDrafts)
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

// RetireAfter is how many trials (a drafter's first draft for a request,
// and each draft ReprobeSteps gave it) a drafter may lose for a request
// before it is retired for the rest of the request. Keeping a drafter in
// the running costs its forward over every row the request commits (its
// context, taken in at its next draft), which the choice does not see: the
// demo pair's MTP head is a quarter of its 4-layer target, and retiring it
// after two lost trials took the choice from 0.91 to 0.955 of DFlash alone
// at concurrency 1 (docs/adaptive.md).
const RetireAfter = 2

// ChoiceState is one request's view of its drafters: each one's recent
// drafts for it, the request's drafts since it last drafted, and the trials it
// lost (RetireAfter of them retire it).
type ChoiceState struct {
	choice *Choice
	recent [][]draft // per drafter, its latest drafts (at most recentDrafts)
	since  []int
	trying []bool // its latest draft was a trial, not yet judged
	fresh  []bool // its latest draft was a trial: its evidence is that draft
	lost   []int
}

// draft is a draft tree's raw path probabilities and depths, in tree order,
// and the request it was made for.
type draft struct {
	probs  []float64
	depths []int32
	owner  *ChoiceState
}

// NewState starts a request's state: no drafter has drafted for it.
func (c *Choice) NewState() *ChoiceState {
	n := len(c.Drafters)
	return &ChoiceState{choice: c, recent: make([][]draft, n), since: make([]int, n), trying: make([]bool, n), fresh: make([]bool, n), lost: make([]int, n)}
}

// evidence is the drafts drafter i is judged by for request s: its latest
// trial's draft alone until it is chosen again, else its latest for s,
// then, up to a window, its latest for other requests.
func (c *Choice) evidence(s *ChoiceState, i int) []draft {
	drafts := s.recent[i]
	if s.fresh[i] {
		return drafts // a trial's own draft, not older ones
	}
	d := &c.Drafters[i]
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := len(d.recent) - 1; k >= 0 && len(drafts) < recentDrafts; k-- {
		if d.recent[k].owner != s {
			drafts = append(drafts[:len(drafts):len(drafts)], d.recent[k])
		}
	}
	return drafts
}

// Choose returns the drafter a request drafts with next, in a batch of
// seqs sequences (itself included) with the step times and commit cost
// given (Policy.StepCosts), among those not retired: first each drafter
// once, in order; then one not chosen for ReprobeSteps drafts (each a
// trial); else the one of the highest ExpectedSpeedup over its evidence
// (its recent drafts for the request, then for others), calibrated by its
// own calibration, with its own draft time. Ties go to the first. A
// drafter on trial that is not the one chosen so lost the trial, and is
// retired after RetireAfter lost trials.
func (c *Choice) Choose(s *ChoiceState, seqs int, stepMs func(rows int) float64, commitMs float64) int {
	for i, r := range s.recent {
		if !s.Retired(i) && (len(r) == 0 || s.since[i] >= ReprobeSteps) {
			s.trying[i] = true
			return i
		}
	}
	best, bestSpeedup := -1, 0.0
	for i := range c.Drafters {
		if s.Retired(i) {
			continue
		}
		d := &c.Drafters[i]
		evidence := c.evidence(s, i)
		calibrated := make([]Prediction, len(evidence))
		for k, r := range evidence {
			calibrated[k] = Prediction{Probs: d.Calibration.Calibrate(r.probs, r.depths)}
		}
		speedup := ExpectedSpeedup(calibrated, plainBatch(seqs-1), stepMs, commitMs, d.DraftMs())
		if best < 0 || speedup > bestSpeedup {
			best, bestSpeedup = i, speedup
		}
	}
	for i, trying := range s.trying {
		if trying && i != best {
			s.lost[i]++
		}
		s.trying[i] = false
	}
	return best
}

// Retired reports whether drafter i is retired for the request: it drafts
// for it no more, and needs none of its rows.
func (s *ChoiceState) Retired(i int) bool { return s.lost[i] >= RetireAfter }

// Drafted records that drafter i drafted for the request a tree of these
// raw path probabilities and depths (in tree order).
func (s *ChoiceState) Drafted(i int, probs []float64, depths []int32) {
	dr := draft{probs: probs, depths: depths, owner: s}
	if s.trying[i] {
		s.recent[i] = s.recent[i][:0]
	}
	s.fresh[i] = s.trying[i]
	s.recent[i] = latest(append(s.recent[i], dr))
	d := &s.choice.Drafters[i]
	d.mu.Lock()
	d.recent = latest(append(d.recent, dr))
	d.mu.Unlock()
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

// latest is the last recentDrafts of drafts.
func latest(drafts []draft) []draft { return drafts[max(0, len(drafts)-recentDrafts):] }
