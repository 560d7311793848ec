/* onnx_ops_math.c - ONNX elementwise and arithmetic ops, bit shifts,
 * determinants, grid sampling and the window generators. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"

/* ---- small emit helpers ---------------------------------------------- */
static kl_value *unary(kl_onnx_ctx *c, kl_op op, kl_value *x) {
  return x ? kl_onnx_emit(c, op, &x, 1, NULL, 0) : NULL;
}

static kl_value *binary(kl_onnx_ctx *c, kl_op op, kl_value *a, kl_value *b) {
  kl_value *ins[2] = {a, b};
  return a && b ? kl_onnx_emit(c, op, ins, 2, NULL, 0) : NULL;
}

/* A cast node even to x's own dtype: the output is a value of its own. */
static kl_value *cast_node(kl_onnx_ctx *c, kl_value *x, kl_dtype t) {
  kl_attr to = kl_adt("to", t);
  return kl_onnx_emit(c, KL_OP_CAST, &x, 1, &to, 1);
}

/* x in dtype t, casting only when needed. */
static kl_value *cast_to(kl_onnx_ctx *c, kl_value *x, kl_dtype t) {
  return !x || x->dtype == t ? x : cast_node(c, x, t);
}

/* A scalar of x's dtype, for the constants of activation formulas. */
static kl_value *scalar_of(kl_onnx_ctx *c, const kl_value *x, double v) {
  return x ? kl_onnx_scalar(c, x->dtype, v) : NULL;
}

static kl_value *reshape(kl_onnx_ctx *c, kl_value *x, const kl_shape *s) {
  kl_attr a = kl_ais("shape", s->dims, s->rank);
  return x ? kl_onnx_emit(c, KL_OP_RESHAPE, &x, 1, &a, 1) : NULL;
}

static int bind(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *y) {
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* Input k, failing when it is absent. */
static kl_value *need_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k) {
  kl_value *v = kl_onnx_input(c, n, k);
  if (!v) kl_onnx_fail(c, "input %d is missing", k);
  return v;
}

/* ---- one to one ------------------------------------------------------ */
/* Before opset 7 binary ops broadcast only with broadcast=1, and then B
 * aligns with A from `axis` (default: trailing, as NumPy): B gets trailing
 * 1s so that NumPy broadcasting lines it up the same way. */
static int legacy_broadcast(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *a,
                            kl_value **b) {
  char sa[128], sb[128];
  if (c->opset >= 7) return 0;
  const kl_shape *ash = &a->shape, *bsh = &(*b)->shape;
  if (!kl_onnx_attr_int(n, "broadcast", 0)) {
    if (kl_shape_equal(ash, bsh)) return 0;
    return kl_onnx_fail(c, "inputs of shapes %s and %s need broadcast=1 before opset 7",
                        kl_shape_str(ash, sa, sizeof sa), kl_shape_str(bsh, sb, sizeof sb));
  }
  if (!kl_onnx_attr(n, "axis")) return 0;
  int64_t axis = kl_onnx_attr_int(n, "axis", 0);
  if (axis < 0) axis += ash->rank;
  if (axis < 0 || axis + bsh->rank > ash->rank)
    return kl_onnx_fail(c, "axis %lld does not place B %s inside A %s",
                        (long long)kl_onnx_attr_int(n, "axis", 0),
                        kl_shape_str(bsh, sb, sizeof sb), kl_shape_str(ash, sa, sizeof sa));
  if (axis + bsh->rank == ash->rank) return 0;
  kl_shape s = *bsh;
  while (s.rank < ash->rank - axis) s.dims[s.rank++] = 1;
  return (*b = reshape(c, *b, &s)) ? 0 : -1;
}

/* ONNX Pow lets the exponent have another type; the result has the base's.
 * An integer exponent is exact in the base's type; otherwise (integer base
 * with float exponent, or floats of two widths) compute in f64 as NumPy
 * does and convert back (truncating toward zero for an integer base). */
static kl_value *mixed_pow(kl_onnx_ctx *c, kl_value *a, kl_value *b) {
  if (!kl_dtype_is_float(b->dtype)) return binary(c, KL_OP_POW, a, cast_to(c, b, a->dtype));
  kl_value *y = binary(c, KL_OP_POW, cast_to(c, a, KL_F64), cast_to(c, b, KL_F64));
  return cast_to(c, y, a->dtype);
}

/* Ops that map onto an IR op with no attributes: the ops registered below
 * with convert_direct.  The IR op is the row of ir/ops.def whose `onnx`
 * column names the ONNX op type (kl_op_lookup_onnx). */
static int convert_direct(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_op op;
  int nin = kl_onnx_ninputs(n);
  if (kl_op_lookup_onnx(n->op_type, &op)) return kl_onnx_fail(c, "no IR op for this ONNX op");
  if (nin < kl_ops[op].min_inputs || nin > kl_ops[op].max_inputs)
    return kl_onnx_fail(c, "takes %d input(s), got %d", kl_ops[op].min_inputs, nin);
  kl_value *ins[3];
  for (int k = 0; k < nin; k++)
    if (!(ins[k] = need_input(c, n, k))) return -1;
  if (nin == 2 && legacy_broadcast(c, n, ins[0], &ins[1])) return -1;
  if (op == KL_OP_POW && ins[1]->dtype != ins[0]->dtype)
    return bind(c, n, mixed_pow(c, ins[0], ins[1]));
  return bind(c, n, kl_onnx_emit(c, op, ins, nin, NULL, 0));
}

static int convert_identity(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  return x ? kl_onnx_bind(c, n, 0, x) : -1;
}

/* ---- casts ----------------------------------------------------------- */
/* A cast node with Cast-19's saturate and Cast-24's round_mode, when the
 * ONNX node gives them (the IR's defaults are ONNX's). */
static kl_value *cast_with_modes(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *x,
                                 kl_dtype t) {
  kl_attr a[3] = {kl_adt("to", t)};
  int na = 1;
  if (kl_onnx_attr(n, "saturate")) a[na++] = kl_ai("saturate", kl_onnx_attr_int(n, "saturate", 1));
  if (kl_onnx_attr(n, "round_mode"))
    a[na++] = kl_as("round_mode", kl_onnx_attr_string(c, n, "round_mode", "up"));
  return kl_onnx_emit(c, KL_OP_CAST, &x, 1, a, na);
}

/* Cast-1 names the type as a string ("FLOAT"); Cast-6 on as an enum. */
static int convert_cast(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "to");
  if (!x) return -1;
  if (!a) return kl_onnx_fail(c, "attribute 'to' is required");
  int64_t t = a->i;
  if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING) {
    const char *name = kl_onnx_attr_string(c, n, "to", "");
    const ProtobufCEnumValue *e =
        protobuf_c_enum_descriptor_get_value_by_name(&onnx__tensor_proto__data_type__descriptor, name);
    if (!e) return kl_onnx_fail(c, "'to' names no ONNX type (\"%s\")", name);
    t = e->value;
  }
  kl_dtype to;
  if (kl_onnx_dtype((int)t, &to))
    return kl_onnx_unsupported(c, "cast to ONNX type %lld is not supported", (long long)t);
  return bind(c, n, cast_with_modes(c, n, x, to));
}

static int convert_cast_like(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *like = need_input(c, n, 1);
  return bind(c, n, x && like ? cast_with_modes(c, n, x, like->dtype) : NULL);
}

/* BitCast-26: the same bits as type `to`. */
static int convert_bitcast(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "to");
  if (!x) return -1;
  if (!a) return kl_onnx_fail(c, "attribute 'to' is required");
  kl_dtype to;
  if (kl_onnx_dtype((int)a->i, &to))
    return kl_onnx_unsupported(c, "bitcast to ONNX type %lld is not supported", (long long)a->i);
  bool wide_from = x->dtype == KL_I64 || x->dtype == KL_U64, wide_to = to == KL_I64 || to == KL_U64;
  if ((wide_from || wide_to) && x->dtype != to)
    return kl_onnx_unsupported(c, "bitcast between %s and %s: the interpreter holds integers in "
                               "float64, exact only below 2^53", kl_dtype_name(x->dtype),
                               kl_dtype_name(to));
  kl_attr at = kl_adt("to", to);
  return bind(c, n, kl_onnx_emit(c, KL_OP_BITCAST, &x, 1, &at, 1));
}

/* ---- variadic -------------------------------------------------------- */
/* Max, Min, Sum, Mean: folded pairwise left to right.  Before opset 8 the
 * inputs had to share a shape, which broadcasting accepts as well. */
static int convert_variadic(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_op op = !strcmp(n->op_type, "Max") ? KL_OP_MAXIMUM
             : !strcmp(n->op_type, "Min") ? KL_OP_MINIMUM : KL_OP_ADD;
  int nin = kl_onnx_ninputs(n);
  if (nin < 1) return kl_onnx_fail(c, "needs at least one input");
  kl_value *acc = need_input(c, n, 0);
  for (int k = 1; k < nin && acc; k++) acc = binary(c, op, acc, need_input(c, n, k));
  if (acc && !strcmp(n->op_type, "Mean") && nin > 1)
    acc = binary(c, KL_OP_DIV, acc, scalar_of(c, acc, nin));
  if (acc && nin == 1) /* x + 0: a value of its own for the output */
    acc = binary(c, KL_OP_ADD, acc, scalar_of(c, acc, 0));
  return bind(c, n, acc);
}

/* ---- clip ------------------------------------------------------------ */
/* A bound given as an input must hold one value; made a scalar so that it
 * cannot change the output's rank. */
static kl_value *scalar_bound(kl_onnx_ctx *c, kl_value *v, const char *what) {
  char b[128];
  if (!v || v->shape.rank == 0) return v;
  if (kl_shape_numel(&v->shape) != 1) {
    kl_onnx_fail(c, "%s must be a scalar, got shape %s", what, kl_shape_str(&v->shape, b, sizeof b));
    return NULL;
  }
  kl_shape s = {0};
  return reshape(c, v, &s);
}

/* An integer bound at or past +-2^53 on the open side (an exporter's
 * INT64_MAX for "no max", INT64_MIN for "no min") bounds nothing Kiln's
 * integers can hold: dropped, rather than refused as inexact. */
static kl_value *unless_sentinel(kl_value *v, int side) {
  if (!v || (v->kind != KL_VAL_PARAM && v->kind != KL_VAL_CONST) || !v->data ||
      kl_shape_numel(&v->shape) != 1 || (v->dtype != KL_I64 && v->dtype != KL_U64))
    return v;
  int64_t x, limit = (int64_t)1 << 53;
  memcpy(&x, v->data, 8);
  if (v->dtype == KL_U64) return side > 0 && (uint64_t)x >= (uint64_t)limit ? NULL : v;
  return (side > 0 && x >= limit) || (side < 0 && x <= -limit) ? NULL : v;
}

/* max(x, min) then min(., max): NaN propagates, and min > max gives max,
 * as ONNX says.  Bounds are attributes before opset 11, inputs after. */
static int convert_clip(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *y = need_input(c, n, 0), *lo = NULL, *hi = NULL;
  if (!y) return -1;
  if (c->opset < 11) {
    if (kl_onnx_attr(n, "min") && !(lo = scalar_of(c, y, kl_onnx_attr_float(n, "min", 0))))
      return -1;
    if (kl_onnx_attr(n, "max") && !(hi = scalar_of(c, y, kl_onnx_attr_float(n, "max", 0))))
      return -1;
  } else {
    kl_value *min = unless_sentinel(kl_onnx_input(c, n, 1), -1);
    kl_value *max = unless_sentinel(kl_onnx_input(c, n, 2), 1);
    if (min && !(lo = scalar_bound(c, min, "min"))) return -1;
    if (max && !(hi = scalar_bound(c, max, "max"))) return -1;
  }
  if (lo) y = binary(c, KL_OP_MAXIMUM, y, lo);
  if (hi) y = binary(c, KL_OP_MINIMUM, y, hi);
  return bind(c, n, y);
}

/* ---- activations ----------------------------------------------------- */
static kl_value *elu(kl_onnx_ctx *c, kl_value *x, double alpha) {
  kl_attr a = kl_af("alpha", alpha);
  return x ? kl_onnx_emit(c, KL_OP_ELU, &x, 1, &a, 1) : NULL;
}

static int convert_elu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return bind(c, n, elu(c, need_input(c, n, 0), kl_onnx_attr_float(n, "alpha", 1.0)));
}

/* gamma * elu(x, alpha) */
static int convert_selu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  double alpha = kl_onnx_attr_float(n, "alpha", 1.67326319217681884765625);
  double gamma = kl_onnx_attr_float(n, "gamma", 1.05070102214813232421875);
  return bind(c, n, binary(c, KL_OP_MUL, elu(c, x, alpha), scalar_of(c, x, gamma)));
}

/* max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) = alpha * elu(x / alpha) */
static int convert_celu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  double alpha = kl_onnx_attr_float(n, "alpha", 1.0);
  if (alpha == 0) return kl_onnx_fail(c, "alpha must not be 0");
  if (alpha == 1) return bind(c, n, elu(c, x, 1.0));
  kl_value *e = elu(c, binary(c, KL_OP_DIV, x, scalar_of(c, x, alpha)), 1.0);
  return bind(c, n, binary(c, KL_OP_MUL, e, scalar_of(c, x, alpha)));
}

/* max(0, min(1, alpha * x + beta)) */
static kl_value *hard_sigmoid(kl_onnx_ctx *c, kl_value *x, double alpha, double beta) {
  kl_value *y = binary(c, KL_OP_MUL, x, scalar_of(c, x, alpha));
  y = binary(c, KL_OP_ADD, y, scalar_of(c, x, beta));
  y = binary(c, KL_OP_MINIMUM, y, scalar_of(c, x, 1.0));
  return binary(c, KL_OP_MAXIMUM, y, scalar_of(c, x, 0.0));
}

static int convert_hard_sigmoid(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return bind(c, n, hard_sigmoid(c, need_input(c, n, 0), kl_onnx_attr_float(n, "alpha", 0.2),
                                 kl_onnx_attr_float(n, "beta", 0.5)));
}

/* x * hard_sigmoid(x, 1/6, 1/2) */
static int convert_hard_swish(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  return bind(c, n, binary(c, KL_OP_MUL, x, hard_sigmoid(c, x, 1.0 / 6.0, 0.5)));
}

/* x / (1 + |x|) */
static int convert_softsign(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  kl_value *d = binary(c, KL_OP_ADD, unary(c, KL_OP_ABS, x), scalar_of(c, x, 1.0));
  return bind(c, n, binary(c, KL_OP_DIV, x, d));
}

/* x > alpha ? x : 0 */
static int convert_thresholded_relu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  kl_value *keep = binary(c, KL_OP_GT, x, scalar_of(c, x, kl_onnx_attr_float(n, "alpha", 1.0)));
  kl_value *ins[3] = {keep, x, scalar_of(c, x, 0.0)};
  return bind(c, n, keep && ins[2] ? kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0) : NULL);
}

/* x < -lambd ? x + bias : x > lambd ? x - bias : 0 */
static int convert_shrink(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  double lambd = kl_onnx_attr_float(n, "lambd", 0.5), bias = kl_onnx_attr_float(n, "bias", 0.0);
  kl_value *hi[3] = {binary(c, KL_OP_GT, x, scalar_of(c, x, lambd)),
                     binary(c, KL_OP_SUB, x, scalar_of(c, x, bias)), scalar_of(c, x, 0.0)};
  if (!hi[0] || !hi[1] || !hi[2]) return -1;
  kl_value *lo[3] = {binary(c, KL_OP_LT, x, scalar_of(c, x, -lambd)),
                     binary(c, KL_OP_ADD, x, scalar_of(c, x, bias)),
                     kl_onnx_emit(c, KL_OP_WHERE, hi, 3, NULL, 0)};
  if (!lo[0] || !lo[1] || !lo[2]) return -1;
  return bind(c, n, kl_onnx_emit(c, KL_OP_WHERE, lo, 3, NULL, 0));
}

/* x < 0 ? slope * x : x.  slope broadcasts to x one way (from opset 7);
 * before, a 1-D slope of x's channel count applied per channel (axis 1). */
static int convert_prelu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *slope = need_input(c, n, 1);
  if (!x || !slope) return -1;
  char sx[128], ss[128];
  const kl_shape *xs = &x->shape;
  if (c->opset < 7 && slope->shape.rank == 1 && xs->rank > 2 &&
      slope->shape.dims[0] == xs->dims[1] && slope->shape.dims[0] != 1) {
    kl_shape s = {.rank = xs->rank - 1, .dims = {xs->dims[1]}};
    for (int d = 1; d < s.rank; d++) s.dims[d] = 1;
    if (!(slope = reshape(c, slope, &s))) return -1;
  }
  kl_shape out;
  kl_error scratch;
  if (kl_broadcast_shapes(xs, &slope->shape, &out, &scratch, (kl_loc){0}) ||
      !kl_shape_equal(&out, xs))
    return kl_onnx_fail(c, "slope %s does not broadcast to x %s",
                        kl_shape_str(&slope->shape, ss, sizeof ss), kl_shape_str(xs, sx, sizeof sx));
  kl_value *ins[3] = {binary(c, KL_OP_LT, x, scalar_of(c, x, 0.0)), binary(c, KL_OP_MUL, x, slope),
                      x};
  if (!ins[0] || !ins[1]) return -1;
  return bind(c, n, kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0));
}

/* ---- tests and mod --------------------------------------------------- */
static int convert_is_inf(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  kl_attr a[2] = {kl_ai("detect_positive", kl_onnx_attr_int(n, "detect_positive", 1)),
                  kl_ai("detect_negative", kl_onnx_attr_int(n, "detect_negative", 1))};
  return bind(c, n, x ? kl_onnx_emit(c, KL_OP_ISINF, &x, 1, a, 2) : NULL);
}

static int convert_mod(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[2] = {need_input(c, n, 0), need_input(c, n, 1)};
  kl_attr a = kl_ai("fmod", kl_onnx_attr_int(n, "fmod", 0));
  return bind(c, n, ins[0] && ins[1] ? kl_onnx_emit(c, KL_OP_MOD, ins, 2, &a, 1) : NULL);
}

static int convert_leaky_relu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  kl_attr a = kl_af("alpha", kl_onnx_attr_float(n, "alpha", 0.01));
  return bind(c, n, x ? kl_onnx_emit(c, KL_OP_LEAKY_RELU, &x, 1, &a, 1) : NULL);
}

/* Gelu (opset 20): approximate "none" (erf) or "tanh". */
static int convert_gelu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  const char *ap = kl_onnx_attr_string(c, n, "approximate", "none");
  if (strcmp(ap, "none") && strcmp(ap, "tanh"))
    return kl_onnx_fail(c, "approximate must be \"none\" or \"tanh\", got \"%s\"", ap);
  kl_attr a = kl_as("approximate", ap);
  return bind(c, n, x ? kl_onnx_emit(c, KL_OP_GELU, &x, 1, &a, 1) : NULL);
}

static kl_value *swish(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *x) {
  kl_attr a = kl_af("alpha", kl_onnx_attr_float(n, "alpha", 1.0));
  return x ? kl_onnx_emit(c, KL_OP_SWISH, &x, 1, &a, 1) : NULL;
}

static int convert_swish(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return bind(c, n, swish(c, n, need_input(c, n, 0)));
}

/* SwiGLU(A, B) = swish_alpha(A) * B, A and B of one shape (no
 * broadcasting); the two elementwise nodes fuse into one kernel. */
static int convert_swiglu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *a = need_input(c, n, 0), *b = need_input(c, n, 1);
  if (!a || !b) return -1;
  if (!kl_shape_equal(&a->shape, &b->shape)) {
    char sa[160], sb[160];
    return kl_onnx_fail(c, "A %s and B %s must have one shape", kl_shape_str(&a->shape, sa, sizeof sa),
                        kl_shape_str(&b->shape, sb, sizeof sb));
  }
  return bind(c, n, binary(c, KL_OP_MUL, swish(c, n, a), b));
}

/* ---- bit shifts, determinants, grid sampling ------------------------- */
static int convert_bit_shift(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[2] = {need_input(c, n, 0), need_input(c, n, 1)};
  const char *d = kl_onnx_attr_string(c, n, "direction", "");
  if (!ins[0] || !ins[1]) return -1;
  if (strcmp(d, "LEFT") && strcmp(d, "RIGHT"))
    return kl_onnx_fail(c, "direction must be \"LEFT\" or \"RIGHT\", got \"%s\"", d);
  kl_attr a = kl_as("direction", d[0] == 'L' ? "left" : "right");
  return bind(c, n, kl_onnx_emit(c, KL_OP_BITSHIFT, ins, 2, &a, 1));
}

static int convert_det(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return bind(c, n, unary(c, KL_OP_DET, need_input(c, n, 0)));
}

/* GridSample-16 names the modes bilinear and bicubic, 20 linear and cubic. */
static int convert_grid_sample(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[2] = {need_input(c, n, 0), need_input(c, n, 1)};
  const char *mode = kl_onnx_attr_string(c, n, "mode", c->opset >= 20 ? "linear" : "bilinear");
  if (!ins[0] || !ins[1]) return -1;
  if (!strcmp(mode, "bilinear")) mode = "linear";
  else if (!strcmp(mode, "bicubic")) mode = "cubic";
  kl_attr a[3] = {kl_as("mode", mode),
                  kl_as("padding_mode", kl_onnx_attr_string(c, n, "padding_mode", "zeros")),
                  kl_ai("align_corners", kl_onnx_attr_int(n, "align_corners", 0))};
  return bind(c, n, kl_onnx_emit(c, KL_OP_GRID_SAMPLE, ins, 2, a, 3));
}

/* ---- windows --------------------------------------------------------- */
#define PI 3.14159265358979323846 /* C11 has no M_PI */

/* HannWindow, HammingWindow, BlackmanWindow: sum_k a_k cos(2 pi k i / N)
 * with N = size (periodic) or size - 1 (symmetric), folded into a
 * constant since the size decides the shape. */
static int convert_window(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  static const struct { const char *op; double a[3]; } kinds[] = {
      {"HannWindow", {0.5, -0.5, 0}},
      {"HammingWindow", {25.0 / 46.0, -21.0 / 46.0, 0}},
      {"BlackmanWindow", {0.42, -0.5, 0.08}},
  };
  const double *a = kinds[0].a;
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    if (!strcmp(kinds[i].op, n->op_type)) a = kinds[i].a;
  int64_t size;
  kl_value *x = need_input(c, n, 0);
  if (!x || kl_onnx_const_ints(c, x, "the window size", &size, 1) < 0) return -1;
  if (size < 0 || size > KL_MAX_NUMEL)
    return kl_onnx_fail(c, "the window size %lld is out of range", (long long)size);
  kl_dtype t;
  int64_t ot = kl_onnx_attr_int(n, "output_datatype", 1);
  if (kl_onnx_dtype((int)ot, &t))
    return kl_onnx_unsupported(c, "output_datatype %lld is not supported", (long long)ot);
  double period = kl_onnx_attr_int(n, "periodic", 1) ? (double)size : (double)size - 1;
  double *vals = malloc((size_t)(size ? size : 1) * sizeof *vals);
  if (!vals) return kl_onnx_fail(c, "out of memory for a window of %lld", (long long)size);
  for (int64_t i = 0; i < size; i++) {
    double w = period > 0 ? 2 * PI * (double)i / period : 0;
    vals[i] = a[0] + a[1] * cos(w) + a[2] * cos(2 * w);
  }
  kl_shape s = {.rank = 1, .dims = {size}};
  kl_value *y = kl_onnx_constant(c, t, &s, vals, (int)size);
  free(vals);
  return bind(c, n, y);
}

/* Rows register at the first opset whose semantics the converter handles;
 * opset-1 rows ignore the legacy `consumed_inputs` attribute. */
const kl_onnx_op kl_onnx_ops_math[] = {
    {"Abs", 1, convert_direct},        {"Neg", 1, convert_direct},
    {"Exp", 1, convert_direct},        {"Log", 1, convert_direct},
    {"Sqrt", 1, convert_direct},       {"Reciprocal", 1, convert_direct},
    {"Tanh", 1, convert_direct},       {"Sigmoid", 1, convert_direct},
    {"Relu", 1, convert_direct},       {"Erf", 9, convert_direct},
    {"Sin", 7, convert_direct},        {"Cos", 7, convert_direct},
    {"Tan", 7, convert_direct},        {"Asin", 7, convert_direct},
    {"Acos", 7, convert_direct},       {"Atan", 7, convert_direct},
    {"Sinh", 9, convert_direct},       {"Cosh", 9, convert_direct},
    {"Asinh", 9, convert_direct},      {"Acosh", 9, convert_direct},
    {"Atanh", 9, convert_direct},      {"Floor", 1, convert_direct},
    {"Ceil", 1, convert_direct},       {"Round", 11, convert_direct},
    {"Sign", 9, convert_direct},       {"Not", 1, convert_direct},
    {"IsNaN", 9, convert_direct},      {"IsInf", 10, convert_is_inf},
    {"Softplus", 1, convert_direct},   {"Softsign", 1, convert_softsign},
    {"Add", 1, convert_direct},        {"Sub", 1, convert_direct},
    {"Mul", 1, convert_direct},        {"Div", 1, convert_direct},
    {"Pow", 1, convert_direct},        {"Mod", 10, convert_mod},
    {"Equal", 1, convert_direct},      {"Less", 1, convert_direct},
    {"Greater", 1, convert_direct},    {"LessOrEqual", 12, convert_direct},
    {"GreaterOrEqual", 12, convert_direct},
    {"And", 1, convert_direct},        {"Or", 1, convert_direct},
    {"Xor", 1, convert_direct},        {"Where", 9, convert_direct},
    {"LeakyRelu", 1, convert_leaky_relu},
    {"Elu", 1, convert_elu},           {"Selu", 1, convert_selu},
    {"Celu", 12, convert_celu},        {"HardSigmoid", 1, convert_hard_sigmoid},
    {"HardSwish", 14, convert_hard_swish},
    {"Gelu", 20, convert_gelu},        {"Swish", 24, convert_swish},
    {"Mish", 18, convert_direct},      {"SwiGLU", 28, convert_swiglu},
    {"ThresholdedRelu", 1, convert_thresholded_relu},
    {"Shrink", 9, convert_shrink},     {"PRelu", 1, convert_prelu},
    {"Clip", 1, convert_clip},         {"Cast", 1, convert_cast},
    {"CastLike", 15, convert_cast_like},
    {"BitCast", 26, convert_bitcast},
    {"Identity", 1, convert_identity},
    {"Max", 1, convert_variadic},      {"Min", 1, convert_variadic},
    {"Sum", 1, convert_variadic},      {"Mean", 1, convert_variadic},
    {"BitShift", 11, convert_bit_shift},
    {"BitwiseAnd", 18, convert_direct}, {"BitwiseOr", 18, convert_direct},
    {"BitwiseXor", 18, convert_direct}, {"BitwiseNot", 18, convert_direct},
    {"Det", 11, convert_det},
    {"GridSample", 16, convert_grid_sample},
    {"HannWindow", 17, convert_window},
    {"HammingWindow", 17, convert_window},
    {"BlackmanWindow", 17, convert_window},
    {NULL, 0, NULL},
};
