package engine

import (
	"context"
	"fmt"
	"time"

	"ddflash/ddtree"
	"ddflash/mamba"
)

// DraftSession is one sequence's drafter state.
type DraftSession interface {
	// Draft takes the tapped features of the tokens committed since the last
	// call (rows in order, each the tap layers' hidden states concatenated)
	// and the anchor (the newest committed token, not yet fed to the target),
	// and returns BlockSize-1 rows of logits over the target vocabulary: the
	// drafter's distributions for the tokens after the anchor.
	Draft(features []float32, anchor int32) ([]float32, error)
	Close()
}

// Drafter proposes blocks of tokens conditioned on the target's hidden states.
type Drafter interface {
	TapLayers() []int
	BlockSize() int
	NewSession() (DraftSession, error)
}

// SpecMode selects the decoding method.
type SpecMode int

const (
	// SpecAuto is plain autoregressive decoding.
	SpecAuto SpecMode = iota
	// SpecLinear verifies the drafter's greedy chain (DFlash).
	SpecLinear
	// SpecTree verifies a DDTree built from the drafter's distributions.
	SpecTree
)

func (m SpecMode) String() string {
	return [...]string{"auto", "linear", "ddtree"}[m]
}

// ParseSpecMode reads auto, linear or ddtree.
func ParseSpecMode(s string) (SpecMode, error) {
	for m := SpecAuto; m <= SpecTree; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("spec mode %q: want auto, linear or ddtree", s)
}

// SpecOptions configures speculative decoding.
type SpecOptions struct {
	Mode     SpecMode
	Budget   int // DDTree: non-root tree nodes per verify (B)
	Rollback mamba.Strategy
	// NoChainSeed builds the tree purely best-first; by default the drafter's
	// greedy chain is inserted first so the tree contains the linear proposal.
	NoChainSeed bool
}

// VerifyTokens is the most tokens one verify step feeds the target.
func (o SpecOptions) VerifyTokens(blockSize int) int {
	switch o.Mode {
	case SpecLinear:
		return blockSize
	case SpecTree:
		return o.Budget + 1
	}
	return 0
}

// SpecStats describes a speculative generation.
type SpecStats struct {
	Mode string `json:"spec"`
	// AcceptanceLength τ: tokens produced per verify (accepted drafts + the bonus).
	AcceptanceLength float64 `json:"acceptance_length"`
	VerifySteps      int     `json:"verify_steps"`
	// PerPositionAcceptance[k] is the share of verify steps that accepted at
	// least k+1 drafted tokens (k+1 = depth in a tree).
	PerPositionAcceptance []float64 `json:"per_position_acceptance"`
	DraftMs               float64   `json:"draft_ms"`
	VerifyMs              float64   `json:"verify_ms"`
	Budget                int       `json:"budget,omitempty"`
	TreeNodes             float64   `json:"tree_nodes,omitempty"` // mean proposed nodes per verify, root excluded
	accepted              []int
	produced, nodes       int
}

func (st *SpecStats) record(path []int32, treeNodes int) {
	a := len(path) - 1
	for len(st.accepted) < a {
		st.accepted = append(st.accepted, 0)
	}
	for k := 0; k < a; k++ {
		st.accepted[k]++
	}
	st.VerifySteps++
	st.produced += len(path)
	st.nodes += treeNodes
}

func (st *SpecStats) finish(blockSize int) {
	if st.VerifySteps == 0 {
		return
	}
	st.AcceptanceLength = float64(st.produced) / float64(st.VerifySteps)
	st.PerPositionAcceptance = make([]float64, blockSize-1)
	for k, n := range st.accepted {
		st.PerPositionAcceptance[k] = float64(n) / float64(st.VerifySteps)
	}
	if st.Budget > 0 {
		st.TreeNodes = float64(st.nodes) / float64(st.VerifySteps)
	}
}

// generateSpec decodes with draft-then-verify rounds. Every emitted token is
// the target's own choice at its position (argmax, or a sample of the
// target's distribution), so greedy output equals autoregressive output and
// sampled output has the target's distribution.
func (e *Engine) generateSpec(ctx context.Context, r Request, onToken func(int32)) (*Result, error) {
	d := e.Drafter
	if d == nil {
		return nil, fmt.Errorf("spec mode %s needs a drafter (--draft)", e.Spec.Mode)
	}
	Q := d.BlockSize()
	maxNodes := e.Spec.VerifyTokens(Q)
	if maxNodes > e.opts.VerifyTokens {
		return nil, fmt.Errorf("engine sized for %d verify tokens, spec mode %s needs %d", e.opts.VerifyTokens, e.Spec.Mode, maxNodes)
	}
	seq, err := e.newSequence()
	if err != nil {
		return nil, err
	}
	defer e.release(seq)
	sess, err := d.NewSession()
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	verify, err := mamba.NewVerify(e.Model.b, e.Model.States.Shape(), e.Spec.Rollback, maxNodes)
	if err != nil {
		return nil, err
	}
	defer verify.Close()

	out := newOutput(e, r, onToken)
	st := &SpecStats{Mode: e.Spec.Mode.String()}
	if e.Spec.Mode == SpecTree {
		st.Budget = e.Spec.Budget
	}
	out.res.Stats.SpecStats = st
	taps := d.TapLayers()
	t0 := time.Now()
	logits, features, err := e.prefill(seq, r.Prompt, taps)
	if err != nil {
		return nil, err
	}
	out.res.Stats.PrefillMs = ms(time.Since(t0))
	t1 := time.Now()
	anchor := out.sampler.Sample(logits)
	done := out.emit(anchor, logits)
	V := e.Model.Cfg.VocabSize
	for !done {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		td := time.Now()
		draft, err := sess.Draft(features, anchor)
		if err != nil {
			return nil, err
		}
		// Positions start..start+depth must stay inside the context.
		depth := min(Q-1, e.Context-1-seq.len)
		tree := e.propose(anchor, draft, depth)
		tv := time.Now()
		st.DraftMs += ms(tv.Sub(td))

		in := SeqInput{Tokens: tree.Tokens, Logits: AllRows, Spec: verify}
		if e.Spec.Mode == SpecTree {
			in.Parents = tree.Parents
		}
		vout, err := e.forward(seq, in, taps)
		if err != nil {
			return nil, err
		}
		path, bonus := tree.Walk(func(node int32) int32 {
			return out.sampler.Sample(vout.Logits[int(node)*V : int(node+1)*V])
		})
		if err := e.commit(seq, verify, path); err != nil {
			return nil, err
		}
		st.VerifyMs += ms(time.Since(tv))
		st.record(path, tree.Len()-1)

		for i := 1; i <= len(path) && !done; i++ {
			tok := bonus
			if i < len(path) {
				tok = tree.Tokens[path[i]]
			}
			row := int(path[i-1])
			done = out.emit(tok, vout.Logits[row*V:(row+1)*V])
		}
		features = e.features(vout, taps, path, 0)
		anchor = bonus
	}
	st.finish(Q)
	return out.finish(time.Since(t1)), nil
}

// propose turns the drafter's logits into the proposal to verify, rooted at
// the anchor and at most depth tokens deep.
func (e *Engine) propose(anchor int32, draft []float32, depth int) *ddtree.Tree {
	V := e.Model.Cfg.VocabSize
	if e.Spec.Mode == SpecLinear {
		drafts := make([]int32, depth)
		for i := range drafts {
			drafts[i] = int32(Argmax(draft[i*V : i*V+e.ValidVocab]))
		}
		return ddtree.Chain(anchor, drafts)
	}
	levels := make([][]ddtree.Candidate, depth)
	for i := range levels {
		levels[i] = ddtree.TopK(draft[i*V:(i+1)*V], e.ValidVocab, e.Spec.Budget)
	}
	return ddtree.Build(anchor, levels, e.Spec.Budget, !e.Spec.NoChainSeed)
}

// commit keeps the accepted path of a verify: GDN states, KV compaction and
// the sequence length; the rejected nodes' KV pages are returned.
func (e *Engine) commit(s *sequence, verify *mamba.Verify, path []int32) error {
	if err := verify.Commit(e.Model.States, s.slot, path); err != nil {
		return err
	}
	if err := e.Model.CommitKV(&s.kv, s.len, path); err != nil {
		return err
	}
	s.len += len(path)
	e.Model.KV.Truncate(&s.kv, s.len)
	return nil
}
