package cpu

import "sync"

// temps hands out float32 work buffers that kernel calls reuse. A decode
// step runs the conv kernels in every Gated DeltaNet layer, and their few
// kilobytes of temporaries, allocated afresh per call, were four fifths of
// what the default pair allocated: the collector ran 25 times a second.
// A buffer too short for a request is dropped for a longer one, so the
// kept ones grow to the longest use.
type temps struct{ pool sync.Pool } // of *[]float32

// get returns a buffer of n values with undefined contents, and its
// handle for put.
func (t *temps) get(n int) (*[]float32, []float32) {
	if p, ok := t.pool.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p, *p
	}
	s := make([]float32, n)
	return &s, s
}

// put returns a buffer from get once nothing reads it.
func (t *temps) put(p *[]float32) { t.pool.Put(p) }
