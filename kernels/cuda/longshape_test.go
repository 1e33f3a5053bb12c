//go:build cgo

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// longAttnSeq is one sequence of a long-context attention check: its query
// rows, its cached keys before them, and a tree mask (parents, -1 for the
// root) or a sliding window.
type longAttnSeq struct {
	rows, prefix int
	parents      []int
	window       int
}

// treeMask is the [rows*rows] ancestor-or-self mask of a tree given by
// its parents (each before its children).
func treeMask(parents []int) []int32 {
	n := len(parents)
	mask := make([]int32, n*n)
	for i := range parents {
		for a := i; a >= 0; a = parents[a] {
			mask[i*n+a] = 1
		}
	}
	return mask
}

// checkLongAttention runs Attention over seqs in one call on be and on the
// CPU backend (random queries, keys and values written by WriteKV into a
// cache of the given dtype; each sequence's pages scattered over one
// shared cache) and compares the outputs. It returns the number of key
// splits be chose.
func checkLongAttention(t *testing.T, be *Backend, shape kernels.AttnShape, cache kernels.DType, seqs []longAttnSeq) int {
	t.Helper()
	kvDim, qDim := shape.NumKVHeads*shape.HeadDim, shape.NumHeads*shape.HeadDim
	rng := rand.New(rand.NewPCG(9, uint64(len(seqs))))
	var pages [][]int32
	var masks [][]int32
	slots, rows := 0, 0
	for _, s := range seqs {
		n := (s.prefix + s.rows + shape.PageSize - 1) / shape.PageSize
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(slots/shape.PageSize + n - 1 - i) // this sequence's pages, backwards
		}
		pages = append(pages, p)
		var m []int32
		if s.parents != nil {
			m = treeMask(s.parents)
		}
		masks = append(masks, m)
		slots += n * shape.PageSize
		rows += s.rows
	}
	k, v, q := randomF32(rng, slots*kvDim), randomF32(rng, slots*kvDim), randomF32(rng, rows*qDim)
	var out [2][]float32
	var attnSeqs []kernels.AttnSeq
	for i, b := range []kernels.Backend{cpu.New(0), be} {
		up := func(v []float32) kernels.Buffer {
			buf := mustAlloc(t, b, kernels.F32, len(v))
			must(t, b.UploadF32(buf, 0, v))
			return buf
		}
		upI := func(v []int32) kernels.Buffer {
			buf := mustAlloc(t, b, kernels.I32, len(v))
			must(t, b.UploadI32(buf, 0, v))
			return buf
		}
		attnSeqs = attnSeqs[:0]
		start := 0
		for j, s := range seqs {
			seq := kernels.AttnSeq{QueryStart: start, QueryLen: s.rows, Prefix: s.prefix, Pages: upI(pages[j]), Window: s.window}
			if masks[j] != nil {
				seq.Mask = upI(masks[j])
			}
			attnSeqs = append(attnSeqs, seq)
			start += s.rows
		}
		kc, vc := filledCaches(t, b, cache, k, v, kvDim)
		o := mustAlloc(t, b, kernels.F32, rows*qDim)
		b.Attention(o, up(q), kc, vc, shape, attnSeqs)
		out[i] = make([]float32, rows*qDim)
		must(t, b.DownloadF32(o, 0, out[i]))
	}
	// Both sum the same exact-ish terms in different orders and with
	// different exp implementations: a few F32 roundings apart.
	d := relNorm(out[1], out[0])
	if !(d < 1e-5) {
		t.Errorf("%v cache, %d sequences, %d rows: ‖cuda−cpu‖/‖cpu‖ = %.2g", cache, len(seqs), rows, d)
	}
	t.Logf("%v cache, %d sequences, %d rows: ‖cuda−cpu‖/‖cpu‖ = %.2g", cache, len(seqs), rows, d)
	return longAttnSplits(be, shape, cache, seqs)
}

// filledCaches returns K and V caches of dtype cache on b holding k and v
// row by row ([slots, kvDim]; WriteKV rounds them to the cache's dtype).
func filledCaches(t *testing.T, b kernels.Backend, cache kernels.DType, k, v []float32, kvDim int) (kc, vc kernels.Buffer) {
	t.Helper()
	slots := len(k) / kvDim
	every := make([]int32, slots)
	for i := range every {
		every[i] = int32(i)
	}
	kb, vb, sb := mustAlloc(t, b, kernels.F32, len(k)), mustAlloc(t, b, kernels.F32, len(v)), mustAlloc(t, b, kernels.I32, slots)
	must(t, b.UploadF32(kb, 0, k))
	must(t, b.UploadF32(vb, 0, v))
	must(t, b.UploadI32(sb, 0, every))
	kc, vc = mustAlloc(t, b, cache, len(k)), mustAlloc(t, b, cache, len(v))
	b.WriteKV(kc, vc, kb, vb, sb, slots, kvDim)
	for _, buf := range []kernels.Buffer{kb, vb, sb} {
		b.Free(buf)
	}
	return kc, vc
}

// longAttnSplits is the number of key splits be chooses for seqs over a
// cache of the given dtype.
func longAttnSplits(be *Backend, shape kernels.AttnShape, cache kernels.DType, seqs []longAttnSeq) int {
	var as []kernels.AttnSeq
	keys := 0
	for _, s := range seqs {
		as = append(as, kernels.AttnSeq{QueryLen: s.rows, Prefix: s.prefix})
		keys = max(keys, s.prefix+s.rows)
	}
	_, tileQ, _ := attnKernel(cache)
	return be.attnSplits(keys, attnTiles(as, shape.NumHeads/shape.NumKVHeads, tileQ)*shape.NumKVHeads)
}

// qwen36Attn is Qwen3.6-27B's full-attention head layout: 24 query heads
// sharing 4 KV heads (6 each), head dim 256.
var qwen36Attn = kernels.AttnShape{
	NumHeads: qwen36.heads, NumKVHeads: qwen36.kvHeads, HeadDim: qwen36.headDim, PageSize: qwen36.pageSize,
	Scale: float32(1 / math.Sqrt(float64(qwen36.headDim))),
}

// tree16 is a 17-node draft tree (root and 16 nodes: two branches of
// depth 4 and side shoots), as a DDTree budget-16 verify sees.
var tree16 = []int{-1, 0, 1, 2, 3, 0, 5, 6, 7, 1, 2, 5, 6, 9, 3, 4, 8}

func TestTreeMask(t *testing.T) {
	got := treeMask([]int{-1, 0, 0, 1})
	want := []int32{1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("treeMask = %v, want %v", got, want)
		}
	}
}

// checkGDNChunked compares GDNChunked over T tokens on be with the CPU
// backend (random inputs, keys and queries of about unit length as after
// L2Norm, chunks of 64 on both).
func checkGDNChunked(t *testing.T, be *Backend, shape kernels.GDNShape, T int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(13, uint64(T)))
	qk, vd := T*shape.KeyHeads*shape.KeyDim, T*shape.ValueHeads*shape.ValueDim
	q, k, v := randomF32(rng, qk), randomF32(rng, qk), randomF32(rng, vd)
	norm := float32(1 / math.Sqrt(float64(shape.KeyDim)))
	for i := range q {
		q[i] *= norm
		k[i] *= norm
	}
	g, beta := make([]float32, T*shape.ValueHeads), make([]float32, T*shape.ValueHeads)
	for i := range g {
		g[i], beta[i] = -0.3*rng.Float32(), rng.Float32()
	}
	state := randomF32(rng, shape.StateLen())
	var outs, states [2][]float32
	for i, b := range []kernels.Backend{cpu.New(0), be} {
		up := func(v []float32) kernels.Buffer {
			buf := mustAlloc(t, b, kernels.F32, len(v))
			must(t, b.UploadF32(buf, 0, v))
			return buf
		}
		out, st := mustAlloc(t, b, kernels.F32, vd), up(state)
		b.GDNChunked(out, up(q), up(k), up(v), up(g), up(beta), st, st, T, 64, shape)
		outs[i], states[i] = make([]float32, vd), make([]float32, shape.StateLen())
		must(t, b.DownloadF32(out, 0, outs[i]))
		must(t, b.DownloadF32(st, 0, states[i]))
	}
	if d := relNorm(outs[1], outs[0]); !(d < 1e-5) {
		t.Errorf("%+v T=%d: out ‖cuda−cpu‖/‖cpu‖ = %.2g", shape, T, d)
	}
	if d := relNorm(states[1], states[0]); !(d < 1e-5) {
		t.Errorf("%+v T=%d: state ‖cuda−cpu‖/‖cpu‖ = %.2g", shape, T, d)
	}
}
