/* test_data_loader.c - unit tests for the training input pipeline
 * (runtime/data_loader.c, krt_loader_*).  Small .npy files are written with
 * krt_npy_write into a fresh mkdtemp directory, removed at the end.  Sample
 * i of the usual files says who it is: x[i] = {i, i + 0.5} and y[i] = i, so
 * a batch shows which rows it holds and that x and y stayed paired. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../runtime/kilnrt.h"

static char tmpdir[64];

static int make_tmpdir(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln-loader-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
  (void)state;
  DIR *d = opendir(tmpdir);
  if (!d) return -1;
  struct dirent *de;
  char p[512];
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
      snprintf(p, sizeof p, "%s/%s", tmpdir, de->d_name);
      unlink(p);
    }
  closedir(d);
  return rmdir(tmpdir);
}

/* Path of `name` inside the temp dir, in a small ring of static buffers. */
static const char *tpath(const char *name) {
  static char bufs[4][512];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, sizeof bufs[0], "%s/%s", tmpdir, name);
  return b;
}

/* Writes `name` with the given dtype and shape; data has numel elements. */
static const char *write_npy(const char *name, krt_dtype dt, int rank,
                             const int64_t *dims, void *data) {
  krt_tensor t = {.dtype = dt, .rank = rank, .data = data};
  if (rank) memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
  const char *path = tpath(name);
  char err[512];
  if (krt_npy_write(path, &t, err, sizeof err)) fail_msg("%s", err);
  return path;
}

/* x: n samples {i, i + 0.5} as f64 (n, 2); y: i as i32 (n,). */
static void write_indexed(const char *xname, const char *yname, int64_t n) {
  double *x = malloc((size_t)n * 2 * sizeof *x);
  int32_t *y = malloc((size_t)n * sizeof *y);
  for (int64_t i = 0; i < n; i++) {
    x[2 * i] = (double)i;
    x[2 * i + 1] = (double)i + 0.5;
    y[i] = (int32_t)i;
  }
  write_npy(xname, KRT_F64, 2, (int64_t[]){n, 2}, x);
  write_npy(yname, KRT_I32, 1, (int64_t[]){n}, y);
  free(x);
  free(y);
}

static krt_loader_config indexed_config(int batch, int shuffle, int drop_last,
                                        int threads) {
  return (krt_loader_config){
      .x_path = tpath("x.npy"), .y_path = tpath("y.npy"), .batch = batch,
      .seed = 1234, .shuffle = shuffle, .drop_last = drop_last,
      .threads = threads, .x_dtype = KRT_F32, .y_dtype = KRT_I64};
}

static krt_loader *open_ok(const krt_loader_config *c) {
  krt_loader *l = NULL;
  char err[512];
  if (krt_loader_open(c, &l, err, sizeof err)) fail_msg("open: %s", err);
  assert_non_null(l);
  return l;
}

/* The next batch of an x f32 (., 2) / y i64 loader as row indices (rows[k]
 * for k < count), checking that every sample is whole and paired. */
static int next_rows(krt_loader *l, int64_t *rows) {
  const void *xv, *yv;
  int count = -1;
  double waited = -1;
  char err[512];
  if (krt_loader_next(l, &xv, &yv, &count, &waited, err, sizeof err))
    fail_msg("next: %s", err);
  assert_true(waited >= 0);
  const float *x = xv;
  const int64_t *y = yv;
  for (int k = 0; k < count; k++) {
    rows[k] = y[k];
    assert_true(y[k] >= 0);
    assert_true(x[2 * k] == (float)y[k] && x[2 * k + 1] == (float)y[k] + 0.5f);
  }
  return count;
}

/* ---- order ---------------------------------------------------------------- */
/* One epoch: every sample exactly once, batches full but maybe the last. */
static void check_epoch(krt_loader *l, int64_t n, int batch, bool shuffled) {
  bool *seen = calloc((size_t)n, 1);
  int64_t *rows = malloc((size_t)batch * sizeof *rows), total = 0;
  int64_t nb = krt_loader_batches_per_epoch(l);
  assert_int_equal(nb, (n + batch - 1) / batch);
  bool in_order = true;
  for (int64_t b = 0; b < nb; b++) {
    int64_t epoch_before, index;
    krt_loader_position(l, &epoch_before, &index);
    assert_int_equal(index, b);
    int count = next_rows(l, rows);
    assert_int_equal(count, b + 1 < nb ? batch : n - b * batch);
    for (int k = 0; k < count; k++) {
      assert_true(rows[k] < n);
      assert_false(seen[rows[k]]);
      seen[rows[k]] = true;
      in_order &= rows[k] == total;
      total++;
    }
  }
  assert_int_equal(total, n);
  assert_true(in_order != shuffled);
  free(seen);
  free(rows);
}

static void test_epoch_covers_each_sample_once(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 103);
  for (int shuffle = 0; shuffle <= 1; shuffle++) {
    krt_loader_config c = indexed_config(10, shuffle, 0, 0);
    krt_loader *l = open_ok(&c);
    assert_int_equal(krt_loader_samples(l), 103);
    for (int epoch = 0; epoch < 3; epoch++) {
      int64_t e, b;
      krt_loader_position(l, &e, &b);
      assert_int_equal(e, epoch);
      assert_int_equal(b, 0);
      check_epoch(l, 103, 10, shuffle);
    }
    krt_loader_close(l);
  }
}

/* All batches of `epochs` epochs, flattened into row indices. */
static int64_t *collect(const krt_loader_config *c, int epochs, int64_t *len) {
  krt_loader *l = open_ok(c);
  int64_t nb = krt_loader_batches_per_epoch(l);
  int64_t *rows = malloc((size_t)(nb * epochs * c->batch) * sizeof *rows);
  *len = 0;
  for (int64_t b = 0; b < nb * epochs; b++) *len += next_rows(l, rows + *len);
  krt_loader_close(l);
  return rows;
}

static void test_epochs_differ_and_seed_repeats(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 50);
  krt_loader_config c = indexed_config(8, 1, 0, 0);
  int64_t n1, n2, n3;
  int64_t *a = collect(&c, 2, &n1), *b = collect(&c, 2, &n2);
  c.seed = 1235;
  int64_t *other = collect(&c, 2, &n3);
  assert_int_equal(n1, 100);
  assert_int_equal(n2, 100);
  assert_int_equal(n3, 100);
  assert_memory_equal(a, b, 100 * sizeof *a);                  /* same seed */
  assert_memory_not_equal(a, a + 50, 50 * sizeof *a);          /* epoch 0 vs 1 */
  assert_memory_not_equal(a, other, 50 * sizeof *a);           /* other seed */
  free(a);
  free(b);
  free(other);
}

static void test_threads_give_identical_batches(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 97);
  /* batch 5 of 97: 20 batches an epoch, many trips round the slot ring */
  krt_loader_config c = indexed_config(5, 1, 0, 1);
  int64_t n1, n4, n2;
  int64_t *one = collect(&c, 4, &n1);
  c.threads = 4;
  int64_t *four = collect(&c, 4, &n4);
  c.threads = 0;
  int64_t *dflt = collect(&c, 4, &n2);
  assert_int_equal(n1, 4 * 97);
  assert_int_equal(n4, n1);
  assert_int_equal(n2, n1);
  assert_memory_equal(one, four, (size_t)n1 * sizeof *one);
  assert_memory_equal(one, dflt, (size_t)n1 * sizeof *one);
  free(one);
  free(four);
  free(dflt);
}

/* An epoch of one batch: each next call crosses an epoch, and the workers
 * run several epochs ahead (several orders in flight at once). */
static void test_one_batch_epochs(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 6);
  krt_loader_config c = indexed_config(6, 1, 1, 4);
  int64_t n4, n1;
  int64_t *four = collect(&c, 12, &n4);
  c.threads = 1;
  int64_t *one = collect(&c, 12, &n1);
  assert_int_equal(n4, 72);
  assert_int_equal(n1, 72);
  assert_memory_equal(one, four, 72 * sizeof *one);
  for (int e = 0; e < 12; e++) {
    int64_t sum = 0;
    for (int k = 0; k < 6; k++) sum += one[e * 6 + k];
    assert_int_equal(sum, 15);
  }
  free(four);
  free(one);
}

/* A batch stays as handed out until the next call, however far ahead the
 * workers get meanwhile. */
static void test_batch_stays_valid_until_next_call(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 40);
  krt_loader_config c = indexed_config(4, 1, 0, 4);
  int64_t len;
  int64_t *all = collect(&c, 3, &len);
  krt_loader *l = open_ok(&c);
  for (int b = 0; b < 30; b++) {
    const void *xv, *yv;
    int count;
    char err[512];
    assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
    nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);  /* workers run ahead */
    const int64_t *y = yv;
    const float *x = xv;
    for (int k = 0; k < count; k++) {
      assert_int_equal(y[k], all[4 * b + k]);
      assert_true(x[2 * k] == (float)y[k]);
    }
  }
  krt_loader_close(l);
  free(all);
}

/* The order recipe is part of the checkpoint format: a resumed run must
 * see the order the interrupted one saw, whatever libkilnrt it runs on.
 * These orders come from a separate Python implementation of the recipe
 * in data_loader.c's comment (splitmix64 and xoshiro256** from their
 * published definitions):
 *   def order(n, seed, epoch):
 *       sm = seed ^ mix(epoch); s = [mix(sm := sm + GOLDEN) for 4 draws]
 *       p = list(range(n))
 *       for i in range(n - 1, 0, -1):
 *           j = below(i + 1); p[i], p[j] = p[j], p[i]
 * with below(b) rejecting draws under 2^64 % b, then taking draw % b. */
static void test_order_recipe(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 12);
  static const int64_t want[3][12] = {
      {1, 4, 6, 2, 8, 3, 9, 0, 10, 5, 7, 11},     /* epoch 0, seed 1234 */
      {4, 6, 9, 10, 3, 8, 0, 5, 2, 11, 1, 7},     /* epoch 1 */
      {2, 9, 7, 11, 8, 6, 10, 1, 4, 3, 0, 5},     /* epoch 7 */
  };
  krt_loader_config c = indexed_config(5, 1, 0, 2);  /* batches 5, 5, 2 */
  krt_loader *l = open_ok(&c);
  int64_t rows[12];
  for (int e = 0; e < 3; e++) {
    char err[512];
    if (e == 2 && krt_loader_seek(l, 7, 0, err, sizeof err)) fail_msg("%s", err);
    int got = 0;
    for (int b = 0; b < 3; b++) got += next_rows(l, rows + got);
    assert_int_equal(got, 12);
    assert_memory_equal(rows, want[e], sizeof want[e]);
  }
  krt_loader_close(l);
}

/* ---- batch sizes -------------------------------------------------------- */
static void test_drop_last(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 103);
  krt_loader_config c = indexed_config(10, 1, 1, 0);
  krt_loader *l = open_ok(&c);
  assert_int_equal(krt_loader_batches_per_epoch(l), 10);
  int64_t rows[10];
  for (int epoch = 0; epoch < 2; epoch++) {
    bool seen[103] = {0};
    for (int b = 0; b < 10; b++) {
      assert_int_equal(next_rows(l, rows), 10);
      for (int k = 0; k < 10; k++) {
        assert_false(seen[rows[k]]);
        seen[rows[k]] = true;
      }
    }
    int64_t e, b;
    krt_loader_position(l, &e, &b);
    assert_int_equal(e, epoch + 1);
    assert_int_equal(b, 0);
  }
  krt_loader_close(l);
}

static void test_short_last_batch_is_zero_padded(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 23);
  krt_loader_config c = indexed_config(10, 0, 0, 0);
  krt_loader *l = open_ok(&c);
  int64_t rows[10];
  assert_int_equal(next_rows(l, rows), 10);
  assert_int_equal(next_rows(l, rows), 10);
  const void *xv, *yv;
  int count;
  char err[512];
  assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
  assert_int_equal(count, 3);
  const float *x = xv;
  const int64_t *y = yv;
  for (int k = 0; k < 3; k++) assert_int_equal(y[k], 20 + k);
  for (int k = 3; k < 10; k++) {
    assert_int_equal(y[k], 0);
    assert_true(x[2 * k] == 0 && x[2 * k + 1] == 0);
  }
  /* then epoch 1 starts with a full batch */
  assert_int_equal(next_rows(l, rows), 10);
  assert_int_equal(rows[0], 0);
  krt_loader_close(l);
}

static void test_batch_larger_than_n(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 4);
  krt_loader_config c = indexed_config(10, 1, 0, 0);
  krt_loader *l = open_ok(&c);
  int64_t rows[10];
  assert_int_equal(krt_loader_batches_per_epoch(l), 1);
  assert_int_equal(next_rows(l, rows), 4);
  krt_loader_close(l);
  c.drop_last = 1;
  char err[512];
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_null(l);
  assert_non_null(strstr(err, "fewer than one batch"));
}

/* ---- seek ------------------------------------------------------------------ */
static void test_seek_reproduces_the_sequence(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 41);
  krt_loader_config c = indexed_config(6, 1, 0, 3);  /* 7 batches an epoch */
  int64_t len;
  int64_t *all = collect(&c, 4, &len);  /* uninterrupted: 28 batches */
  assert_int_equal(len, 4 * 41);
  /* where batch b of the run starts in `all`: epochs of 41 rows, batches
   * of 6 */
  int64_t starts[29];
  for (int b = 0; b <= 28; b++) starts[b] = (b / 7) * 41 + (b % 7) * 6;

  krt_loader *l = open_ok(&c);
  int64_t rows[6];
  next_rows(l, rows);                      /* consume a little, then jump */
  next_rows(l, rows);
  const int64_t targets[][2] = {{1, 4}, {3, 0}, {0, 6}, {2, 2}, {0, 0}};
  for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
    char err[512];
    if (krt_loader_seek(l, targets[t][0], targets[t][1], err, sizeof err))
      fail_msg("seek: %s", err);
    int64_t e, i;
    krt_loader_position(l, &e, &i);
    assert_int_equal(e, targets[t][0]);
    assert_int_equal(i, targets[t][1]);
    for (int b = (int)(targets[t][0] * 7 + targets[t][1]); b < 28; b++) {
      int count = next_rows(l, rows);
      assert_int_equal(count, starts[b + 1] - starts[b]);
      assert_memory_equal(rows, all + starts[b], (size_t)count * sizeof *rows);
      if (t % 2 && b >= 17) break;         /* seek again from mid-run */
    }
  }
  char err[512];
  assert_int_equal(krt_loader_seek(l, 0, 7, err, sizeof err), -1);
  assert_non_null(strstr(err, "batches 0 to 6"));
  assert_int_equal(krt_loader_seek(l, -1, 0, err, sizeof err), -1);
  krt_loader_close(l);
  free(all);
}

/* ---- conversions --------------------------------------------------------- */
static void test_convert_floats(void **state) {
  (void)state;
  /* f64 values and what each target must hold: correctly rounded once.
   * 1 + 2^-11 + 2^-40 is just above the f16 midpoint between 1 and
   * 1 + 2^-10: rounding through f32 first would land on the midpoint and
   * tie to 1. */
  double x[4] = {1.0 / 3.0, -2.5, 1.0 + ldexp(1, -11) + ldexp(1, -40), 1e300};
  int64_t y[4] = {0, 1, 2, 3};
  write_npy("xf.npy", KRT_F64, 2, (int64_t[]){4, 1}, x);
  write_npy("yi.npy", KRT_I64, 1, (int64_t[]){4}, y);
  krt_loader_config c = {.x_path = tpath("xf.npy"), .y_path = tpath("yi.npy"),
                         .batch = 4, .x_dtype = KRT_F32, .y_dtype = KRT_I64};
  const void *xv, *yv;
  int count;
  char err[512];
  krt_loader *l = open_ok(&c);
  assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
  const float *f = xv;
  assert_true(f[0] == (float)(1.0 / 3.0) && f[1] == -2.5f && isinf(f[3]));
  assert_memory_equal(yv, y, sizeof y);
  krt_loader_close(l);

  c.x_dtype = KRT_F16;
  l = open_ok(&c);
  assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
  const uint16_t *h = xv;
  assert_int_equal(h[0], 0x3555);  /* 1/3 in binary16 */
  assert_int_equal(h[1], 0xc100);
  assert_int_equal(h[2], 0x3c01);
  assert_int_equal(h[3], 0x7c00);
  krt_loader_close(l);

  c.x_dtype = KRT_BF16;
  l = open_ok(&c);
  assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
  h = xv;
  assert_int_equal(h[0], 0x3eab);  /* 1/3 in bfloat16 */
  assert_int_equal(h[1], 0xc020);
  assert_int_equal(h[2], 0x3f80);
  assert_int_equal(h[3], 0x7f80);
  krt_loader_close(l);
}

static void test_convert_integers(void **state) {
  (void)state;
  int32_t y[3] = {7, -3, 2147483647};
  uint8_t x[3][2] = {{0, 255}, {1, 2}, {3, 4}};
  write_npy("xu8.npy", KRT_U8, 2, (int64_t[]){3, 2}, x);
  write_npy("yi32.npy", KRT_I32, 1, (int64_t[]){3}, y);
  krt_loader_config c = {.x_path = tpath("xu8.npy"), .y_path = tpath("yi32.npy"),
                         .batch = 3, .x_dtype = KRT_F32, .y_dtype = KRT_I64};
  krt_loader *l = open_ok(&c);
  const void *xv, *yv;
  int count;
  char err[512];
  assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
  const int64_t *yy = yv;
  const float *xx = xv;
  assert_int_equal(yy[0], 7);
  assert_int_equal(yy[1], -3);
  assert_int_equal(yy[2], 2147483647);
  assert_true(xx[0] == 0 && xx[1] == 255 && xx[5] == 4);
  krt_loader_close(l);

  /* the file's own dtype is copied */
  c.x_dtype = KRT_U8;
  c.y_dtype = KRT_I32;
  l = open_ok(&c);
  assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
  assert_memory_equal(xv, x, sizeof x);
  assert_memory_equal(yv, y, sizeof y);
  krt_loader_close(l);
}

/* Opens x.npy with the given labels file, and returns next's result. */
static int next_with_labels(const char *yname, krt_dtype to, char *err, size_t errlen) {
  krt_loader_config c = {.x_path = tpath("x.npy"), .y_path = tpath(yname),
                         .batch = 2, .x_dtype = KRT_F32, .y_dtype = to};
  krt_loader *l = open_ok(&c);
  const void *xv, *yv;
  int count, rc = 0;
  for (int b = 0; b < 2 && rc == 0; b++)
    rc = krt_loader_next(l, &xv, &yv, &count, NULL, err, errlen);
  if (rc) {
    /* the error stays until a seek */
    char again[512];
    assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, again, sizeof again), -1);
    assert_string_equal(again, err);
  }
  krt_loader_close(l);
  return rc;
}

static void test_float_labels(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 4);
  float ok[4] = {0, 1, 2, -5};
  float half[4] = {0, 1, 2, 1.5f};
  double big[4] = {0, 1, 3e9, 2};
  int64_t wide[4] = {0, 1, 2, (int64_t)1 << 40};
  write_npy("ok.npy", KRT_F32, 1, (int64_t[]){4}, ok);
  write_npy("half.npy", KRT_F32, 1, (int64_t[]){4}, half);
  write_npy("big.npy", KRT_F64, 1, (int64_t[]){4}, big);
  write_npy("wide.npy", KRT_I64, 1, (int64_t[]){4}, wide);
  char err[512];
  assert_int_equal(next_with_labels("ok.npy", KRT_I64, err, sizeof err), 0);
  assert_int_equal(next_with_labels("half.npy", KRT_I64, err, sizeof err), -1);
  assert_non_null(strstr(err, tpath("half.npy")));
  assert_non_null(strstr(err, "row 3: 1.5 is not an integer"));
  assert_int_equal(next_with_labels("big.npy", KRT_I32, err, sizeof err), -1);
  assert_non_null(strstr(err, "row 2: 3000000000 is out of range for i32"));
  assert_int_equal(next_with_labels("big.npy", KRT_I64, err, sizeof err), 0);
  assert_int_equal(next_with_labels("wide.npy", KRT_I32, err, sizeof err), -1);
  assert_non_null(strstr(err, "row 3: 1099511627776 is out of range for i32"));
}

static void test_conversion_errors_at_open(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 4);
  int64_t wide[4] = {0};
  write_npy("wide.npy", KRT_I64, 1, (int64_t[]){4}, wide);
  krt_loader_config c = indexed_config(2, 0, 0, 0);
  krt_loader *l;
  char err[512];
  c.y_path = tpath("wide.npy");
  c.y_dtype = KRT_F32;  /* i64 does not fit a double exactly */
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_non_null(strstr(err, "wide.npy: cannot convert the file's i64 to f32"));
  c.y_path = tpath("y.npy");
  c.y_dtype = KRT_I64;
  c.x_dtype = KRT_BOOL;
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_non_null(strstr(err, "x.npy: cannot convert the file's f64 to bool"));
}

/* ---- samples of any rank ------------------------------------------------ */
static void test_sample_shapes(void **state) {
  (void)state;
  float x[5][2][3];
  int64_t y[5][2];
  for (int i = 0; i < 5; i++) {
    for (int j = 0; j < 6; j++) x[i][j / 3][j % 3] = (float)(i * 100 + j);
    y[i][0] = i;
    y[i][1] = -i;
  }
  write_npy("x3.npy", KRT_F32, 3, (int64_t[]){5, 2, 3}, x);
  write_npy("y2.npy", KRT_I64, 2, (int64_t[]){5, 2}, y);
  krt_loader_config c = {.x_path = tpath("x3.npy"), .y_path = tpath("y2.npy"),
                         .batch = 2, .shuffle = 1, .seed = 9, .threads = 2,
                         .x_dtype = KRT_F32, .y_dtype = KRT_I64};
  krt_loader *l = open_ok(&c);
  krt_io_desc xd, yd;
  krt_loader_sample_desc(l, &xd, &yd);
  assert_int_equal(xd.rank, 2);
  assert_int_equal(xd.dims[0], 2);
  assert_int_equal(xd.dims[1], 3);
  assert_int_equal(xd.dtype, KRT_F32);
  assert_int_equal(yd.rank, 1);
  assert_int_equal(yd.dims[0], 2);
  assert_string_equal(xd.name, tpath("x3.npy"));
  for (int b = 0; b < 3; b++) {
    const void *xv, *yv;
    int count;
    char err[512];
    assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
    const float *xs = xv;
    const int64_t *ys = yv;
    for (int k = 0; k < count; k++) {
      int64_t i = ys[2 * k];
      assert_int_equal(ys[2 * k + 1], -i);
      assert_memory_equal(xs + 6 * k, x[i], sizeof x[i]);
    }
  }
  krt_loader_close(l);
}

/* x larger than krt_npy_read's limit of 2^31 - 1 elements: 50000 x 50000
 * bytes, a sparse file (zeros) with two bytes set, at offsets beyond 2^31. */
static void test_file_beyond_numel_limit(void **state) {
  (void)state;
  const int64_t n = 50000;
  char hdr[128];
  int len = snprintf(hdr, sizeof hdr, "{'descr': '|u1', 'fortran_order': False, "
                     "'shape': (%lld, %lld), }", (long long)n, (long long)n);
  int64_t data_at = 128;  /* 10 + header padded with spaces and '\n' */
  memset(hdr + len, ' ', sizeof hdr - (size_t)len);
  hdr[data_at - 10 - 1] = '\n';
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                           (unsigned char)(data_at - 10), 0};
  FILE *f = fopen(tpath("big.npy"), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(pre, 1, 10, f), 10);
  assert_int_equal(fwrite(hdr, 1, (size_t)(data_at - 10), f), (size_t)(data_at - 10));
  const int64_t marks[2][2] = {{43000, 1}, {n - 1, n - 1}};  /* row, column */
  for (int m = 0; m < 2; m++) {
    assert_int_equal(fseeko(f, data_at + marks[m][0] * n + marks[m][1], SEEK_SET), 0);
    assert_int_equal(fputc(7 + m, f), 7 + m);
  }
  assert_int_equal(fclose(f), 0);
  int64_t *y = malloc((size_t)n * sizeof *y);
  for (int64_t i = 0; i < n; i++) y[i] = i;
  write_npy("bigy.npy", KRT_I64, 1, (int64_t[]){n}, y);
  free(y);

  char err[512];
  krt_tensor t;
  assert_int_equal(krt_npy_read(tpath("big.npy"), &t, err, sizeof err), -1);
  assert_non_null(strstr(err, "more than 2147483647 elements"));

  krt_loader_config c = {.x_path = tpath("big.npy"), .y_path = tpath("bigy.npy"),
                         .batch = 1, .x_dtype = KRT_F32, .y_dtype = KRT_I64};
  krt_loader *l = open_ok(&c);
  assert_int_equal(krt_loader_samples(l), n);
  for (int m = 0; m < 2; m++) {
    if (krt_loader_seek(l, 0, marks[m][0], err, sizeof err)) fail_msg("%s", err);
    const void *xv, *yv;
    int count;
    assert_int_equal(krt_loader_next(l, &xv, &yv, &count, NULL, err, sizeof err), 0);
    const float *x = xv;
    assert_int_equal(*(const int64_t *)yv, marks[m][0]);
    for (int64_t j = 0; j < n; j++)
      if (x[j] != (j == marks[m][1] ? 7.0f + (float)m : 0.0f))
        fail_msg("row %lld, column %lld: %g", (long long)marks[m][0], (long long)j, x[j]);
  }
  krt_loader_close(l);
  unlink(tpath("big.npy"));
}

/* ---- bad input ----------------------------------------------------------- */
static void test_mismatched_n(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 10);
  write_indexed("x9.npy", "y9.npy", 9);
  krt_loader_config c = indexed_config(2, 1, 0, 0);
  c.y_path = tpath("y9.npy");
  krt_loader *l = (krt_loader *)&c;  /* must come back NULL */
  char err[512];
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_null(l);
  assert_non_null(strstr(err, tpath("x.npy")));
  assert_non_null(strstr(err, tpath("y9.npy")));
  assert_non_null(strstr(err, "has 10 samples"));
  assert_non_null(strstr(err, "has 9"));
}

static void test_missing_file(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 10);
  krt_loader_config c = indexed_config(2, 1, 0, 0);
  c.y_path = tpath("nope.npy");
  krt_loader *l;
  char err[512];
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_non_null(strstr(err, tpath("nope.npy")));
  assert_non_null(strstr(err, "No such file"));
}

static void test_fortran_order_and_scalars(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 2);
  /* a (2,) f4 array saved with fortran_order True */
  char hdr[] = "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }";
  char file[128] = "\x93NUMPY\x01\x00";
  size_t hlen = strlen(hdr) + 1;
  file[8] = (char)hlen;
  memcpy(file + 10, hdr, hlen - 1);
  file[10 + hlen - 1] = '\n';
  memset(file + 10 + hlen, 0, 8);
  FILE *f = fopen(tpath("fortran.npy"), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(file, 1, 10 + hlen + 8, f), 10 + hlen + 8);
  fclose(f);
  krt_loader_config c = indexed_config(1, 0, 0, 0);
  c.y_path = tpath("fortran.npy");
  krt_loader *l;
  char err[512];
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_non_null(strstr(err, "fortran.npy: Fortran-order arrays are not supported"));

  float one = 1;
  write_npy("scalar.npy", KRT_F32, 0, NULL, &one);
  c.y_path = tpath("scalar.npy");
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_non_null(strstr(err, "scalar.npy: holds a scalar"));
}

static void test_bad_config(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 4);
  krt_loader *l;
  char err[512];
  krt_loader_config c = indexed_config(0, 0, 0, 0);
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_non_null(strstr(err, "batch must be at least 1"));
  c = indexed_config(2, 0, 0, -1);
  assert_int_equal(krt_loader_open(&c, &l, err, sizeof err), -1);
  assert_non_null(strstr(err, "threads"));
  assert_int_equal(krt_loader_open(NULL, &l, err, sizeof err), -1);
  krt_loader_close(NULL);
}

/* Closing while the workers are busy (nothing consumed, or mid-epoch)
 * joins them without a hang. */
static void test_close_while_filling(void **state) {
  (void)state;
  write_indexed("x.npy", "y.npy", 5000);
  for (int consumed = 0; consumed < 3; consumed++) {
    krt_loader_config c = indexed_config(1000, 1, 0, 4);
    krt_loader *l = open_ok(&c);
    int64_t *rows = malloc(1000 * sizeof *rows);
    for (int b = 0; b < consumed; b++) next_rows(l, rows);
    free(rows);
    krt_loader_close(l);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_epoch_covers_each_sample_once),
      cmocka_unit_test(test_epochs_differ_and_seed_repeats),
      cmocka_unit_test(test_order_recipe),
      cmocka_unit_test(test_threads_give_identical_batches),
      cmocka_unit_test(test_one_batch_epochs),
      cmocka_unit_test(test_batch_stays_valid_until_next_call),
      cmocka_unit_test(test_drop_last),
      cmocka_unit_test(test_short_last_batch_is_zero_padded),
      cmocka_unit_test(test_batch_larger_than_n),
      cmocka_unit_test(test_seek_reproduces_the_sequence),
      cmocka_unit_test(test_convert_floats),
      cmocka_unit_test(test_convert_integers),
      cmocka_unit_test(test_float_labels),
      cmocka_unit_test(test_conversion_errors_at_open),
      cmocka_unit_test(test_sample_shapes),
      cmocka_unit_test(test_file_beyond_numel_limit),
      cmocka_unit_test(test_mismatched_n),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_fortran_order_and_scalars),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_close_while_filling),
  };
  return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
