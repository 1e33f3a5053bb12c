// Package mamba manages Gated DeltaNet state: one slot per running request
// holding, for every GDN layer, the causal-conv window and the recurrent
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

// ConvLen is the number of elements of one layer's conv state: [K-1, ConvDim].
func (s Shape) ConvLen() int { return (s.ConvKernel - 1) * s.ConvDim }

// Shard is one tensor-parallel rank's part of the state: the backend that
// holds it, the geometry of the heads that rank owns and the storage dtypes
// of the conv and recurrent states (each F32, the zero value, or BF16).
// Without tensor parallelism there is one shard with the whole model's shape.
type Shard struct {
	B         kernels.Backend
	Shape     Shape
	ConvDType kernels.DType
	SSMDType  kernels.DType
}

// Pool holds slots of GDN state on one or more shards; a slot number names
// the same request's state on every shard. It is not safe for concurrent
// use: the engine's step loop owns it.
type Pool struct {
	shards []poolShard
	slots  int
	free   []int
	inUse  []bool
}

type poolShard struct {
	Shard
	conv []kernels.Buffer // per layer: [slots, K-1, ConvDim]
	ssm  []kernels.Buffer // per layer: [slots, ValueHeads, KeyDim, ValueDim]
}

// NewPool allocates n slots on every shard.
func NewPool(shards []Shard, n int) (*Pool, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mamba: pool needs at least one slot, got %d", n)
	}
	if len(shards) == 0 {
		return nil, errors.New("mamba: pool needs at least one shard")
	}
	p := &Pool{slots: n, inUse: make([]bool, n)}
	for r, sh := range shards {
		for _, dt := range []struct {
			what string
			dt   kernels.DType
		}{{"conv", sh.ConvDType}, {"recurrent", sh.SSMDType}} {
			if dt.dt != kernels.F32 && dt.dt != kernels.BF16 {
				p.Close()
				return nil, fmt.Errorf("mamba: %s state dtype %v: want F32 or BF16", dt.what, dt.dt)
			}
		}
		ps := poolShard{Shard: sh}
		for l := 0; l < sh.Shape.Layers; l++ {
			c, err := sh.B.Alloc(sh.ConvDType, n*sh.Shape.ConvLen())
			if err != nil {
				p.Close()
				return nil, fmt.Errorf("mamba: rank %d conv state for %d slots: %w", r, n, err)
			}
			ps.conv = append(ps.conv, c)
			s, err := sh.B.Alloc(sh.SSMDType, n*sh.Shape.GDN.StateLen())
			if err != nil {
				sh.B.Free(c)
				p.Close()
				return nil, fmt.Errorf("mamba: rank %d recurrent state for %d slots: %w", r, n, err)
			}
			ps.ssm = append(ps.ssm, s)
		}
		p.shards = append(p.shards, ps)
	}
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, i)
	}
	return p, nil
}

// Close frees the pool's memory.
func (p *Pool) Close() {
	for i := range p.shards {
		sh := &p.shards[i]
		for _, c := range sh.conv {
			sh.B.Free(c)
		}
		for _, s := range sh.ssm {
			sh.B.Free(s)
		}
		sh.conv, sh.ssm = nil, nil
	}
}

// Ranks is the number of shards.
func (p *Pool) Ranks() int { return len(p.shards) }

// Shard returns a rank's backend and state geometry.
func (p *Pool) Shard(rank int) Shard { return p.shards[rank].Shard }

// Slots is the pool's capacity.
func (p *Pool) Slots() int { return p.slots }

// Free reports how many slots are unused.
func (p *Pool) Free() int { return len(p.free) }

// Spare names a slot no request holds, without taking it (false when all
// are held): a step may scribble on its state, since Acquire zeroes it.
func (p *Pool) Spare() (int, bool) {
	if len(p.free) == 0 {
		return 0, false
	}
	return p.free[0], true
}

// Acquire takes a slot and zeroes its state on every shard (a fresh request
// starts from zero).
func (p *Pool) Acquire() (int, error) {
	if len(p.free) == 0 {
		return -1, ErrNoSlot
	}
	slot := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.inUse[slot] = true
	for r, sh := range p.shards {
		for l := 0; l < sh.Shape.Layers; l++ {
			sh.B.Fill(p.Conv(r, l, slot), 0)
			sh.B.Fill(p.SSM(r, l, slot), 0)
		}
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

// Conv is rank's share of layer l's conv state of a slot: [K-1, ConvDim],
// oldest row first.
func (p *Pool) Conv(rank, l, slot int) kernels.Buffer {
	sh := &p.shards[rank]
	n := sh.Shape.ConvLen()
	return sh.B.Slice(sh.conv[l], slot*n, n)
}

// ConvLayer and SSMLayer are rank's share of layer l's conv and recurrent
// states of every slot, one after another (what a GDN op given a slot at
// run time indexes: kernels.GDNConvSeq.SlotAt).
func (p *Pool) ConvLayer(rank, l int) kernels.Buffer { return p.shards[rank].conv[l] }
func (p *Pool) SSMLayer(rank, l int) kernels.Buffer  { return p.shards[rank].ssm[l] }

// SSM is rank's share of layer l's recurrent state of a slot:
// [ValueHeads, KeyDim, ValueDim].
func (p *Pool) SSM(rank, l, slot int) kernels.Buffer {
	sh := &p.shards[rank]
	n := sh.Shape.GDN.StateLen()
	return sh.B.Slice(sh.ssm[l], slot*n, n)
}
