package tokenizer

import (
	"slices"
	"strings"
	"sync"
)

// bpe is the byte-level BPE model: a pre-token's bytes start as the ids of
// their single-byte tokens and the lowest-ranked adjacent pair is merged
// until no pair has a merge, leftmost first among equal ranks, as HF does.
type bpe struct {
	byteIDs      [256]int32       // id of each byte's one-character token, -1 if not in the vocabulary
	merges       map[uint64]merge // keyed by pairKey(left, right)
	unkID        int32            // -1 when the model has no unk_token
	fuseUnk      bool
	ignoreMerges bool
	wholeWords   map[string]int32 // raw bytes → id, used only with ignore_merges
	cache        wordCache
}

// merge is what a pair of adjacent ids becomes, and its priority.
type merge struct{ rank, id int32 }

func pairKey(left, right int32) uint64 { return uint64(uint32(left))<<32 | uint64(uint32(right)) }

// symbol is one node of the linked list of current tokens in a word.
// A merged-away symbol has id -1.
type symbol struct{ id, prev, next int32 }

// candidate is a possible merge of the symbol at pos with its successor.
// It goes stale when either symbol changes; pop checks that it still applies.
type candidate struct{ rank, pos, id int32 }

// bpeScratch holds per-call buffers so encoding a word allocates nothing.
type bpeScratch struct {
	symbols []symbol
	heap    []candidate
}

// appendWord appends the ids of one pre-token (raw bytes) to dst.
func (m *bpe) appendWord(dst []int32, word string, sc *bpeScratch) []int32 {
	if len(word) == 0 {
		return dst
	}
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	if id, ok := m.wholeWords[word]; ok {
		dst = append(dst, id)
	} else {
		dst = m.mergeWord(dst, word, sc)
	}
	if len(word) <= maxCachedWord {
		m.cache.put(word, dst[start:])
	}
	return dst
}

func (m *bpe) mergeWord(dst []int32, word string, sc *bpeScratch) []int32 {
	syms := m.initialSymbols(sc.symbols[:0], word)
	sc.symbols = syms
	if len(syms) == 0 {
		return dst
	}
	h := sc.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = append(h, candidate{mg.rank, int32(i), mg.id})
		}
	}
	heapify(h)
	for len(h) > 0 {
		var c candidate
		c, h = heapPop(h)
		left := &syms[c.pos]
		if left.id < 0 || left.next < 0 {
			continue
		}
		right := &syms[left.next]
		// A stale candidate names a pair that is no longer there. Symbols only
		// grow, so the current pair makes the same token only if it is that pair.
		if mg, ok := m.merges[pairKey(left.id, right.id)]; !ok || mg.id != c.id {
			continue
		}
		left.id = c.id
		left.next = right.next
		right.id = -1
		if left.next >= 0 {
			syms[left.next].prev = c.pos
			if mg, ok := m.merges[pairKey(c.id, syms[left.next].id)]; ok {
				h = heapPush(h, candidate{mg.rank, c.pos, mg.id})
			}
		}
		if left.prev >= 0 {
			if mg, ok := m.merges[pairKey(syms[left.prev].id, c.id)]; ok {
				h = heapPush(h, candidate{mg.rank, left.prev, mg.id})
			}
		}
	}
	sc.heap = h
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

// initialSymbols makes one symbol per byte. Bytes whose token is missing
// become unk_token (consecutive ones fused into one with fuse_unk) or are
// dropped when there is no unk_token, as HF does.
func (m *bpe) initialSymbols(syms []symbol, word string) []symbol {
	pendingUnk := false
	add := func(id int32) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1})
	}
	for i := 0; i < len(word); i++ {
		id := m.byteIDs[word[i]]
		switch {
		case id >= 0:
			if pendingUnk {
				add(m.unkID)
				pendingUnk = false
			}
			add(id)
		case m.unkID < 0:
		case m.fuseUnk:
			pendingUnk = true
		default:
			if pendingUnk {
				add(m.unkID)
			}
			pendingUnk = true
		}
	}
	if pendingUnk {
		add(m.unkID)
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

func candidateLess(a, b candidate) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

func heapify(h []candidate) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
}

func heapPush(h []candidate, c candidate) []candidate {
	h = append(h, c)
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !candidateLess(h[i], h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
	return h
}

func heapPop(h []candidate) (candidate, []candidate) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	siftDown(h, 0)
	return top, h
}

func siftDown(h []candidate, i int) {
	for {
		smallest := i
		if l := 2*i + 1; l < len(h) && candidateLess(h[l], h[smallest]) {
			smallest = l
		}
		if r := 2*i + 2; r < len(h) && candidateLess(h[r], h[smallest]) {
			smallest = r
		}
		if smallest == i {
			return
		}
		h[i], h[smallest] = h[smallest], h[i]
		i = smallest
	}
}

// maxCachedWord and maxCacheEntries bound the word cache; a full cache is
// emptied so that it follows the text being encoded.
const (
	maxCachedWord   = 256
	maxCacheEntries = 1 << 16
)

// wordCache remembers the ids of recent pre-tokens. It is safe for
// concurrent use.
type wordCache struct {
	mu    sync.RWMutex
	words map[string][]int32
}

func (c *wordCache) get(word string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.words[word]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int32) {
	c.mu.Lock()
	if c.words == nil || len(c.words) >= maxCacheEntries {
		c.words = make(map[string][]int32)
	}
	c.words[strings.Clone(word)] = slices.Clone(ids) // word may be a slice of a large text
	c.mu.Unlock()
}
