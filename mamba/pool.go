// Package mamba manages Gated DeltaNet state: one slot per running request
// holding, for every GDN layer, the causal-conv window and the fp32 recurrent
// state, plus what speculative decoding needs to roll states back.
package mamba

import (
	"errors"
	"fmt"

	"ddflash/kernels"
)

// ErrNoSlot is returned when every state slot is in use. Callers can queue the
// request or retry later.
var ErrNoSlot = errors.New("mamba: no free state slot")

// Shape is the per-layer state geometry of a GDN model.
type Shape struct {
	Layers     int // GDN layers
	ConvDim    int // conv channels (q | k | v)
	ConvKernel int // K; the conv state keeps K-1 rows
	GDN        kernels.GDNShape
}

// ConvLen is the number of F32 elements of one layer's conv state: [K-1, ConvDim].
func (s Shape) ConvLen() int { return (s.ConvKernel - 1) * s.ConvDim }

// Pool holds slots of GDN state on a backend. It is not safe for concurrent
// use: the engine's step loop owns it.
type Pool struct {
	b     kernels.Backend
	shape Shape
	slots int
	conv  []kernels.Buffer // per layer: [slots, K-1, ConvDim]
	ssm   []kernels.Buffer // per layer: [slots, ValueHeads, KeyDim, ValueDim]
	free  []int
	inUse []bool
}

// NewPool allocates n slots.
func NewPool(b kernels.Backend, shape Shape, n int) (*Pool, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mamba: pool needs at least one slot, got %d", n)
	}
	p := &Pool{b: b, shape: shape, slots: n, inUse: make([]bool, n)}
	for l := 0; l < shape.Layers; l++ {
		c, err := b.Alloc(kernels.F32, n*shape.ConvLen())
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("mamba: conv state for %d slots: %w", n, err)
		}
		p.conv = append(p.conv, c)
		s, err := b.Alloc(kernels.F32, n*shape.GDN.StateLen())
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("mamba: recurrent state for %d slots: %w", n, err)
		}
		p.ssm = append(p.ssm, s)
	}
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, i)
	}
	return p, nil
}

// Close frees the pool's memory.
func (p *Pool) Close() {
	for _, c := range p.conv {
		p.b.Free(c)
	}
	for _, s := range p.ssm {
		p.b.Free(s)
	}
	p.conv, p.ssm = nil, nil
}

// Shape returns the pool's geometry.
func (p *Pool) Shape() Shape { return p.shape }

// Slots is the pool's capacity.
func (p *Pool) Slots() int { return p.slots }

// Free reports how many slots are unused.
func (p *Pool) Free() int { return len(p.free) }

// Acquire takes a slot and zeroes its state (a fresh request starts from zero).
func (p *Pool) Acquire() (int, error) {
	if len(p.free) == 0 {
		return -1, ErrNoSlot
	}
	slot := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.inUse[slot] = true
	for l := 0; l < p.shape.Layers; l++ {
		p.b.Fill(p.Conv(l, slot), 0)
		p.b.Fill(p.SSM(l, slot), 0)
	}
	return slot, nil
}

// Release returns a slot to the pool. Releasing a free slot is a bug.
func (p *Pool) Release(slot int) {
	if slot < 0 || slot >= p.slots || !p.inUse[slot] {
		panic(fmt.Sprintf("mamba: release of slot %d that is not in use", slot))
	}
	p.inUse[slot] = false
	p.free = append(p.free, slot)
}

// Conv is layer l's conv state of a slot: [K-1, ConvDim], oldest row first.
func (p *Pool) Conv(l, slot int) kernels.Buffer {
	n := p.shape.ConvLen()
	return p.b.Slice(p.conv[l], slot*n, n)
}

// SSM is layer l's recurrent state of a slot: [ValueHeads, KeyDim, ValueDim].
func (p *Pool) SSM(l, slot int) kernels.Buffer {
	n := p.shape.GDN.StateLen()
	return p.b.Slice(p.ssm[l], slot*n, n)
}
