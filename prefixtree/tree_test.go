package prefixtree

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// seq makes tokens from page labels: page label c is pageSize copies of c.
func seq(pageSize int, labels string) []int32 {
	var toks []int32
	for _, c := range labels {
		for range pageSize {
			toks = append(toks, int32(c))
		}
	}
	return toks
}

// op is one step of a table test: insert a labelled sequence's pages
// (pages numbered from base) with a checkpoint slot, match a sequence,
// lock or unlock the node a previous insert returned, or evict.
type op struct {
	kind   string // insert, match, lock, unlock, evict
	labels string
	base   int32 // insert: first page number
	slot   int   // insert: checkpoint slot
	ref    int   // lock/unlock: index of the insert whose node to use

	// expectations
	adopted   []int32
	slotTaken bool
	hitTokens int
	hitPages  []int32
	evicted   []int32
	evictSlot int
	evictOK   bool
}

func TestTree(t *testing.T) {
	const P = 2
	pages := func(base int32, n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = base + int32(i)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		ops  []op
	}{
		{"empty tree misses", []op{{kind: "match", labels: "abc"}, {kind: "evict"}}},
		{"hit ends at the deepest checkpoint", []op{
			{kind: "insert", labels: "abc", base: 10, slot: 1, adopted: pages(10, 3), slotTaken: true},
			{kind: "match", labels: "abcd", hitTokens: 3 * P, hitPages: pages(10, 3)},
			{kind: "match", labels: "abx"}, // b has no checkpoint
			{kind: "insert", labels: "ab", base: 20, slot: 2, slotTaken: true},
			{kind: "match", labels: "abx", hitTokens: 2 * P, hitPages: pages(10, 2)},
			{kind: "match", labels: "xbc"},
		}},
		{"duplicate pages stay the tree's", []op{
			{kind: "insert", labels: "ab", base: 10, slot: 1, adopted: pages(10, 2), slotTaken: true},
			{kind: "insert", labels: "abcd", base: 20, slot: 2, adopted: []int32{22, 23}, slotTaken: true},
			{kind: "insert", labels: "abcd", base: 30, slot: 3},
			{kind: "match", labels: "abcde", hitTokens: 4 * P, hitPages: []int32{10, 11, 22, 23}},
		}},
		{"evict takes the least recently used leaf and its bare ancestors", []op{
			{kind: "insert", labels: "ab", base: 10, slot: 1, adopted: pages(10, 2), slotTaken: true},
			{kind: "insert", labels: "abcd", base: 20, slot: 2, adopted: []int32{22, 23}, slotTaken: true},
			{kind: "insert", labels: "xy", base: 30, slot: 3, adopted: pages(30, 2), slotTaken: true},
			{kind: "match", labels: "abcd", hitTokens: 4 * P, hitPages: []int32{10, 11, 22, 23}},
			// xy is older than abcd: it goes first, both its pages with it.
			{kind: "evict", evicted: []int32{31, 30}, evictSlot: 3, evictOK: true},
			// abcd's tail stops at ab, which holds a checkpoint.
			{kind: "evict", evicted: []int32{23, 22}, evictSlot: 2, evictOK: true},
			{kind: "evict", evicted: []int32{11, 10}, evictSlot: 1, evictOK: true},
			{kind: "evict"},
		}},
		{"locked paths stay", []op{
			{kind: "insert", labels: "ab", base: 10, slot: 1, adopted: pages(10, 2), slotTaken: true},
			{kind: "insert", labels: "abc", base: 20, slot: 2, adopted: []int32{22}, slotTaken: true},
			{kind: "insert", labels: "ax", base: 30, slot: 3, adopted: []int32{31}, slotTaken: true},
			{kind: "lock", ref: 0}, // ab: its leaf c stays evictable
			{kind: "evict", evicted: []int32{22}, evictSlot: 2, evictOK: true},
			{kind: "lock", ref: 2}, // ax
			{kind: "evict"},
			{kind: "unlock", ref: 2},
			{kind: "evict", evicted: []int32{31}, evictSlot: 3, evictOK: true},
			{kind: "evict"}, // ab is still locked
			{kind: "unlock", ref: 0},
			{kind: "evict", evicted: []int32{11, 10}, evictSlot: 1, evictOK: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(P)
			var inserted []*Node
			for i, o := range tc.ops {
				switch o.kind {
				case "insert":
					toks := seq(P, o.labels)
					end, adopted, taken := tr.Insert(toks, pages(o.base, len(o.labels)), nil, o.slot)
					inserted = append(inserted, end)
					if !slices.Equal(adopted, o.adopted) || taken != o.slotTaken {
						t.Fatalf("op %d insert %s: adopted %v taken %v, want %v %v", i, o.labels, adopted, taken, o.adopted, o.slotTaken)
					}
				case "match":
					h := tr.Match(seq(P, o.labels))
					if h.Tokens != o.hitTokens || !slices.Equal(h.Pages, o.hitPages) || (h.Node == nil) != (o.hitTokens == 0) {
						t.Fatalf("op %d match %s: %d tokens pages %v, want %d %v", i, o.labels, h.Tokens, h.Pages, o.hitTokens, o.hitPages)
					}
				case "lock":
					tr.Lock(inserted[o.ref])
				case "unlock":
					tr.Unlock(inserted[o.ref])
				case "evict":
					ev, ok := tr.Evict()
					if ok != o.evictOK || !slices.Equal(ev.Pages, o.evicted) || (ok && ev.Slot != o.evictSlot) {
						t.Fatalf("op %d evict: %v slot %d ok %v, want %v %d %v", i, ev.Pages, ev.Slot, ok, o.evicted, o.evictSlot, o.evictOK)
					}
				}
			}
		})
	}
}

func TestMatchWholePagesAndFeatures(t *testing.T) {
	const P = 4
	tr := New(P)
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	feats := make([]float32, len(toks)*3) // 3 values per token
	for i := range feats {
		feats[i] = float32(i)
	}
	tr.Insert(toks, []int32{7, 9}, feats, 0)
	// The second page is incomplete in the query: only the first can match,
	// and it has no checkpoint.
	if h := tr.Match(toks[:7]); h.Node != nil {
		t.Fatalf("a partial page matched: %+v", h)
	}
	h := tr.Match(append(slices.Clone(toks), 9))
	if h.Tokens != 8 || !slices.Equal(h.Features, feats) {
		t.Fatalf("hit %d tokens, features %v; want 8 and %v", h.Tokens, h.Features, feats)
	}
	feats[0] = -1 // the tree keeps its own copy
	if h := tr.Match(toks); h.Features[0] != 0 {
		t.Fatal("the tree's features alias the caller's")
	}
	// Pages cached without features get them from a later insert.
	bare := New(P)
	bare.Insert(toks, []int32{7, 9}, nil, 0)
	if h := bare.Match(toks); h.Features != nil {
		t.Fatalf("features %v from an insert without any", h.Features)
	}
	bare.Insert(toks, []int32{1, 2}, feats, 1)
	if h := bare.Match(toks); !slices.Equal(h.Features, feats) || !slices.Equal(h.Pages, []int32{7, 9}) {
		t.Fatalf("after a second insert: features %v pages %v", h.Features, h.Pages)
	}
}

// TestTreeRandom runs random inserts, matches, locks and evictions against
// a plain list of the sequences inserted, then evicts everything: each page
// and slot the tree took comes back exactly once.
func TestTreeRandom(t *testing.T) {
	const P = 2
	rng := rand.New(rand.NewPCG(1, 2))
	tr := New(P)
	var checkpoints [][]int32 // token prefixes that got a checkpoint, alive or evicted
	held := map[int32]bool{}
	slotsHeld := map[int]bool{}
	ids := map[uint64]int32{} // the live nodes' IDs and pages
	var locked []*Node
	nextPage, nextSlot := int32(0), 0
	for step := 0; step < 2000; step++ {
		labels := make([]int32, 1+rng.IntN(6))
		for i := range labels {
			labels[i] = int32(rng.IntN(3))
		}
		toks := make([]int32, 0, len(labels)*P)
		for _, l := range labels {
			toks = append(toks, l, l)
		}
		switch r := rng.IntN(10); {
		case r < 4:
			pages := make([]int32, len(labels))
			for i := range pages {
				pages[i] = nextPage
				nextPage++
			}
			end, adopted, taken := tr.Insert(toks, pages, nil, nextSlot)
			for _, p := range adopted {
				held[p] = true
			}
			// The new nodes end the path, one per adopted page, with fresh IDs.
			n := end
			for i := len(adopted) - 1; i >= 0; i-- {
				if _, live := ids[n.ID()]; live || n.ID() == 0 || n.page != adopted[i] {
					t.Fatalf("step %d: new node with ID %d (live %v) and page %d, adopted %v", step, n.ID(), live, n.page, adopted)
				}
				ids[n.ID()] = n.page
				n = n.Parent()
			}
			if taken {
				slotsHeld[nextSlot] = true
				nextSlot++
			}
			checkpoints = append(checkpoints, toks)
			if rng.IntN(3) == 0 {
				tr.Lock(end)
				locked = append(locked, end)
			}
		case r < 7:
			h := tr.Match(toks)
			if h.Tokens%P != 0 || h.Tokens > len(toks) || len(h.Pages) != h.Tokens/P {
				t.Fatalf("step %d: hit of %d tokens with %d pages", step, h.Tokens, len(h.Pages))
			}
			if h.Node != nil && !slices.ContainsFunc(checkpoints, func(c []int32) bool { return slices.Equal(c, toks[:h.Tokens]) }) {
				t.Fatalf("step %d: hit %v was never checkpointed", step, toks[:h.Tokens])
			}
			for _, p := range h.Pages {
				if !held[p] {
					t.Fatalf("step %d: hit page %d is not the tree's", step, p)
				}
			}
		case r < 8 && len(locked) > 0:
			i := rng.IntN(len(locked))
			tr.Unlock(locked[i])
			locked = slices.Delete(locked, i, i+1)
		default:
			evict(t, tr, held, slotsHeld, ids)
		}
		if tr.Pages() != len(held) || tr.Checkpoints() != len(slotsHeld) {
			t.Fatalf("step %d: tree counts %d pages %d slots, held %d %d", step, tr.Pages(), tr.Checkpoints(), len(held), len(slotsHeld))
		}
	}
	for _, n := range locked {
		tr.Unlock(n)
	}
	for evict(t, tr, held, slotsHeld, ids) {
	}
	if len(held) != 0 || len(slotsHeld) != 0 || len(ids) != 0 || tr.Pages() != 0 {
		t.Fatalf("after evicting everything %d pages and %d slots are left", len(held), len(slotsHeld))
	}
}

func evict(t *testing.T, tr *Tree, held map[int32]bool, slots map[int]bool, ids map[uint64]int32) bool {
	t.Helper()
	ev, ok := tr.Evict()
	if !ok {
		return false
	}
	if !slots[ev.Slot] {
		t.Fatalf("evicted slot %d the tree did not hold", ev.Slot)
	}
	delete(slots, ev.Slot)
	for i, id := range ev.IDs {
		if p, live := ids[id]; !live || p != ev.Pages[i] {
			t.Fatalf("evicted ID %d with page %d: live %v with page %d", id, ev.Pages[i], live, p)
		}
		delete(ids, id)
	}
	for _, p := range ev.Pages {
		if !held[p] {
			t.Fatalf("evicted page %d twice or never held", p)
		}
		delete(held, p)
	}
	return true
}
