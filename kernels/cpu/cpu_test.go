package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"

	"ddflash/internal/half"
	"ddflash/internal/testrand"
	"ddflash/kernels"
	"ddflash/kernels/kerneltest"
)

// TestConformance runs the suite serially and on three workers that split
// every op however small, with the portable kernels, and with the SIMD ones
// when this build and CPU have them.
func TestConformance(t *testing.T) {
	variants := kernelVariants()
	if len(variants) == 1 {
		t.Log("no SIMD kernels in this build or on this CPU: testing the portable ones only")
	}
	for _, kern := range variants {
		for _, threads := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/threads=%d", kern.name, threads), func(t *testing.T) {
				kerneltest.Run(t, func() kernels.Backend { return newBackend(threads, kern, 1) })
			})
		}
	}
}

// kernelVariants are the kernel sets this build and CPU can run.
func kernelVariants() []kernelSet {
	return append([]kernelSet{portableKernels}, simdKernels()...)
}

// TestMatMulBatchInvariant checks that each row of a multi-row MatMul
// equals the same row computed alone, bit for bit, with every kernel set:
// a speculative verify block then reproduces plain decoding exactly. The
// row counts cross the kernels' pairs of x rows, and n and k include
// partial tiles and vector tails; with k = 4112, m = 123 spans two of
// MatMul's blocks of x rows (matmulXBlock).
func TestMatMulBatchInvariant(t *testing.T) {
	rng := testrand.Seeded(t, 3)
	for _, nk := range [][2]int{{12, 53}, {13, 64}, {7, 16}, {36, 48}, {20, 192}, {12, 4112}} {
		n, k := nk[0], nk[1]
		raw := make([]byte, 0, 4*n*k)
		for range n * k {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(float32(rng.NormFloat64())))
		}
		for _, m := range []int{2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 123} {
			xs := make([]float32, m*k)
			for i := range xs {
				xs[i] = float32(rng.NormFloat64())
			}
			for _, kern := range kernelVariants() {
				be := newBackend(2, kern, 1)
				for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
					w, _ := be.Alloc(dt, n*k)
					if err := be.Upload(w, 0, weightBytes(raw, dt)); err != nil {
						t.Fatal(err)
					}
					x, _ := be.Alloc(kernels.F32, m*k)
					if err := be.UploadF32(x, 0, xs); err != nil {
						t.Fatal(err)
					}
					all, one := make([]float32, m*n), make([]float32, n)
					out, _ := be.Alloc(kernels.F32, m*n)
					be.MatMul(out, x, w, m, n, k)
					if err := be.DownloadF32(out, 0, all); err != nil {
						t.Fatal(err)
					}
					for i := range m {
						be.MatMul(out, be.Slice(x, i*k, k), w, 1, n, k)
						if err := be.DownloadF32(out, 0, one); err != nil {
							t.Fatal(err)
						}
						for j := range n {
							if one[j] != all[i*n+j] {
								t.Errorf("%s %v n=%d k=%d: row %d col %d alone = %g, in a batch of %d = %g", kern.name, dt, n, k, i, j, one[j], m, all[i*n+j])
							}
						}
					}
				}
			}
		}
	}
}

// weightBytes converts little-endian float32s to dt: BF16 keeps the top
// half of each, F16 rounds (small normal values are exact enough here).
func weightBytes(raw []byte, dt kernels.DType) []byte {
	if dt == kernels.F32 {
		return raw
	}
	out := make([]byte, 0, len(raw)/2)
	for i := 0; i < len(raw); i += 4 {
		bits := binary.LittleEndian.Uint32(raw[i:])
		h := uint16(bits >> 16)
		if dt == kernels.F16 {
			h = half.Float32ToF16(math.Float32frombits(bits))
		}
		out = binary.LittleEndian.AppendUint16(out, h)
	}
	return out
}

// TestAttentionBatchInvariant checks that each query row of a block (causal
// or tree-masked, longer than one work item, after a prefix longer than one
// block of keys) equals, bit for bit, the same row computed alone over the
// keys it sees (at other positions: the row alone reads them contiguously),
// with every kernel set and cache dtype.
func TestAttentionBatchInvariant(t *testing.T) {
	rng := testrand.Seeded(t, 4)
	for _, hd := range []int{144, 48, 10} { // 144: one 128-lane panel of mixRows and a tail
		// 8 query heads per KV head: a block's 32 rows keep only their first
		// block of scores between the passes and score the second twice,
		// where a row alone keeps both.
		shape := kernels.AttnShape{NumHeads: 16, NumKVHeads: 2, HeadDim: hd, PageSize: 1, Scale: 0.3}
		qDim, kvDim := shape.NumHeads*hd, shape.NumKVHeads*hd
		const prefix, rows = attnBlockKeys + 23, attnBlockRows + 5
		total := prefix + rows
		normal := func(n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			return v
		}
		keys, values, qs := normal(total*kvDim), normal(total*kvDim), normal(rows*qDim)
		parents := make([]int32, rows) // a random tree over the block
		for i := range parents {
			parents[i] = int32(rng.IntN(i+1)) - 1
		}
		mask := make([]int32, rows*rows)
		for i := range rows {
			for j := i; j >= 0; j = int(parents[j]) {
				mask[i*rows+j] = 1
			}
		}
		identity := make([]int32, total)
		for p := range identity {
			identity[p] = int32(p)
		}
		for _, kern := range kernelVariants() {
			for _, cacheType := range []kernels.DType{kernels.F32, kernels.BF16} {
				be := newBackend(2, kern, 1)
				kc, _ := be.Alloc(cacheType, total*kvDim)
				vc, _ := be.Alloc(cacheType, total*kvDim)
				be.WriteKV(kc, vc, upload(t, be, keys), upload(t, be, values), uploadI32(t, be, identity), total, kvDim)
				for _, m := range [][]int32{nil, mask} {
					seq := kernels.AttnSeq{QueryLen: rows, Prefix: prefix, Pages: uploadI32(t, be, identity)}
					if m != nil {
						seq.Mask = uploadI32(t, be, m)
					}
					out, _ := be.Alloc(kernels.F32, rows*qDim)
					be.Attention(out, upload(t, be, qs), kc, vc, shape, []kernels.AttnSeq{seq})
					all := make([]float32, rows*qDim)
					if err := be.DownloadF32(out, 0, all); err != nil {
						t.Fatal(err)
					}
					for i := range rows {
						var seen []int32 // the slots row i sees, in order; its own last
						for p := range total {
							if j := p - prefix; j < 0 || m == nil && j <= i || m != nil && m[i*rows+j] != 0 {
								seen = append(seen, int32(p))
							}
						}
						alone := kernels.AttnSeq{QueryLen: 1, Prefix: len(seen) - 1, Pages: uploadI32(t, be, seen)}
						one, _ := be.Alloc(kernels.F32, qDim)
						be.Attention(one, upload(t, be, qs[i*qDim:(i+1)*qDim]), kc, vc, shape, []kernels.AttnSeq{alone})
						got := make([]float32, qDim)
						if err := be.DownloadF32(one, 0, got); err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(got, all[i*qDim:(i+1)*qDim]) {
							t.Errorf("%s %v cache hd %d tree %v: row %d alone differs from the block of %d", kern.name, cacheType, hd, m != nil, i, rows)
						}
					}
				}
			}
		}
	}
}

func upload(t *testing.T, be kernels.Backend, v []float32) kernels.Buffer {
	b, _ := be.Alloc(kernels.F32, len(v))
	if err := be.UploadF32(b, 0, v); err != nil {
		t.Fatal(err)
	}
	return b
}

func uploadI32(t *testing.T, be kernels.Backend, v []int32) kernels.Buffer {
	b, _ := be.Alloc(kernels.I32, len(v))
	if err := be.UploadI32(b, 0, v); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAttentionScratchBounded checks that a work item's scratch does not
// grow with the context: the same item over 600 and 6,000 keys (BF16 cache,
// several blocks) leaves scratch of the same size.
func TestAttentionScratchBounded(t *testing.T) {
	shape := kernels.AttnShape{NumHeads: 4, NumKVHeads: 1, HeadDim: 64, PageSize: 16, Scale: 0.125}
	kvDim := shape.HeadDim
	var sizes []int
	for _, keys := range []int{600, 6000} {
		be := newBackend(1, portableKernels, 1)
		kc, _ := be.Alloc(kernels.BF16, keys*kvDim)
		vc, _ := be.Alloc(kernels.BF16, keys*kvDim)
		k, v := cacheRows("test", kc, vc, kvDim)
		pages := make([]int32, (keys+shape.PageSize-1)/shape.PageSize)
		for i := range pages {
			pages[i] = int32(i)
		}
		rows := attnBlockRows
		q := make([]float32, rows*shape.NumHeads*shape.HeadDim)
		out := make([]float32, len(q))
		sq := &kernels.AttnSeq{QueryLen: rows, Prefix: keys - rows}
		sc := new(attnScratch)
		portableKernels.attendBlock(sc, out, q, k, v, shape, sq, pages, nil, attnItem{rows: rows})
		sizes = append(sizes, 4*(cap(sc.k)+cap(sc.v)+cap(sc.q)+cap(sc.scores)+cap(sc.top)+cap(sc.sums)+cap(sc.acc))+
			cap(sc.sees)+cap(sc.partVisible)+8*cap(sc.keys))
	}
	if sizes[0] != sizes[1] || sizes[1] > 1<<20 {
		t.Errorf("attention scratch of %d bytes at 600 keys and %d at 6,000: want equal and under 1 MiB", sizes[0], sizes[1])
	}
}

// TestDecodeKernelsReuseTemporaries checks that a decode step's Gated
// DeltaNet kernels (one row, BF16 states) allocate less per call than one
// copy of the state they widen: their working copies (the conv state, its
// transposed weights, rounded inputs and next state, a head's recurrent
// state) come from the backend's temporaries, not the collector.
func TestDecodeKernelsReuseTemporaries(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled temporaries at random: allocation counts mean nothing under -race")
	}
	be := newBackend(1, portableKernels, defaultMinWork)
	zeros := func(n int) kernels.Buffer { return upload(t, be, make([]float32, n)) }
	bf16 := func(n int) kernels.Buffer { b, _ := be.Alloc(kernels.BF16, n); return b }
	const channels, K = 1024, 4
	x, w, out, convStateBuf := zeros(channels), zeros(channels*K), zeros(channels), bf16((K-1)*channels)
	shape := kernels.GDNShape{KeyHeads: 1, ValueHeads: 1, KeyDim: 64, ValueDim: 64}
	q, k, v, g, beta, o := zeros(64), zeros(64), zeros(64), zeros(1), zeros(1), zeros(64)
	state := bf16(shape.StateLen())
	for _, c := range []struct {
		name       string
		step       func()
		stateBytes int
	}{
		{"conv and commit", func() {
			be.CausalConv(out, x, convStateBuf, w, nil, 1, channels, K)
			be.ConvCommit(convStateBuf, x, nil, 0, channels, K)
		}, (K - 1) * channels * 4},
		{"recurrence", func() {
			be.GDNRecurrence(o, q, k, v, g, beta, state, state, nil, nil, 1, shape)
		}, shape.StateLen() * 4},
	} {
		c.step() // the temporaries' first allocation
		const steps = 200
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range steps {
			c.step()
		}
		runtime.ReadMemStats(&after)
		if perStep := (after.TotalAlloc - before.TotalAlloc) / steps; perStep >= uint64(c.stateBytes) {
			t.Errorf("%s of one row: %d bytes allocated, want less than the widened state's %d", c.name, perStep, c.stateBytes)
		}
	}
}
