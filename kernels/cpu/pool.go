package cpu

import "sync"

// pool is a fixed set of worker goroutines. Decode steps issue hundreds of
// small ops, so workers are started once and fed ranges over a channel.
type pool struct {
	threads int
	// minWork is the least work (in multiply-adds or elements) worth handing
	// to another worker; smaller loops stay on the calling goroutine.
	minWork int
	tasks   chan poolTask
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
	if parts <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	call := &poolCall{}
	call.done.Add(parts)
	for i := 1; i < parts; i++ {
		p.tasks <- poolTask{lo: i * n / parts, hi: (i + 1) * n / parts, fn: fn, call: call}
	}
	call.run(poolTask{lo: 0, hi: n / parts, fn: fn})
	call.done.Wait()
	if call.panicked != nil {
		panic(call.panicked)
	}
}
