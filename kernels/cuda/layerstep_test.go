package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"ddflash/internal/half"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// The step-time benchmark (steptime_test.go, build tag cuda) runs one
// full-attention layer and one Gated DeltaNet layer, each with its MLP, as
// the engine does for a decode step (1 row) or a tree verify (rows > 1),
// through the kernels.Backend interface. This file holds that step; its
// test runs it on the CPU backend at toy sizes so CI checks the op sequence.

// layerShape is the part of a Qwen3.6 config one step needs.
type layerShape struct {
	hidden, inter                   int
	heads, kvHeads, headDim, rotDim int
	gdn                             kernels.GDNShape
	convK, pageSize                 int
}

// qwen36 is Qwen3.6-27B (docs/qwen36-model.md §1).
var qwen36 = layerShape{
	hidden: 5120, inter: 17408, heads: 24, kvHeads: 4, headDim: 256, rotDim: 64,
	gdn: kernels.GDNShape{KeyHeads: 16, ValueHeads: 48, KeyDim: 128, ValueDim: 128}, convK: 4, pageSize: 16,
}

func (s layerShape) kvDim() int   { return s.kvHeads * s.headDim }
func (s layerShape) qkDim() int   { return s.gdn.KeyHeads * s.gdn.KeyDim }
func (s layerShape) vDim() int    { return s.gdn.ValueHeads * s.gdn.ValueDim }
func (s layerShape) convDim() int { return 2*s.qkDim() + s.vDim() }

// layerWeights are random bf16 weights of one attention layer, one GDN
// layer and their two MLPs.
type layerWeights struct {
	q, k, v, o, qNorm, kNorm                kernels.Buffer
	qkv, z, b, a, conv, aLog, dtBias, gNorm kernels.Buffer
	out, inNorm, postNorm, invFreq          kernels.Buffer
	mlp                                     [2][3]kernels.Buffer // gate, up, down
	bytes                                   int64                // of the weights a step reads
	bufs                                    []kernels.Buffer
}

func (w *layerWeights) free(be kernels.Backend) {
	for _, b := range w.bufs {
		be.Free(b)
	}
}

type stepHarness struct {
	tb  testing.TB
	be  kernels.Backend
	rng *rand.Rand
}

// alloc returns a buffer of random values (normal·scale), rounded to dt.
func (h *stepHarness) alloc(dt kernels.DType, n int, scale float64, bufs *[]kernels.Buffer) kernels.Buffer {
	h.tb.Helper()
	b, err := h.be.Alloc(dt, n)
	if err != nil {
		h.tb.Fatal(err)
	}
	*bufs = append(*bufs, b)
	if scale == 0 {
		return b
	}
	// Upload a random block over and over: the values only need to be
	// realistic, not independent, and this keeps big layers fast to build.
	block := make([]byte, min(n, 1<<20)*dt.Size())
	for i := 0; i < len(block); i += dt.Size() {
		v := float32(h.rng.NormFloat64() * scale)
		switch dt {
		case kernels.BF16:
			binary.LittleEndian.PutUint16(block[i:], half.Float32ToBF16(v))
		case kernels.F8E4M3:
			block[i] = half.Float32ToE4M3(v)
		default:
			binary.LittleEndian.PutUint32(block[i:], math.Float32bits(v))
		}
	}
	for off := 0; off < n; off += len(block) / dt.Size() {
		if err := h.be.Upload(b, off, block[:min(len(block), (n-off)*dt.Size())]); err != nil {
			h.tb.Fatal(err)
		}
	}
	return b
}

// newLayerWeights makes the weights with the linear layers (every MatMul
// weight) in linear: BF16, or F8E4M3 block-scaled with random block scales.
// fp8 returns a random block-scaled FP8 weight [rows, cols]: values about
// 1.3·N(0,1) and block scales about N(0,1)/64, so weights near 0.02·N(0,1)
// as newLayerWeights' bf16 ones.
func (h *stepHarness) fp8(rows, cols int, bufs *[]kernels.Buffer) *kernels.BlockScaled {
	h.tb.Helper()
	br, bc := kernels.ScaleBlocks(rows, cols)
	w, err := kernels.NewBlockScaled(h.alloc(kernels.F8E4M3, rows*cols, 1.3, bufs), h.alloc(kernels.F32, br*bc, 1.0/64, bufs), rows, cols)
	if err != nil {
		h.tb.Fatal(err)
	}
	return w
}

func newLayerWeights(h *stepHarness, s layerShape, linear kernels.DType) *layerWeights {
	w := &layerWeights{}
	bf := func(rows, cols int) kernels.Buffer {
		w.bytes += int64(rows * cols * 2)
		return h.alloc(kernels.BF16, rows*cols, 0.02, &w.bufs)
	}
	lin := bf
	if linear == kernels.F8E4M3 {
		lin = func(rows, cols int) kernels.Buffer {
			br, bc := kernels.ScaleBlocks(rows, cols)
			w.bytes += int64(rows*cols + br*bc*4)
			return h.fp8(rows, cols, &w.bufs)
		}
	}
	qDim := s.heads * s.headDim
	w.q, w.k, w.v, w.o = lin(2*qDim, s.hidden), lin(s.kvDim(), s.hidden), lin(s.kvDim(), s.hidden), lin(s.hidden, qDim)
	w.qNorm, w.kNorm = bf(1, s.headDim), bf(1, s.headDim)
	w.qkv, w.z, w.b, w.a = lin(s.convDim(), s.hidden), lin(s.vDim(), s.hidden), lin(s.gdn.ValueHeads, s.hidden), lin(s.gdn.ValueHeads, s.hidden)
	w.conv, w.aLog, w.dtBias, w.gNorm = bf(s.convDim(), s.convK), bf(1, s.gdn.ValueHeads), bf(1, s.gdn.ValueHeads), bf(1, s.gdn.ValueDim)
	w.out, w.inNorm, w.postNorm = lin(s.hidden, s.vDim()), bf(1, s.hidden), bf(1, s.hidden)
	for i := range w.mlp {
		w.mlp[i] = [3]kernels.Buffer{lin(s.inter, s.hidden), lin(s.inter, s.hidden), lin(s.hidden, s.inter)}
	}
	freq := make([]float32, s.rotDim/2)
	for i := range freq {
		freq[i] = float32(math.Pow(1e7, -2*float64(i)/float64(s.rotDim)))
	}
	w.invFreq = h.alloc(kernels.F32, len(freq), 0, &w.bufs)
	if err := h.be.UploadF32(w.invFreq, 0, freq); err != nil {
		h.tb.Fatal(err)
	}
	return w
}

// layerStep is one step's caches, inputs and activations for rows new
// tokens after context cached ones; rows > 1 form a random tree.
type layerStep struct {
	be               kernels.Backend
	s                layerShape
	w                *layerWeights
	rows, context    int
	tree             bool
	kc, vc           kernels.Buffer // F32 KV cache
	convState, ssm   kernels.Buffer
	nodeStates       kernels.Buffer // tree only
	positions, slots kernels.Buffer
	pages, mask      kernels.Buffer // mask: tree only
	parents          kernels.Buffer // tree only
	x, h, qg, q, g   kernels.Buffer
	k, v, attn, o    kernels.Buffer
	mixed, conv      kernels.Buffer
	gq, gk, gv       kernels.Buffer
	z, beta, alpha   kernels.Buffer
	core, up, gate   kernels.Buffer
	bufs             []kernels.Buffer
}

func newLayerStep(h *stepHarness, w *layerWeights, s layerShape, rows, context int) *layerStep {
	l := &layerStep{be: h.be, s: s, w: w, rows: rows, context: context, tree: rows > 1}
	f32 := func(n int, scale float64) kernels.Buffer { return h.alloc(kernels.F32, n, scale, &l.bufs) }
	i32 := func(v []int32) kernels.Buffer {
		b := h.alloc(kernels.I32, len(v), 0, &l.bufs)
		if err := h.be.UploadI32(b, 0, v); err != nil {
			h.tb.Fatal(err)
		}
		return b
	}
	total := context + rows
	slots := (total + s.pageSize - 1) / s.pageSize * s.pageSize
	l.kc, l.vc = f32(slots*s.kvDim(), 1), f32(slots*s.kvDim(), 1)
	l.convState, l.ssm = f32((s.convK-1)*s.convDim(), 1), f32(s.gdn.StateLen(), 0.1)
	parents := make([]int32, rows)
	depth := make([]int32, rows)
	for t := range parents {
		parents[t] = int32(t - 1)
		if l.tree {
			parents[t] = int32(h.rng.IntN(t+1)) - 1
		}
		if p := parents[t]; p >= 0 {
			depth[t] = depth[p] + 1
		}
	}
	pos, sl := make([]int32, rows), make([]int32, rows)
	for t := range pos {
		pos[t], sl[t] = int32(context)+depth[t], int32(context+t)
	}
	pages := make([]int32, slots/s.pageSize)
	for i := range pages {
		pages[i] = int32(i)
	}
	l.positions, l.slots, l.pages = i32(pos), i32(sl), i32(pages)
	if l.tree {
		mask := make([]int32, rows*rows)
		for i := range rows {
			for j := int32(i); j >= 0; j = parents[j] {
				mask[i*rows+int(j)] = 1
			}
		}
		l.mask, l.parents = i32(mask), i32(parents)
		l.nodeStates = f32(rows*s.gdn.StateLen(), 0)
	}
	qDim := s.heads * s.headDim
	l.x, l.h, l.o = f32(rows*s.hidden, 1), f32(rows*s.hidden, 0), f32(rows*s.hidden, 0)
	l.qg, l.q, l.g, l.attn = f32(rows*2*qDim, 0), f32(rows*qDim, 0), f32(rows*qDim, 0), f32(rows*qDim, 0)
	l.k, l.v = f32(rows*s.kvDim(), 0), f32(rows*s.kvDim(), 0)
	l.mixed, l.conv = f32(rows*s.convDim(), 0), f32(rows*s.convDim(), 0)
	l.gq, l.gk, l.gv = f32(rows*s.qkDim(), 0), f32(rows*s.qkDim(), 0), f32(rows*s.vDim(), 0)
	l.z, l.core = f32(rows*s.vDim(), 0), f32(rows*s.vDim(), 0)
	l.beta, l.alpha = f32(rows*s.gdn.ValueHeads, 0), f32(rows*s.gdn.ValueHeads, 0)
	l.up, l.gate = f32(rows*s.inter, 0), f32(rows*s.inter, 0)
	return l
}

func (l *layerStep) free() {
	for _, b := range l.bufs {
		l.be.Free(b)
	}
}

// bytes is the least a step must move: the weights, the KV cache it reads,
// and the GDN state (chain: read and write it; tree: each node reads its
// parent's state and writes its own).
func (l *layerStep) bytes() int64 {
	kv := int64(l.context+l.rows) * int64(l.s.kvDim()) * 4 * 2
	state := int64(l.s.gdn.StateLen()) * 4 * 2
	if l.tree {
		state *= int64(l.rows)
	}
	return l.w.bytes + kv + state
}

// run issues the step's ops; it uploads nothing, so it can be captured.
func (l *layerStep) run() {
	be, s, w, R := l.be, l.s, l.w, l.rows
	const eps = 1e-6
	qDim, hd := s.heads*s.headDim, s.headDim
	// Full attention with the output gate.
	be.RMSNorm(l.h, l.x, w.inNorm, R, s.hidden, eps, true)
	be.MatMul(l.qg, l.h, w.q, R, 2*qDim, s.hidden)
	be.Copy(l.q, l.qg, R*s.heads, hd, hd, 2*hd)
	be.Copy(l.g, be.Slice(l.qg, hd, R*2*qDim-hd), R*s.heads, hd, hd, 2*hd)
	be.MatMul(l.k, l.h, w.k, R, s.kvDim(), s.hidden)
	be.MatMul(l.v, l.h, w.v, R, s.kvDim(), s.hidden)
	be.RMSNorm(l.q, l.q, w.qNorm, R*s.heads, hd, eps, true)
	be.RMSNorm(l.k, l.k, w.kNorm, R*s.kvHeads, hd, eps, true)
	be.RoPE(l.q, l.positions, w.invFreq, R, s.heads, hd, s.rotDim, 1)
	be.RoPE(l.k, l.positions, w.invFreq, R, s.kvHeads, hd, s.rotDim, 1)
	be.WriteKV(l.kc, l.vc, l.k, l.v, l.slots, R, s.kvDim())
	shape := kernels.AttnShape{NumHeads: s.heads, NumKVHeads: s.kvHeads, HeadDim: hd, PageSize: s.pageSize, Scale: float32(1 / math.Sqrt(float64(hd)))}
	be.Attention(l.attn, l.q, l.kc, l.vc, shape, []kernels.AttnSeq{{QueryLen: R, Prefix: l.context, Pages: l.pages, Mask: l.mask}})
	be.MulSigmoid(l.attn, l.g, R*qDim)
	be.MatMul(l.o, l.attn, w.o, R, s.hidden, qDim)
	be.Add(l.x, l.x, l.o, R*s.hidden)
	l.mlp(0)
	// Gated DeltaNet.
	be.RMSNorm(l.h, l.x, w.inNorm, R, s.hidden, eps, true)
	be.MatMul(l.mixed, l.h, w.qkv, R, s.convDim(), s.hidden)
	be.MatMul(l.z, l.h, w.z, R, s.vDim(), s.hidden)
	be.MatMul(l.beta, l.h, w.b, R, s.gdn.ValueHeads, s.hidden)
	be.MatMul(l.alpha, l.h, w.a, R, s.gdn.ValueHeads, s.hidden)
	be.CausalConv(l.conv, l.mixed, l.convState, w.conv, l.parents, R, s.convDim(), s.convK)
	be.Copy(l.gq, l.conv, R, s.qkDim(), s.qkDim(), s.convDim())
	be.Copy(l.gk, be.Slice(l.conv, s.qkDim(), R*s.convDim()-s.qkDim()), R, s.qkDim(), s.qkDim(), s.convDim())
	be.Copy(l.gv, be.Slice(l.conv, 2*s.qkDim(), R*s.convDim()-2*s.qkDim()), R, s.vDim(), s.vDim(), s.convDim())
	be.L2Norm(l.gq, R*s.gdn.KeyHeads, s.gdn.KeyDim, eps, float32(1/math.Sqrt(float64(s.gdn.KeyDim))))
	be.L2Norm(l.gk, R*s.gdn.KeyHeads, s.gdn.KeyDim, eps, 1)
	be.GDNGates(l.alpha, l.beta, w.aLog, w.dtBias, R, s.gdn.ValueHeads)
	be.GDNRecurrence(l.core, l.gq, l.gk, l.gv, l.alpha, l.beta, l.ssm, l.ssm, l.nodeStates, l.parents, R, s.gdn)
	be.GatedRMSNorm(l.core, l.core, l.z, w.gNorm, R*s.gdn.ValueHeads, s.gdn.ValueDim, eps)
	be.MatMul(l.o, l.core, w.out, R, s.hidden, s.vDim())
	be.Add(l.x, l.x, l.o, R*s.hidden)
	l.mlp(1)
}

func (l *layerStep) mlp(i int) {
	be, s, R, m := l.be, l.s, l.rows, l.w.mlp[i]
	be.RMSNorm(l.h, l.x, l.w.postNorm, R, s.hidden, 1e-6, true)
	be.MatMul(l.gate, l.h, m[0], R, s.inter, s.hidden)
	be.MatMul(l.up, l.h, m[1], R, s.inter, s.hidden)
	be.SwiGLU(l.gate, l.gate, l.up, R*s.inter)
	be.MatMul(l.o, l.gate, m[2], R, s.hidden, s.inter)
	be.Add(l.x, l.x, l.o, R*s.hidden)
}

// TestLayerStepOnCPU runs the benchmark's step at toy sizes on the CPU
// backend: every op gets consistent shapes, and the output stays finite.
func TestLayerStepOnCPU(t *testing.T) {
	s := layerShape{
		hidden: 64, inter: 96, heads: 4, kvHeads: 2, headDim: 16, rotDim: 8,
		gdn: kernels.GDNShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 8}, convK: 4, pageSize: 4,
	}
	h := &stepHarness{tb: t, be: cpu.New(2), rng: rand.New(rand.NewPCG(1, 2))}
	w := newLayerWeights(h, s, kernels.BF16)
	for _, rows := range []int{1, 9} {
		l := newLayerStep(h, w, s, rows, 13)
		l.run()
		out := make([]float32, rows*s.hidden)
		if err := h.be.DownloadF32(l.x, 0, out); err != nil {
			t.Fatal(err)
		}
		for i, v := range out {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("rows %d: x[%d] = %g", rows, i, v)
			}
		}
		if l.bytes() <= w.bytes {
			t.Errorf("rows %d: step bytes %d not above the weights' %d", rows, l.bytes(), w.bytes)
		}
		l.free()
	}
}
