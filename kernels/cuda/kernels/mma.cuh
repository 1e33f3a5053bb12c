// Tensor-core matrix multiply-accumulate on bf16 operands with F32
// accumulation, 16×16×16 tiles per warp (the WMMA instructions, sm_80+):
// D = C + A·B with A [16 m][16 k] row-major, B [16 k][16 n] read from
// [16 n][16 k] rows (column-major: MmaB) or from its own [16 k][16 n] rows
// (row-major: MmaBRow), C and D F32. Every lane of the warp
// calls each function (they are warp-collective); fragments are opaque.
//
// The CPU emulation runs them exactly as defined here: each product of two
// bf16 numbers is exact in F32, and each output element sums its 16
// products into C in ascending k order, one F32 rounding per addition.
// (Tensor cores round their sums in an order of their own, so a GPU's
// result may differ by a few F32 roundings.)
#pragma once
#include "common.cuh"

#ifdef DDFLASH_EMU
// Lane l holds elements l, l+32, ... of the row-major 16×16 accumulator:
// column l % 16 of rows 2i + l / 16, i = 0..7. Its operand fragments hold
// what those need: the 8 rows of A and column l % 16 of B.
struct MmaA { u16 v[8][16]; };
struct MmaB { u16 v[16]; };
struct MmaC { float x[8]; };

INLINE int mma_row(int i) { return 2 * i + (int)(threadIdx.x & 31) / 16; }
INLINE int mma_col() { return threadIdx.x & 15; }
INLINE void mma_load_a(MmaA &a, const u16 *p, int ldm) {
  for (int i = 0; i < 8; i++)
    for (int kk = 0; kk < 16; kk++) a.v[i][kk] = p[mma_row(i) * ldm + kk];
}
INLINE void mma_load_b(MmaB &b, const u16 *p, int ldm) {
  for (int kk = 0; kk < 16; kk++) b.v[kk] = p[mma_col() * ldm + kk];
}
struct MmaBRow : MmaB {};  // the same column, read from row-major B
INLINE void mma_load_b_row(MmaBRow &b, const u16 *p, int ldm) {
  for (int kk = 0; kk < 16; kk++) b.v[kk] = p[kk * ldm + mma_col()];
}
INLINE void mma_sync(MmaC &d, const MmaA &a, const MmaB &b) {
  for (int i = 0; i < 8; i++) {
    float s = d.x[i];
    for (int kk = 0; kk < 16; kk++) s = fmaf_(to_f32(bf16{a.v[i][kk]}), to_f32(bf16{b.v[kk]}), s);
    d.x[i] = s;
  }
}
INLINE void mma_store(float *p, const MmaC &d, int ldm) {
  for (int i = 0; i < 8; i++) p[mma_row(i) * ldm + mma_col()] = d.x[i];
}
#else
struct MmaA { int r[4]; };
struct MmaB { int r[4]; };
struct MmaBRow { int r[4]; };
struct MmaC { float x[8]; };

// Layout codes of the builtins: 0 row-major, 1 column-major; the mma's 1
// is A row-major, B column-major.
INLINE void mma_load_a(MmaA &a, const u16 *p, int ldm) { __mma_bf16_m16n16k16_ld_a(a.r, (const int *)p, ldm, 0); }
INLINE void mma_load_b(MmaB &b, const u16 *p, int ldm) { __mma_bf16_m16n16k16_ld_b(b.r, (const int *)p, ldm, 1); }
INLINE void mma_load_b_row(MmaBRow &b, const u16 *p, int ldm) { __mma_bf16_m16n16k16_ld_b(b.r, (const int *)p, ldm, 0); }
INLINE void mma_sync(MmaC &d, const MmaA &a, const MmaB &b) { __mma_bf16_m16n16k16_mma_f32(d.x, a.r, b.r, d.x, 1, 0); }
// The mma's 0: A and B row-major.
INLINE void mma_sync(MmaC &d, const MmaA &a, const MmaBRow &b) { __mma_bf16_m16n16k16_mma_f32(d.x, a.r, b.r, d.x, 0, 0); }
INLINE void mma_store(float *p, MmaC d, int ldm) { __hmma_m16n16k16_st_c_f32(p, d.x, ldm, 0); }
#endif
