/* onnx_ops_nn.c - ONNX neural-network ops: contractions, convolution,
 * pooling, normalisation, softmax, losses. */
#include <string.h>

#include "onnx_internal.h"

static int convert_matmul(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[2] = {kl_onnx_input(c, n, 0), kl_onnx_input(c, n, 1)};
  kl_value *y = kl_onnx_emit(c, KL_OP_MATMUL, ins, 2, NULL, 0);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_gemm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ins[3] = {kl_onnx_input(c, n, 0), kl_onnx_input(c, n, 1), kl_onnx_input(c, n, 2)};
  kl_attr a[4] = {kl_af("alpha", kl_onnx_attr_float(n, "alpha", 1.0)),
                  kl_af("beta", kl_onnx_attr_float(n, "beta", 1.0)),
                  kl_ai("trans_a", kl_onnx_attr_int(n, "transA", 0)),
                  kl_ai("trans_b", kl_onnx_attr_int(n, "transB", 0))};
  kl_value *y = kl_onnx_emit(c, KL_OP_GEMM, ins, ins[2] ? 3 : 2, a, 4);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* Softmax and LogSoftmax before opset 13 flatten the input to 2-D at `axis`
 * (default 1) and normalise over the whole second part. */
static int convert_softmax(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_op op = !strcmp(n->op_type, "Softmax") ? KL_OP_SOFTMAX : KL_OP_LOG_SOFTMAX;
  kl_value *x = kl_onnx_input(c, n, 0);
  if (!x) return kl_onnx_fail(c, "input 0 is missing");
  int64_t axis = kl_onnx_attr_int(n, "axis", c->opset >= 13 ? -1 : 1);
  if (c->opset >= 13) {
    kl_attr a = kl_ai("axis", axis);
    kl_value *y = kl_onnx_emit(c, op, &x, 1, &a, 1);
    return y ? kl_onnx_bind(c, n, 0, y) : -1;
  }
  int r = x->shape.rank;
  if (axis < -r || axis > r) return kl_onnx_fail(c, "axis %lld is out of range", (long long)axis);
  if (axis < 0) axis += r;
  int64_t rows = 1, cols = 1;
  for (int d = 0; d < r; d++) *(d < axis ? &rows : &cols) *= x->shape.dims[d];
  int64_t flat[2] = {rows, cols};
  kl_attr shape2 = kl_ais("shape", flat, 2), last = kl_ai("axis", -1),
          back = kl_ais("shape", x->shape.dims, r);
  kl_value *f = kl_onnx_emit(c, KL_OP_RESHAPE, &x, 1, &shape2, 1);
  kl_value *s = f ? kl_onnx_emit(c, op, &f, 1, &last, 1) : NULL;
  kl_value *y = s ? kl_onnx_emit(c, KL_OP_RESHAPE, &s, 1, &back, 1) : NULL;
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

const kl_onnx_op kl_onnx_ops_nn[] = {
    {"MatMul", 1, convert_matmul},
    {"Gemm", 7, convert_gemm},
    {"Softmax", 1, convert_softmax},
    {"LogSoftmax", 1, convert_softmax},
    {NULL, 0, NULL},
};
