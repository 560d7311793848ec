/* autodiff.c - reverse-mode differentiation over the IR: walk the nodes
 * between the inputs and y backwards, and for each node emit the nodes that
 * turn its outputs' adjoints into its inputs' adjoints.  Broadcasting is
 * undone by summing over the broadcast axes. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  kl_graph *g;
  kl_error *err;
  kl_loc loc;
  kl_value **adj; /* adjoint per value id, NULL while none */
} ad_ctx;

static kl_value *emit(ad_ctx *a, kl_op op, kl_value **ins, int nins, const kl_attr *attrs,
                      int nattrs) {
  for (int i = 0; i < nins; i++)
    if (!ins[i]) return NULL;
  kl_node *n = kl_graph_add_node(a->g, op, NULL, ins, nins, attrs, nattrs, NULL, 0, a->loc, a->err);
  return n ? n->outputs[0] : NULL;
}

static kl_value *bin(ad_ctx *a, kl_op op, kl_value *x, kl_value *y) {
  kl_value *ins[2] = {x, y};
  return emit(a, op, ins, 2, NULL, 0);
}

static kl_value *un(ad_ctx *a, kl_op op, kl_value *x) { return emit(a, op, &x, 1, NULL, 0); }

/* A constant filled with v, shaped and typed like `like`. */
static kl_value *full_like(ad_ctx *a, const kl_value *like, double v) {
  kl_attr attrs[3] = {
      {.name = "value", .kind = KL_ATTR_FLOATS, .floats = &v, .n = 1},
      {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = like->dtype},
      {.name = "shape", .kind = KL_ATTR_INTS, .ints = (int64_t *)like->shape.dims,
       .n = like->shape.rank},
  };
  return emit(a, KL_OP_CONSTANT, NULL, 0, attrs, 3);
}

/* Sum a gradient of the broadcast shape down to `shape`. */
static kl_value *unbroadcast(ad_ctx *a, kl_value *grad, const kl_shape *shape) {
  if (!grad || kl_shape_equal(&grad->shape, shape)) return grad;
  int64_t axes[KL_MAX_RANK];
  int n = 0, off = grad->shape.rank - shape->rank;
  for (int d = 0; d < grad->shape.rank; d++)
    if (d < off || (shape->dims[d - off] == 1 && grad->shape.dims[d] != 1)) axes[n++] = d;
  kl_attr sum[2] = {{.name = "axes", .kind = KL_ATTR_INTS, .ints = axes, .n = n},
                    {.name = "keepdims", .kind = KL_ATTR_INT, .i = 1}};
  kl_value *s = n ? emit(a, KL_OP_REDUCE_SUM, &grad, 1, sum, 2) : grad;
  kl_attr rs = {.name = "shape", .kind = KL_ATTR_INTS, .ints = (int64_t *)shape->dims,
                .n = shape->rank};
  return s ? emit(a, KL_OP_RESHAPE, &s, 1, &rs, 1) : NULL;
}

static int accumulate(ad_ctx *a, kl_value *v, kl_value *grad) {
  if (!grad) return -1;
  grad = unbroadcast(a, grad, &v->shape);
  if (!grad) return -1;
  a->adj[v->id] = a->adj[v->id] ? bin(a, KL_OP_ADD, a->adj[v->id], grad) : grad;
  return a->adj[v->id] ? 0 : -1;
}

/* Swap the last two axes (matmul's transposes). */
static kl_value *transpose_last2(ad_ctx *a, kl_value *x) {
  int r = x->shape.rank;
  int64_t perm[KL_MAX_RANK];
  for (int d = 0; d < r; d++) perm[d] = d;
  perm[r - 1] = r - 2;
  perm[r - 2] = r - 1;
  kl_attr p = {.name = "perm", .kind = KL_ATTR_INTS, .ints = perm, .n = r};
  return emit(a, KL_OP_TRANSPOSE, &x, 1, &p, 1);
}

/* The gradient rules: dy is the adjoint of n's output. */
static int backprop(ad_ctx *a, const kl_node *n, kl_value *dy) {
  kl_value *x = n->inputs[0], *y = n->outputs[0];
  kl_value *z = n->ninputs > 1 ? n->inputs[1] : NULL;
  switch (n->op) {
  case KL_OP_ADD:
    return accumulate(a, x, dy) || accumulate(a, z, dy);
  case KL_OP_SUB:
    return accumulate(a, x, dy) || accumulate(a, z, un(a, KL_OP_NEG, dy));
  case KL_OP_MUL:
    return accumulate(a, x, bin(a, KL_OP_MUL, dy, z)) || accumulate(a, z, bin(a, KL_OP_MUL, dy, x));
  case KL_OP_DIV: /* d(x/z) = dy/z, -dy*y/z */
    return accumulate(a, x, bin(a, KL_OP_DIV, dy, z)) ||
           accumulate(a, z, un(a, KL_OP_NEG, bin(a, KL_OP_DIV, bin(a, KL_OP_MUL, dy, y), z)));
  case KL_OP_NEG:
    return accumulate(a, x, un(a, KL_OP_NEG, dy));
  case KL_OP_EXP:
    return accumulate(a, x, bin(a, KL_OP_MUL, dy, y));
  case KL_OP_LOG:
    return accumulate(a, x, bin(a, KL_OP_DIV, dy, x));
  case KL_OP_SQRT: /* dy / (2 y) */
    return accumulate(a, x, bin(a, KL_OP_DIV, dy, bin(a, KL_OP_MUL, y, full_like(a, y, 2))));
  case KL_OP_TANH: /* dy (1 - y^2) */
    return accumulate(a, x, bin(a, KL_OP_MUL, dy,
                                bin(a, KL_OP_SUB, full_like(a, y, 1), bin(a, KL_OP_MUL, y, y))));
  case KL_OP_SIGMOID: /* dy y (1 - y) */
    return accumulate(a, x, bin(a, KL_OP_MUL, bin(a, KL_OP_MUL, dy, y),
                                bin(a, KL_OP_SUB, full_like(a, y, 1), y)));
  case KL_OP_RELU: { /* dy where x > 0 */
    kl_value *ins[3] = {bin(a, KL_OP_GT, x, full_like(a, x, 0)), dy, full_like(a, dy, 0)};
    return accumulate(a, x, emit(a, KL_OP_WHERE, ins, 3, NULL, 0));
  }
  case KL_OP_MATMUL:
    if (x->shape.rank < 2 || z->shape.rank < 2) break; /* 1-D operands: not yet */
    return accumulate(a, x, bin(a, KL_OP_MATMUL, dy, transpose_last2(a, z))) ||
           accumulate(a, z, bin(a, KL_OP_MATMUL, transpose_last2(a, x), dy));
  case KL_OP_RESHAPE: {
    kl_attr rs = {.name = "shape", .kind = KL_ATTR_INTS, .ints = x->shape.dims,
                  .n = x->shape.rank};
    return accumulate(a, x, emit(a, KL_OP_RESHAPE, &dy, 1, &rs, 1));
  }
  case KL_OP_REDUCE_SUM: { /* spread dy back over the summed axes */
    kl_attr rs = {.name = "shape", .kind = KL_ATTR_INTS, .ints = NULL, .n = 0};
    kl_shape kept = x->shape;
    const int64_t *axes;
    int na = kl_attr_ints(n, "axes", &axes);
    for (int d = 0; d < kept.rank; d++) {
      bool summed = na < 0;
      for (int i = 0; i < na; i++) summed |= (axes[i] + kept.rank) % kept.rank == d;
      if (summed) kept.dims[d] = 1;
    }
    rs.ints = kept.dims;
    rs.n = kept.rank;
    kl_value *k = emit(a, KL_OP_RESHAPE, &dy, 1, &rs, 1);
    kl_attr ex = {.name = "shape", .kind = KL_ATTR_INTS, .ints = x->shape.dims,
                  .n = x->shape.rank};
    return accumulate(a, x, k ? emit(a, KL_OP_EXPAND, &k, 1, &ex, 1) : NULL);
  }
  default:
    break;
  }
  return kl_fail(a->err, n->loc, "autodiff: no gradient rule for %s (node '%s')",
                 kl_ops[n->op].name, n->name);
}

int kl_autodiff(kl_graph *g, kl_value *y, kl_value *const *xs, int nxs, kl_value **grads,
                kl_error *err) {
  int nn = g->nodes.len, rc = 0;
  kl_node **order = calloc((size_t)nn + 1, sizeof *order);
  bool *needed = calloc((size_t)nn + 1, sizeof *needed);
  ad_ctx a = {.g = g, .err = err, .loc = y->loc};
  /* adjoints are indexed by value id; ids made while differentiating are
   * never looked up, so the table is sized once */
  a.adj = calloc((size_t)g->values.len + 1, sizeof *a.adj);
  if (!order || !needed || !a.adj) abort();
  if ((rc = kl_topo_order(g, order, err))) goto done;
  /* Only nodes y depends on carry adjoints. */
  if (y->producer) needed[y->producer->id] = true;
  for (int i = nn - 1; i >= 0; i--)
    if (needed[order[i]->id])
      for (int k = 0; k < order[i]->ninputs; k++)
        if (order[i]->inputs[k]->producer) needed[order[i]->inputs[k]->producer->id] = true;
  /* ... and only nodes that depend on some x: the rest (constants, a
   * branch of other inputs) has no gradient to pass on. */
  bool *from_x = calloc((size_t)g->values.len + 1, sizeof *from_x);
  if (!from_x) abort();
  for (int i = 0; i < nxs; i++) from_x[xs[i]->id] = true;
  for (int i = 0; i < nn; i++) {
    bool any = false;
    for (int k = 0; k < order[i]->ninputs; k++) any |= from_x[order[i]->inputs[k]->id];
    for (int k = 0; k < order[i]->noutputs; k++) from_x[order[i]->outputs[k]->id] |= any;
    if (!any) needed[order[i]->id] = false;
  }
  free(from_x);
  if (!kl_dtype_is_float(y->dtype)) {
    rc = kl_fail(err, y->loc, "autodiff: '%s' is %s; gradients need a float value", y->name,
                 kl_dtype_name(y->dtype));
    goto done;
  }
  if (!(a.adj[y->id] = full_like(&a, y, 1))) { rc = -1; goto done; }
  for (int i = nn - 1; i >= 0 && !rc; i--) {
    const kl_node *n = order[i];
    if (!needed[n->id] || n->noutputs != 1 || !a.adj[n->outputs[0]->id]) continue;
    rc = backprop(&a, n, a.adj[n->outputs[0]->id]);
  }
  for (int i = 0; i < nxs && !rc; i++) {
    kl_value *dx = a.adj[xs[i]->id];
    /* a value y does not depend on has a zero gradient */
    grads[i] = dx ? dx : full_like(&a, xs[i], 0);
    if (!grads[i]) rc = -1;
  }
done:
  free(order);
  free(needed);
  free(a.adj);
  return rc;
}
