package adaptive

import "sync"

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
	// recent are the engine's latest drafts, where a new request starts
	// (StartBackoff); seen says there were any.
	recent []Prediction
	seen   bool
	probes Probes
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
	StepMs      []Point           `json:"step_ms"`  // the target's step time by rows, for one sequence
	BatchMs     []Point           `json:"batch_ms"` // a plain decoding step's time by rows, one per sequence
	DraftMs     float64           `json:"draft_ms"`
	CommitMs    float64           `json:"commit_ms"`   // per speculating request: its commit and bookkeeping
	OverheadMs  float64           `json:"overhead_ms"` // per plain step, outside the forward
	Calibration CalibrationReport `json:"calibration"`
	Schedule    ScheduleReport    `json:"schedule"` // the probe schedule (--spec adaptive)
}

// Snapshot returns the current cost curves, calibration and probe schedule.
func (p *Policy) Snapshot() Snapshot {
	c := p.Cost.Costs()
	p.mu.Lock()
	schedule := p.probes.Report()
	p.mu.Unlock()
	return Snapshot{Mode: p.Name(), StepMs: c.OneSequence(), BatchMs: c.Plain, DraftMs: c.DraftMs, CommitMs: c.CommitMs, OverheadMs: p.Cost.OverheadMs(), Calibration: p.Calibration.Report(), Schedule: schedule}
}

// Draft is a drafted request's tree as its drafter scored it: the raw path
// probabilities and depths of its nodes (root excluded), in tree order,
// and, under a Choice, the drafter that drafted it, whose own calibration
// and draft time judge it (nil: the policy's).
type Draft struct {
	Probs   []float64
	Depths  []int32
	Drafter *DrafterStats
}

// calibration is what calibrates d's predictions: its drafter's, else the
// policy's.
func (p *Policy) calibration(d Draft) *Calibration {
	if d.Drafter != nil {
		return &d.Drafter.Calibration
	}
	return &p.Calibration
}

// Allot chooses the node counts of a step's drafted requests, with the
// rest of the batch as given. The drafts are made, so their time does not
// count against verifying them (a commit does: it follows any node). Under
// --spec adaptive, backoffs are the drafted requests' schedules: each
// learns whether its next draft is expected to pay in this batch. A probe
// verifies at least one node, so that the calibration goes on learning
// while requests do not draft.
func (p *Policy) Allot(drafts []Draft, rest Rest, backoffs []*Backoff) []int {
	seqs := rest.Seqs + len(drafts)
	costs, stepMs := p.batchCosts(seqs)
	reqs := make([]Request, len(drafts))
	for i, d := range drafts {
		reqs[i] = Request{Probs: p.calibration(d).Calibrate(d.Probs, d.Depths), Min: p.MinNodes()}
		if backoffs != nil && backoffs[i].probing {
			reqs[i].Min = 1
		}
	}
	nodes := Allot(reqs, rest, stepMs, costs.CommitMs)
	if backoffs == nil {
		return nodes
	}
	// Each request's next draft is judged beside the rest of the batch
	// decoding plainly. Beside the others' drafts, whose time dilutes its
	// own, every request of a batch could go on drafting where none should;
	// beside a prompt chunk, which a step takes once, any draft looks cheap.
	interval := ProbeInterval(seqs, costs.ProbeMs, stepMs(seqs))
	gains := make([]float64, len(reqs))
	predictions := make([]Prediction, len(reqs))
	for i, r := range reqs {
		predictions[i] = Prediction{Probs: r.Probs, Drafter: drafts[i].Drafter}
		backoffs[i].record(predictions[i])
		gains[i] = ExpectedGain(backoffs[i].recent, plainBatch(seqs-1), stepMs, costs.CommitMs, costs.DraftMs)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range reqs {
		p.probes.judge(backoffs[i], gains[i], interval)
		p.recent = append(p.recent, predictions[i])
	}
	p.recent = p.recent[max(0, len(p.recent)-recentDrafts):]
	p.seen = true
	return nodes
}

// Draft reports whether a request drafts this step: every step unless it
// stopped, then when the engine's probe schedule gives it a probe.
func (p *Policy) Draft(b *Backoff) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probes.draft(b)
}

// batchCosts are the current cost estimates and the step time by rows in a
// batch of seqs sequences.
func (p *Policy) batchCosts(seqs int) (Costs, func(rows int) float64) {
	costs, overhead := p.Cost.Costs(), p.Cost.OverheadMs()
	return costs, func(rows int) float64 { return overhead + costs.StepMs(seqs, rows) }
}

// plainBatch is seqs sequences decoding plainly: a row and a token each.
func plainBatch(seqs int) Rest { return Rest{Seqs: seqs, Rows: seqs, Tokens: float64(seqs)} }

// StartBackoff is the drafting schedule of a new request that starts
// decoding in a batch of seqs sequences, itself included: drafting at once
// before any draft was seen, else as the engine's recent drafts, taken as
// its own, are expected to pay in that batch (or stopped, waiting for the
// engine's next probe).
func (p *Policy) StartBackoff(seqs int) Backoff {
	p.mu.Lock()
	recent, seen := p.recent, p.seen
	p.mu.Unlock()
	if !seen {
		return Backoff{}
	}
	costs, stepMs := p.batchCosts(seqs)
	gain := ExpectedGain(recent, plainBatch(seqs-1), stepMs, costs.CommitMs, costs.DraftMs)
	return StartBackoff(recent, gain)
}
