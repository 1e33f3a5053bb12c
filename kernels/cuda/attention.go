//go:build cgo

package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"

	"ddflash/kernels"
)

// Mirrors of attention.cu's limits and of its AttnSeqs kernel argument.
const (
	maxAttnSeqs    = 32   // sequences per launch; Attention launches once per group
	attnSeqDescLen = 32   // bytes of one AttnSeqDesc: pages, mask, 4 ints
	attnSeqsLen    = 1032 // bytes of AttnSeqs: the descriptors, count, padding
	attnThreads    = 256  // ATTN_WARPS warps
	attnTileQ      = 8    // ATTN_TILE_Q: query vectors (row, head) per block
	// The tensor-core kernel's (BF16 caches): AMMA_WARPS warps, AMMA_TILE_Q vectors.
	attnMMAThreads = 128
	attnMMATileQ   = 16
	maxHeadDim     = 256
	// A launch splits each row's keys (then merges) when its (query tile,
	// KV head) blocks would not fill the GPU twice over, in splits of at
	// least attnSplitKeys keys, at most maxAttnSplits of them.
	attnSplitKeys = 256
	maxAttnSplits = 128
)

// WriteKV stores n rows of k and v into the caches at the given slots.
func (be *Backend) WriteKV(kCache, vCache, k, v, slots kernels.Buffer, n, kvDim int) {
	kv, vv := f32s("WriteKV k", k, n*kvDim), f32s("WriteKV v", v, n*kvDim)
	sl := i32s("WriteKV slots", slots, n)
	kc, vc, variant := caches("WriteKV", kCache, vCache, kvDim)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("write_kv"+variant, be.gridFor(n*kvDim, 256), d1(256), 0, kc, vc, kv, vv, sl, i32(n), i32(kvDim), int64(kc.n/kvDim))
}

// AttnInputs normalises and rotates every query and KV head of a step and
// stores k and v in the caches: one launch instead of RMSNorm, RoPE (two
// each) and WriteKV.
func (be *Backend) AttnInputs(q, qg, gate, k, v, qNorm, kNorm, positions, invFreq, kCache, vCache, slots kernels.Buffer, rows int, s kernels.AttnInputShape) {
	if s.RotDim%2 != 0 || s.RotDim > s.HeadDim || s.HeadDim > maxHeadDim {
		panic(fmt.Sprintf("cuda: AttnInputs shape %+v: RotDim must be even and at most HeadDim, HeadDim at most %d", s, maxHeadDim))
	}
	kvDim := s.KVHeads * s.HeadDim
	qv, kv := f32s("AttnInputs q", q, rows*s.Heads*s.HeadDim), f32s("AttnInputs k", k, rows*kvDim)
	vv := f32s("AttnInputs v", v, rows*kvDim)
	var qgv, gv any // null pointers without the gate
	if qg != nil {
		qgv, gv = f32s("AttnInputs qg", qg, 2*rows*s.Heads*s.HeadDim), f32s("AttnInputs gate", gate, rows*s.Heads*s.HeadDim)
	}
	qn, variant := weights("AttnInputs qNorm", qNorm, s.HeadDim)
	kn, kVariant := weights("AttnInputs kNorm", kNorm, s.HeadDim)
	if variant != kVariant {
		panic(fmt.Sprintf("cuda: AttnInputs qNorm is %v and kNorm %v: the kernel needs one dtype", qn.dt, kn.dt))
	}
	pos, freq := i32s("AttnInputs positions", positions, rows), f32s("AttnInputs invFreq", invFreq, s.RotDim/2)
	sl := i32s("AttnInputs slots", slots, rows)
	kc, vc, cacheVariant := caches("AttnInputs", kCache, vCache, kvDim)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("attn_inputs"+cacheVariant+variant, dim3{rows, s.Heads + s.KVHeads, 1}, rowThreads(s.HeadDim, attnThreads), 0,
		qv, qgv, gv, kv, vv, qn, kn, pos, freq, kc, vc, sl, i32(s.Heads), i32(s.KVHeads), i32(s.HeadDim), i32(s.RotDim/2),
		s.Eps, s.RoPEScale, int64(kc.n/kvDim))
}

// MoveKV copies cache rows src[i] → dst[i]: all rows go to scratch first,
// then to their destinations, so every read precedes every write.
func (be *Backend) MoveKV(kCache, vCache, dst, src kernels.Buffer, n, kvDim int) {
	dv, sv := i32s("MoveKV dst", dst, n), i32s("MoveKV src", src, n)
	kc, vc, variant := caches("MoveKV", kCache, vCache, kvDim)
	if n == 0 {
		return
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	half := n * kvDim * kc.dt.Size()
	tmp, err := be.scratchPtr(2 * half)
	if err != nil {
		be.fail(err)
		return
	}
	tk, tv := tmp, tmp+devPtr(half)
	slots := int64(kc.n / kvDim)
	grid := be.gridFor(n*kvDim, 256)
	be.launch("move_kv"+variant, grid, d1(256), 0, tk, tv, kc, vc, nil, sv, i32(n), i32(kvDim), slots)
	be.launch("move_kv"+variant, grid, d1(256), 0, kc, vc, tk, tv, dv, nil, i32(n), i32(kvDim), slots)
}

// caches checks the two caches, which must be both F32 or both BF16 and of
// one length, and returns the suffix of the kernels for their dtype.
func caches(op string, kCache, vCache kernels.Buffer, kvDim int) (k, v *buffer, variant string) {
	k, v = asBuffer(kCache), asBuffer(vCache)
	if k.dt != v.dt || k.dt != kernels.F32 && k.dt != kernels.BF16 || k.n != v.n || kvDim <= 0 {
		panic(fmt.Sprintf("cuda: %s caches %v[%d] and %v[%d] with kvDim %d: need two F32 or two BF16 caches of one length and kvDim > 0",
			op, k.dt, k.n, v.dt, v.n, kvDim))
	}
	_, variant = weights(op, kCache, 0)
	return k, v, variant
}

// Attention computes paged, masked softmax attention for every sequence,
// in launches of up to maxAttnSeqs sequences: one block per (query tile,
// KV head, key split), a query tile being attnTileQ (attnMMATileQ on
// tensor cores: attnKernel) (row, head) query vectors of one sequence
// among the heads that share the KV head. The
// sequences' descriptors go to the device by an upload into the backend's
// own table (so Attention cannot be captured in a graph: a replayable step
// uploads its table with its other metadata and calls AttentionTable).
func (be *Backend) Attention(out, q, kCache, vCache kernels.Buffer, shape kernels.AttnShape, seqs []kernels.AttnSeq) {
	keys := 0
	for _, sq := range seqs {
		keys = max(keys, sq.Prefix+sq.QueryLen)
	}
	table := make([]int32, attnTableLen(len(seqs)))
	be.EncodeAttnTable(table, seqs, shape.PageSize)
	tb, err := be.attnTableBuffer(len(table))
	if err == nil {
		err = be.UploadI32(tb, 0, table)
	}
	if err != nil {
		be.mu.Lock()
		be.fail(err)
		be.mu.Unlock()
		return
	}
	be.AttentionTable(out, q, kCache, vCache, shape, seqs, tb, keys)
}

// attnTableBuffer returns the backend's table for Attention's descriptors,
// grown to at least n elements. Like scratch memory it is the backend's
// own (not a buffer BufferBytes counts), and a queued launch may still read
// it: it is replaced only after a wait for the stream.
func (be *Backend) attnTableBuffer(n int) (*buffer, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.capturing {
		return nil, errCapture
	}
	if bytes := 4 * n; bytes > be.attnTable.bytes {
		if err := check("cuStreamSynchronize", C.dd_stream_sync(be.ctx, be.stream)); err != nil {
			return nil, err
		}
		be.attnTable.free(be)
		be.counts.Allocs++
		var p C.CUdeviceptr
		if err := check("cuMemAlloc for attention tables", C.dd_mem_alloc(be.ctx, &p, C.size_t(bytes))); err != nil {
			return nil, err
		}
		be.attnTable = allocation{p, bytes}
	}
	return &buffer{mem: &be.attnTable, n: be.attnTable.bytes / 4, dt: kernels.I32, view: true}, nil
}

// AttnTableLen is the I32 elements of a device table for n sequences:
// one attention.cu AttnSeqs per launch of up to maxAttnSeqs of them.
func (be *Backend) AttnTableLen(n int) int { return attnTableLen(n) }

func attnTableLen(n int) int { return (n + maxAttnSeqs - 1) / maxAttnSeqs * attnSeqsLen / 4 }

// EncodeAttnTable writes the device form of seqs into dst (AttnTableLen
// elements): their descriptors with their Pages and Mask buffers' device
// addresses, so those buffers must stay allocated while the table is used.
func (be *Backend) EncodeAttnTable(dst []int32, seqs []kernels.AttnSeq, pageSize int) {
	for g, lo := 0, 0; lo < len(seqs); g, lo = g+1, lo+maxAttnSeqs {
		b, _ := attnSeqs(seqs[lo:min(lo+maxAttnSeqs, len(seqs))], pageSize)
		for i := range attnSeqsLen / 4 {
			dst[g*attnSeqsLen/4+i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
	}
}

// AttentionTable is Attention over the sequences seqs describes on the
// host, reading their descriptors from table (written by EncodeAttnTable
// and uploaded; 8-byte aligned) at run time. The launches depend only on
// the sequences' query lengths and on maxKeys, which bounds every
// sequence's keys (Prefix+QueryLen) and sets how each row's keys split:
// a graph captured from this call replays correctly for any step whose
// table describes sequences of those query lengths within maxKeys keys.
func (be *Backend) AttentionTable(out, q, kCache, vCache kernels.Buffer, shape kernels.AttnShape, seqs []kernels.AttnSeq, table kernels.Buffer, maxKeys int) {
	if shape.NumKVHeads <= 0 || shape.NumHeads%shape.NumKVHeads != 0 || shape.PageSize <= 0 {
		panic(fmt.Sprintf("cuda: Attention shape %+v: NumHeads must be a positive multiple of NumKVHeads and PageSize > 0", shape))
	}
	if shape.HeadDim <= 0 || shape.HeadDim > maxHeadDim {
		panic(fmt.Sprintf("cuda: Attention head dim %d: the kernel supports 1..%d", shape.HeadDim, maxHeadDim))
	}
	qDim := shape.NumHeads * shape.HeadDim
	kc, vc, _ := caches("Attention", kCache, vCache, shape.NumKVHeads*shape.HeadDim)
	qRows := 0
	for _, sq := range seqs {
		qRows = max(qRows, sq.QueryStart+sq.QueryLen)
		if sq.Prefix+sq.QueryLen > maxKeys {
			panic(fmt.Sprintf("cuda: Attention sequence of %d keys beyond maxKeys %d", sq.Prefix+sq.QueryLen, maxKeys))
		}
	}
	qv, ov := f32s("Attention q", q, qRows*qDim), f32s("Attention out", out, qRows*qDim)
	tb := i32s("Attention table", table, attnTableLen(len(seqs)))
	if tb.addr()%8 != 0 {
		panic("cuda: Attention table must be 8-byte aligned (it holds device pointers)")
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	for g, lo := 0, 0; lo < len(seqs); g, lo = g+1, lo+maxAttnSeqs {
		group := seqs[lo:min(lo+maxAttnSeqs, len(seqs))]
		rows := 0
		for _, sq := range group {
			rows += sq.QueryLen
		}
		desc := tb.addr() + devPtr(g*attnSeqsLen)
		kernel, tileQ, threads := attnKernel(kc.dt)
		tiles := attnTiles(group, shape.NumHeads/shape.NumKVHeads, tileQ)
		splits := be.attnSplits(maxKeys, tiles*shape.NumKVHeads)
		var parts any
		if splits > 1 {
			p, err := be.scratchPtr(rows * shape.NumHeads * splits * (2 + shape.HeadDim) * 4)
			if err != nil {
				be.fail(err)
				return
			}
			parts = p
		}
		args := []any{ov, qv, kc, vc, desc, i32(shape.NumHeads), i32(shape.NumKVHeads), i32(shape.HeadDim), i32(shape.PageSize),
			int64(kc.n / (shape.NumKVHeads * shape.HeadDim)), shape.Scale, parts, i32(splits)}
		if kc.dt == kernels.BF16 {
			args = append(args, i32(splitTerms(shape.HeadDim)))
		}
		be.launch(kernel, dim3{tiles, shape.NumKVHeads, splits}, d1(threads), 0, args...)
		if splits > 1 {
			be.launch("attention_merge", dim3{rows, shape.NumHeads, 1}, rowThreads(shape.HeadDim, attnThreads), 0,
				ov, parts, desc, i32(shape.NumHeads), i32(shape.HeadDim), i32(splits))
		}
	}
}

// attnKernel is the attention kernel for a cache dtype, with its query
// tile and block size: for BF16 caches attention_mma_bf16, whose products
// run on tensor cores (the keys and values are bf16 already; the queries
// and probabilities split into bf16 terms as split GEMMs' activations do),
// for F32 caches the F32 kernel.
func attnKernel(cache kernels.DType) (name string, tileQ, threads int) {
	if cache == kernels.BF16 {
		return "attention_mma_bf16", attnMMATileQ, attnMMAThreads
	}
	return "attention_f32", attnTileQ, attnThreads
}

// attnTiles is the number of query tiles of a launch: each sequence's
// query vectors, (row, head) for the group heads of a KV head, in tiles
// of tileQ.
func attnTiles(seqs []kernels.AttnSeq, group, tileQ int) int {
	tiles := 0
	for _, sq := range seqs {
		tiles += (sq.QueryLen*group + tileQ - 1) / tileQ
	}
	return tiles
}

// attnSplits is how many parts to split each row's keys into, given the
// most keys a row has and the launch's (query tile, KV head) block count:
// enough for two blocks per SM, each split at least attnSplitKeys keys long.
func (be *Backend) attnSplits(keys, blocks int) int {
	if blocks == 0 || blocks >= 2*be.sms || keys < 2*attnSplitKeys {
		return 1
	}
	return min((2*be.sms+blocks-1)/blocks, keys/attnSplitKeys, maxAttnSplits)
}

// attnSeqs packs up to maxAttnSeqs sequences as attention.cu's AttnSeqs and
// returns the number of query rows they hold.
func attnSeqs(seqs []kernels.AttnSeq, pageSize int) ([]byte, int) {
	b := make([]byte, attnSeqsLen)
	rows := 0
	for i, sq := range seqs {
		pages := i32s("Attention pages", sq.Pages, (sq.Prefix+sq.QueryLen+pageSize-1)/pageSize)
		d := b[i*attnSeqDescLen:]
		binary.LittleEndian.PutUint64(d, uint64(pages.addr()))
		if sq.Mask != nil {
			binary.LittleEndian.PutUint64(d[8:], uint64(i32s("Attention mask", sq.Mask, sq.QueryLen*sq.QueryLen).addr()))
		}
		for j, v := range []int{sq.QueryStart, sq.QueryLen, sq.Prefix, sq.Window} {
			binary.LittleEndian.PutUint32(d[16+4*j:], uint32(i32(v)))
		}
		rows += sq.QueryLen
	}
	binary.LittleEndian.PutUint32(b[maxAttnSeqs*attnSeqDescLen:], uint32(len(seqs)))
	return b, rows
}
