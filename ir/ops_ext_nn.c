/* ops_ext_nn.c - shape inference and evaluation of the rows in
 * ops_ext_nn.def. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* ---- shared helpers -------------------------------------------------- */

static int need_float(const kl_node *n, kl_error *err, int k,
                      const char *what) {
  char b[300];
  if (kl_dtype_is_float(n->inputs[k]->dtype)) return 0;
  return KL_NODE_FAIL(n, err, "%s must be a float tensor, got %s", what,
                      kl_value_str(n->inputs[k], b, sizeof b));
}

/* An ints attribute of `len` entries, each in [lo, KL_MAX_NUMEL] (the cap
 * keeps index arithmetic far from overflow); all `dv` when absent. */
static int ints_attr(const kl_node *n, kl_error *err, const char *name,
                     int len, int64_t lo, int64_t dv, int64_t *out) {
  const int64_t *v;
  int got = kl_attr_ints(n, name, &v);
  if (got < 0) {
    for (int i = 0; i < len; i++) out[i] = dv;
    return 0;
  }
  if (got != len)
    return KL_NODE_FAIL(n, err, "%s must have %d entries, got %d", name, len,
                        got);
  for (int i = 0; i < len; i++) {
    if (v[i] < lo || v[i] > KL_MAX_NUMEL)
      return KL_NODE_FAIL(n, err, "%s[%d] = %lld is out of range [%lld, %lld]",
                          name, i, (long long)v[i], (long long)lo,
                          (long long)KL_MAX_NUMEL);
    out[i] = v[i];
  }
  return 0;
}

/* A floats attribute of exactly `len` entries into out; 0 when absent (out
 * untouched), 1 when read, -1 on a wrong length. */
static int floats_attr(const kl_node *n, kl_error *err, const char *name,
                       int len, double *out) {
  const kl_attr *a = kl_node_attr(n, name);
  if (!a) return 0;
  if (a->kind != KL_ATTR_FLOATS || a->n != len)
    return KL_NODE_FAIL(n, err, "%s must be %d floats, got %d", name, len,
                        a->n);
  memcpy(out, a->floats, sizeof(double) * (size_t)len);
  return 1;
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

/* ---- conv_transpose2d ------------------------------------------------ */

typedef struct {
  int64_t stride[2], pad[4], dil[2], opad[2], k[2], out[2], groups;
} tconv;

static int tconv_setup(const kl_node *n, kl_error *err, tconv *t) {
  const kl_value *x = n->inputs[0], *w = n->inputs[1];
  const kl_value *b = n->ninputs > 2 ? n->inputs[2] : NULL;
  char sx[300], sw[300];
  if (ints_attr(n, err, "strides", 2, 1, 1, t->stride) ||
      ints_attr(n, err, "pads", 4, -KL_MAX_NUMEL, 0, t->pad) ||
      ints_attr(n, err, "dilations", 2, 1, 1, t->dil) ||
      ints_attr(n, err, "output_padding", 2, 0, 0, t->opad))
    return -1;
  t->groups = kl_attr_int(n, "groups", 1);
  int64_t c = x->shape.dims[1];
  if (t->groups < 1 || t->groups > KL_MAX_NUMEL)
    return KL_NODE_FAIL(n, err, "groups must be >= 1, got %lld",
                        (long long)t->groups);
  if (w->shape.dims[0] != c || c % t->groups != 0)
    return KL_NODE_FAIL(n, err, "w %s must be [C, M/groups, kH, kW] with C = "
                        "%lld input channels divisible by groups %lld (x %s)",
                        kl_value_str(w, sw, sizeof sw), (long long)c,
                        (long long)t->groups, kl_value_str(x, sx, sizeof sx));
  int64_t m = w->shape.dims[1] * t->groups;
  if (b && (b->shape.rank != 1 || b->shape.dims[0] != m))
    return KL_NODE_FAIL(n, err, "bias must have shape [%lld], got %s",
                        (long long)m, kl_value_str(b, sx, sizeof sx));
  for (int a = 0; a < 2; a++) {
    t->k[a] = w->shape.dims[2 + a];
    int64_t in = x->shape.dims[2 + a];
    if (t->k[a] < 1 || in < 1)
      return KL_NODE_FAIL(n, err, "spatial dims of x %s and w %s must be >= 1",
                          kl_value_str(x, sx, sizeof sx),
                          kl_value_str(w, sw, sizeof sw));
    /* Each product stays below 2^62; their sum is checked in double
     * before it is formed in int64. */
    double len = (double)t->stride[a] * (double)(in - 1) + (double)t->opad[a] +
                 (double)t->dil[a] * (double)(t->k[a] - 1) + 1 -
                 (double)t->pad[a] - (double)t->pad[2 + a];
    if (len > (double)KL_MAX_NUMEL)
      return KL_NODE_FAIL(n, err, "output dim %d (%.0f) is too large", a, len);
    t->out[a] = (int64_t)len;
    if (t->out[a] < 1)
      return KL_NODE_FAIL(n, err, "pads [%lld, %lld, %lld, %lld] crop the "
                          "whole output of x %s, w %s",
                          (long long)t->pad[0], (long long)t->pad[1],
                          (long long)t->pad[2], (long long)t->pad[3],
                          kl_value_str(x, sx, sizeof sx),
                          kl_value_str(w, sw, sizeof sw));
  }
  return 0;
}

int kl_infer_CONV_TRANSPOSE2D(kl_node *n, kl_error *err) {
  char a[300], b[300];
  for (int i = 0; i < n->ninputs; i++) {
    if (need_float(n, err, i, i == 0 ? "x" : i == 1 ? "w" : "b")) return -1;
    if (n->inputs[i]->dtype != n->inputs[0]->dtype)
      return KL_NODE_FAIL(n, err, "operands must share a dtype: %s and %s",
                          kl_value_str(n->inputs[0], a, sizeof a),
                          kl_value_str(n->inputs[i], b, sizeof b));
  }
  if (n->inputs[0]->shape.rank != 4 || n->inputs[1]->shape.rank != 4)
    return KL_NODE_FAIL(n, err, "x and w must have rank 4, got %s and %s",
                        kl_value_str(n->inputs[0], a, sizeof a),
                        kl_value_str(n->inputs[1], b, sizeof b));
  tconv t;
  if (tconv_setup(n, err, &t)) return -1;
  kl_shape out = {4, {n->inputs[0]->shape.dims[0],
                      n->inputs[1]->shape.dims[1] * t.groups, t.out[0],
                      t.out[1]}};
  return kl_set_checked_output(n, err, 0, n->inputs[0]->dtype, &out);
}

/* Scatter form: each input pixel adds its kernel-weighted copy to the
 * output window it reaches. */
int kl_eval_CONV_TRANSPOSE2D(const kl_node *n, kl_tensor **in, kl_tensor **out,
                             kl_error *err) {
  tconv t;
  if (tconv_setup(n, err, &t)) return -1;
  const int64_t *xd = in[0]->shape.dims;
  int64_t nb = xd[0], c = xd[1], h = xd[2], wi = xd[3];
  int64_t mpg = in[1]->shape.dims[1], m = mpg * t.groups, cpg = c / t.groups;
  int64_t oh = t.out[0], ow = t.out[1], plane = oh * ow;
  const double *x = in[0]->data, *w = in[1]->data;
  double *o = out[0]->data;
  if (n->ninputs > 2)
    for (int64_t b = 0; b < nb; b++)
      for (int64_t oc = 0; oc < m; oc++)
        for (int64_t i = 0; i < plane; i++)
          o[(b * m + oc) * plane + i] = in[2]->data[oc];
  for (int64_t b = 0; b < nb; b++)
    for (int64_t ic = 0; ic < c; ic++) {
      int64_t g = ic / cpg;
      for (int64_t iy = 0; iy < h; iy++)
        for (int64_t ix = 0; ix < wi; ix++) {
          double v = x[((b * c + ic) * h + iy) * wi + ix];
          for (int64_t j = 0; j < mpg; j++) {
            double *op = o + (b * m + g * mpg + j) * plane;
            const double *wp = w + (ic * mpg + j) * t.k[0] * t.k[1];
            for (int64_t ky = 0; ky < t.k[0]; ky++) {
              int64_t oy = iy * t.stride[0] - t.pad[0] + ky * t.dil[0];
              if (oy < 0 || oy >= oh) continue;
              for (int64_t kx = 0; kx < t.k[1]; kx++) {
                int64_t ox = ix * t.stride[1] - t.pad[1] + kx * t.dil[1];
                if (ox < 0 || ox >= ow) continue;
                op[oy * ow + ox] += v * wp[ky * t.k[1] + kx];
              }
            }
          }
        }
    }
  return 0;
}

/* ---- resize ---------------------------------------------------------- */

enum { R_NEAREST, R_LINEAR, R_CUBIC };
static const char *const resize_modes[] = {"nearest", "linear", "cubic", NULL};
enum {
  C_HALF_PIXEL, C_HALF_PIXEL_SYM, C_PYTORCH_HALF_PIXEL, C_ALIGN_CORNERS,
  C_ASYMMETRIC, C_TF_HALF_PIXEL_NN, C_TF_CROP_AND_RESIZE
};
static const char *const coord_modes[] = {
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
    "align_corners", "asymmetric", "tf_half_pixel_for_nn",
    "tf_crop_and_resize", NULL};
enum { N_ROUND_FLOOR, N_ROUND_CEIL, N_FLOOR, N_CEIL };
static const char *const nearest_modes[] = {
    "round_prefer_floor", "round_prefer_ceil", "floor", "ceil", NULL};

typedef struct {
  int mode, coord, nearest;
  double a, extrapolation;
  bool exclude_outside;
  int64_t sizes[KL_MAX_RANK];
  double scales[KL_MAX_RANK], roi[2 * KL_MAX_RANK];
} resize_cfg;

static int resize_setup(const kl_node *n, kl_error *err, resize_cfg *r) {
  const kl_value *x = n->inputs[0];
  int rank = x->shape.rank;
  char sx[300];
  if (pick(n, err, "mode", "nearest", resize_modes, &r->mode) ||
      pick(n, err, "coordinate_transformation_mode", "half_pixel",
           coord_modes, &r->coord) ||
      pick(n, err, "nearest_mode", "round_prefer_floor", nearest_modes,
           &r->nearest) ||
      kl_attr_flag(n, err, "exclude_outside", 0, &r->exclude_outside))
    return -1;
  r->a = kl_attr_float(n, "cubic_coeff_a", -0.75);
  r->extrapolation = kl_attr_float(n, "extrapolation_value", 0.0);
  const int64_t *sizes;
  if (kl_attr_ints(n, "sizes", &sizes) != rank)
    return KL_NODE_FAIL(n, err, "sizes must have one entry per axis of x %s",
                        kl_value_str(x, sx, sizeof sx));
  for (int d = 0; d < rank; d++) {
    if (sizes[d] < 1 || sizes[d] > KL_MAX_NUMEL || x->shape.dims[d] < 1)
      return KL_NODE_FAIL(n, err, "sizes[%d] = %lld and the dims of x %s must "
                          "be >= 1", d, (long long)sizes[d],
                          kl_value_str(x, sx, sizeof sx));
    r->sizes[d] = sizes[d];
    r->scales[d] = (double)sizes[d] / (double)x->shape.dims[d];
    r->roi[d] = 0.0;
    r->roi[rank + d] = 1.0;
  }
  if (floats_attr(n, err, "scales", rank, r->scales) < 0 ||
      floats_attr(n, err, "roi", 2 * rank, r->roi) < 0)
    return -1;
  for (int d = 0; d < rank; d++)
    if (!(r->scales[d] > 0) || !isfinite(r->scales[d]))
      return KL_NODE_FAIL(n, err, "scales[%d] = %g must be positive", d,
                          r->scales[d]);
  return 0;
}

int kl_infer_RESIZE(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char sx[300];
  if (x->dtype == KL_BOOL)
    return KL_NODE_FAIL(n, err, "does not accept bool, got %s",
                        kl_value_str(x, sx, sizeof sx));
  resize_cfg r;
  if (resize_setup(n, err, &r)) return -1;
  kl_shape out = {x->shape.rank, {0}};
  memcpy(out.dims, r.sizes, sizeof(int64_t) * (size_t)out.rank);
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

/* Up to four taps (input index, weight) for one output index on one axis;
 * ntap 0 means "outside the crop: use the extrapolation value". */
typedef struct {
  int64_t idx[4];
  double w[4];
  int ntap;
} taps;

/* The input coordinate of output index o on an axis (ONNX's formulas,
 * with the fractional output width scale * in); *outside for
 * tf_crop_and_resize points beyond the input. */
static double source_coord(const resize_cfg *r, int d, int rank, int64_t o,
                           int64_t in, bool *outside) {
  double s = r->scales[d], width = s * (double)in, x = (double)o;
  *outside = false;
  switch (r->coord) {
  case C_HALF_PIXEL: return (x + 0.5) / s - 0.5;
  case C_HALF_PIXEL_SYM: {
    double adj = (double)r->sizes[d] / width, center = (double)in / 2;
    return center * (1 - adj) + (x + 0.5) / s - 0.5;
  }
  case C_PYTORCH_HALF_PIXEL: return width == 1 ? -0.5 : (x + 0.5) / s - 0.5;
  case C_ALIGN_CORNERS:
    return width == 1 ? 0.0 : x * (double)(in - 1) / (width - 1);
  case C_ASYMMETRIC: return x / s;
  case C_TF_HALF_PIXEL_NN: return (x + 0.5) / s;
  default: {
    double r0 = r->roi[d], r1 = r->roi[rank + d], v;
    if (width == 1) v = (r1 - r0) * (double)(in - 1) / 2;
    else v = x * (r1 - r0) * (double)(in - 1) / (width - 1);
    v += r0 * (double)(in - 1);
    *outside = v < 0 || v > (double)(in - 1);
    return v;
  }
  }
}

static void cubic_coeffs(double t, double a, double *c) {
  double u = 1 - t;
  c[0] = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a;
  c[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
  c[2] = ((a + 2) * u - (a + 3)) * u * u + 1;
  c[3] = ((a * (u + 1) - 5 * a) * (u + 1) + 8 * a) * (u + 1) - 4 * a;
}

/* As the ONNX reference: the left neighbour `base` and ratio t in (0, 1]
 * (an integral coordinate is the right end of the interval to its left);
 * taps beyond the edges are clamped, or dropped with exclude_outside. */
static void make_taps(const resize_cfg *r, int d, int rank, int64_t o,
                      int64_t in, taps *tp) {
  bool outside;
  double x = source_coord(r, d, rank, o, in, &outside);
  tp->ntap = 0;
  if (outside) return;
  /* Odd scales or roi can send x anywhere (or to NaN); far outside, every
   * tap reads an edge anyway, and int64 conversion stays defined. */
  if (!(x > -1e9)) x = -1e9;
  if (!(x < 1e9)) x = 1e9;
  double fl = floor(x), t = x - fl;
  int64_t base = (int64_t)fl;
  if (t == 0) {
    base--;
    t = 1;
  }
  int64_t first;
  double c[4];
  if (r->mode == R_NEAREST) {
    bool right = true;
    if (t < 1) {
      switch (r->nearest) {
      case N_ROUND_FLOOR: right = t > 0.5; break;
      case N_ROUND_CEIL: right = t >= 0.5; break;
      case N_FLOOR: right = false; break;
      default: right = true; break;
      }
    }
    first = base + (right ? 1 : 0);
    tp->ntap = 1;
    c[0] = 1;
  } else if (r->mode == R_LINEAR) {
    first = base;
    tp->ntap = 2;
    c[0] = 1 - t;
    c[1] = t;
  } else {
    first = base - 1;
    tp->ntap = 4;
    cubic_coeffs(t, r->a, c);
  }
  double sum = 0;
  for (int k = 0; k < tp->ntap; k++) {
    int64_t i = first + k;
    if (r->exclude_outside && (i < 0 || i >= in)) c[k] = 0;
    sum += c[k];
    tp->idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
    tp->w[k] = c[k];
  }
  if (r->exclude_outside && sum != 0)
    for (int k = 0; k < tp->ntap; k++) tp->w[k] /= sum;
}

int kl_resize_tap_at(const kl_node *n, int d, int64_t o, kl_resize_taps *out) {
  resize_cfg r;
  const kl_value *x = n->inputs[0];
  if (n->op != KL_OP_RESIZE || d < 0 || d >= x->shape.rank || resize_setup(n, NULL, &r)) return -1;
  taps tp;
  make_taps(&r, d, x->shape.rank, o, x->shape.dims[d], &tp);
  memcpy(out->idx, tp.idx, sizeof tp.idx);
  memcpy(out->w, tp.w, sizeof tp.w);
  out->ntap = tp.ntap;
  return 0;
}

int kl_eval_RESIZE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  resize_cfg r;
  if (resize_setup(n, err, &r)) return -1;
  const kl_tensor *x = in[0];
  kl_tensor *y = out[0];
  int rank = x->shape.rank;
  if (y->numel == 0) return 0;
  /* Per axis, the taps of each output index. */
  taps *tab[KL_MAX_RANK];
  int64_t total = 0;
  for (int d = 0; d < rank; d++) total += r.sizes[d];
  taps *all = malloc(sizeof *all * (size_t)(total > 0 ? total : 1));
  if (!all) return KL_NODE_FAIL(n, err, "out of memory");
  for (int d = 0, at = 0; d < rank; at += (int)r.sizes[d], d++) {
    tab[d] = all + at;
    for (int64_t o = 0; o < r.sizes[d]; o++)
      make_taps(&r, d, rank, o, x->shape.dims[d], &tab[d][o]);
  }
  int64_t xs[KL_MAX_RANK], idx[KL_MAX_RANK] = {0}, i = 0;
  kl_shape_strides(&x->shape, xs);
  do {
    const taps *t[KL_MAX_RANK];
    bool extrapolate = false;
    for (int d = 0; d < rank; d++) {
      t[d] = &tab[d][idx[d]];
      extrapolate |= t[d]->ntap == 0;
    }
    double acc = 0;
    if (extrapolate) {
      acc = r.extrapolation;
    } else {
      /* Sum over every combination of one tap per axis. */
      int k[KL_MAX_RANK] = {0};
      for (;;) {
        double w = 1;
        int64_t off = 0;
        for (int d = 0; d < rank; d++) {
          w *= t[d]->w[k[d]];
          off += t[d]->idx[k[d]] * xs[d];
        }
        if (w != 0) acc += w * x->data[off];
        int d = rank - 1;
        while (d >= 0 && ++k[d] == t[d]->ntap) k[d--] = 0;
        if (d < 0) break;
      }
    }
    y->data[i++] = acc;
  } while (kl_index_next(&y->shape, idx));
  free(all);
  return 0;
}

/* ---- nll_loss -------------------------------------------------------- */

static const char *const reductions[] = {"mean", "sum", "none", NULL};
enum { RED_MEAN, RED_SUM, RED_NONE };

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
