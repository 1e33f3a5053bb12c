// Package ddtree builds DDTree draft trees from a drafter's per-position
// distributions, compiles them into verify inputs, walks them with the
// target's tokens and plans the commit. Everything here is a pure function.
package ddtree

import (
	"container/heap"
	"math"

	"ddflash/kernels/rowmath"
)

// Candidate is a token proposed at some depth with its draft log-probability.
type Candidate struct {
	Token   int32
	Logprob float64
}

// Tree is a draft tree. Node 0 is the root: the last committed token, whose
// successors the tree proposes. Parents always precede their children.
type Tree struct {
	Tokens  []int32
	Parents []int32 // Parents[0] = -1
	Depths  []int32 // Depths[0] = 0
	// Scores are Build's path log-probabilities under the drafter (the sum
	// of the per-depth log-probs along the path; 0 at the root): the
	// predicted log-probability that the target accepts the node. Nil for
	// a Chain.
	Scores []float64
}

// Len is the number of nodes, root included.
func (t *Tree) Len() int { return len(t.Tokens) }

// Chain is the linear proposal: root followed by drafts, each the child of the previous.
func Chain(root int32, drafts []int32) *Tree {
	t := &Tree{}
	t.add(root, -1, 0)
	for i, d := range drafts {
		t.add(d, int32(i), int32(i+1))
	}
	return t
}

func (t *Tree) add(token, parent, depth int32) int32 {
	t.Tokens = append(t.Tokens, token)
	t.Parents = append(t.Parents, parent)
	t.Depths = append(t.Depths, depth)
	return int32(len(t.Tokens) - 1)
}

// TopK turns a row of draft logits into its k most likely tokens with their
// log-probabilities (log-softmax over the row's first valid entries),
// descending, ties by lower token id. NaN entries are never proposed; when
// the row's maximum is infinite, the tokens at it get log-probability 0.
//
// A draft row has the whole vocabulary, so every pass over it is one of
// kernels/rowmath's vectorised row kernels: the log-sum-exp (float32
// exponentials summed in float64: log-probs within about 1e-6), and the
// selection, which looks only at entries above the k-th best so far.
func TopK(logits []float32, valid, k int) []Candidate {
	lse := rowmath.LogSumExp(logits[:valid])
	out := TopLogits(logits, valid, k)
	for i, c := range out {
		if c.Logprob == lse { // an infinite maximum: the softmax's limit
			out[i].Logprob = 0
		} else {
			out[i].Logprob -= lse
		}
	}
	return out
}

// TopLogits is TopK without the normalisation: the k largest of the row's
// first valid logits (in Logprob), descending, ties by lower token id, NaN
// never.
func TopLogits(logits []float32, valid, k int) []Candidate {
	row := logits[:valid]
	out := make([]Candidate, 0, max(0, min(k, len(row))))
	if cap(out) == 0 {
		return out
	}
	// Keep the best k so far, sorted, with their logits; a later entry equal
	// to one kept goes after it, so ties stay in token order.
	for i := 0; ; i++ {
		bound := float32(math.Inf(-1))
		if len(out) == cap(out) {
			bound = math.Nextafter32(float32(out[len(out)-1].Logprob), float32(math.Inf(1)))
		}
		if i += rowmath.NextAtLeast(row[i:], bound); i == len(row) {
			break
		}
		v := float64(row[i])
		if len(out) == cap(out) && v <= out[len(out)-1].Logprob { // only past a +Inf bound
			continue
		}
		if len(out) < cap(out) {
			out = append(out, Candidate{})
		}
		j := len(out) - 1
		for ; j > 0 && v > out[j-1].Logprob; j-- {
			out[j] = out[j-1]
		}
		out[j] = Candidate{Token: int32(i), Logprob: v}
	}
	return out
}

// Build grows the tree of the budget most likely prefixes, best first, under
// the factorised surrogate score (the sum of per-depth draft log-probs).
// levels[d-1] holds depth d's candidates, sorted by descending log-prob.
// Ties pop the lexicographically smaller rank sequence first. With
// chainSeed, the top-1 chain is inserted first (so the tree always contains
// the linear proposal), then the best-first search fills the rest.
func Build(root int32, levels [][]Candidate, budget int, chainSeed bool) *Tree {
	ranked := make([][]option, len(levels))
	for d, lv := range levels {
		for r, c := range lv {
			ranked[d] = append(ranked[d], option{Candidate: c, index: int32(r)})
		}
	}
	return grow(root, len(levels), func(depth, _ int32) []option { return ranked[depth-1] }, budget, chainSeed)
}

// option is a child a node can have: a candidate, with the index its own
// children are looked up by (see grow).
type option struct {
	Candidate
	index int32
}

// grow is Build's best-first search over options(depth, pred): the
// children a node at depth−1 can have, best first, where pred is that
// node's option index (0 for the root).
func grow(root int32, depths int, options func(depth, pred int32) []option, budget int, chainSeed bool) *Tree {
	t := &Tree{Scores: []float64{0}}
	t.add(root, -1, 0)
	h := &frontier{}
	// index[n] is node n's option index, by which its children are found.
	index := []int32{0}
	first := func(parent int32, score float64, ranks []int32, depth int32) (entry, bool) {
		if int(depth) > depths || len(options(depth, index[parent])) == 0 {
			return entry{}, false
		}
		o := options(depth, index[parent])[0]
		return entry{score: score + o.Logprob, ranks: append(append([]int32{}, ranks...), 0), parent: parent, depth: depth, pred: index[parent]}, true
	}
	// insert adds an entry as a node, queues its next sibling and returns the node.
	insert := func(e entry) int32 {
		opts := options(e.depth, e.pred)
		if int(e.rank)+1 < len(opts) {
			s := e
			s.rank++
			s.score += opts[s.rank].Logprob - opts[e.rank].Logprob
			s.ranks = append(append([]int32{}, e.ranks[:len(e.ranks)-1]...), s.rank)
			heap.Push(h, s)
		}
		t.Scores = append(t.Scores, e.score)
		index = append(index, opts[e.rank].index)
		return t.add(opts[e.rank].Token, e.parent, e.depth)
	}
	nodes := 0
	if chainSeed {
		parent, score, ranks := int32(0), 0.0, []int32(nil)
		for d := int32(1); nodes < budget; d++ {
			e, ok := first(parent, score, ranks, d)
			if !ok {
				break
			}
			parent, score, ranks = insert(e), e.score, e.ranks
			nodes++
		}
	} else if e, ok := first(0, 0, nil, 1); ok {
		heap.Push(h, e)
	}
	for h.Len() > 0 && nodes < budget {
		e := heap.Pop(h).(entry)
		node := insert(e)
		nodes++
		if c, ok := first(node, e.score, e.ranks, e.depth+1); ok {
			heap.Push(h, c)
		}
	}
	return t
}

// Prefix is the tree of its first nodes non-root nodes (all when it has
// fewer). Build adds nodes in order, so Build's tree for a smaller budget is
// its prefix, and parents precede children, so a prefix is a tree.
func (t *Tree) Prefix(nodes int) *Tree {
	n := min(nodes+1, t.Len())
	p := &Tree{Tokens: t.Tokens[:n:n], Parents: t.Parents[:n:n], Depths: t.Depths[:n:n]}
	if t.Scores != nil {
		p.Scores = t.Scores[:n:n]
	}
	return p
}

// entry is a frontier candidate: the rank-th option at depth under parent,
// whose option index is pred.
type entry struct {
	score  float64
	ranks  []int32 // option rank at each depth along the path
	parent int32
	depth  int32
	rank   int32
	pred   int32
}

// frontier is a max-heap by score, then by lexicographically smaller ranks.
type frontier []entry

func (f frontier) Len() int { return len(f) }
func (f frontier) Less(i, j int) bool {
	if f[i].score != f[j].score {
		return f[i].score > f[j].score
	}
	return lexLess(f[i].ranks, f[j].ranks)
}
func (f frontier) Swap(i, j int) { f[i], f[j] = f[j], f[i] }
func (f *frontier) Push(x any)   { *f = append(*f, x.(entry)) }
func (f *frontier) Pop() any {
	old := *f
	e := old[len(old)-1]
	*f = old[:len(old)-1]
	return e
}

// lexLess orders rank sequences as Python orders tuples.
func lexLess(a, b []int32) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// AncestorMask is the Len×Len visibility of the tree: node i sees node j
// when j is i or one of its ancestors.
func AncestorMask(parents []int32) []int32 {
	n := len(parents)
	mask := make([]int32, n*n)
	for i := range n {
		for j := i; j >= 0; j = int(parents[j]) {
			mask[i*n+j] = 1
		}
	}
	return mask
}

// Walk follows the target's choices down the tree: from the root, while the
// token the target picks at the current node is one of its children, move
// there. It returns the accepted path (root first) and the bonus token, the
// target's pick at the last node. targetAt is asked only for nodes on the
// path, so at temperature > 0 each visited node's token can be sampled
// lazily and every emitted token is still a target sample.
func (t *Tree) Walk(targetAt func(node int32) int32) (path []int32, bonus int32) {
	children := make(map[int32]map[int32]int32)
	for i := 1; i < t.Len(); i++ {
		p := t.Parents[i]
		if children[p] == nil {
			children[p] = map[int32]int32{}
		}
		children[p][t.Tokens[i]] = int32(i)
	}
	cur := int32(0)
	path = []int32{0}
	next := targetAt(0)
	for {
		child, ok := children[cur][next]
		if !ok {
			return path, next
		}
		cur = child
		path = append(path, cur)
		next = targetAt(cur)
	}
}

// KVMove says that the K/V at offset Src of the verified block moves to Dst.
type KVMove struct{ Dst, Src int }

// KVMoves is the attention-cache compaction of an accepted path: node path[d]
// was written at block offset path[d] and belongs at offset d. Offsets where
// they agree (a chain prefix) need no move.
func KVMoves(path []int32) []KVMove {
	var moves []KVMove
	for d, node := range path {
		if int(node) != d {
			moves = append(moves, KVMove{Dst: d, Src: int(node)})
		}
	}
	return moves
}
