/* ops_elementwise.c - unary, binary, comparison, where and cast rows:
 * shape inference and reference evaluation. */
#include <math.h>
#include <string.h>

#include "op_impl.h"

#define SQRT1_2 0.70710678118654752440   /* 1/sqrt(2) */
#define SQRT_2_PI 0.79788456080286535588 /* sqrt(2/pi) */
#define TWO_OVER_SQRT_PI 1.12837916709551257390 /* 2/sqrt(pi), erf's slope at 0 */

/* Which input dtypes a row accepts. */
typedef enum {
  T_FLOAT,   /* floating point only (transcendental functions) */
  T_NUMERIC, /* floats and integers, not bool (arithmetic) */
  T_ANY      /* every dtype, bool included (equality, where's branches) */
} type_class;

static int check_type(const kl_node *n, kl_error *err, const kl_value *v,
                      type_class c) {
  if (c == T_FLOAT) return kl_need_float(n, err, v);
  if (c == T_NUMERIC) return kl_need_numeric(n, err, v);
  return 0;
}

/* Broadcast two input shapes, reporting the failure with both types. */
static int broadcast2(const kl_node *n, kl_error *err, const kl_value *a,
                      const kl_value *b, const kl_shape *sa,
                      const kl_shape *sb, kl_shape *out) {
  kl_error scratch;
  if (kl_broadcast_shapes(sa, sb, out, &scratch, n->loc) == 0) return 0;
  char ba[256], bb[256];
  return KL_NODE_FAIL(n, err, "cannot broadcast %s with %s",
                      kl_value_str(a, ba, sizeof ba),
                      kl_value_str(b, bb, sizeof bb));
}

static int same_dtype(const kl_node *n, kl_error *err, const kl_value *a,
                      const kl_value *b) {
  if (a->dtype == b->dtype) return 0;
  char ba[256], bb[256];
  return KL_NODE_FAIL(n, err, "inputs must share a dtype, got %s and %s",
                      kl_value_str(a, ba, sizeof ba),
                      kl_value_str(b, bb, sizeof bb));
}

/* Flat index of output element i (multi-index idx) in input t. */
static int64_t src_index(const kl_tensor *t, const kl_tensor *y, int64_t i,
                         const int64_t *idx) {
  if (kl_shape_equal(&t->shape, &y->shape)) return i;
  return kl_broadcast_index(&t->shape, &y->shape, idx);
}

/* ---- unary ----------------------------------------------------------- */
/* p carries the row's parameter (leaky_relu's alpha); most ignore it. */
typedef double (*unary_fn)(double x, double p);

static int infer_unary(kl_node *n, kl_error *err, type_class c) {
  const kl_value *x = n->inputs[0];
  if (check_type(n, err, x, c)) return -1;
  kl_set_output(n, 0, x->dtype, &x->shape);
  return 0;
}

static int eval_unary(const kl_tensor *x, kl_tensor *y, unary_fn f, double p) {
  for (int64_t i = 0; i < x->numel; i++) y->data[i] = f(x->data[i], p);
  return 0;
}

/* Negating or taking |x| of an integer stays exact in double (at most one
 * bit more), and the interpreter's rounding then wraps INT_MIN as C does. */
static double f_neg(double x, double p) { (void)p; return -x; }
static double f_abs(double x, double p) { (void)p; return fabs(x); }
static double f_exp(double x, double p) { (void)p; return exp(x); }
static double f_log(double x, double p) { (void)p; return log(x); }
static double f_sqrt(double x, double p) { (void)p; return sqrt(x); }
static double f_rsqrt(double x, double p) { (void)p; return 1.0 / sqrt(x); }
static double f_recip(double x, double p) { (void)p; return 1.0 / x; }
static double f_tanh(double x, double p) { (void)p; return tanh(x); }
static double f_erf(double x, double p) { (void)p; return erf(x); }
/* Split by sign so exp never overflows. */
static double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}
static double f_sigmoid(double x, double p) { (void)p; return sigmoid(x); }
static double f_silu(double x, double p) { (void)p; return x * sigmoid(x); }
static double f_swish(double x, double alpha) { return x * sigmoid(alpha * x); }
/* softplus split by sign (no overflow), as ops_math.c's */
static double f_mish(double x, double p) {
  (void)p;
  return x * tanh(log1p(exp(-fabs(x))) + (x > 0 ? x : 0));
}
/* `x < 0` rather than `x > 0` so NaN passes through. */
static double f_relu(double x, double p) { (void)p; return x < 0 ? 0.0 : x; }
static double f_leaky(double x, double alpha) { return x < 0 ? alpha * x : x; }
static double f_gelu_erf(double x, double p) {
  (void)p;
  return 0.5 * x * (1.0 + erf(x * SQRT1_2));
}
static double f_gelu_tanh(double x, double p) {
  (void)p;
  return 0.5 * x * (1.0 + tanh(SQRT_2_PI * (x + 0.044715 * x * x * x)));
}

#define UNARY_ROW(ID, CLASS, FN)                                               \
  int kl_infer_##ID(kl_node *n, kl_error *err) {                               \
    return infer_unary(n, err, CLASS);                                         \
  }                                                                            \
  int kl_eval_##ID(const kl_node *n, kl_tensor **in, kl_tensor **out,          \
                   kl_error *err) {                                            \
    (void)n;                                                                   \
    (void)err;                                                                 \
    return eval_unary(in[0], out[0], FN, 0.0);                                 \
  }

UNARY_ROW(NEG, T_NUMERIC, f_neg)
UNARY_ROW(ABS, T_NUMERIC, f_abs)
UNARY_ROW(EXP, T_FLOAT, f_exp)
UNARY_ROW(LOG, T_FLOAT, f_log)
UNARY_ROW(SQRT, T_FLOAT, f_sqrt)
UNARY_ROW(RSQRT, T_FLOAT, f_rsqrt)
UNARY_ROW(RECIPROCAL, T_FLOAT, f_recip)
UNARY_ROW(TANH, T_FLOAT, f_tanh)
UNARY_ROW(SIGMOID, T_FLOAT, f_sigmoid)
UNARY_ROW(RELU, T_NUMERIC, f_relu)
UNARY_ROW(SILU, T_FLOAT, f_silu)
UNARY_ROW(ERF, T_FLOAT, f_erf)
UNARY_ROW(MISH, T_FLOAT, f_mish)

int kl_infer_SWISH(kl_node *n, kl_error *err) {
  return infer_unary(n, err, T_FLOAT);
}

int kl_eval_SWISH(const kl_node *n, kl_tensor **in, kl_tensor **out,
                  kl_error *err) {
  (void)err;
  return eval_unary(in[0], out[0], f_swish, kl_attr_float(n, "alpha", 1.0));
}

int kl_infer_LEAKY_RELU(kl_node *n, kl_error *err) {
  return infer_unary(n, err, T_FLOAT);
}

int kl_eval_LEAKY_RELU(const kl_node *n, kl_tensor **in, kl_tensor **out,
                       kl_error *err) {
  (void)err;
  return eval_unary(in[0], out[0], f_leaky, kl_attr_float(n, "alpha", 0.01));
}

int kl_infer_GELU(kl_node *n, kl_error *err) {
  const char *a = kl_attr_string(n, "approximate", "none");
  if (strcmp(a, "none") != 0 && strcmp(a, "tanh") != 0)
    return KL_NODE_FAIL(n, err,
                        "approximate must be \"none\" or \"tanh\", not \"%s\"",
                        a);
  return infer_unary(n, err, T_FLOAT);
}

int kl_eval_GELU(const kl_node *n, kl_tensor **in, kl_tensor **out,
                 kl_error *err) {
  (void)err;
  bool approx = strcmp(kl_attr_string(n, "approximate", "none"), "tanh") == 0;
  return eval_unary(in[0], out[0], approx ? f_gelu_tanh : f_gelu_erf, 0.0);
}

int kl_infer_CAST(kl_node *n, kl_error *err) {
  const kl_attr *to = kl_node_attr(n, "to");
  if (!to)
    return KL_NODE_FAIL(n, err,
                        "attribute 'to' (the target dtype) is required");
  if (to->i < 0 || to->i >= KL_DTYPE_COUNT)
    return KL_NODE_FAIL(n, err, "attribute 'to' is not a dtype (%lld)",
                        (long long)to->i);
  if (kl_cast_round_mode(n) < 0)
    return KL_NODE_FAIL(n, err, "round_mode must be \"up\", \"down\" or \"nearest\", got \"%s\"",
                        kl_attr_string(n, "round_mode", "up"));
  kl_set_output(n, 0, (kl_dtype)to->i, &n->inputs[0]->shape);
  return 0;
}

int kl_cast_round_mode(const kl_node *n) {
  const char *m = kl_attr_string(n, "round_mode", "up");
  return !strcmp(m, "up") ? KL_ROUND_UP : !strcmp(m, "down") ? KL_ROUND_DOWN
         : !strcmp(m, "nearest") ? KL_ROUND_NEAREST : -1;
}

/* kl_dtype_cast does the conversion; the interpreter's rounding to the
 * output dtype afterwards keeps its result. */
int kl_eval_CAST(const kl_node *n, kl_tensor **in, kl_tensor **out,
                 kl_error *err) {
  (void)err;
  kl_dtype from = in[0]->dtype, to = out[0]->dtype;
  bool saturate = kl_attr_int(n, "saturate", 1) != 0;
  int mode = kl_cast_round_mode(n);
  for (int64_t i = 0; i < in[0]->numel; i++)
    out[0]->data[i] = kl_dtype_cast(from, to, in[0]->data[i], saturate, mode);
  return 0;
}

/* ---- binary ---------------------------------------------------------- */
typedef double (*binary_fn)(double a, double b);
/* Integer variant: wrap-around result modulo 2^64 in *r, or an error
 * message.  Needed because e.g. an i32 product can need 62 bits, which a
 * double cannot hold exactly, so rounding afterwards would wrap wrongly. */
typedef const char *(*int_fn)(int64_t a, int64_t b, uint64_t *r);

static double f_add(double a, double b) { return a + b; }
static double f_sub(double a, double b) { return a - b; }
static double f_mul(double a, double b) { return a * b; }
static double f_div(double a, double b) { return a / b; }
static double f_pow(double a, double b) { return pow(a, b); }
/* NaN in either input gives NaN, as numpy.maximum does. */
static double f_max(double a, double b) {
  return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
}
static double f_min(double a, double b) {
  return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
}
static double f_eq(double a, double b) { return a == b; }
static double f_ne(double a, double b) { return a != b; }
static double f_lt(double a, double b) { return a < b; }
static double f_le(double a, double b) { return a <= b; }
static double f_gt(double a, double b) { return a > b; }
static double f_ge(double a, double b) { return a >= b; }

static const char *i_add(int64_t a, int64_t b, uint64_t *r) {
  *r = (uint64_t)a + (uint64_t)b;
  return NULL;
}
static const char *i_sub(int64_t a, int64_t b, uint64_t *r) {
  *r = (uint64_t)a - (uint64_t)b;
  return NULL;
}
static const char *i_mul(int64_t a, int64_t b, uint64_t *r) {
  *r = (uint64_t)a * (uint64_t)b;
  return NULL;
}
static const char *i_div(int64_t a, int64_t b, uint64_t *r) {
  if (b == 0) return "integer division by zero";
  /* INT64_MIN / -1 overflows in C; wrap-around gives INT64_MIN. */
  *r = b == -1 ? 0 - (uint64_t)a : (uint64_t)(a / b);
  return NULL;
}
/* Integer power by squaring.  Negative exponents truncate 1/a^|b| toward
 * zero, as C would for the exact quotient: only |a| = 1 survives. */
static const char *i_pow(int64_t a, int64_t b, uint64_t *r) {
  if (b < 0) {
    if (a == 0) return "zero raised to a negative power";
    *r = a == 1 ? 1 : a == -1 ? ((b & 1) ? (uint64_t)-1 : 1) : 0;
    return NULL;
  }
  uint64_t base = (uint64_t)a, acc = 1;
  for (uint64_t e = (uint64_t)b; e; e >>= 1) {
    if (e & 1) acc *= base;
    base *= base;
  }
  *r = acc;
  return NULL;
}

static int infer_binary(kl_node *n, kl_error *err, type_class c, bool to_bool) {
  const kl_value *a = n->inputs[0], *b = n->inputs[1];
  if (same_dtype(n, err, a, b) || check_type(n, err, a, c)) return -1;
  kl_shape s;
  if (broadcast2(n, err, a, b, &a->shape, &b->shape, &s)) return -1;
  kl_set_output(n, 0, to_bool ? KL_BOOL : a->dtype, &s);
  return 0;
}

static int eval_binary(const kl_node *n, kl_tensor **in, kl_tensor *y,
                       binary_fn f, int_fn fi, kl_error *err) {
  const kl_tensor *a = in[0], *b = in[1];
  bool ints = fi && kl_dtype_is_int(a->dtype);
  int64_t idx[KL_MAX_RANK] = {0};
  for (int64_t i = 0; i < y->numel; i++, kl_index_next(&y->shape, idx)) {
    double va = a->data[src_index(a, y, i, idx)];
    double vb = b->data[src_index(b, y, i, idx)];
    if (!ints) {
      y->data[i] = f(va, vb);
      continue;
    }
    uint64_t r;
    const char *msg = fi(kl_to_i64(va), kl_to_i64(vb), &r);
    if (msg)
      return KL_NODE_FAIL(n, err, "%s (%lld and %lld)", msg,
                          (long long)kl_to_i64(va), (long long)kl_to_i64(vb));
    y->data[i] = kl_wrap_to(y->dtype, r);
  }
  return 0;
}

#define BINARY_ROW(ID, CLASS, TO_BOOL, FN, IFN)                                \
  int kl_infer_##ID(kl_node *n, kl_error *err) {                               \
    return infer_binary(n, err, CLASS, TO_BOOL);                               \
  }                                                                            \
  int kl_eval_##ID(const kl_node *n, kl_tensor **in, kl_tensor **out,          \
                   kl_error *err) {                                            \
    return eval_binary(n, in, out[0], FN, IFN, err);                           \
  }

BINARY_ROW(ADD, T_NUMERIC, false, f_add, i_add)
BINARY_ROW(SUB, T_NUMERIC, false, f_sub, i_sub)
BINARY_ROW(MUL, T_NUMERIC, false, f_mul, i_mul)
BINARY_ROW(DIV, T_NUMERIC, false, f_div, i_div)
BINARY_ROW(POW, T_NUMERIC, false, f_pow, i_pow)
BINARY_ROW(MAXIMUM, T_NUMERIC, false, f_max, NULL)
BINARY_ROW(MINIMUM, T_NUMERIC, false, f_min, NULL)
/* Equality is meaningful on bool; ordering is not. */
BINARY_ROW(EQ, T_ANY, true, f_eq, NULL)
BINARY_ROW(NE, T_ANY, true, f_ne, NULL)
BINARY_ROW(LT, T_NUMERIC, true, f_lt, NULL)
BINARY_ROW(LE, T_NUMERIC, true, f_le, NULL)
BINARY_ROW(GT, T_NUMERIC, true, f_gt, NULL)
BINARY_ROW(GE, T_NUMERIC, true, f_ge, NULL)

/* ---- where ----------------------------------------------------------- */
int kl_infer_WHERE(kl_node *n, kl_error *err) {
  const kl_value *c = n->inputs[0], *a = n->inputs[1], *b = n->inputs[2];
  char buf[256];
  if (c->dtype != KL_BOOL)
    return KL_NODE_FAIL(n, err, "condition must be bool, got %s",
                        kl_value_str(c, buf, sizeof buf));
  if (same_dtype(n, err, a, b)) return -1;
  kl_shape ab, s;
  if (broadcast2(n, err, a, b, &a->shape, &b->shape, &ab)) return -1;
  kl_error scratch;
  if (kl_broadcast_shapes(&c->shape, &ab, &s, &scratch, n->loc)) {
    char bc[256], sab[200];
    return KL_NODE_FAIL(n, err, "cannot broadcast condition %s with %s%s",
                        kl_value_str(c, bc, sizeof bc), kl_dtype_name(a->dtype),
                        kl_shape_str(&ab, sab, sizeof sab));
  }
  kl_set_output(n, 0, a->dtype, &s);
  return 0;
}

int kl_eval_WHERE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                  kl_error *err) {
  (void)n;
  (void)err;
  const kl_tensor *c = in[0], *a = in[1], *b = in[2];
  kl_tensor *y = out[0];
  int64_t idx[KL_MAX_RANK] = {0};
  for (int64_t i = 0; i < y->numel; i++, kl_index_next(&y->shape, idx)) {
    const kl_tensor *t = c->data[src_index(c, y, i, idx)] != 0 ? a : b;
    y->data[i] = t->data[src_index(t, y, i, idx)];
  }
  return 0;
}

/* ---- gradient rules (ir.h, kl_grad_fn) --------------------------------
 * Written over the op's own output y where that is cheaper than x. */
#define X (n->inputs[0])
#define Y (n->outputs[0])
#define S(v) kl_gb_scalar(c, Y->dtype, (v))
#define MUL(a, b) kl_gb2(c, KL_OP_MUL, (a), (b))
#define SUB(a, b) kl_gb2(c, KL_OP_SUB, (a), (b))
#define DIV(a, b) kl_gb2(c, KL_OP_DIV, (a), (b))
#define ADD(a, b) kl_gb2(c, KL_OP_ADD, (a), (b))

int kl_grad_NEG(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  (void)n;
  dx[0] = kl_gb1(c, KL_OP_NEG, dy[0]);
  return 0;
}

int kl_grad_ABS(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = MUL(dy[0], kl_gb1(c, KL_OP_SIGN, X));
  return 0;
}

int kl_grad_EXP(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = MUL(dy[0], Y);
  return 0;
}

int kl_grad_LOG(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = DIV(dy[0], X);
  return 0;
}

int kl_grad_SQRT(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = DIV(MUL(dy[0], S(0.5)), Y); /* dy / (2 y) */
  return 0;
}

int kl_grad_RSQRT(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = MUL(MUL(dy[0], S(-0.5)), MUL(Y, MUL(Y, Y))); /* -y^3 / 2 */
  return 0;
}

int kl_grad_RECIPROCAL(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = kl_gb1(c, KL_OP_NEG, MUL(dy[0], MUL(Y, Y)));
  return 0;
}

int kl_grad_TANH(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = MUL(dy[0], SUB(S(1), MUL(Y, Y)));
  return 0;
}

int kl_grad_SIGMOID(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = MUL(MUL(dy[0], Y), SUB(S(1), Y));
  return 0;
}

/* y > 0 exactly where x > 0: the mask reads y, which the next layer keeps
 * for its own gradient anyway, so x need not stay alive for backward */
int kl_grad_RELU(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = kl_gb_mask(c, kl_gb2(c, KL_OP_GT, Y, S(0)), dy[0]);
  return 0;
}

int kl_grad_LEAKY_RELU(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  double alpha = kl_attr_float(n, "alpha", 0.01);
  dx[0] = kl_gb3(c, KL_OP_WHERE, kl_gb2(c, KL_OP_GT, X, S(0)), dy[0], MUL(dy[0], S(alpha)));
  return 0;
}

/* silu(x) = x s, s = sigmoid(x): s (1 + x (1 - s)) */
int kl_grad_SILU(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *s = kl_gb1(c, KL_OP_SIGMOID, X);
  dx[0] = MUL(dy[0], MUL(s, kl_gb2(c, KL_OP_ADD, S(1), MUL(X, SUB(S(1), s)))));
  return 0;
}

/* 2/sqrt(pi) exp(-x^2) */
int kl_grad_ERF(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *e = kl_gb1(c, KL_OP_EXP, kl_gb1(c, KL_OP_NEG, MUL(X, X)));
  dx[0] = MUL(dy[0], MUL(e, S(TWO_OVER_SQRT_PI)));
  return 0;
}

/* erf form: Phi(x) + x phi(x); tanh form, u = k (x + 0.044715 x^3),
 * t = tanh(u): (1 + t) / 2 + x (1 - t^2) k (1 + 3 * 0.044715 x^2) / 2. */
int kl_grad_GELU(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x2 = MUL(X, X), *d;
  if (strcmp(kl_attr_string(n, "approximate", "none"), "tanh") == 0) {
    const double k = SQRT_2_PI, a = 0.044715;
    kl_value *t = kl_gb1(c, KL_OP_TANH, MUL(MUL(X, ADD(S(1), MUL(x2, S(a)))), S(k)));
    kl_value *slope = MUL(SUB(S(1), MUL(t, t)), ADD(S(0.5 * k), MUL(x2, S(1.5 * k * a))));
    d = ADD(MUL(ADD(S(1), t), S(0.5)), MUL(X, slope));
  } else {
    kl_value *cdf = MUL(ADD(S(1), kl_gb1(c, KL_OP_ERF, MUL(X, S(SQRT1_2)))), S(0.5));
    kl_value *pdf = MUL(kl_gb1(c, KL_OP_EXP, MUL(x2, S(-0.5))), S(0.5 * TWO_OVER_SQRT_PI * SQRT1_2));
    d = ADD(cdf, MUL(X, pdf));
  }
  dx[0] = MUL(dy[0], d);
  return 0;
}

/* swish(x) = x s, s = sigmoid(alpha x): s (1 + alpha x (1 - s)) */
int kl_grad_SWISH(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *ax = MUL(X, S(kl_attr_float(n, "alpha", 1.0)));
  kl_value *s = kl_gb1(c, KL_OP_SIGMOID, ax);
  dx[0] = MUL(dy[0], MUL(s, ADD(S(1), MUL(ax, SUB(S(1), s)))));
  return 0;
}

/* mish(x) = x t, t = tanh(softplus(x)): t + x (1 - t^2) sigmoid(x) */
int kl_grad_MISH(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *t = kl_gb1(c, KL_OP_TANH, kl_gb1(c, KL_OP_SOFTPLUS, X));
  kl_value *slope = MUL(SUB(S(1), MUL(t, t)), kl_gb1(c, KL_OP_SIGMOID, X));
  dx[0] = MUL(dy[0], ADD(t, MUL(X, slope)));
  return 0;
}

int kl_grad_CAST(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  if (kl_dtype_is_float(X->dtype) && kl_dtype_is_float(Y->dtype)) dx[0] = kl_gb_cast(c, dy[0], X->dtype);
  return 0;
}

int kl_grad_ADD(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  (void)c, (void)n;
  dx[0] = dx[1] = dy[0];
  return 0;
}

int kl_grad_SUB(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  (void)n;
  dx[0] = dy[0];
  dx[1] = kl_gb1(c, KL_OP_NEG, dy[0]);
  return 0;
}

int kl_grad_MUL(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = MUL(dy[0], n->inputs[1]);
  dx[1] = n->inputs[1] == X ? NULL : MUL(dy[0], X);
  if (!dx[1]) dx[0] = MUL(dx[0], S(2)); /* x * x */
  return 0;
}

int kl_grad_DIV(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *z = n->inputs[1];
  dx[0] = DIV(dy[0], z);
  dx[1] = kl_gb1(c, KL_OP_NEG, DIV(MUL(dy[0], Y), z)); /* -dy x / z^2 */
  return 0;
}

/* y = a^b: da = b a^(b - 1) (any a where y is defined: integer b with a
 * negative a); db = y log(a) where a > 0, else 0 (a <= 0 has no
 * derivative in b; log's NaN stays in the branch where drops). */
int kl_grad_POW(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *b = n->inputs[1];
  dx[0] = MUL(dy[0], MUL(b, kl_gb2(c, KL_OP_POW, X, SUB(b, S(1)))));
  kl_value *ylog = MUL(Y, kl_gb1(c, KL_OP_LOG, X));
  dx[1] = MUL(dy[0], kl_gb_mask(c, kl_gb2(c, KL_OP_GT, X, S(0)), ylog));
  return 0;
}

/* Ties send the whole gradient to the first operand. */
static int grad_pick(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx,
                     kl_op first_wins) {
  kl_value *first = kl_gb2(c, first_wins, X, n->inputs[1]);
  dx[0] = kl_gb_mask(c, first, dy[0]);
  dx[1] = kl_gb3(c, KL_OP_WHERE, first, S(0), dy[0]);
  return 0;
}

int kl_grad_MAXIMUM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_pick(c, n, dy, dx, KL_OP_GE);
}

int kl_grad_MINIMUM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_pick(c, n, dy, dx, KL_OP_LE);
}

int kl_grad_WHERE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *cond = n->inputs[0];
  dx[1] = kl_gb_mask(c, cond, dy[0]);
  dx[2] = kl_gb3(c, KL_OP_WHERE, cond, S(0), dy[0]);
  return 0;
}

#undef X
#undef Y
#undef S
#undef MUL
#undef SUB
#undef DIV
#undef ADD
