/* fake_libcublas.c - a stand-in libcublas.so.13 for testing krt_gemm on the
 * cuda device without a GPU (memory of fake_libcuda.c is host memory).
 *
 * cublasGemmStridedBatchedEx is a naive column-major loop with cuBLAS's own
 * argument rules (leading dimensions, matching types, the scale type that
 * follows the compute type), so the row-major-to-column-major operand swap
 * in device_cuda.c is checked against an independent implementation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_api.h>

#include "fake_defer.h"

#define EXPORT __attribute__((visibility("default")))

struct cublasContext {
  cudaStream_t stream; /* cublasSetStream: GEMMs captured with it */
};

EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  if (fake_capturing()) return CUBLAS_STATUS_ALLOC_FAILED; /* its workspace */
  *h = calloc(1, sizeof **h);
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT const char *cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

EXPORT const char *cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_INVALID_VALUE ? "an invalid numeric value was used as an argument"
                                          : "see cublasGetStatusName";
}

static double load(cudaDataType t, const void *p, int64_t i) {
  switch (t) {
  case CUDA_R_32F: return ((const float *)p)[i];
  case CUDA_R_64F: return ((const double *)p)[i];
  case CUDA_R_16F: return (double)((const _Float16 *)p)[i];
  default: { /* bf16 */
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  }
}

static void store(cudaDataType t, void *p, int64_t i, double v) {
  switch (t) {
  case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
  case CUDA_R_64F: ((double *)p)[i] = v; break;
  case CUDA_R_16F: ((_Float16 *)p)[i] = (_Float16)(float)v; break;
  default: { /* bf16, round to nearest even (no NaN in these tests) */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)p)[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  }
}

/* one GEMM's arguments, kept by value (a captured graph runs it later) */
typedef struct {
  cublasOperation_t ta, tb;
  int m, n, k;
  double al, be;
  const void *A;
  cudaDataType at;
  int lda;
  long long sa;
  const void *B;
  cudaDataType bt;
  int ldb;
  long long sb;
  void *C;
  cudaDataType ct;
  int ldc;
  long long sc;
  int batch;
} gemm_call;

static void run_gemm(void *p) {
  const gemm_call *c = p;
  for (int b = 0; b < c->batch; b++)
    for (int j = 0; j < c->n; j++)
      for (int i = 0; i < c->m; i++) {
        double s = 0;
        for (int q = 0; q < c->k; q++) {
          int64_t ia = b * c->sa + (c->ta == CUBLAS_OP_N ? i + (int64_t)q * c->lda : q + (int64_t)i * c->lda);
          int64_t ib = b * c->sb + (c->tb == CUBLAS_OP_N ? q + (int64_t)j * c->ldb : j + (int64_t)q * c->ldb);
          s += load(c->at, c->A, ia) * load(c->bt, c->B, ib);
        }
        int64_t ic = b * c->sc + i + (int64_t)j * c->ldc;
        store(c->ct, c->C, ic, c->al * s + (c->be != 0 ? c->be * load(c->ct, c->C, ic) : 0));
      }
}

EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
    cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
    long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  (void)algo;
  if (!h || m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
  if (lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
      ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (at != bt || at != ct) return CUBLAS_STATUS_NOT_SUPPORTED;
  double al, be;
  if (compute == CUBLAS_COMPUTE_64F && at == CUDA_R_64F) {
    al = *(const double *)alpha;
    be = *(const double *)beta;
  } else if (compute == CUBLAS_COMPUTE_32F &&
             (at == CUDA_R_32F || at == CUDA_R_16F || at == CUDA_R_16BF)) {
    al = *(const float *)alpha;
    be = *(const float *)beta;
  } else {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  gemm_call c = {ta, tb, m, n, k, al, be, A, at, lda, sa, B, bt, ldb, sb, C, ct, ldc, sc, batch};
  if (!fake_defer(h->stream, run_gemm, &c, sizeof c)) run_gemm(&c);
  return CUBLAS_STATUS_SUCCESS;
}
