package adaptive

import (
	"math"
	"sync"
)

// Policy is an engine's adaptive speculation: the measured cost model and
// the acceptance calibration that every request's allotment uses.
type Policy struct {
	Cost        CostModel
	Calibration Calibration
	// Autoregressive lets the policy give a request no nodes, and let it
	// stop drafting for a while, when speculation does not pay (--spec
	// adaptive). Without it every drafted request gets at least one node
	// (--spec ddtree --budget auto).
	Autoregressive bool

	mu sync.Mutex
	// gain is the running gain of every request's drafts and interval the
	// latest probe interval: where a new request starts (StartBackoff).
	gain     float64
	drafts   int
	interval int
}

// Name is the policy's mode name in stats and reports.
func (p *Policy) Name() string {
	if p.Autoregressive {
		return "adaptive"
	}
	return "ddtree-auto"
}

// MinNodes is the fewest nodes a drafted request gets.
func (p *Policy) MinNodes() int {
	if p.Autoregressive {
		return 0
	}
	return 1
}

// Snapshot is the policy's printable state.
type Snapshot struct {
	Mode        string            `json:"mode"`
	StepMs      []Point           `json:"step_ms"` // the target's step time by rows
	DraftMs     float64           `json:"draft_ms"`
	CommitMs    float64           `json:"commit_ms"`
	OverheadMs  float64           `json:"overhead_ms"` // per step, outside forward, drafts and commits
	Calibration CalibrationReport `json:"calibration"`
}

// Snapshot returns the current cost curve and calibration.
func (p *Policy) Snapshot() Snapshot {
	points, draft, commit := p.Cost.Curve()
	return Snapshot{Mode: p.Name(), StepMs: points, DraftMs: draft, CommitMs: commit, OverheadMs: p.Cost.OverheadMs(), Calibration: p.Calibration.Report()}
}

// Allot chooses the node counts of a step's drafted requests, whose raw
// (drafter) path probabilities and depths are given in tree order, with the
// rest of the batch as given. The drafts are made, so their time does not
// count against verifying them (a commit does: it follows any node). It
// also returns each request's gain from its draft (DraftGains, where the
// draft does count) and the batch's probe interval, for its Backoff.
func (p *Policy) Allot(probs [][]float64, depths [][]int32, rest Rest) (nodes []int, gains []float64, interval int) {
	points, draft, commit := p.Cost.Curve()
	points, overhead := Monotone(points), p.Cost.OverheadMs()
	stepMs := func(rows int) float64 { return overhead + StepMs(points, rows) }
	reqs := make([]Request, len(probs))
	for i := range probs {
		reqs[i] = Request{Probs: p.Calibration.Calibrate(probs[i], depths[i]), Min: p.MinNodes()}
	}
	nodes = Allot(reqs, rest, stepMs, commit)
	gains = DraftGains(reqs, rest, nodes, stepMs, draft+commit)
	batch := len(reqs) + int(math.Round(rest.Tokens))
	interval = ProbeInterval(batch, draft, stepMs(rest.Rows+len(reqs)))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drafts == 0 {
		p.gain = optimism
	}
	for _, g := range gains {
		p.gain += gainSmoothing * (g - p.gain)
		p.drafts++
	}
	p.interval = interval
	return nodes, gains, interval
}

// StartBackoff is a new request's drafting schedule: drafting at once until
// the engine's drafts are seen not to pay.
func (p *Policy) StartBackoff() Backoff {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drafts == 0 {
		return StartBackoff(optimism, 1)
	}
	return StartBackoff(p.gain, p.interval)
}
