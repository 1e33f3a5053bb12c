package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"ddflash/adaptive"
	"ddflash/ddtree"
	"ddflash/mamba"
	"ddflash/prefixtree"
)

// job is one request's decoding state machine. Each round, prepare says what
// the request feeds the target next (a prompt chunk, one token, or a
// speculative proposal), the caller runs the target over a batch of such
// inputs, and complete consumes the request's share of the output. Generate
// drives one job; the Scheduler batches many.
//
// In spec modes every emitted token is the target's own choice at its
// position (argmax, or a sample of the target's distribution drawn at each
// visited tree node), so greedy output equals autoregressive output and
// sampled output has the target's distribution.
type job struct {
	e   *Engine
	out *output
	seq *sequence

	prefilled int // prompt tokens fed so far
	chunk     int // prompt tokens in the input being computed
	// checkpointAt is the prompt length at which the prefix cache stores
	// the prompt (0: it does not); cacheNode is the cached prefix the job
	// holds locked.
	checkpointAt int
	cacheNode    *prefixtree.Node
	// checkpointOnly marks a checkpoint prefill (see newCheckpointJob): it
	// feeds its prompt to cache it and ends without sampling.
	checkpointOnly bool

	last int32 // newest token: the next input (autoregressive) or the anchor (spec)
	// context is the drafter context of the tokens committed since the
	// last draft (spec): their rows of the target's features. Its memory is
	// reused from draft to draft.
	context []float32
	// contextTokens are the tokens of context's rows.
	contextTokens []int32

	sess DraftSession
	// claimed says the job holds a claim on a verify scratch (claimVerify,
	// at its first draft); verify is the one its step verifies in
	// (assignVerifies).
	claimed bool
	verify  *mamba.Verify
	tree    *ddtree.Tree // the proposal in flight
	stats   *SpecStats
	// drafted says the proposal in flight comes from a draft; under an
	// adaptive policy a step may skip the drafter (backoff says when). Its
	// backoff starts at its first decoding step, a plain one (unscheduled
	// until then): by then the requests that came with it are in the batch.
	drafted     bool
	backoff     adaptive.Backoff
	unscheduled bool

	started, decodeStart, verifyStart time.Time
	finished                          bool
}

func (e *Engine) newJob(r Request) (*job, error) { return e.startJob(r, false) }

func (e *Engine) startJob(r Request, checkpointOnly bool) (*job, error) {
	if err := e.CheckRequest(r); err != nil {
		return nil, err
	}
	j := &job{e: e, out: newOutput(e, r), started: time.Now(), checkpointOnly: checkpointOnly, context: e.contexts.get()}
	if e.Spec.Mode != SpecAuto {
		if e.Drafter == nil {
			return nil, fmt.Errorf("spec mode %s needs a drafter (--draft)", e.Spec.Mode)
		}
		if need := e.Spec.VerifyTokens(e.Drafter.BlockSize()); need > e.opts.VerifyTokens {
			return nil, fmt.Errorf("engine sized for %d verify tokens, spec mode %s needs %d", e.opts.VerifyTokens, e.Spec.Mode, need)
		}
	}
	if p := e.Spec.Policy; p != nil {
		if e.Spec.Mode != SpecTree {
			return nil, fmt.Errorf("an adaptive budget needs spec mode ddtree, not %s", e.Spec.Mode)
		}
		if err := e.measureCost(p); err != nil {
			return nil, fmt.Errorf("measuring the verify cost: %w", err)
		}
		j.unscheduled = p.Autoregressive && !checkpointOnly
	}
	var err error
	if j.seq, err = e.newSequence(); err != nil {
		return nil, err
	}
	// From here the job holds a slot and pages: give them back unless it is
	// returned, on an error or a panic alike.
	built := false
	defer func() {
		if !built {
			j.close()
		}
	}()
	if c := e.activePrefix(); c != nil {
		c.reuse(e, j)
	}
	if e.Spec.Mode == SpecAuto || checkpointOnly {
		built = true
		return j, nil
	}
	j.stats = &SpecStats{Mode: e.Spec.Name()}
	if e.Spec.Mode == SpecTree {
		j.stats.Budget = e.Spec.Budget
	}
	j.out.res.Stats.SpecStats = j.stats
	if j.sess, err = e.newDraftSession(r.Prompt); err != nil {
		return nil, err
	}
	if _, ok := j.sess.(*choiceSession); ok && e.Spec.Policy == nil {
		return nil, errors.New("a choice among drafters needs an adaptive policy (--spec adaptive)")
	}
	built = true
	return j, nil
}

// close returns the job's KV pages, state slot and drafter context.
func (j *job) close() {
	if j.sess != nil {
		j.sess.Close()
	}
	j.e.contexts.put(j.context, j.e.MaxSeqs())
	j.context = nil
	if j.claimed { // the scratch stays for later requests (claimVerify)
		j.e.verifies.claims--
		j.claimed = false
	}
	j.verify = nil
	if j.e.prefix != nil {
		j.e.prefix.unlock(j)
	}
	if j.seq != nil {
		j.e.release(j.seq)
		j.seq = nil
	}
}

func (j *job) done() bool { return j.finished }

// taps are the layers whose hidden states the job needs from the target.
func (j *job) taps() []int {
	if j.sess == nil && (!j.checkpointOnly || j.e.featureWidth() == 0) {
		return nil
	}
	return j.e.Drafter.TapLayers()
}

// absorber is the job's session when it takes its tapped rows on the
// device (Engine.DeviceTaps), else nil.
func (j *job) absorber() TapAbsorber {
	if a, ok := j.sess.(TapAbsorber); ok && j.e.DeviceTaps {
		return a
	}
	return nil
}

// draftsNow reports whether the job drafts this step (see adaptive.Backoff).
func (j *job) draftsNow() bool {
	p := j.e.Spec.Policy
	return p == nil || (!j.unscheduled && p.Draft(&j.backoff))
}

// prefilling reports whether prompt tokens remain to be fed.
func (j *job) prefilling() bool { return j.prefilled < len(j.out.r.Prompt) }

// prepare returns the job's next target input, with KV pages reserved. A
// prompt is fed at most maxChunk tokens at a time.
func (j *job) prepare(maxChunk int) (SeqInput, error) {
	e, prompt := j.e, j.out.r.Prompt
	in := SeqInput{Start: j.seq.len, KV: &j.seq.kv, Slot: j.seq.slot}
	switch {
	case j.prefilled < len(prompt):
		end := j.prefillEnd(maxChunk)
		j.chunk = end - j.prefilled
		in.Tokens, in.Logits = prompt[j.prefilled:end], NoRows
		if end == len(prompt) && !j.checkpointOnly {
			in.Logits = LastRow
		}
	case j.sess == nil:
		in.Tokens, in.Logits = []int32{j.last}, LastRow
	default:
		// A verify scratch is claimed at the first draft: a request that
		// never drafts needs none.
		room := j.draftRoom()
		if j.drafted = room > 0 && j.draftsNow(); j.drafted && !j.claimed {
			if err := e.claimVerify(); err != nil {
				return in, err
			}
			j.claimed = true
		}
		td := time.Now()
		steady := true
		if j.drafted {
			// A verify commits at most a block: more context rows are catch-up.
			steady = len(j.context) <= e.Drafter.BlockSize()*e.featureWidth()
			var err error
			j.tree, err = e.propose(j.sess, j.context, j.contextTokens, j.last, room)
			if err != nil {
				return in, err
			}
			j.context, j.contextTokens = j.context[:0], j.contextTokens[:0]
		} else {
			// An autoregressive step: the drafter sees its features with the next draft.
			j.tree = ddtree.Chain(j.last, nil)
		}
		j.verifyStart = time.Now()
		j.stats.DraftMs += ms(j.verifyStart.Sub(td))
		if p := e.Spec.Policy; p != nil && j.drafted {
			p.Cost.ObserveDraft(j.verifyStart.Sub(td), steady)
		}
		j.setProposal(&in)
		in.KeepTaps = j.absorber() != nil
	}
	if in.Logits != NoRows {
		in.Top = j.out.deviceTop()
	}
	if err := e.reserveKV(&j.seq.kv, j.seq.len+len(in.Tokens)); err != nil {
		return in, err
	}
	return in, nil
}

// draftRoom is how deep the job's next draft may go: no deeper than the
// caches hold, nor than its reply has tokens left (a verify accepting d
// nodes emits d+1 tokens, the bonus included; a node past max tokens would
// be verified, counted as accepted and thrown away). At 0 the step decodes
// plainly.
func (j *job) draftRoom() int {
	left := j.out.r.MaxTokens - len(j.out.res.Tokens) - 1
	return min(j.e.Context-1-j.seq.len, left)
}

// prefillEnd is where the next prompt chunk ends: at most maxChunk tokens
// on (but at least to the next GDN chunk boundary), at a GDN chunk boundary
// unless it is the prompt's end, and at the prefix checkpoint when it
// passes it. Chunk-aligned forwards keep prefill exact across prefix reuse
// (see gdnChain).
func (j *job) prefillEnd(maxChunk int) int {
	n := len(j.out.r.Prompt)
	end := min(j.prefilled+maxChunk, n)
	if end < n {
		end = min(max(end/gdnChunk, j.prefilled/gdnChunk+1)*gdnChunk, n)
	}
	if j.checkpointAt > j.prefilled && j.checkpointAt < end {
		end = j.checkpointAt
	}
	return end
}

// setProposal makes the input verify the proposal in flight, in the
// scratch the step assigns (assignVerifies). A proposal of the root alone
// is a plain decoding step, which the forward commits itself: the
// autoregressive computation, without a verify to commit.
func (j *job) setProposal(in *SeqInput) {
	in.Tokens, in.Logits, in.Spec, in.Parents = j.tree.Tokens, AllRows, nil, nil
	if j.verifies() && j.e.Spec.Mode == SpecTree {
		in.Parents = j.tree.Parents
	}
}

// verifies reports whether the job's step verifies a proposal: it is past
// its prompt, drafts, and its proposal goes beyond the root.
func (j *job) verifies() bool {
	return j.sess != nil && !j.prefilling() && j.tree != nil && j.tree.Len() > 1
}

// complete consumes the target's output for the input prepare returned.
func (j *job) complete(out *SeqOutput) error {
	e, prompt := j.e, j.out.r.Prompt
	switch {
	case j.prefilled < len(prompt):
		n := j.chunk
		j.prefilled += n
		j.seq.len += n
		if j.taps() != nil {
			j.context = append(j.context, out.Features...)
			j.contextTokens = append(j.contextTokens, prompt[j.prefilled-n:j.prefilled]...)
		}
		if j.prefilled == j.checkpointAt {
			e.prefix.store(e, j)
		}
		if j.prefilled < len(prompt) {
			return nil
		}
		if j.checkpointOnly {
			j.finished = true
			return nil
		}
		j.out.res.Stats.PrefillMs = ms(time.Since(j.started))
		j.decodeStart = time.Now()
		if err := j.next(out); err != nil {
			return err
		}
	case j.sess == nil:
		j.seq.len++
		if err := j.next(out); err != nil {
			return err
		}
	default:
		return j.completeVerify(out)
	}
	if j.finished {
		j.finish()
	}
	return nil
}

// next chooses and emits the token after the output from a step's one logit row.
func (j *job) next(out *SeqOutput) error {
	tok, err := j.out.choose(out, 0, nil)
	if err != nil {
		return err
	}
	j.last = tok
	j.finished = j.out.emit(tok, j.out.rowLogits(out, 0))
	return nil
}

// completeVerify walks the proposal with the target's tokens, commits the
// accepted path and emits its tokens and the bonus.
func (j *job) completeVerify(out *SeqOutput) error {
	e, tree := j.e, j.tree
	// Each visited node's distribution is processed along its own path.
	var walkErr error
	path, bonus := tree.Walk(func(node int32) int32 {
		if walkErr != nil {
			return -1 // no child has this token: the walk stops
		}
		tok, err := j.out.choose(out, int(node), draftedPath(tree, node))
		walkErr = err
		return tok
	})
	if walkErr != nil {
		return walkErr
	}
	tc := time.Now()
	if tree.Len() == 1 { // a plain step (setProposal): the forward committed the root
		j.seq.len++
		e.Model.KV.Truncate(&j.seq.kv, j.seq.len)
	} else if err := e.commit(j.seq, j.verify, path); err != nil {
		return err
	}
	j.stats.VerifyMs += ms(time.Since(j.verifyStart))
	j.stats.record(path, tree.Len()-1)
	if j.drafted {
		e.observeVerify(tree, len(path)-1, time.Since(tc))
		if o, ok := j.sess.(*choiceSession); ok {
			o.verified(tree, len(path)-1)
		}
	}
	for i := 1; i <= len(path) && !j.finished; i++ {
		tok := bonus
		if i < len(path) {
			tok = tree.Tokens[path[i]]
		}
		j.finished = j.out.emit(tok, j.out.rowLogits(out, int(path[i-1])))
	}
	if err := j.takeContext(out, path); err != nil {
		return err
	}
	j.last = bonus
	if j.finished {
		j.finish()
	}
	return nil
}

// takeContext keeps the committed rows' features (rows lists them) for the
// next draft, or hands them to a session that takes them on the device,
// with any prompt rows it has not drafted after yet.
func (j *job) takeContext(out *SeqOutput, rows []int32) error {
	if a := j.absorber(); a != nil {
		stepRows := make([]int32, len(rows))
		for i, r := range rows {
			stepRows[i] = int32(out.TapRow) + r
		}
		if err := a.Absorb(j.context, out.Taps, stepRows); err != nil {
			return err
		}
		j.context, j.contextTokens = j.context[:0], j.contextTokens[:0]
		return nil
	}
	width := j.e.featureWidth()
	for _, r := range rows {
		j.context = append(j.context, out.Features[int(r)*width:int(r+1)*width]...)
		j.contextTokens = append(j.contextTokens, j.tree.Tokens[r])
	}
	return nil
}

func (j *job) finish() {
	if j.stats != nil {
		j.stats.finish(j.e.Drafter.BlockSize())
		if p := j.e.Spec.Policy; p != nil {
			s := p.Snapshot()
			j.stats.Policy = &s
		}
	}
	took := time.Since(j.decodeStart)
	if cs, ok := j.sess.(*choiceSession); ok {
		cs.finished(len(j.out.res.Tokens), took)
	}
	j.out.finish(took)
}

func (j *job) result() *Result { return j.out.res }

// draftedPath is the drafted tokens from the tree's root (excluded: it is
// the anchor, already output) down to node.
func draftedPath(tree *ddtree.Tree, node int32) []int32 {
	var toks []int32
	for n := node; n > 0; n = tree.Parents[n] {
		toks = append(toks, tree.Tokens[n])
	}
	slices.Reverse(toks)
	return toks
}
