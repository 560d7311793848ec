/* onnx_ops_tensor.c - ONNX data-movement, shape and reduction ops, and the
 * sources (Constant, Shape) that feed compile-time shape computations. */
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "onnx_internal.h"

static int convert_constant(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "value");
  kl_value *y = NULL;
  if (a && a->t) {
    kl_dtype dt;
    kl_shape s;
    void *raw;
    if (kl_onnx_tensor_data(a->t, c->path, &dt, &s, &raw, c->err)) return -1;
    char name[64];
    snprintf(name, sizeof name, "const_%d", c->g->values.len);
    y = kl_graph_add_const_data(c->g, kl_graph_fresh_name(c->g, name), dt, &s, raw,
                                (kl_loc){c->path, 0, 0});
    free(raw);
  } else if ((a = kl_onnx_attr(n, "value_float")) && a->has_f) {
    y = kl_onnx_scalar(c, KL_F32, a->f);
  } else if ((a = kl_onnx_attr(n, "value_int")) && a->has_i) {
    y = kl_onnx_scalar(c, KL_I64, (double)a->i);
  } else if ((a = kl_onnx_attr(n, "value_floats"))) {
    kl_shape s = {.rank = 1, .dims = {(int64_t)a->n_floats}};
    double *v = malloc((a->n_floats + 1) * sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < a->n_floats; i++) v[i] = a->floats[i];
    y = kl_onnx_constant(c, KL_F32, &s, v, (int)a->n_floats);
    free(v);
  } else if ((a = kl_onnx_attr(n, "value_ints"))) {
    kl_shape s = {.rank = 1, .dims = {(int64_t)a->n_ints}};
    double *v = malloc((a->n_ints + 1) * sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < a->n_ints; i++) v[i] = (double)a->ints[i];
    y = kl_onnx_constant(c, KL_I64, &s, v, (int)a->n_ints);
    free(v);
  } else {
    return kl_onnx_fail(c, "needs a value, value_float(s) or value_int(s) attribute "
                           "(strings and sparse tensors are not supported)");
  }
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* Shape is known at compile time: a constant. */
static int convert_shape(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  if (!x) return kl_onnx_fail(c, "input 0 is missing");
  int r = x->shape.rank;
  int64_t start = kl_onnx_attr_int(n, "start", 0), end = kl_onnx_attr_int(n, "end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = start < 0 ? 0 : start > r ? r : start;
  end = end < 0 ? 0 : end > r ? r : end;
  double dims[KL_MAX_RANK];
  int k = 0;
  for (int64_t d = start; d < end; d++) dims[k++] = (double)x->shape.dims[d];
  kl_shape s = {.rank = 1, .dims = {k}};
  kl_value *y = kl_onnx_constant(c, KL_I64, &s, dims, k);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* Reshape: the target shape must be a compile-time constant; 0 copies the
 * input's dim unless allowzero. */
static int convert_reshape(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  int64_t shape[KL_MAX_RANK];
  int k;
  if (c->opset < 5) {
    const int64_t *p;
    k = kl_onnx_attr_ints(n, "shape", &p);
    if (k < 0 || k > KL_MAX_RANK) return kl_onnx_fail(c, "needs a shape attribute");
    memcpy(shape, p, (size_t)k * sizeof *p);
  } else if ((k = kl_onnx_const_ints(c, kl_onnx_input(c, n, 1), "the shape", shape,
                                     KL_MAX_RANK)) < 0) {
    return -1;
  }
  if (!x) return kl_onnx_fail(c, "input 0 is missing");
  if (!kl_onnx_attr_int(n, "allowzero", 0))
    for (int d = 0; d < k; d++)
      if (shape[d] == 0) {
        if (d >= x->shape.rank) return kl_onnx_fail(c, "shape[%d] = 0 has no input dim to copy", d);
        shape[d] = x->shape.dims[d];
      }
  kl_attr a = kl_ais("shape", shape, k);
  kl_value *y = kl_onnx_emit(c, KL_OP_RESHAPE, &x, 1, &a, 1);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_transpose(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  const int64_t *perm;
  int k = kl_onnx_attr_ints(n, "perm", &perm);
  kl_attr a = kl_ais("perm", perm, k);
  kl_value *y = kl_onnx_emit(c, KL_OP_TRANSPOSE, &x, 1, &a, k >= 0 ? 1 : 0);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_concat(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  int nin = kl_onnx_ninputs(n);
  if (nin > 64) return kl_onnx_fail(c, "more than 64 inputs");
  kl_value *ins[64];
  int used = 0;
  for (int k = 0; k < nin; k++)
    if ((ins[used] = kl_onnx_input(c, n, k))) used++;
  kl_attr a = kl_ai("axis", kl_onnx_attr_int(n, "axis", 0));
  kl_value *y = kl_onnx_emit(c, KL_OP_CONCAT, ins, used, &a, 1);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

const kl_onnx_op kl_onnx_ops_tensor[] = {
    {"Constant", 1, convert_constant},
    {"Shape", 1, convert_shape},
    {"Reshape", 1, convert_reshape},
    {"Transpose", 1, convert_transpose},
    {"Concat", 4, convert_concat},
    {NULL, 0, NULL},
};
