/* ops_nn.c - shape inference and reference evaluation of the softmax
 * family, the norms and the losses (cross_entropy, nll_loss). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* ---- shared helpers -------------------------------------------------- */

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

static int need_float(const kl_node *n, kl_error *err, int k,
                      const char *what) {
  char b[300];
  if (kl_dtype_is_float(n->inputs[k]->dtype)) return 0;
  return KL_NODE_FAIL(n, err, "%s must be a float tensor, got %s", what,
                      kl_value_str(n->inputs[k], b, sizeof b));
}

/* Index of `s` in the NULL-terminated list, or a failure naming them. */
static int pick(const kl_node *n, kl_error *err, const char *attr,
                const char *dflt, const char *const *names, int *out) {
  const char *s = kl_attr_string(n, attr, dflt);
  char all[400] = "";
  for (int i = 0; names[i]; i++) {
    if (!strcmp(s, names[i])) {
      *out = i;
      return 0;
    }
    snprintf(all + strlen(all), sizeof all - strlen(all), "%s\"%s\"",
             i ? ", " : "", names[i]);
  }
  return KL_NODE_FAIL(n, err, "%s must be one of %s, not \"%s\"", attr, all,
                      s);
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

/* ---- nll_loss -------------------------------------------------------- */

static const char *const reductions[] = {"mean", "sum", "none", NULL};

int kl_infer_NLL_LOSS(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0], *t = n->inputs[1];
  const kl_value *w = n->ninputs > 2 ? n->inputs[2] : NULL;
  char bx[300], bt[300];
  int red;
  if (need_float(n, err, 0, "x") ||
      pick(n, err, "reduction", "mean", reductions, &red))
    return -1;
  if (x->shape.rank < 2)
    return KL_NODE_FAIL(n, err, "x must be [N, C, d...], got %s",
                        kl_value_str(x, bx, sizeof bx));
  kl_shape items = {0};
  for (int d = 0; d < x->shape.rank; d++)
    if (d != 1) items.dims[items.rank++] = x->shape.dims[d];
  if ((t->dtype != KL_I32 && t->dtype != KL_I64) ||
      !kl_shape_equal(&t->shape, &items)) {
    char bs[200];
    return KL_NODE_FAIL(n, err, "target must be i32/i64 of shape %s (x %s "
                        "without its class axis 1), got %s",
                        kl_shape_str(&items, bs, sizeof bs),
                        kl_value_str(x, bx, sizeof bx),
                        kl_value_str(t, bt, sizeof bt));
  }
  if (w && (w->dtype != x->dtype || w->shape.rank != 1 ||
            w->shape.dims[0] != x->shape.dims[1]))
    return KL_NODE_FAIL(n, err, "weight must be %s[%lld] (one per class of x "
                        "%s), got %s", kl_dtype_name(x->dtype),
                        (long long)x->shape.dims[1],
                        kl_value_str(x, bx, sizeof bx),
                        kl_value_str(w, bt, sizeof bt));
  kl_shape scalar = {0};
  kl_set_output(n, 0, x->dtype, red == RED_NONE ? &items : &scalar);
  return 0;
}

int kl_eval_NLL_LOSS(const kl_node *n, kl_tensor **in, kl_tensor **out,
                     kl_error *err) {
  const kl_tensor *x = in[0], *t = in[1];
  const kl_tensor *w = n->ninputs > 2 ? in[2] : NULL;
  int red;
  if (pick(n, err, "reduction", "mean", reductions, &red)) return -1;
  bool has_ii = kl_node_attr(n, "ignore_index") != NULL;
  int64_t ii = kl_attr_int(n, "ignore_index", 0);
  int64_t nb = x->shape.dims[0], c = x->shape.dims[1];
  int64_t inner = nb > 0 && c > 0 ? x->numel / (nb * c) : 0;
  double total = 0, wsum = 0;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t item = b * inner + i, cls = kl_to_i64(t->data[item]);
      double loss = 0, wt = 0;
      if (!has_ii || cls != ii) {
        if (cls < 0 || cls >= c)
          return KL_NODE_FAIL(n, err, "target %lld is out of range [0, %lld) "
                              "(item %lld)", (long long)cls, (long long)c,
                              (long long)item);
        wt = w ? w->data[cls] : 1.0;
        loss = -x->data[(b * c + cls) * inner + i] * wt;
      }
      if (red == RED_NONE) out[0]->data[item] = loss;
      total += loss;
      wsum += wt;
    }
  if (red == RED_SUM) out[0]->data[0] = total;
  if (red == RED_MEAN) out[0]->data[0] = total / wsum;
  return 0;
}

/* ---- rotary ---------------------------------------------------------- */
/* x's layout: B, H, S, D and the strides of h and s in x (a [B,S,H*D] x
 * has them swapped). */
typedef struct {
  int64_t b, h, s, d, r, sh, ss;
} rotary_dims;

static int rotary_layout(const kl_node *n, kl_error *err, const kl_shape *x, rotary_dims *o) {
  char bx[200];
  if (x->rank == 4) {
    *o = (rotary_dims){.b = x->dims[0], .h = x->dims[1], .s = x->dims[2], .d = x->dims[3]};
    o->sh = o->s * o->d, o->ss = o->d;
  } else if (x->rank == 3) {
    int64_t h = kl_attr_int(n, "num_heads", 0);
    if (h < 1 || x->dims[2] % h)
      return KL_NODE_FAIL(n, err, "a 3-D x %s needs num_heads dividing its last dim, got %lld",
                          kl_shape_str(x, bx, sizeof bx), (long long)h);
    *o = (rotary_dims){.b = x->dims[0], .h = h, .s = x->dims[1], .d = x->dims[2] / h};
    o->sh = o->d, o->ss = h * o->d;
  } else {
    return KL_NODE_FAIL(n, err, "x must be [B,H,S,D] or [B,S,H*D], got %s",
                        kl_shape_str(x, bx, sizeof bx));
  }
  o->r = kl_attr_int(n, "rotary_dim", 0);
  if (o->r == 0) o->r = o->d;
  if (o->r < 0 || o->r > o->d || o->r % 2)
    return KL_NODE_FAIL(n, err, "rotary_dim %lld must be even and at most the head size %lld",
                        (long long)o->r, (long long)o->d);
  return 0;
}

int kl_infer_ROTARY(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  rotary_dims rd;
  if (kl_need_float(n, err, x) || rotary_layout(n, err, &x->shape, &rd)) return -1;
  for (int k = 1; k < 3; k++) {
    const kl_value *c = n->inputs[k];
    const kl_shape *cs = &c->shape;
    char bc[256];
    bool ok = c->dtype == x->dtype && (cs->rank == 2 || cs->rank == 3) &&
              cs->dims[cs->rank - 1] == rd.r / 2 && cs->dims[cs->rank - 2] == rd.s &&
              (cs->rank == 2 || cs->dims[0] == 1 || cs->dims[0] == rd.b);
    if (!ok)
      return KL_NODE_FAIL(n, err, "%s %s must be x's dtype and [%lld, %lld, %lld]",
                          k == 1 ? "cos" : "sin", kl_value_str(c, bc, sizeof bc),
                          (long long)rd.b, (long long)rd.s, (long long)(rd.r / 2));
  }
  /* one batch stride serves both (here and in the kernel) */
  if (!kl_shape_equal(&n->inputs[1]->shape, &n->inputs[2]->shape)) {
    char bc[256], bs[256];
    return KL_NODE_FAIL(n, err, "cos %s and sin %s must have the same shape",
                        kl_value_str(n->inputs[1], bc, sizeof bc),
                        kl_value_str(n->inputs[2], bs, sizeof bs));
  }
  kl_set_output(n, 0, x->dtype, &x->shape);
  return 0;
}

int kl_eval_ROTARY(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  const kl_tensor *x = in[0];
  rotary_dims rd;
  if (rotary_layout(n, err, &x->shape, &rd)) return -1;
  bool inter = kl_attr_int(n, "interleaved", 0) != 0;
  int64_t half = rd.r / 2;
  /* cos and sin of batch b at s: [B|1, S, R/2] or [S, R/2] */
  int64_t cb = in[1]->shape.rank == 3 && in[1]->shape.dims[0] > 1 ? rd.s * half : 0;
  for (int64_t b = 0; b < rd.b; b++)
    for (int64_t h = 0; h < rd.h; h++)
      for (int64_t s = 0; s < rd.s; s++) {
        int64_t base = b * rd.h * rd.s * rd.d + h * rd.sh + s * rd.ss;
        const double *xr = x->data + base, *cr = in[1]->data + b * cb + s * half,
                     *sr = in[2]->data + b * cb + s * half;
        double *yr = out[0]->data + base;
        for (int64_t d = rd.r; d < rd.d; d++) yr[d] = xr[d];
        for (int64_t p = 0; p < half; p++) {
          int64_t i1 = inter ? 2 * p : p, i2 = inter ? 2 * p + 1 : p + half;
          yr[i1] = xr[i1] * cr[p] - xr[i2] * sr[p];
          yr[i2] = xr[i1] * sr[p] + xr[i2] * cr[p];
        }
      }
  return 0;
}

/* ---- gradient rules (ir.h, kl_grad_fn) -------------------------------- */
static kl_value *sum_axis(kl_grad_ctx *c, kl_value *x, int axis) {
  int64_t a = axis;
  return kl_gb_sum(c, x, &a, 1);
}

static kl_value *node_axis(kl_grad_ctx *c, const kl_node *n, const char *attr, int *axis) {
  if (kl_norm_axis(kl_attr_int(n, attr, -1), n->inputs[0]->shape.rank, axis, n, c->err)) {
    c->failed = true;
    return NULL;
  }
  return n->inputs[0];
}

/* dx = y (dy - sum(dy y)) */
int kl_grad_SOFTMAX(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  int axis;
  if (!node_axis(c, n, "axis", &axis)) return -1;
  kl_value *y = n->outputs[0];
  kl_value *s = sum_axis(c, kl_gb2(c, KL_OP_MUL, dy[0], y), axis);
  dx[0] = kl_gb2(c, KL_OP_MUL, y, kl_gb2(c, KL_OP_SUB, dy[0], s));
  return 0;
}

/* dx = dy - exp(y) sum(dy) */
int kl_grad_LOG_SOFTMAX(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  int axis;
  if (!node_axis(c, n, "axis", &axis)) return -1;
  kl_value *p = kl_gb1(c, KL_OP_EXP, n->outputs[0]);
  dx[0] = kl_gb2(c, KL_OP_SUB, dy[0], kl_gb2(c, KL_OP_MUL, p, sum_axis(c, dy[0], axis)));
  return 0;
}

/* With class indices: dlogits = (softmax(logits) - onehot(labels)) dL,
 * scaled by 1 / items for the mean; with probabilities t:
 * dlogits = (softmax sum(t) - t) dL and dt = -log_softmax dL. */
int kl_grad_CROSS_ENTROPY(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  int axis;
  reduction red;
  kl_value *x = node_axis(c, n, "axis", &axis), *l = n->inputs[1];
  if (!x) return -1;
  if (get_reduction(n, c->err, &red)) return -1;
  kl_attr ax = {.name = "axis", .kind = KL_ATTR_INT, .i = axis};
  kl_value *p = kl_gb_node(c, KL_OP_SOFTMAX, &x, 1, &ax, 1);
  int64_t items = kl_shape_numel(&x->shape) / (x->shape.dims[axis] ? x->shape.dims[axis] : 1);
  /* dL where each item's loss was: items x 1 at the class axis */
  kl_value *g = dy[0];
  if (red == RED_NONE) {
    kl_shape s = x->shape;
    s.dims[axis] = 1;
    g = kl_gb_reshape(c, g, &s);
  } else if (red == RED_MEAN) {
    g = kl_gb2(c, KL_OP_MUL, g, kl_gb_scalar(c, g->dtype, 1.0 / (double)(items ? items : 1)));
  }
  if (!kl_dtype_is_float(l->dtype)) {
    /* onehot: labels (class axis put back as 1) == 0..C-1 along the axis */
    kl_shape ls = x->shape, cs = {x->shape.rank, {0}};
    ls.dims[axis] = 1;
    for (int d = 0; d < cs.rank; d++) cs.dims[d] = d == axis ? x->shape.dims[axis] : 1;
    int64_t nc = x->shape.dims[axis];
    double *iota = malloc(sizeof(double) * (size_t)(nc ? nc : 1));
    if (!iota) abort();
    for (int64_t i = 0; i < nc; i++) iota[i] = (double)i;
    kl_attr k[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = iota, .n = (int)nc},
                    {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = l->dtype},
                    {.name = "shape", .kind = KL_ATTR_INTS, .ints = cs.dims, .n = cs.rank}};
    kl_value *classes = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, k, 3);
    free(iota);
    kl_value *hot = kl_gb_cast(c, kl_gb2(c, KL_OP_EQ, kl_gb_reshape(c, l, &ls), classes), x->dtype);
    dx[0] = kl_gb2(c, KL_OP_MUL, kl_gb2(c, KL_OP_SUB, p, hot), g);
    return 0;
  }
  kl_value *tsum = sum_axis(c, l, axis);
  dx[0] = kl_gb2(c, KL_OP_MUL, kl_gb2(c, KL_OP_SUB, kl_gb2(c, KL_OP_MUL, p, tsum), l), g);
  kl_value *lsm = kl_gb_node(c, KL_OP_LOG_SOFTMAX, &x, 1, &ax, 1);
  dx[1] = kl_gb1(c, KL_OP_NEG, kl_gb2(c, KL_OP_MUL, lsm, g));
  return 0;
}

/* The mean over the normalised axes [axis, rank), kept as 1s. */
static kl_value *row_mean(kl_grad_ctx *c, kl_value *v, int axis) {
  int64_t axes[KL_MAX_RANK];
  int na = 0;
  for (int d = axis; d < v->shape.rank; d++) axes[na++] = d;
  kl_attr a[2] = {{.name = "axes", .kind = KL_ATTR_INTS, .ints = axes, .n = na},
                  {.name = "keepdims", .kind = KL_ATTR_INT, .i = 1}};
  return kl_gb_node(c, KL_OP_REDUCE_MEAN, &v, 1, a, 2);
}

/* layer_norm (center) and rms_norm: with xhat = (x - mean) r, r =
 * 1 / sqrt(var + eps) (rms: xhat = x r, r from the mean square) and
 * g = dy scale: dx = r (g - mean(g) - xhat mean(g xhat)), without the
 * mean(g) term for rms; dscale = dy xhat, dbias = dy (the autodiff pass
 * sums them down to their broadcast shapes). */
static int grad_norm(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx,
                     bool center) {
  int axis;
  kl_value *x = node_axis(c, n, "axis", &axis);
  if (!x) return -1;
  double eps = kl_attr_float(n, "epsilon", 1e-5);
  kl_value *d = center ? kl_gb2(c, KL_OP_SUB, x, row_mean(c, x, axis)) : x;
  kl_value *var = row_mean(c, kl_gb2(c, KL_OP_MUL, d, d), axis);
  kl_value *r = kl_gb1(c, KL_OP_RSQRT, kl_gb2(c, KL_OP_ADD, var, kl_gb_scalar(c, x->dtype, eps)));
  kl_value *xhat = kl_gb2(c, KL_OP_MUL, d, r);
  kl_value *g = n->ninputs > 1 ? kl_gb2(c, KL_OP_MUL, dy[0], n->inputs[1]) : dy[0];
  kl_value *t = kl_gb2(c, KL_OP_SUB, g, kl_gb2(c, KL_OP_MUL, xhat, row_mean(c, kl_gb2(c, KL_OP_MUL, g, xhat), axis)));
  if (center) t = kl_gb2(c, KL_OP_SUB, t, row_mean(c, g, axis));
  dx[0] = kl_gb2(c, KL_OP_MUL, t, r);
  if (n->ninputs > 1) dx[1] = kl_gb2(c, KL_OP_MUL, dy[0], xhat);
  if (n->ninputs > 2) dx[2] = dy[0];
  return 0;
}

int kl_grad_LAYER_NORM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_norm(c, n, dy, dx, true);
}

int kl_grad_RMS_NORM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_norm(c, n, dy, dx, false);
}

/* A per-channel [C] value as [1, C, 1, ...] for x's rank, and a value of
 * x's shape summed to [C] (all axes but 1). */
static kl_value *per_channel(kl_grad_ctx *c, kl_value *v, int rank) {
  kl_shape s = {rank, {0}};
  for (int d = 0; d < rank; d++) s.dims[d] = d == 1 ? v->shape.dims[0] : 1;
  return kl_gb_reshape(c, v, &s);
}

static kl_value *channel_sum(kl_grad_ctx *c, kl_value *v) {
  if (!v) return NULL;
  int64_t axes[KL_MAX_RANK];
  int na = 0;
  for (int d = 0; d < v->shape.rank; d++)
    if (d != 1) axes[na++] = d;
  kl_shape s = {1, {v->shape.dims[1]}};
  return kl_gb_reshape(c, kl_gb_sum(c, v, axes, na), &s);
}

/* y = (x - mean) a + bias, a = scale r, r = 1 / sqrt(var + eps), per
 * channel; every input is differentiated, so batch statistics computed
 * from x (the ONNX front end's training mode) pass their share back
 * through the reductions that made them. */
int kl_grad_BATCH_NORM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0], *g = dy[0];
  int rank = x->shape.rank;
  double eps = kl_attr_float(n, "epsilon", 1e-5);
  kl_value *r = kl_gb1(c, KL_OP_RSQRT, kl_gb2(c, KL_OP_ADD, n->inputs[4], kl_gb_scalar(c, x->dtype, eps)));
  kl_value *a = kl_gb2(c, KL_OP_MUL, n->inputs[1], r);
  kl_value *centered = kl_gb2(c, KL_OP_SUB, x, per_channel(c, n->inputs[3], rank));
  kl_value *gsum = channel_sum(c, g), *gxsum = channel_sum(c, kl_gb2(c, KL_OP_MUL, g, centered));
  dx[0] = kl_gb2(c, KL_OP_MUL, g, per_channel(c, a, rank));
  dx[1] = kl_gb2(c, KL_OP_MUL, gxsum, r);
  dx[2] = gsum;
  dx[3] = kl_gb1(c, KL_OP_NEG, kl_gb2(c, KL_OP_MUL, gsum, a));
  /* d r / d var = -r^3 / 2 */
  kl_value *r3 = kl_gb2(c, KL_OP_MUL, r, kl_gb2(c, KL_OP_MUL, r, r));
  dx[4] = kl_gb2(c, KL_OP_MUL, kl_gb2(c, KL_OP_MUL, gxsum, n->inputs[1]),
                 kl_gb2(c, KL_OP_MUL, r3, kl_gb_scalar(c, x->dtype, -0.5)));
  return 0;
}

/* loss = -x[n, t, d] w[t], 0 where t is ignored.  With h the one-hot of t
 * over axis 1 (0 for ignored items) and G the adjoint of each item's loss
 * (dy, dy / sum of weights for the mean): dx = -h w G; dw = sum over items
 * of h G (-x - L), L the mean loss for "mean" (which divides by the
 * weights) and 0 otherwise. */
int kl_grad_NLL_LOSS(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0], *t = n->inputs[1];
  kl_value *w = n->ninputs > 2 ? n->inputs[2] : NULL;
  int red;
  if (pick(n, c->err, "reduction", "mean", reductions, &red)) {
    c->failed = true;
    return -1;
  }
  int rank = x->shape.rank;
  int64_t nc = x->shape.dims[1];
  kl_shape ts = x->shape, cs = {rank, {0}};
  ts.dims[1] = 1;
  for (int d = 0; d < rank; d++) cs.dims[d] = d == 1 ? nc : 1;
  double *iota = malloc(sizeof(double) * (size_t)(nc ? nc : 1));
  if (!iota) abort();
  for (int64_t i = 0; i < nc; i++) iota[i] = (double)i;
  kl_attr k[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = iota, .n = (int)nc},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = t->dtype},
                  {.name = "shape", .kind = KL_ATTR_INTS, .ints = cs.dims, .n = rank}};
  kl_value *classes = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, k, 3);
  free(iota);
  kl_value *tt = kl_gb_reshape(c, t, &ts);
  kl_value *hit = kl_gb2(c, KL_OP_EQ, tt, classes);
  if (kl_node_attr(n, "ignore_index")) {
    kl_value *ii = kl_gb_scalar(c, t->dtype, (double)kl_attr_int(n, "ignore_index", 0));
    hit = kl_gb2(c, KL_OP_LOGICAL_AND, hit, kl_gb2(c, KL_OP_NE, tt, ii));
  }
  kl_value *h = kl_gb_cast(c, hit, x->dtype);
  kl_value *wc = w ? per_channel(c, w, rank) : NULL;
  kl_value *G = red == 2 ? kl_gb_reshape(c, dy[0], &ts) : dy[0];
  if (red == 0) {
    kl_value *hw = wc ? kl_gb2(c, KL_OP_MUL, h, wc) : h;
    int64_t all[KL_MAX_RANK];
    for (int d = 0; d < rank; d++) all[d] = d;
    G = kl_gb2(c, KL_OP_DIV, G, kl_gb_sum(c, hw, all, rank));
  }
  kl_value *hg = kl_gb2(c, KL_OP_MUL, h, G);
  dx[0] = kl_gb1(c, KL_OP_NEG, wc ? kl_gb2(c, KL_OP_MUL, hg, wc) : hg);
  if (w) {
    kl_value *v = kl_gb1(c, KL_OP_NEG, x);
    if (red == 0) v = kl_gb2(c, KL_OP_SUB, v, n->outputs[0]);
    dx[2] = channel_sum(c, kl_gb2(c, KL_OP_MUL, hg, v));
  }
  return 0;
}

/* v [B,H,S,D] or [B,S,H*D] (x's layout) reduced to [B,S,R/2]: the two
 * entries of each rotated pair added, then the heads. */
static kl_value *pair_head_sum(kl_grad_ctx *c, kl_value *v, const rotary_dims *rd, bool inter) {
  kl_shape four = {4, {rd->b, rd->h, rd->s, rd->d}};
  int head_axis = 1;
  if (v && v->shape.rank == 3) four = (kl_shape){4, {rd->b, rd->s, rd->h, rd->d}}, head_axis = 2;
  v = kl_gb_reshape(c, v, &four);
  if (rd->r != rd->d) {
    int64_t st = 0, en = rd->r, ax = 3;
    kl_attr sl[3] = {{.name = "starts", .kind = KL_ATTR_INTS, .ints = &st, .n = 1},
                     {.name = "ends", .kind = KL_ATTR_INTS, .ints = &en, .n = 1},
                     {.name = "axes", .kind = KL_ATTR_INTS, .ints = &ax, .n = 1}};
    v = kl_gb_node(c, KL_OP_SLICE, &v, 1, sl, 3);
  }
  kl_shape five = four;
  five.rank = 5;
  five.dims[3] = inter ? rd->r / 2 : 2;
  five.dims[4] = inter ? 2 : rd->r / 2;
  int64_t axes[2] = {head_axis, inter ? 4 : 3};
  kl_shape out = {3, {rd->b, rd->s, rd->r / 2}};
  return kl_gb_reshape(c, kl_gb_sum(c, kl_gb_reshape(c, v, &five), axes, 2), &out);
}

/* Each pair turns by the angle whose cos and sin are given: dx turns dy
 * back (sin negated); with u = x turned by a right angle (cos 0, sin 1),
 * dcos and dsin are the pair sums of x dy and u dy, over the heads. */
int kl_grad_ROTARY(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0], *cs = n->inputs[1], *sn = n->inputs[2];
  rotary_dims rd;
  if (rotary_layout(n, c->err, &x->shape, &rd)) {
    c->failed = true;
    return -1;
  }
  bool inter = kl_attr_int(n, "interleaved", 0) != 0;
  kl_value *back[3] = {dy[0], cs, kl_gb1(c, KL_OP_NEG, sn)};
  dx[0] = kl_gb_node(c, KL_OP_ROTARY, back, 3, n->attrs, n->nattrs);
  kl_value *turn[3] = {x, kl_gb_expand(c, kl_gb_scalar(c, x->dtype, 0), &cs->shape),
                       kl_gb_expand(c, kl_gb_scalar(c, x->dtype, 1), &sn->shape)};
  kl_value *u = kl_gb_node(c, KL_OP_ROTARY, turn, 3, n->attrs, n->nattrs);
  dx[1] = pair_head_sum(c, kl_gb2(c, KL_OP_MUL, x, dy[0]), &rd, inter);
  dx[2] = pair_head_sum(c, kl_gb2(c, KL_OP_MUL, u, dy[0]), &rd, inter);
  return 0;
}
