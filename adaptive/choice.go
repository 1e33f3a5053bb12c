package adaptive

import (
	"math"
	"sync"
	"time"
)

// Choice is the choice among an engine's drafters (--spec adaptive with
// several loaded, such as the target's MTP head and a DFlash drafter). A
// request drafts with one of them from its first draft to its end (Pick):
// the one whose latest requests decoded fastest (tokens per second of
// decoding, measured: Finished), or among drafters as fast as it within
// speedTie the one whose drafts cost least, except every ExploreEvery-th
// request,
// which goes to each drafter in turn so that every one's speed stays
// current. Within the request the adaptive policy judges each draft by its
// drafter's own calibration and draft cost (Draft.Drafter), as it cuts
// and stops drafts.
//
// Why per request and measured speed (docs/adaptive.md): a choice per step
// by each drafter's calibrated drafts kept every drafter's session in the
// running (its catch-up forward over the rows it missed, its trials) and
// judged the drafter not chosen by one trial draft against the chosen
// one's window of drafts; on the demo pair it ran at 0.90× DFlash alone,
// below both drafters alone, in every sweep.
type Choice struct {
	Drafters []DrafterStats

	mu       sync.Mutex
	requests int         // requests picked for
	speeds   [][]float64 // per drafter, its latest requests' speeds (at most speedWindow)
}

// NewChoice returns the choice among n drafters.
func NewChoice(n int) *Choice {
	return &Choice{Drafters: make([]DrafterStats, n), speeds: make([][]float64, n)}
}

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

const (
	// ExploreEvery: every ExploreEvery-th request drafts with the drafters
	// in turn, whatever their speeds. Prime, so that a workload cycling
	// through prompts does not explore on the same few (bench's 12).
	ExploreEvery = 7
	// minSpeeds is how many requests each drafter must have finished
	// before speeds choose; until then requests go round.
	minSpeeds = 2
	// speedWindow is how many of a drafter's latest requests its speed is
	// the mean of.
	speedWindow = 16
	// minSpeedTokens: a request of fewer tokens says too little about a
	// drafter's speed to count.
	minSpeedTokens = 8
	// speedTie: drafters whose mean speeds are within this share of the
	// fastest's are as fast as their requests can tell (one request's
	// speed varies by prompt by more). Among them the one whose drafts
	// cost least is picked: a costlier drafter's drafts, and its catch-up
	// over the rows since a request's last draft, slow every request
	// batched with its own, which its own speed does not show (on the
	// demo pair at concurrency 4, where speculation stops paying, both
	// drafters' requests ran within 1.5 % of each other and a coin flip
	// between them cost 7 % of the batch's speed). At most this share of
	// speed is given up when the costlier drafter really is faster.
	speedTie = 0.03
)

// Pick returns the drafter a new request drafts with.
func (c *Choice) Pick() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, n := c.requests, len(c.Drafters)
	c.requests++
	for _, s := range c.speeds {
		if len(s) < minSpeeds {
			return k % n
		}
	}
	if k%ExploreEvery == 0 {
		return k / ExploreEvery % n
	}
	fastest := 0.0
	for _, s := range c.speeds {
		fastest = max(fastest, mean(s))
	}
	best, bestCost, bestSpeed := -1, 0.0, 0.0
	for i, s := range c.speeds {
		speed, cost := mean(s), c.Drafters[i].DraftMs()
		if speed < fastest*(1-speedTie) {
			continue
		}
		if cost == 0 { // not measured: no cheaper than any
			cost = math.Inf(1)
		}
		if best < 0 || cost < bestCost || cost == bestCost && speed > bestSpeed {
			best, bestCost, bestSpeed = i, cost, speed
		}
	}
	return best
}

// Finished records that a request drafted with drafter i decoded tokens
// tokens in took (from its first decoding step to its end).
func (c *Choice) Finished(i, tokens int, took time.Duration) {
	if tokens < minSpeedTokens || took <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := append(c.speeds[i], float64(tokens)/took.Seconds())
	c.speeds[i] = s[max(0, len(s)-speedWindow):]
}

func mean(v []float64) float64 {
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}
