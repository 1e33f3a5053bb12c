package cpu

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// TestPoolStats checks that PoolStats counts loops, the split ones and a
// barrier wait while a worker runs a slow range, and nothing before
// StartPoolStats.
func TestPoolStats(t *testing.T) {
	be := newBackend(2, portableKernels, 1)
	be.pool.parallelFor(2, 1, func(lo, hi int) {})
	if s := be.PoolStats(); s != (PoolStats{}) {
		t.Errorf("stats before StartPoolStats: %+v", s)
	}
	be.StartPoolStats()
	be.pool.parallelFor(1, 1, func(lo, hi int) {}) // too small to split
	be.pool.parallelFor(2, 1, func(lo, hi int) {
		if lo == 1 { // the worker's range
			time.Sleep(5 * time.Millisecond)
		}
	})
	s := be.PoolStats()
	if s.Calls != 2 || s.Split != 1 {
		t.Errorf("stats %+v: want 2 loops, 1 split", s)
	}
	if s.Wait < 4*time.Millisecond {
		t.Errorf("barrier wait %v, want the worker's 5ms range", s.Wait)
	}
}
