// Paged attention with causal, tree/block masks and sliding windows, and
// the KV cache writes and moves. The caches are [slots, kv_heads*head_dim]
// of F32 or BF16 (widened to F32 as they are read): each kernel has a _f32
// and a _bf16 variant.
#include "common.cuh"

// Mirror of the Go attnSeqs struct (attention.go): one entry per sequence.
// The kernels read it from device memory, so that a replayed graph picks up
// each step's sequences (attention.go's AttentionTable).
#define MAX_ATTN_SEQS 32
struct AttnSeqDesc {
  const int *pages;  // page table
  const int *mask;   // [query_len*query_len] or null for causal
  int query_start, query_len, prefix, window;
};
struct AttnSeqs {
  AttnSeqDesc s[MAX_ATTN_SEQS];
  int count;
};

#define ATTN_WARPS 8
#define HD_PER_LANE (MAX_HEAD_DIM / 32)
// A block's query tile: ATTN_TILE_Q query vectors (one per warp), taken in
// (row, head) order from the rows of one sequence and the heads that share
// one KV head; its keys go through shared memory ATTN_TILE_K at a time.
#define ATTN_TILE_Q ATTN_WARPS
#define ATTN_TILE_K 32

// seq_row finds the sequence s and its query row i of a launch's block row.
INLINE bool seq_row(const AttnSeqs &seqs, int block_row, int *s, int *i) {
  *i = block_row;
  for (*s = 0; *s < seqs.count && *i >= seqs.s[*s].query_len; ++*s) *i -= seqs.s[*s].query_len;
  return *s < seqs.count;
}

// seq_tile finds the sequence s of a launch's query tile, the tile's first
// query vector v0 (row v0 / group, head v0 % group of the KV head's group)
// and the launch row of the sequence's first row. Each sequence's rows
// start a new tile: tiles never mix sequences, whose keys differ.
INLINE bool seq_tile(const AttnSeqs &seqs, int tile, int group, int *s, int *v0, int *row0) {
  *row0 = 0;
  for (*s = 0; *s < seqs.count; ++*s) {
    int tiles = (seqs.s[*s].query_len * group + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
    if (tile < tiles) {
      *v0 = tile * ATTN_TILE_Q;
      return true;
    }
    tile -= tiles;
    *row0 += seqs.s[*s].query_len;
  }
  return false;
}

// visible_begin and visible_end bound the keys query row i of sq sees.
INLINE int visible_begin(const AttnSeqDesc &sq, int i) {
  int b = sq.prefix + i - sq.window + 1;
  return sq.window > 0 && b > 0 ? b : 0;
}
INLINE int visible_end(const AttnSeqDesc &sq, int i) { return sq.prefix + (sq.mask ? sq.query_len : i + 1); }

// kv_at is where key j of a tile keeps dim d in shared memory: rows of
// MAX_HEAD_DIM floats, row j rotated by j, so that 32 lanes reading dim d
// of 32 keys, or 32 dims of one key, hit 32 different banks.
INLINE int kv_at(int j, int d) { return j * MAX_HEAD_DIM + ((d + j) & (MAX_HEAD_DIM - 1)); }

// attention: block (query tile, KV head, key split). The block stages its
// query vectors and then, tile by tile, the keys and values of its KV head
// in shared memory, once for all its query vectors: warp w owns query
// vector w, lane j scores key j of the tile, and each lane keeps dims
// lane, lane+32, ... of the warp's output accumulator (online softmax).
// With one split the block writes its output rows; with more (long
// contexts and few rows, where the tiles alone would leave most of the
// GPU idle) it writes each query vector's max, sum and unnormalised output
// to parts [launch row, head, split, 2 + head_dim], and attention_merge
// finishes.
template <typename C>
INLINE void attention(float *out, const float *q, const C *kc, const C *vc, const AttnSeqs *seqs, int num_heads,
                      int num_kv_heads, int head_dim, int page_size, i64 num_slots, float scale, float *parts,
                      int splits) {
  __shared__ float q_tile[ATTN_TILE_Q][MAX_HEAD_DIM];
  __shared__ float kv_tile[ATTN_TILE_K * MAX_HEAD_DIM];  // the keys, then the values
  __shared__ float probs[ATTN_WARPS][ATTN_TILE_K];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int group = num_heads / num_kv_heads, kvh = blockIdx.y;
  int s, v0, row0;
  if (!seq_tile(*seqs, blockIdx.x, group, &s, &v0, &row0)) return;
  const AttnSeqDesc sq = seqs->s[s];
  int vectors = sq.query_len * group - v0;
  if (vectors > ATTN_TILE_Q) vectors = ATTN_TILE_Q;
  i64 kv_dim = (i64)num_kv_heads * head_dim;

  // This warp's query vector: row i of the sequence, head h.
  int v = v0 + warp, i = v / group, h = kvh * group + v % group;
  bool active = warp < vectors;
  for (int d = lane; d < MAX_HEAD_DIM; d += 32)
    q_tile[warp][d] = active && d < head_dim ? q[((sq.query_start + i) * (i64)num_heads + h) * head_dim + d] : 0.0f;
  int begin = active ? visible_begin(sq, i) : 0, end = active ? visible_end(sq, i) : 0;

  // The block's keys: those any of its rows sees, cut into splits.
  int first_row = v0 / group, last_row = (v0 + vectors - 1) / group;
  int block_begin = visible_begin(sq, first_row), block_end = visible_end(sq, last_row);
  int span = (block_end - block_begin + splits - 1) / splits;
  block_begin += blockIdx.z * span;
  if (block_end > block_begin + span) block_end = block_begin + span;

  float acc[HD_PER_LANE];
#pragma unroll
  for (int c = 0; c < HD_PER_LANE; c++) acc[c] = 0.0f;
  float m = -__builtin_inff(), l = 0.0f;
  for (int t0 = block_begin; t0 < block_end; t0 += ATTN_TILE_K) {
    // Stage the tile's keys (keys past the block's end as zeros).
    for (int e = threadIdx.x; e < ATTN_TILE_K * head_dim; e += blockDim.x) {
      int j = e / head_dim, d = e % head_dim, p = t0 + j;
      float k = 0.0f;
      if (p < block_end) {
        i64 slot = (i64)sq.pages[p / page_size] * page_size + p % page_size;
        if (slot < 0 || slot >= num_slots) trap();
        k = to_f32(kc[slot * kv_dim + kvh * head_dim + d]);
      }
      kv_tile[kv_at(j, d)] = k;
    }
    sync_threads();
    int p = t0 + lane;
    bool visible = active && p >= begin && p < end && p < block_end &&
                   (!sq.mask || p < sq.prefix || sq.mask[i * sq.query_len + (p - sq.prefix)] != 0);
    float score = -__builtin_inff();
    if (visible) {
      float dot = 0.0f;
      for (int d = 0; d < head_dim; d++) dot = fmaf_(q_tile[warp][d], kv_tile[kv_at(lane, d)], dot);
      score = dot * scale;
    }
    float m_new = __builtin_fmaxf(m, warp_max(score));
    // A warp that has seen no visible key yet keeps m = -inf, l = 0.
    float corr = m_new == -__builtin_inff() ? 1.0f : expf_(m - m_new);
    float pr = visible ? expf_(score - m_new) : 0.0f;
    l = l * corr + warp_sum(pr);
    m = m_new;
    probs[warp][lane] = pr;
    sync_threads();  // every warp has read the keys
    for (int e = threadIdx.x; e < ATTN_TILE_K * head_dim; e += blockDim.x) {
      int j = e / head_dim, d = e % head_dim, p = t0 + j;
      float val = 0.0f;
      if (p < block_end) {
        i64 slot = (i64)sq.pages[p / page_size] * page_size + p % page_size;
        val = to_f32(vc[slot * kv_dim + kvh * head_dim + d]);
      }
      kv_tile[kv_at(j, d)] = val;
    }
    sync_threads();
#pragma unroll
    for (int c = 0; c < HD_PER_LANE; c++) {
      int d = lane + 32 * c;
      if (d >= head_dim) continue;
      float a = acc[c] * corr;
      for (int j = 0; j < ATTN_TILE_K; j++) a = fmaf_(probs[warp][j], kv_tile[kv_at(j, d)], a);
      acc[c] = a;
    }
    sync_threads();  // every warp has read the values
  }
  if (!active) return;
  i64 row = row0 + i;  // the query vector's launch row
  float *part = parts + ((row * num_heads + h) * splits + blockIdx.z) * (2 + head_dim);
  if (splits > 1 && lane == 0) part[0] = m, part[1] = l;
#pragma unroll
  for (int c = 0; c < HD_PER_LANE; c++) {
    int d = lane + 32 * c;
    if (d >= head_dim) continue;
    if (splits > 1)
      part[2 + d] = acc[c];
    else
      out[((sq.query_start + i) * (i64)num_heads + h) * head_dim + d] = l > 0 ? acc[c] / l : 0.0f;  // a row that sees no key gets zeros
  }
}

// Defines KERNEL name##_f32 and name##_bf16 from the template name<C> over
// the cache type C; params is a macro of C giving the parameter list.
#define CACHE_KERNELS(name, params, args)                       \
  KERNEL name##_f32 params(float) { name<float> args; }         \
  KERNEL name##_bf16 params(bf16) { name<bf16> args; }

#define ATTENTION_PARAMS(C)                                                                                   \
  (float *out, const float *q, const C *kc, const C *vc, const AttnSeqs *seqs, int num_heads, int num_kv_heads, \
   int head_dim, int page_size, i64 num_slots, float scale, float *parts, int splits)
CACHE_KERNELS(attention, ATTENTION_PARAMS,
              (out, q, kc, vc, seqs, num_heads, num_kv_heads, head_dim, page_size, num_slots, scale, parts, splits))

// attention_merge combines the splits' partial results: block (query row, head).
KERNEL attention_merge(float *out, const float *parts, const AttnSeqs *seqs, int num_heads, int head_dim, int splits) {
  int s, i;
  if (!seq_row(*seqs, blockIdx.x, &s, &i)) return;
  int h = blockIdx.y;
  i64 row = seqs->s[s].query_start + i;
  const float *part = parts + ((i64)blockIdx.x * num_heads + h) * splits * (2 + head_dim);
  float top = -__builtin_inff();
  for (int z = 0; z < splits; z++) top = __builtin_fmaxf(top, part[z * (2 + head_dim)]);
  float sum = 0.0f;
  if (top != -__builtin_inff())
    for (int z = 0; z < splits; z++) sum += part[z * (2 + head_dim) + 1] * expf_(part[z * (2 + head_dim)] - top);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    if (sum > 0) {
      for (int z = 0; z < splits; z++) {
        const float *pz = part + z * (2 + head_dim);
        if (pz[1] > 0) o += pz[2 + d] * expf_(pz[0] - top);
      }
      o /= sum;
    }
    out[(row * num_heads + h) * head_dim + d] = o;
  }
}

// write_kv stores row i of k and v at cache slot slots[i].
template <typename C>
INLINE void write_kv(C *kc, C *vc, const float *k, const float *v, const int *slots, int n, int kv_dim,
                     i64 num_slots) {
  GRID_LOOP(e, (i64)n * kv_dim) {
    i64 i = e / kv_dim, d = e % kv_dim, slot = slots[i];
    if (slot < 0 || slot >= num_slots) trap();
    store_cache(&kc[slot * kv_dim + d], k[e]);
    store_cache(&vc[slot * kv_dim + d], v[e]);
  }
}
#define WRITE_KV_PARAMS(C) \
  (C * kc, C * vc, const float *k, const float *v, const int *slots, int n, int kv_dim, i64 num_slots)
CACHE_KERNELS(write_kv, WRITE_KV_PARAMS, (kc, vc, k, v, slots, n, kv_dim, num_slots))

// move_kv copies cache rows src_slots[i] to dst_slots[i] in both caches; a
// null slot list means rows 0..n-1 of a scratch pair. MoveKV runs it twice,
// caches to scratch and back, so that every read precedes every write.
template <typename C>
INLINE void move_kv(C *dk, C *dv, const C *sk, const C *sv, const int *dst_slots, const int *src_slots, int n,
                    int kv_dim, i64 num_slots) {
  GRID_LOOP(e, (i64)n * kv_dim) {
    i64 i = e / kv_dim, d = e % kv_dim;
    i64 ds = dst_slots ? dst_slots[i] : i, ss = src_slots ? src_slots[i] : i;
    if (ds < 0 || ss < 0 || (dst_slots && ds >= num_slots) || (src_slots && ss >= num_slots)) trap();
    dk[ds * kv_dim + d] = sk[ss * kv_dim + d];
    dv[ds * kv_dim + d] = sv[ss * kv_dim + d];
  }
}
#define MOVE_KV_PARAMS(C) \
  (C * dk, C * dv, const C *sk, const C *sv, const int *dst_slots, const int *src_slots, int n, int kv_dim, i64 num_slots)
CACHE_KERNELS(move_kv, MOVE_KV_PARAMS, (dk, dv, sk, sv, dst_slots, src_slots, n, kv_dim, num_slots))
