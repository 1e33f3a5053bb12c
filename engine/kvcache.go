package engine

import (
	"errors"
	"fmt"

	"ddflash/kernels"
)

// ErrKVFull is returned when the paged KV cache has no free page. The caller
// decides what to do (queue, preempt, or fail the request).
var ErrKVFull = errors.New("engine: KV cache is full")

// KVCache is a paged key/value cache for the full-attention layers: every
// layer has one K and one V buffer of NumPages*PageSize rows of kvDim, and a
// sequence owns whole pages, the same page index in every layer. Under tensor
// parallelism each rank (shard) holds the rows of its own KV heads; the page
// table is shared. A page may be shared (the prefix cache and the requests
// that reuse a prefix): it counts its holders and is free when none is left.
// Only a page's first holder writes it; sharers only read.
type KVCache struct {
	pageSize int
	numPages int
	shards   []kvShard
	free     []int32
	refs     []int32 // holders per page
	cached   []bool  // the prefix cache is one of the page's holders
	idle     int     // cached pages no sequence holds (evictable on demand)
}

// KVShard is one rank's part of a KV cache: its backend, the width of one
// token's K (or V) for the KV heads it holds, and the storage dtype (F32,
// the zero value, or BF16).
type KVShard struct {
	B     kernels.Backend
	KVDim int
	DType kernels.DType
}

type kvShard struct {
	KVShard
	k, v []kernels.Buffer // per layer
}

// NewKVCache allocates numPages pages of pageSize tokens for layers layers
// on every shard.
func NewKVCache(shards []KVShard, layers, pageSize, numPages int) (*KVCache, error) {
	if pageSize <= 0 || numPages <= 0 {
		return nil, fmt.Errorf("engine: KV cache needs positive page size and page count, got %d and %d", pageSize, numPages)
	}
	c := &KVCache{pageSize: pageSize, numPages: numPages, refs: make([]int32, numPages), cached: make([]bool, numPages)}
	rows := pageSize * numPages
	for r, sh := range shards {
		if sh.DType != kernels.F32 && sh.DType != kernels.BF16 {
			c.Close()
			return nil, fmt.Errorf("engine: KV cache dtype %v: want F32 or BF16", sh.DType)
		}
		c.shards = append(c.shards, kvShard{KVShard: sh})
		cs := &c.shards[r]
		for l := 0; l < layers; l++ {
			k, err := sh.B.Alloc(sh.DType, rows*sh.KVDim)
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("engine: rank %d KV cache of %d tokens: %w", r, rows, err)
			}
			v, err := sh.B.Alloc(sh.DType, rows*sh.KVDim)
			if err != nil {
				sh.B.Free(k)
				c.Close()
				return nil, fmt.Errorf("engine: rank %d KV cache of %d tokens: %w", r, rows, err)
			}
			cs.k, cs.v = append(cs.k, k), append(cs.v, v)
		}
	}
	for p := numPages - 1; p >= 0; p-- {
		c.free = append(c.free, int32(p))
	}
	return c, nil
}

// Close frees the cache memory.
func (c *KVCache) Close() {
	for r := range c.shards {
		sh := &c.shards[r]
		for i := range sh.k {
			sh.B.Free(sh.k[i])
			sh.B.Free(sh.v[i])
		}
		sh.k, sh.v = nil, nil
	}
}

// PageSize is the number of tokens per page.
func (c *KVCache) PageSize() int { return c.pageSize }

// Pages is the total number of pages.
func (c *KVCache) Pages() int { return c.numPages }

// PagesFor is the number of pages that hold n tokens.
func (c *KVCache) PagesFor(n int) int { return (n + c.pageSize - 1) / c.pageSize }

// FreePages is the number of unused pages.
func (c *KVCache) FreePages() int { return len(c.free) }

// IdleCachedPages is the number of pages that only the prefix cache holds:
// not free, but not in use by a request either (one that needs them
// evicts the cache).
func (c *KVCache) IdleCachedPages() int { return c.idle }

// Layer returns rank's K and V buffers of layer l ([slots, kvDim]).
func (c *KVCache) Layer(rank, l int) (k, v kernels.Buffer) {
	return c.shards[rank].k[l], c.shards[rank].v[l]
}

// Shard returns a rank's backend and K/V width.
func (c *KVCache) Shard(rank int) KVShard { return c.shards[rank].KVShard }

// SeqKV is one sequence's page table.
type SeqKV struct {
	Pages []int32
}

// Slot is the physical cache row of the sequence's logical position pos.
func (s *SeqKV) Slot(pageSize, pos int) int32 {
	return s.Pages[pos/pageSize]*int32(pageSize) + int32(pos%pageSize)
}

// Spare names a page no sequence or cache holds, without taking it (false
// when none is free): a step may scribble on it, since a sequence that
// reserves it writes its rows before it reads them.
func (c *KVCache) Spare() (int32, bool) {
	if len(c.free) == 0 {
		return 0, false
	}
	return c.free[0], true
}

// Reserve makes sure the sequence owns pages for n tokens. On ErrKVFull it
// keeps the pages it already had.
func (c *KVCache) Reserve(s *SeqKV, n int) error {
	need := c.PagesFor(n)
	if need-len(s.Pages) > len(c.free) {
		return fmt.Errorf("%w: %d tokens need %d more pages, %d free", ErrKVFull, n, need-len(s.Pages), len(c.free))
	}
	for len(s.Pages) < need {
		p := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		c.refs[p] = 1
		s.Pages = append(s.Pages, p)
	}
	return nil
}

// Truncate keeps pages for the first n tokens and lets go of the rest.
func (c *KVCache) Truncate(s *SeqKV, n int) {
	keep := c.PagesFor(n)
	for len(s.Pages) > keep {
		c.Release(s.Pages[len(s.Pages)-1])
		s.Pages = s.Pages[:len(s.Pages)-1]
	}
}

// Share appends pages held elsewhere to an empty sequence's table (a cached
// prefix) and counts the sequence as one more holder of each.
func (c *KVCache) Share(s *SeqKV, pages []int32) {
	if len(s.Pages) != 0 {
		panic("engine: a shared prefix must start the sequence")
	}
	for _, p := range pages {
		c.Retain(p)
	}
	s.Pages = append(s.Pages, pages...)
}

// Retain counts one more holder of a page in use.
func (c *KVCache) Retain(p int32) {
	if c.refs[p] <= 0 {
		panic(fmt.Sprintf("engine: retain of free KV page %d", p))
	}
	if c.cached[p] && c.refs[p] == 1 {
		c.idle--
	}
	c.refs[p]++
}

// Release drops one holder of a page; the last one frees it.
func (c *KVCache) Release(p int32) {
	if c.refs[p] <= 0 {
		panic(fmt.Sprintf("engine: release of free KV page %d", p))
	}
	c.refs[p]--
	switch {
	case c.refs[p] == 0:
		c.free = append(c.free, p)
	case c.cached[p] && c.refs[p] == 1:
		c.idle++
	}
}

// Cache counts the prefix cache as one more holder of a page a sequence holds.
func (c *KVCache) Cache(p int32) {
	if c.cached[p] {
		panic(fmt.Sprintf("engine: KV page %d is cached already", p))
	}
	c.Retain(p)
	c.cached[p] = true
}

// Uncache drops the prefix cache's hold on a page.
func (c *KVCache) Uncache(p int32) {
	if !c.cached[p] {
		panic(fmt.Sprintf("engine: KV page %d is not cached", p))
	}
	if c.refs[p] == 1 {
		c.idle--
	}
	c.cached[p] = false
	c.Release(p)
}
