package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// pool is a fixed set of worker goroutines. Decode steps issue hundreds of
// small ops, so workers are started once and fed loops over a channel.
// A loop is cut into chunks that the calling goroutine and the workers
// claim one at a time: a worker that starts late (a parked goroutine's
// wake-up takes microseconds, and far longer on a busy machine) takes
// fewer chunks instead of holding the caller at the barrier. A worker
// that has finished a loop polls for the next one for a while before it
// parks, as a decode step's next loop follows within microseconds.
type pool struct {
	threads int
	// minWork is the least work (in multiply-adds or elements) worth handing
	// to another worker; smaller loops stay on the calling goroutine.
	minWork int
	calls   chan *poolCall
	// stats, when set, counts what the hand-offs cost (see PoolStats).
	stats atomic.Pointer[poolCounters]
}

// PoolStats is what a backend's worker pool spent on meeting its workers
// since StartPoolStats (a profile's "between the threads" share).
type PoolStats struct {
	Calls int // parallel loops
	Split int // of them, offered to other workers
	// Handoff sums, over the loops a worker took part in, the time from
	// offering it to the worker claiming its first chunk.
	Handoff time.Duration
	// Wait sums the time the calling goroutine waited, after the last
	// chunk was claimed, for the workers to finish theirs (the barrier).
	Wait time.Duration
}

type poolCounters struct {
	calls, split, handoffNs, waitNs atomic.Int64
}

// defaultMinWork is about ten microseconds of one core's work (a decode
// row reading 512 KB of bf16 weights): with the workers polling through a
// step (spinFor), a hand-off costs a microsecond or two, so every
// projection of a small model's decode step is split. Parked, a worker
// took 40 µs to wake on a 2-vCPU VM; at 1<<20, with a 50 µs poll, the
// small preset's decode step left its 2 MB projections and the GDN
// recurrence on one thread and paid a wake-up at most of the rest
// (docs/cpu-profile.md).
const defaultMinWork = 1 << 18

// chunksPerThread is how many chunks a split loop has per goroutine taking
// part: enough that a late worker costs the caller at most a fraction of
// its share at the barrier, few enough that chunks stay large (a decode
// step's smallest split matmul gets chunks of over 100 KB of weights).
const chunksPerThread = 4

// spinFor is how long a worker, and a caller at the barrier, poll before
// parking: longer than the gaps between a decode step's split loops (the
// unsplit ops between them, a GDN layer's convolution and norms: tens of
// microseconds), short enough that an idle engine's workers park at once
// next to a scheduler's time slice.
const spinFor = 200 * time.Microsecond

// poolCall is one split parallelFor: its chunks, how many are claimed and
// finished, and the first panic of a chunk, re-raised on the calling goroutine.
type poolCall struct {
	fn        func(lo, hi int)
	n, chunks int
	claimed   atomic.Int64
	finished  atomic.Int64
	done      chan struct{} // closed when the last chunk finishes
	sent      time.Time     // set while stats are counted
	mu        sync.Mutex
	panicked  any
}

// claim returns the next unclaimed chunk, or -1 when none is left.
func (c *poolCall) claim() int {
	if i := int(c.claimed.Add(1) - 1); i < c.chunks {
		return i
	}
	return -1
}

// work runs chunks until none is left unclaimed.
func (c *poolCall) work() {
	for i := c.claim(); i >= 0; i = c.claim() {
		c.run(i)
	}
}

func (c *poolCall) run(i int) {
	defer func() {
		if r := recover(); r != nil {
			c.mu.Lock()
			if c.panicked == nil {
				c.panicked = r
			}
			c.mu.Unlock()
		}
		if int(c.finished.Add(1)) == c.chunks {
			close(c.done)
		}
	}()
	c.fn(i*c.n/c.chunks, (i+1)*c.n/c.chunks)
}

func newPool(threads, minWork int) *pool {
	p := &pool{threads: threads, minWork: minWork, calls: make(chan *poolCall, threads)}
	for range threads - 1 { // the calling goroutine is the last worker
		go func() {
			for {
				c, ok := spinReceive(p.calls)
				if !ok {
					return
				}
				i := c.claim()
				if i < 0 {
					continue // the caller ran every chunk before this worker came
				}
				if s := p.stats.Load(); s != nil && !c.sent.IsZero() {
					s.handoffNs.Add(int64(time.Since(c.sent)))
				}
				c.run(i)
				c.work()
			}
		}()
	}
	return p
}

// spinReceive receives from ch, polling for spinFor before it blocks.
func spinReceive[T any](ch <-chan T) (T, bool) {
	start := time.Now()
	for time.Since(start) < spinFor {
		select {
		case v, ok := <-ch:
			return v, ok
		default:
			runtime.Gosched()
		}
	}
	v, ok := <-ch
	return v, ok
}

func (p *pool) close() { close(p.calls) }

// parallelFor calls fn on disjoint ranges covering [0, n) and returns when
// all are done. itemCost is the work of one item: a loop is offered to as
// many workers as can each get minWork of it. fn must not call parallelFor
// itself.
func (p *pool) parallelFor(n, itemCost int, fn func(lo, hi int)) {
	parts := p.threads
	minItems := max(1, p.minWork/max(1, itemCost))
	if most := n / minItems; most < parts {
		parts = most
	}
	stats := p.stats.Load()
	if stats != nil {
		stats.calls.Add(1)
	}
	if parts <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	c := &poolCall{fn: fn, n: n, chunks: min(n, parts*chunksPerThread), done: make(chan struct{})}
	if stats != nil {
		stats.split.Add(1)
		c.sent = time.Now()
	}
	for range parts - 1 {
		select {
		case p.calls <- c:
		default: // the workers have loops queued already: the caller does the rest
		}
	}
	c.work()
	var t0 time.Time
	if stats != nil {
		t0 = time.Now()
	}
	spinReceive(c.done)
	if stats != nil {
		stats.waitNs.Add(int64(time.Since(t0)))
	}
	if c.panicked != nil {
		panic(c.panicked)
	}
}

// StartPoolStats starts counting PoolStats afresh.
func (be *Backend) StartPoolStats() { be.pool.stats.Store(new(poolCounters)) }

// PoolStats returns the counts since StartPoolStats (zero without it).
func (be *Backend) PoolStats() PoolStats {
	c := be.pool.stats.Load()
	if c == nil {
		return PoolStats{}
	}
	return PoolStats{Calls: int(c.calls.Load()), Split: int(c.split.Load()),
		Handoff: time.Duration(c.handoffNs.Load()), Wait: time.Duration(c.waitNs.Load())}
}
