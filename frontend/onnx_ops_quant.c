/* onnx_ops_quant.c - ONNX quantization ops: QuantizeLinear,
 * DequantizeLinear, DynamicQuantizeLinear and the integer / quantized
 * contractions (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv).
 * They decompose into casts and float arithmetic: 8-bit products summed in
 * f64 are exact at any size the IR holds, so the float contractions give
 * the integer results. */
#include <stdio.h>
#include <string.h>

#include "onnx_internal.h"

#include "onnx_emit.h"

/* x - zp in dtype t; zp may be absent (0). */
static kl_value *shifted(kl_onnx_ctx *c, kl_value *x, kl_value *zp, kl_dtype t) {
  x = cast(c, x, t);
  return zp ? binary(c, KL_OP_SUB, x, cast(c, zp, t)) : x;
}

/* ---- quantization parameters ----------------------------------------- */

/* A 1-D parameter p (a scale or zero point) of more than one element lies
 * along `axis` of a rank-`rank` operand: reshaped so that it broadcasts
 * there.  Scalars and one-element vectors broadcast as they are. */
static kl_value *along_axis(kl_onnx_ctx *c, kl_value *p, int axis, int rank, int64_t dim,
                            const char *what) {
  char b[128];
  if (!p || p->shape.rank == 0 || kl_shape_numel(&p->shape) == 1) return p;
  if (p->shape.rank != 1) {
    kl_onnx_unsupported(c, "%s of shape %s: only per-tensor and per-axis (1-D) quantization",
                        what, kl_shape_str(&p->shape, b, sizeof b));
    return NULL;
  }
  if (axis < 0 || axis >= rank) {
    kl_onnx_fail(c, "%s is per axis, but the axis is out of range for a rank-%d operand", what,
                 rank);
    return NULL;
  }
  if (p->shape.dims[0] != dim) {
    kl_onnx_fail(c, "%s has %lld elements, which do not match axis %d of a rank-%d operand",
                 what, (long long)p->shape.dims[0], axis, rank);
    return NULL;
  }
  kl_shape s = {.rank = rank};
  for (int i = 0; i < rank; i++) s.dims[i] = i == axis ? dim : 1;
  return reshape(c, p, &s);
}

/* A blocked parameter p (x's rank, dim `axis` ceil(x's / block)) with
 * each element repeated `block` times along the axis, cut to x's length:
 * p[.., nb, ..] -> [.., nb, 1, ..] -> expand [.., nb, block, ..] ->
 * [.., nb * block, ..] -> slice to x.dims[axis]. */
static kl_value *blocked(kl_onnx_ctx *c, kl_value *p, const kl_value *x, int axis, int64_t block,
                         const char *what) {
  char a[128], b[128];
  int r = x->shape.rank;
  int64_t len = x->shape.dims[axis], nb = (len + block - 1) / block;
  bool ok = p->shape.rank == r && r < KL_MAX_RANK;
  for (int i = 0; ok && i < r; i++) ok = p->shape.dims[i] == (i == axis ? nb : x->shape.dims[i]);
  if (!ok) {
    kl_onnx_fail(c, "%s of shape %s does not block x of shape %s by %lld along axis %d", what,
                 kl_shape_str(&p->shape, a, sizeof a), kl_shape_str(&x->shape, b, sizeof b),
                 (long long)block, axis);
    return NULL;
  }
  kl_shape one = {.rank = r + 1}, wide, flat = x->shape;
  for (int i = 0, j = 0; i < r; i++) {
    one.dims[j++] = p->shape.dims[i];
    if (i == axis) one.dims[j++] = 1;
  }
  wide = one;
  wide.dims[axis + 1] = block;
  flat.dims[axis] = nb * block;
  kl_attr to = kl_ais("shape", wide.dims, wide.rank);
  p = unary(c, KL_OP_EXPAND, reshape(c, p, &one), &to, 1);
  p = reshape(c, p, &flat);
  if (nb * block != len) {
    int64_t st = 0, ax = axis;
    kl_attr sl[3] = {kl_ais("starts", &st, 1), kl_ais("ends", &len, 1), kl_ais("axes", &ax, 1)};
    p = unary(c, KL_OP_SLICE, p, sl, 3);
  }
  return p;
}

/* Scale and zero point of input x: per tensor, along `axis`, or blocked
 * along it (block_size, opset 21). */
static int read_params(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *x, int k_scale,
                       kl_value **scale, kl_value **zp) {
  /* axis matters only for per-axis parameters, which check it. */
  int r = x->shape.rank;
  int64_t a = kl_onnx_attr_int(n, "axis", 1), block = kl_onnx_attr_int(n, "block_size", 0);
  int axis = a < -r || a >= r ? -1 : (int)(a < 0 ? a + r : a);
  *scale = need_input(c, n, k_scale);
  *zp = kl_onnx_input(c, n, k_scale + 1);
  if (!*scale) return -1;
  if (!kl_dtype_is_float((*scale)->dtype))
    return kl_onnx_fail(c, "the scale must be a float tensor, got %s",
                        kl_dtype_name((*scale)->dtype));
  if (block < 0) return kl_onnx_fail(c, "block_size must not be negative, got %lld", (long long)block);
  if (block > 0) {
    if (axis < 0)
      return kl_onnx_fail(c, "axis %lld is out of range for a rank-%d input", (long long)a, r);
    *scale = blocked(c, *scale, x, axis, block, "the scale");
    if (*zp) *zp = blocked(c, *zp, x, axis, block, "the zero point");
    return *scale && (!*zp || (*zp)->dtype != KL_BOOL) ? 0 : -1;
  }
  int64_t dim = axis >= 0 ? x->shape.dims[axis] : 1;
  *scale = along_axis(c, *scale, axis, r, dim, "the scale");
  if (*zp) *zp = along_axis(c, *zp, axis, r, dim, "the zero point");
  return *scale && (!*zp || (*zp)->dtype != KL_BOOL) ? 0 : -1;
}

/* The range of a quantized integer dtype; -1 (unsupported) for others. */
static int quant_range(kl_onnx_ctx *c, kl_dtype t, double *lo, double *hi) {
  switch (t) {
  case KL_U8: *lo = 0, *hi = 255; return 0;
  case KL_I8: *lo = -128, *hi = 127; return 0;
  case KL_U16: *lo = 0, *hi = 65535; return 0;
  case KL_I16: *lo = -32768, *hi = 32767; return 0;
  case KL_U4: *lo = 0, *hi = 15; return 0;
  case KL_I4: *lo = -8, *hi = 7; return 0;
  case KL_U2: *lo = 0, *hi = 3; return 0;
  case KL_I2: *lo = -2, *hi = 1; return 0;
  default:
    return kl_onnx_unsupported(c, "quantized type %s is not supported (u8, i8, u16, i16, u4, i4, "
                               "u2, i2, the fp8 types, f4e2m1)", kl_dtype_name(t));
  }
}

/* v (float, already rounded) clamped to t's range and cast to t. */
static kl_value *saturate(kl_onnx_ctx *c, kl_value *v, kl_dtype t) {
  double lo = 0, hi = 0;
  if (!v || quant_range(c, t, &lo, &hi)) return NULL;
  v = binary(c, KL_OP_MAXIMUM, v, kl_onnx_scalar(c, v->dtype, lo));
  v = binary(c, KL_OP_MINIMUM, v, kl_onnx_scalar(c, v->dtype, hi));
  return cast(c, v, t);
}

static kl_value *round_even(kl_onnx_ctx *c, kl_value *v) {
  return unary(c, KL_OP_ROUND, v, NULL, 0);
}

static bool is_fp8(kl_dtype t) {
  return t == KL_F8E4M3FN || t == KL_F8E4M3FNUZ || t == KL_F8E5M2 || t == KL_F8E5M2FNUZ;
}

/* x / scale into a small float t, as ONNX's reference: fp8 by Cast with
 * `saturate` (its zero point, which must be 0, is not added: 0 would turn
 * -0 into +0); fp4 adds the zero point and always saturates. */
static kl_value *quantize_float(kl_onnx_ctx *c, kl_value *q, kl_value *zp, kl_dtype t,
                                int64_t sat) {
  if (t == KL_F4E2M1 && zp) q = binary(c, KL_OP_ADD, q, cast(c, zp, q->dtype));
  kl_attr a[2] = {kl_adt("to", t), kl_ai("saturate", sat)};
  return unary(c, KL_OP_CAST, q, a, 2);
}

/* saturate(round(x / scale) + zp) into dtype t, as ONNX QuantizeLinear:
 * the division and rounding in type ft (the scale's, or the precision
 * attribute's), f32 for f16/bf16 after rounding, so that the zero point
 * and the range stay exact. */
static kl_value *quantize(kl_onnx_ctx *c, kl_value *x, kl_value *scale, kl_value *zp,
                          kl_dtype t, kl_dtype ft, int64_t sat) {
  if (!x || !scale) return NULL;
  kl_value *q = binary(c, KL_OP_DIV, cast(c, x, ft), cast(c, scale, ft));
  if (t == KL_F4E2M1 || is_fp8(t)) return quantize_float(c, q, zp, t, sat);
  q = round_even(c, q);
  if (ft == KL_F16 || ft == KL_BF16) q = cast(c, q, KL_F32);
  if (zp && q) q = binary(c, KL_OP_ADD, q, cast(c, zp, q->dtype));
  return saturate(c, q, t);
}

/* ---- QuantizeLinear, DequantizeLinear -------------------------------- */

/* The dtype named by attribute `name` (0 or absent: none, *t unchanged). */
static int attr_dtype(kl_onnx_ctx *c, const Onnx__NodeProto *n, const char *name, kl_dtype *t) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, name);
  if (a && a->i && kl_onnx_dtype((int)a->i, t))
    return kl_onnx_unsupported(c, "%s %lld is not supported", name, (long long)a->i);
  return 0;
}

static int convert_quantize(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *scale, *zp;
  if (!x || read_params(c, n, x, 1, &scale, &zp)) return -1;
  kl_dtype t = KL_U8, ft = scale->dtype;
  if (zp) t = zp->dtype;
  else if (attr_dtype(c, n, "output_dtype", &t)) return -1;
  if (attr_dtype(c, n, "precision", &ft)) return -1;
  if (!kl_dtype_is_float(ft))
    return kl_onnx_fail(c, "precision must be a float type, got %s", kl_dtype_name(ft));
  return bind(c, n, 0, quantize(c, x, scale, zp, t, ft, kl_onnx_attr_int(n, "saturate", 1)));
}

/* (x - zp) * scale in the scale's type, cast to output_dtype when given;
 * the zero point of the small floats is not subtracted (it must be 0; ONNX's
 * reference ignores it). */
static int convert_dequantize(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *scale, *zp;
  if (!x || read_params(c, n, x, 1, &scale, &zp)) return -1;
  bool small = is_fp8(x->dtype) || x->dtype == KL_F4E2M1;
  if (!kl_dtype_is_int(x->dtype) && !small)
    return kl_onnx_unsupported(c, "dequantizing %s is not supported", kl_dtype_name(x->dtype));
  kl_dtype out = scale->dtype;
  if (attr_dtype(c, n, "output_dtype", &out)) return -1;
  kl_value *y = binary(c, KL_OP_MUL, shifted(c, x, small ? NULL : zp, scale->dtype), scale);
  return bind(c, n, 0, cast(c, y, out));
}

/* Scale and zero point that map [min(x, 0), max(x, 0)] onto [0, 255], then
 * x quantized with them; the order of operations follows the ONNX
 * function body. */
static int convert_dynamic_quantize(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  if (x->dtype != KL_F32)
    return kl_onnx_fail(c, "the input must be f32, got %s", kl_dtype_name(x->dtype));
  kl_attr all = kl_ai("keepdims", 0);
  kl_value *zero = kl_onnx_scalar(c, KL_F32, 0), *qmax = kl_onnx_scalar(c, KL_F32, 255);
  kl_value *lo = binary(c, KL_OP_MINIMUM, unary(c, KL_OP_REDUCE_MIN, x, &all, 1), zero);
  kl_value *hi = binary(c, KL_OP_MAXIMUM, unary(c, KL_OP_REDUCE_MAX, x, &all, 1), zero);
  kl_value *scale = binary(c, KL_OP_DIV, binary(c, KL_OP_SUB, hi, lo), qmax);
  kl_value *zp = binary(c, KL_OP_SUB, zero, binary(c, KL_OP_DIV, lo, scale));
  zp = binary(c, KL_OP_MINIMUM, binary(c, KL_OP_MAXIMUM, zp, zero), qmax);
  zp = cast(c, round_even(c, zp), KL_U8);
  if (bind(c, n, 0, quantize(c, x, scale, zp, KL_U8, KL_F32, 1)) || bind(c, n, 1, scale))
    return -1;
  return bind(c, n, 2, zp);
}

/* ---- integer and quantized contractions ------------------------------ */

/* Runs the Conv converter on x and w (and bias b) with this node's window
 * attributes (ConvInteger and QLinearConv share Conv's), so that every
 * geometry Conv handles (1-D to 3-D, auto_pad, groups) works here too.
 * The operands travel under fresh names bound for the call. */
static kl_value *conv_of(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *x, kl_value *w,
                         kl_value *b) {
  if (!x || !w) return NULL;
  const kl_onnx_op *row = NULL;
  for (const kl_onnx_op *r = kl_onnx_ops_nn; r->op; r++)
    if (!strcmp(r->op, "Conv") && r->since <= c->opset && (!row || r->since > row->since))
      row = r;
  if (!row) {
    kl_onnx_fail(c, "no Conv converter for opset %d", c->opset);
    return NULL;
  }
  /* ONNX names are bound once each, and the binding count only grows, so
   * it numbers the names apart; the ':' keeps them from real models'. */
  char *names[4];
  kl_value *vals[3] = {x, w, b};
  for (int k = 0; k < 4; k++) {
    names[k] = kl_arena_alloc(&c->g->arena, 32);
    snprintf(names[k], 32, "kl:conv:%d", c->nvals + k);
  }
  Onnx__NodeProto binder = *n;
  binder.output = names;
  binder.n_output = b ? 3 : 2;
  for (int k = 0; k < (int)binder.n_output; k++)
    if (kl_onnx_bind(c, &binder, k, vals[k])) return NULL;
  Onnx__NodeProto conv = *n;
  conv.op_type = "Conv";
  conv.input = names;
  conv.n_input = binder.n_output;
  conv.output = &names[3];
  conv.n_output = 1;
  if (row->convert(c, &conv)) return NULL;
  Onnx__NodeProto reader = *n;
  reader.input = &names[3];
  reader.n_input = 1;
  return kl_onnx_input(c, &reader, 0);
}

/* The zero point of a matmul's A: per row, so a vector [M] becomes
 * [M, 1]; other shapes broadcast as given. */
static kl_value *row_param(kl_onnx_ctx *c, kl_value *p) {
  if (!p || p->shape.rank != 1 || p->shape.dims[0] == 1) return p;
  kl_shape s = {.rank = 2, .dims = {p->shape.dims[0], 1}};
  return reshape(c, p, &s);
}

/* (a - azp) @ (b - bzp) in i32. */
static int convert_matmul_integer(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *a = need_input(c, n, 0), *b = need_input(c, n, 1);
  kl_value *azp = row_param(c, kl_onnx_input(c, n, 2)), *bzp = kl_onnx_input(c, n, 3);
  if (!a || !b) return -1;
  kl_value *y = binary(c, KL_OP_MATMUL, shifted(c, a, azp, KL_I32), shifted(c, b, bzp, KL_I32));
  return bind(c, n, 0, y);
}

/* conv(x - xzp, w - wzp) in f64, cast to i32; wzp is per tensor or per
 * output channel. */
static int convert_conv_integer(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *w = need_input(c, n, 1);
  kl_value *xzp = kl_onnx_input(c, n, 2), *wzp = kl_onnx_input(c, n, 3);
  if (!x || !w) return -1;
  if (wzp && !(wzp = along_axis(c, wzp, 0, w->shape.rank, w->shape.dims[0], "w_zero_point")))
    return -1;
  kl_value *y = conv_of(c, n, shifted(c, x, xzp, KL_F64), shifted(c, w, wzp, KL_F64), NULL);
  return bind(c, n, 0, cast(c, y, KL_I32));
}

/* The common tail of QLinearMatMul and QLinearConv: the exact integer
 * accumulator acc (f64) times a_scale * b_scale / y_scale (computed in the
 * scales' type, as the ONNX reference does), plus the output zero point,
 * rounded and saturated to its type (a's type when it is absent). */
static kl_value *requantize(kl_onnx_ctx *c, kl_value *acc, kl_value *as, kl_value *bs,
                            kl_value *ys, kl_value *yzp, kl_dtype t) {
  kl_value *mult = binary(c, KL_OP_DIV, binary(c, KL_OP_MUL, as, bs), ys);
  kl_value *d = binary(c, KL_OP_MUL, acc, cast(c, mult, KL_F64));
  if (yzp) d = binary(c, KL_OP_ADD, d, cast(c, yzp, KL_F64));
  return saturate(c, round_even(c, d), t);
}

/* Inputs 0..count-1 into in, the first `required` of them required. */
static int read_inputs(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value **in, int count,
                       int required) {
  for (int k = 0; k < count; k++)
    if (!(in[k] = k < required ? need_input(c, n, k) : kl_onnx_input(c, n, k)) && k < required)
      return -1;
  return 0;
}

/* Inputs a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
 * y_zero_point: a's parameters per row, b's per column. */
static int convert_qlinear_matmul(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *in[8];
  if (read_inputs(c, n, in, 8, 7)) return -1;
  kl_value *acc = binary(c, KL_OP_MATMUL, shifted(c, in[0], row_param(c, in[2]), KL_F64),
                         shifted(c, in[3], in[5], KL_F64));
  kl_value *y = requantize(c, acc, row_param(c, in[1]), in[4], in[6], in[7],
                           in[7] ? in[7]->dtype : in[0]->dtype);
  return bind(c, n, 0, y);
}

/* Inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
 * y_zero_point, bias (i32): w's parameters per tensor or per output
 * channel. */
static int convert_qlinear_conv(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *in[9];
  if (read_inputs(c, n, in, 9, 7)) return -1;
  kl_value *x = in[0], *w = in[3], *wzp = in[5], *ws = in[4];
  int64_t m = w->shape.rank ? w->shape.dims[0] : 1;
  if (wzp && !(wzp = along_axis(c, wzp, 0, w->shape.rank, m, "w_zero_point"))) return -1;
  if (!(ws = along_axis(c, ws, 1, x->shape.rank, m, "w_scale"))) return -1;
  kl_value *acc = conv_of(c, n, shifted(c, x, in[2], KL_F64), shifted(c, w, wzp, KL_F64),
                          cast(c, in[8], KL_F64));
  return bind(c, n, 0, requantize(c, acc, in[1], ws, in[6], in[7],
                                  in[7] ? in[7]->dtype : x->dtype));
}

const kl_onnx_op kl_onnx_ops_quant[] = {
    {"QuantizeLinear", 10, convert_quantize},
    {"DequantizeLinear", 10, convert_dequantize},
    {"DynamicQuantizeLinear", 11, convert_dynamic_quantize},
    {"MatMulInteger", 10, convert_matmul_integer},
    {"ConvInteger", 10, convert_conv_integer},
    {"QLinearMatMul", 10, convert_qlinear_matmul},
    {"QLinearConv", 10, convert_qlinear_conv},
    {NULL, 0, NULL},
};
