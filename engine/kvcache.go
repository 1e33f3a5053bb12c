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
// sequence owns whole pages, the same page index in every layer.
type KVCache struct {
	b        kernels.Backend
	pageSize int
	numPages int
	kvDim    int
	k, v     []kernels.Buffer
	free     []int32
}

// NewKVCache allocates numPages pages of pageSize tokens for layers layers.
func NewKVCache(b kernels.Backend, layers, kvDim, pageSize, numPages int) (*KVCache, error) {
	if pageSize <= 0 || numPages <= 0 {
		return nil, fmt.Errorf("engine: KV cache needs positive page size and page count, got %d and %d", pageSize, numPages)
	}
	c := &KVCache{b: b, pageSize: pageSize, numPages: numPages, kvDim: kvDim}
	rows := pageSize * numPages
	for l := 0; l < layers; l++ {
		k, err := b.Alloc(kernels.F32, rows*kvDim)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("engine: KV cache of %d tokens: %w", rows, err)
		}
		v, err := b.Alloc(kernels.F32, rows*kvDim)
		if err != nil {
			b.Free(k)
			c.Close()
			return nil, fmt.Errorf("engine: KV cache of %d tokens: %w", rows, err)
		}
		c.k, c.v = append(c.k, k), append(c.v, v)
	}
	for p := numPages - 1; p >= 0; p-- {
		c.free = append(c.free, int32(p))
	}
	return c, nil
}

// Close frees the cache memory.
func (c *KVCache) Close() {
	for i := range c.k {
		c.b.Free(c.k[i])
		c.b.Free(c.v[i])
	}
	c.k, c.v = nil, nil
}

// PageSize is the number of tokens per page.
func (c *KVCache) PageSize() int { return c.pageSize }

// Pages is the total number of pages.
func (c *KVCache) Pages() int { return c.numPages }

// FreePages is the number of unused pages.
func (c *KVCache) FreePages() int { return len(c.free) }

// Layer returns layer l's K and V buffers ([slots, kvDim]).
func (c *KVCache) Layer(l int) (k, v kernels.Buffer) { return c.k[l], c.v[l] }

// SeqKV is one sequence's page table.
type SeqKV struct {
	Pages []int32
}

// Slot is the physical cache row of the sequence's logical position pos.
func (s *SeqKV) Slot(pageSize, pos int) int32 {
	return s.Pages[pos/pageSize]*int32(pageSize) + int32(pos%pageSize)
}

// Reserve makes sure the sequence owns pages for n tokens. On ErrKVFull it
// keeps the pages it already had.
func (c *KVCache) Reserve(s *SeqKV, n int) error {
	need := (n + c.pageSize - 1) / c.pageSize
	if need-len(s.Pages) > len(c.free) {
		return fmt.Errorf("%w: %d tokens need %d more pages, %d free", ErrKVFull, n, need-len(s.Pages), len(c.free))
	}
	for len(s.Pages) < need {
		s.Pages = append(s.Pages, c.free[len(c.free)-1])
		c.free = c.free[:len(c.free)-1]
	}
	return nil
}

// Truncate keeps pages for the first n tokens and returns the rest.
func (c *KVCache) Truncate(s *SeqKV, n int) {
	keep := (n + c.pageSize - 1) / c.pageSize
	for len(s.Pages) > keep {
		c.free = append(c.free, s.Pages[len(s.Pages)-1])
		s.Pages = s.Pages[:len(s.Pages)-1]
	}
}
