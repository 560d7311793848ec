/* test_emu.c - the host device's emulator against plain C references.
 *
 * Runs the kernels of emu_kernels.cu (built for the host through
 * emu_kernels_host.c) with kl_emu_launch and compares with references
 * computed here.  `test_emu --bench` prints launch and switch rates instead.
 * Each test runs with the default pool and again with 1 and 3 workers, so
 * the pool's hand-off is exercised even on a small machine. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "emu.h"

extern const kl_emu_kernel vec_add__emu, block_sum__emu, shfl_sum__emu, transpose__emu,
    softmax_rows__emu, half_roundtrip__emu, grid3d__emu, warp_ops__emu, reverse_tail__emu,
    divergent__emu, empty__emu, barriers__emu;

static kl_dim3 d3(unsigned x, unsigned y, unsigned z) {
  kl_dim3 d = {x, y, z};
  return d;
}

static void launch_ok(const kl_emu_kernel *k, kl_dim3 g, kl_dim3 b, size_t dyn, void **args) {
  char err[512];
  int rc = kl_emu_launch(k, g, b, dyn, args, err, sizeof err);
  if (rc) fail_msg("%s", err);
}

/* Deterministic inputs in [-1, 1). */
static float *random_floats(size_t n, unsigned seed) {
  float *x = malloc(n * sizeof *x);
  assert_non_null(x);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
  }
  return x;
}

static void assert_close(double got, double want, double rel, const char *what, size_t i) {
  double tol = rel * fmax(1.0, fabs(want));
  if (!(fabs(got - want) <= tol))
    fail_msg("%s[%zu] = %.9g, want %.9g (tolerance %.3g)", what, i, got, want, tol);
}

static unsigned long long fiber_blocks(void) {
  kl_emu_stats s;
  kl_emu_get_stats(&s);
  return s.fiber_blocks;
}

/* ---- 1 */
static void test_vec_add(void **state) {
  (void)state;
  int n = 100003;
  float *a = random_floats((size_t)n, 1), *b = random_floats((size_t)n, 2);
  float *c = calloc((size_t)n, sizeof *c);
  void *args[] = {&a, &b, &c, &n};
  unsigned long long fb = fiber_blocks();
  launch_ok(&vec_add__emu, d3(64, 1, 1), d3(256, 1, 1), 0, args);
  for (int i = 0; i < n; i++)
    if (c[i] != a[i] + b[i]) fail_msg("c[%d] = %g, want %g", i, c[i], a[i] + b[i]);
  /* no barrier: every block ran as a plain loop */
  assert_int_equal(fiber_blocks(), fb);
  free(a), free(b), free(c);
}

/* ---- 2 */
static void test_block_sum(void **state) {
  (void)state;
  int n = 10000, nb = (n + 255) / 256;
  float *x = random_floats((size_t)n, 3), *out = calloc((size_t)nb, sizeof *out);
  void *args[] = {&x, &out, &n};
  unsigned long long fb = fiber_blocks();
  launch_ok(&block_sum__emu, d3((unsigned)nb, 1, 1), d3(256, 1, 1), 0, args);
  assert_int_equal(fiber_blocks() - fb, nb);
  for (int bi = 0; bi < nb; bi++) {
    double want = 0;
    for (int i = bi * 256; i < n && i < bi * 256 + 256; i++) want += x[i];
    assert_close(out[bi], want, 1e-5, "block sum", (size_t)bi);
  }
  free(x), free(out);
}

/* ---- 3 */
static void test_shfl_sum(void **state) {
  (void)state;
  int n = 1 << 20;
  float *x = random_floats((size_t)n, 4), total = 0;
  float *tp = &total;
  void *args[] = {&x, &tp, &n};
  launch_ok(&shfl_sum__emu, d3(40, 1, 1), d3(256, 1, 1), 0, args);
  double want = 0;
  for (int i = 0; i < n; i++) want += x[i];
  assert_close(total, want, 1e-4, "shfl sum", 0);
  /* a 1024-thread block and a single-warp block */
  total = 0;
  launch_ok(&shfl_sum__emu, d3(3, 1, 1), d3(1024, 1, 1), 0, args);
  assert_close(total, want, 1e-4, "shfl sum (1024)", 0);
  total = 0;
  launch_ok(&shfl_sum__emu, d3(7, 1, 1), d3(32, 1, 1), 0, args);
  assert_close(total, want, 1e-4, "shfl sum (32)", 0);
  free(x);
}

/* ---- 4 */
static void test_transpose(void **state) {
  (void)state;
  int rows = 67, cols = 45;
  float *in = random_floats((size_t)rows * cols, 5);
  float *out = calloc((size_t)rows * cols, sizeof *out);
  void *args[] = {&in, &out, &rows, &cols};
  launch_ok(&transpose__emu, d3((unsigned)(cols + 31) / 32, (unsigned)(rows + 31) / 32, 1),
            d3(32, 8, 1), 0, args);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++)
      if (out[c * rows + r] != in[r * cols + c])
        fail_msg("out[%d][%d] = %g, want %g", c, r, out[c * rows + r], in[r * cols + c]);
  free(in), free(out);
}

/* ---- 5 */
static void check_softmax(int rows, int cols, unsigned threads) {
  float *x = random_floats((size_t)rows * cols, 6), *y = calloc((size_t)rows * cols, sizeof *y);
  for (int i = 0; i < rows * cols; i++) x[i] *= 20.0f; /* exp needs the max shift */
  void *args[] = {&x, &y, &cols};
  launch_ok(&softmax_rows__emu, d3((unsigned)rows, 1, 1), d3(threads, 1, 1), 0, args);
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * cols;
    double m = -INFINITY, s = 0;
    for (int j = 0; j < cols; j++) m = fmax(m, xr[j]);
    for (int j = 0; j < cols; j++) s += exp(xr[j] - m);
    for (int j = 0; j < cols; j++)
      assert_close(y[(size_t)r * cols + j], exp(xr[j] - m) / s, 1e-5, "softmax",
                   (size_t)r * cols + j);
  }
  free(x), free(y);
}

static void test_softmax(void **state) {
  (void)state;
  check_softmax(33, 1000, 128);
  check_softmax(4, 5000, 1024);
  check_softmax(5, 7, 32); /* fewer columns than threads */
}

/* ---- 6: fp16/bf16, checked exhaustively around every rounding boundary */
static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* The exact value of a finite half, from its definition. */
static double half_value(uint16_t h) {
  int e = h >> 10 & 0x1f, m = h & 0x3ff;
  double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

typedef struct {
  float *x;
  uint16_t *want_h, *want_b; /* expected bits */
  size_t n, cap;
} cases;

static void add_case(cases *c, float x, uint16_t h, uint16_t b) {
  if (c->n == c->cap) {
    c->cap = c->cap ? 2 * c->cap : 1024;
    c->x = realloc(c->x, c->cap * sizeof *c->x);
    c->want_h = realloc(c->want_h, c->cap * sizeof *c->want_h);
    c->want_b = realloc(c->want_b, c->cap * sizeof *c->want_b);
  }
  c->x[c->n] = x;
  c->want_h[c->n] = h;
  c->want_b[c->n++] = b;
}

/* A magnitude's value, reading the bits just past the largest finite float
 * as 2^128: rounding ties there are decided as if the exponent went on. */
static double mag_value(uint32_t bits) {
  return (bits & 0x7fffffff) == 0x7f800000 ? ldexp(1, 128) : fabs((double)bits_f(bits));
}

/* What bf16 should give for x, by definition: the nearer of the two bf16
 * values around it, the even one on a tie. */
static uint16_t bf16_ref(float x) {
  uint32_t u = f_bits(x);
  if ((u & 0x7fffffff) > 0x7f800000) return 0x7fff;
  if ((u & 0x7fffffff) == 0x7f800000) return (uint16_t)(u >> 16);
  uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  double ax = fabs((double)x), dl = ax - mag_value(lo), dh = mag_value(hi) - ax;
  return (uint16_t)((dl < dh || (dl == dh && !(lo >> 16 & 1))) ? lo >> 16 : hi >> 16);
}

/* Same for half: binary search for the largest half <= |x|. */
static uint16_t half_ref(float x) {
  uint32_t u = f_bits(x);
  if ((u & 0x7fffffff) > 0x7f800000) return 0x7fff;
  uint16_t sign = u >> 31 ? 0x8000 : 0;
  double ax = fabs((double)x);
  if (ax >= 65520.0) return sign | 0x7c00;
  unsigned lo = 0, hi = 0x7bff;
  while (lo < hi) {
    unsigned mid = (lo + hi + 1) / 2;
    if (half_value((uint16_t)mid) <= ax) lo = mid;
    else hi = mid - 1;
  }
  double dl = ax - half_value((uint16_t)lo), dh = half_value((uint16_t)(lo + 1)) - ax;
  return sign | (uint16_t)((dl < dh || (dl == dh && !(lo & 1))) ? lo : lo + 1);
}

static void test_half(void **state) {
  (void)state;
  cases c = {0};
  /* every half and bf16 value, and the midpoints between neighbours with
   * their float neighbours: ties go to even, a hair off goes the near way */
  for (uint32_t h = 0; h < 0x7c00; h++) {
    for (int s = 0; s < 2; s++) {
      double v = half_value((uint16_t)h), mid = (v + half_value((uint16_t)(h + 1))) / 2;
      float sg = s ? -1.0f : 1.0f;
      uint16_t sb = s ? 0x8000 : 0;
      float fv = sg * (float)v;
      add_case(&c, fv, sb | (uint16_t)h, bf16_ref(fv));
      float fm = sg * (float)mid;
      uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
      if (h + 1 == 0x7c00) even = 0x7c00; /* 65520 rounds to infinity */
      add_case(&c, fm, sb | even, bf16_ref(fm));
      float below = nextafterf(fm, 0.0f), above = nextafterf(fm, sg * INFINITY);
      add_case(&c, below, sb | (uint16_t)h, bf16_ref(below));
      add_case(&c, above, sb | (uint16_t)(h + 1), bf16_ref(above));
    }
  }
  for (uint32_t b = 0; b < 0x10000; b++) {
    float v = bits_f(b << 16);
    if (isnan(v)) continue;
    float mid = bits_f(b << 16 | 0x8000);
    add_case(&c, v, half_ref(v), (uint16_t)b);
    float near = nextafterf(mid, 0.0f);
    add_case(&c, mid, half_ref(mid), bf16_ref(mid));
    add_case(&c, near, half_ref(near), bf16_ref(near));
  }
  float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 1e-30f, -1e-30f, 3.14159265f, 1e10f,
                      65519.0f, 65520.0f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f};
  for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
    add_case(&c, specials[i], half_ref(specials[i]), bf16_ref(specials[i]));

  int n = (int)c.n;
  uint16_t *h = calloc(c.n, 2), *b = calloc(c.n, 2);
  float *hf = calloc(c.n, 4), *bf = calloc(c.n, 4);
  void *args[] = {&c.x, &h, &b, &hf, &bf, &n};
  launch_ok(&half_roundtrip__emu, d3((unsigned)(n + 255) / 256, 1, 1), d3(256, 1, 1), 0, args);
  for (size_t i = 0; i < c.n; i++) {
    if (h[i] != c.want_h[i]) /* every case: +0 (an underflow's result) too */
      fail_msg("half(%a) = 0x%04x, want 0x%04x", (double)c.x[i], h[i], c.want_h[i]);
    if (b[i] != c.want_b[i])
      fail_msg("bf16(%a) = 0x%04x, want 0x%04x", (double)c.x[i], b[i], c.want_b[i]);
    /* back to float: exact, NaN -> the canonical NaN */
    double hv = (h[i] & 0x7c00) == 0x7c00 ? ((h[i] & 0x3ff) ? NAN : (h[i] & 0x8000 ? -INFINITY : INFINITY))
                                          : half_value(h[i]);
    if (isnan(hv) ? f_bits(hf[i]) != 0x7fffffffu : (double)hf[i] != hv || !signbit(hf[i]) != !signbit(hv))
      fail_msg("float(half 0x%04x) = %a, want %a", h[i], (double)hf[i], hv);
    if (f_bits(bf[i]) != (uint32_t)b[i] << 16)
      fail_msg("float(bf16 0x%04x) = %a", b[i], (double)bf[i]);
  }
  free(c.x), free(c.want_h), free(c.want_b), free(h), free(b), free(hf), free(bf);
}

/* ---- 7 */
static void test_grid3d(void **state) {
  (void)state;
  kl_dim3 g = d3(3, 2, 4), b = d3(4, 2, 8);
  int total = 3 * 2 * 4 * 4 * 2 * 8;
  int *out = malloc((size_t)total * sizeof *out), maxid = -1, count = 0;
  memset(out, 0xff, (size_t)total * sizeof *out);
  int *mp = &maxid, *cp = &count;
  void *args[] = {&out, &mp, &cp};
  launch_ok(&grid3d__emu, g, b, 0, args);
  for (int i = 0; i < total; i++) assert_int_equal(out[i], i);
  assert_int_equal(maxid, total - 1);
  assert_int_equal(count, total);
  free(out);
}

/* ---- 8: the CUDA rules, written out plainly */
static void test_warp_ops(void **state) {
  (void)state;
  enum { T = 96 };
  int x[T], out[T * 8];
  for (int i = 0; i < T; i++) x[i] = (i * 37 + 11) % 101 - 20;
  x[50] = 42;
  const int *xp = x;
  int *op = out;
  void *args[] = {&xp, &op};
  launch_ok(&warp_ops__emu, d3(1, 1, 1), d3(T, 1, 1), 0, args);
  int evens = 0;
  for (int i = 0; i < T; i++) evens += x[i] % 2 == 0;
  for (int t = 0; t < T; t++) {
    int lane = t % 32, w0 = t - lane, scan = 0;
    for (int l = 0; l <= lane; l++) scan += x[w0 + l];
    int seg = lane & ~7, down = (lane % 8) + 3 < 8 ? x[t + 3] : x[t];
    int xl = lane ^ 5, bfly = (xl & ~15) <= (lane & ~15) + 15 ? x[w0 + xl] : x[t];
    unsigned ballot = 0;
    int any = 0, all = 1;
    for (int l = 0; l < 32; l++) {
      if (x[w0 + l] % 3 == 0) ballot |= 1u << l;
      any |= x[w0 + l] > 70;
      all &= x[w0 + l] >= 0;
    }
    int want[8] = {scan, x[w0 + seg], down, bfly, (int)ballot, any, all, evens * 2 + 1};
    for (int k = 0; k < 8; k++)
      if (out[t * 8 + k] != want[k])
        fail_msg("thread %d, result %d: got %d, want %d", t, k, out[t * 8 + k], want[k]);
  }
}

/* ---- 9 */
static void test_reverse_tail(void **state) {
  (void)state;
  int nb = 5, bs = 64, skip = 10;
  float *x = random_floats((size_t)nb * bs, 7), *y = calloc((size_t)nb * bs, sizeof *y);
  void *args[] = {&x, &y, &skip};
  launch_ok(&reverse_tail__emu, d3((unsigned)nb, 1, 1), d3((unsigned)bs, 1, 1),
            (size_t)bs * sizeof(float), args);
  for (int b = 0; b < nb; b++)
    for (int t = 0; t < bs; t++) {
      float want = t < skip ? 0.0f : x[b * bs + (bs - 1 - t + skip)];
      if (y[b * bs + t] != want) fail_msg("y[%d][%d] = %g, want %g", b, t, y[b * bs + t], want);
    }
  free(x), free(y);
}

/* ---- 10 */
static void test_divergent(void **state) {
  (void)state;
  float y[128];
  float *yp = y;
  void *args[] = {&yp};
  char err[512];
  assert_int_equal(kl_emu_launch(&divergent__emu, d3(2, 1, 1), d3(64, 1, 1), 0, args, err, sizeof err), -1);
  assert_non_null(strstr(err, "divergent"));
  assert_non_null(strstr(err, "deadlock"));
  /* the emulator is still usable afterwards */
  test_block_sum(state);
}

/* ---- launch errors */
static void expect_error(kl_dim3 g, kl_dim3 b, size_t dyn, const char *needle) {
  char err[512];
  int n = 0;
  void *args[] = {&n};
  assert_int_equal(kl_emu_launch(&barriers__emu, g, b, dyn, args, err, sizeof err), -1);
  if (!strstr(err, needle) || !strstr(err, "barriers")) fail_msg("message: %s", err);
}

static void test_launch_errors(void **state) {
  (void)state;
  expect_error(d3(1, 1, 1), d3(1025, 1, 1), 0, "1025 threads");
  expect_error(d3(1, 1, 1), d3(32, 32, 2), 0, "2048 threads");
  expect_error(d3(1, 1, 1), d3(1, 1, 65), 0, "z <= 64");
  expect_error(d3(0, 1, 1), d3(32, 1, 1), 0, "zero dimension");
  expect_error(d3(1, 65536, 1), d3(32, 1, 1), 0, "exceeds");
  expect_error(d3(1, 1, 1), d3(32, 1, 1), 300000, "dynamic shared memory");
  kl_emu_kernel none = {"nothing", NULL};
  char err[128];
  assert_int_equal(kl_emu_launch(&none, d3(1, 1, 1), d3(1, 1, 1), 0, NULL, err, sizeof err), -1);
  assert_non_null(strstr(err, "nothing"));
  /* the largest legal block */
  int rounds = 3;
  void *args[] = {&rounds};
  launch_ok(&barriers__emu, d3(2, 1, 1), d3(1024, 1, 1), 0, args);
}

/* Run every test with 1, 3 and the default number of workers. */
static int with_threads(void **state, int n) {
  (void)state;
  kl_emu_set_threads(n);
  return 0;
}
static int setup_1(void **s) { return with_threads(s, 1); }
static int setup_3(void **s) { return with_threads(s, 3); }
static int setup_default(void **s) { return with_threads(s, 0); }
static int teardown(void **s) {
  (void)s;
  kl_emu_shutdown();
  return 0;
}

/* ---- benchmarks ------------------------------------------------------------ */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench_launches(kl_dim3 g, kl_dim3 b, const char *what) {
  int iters = 0;
  double t0 = now(), t;
  do {
    launch_ok(&empty__emu, g, b, 0, NULL);
    iters++;
  } while ((t = now() - t0) < 0.5);
  printf("  %-34s %10.0f launches/s  (%.1f ns per thread)\n", what, iters / t,
         1e9 * t / iters / ((double)g.x * g.y * g.z * b.x * b.y * b.z));
}

static void bench(void) {
  printf("kiln emu benchmarks (%s)\n",
#ifdef KL_EMU_UCONTEXT
         "ucontext"
#else
         "default switch"
#endif
  );
  bench_launches(d3(1, 1, 1), d3(1, 1, 1), "empty kernel, 1x1");
  bench_launches(d3(64, 1, 1), d3(256, 1, 1), "empty kernel, 64x256");
  bench_launches(d3(4096, 1, 1), d3(256, 1, 1), "empty kernel, 4096x256");
  /* a barrier-heavy kernel end to end: 1M floats, 3907 blocks of 256 */
  int n = 1 << 20, nb = (n + 255) / 256, reps = 0;
  float *x = random_floats((size_t)n, 9), *out = calloc((size_t)nb, sizeof *out);
  void *sargs[] = {&x, &out, &n};
  double t0 = now(), t;
  do {
    launch_ok(&block_sum__emu, d3((unsigned)nb, 1, 1), d3(256, 1, 1), 0, sargs);
    reps++;
  } while ((t = now() - t0) < 0.5);
  printf("  %-34s %10.1f ns per thread (9 barriers each)\n", "block_sum, 1M floats",
         1e9 * t / reps / (nb * 256.0));
  free(x), free(out);

  int rounds = 1000;
  void *args[] = {&rounds};
  kl_emu_set_threads(1); /* switches per second of one core */
  kl_emu_stats s0, s1;
  kl_emu_get_stats(&s0);
  t0 = now();
  launch_ok(&barriers__emu, d3(4, 1, 1), d3(256, 1, 1), 0, args);
  t = now() - t0;
  kl_emu_get_stats(&s1);
  printf("  %-34s %10.2f M switches/s  (%llu switches, %.3f s, 1 worker)\n",
         "__syncthreads x1000, 4x256", (double)(s1.switches - s0.switches) / t / 1e6,
         s1.switches - s0.switches, t);
  kl_emu_set_threads(0);
}

#define T3(f)                                                                  \
  cmocka_unit_test_setup_teardown(f, setup_default, NULL),                     \
      cmocka_unit_test_setup_teardown(f, setup_1, NULL),                       \
      cmocka_unit_test_setup_teardown(f, setup_3, teardown)

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
    bench();
    kl_emu_shutdown();
    return 0;
  }
  const struct CMUnitTest tests[] = {
      T3(test_vec_add),      T3(test_block_sum),   T3(test_shfl_sum),
      T3(test_transpose),    T3(test_softmax),     cmocka_unit_test(test_half),
      T3(test_grid3d),       T3(test_warp_ops),    T3(test_reverse_tail),
      T3(test_divergent),    cmocka_unit_test(test_launch_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
