/* test_device.c - the device API of kilnrt.h on the host device: choosing a
 * device (kinds, AUTO, KILN_DEVICE), memory, module load and launch through
 * the emulator, and krt_gemm against a naive triple loop in double.
 *
 * Memory and GEMM tests run on every device that opens: the host, and cuda
 * where a GPU works.  Without a GPU, opening cuda fails with a clear message
 * and AUTO falls back to the host (those tests skip where a GPU works).
 * With KILN_FAKE_CUDA=1 and the fake driver and cuBLAS of this folder on
 * LD_LIBRARY_PATH (the unit_device_fake_cuda test), the cuda device runs
 * everything but real kernels on the CPU, and the test_fake_cuda_* tests
 * check its module selection and its error messages. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>
#include <cuda.h> /* CUDA_VERSION: the toolkit libkilnrt was built with */
#include <nccl.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../runtime/comm_impl.h" /* a communicator of the test's own */
#include "../../runtime/kilnrt.h"
#include "../../runtime/emu/emu.h" /* kl_emu_shutdown, at the end */
#include "../../codegen/codegen.h"   /* NVRTC, for the launch test on a real GPU */

extern const krt_host_kernel axpy__emu, block_reverse__emu;

static krt_dim3 d3(unsigned x, unsigned y, unsigned z) {
  krt_dim3 d = {x, y, z};
  return d;
}

static krt_device *open_host(void) {
  krt_device *d = NULL;
  char err[256];
  if (krt_device_open(KRT_DEVICE_HOST, &d, err, sizeof err)) fail_msg("%s", err);
  return d;
}

#define OK(call)                                                                          \
  do {                                                                                    \
    if ((call) != 0) fail_msg("%s failed: %s", #call, err);                               \
  } while (0)

static int starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

#define assert_prefix(s, prefix)                                                          \
  do {                                                                                    \
    if (!starts_with((s), (prefix))) fail_msg("expected \"%s...\", got \"%s\"", (prefix), (s)); \
  } while (0)

#define assert_contains(s, part)                                                          \
  do {                                                                                    \
    if (!strstr((s), (part))) fail_msg("expected \"%s\" in \"%s\"", (part), (s));          \
  } while (0)

/* KILN_DEVICE as the test found it, restored after each test that sets it. */
static char *saved_env;
static int save_env(void **state) {
  (void)state;
  const char *v = getenv("KILN_DEVICE");
  saved_env = v ? strdup(v) : NULL;
  unsetenv("KILN_DEVICE");
  return 0;
}
static int restore_env(void **state) {
  (void)state;
  if (saved_env) setenv("KILN_DEVICE", saved_env, 1);
  else unsetenv("KILN_DEVICE");
  free(saved_env);
  saved_env = NULL;
  return 0;
}

/* Whether this machine has a working GPU (or the fake one). */
static int cuda_works(void) {
  krt_device *d = NULL;
  if (krt_device_open(KRT_DEVICE_CUDA, &d, NULL, 0)) return 0;
  krt_device_close(d);
  return 1;
}

static krt_device *open_cuda(void) {
  krt_device *d = NULL;
  char err[512];
  if (krt_device_open(KRT_DEVICE_CUDA, &d, err, sizeof err)) fail_msg("%s", err);
  return d;
}

/* Run fn on the host device, then on cuda if it opens. */
static void on_each_device(void (*fn)(krt_device *)) {
  krt_device *d = open_host();
  fn(d);
  krt_device_close(d);
  if (cuda_works()) {
    d = open_cuda();
    fn(d);
    krt_device_close(d);
  }
}

static void gpu_launch_checks(krt_device *d, krt_module *m);

/* ---- choosing a device ---------------------------------------------------- */
static void test_kind_parse(void **state) {
  (void)state;
  krt_device_kind k = KRT_DEVICE_CUDA;
  assert_int_equal(krt_device_kind_parse("host", &k), 0);
  assert_int_equal(k, KRT_DEVICE_HOST);
  assert_int_equal(krt_device_kind_parse("cuda", &k), 0);
  assert_int_equal(k, KRT_DEVICE_CUDA);
  assert_int_equal(krt_device_kind_parse("auto", &k), 0);
  assert_int_equal(k, KRT_DEVICE_AUTO);
  k = KRT_DEVICE_HOST;
  const char *bad[] = {"", "HOST", "gpu", "cuda ", "hos", "cpu"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(krt_device_kind_parse(bad[i], &k), -1);
  assert_int_equal(krt_device_kind_parse(NULL, &k), -1);
  assert_int_equal(k, KRT_DEVICE_HOST); /* untouched on failure */
}

static void test_open_host(void **state) {
  (void)state;
  const char *old = getenv("KL_EMU_THREADS");
  char *saved = old ? strdup(old) : NULL;
  setenv("KL_EMU_THREADS", "3", 1);
  krt_device *d = open_host();
  assert_int_equal(krt_device_kind_of(d), KRT_DEVICE_HOST);
  assert_string_equal(krt_device_name(d), "host (3 threads)");
  krt_device_close(d);
  setenv("KL_EMU_THREADS", "1", 1);
  d = open_host();
  assert_string_equal(krt_device_name(d), "host (1 thread)");
  krt_device_close(d);
  if (saved) setenv("KL_EMU_THREADS", saved, 1);
  else unsetenv("KL_EMU_THREADS");
  free(saved);
  d = open_host();
  assert_prefix(krt_device_name(d), "host (");
  krt_device_close(d);
  krt_device_close(NULL);
}

static void test_open_cuda_without_driver(void **state) {
  (void)state;
  krt_device *d = (krt_device *)&d; /* must be reset to NULL */
  char err[512] = "";
  if (krt_device_open(KRT_DEVICE_CUDA, &d, err, sizeof err) == 0) {
    krt_device_close(d);
    skip();
  }
  assert_null(d);
  /* No libcuda at all (this machine), or a driver without a usable GPU. */
  if (!starts_with(err, "cuInit: ")) {
    assert_prefix(err, "no CUDA driver (libcuda.so.1 not found): ");
    assert_contains(err, "libcuda.so.1: cannot open shared object file");
  }
}

static void test_auto_and_env(void **state) {
  (void)state;
  char err[512] = "";
  krt_device *d = NULL;
  int gpu = cuda_works();
  /* AUTO without KILN_DEVICE: the GPU if it works, else the host, silently. */
  OK(krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err));
  assert_int_equal(krt_device_kind_of(d), gpu ? KRT_DEVICE_CUDA : KRT_DEVICE_HOST);
  krt_device_close(d);

  setenv("KILN_DEVICE", "host", 1);
  OK(krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err));
  assert_int_equal(krt_device_kind_of(d), KRT_DEVICE_HOST);
  krt_device_close(d);

  setenv("KILN_DEVICE", "auto", 1);
  OK(krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err));
  assert_int_equal(krt_device_kind_of(d), gpu ? KRT_DEVICE_CUDA : KRT_DEVICE_HOST);
  krt_device_close(d);

  /* KILN_DEVICE=cuda makes the missing GPU an error, not a fallback. */
  setenv("KILN_DEVICE", "cuda", 1);
  int rc = krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err);
  if (gpu) {
    assert_int_equal(rc, 0);
    assert_int_equal(krt_device_kind_of(d), KRT_DEVICE_CUDA);
    krt_device_close(d);
  } else {
    assert_int_equal(rc, -1);
    assert_null(d);
    assert_true(starts_with(err, "no CUDA driver") || starts_with(err, "cuInit: "));
  }

  /* The environment overrides AUTO only: an explicit kind wins. */
  OK(krt_device_open(KRT_DEVICE_HOST, &d, err, sizeof err));
  assert_int_equal(krt_device_kind_of(d), KRT_DEVICE_HOST);
  krt_device_close(d);

  setenv("KILN_DEVICE", "gpu", 1);
  assert_int_equal(krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err), -1);
  assert_string_equal(err, "KILN_DEVICE=gpu: expected host, cuda or auto");

  setenv("KILN_DEVICE", "", 1); /* empty is unset */
  OK(krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err));
  krt_device_close(d);

  assert_int_equal(krt_device_open((krt_device_kind)7, &d, err, sizeof err), -1);
  assert_string_equal(err, "krt_device_open: unknown device kind 7");
  assert_int_equal(krt_device_open(KRT_DEVICE_HOST, NULL, NULL, 0), -1);
}

/* ---- memory ------------------------------------------------------------------ */
static void memory_on(krt_device *d) {
  char err[256] = "";
  enum { N = 1001 };
  float src[N], back[N];
  for (int i = 0; i < N; i++) src[i] = (float)i * 0.25f - 7.0f;
  void *p = NULL;
  OK(krt_malloc(d, sizeof src, &p, err, sizeof err));
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 64, 0);
  OK(krt_upload(d, p, src, sizeof src, err, sizeof err));
  memset(back, 0xff, sizeof back);
  OK(krt_download(d, back, p, sizeof back, err, sizeof err));
  assert_memory_equal(back, src, sizeof src);

  /* Zero a middle range only. */
  OK(krt_memset_zero(d, (char *)p + 40, 400, err, sizeof err));
  OK(krt_synchronize(d, err, sizeof err));
  OK(krt_download(d, back, p, sizeof back, err, sizeof err));
  for (int i = 0; i < N; i++)
    assert_true(back[i] == (i >= 10 && i < 110 ? 0.0f : src[i]));

  /* Empty requests succeed and do nothing. */
  void *z = (void *)&z;
  OK(krt_malloc(d, 0, &z, err, sizeof err));
  assert_null(z);
  OK(krt_upload(d, NULL, NULL, 0, err, sizeof err));
  OK(krt_memset_zero(d, NULL, 0, err, sizeof err));
  krt_free(d, NULL);
  krt_free(NULL, p); /* no device: nothing to do, and no crash */

  assert_int_equal(krt_upload(d, p, NULL, 8, err, sizeof err), -1);
  assert_string_equal(err, "krt_upload of 8 bytes: source pointer is NULL");
  assert_int_equal(krt_download(d, NULL, p, 8, err, sizeof err), -1);
  assert_string_equal(err, "krt_download of 8 bytes: destination pointer is NULL");
  assert_int_equal(krt_malloc(d, 16, NULL, NULL, 0), -1); /* err may be NULL */
  krt_free(d, p);
}

static void test_memory(void **state) {
  (void)state;
  on_each_device(memory_on);
}

/* Far more than any machine has: a message with the size, not a crash. */
static void test_host_out_of_memory(void **state) {
  (void)state;
  char err[256] = "";
  krt_device *d = open_host();
  void *huge = NULL;
  assert_int_equal(krt_malloc(d, SIZE_MAX - 8, &huge, err, sizeof err), -1);
  assert_null(huge);
  assert_string_equal(err, "krt_malloc: out of host memory (18446744073709551607 bytes asked)");
  krt_device_close(d);
}

/* ---- modules and launches ------------------------------------------------------ */
static void test_module_launch(void **state) {
  (void)state;
  char err[512] = "";
  krt_device *d = open_host();
  krt_kernel_desc kernels[] = {{"axpy", &axpy__emu}, {"block_reverse", &block_reverse__emu}};
  krt_module_desc desc = {kernels, 2, NULL, 0, NULL};
  krt_module *m = NULL;
  OK(krt_module_load(d, &desc, &m, err, sizeof err));
  memset(kernels, 0, sizeof kernels); /* the module keeps its own copy */

  enum { N = 1000, B = 128, NB = 4 };
  float x[NB * B], y[NB * B], back[NB * B];
  for (int i = 0; i < NB * B; i++) {
    x[i] = (float)i;
    y[i] = 1.0f - (float)i;
  }
  void *dx, *dy;
  OK(krt_malloc(d, sizeof x, &dx, err, sizeof err));
  OK(krt_malloc(d, sizeof y, &dy, err, sizeof err));
  OK(krt_upload(d, dx, x, sizeof x, err, sizeof err));
  OK(krt_upload(d, dy, y, sizeof y, err, sizeof err));

  float a = 2.0f;
  int n = N < NB * B ? N : NB * B;
  void *args[] = {&a, &dx, &dy, &n};
  OK(krt_launch(m, 0, d3(3, 1, 1), d3(64, 1, 1), 0, args, err, sizeof err));
  OK(krt_synchronize(d, err, sizeof err));
  OK(krt_download(d, back, dy, sizeof back, err, sizeof err));
  for (int i = 0; i < NB * B; i++) assert_true(back[i] == (i < n ? 2.0f * x[i] + y[i] : y[i]));

  void *args2[] = {&dx, &dy};
  OK(krt_launch(m, 1, d3(NB, 1, 1), d3(B, 1, 1), B * sizeof(float), args2, err, sizeof err));
  OK(krt_download(d, back, dy, sizeof back, err, sizeof err));
  for (int blk = 0; blk < NB; blk++)
    for (int t = 0; t < B; t++) assert_true(back[blk * B + t] == x[blk * B + B - 1 - t]);

  /* Errors name the kernel. */
  assert_int_equal(krt_launch(m, 2, d3(1, 1, 1), d3(1, 1, 1), 0, args, err, sizeof err), -1);
  assert_string_equal(err, "krt_launch: kernel index 2 out of range (module has 2)");
  assert_int_equal(krt_launch(m, -1, d3(1, 1, 1), d3(1, 1, 1), 0, args, err, sizeof err), -1);
  assert_int_equal(krt_launch(m, 0, d3(1, 1, 1), d3(2048, 1, 1), 0, args, err, sizeof err), -1);
  assert_contains(err, "kernel axpy");
  assert_int_equal(krt_launch(NULL, 0, d3(1, 1, 1), d3(1, 1, 1), 0, args, err, sizeof err), -1);

  krt_free(d, dx);
  krt_free(d, dy);
  gpu_launch_checks(d, m); /* what test_gpu_module_launch asks of a GPU */
  krt_module_unload(m);
  krt_module_unload(NULL);

  /* A GPU-only build (no host entries) is refused at load, by kernel name. */
  krt_kernel_desc gpu_only[] = {{"axpy", &axpy__emu}, {"fused_softmax_3", NULL}};
  krt_module_desc gdesc = {gpu_only, 2, NULL, 0, "// ptx"};
  m = (krt_module *)&m;
  assert_int_equal(krt_module_load(d, &gdesc, &m, err, sizeof err), -1);
  assert_null(m);
  assert_string_equal(err, "kernel fused_softmax_3 was not built for the host (the program was "
                           "compiled for the GPU only)");

  krt_kernel_desc unnamed[] = {{NULL, &axpy__emu}};
  krt_module_desc udesc = {unnamed, 1, NULL, 0, NULL};
  assert_int_equal(krt_module_load(d, &udesc, &m, err, sizeof err), -1);
  assert_string_equal(err, "krt_module_load: kernel 0 has no name");

  /* An empty module is fine (a graph with no kernels of its own). */
  krt_module_desc empty = {NULL, 0, NULL, 0, NULL};
  OK(krt_module_load(d, &empty, &m, err, sizeof err));
  krt_module_unload(m);
  krt_device_close(d);
}

/* ---- GEMM -------------------------------------------------------------------------- */
static void put(krt_dtype t, void *buf, int64_t i, double v) {
  switch (t) {
  case KRT_F32: ((float *)buf)[i] = (float)v; break;
  case KRT_F64: ((double *)buf)[i] = v; break;
  case KRT_F16: ((uint16_t *)buf)[i] = krt_f32_to_f16((float)v); break;
  case KRT_BF16: ((uint16_t *)buf)[i] = krt_f32_to_bf16((float)v); break;
  default: fail();
  }
}

static double get(krt_dtype t, const void *buf, int64_t i) {
  switch (t) {
  case KRT_F32: return ((const float *)buf)[i];
  case KRT_F64: return ((const double *)buf)[i];
  case KRT_F16: return krt_f16_to_f32(((const uint16_t *)buf)[i]);
  case KRT_BF16: return krt_bf16_to_f32(((const uint16_t *)buf)[i]);
  default: fail();
  }
  return 0;
}

static uint64_t rng = 88172645463325252ull;
static double uniform(void) { /* xorshift64, in [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

typedef struct {
  int ta, tb;
  int64_t m, n, k, batch;
  int pad;              /* extra columns in every leading dimension */
  int bcast_a, bcast_b; /* stride 0 */
  double alpha, beta;
} gcase;

/* Buffer of `count` elements of random values (already rounded to t). */
static void *random_buf(krt_dtype t, int64_t count) {
  void *b = malloc((size_t)(count > 0 ? count : 1) * krt_dtype_size(t));
  assert_non_null(b);
  for (int64_t i = 0; i < count; i++) put(t, b, i, uniform());
  return b;
}

static void *to_device(krt_device *d, const void *host, size_t bytes) {
  char err[256] = "";
  void *p = NULL;
  OK(krt_malloc(d, bytes, &p, err, sizeof err));
  OK(krt_upload(d, p, host, bytes, err, sizeof err));
  return p;
}

static void run_gemm(krt_device *d, krt_dtype t, gcase c) {
  const size_t es = krt_dtype_size(t);
  const int64_t rows_a = c.ta ? c.k : c.m, cols_a = c.ta ? c.m : c.k;
  const int64_t rows_b = c.tb ? c.n : c.k, cols_b = c.tb ? c.k : c.n;
  const int64_t lda = (cols_a ? cols_a : 1) + c.pad, ldb = (cols_b ? cols_b : 1) + c.pad,
                ldc = c.n + c.pad;
  const int64_t sa = c.bcast_a ? 0 : rows_a * lda, sb = c.bcast_b ? 0 : rows_b * ldb,
                sc = c.m * ldc + c.pad;
  const int64_t na = (c.bcast_a ? 1 : c.batch) * rows_a * lda,
                nb = (c.bcast_b ? 1 : c.batch) * rows_b * ldb, nc = c.batch * sc;
  void *A = random_buf(t, na), *B = random_buf(t, nb), *C0 = random_buf(t, nc);
  void *C = malloc((size_t)nc * es);
  assert_non_null(C);
  void *dA = to_device(d, A, (size_t)na * es), *dB = to_device(d, B, (size_t)nb * es),
       *dC = to_device(d, C0, (size_t)nc * es);

  krt_gemm_desc g = {.dtype = t, .trans_a = c.ta, .trans_b = c.tb, .m = c.m, .n = c.n,
                     .k = c.k, .batch = c.batch, .a = dA, .lda = lda, .stride_a = sa,
                     .b = dB, .ldb = ldb, .stride_b = sb, .c = dC, .ldc = ldc,
                     .stride_c = sc, .alpha = c.alpha, .beta = c.beta};
  char err[512] = "";
  OK(krt_gemm(d, &g, err, sizeof err));
  OK(krt_synchronize(d, err, sizeof err));
  OK(krt_download(d, C, dC, (size_t)nc * es, err, sizeof err));

  /* f32/f16/bf16 accumulate in f32; halves are rounded once at the end. */
  const double tol = t == KRT_F64 ? 1e-13 : t == KRT_F32 ? 2e-6 : t == KRT_F16 ? 2e-3 : 1e-2;
  for (int64_t b = 0; b < c.batch; b++)
    for (int64_t i = 0; i < c.m; i++)
      for (int64_t j = 0; j < ldc; j++) {
        int64_t ci = b * sc + i * ldc + j;
        double got = get(t, C, ci);
        if (j >= c.n) { /* padding is never written */
          assert_true(got == get(t, C0, ci));
          continue;
        }
        double sum = 0, mag = 0;
        for (int64_t p = 0; p < c.k; p++) {
          double x = get(t, A, b * sa + (c.ta ? p * lda + i : i * lda + p));
          double y = get(t, B, b * sb + (c.tb ? j * ldb + p : p * ldb + j));
          sum += x * y;
          mag += fabs(x * y);
        }
        double c0 = get(t, C0, ci);
        double want = c.alpha * sum + c.beta * c0;
        double scale = fabs(c.alpha) * mag + fabs(c.beta * c0) + 1e-30;
        if (!(fabs(got - want) <= tol * scale))
          fail_msg("%s gemm ta=%d tb=%d %lldx%lldx%lld batch %lld: C[%lld][%lld][%lld] = %.9g, "
                   "want %.9g",
                   krt_dtype_name(t), c.ta, c.tb, (long long)c.m, (long long)c.n,
                   (long long)c.k, (long long)c.batch, (long long)b, (long long)i,
                   (long long)j, got, want);
      }
  krt_free(d, dA);
  krt_free(d, dB);
  krt_free(d, dC);
  free(A);
  free(B);
  free(C0);
  free(C);
}

static const gcase gemm_cases[] = {
    /* ta tb  m   n    k batch pad ba bb alpha beta */
    {0, 0, 5, 7, 3, 1, 0, 0, 0, 1.0, 0.0},
    {1, 0, 4, 6, 9, 1, 2, 0, 0, 0.5, 2.0},
    {0, 1, 33, 17, 65, 1, 1, 0, 0, -1.5, 1.0},
    {1, 1, 8, 3, 5, 3, 3, 0, 0, 2.0, -0.5},
    {0, 1, 6, 5, 7, 4, 0, 1, 0, 1.0, 0.0},   /* one A for every batch item */
    {1, 0, 3, 9, 4, 3, 1, 0, 1, 1.0, 1.0},   /* one B (a shared weight) */
    {0, 0, 4, 4, 0, 2, 0, 0, 0, 1.0, 0.5},   /* k = 0: C = beta * C */
    {0, 0, 70, 90, 130, 2, 0, 0, 0, 1.0, 0.0}, /* big enough for blocked kernels */
    {1, 1, 1, 1, 1, 1, 0, 0, 0, 3.0, 0.0},
};

#define GEMM_TEST(T)                                                                      \
  static void gemm_cases_##T(krt_device *d) {                                             \
    for (size_t i = 0; i < sizeof gemm_cases / sizeof gemm_cases[0]; i++)                 \
      run_gemm(d, KRT_##T, gemm_cases[i]);                                                 \
  }                                                                                       \
  static void test_gemm_##T(void **state) {                                               \
    (void)state;                                                                          \
    on_each_device(gemm_cases_##T);                                                       \
  }
GEMM_TEST(F32)
GEMM_TEST(F64)
GEMM_TEST(F16)
GEMM_TEST(BF16)

/* beta = 0 means C is not read (BLAS): NaN there must not leak through. */
static void beta0_on(krt_device *d) {
  const krt_dtype types[] = {KRT_F32, KRT_F64, KRT_F16, KRT_BF16};
  for (size_t ti = 0; ti < 4; ti++) {
    krt_dtype t = types[ti];
    double a[4], b[4], c[4]; /* storage for 4 elements of any of the types */
    for (int i = 0; i < 4; i++) {
      put(t, a, i, i + 1); /* [[1 2] [3 4]] */
      put(t, b, i, i == 0 || i == 3); /* identity */
      put(t, c, i, NAN);
    }
    void *da = to_device(d, a, sizeof a), *db = to_device(d, b, sizeof b),
         *dc = to_device(d, c, sizeof c);
    krt_gemm_desc g = {.dtype = t, .m = 2, .n = 2, .k = 2, .batch = 1, .a = da, .lda = 2,
                       .b = db, .ldb = 2, .c = dc, .ldc = 2, .alpha = 1.0};
    char err[256] = "";
    OK(krt_gemm(d, &g, err, sizeof err));
    OK(krt_download(d, c, dc, sizeof c, err, sizeof err));
    for (int i = 0; i < 4; i++) assert_true(get(t, c, i) == i + 1);
    krt_free(d, da);
    krt_free(d, db);
    krt_free(d, dc);
  }
}

static void test_gemm_beta0_ignores_c(void **state) {
  (void)state;
  on_each_device(beta0_on);
}

/* The outer batch and the epilogue against loops written out here, on
 * each device (cuda: cuBLASLt, the fake one without a GPU):
 * C[o][b] (2x3, items side by side within rows of 6) =
 *   relu(A[o][b] @ B + C_in + bias), with A's items at o*stride_a2 + b*stride_a. */
static void batch2_epilogue_on(krt_device *d) {
  enum { O = 2, NB = 2, M = 2, K = 3, N = 3, LDC = 6, NA = O * NB * M * K, NCC = O * M * LDC };
  float a[NA], b[K * N], cin[NCC], bias[N], c[NCC];
  for (int i = 0; i < NA; i++) a[i] = (float)((i * 7 % 11) - 5);
  for (int i = 0; i < K * N; i++) b[i] = (float)((i * 5 % 7) - 3);
  for (int i = 0; i < NCC; i++) cin[i] = (float)((i % 5) - 2), c[i] = 99;
  for (int i = 0; i < N; i++) bias[i] = (float)(i - 1);
  char err[256] = "";
  void *da, *db, *dcin, *dbias, *dc;
  OK(krt_malloc(d, sizeof a, &da, err, sizeof err));
  OK(krt_malloc(d, sizeof b, &db, err, sizeof err));
  OK(krt_malloc(d, sizeof cin, &dcin, err, sizeof err));
  OK(krt_malloc(d, sizeof bias, &dbias, err, sizeof err));
  OK(krt_malloc(d, sizeof c, &dc, err, sizeof err));
  OK(krt_upload(d, da, a, sizeof a, err, sizeof err));
  OK(krt_upload(d, db, b, sizeof b, err, sizeof err));
  OK(krt_upload(d, dcin, cin, sizeof cin, err, sizeof err));
  OK(krt_upload(d, dbias, bias, sizeof bias, err, sizeof err));
  OK(krt_upload(d, dc, c, sizeof c, err, sizeof err));
  krt_gemm_desc g = {.dtype = KRT_F32, .m = M, .n = N, .k = K, .batch = NB,
                     .a = da, .lda = K, .stride_a = M * K,
                     .b = db, .ldb = N, .stride_b = 0,
                     .c = dc, .ldc = LDC, .stride_c = N, .alpha = 1, .beta = 1,
                     .batch2 = O, .stride_a2 = NB * M * K, .stride_b2 = 0, .stride_c2 = M * LDC,
                     .c_in = dcin, .bias = dbias, .relu = 1};
  OK(krt_gemm(d, &g, err, sizeof err));
  OK(krt_download(d, c, dc, sizeof c, err, sizeof err));
  for (int o = 0; o < O; o++)
    for (int bi = 0; bi < NB; bi++)
      for (int r = 0; r < M; r++)
        for (int q = 0; q < N; q++) {
          double want = 0;
          for (int k = 0; k < K; k++) want += a[((o * NB + bi) * M + r) * K + k] * b[k * N + q];
          int at = o * M * LDC + r * LDC + bi * N + q;
          want += cin[at] + bias[q];
          assert_float_equal(c[at], want < 0 ? 0 : want, 1e-6);
        }
  /* the bias alone, no relu, C_in = C (the common case of a linear layer) */
  OK(krt_upload(d, dc, cin, sizeof cin, err, sizeof err));
  g.c_in = NULL, g.relu = 0, g.beta = 0;
  OK(krt_gemm(d, &g, err, sizeof err));
  OK(krt_download(d, c, dc, sizeof c, err, sizeof err));
  for (int q = 0; q < N; q++) {
    double want = bias[q];
    for (int k = 0; k < K; k++) want += a[k] * b[k * N + q];
    assert_float_equal(c[q], want, 1e-6);
  }
  /* items that would overlap are refused */
  g.stride_c = 2;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);
  krt_free(d, da), krt_free(d, db), krt_free(d, dcin), krt_free(d, dbias), krt_free(d, dc);
}

static void test_gemm_batch2_epilogue(void **state) {
  (void)state;
  on_each_device(batch2_epilogue_on);
}

/* The profiler's marks on the host: the clock, so the time between two
 * marks covers what ran between them; the copy bandwidth is positive. */
static void test_profile_marks(void **state) {
  (void)state;
  krt_device *d = open_host();
  char err[256] = "";
  double ms[2] = {-1, -1}, gbps = 0;
  OK(krt_mark(d, 0, err, sizeof err)); /* off: a no-op */
  OK(krt_profile_enable(d, 3, err, sizeof err));
  OK(krt_mark(d, 0, err, sizeof err));
  double t0 = krt_now_ms();
  while (krt_now_ms() - t0 < 2) continue;
  OK(krt_mark(d, 1, err, sizeof err));
  OK(krt_mark(d, 2, err, sizeof err));
  OK(krt_profile_read(d, ms, 2, err, sizeof err));
  assert_true(ms[0] >= 2 && ms[1] >= 0 && ms[1] < ms[0]);
  assert_int_equal(krt_mark(d, 3, err, sizeof err), -1);
  assert_string_equal(err, "krt_mark: mark 3, profiling has 3");
  assert_int_equal(krt_profile_read(d, ms, 3, err, sizeof err), -1);
  OK(krt_copy_bandwidth(d, 1 << 20, 3, &gbps, err, sizeof err));
  assert_true(gbps > 0);
  OK(krt_mark(d, 2, err, sizeof err)); /* the model's marks survive the copy */
  OK(krt_profile_enable(d, 0, err, sizeof err));
  krt_device_close(d);
}

static void test_gemm_errors(void **state) {
  (void)state;
  krt_device *d = open_host();
  float a[16] = {0}, b[16] = {0}, c[16] = {0};
  char err[512] = "";
  krt_gemm_desc ok = {.dtype = KRT_F32, .m = 2, .n = 2, .k = 2, .batch = 1, .a = a, .lda = 2,
                      .stride_a = 4, .b = b, .ldb = 2, .stride_b = 4, .c = c, .ldc = 2,
                      .stride_c = 4, .alpha = 1.0};
  OK(krt_gemm(d, &ok, err, sizeof err));

  krt_gemm_desc g = ok;
  g.dtype = KRT_I32;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);
  assert_string_equal(err, "krt_gemm: dtype i32 is not supported (f32, f64, f16, bf16)");

  g = ok;
  g.trans_a = 1;
  g.m = 3;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);
  assert_prefix(err, "krt_gemm 3x2x2: lda=2, expected 3..");

  g = ok;
  g.k = -1;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);
  assert_prefix(err, "krt_gemm: m=2 n=2 k=-1 batch=1: each must be in 0..");

  g = ok;
  g.k = (int64_t)1 << 31;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);

  g = ok;
  g.stride_b = -4;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);
  assert_string_equal(err, "krt_gemm: stride_b=-4 is negative");

  g = ok;
  g.batch = 2;
  g.stride_c = 0;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);
  assert_prefix(err, "krt_gemm: stride_c=0, stride_c2=0 make the 1 x 2 C matrices");

  g = ok;
  g.b = NULL;
  assert_int_equal(krt_gemm(d, &g, err, sizeof err), -1);
  assert_string_equal(err, "krt_gemm: matrix b is NULL");

  /* Nothing to compute: fine even with NULL matrices. */
  g = ok;
  g.m = 0;
  g.a = g.b = g.c = NULL;
  OK(krt_gemm(d, &g, err, sizeof err));
  assert_int_equal(krt_gemm(d, NULL, err, sizeof err), -1);
  krt_device_close(d);
}

/* ---- the cuda device on the fake driver ------------------------------------------- */
static int fake_cuda(void) { return getenv("KILN_FAKE_CUDA") != NULL; }

/* A query function of fake_libcuda.c, from the copy libkilnrt loaded. */
static void *fake_fn(const char *name) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(lib);
  void *p = dlsym(lib, name);
  dlclose(lib);
  assert_non_null(p);
  return p;
}
static int fake_ctx_refs(void) {
  int (*f)(void);
  void *p = fake_fn("fake_cuda_ctx_refs");
  memcpy(&f, &p, sizeof p);
  return f();
}
static size_t fake_used(void) {
  size_t (*f)(void);
  void *p = fake_fn("fake_cuda_used");
  memcpy(&f, &p, sizeof p);
  return f();
}
static const char *fake_last_image(void) {
  const char *(*f)(void);
  void *p = fake_fn("fake_cuda_last_image");
  memcpy(&f, &p, sizeof p);
  return f();
}

/* A driver older than the toolkit's major version: refused at open, named. */
static void test_fake_cuda_old_driver(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[512] = "";
  krt_device *d = NULL;
  setenv("FAKE_CUDA_DRIVER", "12080", 1);
  assert_int_equal(krt_device_open(KRT_DEVICE_CUDA, &d, err, sizeof err), -1);
  assert_null(d);
  char want[256];
  snprintf(want, sizeof want, "the GPU driver supports CUDA 12.8; this program was built with CUDA %d.%d and "
           "needs a driver for CUDA %d or newer (update the NVIDIA driver)", CUDA_VERSION / 1000,
           CUDA_VERSION % 1000 / 10, CUDA_VERSION / 1000);
  assert_string_equal(err, want);
  /* auto passes over it to the host device */
  OK(krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err));
  assert_int_equal(krt_device_kind_of(d), KRT_DEVICE_HOST);
  krt_device_close(d);
  unsetenv("FAKE_CUDA_DRIVER");
  OK(krt_device_open(KRT_DEVICE_CUDA, &d, err, sizeof err));
  krt_device_close(d);
}

static void test_fake_cuda_open(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[512] = "";
  krt_device *d = open_cuda(), *d2 = open_cuda();
  assert_int_equal(krt_device_kind_of(d), KRT_DEVICE_CUDA);
  assert_string_equal(krt_device_name(d), "cuda: Fake GPU");
  assert_int_equal(fake_ctx_refs(), 2); /* both share the primary context */
  krt_device_close(d2);
  krt_device_close(d);
  assert_int_equal(fake_ctx_refs(), 0);

  /* A driver without a GPU: a named error for cuda, the host for AUTO. */
  setenv("FAKE_CUDA_NODEV", "1", 1);
  d = (krt_device *)&d;
  assert_int_equal(krt_device_open(KRT_DEVICE_CUDA, &d, err, sizeof err), -1);
  assert_null(d);
  assert_string_equal(err, "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)");
  OK(krt_device_open(KRT_DEVICE_AUTO, &d, err, sizeof err));
  assert_int_equal(krt_device_kind_of(d), KRT_DEVICE_HOST);
  krt_device_close(d);
  unsetenv("FAKE_CUDA_NODEV");
}

static void test_fake_cuda_out_of_memory(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[512] = "";
  setenv("FAKE_CUDA_MEM", "1048576", 1);
  krt_device *d = open_cuda();
  void *p = NULL, *q = (void *)&q;
  OK(krt_malloc(d, 4096, &p, err, sizeof err));
  assert_int_equal(krt_malloc(d, 2u << 20, &q, err, sizeof err), -1);
  assert_null(q);
  assert_string_equal(err, "cuMemAlloc: out of GPU memory on cuda: Fake GPU: 2097152 bytes "
                           "(2.0 MiB) asked, 1044480 bytes (1.0 MiB) free of 1048576 (1.0 MiB) "
                           "(CUDA_ERROR_OUT_OF_MEMORY)");
  krt_free(d, p);
  assert_int_equal(fake_used(), 0);
  krt_device_close(d);
  unsetenv("FAKE_CUDA_MEM");
}

static const unsigned char cubin80[] = "cubin:sm_80", cubin90[] = "cubin:sm_90";
static const krt_cubin two_cubins[] = {{80, cubin80, sizeof cubin80},
                                       {90, cubin90, sizeof cubin90}};

static void test_fake_cuda_modules(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[1024] = "";
  krt_kernel_desc kernels[] = {{"axpy", NULL}, {"faults", &axpy__emu}};
  krt_module_desc desc = {kernels, 2, two_cubins, 2, "ptx:generic"};
  krt_module *m = NULL;

  /* The cubin of the device's architecture, exactly. */
  krt_device *d = open_cuda();
  OK(krt_module_load(d, &desc, &m, err, sizeof err));
  assert_string_equal(fake_last_image(), "cubin:sm_90");
  krt_module_unload(m);
  krt_device_close(d);

  /* A newer GPU than any cubin: the PTX. */
  setenv("FAKE_CUDA_SM", "100", 1);
  d = open_cuda();
  OK(krt_module_load(d, &desc, &m, err, sizeof err));
  assert_string_equal(fake_last_image(), "ptx:generic");
  krt_module_unload(m);

  desc.ptx = NULL;
  assert_int_equal(krt_module_load(d, &desc, &m, err, sizeof err), -1);
  assert_null(m);
  assert_string_equal(err, "no code for this GPU (cuda: Fake GPU, sm_100): the program has cubins "
                           "for sm_80, sm_90 and no PTX; compile it for sm_100");

  desc.ptx = "ptx:bad";
  assert_int_equal(krt_module_load(d, &desc, &m, err, sizeof err), -1);
  assert_string_equal(err, "cuModuleLoadDataEx(PTX for sm_100): CUDA_ERROR_INVALID_PTX (a PTX JIT "
                           "compilation failed)\nptxas fatal: Unresolved extern function 'nope'");
  krt_device_close(d);
  unsetenv("FAKE_CUDA_SM");

  /* The driver's rules, which the fake enforces too: an sm_86 card runs
   * the sm_80 cubin (same major, lower minor); sm_75 runs neither cubin nor
   * compute_90 PTX; sm_120 runs none of the cubins but JITs the PTX. */
  desc.ptx = "ptx:\n.version 8.0\n.target sm_90\n";
  setenv("FAKE_CUDA_SM", "86", 1);
  d = open_cuda();
  OK(krt_module_load(d, &desc, &m, err, sizeof err));
  assert_string_equal(fake_last_image(), "cubin:sm_80");
  krt_module_unload(m);
  krt_device_close(d);
  setenv("FAKE_CUDA_SM", "75", 1);
  d = open_cuda();
  assert_int_equal(krt_module_load(d, &desc, &m, err, sizeof err), -1);
  assert_string_equal(err, "no code for this GPU (cuda: Fake GPU, sm_75): the program has cubins "
                           "for sm_80, sm_90 and PTX for compute_90; compile it for sm_75");
  krt_device_close(d);
  setenv("FAKE_CUDA_SM", "120", 1);
  d = open_cuda();
  OK(krt_module_load(d, &desc, &m, err, sizeof err));
  assert_string_equal(fake_last_image(), "ptx:\n.version 8.0\n.target sm_90\n");
  krt_module_unload(m);
  krt_device_close(d);
  /* the fake refuses what a driver would: a cubin of another major */
  static const unsigned char cubin90_only[] = "cubin:sm_90";
  krt_cubin mislabelled = {86, cubin90_only, sizeof cubin90_only};
  krt_module_desc wrong = {kernels, 2, &mislabelled, 1, NULL};
  setenv("FAKE_CUDA_SM", "86", 1);
  d = open_cuda();
  assert_int_equal(krt_module_load(d, &wrong, &m, err, sizeof err), -1);
  assert_non_null(strstr(err, "CUDA_ERROR_NO_BINARY_FOR_GPU"));
  krt_device_close(d);
  unsetenv("FAKE_CUDA_SM");
  /* ... and PTX of an ISA newer than the driver's (CUDA 13.0 knows PTX 9.0;
   * 9.1 is a newer toolkit's): refused by name, like a real driver */
  setenv("FAKE_CUDA_SM", "120", 1); /* no cubin fits: the PTX must */
  krt_module_desc future = desc;
  future.ptx = "ptx:\n.version 9.1\n.target sm_90\n";
  d = open_cuda();
  assert_int_equal(krt_module_load(d, &future, &m, err, sizeof err), -1);
  assert_non_null(strstr(err, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"));
  future.ptx = "ptx:\n.version 9.0\n.target sm_90\n";
  OK(krt_module_load(d, &future, &m, err, sizeof err));
  krt_module_unload(m);
  krt_device_close(d);
  unsetenv("FAKE_CUDA_SM");

  d = open_cuda();
  krt_kernel_desc missing[] = {{"axpy", NULL}, {"missing", NULL}};
  krt_module_desc mdesc = {missing, 2, two_cubins, 2, NULL};
  assert_int_equal(krt_module_load(d, &mdesc, &m, err, sizeof err), -1);
  assert_string_equal(err, "cuModuleGetFunction(kernel missing): CUDA_ERROR_NOT_FOUND (named "
                           "symbol not found)");
  krt_device_close(d);
  assert_int_equal(fake_ctx_refs(), 0);
}

static void test_fake_cuda_launch(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[512] = "";
  krt_kernel_desc kernels[] = {{"axpy", NULL}, {"faults", NULL}};
  krt_module_desc desc = {kernels, 2, two_cubins, 2, NULL};
  krt_device *d = open_cuda();
  krt_module *m = NULL;
  OK(krt_module_load(d, &desc, &m, err, sizeof err));

  enum { N = 100 };
  float x[N], y[N], back[N];
  for (int i = 0; i < N; i++) {
    x[i] = (float)i;
    y[i] = 0.5f;
  }
  void *dx = to_device(d, x, sizeof x), *dy = to_device(d, y, sizeof y);
  float a = 3.0f;
  int n = N;
  void *args[] = {&a, &dx, &dy, &n};
  OK(krt_launch(m, 0, d3(1, 1, 1), d3(128, 1, 1), 0, args, err, sizeof err));
  /* Over 48 KiB of dynamic shared memory needs the kernel's opt-in, which
   * the fake driver insists on like the real one. */
  OK(krt_launch(m, 0, d3(1, 1, 1), d3(128, 1, 1), 64 * 1024, args, err, sizeof err));
  OK(krt_synchronize(d, err, sizeof err));
  OK(krt_download(d, back, dy, sizeof back, err, sizeof err));
  for (int i = 0; i < N; i++) assert_true(back[i] == 0.5f + 6.0f * (float)i);

  assert_int_equal(krt_launch(m, 0, d3(1, 1, 1), d3(2048, 1, 1), 0, args, err, sizeof err), -1);
  assert_string_equal(err, "cuLaunchKernel(kernel axpy, grid (1,1,1), block (2048,1,1), 0 bytes "
                           "dynamic shared): CUDA_ERROR_INVALID_VALUE (invalid argument)");

  /* A fault shows up later, at the next synchronize, with the last kernel. */
  OK(krt_launch(m, 1, d3(1, 1, 1), d3(32, 1, 1), 0, args, err, sizeof err));
  assert_int_equal(krt_synchronize(d, err, sizeof err), -1);
  assert_string_equal(err, "cuCtxSynchronize (last launch: kernel faults): "
                           "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)");
  krt_free(d, dx);
  krt_free(d, dy);
  krt_module_unload(m);
  krt_device_close(d);
  assert_int_equal(fake_used(), 0);
}

/* ---- the gradient exchange through (fake) NCCL ------------------------------
 * A communicator of two ranks whose broadcast leaves the buffer as it is:
 * rank 0's NCCL id stays its own, rank 1's stays zeros (which the fake
 * NCCL refuses, as a real one refuses an id no rank 0 made). */
static int test_bcast(krt_comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen) {
  (void)c, (void)buf, (void)bytes, (void)root, (void)err, (void)errlen;
  return 0;
}
static void test_abort(krt_comm *c, const char *what) {
  (void)c;
  fail_msg("the exchange timed out: %s", what);
}
static const krt_comm_ops test_comm_ops = {.broadcast = test_bcast, .abort = test_abort};

/* The fake GPU's call log, one call a line. */
static int read_log(const char *path, char lines[][160], int max) {
  FILE *f = fopen(path, "r");
  int n = 0;
  if (!f) return 0;
  while (n < max && fgets(lines[n], 160, f)) lines[n][strcspn(lines[n], "\n")] = 0, n++;
  fclose(f);
  return n;
}

/* The first line at or after *at that starts with prefix (its index), or
 * a failure naming what was expected. */
static int next_line(char lines[][160], int n, int *at, const char *prefix) {
  for (int i = *at; i < n; i++)
    if (starts_with(lines[i], prefix)) return *at = i + 1, i;
  fail_msg("no \"%s...\" in the call log after line %d", prefix, *at);
  return -1;
}

static void test_fake_cuda_exchange(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[512] = "", log[] = "/tmp/kiln-fake-gpu-XXXXXX";
  int fd = mkstemp(log);
  assert_true(fd >= 0);
  close(fd);
  setenv("FAKE_GPU_LOG", log, 1);
  krt_comm comm = {.ops = &test_comm_ops, .rank = 0, .size = 2, .timeout_s = 5, .step = 7};
  enum { A = 5, B = 3 };
  float a[A] = {1, 2, 3, 4, 5}, b[B] = {-1, 0.5f, 8}, back[A];

  /* no NCCL: the library is named */
  setenv("KILN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  krt_device *d = open_cuda();
  krt_device_set_comm(d, &comm);
  void *src[2], *dst[2];
  OK(krt_malloc(d, sizeof a, &src[0], err, sizeof err));
  OK(krt_malloc(d, sizeof b, &src[1], err, sizeof err));
  OK(krt_malloc(d, sizeof a, &dst[0], err, sizeof err));
  OK(krt_malloc(d, sizeof b, &dst[1], err, sizeof err));
  OK(krt_upload(d, src[0], a, sizeof a, err, sizeof err));
  OK(krt_upload(d, src[1], b, sizeof b, err, sizeof err));
  const int64_t numel[2] = {A, B};
  assert_int_equal(krt_all_reduce_start(d, 0, 2, src, dst, numel, KRT_F32, err, sizeof err), -1);
  assert_prefix(err, "NCCL (the data-parallel gradient exchange on GPUs) not found (tried /nonexistent/libnccl.so.2)");
  unsetenv("KILN_NCCL_LIBRARY");

  /* rank 0 of 2: the sums (the fake's other rank holds the same) and the
   * order of the calls */
  assert_int_equal(truncate(log, 0), 0);
  OK(krt_all_reduce_start(d, 0, 2, src, dst, numel, KRT_F32, err, sizeof err));
  OK(krt_all_reduce_wait(d, 0, err, sizeof err));
  OK(krt_all_reduce_wait(d, 0, err, sizeof err)); /* a second wait is no call */
  OK(krt_download(d, back, dst[0], sizeof a, err, sizeof err));
  for (int i = 0; i < A; i++) assert_true(back[i] == 2 * a[i]);
  OK(krt_download(d, back, dst[1], sizeof b, err, sizeof err));
  for (int i = 0; i < B; i++) assert_true(back[i] == 2 * b[i]);
  static char lines[64][160];
  int n = read_log(log, lines, 64), at = 0, stream, ready, done, s2, e2, rs;
  next_line(lines, n, &at, "ncclGetUniqueId");
  next_line(lines, n, &at, "ncclCommInitRank nranks=2 rank=0");
  assert_int_equal(sscanf(lines[next_line(lines, n, &at, "cuStreamCreate")], "cuStreamCreate stream=%d", &stream), 1);
  assert_non_null(strstr(lines[at - 1], "non-blocking")); /* no implicit sync with the default stream */
  /* ready: recorded on the device's stream (the one its kernels run on,
   * not the legacy stream 0) after the backward pass's kernels, and the
   * exchange's stream waits for it */
  assert_int_equal(sscanf(lines[next_line(lines, n, &at, "cuEventRecord")], "cuEventRecord event=%d stream=%d",
                          &ready, &s2), 2);
  const int dev_stream = s2;
  assert_true(dev_stream != 0 && dev_stream != stream);
  assert_int_equal(sscanf(lines[next_line(lines, n, &at, "cuStreamWaitEvent")],
                          "cuStreamWaitEvent stream=%d event=%d (recorded on stream %d)", &s2, &e2, &rs), 3);
  assert_int_equal(s2, stream);
  assert_int_equal(e2, ready);
  int group = next_line(lines, n, &at, "ncclGroupStart");
  char want[160];
  snprintf(want, sizeof want, "ncclAllReduce count=5 type=%d op=%d stream=%d", (int)ncclFloat32, (int)ncclSum, stream);
  assert_string_equal(lines[next_line(lines, n, &at, "ncclAllReduce")], want);
  snprintf(want, sizeof want, "ncclAllReduce count=3 type=%d op=%d stream=%d", (int)ncclFloat32, (int)ncclSum, stream);
  assert_string_equal(lines[next_line(lines, n, &at, "ncclAllReduce")], want);
  assert_true(next_line(lines, n, &at, "ncclGroupEnd") > group);
  /* done: recorded on the exchange's stream; the device's stream waits
   * for it at the wait, after the event is seen complete */
  assert_int_equal(sscanf(lines[next_line(lines, n, &at, "cuEventRecord")], "cuEventRecord event=%d stream=%d",
                          &done, &s2), 2);
  assert_int_equal(s2, stream);
  snprintf(want, sizeof want, "cuEventQuery event=%d", done);
  assert_string_equal(lines[next_line(lines, n, &at, "cuEventQuery")], want);
  snprintf(want, sizeof want, "cuStreamWaitEvent stream=%d event=%d (recorded on stream %d)", dev_stream, done, stream);
  assert_string_equal(lines[next_line(lines, n, &at, "cuStreamWaitEvent")], want);
  assert_int_equal(at, n); /* nothing after: the second wait made no call */

  /* an error names the call, the rank, the step and the bucket */
  setenv("FAKE_NCCL_FAIL", "allreduce", 1);
  assert_int_equal(krt_all_reduce_start(d, 1, 2, src, dst, numel, KRT_F32, err, sizeof err), -1);
  assert_string_equal(err, "ncclAllReduce (rank 0 of 2, step 7, bucket 1): unhandled error (fake NCCL)");
  unsetenv("FAKE_NCCL_FAIL");
  for (int i = 0; i < 2; i++) krt_free(d, src[i]), krt_free(d, dst[i]);
  krt_device_close(d);
  assert_int_equal(truncate(log, 0), 0);
  read_log(log, lines, 64);

  /* rank 1 without rank 0's id: NCCL refuses it, named */
  krt_comm other = comm;
  other.rank = 1;
  d = open_cuda();
  krt_device_set_comm(d, &other);
  OK(krt_malloc(d, sizeof a, &src[0], err, sizeof err));
  OK(krt_malloc(d, sizeof a, &dst[0], err, sizeof err));
  assert_int_equal(krt_all_reduce_start(d, 0, 1, src, dst, numel, KRT_F32, err, sizeof err), -1);
  assert_string_equal(err, "ncclCommInitRank (rank 1 of 2, step 7, bucket 0): invalid argument (fake NCCL)");
  krt_free(d, src[0]);
  krt_free(d, dst[0]);
  krt_device_close(d);
  assert_int_equal(fake_used(), 0);
  unsetenv("FAKE_GPU_LOG");
  unlink(log);
}

/* ---- cuBLASLt on views ------------------------------------------------------
 * A GEMM on a view that starts one element into its buffer (4-byte
 * alignment, where cuBLASLt assumes 256 unless told) goes through
 * cuBLASLt's path (a bias) and is right; the fake cuBLASLt refuses, as a
 * real one does, operands less aligned than the algorithm was chosen for.
 * A call site's algorithm is chosen once: the same call again asks the
 * heuristic nothing, another call site asks it once more. */
static void test_fake_cuda_gemm_view_offset(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[512] = "";
  krt_device *d = open_cuda();
  enum { M = 3, K = 4, N = 5 };
  float a[1 + M * K], b[K * N], bias[N], c[M * N];
  for (int i = 0; i < 1 + M * K; i++) a[i] = (float)((i * 3 % 7) - 3);
  for (int i = 0; i < K * N; i++) b[i] = (float)((i * 5 % 9) - 4);
  for (int i = 0; i < N; i++) bias[i] = (float)i / 2;
  void *da = to_device(d, a, sizeof a), *db = to_device(d, b, sizeof b), *dbias = to_device(d, bias, sizeof bias);
  void *dc = NULL;
  OK(krt_malloc(d, sizeof c, &dc, err, sizeof err));
  krt_gemm_desc g = {.dtype = KRT_F32, .m = M, .n = N, .k = K, .batch = 1, .a = (float *)da + 1, .lda = K,
                     .b = db, .ldb = N, .c = dc, .ldc = N, .alpha = 1, .beta = 0, .bias = dbias};
  long (*calls)(void);
  void *lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_NOLOAD), *p = NULL;
  OK(krt_gemm(d, &g, err, sizeof err)); /* (loads cuBLASLt) */
  if (!lib) lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(lib);
  p = dlsym(lib, "fake_cublaslt_heuristic_calls");
  assert_non_null(p);
  memcpy(&calls, &p, sizeof p);
  long first = calls();
  OK(krt_gemm(d, &g, err, sizeof err));
  assert_int_equal(calls(), first); /* the same call site: its algorithm kept */
  OK(krt_download(d, c, dc, sizeof c, err, sizeof err));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float want = bias[j];
      for (int q = 0; q < K; q++) want += a[1 + i * K + q] * b[q * N + j];
      assert_true(fabsf(c[i * N + j] - want) <= 1e-5f * (1 + fabsf(want)));
    }
  g.relu = 1; /* another call site */
  OK(krt_gemm(d, &g, err, sizeof err));
  assert_int_equal(calls(), first + 1);
  dlclose(lib);
  krt_free(d, da);
  krt_free(d, db);
  krt_free(d, dbias);
  krt_free(d, dc);
  krt_device_close(d);
  assert_int_equal(fake_used(), 0);
}

/* ---- CUDA Graphs ---------------------------------------------------------- */
typedef struct {
  krt_device *d;
  krt_module *m;
  void *x, *y, *c; /* axpy's vectors; c, zeroed, += x^T x (cuBLASLt: relu) */
  float a;
  int n;
  int calls;       /* compute's calls: 1 capture, then replays */
  int bad;         /* 1: a synchronous copy mid-way, which a capture refuses */
} graph_work;

static int graph_compute(void *self, char *err, size_t errlen) {
  graph_work *w = self;
  w->calls++;
  void *args[] = {&w->a, &w->x, &w->y, &w->n};
  if (krt_memset_zero(w->d, w->c, sizeof(float), err, errlen) ||
      krt_launch(w->m, 0, d3(1, 1, 1), d3(128, 1, 1), 0, args, err, errlen))
    return -1;
  if (w->bad) {
    float host;
    if (krt_download(w->d, &host, w->y, sizeof host, err, errlen)) return -1;
  }
  krt_gemm_desc g = {.dtype = KRT_F32, .m = 1, .n = 1, .k = w->n, .batch = 1, .a = w->x, .lda = w->n,
                     .b = w->x, .ldb = 1, .c = w->c, .ldc = 1, .alpha = 1, .beta = 1, .relu = 1};
  return krt_gemm(w->d, &g, err, errlen) ||
                 krt_launch(w->m, 0, d3(1, 1, 1), d3(128, 1, 1), 0, args, err, errlen)
             ? -1
             : 0;
}

static void test_fake_cuda_graph(void **state) {
  (void)state;
  if (!fake_cuda()) skip();
  char err[512] = "";
  krt_kernel_desc kernels[] = {{"axpy", NULL}};
  krt_module_desc desc = {kernels, 1, two_cubins, 2, NULL};
  graph_work w = {.d = open_cuda(), .a = 2.0f, .n = 8};
  long (*run_count)(void);
  void *p = fake_fn("fake_cuda_launches_run");
  memcpy(&run_count, &p, sizeof p);
  OK(krt_module_load(w.d, &desc, &w.m, err, sizeof err));
  float x[8], y[8], back[8], c;
  for (int i = 0; i < 8; i++) x[i] = (float)(i + 1), y[i] = 1.0f;
  w.x = to_device(w.d, x, sizeof x);
  w.y = to_device(w.d, y, sizeof y);
  OK(krt_malloc(w.d, sizeof c, &w.c, err, sizeof err));
  assert_int_equal(krt_device_graphs(w.d), 1);

  /* the first run is plain (a warm-up), the second captures (nothing runs
   * then) and launches; each later run replays the same work: y grows by
   * 2a x per run, c = x^T x */
  krt_graph *g = NULL;
  long before = run_count(), captures, replays;
  for (int run = 1; run <= 4; run++) {
    OK(krt_graph_run(w.d, &g, 1, graph_compute, &w, err, sizeof err));
    OK(krt_synchronize(w.d, err, sizeof err));
    OK(krt_download(w.d, back, w.y, sizeof back, err, sizeof err));
    OK(krt_download(w.d, &c, w.c, sizeof c, err, sizeof err));
    for (int i = 0; i < 8; i++) assert_true(back[i] == 1.0f + 4.0f * (float)run * x[i]);
    assert_true(c == 204.0f); /* 1 + 4 + ... + 64 onto c, zeroed in each replay */
  }
  assert_int_equal(w.calls, 2);                  /* compute ran twice: warm-up, capture */
  assert_int_equal(run_count() - before, 8);     /* two kernels a run */
  krt_device_graph_counts(w.d, &captures, &replays);
  assert_int_equal(captures, 1);
  assert_int_equal(replays, 3);

  /* not capturable, or graphs off: compute runs every time */
  graph_work plain = w;
  plain.calls = 0;
  OK(krt_graph_run(w.d, &g, 0, graph_compute, &plain, err, sizeof err));
  krt_device_set_graphs(w.d, 0);
  assert_int_equal(krt_device_graphs(w.d), 0);
  OK(krt_graph_run(w.d, &g, 1, graph_compute, &plain, err, sizeof err));
  assert_int_equal(plain.calls, 2);
  krt_device_set_graphs(w.d, 1);
  krt_graph_free(w.d, g);

  /* a synchronous copy mid-capture: the driver refuses the capture, and
   * the run goes on with plain launches, right */
  OK(krt_upload(w.d, w.y, y, sizeof y, err, sizeof err));
  graph_work bad = w;
  bad.calls = 0, bad.bad = 1;
  g = NULL;
  OK(krt_graph_run(w.d, &g, 1, graph_compute, &bad, err, sizeof err));
  OK(krt_graph_run(w.d, &g, 1, graph_compute, &bad, err, sizeof err));
  assert_int_equal(bad.calls, 3); /* warm-up, the refused capture, then plain */
  OK(krt_synchronize(w.d, err, sizeof err));
  OK(krt_download(w.d, back, w.y, sizeof back, err, sizeof err));
  for (int i = 0; i < 8; i++) assert_true(back[i] == 1.0f + 8.0f * x[i]);
  krt_graph_free(w.d, g);

  /* an error of compute's own (a GEMM the device rejects) ends the run,
   * in the warm-up and in the capture */
  g = NULL;
  graph_work wrong = w;
  wrong.n = -1;
  assert_int_equal(krt_graph_run(w.d, &g, 1, graph_compute, &wrong, err, sizeof err), -1);
  assert_int_equal(krt_graph_run(w.d, &g, 1, graph_compute, &wrong, err, sizeof err), -1);
  krt_graph_free(w.d, g);

  krt_free(w.d, w.x);
  krt_free(w.d, w.y);
  krt_free(w.d, w.c);
  krt_module_unload(w.m);
  krt_device_close(w.d);
  assert_int_equal(fake_used(), 0);
}

/* On the host device there is nothing to capture: compute runs each time. */
static void test_host_graph(void **state) {
  (void)state;
  char err[512] = "";
  krt_device *d = NULL;
  OK(krt_device_open(KRT_DEVICE_HOST, &d, err, sizeof err));
  assert_int_equal(krt_device_graphs(d), 0);
  krt_kernel_desc kernels[] = {{"axpy", &axpy__emu}};
  krt_module_desc desc = {kernels, 1, NULL, 0, NULL};
  graph_work w = {.d = d, .a = 1.0f, .n = 4};
  OK(krt_module_load(d, &desc, &w.m, err, sizeof err));
  float x[4] = {1, 2, 3, 4}, back[4];
  w.x = to_device(d, x, sizeof x);
  w.y = to_device(d, x, sizeof x);
  OK(krt_malloc(d, sizeof(float), &w.c, err, sizeof err));
  krt_graph *g = NULL;
  for (int i = 0; i < 2; i++) OK(krt_graph_run(d, &g, 1, graph_compute, &w, err, sizeof err));
  assert_int_equal(w.calls, 2);
  OK(krt_download(d, back, w.y, sizeof back, err, sizeof err));
  for (int i = 0; i < 4; i++) assert_true(back[i] == 5.0f * x[i]);
  krt_graph_free(d, g);
  krt_free(d, w.x);
  krt_free(d, w.y);
  krt_free(d, w.c);
  krt_module_unload(w.m);
  krt_device_close(d);
}

/* ---- generated-style kernels on a real GPU -----------------------------------
 * device_kernels.cu through NVRTC, as kiln builds a model: a cubin for the
 * GPU here, then PTX alone (the driver's JIT), each module launching axpy
 * and block_reverse, timed by the profiler's events.  Runs where a real
 * driver opens (bench/gpu-check.sh runs this program there); skipped, and
 * counted so, on the fake driver and without a GPU. */
static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(1 << 20);
  size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
  fclose(f);
  if (buf) buf[n] = 0;
  return buf;
}

static void gpu_launch_checks(krt_device *d, krt_module *m) {
  char err[512] = "";
  enum { NB = 64, B = 256, N = NB * B - 7 };
  static float x[NB * B], y[NB * B], back[NB * B];
  for (int i = 0; i < NB * B; i++) x[i] = (float)(i % 1000) * 0.25f, y[i] = 1.0f - (float)(i % 7);
  void *dx = to_device(d, x, sizeof x), *dy = to_device(d, y, sizeof y);
  float a = 2.0f;
  int n = N;
  void *args[] = {&a, &dx, &dy, &n};
  double ms[2] = {-1, -1};
  OK(krt_profile_enable(d, 2, err, sizeof err));
  OK(krt_mark(d, 0, err, sizeof err));
  OK(krt_launch(m, 0, d3(8, 1, 1), d3(128, 1, 1), 0, args, err, sizeof err));
  OK(krt_mark(d, 1, err, sizeof err));
  OK(krt_synchronize(d, err, sizeof err));
  OK(krt_profile_read(d, ms, 1, err, sizeof err)); /* one step: between marks 0 and 1 */
  OK(krt_profile_enable(d, 0, err, sizeof err));
  assert_true(ms[0] >= 0 && ms[0] < 1000);
  OK(krt_download(d, back, dy, sizeof back, err, sizeof err));
  for (int i = 0; i < NB * B; i++) assert_true(back[i] == (i < N ? 2.0f * x[i] + y[i] : y[i]));
  void *args2[] = {&dx, &dy};
  OK(krt_launch(m, 1, d3(NB, 1, 1), d3(B, 1, 1), B * sizeof(float), args2, err, sizeof err));
  OK(krt_download(d, back, dy, sizeof back, err, sizeof err));
  for (int blk = 0; blk < NB; blk++)
    for (int t = 0; t < B; t++) assert_true(back[blk * B + t] == x[blk * B + B - 1 - t]);
  /* a launch the GPU refuses names the kernel */
  assert_int_equal(krt_launch(m, 0, d3(1, 1, 1), d3(2048, 1, 1), 0, args, err, sizeof err), -1);
  assert_contains(err, "kernel axpy");
  krt_free(d, dx);
  krt_free(d, dy);
}

static void test_gpu_module_launch(void **state) {
  (void)state;
  if (fake_cuda() || !cuda_works() || !kl_nvrtc_available(NULL, 0)) skip();
  const char *src_path = getenv("KILN_TEST_KERNELS_CU"), *rt = getenv("KILN_RUNTIME_DIR");
  char prelude_path[4200];
  snprintf(prelude_path, sizeof prelude_path, "%s/emu/kiln_prelude.h", rt && *rt ? rt : KILN_TEST_RUNTIME_DIR);
  char *src = read_text(src_path && *src_path ? src_path : KILN_TEST_KERNELS_CU), *prelude = read_text(prelude_path);
  if (!src || !prelude) fail_msg("device_kernels.cu or %s not readable", prelude_path);
  krt_device *d = open_cuda();
  int sm = krt_device_sm(d);
  unsigned char *cubin = NULL, *ptx = NULL;
  size_t cubin_len = 0, ptx_len = 0;
  kl_error e;
  if (kl_nvrtc_compile(src, prelude, sm, 0, &cubin, &cubin_len, NULL, &e)) fail_msg("%s", e.msg);
  if (kl_nvrtc_compile(src, prelude, sm, KL_NVRTC_PTX, &ptx, &ptx_len, NULL, &e)) fail_msg("%s", e.msg);
  krt_kernel_desc kernels[] = {{"axpy", NULL}, {"block_reverse", NULL}};
  krt_cubin images[] = {{sm, cubin, cubin_len}};
  krt_module_desc with_cubin = {kernels, 2, images, 1, NULL}, ptx_only = {kernels, 2, NULL, 0, (char *)ptx};
  char err[512] = "";
  krt_module *m = NULL;
  OK(krt_module_load(d, &with_cubin, &m, err, sizeof err));
  gpu_launch_checks(d, m);
  krt_module_unload(m);
  OK(krt_module_load(d, &ptx_only, &m, err, sizeof err));
  gpu_launch_checks(d, m);
  krt_module_unload(m);
  krt_device_close(d);
  free(cubin), free(ptx), free(src), free(prelude);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kind_parse),
      cmocka_unit_test(test_open_host),
      cmocka_unit_test_setup_teardown(test_open_cuda_without_driver, save_env, restore_env),
      cmocka_unit_test_setup_teardown(test_auto_and_env, save_env, restore_env),
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_host_out_of_memory),
      cmocka_unit_test(test_module_launch),
      cmocka_unit_test(test_gemm_F32),
      cmocka_unit_test(test_gemm_F64),
      cmocka_unit_test(test_gemm_F16),
      cmocka_unit_test(test_gemm_BF16),
      cmocka_unit_test(test_gemm_beta0_ignores_c),
      cmocka_unit_test(test_gemm_errors),
      cmocka_unit_test(test_gemm_batch2_epilogue),
      cmocka_unit_test(test_profile_marks),
      cmocka_unit_test_setup_teardown(test_fake_cuda_open, save_env, restore_env),
      cmocka_unit_test(test_fake_cuda_out_of_memory),
      cmocka_unit_test(test_fake_cuda_modules),
      cmocka_unit_test(test_fake_cuda_launch),
      cmocka_unit_test(test_fake_cuda_exchange),
      cmocka_unit_test(test_fake_cuda_graph),
      cmocka_unit_test(test_fake_cuda_gemm_view_offset),
      cmocka_unit_test_setup_teardown(test_fake_cuda_old_driver, save_env, restore_env),
      cmocka_unit_test(test_host_graph),
      cmocka_unit_test(test_gpu_module_launch),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  kl_emu_shutdown();
  return rc;
}
