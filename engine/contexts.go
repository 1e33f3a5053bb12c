package engine

import "sync"

// maxKeptContext bounds the capacity, in values, of a drafter context
// buffer kept for reuse (64 MiB): one that grew with a long prompt goes
// back to the collector rather than staying idle.
const maxKeptContext = 16 << 20

// contextPool keeps finished requests' drafter context buffers (job.context)
// for new ones. A speculating request gathers its prompt's and replies'
// features there; allocated afresh for every request, they keep the
// collector busy, since the engine's own heap is small (weights and caches
// live outside it): on the default pair, a plain decoding step of
// --spec adaptive took 3 % longer than auto's before buffers were reused.
type contextPool struct {
	mu   sync.Mutex
	free [][]float32
}

// get returns an empty buffer, with the capacity of one kept if any.
func (p *contextPool) get() []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.free)
	if n == 0 {
		return nil
	}
	b := p.free[n-1]
	p.free = p.free[:n-1]
	return b
}

// put keeps b for reuse, up to keep buffers.
func (p *contextPool) put(b []float32, keep int) {
	if cap(b) == 0 || cap(b) > maxKeptContext {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < keep {
		p.free = append(p.free, b[:0])
	}
}
