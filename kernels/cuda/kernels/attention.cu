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
#define MAX_HEAD_DIM 256
#define HD_PER_LANE (MAX_HEAD_DIM / 32)

// seq_row finds the sequence s and its query row i of a launch's block row.
INLINE bool seq_row(const AttnSeqs &seqs, int block_row, int *s, int *i) {
  *i = block_row;
  for (*s = 0; *s < seqs.count && *i >= seqs.s[*s].query_len; ++*s) *i -= seqs.s[*s].query_len;
  return *s < seqs.count;
}

// attention: block (query row, head, key split); each warp runs an online
// softmax over every ATTN_WARPS-th visible key of the split, then the warps
// merge. Lane l holds dims l, l+32, ... of q and of its output accumulator.
// With one split the block writes the output row; with more (long contexts
// and few rows, where (row, head) pairs alone would leave most of the GPU
// idle) it writes its max, sum and unnormalised output to parts
// [block row, head, split, 2 + head_dim], and attention_merge finishes.
template <typename C>
INLINE void attention(float *out, const float *q, const C *kc, const C *vc, const AttnSeqs *seqs, int num_heads,
                      int num_kv_heads, int head_dim, int page_size, i64 num_slots, float scale, float *parts,
                      int splits) {
  __shared__ float warp_m[ATTN_WARPS], warp_l[ATTN_WARPS];
  __shared__ float warp_acc[ATTN_WARPS][MAX_HEAD_DIM];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int s, i;
  if (!seq_row(*seqs, blockIdx.x, &s, &i)) return;
  const AttnSeqDesc sq = seqs->s[s];
  int h = blockIdx.y, kvh = h / (num_heads / num_kv_heads);
  i64 row = sq.query_start + i, kv_dim = (i64)num_kv_heads * head_dim;

  float qv[HD_PER_LANE], acc[HD_PER_LANE];
#pragma unroll
  for (int c = 0; c < HD_PER_LANE; c++) {
    int d = lane + 32 * c;
    qv[c] = d < head_dim ? q[(row * num_heads + h) * head_dim + d] : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -__builtin_inff(), l = 0.0f;
  int end = sq.prefix + (sq.mask ? sq.query_len : i + 1);
  int begin = 0;
  if (sq.window > 0 && sq.prefix + i - sq.window + 1 > 0) begin = sq.prefix + i - sq.window + 1;
  int span = (end - begin + splits - 1) / splits;
  begin += blockIdx.z * span;
  if (end > begin + span) end = begin + span;
  for (int p = begin + warp; p < end; p += ATTN_WARPS) {
    if (sq.mask && p >= sq.prefix && sq.mask[i * sq.query_len + (p - sq.prefix)] == 0) continue;
    i64 slot = (i64)sq.pages[p / page_size] * page_size + p % page_size;
    if (slot < 0 || slot >= num_slots) trap();
    const C *kr = kc + slot * kv_dim + kvh * head_dim, *vr = vc + slot * kv_dim + kvh * head_dim;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < HD_PER_LANE; c++) {
      int d = lane + 32 * c;
      if (d < head_dim) dot = fmaf_(qv[c], to_f32(kr[d]), dot);
    }
    float score = warp_sum(dot) * scale;
    float m_new = __builtin_fmaxf(m, score);
    float corr = expf_(m - m_new), pr = expf_(score - m_new);
    l = l * corr + pr;
#pragma unroll
    for (int c = 0; c < HD_PER_LANE; c++) {
      int d = lane + 32 * c;
      acc[c] = acc[c] * corr + (d < head_dim ? pr * to_f32(vr[d]) : 0.0f);
    }
    m = m_new;
  }
  if (lane == 0) warp_m[warp] = m, warp_l[warp] = l;
#pragma unroll
  for (int c = 0; c < HD_PER_LANE; c++) warp_acc[warp][lane + 32 * c] = acc[c];
  sync_threads();
  float top = -__builtin_inff();
  for (int w = 0; w < ATTN_WARPS; w++) top = __builtin_fmaxf(top, warp_m[w]);
  float sum = 0.0f;
  if (top != -__builtin_inff())
    for (int w = 0; w < ATTN_WARPS; w++) sum += warp_l[w] * expf_(warp_m[w] - top);
  float *part = parts + (((i64)blockIdx.x * num_heads + h) * splits + blockIdx.z) * (2 + head_dim);
  if (splits > 1 && threadIdx.x == 0) part[0] = top, part[1] = sum;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    if (sum > 0)
      for (int w = 0; w < ATTN_WARPS; w++) o += warp_acc[w][d] * expf_(warp_m[w] - top);
    if (splits > 1)
      part[2 + d] = o;
    else
      out[(row * num_heads + h) * head_dim + d] = sum > 0 ? o / sum : 0.0f;  // a row that sees no key gets zeros
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

// store_cache rounds a value to the cache's type (BF16: to nearest even).
INLINE void store_cache(float *dst, float v) { *dst = v; }
INLINE void store_cache(bf16 *dst, float v) { dst->bits = to_bf16_rne(v); }

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
