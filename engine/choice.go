package engine

import (
	"errors"
	"slices"
	"time"

	"ddflash/adaptive"
	"ddflash/ddtree"
)

// ChoiceDrafter drafts with one of several drafters (such as the target's
// MTP head and a DFlash drafter) per request and step, the one Choice
// expects to pay most (adaptive.Choice: each drafter's own calibration and
// draft cost). The target taps the union of their layers; each drafter's
// session is given its own layers' rows and keeps the rows committed while
// another drafted until its next draft (catch-up, as after autoregressive
// steps). Only the proposal changes, so decoding stays lossless.
// It runs under an adaptive policy (SpecOptions.Policy), whose step costs
// each draft is weighed against.
type ChoiceDrafter struct {
	Drafters []Drafter
	Choice   *adaptive.Choice

	taps []int
	cols [][]int // per drafter, the index in taps of each of its layers
}

// NewChoiceDrafter chooses among drafters.
func NewChoiceDrafter(drafters ...Drafter) *ChoiceDrafter {
	c := &ChoiceDrafter{Drafters: drafters, Choice: adaptive.NewChoice(len(drafters))}
	for _, d := range drafters {
		c.taps = append(c.taps, d.TapLayers()...)
	}
	slices.Sort(c.taps)
	c.taps = slices.Compact(c.taps)
	for _, d := range drafters {
		var cols []int
		for _, layer := range d.TapLayers() {
			i, _ := slices.BinarySearch(c.taps, layer)
			cols = append(cols, i)
		}
		c.cols = append(c.cols, cols)
	}
	return c
}

// TapLayers is the union of the drafters' layers, ascending.
func (c *ChoiceDrafter) TapLayers() []int { return c.taps }

// BlockSize is the largest of the drafters' blocks.
func (c *ChoiceDrafter) BlockSize() int {
	block := 0
	for _, d := range c.Drafters {
		block = max(block, d.BlockSize())
	}
	return block
}

// Close closes every drafter.
func (c *ChoiceDrafter) Close() {
	for _, d := range c.Drafters {
		if closer, ok := d.(interface{ Close() }); ok {
			closer.Close()
		}
	}
}

// NewSession starts a session of every drafter.
func (c *ChoiceDrafter) NewSession(prompt []int32) (DraftSession, error) {
	return c.NewBlockSession(prompt, c.BlockSize())
}

// NewBlockSession starts a session of every drafter, each drafting at most
// block rows (SpecOptions.DraftDepth): a drafter whose own block is longer
// and that can draft a shorter one drafts block rows, the others their own.
func (c *ChoiceDrafter) NewBlockSession(prompt []int32, block int) (DraftSession, error) {
	s := &choiceSession{c: c, state: c.Choice.NewState(), chosen: -1}
	for _, d := range c.Drafters {
		sess, err := blockSession(d, prompt, block)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.sessions = append(s.sessions, sess)
	}
	s.pending = make([][]float32, len(c.Drafters))
	s.pendingTokens = make([][]int32, len(c.Drafters))
	return s, nil
}

// measured reports whether every drafter's draft cost is measured.
func (c *ChoiceDrafter) measured() bool {
	for i := range c.Drafters {
		if c.Choice.Drafters[i].DraftMs() == 0 {
			return false
		}
	}
	return true
}

// measureDrafts times two steady drafts (one context row each) of every
// drafter on scratch sessions of the requests' block, for its draft cost.
func (c *ChoiceDrafter) measureDrafts(hidden, block int) error {
	for i, d := range c.Drafters {
		sess, err := blockSession(d, []int32{0}, block)
		if err != nil {
			return err
		}
		row := make([]float32, len(c.cols[i])*hidden)
		for range 2 {
			start := time.Now()
			if _, err := draft(sess, row, []int32{0}, 0); err != nil {
				sess.Close()
				return err
			}
			c.Choice.Drafters[i].ObserveDraft(time.Since(start), true)
		}
		sess.Close()
	}
	return nil
}

// choiceSession is a request's sessions of every drafter.
type choiceSession struct {
	c        *ChoiceDrafter
	policy   *adaptive.Policy // the engine's (set by startJob)
	sessions []DraftSession
	// pending are each drafter's rows (its layers' features, and their
	// tokens) committed since its last draft.
	pending       [][]float32
	pendingTokens [][]int32
	state         *adaptive.ChoiceState
	chosen        int // the drafter of the latest draft
}

func (s *choiceSession) Close() {
	for _, sess := range s.sessions {
		if sess != nil {
			sess.Close()
		}
	}
}

// Draft fails: the sessions may need the rows' tokens (DraftTokens).
func (s *choiceSession) Draft([]float32, int32) ([]float32, error) {
	return nil, errors.New("a choice among drafters drafts with its rows' tokens (DraftTokens)")
}

// DraftTokens hands every drafter its layers of the new rows and drafts
// with the one Choice chooses, judged as if the request were alone in its
// batch.
func (s *choiceSession) DraftTokens(features []float32, tokens []int32, anchor int32) ([]float32, error) {
	c := s.c
	if len(tokens) > 0 {
		hidden := len(features) / (len(tokens) * len(c.taps))
		for i, cols := range c.cols {
			if s.state.Retired(i) {
				continue
			}
			for r := range tokens {
				row := features[r*len(c.taps)*hidden:]
				for _, col := range cols {
					s.pending[i] = append(s.pending[i], row[col*hidden:(col+1)*hidden]...)
				}
			}
			s.pendingTokens[i] = append(s.pendingTokens[i], tokens...)
		}
	}
	stepMs, commitMs := s.policy.StepCosts(1)
	i := c.Choice.Choose(s.state, 1, stepMs, commitMs)
	s.retire()
	steady := len(s.pendingTokens[i]) <= c.Drafters[i].BlockSize()
	start := time.Now()
	rows, err := draft(s.sessions[i], s.pending[i], s.pendingTokens[i], anchor)
	if err != nil {
		return nil, err
	}
	c.Choice.Drafters[i].ObserveDraft(time.Since(start), steady)
	s.pending[i], s.pendingTokens[i] = s.pending[i][:0], s.pendingTokens[i][:0]
	s.chosen = i
	return rows, nil
}

// retire closes the sessions of the drafters retired for the request and
// drops the rows they kept.
func (s *choiceSession) retire() {
	for i, sess := range s.sessions {
		if sess != nil && s.state.Retired(i) {
			sess.Close()
			s.sessions[i], s.pending[i], s.pendingTokens[i] = nil, nil, nil
		}
	}
}

// Lattice is the chosen drafter's lattice when it drafts one, else nil.
func (s *choiceSession) Lattice() *ddtree.Lattice {
	if ls, ok := s.sessions[s.chosen].(LatticeSession); ok {
		return ls.Lattice()
	}
	return nil
}

// proposed records the tree the latest draft gave (before the policy's cut).
func (s *choiceSession) proposed(tree *ddtree.Tree) {
	s.state.Drafted(s.chosen, pathProbs(tree), tree.Depths[1:])
}

// drafter is the latest draft's drafter's calibration and draft cost,
// which the policy judges the draft by.
func (s *choiceSession) drafter() *adaptive.DrafterStats { return &s.c.Choice.Drafters[s.chosen] }

// verified calibrates the latest draft's drafter with its verified tree
// and the drafted tokens the target accepted.
func (s *choiceSession) verified(tree *ddtree.Tree, accepted int) {
	s.drafter().Calibration.Observe(pathProbs(tree), tree.Depths[1:], accepted)
}
