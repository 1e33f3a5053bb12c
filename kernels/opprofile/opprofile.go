// Package opprofile times every op a model issues: Backend wraps another
// kernels.Backend and, while it is on, sums each op's wall time and the
// bytes it moves, keyed by the op and its shape (each projection of a
// layer is its own row). On a backend that runs ops synchronously (the CPU
// backend) an op's wall time is its cost; on a queueing one it is the
// time to issue it.
package opprofile

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"ddflash/kernels"
)

// Op is one row of a profile.
type Op struct {
	Key   string // the op and its shape
	Calls int
	Time  time.Duration
	Bytes int64 // read and written, counted as in the op's method below
}

// Backend is a profiling wrapper; every method not timed here is passed through.
type Backend struct {
	kernels.Backend
	on  bool
	ops map[opKey]*Op
}

// opKey names a row without formatting a string per call: the op, and for
// the shaped ones a dtype and two dimensions.
type opKey struct {
	name, dt string
	a, b     int
}

func (k opKey) String() string {
	switch {
	case k.dt != "":
		return fmt.Sprintf("%s %s %d→%d", k.name, k.dt, k.a, k.b)
	case k.a != 0:
		return fmt.Sprintf("%s dim %d", k.name, k.a)
	}
	return k.name
}

// New wraps b; profiling starts with Start.
func New(b kernels.Backend) *Backend { return &Backend{Backend: b, ops: map[opKey]*Op{}} }

// Start clears the profile and starts timing.
func (p *Backend) Start() { p.ops, p.on = map[opKey]*Op{}, true }

// Stop stops timing (the profile stays until the next Start).
func (p *Backend) Stop() { p.on = false }

// Ops returns the profile, the most time first.
func (p *Backend) Ops() []Op {
	var ops []Op
	for _, o := range p.ops {
		ops = append(ops, *o)
	}
	slices.SortFunc(ops, func(a, b Op) int {
		if a.Time != b.Time {
			return int(b.Time - a.Time)
		}
		return strings.Compare(a.Key, b.Key)
	})
	return ops
}

// Total sums the profile's time and bytes.
func Total(ops []Op) (time.Duration, int64) {
	var t time.Duration
	var b int64
	for _, o := range ops {
		t, b = t+o.Time, b+o.Bytes
	}
	return t, b
}

// Write prints ops as a Markdown table, per step (divided by steps), with
// each op's share of step (the whole step's wall time) and its GB/s.
func Write(w io.Writer, ops []Op, steps int, step time.Duration) {
	fmt.Fprintln(w, "| op | calls / step | µs / step | share of step | MB / step | GB/s |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(steps) }
	for _, o := range ops {
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.1f %% | %.2f | %.1f |\n", o.Key, float64(o.Calls)/float64(steps),
			per(o.Time), 100*float64(o.Time)/float64(step), float64(o.Bytes)/1e6/float64(steps), gbps(o.Bytes, o.Time))
	}
}

func gbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}

// begin returns the start time when profiling is on.
func (p *Backend) begin() time.Time {
	if !p.on {
		return time.Time{}
	}
	return time.Now()
}

// end adds one call of key since t0, moving bytes.
func (p *Backend) end(t0 time.Time, bytes int64, key opKey) {
	if t0.IsZero() {
		return
	}
	d := time.Since(t0)
	o := p.ops[key]
	if o == nil {
		o = &Op{Key: key.String()}
		p.ops[key] = o
	}
	o.Calls++
	o.Time += d
	o.Bytes += bytes
}

// size is the bytes of n elements of b.
func size(b kernels.Buffer, n int) int64 {
	if w, ok := b.(*kernels.BlockScaled); ok {
		return size(w.Q, n) + size(w.Scale, w.Scale.Len())
	}
	return int64(n) * int64(b.DType().Size())
}

func (p *Backend) Upload(b kernels.Buffer, off int, src []byte) error {
	t0 := p.begin()
	defer p.end(t0, int64(len(src)), opKey{name: "Upload"})
	return p.Backend.Upload(b, off, src)
}

func (p *Backend) UploadF32(b kernels.Buffer, off int, src []float32) error {
	t0 := p.begin()
	defer p.end(t0, 4*int64(len(src)), opKey{name: "Upload"})
	return p.Backend.UploadF32(b, off, src)
}

func (p *Backend) UploadI32(b kernels.Buffer, off int, src []int32) error {
	t0 := p.begin()
	defer p.end(t0, 4*int64(len(src)), opKey{name: "Upload"})
	return p.Backend.UploadI32(b, off, src)
}

func (p *Backend) DownloadF32(b kernels.Buffer, off int, dst []float32) error {
	t0 := p.begin()
	defer p.end(t0, 4*int64(len(dst)), opKey{name: "Download"})
	return p.Backend.DownloadF32(b, off, dst)
}

func (p *Backend) Copy(dst, src kernels.Buffer, rows, cols, dstStride, srcStride int) {
	t0 := p.begin()
	p.Backend.Copy(dst, src, rows, cols, dstStride, srcStride)
	p.end(t0, 2*size(src, rows*cols), opKey{name: "Copy"})
}

func (p *Backend) Fill(dst kernels.Buffer, v float32) {
	t0 := p.begin()
	p.Backend.Fill(dst, v)
	p.end(t0, size(dst, dst.Len()), opKey{name: "Fill"})
}

func (p *Backend) Embedding(out, table, ids kernels.Buffer, n, dim int) {
	t0 := p.begin()
	p.Backend.Embedding(out, table, ids, n, dim)
	p.end(t0, size(table, n*dim)+4*int64(n*dim), opKey{name: "Embedding", a: dim})
}

// MatMul counts the weights, x and out.
func (p *Backend) MatMul(out, x, w kernels.Buffer, m, n, k int) {
	t0 := p.begin()
	p.Backend.MatMul(out, x, w, m, n, k)
	dt := "FP8"
	if _, ok := w.(*kernels.BlockScaled); !ok {
		dt = w.DType().String()
	}
	p.end(t0, size(w, n*k)+4*int64(m*k+m*n), opKey{"MatMul", dt, k, n})
}

// MatMulParts counts every part's weights and output, and x once.
func (p *Backend) MatMulParts(x kernels.Buffer, m, k int, parts []kernels.MatMulPart) {
	t0 := p.begin()
	p.Backend.MatMulParts(x, m, k, parts)
	bytes, n := 4*int64(m*k), 0
	for _, pt := range parts {
		bytes += size(pt.W, pt.N*k) + 4*int64(m*pt.N)
		n += pt.N
	}
	p.end(t0, bytes, opKey{name: "MatMulParts", a: k, b: n})
}

// MatMulGLU counts both weights, x and out.
func (p *Backend) MatMulGLU(out, up, x, gate, upW kernels.Buffer, m, n, k int) {
	t0 := p.begin()
	p.Backend.MatMulGLU(out, up, x, gate, upW, m, n, k)
	p.end(t0, size(gate, n*k)+size(upW, n*k)+4*int64(m*k+m*n), opKey{name: "MatMulGLU", a: k, b: n})
}

func (p *Backend) Add(out, a, b kernels.Buffer, n int) {
	t0 := p.begin()
	p.Backend.Add(out, a, b, n)
	p.end(t0, 12*int64(n), opKey{name: "Add"})
}

func (p *Backend) AddRMSNorm(x, delta, out, w kernels.Buffer, rows, dim int, eps float32, unitOffset bool) {
	t0 := p.begin()
	p.Backend.AddRMSNorm(x, delta, out, w, rows, dim, eps, unitOffset)
	p.end(t0, 16*int64(rows*dim)+size(w, dim), opKey{name: "AddRMSNorm", a: dim})
}

func (p *Backend) RMSNorm(out, x, w kernels.Buffer, rows, dim int, eps float32, unitOffset bool) {
	t0 := p.begin()
	p.Backend.RMSNorm(out, x, w, rows, dim, eps, unitOffset)
	p.end(t0, 8*int64(rows*dim)+size(w, dim), opKey{name: "RMSNorm", a: dim})
}

func (p *Backend) GatedRMSNorm(out, x, z, w kernels.Buffer, rows, dim int, eps float32) {
	t0 := p.begin()
	p.Backend.GatedRMSNorm(out, x, z, w, rows, dim, eps)
	p.end(t0, 12*int64(rows*dim)+size(w, dim), opKey{name: "GatedRMSNorm"})
}

func (p *Backend) L2Norm(x kernels.Buffer, rows, dim int, eps, scale float32) {
	t0 := p.begin()
	p.Backend.L2Norm(x, rows, dim, eps, scale)
	p.end(t0, 8*int64(rows*dim), opKey{name: "L2Norm"})
}

func (p *Backend) RoPE(x, positions, invFreq kernels.Buffer, rows, heads, headDim, rotDim int, scale float32) {
	t0 := p.begin()
	p.Backend.RoPE(x, positions, invFreq, rows, heads, headDim, rotDim, scale)
	p.end(t0, 8*int64(rows*heads*rotDim), opKey{name: "RoPE"})
}

func (p *Backend) SwiGLU(out, gate, up kernels.Buffer, n int) {
	t0 := p.begin()
	p.Backend.SwiGLU(out, gate, up, n)
	p.end(t0, 12*int64(n), opKey{name: "SwiGLU"})
}

func (p *Backend) MulSigmoid(x, gate kernels.Buffer, n int) {
	t0 := p.begin()
	p.Backend.MulSigmoid(x, gate, n)
	p.end(t0, 12*int64(n), opKey{name: "MulSigmoid"})
}

func (p *Backend) GroupedConv(out, x, base, delta kernels.Buffer, rows, dim, taps, groupSize, deltaStride int) {
	t0 := p.begin()
	p.Backend.GroupedConv(out, x, base, delta, rows, dim, taps, groupSize, deltaStride)
	p.end(t0, 4*int64(rows*dim*(2+taps)+taps*dim+rows*taps*(dim/groupSize)), opKey{name: "GroupedConv"})
}

// GDNConvInputs counts x, q, k, v, the gates and each sequence's state
// read and written.
func (p *Backend) GDNConvInputs(q, k, v, a, b, x, convW, aLog, dtBias kernels.Buffer, seqs []kernels.GDNConvSeq, K int, s kernels.GDNShape, eps, qScale float32) {
	t0 := p.begin()
	p.Backend.GDNConvInputs(q, k, v, a, b, x, convW, aLog, dtBias, seqs, K, s, eps, qScale)
	width := 2*s.KeyHeads*s.KeyDim + s.ValueHeads*s.ValueDim
	bytes := size(convW, width*K)
	for _, sq := range seqs {
		bytes += 8*int64(sq.Rows*width) + 16*int64(sq.Rows*s.ValueHeads) + 2*size(sq.State, (K-1)*width)
	}
	p.end(t0, bytes, opKey{name: "GDNConvInputs"})
}

func (p *Backend) AttnInputs(q, qg, gate, k, v, qNorm, kNorm, positions, invFreq, kCache, vCache, slots kernels.Buffer, rows int, s kernels.AttnInputShape) {
	t0 := p.begin()
	p.Backend.AttnInputs(q, qg, gate, k, v, qNorm, kNorm, positions, invFreq, kCache, vCache, slots, rows, s)
	kvDim := s.KVHeads * s.HeadDim
	bytes := 8*int64(rows*(s.Heads*s.HeadDim+kvDim)) + 4*int64(rows*kvDim) + 2*size(kCache, rows*kvDim)
	if qg != nil {
		bytes += 8 * int64(rows*s.Heads*s.HeadDim) // the gates read and written
	}
	p.end(t0, bytes, opKey{name: "AttnInputs"})
}

func (p *Backend) WriteKV(kCache, vCache, k, v, slots kernels.Buffer, n, kvDim int) {
	t0 := p.begin()
	p.Backend.WriteKV(kCache, vCache, k, v, slots, n, kvDim)
	p.end(t0, 8*int64(n*kvDim)+2*size(kCache, n*kvDim), opKey{name: "WriteKV"})
}

// Attention counts q, out and the cached keys and values each sequence sees.
func (p *Backend) Attention(out, q, kCache, vCache kernels.Buffer, shape kernels.AttnShape, seqs []kernels.AttnSeq) {
	t0 := p.begin()
	p.Backend.Attention(out, q, kCache, vCache, shape, seqs)
	var bytes int64
	kvDim := shape.NumKVHeads * shape.HeadDim
	for _, s := range seqs {
		bytes += 8*int64(s.QueryLen*shape.NumHeads*shape.HeadDim) + 2*size(kCache, (s.Prefix+s.QueryLen)*kvDim)
	}
	p.end(t0, bytes, opKey{name: "Attention"})
}

func (p *Backend) MoveKV(kCache, vCache, dst, src kernels.Buffer, n, kvDim int) {
	t0 := p.begin()
	p.Backend.MoveKV(kCache, vCache, dst, src, n, kvDim)
	p.end(t0, 4*size(kCache, n*kvDim), opKey{name: "MoveKV"})
}

func (p *Backend) CausalConv(out, x, state, w, parents kernels.Buffer, T, channels, K int) {
	t0 := p.begin()
	p.Backend.CausalConv(out, x, state, w, parents, T, channels, K)
	p.end(t0, 8*int64(T*channels)+size(state, (K-1)*channels)+size(w, channels*K), opKey{name: "CausalConv"})
}

func (p *Backend) ConvCommit(state, x, parents kernels.Buffer, node, channels, K int) {
	t0 := p.begin()
	p.Backend.ConvCommit(state, x, parents, node, channels, K)
	p.end(t0, 2*size(state, (K-1)*channels), opKey{name: "ConvCommit"})
}

func (p *Backend) GDNGates(a, b, aLog, dtBias kernels.Buffer, T, heads int) {
	t0 := p.begin()
	p.Backend.GDNGates(a, b, aLog, dtBias, T, heads)
	p.end(t0, 16*int64(T*heads), opKey{name: "GDNGates"})
}

// GDNRecurrence counts q, k, v, out and the state read and written per token.
func (p *Backend) GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, parents kernels.Buffer, T int, shape kernels.GDNShape) {
	t0 := p.begin()
	p.Backend.GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, parents, T, shape)
	qk, vo := shape.KeyHeads*shape.KeyDim, shape.ValueHeads*shape.ValueDim
	p.end(t0, 4*int64(T*(2*qk+2*vo))+2*int64(T)*size(state, shape.StateLen()), opKey{name: "GDNRecurrence"})
}

// GDNRecurrences counts what GDNRecurrence does, per sequence.
func (p *Backend) GDNRecurrences(out, q, k, v, g, beta kernels.Buffer, seqs []kernels.GDNSeq, shape kernels.GDNShape) {
	t0 := p.begin()
	p.Backend.GDNRecurrences(out, q, k, v, g, beta, seqs, shape)
	qk, vo := shape.KeyHeads*shape.KeyDim, shape.ValueHeads*shape.ValueDim
	var bytes int64
	for _, sq := range seqs {
		bytes += 4*int64(sq.Rows*(2*qk+2*vo)) + 2*int64(sq.Rows)*size(sq.State, shape.StateLen())
	}
	p.end(t0, bytes, opKey{name: "GDNRecurrences"})
}

func (p *Backend) GDNChunked(out, q, k, v, g, beta, state, stateOut kernels.Buffer, T, chunk int, shape kernels.GDNShape) {
	t0 := p.begin()
	p.Backend.GDNChunked(out, q, k, v, g, beta, state, stateOut, T, chunk, shape)
	qk, vo := shape.KeyHeads*shape.KeyDim, shape.ValueHeads*shape.ValueDim
	p.end(t0, 4*int64(T*(2*qk+2*vo))+2*size(state, shape.StateLen()), opKey{name: "GDNChunked"})
}

func (p *Backend) LogSoftmax(x kernels.Buffer, rows, n int) {
	t0 := p.begin()
	p.Backend.LogSoftmax(x, rows, n)
	p.end(t0, 8*int64(rows*n), opKey{name: "LogSoftmax"})
}

func (p *Backend) TopK(vals, idx, x kernels.Buffer, rows, n, k int) {
	t0 := p.begin()
	p.Backend.TopK(vals, idx, x, rows, n, k)
	p.end(t0, 4*int64(rows*n), opKey{name: "TopK"})
}
