package engine

import (
	"errors"
	"slices"
	"time"

	"ddflash/adaptive"
	"ddflash/ddtree"
)

// ChoiceDrafter drafts with one of several drafters (such as the target's
// MTP head and a DFlash drafter) per request, the one Choice picks
// (adaptive.Choice: the fastest by its latest requests' measured speed,
// each drafter in turn every ExploreEvery-th request). The target taps the
// union of their layers; the request's drafter is given its own layers'
// rows. Only the proposal changes, so decoding stays lossless. It runs
// under an adaptive policy (SpecOptions.Policy), which judges each draft
// by its drafter's calibration and draft cost.
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

// NewBlockSession starts a session of the drafter the request drafts
// with (Choice.Pick), drafting at most block rows (SpecOptions.DraftDepth):
// a drafter whose own block is longer and that can draft a shorter one
// drafts block rows, the others their own.
func (c *ChoiceDrafter) NewBlockSession(prompt []int32, block int) (DraftSession, error) {
	i := c.Choice.Pick()
	sess, err := blockSession(c.Drafters[i], prompt, block)
	if err != nil {
		return nil, err
	}
	return &choiceSession{c: c, chosen: i, session: sess}, nil
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

// choiceSession is a request's session of the drafter it drafts with.
type choiceSession struct {
	c       *ChoiceDrafter
	chosen  int // the request's drafter
	session DraftSession
	rows    []float32 // the chosen drafter's layers of the rows to draft from
}

func (s *choiceSession) Close() { s.session.Close() }

// Draft fails: the session may need the rows' tokens (DraftTokens).
func (s *choiceSession) Draft([]float32, int32) ([]float32, error) {
	return nil, errors.New("a choice among drafters drafts with its rows' tokens (DraftTokens)")
}

// DraftTokens hands the request's drafter its layers of the new rows and
// drafts.
func (s *choiceSession) DraftTokens(features []float32, tokens []int32, anchor int32) ([]float32, error) {
	c, cols := s.c, s.c.cols[s.chosen]
	s.rows = s.rows[:0]
	if len(tokens) > 0 {
		hidden := len(features) / (len(tokens) * len(c.taps))
		for r := range tokens {
			row := features[r*len(c.taps)*hidden:]
			for _, col := range cols {
				s.rows = append(s.rows, row[col*hidden:(col+1)*hidden]...)
			}
		}
	}
	steady := len(tokens) <= c.Drafters[s.chosen].BlockSize()
	start := time.Now()
	rows, err := draft(s.session, s.rows, tokens, anchor)
	if err != nil {
		return nil, err
	}
	c.Choice.Drafters[s.chosen].ObserveDraft(time.Since(start), steady)
	return rows, nil
}

// finished records the request's decoding speed for its drafter.
func (s *choiceSession) finished(tokens int, took time.Duration) {
	s.c.Choice.Finished(s.chosen, tokens, took)
}

// Lattice is the chosen drafter's lattice when it drafts one, else nil.
func (s *choiceSession) Lattice() *ddtree.Lattice {
	if ls, ok := s.session.(LatticeSession); ok {
		return ls.Lattice()
	}
	return nil
}

// drafter is the request's drafter's calibration and draft cost, which
// the policy judges its drafts by.
func (s *choiceSession) drafter() *adaptive.DrafterStats { return &s.c.Choice.Drafters[s.chosen] }

// verified calibrates the request's drafter with its verified tree
// and the drafted tokens the target accepted.
func (s *choiceSession) verified(tree *ddtree.Tree, accepted int) {
	s.drafter().Calibration.Observe(pathProbs(tree), tree.Depths[1:], accepted)
}
