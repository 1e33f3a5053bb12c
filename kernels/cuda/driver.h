// Hand-written declarations of the parts of the CUDA driver API and
// cuBLASLt that the backend uses, loaded at run time with dlopen (driver.c).
// No CUDA header or library is needed to build.
#ifndef DDFLASH_CUDA_DRIVER_H
#define DDFLASH_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

// dd_cuda_open loads the driver library ($DDFLASH_LIBCUDA, else
// libcuda.so.1) and its symbols; on failure it writes the reason to err and
// returns -1. (The tests point DDFLASH_LIBCUDA at a CPU emulation, emu/.)
int dd_cuda_open(char *err, size_t errlen);
// dd_emu_counts reads the CPU emulation's counters (emu/driver.cc's
// EmuCounts, DD_EMU_COUNTS uint64s); -1 when the driver is not the emulation.
#define DD_EMU_COUNTS 8
int dd_emu_counts(uint64_t counts[DD_EMU_COUNTS]);
const char *dd_error_name(CUresult r);
const char *dd_error_string(CUresult r);

CUresult dd_init(void);
CUresult dd_device(int ordinal, CUdevice *dev);
CUresult dd_device_attr(CUdevice dev, int attr, int *value);
CUresult dd_device_name(CUdevice dev, char *name, int len);

// Every call below makes ctx current on the calling thread first: Go moves
// goroutines between threads, and a driver context is per thread.
CUresult dd_ctx_retain(CUdevice dev, CUcontext *ctx);
CUresult dd_ctx_release(CUdevice dev);
CUresult dd_mem_alloc(CUcontext ctx, CUdeviceptr *p, size_t bytes);
CUresult dd_mem_free(CUcontext ctx, CUdeviceptr p);
CUresult dd_memset(CUcontext ctx, CUdeviceptr p, size_t bytes, CUstream s);
CUresult dd_htod(CUcontext ctx, CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
CUresult dd_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t bytes, CUstream s);
CUresult dd_stream_create(CUcontext ctx, CUstream *s);
CUresult dd_stream_destroy(CUcontext ctx, CUstream s);
CUresult dd_stream_sync(CUcontext ctx, CUstream s);
CUresult dd_module_load(CUcontext ctx, CUmodule *m, const char *ptx, char *log, size_t loglen);
CUresult dd_module_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name);
CUresult dd_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, CUstream s, void **args);
// Kernel resources, for the GPU report (gpu-check.sh): dd_func_attr reads a
// CUfunction_attribute; dd_occupancy is how many blocks of block threads
// (and smem bytes of dynamic shared memory) fit on one multiprocessor.
CUresult dd_func_attr(CUcontext ctx, CUfunction f, int attr, int *value);
CUresult dd_occupancy(CUcontext ctx, CUfunction f, int block, size_t smem, int *blocks);
CUresult dd_event_create(CUcontext ctx, CUevent *e);
CUresult dd_event_destroy(CUcontext ctx, CUevent e);
CUresult dd_event_record(CUcontext ctx, CUevent e, CUstream s);
CUresult dd_event_elapsed(CUcontext ctx, float *ms, CUevent start, CUevent end);
CUresult dd_capture_begin(CUcontext ctx, CUstream s);
CUresult dd_capture_end(CUcontext ctx, CUstream s, CUgraphExec *exec);
CUresult dd_graph_launch(CUcontext ctx, CUgraphExec g, CUstream s);
CUresult dd_graph_destroy(CUcontext ctx, CUgraphExec g);

// cuBLASLt (cublaslt.c). dd_lt_open loads $DDFLASH_LIBCUBLASLT, else the
// newest libcublasLt it finds.
typedef int cublasStatus_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct ddLtPlan *ddLtPlan;  // a matmul shape with its chosen algorithm

int dd_lt_open(char *err, size_t errlen);
const char *dd_lt_status_name(cublasStatus_t s);
// dd_lt_version is cublasLtGetVersion: major·10000 + minor·100 + patch.
size_t dd_lt_version(void);
cublasStatus_t dd_lt_create(CUcontext ctx, cublasLtHandle_t *h);
cublasStatus_t dd_lt_destroy(CUcontext ctx, cublasLtHandle_t h);
// dd_lt_plan prepares D[n, m] (column-major, F32) = op(A)ᵀ·B with A a
// column-major [k, n] matrix of a_type (the row-major weights [n, k]) whose
// address is a multiple of a_align bytes, and B [k, m] of b_type (B and D
// 256-byte aligned); *found is 0 when cuBLASLt has no algorithm for it.
cublasStatus_t dd_lt_plan(CUcontext ctx, cublasLtHandle_t h, int a_type, int b_type, uint64_t m, uint64_t n,
                          uint64_t k, uint32_t a_align, size_t workspace, ddLtPlan *plan, int *found);
cublasStatus_t dd_lt_matmul(CUcontext ctx, cublasLtHandle_t h, ddLtPlan plan, CUdeviceptr a, CUdeviceptr b,
                            CUdeviceptr d, CUdeviceptr workspace, size_t workspace_bytes, CUstream s);
void dd_lt_plan_free(ddLtPlan plan);

// NCCL (nccl.c). dd_nccl_open loads path (libnccl.so.2 unless
// $DDFLASH_LIBNCCL names another) and its symbols; on failure it writes the
// reason to err and returns -1. Types and enum values are those of NCCL 2's
// nccl.h; the collectives take F32 buffers and sum.
typedef int ncclResult_t;
typedef struct ncclComm *ncclComm_t;

int dd_nccl_open(const char *path, char *err, size_t errlen);
const char *dd_nccl_error_string(ncclResult_t r);
ncclResult_t dd_nccl_version(int *version);
ncclResult_t dd_nccl_init_all(CUcontext ctx, ncclComm_t *comms, int ndev, const int *devices);
ncclResult_t dd_nccl_destroy(ncclComm_t comm);
ncclResult_t dd_nccl_all_reduce_sum(CUcontext ctx, ncclComm_t comm, CUdeviceptr buf, size_t n, CUstream s);
ncclResult_t dd_nccl_all_gather(CUcontext ctx, ncclComm_t comm, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
ncclResult_t dd_nccl_broadcast(CUcontext ctx, ncclComm_t comm, CUdeviceptr buf, size_t n, int root, CUstream s);

#endif
