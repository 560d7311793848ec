/* onnx_ops_quant.c - ONNX quantization ops: QuantizeLinear,
 * DequantizeLinear, DynamicQuantizeLinear and the integer / quantized
 * contractions (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv).
 * They decompose into casts and float arithmetic: 8-bit products summed in
 * f64 are exact at any size the IR holds, so the float contractions give
 * the integer results.  Also the recurrent cells (RNN, GRU, LSTM), unrolled
 * into gemms and activations, until they get a family file of their own. */
#include <stdio.h>
#include <string.h>

#include "onnx_internal.h"

/* ---- small emitters (NULL in, NULL out: the error is already set) ---- */

static kl_value *need_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k) {
  kl_value *v = kl_onnx_input(c, n, k);
  if (!v) kl_onnx_fail(c, "input %d is missing", k);
  return v;
}

static kl_value *unary(kl_onnx_ctx *c, kl_op op, kl_value *x, const kl_attr *a, int na) {
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

static kl_value *reshape(kl_onnx_ctx *c, kl_value *x, const kl_shape *s) {
  if (!x || kl_shape_equal(s, &x->shape)) return x;
  kl_attr a = kl_ais("shape", s->dims, s->rank);
  return unary(c, KL_OP_RESHAPE, x, &a, 1);
}

static int bind(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value *y) {
  return y ? kl_onnx_bind(c, n, k, y) : -1;
}

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

/* Scale and zero point of input x, per tensor or along `axis`. */
static int read_params(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *x, int k_scale,
                       kl_value **scale, kl_value **zp) {
  /* axis matters only for per-axis parameters, which check it. */
  int r = x->shape.rank;
  int64_t a = kl_onnx_attr_int(n, "axis", 1);
  int axis = a < -r || a >= r ? -1 : (int)(a < 0 ? a + r : a);
  if (kl_onnx_attr_int(n, "block_size", 0) != 0)
    return kl_onnx_unsupported(c, "blocked quantization (block_size) is not supported");
  *scale = need_input(c, n, k_scale);
  *zp = kl_onnx_input(c, n, k_scale + 1);
  if (!*scale) return -1;
  if (!kl_dtype_is_float((*scale)->dtype))
    return kl_onnx_fail(c, "the scale must be a float tensor, got %s",
                        kl_dtype_name((*scale)->dtype));
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
  default:
    return kl_onnx_unsupported(c, "quantized type %s is not supported (u8, i8, u16, i16)",
                               kl_dtype_name(t));
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

/* saturate(round(x / scale) + zp) into dtype t, as ONNX QuantizeLinear:
 * the division and rounding in the scale's type (f32 for f16/bf16 scales
 * after rounding, so that the zero point and the range stay exact). */
static kl_value *quantize(kl_onnx_ctx *c, kl_value *x, kl_value *scale, kl_value *zp,
                          kl_dtype t) {
  if (!x || !scale) return NULL;
  kl_dtype ft = scale->dtype;
  kl_value *q = round_even(c, binary(c, KL_OP_DIV, cast(c, x, ft), scale));
  if (ft == KL_F16 || ft == KL_BF16) q = cast(c, q, KL_F32);
  if (zp && q) q = binary(c, KL_OP_ADD, q, cast(c, zp, q->dtype));
  return saturate(c, q, t);
}

/* ---- QuantizeLinear, DequantizeLinear -------------------------------- */

static int convert_quantize(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *scale, *zp;
  if (!x || read_params(c, n, x, 1, &scale, &zp)) return -1;
  kl_dtype t = KL_U8;
  const Onnx__AttributeProto *od = kl_onnx_attr(n, "output_dtype");
  if (zp) {
    t = zp->dtype;
  } else if (od && od->i && kl_onnx_dtype((int)od->i, &t)) {
    return kl_onnx_unsupported(c, "output_dtype %lld is not supported", (long long)od->i);
  }
  return bind(c, n, 0, quantize(c, x, scale, zp, t));
}

/* (x - zp) * scale in the scale's type. */
static int convert_dequantize(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *scale, *zp;
  if (!x || read_params(c, n, x, 1, &scale, &zp)) return -1;
  if (!kl_dtype_is_int(x->dtype))
    return kl_onnx_unsupported(c, "dequantizing %s is not supported", kl_dtype_name(x->dtype));
  return bind(c, n, 0, binary(c, KL_OP_MUL, shifted(c, x, zp, scale->dtype), scale));
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
  if (bind(c, n, 0, quantize(c, x, scale, zp, KL_U8)) || bind(c, n, 1, scale)) return -1;
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

/* ---- RNN, GRU, LSTM --------------------------------------------------- */
/* Unrolled over the static sequence length: the input projections of all
 * steps are one gemm per gate, then each step adds h @ R_g^T (a gemm whose
 * C is that step's projection) and applies the gate's activation.
 * Directions run apart and their outputs are concatenated.  Gate orders are
 * ONNX's: GRU z, r, h; LSTM i, o, f, c (peepholes i, o, f). */

enum { MAX_GATES = 4 };

/* One of the cell's activation functions with its alpha and beta. */
typedef struct {
  const char *name;
  double alpha, beta;
} activation;

/* The ONNX activations a recurrent node may name, with their default
 * parameters and how many of alpha, beta they take. */
static const struct {
  const char *name;
  int nparams;
  double alpha, beta;
} act_kinds[] = {
    {"Tanh", 0, 0, 0},           {"Sigmoid", 0, 0, 0},       {"Relu", 0, 0, 0},
    {"Softsign", 0, 0, 0},       {"Softplus", 0, 0, 0},      {"LeakyRelu", 1, 0.01, 0},
    {"ThresholdedRelu", 1, 1.0, 0}, {"Elu", 1, 1.0, 0},      {"HardSigmoid", 2, 0.2, 0.5},
    {"Affine", 2, 1.0, 0.0},     {"ScaledTanh", 2, 1.0, 1.0},
};

static kl_value *with_scalar(kl_onnx_ctx *c, kl_op op, kl_value *x, double v) {
  return x ? binary(c, op, x, kl_onnx_scalar(c, x->dtype, v)) : NULL;
}

static kl_value *apply_act(kl_onnx_ctx *c, const activation *f, kl_value *x) {
  const char *s = f->name;
  double a = f->alpha, b = f->beta;
  if (!strcmp(s, "Tanh")) return unary(c, KL_OP_TANH, x, NULL, 0);
  if (!strcmp(s, "Sigmoid")) return unary(c, KL_OP_SIGMOID, x, NULL, 0);
  if (!strcmp(s, "Relu")) return unary(c, KL_OP_RELU, x, NULL, 0);
  if (!strcmp(s, "Softplus")) return unary(c, KL_OP_SOFTPLUS, x, NULL, 0);
  if (!strcmp(s, "Softsign"))
    return binary(c, KL_OP_DIV, x, with_scalar(c, KL_OP_ADD, unary(c, KL_OP_ABS, x, NULL, 0), 1));
  if (!strcmp(s, "LeakyRelu")) {
    kl_attr at = kl_af("alpha", a);
    return unary(c, KL_OP_LEAKY_RELU, x, &at, 1);
  }
  if (!strcmp(s, "Elu")) {
    kl_attr at = kl_af("alpha", a);
    return unary(c, KL_OP_ELU, x, &at, 1);
  }
  if (!strcmp(s, "ThresholdedRelu")) {
    kl_value *ins[3] = {with_scalar(c, KL_OP_GT, x, a), x, kl_onnx_scalar(c, x->dtype, 0)};
    return ins[0] ? kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0) : NULL;
  }
  kl_value *ax = with_scalar(c, KL_OP_MUL, x, a);
  if (!strcmp(s, "Affine")) return with_scalar(c, KL_OP_ADD, ax, b);
  if (!strcmp(s, "HardSigmoid")) {
    kl_value *y = with_scalar(c, KL_OP_ADD, ax, b);
    return with_scalar(c, KL_OP_MAXIMUM, with_scalar(c, KL_OP_MINIMUM, y, 1), 0);
  }
  /* ScaledTanh: alpha * tanh(beta * x) */
  kl_value *t = unary(c, KL_OP_TANH, with_scalar(c, KL_OP_MUL, x, b), NULL, 0);
  return with_scalar(c, KL_OP_MUL, t, a);
}

/* What differs between RNN, GRU and LSTM. */
typedef struct {
  int gates;            /* G: W is [dirs, G*H, in] */
  int nacts;            /* activations per direction */
  const char *acts[3];  /* their defaults */
} cell_kind;

static const cell_kind k_rnn = {1, 1, {"Tanh"}};
static const cell_kind k_gru = {3, 2, {"Sigmoid", "Tanh"}};
static const cell_kind k_lstm = {4, 3, {"Sigmoid", "Tanh", "Tanh"}};

/* A node's reading of its inputs and attributes. */
typedef struct {
  const cell_kind *kind;
  kl_value *x, *w, *r, *b, *lens, *h0, *c0, *p;
  int64_t seq, batch, in, hidden;
  int dirs;
  bool reverse_only, layout1, lbr;
  double clip;          /* 0: none */
  activation act[2][3]; /* per direction */
} rnn_spec;

static kl_value *slice_axis(kl_onnx_ctx *c, kl_value *x, int64_t axis, int64_t start,
                            int64_t end) {
  int64_t one = 1;
  kl_attr a[4] = {kl_ais("starts", &start, 1), kl_ais("ends", &end, 1),
                  kl_ais("axes", &axis, 1), kl_ais("steps", &one, 1)};
  return unary(c, KL_OP_SLICE, x, a, 4);
}

static kl_value *reshape_to(kl_onnx_ctx *c, kl_value *x, int rank, int64_t d0, int64_t d1,
                            int64_t d2) {
  kl_shape s = {.rank = rank, .dims = {d0, d1, d2}};
  return reshape(c, x, &s);
}

static kl_value *transpose(kl_onnx_ctx *c, kl_value *x, const int64_t *perm) {
  kl_attr a = kl_ais("perm", perm, x ? x->shape.rank : 0);
  return unary(c, KL_OP_TRANSPOSE, x, &a, 1);
}

static kl_value *concat(kl_onnx_ctx *c, kl_value **xs, int n, int64_t axis) {
  for (int i = 0; i < n; i++)
    if (!xs[i]) return NULL;
  kl_attr a = kl_ai("axis", axis);
  return kl_onnx_emit(c, KL_OP_CONCAT, xs, n, &a, 1);
}

/* gemm(a, b^T) + c (c may be NULL). */
static kl_value *gemm_bt(kl_onnx_ctx *c, kl_value *a, kl_value *b, kl_value *cc) {
  kl_attr at = kl_ai("trans_b", 1);
  kl_value *ins[3] = {a, b, cc};
  return a && b ? kl_onnx_emit(c, KL_OP_GEMM, ins, cc ? 3 : 2, &at, 1) : NULL;
}

/* Row block `blk` (H rows) of direction d of a [dirs, k*H, cols] weight,
 * as [H, cols]. */
static kl_value *weight_block(kl_onnx_ctx *c, kl_value *w, int d, int blk, int64_t h) {
  int64_t cols = w->shape.dims[2];
  kl_value *v = slice_axis(c, slice_axis(c, w, 0, d, d + 1), 1, blk * h, (blk + 1) * h);
  return reshape_to(c, v, 2, h, cols, 0);
}

/* Block `blk` of direction d of a [dirs, k*H] vector (bias, peepholes) as
 * [H]; a zero constant when v is absent. */
static kl_value *vector_block(kl_onnx_ctx *c, kl_value *v, int d, int blk, int64_t h,
                              kl_dtype t) {
  kl_shape s = {.rank = 1, .dims = {h}};
  double zero = 0;
  if (!v) return kl_onnx_constant(c, t, &s, &zero, 1);
  return reshape(c, slice_axis(c, slice_axis(c, v, 0, d, d + 1), 1, blk * h, (blk + 1) * h), &s);
}

/* Direction d's initial state from [dirs, batch, H] (zeros when absent). */
static kl_value *initial_state(kl_onnx_ctx *c, const rnn_spec *sp, kl_value *v, int d) {
  kl_shape s = {.rank = 2, .dims = {sp->batch, sp->hidden}};
  double zero = 0;
  if (!v) return kl_onnx_constant(c, sp->x->dtype, &s, &zero, 1);
  return reshape(c, slice_axis(c, v, 0, d, d + 1), &s);
}

static kl_value *clipped(kl_onnx_ctx *c, const rnn_spec *sp, kl_value *v) {
  if (!sp->clip) return v;
  return with_scalar(c, KL_OP_MINIMUM, with_scalar(c, KL_OP_MAXIMUM, v, -sp->clip), sp->clip);
}

/* where(mask, a, b) (a when mask is NULL). */
static kl_value *select(kl_onnx_ctx *c, kl_value *mask, kl_value *a, kl_value *b) {
  if (!mask) return a;
  kl_value *ins[3] = {mask, a, b};
  return a && b ? kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0) : NULL;
}

/* One direction: y receives the per-step outputs [1, 1, batch, H] in time
 * order; *h_out (and *c_out for LSTM) the final states [batch, H]. */
static int run_direction(kl_onnx_ctx *c, const rnn_spec *sp, int d, bool backward, kl_value **y,
                         kl_value **h_out, kl_value **c_out) {
  const cell_kind *k = sp->kind;
  int64_t h = sp->hidden, nb = sp->batch;
  kl_dtype t = sp->x->dtype;
  bool gru = k == &k_gru, lstm = k == &k_lstm;
  const activation *act = sp->act[d];
  kl_value *xflat = reshape_to(c, sp->x, 2, sp->seq * nb, sp->in, 0);
  kl_value *xw[MAX_GATES], *rg[MAX_GATES], *rb_h = NULL, *peep[3] = {NULL, NULL, NULL};
  for (int g = 0; g < k->gates; g++) {
    kl_value *wb = vector_block(c, sp->b, d, g, h, t);
    kl_value *rb = vector_block(c, sp->b, d, k->gates + g, h, t);
    /* GRU with linear_before_reset keeps Rbh inside the reset product. */
    if (gru && g == 2 && sp->lbr) rb_h = rb;
    else wb = binary(c, KL_OP_ADD, wb, rb);
    kl_value *proj = gemm_bt(c, xflat, weight_block(c, sp->w, d, g, h), wb);
    xw[g] = reshape_to(c, proj, 3, sp->seq, nb, h);
    rg[g] = weight_block(c, sp->r, d, g, h);
    if (!xw[g] || !rg[g]) return -1;
  }
  if (lstm && sp->p)
    for (int g = 0; g < 3; g++) peep[g] = vector_block(c, sp->p, d, g, h, t);
  kl_value *hs = initial_state(c, sp, sp->h0, d);
  kl_value *cs = lstm ? initial_state(c, sp, sp->c0, d) : NULL;
  kl_value *zeros = sp->lens ? initial_state(c, sp, NULL, d) : NULL;
  kl_value *lens = sp->lens ? reshape_to(c, cast(c, sp->lens, KL_I64), 2, nb, 1, 0) : NULL;
  for (int64_t i = 0; i < sp->seq; i++) {
    int64_t step = backward ? sp->seq - 1 - i : i;
    kl_value *pre[MAX_GATES];
    for (int g = 0; g < k->gates; g++)
      pre[g] = reshape_to(c, slice_axis(c, xw[g], 0, step, step + 1), 2, nb, h, 0);
    kl_value *hn, *cn = NULL;
    if (!gru && !lstm) {
      hn = apply_act(c, &act[0], clipped(c, sp, gemm_bt(c, hs, rg[0], pre[0])));
    } else if (gru) {
      kl_value *z = apply_act(c, &act[0], clipped(c, sp, gemm_bt(c, hs, rg[0], pre[0])));
      kl_value *r = apply_act(c, &act[0], clipped(c, sp, gemm_bt(c, hs, rg[1], pre[1])));
      kl_value *hh = sp->lbr
          ? binary(c, KL_OP_ADD, pre[2], binary(c, KL_OP_MUL, r, gemm_bt(c, hs, rg[2], rb_h)))
          : gemm_bt(c, binary(c, KL_OP_MUL, r, hs), rg[2], pre[2]);
      hh = apply_act(c, &act[1], clipped(c, sp, hh));
      /* (1 - z) * hh + z * h = hh + z * (h - hh) */
      hn = binary(c, KL_OP_ADD, hh, binary(c, KL_OP_MUL, z, binary(c, KL_OP_SUB, hs, hh)));
    } else {
      kl_value *gi = gemm_bt(c, hs, rg[0], pre[0]), *go = gemm_bt(c, hs, rg[1], pre[1]);
      kl_value *gf = gemm_bt(c, hs, rg[2], pre[2]), *gc = gemm_bt(c, hs, rg[3], pre[3]);
      if (peep[0]) {
        gi = binary(c, KL_OP_ADD, gi, binary(c, KL_OP_MUL, peep[0], cs));
        gf = binary(c, KL_OP_ADD, gf, binary(c, KL_OP_MUL, peep[2], cs));
      }
      kl_value *ig = apply_act(c, &act[0], clipped(c, sp, gi));
      kl_value *fg = apply_act(c, &act[0], clipped(c, sp, gf));
      kl_value *cg = apply_act(c, &act[1], clipped(c, sp, gc));
      cn = binary(c, KL_OP_ADD, binary(c, KL_OP_MUL, fg, cs), binary(c, KL_OP_MUL, ig, cg));
      if (peep[1]) go = binary(c, KL_OP_ADD, go, binary(c, KL_OP_MUL, peep[1], cn));
      kl_value *og = apply_act(c, &act[0], clipped(c, sp, go));
      hn = binary(c, KL_OP_MUL, og, apply_act(c, &act[2], cn));
    }
    /* Steps past a batch item's length keep its state and output 0. */
    kl_value *mask = lens ? with_scalar(c, KL_OP_GT, lens, (double)step) : NULL;
    if (lens && !mask) return -1;
    kl_value *out = select(c, mask, hn, zeros);
    hs = select(c, mask, hn, hs);
    if (lstm) cs = select(c, mask, cn, cs);
    kl_shape s4 = {.rank = 4, .dims = {1, 1, nb, h}};
    y[step] = reshape(c, out, &s4);
    if (!y[step] || !hs || (lstm && !cs)) return -1;
  }
  *h_out = hs;
  if (c_out) *c_out = cs;
  return 0;
}

/* Activation names and parameters for both directions. */
static int read_activations(kl_onnx_ctx *c, const Onnx__NodeProto *n, rnn_spec *sp) {
  const cell_kind *k = sp->kind;
  const Onnx__AttributeProto *names = kl_onnx_attr(n, "activations");
  const Onnx__AttributeProto *al = kl_onnx_attr(n, "activation_alpha");
  const Onnx__AttributeProto *be = kl_onnx_attr(n, "activation_beta");
  size_t nn = names ? names->n_strings : 0, ia = 0, ib = 0;
  if (nn && nn != (size_t)(k->nacts * sp->dirs))
    return kl_onnx_fail(c, "activations lists %zu functions, expected %d", nn,
                        k->nacts * sp->dirs);
  for (int d = 0; d < sp->dirs; d++)
    for (int j = 0; j < k->nacts; j++) {
      activation *f = &sp->act[d][j];
      if (nn) {
        const ProtobufCBinaryData *s = &names->strings[d * k->nacts + j];
        char *copy = kl_arena_alloc(&c->g->arena, s->len + 1);
        if (s->len) memcpy(copy, s->data, s->len);
        f->name = copy;
      } else {
        f->name = k->acts[j];
      }
      size_t kind = 0, nk = sizeof act_kinds / sizeof *act_kinds;
      while (kind < nk && strcmp(act_kinds[kind].name, f->name)) kind++;
      if (kind == nk) return kl_onnx_unsupported(c, "activation \"%s\" is not supported", f->name);
      int np = act_kinds[kind].nparams;
      f->alpha = np >= 1 && al && ia < al->n_floats ? al->floats[ia++] : act_kinds[kind].alpha;
      f->beta = np >= 2 && be && ib < be->n_floats ? be->floats[ib++] : act_kinds[kind].beta;
    }
  return 0;
}

/* x's dims and hidden_size, checked against W and R. */
static int read_rnn(kl_onnx_ctx *c, const Onnx__NodeProto *n, rnn_spec *sp) {
  char b1[128], b2[128];
  kl_value *x = sp->x = need_input(c, n, 0);
  sp->w = need_input(c, n, 1);
  sp->r = need_input(c, n, 2);
  sp->b = kl_onnx_input(c, n, 3);
  sp->lens = kl_onnx_input(c, n, 4);
  sp->h0 = kl_onnx_input(c, n, 5);
  sp->c0 = sp->kind == &k_lstm ? kl_onnx_input(c, n, 6) : NULL;
  sp->p = sp->kind == &k_lstm ? kl_onnx_input(c, n, 7) : NULL;
  if (!x || !sp->w || !sp->r) return -1;
  const char *dir = kl_onnx_attr_string(c, n, "direction", "forward");
  sp->dirs = !strcmp(dir, "bidirectional") ? 2 : 1;
  sp->reverse_only = !strcmp(dir, "reverse");
  if (sp->dirs == 1 && !sp->reverse_only && strcmp(dir, "forward"))
    return kl_onnx_fail(c, "direction \"%s\" is not forward, reverse or bidirectional", dir);
  sp->layout1 = kl_onnx_attr_int(n, "layout", 0) != 0;
  sp->lbr = kl_onnx_attr_int(n, "linear_before_reset", 0) != 0;
  sp->clip = kl_onnx_attr(n, "clip") ? kl_onnx_attr_float(n, "clip", 0) : 0;
  if (kl_onnx_attr_int(n, "input_forget", 0))
    return kl_onnx_unsupported(c, "input_forget = 1 is not supported");
  if (!kl_dtype_is_float(x->dtype) || x->shape.rank != 3)
    return kl_onnx_fail(c, "X must be a 3-D float tensor, got %s%s", kl_dtype_name(x->dtype),
                        kl_shape_str(&x->shape, b1, sizeof b1));
  /* Backward runs would start at each item's own last step. */
  if (sp->lens && (sp->dirs == 2 || sp->reverse_only))
    return kl_onnx_unsupported(c, "sequence_lens with a reverse or bidirectional cell is not "
                                  "supported");
  if (sp->lens && !kl_dtype_is_int(sp->lens->dtype))
    return kl_onnx_fail(c, "sequence_lens must be an integer tensor");
  static const int64_t swap01[3] = {1, 0, 2};
  if (sp->layout1 && !(sp->x = x = transpose(c, x, swap01))) return -1;
  sp->seq = x->shape.dims[0], sp->batch = x->shape.dims[1], sp->in = x->shape.dims[2];
  sp->hidden = kl_onnx_attr_int(n, "hidden_size", sp->r->shape.rank == 3 ? sp->r->shape.dims[2] : 0);
  int64_t gh = sp->kind->gates * sp->hidden;
  const kl_shape *ws = &sp->w->shape, *rs = &sp->r->shape;
  if (sp->hidden < 1 || ws->rank != 3 || ws->dims[0] != sp->dirs || ws->dims[1] != gh ||
      ws->dims[2] != sp->in || rs->rank != 3 || rs->dims[0] != sp->dirs || rs->dims[1] != gh ||
      rs->dims[2] != sp->hidden)
    return kl_onnx_fail(c, "W %s or R %s do not fit %d direction(s), %d gates, hidden size %lld "
                        "and input size %lld", kl_shape_str(ws, b1, sizeof b1),
                        kl_shape_str(rs, b2, sizeof b2), sp->dirs, sp->kind->gates,
                        (long long)sp->hidden, (long long)sp->in);
  static const int64_t to_dbh[3] = {1, 0, 2};
  if (sp->layout1 && sp->h0) sp->h0 = transpose(c, sp->h0, to_dbh);
  if (sp->layout1 && sp->c0) sp->c0 = transpose(c, sp->c0, to_dbh);
  if (sp->w->dtype != x->dtype || sp->r->dtype != x->dtype || (sp->b && sp->b->dtype != x->dtype))
    return kl_onnx_fail(c, "X, W, R and B must share a dtype");
  return read_activations(c, n, sp);
}

/* Outputs Y [seq, dirs, batch, H], Y_h [dirs, batch, H] (and Y_c), or
 * their layout-1 forms [batch, seq, dirs, H] and [batch, dirs, H]. */
static int convert_recurrent(kl_onnx_ctx *c, const Onnx__NodeProto *n, const cell_kind *k) {
  rnn_spec sp = {.kind = k};
  if (read_rnn(c, n, &sp)) return -1;
  if (sp.seq < 1) return kl_onnx_unsupported(c, "an empty sequence is not supported");
  kl_value **y[2], *hf[2], *cf[2];
  for (int d = 0; d < sp.dirs; d++) {
    y[d] = kl_arena_alloc(&c->g->arena, (size_t)sp.seq * sizeof *y[d]);
    bool backward = sp.reverse_only || d == 1;
    if (run_direction(c, &sp, d, backward, y[d], &hf[d], k == &k_lstm ? &cf[d] : NULL))
      return -1;
  }
  /* Y: each direction's steps along axis 0, then directions along axis 1. */
  kl_value *ydirs[2];
  for (int d = 0; d < sp.dirs; d++) ydirs[d] = concat(c, y[d], (int)sp.seq, 0);
  kl_value *yall = sp.dirs == 1 ? ydirs[0] : concat(c, ydirs, 2, 1);
  kl_value *states[2][2];
  for (int d = 0; d < sp.dirs; d++) {
    states[0][d] = reshape_to(c, hf[d], 3, 1, sp.batch, sp.hidden);
    if (k == &k_lstm) states[1][d] = reshape_to(c, cf[d], 3, 1, sp.batch, sp.hidden);
  }
  kl_value *yh = sp.dirs == 1 ? states[0][0] : concat(c, states[0], 2, 0);
  kl_value *yc = k != &k_lstm ? NULL : sp.dirs == 1 ? states[1][0] : concat(c, states[1], 2, 0);
  if (sp.layout1) {
    static const int64_t y_perm[4] = {2, 0, 1, 3}, s_perm[3] = {1, 0, 2};
    yall = transpose(c, yall, y_perm);
    yh = transpose(c, yh, s_perm);
    if (yc) yc = transpose(c, yc, s_perm);
  }
  if (bind(c, n, 0, yall) || bind(c, n, 1, yh)) return -1;
  return k == &k_lstm ? bind(c, n, 2, yc) : 0;
}

static int convert_rnn(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return convert_recurrent(c, n, &k_rnn);
}
static int convert_gru(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return convert_recurrent(c, n, &k_gru);
}
static int convert_lstm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return convert_recurrent(c, n, &k_lstm);
}

const kl_onnx_op kl_onnx_ops_quant[] = {
    {"QuantizeLinear", 10, convert_quantize},
    {"DequantizeLinear", 10, convert_dequantize},
    {"DynamicQuantizeLinear", 11, convert_dynamic_quantize},
    {"MatMulInteger", 10, convert_matmul_integer},
    {"ConvInteger", 10, convert_conv_integer},
    {"QLinearMatMul", 10, convert_qlinear_matmul},
    {"QLinearConv", 10, convert_qlinear_conv},
    {"RNN", 7, convert_rnn},
    {"GRU", 7, convert_gru},
    {"LSTM", 7, convert_lstm},
    {NULL, 0, NULL},
};
