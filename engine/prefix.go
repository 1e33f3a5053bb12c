package engine

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"

	"ddflash/prefixtree"
)

// prefixCache reuses the KV pages, GDN states and drafter features of
// prompt prefixes across requests (see package prefixtree for the policy).
//
// Exactness: a checkpoint is taken only at a prompt position that is a
// multiple of align (whole pages and whole GDN chunks) reached by a prefill
// forward, where the caches hold exactly what a prefill from the start
// holds at that position (prefill forwards end at GDN chunk boundaries and
// gdnChain computes whole chunks the same way wherever a forward begins).
// States after decoded tokens are computed token by token and differ in
// rounding from a prefill of the same tokens, so they are never cached.
// Instead, a finished request's prompt and output are prefilled again by a
// checkpoint prefill (newCheckpointJob), a job of the lowest priority that
// stores their last aligned position as a prompt's, so that the next turn
// of a chat reuses the reply too. The scheduler runs it when no request
// waits and drops it when one needs its slot or pages; Generate runs it
// before returning.
//
// Memory: checkpoints live in state slots beyond the engine's MaxSeqs and
// cached pages in the KV pool; a running request that needs a page evicts
// unlocked entries, least recently used first, so it never waits for the
// cache.
type prefixCache struct {
	tree     *prefixtree.Tree
	slots    int // checkpoint slots the cache may take from the pool
	held     int // checkpoint slots taken
	align    int // checkpoints sit at multiples of align tokens
	interval int // tokens between a prompt's checkpoints (a multiple of align); 0: only its end

	queried, hits atomic.Int64 // prompt tokens looked up and found
	pages, ckpts  atomic.Int64 // what the tree holds, for readers off the step loop
}

// PrefixStats describes the prefix cache for metrics.
type PrefixStats struct {
	QueriedTokens int64 // prompt tokens of requests looked up
	HitTokens     int64 // of which reused from the cache
	Pages         int64 // KV pages the cache holds
	Checkpoints   int64 // GDN checkpoints the cache holds
}

// SetPrefixCache turns the prefix cache on or off (when the engine has
// one); off, it drops what it holds, so that the memory is the requests'.
// Call it while no request is in flight.
func (e *Engine) SetPrefixCache(on bool) {
	if e.prefix != nil && !on {
		e.prefix.evict(e, e.Model.KV.Pages())
	}
	e.prefixOff = !on
}

// activePrefix is the prefix cache new requests use, nil when off.
func (e *Engine) activePrefix() *prefixCache {
	if e.prefixOff {
		return nil
	}
	return e.prefix
}

// PrefixCaching reports whether new requests use the prefix cache.
func (e *Engine) PrefixCaching() bool { return e.activePrefix() != nil }

// PrefixStats returns the prefix cache's counters; safe to call from any goroutine.
func (e *Engine) PrefixStats() PrefixStats {
	c := e.prefix
	if c == nil {
		return PrefixStats{}
	}
	return PrefixStats{QueriedTokens: c.queried.Load(), HitTokens: c.hits.Load(), Pages: c.pages.Load(), Checkpoints: c.ckpts.Load()}
}

func newPrefixCache(pageSize, slots, intervalPages int) *prefixCache {
	align := pageSize
	for align%gdnChunk != 0 {
		align += pageSize
	}
	interval := (max(intervalPages, 0)*pageSize + align - 1) / align * align
	return &prefixCache{tree: prefixtree.New(pageSize), slots: slots, align: align, interval: interval}
}

// nextCheckpoint is the first position after prefilled where a prompt of n
// tokens is checkpointed (every interval tokens, and its last whole
// aligned chunk), 0 when there is none.
func (c *prefixCache) nextCheckpoint(prefilled, n int) int {
	end := n / c.align * c.align
	if c.interval > 0 {
		if next := (prefilled/c.interval + 1) * c.interval; next < end {
			return next
		}
	}
	if end > prefilled {
		return end
	}
	return 0
}

// featureWidth is the drafter feature values per token a job keeps, 0 when
// it keeps none.
func (e *Engine) featureWidth() int {
	if e.Spec.Mode == SpecAuto || e.Drafter == nil {
		return 0
	}
	return len(e.Drafter.TapLayers()) * e.Model.Cfg.HiddenSize
}

// reuse starts a new job from the longest cached prefix of its prompt (at
// least one prompt token is left to prefill, for the first logits) and
// sets where its prompt's checkpoint goes.
func (c *prefixCache) reuse(e *Engine, j *job) {
	prompt := j.out.r.Prompt
	if !j.checkpointOnly { // not a request: vLLM's counters leave it out
		c.queried.Add(int64(len(prompt)))
	}
	j.checkpointAt = c.nextCheckpoint(0, len(prompt))
	h := c.tree.Match(prompt[:len(prompt)-1])
	width := e.featureWidth()
	if h.Node == nil || (width > 0 && len(h.Features) != h.Tokens*width) {
		return // a miss, or cached without the features this mode needs
	}
	j.checkpointAt = c.nextCheckpoint(h.Tokens, len(prompt))
	e.Model.KV.Share(&j.seq.kv, h.Pages)
	e.Model.States.CopySlot(j.seq.slot, h.Node.Slot())
	j.seq.len, j.prefilled = h.Tokens, h.Tokens
	if width > 0 {
		j.context = append(j.context, h.Features...)
		j.contextTokens = append(j.contextTokens, prompt[:h.Tokens]...)
	}
	c.tree.Lock(h.Node)
	j.cacheNode = h.Node
	if !j.checkpointOnly {
		c.hits.Add(int64(h.Tokens))
	}
	j.out.res.Stats.CachedTokens = h.Tokens
}

// newCheckpointJob makes a checkpoint prefill for a finished request's
// prompt and output: a job that feeds them, from their longest cached
// prefix up to their last whole aligned chunk, through the normal prefill
// path, stores the checkpoint there as a prompt's, and ends without
// sampling. It is nil when the cache is off, the tokens hold no whole chunk
// past what the cache already has, or no state slot is free for it.
func (e *Engine) newCheckpointJob(tokens []int32) *job {
	c := e.activePrefix()
	if c == nil || e.freeSeqSlots() <= 0 {
		return nil
	}
	n := len(tokens) / c.align * c.align
	if n == 0 || c.tree.Match(tokens[:n]).Tokens == n {
		return nil
	}
	j, err := e.startJob(Request{Prompt: tokens[:n], MaxTokens: 1}, true)
	if err != nil {
		return nil // a best effort: a prefix as long as the context, say
	}
	return j
}

// checkpointReply runs a checkpoint prefill for a finished request at once
// (Generate's path, where no scheduler can run it later).
func (e *Engine) checkpointReply(ctx context.Context, prompt, output []int32) {
	if j := e.newCheckpointJob(slices.Concat(prompt, output)); j != nil {
		defer j.close()
		_ = e.run(ctx, j) // a best effort: what it stored before an error is exact
	}
}

// store caches the job's prompt up to its current length (a multiple of
// align): its pages, drafter features and a copy of its GDN state.
func (c *prefixCache) store(e *Engine, j *job) {
	j.checkpointAt = c.nextCheckpoint(j.prefilled, len(j.out.r.Prompt))
	slot, ok := c.takeSlot(e)
	if !ok {
		return // every checkpoint is in use by running requests
	}
	n, width := j.prefilled, e.featureWidth()
	var features []float32
	if width > 0 {
		features = j.context[:n*width]
	}
	end, adopted, taken := c.tree.Insert(j.out.r.Prompt[:n], j.seq.kv.Pages[:n/e.Model.KV.PageSize()], features, slot)
	for _, p := range adopted {
		e.Model.KV.Cache(p)
	}
	if taken {
		e.Model.States.CopySlot(slot, j.seq.slot)
	} else {
		c.giveSlot(e, slot)
	}
	if len(adopted) > 0 { // new pages end at the new checkpoint: resumable now
		e.cacheEvent(storedEvent(end, len(adopted), j.out.r.Prompt[:n], e.Model.KV.PageSize()))
	}
	c.tree.Lock(end)
	c.unlock(j)
	j.cacheNode = end
	c.publish()
}

// unlock lets the cache evict the prefix a job holds.
func (c *prefixCache) unlock(j *job) {
	if j.cacheNode != nil {
		c.tree.Unlock(j.cacheNode)
		j.cacheNode = nil
	}
}

// takeSlot finds a state slot for a new checkpoint: a free one while the
// cache holds fewer than its share, else the least recently used
// checkpoint's.
func (c *prefixCache) takeSlot(e *Engine) (int, bool) {
	if c.held < c.slots {
		if slot, err := e.Model.States.Acquire(); err == nil {
			c.held++
			return slot, true
		}
	}
	for {
		ev, ok := c.tree.Evict()
		if !ok {
			return -1, false
		}
		c.release(e, ev)
		if ev.Slot != prefixtree.NoSlot {
			return ev.Slot, true
		}
	}
}

func (c *prefixCache) giveSlot(e *Engine, slot int) {
	e.Model.States.Release(slot)
	c.held--
}

// release lets go of an eviction's pages, once it has told the cache
// events' subscriber that they are gone.
func (c *prefixCache) release(e *Engine, ev prefixtree.Eviction) {
	e.cacheEvent(CacheEvent{Kind: BlocksRemoved, Blocks: ev.IDs})
	for _, p := range ev.Pages {
		e.Model.KV.Uncache(p)
	}
}

// evict drops least recently used unlocked entries until want pages are
// free or nothing is left to drop.
func (c *prefixCache) evict(e *Engine, want int) {
	for e.Model.KV.FreePages() < want {
		ev, ok := c.tree.Evict()
		if !ok {
			break
		}
		c.release(e, ev)
		if ev.Slot != prefixtree.NoSlot {
			c.giveSlot(e, ev.Slot)
		}
	}
	c.publish()
}

func (c *prefixCache) publish() {
	c.pages.Store(int64(c.tree.Pages()))
	c.ckpts.Store(int64(c.tree.Checkpoints()))
}

// reserveKV is KVCache.Reserve that first evicts cached prefixes when the
// free pages do not suffice.
func (e *Engine) reserveKV(s *SeqKV, n int) error {
	err := e.Model.KV.Reserve(s, n)
	if errors.Is(err, ErrKVFull) && e.prefix != nil {
		e.prefix.evict(e, e.Model.KV.PagesFor(n)-len(s.Pages))
		err = e.Model.KV.Reserve(s, n)
	}
	return err
}

// freeSeqSlots is the state slots free for requests: the pool's free slots
// less those kept for checkpoints the cache has not taken yet.
func (e *Engine) freeSeqSlots() int {
	n := e.Model.States.Free()
	if c := e.prefix; c != nil {
		n -= c.slots - c.held
	}
	return n
}
