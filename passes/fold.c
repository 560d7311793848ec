/* fold.c - constant folding: a node computed from weights and constants
 * alone (a causal mask, a scale, a shape) is evaluated at compile time by
 * the interpreter, and its result kept with the weights.  The ONNX loader
 * folds through kl_fold_eval too, for the values it must know (shapes,
 * axes). */
#include <stdlib.h>

#include "passes.h"

int kl_fold_eval(const kl_node *n, kl_tensor *const *in, kl_tensor **out, kl_error *err) {
  for (int k = 0; k < n->noutputs; k++)
    out[k] = kl_tensor_new(n->outputs[k]->dtype, &n->outputs[k]->shape);
  int rc = kl_ops[n->op].eval(n, (kl_tensor **)in, out, err);
  for (int k = 0; k < n->noutputs; k++) {
    kl_tensor *t = out[k];
    /* as stored: the value a kernel would have written */
    for (int64_t e = 0; !rc && e < t->numel; e++) t->data[e] = kl_dtype_round(t->dtype, t->data[e]);
    if (rc) kl_tensor_free(t), out[k] = NULL;
  }
  return rc;
}

/* Small inputs only, so compile time stays short, and no result larger
 * than its inputs, so the weights do not grow (an expand of a scalar
 * stays a kernel). */
enum { FOLD_MAX_INPUT_ELEMENTS = 1 << 16 };

static size_t value_bytes(const kl_value *v) {
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}

static void choose_folded(kl_plan *p) {
  const kl_graph *g = p->g;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (!p->live[n->id]) continue;
    if (n->op == KL_OP_CONSTANT) {
      p->folded[n->id] = true;
      continue;
    }
    size_t in_bytes = 0, out_bytes = 0;
    int64_t elements = 0;
    /* a gradient exchange talks to the other ranks at run time */
    bool fold = n->ninputs > 0 && n->op != KL_OP_ALL_REDUCE && n->op != KL_OP_ALL_REDUCE_WAIT;
    for (int k = 0; k < n->ninputs && fold; k++) {
      const kl_value *v = n->inputs[k];
      /* a training step's params change every step */
      fold = (v->kind == KL_VAL_PARAM && !(g->train && g->train->built)) || v->kind == KL_VAL_CONST ||
             (v->kind == KL_VAL_NODE && p->folded[v->producer->id]);
      in_bytes += value_bytes(v);
      elements += kl_shape_numel(&v->shape);
    }
    for (int k = 0; k < n->noutputs; k++) out_bytes += value_bytes(n->outputs[k]);
    p->folded[n->id] = fold && elements <= FOLD_MAX_INPUT_ELEMENTS && out_bytes <= in_bytes;
  }
}

/* A weight as a tensor, made when a folded node first reads it. */
static int known_input(kl_plan *p, const kl_value *v, kl_error *err) {
  if (p->known[v->id]) return 0;
  return kl_value_materialize(v, &p->known[v->id], err);
}

static int fold_node(kl_plan *p, const kl_node *n, kl_error *err) {
  kl_tensor *in[64] = {0}, *out[16] = {0};
  if (n->ninputs > 64 || n->noutputs > 16)
    return kl_fail(err, n->loc, "internal error: %s (node '%s') has too many operands to fold",
                   kl_ops[n->op].name, n->name);
  for (int k = 0; k < n->ninputs; k++) {
    if (known_input(p, n->inputs[k], err)) return -1;
    in[k] = p->known[n->inputs[k]->id];
  }
  if (kl_fold_eval(n, in, out, err)) return -1;
  for (int k = 0; k < n->noutputs; k++) p->known[n->outputs[k]->id] = out[k];
  return 0;
}

int kl_plan_fold(kl_plan *p, kl_error *err) {
  choose_folded(p);
  for (int i = 0; i < p->g->nodes.len; i++)
    if (p->live[p->order[i]->id] && p->folded[p->order[i]->id] && fold_node(p, p->order[i], err))
      return -1;
  return 0;
}
