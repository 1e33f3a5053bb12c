// Package prefixtree is the prefix cache's policy: a trie over whole pages of
// tokens whose nodes own one KV page each and, at chosen nodes, a GDN
// checkpoint slot (the recurrent and conv state after that node's last
// token). It only does bookkeeping on page and slot numbers; the engine
// copies states and counts page references.
//
// A hybrid model's GDN state cannot be rewound, so a prefix can be reused
// only up to a node that holds a checkpoint: Match returns the deepest one.
// Every leaf holds a checkpoint (a path beyond the last checkpoint would be
// useless), so evicting a leaf always frees a slot and at least one page.
package prefixtree

import (
	"fmt"
	"slices"
	"unsafe"
)

// NoSlot marks a node without a checkpoint.
const NoSlot = -1

// Node is one page of a cached prefix.
type Node struct {
	parent   *Node
	id       uint64 // unique in the tree's lifetime; 0 is the root's
	children map[string]*Node
	key      string // the page's tokens, as the parent's map key
	depth    int    // pages from the root: this page ends at depth·pageSize tokens
	page     int32
	features []float32 // drafter features of the page's tokens (nil without a drafter)
	slot     int
	locks    int // running requests whose cached prefix runs through this node
	used     uint64
}

// Tokens is the length of the prefix that ends with this node.
func (n *Node) Tokens(pageSize int) int { return n.depth * pageSize }

// Slot is the node's checkpoint slot, NoSlot when it has none.
func (n *Node) Slot() int { return n.slot }

// ID names the node's page for as long as it is cached: the tree never
// gives one ID to two nodes. The root's is 0, so a first page's parent is 0.
func (n *Node) ID() uint64 { return n.id }

// Parent is the node before this one (the root for a prefix's first page).
func (n *Node) Parent() *Node { return n.parent }

// Tree is the trie. It is not safe for concurrent use.
type Tree struct {
	pageSize    int
	root        *Node
	clock       uint64
	pages       int
	checkpoints int
	lastID      uint64
}

// New makes an empty tree over pages of pageSize tokens.
func New(pageSize int) *Tree {
	if pageSize <= 0 {
		panic(fmt.Sprintf("prefixtree: page size %d must be positive", pageSize))
	}
	return &Tree{pageSize: pageSize, root: &Node{children: map[string]*Node{}, slot: NoSlot}}
}

// Pages is the number of pages the tree holds.
func (t *Tree) Pages() int { return t.pages }

// Checkpoints is the number of checkpoint slots the tree holds.
func (t *Tree) Checkpoints() int { return t.checkpoints }

func pageKey(tokens []int32) string {
	return string(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), len(tokens)*4))
}

// Hit is the longest reusable prefix of a token sequence.
type Hit struct {
	Node     *Node // the deepest node with a checkpoint; nil on a miss
	Tokens   int
	Pages    []int32   // the prefix's KV pages, in order
	Features []float32 // the prefix's drafter features, concatenated (nil without)
}

// Match finds the longest prefix of tokens made of whole cached pages that
// ends at a checkpoint, and marks its path used.
func (t *Tree) Match(tokens []int32) Hit {
	t.clock++
	var path []*Node
	n, last := t.root, -1
	for p := 0; (p+1)*t.pageSize <= len(tokens); p++ {
		child, ok := n.children[pageKey(tokens[p*t.pageSize:(p+1)*t.pageSize])]
		if !ok {
			break
		}
		n = child
		path = append(path, n)
		if n.slot != NoSlot {
			last = len(path) - 1
		}
	}
	if last < 0 {
		return Hit{}
	}
	h := Hit{Node: path[last], Tokens: (last + 1) * t.pageSize}
	for _, n := range path[:last+1] {
		n.used = t.clock
		h.Pages = append(h.Pages, n.page)
		h.Features = append(h.Features, n.features...)
	}
	return h
}

// Lock marks a node and its ancestors as used by a running request: they
// cannot be evicted until Unlock.
func (t *Tree) Lock(n *Node) {
	for ; n != nil; n = n.parent {
		n.locks++
	}
}

// Unlock undoes one Lock.
func (t *Tree) Unlock(n *Node) {
	for ; n != nil; n = n.parent {
		if n.locks == 0 {
			panic("prefixtree: unlock of a node that is not locked")
		}
		n.locks--
	}
}

// Insert adds the whole pages of tokens (len(pages) of them; features, when
// not nil, holds pageSize rows per page) and puts the checkpoint slot at the
// last page's node. Pages already in the tree keep their own (and get the
// features if they had none); the pages the tree took are returned (the
// caller counts a reference for the tree). The slot is not taken (slotTaken
// false) when the node already has one.
func (t *Tree) Insert(tokens []int32, pages []int32, features []float32, slot int) (end *Node, adopted []int32, slotTaken bool) {
	P := t.pageSize
	if len(pages) == 0 || len(tokens) < len(pages)*P {
		panic(fmt.Sprintf("prefixtree: insert of %d pages needs at least %d tokens, got %d", len(pages), len(pages)*P, len(tokens)))
	}
	width := 0
	if features != nil {
		width = len(features) / (len(pages) * P)
	}
	t.clock++
	n := t.root
	for p, page := range pages {
		key := pageKey(tokens[p*P : (p+1)*P])
		child, ok := n.children[key]
		if !ok {
			t.lastID++
			child = &Node{parent: n, id: t.lastID, children: map[string]*Node{}, key: key, depth: n.depth + 1, page: page, slot: NoSlot}
			n.children[key] = child
			t.pages++
			adopted = append(adopted, page)
		}
		if width > 0 && child.features == nil {
			child.features = slices.Clone(features[p*P*width : (p+1)*P*width])
		}
		n = child
		n.used = t.clock
	}
	if n.slot == NoSlot {
		n.slot = slot
		t.checkpoints++
		slotTaken = true
	}
	return n, adopted, slotTaken
}

// Eviction is what Evict removed.
type Eviction struct {
	Pages []int32  // the removed nodes' pages, the leaf's first
	IDs   []uint64 // the removed nodes' IDs, in the same order
	Slot  int      // the leaf's checkpoint slot
}

// Evict removes the least recently used leaf that no running request
// locks, then its ancestors that are left as leaves without a checkpoint,
// and returns their pages and IDs and the leaf's checkpoint slot. ok is
// false when every leaf is locked (or the tree is empty).
func (t *Tree) Evict() (ev Eviction, ok bool) {
	victim := t.lruLeaf(t.root, nil)
	if victim == nil {
		return Eviction{Slot: NoSlot}, false
	}
	ev.Slot = victim.slot
	if ev.Slot != NoSlot {
		t.checkpoints--
	}
	for n := victim; n != t.root && len(n.children) == 0 && n.locks == 0 && (n == victim || n.slot == NoSlot); {
		parent := n.parent
		delete(parent.children, n.key)
		ev.Pages = append(ev.Pages, n.page)
		ev.IDs = append(ev.IDs, n.id)
		t.pages--
		n = parent
	}
	return ev, true
}

// lruLeaf is the least recently used unlocked leaf under n, or best.
func (t *Tree) lruLeaf(n, best *Node) *Node {
	for _, c := range n.children {
		switch {
		case len(c.children) > 0:
			best = t.lruLeaf(c, best)
		case c.locks == 0 && (best == nil || c.used < best.used):
			best = c
		}
	}
	return best
}
