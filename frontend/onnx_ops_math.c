/* onnx_ops_math.c - ONNX elementwise and arithmetic ops. */
#include <math.h>
#include <string.h>

#include "onnx_internal.h"

/* Ops that map one to one onto an IR op with no attributes. */
static const struct { const char *onnx; kl_op op; } direct[] = {
    {"Abs", KL_OP_ABS},         {"Neg", KL_OP_NEG},         {"Exp", KL_OP_EXP},
    {"Log", KL_OP_LOG},         {"Sqrt", KL_OP_SQRT},       {"Reciprocal", KL_OP_RECIPROCAL},
    {"Tanh", KL_OP_TANH},       {"Sigmoid", KL_OP_SIGMOID}, {"Relu", KL_OP_RELU},
    {"Erf", KL_OP_ERF},         {"Add", KL_OP_ADD},         {"Sub", KL_OP_SUB},
    {"Mul", KL_OP_MUL},         {"Div", KL_OP_DIV},         {"Pow", KL_OP_POW},
    {"Equal", KL_OP_EQ},        {"Less", KL_OP_LT},         {"LessOrEqual", KL_OP_LE},
    {"Greater", KL_OP_GT},      {"GreaterOrEqual", KL_OP_GE}, {"Where", KL_OP_WHERE},
};

static int convert_direct(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_op op = KL_OP_COUNT;
  for (size_t i = 0; i < sizeof direct / sizeof *direct; i++)
    if (!strcmp(direct[i].onnx, n->op_type)) op = direct[i].op;
  kl_value *ins[3];
  int nin = kl_onnx_ninputs(n);
  if (nin > 3) return kl_onnx_fail(c, "too many inputs (%d)", nin);
  for (int k = 0; k < nin; k++)
    if (!(ins[k] = kl_onnx_input(c, n, k))) return kl_onnx_fail(c, "input %d is missing", k);
  /* ONNX Pow allows an exponent of another type; the IR wants one dtype. */
  if (op == KL_OP_POW && nin == 2 && ins[1]->dtype != ins[0]->dtype) {
    kl_attr to = kl_adt("to", ins[0]->dtype);
    if (!(ins[1] = kl_onnx_emit(c, KL_OP_CAST, &ins[1], 1, &to, 1))) return -1;
  }
  kl_value *y = kl_onnx_emit(c, op, ins, nin, NULL, 0);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_leaky_relu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  kl_attr a = kl_af("alpha", kl_onnx_attr_float(n, "alpha", 0.01));
  kl_value *y = kl_onnx_emit(c, KL_OP_LEAKY_RELU, &x, 1, &a, 1);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_cast(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  kl_dtype to;
  int64_t t = kl_onnx_attr_int(n, "to", -1);
  if (kl_onnx_dtype((int)t, &to)) return kl_onnx_fail(c, "cast to ONNX type %lld is not supported", (long long)t);
  kl_attr a = kl_adt("to", to);
  kl_value *y = kl_onnx_emit(c, KL_OP_CAST, &x, 1, &a, 1);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_identity(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  if (!x) return kl_onnx_fail(c, "input 0 is missing");
  return kl_onnx_bind(c, n, 0, x);
}

/* Max, Min, Sum, Mean: variadic, folded pairwise left to right. */
static int convert_variadic(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_op op = !strcmp(n->op_type, "Max") ? KL_OP_MAXIMUM
             : !strcmp(n->op_type, "Min") ? KL_OP_MINIMUM : KL_OP_ADD;
  int nin = kl_onnx_ninputs(n);
  if (nin < 1) return kl_onnx_fail(c, "needs at least one input");
  kl_value *acc = kl_onnx_input(c, n, 0);
  for (int k = 1; k < nin && acc; k++) {
    kl_value *ins[2] = {acc, kl_onnx_input(c, n, k)};
    acc = kl_onnx_emit(c, op, ins, 2, NULL, 0);
  }
  if (acc && !strcmp(n->op_type, "Mean") && nin > 1) {
    kl_value *ins[2] = {acc, kl_onnx_scalar(c, acc->dtype, nin)};
    acc = ins[1] ? kl_onnx_emit(c, KL_OP_DIV, ins, 2, NULL, 0) : NULL;
  }
  if (acc && nin == 1) { /* x + 0: a value of its own for the output */
    kl_value *ins[2] = {acc, kl_onnx_scalar(c, acc->dtype, 0)};
    acc = ins[1] ? kl_onnx_emit(c, KL_OP_ADD, ins, 2, NULL, 0) : NULL;
  }
  return acc ? kl_onnx_bind(c, n, 0, acc) : -1;
}

const kl_onnx_op kl_onnx_ops_math[] = {
    {"Abs", 1, convert_direct},        {"Neg", 1, convert_direct},
    {"Exp", 1, convert_direct},        {"Log", 1, convert_direct},
    {"Sqrt", 1, convert_direct},       {"Reciprocal", 1, convert_direct},
    {"Tanh", 1, convert_direct},       {"Sigmoid", 1, convert_direct},
    {"Relu", 1, convert_direct},       {"Erf", 9, convert_direct},
    {"Add", 7, convert_direct},        {"Sub", 7, convert_direct},
    {"Mul", 7, convert_direct},        {"Div", 7, convert_direct},
    {"Pow", 7, convert_direct},        {"Equal", 7, convert_direct},
    {"Less", 7, convert_direct},       {"LessOrEqual", 12, convert_direct},
    {"Greater", 7, convert_direct},    {"GreaterOrEqual", 12, convert_direct},
    {"Where", 9, convert_direct},      {"LeakyRelu", 6, convert_leaky_relu},
    {"Cast", 6, convert_cast},         {"Identity", 1, convert_identity},
    {"Max", 8, convert_variadic},      {"Min", 8, convert_variadic},
    {"Sum", 8, convert_variadic},      {"Mean", 8, convert_variadic},
    {NULL, 0, NULL},
};
