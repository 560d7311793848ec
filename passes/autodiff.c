/* autodiff.c - reverse-mode differentiation over the IR: walk the nodes
 * between the xs and y backwards and, for each, call its op's gradient rule
 * (kl_op_grads[], the rules beside each op in ir/ops_*.c), which turns its
 * outputs' adjoints into its inputs'.  Broadcasting is undone here by
 * summing over the broadcast axes, and a value read twice adds up its
 * adjoints. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  kl_grad_ctx c;
  kl_value **adj; /* adjoint per value id, NULL while none */
} ad_ctx;

static int accumulate(ad_ctx *a, kl_value *v, kl_value *grad) {
  if (!grad) return a->c.failed ? -1 : 0;
  if (!kl_dtype_is_float(v->dtype)) return 0;
  grad = kl_gb_cast(&a->c, kl_gb_sum_to(&a->c, grad, &v->shape), v->dtype);
  kl_value *sum = a->adj[v->id] ? kl_gb2(&a->c, KL_OP_ADD, a->adj[v->id], grad) : grad;
  if (!sum) return -1;
  a->adj[v->id] = sum;
  return 0;
}

/* Every node on the path that has float outputs and no rule, named at
 * once. */
static int check_rules(kl_node *const *order, int nn, const bool *needed, kl_loc loc,
                       kl_error *err) {
  char msg[700];
  size_t used = 0;
  int missing = 0;
  for (int i = 0; i < nn; i++) {
    const kl_node *n = order[i];
    bool float_out = false;
    for (int k = 0; k < n->noutputs; k++) float_out |= kl_dtype_is_float(n->outputs[k]->dtype);
    if (!needed[n->id] || !float_out || kl_op_grads[n->op]) continue;
    if (missing++ < 8 && used < sizeof msg - 120)
      used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s (node '%s')",
                               missing > 1 ? ", " : "", kl_ops[n->op].name,
                               n->onnx_name ? n->onnx_name : n->name);
  }
  if (!missing) return 0;
  return kl_fail(err, loc, "no gradient for %s%s", msg, missing > 8 ? ", ..." : "");
}

int kl_autodiff_seeded(kl_graph *g, kl_value *y, kl_value *seed, kl_value *const *xs, int nxs,
                       kl_value **grads, kl_error *err) {
  int nn = g->nodes.len, rc = 0;
  kl_node **order = calloc((size_t)nn + 1, sizeof *order);
  bool *needed = calloc((size_t)nn + 1, sizeof *needed);
  bool *from_x = calloc((size_t)g->values.len + 1, sizeof *from_x);
  ad_ctx a = {.c = {.g = g, .err = err, .loc = y->loc}};
  /* adjoints are indexed by value id; ids made while differentiating are
   * never looked up, so the table is sized once */
  a.adj = calloc((size_t)g->values.len + 1, sizeof *a.adj);
  if (!order || !needed || !a.adj || !from_x) abort();
  if ((rc = kl_topo_order(g, order, err))) goto done;
  if (!kl_dtype_is_float(y->dtype)) {
    rc = kl_fail(err, y->loc, "autodiff: '%s' is %s; gradients need a float value", y->name,
                 kl_dtype_name(y->dtype));
    goto done;
  }
  /* Only nodes y depends on carry adjoints ... */
  if (y->producer) needed[y->producer->id] = true;
  for (int i = nn - 1; i >= 0; i--)
    if (needed[order[i]->id])
      for (int k = 0; k < order[i]->ninputs; k++)
        if (order[i]->inputs[k]->producer) needed[order[i]->inputs[k]->producer->id] = true;
  /* ... and only nodes that depend on some x through float values: the
   * rest (constants, labels, a branch of other inputs) has no gradient to
   * pass on. */
  for (int i = 0; i < nxs; i++) from_x[xs[i]->id] = true;
  for (int i = 0; i < nn; i++) {
    bool any = false;
    for (int k = 0; k < order[i]->ninputs; k++)
      any |= from_x[order[i]->inputs[k]->id] && kl_dtype_is_float(order[i]->inputs[k]->dtype);
    for (int k = 0; k < order[i]->noutputs; k++) from_x[order[i]->outputs[k]->id] |= any;
    if (!any) needed[order[i]->id] = false;
  }
  if ((rc = check_rules(order, nn, needed, y->loc, err))) goto done;
  a.adj[y->id] = seed ? kl_gb_cast(&a.c, kl_gb_expand(&a.c, seed, &y->shape), y->dtype)
                      : kl_gb_expand(&a.c, kl_gb_scalar(&a.c, y->dtype, 1), &y->shape);
  if (!a.adj[y->id]) { rc = -1; goto done; }
  for (int i = nn - 1; i >= 0 && !rc; i--) {
    const kl_node *n = order[i];
    kl_value *dy[16] = {0}, *dx[64] = {0};
    bool any = false;
    if (!needed[n->id] || n->noutputs > 16 || n->ninputs > 64) continue;
    for (int k = 0; k < n->noutputs; k++) any |= (dy[k] = a.adj[n->outputs[k]->id]) != NULL;
    if (!any) continue;
    a.c.loc = n->loc;
    if ((rc = kl_op_grads[n->op](&a.c, n, dy, dx)) || a.c.failed) {
      rc = -1;
      break;
    }
    for (int k = 0; k < n->ninputs && !rc; k++)
      if (from_x[n->inputs[k]->id]) rc = accumulate(&a, n->inputs[k], dx[k]);
  }
  a.c.loc = y->loc;
  for (int i = 0; i < nxs && !rc; i++) {
    kl_value *dx = a.adj[xs[i]->id];
    /* a value y does not depend on has a zero gradient */
    grads[i] = dx ? dx : kl_gb_expand(&a.c, kl_gb_scalar(&a.c, xs[i]->dtype, 0), &xs[i]->shape);
    if (!grads[i]) rc = -1;
  }
done:
  free(order);
  free(needed);
  free(from_x);
  free(a.adj);
  return rc;
}

int kl_autodiff(kl_graph *g, kl_value *y, kl_value *const *xs, int nxs, kl_value **grads,
                kl_error *err) {
  return kl_autodiff_seeded(g, y, NULL, xs, nxs, grads, err);
}
