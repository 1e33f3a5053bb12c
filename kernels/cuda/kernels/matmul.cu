// MatMul out[m,n] = x[m,k]·w[n,k]ᵀ in F32 with weights widened exactly,
// for decode-sized m, and the helpers of the cuBLASLt path for larger m.
#include "common.cuh"

#define MR 8  // x rows per pass; each weight element loaded serves MR rows

struct __attribute__((aligned(16))) f4 { float a, b, c, d; };
struct __attribute__((aligned(16))) u4 { u32 a, b, c, d; };

// load8 widens 8 consecutive weights (p 16-byte aligned).
INLINE void load8(const float *p, float *o) {
  f4 u = *(const f4 *)p, v = *(const f4 *)(p + 4);
  o[0] = u.a, o[1] = u.b, o[2] = u.c, o[3] = u.d, o[4] = v.a, o[5] = v.b, o[6] = v.c, o[7] = v.d;
}
INLINE void widen2(u32 pair, float *o, bf16) {
  o[0] = f32_from_bits(pair << 16);
  o[1] = f32_from_bits(pair & 0xffff0000u);
}
INLINE void widen2(u32 pair, float *o, f16) {
  o[0] = to_f32(f16{(u16)pair});
  o[1] = to_f32(f16{(u16)(pair >> 16)});
}
template <typename H>
INLINE void load8(const H *p, float *o) {
  u4 u = *(const u4 *)p;
  widen2(u.a, o, H{}), widen2(u.b, o + 2, H{}), widen2(u.c, o + 4, H{}), widen2(u.d, o + 6, H{});
}

// dot_rows sets acc[i], for the rows r0+i < m of x, to this lane's part of
// the product of that row with the weight row wr (warp_sum adds the
// lanes' parts). With vec set (k % 8 == 0 and 16-byte aligned rows) each lane
// loads 8 weights at once.
template <typename W>
INLINE void dot_rows(float *acc, const float *x, const W *wr, int r0, int m, int k, int vec) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < MR; i++) acc[i] = 0;
  if (vec) {
#pragma unroll 4  // several 16-byte weight loads in flight per lane
    for (int c = lane * 8; c < k; c += 256) {
      float wv[8];
      load8(wr + c, wv);
#pragma unroll
      for (int i = 0; i < MR; i++) {
        if (r0 + i >= m) break;
        float xv[8];
        load8(x + (i64)(r0 + i) * k + c, xv);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[i] = fmaf_(xv[e], wv[e], acc[i]);
      }
    }
  } else {
    for (int c = lane; c < k; c += 32) {
      float wv = to_f32(wr[c]);
#pragma unroll
      for (int i = 0; i < MR; i++) {
        if (r0 + i >= m) break;
        acc[i] = fmaf_(x[(i64)(r0 + i) * k + c], wv, acc[i]);
      }
    }
  }
}

// matmul: one warp per weight row j, MR rows of x at a time.
template <typename W>
INLINE void matmul(float *out, const float *x, const W *w, int m, int n, int k, int vec) {
  i64 j = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (j >= n) return;
  for (int r0 = blockIdx.y * MR; r0 < m; r0 += gridDim.y * MR) {
    float acc[MR];
    dot_rows(acc, x, w + j * k, r0, m, k, vec);
#pragma unroll
    for (int i = 0; i < MR; i++) {
      if (r0 + i >= m) break;  // uniform across the warp
      float s = warp_sum(acc[i]);
      if ((threadIdx.x & 31) == 0) out[(i64)(r0 + i) * n + j] = s;
    }
  }
}
WEIGHT_KERNELS(matmul, (float *out, const float *x, const void *w, int m, int n, int k, int vec),
               (out, x, (const W *)w, m, n, k, vec))

// Mirror of the Go matmulParts (matmul.go): the weights of a MatMulParts or
// MatMulGLU launch. Without glu, the launch's weight rows are those of parts
// 0..count-1 in turn, each part's products going to its out; with glu,
// count is 1 and part 1 holds the up weight of part 0's gate weight.
#define MAX_MATMUL_PARTS 4
struct MatMulPart {
  const void *w;
  float *out;
  int n, vec;
};
struct MatMulParts {
  MatMulPart p[MAX_MATMUL_PARTS];
  int count, glu;
};

// matmul_parts is matmul over the concatenated weight rows of the parts, one
// warp per row; with glu, each warp computes a gate and an up row and writes
// silu(gate)·up, as swiglu does.
template <typename W>
INLINE void matmul_parts(const float *x, const MatMulParts &ps, int m, int k) {
  i64 j = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int p = 0;
  while (p < ps.count && j >= ps.p[p].n) j -= ps.p[p++].n;
  if (p == ps.count) return;
  const MatMulPart &a = ps.p[p];
  for (int r0 = blockIdx.y * MR; r0 < m; r0 += gridDim.y * MR) {
    float acc[MR], up[MR];
    dot_rows(acc, x, (const W *)a.w + j * k, r0, m, k, a.vec);
    if (ps.glu) dot_rows(up, x, (const W *)ps.p[1].w + j * k, r0, m, k, ps.p[1].vec);
#pragma unroll
    for (int i = 0; i < MR; i++) {
      if (r0 + i >= m) break;  // uniform across the warp
      float s = warp_sum(acc[i]);
      if (ps.glu) s = siluf_(s) * warp_sum(up[i]);
      if ((threadIdx.x & 31) == 0) a.out[(i64)(r0 + i) * a.n + j] = s;
    }
  }
}
WEIGHT_KERNELS(matmul_parts, (const float *x, MatMulParts ps, int m, int k), (x, ps, m, k))

// split_bf16 writes x as the sum of `terms` bf16 numbers, x ≈ t0 + t1 + ...,
// term j into xs[j*n .. (j+1)*n): each term rounds what the previous ones
// left, so the residual is below 2^(-9·terms)·|x|. A bf16 GEMM with F32
// accumulation over the stacked terms thus multiplies x almost exactly.
KERNEL split_bf16(u16 *xs, const float *x, i64 n, int terms) {
  GRID_LOOP(i, n) {
    float r = x[i];
    for (int t = 0; t < terms; t++) {
      u16 h = to_bf16_rne(r);
      xs[t * n + i] = h;
      r -= f32_from_bits((u32)h << 16);
    }
  }
}

// sum_parts adds the stacked partial products of the terms back together.
KERNEL sum_parts(float *out, const float *parts, i64 n, int terms) {
  GRID_LOOP(i, n) {
    float s = parts[i];
    for (int t = 1; t < terms; t++) s += parts[t * n + i];
    out[i] = s;
  }
}
