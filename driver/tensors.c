/* tensors.c - tensor files and fill-in inputs for the kiln command. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "driver.h"

kl_tensor *kiln_read_tensor(const char *path) {
  size_t n = strlen(path);
  if (n >= 3 && !strcmp(path + n - 3, ".pb")) {
    kl_error err;
    kl_tensor *t = kl_read_tensor_pb(path, &err);
    if (!t) kl_error_print(stderr, &err);
    return t;
  }
  krt_tensor raw = {0};
  char msg[512];
  if (krt_npy_read(path, &raw, msg, sizeof msg)) {
    fprintf(stderr, "kiln: error: %s\n", msg);
    return NULL;
  }
  kl_shape s = {.rank = raw.rank};
  for (int d = 0; d < raw.rank; d++) s.dims[d] = raw.dims[d];
  kl_tensor *t = kl_tensor_new((kl_dtype)raw.dtype, &s);
  int inexact = kl_tensor_from_raw(t, raw.data);
  krt_tensor_free(&raw);
  if (inexact) {
    fprintf(stderr, "kiln: error: %s: a 64-bit integer lies beyond 2^53, which cannot be "
                    "held exactly (Kiln reads tensors as float64 on every device)\n", path);
    kl_tensor_free(t);
    return NULL;
  }
  return t;
}

int kiln_write_tensor(const char *path, const kl_tensor *t) {
  krt_tensor raw = {.dtype = (krt_dtype)t->dtype, .rank = t->shape.rank};
  for (int d = 0; d < t->shape.rank; d++) raw.dims[d] = t->shape.dims[d];
  size_t bytes = (size_t)t->numel * kl_dtype_size(t->dtype);
  raw.data = malloc(bytes ? bytes : 1);
  if (!raw.data) abort();
  kl_tensor_to_raw(t, raw.data);
  char msg[512];
  int rc = krt_npy_write(path, &raw, msg, sizeof msg);
  if (rc) fprintf(stderr, "kiln: error: %s\n", msg);
  free(raw.data);
  return rc;
}

/* Normal(0, 1) for floats (rounded to the small ones too), small
 * non-negative integers (valid as indices into most axes) for integer
 * types, coin flips for bool. */
kl_tensor *kiln_random_tensor(const kl_value *decl, uint64_t seed) {
  kl_tensor *t = kl_tensor_new(decl->dtype, &decl->shape);
  kl_rng rng;
  kl_rng_seed(&rng, seed);
  for (int64_t i = 0; i < t->numel; i++) {
    double v;
    if (kl_dtype_is_float(decl->dtype) || kl_dtype_is_small_float(decl->dtype))
      v = kl_rng_normal(&rng);
    else if (decl->dtype == KL_BOOL) v = kl_rng_next(&rng) & 1;
    else v = (double)(kl_rng_next(&rng) % 4);
    t->data[i] = kl_dtype_round(decl->dtype, v);
  }
  return t;
}

void kiln_print_summary(FILE *f, const char *label, const kl_tensor *t) {
  char buf[160];
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  int64_t nans = 0;
  for (int64_t i = 0; i < t->numel; i++) {
    double v = t->data[i];
    if (isnan(v)) { nans++; continue; }
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    sum += v;
  }
  fprintf(f, "%s: %s%s", label, kl_dtype_name(t->dtype), kl_shape_str(&t->shape, buf, sizeof buf));
  if (t->numel > nans)
    fprintf(f, "  min %.6g  max %.6g  mean %.6g", lo, hi, sum / (double)(t->numel - nans));
  if (nans) fprintf(f, "  NaN x%lld", (long long)nans);
  fputs("\n  [", f);
  for (int64_t i = 0; i < t->numel && i < 6; i++) fprintf(f, "%s%.6g", i ? ", " : "", t->data[i]);
  fprintf(f, "%s]\n", t->numel > 6 ? ", ..." : "");
}

/* A training step's scalar inputs, when no file gives them: a step that
 * takes its update (learning rate 1e-2, no bias correction, no loss
 * scale), so that kiln run, check and bench see the params change. */
bool kiln_train_scalar(const kl_graph *g, const kl_value *decl, double *value) {
  const kl_train *t = g->train;
  if (!t || !t->built) return false;
  const kl_value *vals[5] = {t->in_lr, t->in_bias1, t->in_bias2, t->in_scale, t->in_apply};
  const double v[5] = {1e-2, 1, 1, 1, 1};
  for (int k = 0; k < 5; k++)
    if (decl == vals[k]) {
      *value = v[k];
      return true;
    }
  return false;
}
