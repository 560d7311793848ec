/* ops_math.c - shape inference and evaluation of the math rows of ops.def:
 * float functions, rounding, sign, NaN/Inf tests, logic on bool, mod, bit
 * shifts, bitwise logic on integers and determinants. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* Which input dtypes a row accepts. */
typedef enum {
  T_FLOAT,   /* floating point only */
  T_NUMERIC, /* floats and integers, not bool */
  T_BOOL     /* bool only (logic) */
} type_class;

static int check_type(const kl_node *n, kl_error *err, const kl_value *v,
                      type_class c) {
  if (c == T_FLOAT) return kl_need_float(n, err, v);
  if (c == T_NUMERIC) return kl_need_numeric(n, err, v);
  char b[256];
  if (c == T_BOOL && v->dtype != KL_BOOL)
    return KL_NODE_FAIL(n, err, "needs a bool input, got %s",
                        kl_value_str(v, b, sizeof b));
  return 0;
}

/* ---- unary ----------------------------------------------------------- */
/* p carries the row's parameter (elu's alpha); most ignore it. */
typedef double (*unary_fn)(double x, double p);

static int infer_unary(kl_node *n, kl_error *err, type_class c, bool to_bool) {
  const kl_value *x = n->inputs[0];
  if (check_type(n, err, x, c)) return -1;
  kl_set_output(n, 0, to_bool ? KL_BOOL : x->dtype, &x->shape);
  return 0;
}

static int eval_unary(const kl_tensor *x, kl_tensor *y, unary_fn f, double p) {
  for (int64_t i = 0; i < x->numel; i++) y->data[i] = f(x->data[i], p);
  return 0;
}

static double f_sin(double x, double p) { (void)p; return sin(x); }
static double f_cos(double x, double p) { (void)p; return cos(x); }
static double f_tan(double x, double p) { (void)p; return tan(x); }
static double f_asin(double x, double p) { (void)p; return asin(x); }
static double f_acos(double x, double p) { (void)p; return acos(x); }
static double f_atan(double x, double p) { (void)p; return atan(x); }
static double f_sinh(double x, double p) { (void)p; return sinh(x); }
static double f_cosh(double x, double p) { (void)p; return cosh(x); }
static double f_asinh(double x, double p) { (void)p; return asinh(x); }
static double f_acosh(double x, double p) { (void)p; return acosh(x); }
static double f_atanh(double x, double p) { (void)p; return atanh(x); }
static double f_floor(double x, double p) { (void)p; return floor(x); }
static double f_ceil(double x, double p) { (void)p; return ceil(x); }
/* nearbyint in the default rounding mode rounds halves to even. */
static double f_round(double x, double p) { (void)p; return nearbyint(x); }
/* max(x, 0) + log1p(exp(-|x|)): exp never overflows. */
static double f_softplus(double x, double p) {
  (void)p;
  return (x > 0 ? x : 0.0) + log1p(exp(-fabs(x)));
}
/* `x < 0` so NaN passes through; expm1 keeps small negatives exact. */
static double f_elu(double x, double alpha) {
  return x < 0 ? alpha * expm1(x) : x;
}
static double f_sign(double x, double p) {
  (void)p;
  return x > 0 ? 1.0 : x < 0 ? -1.0 : x; /* 0, -0 and NaN unchanged */
}
static double f_isnan(double x, double p) { (void)p; return isnan(x) != 0; }
static double f_not(double x, double p) { (void)p; return x == 0; }

#define UNARY_ROW(ID, CLASS, TO_BOOL, FN)                                      \
  int kl_infer_##ID(kl_node *n, kl_error *err) {                               \
    return infer_unary(n, err, CLASS, TO_BOOL);                                \
  }                                                                            \
  int kl_eval_##ID(const kl_node *n, kl_tensor **in, kl_tensor **out,          \
                   kl_error *err) {                                            \
    (void)n;                                                                   \
    (void)err;                                                                 \
    return eval_unary(in[0], out[0], FN, 0.0);                                 \
  }

UNARY_ROW(SIN, T_FLOAT, false, f_sin)
UNARY_ROW(COS, T_FLOAT, false, f_cos)
UNARY_ROW(TAN, T_FLOAT, false, f_tan)
UNARY_ROW(ASIN, T_FLOAT, false, f_asin)
UNARY_ROW(ACOS, T_FLOAT, false, f_acos)
UNARY_ROW(ATAN, T_FLOAT, false, f_atan)
UNARY_ROW(SINH, T_FLOAT, false, f_sinh)
UNARY_ROW(COSH, T_FLOAT, false, f_cosh)
UNARY_ROW(ASINH, T_FLOAT, false, f_asinh)
UNARY_ROW(ACOSH, T_FLOAT, false, f_acosh)
UNARY_ROW(ATANH, T_FLOAT, false, f_atanh)
UNARY_ROW(FLOOR, T_FLOAT, false, f_floor)
UNARY_ROW(CEIL, T_FLOAT, false, f_ceil)
UNARY_ROW(ROUND, T_FLOAT, false, f_round)
UNARY_ROW(SOFTPLUS, T_FLOAT, false, f_softplus)
UNARY_ROW(SIGN, T_NUMERIC, false, f_sign)
UNARY_ROW(ISNAN, T_FLOAT, true, f_isnan)
UNARY_ROW(LOGICAL_NOT, T_BOOL, false, f_not)

int kl_infer_ELU(kl_node *n, kl_error *err) {
  return infer_unary(n, err, T_FLOAT, false);
}

int kl_eval_ELU(const kl_node *n, kl_tensor **in, kl_tensor **out,
                kl_error *err) {
  (void)err;
  return eval_unary(in[0], out[0], f_elu, kl_attr_float(n, "alpha", 1.0));
}

int kl_infer_ISINF(kl_node *n, kl_error *err) {
  bool pos, neg;
  if (kl_attr_flag(n, err, "detect_positive", 1, &pos) ||
      kl_attr_flag(n, err, "detect_negative", 1, &neg))
    return -1;
  return infer_unary(n, err, T_FLOAT, true);
}

int kl_eval_ISINF(const kl_node *n, kl_tensor **in, kl_tensor **out,
                  kl_error *err) {
  (void)err;
  bool pos = kl_attr_int(n, "detect_positive", 1) != 0;
  bool neg = kl_attr_int(n, "detect_negative", 1) != 0;
  const kl_tensor *x = in[0];
  for (int64_t i = 0; i < x->numel; i++) {
    double v = x->data[i];
    out[0]->data[i] = isinf(v) && (v > 0 ? pos : neg);
  }
  return 0;
}

/* ---- binary ---------------------------------------------------------- */
static int infer_binary(kl_node *n, kl_error *err, type_class c) {
  const kl_value *a = n->inputs[0], *b = n->inputs[1];
  char ba[256], bb[256];
  if (a->dtype != b->dtype)
    return KL_NODE_FAIL(n, err, "inputs must share a dtype, got %s and %s",
                        kl_value_str(a, ba, sizeof ba),
                        kl_value_str(b, bb, sizeof bb));
  if (check_type(n, err, a, c)) return -1;
  kl_shape s;
  kl_error scratch;
  if (kl_broadcast_shapes(&a->shape, &b->shape, &s, &scratch, n->loc))
    return KL_NODE_FAIL(n, err, "cannot broadcast %s with %s",
                        kl_value_str(a, ba, sizeof ba),
                        kl_value_str(b, bb, sizeof bb));
  kl_set_output(n, 0, a->dtype, &s);
  return 0;
}

/* Element of t for output element i (multi-index idx) of y. */
static double bcast_at(const kl_tensor *t, const kl_tensor *y, int64_t i,
                       const int64_t *idx) {
  if (kl_shape_equal(&t->shape, &y->shape)) return t->data[i];
  return t->data[kl_broadcast_index(&t->shape, &y->shape, idx)];
}

/* Per-element body of a binary row: NULL, or an error message.  p is the
 * row's parameter (mod's fmod flag); ints says the dtype is an integer. */
typedef const char *(*binary_fn)(double a, double b, double p, bool ints,
                                 double *r);

static int eval_binary(const kl_node *n, kl_tensor **in, kl_tensor *y,
                       binary_fn f, double p, kl_error *err) {
  bool ints = kl_dtype_is_int(in[0]->dtype);
  int64_t idx[KL_MAX_RANK] = {0};
  for (int64_t i = 0; i < y->numel; i++, kl_index_next(&y->shape, idx)) {
    double a = bcast_at(in[0], y, i, idx), b = bcast_at(in[1], y, i, idx);
    const char *msg = f(a, b, p, ints, &y->data[i]);
    if (msg) return KL_NODE_FAIL(n, err, "%s (%.17g and %.17g)", msg, a, b);
  }
  return 0;
}

static const char *f_and(double a, double b, double p, bool ints, double *r) {
  (void)p, (void)ints;
  *r = a != 0 && b != 0;
  return NULL;
}
static const char *f_or(double a, double b, double p, bool ints, double *r) {
  (void)p, (void)ints;
  *r = a != 0 || b != 0;
  return NULL;
}
static const char *f_xor(double a, double b, double p, bool ints, double *r) {
  (void)p, (void)ints;
  *r = (a != 0) != (b != 0);
  return NULL;
}

#define LOGIC_ROW(ID, FN)                                                      \
  int kl_infer_##ID(kl_node *n, kl_error *err) {                               \
    return infer_binary(n, err, T_BOOL);                                       \
  }                                                                            \
  int kl_eval_##ID(const kl_node *n, kl_tensor **in, kl_tensor **out,          \
                   kl_error *err) {                                            \
    return eval_binary(n, in, out[0], FN, 0.0, err);                           \
  }

LOGIC_ROW(LOGICAL_AND, f_and)
LOGIC_ROW(LOGICAL_OR, f_or)
LOGIC_ROW(LOGICAL_XOR, f_xor)

/* ---- mod ------------------------------------------------------------- */
int kl_infer_MOD(kl_node *n, kl_error *err) {
  bool fm;
  if (kl_attr_flag(n, err, "fmod", 0, &fm)) return -1;
  return infer_binary(n, err, T_NUMERIC);
}

/* Floats: fmod is exact, and adding the divisor once moves the remainder
 * to the divisor's sign.  Integers go through int64 (the remainder is below
 * |b|, so doubles hold it exactly). */
static const char *f_mod(double a, double b, double c_fmod, bool ints,
                         double *r) {
  if (!ints) {
    double m = fmod(a, b);
    if (c_fmod == 0 && m != 0 && (m < 0) != (b < 0)) m += b;
    *r = m;
    return NULL;
  }
  int64_t ia = kl_to_i64(a), ib = kl_to_i64(b);
  if (ib == 0) return "integer modulo by zero";
  int64_t m = ib == -1 ? 0 : ia % ib; /* INT64_MIN % -1 overflows in C */
  if (c_fmod == 0 && m != 0 && (m < 0) != (ib < 0)) m += ib;
  *r = (double)m;
  return NULL;
}

int kl_eval_MOD(const kl_node *n, kl_tensor **in, kl_tensor **out,
                kl_error *err) {
  return eval_binary(n, in, out[0], f_mod, (double)kl_attr_int(n, "fmod", 0),
                     err);
}

/* ---- bitshift -------------------------------------------------------- */
/* Which way a bitshift node shifts: 1 left, 0 right, -1 invalid. */
static int shift_left(const kl_node *n) {
  const char *d = kl_attr_string(n, "direction", "");
  return !strcmp(d, "left") ? 1 : !strcmp(d, "right") ? 0 : -1;
}

int kl_infer_BITSHIFT(kl_node *n, kl_error *err) {
  char b[256];
  if (!kl_node_attr(n, "direction"))
    return KL_NODE_FAIL(n, err, "attribute 'direction' is required (\"left\" or \"right\")");
  if (shift_left(n) < 0)
    return KL_NODE_FAIL(n, err, "direction must be \"left\" or \"right\", got \"%s\"",
                        kl_attr_string(n, "direction", ""));
  if (!kl_dtype_is_int(n->inputs[0]->dtype))
    return KL_NODE_FAIL(n, err, "needs integer inputs, got %s",
                        kl_value_str(n->inputs[0], b, sizeof b));
  return infer_binary(n, err, T_NUMERIC);
}

/* p: +bits to shift left, -bits to shift right, bits being the dtype's
 * width.  Operands are non-negative integers below 2^64 held in double. */
static const char *f_shift(double a, double b, double p, bool ints, double *r) {
  (void)ints;
  int bits = (int)fabs(p);
  uint64_t x = a < 0x1p64 ? (uint64_t)a : UINT64_MAX;
  uint64_t s = b < 0x1p64 ? (uint64_t)b : UINT64_MAX;
  uint64_t y = s >= (uint64_t)bits ? 0 : p > 0 ? x << s : x >> s;
  if (bits < 64) y &= ((uint64_t)1 << bits) - 1;
  *r = (double)y;
  return NULL;
}

/* Signed operands (BitShift-26): a left shift drops the bits past the top
 * (the interpreter's rounding wraps to the width), a right shift is
 * arithmetic.  A shift below 0 or at least the width gives the full-width
 * result: 0, or -1 for a negative x shifted right. */
static const char *f_shift_signed(double a, double b, double p, bool ints, double *r) {
  (void)ints;
  int bits = (int)fabs(p);
  int64_t x = kl_to_i64(a), s = kl_to_i64(b);
  if (s < 0 || s >= bits) *r = p > 0 || x >= 0 ? 0 : -1;
  else if (p > 0) *r = (double)(int64_t)((uint64_t)x << s);
  else *r = (double)(x < 0 ? ~(~x >> s) : x >> s); /* no signed >> in C */
  return NULL;
}

int kl_eval_BITSHIFT(const kl_node *n, kl_tensor **in, kl_tensor **out,
                     kl_error *err) {
  double bits = (double)kl_dtype_size(in[0]->dtype) * 8;
  binary_fn f = kl_dtype_is_unsigned(in[0]->dtype) ? f_shift : f_shift_signed;
  return eval_binary(n, in, out[0], f, shift_left(n) ? bits : -bits, err);
}

/* ---- bitwise and, or, xor, not --------------------------------------- */
/* The two's-complement bits of an integer element (signed or not). */
static uint64_t bits_of(double v) {
  return v >= 0x1p63 ? (uint64_t)v : (uint64_t)kl_to_i64(v);
}

/* p selects the operation: 0 and, 1 or, 2 xor.  The interpreter's rounding
 * reads the 64-bit pattern back at the dtype's width and signedness. */
static const char *f_bitwise(double a, double b, double p, bool ints, double *r) {
  (void)ints;
  uint64_t x = bits_of(a), y = bits_of(b);
  uint64_t z = p == 0 ? x & y : p == 1 ? x | y : x ^ y;
  *r = a < 0 || b < 0 ? (double)(int64_t)z : (double)z;
  return NULL;
}

static int need_int(const kl_node *n, kl_error *err, const kl_value *v) {
  char b[256];
  if (!kl_dtype_is_int(v->dtype))
    return KL_NODE_FAIL(n, err, "needs integer inputs, got %s", kl_value_str(v, b, sizeof b));
  return 0;
}

#define BITWISE_ROW(ID, P)                                                     \
  int kl_infer_##ID(kl_node *n, kl_error *err) {                               \
    if (need_int(n, err, n->inputs[0])) return -1;                             \
    return infer_binary(n, err, T_NUMERIC);                                    \
  }                                                                            \
  int kl_eval_##ID(const kl_node *n, kl_tensor **in, kl_tensor **out,          \
                   kl_error *err) {                                            \
    return eval_binary(n, in, out[0], f_bitwise, P, err);                      \
  }

BITWISE_ROW(BITWISE_AND, 0)
BITWISE_ROW(BITWISE_OR, 1)
BITWISE_ROW(BITWISE_XOR, 2)

int kl_infer_BITWISE_NOT(kl_node *n, kl_error *err) {
  if (need_int(n, err, n->inputs[0])) return -1;
  return infer_unary(n, err, T_NUMERIC, false);
}

int kl_eval_BITWISE_NOT(const kl_node *n, kl_tensor **in, kl_tensor **out,
                        kl_error *err) {
  (void)n, (void)err;
  const kl_tensor *x = in[0];
  bool uns = kl_dtype_is_unsigned(x->dtype);
  for (int64_t i = 0; i < x->numel; i++) {
    uint64_t z = ~bits_of(x->data[i]);
    out[0]->data[i] = uns ? kl_wrap_to(x->dtype, z) : (double)(int64_t)z;
  }
  return 0;
}

/* ---- det ------------------------------------------------------------- */
int kl_infer_DET(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char b[256];
  if (check_type(n, err, x, T_FLOAT)) return -1;
  int r = x->shape.rank;
  if (r < 2 || x->shape.dims[r - 1] != x->shape.dims[r - 2])
    return KL_NODE_FAIL(n, err, "needs square matrices [..., n, n], got %s",
                        kl_value_str(x, b, sizeof b));
  kl_shape s = x->shape;
  s.rank -= 2;
  return kl_set_checked_output(n, err, 0, x->dtype, &s);
}

/* Gaussian elimination with partial pivoting on a (n x n, overwritten):
 * the product of the pivots, negated once per row swap. */
static double lu_det(double *a, int64_t n) {
  double det = 1.0;
  for (int64_t k = 0; k < n; k++) {
    int64_t p = k;
    for (int64_t i = k + 1; i < n; i++)
      if (fabs(a[i * n + k]) > fabs(a[p * n + k])) p = i;
    if (a[p * n + k] == 0) return 0.0;
    if (p != k) {
      for (int64_t j = 0; j < n; j++) {
        double t = a[k * n + j];
        a[k * n + j] = a[p * n + j];
        a[p * n + j] = t;
      }
      det = -det;
    }
    double piv = a[k * n + k];
    det *= piv;
    for (int64_t i = k + 1; i < n; i++) {
      double f = a[i * n + k] / piv;
      for (int64_t j = k + 1; j < n; j++) a[i * n + j] -= f * a[k * n + j];
    }
  }
  return det;
}

int kl_eval_DET(const kl_node *n, kl_tensor **in, kl_tensor **out,
                kl_error *err) {
  const kl_tensor *x = in[0];
  int64_t m = x->shape.dims[x->shape.rank - 1], sz = m * m;
  double *work = sz ? malloc((size_t)sz * sizeof *work) : NULL;
  if (sz && !work) return KL_NODE_FAIL(n, err, "out of memory");
  for (int64_t b = 0; b < out[0]->numel; b++) {
    if (sz) memcpy(work, x->data + b * sz, (size_t)sz * sizeof *work);
    out[0]->data[b] = lu_det(work, m);
  }
  free(work);
  return 0;
}

/* ---- gradient rules (ir.h, kl_grad_fn) --------------------------------
 * Each is dy times the function's slope, written over x or the output y. */
#define X (n->inputs[0])
#define Y (n->outputs[0])
#define S(v) kl_gb_scalar(c, Y->dtype, (v))
#define ADD(a, b) kl_gb2(c, KL_OP_ADD, (a), (b))
#define SUB(a, b) kl_gb2(c, KL_OP_SUB, (a), (b))
#define MUL(a, b) kl_gb2(c, KL_OP_MUL, (a), (b))
#define DIV(a, b) kl_gb2(c, KL_OP_DIV, (a), (b))
#define UN(op, a) kl_gb1(c, KL_OP_##op, (a))

#define SLOPE_RULE(ID, SLOPE)                                                            \
  int kl_grad_##ID(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) { \
    dx[0] = MUL(dy[0], (SLOPE));                                                         \
    return 0;                                                                            \
  }
/* dy / f(x) for slopes that are a reciprocal */
#define RECIP_RULE(ID, DENOM)                                                            \
  int kl_grad_##ID(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) { \
    dx[0] = DIV(dy[0], (DENOM));                                                         \
    return 0;                                                                            \
  }

SLOPE_RULE(SIN, UN(COS, X))
SLOPE_RULE(COS, UN(NEG, UN(SIN, X)))
SLOPE_RULE(TAN, ADD(S(1), MUL(Y, Y)))
RECIP_RULE(ASIN, UN(SQRT, SUB(S(1), MUL(X, X))))
RECIP_RULE(ACOS, UN(NEG, UN(SQRT, SUB(S(1), MUL(X, X)))))
RECIP_RULE(ATAN, ADD(S(1), MUL(X, X)))
SLOPE_RULE(SINH, UN(COSH, X))
SLOPE_RULE(COSH, UN(SINH, X))
RECIP_RULE(ASINH, UN(SQRT, ADD(MUL(X, X), S(1))))
RECIP_RULE(ACOSH, UN(SQRT, SUB(MUL(X, X), S(1))))
RECIP_RULE(ATANH, SUB(S(1), MUL(X, X)))
SLOPE_RULE(SOFTPLUS, UN(SIGMOID, X))

/* Piecewise constant: no gradient reaches x (0 almost everywhere). */
#define ZERO_RULE(ID)                                                                    \
  int kl_grad_##ID(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) { \
    (void)c, (void)n, (void)dy;                                                          \
    dx[0] = NULL;                                                                        \
    return 0;                                                                            \
  }
ZERO_RULE(FLOOR)
ZERO_RULE(CEIL)
ZERO_RULE(ROUND)
ZERO_RULE(SIGN)

/* x < 0: alpha exp(x) = y + alpha; else 1 (as the eval's `x < 0`). */
int kl_grad_ELU(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  double alpha = kl_attr_float(n, "alpha", 1.0);
  kl_value *neg = kl_gb2(c, KL_OP_LT, X, S(0));
  dx[0] = kl_gb3(c, KL_OP_WHERE, neg, MUL(dy[0], ADD(Y, S(alpha))), dy[0]);
  return 0;
}

/* y = a - b q with q an integer (floor or truncation of a / b, by fmod):
 * da = dy, db = -q dy, q recovered exactly as round((a - y) / b). */
int kl_grad_MOD(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *q = UN(ROUND, DIV(SUB(X, Y), n->inputs[1]));
  dx[0] = dy[0];
  dx[1] = UN(NEG, MUL(dy[0], q));
  return 0;
}

#undef X
#undef Y
#undef S
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef UN
#undef SLOPE_RULE
#undef RECIP_RULE
#undef ZERO_RULE

/* d det(A) / dA is A's cofactor matrix, (-1)^(i+j) det(A without row i and
 * column j): exact for singular A too (no inverse).  The n^2 minors are
 * gathered from each flattened matrix with a constant index table, then
 * one det over them. */
int kl_grad_DET(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0];
  int r = x->shape.rank;
  int64_t m = x->shape.dims[r - 1], batch = kl_shape_numel(&x->shape) / (m * m > 0 ? m * m : 1);
  if (m == 0) return 0;
  int64_t cells = m * m * (m - 1) * (m - 1);
  if (cells > INT32_MAX) return KL_GRAD_FAIL(c, n, "%lld x %lld matrices have too many minors",
                                             (long long)m, (long long)m);
  double *at = malloc(sizeof(double) * (size_t)(cells > 0 ? cells : 1));
  double *sign = malloc(sizeof(double) * (size_t)(m * m));
  if (!at || !sign) abort();
  int64_t k = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < m; j++) {
      sign[i * m + j] = (i + j) % 2 ? -1.0 : 1.0;
      for (int64_t p = 0; p < m; p++)
        for (int64_t q = 0; q < m; q++)
          if (p != i && q != j) at[k++] = (double)(p * m + q);
    }
  int64_t is[4] = {m, m, m - 1, m - 1}, ss[2] = {m, m};
  kl_attr ia[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = at, .n = (int)cells},
                   {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = KL_I64},
                   {.name = "shape", .kind = KL_ATTR_INTS, .ints = is, .n = 4}};
  kl_attr sa[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = sign, .n = (int)(m * m)},
                   {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = x->dtype},
                   {.name = "shape", .kind = KL_ATTR_INTS, .ints = ss, .n = 2}};
  kl_value *idx = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, ia, 3);
  kl_value *sg = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, sa, 3);
  free(at);
  free(sign);
  kl_shape flat = {2, {batch, m * m}}, cof = {3, {batch, m, m}}, g3 = {3, {batch, 1, 1}};
  kl_attr ax = {.name = "axis", .kind = KL_ATTR_INT, .i = 1};
  kl_value *ins[2] = {kl_gb_reshape(c, x, &flat), idx};
  kl_value *minors = kl_gb_node(c, KL_OP_GATHER, ins, 2, &ax, 1); /* [B, m, m, m-1, m-1] */
  kl_value *cofactors = kl_gb2(c, KL_OP_MUL, kl_gb1(c, KL_OP_DET, minors), sg);
  kl_value *g = kl_gb_reshape(c, dy[0], &g3);
  dx[0] = kl_gb_reshape(c, kl_gb2(c, KL_OP_MUL, kl_gb_reshape(c, cofactors, &cof), g), &x->shape);
  return 0;
}
