package engine

import (
	"math"
	"time"

	"ddflash/adaptive"
	"ddflash/ddtree"
	"ddflash/mamba"
)

// The adaptive budget (SpecOptions.Policy): each drafting job builds the
// tree of the largest budget, and before the forward the policy cuts every
// job's tree to the prefix that maximises the batch's expected committed
// tokens per second (Build's tree of a smaller budget is that prefix). A
// job cut to the root takes an autoregressive step. Under --spec adaptive a
// job whose drafts stop paying on the whole stops drafting (adaptive.Backoff):
// its steps are then plain decoding steps, one row each with no draft, as in
// auto mode, but for the hidden-state taps, rows the forward computes anyway
// and that the next draft takes in at once; it drafts again only to probe,
// rarely enough that probing costs at most a small share of the batch's time.
// Only the proposal changes, never how the target's tokens are chosen, so
// decoding stays lossless.

// probeCap bounds the start-up cost measurement: once it has the two ends
// of the curve it stops adding points after this long.
const probeCap = 300 * time.Millisecond

// forwardBatch runs a batch, with the policy's allotment before it and the
// forward's time recorded after it (and the step's time around it, see
// adaptive.CostModel). jobs[i] prepared inputs[i].
func (e *Engine) forwardBatch(jobs []*job, inputs []SeqInput, taps []int) ([]SeqOutput, error) {
	p := e.Spec.Policy
	if p == nil {
		e.assignVerifies(jobs, inputs)
		return e.Model.Forward(inputs, taps)
	}
	decoding, drafted := e.allot(p, jobs, inputs)
	e.assignVerifies(jobs, inputs)
	start := time.Now()
	p.Cost.ForwardStarts(start, decoding, drafted)
	outs, err := e.Model.Forward(inputs, taps)
	end := time.Now()
	p.Cost.ForwardEnds(end, decoding && err == nil, drafted)
	rows := 0
	for _, in := range inputs {
		rows += len(in.Tokens)
	}
	// A step whose drafts were all cut to the root is plain in shape, but
	// it came after drafts, and the plain steps' curve is what a step
	// costs while none draft.
	if err == nil && decoding && (rows > len(inputs) || drafted == 0) {
		p.Cost.ObserveStep(len(inputs), rows, end.Sub(start))
	}
	return outs, err
}

// allot cuts the drafted jobs' trees to the policy's node counts, starts
// the drafting schedule of the jobs at their first decoding step, judged in
// its batch, and reports whether the batch is a pure decode step (no prompt
// chunk), whose time measures the verify cost, and how many jobs drafted.
func (e *Engine) allot(p *adaptive.Policy, jobs []*job, inputs []SeqInput) (bool, int) {
	var drafted []int
	var drafts []adaptive.Draft
	var rest adaptive.Rest
	decoding := true
	for i, j := range jobs {
		switch {
		case j.drafted:
			drafted = append(drafted, i)
			d := adaptive.Draft{Probs: pathProbs(j.tree), Depths: j.tree.Depths[1:]}
			if cs, ok := j.sess.(*choiceSession); ok {
				d.Drafter = cs.drafter()
			}
			drafts = append(drafts, d)
		case j.prefilling(): // a prompt chunk: rows that commit no output yet
			decoding = false
			rest.Seqs++
			rest.Rows += len(inputs[i].Tokens)
		default:
			rest.Seqs++
			rest.Rows += len(inputs[i].Tokens)
			rest.Tokens++
			if j.unscheduled {
				j.backoff, j.unscheduled = p.StartBackoff(len(jobs)), false
			}
		}
	}
	if len(drafted) == 0 {
		return decoding, 0
	}
	var backoffs []*adaptive.Backoff
	if p.Autoregressive {
		for _, i := range drafted {
			backoffs = append(backoffs, &jobs[i].backoff)
		}
	}
	nodes := p.Allot(drafts, rest, backoffs)
	for k, i := range drafted {
		n := nodes[k]
		if e.Model.records() {
			n = verifyBucket(n, jobs[i].tree.Len()-1)
		}
		jobs[i].tree = jobs[i].tree.Prefix(n)
		jobs[i].setProposal(&inputs[i])
	}
	return decoding, len(drafted)
}

// pathProbs are the tree's non-root nodes' path probabilities under the drafter.
func pathProbs(t *ddtree.Tree) []float64 {
	probs := make([]float64, t.Len()-1)
	for i := range probs {
		probs[i] = math.Exp(t.Scores[i+1])
	}
	return probs
}

// observeVerify calibrates the policy with a verified tree and the drafted
// tokens the target accepted, and times the commit that followed.
func (e *Engine) observeVerify(tree *ddtree.Tree, accepted int, commit time.Duration) {
	if p := e.Spec.Policy; p != nil && tree.Len() > 1 {
		p.Calibration.Observe(pathProbs(tree), tree.Depths[1:], accepted)
		p.Cost.ObserveCommit(commit)
	}
}

// measureCost gives an empty cost model its first curve: verify forwards
// of one row and of the largest tree (then points between while under
// probeCap), three times each, on a scratch sequence, after an untimed warm-up.
// Without a free state slot it leaves the curve to the first steps.
func (e *Engine) measureCost(p *adaptive.Policy) error {
	if c, ok := e.Drafter.(*ChoiceDrafter); ok && !c.measured() {
		if err := c.measureDrafts(e.Model.Cfg.HiddenSize, DraftBlock(e.Drafter, e.Spec.DraftDepth)); err != nil {
			return err
		}
	}
	if c := p.Cost.Costs(); len(c.Plain) > 0 && len(c.Extra) > 0 {
		return nil
	}
	seq, err := e.newSequence()
	if err != nil {
		return nil
	}
	defer e.release(seq)
	maxRows := e.Spec.VerifyTokens(e.Drafter.BlockSize())
	v, err := mamba.NewVerify(e.Model.States, e.Spec.Rollback, maxRows)
	if err != nil {
		return err
	}
	defer v.Close()
	if err := e.Model.KV.Reserve(&seq.kv, maxRows); err != nil {
		return err
	}
	run := func(rows int) (time.Duration, error) {
		in := SeqInput{KV: &seq.kv, Slot: seq.slot, Tokens: make([]int32, rows), Parents: make([]int32, rows), Logits: AllRows, Spec: v}
		for i := range in.Parents {
			in.Parents[i] = int32(i - 1)
		}
		start := time.Now()
		_, err := e.Model.Forward([]SeqInput{in}, e.Drafter.TapLayers())
		return time.Since(start), err
	}
	if _, err := run(1); err != nil {
		return err
	}
	start := time.Now()
	for i, rows := range []int{1, maxRows, (maxRows + 1) / 2, (maxRows + 3) / 4} {
		if i >= 2 && time.Since(start) > probeCap {
			break
		}
		for range 3 {
			d, err := run(rows)
			if err != nil {
				return err
			}
			p.Cost.ObserveStep(1, rows, d)
		}
	}
	return e.measureDraft(p)
}

// measureDraft times two steady drafts (one context row each) on a scratch
// drafter session.
func (e *Engine) measureDraft(p *adaptive.Policy) error {
	sess, err := e.newDraftSession([]int32{0})
	if err != nil {
		return err
	}
	defer sess.Close()
	row := make([]float32, e.featureWidth())
	for range 2 {
		start := time.Now()
		if _, err := draft(sess, row, []int32{0}, 0); err != nil {
			return err
		}
		p.Cost.ObserveDraft(time.Since(start), true)
	}
	return nil
}
