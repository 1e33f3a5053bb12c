package mamba

import (
	"errors"
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
