/* onnx_ops_nn.c - ONNX neural-network ops: contractions, convolution,
 * pooling, normalisation, softmax, losses, resampling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"

/* ---- small emitters (NULL in, NULL out: the error is already set) ---- */

static kl_value *need_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k) {
  kl_value *v = kl_onnx_input(c, n, k);
  if (!v) kl_onnx_fail(c, "input %d is missing", k);
  return v;
}

static kl_value *unary(kl_onnx_ctx *c, kl_op op, kl_value *x, const kl_attr *a,
                       int na) {
  return x ? kl_onnx_emit(c, op, &x, 1, a, na) : NULL;
}

static kl_value *binary(kl_onnx_ctx *c, kl_op op, kl_value *a, kl_value *b) {
  kl_value *ins[2] = {a, b};
  return a && b ? kl_onnx_emit(c, op, ins, 2, NULL, 0) : NULL;
}

/* x as dtype t (x itself when it already is). */
static kl_value *cast(kl_onnx_ctx *c, kl_value *x, kl_dtype t) {
  if (!x || x->dtype == t) return x;
  kl_attr a = kl_adt("to", t);
  return unary(c, KL_OP_CAST, x, &a, 1);
}

/* x op scalar, the scalar in x's dtype. */
static kl_value *with_scalar(kl_onnx_ctx *c, kl_op op, kl_value *x, double v) {
  return x ? binary(c, op, x, kl_onnx_scalar(c, x->dtype, v)) : NULL;
}

static kl_value *reshape(kl_onnx_ctx *c, kl_value *x, const int64_t *dims,
                         int rank) {
  if (!x) return NULL;
  kl_shape s = {rank, {0}};
  memcpy(s.dims, dims, sizeof(int64_t) * (size_t)rank);
  if (kl_shape_equal(&s, &x->shape)) return x;
  kl_attr a = kl_ais("shape", dims, rank);
  return unary(c, KL_OP_RESHAPE, x, &a, 1);
}

static kl_value *transpose(kl_onnx_ctx *c, kl_value *x, const int64_t *perm) {
  if (!x) return NULL;
  bool same = true;
  for (int i = 0; i < x->shape.rank; i++) same &= perm[i] == i;
  if (same) return x;
  kl_attr a = kl_ais("perm", perm, x->shape.rank);
  return unary(c, KL_OP_TRANSPOSE, x, &a, 1);
}

/* reduce_* over axes (keepdims as given). */
static kl_value *reduce(kl_onnx_ctx *c, kl_op op, kl_value *x,
                        const int64_t *axes, int naxes, bool keep) {
  kl_attr a[2] = {kl_ais("axes", axes, naxes), kl_ai("keepdims", keep)};
  return unary(c, op, x, a, 2);
}

/* Axes [from, rank) of x. */
static int tail_axes(const kl_value *x, int from, int64_t *axes) {
  int k = 0;
  for (int d = from; d < x->shape.rank; d++) axes[k++] = d;
  return k;
}

/* x with a size-1 axis inserted before axis 2 ([N, C, L] -> [N, C, 1, L]):
 * how 1-D convolutions and pools reuse the 2-D IR ops. */
static kl_value *lift_1d(kl_onnx_ctx *c, kl_value *x) {
  if (!x) return NULL;
  int64_t d[4] = {x->shape.dims[0], x->shape.dims[1], 1, x->shape.dims[2]};
  return reshape(c, x, d, 4);
}

static kl_value *drop_1d(kl_onnx_ctx *c, kl_value *y) {
  if (!y) return NULL;
  int64_t d[3] = {y->shape.dims[0], y->shape.dims[1], y->shape.dims[3]};
  return reshape(c, y, d, 3);
}

/* v[C] as [C, 1, ..., 1] for broadcasting against x[N, C, ...]. */
static kl_value *per_channel(kl_onnx_ctx *c, kl_value *v, int xrank) {
  if (!v) return NULL;
  int64_t d[KL_MAX_RANK];
  d[0] = kl_shape_numel(&v->shape);
  for (int i = 1; i < xrank - 1; i++) d[i] = 1;
  return reshape(c, v, d, xrank - 1);
}

/* 1 when output k is requested. */
static bool wants_output(const Onnx__NodeProto *n, int k) {
  return k < (int)n->n_output && n->output[k] && *n->output[k];
}

/* ---- MatMul, Gemm ---------------------------------------------------- */

static int convert_matmul(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *y = binary(c, KL_OP_MATMUL, need_input(c, n, 0), need_input(c, n, 1));
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* C is required before opset 11; the `broadcast` flag of opsets < 7 only
 * allowed what the IR's broadcasting of C does anyway. */
static int convert_gemm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[3] = {need_input(c, n, 0), need_input(c, n, 1), kl_onnx_input(c, n, 2)};
  if (!ins[0] || !ins[1]) return -1;
  if (!ins[2] && c->opset < 11) return kl_onnx_fail(c, "input C is required before opset 11");
  kl_attr a[4] = {kl_af("alpha", kl_onnx_attr_float(n, "alpha", 1.0)),
                  kl_af("beta", kl_onnx_attr_float(n, "beta", 1.0)),
                  kl_ai("trans_a", kl_onnx_attr_int(n, "transA", 0)),
                  kl_ai("trans_b", kl_onnx_attr_int(n, "transB", 0))};
  kl_value *y = kl_onnx_emit(c, KL_OP_GEMM, ins, ins[2] ? 3 : 2, a, 4);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- sliding windows: Conv, ConvTranspose, pools ---------------------- */

enum { MAX_SP = 3 }; /* spatial axes handled: 1-D, 2-D, 3-D */

/* Window geometry of an ONNX conv/pool node over `nsp` spatial axes; pads
 * are [begin..., end...] as ONNX. */
typedef struct {
  int nsp;
  int64_t k[MAX_SP], stride[MAX_SP], dil[MAX_SP], pad[2 * MAX_SP];
} window;

/* An ints attribute of exactly `len` entries in [lo, KL_MAX_NUMEL] (which
 * keeps window arithmetic far from overflow), or `dv` everywhere when
 * absent. */
static int ints_attr(kl_onnx_ctx *c, const Onnx__NodeProto *n, const char *name, int len,
                     int64_t lo, int64_t dv, int64_t *out) {
  const int64_t *v;
  int got = kl_onnx_attr_ints(n, name, &v);
  if (got < 0) {
    for (int i = 0; i < len; i++) out[i] = dv;
    return 0;
  }
  if (got != len) return kl_onnx_fail(c, "%s must have %d entries, got %d", name, len, got);
  for (int i = 0; i < len; i++) {
    if (v[i] < lo || v[i] > KL_MAX_NUMEL)
      return kl_onnx_fail(c, "%s[%d] = %lld is out of range [%lld, %lld]", name, i,
                          (long long)v[i], (long long)lo, (long long)KL_MAX_NUMEL);
    out[i] = v[i];
  }
  return 0;
}

static const char *auto_pad(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const char *s = kl_onnx_attr_string(c, n, "auto_pad", "NOTSET");
  return *s ? s : "NOTSET";
}

/* Reads strides, dilations, pads and auto_pad for input x; w->k must be
 * set.  SAME_* pads make the output ceil(in / stride) long, the odd pad
 * at the end (UPPER) or the beginning (LOWER). */
static int read_window(kl_onnx_ctx *c, const Onnx__NodeProto *n, const kl_value *x,
                       bool has_dil, window *w) {
  int s = w->nsp;
  if (ints_attr(c, n, "strides", s, 1, 1, w->stride) ||
      ints_attr(c, n, "pads", 2 * s, 0, 0, w->pad))
    return -1;
  if (has_dil) {
    if (ints_attr(c, n, "dilations", s, 1, 1, w->dil)) return -1;
  } else {
    for (int i = 0; i < s; i++) w->dil[i] = 1;
  }
  const char *ap = auto_pad(c, n);
  if (!strcmp(ap, "VALID")) {
    for (int i = 0; i < 2 * s; i++) w->pad[i] = 0;
  } else if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
    for (int i = 0; i < s; i++) {
      int64_t in = x->shape.dims[2 + i], out = (in + w->stride[i] - 1) / w->stride[i];
      int64_t total = (out - 1) * w->stride[i] + (w->k[i] - 1) * w->dil[i] + 1 - in;
      if (total < 0) total = 0;
      bool upper = ap[5] == 'U';
      w->pad[i] = upper ? total / 2 : total - total / 2;
      w->pad[s + i] = total - w->pad[i];
    }
  } else if (strcmp(ap, "NOTSET")) {
    return kl_onnx_fail(c, "auto_pad \"%s\" is not NOTSET, SAME_UPPER, SAME_LOWER or VALID", ap);
  }
  return 0;
}

/* The 2-D IR attributes (pads [t, l, b, r]) of spatial axes a0 (H) and a1
 * (W) of w; a0 < 0 means a size-1 H axis with no window. */
static void window_2d(const window *w, int a0, int a1, int64_t *k, int64_t *st,
                      int64_t *dil, int64_t *pads) {
  k[0] = a0 < 0 ? 1 : w->k[a0];
  st[0] = a0 < 0 ? 1 : w->stride[a0];
  dil[0] = a0 < 0 ? 1 : w->dil[a0];
  pads[0] = a0 < 0 ? 0 : w->pad[a0];
  pads[2] = a0 < 0 ? 0 : w->pad[w->nsp + a0];
  k[1] = w->k[a1];
  st[1] = w->stride[a1];
  dil[1] = w->dil[a1];
  pads[1] = w->pad[a1];
  pads[3] = w->pad[w->nsp + a1];
}

static int check_spatial(kl_onnx_ctx *c, const kl_value *x, int *nsp) {
  char b[256];
  *nsp = x->shape.rank - 2;
  if (*nsp < 1 || *nsp > MAX_SP)
    return kl_onnx_fail(c, "input must be [N, C, d1..dk] with 1 <= k <= %d, got %s%s", MAX_SP,
                        kl_dtype_name(x->dtype), kl_shape_str(&x->shape, b, sizeof b));
  return 0;
}

/* ---- Conv ------------------------------------------------------------ */

static kl_value *conv2d(kl_onnx_ctx *c, kl_value *x, kl_value *wt, kl_value *b,
                        const window *w, int a0, int a1, int64_t groups) {
  if (!x || !wt) return NULL;
  int64_t k[2], st[2], dil[2], pads[4];
  window_2d(w, a0, a1, k, st, dil, pads);
  kl_attr a[4] = {kl_ais("strides", st, 2), kl_ais("pads", pads, 4),
                  kl_ais("dilations", dil, 2), kl_ai("groups", groups)};
  kl_value *ins[3] = {x, wt, b};
  return kl_onnx_emit(c, KL_OP_CONV2D, ins, b ? 3 : 2, a, 4);
}

/* 3-D convolution as a sum over the kernel's depth taps of 2-D
 * convolutions: depth tap j reads input depths j*dil + o*stride, which a
 * strided slice of the depth-major input gathers into the batch axis. */
static kl_value *conv3d(kl_onnx_ctx *c, kl_value *x, kl_value *wt, kl_value *b,
                        const window *w, int64_t groups) {
  const int64_t *xd = x->shape.dims, *wd = wt->shape.dims;
  int64_t nb = xd[0], ch = xd[1], m = wd[0];
  int64_t padded = xd[2] + w->pad[0] + w->pad[3], ext = (w->k[0] - 1) * w->dil[0] + 1;
  if (padded < ext) {
    kl_onnx_fail(c, "the kernel depth %lld (dilation %lld) does not fit the padded depth %lld",
                 (long long)w->k[0], (long long)w->dil[0], (long long)padded);
    return NULL;
  }
  int64_t od = (padded - ext) / w->stride[0] + 1;
  if (w->pad[0] || w->pad[3]) {
    int64_t pads[10] = {0, 0, w->pad[0], 0, 0, 0, 0, w->pad[3], 0, 0};
    kl_attr a = kl_ais("pads", pads, 10);
    x = unary(c, KL_OP_PAD, x, &a, 1);
  }
  static const int64_t depth_major[5] = {0, 2, 1, 3, 4};
  x = transpose(c, x, depth_major);
  kl_value *acc = NULL;
  for (int64_t j = 0; j < w->k[0] && x; j++) {
    int64_t start = j * w->dil[0], end = start + (od - 1) * w->stride[0] + 1, one = 1;
    int64_t ax1 = 1, ax2 = 2, jn = j + 1;
    kl_attr sa[4] = {kl_ais("starts", &start, 1), kl_ais("ends", &end, 1),
                     kl_ais("axes", &ax1, 1), kl_ais("steps", &w->stride[0], 1)};
    int64_t xs[4] = {nb * od, ch, xd[3], xd[4]};
    kl_value *xj = reshape(c, unary(c, KL_OP_SLICE, x, sa, 4), xs, 4);
    kl_attr wa[4] = {kl_ais("starts", &j, 1), kl_ais("ends", &jn, 1),
                     kl_ais("axes", &ax2, 1), kl_ais("steps", &one, 1)};
    int64_t ws[4] = {m, wd[1], wd[3], wd[4]};
    kl_value *wj = reshape(c, unary(c, KL_OP_SLICE, wt, wa, 4), ws, 4);
    kl_value *yj = conv2d(c, xj, wj, j == 0 ? b : NULL, w, 1, 2, groups);
    acc = acc ? binary(c, KL_OP_ADD, acc, yj) : yj;
  }
  if (!acc) return NULL;
  int64_t ys[5] = {nb, od, m, acc->shape.dims[2], acc->shape.dims[3]};
  static const int64_t channel_major[5] = {0, 2, 1, 3, 4};
  return transpose(c, reshape(c, acc, ys, 5), channel_major);
}

static int convert_conv(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *wt = need_input(c, n, 1), *b = kl_onnx_input(c, n, 2);
  window w = {0};
  if (!x || !wt || check_spatial(c, x, &w.nsp)) return -1;
  if (wt->shape.rank != x->shape.rank)
    return kl_onnx_fail(c, "the weight must have the rank of the input (%d), got %d",
                        x->shape.rank, wt->shape.rank);
  for (int i = 0; i < w.nsp; i++) w.k[i] = wt->shape.dims[2 + i];
  int64_t ks[MAX_SP];
  if (ints_attr(c, n, "kernel_shape", w.nsp, 1, 0, ks)) return -1;
  for (int i = 0; i < w.nsp; i++)
    if (ks[i] && ks[i] != w.k[i])
      return kl_onnx_fail(c, "kernel_shape[%d] = %lld differs from the weight's %lld", i,
                          (long long)ks[i], (long long)w.k[i]);
  if (read_window(c, n, x, true, &w)) return -1;
  int64_t groups = kl_onnx_attr_int(n, "group", 1);
  kl_value *y;
  if (w.nsp == 1) y = drop_1d(c, conv2d(c, lift_1d(c, x), lift_1d(c, wt), b, &w, -1, 0, groups));
  else if (w.nsp == 2) y = conv2d(c, x, wt, b, &w, 0, 1, groups);
  else y = conv3d(c, x, wt, b, &w, groups);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- ConvTranspose --------------------------------------------------- */

static kl_value *conv_transpose2d(kl_onnx_ctx *c, kl_value *x, kl_value *wt, kl_value *b,
                                  const window *w, int a0, int a1, const int64_t *opad,
                                  int64_t groups) {
  if (!x || !wt) return NULL;
  int64_t k[2], st[2], dil[2], pads[4], op2[2] = {a0 < 0 ? 0 : opad[a0], opad[a1]};
  window_2d(w, a0, a1, k, st, dil, pads);
  kl_attr a[5] = {kl_ais("strides", st, 2), kl_ais("pads", pads, 4), kl_ais("dilations", dil, 2),
                  kl_ai("groups", groups), kl_ais("output_padding", op2, 2)};
  kl_value *ins[3] = {x, wt, b};
  return kl_onnx_emit(c, KL_OP_CONV_TRANSPOSE2D, ins, b ? 3 : 2, a, 5);
}

/* IR pad of x (rank r) on axis `ax` only; negative values crop. */
static kl_value *pad_axis(kl_onnx_ctx *c, kl_value *x, int ax, int64_t begin, int64_t end) {
  if (!x || (!begin && !end)) return x;
  int r = x->shape.rank;
  int64_t pads[2 * KL_MAX_RANK] = {0};
  pads[ax] = begin;
  pads[r + ax] = end;
  kl_attr a = kl_ais("pads", pads, 2 * r);
  return unary(c, KL_OP_PAD, x, &a, 1);
}

/* 3-D transposed convolution (no bias) as a sum over the kernel's depth
 * taps: tap j sends input depth i to output depth i*stride + j*dil, so
 * its 2-D result, spread out by the stride with zeros and shifted by
 * j*dil, adds into the full-depth output, which the depth pads crop. */
static kl_value *conv_transpose3d(kl_onnx_ctx *c, kl_value *x, kl_value *wt, const window *w,
                                  const int64_t *opad, int64_t groups) {
  const int64_t *xd = x->shape.dims, *wd = wt->shape.dims;
  int64_t nb = xd[0], depth = xd[2], sd = w->stride[0];
  int64_t full = sd * (depth - 1) + w->dil[0] * (w->k[0] - 1) + 1 + opad[0];
  static const int64_t depth_major[5] = {0, 2, 1, 3, 4};
  int64_t planes[4] = {nb * depth, xd[1], xd[3], xd[4]};
  kl_value *xt = reshape(c, transpose(c, x, depth_major), planes, 4), *acc = NULL;
  int64_t m = 0, oh = 0, ow = 0;
  for (int64_t j = 0; j < w->k[0] && xt; j++) {
    int64_t jn = j + 1, ax = 2, one = 1;
    kl_attr sa[4] = {kl_ais("starts", &j, 1), kl_ais("ends", &jn, 1), kl_ais("axes", &ax, 1),
                     kl_ais("steps", &one, 1)};
    int64_t ws[4] = {wd[0], wd[1], wd[3], wd[4]};
    kl_value *wj = reshape(c, unary(c, KL_OP_SLICE, wt, sa, 4), ws, 4);
    kl_value *yj = conv_transpose2d(c, xt, wj, NULL, w, 1, 2, opad, groups);
    if (!yj) return NULL;
    m = yj->shape.dims[1], oh = yj->shape.dims[2], ow = yj->shape.dims[3];
    int64_t rows[4] = {nb, depth, 1, m * oh * ow}, flat[3] = {nb, depth * sd, m * oh * ow};
    kl_value *spread = reshape(c, pad_axis(c, reshape(c, yj, rows, 4), 2, 0, sd - 1), flat, 3);
    spread = pad_axis(c, spread, 1, j * w->dil[0], full - j * w->dil[0] - depth * sd);
    acc = acc ? binary(c, KL_OP_ADD, acc, spread) : spread;
  }
  acc = pad_axis(c, acc, 1, -w->pad[0], -w->pad[3]);
  if (!acc) return NULL;
  int64_t ys[5] = {nb, acc->shape.dims[1], m, oh, ow};
  return transpose(c, reshape(c, acc, ys, 5), depth_major);
}

/* Pads from output_shape (or auto_pad SAME_*, whose output is in *
 * stride), as the ONNX reference: the total padding splits with the odd
 * one at the beginning unless SAME_UPPER; it is negative when the output
 * is larger than the full one. */
static int convert_conv_transpose(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *wt = need_input(c, n, 1), *b = kl_onnx_input(c, n, 2);
  window w = {0};
  if (!x || !wt || check_spatial(c, x, &w.nsp)) return -1;
  int s = w.nsp;
  if (wt->shape.rank != x->shape.rank)
    return kl_onnx_fail(c, "the weight must have the rank of the input (%d), got %d",
                        x->shape.rank, wt->shape.rank);
  for (int i = 0; i < s; i++) w.k[i] = wt->shape.dims[2 + i];
  int64_t opad[MAX_SP], oshape[MAX_SP];
  if (ints_attr(c, n, "strides", s, 1, 1, w.stride) ||
      ints_attr(c, n, "dilations", s, 1, 1, w.dil) ||
      ints_attr(c, n, "pads", 2 * s, 0, 0, w.pad) ||
      ints_attr(c, n, "output_padding", s, 0, 0, opad))
    return -1;
  const int64_t *os;
  int nos = kl_onnx_attr_ints(n, "output_shape", &os);
  const char *ap = auto_pad(c, n);
  bool same = !strncmp(ap, "SAME_", 5);
  if (nos >= 0 || same) {
    if (nos >= 0 && nos != s && nos != s + 2)
      return kl_onnx_fail(c, "output_shape must have %d entries, got %d", s, nos);
    for (int i = 0; i < s; i++) {
      int64_t in = x->shape.dims[2 + i];
      oshape[i] = nos >= 0 ? os[nos - s + i] : in * w.stride[i];
      if (oshape[i] < 1 || oshape[i] > KL_MAX_NUMEL)
        return kl_onnx_fail(c, "output_shape[%d] = %lld is out of range", i, (long long)oshape[i]);
      int64_t total = w.stride[i] * (in - 1) + opad[i] + (w.k[i] - 1) * w.dil[i] + 1 - oshape[i];
      /* floor division, as Python's // in the reference */
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      bool upper = !strcmp(ap, "SAME_UPPER");
      w.pad[i] = upper ? half : total - half;
      w.pad[s + i] = upper ? total - half : half;
    }
  } else if (!strcmp(ap, "VALID")) {
    for (int i = 0; i < 2 * s; i++) w.pad[i] = 0;
  } else if (strcmp(ap, "NOTSET")) {
    return kl_onnx_fail(c, "auto_pad \"%s\" is not NOTSET, SAME_UPPER, SAME_LOWER or VALID", ap);
  }
  int64_t groups = kl_onnx_attr_int(n, "group", 1);
  kl_value *y;
  if (s == 1) {
    y = drop_1d(c, conv_transpose2d(c, lift_1d(c, x), lift_1d(c, wt), b, &w, -1, 0, opad, groups));
  } else if (s == 2) {
    y = conv_transpose2d(c, x, wt, b, &w, 0, 1, opad, groups);
  } else {
    y = conv_transpose3d(c, x, wt, &w, opad, groups);
    if (b) y = binary(c, KL_OP_ADD, y, per_channel(c, b, 5));
  }
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* DeformConv (2-D): kernel_shape must agree with w; a mask without a
 * bias gets a zero bias (the IR's inputs are positional). */
static int convert_deform_conv(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *in[5] = {need_input(c, n, 0), need_input(c, n, 1), need_input(c, n, 2),
                     kl_onnx_input(c, n, 3), kl_onnx_input(c, n, 4)};
  if (!in[0] || !in[1] || !in[2]) return -1;
  kl_value *x = in[0], *wt = in[1];
  if (x->shape.rank != 4 || wt->shape.rank != 4)
    return kl_onnx_unsupported(c, "only 2-D DeformConv (x [N, C, H, W]) is supported");
  const int64_t *ks;
  int nk = kl_onnx_attr_ints(n, "kernel_shape", &ks);
  if (nk >= 0 && (nk != 2 || ks[0] != wt->shape.dims[2] || ks[1] != wt->shape.dims[3]))
    return kl_onnx_fail(c, "kernel_shape does not match the weight");
  int nin = in[4] ? 5 : in[3] ? 4 : 3;
  if (in[4] && !in[3]) {
    kl_shape bs = {1, {wt->shape.dims[0]}};
    double zero = 0;
    in[3] = kl_onnx_constant(c, x->dtype, &bs, &zero, 1);
  }
  kl_attr a[5];
  int na = 0;
  static const char *const names[3] = {"strides", "pads", "dilations"};
  for (int i = 0; i < 3; i++) {
    const int64_t *v;
    int k = kl_onnx_attr_ints(n, names[i], &v);
    if (k >= 0) a[na++] = kl_ais(names[i], v, k);
  }
  a[na++] = kl_ai("groups", kl_onnx_attr_int(n, "group", 1));
  a[na++] = kl_ai("offset_groups", kl_onnx_attr_int(n, "offset_group", 1));
  kl_value *y = kl_onnx_emit(c, KL_OP_DEFORM_CONV2D, in, nin, a, na);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- pools ----------------------------------------------------------- */

static kl_value *pool2d(kl_onnx_ctx *c, kl_value *x, bool is_max, const window *w, int a0,
                        int a1, bool ceil_mode, bool include_pad) {
  if (!x) return NULL;
  int64_t k[2], st[2], dil[2], pads[4];
  window_2d(w, a0, a1, k, st, dil, pads);
  kl_attr a[6] = {kl_ais("kernel", k, 2), kl_ais("strides", st, 2), kl_ais("pads", pads, 4),
                  kl_ai("ceil_mode", ceil_mode), kl_ais("dilations", dil, 2),
                  kl_ai("count_include_pad", include_pad)};
  return unary(c, is_max ? KL_OP_MAX_POOL2D : KL_OP_AVG_POOL2D, x, a, is_max ? 5 : 6);
}

/* MaxPool's indices (1-D and 2-D): a 1-D pool's lifted [N, C, 1, W]
 * has the same flat indices in either storage order. */
static kl_value *pool_index(kl_onnx_ctx *c, kl_value *x, const window *w, bool ceil_mode,
                            int64_t storage_order) {
  if (!x) return NULL;
  int64_t k[2], st[2], dil[2], pads[4];
  window_2d(w, w->nsp == 1 ? -1 : 0, w->nsp == 1 ? 0 : 1, k, st, dil, pads);
  kl_attr a[6] = {kl_ais("kernel", k, 2), kl_ais("strides", st, 2), kl_ais("pads", pads, 4),
                  kl_ai("ceil_mode", ceil_mode), kl_ais("dilations", dil, 2),
                  kl_ai("storage_order", storage_order)};
  if (w->nsp == 1) return drop_1d(c, unary(c, KL_OP_MAX_POOL2D_INDEX, lift_1d(c, x), a, 6));
  return unary(c, KL_OP_MAX_POOL2D_INDEX, x, a, 6);
}

/* Both pools are separable (a max, or a mean over a box that is a
 * product of per-axis ranges), so 3-D pools run as a 2-D pool over (H, W)
 * and then one over D. */
static kl_value *pool_nd(kl_onnx_ctx *c, kl_value *x, bool is_max, const window *w,
                         bool ceil_mode, bool cip) {
  const int64_t *xd = x->shape.dims;
  if (w->nsp == 1) return drop_1d(c, pool2d(c, lift_1d(c, x), is_max, w, -1, 0, ceil_mode, cip));
  if (w->nsp == 2) return pool2d(c, x, is_max, w, 0, 1, ceil_mode, cip);
  int64_t planes[4] = {xd[0], xd[1] * xd[2], xd[3], xd[4]};
  kl_value *hw = pool2d(c, reshape(c, x, planes, 4), is_max, w, 1, 2, ceil_mode, cip);
  if (!hw) return NULL;
  int64_t oh = hw->shape.dims[2], ow = hw->shape.dims[3];
  int64_t cols[4] = {xd[0], xd[1], xd[2], oh * ow};
  /* the depth window as a 2-D one of width 1: only a0 = D matters */
  window wd = *w;
  wd.k[2] = wd.stride[2] = wd.dil[2] = 1;
  wd.pad[2] = wd.pad[5] = 0;
  kl_value *d = pool2d(c, reshape(c, hw, cols, 4), is_max, &wd, 0, 2, ceil_mode, cip);
  if (!d) return NULL;
  int64_t ys[5] = {xd[0], xd[1], d->shape.dims[2], oh, ow};
  return reshape(c, d, ys, 5);
}

/* The p of LpPool: a float in opset 1, an int after. */
static double lp_order(const Onnx__NodeProto *n) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "p");
  return !a ? 2.0 : a->has_f ? a->f : (double)a->i;
}

/* MaxPool, AveragePool and LpPool; LpPool is (mean of |x|^p with the
 * padding counted, times the window area)^(1/p). */
static int convert_pool(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  bool is_max = !strcmp(n->op_type, "MaxPool"), is_lp = !strcmp(n->op_type, "LpPool");
  kl_value *x = need_input(c, n, 0);
  window w = {0};
  if (!x || check_spatial(c, x, &w.nsp)) return -1;
  const int64_t *ks;
  if (kl_onnx_attr_ints(n, "kernel_shape", &ks) != w.nsp)
    return kl_onnx_fail(c, "kernel_shape must have %d entries", w.nsp);
  int64_t area = 1;
  for (int i = 0; i < w.nsp; i++) {
    if (ks[i] < 1) return kl_onnx_fail(c, "kernel_shape[%d] must be >= 1", i);
    area *= w.k[i] = ks[i];
  }
  if (read_window(c, n, x, true, &w)) return -1;
  bool ceil_mode = kl_onnx_attr_int(n, "ceil_mode", 0) != 0;
  bool cip = kl_onnx_attr_int(n, "count_include_pad", 0) != 0;
  kl_value *y;
  if (is_lp) {
    double p = lp_order(n);
    kl_value *xp = with_scalar(c, KL_OP_POW, unary(c, KL_OP_ABS, x, NULL, 0), p);
    kl_value *sum = xp ? with_scalar(c, KL_OP_MUL, pool_nd(c, xp, false, &w, ceil_mode, true),
                                     (double)area) : NULL;
    y = with_scalar(c, KL_OP_POW, sum, 1.0 / p);
  } else if (is_max && kl_dtype_is_int(x->dtype)) {
    /* the IR pools take floats; f64 holds these integers exactly */
    kl_value *xf = cast(c, x, KL_F64);
    y = xf ? cast(c, pool_nd(c, xf, true, &w, ceil_mode, cip), x->dtype) : NULL;
  } else {
    y = pool_nd(c, x, is_max, &w, ceil_mode, cip);
  }
  if (!y || kl_onnx_bind(c, n, 0, y)) return -1;
  if (!is_max || !wants_output(n, 1)) return 0;
  if (w.nsp > 2) return kl_onnx_unsupported(c, "the indices of a %d-D MaxPool", w.nsp);
  int64_t order = kl_onnx_attr_int(n, "storage_order", 0);
  if (order != 0 && order != 1)
    return kl_onnx_fail(c, "storage_order must be 0 or 1, got %lld", (long long)order);
  kl_value *xi = kl_dtype_is_int(x->dtype) ? cast(c, x, KL_F64) : x;
  kl_value *ix = pool_index(c, xi, &w, ceil_mode, order);
  return ix ? kl_onnx_bind(c, n, 1, ix) : -1;
}

/* MaxUnpool: zeros of the unpooled shape (each spatial axis (in - 1) *
 * stride + kernel - pads) with x's values put at the flat indices I
 * (MaxPool's second output) by a scatter_elements over the flattened
 * output; a larger output_shape pads zeros at the end of each axis (as
 * ONNX's reference).  An index out of range is a run-time error. */
static int convert_max_unpool(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *ix = need_input(c, n, 1), *os = kl_onnx_input(c, n, 2);
  window w = {0};
  if (!x || !ix || check_spatial(c, x, &w.nsp)) return -1;
  char b[256], b2[256];
  if (ix->dtype != KL_I64 || !kl_shape_equal(&ix->shape, &x->shape))
    return kl_onnx_fail(c, "indices must be i64 of x's shape %s",
                        kl_shape_str(&x->shape, b, sizeof b));
  if (ints_attr(c, n, "kernel_shape", w.nsp, 1, 1, w.k) ||
      ints_attr(c, n, "strides", w.nsp, 1, 1, w.stride) ||
      ints_attr(c, n, "pads", 2 * w.nsp, 0, 0, w.pad))
    return -1;
  if (!kl_onnx_attr(n, "kernel_shape")) return kl_onnx_fail(c, "kernel_shape is required");
  int r = x->shape.rank;
  kl_shape out = x->shape, want;
  int64_t total = 1, nx = kl_shape_numel(&x->shape), pads[2 * KL_MAX_RANK] = {0};
  for (int i = 0; i < w.nsp; i++) /* every term is below KL_MAX_NUMEL: no overflow but * */
    if (__builtin_mul_overflow(x->shape.dims[2 + i] - 1, w.stride[i], &out.dims[2 + i]) ||
        (out.dims[2 + i] += w.k[i] - w.pad[i] - w.pad[w.nsp + i]) > KL_MAX_NUMEL)
      return kl_onnx_fail(c, "the unpooled axis %d is too long", 2 + i);
  for (int d = 0; d < r; d++) {
    if (out.dims[d] < 0) return kl_onnx_fail(c, "the unpooled axis %d would be negative", d);
    if (__builtin_mul_overflow(total, out.dims[d], &total) || total > KL_MAX_NUMEL)
      return kl_onnx_fail(c, "the output is too large");
  }
  want = out;
  if (os) {
    if (kl_onnx_const_ints(c, os, "output_shape", want.dims, KL_MAX_RANK) != r)
      return kl_onnx_fail(c, "output_shape must have %d entries", r);
    for (int d = 0; d < r; d++) {
      if (want.dims[d] < out.dims[d] || (d < 2 && want.dims[d] != out.dims[d]))
        return kl_onnx_fail(c, "output_shape %s is smaller than the unpooled %s",
                            kl_shape_str(&want, b, sizeof b), kl_shape_str(&out, b2, sizeof b2));
      pads[r + d] = want.dims[d] - out.dims[d];
    }
  }
  kl_attr flat = kl_ais("shape", &total, 1);
  kl_value *ins[3] = {unary(c, KL_OP_EXPAND, kl_onnx_scalar(c, x->dtype, 0), &flat, 1),
                      reshape(c, ix, &nx, 1), reshape(c, x, &nx, 1)};
  if (!ins[0] || !ins[1] || !ins[2]) return -1;
  kl_attr a[2] = {kl_ai("axis", 0), kl_as("reduction", "none")};
  kl_value *y = reshape(c, kl_onnx_emit(c, KL_OP_SCATTER_ELEMENTS, ins, 3, a, 2), out.dims, r);
  if (y && !kl_shape_equal(&want, &out)) {
    kl_attr pa[3] = {kl_ais("pads", pads, 2 * r), kl_as("mode", "constant"), kl_af("value", 0)};
    y = unary(c, KL_OP_PAD, y, pa, 3);
  }
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* Col2Im: image_shape and block_shape are constant inputs. */
static int convert_col2im(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *iv = need_input(c, n, 1), *bv = need_input(c, n, 2);
  if (!x || !iv || !bv) return -1;
  int64_t img[KL_MAX_RANK], blk[KL_MAX_RANK];
  int s = kl_onnx_const_ints(c, iv, "image_shape", img, KL_MAX_RANK - 2);
  if (s < 0) return -1;
  int sb = kl_onnx_const_ints(c, bv, "block_shape", blk, KL_MAX_RANK - 2);
  if (sb < 0) return -1;
  if (s < 1 || sb != s)
    return kl_onnx_fail(c, "image_shape and block_shape must have one entry per spatial axis, "
                        "got %d and %d", s, sb);
  kl_attr a[5];
  int na = 0;
  a[na++] = kl_ais("image_shape", img, s);
  a[na++] = kl_ais("block_shape", blk, s);
  static const char *const names[3] = {"strides", "pads", "dilations"};
  for (int i = 0; i < 3; i++) {
    const int64_t *v;
    int k = kl_onnx_attr_ints(n, names[i], &v);
    if (k >= 0) a[na++] = kl_ais(names[i], v, k);
  }
  kl_value *y = unary(c, KL_OP_COL2IM, x, a, na);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* DFT: dft_length (input 1) and, from opset 20, axis (input 2, default
 * -2) are constant inputs; before opset 20 axis is an attribute (default 1). */
static int convert_dft(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *lv = kl_onnx_input(c, n, 1);
  if (!x) return -1;
  int64_t len = 0, axis = c->opset >= 20 ? -2 : kl_onnx_attr_int(n, "axis", 1);
  if (lv) {
    int k = kl_onnx_const_ints(c, lv, "dft_length", &len, 1);
    if (k != 1) return k < 0 ? -1 : kl_onnx_fail(c, "dft_length must be one integer");
    if (len < 1) return kl_onnx_fail(c, "dft_length must be positive, got %lld", (long long)len);
  }
  kl_value *av = c->opset >= 20 ? kl_onnx_input(c, n, 2) : NULL;
  if (av) {
    int k = kl_onnx_const_ints(c, av, "axis", &axis, 1);
    if (k != 1) return k < 0 ? -1 : kl_onnx_fail(c, "axis must be one integer");
  }
  kl_attr a[4] = {kl_ai("axis", axis), kl_ai("length", len),
                  kl_ai("inverse", kl_onnx_attr_int(n, "inverse", 0)),
                  kl_ai("onesided", kl_onnx_attr_int(n, "onesided", 0))};
  kl_value *y = unary(c, KL_OP_DFT, x, a, 4);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* One constant int of input k (an integer tensor of one value), into *v;
 * unchanged when the input is absent. */
static int const_int_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, const char *what,
                           int64_t *v) {
  kl_value *iv = kl_onnx_input(c, n, k);
  if (!iv) return 0;
  int got = kl_onnx_const_ints(c, iv, what, v, 1);
  return got == 1 ? 0 : got < 0 ? -1 : kl_onnx_fail(c, "%s must be one integer", what);
}

/* STFT as ONNX defines it: frames of frame_length samples every frame_step
 * (a gather with constant indices), times the window, each frame's DFT
 * (one-sided by default): [B, frames, bins, 2]. */
static int convert_stft(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *win = kl_onnx_input(c, n, 2);
  if (!x) return -1;
  char sx[300];
  if (x->shape.rank != 3 || (x->shape.dims[2] != 1 && x->shape.dims[2] != 2))
    return kl_onnx_fail(c, "signal %s must be [B, length, 1] (real) or [B, length, 2] (complex)",
                        kl_shape_str(&x->shape, sx, sizeof sx));
  int64_t nb = x->shape.dims[0], len = x->shape.dims[1], ch = x->shape.dims[2], step = 0;
  int64_t fl = win ? (win->shape.rank == 1 ? win->shape.dims[0] : -1) : len;
  if (!kl_onnx_input(c, n, 1)) return kl_onnx_fail(c, "frame_step is required");
  if (const_int_input(c, n, 1, "frame_step", &step) || const_int_input(c, n, 3, "frame_length", &fl))
    return -1;
  if (step < 1) return kl_onnx_fail(c, "frame_step must be positive, got %lld", (long long)step);
  if (fl < 1 || fl > len)
    return kl_onnx_fail(c, "frame_length %lld must be within [1, %lld] (the signal's length)",
                        (long long)fl, (long long)len);
  if (win && (win->shape.rank != 1 || win->shape.dims[0] != fl || win->dtype != x->dtype))
    return kl_onnx_fail(c, "window %s must be a [%lld] tensor (frame_length) of the signal's "
                        "dtype", kl_shape_str(&win->shape, sx, sizeof sx), (long long)fl);
  int64_t frames = 1 + (len - fl) / step, count = frames * fl;
  if (count > (1 << 26))
    return kl_onnx_unsupported(c, "%lld frames of %lld samples are too many to gather",
                               (long long)frames, (long long)fl);
  double *at = malloc(sizeof *at * (size_t)count);
  if (!at) return kl_onnx_fail(c, "out of memory");
  for (int64_t f = 0; f < frames; f++)
    for (int64_t t = 0; t < fl; t++) at[f * fl + t] = (double)(f * step + t);
  kl_shape is = {1, {count}};
  kl_value *idx = kl_onnx_constant(c, KL_I64, &is, at, (int)count);
  free(at);
  kl_attr ax = kl_ai("axis", 1);
  kl_value *gi[2] = {x, idx};
  int64_t fd[4] = {nb, frames, fl, ch}, wd[4] = {1, 1, fl, 1};
  kl_value *fr = idx ? reshape(c, kl_onnx_emit(c, KL_OP_GATHER, gi, 2, &ax, 1), fd, 4) : NULL;
  if (fr && win) fr = binary(c, KL_OP_MUL, fr, reshape(c, win, wd, 4));
  kl_attr a[4] = {kl_ai("axis", 2), kl_ai("length", fl), kl_ai("inverse", 0),
                  kl_ai("onesided", kl_onnx_attr_int(n, "onesided", 1))};
  kl_value *y = fr ? unary(c, KL_OP_DFT, fr, a, 4) : NULL;
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* One constant number of input k, into *v. */
static int const_number_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, const char *what,
                              double *v) {
  kl_value *iv = need_input(c, n, k);
  const kl_tensor *t = iv ? kl_onnx_const(c, iv, what) : NULL;
  if (!t) return -1;
  if (t->numel != 1) return kl_onnx_fail(c, "%s must be one number, got %lld", what,
                                         (long long)t->numel);
  *v = t->data[0];
  return 0;
}

/* MelWeightMatrix: every input is a constant, so the matrix is one too,
 * computed here with ONNX's formulas: num_mel_bins + 2 points evenly spaced
 * in mel between the edges, turned back into Hz and into DFT bins (floored),
 * and a triangle per mel bin over them: [dft_length / 2 + 1, num_mel_bins]. */
static int convert_mel_weight_matrix(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  double mels, dft, rate, lo, hi;
  if (const_number_input(c, n, 0, "num_mel_bins", &mels) ||
      const_number_input(c, n, 1, "dft_length", &dft) ||
      const_number_input(c, n, 2, "sample_rate", &rate) ||
      const_number_input(c, n, 3, "lower_edge_hertz", &lo) ||
      const_number_input(c, n, 4, "upper_edge_hertz", &hi))
    return -1;
  if (mels < 1 || mels > 65536 || dft < 1 || dft > (1 << 20) || rate <= 0 || lo < 0 || hi <= lo)
    return kl_onnx_fail(c, "need num_mel_bins in [1, 65536] (got %g), dft_length in [1, 2^20] "
                        "(got %g), a positive sample_rate (got %g) and 0 <= lower_edge_hertz < "
                        "upper_edge_hertz (got %g, %g)", mels, dft, rate, lo, hi);
  kl_dtype dt;
  int64_t odt = kl_onnx_attr_int(n, "output_datatype", 1);
  if (kl_onnx_dtype((int)odt, &dt) || !(kl_dtype_is_float(dt) || kl_dtype_is_int(dt)))
    return kl_onnx_unsupported(c, "output_datatype %lld is not supported", (long long)odt);
  int64_t nm = (int64_t)mels, nd = (int64_t)dft, bins = nd / 2 + 1, npt = nm + 2;
  if (bins * nm > (1 << 26))
    return kl_onnx_unsupported(c, "a %lld x %lld matrix is too large", (long long)bins,
                               (long long)nm);
  int64_t *at = malloc(sizeof *at * (size_t)npt);
  double *w = calloc((size_t)(bins * nm), sizeof *w);
  if (!at || !w) {
    free(at), free(w);
    return kl_onnx_fail(c, "out of memory");
  }
  double mlo = 2595 * log1p(lo / 700) / log(10), mhi = 2595 * log1p(hi / 700) / log(10);
  double step = (mhi - mlo) / (double)npt;
  int bad = 0;
  for (int64_t i = 0; i < npt; i++) {
    double hz = 700 * expm1(((double)i * step + mlo) / 2595 * log(10));
    at[i] = (int64_t)floor((double)(nd + 1) * hz / rate);
    bad |= at[i] < 0 || at[i] >= bins;
  }
  for (int64_t m = 0; m < nm && !bad; m++) {
    int64_t l = at[m], ce = at[m + 1], r = at[m + 2];
    if (ce == l) w[ce * nm + m] = 1;
    for (int64_t j = l; ce > l && j <= ce; j++) w[j * nm + m] = (double)(j - l) / (double)(ce - l);
    for (int64_t j = ce; j < r; j++) w[j * nm + m] = (double)(r - j) / (double)(r - ce);
  }
  kl_shape sh = {2, {bins, nm}};
  kl_value *y = bad ? NULL : kl_onnx_constant(c, dt, &sh, w, (int)(bins * nm));
  free(at), free(w);
  if (bad)
    return kl_onnx_fail(c, "upper_edge_hertz %g falls beyond the last DFT bin (sample_rate %g, "
                        "dft_length %lld)", hi, rate, (long long)nd);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* GlobalMaxPool reduces with reduce_max; GlobalLpPool is the p-norm over
 * the spatial axes. */
static int convert_global_pool(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  kl_value *y;
  if (!strcmp(n->op_type, "GlobalAveragePool")) {
    y = unary(c, KL_OP_GLOBAL_AVG_POOL, x, NULL, 0);
  } else {
    if (x->shape.rank < 3) return kl_onnx_fail(c, "input must be [N, C, spatial...]");
    int64_t axes[KL_MAX_RANK];
    int k = tail_axes(x, 2, axes);
    if (!strcmp(n->op_type, "GlobalMaxPool")) {
      y = reduce(c, KL_OP_REDUCE_MAX, x, axes, k, true);
    } else {
      double p = lp_order(n);
      kl_value *xp = with_scalar(c, KL_OP_POW, unary(c, KL_OP_ABS, x, NULL, 0), p);
      y = with_scalar(c, KL_OP_POW, reduce(c, KL_OP_REDUCE_SUM, xp, axes, k, true), 1.0 / p);
    }
  }
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- normalisations -------------------------------------------------- */


/* Batch statistics over every axis but 1: mean[C] and biased var[C]. */
static int batch_stats(kl_onnx_ctx *c, kl_value *x, kl_value **mean, kl_value **var) {
  int64_t axes[KL_MAX_RANK];
  int k = 0;
  for (int d = 0; d < x->shape.rank; d++)
    if (d != 1) axes[k++] = d;
  *mean = reduce(c, KL_OP_REDUCE_MEAN, x, axes, k, false);
  kl_value *dev = binary(c, KL_OP_SUB, x, per_channel(c, *mean, x->shape.rank));
  *var = reduce(c, KL_OP_REDUCE_MEAN, binary(c, KL_OP_MUL, dev, dev), axes, k, false);
  return *var ? 0 : -1;
}

/* running * momentum + batch * (1 - momentum) */
static kl_value *running(kl_onnx_ctx *c, kl_value *run, kl_value *batch, double momentum) {
  return binary(c, KL_OP_ADD, with_scalar(c, KL_OP_MUL, run, momentum),
                with_scalar(c, KL_OP_MUL, batch, 1 - momentum));
}

/* Inference form everywhere; training_mode (opset 14) normalises with the
 * batch statistics and outputs the updated running ones.  spatial = 0
 * (opsets < 9) has statistics of shape x.shape[1:]. */
static int convert_batch_norm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *in[5];
  for (int k = 0; k < 5; k++)
    if (!(in[k] = need_input(c, n, k))) return -1;
  /* Opset 15 lets scale and the statistics have their own float types
   * (f16 x, f32 statistics): compute in scale's type, cast back at the
   * end. */
  kl_dtype xt = in[0]->dtype;
  kl_dtype ct = in[1]->dtype;
  for (int k = 0; k < 5; k++)
    if (!(in[k] = cast(c, in[k], ct))) return -1;
  kl_value *x = in[0];
  double eps = kl_onnx_attr_float(n, "epsilon", 1e-5);
  double momentum = kl_onnx_attr_float(n, "momentum", 0.9);
  bool training = c->opset >= 14 && kl_onnx_attr_int(n, "training_mode", 0);
  if (!training && c->opset < 7 && !kl_onnx_attr_int(n, "is_test", 0) && wants_output(n, 1))
    training = true;
  if (x->shape.rank < 2) return kl_onnx_fail(c, "input must be [N, C, ...]");
  kl_attr ea = kl_af("epsilon", eps);
  kl_value *y;
  if (training) {
    if (c->opset < 14) return kl_onnx_unsupported(c, "training mode before opset 14 is not supported");
    kl_value *mean, *var;
    if (batch_stats(c, x, &mean, &var)) return -1;
    kl_value *ins[5] = {x, in[1], in[2], mean, var};
    y = cast(c, kl_onnx_emit(c, KL_OP_BATCH_NORM, ins, 5, &ea, 1), xt);
    kl_value *rm = running(c, in[3], mean, momentum), *rv = running(c, in[4], var, momentum);
    if (!y || !rm || !rv) return -1;
    return kl_onnx_bind(c, n, 0, y) || kl_onnx_bind(c, n, 1, rm) || kl_onnx_bind(c, n, 2, rv);
  }
  if (in[1]->shape.rank > 1) {
    /* spatial = 0: per-activation statistics broadcast over N */
    kl_value *sd = unary(c, KL_OP_SQRT, with_scalar(c, KL_OP_ADD, in[4], eps), NULL, 0);
    kl_value *t = binary(c, KL_OP_DIV, binary(c, KL_OP_SUB, x, in[3]), sd);
    y = binary(c, KL_OP_ADD, binary(c, KL_OP_MUL, t, in[1]), in[2]);
  } else {
    y = kl_onnx_emit(c, KL_OP_BATCH_NORM, in, 5, &ea, 1);
  }
  y = cast(c, y, xt);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* layer_norm over the spatial axes, then the per-channel affine. */
static int convert_instance_norm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *scale = need_input(c, n, 1), *bias = need_input(c, n, 2);
  if (!x || !scale || !bias) return -1;
  if (x->shape.rank < 3) return kl_onnx_fail(c, "input must be [N, C, d1, ...]");
  kl_attr a[2] = {kl_ai("axis", 2), kl_af("epsilon", kl_onnx_attr_float(n, "epsilon", 1e-5))};
  kl_value *t = unary(c, KL_OP_LAYER_NORM, x, a, 2);
  int r = x->shape.rank;
  kl_value *y = binary(c, KL_OP_ADD, binary(c, KL_OP_MUL, t, per_channel(c, scale, r)),
                       per_channel(c, bias, r));
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* Mean and InvStdDev, when asked for, come from reductions; stash_type 1
 * gives them as f32. */
static int convert_layer_norm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[3] = {need_input(c, n, 0), kl_onnx_input(c, n, 1), kl_onnx_input(c, n, 2)};
  kl_value *x = ins[0];
  if (!x) return -1;
  int64_t axis = kl_onnx_attr_int(n, "axis", -1);
  double eps = kl_onnx_attr_float(n, "epsilon", 1e-5);
  int r = x->shape.rank;
  if (axis < -r || axis >= r) return kl_onnx_fail(c, "axis %lld is out of range", (long long)axis);
  if (axis < 0) axis += r;
  int nin = 1;
  if (ins[1]) nin = ins[2] ? 3 : 2;
  else if (ins[2]) return kl_onnx_fail(c, "a bias without a scale is not supported");
  kl_attr a[2] = {kl_ai("axis", axis), kl_af("epsilon", eps)};
  kl_value *y = kl_onnx_emit(c, KL_OP_LAYER_NORM, ins, nin, a, 2);
  if (!y || kl_onnx_bind(c, n, 0, y)) return -1;
  if (!wants_output(n, 1) && !wants_output(n, 2)) return 0;
  int64_t stash = kl_onnx_attr_int(n, "stash_type", 1);
  kl_dtype st;
  if (kl_onnx_dtype((int)stash, &st) || !kl_dtype_is_float(st))
    return kl_onnx_fail(c, "stash_type %lld is not a float type", (long long)stash);
  kl_value *xs = cast(c, x, st);
  int64_t axes[KL_MAX_RANK];
  int k = tail_axes(x, (int)axis, axes);
  kl_value *mean = reduce(c, KL_OP_REDUCE_MEAN, xs, axes, k, true);
  kl_value *dev = binary(c, KL_OP_SUB, xs, mean);
  kl_value *var = reduce(c, KL_OP_REDUCE_MEAN, binary(c, KL_OP_MUL, dev, dev), axes, k, true);
  kl_value *inv = unary(c, KL_OP_RSQRT, with_scalar(c, KL_OP_ADD, var, eps), NULL, 0);
  if (!mean || !inv) return -1;
  return kl_onnx_bind(c, n, 1, mean) || kl_onnx_bind(c, n, 2, inv);
}

/* RMSNormalization (opset 23): x / sqrt(mean(x^2 over axis..) + eps) *
 * scale, a row kernel as layer_norm.  The rows are computed in double
 * whatever stash_type says, so it is only checked. */
static int convert_rms_norm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[2] = {need_input(c, n, 0), need_input(c, n, 1)};
  kl_value *x = ins[0];
  if (!x || !ins[1]) return -1;
  int64_t axis = kl_onnx_attr_int(n, "axis", -1);
  double eps = kl_onnx_attr_float(n, "epsilon", 1e-5);
  int r = x->shape.rank;
  if (axis < -r || axis >= r) return kl_onnx_fail(c, "axis %lld is out of range", (long long)axis);
  if (axis < 0) axis += r;
  int64_t stash = kl_onnx_attr_int(n, "stash_type", 1);
  kl_dtype st;
  if (kl_onnx_dtype((int)stash, &st) || !kl_dtype_is_float(st))
    return kl_onnx_fail(c, "stash_type %lld is not a float type", (long long)stash);
  kl_attr a[2] = {kl_ai("axis", axis), kl_af("epsilon", eps)};
  kl_value *y = kl_onnx_emit(c, KL_OP_RMS_NORM, ins, 2, a, 2);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* RotaryEmbedding (opset 23) onto the IR rotary op; position_ids pick
 * the rows of the caches first (a gather). */
static int convert_rotary(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *cs = need_input(c, n, 1), *sn = need_input(c, n, 2);
  kl_value *pos = kl_onnx_input(c, n, 3);
  if (!x || !cs || !sn) return -1;
  if (pos) {
    kl_attr a = kl_ai("axis", 0);
    kl_value *gc[2] = {cs, pos}, *gs[2] = {sn, pos};
    cs = kl_onnx_emit(c, KL_OP_GATHER, gc, 2, &a, 1);
    sn = kl_onnx_emit(c, KL_OP_GATHER, gs, 2, &a, 1);
    if (!cs || !sn) return -1;
  }
  kl_value *ins[3] = {x, cs, sn};
  kl_attr a[3] = {kl_ai("num_heads", kl_onnx_attr_int(n, "num_heads", 0)),
                  kl_ai("rotary_dim", kl_onnx_attr_int(n, "rotary_embedding_dim", 0)),
                  kl_ai("interleaved", kl_onnx_attr_int(n, "interleaved", 0) != 0)};
  kl_value *y = kl_onnx_emit(c, KL_OP_ROTARY, ins, 3, a, 3);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- Attention (opsets 23..25) ----------------------------------------
 * Onto the IR attention op, which takes 4-D [batch, heads, seq, size]
 * inputs: 3-D ones ([batch, seq, heads * size]) are split into heads
 * around it, the key/value cache is concatenated in front of the new keys
 * and values (the concatenations are the present outputs), and the scores
 * output (qk_matmul_output) is a second attention node that gives the
 * scores instead, converted only when the model reads it. */
static kl_value *transpose_0213(kl_onnx_ctx *c, kl_value *x) {
  static const int64_t perm[4] = {0, 2, 1, 3};
  return transpose(c, x, perm);
}

/* [B, S, H * size] -> [B, H, S, size] */
static kl_value *split_heads(kl_onnx_ctx *c, kl_value *x, int64_t heads, const char *what) {
  if (!x) return NULL;
  const int64_t *d = x->shape.dims;
  if (heads < 1 || d[2] % heads) {
    kl_onnx_fail(c, "%s's hidden size %lld is not a multiple of its head count %lld", what,
                 (long long)d[2], (long long)heads);
    return NULL;
  }
  int64_t s[4] = {d[0], d[1], heads, d[2] / heads};
  return transpose_0213(c, reshape(c, x, s, 4));
}

static kl_value *concat_keys(kl_onnx_ctx *c, kl_value *past, kl_value *x) {
  kl_value *ins[2] = {past, x};
  kl_attr a = kl_ai("axis", 2);
  return past && x ? kl_onnx_emit(c, KL_OP_CONCAT, ins, 2, &a, 1) : x;
}

static int convert_attention(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *q = need_input(c, n, 0), *k = need_input(c, n, 1), *v = need_input(c, n, 2);
  kl_value *mask = kl_onnx_input(c, n, 3), *pk = kl_onnx_input(c, n, 4), *pv = kl_onnx_input(c, n, 5);
  kl_value *lens = kl_onnx_input(c, n, 6);
  if (!q || !k || !v) return -1;
  int r = q->shape.rank;
  if ((r != 3 && r != 4) || k->shape.rank != r || v->shape.rank != r)
    return kl_onnx_fail(c, "Q, K and V must all be 3-D or all 4-D");
  if (!pk != !pv) return kl_onnx_fail(c, "past_key and past_value must be given together");
  if (pk && lens) return kl_onnx_fail(c, "nonpad_kv_seqlen cannot be combined with a past cache");
  if ((pk && pk->shape.rank != 4) || (pv && pv->shape.rank != 4))
    return kl_onnx_fail(c, "past_key and past_value must be 4-D");
  int64_t sp = kl_onnx_attr_int(n, "softmax_precision", 0);
  kl_dtype spt;
  if (sp && (kl_onnx_dtype((int)sp, &spt) || !kl_dtype_is_float(spt)))
    return kl_onnx_fail(c, "softmax_precision %lld is not a float type", (long long)sp);
  int64_t mode = kl_onnx_attr_int(n, "qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3)
    return kl_onnx_fail(c, "qk_matmul_output_mode %lld is not 0..3", (long long)mode);
  int64_t batch = q->shape.dims[0], sq = q->shape.dims[r - 2];
  if (r == 3) {
    sq = q->shape.dims[1];
    int64_t hq = kl_onnx_attr_int(n, "q_num_heads", 0), hkv = kl_onnx_attr_int(n, "kv_num_heads", 0);
    if (!(q = split_heads(c, q, hq, "Q")) || !(k = split_heads(c, k, hkv, "K")) ||
        !(v = split_heads(c, v, hkv, "V")))
      return -1;
  }
  int64_t past = pk ? pk->shape.dims[2] : 0;
  k = concat_keys(c, pk, k), v = concat_keys(c, pv, v);
  if (!k || !v) return -1;
  kl_value *ins[5] = {q, k, v};
  int nin = 3;
  if (mask) ins[nin++] = mask;
  if (lens) ins[nin++] = cast(c, lens, KL_I64);
  kl_attr a[7] = {kl_af("scale", kl_onnx_attr_float(n, "scale", 0)),
                  kl_af("softcap", kl_onnx_attr_float(n, "softcap", 0)),
                  kl_ai("causal", kl_onnx_attr_int(n, "is_causal", 0) != 0),
                  kl_ai("past", past),
                  kl_ai("window_left", kl_onnx_attr_int(n, "left_window_size", -1)),
                  kl_ai("window_right", kl_onnx_attr_int(n, "right_window_size", -1)),
                  kl_ai("scores", -1)};
  kl_value *y = kl_onnx_emit(c, KL_OP_ATTENTION, ins, nin, a, 7);
  if (y && r == 3) {
    int64_t s[3] = {batch, sq, y->shape.dims[1] * y->shape.dims[3]};
    y = reshape(c, transpose_0213(c, y), s, 3);
  }
  if (!y || kl_onnx_bind(c, n, 0, y)) return -1;
  if (wants_output(n, 1) && kl_onnx_bind(c, n, 1, k)) return -1;
  if (wants_output(n, 2) && kl_onnx_bind(c, n, 2, v)) return -1;
  if (!wants_output(n, 3)) return 0;
  a[6] = kl_ai("scores", mode);
  kl_value *scores = kl_onnx_emit(c, KL_OP_ATTENTION, ins, nin, a, 7);
  return scores ? kl_onnx_bind(c, n, 3, scores) : -1;
}

/* CausalConvWithState (opset 27): a depthwise 1-D convolution over the
 * input with the past state (or zeros) in front, k - 1 positions, then an
 * optional SiLU; the present state is the last k - 1 positions of that
 * padded input.  Existing ops: concat or pad, a grouped conv2d over a
 * [B, C, 1, L + k - 1] view, silu (fused after the convolution), slice. */
static int convert_causal_conv(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *wt = need_input(c, n, 1), *b = kl_onnx_input(c, n, 2);
  kl_value *past = kl_onnx_input(c, n, 3);
  if (!x || !wt) return -1;
  const char *act = kl_onnx_attr_string(c, n, "activation", "none");
  bool silu = !strcmp(act, "silu") || !strcmp(act, "swish");
  if (!silu && strcmp(act, "none"))
    return kl_onnx_fail(c, "activation must be \"none\", \"silu\" or \"swish\", got \"%s\"", act);
  if (x->shape.rank != 3 || wt->shape.rank != 3 || wt->shape.dims[0] != x->shape.dims[1] ||
      wt->shape.dims[1] != 1 || wt->shape.dims[2] < 1)
    return kl_onnx_fail(c, "input must be [batch, channels, length] and weight [channels, 1, k]");
  int64_t nb = x->shape.dims[0], ch = x->shape.dims[1], len = x->shape.dims[2];
  int64_t k = wt->shape.dims[2];
  if (past && (past->shape.rank != 3 || past->shape.dims[0] != nb || past->shape.dims[1] != ch ||
               past->shape.dims[2] != k - 1))
    return kl_onnx_fail(c, "past_state must be [%lld, %lld, %lld]", (long long)nb, (long long)ch,
                        (long long)(k - 1));
  kl_value *padded = past ? concat_keys(c, past, x) : pad_axis(c, x, 2, k - 1, 0);
  int64_t xs[4] = {nb, ch, 1, len + k - 1}, ws[4] = {ch, 1, 1, k}, ys[3] = {nb, ch, len};
  int64_t ones[2] = {1, 1}, zeros[4] = {0};
  kl_attr a[4] = {kl_ais("strides", ones, 2), kl_ais("pads", zeros, 4),
                  kl_ais("dilations", ones, 2), kl_ai("groups", ch)};
  kl_value *ins[3] = {reshape(c, padded, xs, 4), reshape(c, wt, ws, 4), b};
  if (!ins[0] || !ins[1]) return -1;
  kl_value *y = reshape(c, kl_onnx_emit(c, KL_OP_CONV2D, ins, b ? 3 : 2, a, 4), ys, 3);
  if (silu) y = unary(c, KL_OP_SILU, y, NULL, 0);
  if (!y || kl_onnx_bind(c, n, 0, y)) return -1;
  if (!wants_output(n, 1)) return 0;
  int64_t start = len, end = len + k - 1, axis = 2, step = 1;
  kl_attr sa[4] = {kl_ais("starts", &start, 1), kl_ais("ends", &end, 1), kl_ais("axes", &axis, 1),
                   kl_ais("steps", &step, 1)};
  kl_value *present = unary(c, KL_OP_SLICE, padded, sa, 4);
  return present ? kl_onnx_bind(c, n, 1, present) : -1;
}

/* LinearAttention (opset 27) onto the IR op; its optional inputs go in
 * only where the update rule uses them. */
static int convert_linear_attention(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[6] = {need_input(c, n, 0), need_input(c, n, 1), need_input(c, n, 2)};
  if (!ins[0] || !ins[1] || !ins[2]) return -1;
  const char *rule = kl_onnx_attr_string(c, n, "update_rule", "gated_delta");
  bool gated = !strcmp(rule, "gated") || !strcmp(rule, "gated_delta");
  bool delta = !strcmp(rule, "delta") || !strcmp(rule, "gated_delta");
  kl_value *past = kl_onnx_input(c, n, 3), *decay = kl_onnx_input(c, n, 4);
  kl_value *beta = kl_onnx_input(c, n, 5);
  if (!gated != !decay)
    return kl_onnx_fail(c, "update_rule \"%s\" %s the decay input", rule, gated ? "needs" : "forbids");
  if (!delta != !beta)
    return kl_onnx_fail(c, "update_rule \"%s\" %s the beta input", rule, delta ? "needs" : "forbids");
  int nin = 3;
  if (past) ins[nin++] = past;
  if (decay) ins[nin++] = decay;
  if (beta) ins[nin++] = beta;
  kl_attr a[5] = {kl_ai("q_heads", kl_onnx_attr_int(n, "q_num_heads", 0)),
                  kl_ai("kv_heads", kl_onnx_attr_int(n, "kv_num_heads", 0)),
                  kl_af("scale", kl_onnx_attr_float(n, "scale", 0)), kl_as("rule", rule),
                  kl_ai("past", past != NULL)};
  kl_node *node = kl_onnx_emit_node(c, KL_OP_LINEAR_ATTENTION, ins, nin, a, 5, 2);
  if (!node || kl_onnx_bind(c, n, 0, node->outputs[0])) return -1;
  return wants_output(n, 1) ? kl_onnx_bind(c, n, 1, node->outputs[1]) : 0;
}

/* ai.onnx.preview FlexAttention (4-D, grouped heads, a scale) onto the
 * attention op; score_mod and prob_mod subgraphs are not supported. */
static int convert_flex_attention(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  if (kl_onnx_attr(n, "score_mod") || kl_onnx_attr(n, "prob_mod"))
    return kl_onnx_unsupported(c, "score_mod and prob_mod subgraphs are not supported");
  int64_t sp = kl_onnx_attr_int(n, "softmax_precision", 0);
  kl_dtype spt;
  if (sp && (kl_onnx_dtype((int)sp, &spt) || !kl_dtype_is_float(spt)))
    return kl_onnx_fail(c, "softmax_precision %lld is not a float type", (long long)sp);
  kl_value *ins[3] = {need_input(c, n, 0), need_input(c, n, 1), need_input(c, n, 2)};
  if (!ins[0] || !ins[1] || !ins[2]) return -1;
  kl_attr a = kl_af("scale", kl_onnx_attr_float(n, "scale", 0));
  kl_value *y = kl_onnx_emit(c, KL_OP_ATTENTION, ins, 3, &a, 1);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* y = x / (bias + alpha/size * sum of x^2 over a channel window)^beta;
 * the window sum is an average pool over a [N, 1, C, rest] view that
 * counts the zero padding, so it already carries the 1/size. */
static int convert_lrn(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  int64_t size = kl_onnx_attr_int(n, "size", 0);
  if (size < 1) return kl_onnx_fail(c, "size must be >= 1");
  if (x->shape.rank < 2) return kl_onnx_fail(c, "input must be [N, C, ...]");
  double alpha = kl_onnx_attr_float(n, "alpha", 1e-4), beta = kl_onnx_attr_float(n, "beta", 0.75);
  double bias = kl_onnx_attr_float(n, "bias", 1.0);
  int64_t rest = 1;
  for (int d = 2; d < x->shape.rank; d++) rest *= x->shape.dims[d];
  int64_t view[4] = {x->shape.dims[0], 1, x->shape.dims[1], rest};
  int64_t k[2] = {size, 1}, st[2] = {1, 1}, pads[4] = {(size - 1) / 2, 0, size / 2, 0};
  kl_attr a[4] = {kl_ais("kernel", k, 2), kl_ais("strides", st, 2), kl_ais("pads", pads, 4),
                  kl_ai("count_include_pad", 1)};
  kl_value *avg = unary(c, KL_OP_AVG_POOL2D, reshape(c, binary(c, KL_OP_MUL, x, x), view, 4), a, 4);
  avg = reshape(c, avg, x->shape.dims, x->shape.rank);
  kl_value *den = with_scalar(c, KL_OP_ADD, with_scalar(c, KL_OP_MUL, avg, alpha), bias);
  kl_value *y = binary(c, KL_OP_DIV, x, with_scalar(c, KL_OP_POW, den, beta));
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* (x - mean) / (sqrt(var) + 1e-9) over `axes` (default [0, 2, 3]). */
static int convert_mvn(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  static const int64_t dflt[3] = {0, 2, 3};
  const int64_t *axes = dflt;
  int k = kl_onnx_attr_ints(n, "axes", &axes);
  if (k < 0) {
    axes = dflt;
    k = 3;
  }
  kl_value *dev = binary(c, KL_OP_SUB, x, reduce(c, KL_OP_REDUCE_MEAN, x, axes, k, true));
  kl_value *var = reduce(c, KL_OP_REDUCE_MEAN, binary(c, KL_OP_MUL, dev, dev), axes, k, true);
  kl_value *sd = with_scalar(c, KL_OP_ADD, unary(c, KL_OP_SQRT, var, NULL, 0), 1e-9);
  kl_value *y = binary(c, KL_OP_DIV, dev, sd);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* LpNormalization: x / ||x||_p along axis (p 1 or 2); a zero norm gives
 * 0, as ONNX's reference. */
static int convert_lp_norm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  int64_t p = kl_onnx_attr_int(n, "p", 2), axis = kl_onnx_attr_int(n, "axis", -1);
  int r = x->shape.rank;
  if (!kl_dtype_is_float(x->dtype))
    return kl_onnx_fail(c, "needs a floating-point input, got %s", kl_dtype_name(x->dtype));
  if (p != 1 && p != 2) return kl_onnx_fail(c, "p must be 1 or 2, got %lld", (long long)p);
  if (axis < -r || axis >= r) return kl_onnx_fail(c, "axis %lld is out of range", (long long)axis);
  if (axis < 0) axis += r;
  kl_value *norm;
  if (p == 1) {
    norm = reduce(c, KL_OP_REDUCE_SUM, unary(c, KL_OP_ABS, x, NULL, 0), &axis, 1, true);
  } else {
    norm = reduce(c, KL_OP_REDUCE_SUM, binary(c, KL_OP_MUL, x, x), &axis, 1, true);
    norm = unary(c, KL_OP_SQRT, norm, NULL, 0);
  }
  kl_value *ins[3] = {with_scalar(c, KL_OP_EQ, norm, 0), NULL, binary(c, KL_OP_DIV, x, norm)};
  ins[1] = kl_onnx_scalar(c, x->dtype, 0);
  if (!ins[0] || !ins[2]) return -1;
  kl_value *y = kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* GroupNormalization: the channels in num_groups groups, each group of a
 * sample normalised as one (layer_norm over [C/G, d...]), then a scale and
 * a bias per group (opset 18) or per channel (21). */
static int convert_group_norm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *scale = need_input(c, n, 1), *bias = need_input(c, n, 2);
  if (!x || !scale || !bias) return -1;
  int64_t g = kl_onnx_attr_int(n, "num_groups", 0);
  int r = x->shape.rank;
  if (r < 2) return kl_onnx_fail(c, "input must be [N, C, d...]");
  int64_t ch = x->shape.dims[1], want = c->opset >= 21 ? ch : g;
  if (g <= 0 || ch % g)
    return kl_onnx_fail(c, "num_groups %lld does not divide the %lld channels", (long long)g,
                        (long long)ch);
  if (kl_shape_numel(&scale->shape) != want || kl_shape_numel(&bias->shape) != want)
    return kl_onnx_fail(c, "scale and bias must have %lld elements (one per %s)", (long long)want,
                        c->opset >= 21 ? "channel" : "group");
  int64_t grouped[3] = {x->shape.dims[0], g, ch / g}; /* [N, G, C/G * d...] */
  for (int d = 2; d < r; d++) grouped[2] *= x->shape.dims[d];
  kl_attr a[2] = {kl_ai("axis", 2), kl_af("epsilon", kl_onnx_attr_float(n, "epsilon", 1e-5))};
  kl_value *t = unary(c, KL_OP_LAYER_NORM, reshape(c, x, grouped, 3), a, 2);
  if (c->opset < 21) { /* per group, on [N, G, rest] */
    t = binary(c, KL_OP_ADD, binary(c, KL_OP_MUL, t, per_channel(c, scale, 3)),
               per_channel(c, bias, 3));
    t = reshape(c, t, x->shape.dims, r);
  } else {
    t = binary(c, KL_OP_ADD, binary(c, KL_OP_MUL, reshape(c, t, x->shape.dims, r),
                                     per_channel(c, scale, r)),
               per_channel(c, bias, r));
  }
  return t ? kl_onnx_bind(c, n, 0, t) : -1;
}

/* ---- Dropout --------------------------------------------------------- */

/* Inference is the identity, with an all-true mask (bool from opset 10,
 * the input's type before).  Training with a non-zero ratio draws random
 * numbers: unsupported. */
static int convert_dropout(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  bool training = c->opset < 7 && !kl_onnx_attr_int(n, "is_test", 0) && wants_output(n, 1);
  double ratio = kl_onnx_attr_float(n, "ratio", 0.5);
  kl_value *tm = c->opset >= 12 ? kl_onnx_input(c, n, 2) : NULL;
  if (tm) {
    const kl_tensor *t = kl_onnx_const(c, tm, "training_mode");
    if (!t) return -1;
    training = t->numel > 0 && t->data[0] != 0;
  }
  kl_value *rv = c->opset >= 12 ? kl_onnx_input(c, n, 1) : NULL;
  if (training && rv) {
    const kl_tensor *t = kl_onnx_const(c, rv, "ratio");
    if (!t) return -1;
    ratio = t->numel > 0 ? t->data[0] : ratio;
  }
  if (training && ratio != 0)
    return kl_onnx_unsupported(c, "training-mode dropout (ratio %g) is random: not supported", ratio);
  if (kl_onnx_bind(c, n, 0, x)) return -1;
  if (!wants_output(n, 1)) return 0;
  double one = 1;
  kl_value *mask = kl_onnx_constant(c, c->opset >= 10 ? KL_BOOL : x->dtype, &x->shape, &one, 1);
  return mask ? kl_onnx_bind(c, n, 1, mask) : -1;
}

/* ---- Softmax, LogSoftmax, Hardmax ------------------------------------ */

/* Hardmax along one axis: one-hot of the first maximum, as argmax
 * compared with the positions along the axis. */
static kl_value *hardmax(kl_onnx_ctx *c, kl_value *x, int axis) {
  kl_attr a[2] = {kl_ai("axis", axis), kl_ai("keepdims", 1)};
  kl_value *am = unary(c, KL_OP_ARGMAX, x, a, 2);
  int64_t k = x->shape.dims[axis];
  kl_shape s = {x->shape.rank, {0}};
  for (int d = 0; d < s.rank; d++) s.dims[d] = d == axis ? k : 1;
  double *pos = malloc(sizeof *pos * (size_t)(k > 0 ? k : 1));
  if (!pos) abort();
  for (int64_t i = 0; i < k; i++) pos[i] = (double)i;
  kl_value *iota = kl_onnx_constant(c, KL_I64, &s, pos, (int)k);
  free(pos);
  return cast(c, binary(c, KL_OP_EQ, am, iota), x->dtype);
}

static kl_value *softmax_like(kl_onnx_ctx *c, const char *op, kl_value *x, int axis) {
  if (!x) return NULL;
  if (!strcmp(op, "Hardmax")) return hardmax(c, x, axis);
  kl_attr a = kl_ai("axis", axis);
  return unary(c, !strcmp(op, "Softmax") ? KL_OP_SOFTMAX : KL_OP_LOG_SOFTMAX, x, &a, 1);
}

/* Before opset 13 these flatten the input to 2-D at `axis` (default 1)
 * and normalise over the whole second part. */
static int convert_softmax(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  int r = x->shape.rank;
  int64_t axis = kl_onnx_attr_int(n, "axis", c->opset >= 13 ? -1 : 1);
  if (axis < -r || axis > r || (c->opset >= 13 && axis == r))
    return kl_onnx_fail(c, "axis %lld is out of range for rank %d", (long long)axis, r);
  if (axis < 0) axis += r;
  kl_value *y;
  if (c->opset >= 13) {
    y = softmax_like(c, n->op_type, x, (int)axis);
  } else {
    int64_t flat[2] = {1, 1};
    for (int d = 0; d < r; d++) flat[d < axis ? 0 : 1] *= x->shape.dims[d];
    y = reshape(c, softmax_like(c, n->op_type, reshape(c, x, flat, 2), 1), x->shape.dims, r);
  }
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- losses ---------------------------------------------------------- */

static kl_value *nll(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *x, kl_value *t,
                     kl_value *w) {
  kl_attr a[2] = {kl_as("reduction", kl_onnx_attr_string(c, n, "reduction", "mean")),
                  kl_ai("ignore_index", kl_onnx_attr_int(n, "ignore_index", 0))};
  kl_value *ins[3] = {x, t, w};
  if (!x || !t) return NULL;
  return kl_onnx_emit(c, KL_OP_NLL_LOSS, ins, w ? 3 : 2, a, kl_onnx_attr(n, "ignore_index") ? 2 : 1);
}

static int convert_nll_loss(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *y = nll(c, n, need_input(c, n, 0), need_input(c, n, 1), kl_onnx_input(c, n, 2));
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* log_softmax over the class axis 1, then the NLL loss. */
static int convert_sce_loss(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  if (x->shape.rank < 2) return kl_onnx_fail(c, "scores must be [N, C, ...]");
  kl_value *lp = softmax_like(c, "LogSoftmax", x, 1);
  kl_value *y = nll(c, n, lp, need_input(c, n, 1), kl_onnx_input(c, n, 2));
  if (!y || kl_onnx_bind(c, n, 0, y)) return -1;
  return kl_onnx_bind(c, n, 1, lp);
}

/* ---- DepthToSpace, SpaceToDepth -------------------------------------- */

static int convert_depth_space(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  int64_t b = kl_onnx_attr_int(n, "blocksize", 0);
  if (x->shape.rank != 4) return kl_onnx_fail(c, "input must be [N, C, H, W]");
  if (b < 1 || b > 65536) return kl_onnx_fail(c, "blocksize must be >= 1");
  int64_t nb = x->shape.dims[0], ch = x->shape.dims[1], h = x->shape.dims[2], w = x->shape.dims[3];
  kl_value *y;
  if (!strcmp(n->op_type, "DepthToSpace")) {
    if (ch % (b * b)) return kl_onnx_fail(c, "channels %lld are not a multiple of blocksize^2",
                                          (long long)ch);
    const char *mode = kl_onnx_attr_string(c, n, "mode", "DCR");
    bool crd = !strcmp(mode, "CRD");
    if (!crd && strcmp(mode, "DCR")) return kl_onnx_fail(c, "mode must be DCR or CRD");
    int64_t cb = ch / (b * b);
    int64_t dcr[6] = {nb, b, b, cb, h, w}, crd6[6] = {nb, cb, b, b, h, w};
    static const int64_t pdcr[6] = {0, 3, 4, 1, 5, 2}, pcrd[6] = {0, 1, 4, 2, 5, 3};
    int64_t out[4] = {nb, cb, h * b, w * b};
    y = reshape(c, transpose(c, reshape(c, x, crd ? crd6 : dcr, 6), crd ? pcrd : pdcr), out, 4);
  } else {
    if (h % b || w % b) return kl_onnx_fail(c, "H and W must be multiples of blocksize");
    /* DCR: channel (bh * b + bw) * C + c; CRD: c * b * b + bh * b + bw */
    const char *mode = kl_onnx_attr_string(c, n, "mode", "DCR");
    bool crd = !strcmp(mode, "CRD");
    if (!crd && strcmp(mode, "DCR")) return kl_onnx_fail(c, "mode must be DCR or CRD");
    int64_t six[6] = {nb, ch, h / b, b, w / b, b}, out[4] = {nb, ch * b * b, h / b, w / b};
    static const int64_t pdcr[6] = {0, 3, 5, 1, 2, 4}, pcrd[6] = {0, 1, 3, 5, 2, 4};
    y = reshape(c, transpose(c, reshape(c, x, six, 6), crd ? pcrd : pdcr), out, 4);
  }
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- Resize, Upsample ------------------------------------------------ */

/* A constant float input as doubles; 0 entries when absent or empty. */
static int const_floats(kl_onnx_ctx *c, kl_value *v, const char *what, double *out, int cap) {
  if (!v) return 0;
  const kl_tensor *t = kl_onnx_const(c, v, what);
  if (!t) return -1;
  if (t->numel > cap) return kl_onnx_fail(c, "%s has %lld values (at most %d)", what,
                                          (long long)t->numel, cap);
  for (int64_t i = 0; i < t->numel; i++) out[i] = t->data[i];
  return (int)t->numel;
}

/* Resize-18's axes: the scales, sizes and roi given for `axes` only,
 * spread over every axis (the others keep scale 1, their size and the
 * whole roi).  n* are the counts read; each becomes per-axis. */
static int resize_spread_axes(kl_onnx_ctx *c, const Onnx__NodeProto *n, const kl_value *x,
                              double *scales,
                              int *nscales, int64_t *sizes, int *nsizes, double *roi,
                              int *nroi, int64_t *axes, int *naxes) {
  const int64_t *ax;
  int k = kl_onnx_attr_ints(n, "axes", &ax), r = x->shape.rank;
  *naxes = r;
  for (int d = 0; d < r; d++) axes[d] = d;
  if (k < 0) return 0;
  if (k < 1 || k > r) return kl_onnx_fail(c, "axes has %d entries for rank %d", k, r);
  bool seen[KL_MAX_RANK] = {false};
  for (int i = 0; i < k; i++) {
    int64_t a = ax[i] < 0 ? ax[i] + r : ax[i];
    if (a < 0 || a >= r || seen[a])
      return kl_onnx_fail(c, "axes[%d] = %lld is out of range or repeated", i, (long long)ax[i]);
    seen[a] = true;
    axes[i] = a;
  }
  if ((*nscales && *nscales != k) || (*nsizes && *nsizes != k) || (*nroi && *nroi != 2 * k))
    return kl_onnx_fail(c, "scales, sizes and roi must have one entry (roi: two) per axis in "
                        "axes (%d)", k);
  double sc[KL_MAX_RANK], ro[2 * KL_MAX_RANK];
  int64_t sz[KL_MAX_RANK];
  for (int d = 0; d < r; d++) sc[d] = 1.0, sz[d] = x->shape.dims[d], ro[d] = 0.0, ro[r + d] = 1.0;
  for (int i = 0; i < k; i++) {
    if (*nscales) sc[axes[i]] = scales[i];
    if (*nsizes) sz[axes[i]] = sizes[i];
    if (*nroi) ro[axes[i]] = roi[i], ro[r + axes[i]] = roi[k + i];
  }
  memcpy(scales, sc, sizeof sc);
  memcpy(roi, ro, sizeof ro);
  memcpy(sizes, sz, sizeof sz);
  *naxes = k;
  if (*nscales) *nscales = r;
  if (*nroi) *nroi = 2 * r;
  if (*nsizes) *nsizes = r;
  return 0;
}

/* keep_aspect_ratio_policy "not_larger" / "not_smaller": one scale for
 * the resized axes, the least / greatest of sizes / in, and sizes
 * round(scale * in) (halves up). */
static int resize_keep_aspect(kl_onnx_ctx *c, const char *policy, const kl_value *x,
                              const int64_t *axes, int naxes, int64_t *sizes, double *scales) {
  bool larger = !strcmp(policy, "not_smaller");
  if (!larger && strcmp(policy, "not_larger"))
    return kl_onnx_fail(c, "keep_aspect_ratio_policy must be \"stretch\", \"not_larger\" or "
                        "\"not_smaller\", not \"%s\"", policy);
  double scale = 0;
  for (int i = 0; i < naxes; i++) {
    double s = (double)sizes[axes[i]] / (double)x->shape.dims[axes[i]];
    if (i == 0 || (larger ? s > scale : s < scale)) scale = s;
  }
  for (int d = 0; d < x->shape.rank; d++) scales[d] = 1.0;
  for (int i = 0; i < naxes; i++) {
    double len = floor(scale * (double)x->shape.dims[axes[i]] + 0.5);
    if (!(len >= 1 && len <= (double)KL_MAX_NUMEL))
      return kl_onnx_fail(c, "axis %lld would resize to %g elements", (long long)axes[i], len);
    sizes[axes[i]] = (int64_t)len;
    scales[axes[i]] = scale;
  }
  return 0;
}

/* Scales give floor(in * scale) outputs (the crop's share of it for
 * tf_crop_and_resize); sizes give the scales out / in, unless a
 * keep_aspect_ratio_policy fixes one scale for them all. */
static int convert_resize(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  bool upsample = !strcmp(n->op_type, "Upsample");
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  int r = x->shape.rank;
  double scales[KL_MAX_RANK], roi[2 * KL_MAX_RANK];
  int64_t sizes[KL_MAX_RANK];
  int nscales = 0, nsizes = 0, nroi = 0;
  bool sized_scales = false; /* scales to pass beside sizes */
  const char *mode = kl_onnx_attr_string(c, n, "mode", "nearest");
  const char *coord = "asymmetric", *nearest = "floor";
  bool antialias = false;
  if (upsample && c->opset < 9) {
    const Onnx__AttributeProto *a = kl_onnx_attr(n, "scales");
    if (!a) return kl_onnx_fail(c, "attribute scales is required");
    if ((int)a->n_floats > KL_MAX_RANK) return kl_onnx_fail(c, "too many scales");
    for (size_t i = 0; i < a->n_floats; i++) scales[i] = a->floats[i];
    nscales = (int)a->n_floats;
  } else if (upsample || c->opset < 11) {
    nscales = const_floats(c, need_input(c, n, 1), "scales", scales, KL_MAX_RANK);
  } else {
    coord = kl_onnx_attr_string(c, n, "coordinate_transformation_mode", "half_pixel");
    nearest = kl_onnx_attr_string(c, n, "nearest_mode", "round_prefer_floor");
    antialias = kl_onnx_attr_int(n, "antialias", 0) != 0;
    if (!strcmp(coord, "tf_crop_and_resize") &&
        (nroi = const_floats(c, kl_onnx_input(c, n, 1), "roi", roi, 2 * KL_MAX_RANK)) < 0)
      return -1;
    nscales = const_floats(c, kl_onnx_input(c, n, 2), "scales", scales, KL_MAX_RANK);
    kl_value *sz = kl_onnx_input(c, n, 3);
    if (sz && (nsizes = kl_onnx_const_ints(c, sz, "sizes", sizes, KL_MAX_RANK)) < 0) return -1;
    if (nscales < 0) return -1;
    int64_t axes[KL_MAX_RANK];
    int naxes;
    if (resize_spread_axes(c, n, x, scales, &nscales, sizes, &nsizes, roi, &nroi, axes, &naxes))
      return -1;
    const char *policy = kl_onnx_attr_string(c, n, "keep_aspect_ratio_policy", "stretch");
    if (nsizes == r && strcmp(policy, "stretch")) {
      if (resize_keep_aspect(c, policy, x, axes, naxes, sizes, scales)) return -1;
      sized_scales = true;
    }
  }
  if (nscales < 0) return -1;
  if (!strcmp(mode, "bilinear")) mode = "linear"; /* Upsample-7's name */
  if (nsizes ? nsizes != r : nscales != r)
    return kl_onnx_fail(c, "needs %d scales or sizes (one per axis), got %d", r,
                        nsizes ? nsizes : nscales);
  if (nroi && nroi != 2 * r) return kl_onnx_fail(c, "roi must have %d values", 2 * r);
  if (!nsizes)
    for (int d = 0; d < r; d++) {
      if (!(scales[d] > 0) || scales[d] > 1e9)
        return kl_onnx_fail(c, "scales[%d] = %g must be positive", d, scales[d]);
      /* in f32, as ONNX Runtime: 5 * 1.4f is 7, not 6.99999 */
      float span = nroi ? (float)roi[r + d] - (float)roi[d] : 1.0f;
      float len = floorf((float)x->shape.dims[d] * span * (float)scales[d]);
      if (!(len >= 1 && len <= (float)KL_MAX_NUMEL))
        return kl_onnx_fail(c, "axis %d would resize to %g elements", d, (double)len);
      sizes[d] = (int64_t)len;
    }
  kl_attr a[11];
  int na = 0;
  a[na++] = kl_ais("sizes", sizes, r);
  if (!nsizes || sized_scales)
    a[na++] = (kl_attr){.name = "scales", .kind = KL_ATTR_FLOATS, .floats = scales, .n = r};
  if (nroi) a[na++] = (kl_attr){.name = "roi", .kind = KL_ATTR_FLOATS, .floats = roi, .n = 2 * r};
  a[na++] = kl_as("mode", mode);
  a[na++] = kl_as("coordinate_transformation_mode", coord);
  a[na++] = kl_as("nearest_mode", nearest);
  a[na++] = kl_af("cubic_coeff_a", kl_onnx_attr_float(n, "cubic_coeff_a", -0.75));
  a[na++] = kl_ai("exclude_outside", kl_onnx_attr_int(n, "exclude_outside", 0));
  a[na++] = kl_af("extrapolation_value", kl_onnx_attr_float(n, "extrapolation_value", 0.0));
  if (antialias) a[na++] = kl_ai("antialias", 1);
  kl_value *y = unary(c, KL_OP_RESIZE, x, a, na);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- RoiAlign -------------------------------------------------------- */

/* RoiAlign-10 shifts nothing (output_half_pixel); 16 adds the mode,
 * half_pixel by default. */
static int convert_roi_align(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *in[3] = {need_input(c, n, 0), need_input(c, n, 1), need_input(c, n, 2)};
  if (!in[0] || !in[1] || !in[2]) return -1;
  const char *coord = c->opset < 16 ? "output_half_pixel"
                                    : kl_onnx_attr_string(c, n, "coordinate_transformation_mode",
                                                          "half_pixel");
  kl_attr a[6] = {kl_as("mode", kl_onnx_attr_string(c, n, "mode", "avg")),
                  kl_ai("output_height", kl_onnx_attr_int(n, "output_height", 1)),
                  kl_ai("output_width", kl_onnx_attr_int(n, "output_width", 1)),
                  kl_ai("sampling_ratio", kl_onnx_attr_int(n, "sampling_ratio", 0)),
                  kl_af("spatial_scale", kl_onnx_attr_float(n, "spatial_scale", 1.0)),
                  kl_as("coordinate_transformation_mode", coord)};
  kl_value *y = kl_onnx_emit(c, KL_OP_ROI_ALIGN, in, 3, a, 6);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* ---- AffineGrid ------------------------------------------------------ */

/* grid[n, p, :] = theta[n] @ [x, y, (z,) 1] for every point p of the
 * spatial size (x along the last axis): the homogeneous coordinates are a
 * constant [P, k + 1], and the whole grid one batched matmul with theta
 * transposed. */
static int convert_affine_grid(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *theta = need_input(c, n, 0), *sv = need_input(c, n, 1);
  if (!theta || !sv) return -1;
  int64_t size[5];
  int ns = kl_onnx_const_ints(c, sv, "size", size, 5);
  if (ns < 0) return -1;
  int k = ns - 2;
  if (k != 2 && k != 3) return kl_onnx_fail(c, "size must be [N, C, H, W] or [N, C, D, H, W]");
  if (!kl_dtype_is_float(theta->dtype) || theta->shape.rank != 3 ||
      theta->shape.dims[0] != size[0] || theta->shape.dims[1] != k ||
      theta->shape.dims[2] != k + 1)
    return kl_onnx_fail(c, "theta must be float [%lld, %d, %d]", (long long)size[0], k, k + 1);
  bool ac = kl_onnx_attr_int(n, "align_corners", 0) != 0;
  int64_t pts = 1;
  for (int i = 0; i < k; i++) {
    if (size[2 + i] < 1 || size[2 + i] > KL_MAX_NUMEL / pts)
      return kl_onnx_fail(c, "size[%d] = %lld is not a length", 2 + i, (long long)size[2 + i]);
    pts *= size[2 + i];
  }
  if (pts > KL_MAX_NUMEL / (k + 1)) return kl_onnx_fail(c, "the grid would be too large");
  double *base = malloc(sizeof *base * (size_t)(pts * (k + 1)));
  if (!base) return kl_onnx_fail(c, "out of memory");
  for (int64_t p = 0; p < pts; p++) {
    int64_t rest = p;
    for (int i = k - 1; i >= 0; i--) { /* column k-1-i holds axis i */
      int64_t len = size[2 + i], at = rest % len;
      rest /= len;
      double v = ac ? (len > 1 ? -1 + 2.0 * (double)at / (double)(len - 1) : -1.0)
                    : (2.0 * (double)at + 1) / (double)len - 1;
      base[p * (k + 1) + (k - 1 - i)] = v;
    }
    base[p * (k + 1) + k] = 1;
  }
  kl_shape bs = {2, {pts, k + 1}};
  kl_value *b = kl_onnx_constant(c, theta->dtype, &bs, base, (int)(pts * (k + 1)));
  free(base);
  static const int64_t perm[3] = {0, 2, 1};
  kl_value *g = binary(c, KL_OP_MATMUL, b, transpose(c, theta, perm));
  int64_t out[5] = {size[0]};
  for (int i = 0; i < k; i++) out[1 + i] = size[2 + i];
  out[k + 1] = k;
  g = reshape(c, g, out, k + 2);
  return g ? kl_onnx_bind(c, n, 0, g) : -1;
}

/* ---- Einsum ---------------------------------------------------------- */

/* Labels are letters (their ASCII codes) and the axes an ellipsis covers
 * (ELL + position, right-aligned across operands). */
enum { ELL = 128, NLABEL = ELL + KL_MAX_RANK };

typedef struct {
  kl_value *v;
  int lab[KL_MAX_RANK]; /* one label per axis of v */
} term;

static bool has_label(const term *t, int l) {
  for (int i = 0; i < t->v->shape.rank; i++)
    if (t->lab[i] == l) return true;
  return false;
}

/* Parses one side of the equation ("ab...c") against a rank; ellipsis
 * axes take labels ELL + (ell_rank - count + j). */
static int parse_term(kl_onnx_ctx *c, const char *s, size_t len, int rank, int ell_rank,
                      int *lab, int *nlab) {
  int k = 0, before = 0;
  bool ell = false;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '.') {
      if (ell || i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.')
        return kl_onnx_fail(c, "malformed ellipsis in the equation");
      ell = true;
      before = k;
      i += 2;
      continue;
    }
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
      return kl_onnx_fail(c, "unexpected '%c' in the equation", s[i]);
    if (k >= KL_MAX_RANK) return kl_onnx_fail(c, "too many labels in one term");
    lab[k++] = s[i];
  }
  if (!ell) {
    if (rank >= 0 && k != rank)
      return kl_onnx_fail(c, "a term has %d labels for an input of rank %d", k, rank);
    *nlab = k;
    return 0;
  }
  int ne = rank >= 0 ? rank - k : ell_rank;
  if (ne < 0 || k + ne > KL_MAX_RANK || ne > ell_rank)
    return kl_onnx_fail(c, "the ellipsis does not fit an input of rank %d", rank);
  memmove(lab + before + ne, lab + before, sizeof(int) * (size_t)(k - before));
  for (int j = 0; j < ne; j++) lab[before + j] = ELL + ell_rank - ne + j;
  *nlab = k + ne;
  return 0;
}

/* Sums the axes of t whose labels `keep` does not mark. */
static int sum_unkept(kl_onnx_ctx *c, term *t, const bool *keep) {
  int64_t axes[KL_MAX_RANK];
  int na = 0, r = t->v->shape.rank, w = 0;
  for (int i = 0; i < r; i++) {
    if (!keep[t->lab[i]]) axes[na++] = i;
    else t->lab[w++] = t->lab[i];
  }
  if (!na) return 0;
  t->v = reduce(c, KL_OP_REDUCE_SUM, t->v, axes, na, false);
  return t->v ? 0 : -1;
}

/* Repeated labels in one term take the diagonal: multiply by an identity
 * mask over the two axes, then sum one of them away. */
static int take_diagonals(kl_onnx_ctx *c, term *t) {
  for (int p = 0; p < t->v->shape.rank; p++)
    for (int q = p + 1; q < t->v->shape.rank; q++) {
      if (t->lab[p] != t->lab[q]) continue;
      int64_t d = t->v->shape.dims[p];
      if (t->v->shape.dims[q] != d) return kl_onnx_fail(c, "a repeated label spans unequal dims");
      kl_shape ms = {t->v->shape.rank, {0}};
      for (int i = 0; i < ms.rank; i++) ms.dims[i] = i == p || i == q ? d : 1;
      double *eye = calloc((size_t)(d * d > 0 ? d * d : 1), sizeof *eye);
      if (!eye) abort();
      for (int64_t i = 0; i < d; i++) eye[i * d + i] = 1;
      kl_value *mask = kl_onnx_constant(c, t->v->dtype, &ms, eye, (int)(d * d));
      free(eye);
      int64_t ax = q;
      t->v = reduce(c, KL_OP_REDUCE_SUM, binary(c, KL_OP_MUL, t->v, mask), &ax, 1, false);
      if (!t->v) return -1;
      for (int i = q; i < t->v->shape.rank; i++) t->lab[i] = t->lab[i + 1];
      q--;
    }
  return 0;
}

/* Dim of label l in t, or -1. */
static int64_t label_dim(const term *t, int l) {
  for (int i = 0; i < t->v->shape.rank; i++)
    if (t->lab[i] == l) return t->v->shape.dims[i];
  return -1;
}

/* Permutes t into the label order `order` (n labels) and reshapes it to
 * the group sizes `groups` (ng groups of consecutive labels). */
static kl_value *arrange(kl_onnx_ctx *c, const term *t, const int *order, int n,
                         const int *gsize, int ng) {
  int64_t perm[KL_MAX_RANK], dims[3];
  for (int i = 0; i < n; i++)
    for (int j = 0; j < t->v->shape.rank; j++)
      if (t->lab[j] == order[i]) perm[i] = j;
  int at = 0;
  for (int g = 0; g < ng; g++) {
    dims[g] = 1;
    for (int i = 0; i < gsize[g]; i++) dims[g] *= label_dim(t, order[at++]);
  }
  return reshape(c, transpose(c, t->v, perm), dims, ng);
}

/* a x b -> one term over the labels `keep` marks, through one batched
 * matmul: [batch, left, contracted] @ [batch, contracted, right]. */
static int contract(kl_onnx_ctx *c, term *a, term *b, const bool *keep) {
  bool ka[NLABEL], kb[NLABEL];
  for (int l = 0; l < NLABEL; l++) ka[l] = kb[l] = keep[l];
  for (int i = 0; i < b->v->shape.rank; i++) ka[b->lab[i]] = true;
  for (int i = 0; i < a->v->shape.rank; i++) kb[a->lab[i]] = true;
  if (sum_unkept(c, a, ka) || sum_unkept(c, b, kb)) return -1;
  int batch[KL_MAX_RANK], left[KL_MAX_RANK], right[KL_MAX_RANK], con[KL_MAX_RANK];
  int nb = 0, nl = 0, nr = 0, nc = 0;
  for (int i = 0; i < a->v->shape.rank; i++) {
    int l = a->lab[i];
    if (!has_label(b, l)) left[nl++] = l;
    else if (label_dim(b, l) != a->v->shape.dims[i])
      return kl_onnx_fail(c, "label '%c' has unequal dims", l < ELL ? l : '.');
    else if (keep[l]) batch[nb++] = l;
    else con[nc++] = l;
  }
  for (int i = 0; i < b->v->shape.rank; i++)
    if (!has_label(a, b->lab[i])) right[nr++] = b->lab[i];
  int oa[KL_MAX_RANK], ob[KL_MAX_RANK], k = 0;
  memcpy(oa, batch, sizeof(int) * (size_t)nb);
  memcpy(oa + nb, left, sizeof(int) * (size_t)nl);
  memcpy(oa + nb + nl, con, sizeof(int) * (size_t)nc);
  memcpy(ob, batch, sizeof(int) * (size_t)nb);
  memcpy(ob + nb, con, sizeof(int) * (size_t)nc);
  memcpy(ob + nb + nc, right, sizeof(int) * (size_t)nr);
  int ga[3] = {nb, nl, nc}, gb[3] = {nb, nc, nr};
  kl_value *y = binary(c, KL_OP_MATMUL, arrange(c, a, oa, nb + nl + nc, ga, 3),
                       arrange(c, b, ob, nb + nc + nr, gb, 3));
  int64_t dims[KL_MAX_RANK];
  int lab[KL_MAX_RANK];
  if (nb + nl + nr > KL_MAX_RANK) return kl_onnx_fail(c, "the result has too many axes");
  for (int i = 0; i < nb; i++) dims[k] = label_dim(a, batch[i]), lab[k++] = batch[i];
  for (int i = 0; i < nl; i++) dims[k] = label_dim(a, left[i]), lab[k++] = left[i];
  for (int i = 0; i < nr; i++) dims[k] = label_dim(b, right[i]), lab[k++] = right[i];
  a->v = reshape(c, y, dims, k);
  memcpy(a->lab, lab, sizeof(int) * (size_t)k);
  return a->v ? 0 : -1;
}

/* Any number of operands: diagonals, then sums of labels no one else
 * needs, then pairwise contractions left to right, then the output
 * order.  Ellipsis axes must agree in size (no broadcasting of 1s). */
static int convert_einsum(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const char *eq = kl_onnx_attr_string(c, n, "equation", NULL);
  if (!eq) return kl_onnx_fail(c, "attribute equation is required");
  char buf[512];
  size_t len = 0;
  for (const char *p = eq; *p && len < sizeof buf - 1; p++)
    if (*p != ' ') buf[len++] = *p;
  buf[len] = 0;
  int nin = kl_onnx_ninputs(n);
  if (nin < 1 || nin > 16) return kl_onnx_fail(c, "needs 1 to 16 inputs, got %d", nin);
  term t[16];
  char *arrow = strstr(buf, "->");
  size_t lhs_len = arrow ? (size_t)(arrow - buf) : len;
  int ell_rank = 0;
  /* the ellipsis spans the most axes any operand gives it */
  for (int pass = 0; pass < 2; pass++) {
    const char *s = buf;
    for (int i = 0; i < nin; i++) {
      const char *e = memchr(s, ',', lhs_len - (size_t)(s - buf));
      size_t tl = e ? (size_t)(e - s) : lhs_len - (size_t)(s - buf);
      if (!e && i < nin - 1) return kl_onnx_fail(c, "the equation has fewer terms than inputs");
      if (pass == 0 && !(t[i].v = need_input(c, n, i))) return -1;
      int nl, letters = 0;
      for (size_t j = 0; j < tl; j++) letters += s[j] != '.';
      if (pass == 0) {
        if (memchr(s, '.', tl) && t[i].v->shape.rank - letters > ell_rank)
          ell_rank = t[i].v->shape.rank - letters;
      } else if (parse_term(c, s, tl, t[i].v->shape.rank, ell_rank, t[i].lab, &nl)) {
        return -1;
      }
      s += tl + 1;
      if (pass == 1 && i == nin - 1 && (size_t)(s - 1 - buf) != lhs_len)
        return kl_onnx_fail(c, "the equation has more terms than inputs");
    }
  }
  int out[KL_MAX_RANK], nout = 0, count[NLABEL] = {0};
  for (int i = 0; i < nin; i++)
    for (int j = 0; j < t[i].v->shape.rank; j++) count[t[i].lab[j]]++;
  if (arrow) {
    if (parse_term(c, arrow + 2, strlen(arrow + 2), -1, ell_rank, out, &nout)) return -1;
  } else {
    for (int l = ELL; l < ELL + ell_rank; l++) out[nout++] = l;
    for (int l = 0; l < ELL && nout < KL_MAX_RANK; l++)
      if (count[l] == 1) out[nout++] = l;
  }
  bool in_out[NLABEL] = {false};
  for (int i = 0; i < nout; i++) {
    if (!count[out[i]] || in_out[out[i]])
      return kl_onnx_fail(c, "output label '%c' is repeated or in no input",
                          out[i] < ELL ? out[i] : '.');
    in_out[out[i]] = true;
  }
  for (int i = 0; i < nin; i++) {
    /* keep what the output or any other operand needs */
    bool keep[NLABEL];
    memcpy(keep, in_out, sizeof keep);
    for (int j = 0; j < nin; j++)
      for (int k = 0; j != i && k < t[j].v->shape.rank; k++) keep[t[j].lab[k]] = true;
    if (take_diagonals(c, &t[i]) || sum_unkept(c, &t[i], keep)) return -1;
  }
  for (int i = 1; i < nin; i++) {
    bool keep[NLABEL];
    memcpy(keep, in_out, sizeof keep);
    for (int j = i + 1; j < nin; j++)
      for (int k = 0; k < t[j].v->shape.rank; k++) keep[t[j].lab[k]] = true;
    if (contract(c, &t[0], &t[i], keep)) return -1;
  }
  if (sum_unkept(c, &t[0], in_out)) return -1;
  int64_t perm[KL_MAX_RANK];
  for (int i = 0; i < nout; i++)
    for (int j = 0; j < t[0].v->shape.rank; j++)
      if (t[0].lab[j] == out[i]) perm[i] = j;
  kl_value *y = transpose(c, t[0].v, perm);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

const kl_onnx_op kl_onnx_ops_nn[] = {
    {"MatMul", 1, convert_matmul},
    {"Gemm", 1, convert_gemm},
    {"Conv", 1, convert_conv},
    {"ConvTranspose", 1, convert_conv_transpose},
    {"MaxPool", 1, convert_pool},
    {"AveragePool", 1, convert_pool},
    {"MaxUnpool", 9, convert_max_unpool},
    {"GlobalAveragePool", 1, convert_global_pool},
    {"GlobalMaxPool", 1, convert_global_pool},
    {"LpPool", 1, convert_pool},
    {"Col2Im", 18, convert_col2im},
    {"DeformConv", 19, convert_deform_conv},
    {"DFT", 17, convert_dft},
    {"STFT", 17, convert_stft},
    {"MelWeightMatrix", 17, convert_mel_weight_matrix},
    {"GlobalLpPool", 1, convert_global_pool},
    {"BatchNormalization", 1, convert_batch_norm},
    {"InstanceNormalization", 1, convert_instance_norm},
    {"LayerNormalization", 17, convert_layer_norm},
    {"RMSNormalization", 23, convert_rms_norm},
    {"Attention", 23, convert_attention},
    {"RotaryEmbedding", 23, convert_rotary},
    {"CausalConvWithState", 27, convert_causal_conv},
    {"LinearAttention", 27, convert_linear_attention},
    {"ai.onnx.preview.FlexAttention", 1, convert_flex_attention},
    {"LRN", 1, convert_lrn},
    {"MeanVarianceNormalization", 9, convert_mvn},
    {"LpNormalization", 1, convert_lp_norm},
    {"GroupNormalization", 18, convert_group_norm},
    {"Dropout", 1, convert_dropout},
    {"Softmax", 1, convert_softmax},
    {"LogSoftmax", 1, convert_softmax},
    {"Hardmax", 1, convert_softmax},
    {"NegativeLogLikelihoodLoss", 12, convert_nll_loss},
    {"SoftmaxCrossEntropyLoss", 12, convert_sce_loss},
    {"DepthToSpace", 1, convert_depth_space},
    {"SpaceToDepth", 1, convert_depth_space},
    {"Resize", 10, convert_resize},
    {"AffineGrid", 20, convert_affine_grid},
    {"RoiAlign", 10, convert_roi_align},
    {"Upsample", 7, convert_resize},
    {"Einsum", 12, convert_einsum},
    {NULL, 0, NULL},
};
