// MatMul out[m,n] = x[m,k]·w[n,k]ᵀ on FP8 block-scaled weights: q holds
// E4M3 bytes [n,k], scale one float per 128×128 block [ceil(n/128),
// ceil(k/128)], and w = e4m3(q)·scale. Each weight is widened and scaled in
// registers (rounded to float32, as a dequantised copy would hold it); no
// dequantised copy is made.
#include "common.cuh"
#include "mma.cuh"

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

// e4m3x2 decodes the two E4M3 bytes in the low 16 bits of b (the low byte
// into lo). On sm_89 and newer the hardware converts them to two halves,
// exactly (NaN bytes give NaN there, which quantised weights never hold);
// elsewhere, and in the CPU emulation, e4m3 does, to the same values.
INLINE void e4m3x2(u32 b, float &lo, float &hi) {
#if !defined(DDFLASH_EMU) && __CUDA_ARCH__ >= 890
  u32 h2;
  u16 lo_h, hi_h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)b));
  asm("mov.b32 {%0, %1}, %2;" : "=h"(lo_h), "=h"(hi_h) : "r"(h2));
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(lo_h));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(hi_h));
#else
  lo = e4m3(b & 0xff), hi = e4m3((b >> 8) & 0xff);
#endif
}

// fp8_step16 adds the products of 16 weights of row wr at c (16-byte
// aligned, in one scale block) with x rows r0.. to acc.
INLINE void fp8_step16(float (&acc)[FP8_MR], const float *x, const u8 *wr, const float *sr, int r0, int m, int k, int c) {
  struct __attribute__((aligned(16))) { u32 a[4]; } raw = *(const decltype(raw) *)(wr + c);
  float s = sr[c / FP8_BLOCK], wv[16];
#pragma unroll
  for (int e = 0; e < 16; e += 2) {
    e4m3x2(raw.a[e / 4] >> (8 * (e % 4)), wv[e], wv[e + 1]);
    wv[e] *= s, wv[e + 1] *= s;
  }
#pragma unroll
  for (int i = 0; i < FP8_MR; i++) {
    if (r0 + i >= m) break;
    const float *xr = x + (i64)(r0 + i) * k + c;
#pragma unroll
    for (int e = 0; e < 16; e++) acc[i] = fmaf_(xr[e], wv[e], acc[i]);
  }
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
      // Two steps per iteration keep more loads in flight (written out:
      // the sm_89 conversion is convergent, which stops the compiler from
      // unrolling the loop itself).
      int c = lane * 16;
      for (; c + 512 < k; c += 1024) fp8_step16(acc, x, wr, sr, r0, m, k, c), fp8_step16(acc, x, wr, sr, r0, m, k, c + 512);
      if (c < k) fp8_step16(acc, x, wr, sr, r0, m, k, c);
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

#define FP8_MMA_ROWS 64  // x rows per block of the tensor-core kernel (4 tiles of 16)
#define FP8_MMA_COLS 64  // weight rows per block: 16 per warp
#define FP8_MMA_K 64     // k per shared-memory step: half a scale block
#define FP8_MMA_LD (FP8_MMA_K + 8)  // staged row stride (bf16): rows 16 bytes apart in the banks
#define FP8_MAX_TERMS 3

// matmul_fp8_mma: the verify and prefill path (more than 8 x rows), on
// bf16 tensor cores (mma.cuh). A block of 4 warps computes 64 x rows ×
// 64 weight rows, each warp 16 weight rows. Per 64-wide k step it stages
// the x rows split into `terms` bf16 numbers (split_bf16's terms: products
// with them are exact, their residual below 2^(-9·terms)·|x|) and the
// weight rows widened from E4M3 to bf16 (exact: E4M3 has 3 mantissa bits),
// once for every warp. The products of each 128-wide scale block
// accumulate in F32 on their own; the block's scale then multiplies that
// sum into the output's accumulator, as a dequantised weight would scale
// each product (the same to F32 rounding).
KERNEL LAUNCH_BOUNDS(128) matmul_fp8_mma(float *out, const float *x, const u8 *q, const float *scale, int m, int n,
                                         int k, int terms) {
  __shared__ __attribute__((aligned(32))) u16 xs[FP8_MAX_TERMS][FP8_MMA_ROWS][FP8_MMA_LD];
  __shared__ __attribute__((aligned(32))) u16 ws[FP8_MMA_COLS][FP8_MMA_LD];
  __shared__ __attribute__((aligned(32))) float tile[4][16][16];  // each warp's output tile, for the edges
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  i64 row0 = (i64)blockIdx.y * FP8_MMA_ROWS, col0 = (i64)blockIdx.x * FP8_MMA_COLS, wcol = col0 + 16 * warp;
  int tiles = (int)((m - row0 + 15) / 16);
  if (tiles > FP8_MMA_ROWS / 16) tiles = FP8_MMA_ROWS / 16;
  bool cols = wcol < n;  // uniform across the warp
  const float *srow = scale + (wcol / FP8_BLOCK) * ((k + FP8_BLOCK - 1) / FP8_BLOCK);
  // Loops over tiles and terms run to their constant bounds (unrolled),
  // so that the accumulators stay in registers.
  MmaC acc[FP8_MMA_ROWS / 16], part[FP8_MMA_ROWS / 16];
#pragma unroll
  for (int t = 0; t < FP8_MMA_ROWS / 16; t++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[t].x[e] = part[t].x[e] = 0.0f;
  for (int k0 = 0; k0 < k; k0 += FP8_MMA_K) {
    for (int e = threadIdx.x; e < FP8_MMA_ROWS * FP8_MMA_K; e += blockDim.x) {
      int r = e / FP8_MMA_K, c = e % FP8_MMA_K;
      i64 xr = row0 + r, wr = col0 + r, kc = k0 + c;
      float v = xr < m && kc < k ? x[xr * k + kc] : 0.0f;
      for (int t = 0; t < terms; t++) {
        u16 h = to_bf16_rne(v);
        xs[t][r][c] = h;
        v -= f32_from_bits((u32)h << 16);
      }
      ws[r][c] = wr < n && kc < k ? (u16)(bits_from_f32(e4m3(q[wr * k + kc])) >> 16) : 0;
    }
    sync_threads();
    if (cols) {
      for (int kk = 0; kk < FP8_MMA_K; kk += 16) {
        MmaB b;
        mma_load_b(b, &ws[16 * warp][kk], FP8_MMA_LD);
#pragma unroll
        for (int t = 0; t < FP8_MMA_ROWS / 16; t++)
#pragma unroll
          for (int term = 0; term < FP8_MAX_TERMS; term++)
            if (t < tiles && term < terms) {
              MmaA a;
              mma_load_a(a, &xs[term][16 * t][kk], FP8_MMA_LD);
              mma_sync(part[t], a, b);
            }
      }
      // The end of a scale block (or of k): scale its sums into acc.
      if ((k0 + FP8_MMA_K) % FP8_BLOCK == 0 || k0 + FP8_MMA_K >= k) {
        float s = srow[k0 / FP8_BLOCK];
#pragma unroll
        for (int t = 0; t < FP8_MMA_ROWS / 16; t++)
#pragma unroll
          for (int e = 0; e < 8; e++) acc[t].x[e] = fmaf_(s, part[t].x[e], acc[t].x[e]), part[t].x[e] = 0.0f;
      }
    }
    sync_threads();  // the next step overwrites xs and ws
  }
  if (!cols) return;
#pragma unroll
  for (int t = 0; t < FP8_MMA_ROWS / 16; t++) {
    if (t >= tiles) continue;  // uniform across the warp
    mma_store(&tile[warp][0][0], acc[t], 16);
    sync_warp();
    for (int e = lane; e < 256; e += 32) {
      i64 r = row0 + 16 * t + e / 16, c = wcol + e % 16;
      if (r < m && c < n) out[r * n + c] = tile[warp][e / 16][e % 16];
    }
    sync_warp();  // the next tile overwrites this one
  }
}
