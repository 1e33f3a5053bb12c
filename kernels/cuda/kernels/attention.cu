// Paged attention with causal, tree/block masks and sliding windows, and
// the KV cache writes and moves. The caches are [slots, kv_heads*head_dim]
// of F32 or BF16: the cache kernels have a _f32 and a _bf16 variant;
// attention has attention_f32 (F32 FMAs) and, for BF16 caches,
// attention_mma_bf16 (tensor cores).
#include "common.cuh"
#include "mma.cuh"

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

// seq_tile finds the sequence s of a launch's query tile of tile_q query
// vectors, the tile's first query vector v0 (row v0 / group, head
// v0 % group of the KV head's group) and the launch row of the sequence's
// first row. Each sequence's rows start a new tile: tiles never mix
// sequences, whose keys differ.
INLINE bool seq_tile(const AttnSeqs &seqs, int tile, int group, int tile_q, int *s, int *v0, int *row0) {
  *row0 = 0;
  for (*s = 0; *s < seqs.count; ++*s) {
    int tiles = (seqs.s[*s].query_len * group + tile_q - 1) / tile_q;
    if (tile < tiles) {
      *v0 = tile * tile_q;
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

// sees reports whether query row i of sq, whose keys are begin..end-1,
// attends to key p: within them and, under a mask, allowed by it.
INLINE bool sees(const AttnSeqDesc &sq, int i, int p, int begin, int end) {
  return p >= begin && p < end && (!sq.mask || p < sq.prefix || sq.mask[i * sq.query_len + (p - sq.prefix)] != 0);
}

// kv_slot is the cache slot of key p of sq (a slot outside the cache traps).
INLINE i64 kv_slot(const AttnSeqDesc &sq, int p, int page_size, i64 num_slots) {
  i64 slot = (i64)sq.pages[p / page_size] * page_size + p % page_size;
  if (slot < 0 || slot >= num_slots) trap();
  return slot;
}

// block_keys bounds the keys of a block whose query vectors are v0 ..
// v0+vectors-1: those any of its rows sees, cut into splits (the block's
// is split blockIdx.z).
INLINE void block_keys(const AttnSeqDesc &sq, int v0, int vectors, int group, int splits, int *begin, int *end) {
  int first_row = v0 / group, last_row = (v0 + vectors - 1) / group;
  *begin = visible_begin(sq, first_row), *end = visible_end(sq, last_row);
  int span = (*end - *begin + splits - 1) / splits;
  *begin += blockIdx.z * span;
  if (*end > *begin + span) *end = *begin + span;
}

// kv_at is where key j of a tile keeps dim d in shared memory: rows of
// MAX_HEAD_DIM floats, row j rotated by j, so that 32 lanes reading dim d
// of 32 keys, or 32 dims of one key, hit 32 different banks.
INLINE int kv_at(int j, int d) { return j * MAX_HEAD_DIM + ((d + j) & (MAX_HEAD_DIM - 1)); }

// attention_f32: block (query tile, KV head, key split). The block stages its
// query vectors and then, tile by tile, the keys and values of its KV head
// in shared memory, once for all its query vectors: warp w owns query
// vector w, lane j scores key j of the tile, and each lane keeps dims
// lane, lane+32, ... of the warp's output accumulator (online softmax).
// With one split the block writes its output rows; with more (long
// contexts and few rows, where the tiles alone would leave most of the
// GPU idle) it writes each query vector's max, sum and unnormalised output
// to parts [launch row, head, split, 2 + head_dim], and attention_merge
// finishes.
KERNEL attention_f32(float *out, const float *q, const float *kc, const float *vc, const AttnSeqs *seqs, int num_heads,
                     int num_kv_heads, int head_dim, int page_size, i64 num_slots, float scale, float *parts,
                     int splits) {
  __shared__ float q_tile[ATTN_TILE_Q][MAX_HEAD_DIM];
  __shared__ float kv_tile[ATTN_TILE_K * MAX_HEAD_DIM];  // the keys, then the values
  __shared__ float probs[ATTN_WARPS][ATTN_TILE_K];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int group = num_heads / num_kv_heads, kvh = blockIdx.y;
  int s, v0, row0;
  if (!seq_tile(*seqs, blockIdx.x, group, ATTN_TILE_Q, &s, &v0, &row0)) return;
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

  int block_begin, block_end;
  block_keys(sq, v0, vectors, group, splits, &block_begin, &block_end);

  float acc[HD_PER_LANE];
#pragma unroll
  for (int c = 0; c < HD_PER_LANE; c++) acc[c] = 0.0f;
  float m = -__builtin_inff(), l = 0.0f;
  for (int t0 = block_begin; t0 < block_end; t0 += ATTN_TILE_K) {
    // Stage the tile's keys (keys past the block's end as zeros).
    for (int e = threadIdx.x; e < ATTN_TILE_K * head_dim; e += blockDim.x) {
      int j = e / head_dim, d = e % head_dim, p = t0 + j;
      float k = 0.0f;
      if (p < block_end) k = to_f32(kc[kv_slot(sq, p, page_size, num_slots) * kv_dim + kvh * head_dim + d]);
      kv_tile[kv_at(j, d)] = k;
    }
    sync_threads();
    int p = t0 + lane;
    bool visible = active && p < block_end && sees(sq, i, p, begin, end);
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
      if (p < block_end) val = to_f32(vc[kv_slot(sq, p, page_size, num_slots) * kv_dim + kvh * head_dim + d]);
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

// ---- On tensor cores (BF16 caches) ----
//
// attention_mma_bf16 computes what attention_f32 does, for a BF16 cache, with
// the two products on bf16 tensor cores (mma.cuh), F32 accumulation: a
// block of AMMA_WARPS warps takes AMMA_TILE_Q query vectors (the MMA's 16
// rows) and walks the keys AMMA_TILE_K at a time. The cache's keys and
// values are bf16 already; the F32 queries and probabilities split into
// bf16 terms (split_bf16's: the products are exact and what the terms
// leave is below 2^(-9·terms) of the value): q_terms for the queries
// (matmul.go's splitTerms of the head dim, the contract of every split
// GEMM) and AMMA_TERMS for the probabilities, whose sums run over any
// number of keys. Scores and the online softmax stay in F32.
#define AMMA_WARPS 4
#define AMMA_TILE_Q 16
#define AMMA_TILE_K 16
#define AMMA_TERMS 3
#define AMMA_LD (MAX_HEAD_DIM + 8)  // staged row stride (bf16): rows 16 bytes apart in the banks
#define AMMA_P_LD (AMMA_TILE_K + 8)
#define AMMA_DIM_TILES (MAX_HEAD_DIM / 16 / AMMA_WARPS)  // output tiles of 16 dims per warp

// half_max and half_sum reduce over the 16 lanes of a half warp.
INLINE float half_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = __builtin_fmaxf(v, __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 31));
  return v;
}
INLINE float half_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 31);
  return v;
}

// split_terms writes v as the sum of terms bf16 numbers into dst[0],
// dst[stride], ... (zeros past terms up to AMMA_TERMS).
INLINE void split_terms(u16 *dst, i64 stride, float v, int terms) {
  for (int t = 0; t < AMMA_TERMS; t++) {
    u16 h = t < terms ? to_bf16_rne(v) : 0;
    dst[t * stride] = h;
    v -= f32_from_bits((u32)h << 16);
  }
}

// Each step: the warps stage the tile's keys; warp w sums the scores over
// every AMMA_WARPS-th 16-dim slab into its part of sc; the half warps take
// two query vectors each and run the online softmax over the parts' sum,
// writing the probabilities' terms and each vector's rescale; then the
// values replace the keys, and warp w multiplies the probabilities by its
// 16-dim columns of them, adding the product (through sc) to its
// accumulators, which hold element lane + 32·e of each of its 16×16
// output tiles.
KERNEL LAUNCH_BOUNDS(128) attention_mma_bf16(float *out, const float *q, const bf16 *kc, const bf16 *vc,
                                             const AttnSeqs *seqs, int num_heads, int num_kv_heads, int head_dim,
                                             int page_size, i64 num_slots, float scale, float *parts, int splits,
                                             int q_terms) {
  __shared__ __attribute__((aligned(32))) u16 qs[AMMA_TERMS][AMMA_TILE_Q][AMMA_LD];
  __shared__ __attribute__((aligned(32))) u16 kv[AMMA_TILE_K][AMMA_LD];  // the keys, then the values
  __shared__ __attribute__((aligned(32))) u16 ps[AMMA_TERMS][AMMA_TILE_Q][AMMA_P_LD];
  __shared__ __attribute__((aligned(32))) float sc[AMMA_WARPS][16][16];  // score parts, then products
  __shared__ float rescale[AMMA_TILE_Q], sums[AMMA_TILE_Q], maxes[AMMA_TILE_Q];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int group = num_heads / num_kv_heads, kvh = blockIdx.y;
  int s, v0, row0;
  if (!seq_tile(*seqs, blockIdx.x, group, AMMA_TILE_Q, &s, &v0, &row0)) return;
  const AttnSeqDesc sq = seqs->s[s];
  int vectors = sq.query_len * group - v0;
  if (vectors > AMMA_TILE_Q) vectors = AMMA_TILE_Q;
  i64 kv_dim = (i64)num_kv_heads * head_dim;
  int slabs = (head_dim + 15) / 16;  // 16-dim slabs, zero past head_dim

  // The query vectors' terms; vector r is row r_i = (v0 + r) / group of
  // the sequence and head kvh·group + (v0 + r) % group.
  for (int e = threadIdx.x; e < AMMA_TILE_Q * 16 * slabs; e += blockDim.x) {
    int r = e / (16 * slabs), d = e % (16 * slabs), v = v0 + r;
    float x = 0.0f;
    if (r < vectors && d < head_dim)
      x = q[((sq.query_start + v / group) * (i64)num_heads + kvh * group + v % group) * head_dim + d];
    split_terms(&qs[0][r][d], AMMA_TILE_Q * AMMA_LD, x, q_terms);
  }
  // This lane's softmax vectors: r = 4·warp + 2·k + lane / 16, k = 0, 1.
  float m[2], l[2];
  int begin[2], end[2];
  for (int k = 0; k < 2; k++) {
    int r = 4 * warp + 2 * k + lane / 16, i = (v0 + r) / group;
    bool active = r < vectors;
    m[k] = -__builtin_inff(), l[k] = 0.0f;
    begin[k] = active ? visible_begin(sq, i) : 0, end[k] = active ? visible_end(sq, i) : 0;
  }
  MmaC zero;
  for (int e = 0; e < 8; e++) zero.x[e] = 0.0f;
  float acc[AMMA_DIM_TILES][8];
#pragma unroll
  for (int t = 0; t < AMMA_DIM_TILES; t++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[t][e] = 0.0f;

  int block_begin, block_end;
  block_keys(sq, v0, vectors, group, splits, &block_begin, &block_end);
  for (int t0 = block_begin; t0 < block_end; t0 += AMMA_TILE_K) {
    for (int e = threadIdx.x; e < AMMA_TILE_K * 16 * slabs; e += blockDim.x) {
      int j = e / (16 * slabs), d = e % (16 * slabs), p = t0 + j;
      kv[j][d] = p < block_end && d < head_dim ? kc[kv_slot(sq, p, page_size, num_slots) * kv_dim + kvh * head_dim + d].bits : 0;
    }
    sync_threads();
    MmaC part = zero;
    for (int slab = warp; slab < slabs; slab += AMMA_WARPS) {
      MmaB b;
      mma_load_b(b, &kv[0][16 * slab], AMMA_LD);
      for (int t = 0; t < q_terms; t++) {
        MmaA a;
        mma_load_a(a, &qs[t][0][16 * slab], AMMA_LD);
        mma_sync(part, a, b);
      }
    }
    mma_store(&sc[warp][0][0], part, 16);
    sync_threads();
    for (int k = 0; k < 2; k++) {
      int r = 4 * warp + 2 * k + lane / 16, j = lane % 16, p = t0 + j, i = (v0 + r) / group;
      bool visible = p < block_end && sees(sq, i, p, begin[k], end[k]);
      float score = -__builtin_inff();
      if (visible) {
        float dot = sc[0][r][j];
        for (int w = 1; w < AMMA_WARPS; w++) dot += sc[w][r][j];
        score = dot * scale;
      }
      float m_new = __builtin_fmaxf(m[k], half_max(score));
      float corr = m_new == -__builtin_inff() ? 1.0f : expf_(m[k] - m_new);
      float pr = visible ? expf_(score - m_new) : 0.0f;
      l[k] = l[k] * corr + half_sum(pr);
      m[k] = m_new;
      split_terms(&ps[0][r][j], AMMA_TILE_Q * AMMA_P_LD, pr, AMMA_TERMS);
      if (j == 0) rescale[r] = corr;
    }
    sync_threads();  // every warp has read the keys and the score parts
    for (int e = threadIdx.x; e < AMMA_TILE_K * 16 * slabs; e += blockDim.x) {
      int j = e / (16 * slabs), d = e % (16 * slabs), p = t0 + j;
      kv[j][d] = p < block_end && d < head_dim ? vc[kv_slot(sq, p, page_size, num_slots) * kv_dim + kvh * head_dim + d].bits : 0;
    }
    sync_threads();
#pragma unroll
    for (int t = 0; t < AMMA_DIM_TILES; t++) {
      int slab = warp + AMMA_WARPS * t;
      if (slab >= slabs) continue;  // uniform across the warp
      MmaBRow b;
      mma_load_b_row(b, &kv[0][16 * slab], AMMA_LD);
      MmaC pv = zero;
      for (int term = 0; term < AMMA_TERMS; term++) {
        MmaA a;
        mma_load_a(a, &ps[term][0][0], AMMA_P_LD);
        mma_sync(pv, a, b);
      }
      mma_store(&sc[warp][0][0], pv, 16);
      sync_warp();
#pragma unroll
      for (int e = 0; e < 8; e++) {
        int idx = lane + 32 * e;
        acc[t][e] = fmaf_(acc[t][e], rescale[idx / 16], sc[warp][idx / 16][idx % 16]);
      }
      sync_warp();  // the next tile overwrites sc[warp]
    }
    sync_threads();  // every warp has read the values, the probabilities and the rescales
  }
  for (int k = 0; k < 2; k++)
    if (lane % 16 == 0) {
      int r = 4 * warp + 2 * k + lane / 16;
      sums[r] = l[k], maxes[r] = m[k];
    }
  sync_threads();
#pragma unroll
  for (int t = 0; t < AMMA_DIM_TILES; t++) {
    int slab = warp + AMMA_WARPS * t;
    if (slab >= slabs) continue;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      int idx = lane + 32 * e, r = idx / 16, d = 16 * slab + idx % 16, v = v0 + r;
      if (r >= vectors || d >= head_dim) continue;
      i64 row = row0 + v / group;  // the query vector's launch row
      int h = kvh * group + v % group;
      float *part = parts + ((row * num_heads + h) * splits + blockIdx.z) * (2 + head_dim);
      if (splits > 1) {
        if (d == 0) part[0] = maxes[r], part[1] = sums[r];
        part[2 + d] = acc[t][e];
      } else {
        float o = sums[r] > 0 ? acc[t][e] / sums[r] : 0.0f;  // a row that sees no key gets zeros
        out[((sq.query_start + v / group) * (i64)num_heads + h) * head_dim + d] = o;
      }
    }
  }
}

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

// Defines KERNEL name##_f32 and name##_bf16 from the template name<C> over
// the cache type C; params is a macro of C giving the parameter list.
#define CACHE_KERNELS(name, params, args)                       \
  KERNEL name##_f32 params(float) { name<float> args; }         \
  KERNEL name##_bf16 params(bf16) { name<bf16> args; }

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
