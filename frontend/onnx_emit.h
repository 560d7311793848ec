/* onnx_emit.h - small emitters shared by converter families that build
 * longer decompositions (quantization, recurrent cells): each takes and
 * returns NULL when an earlier step failed, so a chain of them needs one
 * check at the end (internal to frontend/). */
#ifndef KILN_ONNX_EMIT_H
#define KILN_ONNX_EMIT_H

#include "onnx_internal.h"

static inline kl_value *need_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k) {
  kl_value *v = kl_onnx_input(c, n, k);
  if (!v) kl_onnx_fail(c, "input %d is missing", k);
  return v;
}

static inline kl_value *unary(kl_onnx_ctx *c, kl_op op, kl_value *x, const kl_attr *a, int na) {
  return x ? kl_onnx_emit(c, op, &x, 1, a, na) : NULL;
}

static inline kl_value *binary(kl_onnx_ctx *c, kl_op op, kl_value *a, kl_value *b) {
  kl_value *ins[2] = {a, b};
  return a && b ? kl_onnx_emit(c, op, ins, 2, NULL, 0) : NULL;
}

/* x as dtype t (x itself when it already is). */
static inline kl_value *cast(kl_onnx_ctx *c, kl_value *x, kl_dtype t) {
  if (!x || x->dtype == t) return x;
  kl_attr a = kl_adt("to", t);
  return unary(c, KL_OP_CAST, x, &a, 1);
}

static inline kl_value *reshape(kl_onnx_ctx *c, kl_value *x, const kl_shape *s) {
  if (!x || kl_shape_equal(s, &x->shape)) return x;
  kl_attr a = kl_ais("shape", s->dims, s->rank);
  return unary(c, KL_OP_RESHAPE, x, &a, 1);
}

static inline int bind(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value *y) {
  return y ? kl_onnx_bind(c, n, k, y) : -1;
}

#endif
