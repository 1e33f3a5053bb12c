package kerneltest

import (
	"fmt"
	"math"

	"ddflash/kernels"
)

// attnCase is one sequence of an Attention call, with its logical K/V.
type attnCase struct {
	prefix, queryLen, window int
	mask                     []int32 // nil: causal
	pages                    []int32
	keys, values             [][]float32 // [prefix+queryLen][kvDim]
	queryStart               int
}

// ancestryMask is the tree mask of parents: row i sees j when j is i or an ancestor.
func ancestryMask(parents []int32) []int32 {
	n := len(parents)
	mask := make([]int32, n*n)
	for i := range n {
		for j := i; j >= 0; j = int(parents[j]) {
			mask[i*n+j] = 1
		}
	}
	return mask
}

// testAttention writes K/V through WriteKV into shuffled, non-contiguous
// pages and runs several sequences in one Attention call: causal, a tree
// mask, a random block mask, a decode row and a sliding window, with GQA.
// Each cache storage dtype: WriteKV must round to it to nearest even (read
// back exactly), and the reference attends over the rounded K/V.
// Bound: |Δ| ≤ 2e-5·max|V|, which covers float32 scores and softmax.
// Head dims 10 and 144 (past a 128-lane panel, the real models' width).
func testAttention(h *harness) {
	for _, headDim := range []int{10, 144} {
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, pageSize := range []int{1, 3} {
				testAttentionCache(h, dt, pageSize, headDim)
			}
		}
	}
}

func testAttentionCache(h *harness, cacheType kernels.DType, pageSize, headDim int) {
	shape := kernels.AttnShape{NumHeads: 6, NumKVHeads: 2, HeadDim: headDim}
	shape.Scale = float32(1 / math.Sqrt(float64(shape.HeadDim)))
	kvDim, qDim := shape.NumKVHeads*shape.HeadDim, shape.NumHeads*shape.HeadDim
	shape.PageSize = pageSize
	randomMask := make([]int32, 36)
	for i := range randomMask {
		randomMask[i] = int32(h.rng.IntN(2))
	}
	cases := []*attnCase{
		{prefix: 7, queryLen: 4},
		{prefix: 0, queryLen: 5, mask: ancestryMask(h.randomTree(5))},
		{prefix: 10, queryLen: 1},
		{prefix: 9, queryLen: 6, window: 5},
		{prefix: 4, queryLen: 6, mask: randomMask},
		{prefix: 2, queryLen: 7, mask: ancestryMask(h.randomTree(7))},
	}
	// Hand out pages from a shuffled pool so sequences interleave in the cache.
	pagesNeeded := 0
	for _, c := range cases {
		pagesNeeded += (c.prefix + c.queryLen + pageSize - 1) / pageSize
	}
	pool := h.rng.Perm(pagesNeeded + 3)
	kCache := h.alloc(cacheType, (pagesNeeded+3)*pageSize*kvDim)
	vCache := h.alloc(cacheType, (pagesNeeded+3)*pageSize*kvDim)
	// Place the blocks' query rows in a shuffled order.
	row := 0
	for _, ci := range h.rng.Perm(len(cases)) {
		cases[ci].queryStart = row
		row += cases[ci].queryLen
	}
	queryRows := row
	var seqs []kernels.AttnSeq
	for _, c := range cases {
		npages := (c.prefix + c.queryLen + pageSize - 1) / pageSize
		for _, p := range pool[:npages] {
			c.pages = append(c.pages, int32(p))
		}
		pool = pool[npages:]
		total := c.prefix + c.queryLen
		slots := make([]int32, total)
		for p := range total {
			c.keys = append(c.keys, h.normal(kvDim, 1))
			c.values = append(c.values, h.normal(kvDim, 1))
			slots[p] = c.pages[p/pageSize]*int32(pageSize) + int32(p%pageSize)
		}
		// Prefix and block in two calls, as a model writes them.
		for _, part := range [][2]int{{0, c.prefix}, {c.prefix, total}} {
			n := part[1] - part[0]
			if n == 0 {
				continue
			}
			h.be.WriteKV(kCache, vCache, h.f32(concat(c.keys[part[0]:part[1]])), h.f32(concat(c.values[part[0]:part[1]])), h.i32(slots[part[0]:part[1]]), n, kvDim)
		}
		if cacheType == kernels.BF16 {
			c.keys, c.values = storedBF16(c.keys), storedBF16(c.values)
		}
		h.expectStored(fmt.Sprintf("WriteKV %v page %d", cacheType, pageSize), kCache, c.keys, slots, kvDim)
		h.expectStored(fmt.Sprintf("WriteKV %v page %d", cacheType, pageSize), vCache, c.values, slots, kvDim)
		seq := kernels.AttnSeq{QueryStart: c.queryStart, QueryLen: c.queryLen, Prefix: c.prefix, Pages: h.i32(c.pages), Window: c.window}
		if c.mask != nil {
			seq.Mask = h.i32(c.mask)
		}
		seqs = append(seqs, seq)
	}
	q := h.normal(queryRows*qDim, 1)
	out := h.alloc(kernels.F32, queryRows*qDim)
	h.be.Attention(out, h.f32(q), kCache, vCache, shape, seqs)
	got := h.read(out, queryRows*qDim)
	for ci, c := range cases {
		lo, hi := c.queryStart*qDim, (c.queryStart+c.queryLen)*qDim
		want := refAttention(c, q[lo:hi], shape)
		h.expectClose(fmt.Sprintf("Attention hd %d %v cache page %d seq %d (prefix %d, len %d, mask %v, window %d)", headDim, cacheType, pageSize, ci, c.prefix, c.queryLen, c.mask != nil, c.window),
			got[lo:hi], want, nil, tolerance{2e-5 * maxAbs(widen(concat(c.values))), 0})
	}
}

// storedBF16 rounds every value to bfloat16, as a BF16 cache stores it.
func storedBF16(rows [][]float32) [][]float32 {
	out := make([][]float32, len(rows))
	for i, r := range rows {
		for _, v := range r {
			_, exact := roundBF16(v)
			out[i] = append(out[i], float32(exact))
		}
	}
	return out
}

// expectStored checks that cache rows slots[p] hold rows[p] exactly.
func (h *harness) expectStored(what string, cache kernels.Buffer, rows [][]float32, slots []int32, kvDim int) {
	h.t.Helper()
	all := h.read(cache, cache.Len())
	var got, want []float32
	for p, s := range slots {
		got = append(got, all[int(s)*kvDim:(int(s)+1)*kvDim]...)
		want = append(want, rows[p]...)
	}
	h.expectEqual(what, got, want)
}

func concat(rows [][]float32) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

// refAttention computes one sequence's output rows from its logical K/V.
func refAttention(c *attnCase, q []float32, shape kernels.AttnShape) []float64 {
	hd, group := shape.HeadDim, shape.NumHeads/shape.NumKVHeads
	qDim := shape.NumHeads * hd
	out := make([]float64, c.queryLen*qDim)
	for i := range c.queryLen {
		var visible []int
		for p := range c.prefix + c.queryLen {
			j := p - c.prefix
			switch {
			case j >= 0 && c.mask == nil && j > i:
			case j >= 0 && c.mask != nil && c.mask[i*c.queryLen+j] == 0:
			case c.window > 0 && c.prefix+i-p >= c.window:
			default:
				visible = append(visible, p)
			}
		}
		for head := range shape.NumHeads {
			kvOff := head / group * hd
			qh := q[i*qDim+head*hd : i*qDim+(head+1)*hd]
			scores := make([]float64, len(visible))
			top := math.Inf(-1)
			for n, p := range visible {
				for d := range hd {
					scores[n] += float64(qh[d]) * float64(c.keys[p][kvOff+d])
				}
				scores[n] *= float64(shape.Scale)
				top = math.Max(top, scores[n])
			}
			var sum float64
			for n := range scores {
				scores[n] = math.Exp(scores[n] - top)
				sum += scores[n]
			}
			for n, p := range visible {
				for d := range hd {
					out[i*qDim+head*hd+d] += scores[n] / sum * float64(c.values[p][kvOff+d])
				}
			}
		}
	}
	return out
}

// testMoveKV moves rows with overlapping source and destination sets (a
// shift and a swap): every read must see the contents before the call.
// Each cache storage dtype.
func testMoveKV(h *harness) {
	const slots, kvDim = 9, 5
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		kb, k := h.weights(dt, h.normal(slots*kvDim, 1))
		vb, v := h.weights(dt, h.normal(slots*kvDim, 1))
		dst := []int32{2, 3, 4, 7, 8}
		src := []int32{1, 2, 3, 8, 7}
		h.be.MoveKV(kb, vb, h.i32(dst), h.i32(src), len(dst), kvDim)
		for _, c := range []struct {
			name   string
			before []float64
			buf    kernels.Buffer
		}{{"kCache", k, kb}, {"vCache", v, vb}} {
			want := make([]float32, len(c.before))
			for i, x := range c.before {
				want[i] = float32(x)
			}
			for i := range dst {
				for d := range kvDim {
					want[int(dst[i])*kvDim+d] = float32(c.before[int(src[i])*kvDim+d])
				}
			}
			h.expectEqual(fmt.Sprintf("MoveKV %v %s", dt, c.name), h.read(c.buf, slots*kvDim), want)
		}
	}
}
