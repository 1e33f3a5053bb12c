package mamba

import (
	"errors"
	"strings"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

func TestPoolAcquireZeroesAndRelease(t *testing.T) {
	b := cpu.New(1)
	shape := Shape{Layers: 2, ConvDim: 6, ConvKernel: 4, GDN: kernels.GDNShape{KeyHeads: 1, ValueHeads: 2, KeyDim: 3, ValueDim: 2}}
	p, err := NewPool([]Shard{{B: b, Shape: shape}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s0, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	dirty := make([]float32, shape.GDN.StateLen())
	for i := range dirty {
		dirty[i] = 1
	}
	if err := b.UploadF32(p.SSM(0, 1, s0), 0, dirty); err != nil {
		t.Fatal(err)
	}
	s1, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("third acquire of two slots: %v, want ErrNoSlot", err)
	}
	p.Release(s0)
	again, err := p.Acquire()
	if err != nil || again != s0 {
		t.Fatalf("reacquire: slot %d err %v, want slot %d", again, err, s0)
	}
	got := make([]float32, shape.GDN.StateLen())
	if err := b.DownloadF32(p.SSM(0, 1, again), 0, got); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != 0 {
			t.Fatalf("reacquired slot not zeroed at %d: %g", i, v)
		}
	}
	if s1 == s0 || p.Free() != 0 {
		t.Fatalf("slots %d and %d, %d free", s0, s1, p.Free())
	}
}

// allocCounter counts the bytes its backend's Alloc hands out.
type allocCounter struct {
	kernels.Backend
	bytes int64
}

func (c *allocCounter) Alloc(dt kernels.DType, n int) (kernels.Buffer, error) {
	c.bytes += int64(n * dt.Size())
	return c.Backend.Alloc(dt, n)
}

// TestPoolStorageDTypes: the conv and recurrent states are stored in the
// dtypes the shard names, in exactly the bytes SlotBytes (the planner's
// count) gives per slot, and a dtype the kernels cannot store is refused
// naming which state asked for it.
func TestPoolStorageDTypes(t *testing.T) {
	shape := Shape{Layers: 3, ConvDim: 12, ConvKernel: 4, GDN: kernels.GDNShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 8, ValueDim: 6}}
	for _, dt := range [][2]kernels.DType{{kernels.F32, kernels.F32}, {kernels.F32, kernels.BF16}, {kernels.BF16, kernels.F32}, {kernels.BF16, kernels.BF16}} {
		b := &allocCounter{Backend: cpu.New(1)}
		const slots = 5
		p, err := NewPool([]Shard{{B: b, Shape: shape, ConvDType: dt[0], SSMDType: dt[1]}}, slots)
		if err != nil {
			t.Fatal(err)
		}
		if got := [2]kernels.DType{p.Conv(0, 0, 0).DType(), p.SSM(0, 0, 0).DType()}; got != dt {
			t.Errorf("asked for conv/recurrent %v, got %v", dt, got)
		}
		if want := slots * SlotBytes(shape, dt[1].Size(), dt[0].Size()); b.bytes != want {
			t.Errorf("conv/recurrent %v: the pool allocated %d bytes, SlotBytes counts %d", dt, b.bytes, want)
		}
		p.Close()
	}
	b := cpu.New(1)
	if _, err := NewPool([]Shard{{B: b, Shape: shape, SSMDType: kernels.F16}}, 1); err == nil || !strings.Contains(err.Error(), "recurrent state dtype F16") {
		t.Errorf("an F16 recurrent state: %v, want a refusal naming it", err)
	}
}
