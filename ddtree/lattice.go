package ddtree

import (
	"math"
	"slices"
)

// Lattice is a drafter's proposal as candidates per depth with scores that
// depend on the predecessor: DFlash2's candidate selector, which keeps the
// top K tokens of every proposal position and scores each adjacent pair
// (docs/dflash2.md).
type Lattice struct {
	// Tokens[d][c] is candidate c at depth d+1.
	Tokens [][]int32
	// Scores[d][p][c] scores candidate c at depth d+1 after candidate p of
	// depth d; depth 1 has one predecessor, the root (Scores[0] has one row).
	Scores [][][]float64
}

// Truncate is the lattice's first depth depths (all when it has fewer).
func (l *Lattice) Truncate(depth int) *Lattice {
	n := min(depth, len(l.Tokens))
	return &Lattice{Tokens: l.Tokens[:n], Scores: l.Scores[:n]}
}

// GreedyPath is the selector's greedy walk: from the root, at every depth
// the candidate with the highest score after the previous pick (ties: the
// lower candidate index).
func (l *Lattice) GreedyPath() []int32 {
	path := make([]int32, len(l.Tokens))
	pred := 0
	for d := range l.Tokens {
		pred = argmax(l.Scores[d][pred])
		path[d] = l.Tokens[d][pred]
	}
	return path
}

func argmax(row []float64) int {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return best
}

// BuildLattice grows the tree of the budget most likely paths through the
// lattice, best first, as Build does over independent levels: a node's
// score is the sum along its path of the selector's log-probabilities,
// each the log-softmax of the scores after the node's predecessor over the
// depth's candidates. With chainSeed the greedy walk is inserted first, so
// the tree contains the linear proposal.
func BuildLattice(root int32, l *Lattice, budget int, chainSeed bool) *Tree {
	ranked := make([][][]option, len(l.Tokens))
	for d, rows := range l.Scores {
		for _, row := range rows {
			ranked[d] = append(ranked[d], rankedOptions(l.Tokens[d], row))
		}
	}
	return grow(root, len(l.Tokens), func(depth, pred int32) []option { return ranked[depth-1][pred] }, budget, chainSeed)
}

// rankedOptions is a depth's candidates after one predecessor, by
// descending score (ties: lower candidate index), with the log-softmax of
// the scores.
func rankedOptions(tokens []int32, scores []float64) []option {
	top := scores[argmax(scores)]
	var sum float64
	for _, s := range scores {
		sum += math.Exp(s - top)
	}
	lse := top + math.Log(sum)
	opts := make([]option, len(tokens))
	for c, tok := range tokens {
		opts[c] = option{Candidate: Candidate{Token: tok, Logprob: scores[c] - lse}, index: int32(c)}
	}
	slices.SortStableFunc(opts, func(a, b option) int {
		switch {
		case a.Logprob > b.Logprob:
			return -1
		case a.Logprob < b.Logprob:
			return 1
		}
		return 0
	})
	return opts
}
