package ddtree

import (
	"ddflash/internal/closeness"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// randomLevels makes depth levels of k candidates with distinct tokens and
// descending log-probs; coarse values make score ties common.
func randomLevels(rng *rand.Rand, depth, k int, coarse bool) [][]Candidate {
	levels := make([][]Candidate, depth)
	for d := range levels {
		lps := make([]float64, k)
		for i := range lps {
			if coarse {
				lps[i] = -float64(rng.IntN(4))
			} else {
				lps[i] = math.Log(rng.Float64())
			}
		}
		sort.Sort(sort.Reverse(sort.Float64Slice(lps)))
		perm := rng.Perm(100)
		for i := range lps {
			levels[d] = append(levels[d], Candidate{Token: int32(perm[i]), Logprob: lps[i]})
		}
	}
	return levels
}

// bruteForceTop enumerates every prefix (as a rank sequence), sorts by score
// then lexicographic ranks, and returns the first budget.
func bruteForceTop(levels [][]Candidate, budget int) [][]int32 {
	var all [][]int32
	var walk func(prefix []int32)
	walk = func(prefix []int32) {
		if len(prefix) == len(levels) {
			return
		}
		for r := range levels[len(prefix)] {
			p := append(append([]int32{}, prefix...), int32(r))
			all = append(all, p)
			walk(p)
		}
	}
	walk(nil)
	score := func(p []int32) float64 {
		s := 0.0
		for d, r := range p {
			s += levels[d][r].Logprob
		}
		return s
	}
	sort.SliceStable(all, func(i, j int) bool {
		si, sj := score(all[i]), score(all[j])
		if si != sj {
			return si > sj
		}
		return lexLess(all[i], all[j])
	})
	return all[:min(budget, len(all))]
}

// rankPaths maps each non-root node to its rank sequence.
func rankPaths(t *Tree, levels [][]Candidate) [][]int32 {
	var out [][]int32
	for i := 1; i < t.Len(); i++ {
		var rev []int32
		for n := int32(i); n > 0; n = t.Parents[n] {
			d := t.Depths[n]
			r := slices.IndexFunc(levels[d-1], func(c Candidate) bool { return c.Token == t.Tokens[n] })
			rev = append(rev, int32(r))
		}
		slices.Reverse(rev)
		out = append(out, rev)
	}
	return out
}

func TestBuildEqualsBruteForceTopB(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for trial := 0; trial < 300; trial++ {
		depth, k := 1+rng.IntN(4), 1+rng.IntN(3)
		levels := randomLevels(rng, depth, k, trial%2 == 0)
		budget := rng.IntN(40)
		tree := Build(7, levels, budget, false)
		want := bruteForceTop(levels, budget)
		got := rankPaths(tree, levels)
		if len(got) != len(want) {
			t.Fatalf("trial %d: %d nodes, want min(B=%d, possible)=%d", trial, len(got), budget, len(want))
		}
		// Pop order is the brute-force order exactly (ties included).
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("trial %d: node %d is %v, brute force says %v", trial, i+1, got[i], want[i])
			}
		}
		checkShape(t, tree)
	}
}

// checkShape asserts the structural invariants of a tree.
func checkShape(t *testing.T, tree *Tree) {
	t.Helper()
	if tree.Parents[0] != -1 || tree.Depths[0] != 0 {
		t.Fatal("root is not node 0")
	}
	type key struct{ parent, token int32 }
	seen := map[key]bool{}
	for i := 1; i < tree.Len(); i++ {
		p := tree.Parents[i]
		if p < 0 || int(p) >= i {
			t.Fatalf("node %d has parent %d: parents must precede children", i, p)
		}
		if tree.Depths[i] != tree.Depths[p]+1 {
			t.Fatalf("node %d depth %d under parent depth %d", i, tree.Depths[i], tree.Depths[p])
		}
		k := key{p, tree.Tokens[i]}
		if seen[k] {
			t.Fatalf("node %d repeats token %d under parent %d", i, tree.Tokens[i], p)
		}
		seen[k] = true
	}
}

func TestChainSeedContainsChain(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for trial := 0; trial < 200; trial++ {
		depth, k := 1+rng.IntN(6), 1+rng.IntN(4)
		levels := randomLevels(rng, depth, k, false)
		budget := 1 + rng.IntN(30)
		tree := Build(3, levels, budget, true)
		checkShape(t, tree)
		chainLen := min(depth, budget)
		for d := 1; d <= chainLen; d++ {
			if tree.Parents[d] != int32(d-1) || tree.Tokens[d] != levels[d-1][0].Token {
				t.Fatalf("trial %d: node %d is not the top-1 chain", trial, d)
			}
		}
		possible := len(bruteForceTop(levels, 1<<20))
		if tree.Len()-1 != min(budget, possible) {
			t.Fatalf("trial %d: %d nodes, want %d", trial, tree.Len()-1, min(budget, possible))
		}
	}
}

func TestChainSeededSmallBudgetIsTheChain(t *testing.T) {
	levels := randomLevels(rand.New(rand.NewPCG(4, 4)), 15, 8, false)
	var drafts []int32
	for _, lv := range levels {
		drafts = append(drafts, lv[0].Token)
	}
	tree := Build(9, levels, 15, true)
	chain := Chain(9, drafts)
	if !slices.Equal(tree.Tokens, chain.Tokens) || !slices.Equal(tree.Parents, chain.Parents) || !slices.Equal(tree.Depths, chain.Depths) {
		t.Fatalf("budget = depth with chain seeding should be the chain:\n%v\n%v", tree, chain)
	}
}

func TestWalk(t *testing.T) {
	// root(5) ─ 1(10) ─ 3(30)
	//         └ 2(20) ─ 4(40)
	tree := &Tree{Tokens: []int32{5, 10, 20, 30, 40}, Parents: []int32{-1, 0, 0, 1, 2}, Depths: []int32{0, 1, 1, 2, 2}}
	picks := map[int32]int32{0: 20, 2: 40, 4: 99}
	var asked []int32
	path, bonus := tree.Walk(func(n int32) int32 { asked = append(asked, n); return picks[n] })
	if !slices.Equal(path, []int32{0, 2, 4}) || bonus != 99 {
		t.Fatalf("path %v bonus %d, want [0 2 4] and 99", path, bonus)
	}
	if !slices.Equal(asked, []int32{0, 2, 4}) {
		t.Fatalf("asked nodes %v: only the path's nodes should be asked", asked)
	}
	path, bonus = tree.Walk(func(int32) int32 { return 77 })
	if !slices.Equal(path, []int32{0}) || bonus != 77 {
		t.Fatalf("rejecting everything: path %v bonus %d", path, bonus)
	}
}

func TestKVMovesAndMask(t *testing.T) {
	if m := KVMoves([]int32{0, 1, 2}); len(m) != 0 {
		t.Fatalf("a chain prefix moves nothing, got %v", m)
	}
	if m := KVMoves([]int32{0, 2, 4}); !slices.Equal(m, []KVMove{{1, 2}, {2, 4}}) {
		t.Fatalf("moves %v", m)
	}
	mask := AncestorMask([]int32{-1, 0, 0, 1, 2})
	want := []int32{
		1, 0, 0, 0, 0,
		1, 1, 0, 0, 0,
		1, 0, 1, 0, 0,
		1, 1, 0, 1, 0,
		1, 0, 1, 0, 1,
	}
	if !slices.Equal(mask, want) {
		t.Fatalf("mask %v", mask)
	}
}

// TestTopKMatchesSort checks TopK against a stable sort of the whole row,
// on coarse logits where ties are common; some rows are long enough for
// the vectorised skipping of entries below the k-th best.
func TestTopKMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		n := 1 + rng.IntN(40)
		if trial%4 == 0 {
			n = 1 + rng.IntN(3000)
		}
		logits := make([]float32, n+rng.IntN(3)) // padding past the valid entries
		for i := range logits {
			logits[i] = float32(rng.IntN(6)) / 2
		}
		k := 1 + rng.IntN(n+2)
		got := TopK(logits, n, k)
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
		if len(got) != min(k, n) {
			t.Fatalf("%d candidates, want %d", len(got), min(k, n))
		}
		for i, c := range got {
			if c.Token != int32(idx[i]) {
				t.Fatalf("logits %v k %d: rank %d is token %d, want %d", logits[:n], k, i, c.Token, idx[i])
			}
		}
	}
}

// TestTopKSpecialValues checks that NaN is never proposed and that an
// infinite maximum gives its tokens log-probability 0 (not ∞ − ∞).
func TestTopKSpecialValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	got := TopK([]float32{nan, 1, nan, 2}, 4, 3)
	if len(got) != 2 || got[0].Token != 3 || got[1].Token != 1 || math.IsNaN(got[0].Logprob+got[1].Logprob) {
		t.Fatalf("got %+v, want tokens 3 then 1 with finite log-probs", got)
	}
	got = TopK([]float32{1, inf, 2, inf}, 4, 3)
	if len(got) != 3 || got[0] != (Candidate{1, 0}) || got[1] != (Candidate{3, 0}) || got[2].Token != 2 || !math.IsInf(got[2].Logprob, -1) {
		t.Fatalf("got %+v, want tokens 1 and 3 at log-prob 0, then 2 at -Inf", got)
	}
}

func TestTopK(t *testing.T) {
	logits := []float32{1, 3, 3, 0.5, 100}
	got := TopK(logits, 4, 3)
	lse := math.Log(math.Exp(1) + 2*math.Exp(3) + math.Exp(0.5))
	if got[0].Token != 1 || got[1].Token != 2 || got[2].Token != 0 {
		t.Fatalf("order %v: want 1, 2 (tie by id) then 0; padding 4 excluded", got)
	}
	if !closeness.Near(got[0].Logprob, 3-lse, 1e-6) { // float32 exponentials (see TopK)
		t.Fatalf("logprob %g, want %g", got[0].Logprob, 3-lse)
	}
}

// TestPrefixIsTheSmallerBudgetsTree checks what adaptive budgets rely on:
// the tree of budget b is the first b nodes of any larger budget's tree,
// and each node's score is its path's summed draft log-probability.
func TestPrefixIsTheSmallerBudgetsTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := 0; trial < 200; trial++ {
		levels := randomLevels(rng, 1+rng.IntN(6), 1+rng.IntN(4), trial%2 == 0)
		seed := trial%3 != 0
		full := Build(3, levels, 40, seed)
		for i, ranks := range rankPaths(full, levels) {
			want := 0.0
			for d, r := range ranks {
				want += levels[d][r].Logprob
			}
			if math.Abs(full.Scores[i+1]-want) > 1e-12 {
				t.Fatalf("trial %d: node %d scores %v, its path %v", trial, i+1, full.Scores[i+1], want)
			}
		}
		for b := 0; b <= 40; b++ {
			small, prefix := Build(3, levels, b, seed), full.Prefix(b)
			if !slices.Equal(small.Tokens, prefix.Tokens) || !slices.Equal(small.Parents, prefix.Parents) ||
				!slices.Equal(small.Depths, prefix.Depths) || !slices.Equal(small.Scores, prefix.Scores) {
				t.Fatalf("trial %d (chain seed %v): budget %d tree %+v, prefix of the budget-40 tree %+v", trial, seed, b, small, prefix)
			}
		}
	}
}
