// Package kernels defines the compute backend the model is written against.
//
// A Backend owns device memory and runs ops on it. Model code only holds
// Buffers (opaque handles) and small host-side integers; it never reads device
// memory except through Download. Ops are issued in order on one implicit
// stream per Backend; Sync waits for all of them. The CPU backend runs ops
// synchronously; a CUDA backend queues them.
//
// Shapes are row-major. Weights are [out, in] as stored in safetensors.
// Activations are F32 on every backend; KV caches, conv states and GDN
// recurrent states F32 or BF16; weights may be F32, BF16, F16 or FP8 block-scaled
// (BlockScaled, fp8.go). Index buffers (token ids, positions, page tables,
// tree parents) are I32.
package kernels

import "fmt"

// DType is an element type.
type DType uint8

const (
	F32 DType = iota
	BF16
	F16
	I32
	// F8E4M3 is float8 with 4 exponent and 3 mantissa bits (the "fn"
	// variant of FP8 checkpoints); MatMul reads it only as BlockScaled.Q.
	F8E4M3
)

// Size is the number of bytes of one element.
func (d DType) Size() int {
	switch d {
	case BF16, F16:
		return 2
	case F8E4M3:
		return 1
	default:
		return 4
	}
}

func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	case F16:
		return "F16"
	case I32:
		return "I32"
	case F8E4M3:
		return "F8E4M3"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Buffer is a handle to device memory: Len elements of DType. A Buffer made by
// Slice aliases its parent's memory.
type Buffer interface {
	DType() DType
	Len() int
}

// AttnSeq describes one sequence's query rows in an Attention call.
//
// The sequence's keys live in the paged KV cache: logical key position p is in
// physical slot Pages[p/PageSize]*PageSize + p%PageSize. The query rows are
// rows QueryStart..QueryStart+QueryLen-1 of q and out; they correspond to the
// logical key positions Prefix..Prefix+QueryLen-1 (their own K/V must already
// be written there). Query row i sees every key in [0, Prefix), and key
// Prefix+j of its own block when Mask is nil and j <= i (causal), or when
// Mask is set and Mask[i*QueryLen+j] != 0 (tree or block masks).
// Window > 0 additionally hides keys whose logical position p has
// (Prefix+i) - p >= Window (sliding-window attention), with or without a
// Mask. A query row that sees no key gets zeros.
type AttnSeq struct {
	QueryStart, QueryLen int
	Prefix               int
	Pages                Buffer // I32, at least ceil((Prefix+QueryLen)/PageSize) entries
	Mask                 Buffer // I32 [QueryLen*QueryLen] or nil for causal
	Window               int
}

// AttnShape is the head layout of an attention call.
type AttnShape struct {
	NumHeads   int     // query heads; query head h reads KV head h/(NumHeads/NumKVHeads)
	NumKVHeads int     // heads stored in the cache
	HeadDim    int     // for q, k and v
	PageSize   int     // tokens per KV page
	Scale      float32 // softmax scale, usually 1/sqrt(HeadDim)
}

// AttnInputShape is the layout of an AttnInputs call.
type AttnInputShape struct {
	Heads, KVHeads, HeadDim int
	RotDim                  int     // the rotated leading dims of each head (even, at most HeadDim)
	Eps                     float32 // the norms' epsilon
	RoPEScale               float32 // RoPE's cos/sin scale
}

// GDNShape is the head layout of a Gated DeltaNet layer.
type GDNShape struct {
	KeyHeads   int // q/k heads; value head j uses key head j/(ValueHeads/KeyHeads)
	ValueHeads int
	KeyDim     int
	ValueDim   int
}

// MatMulPart is one weight of a MatMulParts call: Out [m, N] (F32)
// receives x·Wᵀ for W [N, k].
type MatMulPart struct {
	W, Out Buffer
	N      int
}

// GDNConvSeq is one sequence of a GDNConvInputs call: the next Rows rows,
// their conv state [K-1, channels] (F32 or BF16) and tree parents (I32
// [Rows], nil for a chain); Commit sets the state to the window of the
// last row afterwards (ConvCommit). With SlotAt (one I32, read when the op
// runs) State holds states one after another and the sequence's is the
// one SlotAt names: a recorded step (Replayer) then serves any slot.
type GDNConvSeq struct {
	Rows                   int
	State, Parents, SlotAt Buffer
	Commit                 bool
}

// GDNSeq is one sequence of a GDNRecurrences call: its rows Start ..
// Start+Rows-1 of the operands, and the states and tree parents (I32
// [Rows] or nil) that GDNRecurrence takes. SlotAt names the sequence's
// slot of State as GDNConvSeq's does; StateOut is then the same slots'
// states, indexed alike, when it has State's length, else one state (a
// verify's discarded final state). NodeStates is never indexed.
type GDNSeq struct {
	Start, Rows                                  int
	State, StateOut, NodeStates, Parents, SlotAt Buffer
}

// StateLen is the number of F32 elements of one recurrent state: [ValueHeads, KeyDim, ValueDim].
func (s GDNShape) StateLen() int { return s.ValueHeads * s.KeyDim * s.ValueDim }

// Backend is a compute device. Every op panics only on programmer error
// (mismatched buffer sizes); data-dependent failures are returned as errors by
// Alloc and the transfer calls.
type Backend interface {
	Name() string

	// Alloc returns a zeroed buffer.
	Alloc(dt DType, n int) (Buffer, error)
	// Free releases a buffer made by Alloc. Slices of it become invalid.
	Free(b Buffer)
	// Slice returns a view of n elements of b starting at element off.
	Slice(b Buffer, off, n int) Buffer

	// Upload copies host bytes (in b's dtype, little-endian) into b at element off.
	Upload(b Buffer, off int, src []byte) error
	UploadF32(b Buffer, off int, src []float32) error
	UploadI32(b Buffer, off int, src []int32) error
	// DownloadF32 copies len(dst) F32 elements of b starting at off.
	DownloadF32(b Buffer, off int, dst []float32) error
	// Sync waits until all issued ops are done.
	Sync() error

	// Copy copies rows×cols elements: dst[r*dstStride+c] = src[r*srcStride+c].
	// Buffers of any one dtype; Slice them to start at an offset.
	Copy(dst, src Buffer, rows, cols, dstStride, srcStride int)
	// Fill sets every element of an F32 or BF16 buffer to v (rounded to
	// nearest even for BF16).
	Fill(dst Buffer, v float32)

	// Embedding gathers rows: out[i,:] = table[ids[i],:] for i < n, table [*, dim].
	Embedding(out, table, ids Buffer, n, dim int)
	// MatMul computes out[m,n] = x[m,k] · w[n,k]ᵀ. x and out are F32; w is any
	// float dtype or a *BlockScaled FP8 weight, widened as it is read.
	MatMul(out, x, w Buffer, m, n, k int)
	// MatMulParts computes MatMul(p.Out, x, p.W, m, p.N, k) for every
	// part, bit for bit, in one pass over x where the backend can (the
	// projections that share an input: q/k/v, a GDN layer's in_proj).
	MatMulParts(x Buffer, m, k int, parts []MatMulPart)
	// MatMulGLU computes out [m, n] = silu(x·gateᵀ)·(x·upWᵀ): what MatMul
	// into out and up and then SwiGLU(out, out, up) compute, bit for bit,
	// in one pass where the backend can. up [m, n] is scratch, its
	// contents afterwards undefined.
	MatMulGLU(out, up, x, gate, upW Buffer, m, n, k int)
	// Add computes out = a + b over n elements (out may alias a or b).
	Add(out, a, b Buffer, n int)

	// RMSNorm normalises each of rows rows of dim elements:
	// out = x·rsqrt(mean(x²)+eps)·(1+w) when unitOffset (Qwen's zero-centred
	// norm), else ·w. w has dim elements of any float dtype. out may alias x.
	RMSNorm(out, x, w Buffer, rows, dim int, eps float32, unitOffset bool)
	// AddRMSNorm adds delta into the residual stream x in place, then
	// writes RMSNorm(x) to out: what Add(x, x, delta) followed by
	// RMSNorm(out, x, ...) compute, bit for bit, in one pass.
	AddRMSNorm(x, delta, out, w Buffer, rows, dim int, eps float32, unitOffset bool)
	// GatedRMSNorm computes out = RMSNorm(x)·w·silu(z) per row of dim (plain w).
	GatedRMSNorm(out, x, z, w Buffer, rows, dim int, eps float32)
	// L2Norm scales each row of dim to unit length, x·rsqrt(Σx²+eps), then by scale. In place.
	L2Norm(x Buffer, rows, dim int, eps, scale float32)

	// RoPE rotates the first rotDim dims of each head in place, NeoX style:
	// for i < rotDim/2, with a = pos·invFreq[i], the pair (i, i+rotDim/2)
	// becomes (x_i·c − x_{i+h}·s, x_{i+h}·c + x_i·s) where c = scale·cos a and
	// s = scale·sin a. x is [rows, heads, headDim]; positions is I32 [rows];
	// invFreq is F32 [rotDim/2] (theta^(-2i/rotDim) for plain RoPE; scaled
	// variants such as YaRN change the frequencies and the scale).
	RoPE(x, positions, invFreq Buffer, rows, heads, headDim, rotDim int, scale float32)

	// SwiGLU computes out = silu(gate)·up over n elements.
	SwiGLU(out, gate, up Buffer, n int)
	// MulSigmoid computes x = x·sigmoid(gate) over n elements.
	MulSigmoid(x, gate Buffer, n int)

	// WriteKV stores n rows of k and v ([n, kvDim], F32) into the caches at
	// the physical slots given by the I32 buffer slots [n]. Caches are
	// [slots, kvDim], both F32 or both BF16 (stored rounded to nearest even).
	WriteKV(kCache, vCache, k, v, slots Buffer, n, kvDim int)

	// AttnInputs prepares a step's attention inputs in one pass: every
	// query head of q [rows, Heads, HeadDim] and KV head of k [rows,
	// KVHeads, HeadDim] is RMS-normalised with qNorm or kNorm (unit
	// offset) and rotated by RoPE at its row's position, in place; then k
	// and v are stored in the caches at slots. What RMSNorm, RoPE and
	// WriteKV compute, to F32 rounding. When qg is non-nil it holds
	// q_proj's output with the attention output gate, [rows, Heads,
	// 2·HeadDim], each head's query then its gate: the queries are read
	// from it (q is only written) and the gates copied to gate [rows,
	// Heads·HeadDim], as the two Copy calls that split them would.
	AttnInputs(q, qg, gate, k, v, qNorm, kNorm, positions, invFreq, kCache, vCache, slots Buffer, rows int, shape AttnInputShape)
	// Attention computes out [rows, NumHeads*HeadDim] from q [rows, NumHeads*HeadDim]
	// over the paged caches ([slots, NumKVHeads*HeadDim], F32 or BF16, read
	// widened to F32); softmax in F32.
	Attention(out, q, kCache, vCache Buffer, shape AttnShape, seqs []AttnSeq)
	// MoveKV copies cache rows: for i < n, slot dst[i] takes the contents of
	// slot src[i] (both I32 buffers), in both caches; all reads happen before writes.
	MoveKV(kCache, vCache, dst, src Buffer, n, kvDim int)

	// CausalConv runs a depthwise causal conv of kernel K over T rows of
	// x [T, channels], followed by SiLU: out[t,c] = silu(Σ_j w[c,j]·x_{t-K+1+j}[c]).
	// Row t's history is its ancestor chain: parents (I32 [T], parents[t] < t,
	// -1 = the committed state) or, when parents is nil, the rows before it.
	// Inputs before the chain's start come from state [K-1, channels], oldest
	// first, F32 or BF16 (widened). w is [channels, K] of any float dtype.
	// state is not modified.
	CausalConv(out, x, state, w, parents Buffer, T, channels, K int)
	// ConvCommit sets state to the last K-1 inputs of the chain ending at row
	// node of x (following parents, or the preceding rows when parents is nil),
	// filling from the old state where the chain is shorter than K-1,
	// rounding to nearest even when the state is BF16.
	// node = -1 leaves the state unchanged.
	ConvCommit(state, x, parents Buffer, node, channels, K int)

	// GroupedConv runs a depthwise convolution over a block of rows whose
	// taps have a static part per channel and a dynamic part per row and
	// channel group (DFlash2's, docs/dflash2.md): for i < rows, c < dim,
	//   out[i,c] = Σ_{t<taps} (base[t,c] + delta[i·deltaStride + t·G + c/groupSize]) · x[i−t, c]
	// with G = dim/groupSize and rows before the block's first contributing
	// zero. x, out [rows, dim], base [taps, dim] and delta are F32; out must
	// not alias x.
	GroupedConv(out, x, base, delta Buffer, rows, dim, taps, groupSize, deltaStride int)

	// GDNGates computes per row and value head g = -exp(aLog)·softplus(a+dtBias)
	// into a, and beta = sigmoid(b) into b, in place. a, b are [T, heads].
	GDNGates(a, b, aLog, dtBias Buffer, T, heads int)
	// GDNConvInputs prepares a GDN layer's recurrence inputs from its
	// in_proj outputs, every sequence of a step in one pass: the rows x [T,
	// 2·KeyHeads·KeyDim + ValueHeads·ValueDim] (T the sequences' rows, one
	// sequence after another) go through CausalConv with convW [channels, K]
	// and each sequence's state and parents (then ConvCommit of its last
	// row where Commit is set), and the convolved rows are split into q, k
	// [T, KeyHeads·KeyDim] and v [T, ValueHeads·ValueDim], every key head of
	// q and k scaled to unit length (x·rsqrt(Σx²+eps)), then q by qScale;
	// a and b [T, ValueHeads] become the gates as GDNGates makes them. What
	// those ops (the split as three Copy and two L2Norm calls) compute, bit
	// for bit. convW, aLog and dtBias share one dtype.
	GDNConvInputs(q, k, v, a, b, x, convW, aLog, dtBias Buffer, seqs []GDNConvSeq, K int, shape GDNShape, eps, qScale float32)
	// GDNRecurrence runs the gated delta rule over T tokens. q, k [T, KeyHeads*KeyDim]
	// (already L2-normalised and scaled), v [T, ValueHeads*ValueDim], g and beta
	// [T, ValueHeads]. Per value head, with S [KeyDim, ValueDim]:
	//   S = exp(g)·S; S += k ⊗ beta·(v − Sᵀk); out = Sᵀq.
	// Chain (parents nil): starts from state, writes the final state to
	// stateOut (which may be state itself), and, when nodeStates is non-nil,
	// the state after each token t to nodeStates[t]. Tree (parents non-nil):
	// token t starts from nodeStates[parents[t]] (or state when -1), writes its
	// state to nodeStates[t]; stateOut is ignored and state is only read.
	// out may be nil when only the state is wanted (replay).
	// The states (state, stateOut, nodeStates) are all F32 or all BF16. A
	// BF16 state is widened for the update and rounded to nearest even after
	// every token (out is computed before rounding), so a T-token call
	// equals T one-token calls bit for bit and tree nodes hold what decoding
	// their path token by token stores.
	GDNRecurrence(out, q, k, v, g, beta, state, stateOut, nodeStates, parents Buffer, T int, shape GDNShape)
	// GDNRecurrences runs GDNRecurrence for every sequence on its rows of
	// out, q, k, v, g and beta (out may be nil), in one pass where the
	// backend can: what one GDNRecurrence call per sequence computes, bit
	// for bit. The sequences' states share one dtype.
	GDNRecurrences(out, q, k, v, g, beta Buffer, seqs []GDNSeq, shape GDNShape)
	// GDNChunked computes the same as a chain GDNRecurrence without nodeStates
	// (outputs and final state), using the chunked WY form with the given chunk
	// length: the fast path for prefill. Results agree with the token loop to
	// F32 rounding. out may be nil. state and stateOut are both F32 or both
	// BF16; a BF16 state is widened on load and rounded once, on store.
	GDNChunked(out, q, k, v, g, beta, state, stateOut Buffer, T, chunk int, shape GDNShape)

	// LogSoftmax replaces each of rows rows of n logits by its log-probabilities. In place.
	LogSoftmax(x Buffer, rows, n int)
	// TopK writes, per row, the k largest values of x [rows, n] in descending
	// order (ties: lower index first) to vals [rows, k] (F32) and their
	// indices to idx [rows, k] (I32).
	TopK(vals, idx, x Buffer, rows, n, k int)
}
