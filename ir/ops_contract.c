/* ops_contract.c - shape inference and reference evaluation of the
 * contraction rows (matmul, gemm, conv2d, conv_transpose2d, deform_conv2d),
 * the 2-D pools, col2im and dft (ONNX DFT; STFT and the rest of the signal
 * ops are converters over it in frontend/onnx_ops_nn.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* ---- shared helpers -------------------------------------------------- */

/* Contractions and pools work on operands that share one dtype: float, or
 * for matmul also integer (ONNX MatMul takes int32/int64). */
static int check_operands(kl_node *n, kl_error *err, bool allow_int) {
  char a[300], b[300];
  for (int i = 0; i < n->ninputs; i++) {
    const kl_value *v = n->inputs[i];
    if (!v) continue;
    if (allow_int && kl_dtype_is_int(v->dtype)) {
      if (v->dtype != n->inputs[0]->dtype)
        return KL_NODE_FAIL(n, err, "operands must share a dtype: %s and %s",
                            kl_value_str(n->inputs[0], a, sizeof a),
                            kl_value_str(v, b, sizeof b));
      continue;
    }
    if (!kl_dtype_is_float(v->dtype))
      return KL_NODE_FAIL(n, err, allow_int ? "operand %d must be a float or integer tensor, got %s"
                                    : "operand %d must be a float tensor, got %s",
                          i, kl_value_str(v, a, sizeof a));
    if (v->dtype != n->inputs[0]->dtype)
      return KL_NODE_FAIL(n, err, "operands must share a dtype: %s and %s",
                          kl_value_str(n->inputs[0], a, sizeof a),
                          kl_value_str(v, b, sizeof b));
  }
  return 0;
}

static int check_rank(kl_node *n, kl_error *err, int i, int rank,
                      const char *what) {
  char a[300];
  if (n->inputs[i]->shape.rank != rank)
    return KL_NODE_FAIL(n, err, "%s must have rank %d, got %s", what, rank,
                        kl_value_str(n->inputs[i], a, sizeof a));
  return 0;
}

/* Sum over p < k of a[p*sa] * b[p*sb]; strides make transposes free. */
static double dot(const double *a, int64_t sa, const double *b, int64_t sb,
                  int64_t k) {
  double acc = 0.0;
  for (int64_t p = 0; p < k; p++) acc += a[p * sa] * b[p * sb];
  return acc;
}

static int need_float(const kl_node *n, kl_error *err, int k,
                      const char *what) {
  char b[300];
  if (kl_dtype_is_float(n->inputs[k]->dtype)) return 0;
  return KL_NODE_FAIL(n, err, "%s must be a float tensor, got %s", what,
                      kl_value_str(n->inputs[k], b, sizeof b));
}

/* ---- matmul ---------------------------------------------------------- */

/* Operands split into batch dims and matrix dims after NumPy's 1-D
 * promotion: a 1-D a is a [1, K] row, a 1-D b is a [K, 1] column. */
typedef struct {
  kl_shape abatch, bbatch, obatch;
  int64_t m, k, kb, ncols;
  bool a_vec, b_vec;
} mm_dims;

static void mm_split(const kl_shape *a, const kl_shape *b, mm_dims *d) {
  memset(d, 0, sizeof *d);
  d->a_vec = a->rank == 1;
  d->b_vec = b->rank == 1;
  d->k = a->dims[a->rank - 1];
  d->m = d->a_vec ? 1 : a->dims[a->rank - 2];
  d->kb = d->b_vec ? b->dims[0] : b->dims[b->rank - 2];
  d->ncols = d->b_vec ? 1 : b->dims[b->rank - 1];
  d->abatch.rank = d->a_vec ? 0 : a->rank - 2;
  d->bbatch.rank = d->b_vec ? 0 : b->rank - 2;
  memcpy(d->abatch.dims, a->dims, sizeof(int64_t) * (size_t)d->abatch.rank);
  memcpy(d->bbatch.dims, b->dims, sizeof(int64_t) * (size_t)d->bbatch.rank);
}

int kl_infer_MATMUL(kl_node *n, kl_error *err) {
  const kl_value *a = n->inputs[0], *b = n->inputs[1];
  char sa[300], sb[300];
  if (check_operands(n, err, true)) return -1;
  if (a->shape.rank < 1 || b->shape.rank < 1)
    return KL_NODE_FAIL(n, err, "operands must have rank >= 1: %s @ %s",
                        kl_value_str(a, sa, sizeof sa),
                        kl_value_str(b, sb, sizeof sb));
  mm_dims d;
  mm_split(&a->shape, &b->shape, &d);
  if (d.k != d.kb)
    return KL_NODE_FAIL(n, err, "inner dimensions differ: %s @ %s",
                        kl_value_str(a, sa, sizeof sa),
                        kl_value_str(b, sb, sizeof sb));
  kl_error scratch;
  if (kl_broadcast_shapes(&d.abatch, &d.bbatch, &d.obatch, &scratch,
                          n->loc))
    return KL_NODE_FAIL(n, err, "batch dimensions do not broadcast: %s @ %s",
                        kl_value_str(a, sa, sizeof sa),
                        kl_value_str(b, sb, sizeof sb));
  kl_shape out = d.obatch;
  if (!d.a_vec) out.dims[out.rank++] = d.m;
  if (!d.b_vec) out.dims[out.rank++] = d.ncols;
  return kl_set_checked_output(n, err, 0, a->dtype, &out);
}

int kl_eval_MATMUL(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  if (out[0]->numel == 0) return 0;
  mm_dims d;
  mm_split(&in[0]->shape, &in[1]->shape, &d);
  if (kl_broadcast_shapes(&d.abatch, &d.bbatch, &d.obatch, err, n->loc))
    return -1;
  int64_t idx[KL_MAX_RANK] = {0};
  double *o = out[0]->data;
  do {
    const double *pa = in[0]->data +
        kl_broadcast_index(&d.abatch, &d.obatch, idx) * d.m * d.k;
    const double *pb = in[1]->data +
        kl_broadcast_index(&d.bbatch, &d.obatch, idx) * d.k * d.ncols;
    for (int64_t i = 0; i < d.m; i++)
      for (int64_t j = 0; j < d.ncols; j++)
        *o++ = dot(pa + i * d.k, 1, pb + j, d.ncols, d.k);
  } while (kl_index_next(&d.obatch, idx));
  return 0;
}

/* ---- gemm ------------------------------------------------------------ */

/* M, K, N of op(A) @ op(B), and whether A and B are transposed. */
typedef struct {
  int64_t m, k, kb, ncols;
  bool ta, tb;
} gemm_dims;

static int gemm_split(const kl_node *n, kl_error *err, const kl_shape *a,
                      const kl_shape *b, gemm_dims *d) {
  if (kl_attr_flag(n, err, "trans_a", 0, &d->ta) ||
      kl_attr_flag(n, err, "trans_b", 0, &d->tb))
    return -1;
  d->m = a->dims[d->ta ? 1 : 0];
  d->k = a->dims[d->ta ? 0 : 1];
  d->kb = b->dims[d->tb ? 1 : 0];
  d->ncols = b->dims[d->tb ? 0 : 1];
  return 0;
}

int kl_infer_GEMM(kl_node *n, kl_error *err) {
  const kl_value *a = n->inputs[0], *b = n->inputs[1];
  const kl_value *c = n->ninputs > 2 ? n->inputs[2] : NULL;
  char sa[300], sb[300];
  if (check_operands(n, err, false) || check_rank(n, err, 0, 2, "a") ||
      check_rank(n, err, 1, 2, "b"))
    return -1;
  gemm_dims d;
  if (gemm_split(n, err, &a->shape, &b->shape, &d)) return -1;
  if (d.k != d.kb)
    return KL_NODE_FAIL(n, err, "inner dimensions differ: op(%s) @ op(%s) "
                        "with trans_a=%d trans_b=%d",
                        kl_value_str(a, sa, sizeof sa),
                        kl_value_str(b, sb, sizeof sb), d.ta, d.tb);
  kl_shape out = {2, {d.m, d.ncols}};
  if (c) {
    /* c broadcasts to [M, N], never the other way round. */
    kl_shape bc;
    kl_error scratch;
    if (kl_broadcast_shapes(&c->shape, &out, &bc, &scratch, n->loc) ||
        !kl_shape_equal(&bc, &out))
      return KL_NODE_FAIL(n, err, "c %s does not broadcast to [%lld, %lld]",
                          kl_value_str(c, sa, sizeof sa), (long long)d.m,
                          (long long)d.ncols);
  }
  return kl_set_checked_output(n, err, 0, a->dtype, &out);
}

int kl_eval_GEMM(const kl_node *n, kl_tensor **in, kl_tensor **out,
                 kl_error *err) {
  gemm_dims d;
  if (gemm_split(n, err, &in[0]->shape, &in[1]->shape, &d)) return -1;
  double alpha = kl_attr_float(n, "alpha", 1.0);
  double beta = kl_attr_float(n, "beta", 1.0);
  const kl_tensor *c = n->ninputs > 2 ? in[2] : NULL;
  /* Element (i, p) of op(A) is at i*ars + p*acs; likewise for B. */
  int64_t ars = d.ta ? 1 : d.k, acs = d.ta ? d.m : 1;
  int64_t brs = d.tb ? 1 : d.ncols, bcs = d.tb ? d.k : 1;
  int64_t idx[2];
  for (idx[0] = 0; idx[0] < d.m; idx[0]++)
    for (idx[1] = 0; idx[1] < d.ncols; idx[1]++) {
      double v = alpha * dot(in[0]->data + idx[0] * ars, acs,
                             in[1]->data + idx[1] * bcs, brs, d.k);
      if (c)
        v += beta * c->data[kl_broadcast_index(&c->shape, &out[0]->shape,
                                               idx)];
      out[0]->data[idx[0] * d.ncols + idx[1]] = v;
    }
  return 0;
}

/* ---- sliding windows (conv2d and pools) ------------------------------ */

/* Geometry of a 2-D window over NCHW; pad is [top, left, bottom, right]. */
typedef struct {
  int64_t k[2], stride[2], dil[2], pad[4], out[2];
} window;

/* Reads an ints attribute of `len` entries, each in [lo, KL_MAX_NUMEL]
 * (the cap keeps window arithmetic far from overflow); `dflt` when absent,
 * required when dflt is NULL. */
static int ints_attr(const kl_node *n, kl_error *err, const char *name,
                     int len, int64_t lo, const int64_t *dflt, int64_t *out) {
  const int64_t *v;
  int got = kl_attr_ints(n, name, &v);
  if (got < 0) {
    if (!dflt) return KL_NODE_FAIL(n, err, "%s is required", name);
    memcpy(out, dflt, sizeof(int64_t) * (size_t)len);
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

/* Output length along one axis, or -1 when the numbers overflow.  In ceil
 * mode a last window that starts in the right padding is dropped (ONNX). */
static int64_t window_len(int64_t in, int64_t p0, int64_t p1, int64_t k,
                          int64_t s, int64_t d, bool ceil_mode) {
  int64_t span, ext = d * (k - 1) + 1;
  if (__builtin_add_overflow(in, p0 + p1, &span)) return -1;
  if (span < ext) return 0;
  int64_t len = (span - ext) / s + 1;
  if (ceil_mode && (span - ext) % s != 0) len++;
  if (ceil_mode && in + p0 >= 1 && len - 1 > (in + p0 - 1) / s) len--;
  return len;
}

/* Fills w from the strides/pads/dilations attributes (w->k and the
 * default strides already set) and the spatial dims of x. */
static int window_setup(const kl_node *n, kl_error *err, const kl_value *x,
                        bool has_dil, bool ceil_mode, window *w) {
  static const int64_t zeros[4] = {0, 0, 0, 0}, ones[2] = {1, 1};
  int64_t dstride[2] = {w->stride[0], w->stride[1]};
  if (ints_attr(n, err, "strides", 2, 1, dstride, w->stride) ||
      ints_attr(n, err, "pads", 4, 0, zeros, w->pad))
    return -1;
  if (has_dil) {
    if (ints_attr(n, err, "dilations", 2, 1, ones, w->dil)) return -1;
  } else {
    w->dil[0] = w->dil[1] = 1;
  }
  for (int a = 0; a < 2; a++) {
    int64_t len = window_len(x->shape.dims[2 + a], w->pad[a], w->pad[2 + a],
                             w->k[a], w->stride[a], w->dil[a], ceil_mode);
    if (len < 1) {
      char s[300];
      return KL_NODE_FAIL(n, err, "window %lldx%lld (dilations %lldx%lld, "
                          "pads [%lld, %lld, %lld, %lld]) does not fit input "
                          "%s", (long long)w->k[0], (long long)w->k[1],
                          (long long)w->dil[0], (long long)w->dil[1],
                          (long long)w->pad[0], (long long)w->pad[1],
                          (long long)w->pad[2], (long long)w->pad[3],
                          kl_value_str(x, s, sizeof s));
    }
    w->out[a] = len;
  }
  return 0;
}

/* ---- conv2d ---------------------------------------------------------- */

static int conv_setup(const kl_node *n, kl_error *err, window *w,
                      int64_t *groups) {
  const kl_value *x = n->inputs[0], *wt = n->inputs[1];
  const kl_value *b = n->ninputs > 2 ? n->inputs[2] : NULL;
  char sx[300], sw[300];
  int64_t c = x->shape.dims[1], m = wt->shape.dims[0];
  *groups = kl_attr_int(n, "groups", 1);
  if (*groups < 1)
    return KL_NODE_FAIL(n, err, "groups must be >= 1, got %lld",
                        (long long)*groups);
  if (c % *groups != 0 || c / *groups != wt->shape.dims[1])
    return KL_NODE_FAIL(n, err, "input channels %lld != weight channels "
                        "%lld * groups %lld: x %s, w %s", (long long)c,
                        (long long)wt->shape.dims[1], (long long)*groups,
                        kl_value_str(x, sx, sizeof sx),
                        kl_value_str(wt, sw, sizeof sw));
  if (m % *groups != 0)
    return KL_NODE_FAIL(n, err, "output channels %lld of w %s are not a "
                        "multiple of groups %lld", (long long)m,
                        kl_value_str(wt, sw, sizeof sw), (long long)*groups);
  if (b && (b->shape.rank != 1 || b->shape.dims[0] != m))
    return KL_NODE_FAIL(n, err, "bias must have shape [%lld], got %s",
                        (long long)m, kl_value_str(b, sx, sizeof sx));
  for (int a = 0; a < 2; a++) {
    w->k[a] = wt->shape.dims[2 + a];
    if (w->k[a] < 1 || w->k[a] > KL_MAX_NUMEL)
      return KL_NODE_FAIL(n, err, "kernel dims of w %s must be >= 1",
                          kl_value_str(wt, sw, sizeof sw));
    w->stride[a] = 1;
  }
  return window_setup(n, err, x, true, false, w);
}

int kl_infer_CONV2D(kl_node *n, kl_error *err) {
  if (check_operands(n, err, false) || check_rank(n, err, 0, 4, "x") ||
      check_rank(n, err, 1, 4, "w"))
    return -1;
  window w;
  int64_t groups;
  if (conv_setup(n, err, &w, &groups)) return -1;
  const kl_shape *x = &n->inputs[0]->shape;
  kl_shape out = {4, {x->dims[0], n->inputs[1]->shape.dims[0], w.out[0],
                      w.out[1]}};
  return kl_set_checked_output(n, err, 0, n->inputs[0]->dtype, &out);
}

int kl_eval_CONV2D(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  window w;
  int64_t groups;
  if (conv_setup(n, err, &w, &groups)) return -1;
  const int64_t *xd = in[0]->shape.dims, *wd = in[1]->shape.dims;
  int64_t nb = xd[0], c = xd[1], h = xd[2], wi = xd[3], m = wd[0];
  int64_t cpg = c / groups, mpg = m / groups;
  const double *x = in[0]->data, *wt = in[1]->data;
  const double *bias = n->ninputs > 2 ? in[2]->data : NULL;
  double *o = out[0]->data;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t oc = 0; oc < m; oc++) {
      int64_t c0 = oc / mpg * cpg; /* first input channel of the group */
      for (int64_t oy = 0; oy < w.out[0]; oy++)
        for (int64_t ox = 0; ox < w.out[1]; ox++) {
          double acc = bias ? bias[oc] : 0.0;
          for (int64_t ic = 0; ic < cpg; ic++)
            for (int64_t ky = 0; ky < w.k[0]; ky++) {
              int64_t iy = oy * w.stride[0] - w.pad[0] + ky * w.dil[0];
              if (iy < 0 || iy >= h) continue;
              for (int64_t kx = 0; kx < w.k[1]; kx++) {
                int64_t ix = ox * w.stride[1] - w.pad[1] + kx * w.dil[1];
                if (ix < 0 || ix >= wi) continue;
                acc += x[((b * c + c0 + ic) * h + iy) * wi + ix] *
                       wt[((oc * cpg + ic) * w.k[0] + ky) * w.k[1] + kx];
              }
            }
          *o++ = acc;
        }
    }
  return 0;
}

/* ---- conv2d_weight_grad ---------------------------------------------- */

/* The window of conv2d_weight_grad: kernel from its attribute, out from
 * dy's spatial dims (the output the gradient came from). */
static int wgrad_setup(kl_node *n, kl_error *err, window *w, int64_t *groups) {
  static const int64_t zeros[4] = {0, 0, 0, 0}, ones[2] = {1, 1};
  const kl_value *x = n->inputs[0], *dy = n->inputs[1];
  char sx[300], sd[300];
  if (ints_attr(n, err, "kernel", 2, 1, NULL, w->k) ||
      ints_attr(n, err, "strides", 2, 1, ones, w->stride) ||
      ints_attr(n, err, "pads", 4, 0, zeros, w->pad) ||
      ints_attr(n, err, "dilations", 2, 1, ones, w->dil))
    return -1;
  *groups = kl_attr_int(n, "groups", 1);
  int64_t c = x->shape.dims[1], m = dy->shape.dims[1];
  if (*groups < 1 || *groups > KL_MAX_NUMEL)
    return KL_NODE_FAIL(n, err, "groups must be >= 1, got %lld", (long long)*groups);
  if (x->shape.dims[0] != dy->shape.dims[0] || c % *groups || m % *groups)
    return KL_NODE_FAIL(n, err, "x %s and dy %s must share the batch, with channels "
                        "divisible by groups %lld", kl_value_str(x, sx, sizeof sx),
                        kl_value_str(dy, sd, sizeof sd), (long long)*groups);
  w->out[0] = dy->shape.dims[2], w->out[1] = dy->shape.dims[3];
  return 0;
}

int kl_infer_CONV2D_WEIGHT_GRAD(kl_node *n, kl_error *err) {
  if (check_operands(n, err, false) || check_rank(n, err, 0, 4, "x") ||
      check_rank(n, err, 1, 4, "dy"))
    return -1;
  window w;
  int64_t groups;
  if (wgrad_setup(n, err, &w, &groups)) return -1;
  kl_shape out = {4, {n->inputs[1]->shape.dims[1], n->inputs[0]->shape.dims[1] / groups,
                      w.k[0], w.k[1]}};
  return kl_set_checked_output(n, err, 0, n->inputs[0]->dtype, &out);
}

int kl_eval_CONV2D_WEIGHT_GRAD(const kl_node *n, kl_tensor **in, kl_tensor **out,
                               kl_error *err) {
  window w;
  int64_t groups;
  if (wgrad_setup((kl_node *)n, err, &w, &groups)) return -1;
  const int64_t *xd = in[0]->shape.dims;
  int64_t nb = xd[0], c = xd[1], h = xd[2], wi = xd[3], m = in[1]->shape.dims[1];
  int64_t cpg = c / groups, mpg = m / groups;
  const double *x = in[0]->data, *dy = in[1]->data;
  double *o = out[0]->data;
  for (int64_t oc = 0; oc < m; oc++) {
    int64_t c0 = oc / mpg * cpg; /* first input channel of the group */
    for (int64_t ic = 0; ic < cpg; ic++)
      for (int64_t ky = 0; ky < w.k[0]; ky++)
        for (int64_t kx = 0; kx < w.k[1]; kx++) {
          double acc = 0.0;
          for (int64_t b = 0; b < nb; b++)
            for (int64_t oy = 0; oy < w.out[0]; oy++) {
              int64_t iy = oy * w.stride[0] - w.pad[0] + ky * w.dil[0];
              if (iy < 0 || iy >= h) continue;
              for (int64_t ox = 0; ox < w.out[1]; ox++) {
                int64_t ix = ox * w.stride[1] - w.pad[1] + kx * w.dil[1];
                if (ix < 0 || ix >= wi) continue;
                acc += dy[((b * m + oc) * w.out[0] + oy) * w.out[1] + ox] *
                       x[((b * c + c0 + ic) * h + iy) * wi + ix];
              }
            }
          *o++ = acc;
        }
  }
  return 0;
}

/* ---- conv_transpose2d ------------------------------------------------ */

/* An ints attribute of `len` entries, each in [lo, KL_MAX_NUMEL] (the cap
 * keeps index arithmetic far from overflow); all `dv` when absent. */
static int ints_attr_or(const kl_node *n, kl_error *err, const char *name,
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


typedef struct {
  int64_t stride[2], pad[4], dil[2], opad[2], k[2], out[2], groups;
} tconv;

static int tconv_setup(const kl_node *n, kl_error *err, tconv *t) {
  const kl_value *x = n->inputs[0], *w = n->inputs[1];
  const kl_value *b = n->ninputs > 2 ? n->inputs[2] : NULL;
  char sx[300], sw[300];
  if (ints_attr_or(n, err, "strides", 2, 1, 1, t->stride) ||
      ints_attr_or(n, err, "pads", 4, -KL_MAX_NUMEL, 0, t->pad) ||
      ints_attr_or(n, err, "dilations", 2, 1, 1, t->dil) ||
      ints_attr_or(n, err, "output_padding", 2, 0, 0, t->opad))
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

/* ---- deform_conv2d --------------------------------------------------- */

typedef struct {
  window w;
  int64_t groups, ogroups;
} deform_cfg;

static int deform_setup(const kl_node *n, kl_error *err, deform_cfg *d) {
  const kl_value *x = n->inputs[0], *wt = n->inputs[1], *off = n->inputs[2];
  const kl_value *b = n->ninputs > 3 ? n->inputs[3] : NULL;
  const kl_value *mask = n->ninputs > 4 ? n->inputs[4] : NULL;
  char sx[300], sw[300];
  int64_t c = x->shape.dims[1], m = wt->shape.dims[0];
  d->groups = kl_attr_int(n, "groups", 1);
  d->ogroups = kl_attr_int(n, "offset_groups", 1);
  if (d->groups < 1 || d->ogroups < 1 || c % d->groups || c % d->ogroups ||
      c / d->groups != wt->shape.dims[1] || m % d->groups)
    return KL_NODE_FAIL(n, err, "groups %lld and offset_groups %lld must divide the input "
                        "channels of x %s, and w %s must be [M (a multiple of groups), C / "
                        "groups, kH, kW]", (long long)d->groups, (long long)d->ogroups,
                        kl_value_str(x, sx, sizeof sx), kl_value_str(wt, sw, sizeof sw));
  if (b && (b->shape.rank != 1 || b->shape.dims[0] != m))
    return KL_NODE_FAIL(n, err, "bias must have shape [%lld], got %s", (long long)m,
                        kl_value_str(b, sx, sizeof sx));
  for (int a = 0; a < 2; a++) {
    d->w.k[a] = wt->shape.dims[2 + a];
    if (d->w.k[a] < 1 || d->w.k[a] > KL_MAX_NUMEL)
      return KL_NODE_FAIL(n, err, "kernel dims of w %s must be >= 1",
                          kl_value_str(wt, sw, sizeof sw));
    d->w.stride[a] = 1;
  }
  if (window_setup(n, err, x, true, false, &d->w)) return -1;
  int64_t taps = d->w.k[0] * d->w.k[1];
  const kl_value *want[2] = {off, mask};
  for (int i = 0; i < 2; i++) {
    const kl_value *v = want[i];
    if (!v) continue;
    int64_t ch = (i == 0 ? 2 : 1) * d->ogroups * taps;
    if (v->shape.rank != 4 || v->shape.dims[0] != x->shape.dims[0] || v->shape.dims[1] != ch ||
        v->shape.dims[2] != d->w.out[0] || v->shape.dims[3] != d->w.out[1])
      return KL_NODE_FAIL(n, err, "%s must be [%lld, %lld, %lld, %lld], got %s",
                          i == 0 ? "offset" : "mask", (long long)x->shape.dims[0], (long long)ch,
                          (long long)d->w.out[0], (long long)d->w.out[1],
                          kl_value_str(v, sx, sizeof sx));
  }
  return 0;
}

int kl_infer_DEFORM_CONV2D(kl_node *n, kl_error *err) {
  deform_cfg d;
  if (check_operands(n, err, false) || check_rank(n, err, 0, 4, "x") ||
      check_rank(n, err, 1, 4, "w") || deform_setup(n, err, &d))
    return -1;
  const kl_shape *x = &n->inputs[0]->shape;
  kl_shape out = {4, {x->dims[0], n->inputs[1]->shape.dims[0], d.w.out[0], d.w.out[1]}};
  return kl_set_checked_output(n, err, 0, n->inputs[0]->dtype, &out);
}

/* x [h, w] at (y, x), bilinear over the four pixels around it, those
 * outside counting as 0; NaN for a NaN coordinate. */
static double bilinear_zero(const double *p, int64_t h, int64_t w, double y, double x) {
  if (isnan(y) || isnan(x)) return NAN;
  y = fmax(fmin(y, 1e9), -1e9), x = fmax(fmin(x, 1e9), -1e9);
  double fy = floor(y), fx = floor(x), ly = y - fy, lx = x - fx;
  int64_t y0 = (int64_t)fy, x0 = (int64_t)fx;
  double acc = 0, wy[2] = {1 - ly, ly}, wx[2] = {1 - lx, lx};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      int64_t yy = y0 + i, xx = x0 + j;
      if (yy >= 0 && yy < h && xx >= 0 && xx < w && wy[i] * wx[j] != 0)
        acc += wy[i] * wx[j] * p[yy * w + xx];
    }
  return acc;
}

int kl_eval_DEFORM_CONV2D(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  deform_cfg d;
  if (deform_setup(n, err, &d)) return -1;
  const window *w = &d.w;
  const int64_t *xd = in[0]->shape.dims;
  int64_t nb = xd[0], c = xd[1], h = xd[2], wi = xd[3], m = in[1]->shape.dims[0];
  int64_t cpg = c / d.groups, mpg = m / d.groups, cpo = c / d.ogroups;
  int64_t taps = w->k[0] * w->k[1], plane = w->out[0] * w->out[1];
  const double *x = in[0]->data, *wt = in[1]->data, *off = in[2]->data;
  const double *bias = n->ninputs > 3 ? in[3]->data : NULL;
  const double *mask = n->ninputs > 4 ? in[4]->data : NULL;
  double *o = out[0]->data;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t oc = 0; oc < m; oc++)
      for (int64_t oy = 0; oy < w->out[0]; oy++)
        for (int64_t ox = 0; ox < w->out[1]; ox++) {
          double acc = bias ? bias[oc] : 0.0;
          for (int64_t icl = 0; icl < cpg; icl++) {
            int64_t ic = oc / mpg * cpg + icl, og = ic / cpo;
            const double *xp = x + (b * c + ic) * h * wi;
            for (int64_t t = 0; t < taps; t++) {
              int64_t ky = t / w->k[1], kx = t % w->k[1], at = oy * w->out[1] + ox;
              const double *op = off + ((b * d.ogroups + og) * taps + t) * 2 * plane;
              double y = (double)(oy * w->stride[0] - w->pad[0] + ky * w->dil[0]) + op[at];
              double xx = (double)(ox * w->stride[1] - w->pad[1] + kx * w->dil[1]) + op[plane + at];
              double v = bilinear_zero(xp, h, wi, y, xx);
              if (mask) v *= mask[((b * d.ogroups + og) * taps + t) * plane + at];
              acc += wt[(oc * cpg + icl) * taps + t] * v;
            }
          }
          *o++ = acc;
        }
  return 0;
}

/* ---- pools ----------------------------------------------------------- */

typedef struct {
  window w;
  bool ceil_mode, include_pad;
} pool_cfg;

static int pool_setup(const kl_node *n, kl_error *err, bool is_max,
                      pool_cfg *p) {
  const kl_value *x = n->inputs[0];
  char sx[300];
  memset(p, 0, sizeof *p);
  if (kl_attr_flag(n, err, "ceil_mode", 0, &p->ceil_mode)) return -1;
  if (!is_max && kl_attr_flag(n, err, "count_include_pad", 0, &p->include_pad))
    return -1;
  if (ints_attr(n, err, "kernel", 2, 1, NULL, p->w.k)) return -1;
  if (x->shape.dims[2] < 1 || x->shape.dims[3] < 1)
    return KL_NODE_FAIL(n, err, "spatial dims of %s must be >= 1",
                        kl_value_str(x, sx, sizeof sx));
  p->w.stride[0] = p->w.k[0];
  p->w.stride[1] = p->w.k[1];
  if (window_setup(n, err, x, true, p->ceil_mode, &p->w)) return -1;
  /* As ONNX Runtime: a pad as wide as the kernel would make windows that
   * see only padding. */
  for (int i = 0; i < 4; i++)
    if (p->w.pad[i] >= p->w.k[i % 2])
      return KL_NODE_FAIL(n, err, "pads[%d] = %lld must be smaller than the "
                          "kernel (%lld)", i, (long long)p->w.pad[i],
                          (long long)p->w.k[i % 2]);
  return 0;
}

/* The pool's output, of dtype t. */
static int pool_infer_as(kl_node *n, kl_error *err, bool is_max, kl_dtype t) {
  pool_cfg p;
  if (check_operands(n, err, false) || check_rank(n, err, 0, 4, "x") ||
      pool_setup(n, err, is_max, &p))
    return -1;
  const kl_shape *x = &n->inputs[0]->shape;
  kl_shape out = {4, {x->dims[0], x->dims[1], p.w.out[0], p.w.out[1]}};
  return kl_set_checked_output(n, err, 0, t, &out);
}

static int pool_infer(kl_node *n, kl_error *err, bool is_max) {
  return pool_infer_as(n, err, is_max, n->inputs[0]->dtype);
}

/* How many of the taps start, start + d, .. (k of them) lie before end. */
static int64_t taps_before(int64_t start, int64_t k, int64_t d, int64_t end) {
  int64_t n = start < end ? (end - start + d - 1) / d : 0;
  return n < k ? n : k;
}

/* Max of an empty window (possible only with dilation) is -inf. */
static int pool_eval(const kl_node *n, kl_tensor **in, kl_tensor **out,
                     kl_error *err, bool is_max) {
  pool_cfg p;
  if (pool_setup(n, err, is_max, &p)) return -1;
  const window *w = &p.w;
  int64_t h = in[0]->shape.dims[2], wi = in[0]->shape.dims[3];
  int64_t planes = in[0]->shape.dims[0] * in[0]->shape.dims[1];
  double *o = out[0]->data;
  for (int64_t pl = 0; pl < planes; pl++) {
    const double *x = in[0]->data + pl * h * wi;
    for (int64_t oy = 0; oy < w->out[0]; oy++)
      for (int64_t ox = 0; ox < w->out[1]; ox++) {
        int64_t y0 = oy * w->stride[0] - w->pad[0];
        int64_t x0 = ox * w->stride[1] - w->pad[1];
        double acc = is_max ? -INFINITY : 0.0;
        int64_t count = 0;
        for (int64_t ky = 0; ky < w->k[0]; ky++) {
          int64_t iy = y0 + ky * w->dil[0];
          if (iy < 0 || iy >= h) continue;
          for (int64_t kx = 0; kx < w->k[1]; kx++) {
            int64_t ix = x0 + kx * w->dil[1];
            if (ix < 0 || ix >= wi) continue;
            double v = x[iy * wi + ix];
            if (!is_max) acc += v;
            else if (v > acc || isnan(v)) acc = v; /* NaN propagates */
            count++;
          }
        }
        if (!is_max) {
          if (p.include_pad) /* taps inside the padded input, not beyond
                                 it (ceil mode's overhang never counts) */
            count = taps_before(y0, w->k[0], w->dil[0], h + w->pad[2]) *
                    taps_before(x0, w->k[1], w->dil[1], wi + w->pad[3]);
          acc /= (double)count;
        }
        *o++ = acc;
      }
  }
  return 0;
}

int kl_infer_MAX_POOL2D(kl_node *n, kl_error *err) {
  return pool_infer(n, err, true);
}
int kl_eval_MAX_POOL2D(const kl_node *n, kl_tensor **in, kl_tensor **out,
                       kl_error *err) {
  return pool_eval(n, in, out, err, true);
}
int kl_infer_AVG_POOL2D(kl_node *n, kl_error *err) {
  return pool_infer(n, err, false);
}
int kl_eval_AVG_POOL2D(const kl_node *n, kl_tensor **in, kl_tensor **out,
                       kl_error *err) {
  return pool_eval(n, in, out, err, false);
}

int kl_infer_MAX_POOL2D_INDEX(kl_node *n, kl_error *err) {
  bool col;
  if (kl_attr_flag(n, err, "storage_order", 0, &col)) return -1;
  return pool_infer_as(n, err, true, KL_I64);
}

/* As pool_eval's max, keeping where the maximum was. */
int kl_eval_MAX_POOL2D_INDEX(const kl_node *n, kl_tensor **in, kl_tensor **out,
                             kl_error *err) {
  pool_cfg p;
  if (pool_setup(n, err, true, &p)) return -1;
  const window *w = &p.w;
  bool col = kl_attr_int(n, "storage_order", 0) != 0;
  int64_t h = in[0]->shape.dims[2], wi = in[0]->shape.dims[3];
  int64_t planes = in[0]->shape.dims[0] * in[0]->shape.dims[1];
  double *o = out[0]->data;
  for (int64_t pl = 0; pl < planes; pl++) {
    const double *x = in[0]->data + pl * h * wi;
    for (int64_t oy = 0; oy < w->out[0]; oy++)
      for (int64_t ox = 0; ox < w->out[1]; ox++) {
        int64_t y0 = oy * w->stride[0] - w->pad[0];
        int64_t x0 = ox * w->stride[1] - w->pad[1];
        double acc = -INFINITY;
        int64_t at = -1;
        for (int64_t ky = 0; ky < w->k[0]; ky++) {
          int64_t iy = y0 + ky * w->dil[0];
          if (iy < 0 || iy >= h) continue;
          for (int64_t kx = 0; kx < w->k[1]; kx++) {
            int64_t ix = x0 + kx * w->dil[1];
            if (ix < 0 || ix >= wi || isnan(acc)) continue;
            double v = x[iy * wi + ix];
            if (at < 0 || v > acc || isnan(v)) {
              acc = v;
              at = pl * h * wi + (col ? iy + ix * h : iy * wi + ix);
            }
          }
        }
        *o++ = (double)at;
      }
  }
  return 0;
}

/* ---- global_avg_pool ------------------------------------------------- */

int kl_infer_GLOBAL_AVG_POOL(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char sx[300];
  if (check_operands(n, err, false)) return -1;
  if (x->shape.rank < 3)
    return KL_NODE_FAIL(n, err, "input must be [N, C, spatial...], got %s",
                        kl_value_str(x, sx, sizeof sx));
  kl_shape out = x->shape;
  for (int i = 2; i < out.rank; i++) {
    if (out.dims[i] < 1)
      return KL_NODE_FAIL(n, err, "spatial dims of %s must be >= 1",
                          kl_value_str(x, sx, sizeof sx));
    out.dims[i] = 1;
  }
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_GLOBAL_AVG_POOL(const kl_node *n, kl_tensor **in,
                            kl_tensor **out, kl_error *err) {
  (void)n;
  (void)err;
  int64_t planes = out[0]->numel;
  if (planes == 0) return 0;
  int64_t size = in[0]->numel / planes;
  for (int64_t p = 0; p < planes; p++) {
    double acc = 0.0;
    for (int64_t i = 0; i < size; i++) acc += in[0]->data[p * size + i];
    out[0]->data[p] = acc / (double)size;
  }
  return 0;
}

/* ---- col2im ---------------------------------------------------------- */

/* An ints attribute of s entries, each >= lo; `dflt` for every entry when
 * absent (dflt < 0: required). */
static int axis_ints(const kl_node *n, kl_error *err, const char *name, int s, int64_t lo,
                     int64_t dflt, int64_t *out) {
  const int64_t *v;
  int got = kl_attr_ints(n, name, &v);
  if (got < 0 && dflt >= 0) {
    for (int i = 0; i < s; i++) out[i] = dflt;
    return 0;
  }
  if (got != s) return KL_NODE_FAIL(n, err, "%s must have %d entries, got %d", name, s, got);
  for (int i = 0; i < s; i++) {
    if (v[i] < lo || v[i] > KL_MAX_NUMEL)
      return KL_NODE_FAIL(n, err, "%s[%d] = %lld is out of range [%lld, %lld]", name, i,
                          (long long)v[i], (long long)lo, (long long)KL_MAX_NUMEL);
    out[i] = v[i];
  }
  return 0;
}

/* Where block element b of block position q lands in the flat image;
 * false when it falls in the padding. */
static bool col2im_position(const kl_col2im_geom *g, int64_t b, int64_t q, int64_t *pos) {
  int64_t rb = b, rq = q, at = 0, stride = 1;
  bool inside = true;
  for (int i = g->s - 1; i >= 0; i--) {
    int64_t bi = rb % g->block[i], qi = rq % g->nblk[i];
    rb /= g->block[i], rq /= g->nblk[i];
    int64_t p = qi * g->stride[i] - g->pad[i] + bi * g->dil[i];
    inside &= p >= 0 && p < g->image[i];
    at += p * stride;
    stride *= g->image[i];
  }
  *pos = at;
  return inside;
}

static int col2im_setup(const kl_node *n, kl_error *err, kl_col2im_geom *g) {
  const int64_t *img;
  int s = kl_attr_ints(n, "image_shape", &img);
  if (s < 1 || s > KL_MAX_RANK - 2)
    return KL_NODE_FAIL(n, err, "image_shape must have 1 to %d entries", KL_MAX_RANK - 2);
  g->s = s;
  if (axis_ints(n, err, "image_shape", s, 1, -1, g->image) ||
      axis_ints(n, err, "block_shape", s, 1, -1, g->block) ||
      axis_ints(n, err, "strides", s, 1, 1, g->stride) ||
      axis_ints(n, err, "pads", 2 * s, 0, 0, g->pad) ||
      axis_ints(n, err, "dilations", s, 1, 1, g->dil))
    return -1;
  for (int i = 0; i < s; i++) {
    int64_t span = g->image[i] + g->pad[i] + g->pad[s + i], ext = g->dil[i] * (g->block[i] - 1) + 1;
    if (span < ext)
      return KL_NODE_FAIL(n, err, "block %lld (dilation %lld) does not fit image axis %d of "
                          "%lld padded to %lld", (long long)g->block[i], (long long)g->dil[i], i,
                          (long long)g->image[i], (long long)span);
    g->nblk[i] = (span - ext) / g->stride[i] + 1;
  }
  return 0;
}

int kl_col2im_geometry(const kl_node *n, kl_col2im_geom *g) {
  if (n->op != KL_OP_COL2IM) return -1;
  return col2im_setup(n, NULL, g);
}

int kl_infer_COL2IM(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char sx[300];
  kl_col2im_geom g;
  if (check_operands(n, err, false) || check_rank(n, err, 0, 3, "x") || col2im_setup(n, err, &g))
    return -1;
  int64_t k = 1, l = 1;
  for (int i = 0; i < g.s; i++) k *= g.block[i], l *= g.nblk[i];
  if (x->shape.dims[1] % k || x->shape.dims[2] != l)
    return KL_NODE_FAIL(n, err, "x %s must be [N, C * %lld (the block size), %lld (the block "
                        "positions)]", kl_value_str(x, sx, sizeof sx), (long long)k, (long long)l);
  kl_shape out = {2 + g.s, {x->shape.dims[0], x->shape.dims[1] / k}};
  for (int i = 0; i < g.s; i++) out.dims[2 + i] = g.image[i];
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

/* Scatters each block element to its image position, blocks in order;
 * positions in the padding are dropped. */
int kl_eval_COL2IM(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  kl_col2im_geom g;
  if (col2im_setup(n, err, &g)) return -1;
  const kl_tensor *x = in[0];
  kl_tensor *y = out[0];
  int s = g.s;
  int64_t k = 1, l = x->shape.dims[2], img = 1;
  for (int i = 0; i < s; i++) k *= g.block[i], img *= g.image[i];
  int64_t planes = x->shape.dims[0] * y->shape.dims[1];
  memset(y->data, 0, sizeof(double) * (size_t)y->numel);
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t b = 0; b < k; b++)
      for (int64_t q = 0; q < l; q++) {
        int64_t at;
        if (col2im_position(&g, b, q, &at)) y->data[pl * img + at] += x->data[(pl * k + b) * l + q];
      }
  return 0;
}

/* ---- attention ------------------------------------------------------- */
/* The optional inputs after q, k, v: a mask (bool or q's dtype) then the
 * key lengths (an integer vector); each found by its dtype. */
typedef struct {
  int mask, lengths; /* input indices, -1 when absent */
} attn_inputs;

static attn_inputs attention_inputs(const kl_node *n) {
  attn_inputs a = {-1, -1};
  for (int k = 3; k < n->ninputs; k++) {
    kl_dtype t = n->inputs[k]->dtype;
    if (t == KL_I64 || t == KL_I32) a.lengths = k;
    else a.mask = k;
  }
  return a;
}

/* The mask's dims aligned to [B, Hq, Sq, M]: 1 where it broadcasts. */
static void mask_dims4(const kl_shape *m, int64_t *d4) {
  for (int d = 0; d < 4; d++) {
    int md = d - (4 - m->rank);
    d4[d] = md < 0 ? 1 : m->dims[md];
  }
}

int kl_infer_ATTENTION(kl_node *n, kl_error *err) {
  const kl_value *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2];
  char bq[256], bk[256], bv[256];
  for (int i = 0; i < 3; i++) {
    if (kl_need_float(n, err, n->inputs[i])) return -1;
    if (n->inputs[i]->shape.rank != 4)
      return KL_NODE_FAIL(n, err, "q, k and v must be 4-D [batch, heads, seq, head size], got %s",
                          kl_value_str(n->inputs[i], bq, sizeof bq));
    if (n->inputs[i]->dtype != q->dtype)
      return KL_NODE_FAIL(n, err, "q, k and v must share a dtype, got %s and %s",
                          kl_value_str(q, bq, sizeof bq), kl_value_str(n->inputs[i], bk, sizeof bk));
  }
  const int64_t *Q = q->shape.dims, *K = k->shape.dims, *V = v->shape.dims;
  if (K[0] != Q[0] || V[0] != Q[0] || K[1] != V[1] || K[2] != V[2] || K[3] != Q[3] ||
      K[1] < 1 || Q[1] % K[1] != 0)
    return KL_NODE_FAIL(n, err,
                        "q %s, k %s and v %s do not fit: one batch, k and v one head count "
                        "dividing q's and one key count, q and k one head size",
                        kl_value_str(q, bq, sizeof bq), kl_value_str(k, bk, sizeof bk),
                        kl_value_str(v, bv, sizeof bv));
  attn_inputs in = attention_inputs(n);
  int nmask = 0, nlen = 0;
  for (int i = 3; i < n->ninputs; i++) *(i == in.mask ? &nmask : &nlen) += 1;
  if (nmask > 1 || nlen > 1 || (in.mask > 0 && in.lengths > 0 && in.lengths < in.mask))
    return KL_NODE_FAIL(n, err, "the inputs after v are a mask, then the key lengths");
  if (in.mask > 0) {
    const kl_value *m = n->inputs[in.mask];
    int64_t d4[4], want[4] = {Q[0], Q[1], Q[2], K[2]};
    bool ok = (m->dtype == KL_BOOL || m->dtype == q->dtype) && m->shape.rank >= 1 &&
              m->shape.rank <= 4;
    if (ok) mask_dims4(&m->shape, d4);
    for (int d = 0; ok && d < 3; d++) ok = d4[d] == 1 || d4[d] == want[d];
    if (!ok || d4[3] > K[2])
      return KL_NODE_FAIL(n, err,
                          "mask %s must be bool or q's dtype and broadcast to [%lld, %lld, %lld, "
                          "at most %lld keys]",
                          kl_value_str(m, bk, sizeof bk), (long long)want[0], (long long)want[1],
                          (long long)want[2], (long long)want[3]);
  }
  if (in.lengths > 0) {
    const kl_value *l = n->inputs[in.lengths];
    if (l->shape.rank != 1 || l->shape.dims[0] != Q[0])
      return KL_NODE_FAIL(n, err, "key lengths %s must be [%lld], one per batch",
                          kl_value_str(l, bk, sizeof bk), (long long)Q[0]);
  }
  int64_t past = kl_attr_int(n, "past", 0), scores = kl_attr_int(n, "scores", -1);
  if (past < 0 || past > K[2])
    return KL_NODE_FAIL(n, err, "past %lld must be in [0, %lld], the key count", (long long)past,
                        (long long)K[2]);
  if (scores < -1 || scores > 3)
    return KL_NODE_FAIL(n, err, "scores must be -1 (the output) or 0..3, not %lld",
                        (long long)scores);
  if (kl_attr_int(n, "window_left", -1) < -1 || kl_attr_int(n, "window_right", -1) < -1)
    return KL_NODE_FAIL(n, err, "window_left and window_right must be -1 or >= 0");
  kl_shape y = {.rank = 4, .dims = {Q[0], Q[1], Q[2], scores < 0 ? V[3] : K[2]}};
  kl_set_output(n, 0, q->dtype, &y);
  return 0;
}

/* The additive bias of key j for query i of (b, h): 0 or -inf from the
 * causal rule, the window and the key length, plus the mask's value. */
typedef struct {
  const kl_tensor *mask, *lengths;
  int64_t mstride[4], mlen; /* the mask's strides over [B,Hq,Sq,M], its M */
  int64_t sq, past, left, right;
  bool causal;
} attn_bias;

static double bias_at(const attn_bias *a, int64_t b, int64_t h, int64_t i, int64_t j) {
  int64_t off = a->past;
  if (a->lengths) {
    int64_t len = (int64_t)a->lengths->data[b];
    if (j >= len) return -INFINITY;
    off = len - a->sq;
  }
  if (a->causal && j > i + off) return -INFINITY;
  if (a->left >= 0 && i + off - j > a->left) return -INFINITY;
  if (a->right >= 0 && j - (i + off) > a->right) return -INFINITY;
  if (!a->mask) return 0;
  if (j >= a->mlen) return -INFINITY;
  double m = a->mask->data[b * a->mstride[0] + h * a->mstride[1] + i * a->mstride[2] +
                           j * a->mstride[3]];
  if (a->mask->dtype == KL_BOOL) return m != 0 ? 0 : -INFINITY;
  return m;
}

int kl_eval_ATTENTION(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  const kl_tensor *q = in[0], *k = in[1], *v = in[2];
  const int64_t *Q = q->shape.dims, *K = k->shape.dims, *V = v->shape.dims;
  int64_t B = Q[0], hq = Q[1], sq = Q[2], d = Q[3], hkv = K[1], skv = K[2], dv = V[3];
  int scores = (int)kl_attr_int(n, "scores", -1);
  double scale = kl_attr_float(n, "scale", 0), cap = kl_attr_float(n, "softcap", 0);
  if (scale == 0) scale = 1 / sqrt((double)d);
  attn_inputs ai = attention_inputs(n);
  attn_bias ab = {.mask = ai.mask > 0 ? in[ai.mask] : NULL,
                  .lengths = ai.lengths > 0 ? in[ai.lengths] : NULL,
                  .sq = sq,
                  .past = kl_attr_int(n, "past", 0),
                  .left = kl_attr_int(n, "window_left", -1),
                  .right = kl_attr_int(n, "window_right", -1),
                  .causal = kl_attr_int(n, "causal", 0) != 0};
  if (ab.mask) {
    int64_t d4[4], st = 1;
    mask_dims4(&ab.mask->shape, d4);
    for (int x = 3; x >= 0; x--) {
      ab.mstride[x] = d4[x] == 1 ? 0 : st;
      st *= d4[x];
    }
    ab.mstride[3] = 1, ab.mlen = d4[3];
  }
  double *x = malloc(2 * (size_t)(skv ? skv : 1) * sizeof *x);
  if (!x) return KL_NODE_FAIL(n, err, "out of memory");
  double *s = x + skv;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < hq; h++) {
      int64_t kh = h / (hq / hkv);
      const double *kb = k->data + (b * hkv + kh) * skv * d, *vb = v->data + (b * hkv + kh) * skv * dv;
      for (int64_t i = 0; i < sq; i++) {
        const double *qr = q->data + ((b * hq + h) * sq + i) * d;
        double *yr = out[0]->data + ((b * hq + h) * sq + i) * (scores < 0 ? dv : skv);
        bool all_masked = true;
        double mx = -INFINITY;
        for (int64_t j = 0; j < skv; j++) {
          double dot = 0;
          for (int64_t e = 0; e < d; e++) dot += qr[e] * kb[j * d + e];
          s[j] = dot * scale;
          if (cap > 0) s[j] = cap * tanh(s[j] / cap);
          double bias = bias_at(&ab, b, h, i, j);
          if (bias != -INFINITY) all_masked = false;
          x[j] = s[j] + bias;
          if (x[j] > mx || isnan(x[j])) mx = x[j];
        }
        if (scores == 0 || scores == 1 || scores == 2) {
          for (int64_t j = 0; j < skv; j++) yr[j] = scores == 2 ? x[j] : s[j];
          continue;
        }
        /* the probabilities, into x: a row of -inf gives zeros, not NaN */
        if (mx == -INFINITY) mx = 0;
        double sum = 0;
        for (int64_t j = 0; j < skv; j++) sum += x[j] = exp(x[j] - mx);
        if (sum == 0) sum = 1;
        for (int64_t j = 0; j < skv; j++) x[j] = all_masked ? 0 : x[j] / sum;
        if (scores == 3) {
          memcpy(yr, x, (size_t)skv * sizeof *x);
          continue;
        }
        for (int64_t e = 0; e < dv; e++) {
          double acc = 0;
          for (int64_t j = 0; j < skv; j++) acc += x[j] * vb[j * dv + e];
          yr[e] = acc;
        }
      }
    }
  free(x);
  return 0;
}

/* ---- linear_attention ------------------------------------------------ */
/* The rule's flags and where the optional inputs sit (-1: absent). */
typedef struct {
  bool gated, delta;
  int past, decay, beta;
  int64_t b, t, hq, hkv, dk, dv;
} lin_attn;

static int linear_attention_layout(const kl_node *n, kl_error *err, lin_attn *o) {
  const char *rule = kl_attr_string(n, "rule", "");
  static const char *const rules[] = {"linear", "gated", "delta", "gated_delta"};
  int r = -1;
  for (int i = 0; i < 4; i++)
    if (!strcmp(rule, rules[i])) r = i;
  if (r < 0)
    return KL_NODE_FAIL(n, err, "rule must be \"linear\", \"gated\", \"delta\" or \"gated_delta\", "
                                "not \"%s\"", rule);
  *o = (lin_attn){.gated = r & 1, .delta = r >= 2, .past = -1, .decay = -1, .beta = -1};
  int k = 3;
  if (kl_attr_int(n, "past", 0)) o->past = k++;
  if (o->gated) o->decay = k++;
  if (o->delta) o->beta = k++;
  if (k != n->ninputs)
    return KL_NODE_FAIL(n, err, "takes q, k, v%s%s%s (%d inputs), got %d",
                        o->past > 0 ? ", past" : "", o->gated ? ", decay" : "",
                        o->delta ? ", beta" : "", k, n->ninputs);
  const kl_shape *q = &n->inputs[0]->shape, *kk = &n->inputs[1]->shape, *v = &n->inputs[2]->shape;
  o->hq = kl_attr_int(n, "q_heads", 0), o->hkv = kl_attr_int(n, "kv_heads", 0);
  char b1[200];
  if (o->hq < 1 || o->hkv < 1 || o->hq % o->hkv)
    return KL_NODE_FAIL(n, err, "q_heads %lld must be a positive multiple of kv_heads %lld",
                        (long long)o->hq, (long long)o->hkv);
  for (int i = 0; i < 3; i++) {
    const kl_shape *s = &n->inputs[i]->shape;
    int64_t h = i ? o->hkv : o->hq;
    if (s->rank != 3 || s->dims[0] != q->dims[0] || s->dims[1] != q->dims[1] || s->dims[2] % h)
      return KL_NODE_FAIL(n, err, "q, k and v must be [B, T, heads * size] of one B and T, "
                                  "got %s", kl_value_str(n->inputs[i], b1, sizeof b1));
  }
  o->b = q->dims[0], o->t = q->dims[1], o->dk = kk->dims[2] / o->hkv, o->dv = v->dims[2] / o->hkv;
  if (q->dims[2] / o->hq != o->dk)
    return KL_NODE_FAIL(n, err, "q's head size %lld differs from k's %lld",
                        (long long)(q->dims[2] / o->hq), (long long)o->dk);
  return 0;
}

int kl_infer_LINEAR_ATTENTION(kl_node *n, kl_error *err) {
  lin_attn a;
  for (int i = 0; i < n->ninputs; i++)
    if (kl_need_float(n, err, n->inputs[i])) return -1;
  if (linear_attention_layout(n, err, &a)) return -1;
  char b1[200];
  kl_shape st = {.rank = 4, .dims = {a.b, a.hkv, a.dk, a.dv}};
  if (a.past > 0 && !kl_shape_equal(&n->inputs[a.past]->shape, &st))
    return KL_NODE_FAIL(n, err, "past %s must be [%lld, %lld, %lld, %lld]",
                        kl_value_str(n->inputs[a.past], b1, sizeof b1), (long long)a.b,
                        (long long)a.hkv, (long long)a.dk, (long long)a.dv);
  int which[2] = {a.decay, a.beta};
  for (int w = 0; w < 2; w++) {
    if (which[w] < 0) continue;
    const kl_shape *s = &n->inputs[which[w]]->shape;
    int64_t last = s->rank == 3 ? s->dims[2] : -1;
    bool ok = s->rank == 3 && s->dims[0] == a.b && s->dims[1] == a.t &&
              (w == 0 ? last == a.hkv || last == a.hkv * a.dk : last == a.hkv || last == 1);
    if (!ok)
      return KL_NODE_FAIL(n, err, "%s %s must be [%lld, %lld, %s]", w ? "beta" : "decay",
                          kl_value_str(n->inputs[which[w]], b1, sizeof b1), (long long)a.b,
                          (long long)a.t, w ? "kv_heads or 1" : "kv_heads or kv_heads * Dk");
  }
  kl_shape y = {.rank = 3, .dims = {a.b, a.t, a.hq * a.dv}};
  kl_set_output(n, 0, n->inputs[0]->dtype, &y);
  kl_set_output(n, 1, a.past > 0 ? n->inputs[a.past]->dtype : n->inputs[0]->dtype, &st);
  return 0;
}

int kl_eval_LINEAR_ATTENTION(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  lin_attn a;
  if (linear_attention_layout(n, err, &a)) return -1;
  double scale = kl_attr_float(n, "scale", 0);
  if (scale == 0) scale = 1 / sqrt((double)a.dk);
  int64_t group = a.hq / a.hkv, dl = a.decay > 0 ? in[a.decay]->shape.dims[2] : 0;
  int64_t bl = a.beta > 0 ? in[a.beta]->shape.dims[2] : 0;
  double *S = out[1]->data; /* [B, Hkv, Dk, Dv], updated in place */
  for (int64_t i = 0; i < out[1]->numel; i++) S[i] = a.past > 0 ? in[a.past]->data[i] : 0;
  double *vt = malloc((size_t)(a.dv ? a.dv : 1) * sizeof *vt);
  if (!vt) return KL_NODE_FAIL(n, err, "out of memory");
  for (int64_t b = 0; b < a.b; b++)
    for (int64_t h = 0; h < a.hkv; h++) {
      double *s = S + (b * a.hkv + h) * a.dk * a.dv;
      for (int64_t t = 0; t < a.t; t++) {
        int64_t bt = b * a.t + t;
        const double *kt = in[1]->data + (bt * a.hkv + h) * a.dk;
        const double *v = in[2]->data + (bt * a.hkv + h) * a.dv;
        for (int64_t d = 0; d < a.dk && a.gated; d++) {
          const double *g = in[a.decay]->data + bt * dl;
          double f = exp(dl == a.hkv ? g[h] : g[h * a.dk + d]);
          for (int64_t m = 0; m < a.dv; m++) s[d * a.dv + m] *= f;
        }
        for (int64_t m = 0; m < a.dv; m++) {
          vt[m] = v[m];
          if (!a.delta) continue;
          double got = 0;
          for (int64_t d = 0; d < a.dk; d++) got += s[d * a.dv + m] * kt[d];
          vt[m] = in[a.beta]->data[bt * bl + (bl == 1 ? 0 : h)] * (v[m] - got);
        }
        for (int64_t d = 0; d < a.dk; d++)
          for (int64_t m = 0; m < a.dv; m++) s[d * a.dv + m] += kt[d] * vt[m];
        for (int64_t g = 0; g < group; g++) {
          int64_t hq = h * group + g;
          const double *qt = in[0]->data + (bt * a.hq + hq) * a.dk;
          double *y = out[0]->data + (bt * a.hq + hq) * a.dv;
          for (int64_t m = 0; m < a.dv; m++) {
            double acc = 0;
            for (int64_t d = 0; d < a.dk; d++) acc += qt[d] * s[d * a.dv + m];
            y[m] = scale * acc;
          }
        }
      }
    }
  free(vt);
  return 0;
}

/* ---- dft ------------------------------------------------------------- */

static const double DFT_TWO_PI = 6.28318530717958647692528676655900577;

static int dft_setup(const kl_node *n, kl_error *err, kl_dft_geom *g) {
  const kl_value *x = n->inputs[0];
  char sx[300];
  int r = x->shape.rank;
  if (r < 2 || (x->shape.dims[r - 1] != 1 && x->shape.dims[r - 1] != 2))
    return KL_NODE_FAIL(n, err, "x %s must be [..., 1] (real) or [..., 2] (complex) with a "
                        "signal axis before the last", kl_value_str(x, sx, sizeof sx));
  int64_t axis = kl_attr_int(n, "axis", -2);
  if (axis < -r || axis > r - 2 || axis == -1)
    return KL_NODE_FAIL(n, err, "axis %lld must name an axis of x %s other than the last",
                        (long long)axis, kl_value_str(x, sx, sizeof sx));
  g->axis = (int)(axis < 0 ? axis + r : axis);
  g->inverse = kl_attr_int(n, "inverse", 0) != 0;
  g->onesided = kl_attr_int(n, "onesided", 0) != 0;
  g->cin = (int)x->shape.dims[r - 1];
  g->m = x->shape.dims[g->axis];
  int64_t len = kl_attr_int(n, "length", 0);
  if (len < 0 || len > KL_MAX_NUMEL)
    return KL_NODE_FAIL(n, err, "length %lld must be positive (or 0: the default)",
                        (long long)len);
  bool irfft = g->inverse && g->onesided;
  g->n = len ? len : irfft ? 2 * (g->m - 1) : g->m;
  if (g->n < 1)
    return KL_NODE_FAIL(n, err, "the transform length is %lld: x %s is too short along axis %d",
                        (long long)g->n, kl_value_str(x, sx, sizeof sx), g->axis);
  g->nout = g->onesided && !g->inverse ? g->n / 2 + 1 : g->n;
  g->cout = irfft ? 1 : 2;
  g->outer = g->inner = 1;
  for (int d = 0; d < g->axis; d++) g->outer *= x->shape.dims[d];
  for (int d = g->axis + 1; d < r - 1; d++) g->inner *= x->shape.dims[d];
  return 0;
}

int kl_dft_geometry(const kl_node *n, kl_dft_geom *g) {
  if (n->op != KL_OP_DFT) return -1;
  return dft_setup(n, NULL, g);
}

int kl_infer_DFT(kl_node *n, kl_error *err) {
  kl_dft_geom g;
  if (check_operands(n, err, false) || dft_setup(n, err, &g)) return -1;
  kl_shape out = n->inputs[0]->shape;
  out.dims[g.axis] = g.nout;
  out.dims[out.rank - 1] = g.cout;
  return kl_set_checked_output(n, err, 0, n->inputs[0]->dtype, &out);
}

/* Direct summation, twiddles from the exact angle 2 pi ((k t) mod n) / n.
 * The one-sided inverse sums the Hermitian spectrum's real part: bins 1 ..
 * ceil(n/2) - 1 stand for themselves and their mirrors (weight 2); the DC
 * and Nyquist bins count once, their imaginary parts dropped (numpy irfft). */
int kl_eval_DFT(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  kl_dft_geom g;
  if (dft_setup(n, err, &g)) return -1;
  const double *x = in[0]->data;
  double *y = out[0]->data;
  bool irfft = g.inverse && g.onesided;
  int64_t terms = irfft ? g.n / 2 + 1 : g.n;
  if (terms > g.m) terms = g.m;
  double sign = g.inverse ? 1.0 : -1.0, scale = g.inverse ? 1.0 / (double)g.n : 1.0;
  for (int64_t o = 0; o < g.outer; o++)
    for (int64_t k = 0; k < g.nout; k++)
      for (int64_t i = 0; i < g.inner; i++) {
        double re = 0, im = 0;
        for (int64_t t = 0; t < terms; t++) {
          const double *xt = x + ((o * g.m + t) * g.inner + i) * g.cin;
          double xr = xt[0], xi = g.cin == 2 ? xt[1] : 0.0;
          double a = DFT_TWO_PI * (double)((k * t) % g.n) / (double)g.n;
          double c = cos(a), s = sign * sin(a);
          if (irfft) {
            double w = t == 0 || 2 * t == g.n ? 1.0 : 2.0;
            re += w * (xr * c - xi * s);
          } else {
            re += xr * c - xi * s;
            im += xr * s + xi * c;
          }
        }
        double *yk = y + ((o * g.nout + k) * g.inner + i) * g.cout;
        yk[0] = re * scale;
        if (g.cout == 2) yk[1] = im * scale;
      }
  return 0;
}

/* ---- gradient rules (ir.h, kl_grad_fn) -------------------------------- */
static kl_value *swap_last2(kl_grad_ctx *c, kl_value *x) {
  if (!x) return NULL;
  int64_t perm[KL_MAX_RANK];
  int r = x->shape.rank;
  for (int d = 0; d < r; d++) perm[d] = d;
  perm[r - 1] = r - 2;
  perm[r - 2] = r - 1;
  return kl_gb_transpose(c, x, perm);
}

static kl_value *mm(kl_grad_ctx *c, kl_value *a, kl_value *b) { return kl_gb2(c, KL_OP_MATMUL, a, b); }

/* 1-D operands are promoted as matmul does ([K] -> [1, K] on the left,
 * [K, 1] on the right), differentiated, and summed back. */
int kl_grad_MATMUL(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *a = n->inputs[0], *b = n->inputs[1], *g = dy[0];
  kl_shape as = a->shape, bs = b->shape, gs = n->outputs[0]->shape;
  if (as.rank == 1) as = (kl_shape){2, {1, a->shape.dims[0]}};
  if (bs.rank == 1) bs = (kl_shape){2, {b->shape.dims[0], 1}};
  /* y without the promoted axes: its batch dims, then M and N */
  int nb = gs.rank - (a->shape.rank > 1) - (b->shape.rank > 1);
  gs.rank = nb + 2;
  gs.dims[nb] = as.dims[as.rank - 2];
  gs.dims[nb + 1] = bs.dims[bs.rank - 1];
  a = kl_gb_reshape(c, a, &as);
  b = kl_gb_reshape(c, b, &bs);
  g = kl_gb_reshape(c, g, &gs);
  dx[0] = kl_gb_reshape(c, kl_gb_sum_to(c, mm(c, g, swap_last2(c, b)), &as), &n->inputs[0]->shape);
  dx[1] = kl_gb_reshape(c, kl_gb_sum_to(c, mm(c, swap_last2(c, a), g), &bs), &n->inputs[1]->shape);
  return 0;
}

/* y = alpha op(A) op(B) + beta C */
int kl_grad_GEMM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *a = n->inputs[0], *b = n->inputs[1], *g = dy[0];
  bool ta = kl_attr_int(n, "trans_a", 0), tb = kl_attr_int(n, "trans_b", 0);
  double alpha = kl_attr_float(n, "alpha", 1), beta = kl_attr_float(n, "beta", 1);
  kl_value *opa = ta ? swap_last2(c, a) : a, *opb = tb ? swap_last2(c, b) : b;
  if (alpha != 1) g = kl_gb2(c, KL_OP_MUL, g, kl_gb_scalar(c, g->dtype, alpha));
  kl_value *da = mm(c, g, swap_last2(c, opb)), *db = mm(c, swap_last2(c, opa), g);
  dx[0] = ta ? swap_last2(c, da) : da;
  dx[1] = tb ? swap_last2(c, db) : db;
  if (n->ninputs > 2)
    dx[2] = beta == 1 ? dy[0] : kl_gb2(c, KL_OP_MUL, dy[0], kl_gb_scalar(c, dy[0]->dtype, beta));
  return 0;
}

static kl_attr ints_of(const char *name, int64_t *v, int n) {
  return (kl_attr){.name = name, .kind = KL_ATTR_INTS, .ints = v, .n = n};
}

/* The input gradient of a window op: a transposed convolution of g with w
 * over the same window, its output padded out to x's size. */
static kl_value *window_back(kl_grad_ctx *c, const window *w, kl_value *g, kl_value *wt,
                             const kl_shape *xs, int64_t groups) {
  /* The transposed convolution's full output starts pads[top] rows above
   * x; its end is cropped (windows past x's end: the padding, ceil mode's
   * overhang) or extended (rows no window reached) to x's size. */
  int64_t op[2], pad[4] = {w->pad[0], w->pad[1], 0, 0};
  for (int i = 0; i < 2; i++) {
    int64_t full = w->stride[i] * (w->out[i] - 1) + w->dil[i] * (w->k[i] - 1) + 1;
    int64_t past = full - w->pad[i] - xs->dims[2 + i];
    pad[i + 2] = past > 0 ? past : 0;
    op[i] = past < 0 ? -past : 0;
  }
  kl_attr at[5] = {ints_of("strides", (int64_t *)w->stride, 2), ints_of("pads", pad, 4),
                   ints_of("dilations", (int64_t *)w->dil, 2), ints_of("output_padding", op, 2),
                   {.name = "groups", .kind = KL_ATTR_INT, .i = groups}};
  kl_value *ins[2] = {g, wt};
  return kl_gb_node(c, KL_OP_CONV_TRANSPOSE2D, ins, 2, at, 5);
}

/* The weight gradient of a convolution reading `in` [N, Ci, H, W] into an
 * output whose adjoint is `out` [N, Co, oH, oW]: conv2d_weight_grad,
 * which reads both where they lie (no transposed copies to keep alive
 * beside the gradient: the backward pass's peak). */
static kl_value *weight_grad(kl_grad_ctx *c, kl_value *in, kl_value *out, const int64_t *k,
                             const int64_t *stride, const int64_t *pad, const int64_t *dil,
                             int64_t groups) {
  if (!in || !out) return NULL;
  kl_attr at[5] = {ints_of("kernel", (int64_t *)k, 2), ints_of("strides", (int64_t *)stride, 2),
                   ints_of("pads", (int64_t *)pad, 4), ints_of("dilations", (int64_t *)dil, 2),
                   {.name = "groups", .kind = KL_ATTR_INT, .i = groups}};
  kl_value *ins[2] = {in, out};
  return kl_gb_node(c, KL_OP_CONV2D_WEIGHT_GRAD, ins, 2, at, 5);
}

/* conv2d_weight_grad is bilinear in x and dy.  With g the adjoint of its
 * result: dx is the input gradient of conv2d(x, g) given dy (a transposed
 * convolution), and d(dy) is conv2d(x, g) itself, its bottom/right pads
 * chosen (or its end cut) so that it has dy's size. */
int kl_grad_CONV2D_WEIGHT_GRAD(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy,
                               kl_value **dx) {
  window w;
  int64_t groups;
  if (wgrad_setup((kl_node *)n, c->err, &w, &groups)) return -1;
  kl_value *x = n->inputs[0], *g = dy[0];
  dx[0] = window_back(c, &w, n->inputs[1], g, &x->shape, groups);
  int64_t pad[4] = {w.pad[0], w.pad[1], 0, 0};
  for (int i = 0; i < 2; i++) {
    int64_t need = (w.out[i] - 1) * w.stride[i] + w.dil[i] * (w.k[i] - 1) + 1 -
                   x->shape.dims[2 + i] - w.pad[i];
    pad[2 + i] = need > 0 ? need : 0;
  }
  if (w.out[0] < 1 || w.out[1] < 1) return 0; /* an empty dy has no gradient to give */
  kl_attr at[4] = {ints_of("strides", w.stride, 2), ints_of("pads", pad, 4),
                   ints_of("dilations", w.dil, 2),
                   {.name = "groups", .kind = KL_ATTR_INT, .i = groups}};
  kl_value *ins[2] = {x, g};
  kl_value *full = kl_gb_node(c, KL_OP_CONV2D, ins, 2, at, 4);
  if (full && (full->shape.dims[2] != w.out[0] || full->shape.dims[3] != w.out[1])) {
    int64_t st[2] = {0, 0}, en[2] = {w.out[0], w.out[1]}, ax[2] = {2, 3};
    kl_attr sl[3] = {ints_of("starts", st, 2), ints_of("ends", en, 2), ints_of("axes", ax, 2)};
    full = kl_gb_node(c, KL_OP_SLICE, &full, 1, sl, 3);
  }
  dx[1] = full;
  return 0;
}

static kl_value *bias_grad(kl_grad_ctx *c, const kl_node *n, kl_value *g) {
  int64_t axes[3] = {0, 2, 3};
  return kl_gb_reshape(c, kl_gb_sum(c, g, axes, 3), &n->inputs[2]->shape);
}

/* dx: conv_transpose2d(dy, w) in the same groups; dw: weight_grad; db: dy
 * summed over N, H, W. */
int kl_grad_CONV2D(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  window w;
  int64_t groups;
  if (conv_setup(n, c->err, &w, &groups)) return -1;
  kl_value *x = n->inputs[0], *wt = n->inputs[1], *g = dy[0];
  dx[0] = window_back(c, &w, g, wt, &x->shape, groups);
  dx[1] = weight_grad(c, x, g, w.k, w.stride, w.pad, w.dil, groups);
  if (n->ninputs > 2) dx[2] = bias_grad(c, n, g);
  return 0;
}

/* conv_transpose2d is the adjoint of conv2d(y, w) (same strides, pads,
 * dilations, groups) read from its output back to its input, so dx is
 * that conv2d of dy (cut to x's size when output_padding reaches a whole
 * stride) and dw the weight gradient of it, with x as the output adjoint. */
int kl_grad_CONV_TRANSPOSE2D(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  tconv t;
  if (tconv_setup(n, c->err, &t)) return -1;
  kl_value *x = n->inputs[0], *g = dy[0];
  for (int i = 0; i < 4; i++)
    if (t.pad[i] < 0)
      return KL_GRAD_FAIL(c, n, "negative pads (an output extended by them) are not handled");
  kl_attr at[4] = {ints_of("strides", t.stride, 2), ints_of("pads", t.pad, 4),
                   ints_of("dilations", t.dil, 2), {.name = "groups", .kind = KL_ATTR_INT, .i = t.groups}};
  kl_value *ins[2] = {g, n->inputs[1]};
  kl_value *back = kl_gb_node(c, KL_OP_CONV2D, ins, 2, at, 4);
  if (back && (back->shape.dims[2] != x->shape.dims[2] || back->shape.dims[3] != x->shape.dims[3])) {
    int64_t st[2] = {0, 0}, en[2] = {x->shape.dims[2], x->shape.dims[3]}, ax[2] = {2, 3};
    kl_attr sl[3] = {ints_of("starts", st, 2), ints_of("ends", en, 2), ints_of("axes", ax, 2)};
    back = kl_gb_node(c, KL_OP_SLICE, &back, 1, sl, 3);
  }
  dx[0] = back;
  dx[1] = weight_grad(c, g, x, t.k, t.stride, t.pad, t.dil, t.groups);
  if (n->ninputs > 2) dx[2] = bias_grad(c, n, g);
  return 0;
}

/* Each window's gradient goes to the element max_pool2d_index names: a
 * scatter-add per plane (one thread per plane), so overlapping windows
 * add up. */
int kl_grad_MAX_POOL2D(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0], *g = dy[0];
  kl_value *idx = kl_gb_node(c, KL_OP_MAX_POOL2D_INDEX, &x, 1, n->attrs, n->nattrs);
  const int64_t *d = x->shape.dims;
  int64_t planes = d[0] * d[1], hw = d[2] * d[3];
  const int64_t *o = n->outputs[0]->shape.dims;
  kl_shape ps = {2, {planes, hw}}, os = {2, {planes, o[2] * o[3]}};
  kl_value *local = kl_gb2(c, KL_OP_MOD, idx, kl_gb_scalar(c, KL_I64, (double)hw));
  kl_value *zeros = kl_gb_expand(c, kl_gb_scalar(c, x->dtype, 0), &ps);
  kl_attr at[2] = {{.name = "axis", .kind = KL_ATTR_INT, .i = 1},
                   {.name = "reduction", .kind = KL_ATTR_STRING, .s = "add"}};
  kl_value *ins[3] = {zeros, kl_gb_reshape(c, local, &os), kl_gb_reshape(c, g, &os)};
  dx[0] = kl_gb_reshape(c, kl_gb_node(c, KL_OP_SCATTER_ELEMENTS, ins, 3, at, 2), &x->shape);
  return 0;
}

/* 1 / the count each window divides by, per axis (a window's count is the
 * product of its axes' counts): its taps inside x, or inside the padded x
 * with count_include_pad, as pool_eval; 0 for an empty window. */
static void window_inverse_counts(const pool_cfg *p, int i, int64_t len, double *inv) {
  const window *w = &p->w;
  for (int64_t o = 0; o < w->out[i]; o++) {
    int64_t start = o * w->stride[i] - w->pad[i], cnt;
    if (p->include_pad) {
      cnt = taps_before(start, w->k[i], w->dil[i], len + w->pad[i + 2]);
    } else {
      int64_t first = start < 0 ? (-start + w->dil[i] - 1) / w->dil[i] : 0; /* first tap at >= 0 */
      cnt = first < w->k[i] ? taps_before(start + first * w->dil[i], w->k[i] - first, w->dil[i], len) : 0;
    }
    inv[o] = cnt > 0 ? 1.0 / (double)cnt : 0.0;
  }
}

/* Each window spreads dy / its count over its taps: dy scaled per window,
 * then a transposed convolution, plane by plane, with a kernel of ones
 * (taps in the padding or the ceil-mode overhang fall off its ends). */
int kl_grad_AVG_POOL2D(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  pool_cfg p;
  if (pool_setup(n, c->err, false, &p)) return -1;
  kl_value *x = n->inputs[0];
  const int64_t *d = x->shape.dims, *o = n->outputs[0]->shape.dims;
  double *inv = malloc(sizeof(double) * (size_t)(o[2] + o[3] + o[2] * o[3]));
  if (!inv) abort();
  double *iy = inv + o[2] * o[3], *ix = iy + o[2];
  window_inverse_counts(&p, 0, d[2], iy);
  window_inverse_counts(&p, 1, d[3], ix);
  for (int64_t r = 0; r < o[2]; r++)
    for (int64_t q = 0; q < o[3]; q++) inv[r * o[3] + q] = iy[r] * ix[q];
  int64_t os[2] = {o[2], o[3]}, ks[4] = {1, 1, p.w.k[0], p.w.k[1]};
  double one = 1;
  kl_attr w[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = inv, .n = (int)(o[2] * o[3])},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = x->dtype}, ints_of("shape", os, 2)};
  kl_value *scale = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, w, 3);
  free(inv);
  kl_attr k[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = &one, .n = 1},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = x->dtype}, ints_of("shape", ks, 4)};
  kl_value *ones = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, k, 3);
  kl_shape gs = {4, {d[0] * d[1], 1, o[2], o[3]}}, xs = {4, {d[0] * d[1], 1, d[2], d[3]}};
  kl_value *g = kl_gb_reshape(c, kl_gb2(c, KL_OP_MUL, dy[0], scale), &gs);
  dx[0] = kl_gb_reshape(c, window_back(c, &p.w, g, ones, &xs, 1), &x->shape);
  return 0;
}

int kl_grad_GLOBAL_AVG_POOL(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  const kl_value *x = n->inputs[0];
  int64_t in = kl_shape_numel(&x->shape), out = kl_shape_numel(&n->outputs[0]->shape);
  kl_value *s = kl_gb2(c, KL_OP_MUL, dy[0], kl_gb_scalar(c, dy[0]->dtype, (double)out / (double)(in ? in : 1)));
  dx[0] = kl_gb_expand(c, s, &x->shape);
  return 0;
}

/* ---- attention ---------------------------------------------------------- */
/* kv [B, Hkv, S, D] repeated for the query heads that read it: [B, Hq, S, D]. */
static kl_value *kv_heads(kl_grad_ctx *c, kl_value *kv, int64_t hq) {
  if (!kv || kv->shape.dims[1] == hq) return kv;
  const int64_t *d = kv->shape.dims;
  kl_shape one = {5, {d[0], d[1], 1, d[2], d[3]}}, all = {5, {d[0], d[1], hq / d[1], d[2], d[3]}},
           flat = {4, {d[0], hq, d[2], d[3]}};
  return kl_gb_reshape(c, kl_gb_expand(c, kl_gb_reshape(c, kv, &one), &all), &flat);
}

/* The adjoint of kv_heads: [B, Hq, S, D] summed over each kv head's group. */
static kl_value *group_sum(kl_grad_ctx *c, kl_value *g, int64_t hkv) {
  if (!g || g->shape.dims[1] == hkv) return g;
  const int64_t *d = g->shape.dims;
  kl_shape five = {5, {d[0], hkv, d[1] / hkv, d[2], d[3]}}, kv = {4, {d[0], hkv, d[2], d[3]}};
  int64_t axis = 2;
  return kl_gb_reshape(c, kl_gb_sum(c, kl_gb_reshape(c, g, &five), &axis, 1), &kv);
}

/* The same attention node giving its scores (mode 1: after scale and
 * softcap; 3: the probabilities, every mask applied). */
static kl_value *attention_scores(kl_grad_ctx *c, const kl_node *n, int mode) {
  kl_attr at[16];
  int na = 0;
  for (int i = 0; i < n->nattrs && na < 15; i++)
    if (strcmp(n->attrs[i].name, "scores") != 0) at[na++] = n->attrs[i];
  at[na++] = (kl_attr){.name = "scores", .kind = KL_ATTR_INT, .i = mode};
  return kl_gb_node(c, KL_OP_ATTENTION, n->inputs, n->ninputs, at, na);
}

/* With P the probabilities (recomputed, masks and all), S the scores:
 * dv = P^T dy, dS = P (dP - sum(dP P)) with dP = dy v^T, through the
 * softcap (1 - tanh^2), then dq = scale dS k and dk = scale dS^T q, the
 * kv heads' gradients summed over the query heads that read them.  A float
 * mask is added after the softcap: its gradient is dS on its keys. */
int kl_grad_ATTENTION(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2], *g = dy[0];
  int64_t scores = kl_attr_int(n, "scores", -1);
  if (scores != -1)
    return KL_GRAD_FAIL(c, n, "it gives its scores (scores = %lld); the output (scores = -1) "
                        "has one", (long long)scores);
  int64_t hq = q->shape.dims[1], hkv = k->shape.dims[1];
  double scale = kl_attr_float(n, "scale", 0), cap = kl_attr_float(n, "softcap", 0);
  if (scale == 0) scale = 1 / sqrt((double)q->shape.dims[3]);
  kl_value *p = attention_scores(c, n, 3);
  kl_value *ke = kv_heads(c, k, hq), *ve = kv_heads(c, v, hq);
  dx[2] = group_sum(c, mm(c, swap_last2(c, p), g), hkv);
  kl_value *dp = mm(c, g, swap_last2(c, ve));
  int64_t last = 3;
  kl_value *ds = kl_gb2(c, KL_OP_MUL, p,
                        kl_gb2(c, KL_OP_SUB, dp, kl_gb_sum(c, kl_gb2(c, KL_OP_MUL, dp, p), &last, 1)));
  attn_inputs ai = attention_inputs(n);
  if (ai.mask > 0 && n->inputs[ai.mask]->dtype != KL_BOOL) {
    const kl_value *m = n->inputs[ai.mask];
    int64_t st = 0, en = m->shape.dims[m->shape.rank - 1];
    kl_attr sl[3] = {ints_of("starts", &st, 1), ints_of("ends", &en, 1), ints_of("axes", &last, 1)};
    dx[ai.mask] = en == k->shape.dims[2] ? ds : kl_gb_node(c, KL_OP_SLICE, &ds, 1, sl, 3);
  }
  if (cap > 0) {
    kl_value *t = kl_gb2(c, KL_OP_MUL, attention_scores(c, n, 1), kl_gb_scalar(c, q->dtype, 1 / cap));
    ds = kl_gb2(c, KL_OP_MUL, ds, kl_gb2(c, KL_OP_SUB, kl_gb_scalar(c, q->dtype, 1), kl_gb2(c, KL_OP_MUL, t, t)));
  }
  ds = kl_gb2(c, KL_OP_MUL, ds, kl_gb_scalar(c, q->dtype, scale));
  dx[0] = mm(c, ds, ke);
  dx[1] = group_sum(c, mm(c, swap_last2(c, ds), q), hkv);
  return 0;
}

/* ---- col2im -------------------------------------------------------------- */
/* col2im adds each block element into the image: its gradient reads each
 * back (im2col).  A gather along the flattened image, which has one zero
 * appended for the elements that fell in the padding. */
int kl_grad_COL2IM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_col2im_geom g;
  if (col2im_setup(n, c->err, &g)) return -1;
  const kl_value *x = n->inputs[0];
  int s = g.s;
  int64_t k = 1, l = x->shape.dims[2], img = 1, nb = x->shape.dims[0];
  int64_t ch = n->outputs[0]->shape.dims[1];
  for (int i = 0; i < s; i++) k *= g.block[i], img *= g.image[i];
  if (k * l > INT32_MAX)
    return KL_GRAD_FAIL(c, n, "%lld block elements are too many for its index table",
                        (long long)(k * l));
  int64_t cells = k * l;
  double *at = malloc(sizeof(double) * (size_t)(cells > 0 ? cells : 1));
  if (!at) abort();
  for (int64_t b = 0; b < k; b++)
    for (int64_t q = 0; q < l; q++) {
      int64_t pos;
      at[b * l + q] = col2im_position(&g, b, q, &pos) ? (double)pos : (double)img;
    }
  int64_t is[2] = {k, l};
  kl_attr ka[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = at, .n = (int)cells},
                   {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = KL_I64}, ints_of("shape", is, 2)};
  kl_value *idx = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, ka, 3);
  free(at);
  kl_shape flat = {3, {nb, ch, img}}, zs = {3, {nb, ch, 1}};
  kl_value *parts[2] = {kl_gb_reshape(c, dy[0], &flat),
                        kl_gb_expand(c, kl_gb_scalar(c, x->dtype, 0), &zs)};
  kl_attr cat = {.name = "axis", .kind = KL_ATTR_INT, .i = 2};
  kl_value *ins[2] = {kl_gb_node(c, KL_OP_CONCAT, parts, 2, &cat, 1), idx};
  kl_value *cols = kl_gb_node(c, KL_OP_GATHER, ins, 2, &cat, 1); /* [N, C, k, l] */
  dx[0] = kl_gb_reshape(c, cols, &x->shape);
  return 0;
}

/* ---- dft ------------------------------------------------------------------ */
/* dft is linear: y[o, k, i, :] = M x[o, :, i, :] with M [nout * cout,
 * m * cin] the twiddles as kl_eval_DFT sums them.  dx = M^T dy: dy with the
 * transform axis and the complex axis last, flattened, times M, put back. */
int kl_grad_DFT(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_dft_geom g;
  if (dft_setup(n, c->err, &g)) return -1;
  const kl_value *x = n->inputs[0];
  int64_t rows = g.nout * g.cout, cols = g.m * g.cin;
  if ((double)rows * (double)cols > (double)INT32_MAX)
    return KL_GRAD_FAIL(c, n, "a transform of length %lld is too large for its matrix",
                        (long long)g.n);
  double *m = calloc((size_t)(rows * cols), sizeof *m);
  if (!m) abort();
  bool irfft = g.inverse && g.onesided;
  int64_t terms = irfft ? g.n / 2 + 1 : g.n;
  if (terms > g.m) terms = g.m;
  double sign = g.inverse ? 1.0 : -1.0, scale = g.inverse ? 1.0 / (double)g.n : 1.0;
  for (int64_t k = 0; k < g.nout; k++)
    for (int64_t t = 0; t < terms; t++) {
      double a = DFT_TWO_PI * (double)((k * t) % g.n) / (double)g.n;
      double co = cos(a) * scale, si = sign * sin(a) * scale;
      double w = irfft && t != 0 && 2 * t != g.n ? 2.0 : 1.0;
      double *re = m + (k * g.cout) * cols + t * g.cin;
      re[0] = w * co;
      if (g.cin == 2) re[1] = -w * si;
      if (g.cout == 2) {
        double *im = re + cols;
        im[0] = si;
        if (g.cin == 2) im[1] = co;
      }
    }
  int64_t ms[2] = {rows, cols};
  kl_attr ka[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = m, .n = (int)(rows * cols)},
                   {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = x->dtype}, ints_of("shape", ms, 2)};
  kl_value *mat = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, ka, 3);
  free(m);
  int64_t p4[4] = {0, 2, 1, 3};
  kl_shape g4 = {4, {g.outer, g.nout, g.inner, g.cout}}, g3 = {3, {g.outer, g.inner, rows}},
           x4 = {4, {g.outer, g.inner, g.m, g.cin}};
  kl_value *t = kl_gb_reshape(c, kl_gb_transpose(c, kl_gb_reshape(c, dy[0], &g4), p4), &g3);
  t = kl_gb_reshape(c, mm(c, t, mat), &x4);
  dx[0] = kl_gb_reshape(c, kl_gb_transpose(c, t, p4), &x->shape);
  return 0;
}

/* ---- linear_attention ----------------------------------------------------- */
static kl_value *heads_first(kl_grad_ctx *c, kl_value *v, int64_t heads) {
  if (!v) return NULL;
  const int64_t *d = v->shape.dims;
  kl_shape s = {4, {d[0], d[1], heads, d[2] / heads}};
  int64_t p[4] = {0, 2, 1, 3};
  return kl_gb_transpose(c, kl_gb_reshape(c, v, &s), p);
}

static kl_value *heads_back(kl_grad_ctx *c, kl_value *v, const kl_shape *to) {
  int64_t p[4] = {0, 2, 1, 3};
  return kl_gb_reshape(c, kl_gb_transpose(c, v, p), to);
}

static kl_value *lower(kl_grad_ctx *c, kl_value *v) {
  kl_attr a = {.name = "upper", .kind = KL_ATTR_INT, .i = 0};
  return kl_gb_node(c, KL_OP_TRILU, &v, 1, &a, 1);
}

static kl_value *add_or(kl_grad_ctx *c, kl_value *a, kl_value *b) {
  return a ? (b ? kl_gb2(c, KL_OP_ADD, a, b) : a) : b;
}

/* The "linear" rule unrolled: per head, y = scale (q S0 + tril(q k^T) v)
 * and state = S0 + k^T v, so the gradients are matmuls with the causal
 * (lower) triangle, the kv heads' summed over the query heads reading
 * them.  The gated and delta rules' recurrences are refused by name. */
int kl_grad_LINEAR_ATTENTION(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  lin_attn a;
  if (linear_attention_layout(n, c->err, &a)) return -1;
  if (a.gated || a.delta)
    return KL_GRAD_FAIL(c, n, "rule \"%s\"; \"linear\" has one", kl_attr_string(n, "rule", ""));
  double scale = kl_attr_float(n, "scale", 0);
  if (scale == 0) scale = 1 / sqrt((double)a.dk);
  kl_value *q = heads_first(c, n->inputs[0], a.hq), *k = heads_first(c, n->inputs[1], a.hkv);
  kl_value *v = heads_first(c, n->inputs[2], a.hkv);
  kl_value *past = a.past > 0 ? n->inputs[a.past] : NULL;
  kl_value *ke = kv_heads(c, k, a.hq), *ve = kv_heads(c, v, a.hq);
  kl_value *dq = NULL, *dk = NULL, *dv = NULL, *dpast = NULL;
  kl_value *sc = kl_gb_scalar(c, n->inputs[0]->dtype, scale);
  if (dy[0]) {
    kl_value *g = heads_first(c, dy[0], a.hq);
    kl_value *att = lower(c, mm(c, q, swap_last2(c, ke)));
    kl_value *datt = kl_gb2(c, KL_OP_MUL, lower(c, mm(c, g, swap_last2(c, ve))), sc);
    dq = mm(c, datt, ke);
    dk = group_sum(c, mm(c, swap_last2(c, datt), q), a.hkv);
    dv = group_sum(c, kl_gb2(c, KL_OP_MUL, mm(c, swap_last2(c, att), g), sc), a.hkv);
    if (past) {
      kl_value *qg = kl_gb2(c, KL_OP_MUL, mm(c, swap_last2(c, q), g), sc); /* [B, Hq, Dk, Dv] */
      dq = kl_gb2(c, KL_OP_ADD, dq, kl_gb2(c, KL_OP_MUL, mm(c, g, swap_last2(c, kv_heads(c, past, a.hq))), sc));
      dpast = group_sum(c, qg, a.hkv);
    }
  }
  if (dy[1]) {
    dk = add_or(c, dk, mm(c, v, swap_last2(c, dy[1])));
    dv = add_or(c, dv, mm(c, k, dy[1]));
    dpast = add_or(c, dpast, dy[1]);
  }
  dx[0] = dq ? heads_back(c, dq, &n->inputs[0]->shape) : NULL;
  dx[1] = dk ? heads_back(c, dk, &n->inputs[1]->shape) : NULL;
  dx[2] = dv ? heads_back(c, dv, &n->inputs[2]->shape) : NULL;
  if (past) dx[a.past] = dpast;
  return 0;
}

/* ---- deform_conv2d -------------------------------------------------------- */
#define DADD(a, b) kl_gb2(c, KL_OP_ADD, (a), (b))
#define DSUB(a, b) kl_gb2(c, KL_OP_SUB, (a), (b))
#define DMUL(a, b) kl_gb2(c, KL_OP_MUL, (a), (b))
#define DK(v) kl_gb_scalar(c, t, (v))

/* A [taps, P] constant: each tap's undeformed position on one axis. */
static kl_value *deform_base(kl_grad_ctx *c, const window *w, int axis, kl_dtype t) {
  int64_t taps = w->k[0] * w->k[1], plane = w->out[0] * w->out[1];
  double *v = malloc(sizeof(double) * (size_t)(taps * plane));
  if (!v) abort();
  for (int64_t tp = 0; tp < taps; tp++)
    for (int64_t p = 0; p < plane; p++) {
      int64_t o = axis ? p % w->out[1] : p / w->out[1], k = axis ? tp % w->k[1] : tp / w->k[1];
      v[tp * plane + p] = (double)(o * w->stride[axis] - w->pad[axis] + k * w->dil[axis]);
    }
  int64_t s[2] = {taps, plane};
  kl_attr a[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = v, .n = (int)(taps * plane)},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = t}, ints_of("shape", s, 2)};
  kl_value *r = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, a, 3);
  free(v);
  return r;
}

/* deform_conv2d as the interpreter computes it, rebuilt from IR ops: each
 * tap samples x bilinearly (zero outside) at its place moved by the
 * offsets, times the mask, and the weights contract those columns per
 * group.  The columns' adjoint (w^T dy) then goes to x (a scatter-add at
 * the four corners), to the offsets (the corner weights' slopes), to the
 * mask (the samples); dw is dy times the columns, db dy summed. */
int kl_grad_DEFORM_CONV2D(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  deform_cfg d;
  if (deform_setup(n, c->err, &d)) return -1;
  kl_value *x = n->inputs[0], *wt = n->inputs[1], *off = n->inputs[2];
  kl_value *mask = n->ninputs > 4 ? n->inputs[4] : NULL;
  kl_dtype t = x->dtype;
  const int64_t *xd = x->shape.dims;
  int64_t nb = xd[0], ch = xd[1], h = xd[2], wi = xd[3], m = wt->shape.dims[0];
  int64_t g = d.groups, og = d.ogroups, cpg = ch / g, mpg = m / g, cpo = ch / og;
  int64_t taps = d.w.k[0] * d.w.k[1], plane = d.w.out[0] * d.w.out[1];
  kl_shape o5 = {5, {nb, og, taps, 2, plane}}, s4 = {4, {nb, og, taps, plane}},
           x4 = {4, {nb, og, cpo, h * wi}}, i4 = {4, {nb, og, 1, taps * plane}},
           e4 = {4, {nb, og, cpo, taps * plane}}, v5 = {5, {nb, og, cpo, taps, plane}};
  kl_value *o = kl_gb_reshape(c, off, &o5);
  kl_value *coord[2];
  for (int a = 0; a < 2; a++) {
    int64_t st = a, en = a + 1, ax = 3;
    kl_attr sl[3] = {ints_of("starts", &st, 1), ints_of("ends", &en, 1), ints_of("axes", &ax, 1)};
    coord[a] = DADD(kl_gb_reshape(c, kl_gb_node(c, KL_OP_SLICE, &o, 1, sl, 3), &s4),
                    deform_base(c, &d.w, a, t));
  }
  kl_value *fl[2], *fr[2];
  for (int a = 0; a < 2; a++) {
    fl[a] = kl_gb1(c, KL_OP_FLOOR, coord[a]);
    fr[a] = DSUB(coord[a], fl[a]);
  }
  kl_value *xf = kl_gb_reshape(c, x, &x4);
  kl_value *idx[4], *wgt[4], *dwy[4], *dwx[4], *val[4], *samp = NULL;
  for (int corner = 0; corner < 4; corner++) {
    int i = corner / 2, j = corner % 2;
    kl_value *yy = i ? DADD(fl[0], DK(1)) : fl[0], *xx = j ? DADD(fl[1], DK(1)) : fl[1];
    kl_value *inside = kl_gb2(c, KL_OP_LOGICAL_AND,
                              kl_gb2(c, KL_OP_LOGICAL_AND, kl_gb2(c, KL_OP_GE, yy, DK(0)),
                                     kl_gb2(c, KL_OP_LT, yy, DK((double)h))),
                              kl_gb2(c, KL_OP_LOGICAL_AND, kl_gb2(c, KL_OP_GE, xx, DK(0)),
                                     kl_gb2(c, KL_OP_LT, xx, DK((double)wi))));
    kl_value *wy = i ? fr[0] : DSUB(DK(1), fr[0]), *wx = j ? fr[1] : DSUB(DK(1), fr[1]);
    wgt[corner] = kl_gb_mask(c, inside, DMUL(wy, wx));
    dwy[corner] = kl_gb_mask(c, inside, i ? wx : kl_gb1(c, KL_OP_NEG, wx));
    dwx[corner] = kl_gb_mask(c, inside, j ? wy : kl_gb1(c, KL_OP_NEG, wy));
    kl_value *flat = DADD(DMUL(kl_gb2(c, KL_OP_MINIMUM, kl_gb2(c, KL_OP_MAXIMUM, yy, DK(0)), DK((double)h - 1)),
                               DK((double)wi)),
                          kl_gb2(c, KL_OP_MINIMUM, kl_gb2(c, KL_OP_MAXIMUM, xx, DK(0)), DK((double)wi - 1)));
    idx[corner] = kl_gb_expand(c, kl_gb_reshape(c, kl_gb_cast(c, flat, KL_I64), &i4), &e4);
    kl_value *ins[2] = {xf, idx[corner]};
    kl_attr a3 = {.name = "axis", .kind = KL_ATTR_INT, .i = 3};
    val[corner] = kl_gb_reshape(c, kl_gb_node(c, KL_OP_GATHER_ELEMENTS, ins, 2, &a3, 1), &v5);
    kl_shape w5 = {5, {nb, og, 1, taps, plane}};
    kl_value *term = DMUL(val[corner], kl_gb_reshape(c, wgt[corner], &w5));
    samp = samp ? DADD(samp, term) : term; /* [N, og, cpo, taps, P] */
  }
  kl_shape m5 = {5, {nb, og, 1, taps, plane}}, cols4 = {4, {nb, g, cpg * taps, plane}},
           w3 = {3, {g, mpg, cpg * taps}}, y4 = {4, {nb, g, mpg, plane}};
  kl_value *mk = mask ? kl_gb_reshape(c, mask, &m5) : NULL;
  kl_value *cols = kl_gb_reshape(c, mk ? DMUL(samp, mk) : samp, &cols4);
  kl_value *gy = kl_gb_reshape(c, dy[0], &y4);
  kl_value *wg = kl_gb_reshape(c, wt, &w3);
  int64_t n0 = 0;
  dx[1] = kl_gb_reshape(c, kl_gb_sum(c, mm(c, gy, swap_last2(c, cols)), &n0, 1), &wt->shape);
  if (n->ninputs > 3) {
    int64_t axes[3] = {0, 2, 3};
    dx[3] = kl_gb_reshape(c, kl_gb_sum(c, dy[0], axes, 3), &n->inputs[3]->shape);
  }
  kl_value *dsm = kl_gb_reshape(c, mm(c, swap_last2(c, wg), gy), &v5); /* d(samples * mask) */
  int64_t cax = 2;
  kl_shape ms = mask ? mask->shape : (kl_shape){0};
  if (mask) dx[4] = kl_gb_reshape(c, kl_gb_sum(c, DMUL(dsm, samp), &cax, 1), &ms);
  kl_value *ds = mk ? DMUL(dsm, mk) : dsm;
  kl_value *places[4], *updates[4], *dcy = NULL, *dcx = NULL;
  kl_shape w5 = {5, {nb, og, 1, taps, plane}};
  for (int corner = 0; corner < 4; corner++) {
    places[corner] = idx[corner];
    updates[corner] = kl_gb_reshape(c, DMUL(ds, kl_gb_reshape(c, wgt[corner], &w5)), &e4);
    kl_value *dv = kl_gb_reshape(c, kl_gb_sum(c, DMUL(ds, val[corner]), &cax, 1), &s4);
    dcy = dcy ? DADD(dcy, DMUL(dv, dwy[corner])) : DMUL(dv, dwy[corner]);
    dcx = dcx ? DADD(dcx, DMUL(dv, dwx[corner])) : DMUL(dv, dwx[corner]);
  }
  kl_attr a3[2] = {{.name = "axis", .kind = KL_ATTR_INT, .i = 3},
                   {.name = "reduction", .kind = KL_ATTR_STRING, .s = "add"}};
  kl_value *sins[3] = {kl_gb_expand(c, kl_gb_scalar(c, t, 0), &x4),
                       kl_gb_node(c, KL_OP_CONCAT, places, 4, a3, 1),
                       kl_gb_node(c, KL_OP_CONCAT, updates, 4, a3, 1)};
  dx[0] = kl_gb_reshape(c, kl_gb_node(c, KL_OP_SCATTER_ELEMENTS, sins, 3, a3, 2), &x->shape);
  kl_shape c5 = {5, {nb, og, taps, 1, plane}};
  kl_value *pair[2] = {kl_gb_reshape(c, dcy, &c5), kl_gb_reshape(c, dcx, &c5)};
  kl_value *dof = kl_gb_node(c, KL_OP_CONCAT, pair, 2, a3, 1);
  dx[2] = kl_gb_reshape(c, dof, &off->shape);
  return 0;
}
#undef DADD
#undef DSUB
#undef DMUL
#undef DK
