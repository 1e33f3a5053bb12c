package cpu

import (
	"sync"
	"sync/atomic"
	"time"
)

// pool is a fixed set of worker goroutines. Decode steps issue hundreds of
// small ops, so workers are started once and fed ranges over a channel.
type pool struct {
	threads int
	// minWork is the least work (in multiply-adds or elements) worth handing
	// to another worker; smaller loops stay on the calling goroutine.
	minWork int
	tasks   chan poolTask
	// stats, when set, counts what the hand-offs cost (see PoolStats).
	stats atomic.Pointer[poolCounters]
}

// PoolStats is what a backend's worker pool spent on meeting its workers
// since StartPoolStats (a profile's "between the threads" share).
type PoolStats struct {
	Calls int // parallel loops
	Split int // of them, split between goroutines
	// Handoff sums, over the ranges handed to another worker, the time
	// from handing it over to the worker starting it (a parked worker's
	// wake-up).
	Handoff time.Duration
	// Wait sums the time the calling goroutine waited, after its own
	// range, for the other workers to finish theirs (the barrier: their
	// late start plus any imbalance).
	Wait time.Duration
}

type poolCounters struct {
	calls, split, handoffNs, waitNs atomic.Int64
}

// defaultMinWork is tens of microseconds of one core's work: handing a
// range to a parked worker (a futex wake-up) costs several, and on a
// two-core machine the default pair's 16-row verify ran faster serial than
// split at 1<<17, where futex calls took a tenth of its time.
const defaultMinWork = 1 << 20

type poolTask struct {
	lo, hi int
	fn     func(lo, hi int)
	call   *poolCall
	sent   time.Time // set while stats are counted
}

// poolCall tracks one parallelFor: its outstanding ranges and the first
// panic of a worker, which is re-raised on the calling goroutine.
type poolCall struct {
	done     sync.WaitGroup
	mu       sync.Mutex
	panicked any
}

func (c *poolCall) run(t poolTask) {
	defer c.done.Done()
	defer func() {
		if r := recover(); r != nil {
			c.mu.Lock()
			if c.panicked == nil {
				c.panicked = r
			}
			c.mu.Unlock()
		}
	}()
	t.fn(t.lo, t.hi)
}

func newPool(threads, minWork int) *pool {
	p := &pool{threads: threads, minWork: minWork, tasks: make(chan poolTask, threads)}
	for range threads - 1 { // the calling goroutine is the last worker
		go func() {
			for t := range p.tasks {
				if c := p.stats.Load(); c != nil && !t.sent.IsZero() {
					c.handoffNs.Add(int64(time.Since(t.sent)))
				}
				t.call.run(t)
			}
		}()
	}
	return p
}

func (p *pool) close() { close(p.tasks) }

// parallelFor calls fn on disjoint ranges covering [0, n) and returns when
// all are done. itemCost is the work of one item: ranges carry at least
// minWork of it. fn must not call parallelFor itself.
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
	var sent time.Time
	if stats != nil {
		stats.split.Add(1)
		sent = time.Now()
	}
	call := &poolCall{}
	call.done.Add(parts)
	for i := 1; i < parts; i++ {
		p.tasks <- poolTask{lo: i * n / parts, hi: (i + 1) * n / parts, fn: fn, call: call, sent: sent}
	}
	call.run(poolTask{lo: 0, hi: n / parts, fn: fn})
	if stats != nil {
		t0 := time.Now()
		call.done.Wait()
		stats.waitNs.Add(int64(time.Since(t0)))
	} else {
		call.done.Wait()
	}
	if call.panicked != nil {
		panic(call.panicked)
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
