//go:build cgo

// cuBLASLt through dlopen: see driver.h. Enum values are those of
// cublasLt.h and library_types.h (CUDA 11 to 13).
#include "driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define CUBLAS_COMPUTE_32F 68
#define CUDA_R_32F 0
#define CUBLAS_OP_N 0
#define CUBLAS_OP_T 1
#define CUBLASLT_MATMUL_DESC_TRANSA 3
#define CUBLASLT_MATMUL_DESC_TRANSB 4
#define CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES 1
#define CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES 5

typedef struct cublasLtMatmulDescOpaque *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque *cublasLtMatmulPreference_t;
typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

static struct {
  cublasStatus_t (*Create)(cublasLtHandle_t *);
  cublasStatus_t (*Destroy)(cublasLtHandle_t);
  const char *(*GetStatusName)(cublasStatus_t);
  size_t (*GetVersion)(void);
  cublasStatus_t (*MatmulDescCreate)(cublasLtMatmulDesc_t *, int, int);
  cublasStatus_t (*MatmulDescDestroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*MatmulDescSetAttribute)(cublasLtMatmulDesc_t, int, const void *, size_t);
  cublasStatus_t (*MatrixLayoutCreate)(cublasLtMatrixLayout_t *, int, uint64_t, uint64_t, int64_t);
  cublasStatus_t (*MatrixLayoutDestroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*MatmulPreferenceCreate)(cublasLtMatmulPreference_t *);
  cublasStatus_t (*MatmulPreferenceDestroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*MatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t, int, const void *, size_t);
  cublasStatus_t (*MatmulAlgoGetHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                           cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                           cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *);
  cublasStatus_t (*Matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                           const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t,
                           void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, CUstream);
} lt;

// CtxSetCurrent is reached through the driver table in driver.c.
CUresult dd_ctx_current(CUcontext ctx);

int dd_lt_open(char *err, size_t errlen) {
  static void *lib;
  if (lib) return 0;
  static const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"};
  const char *path = getenv("DDFLASH_LIBCUBLASLT");
  void *h = path && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "libcublasLt.so.13/.12/.11 not found (install cuBLAS or add its lib folder to LD_LIBRARY_PATH)");
    return -1;
  }
#define SYM(field, name)                                               \
  if (!(*(void **)&lt.field = dlsym(h, name))) {                       \
    snprintf(err, errlen, "libcublasLt lacks %s", name);               \
    dlclose(h);                                                        \
    return -1;                                                         \
  }
  SYM(Create, "cublasLtCreate")
  SYM(Destroy, "cublasLtDestroy")
  SYM(GetStatusName, "cublasLtGetStatusName")
  SYM(GetVersion, "cublasLtGetVersion")
  SYM(MatmulDescCreate, "cublasLtMatmulDescCreate")
  SYM(MatmulDescDestroy, "cublasLtMatmulDescDestroy")
  SYM(MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute")
  SYM(MatrixLayoutCreate, "cublasLtMatrixLayoutCreate")
  SYM(MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy")
  SYM(MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate")
  SYM(MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy")
  SYM(MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute")
  SYM(MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic")
  SYM(Matmul, "cublasLtMatmul")
#undef SYM
  lib = h;
  return 0;
}

const char *dd_lt_status_name(cublasStatus_t s) { return lt.GetStatusName ? lt.GetStatusName(s) : "CUBLAS_STATUS_?"; }
size_t dd_lt_version(void) { return lt.GetVersion(); }

#define CURRENT(ctx)                                      \
  do {                                                    \
    if (dd_ctx_current(ctx)) return 13; /* CUBLAS_STATUS_EXECUTION_FAILED */ \
  } while (0)

cublasStatus_t dd_lt_create(CUcontext ctx, cublasLtHandle_t *h) {
  CURRENT(ctx);
  return lt.Create(h);
}
cublasStatus_t dd_lt_destroy(CUcontext ctx, cublasLtHandle_t h) {
  CURRENT(ctx);
  return lt.Destroy(h);
}

struct ddLtPlan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
};

void dd_lt_plan_free(ddLtPlan p) {
  if (!p) return;
  if (p->desc) lt.MatmulDescDestroy(p->desc);
  if (p->a) lt.MatrixLayoutDestroy(p->a);
  if (p->b) lt.MatrixLayoutDestroy(p->b);
  if (p->d) lt.MatrixLayoutDestroy(p->d);
  free(p);
}

cublasStatus_t dd_lt_plan(CUcontext ctx, cublasLtHandle_t h, int a_type, int b_type, uint64_t m, uint64_t n,
                          uint64_t k, uint32_t a_align, size_t workspace, ddLtPlan *plan, int *found) {
  CURRENT(ctx);
  *plan = NULL;
  *found = 0;
  ddLtPlan p = calloc(1, sizeof *p);
  if (!p) return 3;  // CUBLAS_STATUS_ALLOC_FAILED
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res;
  int n_res = 0;
  int transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  cublasStatus_t s;
  if ((s = lt.MatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
      (s = lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa)) ||
      (s = lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb)) ||
      (s = lt.MatrixLayoutCreate(&p->a, a_type, k, n, (int64_t)k)) ||
      (s = lt.MatrixLayoutCreate(&p->b, b_type, k, m, (int64_t)k)) ||
      (s = lt.MatrixLayoutCreate(&p->d, CUDA_R_32F, n, m, (int64_t)n)) ||
      (s = lt.MatmulPreferenceCreate(&pref)) ||
      (s = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                           sizeof workspace)) ||
      (s = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_align,
                                           sizeof a_align))) {
    if (pref) lt.MatmulPreferenceDestroy(pref);
    dd_lt_plan_free(p);
    return s;
  }
  s = lt.MatmulAlgoGetHeuristic(h, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res, &n_res);
  lt.MatmulPreferenceDestroy(pref);
  if (s || n_res == 0) {  // no algorithm is not an error: the caller falls back
    dd_lt_plan_free(p);
    return 0;
  }
  p->algo = res.algo;
  *plan = p;
  *found = 1;
  return 0;
}

cublasStatus_t dd_lt_matmul(CUcontext ctx, cublasLtHandle_t h, ddLtPlan p, CUdeviceptr a, CUdeviceptr b,
                            CUdeviceptr d, CUdeviceptr workspace, size_t workspace_bytes, CUstream s) {
  CURRENT(ctx);
  const float one = 1, zero = 0;
  return lt.Matmul(h, p->desc, &one, (const void *)a, p->a, (const void *)b, p->b, &zero, (const void *)d, p->d,
                   (void *)d, p->d, &p->algo, (void *)workspace, workspace_bytes, s);
}
