// Row normalisations: one block per row; sums of squares in double, as in
// the CPU reference. out may alias x: each thread rereads only its own elements.
#include "common.cuh"

// inv_rms returns rsqrt(Σx²/dim + eps) of row x, to every thread.
INLINE float inv_rms(const float *x, int dim, float eps, bool mean) {
  __shared__ double scratch[32];
  double ss = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)x[i] * x[i];
  ss = block_sum_d(ss, scratch);
  return (float)(1.0 / sqrt_((mean ? ss / dim : ss) + (double)eps));
}

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
