// MatMul out[m,n] = x[m,k]·w[n,k]ᵀ on FP8 block-scaled weights: q holds
// E4M3 bytes [n,k], scale one float per 128×128 block [ceil(n/128),
// ceil(k/128)], and w = e4m3(q)·scale. Each weight is widened and scaled in
// registers (rounded to float32, as a dequantised copy would hold it); no
// dequantised copy is made.
#include "common.cuh"

#define FP8_BLOCK 128
#define FP8_MR 8  // x rows per pass of the warp kernel

typedef unsigned char u8;

// e4m3 decodes an E4M3 byte exactly (bias 7, subnormals at exponent 0).
// The NaN patterns 0x7f and 0xff read as ±480, as on the CPU backend.
INLINE float e4m3(u32 b) {
  u32 e = (b >> 3) & 0xf, mant = b & 7;
  float v = e ? f32_from_bits(((e + 120) << 23) | (mant << 20)) : (float)mant * 0.001953125f;  // m·2^-9
  return (b & 0x80) ? -v : v;
}

// matmul_fp8: the decode path (few x rows). One warp per weight row j,
// FP8_MR rows of x at a time. With vec set (k % 16 == 0, 16-byte aligned
// rows) each lane loads 16 weights, all in one scale block, at once.
KERNEL matmul_fp8(float *out, const float *x, const u8 *q, const float *scale, int m, int n, int k, int vec) {
  int lane = threadIdx.x & 31;
  i64 j = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (j >= n) return;
  const u8 *wr = q + j * k;
  const float *sr = scale + (j / FP8_BLOCK) * ((k + FP8_BLOCK - 1) / FP8_BLOCK);
  for (int r0 = blockIdx.y * FP8_MR; r0 < m; r0 += gridDim.y * FP8_MR) {
    float acc[FP8_MR];
#pragma unroll
    for (int i = 0; i < FP8_MR; i++) acc[i] = 0;
    if (vec) {
#pragma unroll 2
      for (int c = lane * 16; c < k; c += 512) {
        struct __attribute__((aligned(16))) { u32 a[4]; } raw = *(const decltype(raw) *)(wr + c);
        float s = sr[c / FP8_BLOCK], wv[16];
#pragma unroll
        for (int e = 0; e < 16; e++) wv[e] = e4m3((raw.a[e / 4] >> (8 * (e % 4))) & 0xff) * s;
#pragma unroll
        for (int i = 0; i < FP8_MR; i++) {
          if (r0 + i >= m) break;
          const float *xr = x + (i64)(r0 + i) * k + c;
#pragma unroll
          for (int e = 0; e < 16; e++) acc[i] = fmaf_(xr[e], wv[e], acc[i]);
        }
      }
    } else {
      for (int c = lane; c < k; c += 32) {
        float wv = e4m3(wr[c]) * sr[c / FP8_BLOCK];
#pragma unroll
        for (int i = 0; i < FP8_MR; i++) {
          if (r0 + i >= m) break;
          acc[i] = fmaf_(x[(i64)(r0 + i) * k + c], wv, acc[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < FP8_MR; i++) {
      if (r0 + i >= m) break;  // uniform across the warp
      float s = warp_sum(acc[i]);
      if (lane == 0) out[(i64)(r0 + i) * n + j] = s;
    }
  }
}

#define FP8_TILE 32  // x rows and weight rows per block of the tiled kernel
#define FP8_TK 32    // k elements per shared-memory step

// matmul_fp8_tiled: the verify and prefill path (many x rows). A block of
// 256 threads computes a 32×32 tile of out, each thread 2×2 outputs; per
// step it widens a 32×32 weight tile once into shared memory, where every
// x row of the tile reads it.
KERNEL LAUNCH_BOUNDS(256) matmul_fp8_tiled(float *out, const float *x, const u8 *q, const float *scale, int m, int n, int k) {
  __shared__ float xs[FP8_TILE][FP8_TK + 1], ws[FP8_TILE][FP8_TK + 1];
  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  i64 row0 = (i64)blockIdx.y * FP8_TILE, col0 = (i64)blockIdx.x * FP8_TILE;
  int blocks = (k + FP8_BLOCK - 1) / FP8_BLOCK;
  float acc[2][2] = {{0, 0}, {0, 0}};
  for (int k0 = 0; k0 < k; k0 += FP8_TK) {
    for (int t = threadIdx.x; t < FP8_TILE * FP8_TK; t += 256) {
      int r = t / FP8_TK, c = t % FP8_TK, gc = k0 + c;
      i64 xr = row0 + r, wr = col0 + r;
      xs[r][c] = (xr < m && gc < k) ? x[xr * k + gc] : 0.0f;
      ws[r][c] = (wr < n && gc < k) ? e4m3(q[wr * k + gc]) * scale[(wr / FP8_BLOCK) * blocks + gc / FP8_BLOCK] : 0.0f;
    }
    sync_threads();
#pragma unroll 8
    for (int c = 0; c < FP8_TK; c++) {
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int jj = 0; jj < 2; jj++) acc[i][jj] = fmaf_(xs[ty + 16 * i][c], ws[tx + 16 * jj][c], acc[i][jj]);
    }
    sync_threads();
  }
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int jj = 0; jj < 2; jj++) {
      i64 r = row0 + ty + 16 * i, c = col0 + tx + 16 * jj;
      if (r < m && c < n) out[r * n + c] = acc[i][jj];
    }
}
