package cpu

import "sync"

// pool is a fixed set of worker goroutines. Decode steps issue hundreds of
// small ops, so workers are started once and fed ranges over a channel.
type pool struct {
	threads int
	tasks   chan poolTask
}

type poolTask struct {
	lo, hi int
	fn     func(lo, hi int)
	done   *sync.WaitGroup
}

func newPool(threads int) *pool {
	p := &pool{threads: threads, tasks: make(chan poolTask, threads)}
	for range threads - 1 { // the calling goroutine is the last worker
		go func() {
			for t := range p.tasks {
				t.fn(t.lo, t.hi)
				t.done.Done()
			}
		}()
	}
	return p
}

func (p *pool) close() { close(p.tasks) }

// parallelFor calls fn on disjoint ranges covering [0, n) and returns when
// all are done. Ranges hold at least minGrain items, so tiny loops stay on
// the calling goroutine. fn must not call parallelFor itself.
func (p *pool) parallelFor(n, minGrain int, fn func(lo, hi int)) {
	parts := p.threads
	if minGrain < 1 {
		minGrain = 1
	}
	if most := n / minGrain; most < parts {
		parts = most
	}
	if parts <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	var done sync.WaitGroup
	done.Add(parts - 1)
	for i := 1; i < parts; i++ {
		p.tasks <- poolTask{lo: i * n / parts, hi: (i + 1) * n / parts, fn: fn, done: &done}
	}
	fn(0, n/parts)
	done.Wait()
}
