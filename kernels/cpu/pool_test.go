package cpu

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestPoolCoversRangeOnce checks that every item is visited exactly once
// for sizes around the split points.
func TestPoolCoversRangeOnce(t *testing.T) {
	p := newPool(3, 1)
	defer p.close()
	for n := range 12 {
		visits := make([]atomic.Int32, n)
		p.parallelFor(n, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				visits[i].Add(1)
			}
		})
		for i := range visits {
			if v := visits[i].Load(); v != 1 {
				t.Errorf("n=%d: item %d visited %d times", n, i, v)
			}
		}
	}
}

// TestPoolRepanicsOnCaller checks that a panic in a worker reaches the
// goroutine that called parallelFor, and that the pool still works after.
func TestPoolRepanicsOnCaller(t *testing.T) {
	p := newPool(2, 1)
	defer p.close()
	func() {
		defer func() {
			r := recover()
			if s, _ := r.(string); !strings.Contains(s, "bad item") {
				t.Errorf("recovered %v, want the worker's panic", r)
			}
		}()
		p.parallelFor(2, 1, func(lo, hi int) {
			if lo == 1 { // the range handed to the worker goroutine
				panic("bad item")
			}
		})
	}()
	var sum atomic.Int64
	p.parallelFor(100, 1, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	if sum.Load() != 100 {
		t.Errorf("after a panic the pool covered %d of 100 items", sum.Load())
	}
}

// TestPoolStats checks that PoolStats counts loops, the split ones and
// the hand-off of a chunk to the worker, and nothing before StartPoolStats.
func TestPoolStats(t *testing.T) {
	be := newBackend(2, portableKernels, 1)
	be.pool.parallelFor(2, 1, func(lo, hi int) {})
	if s := be.PoolStats(); s != (PoolStats{}) {
		t.Errorf("stats before StartPoolStats: %+v", s)
	}
	be.StartPoolStats()
	be.pool.parallelFor(1, 1, func(lo, hi int) {}) // too small to split
	// Two chunks that wait for each other run on both goroutines.
	var started sync.WaitGroup
	started.Add(2)
	be.pool.parallelFor(2, 1, func(lo, hi int) {
		started.Done()
		started.Wait()
	})
	s := be.PoolStats()
	if s.Calls != 2 || s.Split != 1 || s.Handoff <= 0 {
		t.Errorf("stats %+v: want 2 loops, 1 split, a hand-off", s)
	}
}
