// Row normalisations: one block per row; sums of squares in double, as in
// the CPU reference. out may alias x: each thread rereads only its own elements.
#include "common.cuh"

// rmsnorm: out = x·inv·(offset + w), offset 1 for Qwen's zero-centred weights.
template <typename W>
INLINE void rmsnorm(float *out, const float *x, const W *w, int dim, float eps, float offset) {
  i64 row = (i64)blockIdx.x * dim;
  float inv = inv_rms(x + row, dim, eps, true);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[row + i] = x[row + i] * inv * (offset + to_f32(w[i]));
}
WEIGHT_KERNELS(rmsnorm, (float *out, const float *x, const void *w, int dim, float eps, float offset),
               (out, x, (const W *)w, dim, eps, offset))

// add_rmsnorm: x += delta, then rmsnorm into out. Each thread adds the
// elements it then reads back (inv_rms and the output take the same
// stride), so the row needs no barrier between the add and the norm.
template <typename W>
INLINE void add_rmsnorm(float *x, const float *delta, float *out, const W *w, int dim, float eps, float offset) {
  i64 row = (i64)blockIdx.x * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) x[row + i] += delta[row + i];
  rmsnorm(out, x, w, dim, eps, offset);
}
WEIGHT_KERNELS(add_rmsnorm,
               (float *x, const float *delta, float *out, const void *w, int dim, float eps, float offset),
               (x, delta, out, (const W *)w, dim, eps, offset))

// gated_rmsnorm: out = x·inv·w·silu(z).
template <typename W>
INLINE void gated_rmsnorm(float *out, const float *x, const float *z, const W *w, int dim, float eps) {
  i64 row = (i64)blockIdx.x * dim;
  float inv = inv_rms(x + row, dim, eps, true);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float n = x[row + i] * inv * to_f32(w[i]);
    out[row + i] = siluf_(z[row + i]) * n;
  }
}
WEIGHT_KERNELS(gated_rmsnorm, (float *out, const float *x, const float *z, const void *w, int dim, float eps),
               (out, x, z, (const W *)w, dim, eps))

// l2norm scales each row in place by rsqrt(Σx²+eps)·scale.
KERNEL l2norm(float *x, int dim, float eps, float scale) {
  i64 row = (i64)blockIdx.x * dim;
  float f = inv_rms(x + row, dim, eps, false) * scale;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) x[row + i] *= f;
}

// attn_inputs: block (row, head) over the query heads of q, then the KV
// heads of k. It normalises the head as rmsnorm does, rotates its first
// 2·half dims as rope does (angles in double), writes it back, and for a
// KV head stores it and the head's v at the row's cache slot. With qg set,
// a query head is read from qg's row (per head its query, then its gate)
// and its gate copied to gate.
template <typename C, typename W>
INLINE void attn_inputs(float *q, const float *qg, float *gate, float *k, const float *v, const W *q_norm, const W *k_norm, const int *positions,
                        const float *inv_freq, C *kc, C *vc, const int *slots, int heads, int kv_heads, int head_dim,
                        int half, float eps, float rope_scale, i64 num_slots) {
  __shared__ float y[MAX_HEAD_DIM], cs[MAX_HEAD_DIM / 2], sn[MAX_HEAD_DIM / 2];
  i64 r = blockIdx.x;
  int h = blockIdx.y, kh = h - heads;
  bool key = kh >= 0;
  float *x = key ? k + (r * kv_heads + kh) * head_dim : q + (r * heads + h) * head_dim;
  const W *w = key ? k_norm : q_norm;
  const float *src = x;
  if (!key && qg) {
    src = qg + (r * heads + h) * 2 * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) gate[(r * heads + h) * head_dim + i] = src[head_dim + i];
  }
  float inv = inv_rms(src, head_dim, eps, true);
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) y[i] = src[i] * inv * (1.0f + to_f32(w[i]));
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos_((double)positions[r] * (double)inv_freq[i], &s, &c);
    cs[i] = (float)c * rope_scale, sn[i] = (float)s * rope_scale;
  }
  sync_threads();
  i64 kv_dim = (i64)kv_heads * head_dim, slot = key ? slots[r] : 0;
  if (key && (slot < 0 || slot >= num_slots)) trap();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float o = y[i];
    if (i < half)
      o = y[i] * cs[i] - y[i + half] * sn[i];
    else if (i < 2 * half)
      o = y[i] * cs[i - half] + y[i - half] * sn[i - half];
    x[i] = o;
    if (key) {
      store_cache(&kc[slot * kv_dim + kh * head_dim + i], o);
      store_cache(&vc[slot * kv_dim + kh * head_dim + i], v[(r * kv_heads + kh) * head_dim + i]);
    }
  }
}
#define ATTN_INPUTS_KERNEL(cache, C, wname, W)                                                                     \
  KERNEL attn_inputs_##cache##_##wname(float *q, const float *qg, float *gate, float *k, const float *v,           \
                                       const void *q_norm, const void *k_norm,                                      \
                                       const int *positions, const float *inv_freq, C *kc, C *vc, const int *slots, \
                                       int heads, int kv_heads, int head_dim, int half, float eps, float rope_scale, \
                                       i64 num_slots) {                                                             \
    attn_inputs<C, W>(q, qg, gate, k, v, (const W *)q_norm, (const W *)k_norm, positions, inv_freq, kc, vc, slots, heads,     \
                      kv_heads, head_dim, half, eps, rope_scale, num_slots);                                        \
  }
ATTN_INPUTS_KERNEL(f32, float, f32, float)
ATTN_INPUTS_KERNEL(f32, float, bf16, bf16)
ATTN_INPUTS_KERNEL(f32, float, f16, f16)
ATTN_INPUTS_KERNEL(bf16, bf16, f32, float)
ATTN_INPUTS_KERNEL(bf16, bf16, bf16, bf16)
ATTN_INPUTS_KERNEL(bf16, bf16, f16, f16)
