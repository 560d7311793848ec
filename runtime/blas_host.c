/* blas_host.c - krt_gemm for the host device, through CBLAS (OpenBLAS).
 *
 * f64 goes straight to cblas_dgemm, one call per batch item (CBLAS has no
 * strided batch).  f32 is widened to f64 and multiplied by cblas_dgemm:
 * the host device is the test device that compiled code is checked on
 * against the float64 interpreter, so it sums exactly rather than fast.  CBLAS has no half types, so f16 and
 * bf16 are widened to f32 temporaries, multiplied by cblas_sgemm and rounded
 * back once: the same "accumulate in f32" contract as cuBLAS with
 * CUBLAS_COMPUTE_32F, though the summation order differs.
 *
 * device.c has already checked shapes and leading dimensions (all fit in
 * int, Debian's OpenBLAS being LP64) and that m, n, batch > 0. */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "device_impl.h"

static enum CBLAS_TRANSPOSE tr(int t) { return t ? CblasTrans : CblasNoTrans; }

/* Batch item i of a matrix.  With k == 0, A and B may be NULL (nothing is
 * read), and offsetting NULL is undefined, so it stays NULL. */
static const void *item(const void *base, int64_t i, int64_t stride, size_t elem) {
  return base ? (const char *)base + (size_t)(i * stride) * elem : NULL;
}

/* One stored matrix of a batch item: rows x cols, leading dimension ld. */
typedef struct {
  const uint16_t *src; /* first element, in halves */
  int64_t rows, cols, ld;
} half_mat;

static void widen(krt_dtype t, half_mat h, float *dst) {
  for (int64_t r = 0; r < h.rows; r++) {
    const uint16_t *s = h.src + r * h.ld;
    float *d = dst + r * h.cols;
    if (t == KRT_F16)
      for (int64_t c = 0; c < h.cols; c++) d[c] = krt_f16_to_f32(s[c]);
    else
      for (int64_t c = 0; c < h.cols; c++) d[c] = krt_bf16_to_f32(s[c]);
  }
}

static void narrow(krt_dtype t, const float *src, uint16_t *dst, int64_t rows, int64_t cols,
                   int64_t ld) {
  for (int64_t r = 0; r < rows; r++) {
    const float *s = src + r * cols;
    uint16_t *d = dst + r * ld;
    if (t == KRT_F16)
      for (int64_t c = 0; c < cols; c++) d[c] = krt_f32_to_f16(s[c]);
    else
      for (int64_t c = 0; c < cols; c++) d[c] = krt_f32_to_bf16(s[c]);
  }
}

static float *temp(int64_t rows, int64_t cols) {
  /* rows, cols <= INT_MAX each: the product fits int64 but not always a
   * byte count; anything near 2^60 elements is not going to be malloc'd. */
  int64_t n = rows * cols;
  if (n >= ((int64_t)1 << 60)) return NULL;
  return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

/* Bias and activation of element (row, col) of a product, before it is
 * rounded to the output type (once, as cuBLASLt does). */
static double epilogue(const krt_gemm_desc *g, double v, int64_t col) {
  if (g->bias) switch (g->dtype) {
    case KRT_F32: v += ((const float *)g->bias)[col]; break;
    case KRT_F64: v += ((const double *)g->bias)[col]; break;
    case KRT_F16: v += krt_f16_to_f32(((const uint16_t *)g->bias)[col]); break;
    case KRT_BF16: v += krt_bf16_to_f32(((const uint16_t *)g->bias)[col]); break;
    default: break;
    }
  return g->relu && v < 0 ? 0.0 : v;
}

static int gemm_half(const krt_gemm_desc *g, char *err, size_t errlen) {
  const int64_t m = g->m, n = g->n, k = g->k;
  half_mat A = {g->a, g->trans_a ? k : m, g->trans_a ? m : k, g->lda};
  half_mat B = {g->b, g->trans_b ? n : k, g->trans_b ? k : n, g->ldb};
  float *a = temp(A.rows, A.cols), *b = temp(B.rows, B.cols), *c = temp(m, n);
  int rc = 0;
  if (!a || !b || !c) {
    rc = krt_err(err, errlen,
                 "krt_gemm %s %lldx%lldx%lld on the host: out of memory for the f32 copies",
                 krt_dtype_name(g->dtype), (long long)m, (long long)n, (long long)k);
    goto out;
  }
  for (int64_t i = 0; i < g->batch; i++) {
    /* A stride of 0 broadcasts one matrix: widen it once. */
    if (k > 0 && (i == 0 || g->stride_a)) {
      A.src = (const uint16_t *)g->a + i * g->stride_a;
      widen(g->dtype, A, a);
    }
    if (k > 0 && (i == 0 || g->stride_b)) {
      B.src = (const uint16_t *)g->b + i * g->stride_b;
      widen(g->dtype, B, b);
    }
    uint16_t *ci = (uint16_t *)g->c + i * g->stride_c;
    /* BLAS semantics: with beta == 0 C is not read, so NaN there is fine. */
    if (g->beta != 0) {
      half_mat C = {g->c_in ? (const uint16_t *)g->c_in + i * g->stride_c : ci, m, n, g->ldc};
      widen(g->dtype, C, c);
    } else {
      memset(c, 0, (size_t)(m * n) * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, tr(g->trans_a), tr(g->trans_b), (int)m, (int)n, (int)k,
                (float)g->alpha, a, (int)(A.cols > 0 ? A.cols : 1), b,
                (int)(B.cols > 0 ? B.cols : 1), (float)g->beta, c, (int)n);
    for (int64_t r = 0; r < m; r++)
      for (int64_t q = 0; q < n; q++) c[r * n + q] = (float)epilogue(g, c[r * n + q], q);
    narrow(g->dtype, c, ci, m, n, g->ldc);
  }
out:
  free(a);
  free(b);
  free(c);
  return rc;
}

/* A row-major matrix of `rows` x `cols` with leading dimension ld, widened
 * (or narrowed back) between f32 and f64. */
static size_t span(int64_t rows, int64_t cols, int64_t ld) {
  return rows && cols ? (size_t)((rows - 1) * ld + cols) : 0;
}

static int gemm_f32_via_f64(const krt_gemm_desc *g, char *err, size_t errlen) {
  size_t na = span(g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda);
  size_t nb = span(g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb);
  size_t nc = span(g->m, g->n, g->ldc);
  double *a = malloc((na + 1) * sizeof *a), *b = malloc((nb + 1) * sizeof *b),
         *c = malloc((nc + 1) * sizeof *c);
  int rc = 0;
  if (!a || !b || !c) {
    rc = krt_err(err, errlen, "krt_gemm: out of host memory for f64 temporaries");
  } else {
    for (int64_t i = 0; i < g->batch; i++) {
      const float *fa = item(g->a, i, g->stride_a, 4), *fb = item(g->b, i, g->stride_b, 4);
      float *fc = (float *)g->c + i * g->stride_c;
      const float *fin = g->c_in ? (const float *)g->c_in + i * g->stride_c : fc;
      for (size_t j = 0; j < na; j++) a[j] = fa[j];
      for (size_t j = 0; j < nb; j++) b[j] = fb[j];
      for (size_t j = 0; j < nc; j++) c[j] = g->beta != 0 ? fin[j] : 0;
      cblas_dgemm(CblasRowMajor, tr(g->trans_a), tr(g->trans_b), (int)g->m, (int)g->n, (int)g->k,
                  g->alpha, a, (int)g->lda, b, (int)g->ldb, g->beta, c, (int)g->ldc);
      for (int64_t r = 0; r < g->m; r++)
        for (int64_t q = 0; q < g->n; q++)
          fc[r * g->ldc + q] = (float)epilogue(g, c[r * g->ldc + q], q);
    }
  }
  free(a);
  free(b);
  free(c);
  return rc;
}

int krt_blas_gemm(const krt_gemm_desc *g, char *err, size_t errlen) {
  const int m = (int)g->m, n = (int)g->n, k = (int)g->k;
  const int lda = (int)g->lda, ldb = (int)g->ldb, ldc = (int)g->ldc;
  switch (g->dtype) {
  case KRT_F32: return gemm_f32_via_f64(g, err, errlen);
  case KRT_F64:
    for (int64_t i = 0; i < g->batch; i++) {
      double *c = (double *)g->c + i * g->stride_c;
      if (g->c_in && g->beta != 0) /* C_in into C first: BLAS accumulates in place */
        for (int64_t r = 0; r < g->m; r++)
          memmove(c + r * ldc, (const double *)g->c_in + i * g->stride_c + r * ldc,
                  (size_t)n * sizeof *c);
      cblas_dgemm(CblasRowMajor, tr(g->trans_a), tr(g->trans_b), m, n, k, g->alpha,
                  item(g->a, i, g->stride_a, 8), lda, item(g->b, i, g->stride_b, 8), ldb,
                  g->beta, c, ldc);
      if (g->bias || g->relu)
        for (int64_t r = 0; r < g->m; r++)
          for (int64_t q = 0; q < g->n; q++) c[r * ldc + q] = epilogue(g, c[r * ldc + q], q);
    }
    return 0;
  case KRT_F16:
  case KRT_BF16: return gemm_half(g, err, errlen);
  default:
    return krt_err(err, errlen, "krt_gemm: dtype %s is not supported on the host",
                   krt_dtype_name(g->dtype));
  }
}
