/* fake_libcublaslt.c - a stand-in libcublasLt.so.13 for testing krt_gemm's
 * epilogues (bias, relu, a separate C input) on the cuda device without a
 * GPU (memory of fake_libcuda.c is host memory).
 *
 * cublasLtMatmul is a naive column-major loop with cuBLASLt's documented
 * meaning, D = epilogue(alpha * op(A) op(B) + beta * C), the bias one value
 * per row of D added before the activation; layouts and descriptors keep
 * what was set on them.  So device_cuda.c's mapping of a row-major GEMM
 * onto cuBLASLt is checked against an independent reading of the API. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "fake_defer.h"

#define EXPORT __attribute__((visibility("default")))

struct cublasLtContext {
  int dummy;
};

typedef struct {
  cublasComputeType_t compute;
  cudaDataType scale;
  int32_t transa, transb, epilogue;
  const void *bias;
} fake_desc;

typedef struct {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld, stride;
  int32_t batch;
} fake_layout;

/* a heuristic preference: the workspace it may use and the operands'
 * alignments (A, B, C, D), cuBLASLt's defaults 0 and 256 bytes */
typedef struct {
  uint64_t max_workspace;
  uint32_t align[4];
} fake_pref;

_Static_assert(sizeof(fake_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "desc fits");
_Static_assert(sizeof(fake_pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "pref fits");

static long heuristic_calls;
EXPORT long fake_cublaslt_heuristic_calls(void) { return heuristic_calls; }

EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  fake_pref *f = calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
  if (!f) return CUBLAS_STATUS_ALLOC_FAILED;
  for (int i = 0; i < 4; i++) f->align[i] = 256;
  *p = (cublasLtMatmulPreference_t)f;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  free(p);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t a,
                                                           const void *buf, size_t size) {
  fake_pref *f = (fake_pref *)p;
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(uint64_t)) {
    memcpy(&f->max_workspace, buf, size);
  } else if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
             a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && size == sizeof(uint32_t)) {
    memcpy(&f->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
  } else {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

/* One algorithm, which works for the alignments the preference states
 * (kept in it: data[0..3]) and wants up to 4 MiB of the workspace
 * allowed (data[4]). */
EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                     cublasLtMatmulPreference_t p, int requested,
                                                     cublasLtMatmulHeuristicResult_t *results, int *count) {
  if (!h || !op || !a || !b || !c || !d || !p || requested < 1 || !results || !count)
    return CUBLAS_STATUS_INVALID_VALUE;
  const fake_pref *f = (const fake_pref *)p;
  heuristic_calls++;
  memset(&results[0], 0, sizeof results[0]);
  for (int i = 0; i < 4; i++) results[0].algo.data[i] = f->align[i];
  uint64_t want = f->max_workspace < (4u << 20) ? f->max_workspace : (4u << 20);
  results[0].algo.data[4] = want;
  results[0].workspaceSize = want;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}
_Static_assert(sizeof(fake_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");

EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (fake_capturing()) return CUBLAS_STATUS_ALLOC_FAILED;
  *h = calloc(1, sizeof **h);
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
  fake_desc *f = calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
  if (!f) return CUBLAS_STATUS_ALLOC_FAILED;
  f->compute = compute, f->scale = scale, f->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  *d = (cublasLtMatmulDesc_t)f;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  free(d);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                     cublasLtMatmulDescAttributes_t a,
                                                     const void *buf, size_t size) {
  fake_desc *f = (fake_desc *)d;
  switch (a) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB:
  case CUBLASLT_MATMUL_DESC_EPILOGUE:
    if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(a == CUBLASLT_MATMUL_DESC_TRANSA   ? &f->transa
           : a == CUBLASLT_MATMUL_DESC_TRANSB ? &f->transb
                                              : &f->epilogue,
           buf, size);
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&f->bias, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
  if (ld < (int64_t)(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  fake_layout *f = calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
  if (!f) return CUBLAS_STATUS_ALLOC_FAILED;
  *f = (fake_layout){type, rows, cols, ld, 0, 1};
  *l = (cublasLtMatrixLayout_t)f;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  free(l);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                       cublasLtMatrixLayoutAttribute_t a,
                                                       const void *buf, size_t size) {
  fake_layout *f = (fake_layout *)l;
  if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t))
    memcpy(&f->batch, buf, size);
  else if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t))
    memcpy(&f->stride, buf, size);
  else
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

static double load(cudaDataType t, const void *p, int64_t i) {
  switch (t) {
  case CUDA_R_32F: return ((const float *)p)[i];
  case CUDA_R_64F: return ((const double *)p)[i];
  default: return (double)((const _Float16 *)p)[i];
  }
}

static void store(cudaDataType t, void *p, int64_t i, double v) {
  switch (t) {
  case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
  case CUDA_R_64F: ((double *)p)[i] = v; break;
  default: ((_Float16 *)p)[i] = (_Float16)(float)v; break;
  }
}

/* Element (r, c) of op(X) for a layout with its batch offset. */
static double at(const fake_layout *l, const void *x, int32_t op, int64_t b, uint64_t r,
                 uint64_t c) {
  if (op != CUBLAS_OP_N) {
    uint64_t t = r;
    r = c, c = t;
  }
  return load(l->type, x, b * l->stride + (int64_t)c * l->ld + (int64_t)r);
}

typedef struct {
  fake_desc f;
  fake_layout a, b, c, d;
  double alpha, beta;
  const void *A, *B, *C;
  void *D;
} matmul_call;

static void run_matmul(void *p) {
  const matmul_call *mc = p;
  const fake_desc *f = &mc->f;
  const fake_layout *a = &mc->a, *b = &mc->b, *c = &mc->c, *d = &mc->d;
  uint64_t m = d->rows, n = d->cols, k = f->transa == CUBLAS_OP_N ? a->cols : a->rows;
  bool relu = f->epilogue == CUBLASLT_EPILOGUE_RELU || f->epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
  bool bias = f->epilogue == CUBLASLT_EPILOGUE_BIAS || f->epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
  for (int64_t bi = 0; bi < d->batch; bi++)
    for (uint64_t i = 0; i < m; i++)
      for (uint64_t j = 0; j < n; j++) {
        double s = 0;
        for (uint64_t q = 0; q < k; q++)
          s += at(a, mc->A, f->transa, bi, i, q) * at(b, mc->B, f->transb, bi, q, j);
        s *= mc->alpha;
        if (mc->beta != 0) s += mc->beta * load(c->type, mc->C, bi * c->stride + (int64_t)j * c->ld + (int64_t)i);
        if (bias) s += load(d->type, f->bias, (int64_t)i);
        if (relu && s < 0) s = 0;
        store(d->type, mc->D, bi * d->stride + (int64_t)j * d->ld + (int64_t)i, s);
      }
}

EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                     const void *alpha, const void *A, cublasLtMatrixLayout_t al,
                                     const void *B, cublasLtMatrixLayout_t bl, const void *beta,
                                     const void *C, cublasLtMatrixLayout_t cl, void *D,
                                     cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *algo,
                                     void *ws, size_t wss, cudaStream_t stream) {
  /* what a real cuBLASLt refuses: operands less aligned than the
   * algorithm was chosen for (256 bytes when none was chosen), a workspace
   * smaller than it needs */
  const void *ptr[4] = {A, B, C, D};
  for (int i = 0; i < 4; i++) {
    uint64_t need = algo ? algo->data[i] : 256;
    if (need && (uintptr_t)ptr[i] % need) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (algo && algo->data[4] && (!ws || wss < algo->data[4])) return CUBLAS_STATUS_INVALID_VALUE;
  const fake_desc *f = (const fake_desc *)desc;
  const fake_layout *a = (const fake_layout *)al, *b = (const fake_layout *)bl,
                    *c = (const fake_layout *)cl, *d = (const fake_layout *)dl;
  if (!h || !f || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
  uint64_t m = d->rows, n = d->cols, k = f->transa == CUBLAS_OP_N ? a->cols : a->rows;
  uint64_t am = f->transa == CUBLAS_OP_N ? a->rows : a->cols;
  uint64_t bk = f->transb == CUBLAS_OP_N ? b->rows : b->cols, bn = f->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (am != m || bk != k || bn != n || c->rows != m || c->cols != n || c->ld != d->ld ||
      a->batch != d->batch || b->batch != d->batch || c->batch != d->batch ||
      c->type != d->type || a->type != b->type)
    return CUBLAS_STATUS_INVALID_VALUE;
  if ((f->epilogue == CUBLASLT_EPILOGUE_BIAS || f->epilogue == CUBLASLT_EPILOGUE_RELU_BIAS) && !f->bias)
    return CUBLAS_STATUS_INVALID_VALUE;
  /* by value: the caller destroys the descriptors, and a captured graph
   * runs the GEMM later */
  matmul_call mc = {*f, *a, *b, *c, *d, f->scale == CUDA_R_64F ? *(const double *)alpha : *(const float *)alpha,
                    f->scale == CUDA_R_64F ? *(const double *)beta : *(const float *)beta, A, B, C, D};
  if (!fake_defer(stream, run_matmul, &mc, sizeof mc)) run_matmul(&mc);
  return CUBLAS_STATUS_SUCCESS;
}
