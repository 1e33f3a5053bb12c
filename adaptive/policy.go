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
	// Where a new request starts (StartBackoff): the engine's latest
	// drafts, the mean expected gain of the drafting requests of the latest
	// step that had any (seen), and that step's probe interval.
	recent   [][]float64
	gain     float64
	seen     bool
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
	StepMs      []Point           `json:"step_ms"`  // the target's step time by rows, for one sequence
	BatchMs     []Point           `json:"batch_ms"` // a plain decoding step's time by rows, one per sequence
	DraftMs     float64           `json:"draft_ms"`
	CommitMs    float64           `json:"commit_ms"`
	OverheadMs  float64           `json:"overhead_ms"` // per step, outside forward, drafts and commits
	Calibration CalibrationReport `json:"calibration"`
}

// Snapshot returns the current cost curves and calibration.
func (p *Policy) Snapshot() Snapshot {
	c := p.Cost.Costs()
	return Snapshot{Mode: p.Name(), StepMs: c.OneSequence(), BatchMs: c.Plain, DraftMs: c.DraftMs, CommitMs: c.CommitMs, OverheadMs: p.Cost.OverheadMs(), Calibration: p.Calibration.Report()}
}

// Allot chooses the node counts of a step's drafted requests, whose raw
// (drafter) path probabilities and depths are given in tree order, with the
// rest of the batch as given. The drafts are made, so their time does not
// count against verifying them (a commit does: it follows any node). Under
// --spec adaptive, backoffs are the drafted requests' schedules: each
// learns whether its next draft is expected to pay in this batch.
func (p *Policy) Allot(probs [][]float64, depths [][]int32, rest Rest, backoffs []*Backoff) []int {
	costs, overhead := p.Cost.Costs(), p.Cost.OverheadMs()
	draft, commit, seqs := costs.DraftMs, costs.CommitMs, rest.Seqs+len(probs)
	stepMs := func(rows int) float64 { return overhead + costs.StepMs(seqs, rows) }
	reqs := make([]Request, len(probs))
	for i := range probs {
		reqs[i] = Request{Probs: p.Calibration.Calibrate(probs[i], depths[i]), Min: p.MinNodes()}
	}
	nodes := Allot(reqs, rest, stepMs, commit)
	if backoffs == nil {
		return nodes
	}
	// Each request's next draft is judged beside the rest of the batch
	// decoding plainly. Beside the others' drafts, whose time dilutes its
	// own, every request of a batch could go on drafting where none should;
	// beside a prompt chunk, which a step takes once, any draft looks cheap.
	interval := ProbeInterval(seqs, draft, stepMs(seqs))
	others := Rest{Seqs: seqs - 1, Rows: seqs - 1, Tokens: float64(seqs - 1)}
	meanGain := 0.0
	for i, r := range reqs {
		backoffs[i].record(r.Probs)
		gain := ExpectedGain(backoffs[i].recent, others, stepMs, commit, draft)
		backoffs[i].Drafted(gain, interval)
		meanGain += gain / float64(len(reqs))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range reqs {
		p.recent = append(p.recent, r.Probs)
	}
	p.recent = p.recent[max(0, len(p.recent)-recentDrafts):]
	p.gain, p.seen, p.interval = meanGain, true, interval
	return nodes
}

// StartBackoff is a new request's drafting schedule: drafting at once
// before any draft was seen.
func (p *Policy) StartBackoff() Backoff {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.seen {
		return Backoff{}
	}
	return StartBackoff(p.recent, p.gain, p.interval)
}
