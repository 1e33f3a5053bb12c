// Host emulation of the CUDA features the kernels use, for compiling them
// as C++ into a stand-in libcuda (driver.cc). Every thread of a block is a
// fiber; blocks run one after another, so `static` serves as __shared__.
#pragma once

#include <cmath>

struct emu_dim3 {
  unsigned x, y, z;
};
extern emu_dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
extern void *emu_dynamic_shared;

#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

#define __global__
#define __device__
#define __shared__ static
#define DYNAMIC_SHARED(type, name) type *name = (type *)emu_dynamic_shared
#define LAUNCH_BOUNDS(n)

void emu_barrier();
void emu_warp_barrier();
float emu_shfl_f32(float v, int lane_mask);
int emu_shfl_i32(int v, int lane_mask);

inline void __nvvm_bar_sync(int) { emu_barrier(); }
inline void __nvvm_bar_warp_sync(unsigned) { emu_warp_barrier(); }
inline float __nvvm_shfl_sync_bfly_f32(unsigned, float v, int o, int) { return emu_shfl_f32(v, o); }
inline int __nvvm_shfl_sync_bfly_i32(unsigned, int v, int o, int) { return emu_shfl_i32(v, o); }
inline float __nvvm_round_f(float x) { return std::round(x); }
inline double __nvvm_round_d(double x) { return std::round(x); }
inline float __nvvm_sqrt_rn_f(float x) { return std::sqrt(x); }
inline double __nvvm_sqrt_rn_d(double x) { return std::sqrt(x); }
inline float __nvvm_fabs_f(float x) { return std::fabs(x); }
