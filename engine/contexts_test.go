package engine

import "testing"

// TestContextPool: buffers come back empty with their capacity, at most
// keep are kept, and an empty or oversized one is not.
func TestContextPool(t *testing.T) {
	var p contextPool
	if b := p.get(); b != nil {
		t.Fatalf("an empty pool gave %d values of capacity", cap(b))
	}
	p.put(make([]float32, 5, 8), 2)
	p.put(make([]float32, 3, 16), 2)
	p.put(make([]float32, 1, 32), 2) // beyond keep
	p.put(nil, 2)
	p.put(make([]float32, 0, maxKeptContext+1), 2)
	var caps []int
	for b := p.get(); b != nil; b = p.get() {
		if len(b) != 0 {
			t.Errorf("a kept buffer came back with %d values", len(b))
		}
		caps = append(caps, cap(b))
	}
	if len(caps) != 2 || caps[0] != 16 || caps[1] != 8 {
		t.Errorf("capacities %v, want [16 8]", caps)
	}
}
