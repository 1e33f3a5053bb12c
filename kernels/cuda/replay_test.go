//go:build cgo

package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// The pieces of a replayable step on the CPU emulation (children of
// TestEmulator): the driver's counters, cuBLASLt inside a graph, attention
// reading its sequences from device memory, and the one-download top-k.

// TestEmulatedCounts runs allocations, transfers, kernels, a cuBLASLt
// GEMM and a graph replay, and checks both the emulated driver's counters
// and the backend's own tally against what was issued.
func TestEmulatedCounts(t *testing.T) {
	be := emulated(t)
	emu0, ok := EmulatorCounts()
	if !ok {
		t.Fatal("the emulated driver has no counters")
	}
	own0 := be.Counts()
	const m, n, k = 12, 16, 64 // above gemvMaxRows: one split, one cuBLASLt GEMM, one sum
	x, w, out := mustAlloc(t, be, kernels.F32, m*k), mustAlloc(t, be, kernels.BF16, n*k), mustAlloc(t, be, kernels.F32, m*n)
	must(t, be.UploadF32(x, 0, make([]float32, m*k)))
	be.MatMul(out, x, w, m, n, k)
	must(t, be.DownloadF32(out, 0, make([]float32, m*n)))
	g, err := be.Capture(func() error { be.MatMul(out, x, w, m, n, k); be.Add(out, out, out, m*n); return nil })
	must(t, err)
	defer g.Close()
	must(t, g.Replay())
	must(t, g.Replay())
	must(t, be.Sync())
	emu, _ := EmulatorCounts()
	// Three buffers and the scratch the split GEMM takes; the eager MatMul's
	// three launches and two graph launches.
	want := kernels.DriverCounts{Launches: 3 + 2, Allocs: 3 + 1, Uploads: 1, UploadBytes: 4 * m * k, Downloads: 1, DownloadBytes: 4 * m * n}
	if got := emu.Sub(emu0); got != want {
		t.Errorf("emulated driver counted %v, want %v", got, want)
	}
	if got, own := emu.Sub(emu0), be.Counts().Sub(own0); got != own {
		t.Errorf("the backend's tally %v differs from the emulated driver's %v", own, got)
	}
}

// TestEmulatedGraphCuBLASLt: a graph captures a cuBLASLt GEMM (verify
// rows), whose replay recomputes it from new inputs bit for bit.
func TestEmulatedGraphCuBLASLt(t *testing.T) {
	be := emulated(t)
	const m, n, k = 17, 24, 64
	rng := rand.New(rand.NewPCG(21, 22))
	x, out := mustAlloc(t, be, kernels.F32, m*k), mustAlloc(t, be, kernels.F32, m*n)
	w := mustAlloc(t, be, kernels.BF16, n*k)
	must(t, be.Upload(w, 0, encode(kernels.BF16, randomF32(rng, n*k))))
	must(t, be.UploadF32(x, 0, randomF32(rng, m*k)))
	be.MatMul(out, x, w, m, n, k) // sizes the scratch before the capture
	g, err := be.Capture(func() error { be.MatMul(out, x, w, m, n, k); return nil })
	must(t, err)
	defer g.Close()
	for range 2 { // the replay first: the scratch then holds the previous inputs' products
		must(t, be.UploadF32(x, 0, randomF32(rng, m*k)))
		be.Fill(out, float32(math.NaN()))
		must(t, g.Replay())
		got := download(t, be, out)
		be.MatMul(out, x, w, m, n, k)
		if want := download(t, be, out); !slices.Equal(got, want) {
			t.Fatalf("replayed cuBLASLt MatMul differs from the eager one: ‖Δ‖/‖eager‖ = %g", relNorm(got, want))
		}
	}
}

// TestEmulatedAttentionTable captures AttentionTable once and replays it
// over steps whose sequences grow (new prefixes and pages, a tree mask,
// uploaded into the same table): each replay equals the eager call bit for
// bit and the CPU backend's Attention to rounding, with and without a key
// split, on F32 and BF16 caches (the F32 and the tensor-core kernel).
func TestEmulatedAttentionTable(t *testing.T) {
	for _, cache := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(cache.String(), func(t *testing.T) { checkAttentionTable(t, cache) })
	}
}

func checkAttentionTable(t *testing.T, cache kernels.DType) {
	be := emulated(t)
	shape := kernels.AttnShape{NumHeads: 1, NumKVHeads: 1, HeadDim: 24, PageSize: 4, Scale: 0.2}
	kvDim, qDim := shape.NumKVHeads*shape.HeadDim, shape.NumHeads*shape.HeadDim
	const slots, rows = 1200, 4 // one decode row and a 3-node tree
	rng := rand.New(rand.NewPCG(23, 24))
	kv, q := [2][]float32{randomF32(rng, slots*kvDim), randomF32(rng, slots*kvDim)}, randomF32(rng, rows*qDim)
	cpuB := cpu.New(1)
	upload := func(b kernels.Backend, v []float32) kernels.Buffer {
		buf := mustAlloc(t, b, kernels.F32, len(v))
		must(t, b.UploadF32(buf, 0, v))
		return buf
	}
	mask := []int32{1, 0, 0, 1, 1, 0, 1, 0, 1}
	for _, maxKeys := range []int{64, 1024} { // 1024 keys split on the emulation's 4 SMs
		kc, vc := filledCaches(t, be, cache, kv[0], kv[1], kvDim)
		ck, cv := filledCaches(t, cpuB, cache, kv[0], kv[1], kvDim)
		qv, out := upload(be, q), mustAlloc(t, be, kernels.F32, rows*qDim)
		cq, cout := upload(cpuB, q), mustAlloc(t, cpuB, kernels.F32, rows*qDim)
		// The step's metadata: one I32 buffer holding the table (first, at
		// an even offset), both page tables and the mask.
		tableLen := be.AttnTableLen(2)
		pagesLen := slots / shape.PageSize
		meta := mustAlloc(t, be, kernels.I32, tableLen+2*pagesLen+len(mask))
		seqsOn := func(b kernels.Backend, meta kernels.Buffer, prefixes [2]int) []kernels.AttnSeq {
			p0, p1 := b.Slice(meta, tableLen, pagesLen), b.Slice(meta, tableLen+pagesLen, pagesLen)
			return []kernels.AttnSeq{
				{QueryStart: 0, QueryLen: 1, Prefix: prefixes[0], Pages: p0},
				{QueryStart: 1, QueryLen: 3, Prefix: prefixes[1], Pages: p1, Mask: b.Slice(meta, tableLen+2*pagesLen, len(mask))},
			}
		}
		hostMeta := func(b kernels.Backend, seqs []kernels.AttnSeq) []int32 {
			v := make([]int32, tableLen, tableLen+2*pagesLen+len(mask))
			if r, ok := b.(kernels.Replayer); ok {
				r.EncodeAttnTable(v, seqs, shape.PageSize)
			}
			pages := rng.Perm(pagesLen)
			for range 2 {
				for _, p := range pages {
					v = append(v, int32(p))
				}
				slices.Reverse(pages) // a different table per sequence
			}
			return append(v, mask...)
		}
		var g kernels.Graph
		for step, prefixes := range [][2]int{{maxKeys / 2, maxKeys / 3}, {maxKeys - 1, maxKeys - 3}, {5, 0}} {
			seqs := seqsOn(be, meta, prefixes)
			host := hostMeta(be, seqs)
			must(t, be.UploadI32(meta, 0, host))
			if g == nil {
				be.AttentionTable(out, qv, kc, vc, shape, seqs, meta, maxKeys) // sizes the scratch
				var err error
				g, err = be.Capture(func() error { be.AttentionTable(out, qv, kc, vc, shape, seqs, meta, maxKeys); return nil })
				must(t, err)
				defer g.Close()
			}
			be.AttentionTable(out, qv, kc, vc, shape, seqs, meta, maxKeys)
			eager := download(t, be, out)
			be.Fill(out, float32(math.NaN()))
			must(t, g.Replay())
			if got := download(t, be, out); !slices.Equal(got, eager) {
				t.Errorf("maxKeys %d step %d: the replay differs from the eager call: %g", maxKeys, step, relNorm(got, eager))
			}
			cmeta := mustAlloc(t, cpuB, kernels.I32, len(host))
			must(t, cpuB.UploadI32(cmeta, 0, host))
			cpuB.Attention(cout, cq, ck, cv, shape, seqsOn(cpuB, cmeta, prefixes))
			if d := relNorm(eager, download(t, cpuB, cout)); !(d < 1e-5) {
				t.Errorf("maxKeys %d step %d: ‖emulated−cpu‖/‖cpu‖ = %.2g", maxKeys, step, d)
			}
		}
		_, tileQ, _ := attnKernel(cache)
		blocks := attnTiles([]kernels.AttnSeq{{QueryLen: 1}, {QueryLen: 3}}, shape.NumHeads/shape.NumKVHeads, tileQ) * shape.NumKVHeads
		if maxKeys == 1024 && be.attnSplits(maxKeys, blocks) < 2 {
			t.Errorf("%d keys over %d SMs do not split: the split path went untested", maxKeys, be.sms)
		}
	}
}

// TestEmulatedTopKLSE checks TopKLSE against a float64 host reference: the
// k best of each row's first n values (exactly; ties to the lower index),
// their indices, and the log-sum-exp, on rows ld apart.
func TestEmulatedTopKLSE(t *testing.T) {
	be := emulated(t)
	const rows, n, ld, k = 3, 1000, 1003, 20
	rng := rand.New(rand.NewPCG(25, 26))
	x := make([]float32, rows*ld)
	for i := range x {
		x[i] = float32(rng.IntN(400)) / 16 // many ties
	}
	x[1*ld+n] = 1000 // beyond n: never chosen
	xb := mustAlloc(t, be, kernels.F32, len(x))
	must(t, be.UploadF32(xb, 0, x))
	out := mustAlloc(t, be, kernels.F32, rows*(2*k+1))
	be.TopKLSE(out, xb, rows, n, ld, k)
	got := download(t, be, out)
	for r := range rows {
		row := x[r*ld : r*ld+n]
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { // descending, ties keep the lower index first
			switch {
			case row[a] > row[b]:
				return -1
			case row[a] < row[b]:
				return 1
			}
			return 0
		})
		o := got[r*(2*k+1):]
		for j := range k {
			if o[j] != row[order[j]] || o[k+j] != float32(order[j]) {
				t.Fatalf("row %d rank %d: got %g at %g, want %g at %d", r, j, o[j], o[k+j], row[order[j]], order[j])
			}
		}
		top := float64(row[order[0]])
		sum := 0.0
		for _, v := range row {
			sum += math.Exp(float64(v) - top)
		}
		if lse := top + math.Log(sum); math.Abs(float64(o[2*k])-lse) > 1e-6*math.Abs(lse)+1e-6 {
			t.Errorf("row %d: log-sum-exp %g, want %g", r, o[2*k], lse)
		}
	}
}

func download(t *testing.T, b kernels.Backend, buf kernels.Buffer) []float32 {
	t.Helper()
	v := make([]float32, buf.Len())
	must(t, b.DownloadF32(buf, 0, v))
	return v
}
