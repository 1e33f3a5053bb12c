// A stand-in libcuda.so.1 that runs the kernels on the CPU, so that the
// tests can drive the real backend (kernels/cuda) through the whole
// kernels.Backend conformance suite without a GPU: package emulator builds it
// with the kernels compiled as C++ and points DDFLASH_LIBCUDA at it.
//
// Memory is host memory, every call is synchronous, and a launch runs its
// blocks one after another, each block's threads as fibers that switch at
// barriers and warp shuffles (a hand-written x86-64 context switch: ucontext
// makes a system call per switch, which made the tests slow). Stream
// capture records launches (and cuBLASLt matmuls), with copies of their
// arguments, for graph replay; counters total the calls (EmuCounts).
// There are emu_devices devices, each backend's its own stream; launches
// from several threads (tensor-parallel ranks) take turns, as the fibers
// and the kernels' `static` shared memory are global. The NCCL calls the
// backend makes run over those devices' ranks (the end of this file).
#if !defined(__x86_64__)
#error "the CPU emulation's fibers switch with x86-64 code"
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../kernels/attention.cu"
#include "../kernels/conv.cu"
#include "../kernels/elementwise.cu"
#include "../kernels/gdn.cu"
#include "../kernels/matmul.cu"
#include "../kernels/matmul_fp8.cu"
#include "../kernels/norms.cu"
#include "../kernels/rope.cu"
#include "../kernels/sampling.cu"

emu_dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
void *emu_dynamic_shared;

// ---- Kernel table: K(name) lines, one per PTX entry, from table.inc (written by the test). ----

// EmuKernel binds a kernel to copies of the arguments cuLaunchKernel
// points at: a call that any thread of any block may make, now or later.
struct EmuKernel {
  const char *name;
  std::function<void()> (*bind)(void **args);
};

template <typename T>
struct Binder;
template <typename... A>
struct Binder<void (*)(A...)> {
  template <void (*F)(A...), size_t... I>
  static std::function<void()> copy(void **args, std::index_sequence<I...>) {
    auto values = std::make_tuple(*static_cast<std::remove_reference_t<A> *>(args[I])...);
    return [values] { std::apply(F, values); };
  }
  template <void (*F)(A...)>
  static std::function<void()> bind(void **args) {
    return copy<F>(args, std::index_sequence_for<A...>{});
  }
};
#define K(n) {#n, &Binder<decltype(&n)>::bind<&n>},
static const EmuKernel kernel_table[] = {
#include "table.inc"
};

// ---- Fibers ----

// emu_switch saves the callee-saved registers and the stack pointer to
// *save, then resumes the context whose stack pointer is next.
extern "C" void emu_switch(void **save, void *next);
asm(R"(
.text
.globl emu_switch
.type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
)");

struct Barrier {
  int live, arrived;
  unsigned gen;
};

struct Fiber {
  void *sp;
  emu_dim3 tid;
  bool done;
  const Barrier *wait_on;  // the barrier it waits at, until its generation passes wait_gen
  unsigned wait_gen;
};

static const size_t fiber_stack = 64 << 10;
static std::vector<Fiber> fibers;
static std::vector<char *> stacks;
static std::vector<Barrier> warp_bars;
static Barrier block_bar;
static void *sched_sp;
static int current, n_threads;
static const char *cur_name;               // the running kernel
static const std::function<void()> *cur_call;  // and its bound arguments
// ShuffleSlots hold each thread's value for a warp shuffle and the warp
// barrier generation it was written at, by that generation's parity.
template <typename T>
struct ShuffleSlots {
  T value[2][1024];
  unsigned gen[2][1024];
};
static ShuffleSlots<float> shfl_f;
static ShuffleSlots<int> shfl_i;

static void yield() { emu_switch(&fibers[current].sp, sched_sp); }

static void release(Barrier &b) {
  b.arrived = 0;
  b.gen++;
}

// arrive waits at b; the scheduler resumes the fiber once b releases.
static void arrive(Barrier &b) {
  if (++b.arrived == b.live) {
    release(b);
    return;
  }
  Fiber &f = fibers[current];
  f.wait_on = &b;
  f.wait_gen = b.gen;
  yield();
  f.wait_on = nullptr;
}

static void drop(Barrier &b) {
  b.live--;
  if (b.live > 0 && b.arrived == b.live) release(b);
}

void emu_barrier() { arrive(block_bar); }
void emu_warp_barrier() { arrive(warp_bars[current / 32]); }

// shfl waits once per shuffle: each lane writes its value at the parity
// of the warp barrier's generation, arrives, and reads its partner's. No
// lane writes that parity again before every lane has read it, since that
// takes passing the next shuffle's barrier. A partner that has exited (or
// lies outside the block) wrote nothing at this generation: the lane keeps
// its own value.
template <typename T>
static T shfl(ShuffleSlots<T> &slots, T v, int lane_mask) {
  int t = current, p = t ^ lane_mask;
  Barrier &warp = warp_bars[t / 32];
  unsigned gen = warp.gen, parity = gen & 1;
  slots.value[parity][t] = v;
  slots.gen[parity][t] = gen;
  arrive(warp);
  return p < n_threads && slots.gen[parity][p] == gen ? slots.value[parity][p] : v;
}
float emu_shfl_f32(float v, int lane_mask) { return shfl(shfl_f, v, lane_mask); }
int emu_shfl_i32(int v, int lane_mask) { return shfl(shfl_i, v, lane_mask); }

// fiber_main is where a new fiber's first switch returns to; it never
// returns itself: a finished fiber switches back to the scheduler for good.
static void fiber_main() {
  int i = current;
  (*cur_call)();
  fibers[i].done = true;
  drop(block_bar);
  drop(warp_bars[i / 32]);
  yield();
  abort();  // not reached: the scheduler never resumes a finished fiber
}

static void run_block() {
  for (int i = 0; i < n_threads; i++) {
    Fiber &f = fibers[i];
    f.done = false;
    f.wait_on = nullptr;
    f.tid = {(unsigned)i % emu_blockDim.x, (unsigned)i / emu_blockDim.x % emu_blockDim.y,
             (unsigned)i / (emu_blockDim.x * emu_blockDim.y)};
    // The stack as emu_switch leaves it: six saved registers, then the
    // return address at a 16-byte boundary, so fiber_main starts with the
    // stack aligned as after a call.
    void **top = (void **)(((uintptr_t)stacks[i] + fiber_stack) & ~(uintptr_t)15) - 2;
    top[0] = (void *)fiber_main;
    f.sp = top - 6;
    memset(f.sp, 0, 6 * sizeof(void *));
  }
  for (unsigned *stamps : {shfl_f.gen[0], shfl_f.gen[1], shfl_i.gen[0], shfl_i.gen[1]})
    memset(stamps, 0xff, n_threads * sizeof *stamps);  // no generation: nothing from an earlier block
  block_bar = {n_threads, 0, 0};
  warp_bars.assign((n_threads + 31) / 32, Barrier{});
  for (int w = 0; w * 32 < n_threads; w++) warp_bars[w].live = n_threads - 32 * w < 32 ? n_threads - 32 * w : 32;
  // Passes alternate between ascending and descending thread order, so that
  // a read of shared memory that lacks a barrier after the write it needs
  // sees stale data in one order or the other.
  for (bool down = false;; down = !down) {
    bool live = false, ran = false;
    for (int n = 0; n < n_threads; n++) {
      int i = down ? n_threads - 1 - n : n;
      Fiber &f = fibers[i];
      if (f.done) continue;
      live = true;
      if (f.wait_on && f.wait_on->gen == f.wait_gen) continue;  // still waiting
      ran = true;
      current = i;
      emu_threadIdx = f.tid;
      emu_switch(&sched_sp, f.sp);
    }
    if (!live) return;
    if (!ran) {
      fprintf(stderr, "emulated %s: deadlock (threads wait at barriers that never fill)\n", cur_name);
      abort();
    }
  }
}

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_NOT_FOUND = 500, ERR_NOT_SUPPORTED = 801, ERR_CAPTURE = 900 };

#define API extern "C" __attribute__((visibility("default"))) CUresult

// ---- Launches and graphs ----

// Launch is a kernel launch with its arguments bound, or (host set) a
// library call that runs on the host: an emulated cuBLASLt matmul.
struct Launch {
  const char *name;
  std::function<void()> call;
  emu_dim3 grid, block;
  unsigned smem;
  bool host;
};
typedef std::vector<Launch> Graph;
static Graph *capture;         // non-null while capture_stream is being captured
static void *capture_stream;
// emu_mu serialises launches (the fibers and the kernels' shared memory are
// global) and guards capture.
static std::mutex emu_mu;
static bool captured(void *stream) { return capture && stream == capture_stream; }

// ---- Counters: the work the backend asks of the driver, for the tests of a step's cost ----

// EmuCounts mirrors emuCounts in kernels/cuda/counts.go. A graph launch
// counts once, however many launches it replays; a download is a
// synchronising one (the backend waits for the stream after each).
struct EmuCounts {
  uint64_t launches, graph_launches, lt_matmuls, allocs, uploads, upload_bytes, downloads, download_bytes;
};
static EmuCounts counts;  // guarded by emu_mu

extern "C" __attribute__((visibility("default"))) void ddflash_emu_counts(EmuCounts *c) {
  std::lock_guard<std::mutex> lock(emu_mu);
  *c = counts;
}

static CUresult run(const Launch &l) {
  if (l.host) {
    l.call();
    return OK;
  }
  n_threads = (int)(l.block.x * l.block.y * l.block.z);
  if (n_threads < 1 || n_threads > 1024) return ERR_INVALID_VALUE;
  // A real GPU's grid limits, so that shapes as large as Qwen3.6-27B's (a
  // 248,320-row LM head) cannot pass here and fail on the device.
  if (l.grid.x < 1 || l.grid.x > 2147483647u || l.grid.y < 1 || l.grid.y > 65535 || l.grid.z < 1 || l.grid.z > 65535)
    return ERR_INVALID_VALUE;
  while ((int)fibers.size() < n_threads) {
    fibers.emplace_back();
    stacks.push_back((char *)malloc(fiber_stack));
  }
  std::vector<unsigned char> shared(l.smem, 0xff);  // NaN-filled: unwritten reads show
  emu_dynamic_shared = shared.data();
  cur_name = l.name;
  cur_call = &l.call;
  emu_blockDim = l.block;
  emu_gridDim = l.grid;
  for (unsigned z = 0; z < l.grid.z; z++)
    for (unsigned y = 0; y < l.grid.y; y++)
      for (unsigned x = 0; x < l.grid.x; x++) {
        emu_blockIdx = {x, y, z};
        run_block();
      }
  return OK;
}

// ---- Driver API ----


API cuInit(unsigned) { return OK; }
API cuGetErrorName(CUresult r, const char **s) {
  *s = r == ERR_CAPTURE       ? "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
       : r == ERR_NOT_FOUND   ? "CUDA_ERROR_NOT_FOUND"
       : r == ERR_NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED"
                              : "CUDA_ERROR_INVALID_VALUE";
  return OK;
}
API cuGetErrorString(CUresult r, const char **s) {
  *s = r == ERR_CAPTURE ? "not allowed while the stream is captured" : "invalid value";
  return OK;
}
static const int emu_devices = 8;  // enough for tensor parallelism 2, 4 and 8
API cuDeviceGet(int *dev, int ordinal) {
  *dev = ordinal;
  return ordinal >= 0 && ordinal < emu_devices ? OK : ERR_INVALID_VALUE;
}
// The GPU the emulation imitates: DDFLASH_EMU_GPU names one of these, so
// that decisions made from the device's attributes (attention's key
// splits from the SM count) run as they would there. By default a GPU of
// 4 SMs, which keeps grid-stride loops looping.
struct EmuGPU {
  const char *name;
  int sms, cc_major, cc_minor;
};
static const EmuGPU emu_gpus[] = {
    {"CPU emulation", 4, 9, 0},
    {"NVIDIA H200", 132, 9, 0},
    {"NVIDIA RTX PRO 6000 Blackwell Server Edition", 188, 12, 0},
};
static const EmuGPU &emu_gpu() {
  const char *want = getenv("DDFLASH_EMU_GPU");
  if (want && *want)
    for (const EmuGPU &g : emu_gpus)
      if (strstr(g.name, want)) return g;
  return emu_gpus[0];
}
API cuDeviceGetAttribute(int *v, int attr, int) {
  switch (attr) {
    case 16: *v = emu_gpu().sms; return OK;  // multiprocessors
    case 39: *v = 2048; return OK;  // threads per multiprocessor, as sm_80 and sm_90
    case 75: *v = emu_gpu().cc_major; return OK;
    case 76: *v = emu_gpu().cc_minor; return OK;
  }
  return ERR_INVALID_VALUE;
}
API cuDeviceGetName(char *name, int len, int) {
  snprintf(name, len, "%s", emu_gpu().name);
  return OK;
}
static int ctx_token;
API cuDevicePrimaryCtxRetain(void **ctx, int) {
  *ctx = &ctx_token;
  return OK;
}
API cuDevicePrimaryCtxRelease_v2(int) { return OK; }
API cuCtxSetCurrent(void *) { return OK; }
API cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(emu_mu);
    counts.allocs++;
  }
  void *m = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
  if (!m) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  memset(m, 0xa5, bytes);  // garbage, as on a GPU
  *p = (CUdeviceptr)m;
  return OK;
}
API cuMemFree_v2(CUdeviceptr p) {
  free((void *)p);
  return OK;
}
API cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void *s) {
  std::lock_guard<std::mutex> lock(emu_mu);
  if (captured(s)) return ERR_CAPTURE;  // only kernels are captured here
  memset((void *)p, v, n);
  return OK;
}
API cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *stream) {
  std::lock_guard<std::mutex> lock(emu_mu);
  if (captured(stream)) return ERR_CAPTURE;  // only kernels are captured here
  counts.uploads++;
  counts.upload_bytes += n;
  memcpy((void *)d, s, n);
  return OK;
}
API cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *stream) {
  std::lock_guard<std::mutex> lock(emu_mu);
  if (captured(stream)) return ERR_CAPTURE;  // only kernels are captured here
  counts.downloads++;
  counts.download_bytes += n;
  memcpy(d, (const void *)s, n);
  return OK;
}
struct Stream {};
API cuStreamCreate(Stream **s, unsigned) {
  *s = new Stream;
  return OK;
}
API cuStreamDestroy_v2(Stream *s) {
  delete s;
  return OK;
}
API cuStreamSynchronize(void *s) {
  std::lock_guard<std::mutex> lock(emu_mu);
  return captured(s) ? ERR_CAPTURE : OK;
}
static int module_token;
API cuModuleLoadDataEx(void **m, const void *, unsigned, int *, void **) {
  *m = &module_token;
  return OK;
}
API cuModuleGetFunction(const EmuKernel **f, void *, const char *name) {
  for (const EmuKernel &k : kernel_table)
    if (!strcmp(k.name, name)) {
      *f = &k;
      return OK;
    }
  return ERR_NOT_FOUND;
}
// Kernel resources: plausible figures (the emulation has no registers or
// occupancy), so that the report's host code runs in the tests.
API cuFuncGetAttribute(int *v, int attr, const EmuKernel *) {
  switch (attr) {
    case 0: *v = 1024; return OK;  // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    case 1: *v = 0; return OK;     // SHARED_SIZE_BYTES (static)
    case 3: *v = 0; return OK;     // LOCAL_SIZE_BYTES
    case 4: *v = 32; return OK;    // NUM_REGS
  }
  return ERR_INVALID_VALUE;
}
// As on sm_90 at 32 registers a thread: 2048 threads and 32 blocks per SM.
API cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const EmuKernel *, int block, size_t) {
  if (block <= 0 || block > 1024) return ERR_INVALID_VALUE;
  *blocks = std::min(2048 / block, 32);
  return OK;
}
API cuLaunchKernel(const EmuKernel *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void *stream, void **args, void **) {
  Launch l{f->name, f->bind(args), {gx, gy, gz}, {bx, by, bz}, smem, false};
  std::lock_guard<std::mutex> lock(emu_mu);
  if (captured(stream)) {
    capture->push_back(std::move(l));
    return OK;
  }
  counts.launches++;
  return run(l);
}
struct Event {
  timespec t;
};
API cuEventCreate(Event **e, unsigned) {
  *e = new Event();
  return OK;
}
API cuEventDestroy_v2(Event *e) {
  delete e;
  return OK;
}
API cuEventRecord(Event *e, void *) {
  clock_gettime(CLOCK_MONOTONIC, &e->t);
  return OK;
}
API cuEventSynchronize(Event *) { return OK; }
API cuEventElapsedTime(float *ms, Event *a, Event *b) {
  *ms = (float)((b->t.tv_sec - a->t.tv_sec) * 1e3 + (b->t.tv_nsec - a->t.tv_nsec) / 1e6);
  return OK;
}
API cuStreamBeginCapture_v2(void *stream, int) {
  std::lock_guard<std::mutex> lock(emu_mu);
  if (capture) return ERR_CAPTURE;  // one capture at a time here
  capture = new Graph;
  capture_stream = stream;
  return OK;
}
API cuStreamEndCapture(void *stream, Graph **g) {
  std::lock_guard<std::mutex> lock(emu_mu);
  if (!captured(stream)) return ERR_CAPTURE;
  *g = capture;
  capture = nullptr;
  return OK;
}
API cuGraphInstantiateWithFlags(Graph **exec, Graph *g, unsigned long long) {
  *exec = new Graph(*g);
  return OK;
}
API cuGraphLaunch(Graph *exec, void *) {
  std::lock_guard<std::mutex> lock(emu_mu);
  counts.graph_launches++;
  for (const Launch &l : *exec)
    if (CUresult r = run(l)) return r;
  return OK;
}
API cuGraphExecDestroy(Graph *exec) {
  delete exec;
  return OK;
}
API cuGraphDestroy(Graph *g) {
  delete g;
  return OK;
}

// ---- cuBLASLt: the one GEMM form blas.go plans, D = op(A)·op(B) with F32 accumulation ----

struct LtDesc {
  int trans[2];
};
struct LtLayout {
  int type;
  uint64_t rows, cols;
  int64_t ld;
};
struct LtHeuristic {
  uint64_t algo[8];
  size_t workspace;
  int state;
  float waves;
  int reserved[4];
};
enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };

static float lt_load(const LtLayout *l, const void *p, uint64_t r, uint64_t c) {
  size_t i = r + c * (size_t)l->ld;
  switch (l->type) {
    case CUDA_R_16BF: return to_f32(((const bf16 *)p)[i]);
    case CUDA_R_16F: return to_f32(((const f16 *)p)[i]);
    default: return ((const float *)p)[i];
  }
}

#define LT extern "C" __attribute__((visibility("default"))) int
static int lt_token;
LT cublasLtCreate(void **h) {
  *h = &lt_token;
  return 0;
}
LT cublasLtDestroy(void *) { return 0; }
extern "C" __attribute__((visibility("default"))) const char *cublasLtGetStatusName(int) { return "CUBLAS_STATUS_EMULATED"; }
extern "C" __attribute__((visibility("default"))) size_t cublasLtGetVersion() { return 120804; }  // as 12.8.4
LT cublasLtMatmulDescCreate(LtDesc **d, int, int) {
  *d = new LtDesc{{0, 0}};
  return 0;
}
LT cublasLtMatmulDescDestroy(LtDesc *d) {
  delete d;
  return 0;
}
LT cublasLtMatmulDescSetAttribute(LtDesc *d, int attr, const void *buf, size_t) {
  if (attr == 3 || attr == 4) d->trans[attr - 3] = *(const int *)buf;  // TRANSA, TRANSB
  return 0;
}
LT cublasLtMatrixLayoutCreate(LtLayout **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  *l = new LtLayout{type, rows, cols, ld};
  return 0;
}
LT cublasLtMatrixLayoutDestroy(LtLayout *l) {
  delete l;
  return 0;
}
LT cublasLtMatmulPreferenceCreate(void **p) {
  *p = &lt_token;
  return 0;
}
LT cublasLtMatmulPreferenceDestroy(void *) { return 0; }
LT cublasLtMatmulPreferenceSetAttribute(void *, int, const void *, size_t) { return 0; }
LT cublasLtMatmulAlgoGetHeuristic(void *, LtDesc *, LtLayout *, LtLayout *, LtLayout *, LtLayout *, void *, int,
                                  LtHeuristic *res, int *n) {
  memset(res, 0, sizeof *res);
  // DDFLASH_EMU_LT_NO_ALGORITHM set: no algorithm for any shape, as
  // cuBLASLt may answer, for the tests of the fallback.
  const char *none = getenv("DDFLASH_EMU_LT_NO_ALGORITHM");
  *n = none && *none ? 0 : 1;
  return 0;
}
// lt_column widens column c of a matrix (contiguous in column-major
// storage) to floats.
static void lt_column(const LtLayout *l, const void *p, uint64_t c, float *out) {
  size_t base = c * (size_t)l->ld;
  for (uint64_t r = 0; r < l->rows; r++) switch (l->type) {
      case CUDA_R_16BF: out[r] = to_f32(((const bf16 *)p)[base + r]); break;
      case CUDA_R_16F: out[r] = to_f32(((const f16 *)p)[base + r]); break;
      default: out[r] = ((const float *)p)[base + r];
    }
}

// lt_matmul widens op(B) (the activations: a few columns) once, laid
// out [k][m] with m padded to whole 16-column groups, and each row of op(A)
// (a weight row) once, then runs 16 output columns' accumulations side by
// side (one vector register); each element is still one fma chain over k
// in order.
static void lt_matmul(const LtDesc *d, float alpha, const void *A, const LtLayout *a, const void *B, const LtLayout *b,
                      float beta, const void *C, const LtLayout *c, void *D, const LtLayout *dl) {
  const uint64_t group = 16;
  uint64_t n = dl->rows, m = dl->cols, k = d->trans[0] ? a->rows : a->cols, mp = (m + group - 1) / group * group;
  std::vector<float> bt(k * mp, 0.0f), arow(k);
  for (uint64_t l = 0; l < k; l++)
    for (uint64_t j = 0; j < m; j++) bt[l * mp + j] = d->trans[1] ? lt_load(b, B, j, l) : lt_load(b, B, l, j);
  for (uint64_t i = 0; i < n; i++) {
    if (d->trans[0])
      lt_column(a, A, i, arow.data());
    else
      for (uint64_t l = 0; l < k; l++) arow[l] = lt_load(a, A, i, l);
    for (uint64_t j0 = 0; j0 < m; j0 += group) {
      float acc[group] = {};
      for (uint64_t l = 0; l < k; l++) {
        const float av = arow[l], *bl = &bt[l * mp + j0];
        for (uint64_t j = 0; j < group; j++) acc[j] = __builtin_fmaf(av, bl[j], acc[j]);
      }
      for (uint64_t j = j0; j < m && j < j0 + group; j++) {
        float *out = (float *)D + i + j * (size_t)dl->ld;
        *out = alpha * acc[j - j0] + (beta != 0 ? beta * lt_load(c, C, i, j) : 0.0f);
      }
    }
  }
}

// cublasLtMatmul runs at once, or joins the graph being captured on its
// stream (as the real one's kernels do), with copies of its descriptors.
LT cublasLtMatmul(void *, LtDesc *d, const float *alpha, const void *A, LtLayout *a, const void *B, LtLayout *b,
                  const float *beta, const void *C, LtLayout *c, void *D, LtLayout *dl, const void *, void *, size_t,
                  void *stream) {
  std::function<void()> call = [d = *d, alpha = *alpha, A, a = *a, B, b = *b, beta = *beta, C, c = *c, D, dl = *dl] {
    lt_matmul(&d, alpha, A, &a, B, &b, beta, C, &c, D, &dl);
  };
  std::lock_guard<std::mutex> lock(emu_mu);
  if (captured(stream)) {
    capture->push_back(Launch{"cublasLtMatmul", std::move(call), {}, {}, 0, true});
    return 0;
  }
  counts.lt_matmuls++;
  call();
  return 0;
}

// ---- NCCL: the collectives ncclComm (nccl.go) makes, over ranks of this process ----
//
// Enum values and signatures follow NCCL 2's nccl.h. Every call is
// synchronous, like the rest of the emulation: a rank's collective waits
// for its peers' at a barrier, reads their buffers (host memory), waits
// until every peer has read its own, then writes its result. All-reduce
// adds in rank order, ((r0 + r1) + r2) + ..., as engine.LocalComm does, so
// tensor-parallel results match the CPU backend's bit for bit.

enum { NCCL_OK = 0, NCCL_INVALID_ARGUMENT = 4, NCCL_INVALID_USAGE = 5 };
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

// Clique is the ranks ncclCommInitAll connected, with what each rank
// brings to the collective in flight.
struct Clique {
  int ranks, live;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  unsigned gen = 0;
  struct Part {
    const float *send;
    size_t count;
    int root;
  };
  std::vector<Part> parts;
};
struct Comm {
  Clique *clique;
  int rank;
};

static void clique_barrier(Clique &c) {
  std::unique_lock<std::mutex> lock(c.mu);
  unsigned gen = c.gen;
  if (++c.arrived == c.ranks) {
    c.arrived = 0;
    c.gen++;
    c.cv.notify_all();
    return;
  }
  c.cv.wait(lock, [&] { return c.gen != gen; });
}

#define NCCL_API extern "C" __attribute__((visibility("default"))) int
extern "C" __attribute__((visibility("default"))) const char *ncclGetErrorString(int r) {
  switch (r) {
    case NCCL_OK: return "no error";
    case NCCL_INVALID_ARGUMENT: return "invalid argument (emulated NCCL)";
    case NCCL_INVALID_USAGE: return "invalid usage (emulated NCCL)";
  }
  return "unknown result (emulated NCCL)";
}
NCCL_API ncclGetVersion(int *v) {
  *v = 22700;  // 2.27.0 in the 2.9+ encoding, major*10000 + minor*100 + patch
  return NCCL_OK;
}
NCCL_API ncclCommInitAll(Comm **comms, int ndev, const int *devices) {
  if (ndev < 1) return NCCL_INVALID_ARGUMENT;
  std::vector<bool> seen(emu_devices);
  for (int i = 0; i < ndev; i++) {
    int d = devices ? devices[i] : i;
    if (d < 0 || d >= emu_devices || seen[d]) return NCCL_INVALID_ARGUMENT;  // NCCL refuses a device twice
    seen[d] = true;
  }
  Clique *c = new Clique;
  c->ranks = c->live = ndev;
  c->parts.resize(ndev);
  for (int i = 0; i < ndev; i++) comms[i] = new Comm{c, i};
  return NCCL_OK;
}
NCCL_API ncclCommDestroy(Comm *comm) {
  Clique *c = comm->clique;
  bool last;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    last = --c->live == 0;
  }
  if (last) delete c;
  delete comm;
  return NCCL_OK;
}

// collective runs one rank's part: it posts send, count and root, and once
// every rank has, fills result from the parts (the same on every rank, as
// are the arguments it checks), waits until every rank has read the parts,
// and writes result to recv.
template <typename Fill>
static int collective(Comm *comm, const void *send, void *recv, size_t count, size_t recv_count, int type, int root,
                      void *stream, Fill fill) {
  {
    std::lock_guard<std::mutex> lock(emu_mu);
    if (captured(stream)) return NCCL_INVALID_USAGE;  // only kernels are captured here
  }
  Clique &c = *comm->clique;
  c.parts[comm->rank] = {(const float *)send, count, root};
  clique_barrier(c);
  bool agree = type == NCCL_FLOAT32;
  for (const Clique::Part &p : c.parts) agree = agree && p.count == count && p.root == root;
  std::vector<float> result;
  if (agree) {
    result.resize(recv_count);
    fill(c.parts, result.data());
  }
  clique_barrier(c);  // every rank has read the parts (an in-place send is a recv)
  if (!agree) return NCCL_INVALID_USAGE;
  memcpy(recv, result.data(), recv_count * sizeof(float));
  return NCCL_OK;
}

NCCL_API ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, Comm *comm, void *stream) {
  if (op != NCCL_SUM) return NCCL_INVALID_ARGUMENT;
  return collective(comm, send, recv, count, count, type, 0, stream,
                    [count](const std::vector<Clique::Part> &parts, float *sum) {
                      memcpy(sum, parts[0].send, count * sizeof(float));
                      for (size_t r = 1; r < parts.size(); r++)
                        for (size_t i = 0; i < count; i++) sum[i] += parts[r].send[i];
                    });
}
NCCL_API ncclAllGather(const void *send, void *recv, size_t count, int type, Comm *comm, void *stream) {
  return collective(comm, send, recv, count, count * comm->clique->ranks, type, 0, stream,
                    [count](const std::vector<Clique::Part> &parts, float *all) {
                      for (size_t r = 0; r < parts.size(); r++) memcpy(all + r * count, parts[r].send, count * sizeof(float));
                    });
}
NCCL_API ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, Comm *comm, void *stream) {
  if (root < 0 || root >= comm->clique->ranks) return NCCL_INVALID_ARGUMENT;
  return collective(comm, send, recv, count, count, type, root, stream,
                    [count, root](const std::vector<Clique::Part> &parts, float *out) {
                      memcpy(out, parts[root].send, count * sizeof(float));
                    });
}
