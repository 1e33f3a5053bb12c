package mamba

import (
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// opCounter is a backend that counts the row copies and gathers it runs.
type opCounter struct {
	kernels.Backend
	copies, gathers int
}

func (b *opCounter) Copy(dst, src kernels.Buffer, rows, cols, dstStride, srcStride int) {
	b.copies++
	b.Backend.Copy(dst, src, rows, cols, dstStride, srcStride)
}

func (b *opCounter) Embedding(out, table, ids kernels.Buffer, n, dim int) {
	b.gathers++
	b.Backend.Embedding(out, table, ids, n, dim)
}

// TestReplayCommitAlongATreePath commits a tree path that is not a prefix
// under Replay: the recurrent state becomes the recurrence over the path's
// saved inputs from the committed state (bit for bit: the same op on
// host-gathered rows), and the inputs are gathered in one op per input and
// layer, not copied token by token.
func TestReplayCommitAlongATreePath(t *testing.T) {
	b := &opCounter{Backend: cpu.New(1)}
	gdn := kernels.GDNShape{KeyHeads: 1, ValueHeads: 2, KeyDim: 4, ValueDim: 3}
	shape := Shape{Layers: 2, ConvDim: 2*4 + 2*3, ConvKernel: 4, GDN: gdn}
	pool, err := NewPool([]Shard{{B: b, Shape: shape}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	acquire := func() int {
		s, err := pool.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	slot, ref := acquire(), acquire() // ref: the state the reference recurrence updates
	const n = 5
	parents, path := []int32{-1, 0, 0, 1, 2}, []int32{0, 2, 4}
	v, err := NewVerify(pool, Replay, n)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Begin(n, parents); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	widths := [5]int{gdn.KeyHeads * gdn.KeyDim, gdn.KeyHeads * gdn.KeyDim, gdn.ValueHeads * gdn.ValueDim, gdn.ValueHeads, gdn.ValueHeads}
	upload := func(vals []float32) kernels.Buffer {
		buf, err := b.Alloc(kernels.F32, len(vals))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.UploadF32(buf, 0, vals); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	random := func(k int) []float32 {
		out := make([]float32, k)
		for i := range out {
			out[i] = float32(rng.NormFloat64()) / 4
		}
		return out
	}
	inputs := make([][5][]float32, shape.Layers)
	for l := range shape.Layers {
		var bufs [5]kernels.Buffer
		for i, w := range widths {
			inputs[l][i] = random(n * w)
			bufs[i] = upload(inputs[l][i])
		}
		v.Save(0, l, upload(random(n*shape.ConvDim)), bufs[0], bufs[1], bufs[2], bufs[3], bufs[4])
	}
	b.copies, b.gathers = 0, 0
	if err := v.Commit(pool, slot, path); err != nil {
		t.Fatal(err)
	}
	if b.copies != 0 || b.gathers != 5*shape.Layers {
		t.Errorf("the commit ran %d copies and %d gathers; want none and 5 per layer (%d)", b.copies, b.gathers, 5*shape.Layers)
	}
	for l := range shape.Layers {
		var rows [5]kernels.Buffer
		for i, w := range widths {
			var picked []float32
			for _, p := range path {
				picked = append(picked, inputs[l][i][int(p)*w:int(p+1)*w]...)
			}
			rows[i] = upload(picked)
		}
		state := pool.SSM(0, l, ref)
		b.GDNRecurrence(nil, rows[0], rows[1], rows[2], rows[3], rows[4], state, state, nil, nil, len(path), gdn)
		want, got := make([]float32, gdn.StateLen()), make([]float32, gdn.StateLen())
		if err := b.DownloadF32(state, 0, want); err != nil {
			t.Fatal(err)
		}
		if err := b.DownloadF32(pool.SSM(0, l, slot), 0, got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) || slices.Equal(want, make([]float32, len(want))) {
			t.Errorf("layer %d: the committed state differs from the recurrence over the path's inputs", l)
		}
	}
}
