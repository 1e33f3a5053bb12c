//go:build cgo

// The CUDA driver API through dlopen: see driver.h.
#include "driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
#define CU_STREAM_CAPTURE_MODE_RELAXED 2
#define CU_EVENT_DEFAULT 0

static struct {
  CUresult (*Init)(unsigned);
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*ModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *, void **);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
  CUresult (*FuncGetAttribute)(int *, int, CUfunction);
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int *, CUfunction, int, size_t);
  CUresult (*EventCreate)(CUevent *, unsigned);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
  CUresult (*StreamBeginCapture)(CUstream, int);
  CUresult (*StreamEndCapture)(CUstream, CUgraph *);
  CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
} cu;

static void *lib;  // the loaded driver library

int dd_cuda_open(char *err, size_t errlen) {
  if (lib) return 0;
  const char *path = getenv("DDFLASH_LIBCUDA");
  if (!path || !*path) path = "libcuda.so.1";
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "%s not found (no NVIDIA driver?): %s", path, dlerror());
    return -1;
  }
#define SYM(field, name)                                                     \
  if (!(*(void **)&cu.field = dlsym(h, name))) {                             \
    snprintf(err, errlen, "%s lacks %s (driver too old?)", path, name);      \
    dlclose(h);                                                              \
    return -1;                                                               \
  }
  SYM(Init, "cuInit")
  SYM(GetErrorName, "cuGetErrorName")
  SYM(GetErrorString, "cuGetErrorString")
  SYM(DeviceGet, "cuDeviceGet")
  SYM(DeviceGetAttribute, "cuDeviceGetAttribute")
  SYM(DeviceGetName, "cuDeviceGetName")
  SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
  SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")
  SYM(CtxSetCurrent, "cuCtxSetCurrent")
  SYM(MemAlloc, "cuMemAlloc_v2")
  SYM(MemFree, "cuMemFree_v2")
  SYM(MemsetD8Async, "cuMemsetD8Async")
  SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
  SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
  SYM(StreamCreate, "cuStreamCreate")
  SYM(StreamDestroy, "cuStreamDestroy_v2")
  SYM(StreamSynchronize, "cuStreamSynchronize")
  SYM(ModuleLoadDataEx, "cuModuleLoadDataEx")
  SYM(ModuleGetFunction, "cuModuleGetFunction")
  SYM(LaunchKernel, "cuLaunchKernel")
  SYM(FuncGetAttribute, "cuFuncGetAttribute")
  SYM(OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
  SYM(EventCreate, "cuEventCreate")
  SYM(EventDestroy, "cuEventDestroy_v2")
  SYM(EventRecord, "cuEventRecord")
  SYM(EventSynchronize, "cuEventSynchronize")
  SYM(EventElapsedTime, "cuEventElapsedTime")
  SYM(StreamBeginCapture, "cuStreamBeginCapture_v2")
  SYM(StreamEndCapture, "cuStreamEndCapture")
  SYM(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")
  SYM(GraphLaunch, "cuGraphLaunch")
  SYM(GraphExecDestroy, "cuGraphExecDestroy")
  SYM(GraphDestroy, "cuGraphDestroy")
#undef SYM
  lib = h;
  return 0;
}

int dd_emu_counts(uint64_t counts[DD_EMU_COUNTS]) {
  void (*read)(uint64_t *) = NULL;
  if (lib) *(void **)&read = dlsym(lib, "ddflash_emu_counts");
  if (!read) return -1;
  read(counts);
  return 0;
}

const char *dd_error_name(CUresult r) {
  const char *s = NULL;
  if (!cu.GetErrorName || cu.GetErrorName(r, &s) != 0 || !s) return "CUDA_ERROR_UNKNOWN";
  return s;
}

const char *dd_error_string(CUresult r) {
  const char *s = NULL;
  if (!cu.GetErrorString || cu.GetErrorString(r, &s) != 0 || !s) return "unknown error";
  return s;
}

CUresult dd_init(void) { return cu.Init(0); }
CUresult dd_device(int ordinal, CUdevice *dev) { return cu.DeviceGet(dev, ordinal); }
CUresult dd_device_attr(CUdevice dev, int attr, int *value) { return cu.DeviceGetAttribute(value, attr, dev); }
CUresult dd_device_name(CUdevice dev, char *name, int len) { return cu.DeviceGetName(name, len, dev); }

CUresult dd_ctx_retain(CUdevice dev, CUcontext *ctx) {
  CUresult r = cu.DevicePrimaryCtxRetain(ctx, dev);
  return r ? r : cu.CtxSetCurrent(*ctx);
}
CUresult dd_ctx_release(CUdevice dev) { return cu.DevicePrimaryCtxRelease(dev); }

// CURRENT makes ctx current or returns the error.
#define CURRENT(ctx)                         \
  do {                                       \
    CUresult r_ = cu.CtxSetCurrent(ctx);     \
    if (r_) return r_;                       \
  } while (0)

CUresult dd_mem_alloc(CUcontext ctx, CUdeviceptr *p, size_t bytes) {
  CURRENT(ctx);
  return cu.MemAlloc(p, bytes);
}
CUresult dd_mem_free(CUcontext ctx, CUdeviceptr p) {
  CURRENT(ctx);
  return cu.MemFree(p);
}
CUresult dd_memset(CUcontext ctx, CUdeviceptr p, size_t bytes, CUstream s) {
  CURRENT(ctx);
  return cu.MemsetD8Async(p, 0, bytes, s);
}
// dd_htod returns once src may be reused: the driver stages pageable memory.
CUresult dd_htod(CUcontext ctx, CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
  CURRENT(ctx);
  return cu.MemcpyHtoDAsync(dst, src, bytes, s);
}
// dd_dtoh waits for the stream, so dst holds the data when it returns.
CUresult dd_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
  CURRENT(ctx);
  CUresult r = cu.MemcpyDtoHAsync(dst, src, bytes, s);
  return r ? r : cu.StreamSynchronize(s);
}
CUresult dd_stream_create(CUcontext ctx, CUstream *s) {
  CURRENT(ctx);
  return cu.StreamCreate(s, 0);
}
CUresult dd_stream_destroy(CUcontext ctx, CUstream s) {
  CURRENT(ctx);
  return cu.StreamDestroy(s);
}
CUresult dd_stream_sync(CUcontext ctx, CUstream s) {
  CURRENT(ctx);
  return cu.StreamSynchronize(s);
}
CUresult dd_module_load(CUcontext ctx, CUmodule *m, const char *ptx, char *log, size_t loglen) {
  CURRENT(ctx);
  int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[2] = {log, (void *)(uintptr_t)loglen};
  return cu.ModuleLoadDataEx(m, ptx, 2, opts, vals);
}
CUresult dd_module_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name) {
  CURRENT(ctx);
  return cu.ModuleGetFunction(f, m, name);
}
CUresult dd_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, CUstream s, void **args) {
  CURRENT(ctx);
  return cu.LaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, args, NULL);
}
CUresult dd_func_attr(CUcontext ctx, CUfunction f, int attr, int *value) {
  CURRENT(ctx);
  return cu.FuncGetAttribute(value, attr, f);
}
CUresult dd_occupancy(CUcontext ctx, CUfunction f, int block, size_t smem, int *blocks) {
  CURRENT(ctx);
  return cu.OccupancyMaxActiveBlocksPerMultiprocessor(blocks, f, block, smem);
}
CUresult dd_event_create(CUcontext ctx, CUevent *e) {
  CURRENT(ctx);
  return cu.EventCreate(e, CU_EVENT_DEFAULT);
}
CUresult dd_event_destroy(CUcontext ctx, CUevent e) {
  CURRENT(ctx);
  return cu.EventDestroy(e);
}
CUresult dd_event_record(CUcontext ctx, CUevent e, CUstream s) {
  CURRENT(ctx);
  return cu.EventRecord(e, s);
}
// dd_event_elapsed waits for end, then reports the milliseconds from start.
CUresult dd_event_elapsed(CUcontext ctx, float *ms, CUevent start, CUevent end) {
  CURRENT(ctx);
  CUresult r = cu.EventSynchronize(end);
  return r ? r : cu.EventElapsedTime(ms, start, end);
}
// Relaxed capture: the Go runtime may run other goroutines' cgo calls on
// this thread meanwhile, and those must not invalidate the capture.
CUresult dd_capture_begin(CUcontext ctx, CUstream s) {
  CURRENT(ctx);
  return cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
}
CUresult dd_capture_end(CUcontext ctx, CUstream s, CUgraphExec *exec) {
  CURRENT(ctx);
  CUgraph g = NULL;
  CUresult r = cu.StreamEndCapture(s, &g);
  if (r) return r;
  r = cu.GraphInstantiateWithFlags(exec, g, 0);
  cu.GraphDestroy(g);
  return r;
}
CUresult dd_graph_launch(CUcontext ctx, CUgraphExec g, CUstream s) {
  CURRENT(ctx);
  return cu.GraphLaunch(g, s);
}
CUresult dd_graph_destroy(CUcontext ctx, CUgraphExec g) {
  CURRENT(ctx);
  return cu.GraphExecDestroy(g);
}

CUresult dd_ctx_current(CUcontext ctx) { return cu.CtxSetCurrent(ctx); }
