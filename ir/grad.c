/* grad.c - what gradient rules build with, and the table of rules.  The
 * rules themselves sit beside each op's infer and eval (kl_grad_<id> in
 * ir/ops_*.c); ir/grads.def lists which ops have one. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "op_impl.h"

const kl_grad_fn kl_op_grads[KL_OP_COUNT] = {
#define KL_GRAD(id) [KL_OP_##id] = kl_grad_##id,
#include "grads.def"
#undef KL_GRAD
};

int kl_grad_fail(kl_grad_ctx *c, const kl_node *n, const char *fmt, ...) {
  char why[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  c->failed = true;
  return kl_fail(c->err, n->loc, "no gradient for %s (node '%s'): %s", kl_ops[n->op].name,
                 n->onnx_name ? n->onnx_name : n->name, why);
}

kl_value *kl_gb_node(kl_grad_ctx *c, kl_op op, kl_value *const *ins, int nins,
                     const kl_attr *attrs, int nattrs) {
  if (c->failed) return NULL;
  for (int i = 0; i < nins; i++)
    if (!ins[i]) return NULL;
  kl_node *n = kl_graph_add_node(c->g, op, NULL, (kl_value **)ins, nins, attrs, nattrs, NULL, 0,
                                 c->loc, c->err);
  if (!n) c->failed = true;
  return n ? n->outputs[0] : NULL;
}

kl_value *kl_gb1(kl_grad_ctx *c, kl_op op, kl_value *x) { return kl_gb_node(c, op, &x, 1, NULL, 0); }

kl_value *kl_gb2(kl_grad_ctx *c, kl_op op, kl_value *x, kl_value *y) {
  kl_value *ins[2] = {x, y};
  return kl_gb_node(c, op, ins, 2, NULL, 0);
}

kl_value *kl_gb3(kl_grad_ctx *c, kl_op op, kl_value *x, kl_value *y, kl_value *z) {
  kl_value *ins[3] = {x, y, z};
  return kl_gb_node(c, op, ins, 3, NULL, 0);
}

kl_value *kl_gb_scalar(kl_grad_ctx *c, kl_dtype t, double v) {
  kl_attr attrs[3] = {
      {.name = "value", .kind = KL_ATTR_FLOATS, .floats = &v, .n = 1},
      {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = t},
      {.name = "shape", .kind = KL_ATTR_INTS, .ints = NULL, .n = 0},
  };
  return kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, attrs, 3);
}

kl_value *kl_gb_reshape(kl_grad_ctx *c, kl_value *x, const kl_shape *shape) {
  if (!x) return NULL;
  if (kl_shape_equal(&x->shape, shape)) return x;
  kl_attr a = {.name = "shape", .kind = KL_ATTR_INTS, .ints = (int64_t *)shape->dims, .n = shape->rank};
  return kl_gb_node(c, KL_OP_RESHAPE, &x, 1, &a, 1);
}

kl_value *kl_gb_expand(kl_grad_ctx *c, kl_value *x, const kl_shape *shape) {
  if (!x) return NULL;
  if (kl_shape_equal(&x->shape, shape)) return x;
  kl_attr a = {.name = "shape", .kind = KL_ATTR_INTS, .ints = (int64_t *)shape->dims, .n = shape->rank};
  return kl_gb_node(c, KL_OP_EXPAND, &x, 1, &a, 1);
}

static kl_value *sum_over(kl_grad_ctx *c, kl_value *x, const int64_t *axes, int n) {
  kl_attr a[2] = {{.name = "axes", .kind = KL_ATTR_INTS, .ints = (int64_t *)axes, .n = n},
                  {.name = "keepdims", .kind = KL_ATTR_INT, .i = 1}};
  return kl_gb_node(c, KL_OP_REDUCE_SUM, &x, 1, a, 2);
}

/* Axes ascending.  A sum over the innermost axes and some outer ones (a
 * conv bias's gradient: N, H, W) runs as two: the innermost run first, a
 * row reduction that fuses with the elementwise nodes making x (a cast to
 * f32 among them, so no f32 copy of a half gradient is stored) and gives a
 * thread group per row, then the outer axes over what is left. */
kl_value *kl_gb_sum(kl_grad_ctx *c, kl_value *x, const int64_t *axes, int n) {
  if (!x || n == 0) return x;
  int rank = x->shape.rank, inner = 0;
  while (inner < n && axes[n - 1 - inner] == rank - 1 - inner) inner++;
  if (inner == 0 || inner == n) return sum_over(c, x, axes, n);
  return sum_over(c, sum_over(c, x, axes + n - inner, inner), axes, n - inner);
}

kl_value *kl_gb_sum_to(kl_grad_ctx *c, kl_value *x, const kl_shape *shape) {
  if (!x || kl_shape_equal(&x->shape, shape)) return x;
  int64_t axes[KL_MAX_RANK];
  int n = 0, off = x->shape.rank - shape->rank;
  for (int d = 0; d < x->shape.rank; d++)
    if (d < off || (shape->dims[d - off] == 1 && x->shape.dims[d] != 1)) axes[n++] = d;
  return kl_gb_reshape(c, kl_gb_sum(c, x, axes, n), shape);
}

kl_value *kl_gb_transpose(kl_grad_ctx *c, kl_value *x, const int64_t *perm) {
  if (!x) return NULL;
  kl_attr a = {.name = "perm", .kind = KL_ATTR_INTS, .ints = (int64_t *)perm, .n = x->shape.rank};
  return kl_gb_node(c, KL_OP_TRANSPOSE, &x, 1, &a, 1);
}

kl_value *kl_gb_cast(kl_grad_ctx *c, kl_value *x, kl_dtype t) {
  if (!x || x->dtype == t) return x;
  kl_attr a = {.name = "to", .kind = KL_ATTR_DTYPE, .i = t};
  return kl_gb_node(c, KL_OP_CAST, &x, 1, &a, 1);
}

kl_value *kl_gb_mask(kl_grad_ctx *c, kl_value *cond, kl_value *a) {
  if (!a) return NULL;
  return kl_gb3(c, KL_OP_WHERE, cond, a, kl_gb_scalar(c, a->dtype, 0));
}
