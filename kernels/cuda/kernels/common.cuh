// Shared definitions for the ddflash CUDA kernels.
//
// The kernels build with clang alone (no CUDA toolkit, no libdevice): see
// ../gen.sh. So this header declares the few CUDA keywords the kernels use,
// takes threadIdx/blockIdx from clang's builtin header, and implements the
// math (exp, log, sincos) and the bf16/f16 conversions itself, accurate to
// about one float32 rounding so that results match the CPU reference.
#pragma once

#ifdef DDFLASH_EMU
#include "../emu/emu.h"  // the CPU emulation used by the tests (../emu/driver.cc)
#else
#include "__clang_cuda_builtin_vars.h"

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
// DYNAMIC_SHARED declares the block's dynamic shared memory (the launch's smem bytes).
#define DYNAMIC_SHARED(type, name) extern __shared__ type name[]
// LAUNCH_BOUNDS(n) promises blocks of at most n threads, so that the
// compiler keeps registers within what n threads may use.
#define LAUNCH_BOUNDS(n) __attribute__((launch_bounds(n)))
#endif

#define KERNEL extern "C" __global__ void
#define INLINE static __device__ __attribute__((always_inline)) inline

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

INLINE void sync_threads() { __nvvm_bar_sync(0); }
// sync_warp waits for the warp's lanes and orders their shared-memory accesses.
INLINE void sync_warp() { __nvvm_bar_warp_sync(0xffffffffu); }

// trap aborts the kernel: the CUDA analogue of the CPU backend's panics on
// out-of-range indices. The context then reports an error at the next Sync.
INLINE void trap() { __builtin_trap(); }

INLINE float f32_from_bits(u32 b) { return __builtin_bit_cast(float, b); }
INLINE u32 bits_from_f32(float f) { return __builtin_bit_cast(u32, f); }

// Weight element types. Each converts exactly to float.
struct bf16 { u16 bits; };
struct f16 { u16 bits; };

INLINE float to_f32(float v) { return v; }
INLINE float to_f32(bf16 v) { return f32_from_bits((u32)v.bits << 16); }
INLINE float to_f32(f16 v) {
  u32 sign = (u32)(v.bits & 0x8000) << 16, exp = (v.bits >> 10) & 0x1f, man = v.bits & 0x3ff;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000 | (man << 13));  // inf, nan
  if (exp == 0) return (sign ? -1.0f : 1.0f) * (float)man * 5.9604644775390625e-8f;  // man·2^-24
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

// to_bf16_rne rounds to the nearest bf16, ties to even (nan stays nan).
INLINE u16 to_bf16_rne(float f) {
  u32 b = bits_from_f32(f);
  if ((b & 0x7fffffff) > 0x7f800000) return (u16)((b >> 16) | 0x40);
  return (u16)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

#define MAX_HEAD_DIM 256  // attention's head dim limit (maxHeadDim in attention.go)

// store_cache rounds a value to a KV cache's type (BF16: to nearest even).
INLINE void store_cache(float *dst, float v) { *dst = v; }
INLINE void store_cache(bf16 *dst, float v) { dst->bits = to_bf16_rne(v); }

// Defines KERNEL name##_f32, name##_bf16 and name##_f16 from one template
// whose template parameter is the weight type; args may name it as W.
#define WEIGHT_KERNELS(name, params, args)                             \
  KERNEL name##_f32 params { typedef float W; name<W> args; }          \
  KERNEL name##_bf16 params { typedef bf16 W; name<W> args; }          \
  KERNEL name##_f16 params { typedef f16 W; name<W> args; }

// ---- Math (no libdevice) ----

INLINE float fmaf_(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
INLINE double fma_(double a, double b, double c) { return __builtin_fma(a, b, c); }
INLINE float rintf_(float x) { return __nvvm_round_f(x); }  // round half away; fine for range reduction
INLINE double rint_(double x) { return __nvvm_round_d(x); }
INLINE float sqrtf_(float x) { return __nvvm_sqrt_rn_f(x); }
INLINE double sqrt_(double x) { return __nvvm_sqrt_rn_d(x); }
INLINE float fabsf_(float x) { return __nvvm_fabs_f(x); }

#include "math.cuh"

// ---- Reductions ----

INLINE float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 31);
  return v;
}

INLINE float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __builtin_fmaxf(v, __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 31));
  return v;
}

INLINE double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) {
    u64 b = __builtin_bit_cast(u64, v);
    u32 lo = __nvvm_shfl_sync_bfly_i32(0xffffffffu, (int)(u32)b, o, 31);
    u32 hi = __nvvm_shfl_sync_bfly_i32(0xffffffffu, (int)(u32)(b >> 32), o, 31);
    v += __builtin_bit_cast(double, ((u64)hi << 32) | lo);
  }
  return v;
}

// block_sum_d returns the sum of v over the block (blockDim.x a multiple of
// 32, at most 1024) to every thread. scratch holds 32 doubles.
INLINE double block_sum_d(double v, double *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_d(v);
  sync_threads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  sync_threads();
  v = lane < warps ? scratch[lane] : 0.0;
  return warp_sum_d(v);
}

// inv_rms returns rsqrt(Σx²/dim + eps) of row x (rsqrt(Σx² + eps)
// without mean), to every thread, the sum of squares in double.
INLINE float inv_rms(const float *x, int dim, float eps, bool mean) {
  __shared__ double scratch[32];
  double ss = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)x[i] * x[i];
  ss = block_sum_d(ss, scratch);
  return (float)(1.0 / sqrt_((mean ? ss / dim : ss) + (double)eps));
}

INLINE float block_max(float v, float *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  sync_threads();
  if (lane == 0) scratch[warp] = v;
  sync_threads();
  v = lane < warps ? scratch[lane] : -__builtin_inff();
  return warp_max(v);
}

// slot_state is a sequence's state: state itself, or with slot_at set the
// slot_at[0]-th of slots states of the given bytes one after another, read
// at run time, so that a recorded step serves sequences in any slots.
INLINE char *slot_state(const void *state, const int *slot_at, int slots, i64 bytes) {
  if (!slot_at) return (char *)state;
  int slot = *slot_at;
  if (slot < 0 || slot >= slots) trap();
  return (char *)state + slot * bytes;
}

// Grid-stride loop over [0, n).
#define GRID_LOOP(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)(n); i += (i64)gridDim.x * blockDim.x)

// gdn_gate turns a GDN layer's in_proj_a and in_proj_b outputs for value
// head h into its gates, in place: a = -exp(a_log)·softplus(a + dt_bias)
// in double, b = sigmoid(b).
template <typename W>
INLINE void gdn_gate(float *a, float *b, const W *a_log, const W *dt_bias, int h) {
  double x = (double)(*a + to_f32(dt_bias[h]));
  double sp = x > 20 ? x : log1p_(exp_(x));  // torch's softplus threshold
  *a = (float)(-exp_((double)to_f32(a_log[h])) * sp);
  *b = sigmoidf_(*b);
}
