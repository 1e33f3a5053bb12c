package ddtree

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// randomLattice has k candidates per depth (token ids 100·depth + c) and
// normally distributed scores.
func randomLattice(rng *rand.Rand, depths, k int) *Lattice {
	l := &Lattice{}
	for d := range depths {
		var tokens []int32
		for c := range k {
			tokens = append(tokens, int32(100*(d+1)+c))
		}
		preds := k
		if d == 0 {
			preds = 1
		}
		rows := make([][]float64, preds)
		for p := range rows {
			for range k {
				rows[p] = append(rows[p], 2*rng.NormFloat64())
			}
		}
		l.Tokens, l.Scores = append(l.Tokens, tokens), append(l.Scores, rows)
	}
	return l
}

// TestGreedyPathFollowsPredecessor checks the walk against a direct
// reading of the definition: at each depth the best candidate given the
// previous pick.
func TestGreedyPathFollowsPredecessor(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		l := randomLattice(rng, 5, 4)
		got := l.GreedyPath()
		pred := 0
		for d := range l.Tokens {
			best := math.Inf(-1)
			var pick int
			for c, s := range l.Scores[d][pred] {
				if s > best {
					best, pick = s, c
				}
			}
			if got[d] != l.Tokens[d][pick] {
				t.Fatalf("depth %d: walk took %d, the best after candidate %d is %d", d+1, got[d], pred, l.Tokens[d][pick])
			}
			pred = pick
		}
	}
}

// TestBuildLatticeKeepsTheMostLikelyPaths enumerates every path prefix of
// small random lattices, scores it by the summed selector log-softmax
// (computed here from the definition), and checks that the tree holds
// exactly the budget best prefixes, with their scores.
func TestBuildLatticeKeepsTheMostLikelyPaths(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 30 {
		const depths, k = 3, 3
		l := randomLattice(rng, depths, k)
		type prefix struct {
			tokens []int32
			score  float64
		}
		var all []prefix
		var walk func(d, pred int, tokens []int32, score float64)
		walk = func(d, pred int, tokens []int32, score float64) {
			if d == depths {
				return
			}
			row := l.Scores[d][pred]
			var z float64
			for _, s := range row {
				z += math.Exp(s)
			}
			for c := range row {
				p := prefix{append(slices.Clone(tokens), l.Tokens[d][c]), score + row[c] - math.Log(z)}
				all = append(all, p)
				walk(d+1, c, p.tokens, p.score)
			}
		}
		walk(0, 0, nil, 0)
		sort.Slice(all, func(i, j int) bool { return all[i].score > all[j].score })
		budget := 1 + trial%len(all)
		tree := BuildLattice(7, l, budget, false)
		if tree.Len() != budget+1 {
			t.Fatalf("budget %d: %d nodes", budget, tree.Len()-1)
		}
		for n := 1; n < tree.Len(); n++ {
			path := draftedTokens(tree, n)
			i := slices.IndexFunc(all[:budget], func(p prefix) bool { return slices.Equal(p.tokens, path) })
			if i < 0 {
				t.Fatalf("budget %d: node %v is not among the %d most likely prefixes", budget, path, budget)
			}
			if math.Abs(tree.Scores[n]-all[i].score) > 1e-12 {
				t.Fatalf("node %v: score %g, want %g", path, tree.Scores[n], all[i].score)
			}
		}
	}
}

// TestBuildLatticeWithoutPredecessorsIsBuild checks that a lattice whose
// scores ignore the predecessor gives Build's tree over the same levels.
func TestBuildLatticeWithoutPredecessorsIsBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	l := randomLattice(rng, 4, 5)
	var levels [][]Candidate
	for d := range l.Tokens {
		row := l.Scores[d][0]
		for p := range l.Scores[d] {
			l.Scores[d][p] = row
		}
		logits := make([]float32, 600)
		for i := range logits {
			logits[i] = float32(math.Inf(-1))
		}
		for c, tok := range l.Tokens[d] {
			logits[tok] = float32(row[c])
			l.Scores[d][0][c] = float64(float32(row[c]))
		}
		levels = append(levels, TopK(logits, len(logits), 5))
	}
	for _, seed := range []bool{false, true} {
		want, got := Build(9, levels, 12, seed), BuildLattice(9, l, 12, seed)
		if !slices.Equal(got.Tokens, want.Tokens) || !slices.Equal(got.Parents, want.Parents) {
			t.Fatalf("chain seed %v: lattice tree %v/%v, Build %v/%v", seed, got.Tokens, got.Parents, want.Tokens, want.Parents)
		}
	}
	if path := BuildLattice(9, l, 4, true); !slices.Equal(path.Tokens[1:], l.GreedyPath()) {
		t.Fatalf("chain-seeded tree starts %v, the greedy walk is %v", path.Tokens[1:], l.GreedyPath())
	}
}

func draftedTokens(tree *Tree, node int) []int32 {
	var toks []int32
	for n := int32(node); n > 0; n = tree.Parents[n] {
		toks = append(toks, tree.Tokens[n])
	}
	slices.Reverse(toks)
	return toks
}
