//go:build cgo

// NCCL through dlopen: see driver.h. Signatures and enum values follow
// NCCL 2's src/nccl.h.in (NVIDIA/nccl); docs/cuda.md lists them.
#include "driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define NCCL_FLOAT32 7  // ncclFloat32 (ncclDataType_t)
#define NCCL_SUM 0      // ncclSum (ncclRedOp_t)

static struct {
  const char *(*GetErrorString)(ncclResult_t);
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
  ncclResult_t (*AllGather)(const void *, void *, size_t, int, ncclComm_t, CUstream);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
} nccl;

// CtxSetCurrent is reached through the driver table in driver.c.
CUresult dd_ctx_current(CUcontext ctx);

int dd_nccl_open(const char *path, char *err, size_t errlen) {
  // The library loaded last and its path: a different path (a test that
  // configures the emulation without NCCL) opens that one instead.
  static void *lib;
  static char loaded[4096];
  if (lib && !strcmp(loaded, path)) return 0;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "%s not found: %s", path, dlerror());
    return -1;
  }
#define SYM(field, name)                                    \
  if (!(*(void **)&nccl.field = dlsym(h, name))) {          \
    snprintf(err, errlen, "%s lacks %s", path, name);       \
    dlclose(h);                                             \
    return -1;                                              \
  }
  SYM(GetErrorString, "ncclGetErrorString")
  SYM(GetVersion, "ncclGetVersion")
  SYM(CommInitAll, "ncclCommInitAll")
  SYM(CommDestroy, "ncclCommDestroy")
  SYM(AllReduce, "ncclAllReduce")
  SYM(AllGather, "ncclAllGather")
  SYM(Broadcast, "ncclBroadcast")
#undef SYM
  lib = h;
  snprintf(loaded, sizeof loaded, "%s", path);
  return 0;
}

const char *dd_nccl_error_string(ncclResult_t r) {
  const char *s = nccl.GetErrorString ? nccl.GetErrorString(r) : NULL;
  return s ? s : "unknown NCCL error";
}
ncclResult_t dd_nccl_version(int *version) { return nccl.GetVersion(version); }

// dd_nccl_init_all creates one communicator per device; NCCL switches
// devices itself, ctx only gives it a current context to start from.
ncclResult_t dd_nccl_init_all(CUcontext ctx, ncclComm_t *comms, int ndev, const int *devices) {
  if (dd_ctx_current(ctx)) return 1;  // ncclUnhandledCudaError
  return nccl.CommInitAll(comms, ndev, devices);
}
ncclResult_t dd_nccl_destroy(ncclComm_t comm) { return nccl.CommDestroy(comm); }

ncclResult_t dd_nccl_all_reduce_sum(CUcontext ctx, ncclComm_t comm, CUdeviceptr buf, size_t n, CUstream s) {
  if (dd_ctx_current(ctx)) return 1;
  return nccl.AllReduce((const void *)buf, (void *)buf, n, NCCL_FLOAT32, NCCL_SUM, comm, s);
}
ncclResult_t dd_nccl_all_gather(CUcontext ctx, ncclComm_t comm, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  if (dd_ctx_current(ctx)) return 1;
  return nccl.AllGather((const void *)src, (void *)dst, n, NCCL_FLOAT32, comm, s);
}
ncclResult_t dd_nccl_broadcast(CUcontext ctx, ncclComm_t comm, CUdeviceptr buf, size_t n, int root, CUstream s) {
  if (dd_ctx_current(ctx)) return 1;
  return nccl.Broadcast((const void *)buf, (void *)buf, n, NCCL_FLOAT32, root, comm, s);
}
