/* ops_reduce.c - reductions, argmax, the softmax family, the norms and the
 * cross-entropy loss: shape inference and reference evaluation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* View shape s as [outer, s[axis], inner]. */
static void split_at(const kl_shape *s, int axis, int64_t *outer, int64_t *k,
                     int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < axis; d++) *outer *= s->dims[d];
  for (int d = axis + 1; d < s->rank; d++) *inner *= s->dims[d];
  *k = s->dims[axis];
}

/* s without axis `axis` (keep: with it set to 1). */
static kl_shape drop_axis(const kl_shape *s, int axis, bool keep) {
  kl_shape r = {0};
  for (int d = 0; d < s->rank; d++)
    if (d != axis) r.dims[r.rank++] = s->dims[d];
    else if (keep) r.dims[r.rank++] = 1;
  return r;
}

/* ---- reductions ------------------------------------------------------ */
typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD } reduce_kind;

/* Reduced axes from the `axes` attribute; absent means all axes. */
static int reduce_mask(const kl_node *n, kl_error *err, int rank, bool *mask) {
  const int64_t *axes;
  int na = kl_attr_ints(n, "axes", &axes);
  for (int d = 0; d < rank; d++) mask[d] = na < 0;
  for (int i = 0; i < na; i++) {
    int ax;
    if (kl_norm_axis(axes[i], rank, &ax, n, err)) return -1;
    if (mask[ax])
      return KL_NODE_FAIL(n, err, "axis %d appears twice in axes", ax);
    mask[ax] = true;
  }
  return 0;
}

static int infer_reduce(kl_node *n, kl_error *err, reduce_kind kind) {
  const kl_value *x = n->inputs[0];
  bool mask[KL_MAX_RANK], keep = false;
  if (kl_need_numeric(n, err, x) || reduce_mask(n, err, x->shape.rank, mask) ||
      kl_attr_flag(n, err, "keepdims", 0, &keep))
    return -1;
  kl_shape s = {0};
  int64_t count = 1;
  for (int d = 0; d < x->shape.rank; d++) {
    if (mask[d]) count *= x->shape.dims[d];
    if (!mask[d]) s.dims[s.rank++] = x->shape.dims[d];
    else if (keep) s.dims[s.rank++] = 1;
  }
  /* NaN has no integer value. */
  if (kind == R_MEAN && count == 0 && kl_dtype_is_int(x->dtype) &&
      kl_shape_numel(&s) > 0) {
    char b[256];
    return KL_NODE_FAIL(n, err, "mean over zero elements of %s is undefined "
                        "for an integer dtype", kl_value_str(x, b, sizeof b));
  }
  kl_set_output(n, 0, x->dtype, &s);
  return 0;
}

/* The result of reducing nothing; integer max/min use the dtype's limits
 * since they have no infinities. */
static double identity(reduce_kind kind, kl_dtype t) {
  double lo = t == KL_I8 ? -128.0 : t == KL_I32 ? -2147483648.0
                                                : -9223372036854775808.0;
  double hi = t == KL_I8 ? 127.0 : t == KL_I32 ? 2147483647.0
                                               : 9223372036854775807.0;
  switch (kind) {
  case R_MAX: return kl_dtype_is_int(t) ? lo : -INFINITY;
  case R_MIN: return kl_dtype_is_int(t) ? hi : INFINITY;
  case R_PROD: return 1.0;
  default: return 0.0;
  }
}

/* NaN wins in max/min, as numpy's reductions do. */
static double combine(reduce_kind kind, double acc, double v) {
  switch (kind) {
  case R_MAX: return isnan(acc) || isnan(v) ? NAN : v > acc ? v : acc;
  case R_MIN: return isnan(acc) || isnan(v) ? NAN : v < acc ? v : acc;
  case R_PROD: return acc * v;
  default: return acc + v;
  }
}

static int eval_reduce(const kl_node *n, const kl_tensor *x, kl_tensor *y,
                       reduce_kind kind, kl_error *err) {
  bool mask[KL_MAX_RANK];
  if (reduce_mask(n, err, x->shape.rank, mask)) return -1;
  /* Output offset of an input index: strides of the keepdims shape, with
   * the reduced axes contributing nothing. */
  kl_shape ks = x->shape;
  int64_t ostr[KL_MAX_RANK], count = 1;
  for (int d = 0; d < ks.rank; d++)
    if (mask[d]) {
      count *= ks.dims[d];
      ks.dims[d] = 1;
    }
  kl_shape_strides(&ks, ostr);
  for (int d = 0; d < ks.rank; d++)
    if (mask[d]) ostr[d] = 0;

  /* Integer products overflow a double's 53 bits long before they wrap, so
   * they are accumulated as wrapping 64-bit integers. */
  uint64_t *iacc = NULL;
  if (kind == R_PROD && kl_dtype_is_int(x->dtype)) {
    iacc = malloc((size_t)(y->numel ? y->numel : 1) * sizeof *iacc);
    if (!iacc) return KL_NODE_FAIL(n, err, "out of memory");
    for (int64_t j = 0; j < y->numel; j++) iacc[j] = 1;
  }
  for (int64_t j = 0; j < y->numel; j++) y->data[j] = identity(kind, x->dtype);

  int64_t idx[KL_MAX_RANK] = {0};
  for (int64_t i = 0; i < x->numel; i++, kl_index_next(&x->shape, idx)) {
    int64_t o = 0;
    for (int d = 0; d < ks.rank; d++) o += idx[d] * ostr[d];
    if (iacc) iacc[o] *= (uint64_t)kl_to_i64(x->data[i]);
    else y->data[o] = combine(kind, y->data[o], x->data[i]);
  }
  for (int64_t j = 0; j < y->numel; j++) {
    if (iacc) y->data[j] = kl_wrap_to(y->dtype, iacc[j]);
    if (kind == R_MEAN) y->data[j] /= (double)count; /* 0/0: NaN */
  }
  free(iacc);
  return 0;
}

#define REDUCE_ROW(ID, KIND)                                                   \
  int kl_infer_##ID(kl_node *n, kl_error *err) {                               \
    return infer_reduce(n, err, KIND);                                         \
  }                                                                            \
  int kl_eval_##ID(const kl_node *n, kl_tensor **in, kl_tensor **out,          \
                   kl_error *err) {                                            \
    return eval_reduce(n, in[0], out[0], KIND, err);                           \
  }

REDUCE_ROW(REDUCE_SUM, R_SUM)
REDUCE_ROW(REDUCE_MEAN, R_MEAN)
REDUCE_ROW(REDUCE_MAX, R_MAX)
REDUCE_ROW(REDUCE_MIN, R_MIN)
REDUCE_ROW(REDUCE_PROD, R_PROD)

/* ---- argmax ---------------------------------------------------------- */
int kl_infer_ARGMAX(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int axis;
  bool keep = false;
  if (kl_need_numeric(n, err, x) ||
      kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err) ||
      kl_attr_flag(n, err, "keepdims", 1, &keep))
    return -1;
  kl_shape s = drop_axis(&x->shape, axis, keep);
  if (x->shape.dims[axis] == 0 && kl_shape_numel(&s) > 0) {
    char b[256];
    return KL_NODE_FAIL(n, err, "axis %d of %s is empty, so it has no maximum",
                        axis, kl_value_str(x, b, sizeof b));
  }
  kl_set_output(n, 0, KL_I64, &s);
  return 0;
}

int kl_eval_ARGMAX(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  const kl_tensor *x = in[0];
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  int64_t outer, k, inner;
  split_at(&x->shape, axis, &outer, &k, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const double *row = x->data + o * k * inner + i;
      int64_t best = 0;
      /* Strict > keeps the first maximum; the first NaN wins, as numpy. */
      for (int64_t j = 1; j < k && !isnan(row[best * inner]); j++)
        if (isnan(row[j * inner]) || row[j * inner] > row[best * inner])
          best = j;
      out[0]->data[o * inner + i] = (double)best;
    }
  return 0;
}

/* ---- softmax family -------------------------------------------------- */
/* Max and sum of exp(x - max) of a strided row: the stable log-sum-exp. */
static double row_max(const double *x, int64_t k, int64_t st) {
  double m = -INFINITY;
  for (int64_t j = 0; j < k; j++)
    if (x[j * st] > m || isnan(x[j * st])) m = x[j * st];
  return m;
}

static double row_sum_exp(const double *x, int64_t k, int64_t st, double m) {
  double s = 0;
  for (int64_t j = 0; j < k; j++) s += exp(x[j * st] - m);
  return s;
}

static int infer_softmax(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int axis;
  if (kl_need_float(n, err, x) ||
      kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, &axis, n, err))
    return -1;
  kl_set_output(n, 0, x->dtype, &x->shape);
  return 0;
}

static int eval_softmax(const kl_node *n, const kl_tensor *x, kl_tensor *y,
                        bool log_form, kl_error *err) {
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, &axis, n, err))
    return -1;
  int64_t outer, k, inner;
  split_at(&x->shape, axis, &outer, &k, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * k * inner + i;
      const double *xr = x->data + base;
      double *yr = y->data + base;
      double m = row_max(xr, k, inner), s = row_sum_exp(xr, k, inner, m);
      for (int64_t j = 0; j < k; j++)
        yr[j * inner] = log_form ? xr[j * inner] - m - log(s)
                                 : exp(xr[j * inner] - m) / s;
    }
  return 0;
}

int kl_infer_SOFTMAX(kl_node *n, kl_error *err) {
  return infer_softmax(n, err);
}
int kl_infer_LOG_SOFTMAX(kl_node *n, kl_error *err) {
  return infer_softmax(n, err);
}
int kl_eval_SOFTMAX(const kl_node *n, kl_tensor **in, kl_tensor **out,
                    kl_error *err) {
  return eval_softmax(n, in[0], out[0], false, err);
}
int kl_eval_LOG_SOFTMAX(const kl_node *n, kl_tensor **in, kl_tensor **out,
                        kl_error *err) {
  return eval_softmax(n, in[0], out[0], true, err);
}

/* ---- layer_norm, rms_norm -------------------------------------------- */
static const char *const affine_names[] = {"x", "scale", "bias"};

/* x.shape[axis:], the shape each normalised row has. */
static kl_shape norm_shape(const kl_shape *s, int axis) {
  kl_shape r = {.rank = s->rank - axis};
  for (int d = axis; d < s->rank; d++) r.dims[d - axis] = s->dims[d];
  return r;
}

/* x, then optional scale and bias that broadcast to x.shape[axis:]. */
static int infer_norm(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int axis;
  if (kl_need_float(n, err, x) ||
      kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, &axis, n, err))
    return -1;
  kl_shape ns = norm_shape(&x->shape, axis), b;
  for (int k = 1; k < n->ninputs; k++) {
    const kl_value *p = n->inputs[k];
    char bx[256], bp[256], bs[200];
    if (p->dtype != x->dtype)
      return KL_NODE_FAIL(n, err, "%s %s must have x's dtype (x is %s)",
                          affine_names[k], kl_value_str(p, bp, sizeof bp),
                          kl_value_str(x, bx, sizeof bx));
    kl_error scratch;
    if (p->shape.rank > ns.rank ||
        kl_broadcast_shapes(&p->shape, &ns, &b, &scratch, n->loc) ||
        !kl_shape_equal(&b, &ns))
      return KL_NODE_FAIL(n, err, "%s %s does not broadcast to the normalised "
                          "shape %s (x is %s, axis %d)",
                          affine_names[k], kl_value_str(p, bp, sizeof bp),
                          kl_shape_str(&ns, bs, sizeof bs),
                          kl_value_str(x, bx, sizeof bx), axis);
  }
  kl_set_output(n, 0, x->dtype, &x->shape);
  return 0;
}

/* t broadcast to the row shape ns, flattened into dst. */
static void expand_to(const kl_tensor *t, const kl_shape *ns, double *dst) {
  int64_t idx[KL_MAX_RANK] = {0}, m = kl_shape_numel(ns);
  for (int64_t j = 0; j < m; j++, kl_index_next(ns, idx))
    dst[j] = t->data[kl_broadcast_index(&t->shape, ns, idx)];
}

/* layer_norm (center: subtract the mean, scale, bias) and rms_norm (no
 * centering, scale only) share everything but the statistics. */
static int eval_norm(const kl_node *n, kl_tensor **in, kl_tensor *y,
                     bool center, kl_error *err) {
  const kl_tensor *x = in[0];
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, &axis, n, err))
    return -1;
  double eps = kl_attr_float(n, "epsilon", 1e-5);
  kl_shape ns = norm_shape(&x->shape, axis);
  int64_t m = kl_shape_numel(&ns);
  if (m == 0) return 0;
  double *scale = malloc(2 * (size_t)m * sizeof *scale);
  if (!scale) return KL_NODE_FAIL(n, err, "out of memory");
  double *bias = scale + m;
  for (int64_t j = 0; j < m; j++) {
    scale[j] = 1.0;
    bias[j] = 0.0;
  }
  if (n->ninputs > 1) expand_to(in[1], &ns, scale);
  if (n->ninputs > 2) expand_to(in[2], &ns, bias);

  for (int64_t r = 0; r < x->numel / m; r++) {
    const double *xr = x->data + r * m;
    double *yr = y->data + r * m;
    double mean = 0, sq = 0;
    if (center) {
      for (int64_t j = 0; j < m; j++) mean += xr[j];
      mean /= (double)m;
    }
    /* Two passes: the variance of x - mean, not E[x^2] - mean^2, which
     * cancels badly. */
    for (int64_t j = 0; j < m; j++) sq += (xr[j] - mean) * (xr[j] - mean);
    double inv = 1.0 / sqrt(sq / (double)m + eps);
    for (int64_t j = 0; j < m; j++)
      yr[j] = (xr[j] - mean) * inv * scale[j] + bias[j];
  }
  free(scale);
  return 0;
}

int kl_infer_LAYER_NORM(kl_node *n, kl_error *err) {
  return infer_norm(n, err);
}
int kl_infer_RMS_NORM(kl_node *n, kl_error *err) { return infer_norm(n, err); }
int kl_eval_LAYER_NORM(const kl_node *n, kl_tensor **in, kl_tensor **out,
                       kl_error *err) {
  return eval_norm(n, in, out[0], true, err);
}
int kl_eval_RMS_NORM(const kl_node *n, kl_tensor **in, kl_tensor **out,
                     kl_error *err) {
  return eval_norm(n, in, out[0], false, err);
}

/* ---- batch_norm ------------------------------------------------------ */
static const char *const bn_names[] = {"x", "scale", "bias", "mean", "var"};

int kl_infer_BATCH_NORM(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char bx[256], bp[256];
  if (kl_need_float(n, err, x)) return -1;
  if (x->shape.rank < 2)
    return KL_NODE_FAIL(n, err, "x must have rank >= 2 (N, C, ...), got %s",
                        kl_value_str(x, bx, sizeof bx));
  int64_t c = x->shape.dims[1];
  for (int k = 1; k < 5; k++) {
    const kl_value *p = n->inputs[k];
    if (p->dtype != x->dtype || p->shape.rank != 1 || p->shape.dims[0] != c)
      return KL_NODE_FAIL(n, err, "%s must be %s[%lld] (one per channel of x "
                          "%s), got %s", bn_names[k], kl_dtype_name(x->dtype),
                          (long long)c, kl_value_str(x, bx, sizeof bx),
                          kl_value_str(p, bp, sizeof bp));
  }
  kl_set_output(n, 0, x->dtype, &x->shape);
  return 0;
}

int kl_eval_BATCH_NORM(const kl_node *n, kl_tensor **in, kl_tensor **out,
                       kl_error *err) {
  (void)err;
  const kl_tensor *x = in[0];
  const double *scale = in[1]->data, *bias = in[2]->data, *mean = in[3]->data,
               *var = in[4]->data;
  double eps = kl_attr_float(n, "epsilon", 1e-5);
  int64_t outer, c, inner;
  split_at(&x->shape, 1, &outer, &c, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t ch = 0; ch < c; ch++) {
      double a = scale[ch] / sqrt(var[ch] + eps);
      int64_t base = (o * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++)
        out[0]->data[base + i] = (x->data[base + i] - mean[ch]) * a + bias[ch];
    }
  return 0;
}

/* ---- cross_entropy --------------------------------------------------- */
typedef enum { RED_MEAN, RED_SUM, RED_NONE } reduction;

static int get_reduction(const kl_node *n, kl_error *err, reduction *r) {
  const char *s = kl_attr_string(n, "reduction", "mean");
  if (strcmp(s, "mean") == 0) *r = RED_MEAN;
  else if (strcmp(s, "sum") == 0) *r = RED_SUM;
  else if (strcmp(s, "none") == 0) *r = RED_NONE;
  else
    return KL_NODE_FAIL(n, err, "reduction must be \"mean\", \"sum\" or "
                        "\"none\", not \"%s\"", s);
  return 0;
}

int kl_infer_CROSS_ENTROPY(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0], *l = n->inputs[1];
  int axis;
  reduction red;
  char bx[256], bl[256];
  if (kl_need_float(n, err, x) ||
      kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, &axis, n, err) ||
      get_reduction(n, err, &red))
    return -1;
  if (x->shape.dims[axis] == 0)
    return KL_NODE_FAIL(n, err, "logits %s have no classes on axis %d",
                        kl_value_str(x, bx, sizeof bx), axis);
  kl_shape items = drop_axis(&x->shape, axis, false);
  if (l->dtype == KL_I32 || l->dtype == KL_I64) {
    if (!kl_shape_equal(&l->shape, &items)) {
      char bs[200];
      return KL_NODE_FAIL(n, err, "class-index labels must have shape %s "
                          "(logits %s without axis %d), got %s",
                          kl_shape_str(&items, bs, sizeof bs),
                          kl_value_str(x, bx, sizeof bx), axis,
                          kl_value_str(l, bl, sizeof bl));
    }
  } else if (kl_dtype_is_float(l->dtype)) {
    if (l->dtype != x->dtype || !kl_shape_equal(&l->shape, &x->shape))
      return KL_NODE_FAIL(n, err, "probability labels must match the logits "
                          "%s, got %s", kl_value_str(x, bx, sizeof bx),
                          kl_value_str(l, bl, sizeof bl));
  } else {
    return KL_NODE_FAIL(n, err, "labels must be i32/i64 class indices or "
                        "float probabilities, got %s",
                        kl_value_str(l, bl, sizeof bl));
  }
  kl_shape scalar = {0};
  kl_set_output(n, 0, x->dtype, red == RED_NONE ? &items : &scalar);
  return 0;
}

int kl_eval_CROSS_ENTROPY(const kl_node *n, kl_tensor **in, kl_tensor **out,
                          kl_error *err) {
  const kl_tensor *x = in[0], *l = in[1];
  int axis;
  reduction red;
  if (kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, &axis, n, err) ||
      get_reduction(n, err, &red))
    return -1;
  bool indices = !kl_dtype_is_float(l->dtype);
  int64_t outer, c, inner;
  split_at(&x->shape, axis, &outer, &c, &inner);
  double total = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * c * inner + i, item = o * inner + i;
      const double *xr = x->data + base;
      double m = row_max(xr, c, inner);
      double lse = m + log(row_sum_exp(xr, c, inner, m)), loss = 0;
      if (indices) {
        double lab = l->data[item];
        if (!(lab >= 0 && lab < (double)c))
          return KL_NODE_FAIL(n, err, "label %lld is out of range [0, %lld) "
                              "(item %lld)", (long long)kl_to_i64(lab),
                              (long long)c, (long long)item);
        loss = lse - xr[(int64_t)lab * inner];
      } else {
        /* 0 * log p counts as 0 even where p's logit is -inf. */
        for (int64_t j = 0; j < c; j++) {
          double p = l->data[base + j * inner];
          if (p != 0) loss -= p * (xr[j * inner] - lse);
        }
      }
      if (red == RED_NONE) out[0]->data[item] = loss;
      else total += loss;
    }
  if (red == RED_SUM) out[0]->data[0] = total;
  if (red == RED_MEAN) out[0]->data[0] = total / (double)(outer * inner);
  return 0;
}
