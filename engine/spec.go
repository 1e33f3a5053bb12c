package engine

import (
	"fmt"

	"ddflash/adaptive"
	"ddflash/ddtree"
	"ddflash/kernels"
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

// TopDraftSession is a DraftSession that reduces its rows where it runs:
// DraftTop drafts as Draft does and returns, for each of the BlockSize-1
// proposal rows, its k most likely tokens among the first valid ids with
// their log-probabilities, best first (ties: the lower id), as ddtree.TopK
// computes them from Draft's logits. A drafter on the device brings home
// those k candidates a row instead of the row.
type TopDraftSession interface {
	DraftSession
	DraftTop(features []float32, anchor int32, valid, k int) ([][]ddtree.Candidate, error)
}

// LatticeSession is a DraftSession whose proposals are paths through a
// candidate lattice (DFlash2's selector): its Lattice, for the latest
// Draft, replaces the logits' argmax chain and top-k levels (nil: the
// latest draft has none). The lattice
// is deterministic given the drafter's input, so at T > 0 the proposal is
// a point mass and the sample-and-match verify stays exact (docs/dflash2.md).
type LatticeSession interface {
	Lattice() *ddtree.Lattice
}

// TokenDraftSession is a DraftSession that also reads the tokens of its
// feature rows: an MTP head pairs each committed token's hidden state with
// the token after it (the next row's token, the anchor for the last row).
// The engine calls DraftTokens instead of Draft on such a session.
type TokenDraftSession interface {
	DraftSession
	DraftTokens(features []float32, tokens []int32, anchor int32) ([]float32, error)
}

// TapAbsorber is a DraftSession that takes the target's tapped rows where
// the step left them, on the model's rank-0 backend (the drafter's): where
// the engine keeps taps on the device (Engine.DeviceTaps), a drafting job
// hands each verify's accepted rows over as the verify completes, and they
// never come home.
type TapAbsorber interface {
	DraftSession
	// Absorb takes newly committed tokens into the context: the rows of
	// features (on the host, as Draft takes them), then the rows of taps
	// (a step's SeqOutput.Taps, the whole step's) that rows lists, in that
	// order. A later draft runs after them, given no features of theirs
	// again.
	Absorb(features []float32, taps kernels.Buffer, rows []int32) error
}

// DraftBlock is the block d drafts when proposals are capped at depth
// tokens (SpecOptions.DraftDepth; 0: no cap): depth+1 rows for a
// BlockDrafter whose own block is longer, else its own block.
func DraftBlock(d Drafter, depth int) int {
	if _, ok := d.(BlockDrafter); ok && depth > 0 && depth+1 < d.BlockSize() {
		return depth + 1
	}
	return d.BlockSize()
}

// newDraftSession starts a request's drafting state, DraftDepth deep when
// the drafter can draft a shorter block than its own.
func (e *Engine) newDraftSession(prompt []int32) (DraftSession, error) {
	return blockSession(e.Drafter, prompt, DraftBlock(e.Drafter, e.Spec.DraftDepth))
}

// blockSession starts d's session drafting block rows when d can draft a
// shorter block than its own, else its own block.
func blockSession(d Drafter, prompt []int32, block int) (DraftSession, error) {
	if bd, ok := d.(BlockDrafter); ok && block < d.BlockSize() {
		return bd.NewBlockSession(prompt, block)
	}
	return d.NewSession(prompt)
}

// draft runs one draft of sess over the committed rows' features and tokens.
func draft(sess DraftSession, features []float32, tokens []int32, anchor int32) ([]float32, error) {
	if ts, ok := sess.(TokenDraftSession); ok {
		return ts.DraftTokens(features, tokens, anchor)
	}
	return sess.Draft(features, anchor)
}

// Drafter proposes blocks of tokens conditioned on the target's hidden states.
type Drafter interface {
	TapLayers() []int
	BlockSize() int
	// NewSession starts a request's drafting state; prompt is the request's
	// prompt (drafters that look tokens up, such as n-gram ones, need it).
	NewSession(prompt []int32) (DraftSession, error)
}

// BlockDrafter is a Drafter that can also draft a shorter block than its
// own, the anchor and block−1 proposals (SpecOptions.DraftDepth).
type BlockDrafter interface {
	Drafter
	NewBlockSession(prompt []int32, block int) (DraftSession, error)
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
	// Policy, with Mode SpecTree, chooses each step's tree size up to
	// Budget (see adaptive.go); nil verifies Budget nodes every step.
	Policy *adaptive.Policy
	// Label names the decoding in SpecStats when Mode's name does not say
	// which drafter proposes (mtp); empty means Mode's name.
	Label string
	// DraftDepth caps the tokens a draft proposes: a BlockDrafter drafts a
	// block of DraftDepth+1 rows. 0 means the drafter's whole block.
	DraftDepth int
}

// Name names the decoding: Label, the policy's name, or else Mode's.
func (o SpecOptions) Name() string {
	switch {
	case o.Label != "":
		return o.Label
	case o.Policy != nil:
		return o.Policy.Name()
	}
	return o.Mode.String()
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
	// Counters (as vLLM's spec-decode metrics count them): tokens proposed
	// (tree nodes, root excluded), drafts accepted, and accepted per position.
	DraftTokens         int   `json:"draft_tokens"`
	AcceptedTokens      int   `json:"accepted_tokens"`
	AcceptedPerPosition []int `json:"accepted_per_position"`
	// AcceptanceLengths lists each verify step's accepted drafts + 1, in order.
	AcceptanceLengths []int `json:"acceptance_lengths"`
	// Policy is the adaptive policy's cost curve and calibration when the
	// generation ended.
	Policy *adaptive.Snapshot `json:"policy,omitempty"`
}

func (st *SpecStats) record(path []int32, treeNodes int) {
	a := len(path) - 1
	for len(st.AcceptedPerPosition) < a {
		st.AcceptedPerPosition = append(st.AcceptedPerPosition, 0)
	}
	for k := 0; k < a; k++ {
		st.AcceptedPerPosition[k]++
	}
	st.VerifySteps++
	st.AcceptedTokens += a
	st.AcceptanceLengths = append(st.AcceptanceLengths, a+1)
	st.DraftTokens += treeNodes
}

func (st *SpecStats) finish(blockSize int) {
	if st.VerifySteps == 0 {
		return
	}
	st.AcceptanceLength = 1 + float64(st.AcceptedTokens)/float64(st.VerifySteps)
	st.PerPositionAcceptance = make([]float64, blockSize-1)
	for k, n := range st.AcceptedPerPosition {
		st.PerPositionAcceptance[k] = float64(n) / float64(st.VerifySteps)
	}
	if st.Budget > 0 {
		st.TreeNodes = float64(st.DraftTokens) / float64(st.VerifySteps)
	}
}

// propose drafts and turns the drafter's output into the proposal to
// verify, rooted at the anchor and at most room tokens deep (a proposal is
// as deep as its draft): a lattice session's lattice (DFlash2), else the
// candidates DraftTop brings home when the session has it (the budget's a
// row, or the best one for a chain), else those of the draft's logits.
// features and tokens are the rows committed since the last draft.
func (e *Engine) propose(sess DraftSession, features []float32, tokens []int32, anchor int32, room int) (*ddtree.Tree, error) {
	k := e.Spec.Budget
	if e.Spec.Mode == SpecLinear {
		k = 1
	}
	ls, isLattice := sess.(LatticeSession)
	_, readsTokens := sess.(TokenDraftSession)
	var levels [][]ddtree.Candidate
	if ts, ok := sess.(TopDraftSession); ok && !isLattice && !readsTokens {
		var err error
		if levels, err = ts.DraftTop(features, anchor, e.ValidVocab, k); err != nil {
			return nil, err
		}
		levels = levels[:min(len(levels), room)]
	} else {
		rows, err := draft(sess, features, tokens, anchor)
		if err != nil {
			return nil, err
		}
		if isLattice && ls.Lattice() != nil {
			lattice := ls.Lattice().Truncate(room)
			if e.Spec.Mode == SpecLinear {
				return ddtree.Chain(anchor, lattice.GreedyPath()), nil
			}
			return ddtree.BuildLattice(anchor, lattice, e.Spec.Budget, !e.Spec.NoChainSeed), nil
		}
		V := e.Model.Cfg.VocabSize
		levels = make([][]ddtree.Candidate, min(len(rows)/V, room))
		for i := range levels {
			levels[i] = ddtree.TopK(rows[i*V:(i+1)*V], e.ValidVocab, k)
		}
	}
	if e.Spec.Mode == SpecLinear {
		drafts := make([]int32, len(levels))
		for i, l := range levels {
			if len(l) > 0 { // none when a row is all NaN: token 0, as Argmax
				drafts[i] = l[0].Token
			}
		}
		return ddtree.Chain(anchor, drafts), nil
	}
	return ddtree.Build(anchor, levels, e.Spec.Budget, !e.Spec.NoChainSeed), nil
}

// commit keeps the accepted path of a verify: GDN states, KV compaction and
// the sequence length; the rejected nodes' KV pages are returned.
func (e *Engine) commit(s *sequence, verify *mamba.Verify, path []int32) error {
	verify.Eager = e.Model.Eager
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
