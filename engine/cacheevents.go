package engine

import (
	"slices"

	"ddflash/prefixtree"
)

// CacheEventKind is what a CacheEvent reports.
type CacheEventKind uint8

const (
	// BlocksStored: the blocks, which extend the prefix that ends at
	// Parent, can be resumed from the prefix cache.
	BlocksStored CacheEventKind = iota + 1
	// BlocksRemoved: the blocks left the cache; their pages may be reused.
	BlocksRemoved
)

// CacheEvent is a change in the prompt prefixes the prefix cache can
// resume, in KV pages ("blocks", as vLLM's KV events call them), for a
// router that sends each request where its prefix is cached (see package
// kvevents). A block is stored only when a GDN checkpoint at its end or
// after it makes it resumable, and removed with that checkpoint: a hybrid
// model cannot resume from KV pages alone.
type CacheEvent struct {
	Kind CacheEventKind
	// Blocks name the pages (opaque IDs, never 0, unique while cached). A
	// stored run is in prompt order.
	Blocks []uint64
	// Parent is the block before the first stored one, 0 when they start
	// the prompt.
	Parent uint64
	// Tokens are the stored blocks' tokens, BlockSize each.
	Tokens    []int32
	BlockSize int
}

// SetCacheEvents sends the prefix cache's events to sink, which is called
// on the engine's step loop and must not block (nil: none). Call it before
// serving.
func (e *Engine) SetCacheEvents(sink func(CacheEvent)) { e.cacheEvents = sink }

func (e *Engine) cacheEvent(ev CacheEvent) {
	if e.cacheEvents != nil && len(ev.Blocks) > 0 {
		e.cacheEvents(ev)
	}
}

// storedEvent reports the last n nodes on the path to end, new in the
// tree, whose tokens are the last n pages of prompt.
func storedEvent(end *prefixtree.Node, n int, prompt []int32, pageSize int) CacheEvent {
	ev := CacheEvent{Kind: BlocksStored, Blocks: make([]uint64, n), BlockSize: pageSize,
		Tokens: slices.Clone(prompt[len(prompt)-n*pageSize:])}
	node := end
	for i := n - 1; i >= 0; i-- {
		ev.Blocks[i] = node.ID()
		node = node.Parent()
	}
	ev.Parent = node.ID()
	return ev
}
