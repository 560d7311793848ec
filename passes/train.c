/* train.c - the training compile: appends to a model the rest of one
 * training step, so that precision, fusion and memory planning run over
 * forward, backward and update together.
 *
 *   loss            the train block's (or --loss for ONNX), on the forward
 *   backward        kl_autodiff_seeded from the loss scale (autodiff.c)
 *   global norm     sum_squares of all gradients (two kernels), unscaled:
 *                   the clip factor and the one finite flag of the step
 *   update          optim_step nodes (ir/ops_train.c), up to
 *                   KL_OPTIM_TENSORS params each: one kernel apiece
 *
 * The step reads five f32 scalars the training program computes on the
 * host each step (learning rate from the schedule, Adam's bias
 * corrections, loss scale, apply) and gives the loss, ok (1: the update
 * was taken) and the gradients' global norm.  Each param and optimizer
 * state gets its new value as an update output: compiled code writes it
 * over the old one in place (plan_memory.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* tensors per optim_step and sum_squares node: their kernels' pointer
 * arguments stay within CUDA's 4 KB of parameters */
enum { KL_OPTIM_TENSORS = 32, KL_SUMSQ_TENSORS = 256 };

typedef struct {
  kl_graph *g;
  kl_grad_ctx c;
} train_ctx;

static kl_value *scalar_input(train_ctx *t, const char *base) {
  kl_shape s = {0, {0}};
  return kl_graph_add_input(t->g, kl_graph_fresh_value_name(t->g, base), KL_F32, &s, t->c.loc);
}

static kl_value *to_f32(train_ctx *t, kl_value *v) { return kl_gb_cast(&t->c, v, KL_F32); }

/* An f32 param's optimizer state: zeros, stored with the weights. */
static kl_value *state_like(train_ctx *t, const kl_value *p, const char *what) {
  char name[300];
  snprintf(name, sizeof name, "%s_%s", p->name, what);
  return kl_graph_add_param(t->g, kl_graph_fresh_value_name(t->g, name), p->dtype, &p->shape,
                            KL_VAL_PARAM, (kl_init){.kind = KL_INIT_ZEROS}, p->loc);
}

static double hyper(const kl_train *tr, const char *name, double dflt) {
  for (int i = 0; i < tr->nattrs; i++)
    if (!strcmp(tr->attrs[i].name, name)) return tr->attrs[i].f;
  return dflt;
}

/* Data parallelism: each gradient summed over the ranks.  Buckets are
 * filled in reverse param order (the order the backward pass computes
 * them in: the last layer's first, as PyTorch's DDP does), each at most
 * bucket_bytes unless one gradient alone is larger; one all_reduce node
 * per bucket starts its exchange, and one all_reduce_wait per gradient
 * stands where the sum is first needed.  grads[] become the sums. */
static int exchange_gradients(train_ctx *t, kl_train *tr, kl_value **grads, int nparams) {
  kl_value **ins = calloc((size_t)nparams + 1, sizeof *ins);
  int *index = calloc((size_t)nparams + 1, sizeof *index);
  if (!ins || !index) abort();
  int rc = 0;
  for (int last = nparams - 1; last >= 0 && !rc;) {
    size_t bytes = 0;
    int count = 0;
    for (int i = last; i >= 0; i--) {
      size_t b = (size_t)kl_shape_numel(&grads[i]->shape) * kl_dtype_size(grads[i]->dtype);
      if (count && bytes + b > tr->bucket_bytes) break;
      bytes += b, index[count] = i, ins[count++] = grads[i];
    }
    kl_attr bucket = {.name = "bucket", .kind = KL_ATTR_INT, .i = tr->nbuckets};
    char name[64];
    snprintf(name, sizeof name, "all_reduce_%d", tr->nbuckets);
    kl_node *n = kl_graph_add_node(t->g, KL_OP_ALL_REDUCE, kl_graph_fresh_name(t->g, name), ins, count,
                                   &bucket, 1, NULL, 0, tr->loc, t->c.err);
    if (!n) {
      rc = -1;
      break;
    }
    for (int k = 0; k < count && !rc; k++) {
      kl_value *pair[2] = {n->outputs[k], grads[index[k]]};
      snprintf(name, sizeof name, "wait_%d", tr->nbuckets);
      kl_node *w = kl_graph_add_node(t->g, KL_OP_ALL_REDUCE_WAIT, kl_graph_fresh_name(t->g, name), pair,
                                     2, &bucket, 1, NULL, 0, tr->loc, t->c.err);
      if (!w) rc = -1;
      else grads[index[k]] = w->outputs[0];
    }
    tr->nbuckets++;
    last -= count;
  }
  free(ins);
  free(index);
  return rc;
}

/* Which values the loss depends on. */
static bool *depends(const kl_graph *g, const kl_value *loss) {
  bool *dep = calloc((size_t)g->values.len + 1, sizeof *dep);
  kl_node **order = calloc((size_t)g->nodes.len + 1, sizeof *order);
  if (!dep || !order) abort();
  kl_error e;
  kl_topo_order(g, order, &e);
  dep[loss->id] = true;
  for (int i = g->nodes.len - 1; i >= 0; i--) {
    const kl_node *n = order[i];
    bool any = false;
    for (int k = 0; k < n->noutputs; k++) any |= dep[n->outputs[k]->id];
    for (int k = 0; any && k < n->ninputs; k++) dep[n->inputs[k]->id] = true;
  }
  free(order);
  return dep;
}

static const char *next_name(const char *name, char *buf, size_t len) {
  snprintf(buf, len, "%s_next", name);
  return buf;
}

static int mark_output(train_ctx *t, kl_value *v, const char *name) {
  if (v->is_output) return 0;
  if (name && !v->producer) return kl_fail(t->c.err, t->c.loc, "internal error: %s has no producer", name);
  if (name) kl_graph_rename_value(t->g, v, kl_graph_fresh_value_name(t->g, name));
  return kl_graph_mark_output(t->g, v, t->c.err);
}

int kl_train_build(kl_graph *g, bool loss_scaling, kl_error *err) {
  kl_train *tr = g->train;
  if (!tr || tr->built) return 0;
  train_ctx t = {.g = g, .c = {.g = g, .err = err, .loc = tr->loc}};
  kl_value *loss = kl_graph_find_value(g, tr->loss);
  if (!loss) return kl_fail(err, tr->loc, "the loss '%s' is not a value of the model", tr->loss);
  if (!kl_dtype_is_float(loss->dtype) || kl_shape_numel(&loss->shape) != 1)
    return kl_fail(err, tr->loc, "the loss must be a float scalar");
  /* the samples and the labels: a cross entropy's or NLL's operands */
  const kl_node *lp = loss->producer;
  if (lp && (lp->op == KL_OP_CROSS_ENTROPY || lp->op == KL_OP_NLL_LOSS)) {
    tr->out_logits = lp->inputs[0];
    if (lp->inputs[1]->kind == KL_VAL_INPUT) tr->in_labels = lp->inputs[1];
  }
  int nparams = 0;
  kl_value **params = calloc((size_t)g->params.len + 1, sizeof *params);
  bool *dep = depends(g, loss);
  if (!params) abort();
  for (int i = 0; i < g->params.len; i++) {
    kl_value *p = g->params.items[i];
    if (p->kind == KL_VAL_PARAM && dep[p->id] && kl_dtype_is_float(p->dtype)) params[nparams++] = p;
  }
  /* the samples: the first input the loss reads; the labels, unless a
   * cross entropy said, the next one (an mse's targets) */
  for (int i = 0; i < g->inputs.len && !tr->in_x; i++)
    if (g->inputs.items[i] != tr->in_labels && dep[g->inputs.items[i]->id]) tr->in_x = g->inputs.items[i];
  for (int i = 0; i < g->inputs.len && !tr->in_labels; i++)
    if (g->inputs.items[i] != tr->in_x && dep[g->inputs.items[i]->id]) tr->in_labels = g->inputs.items[i];
  free(dep);
  int rc = -1;
  if (!nparams) {
    rc = kl_fail(err, tr->loc, "the loss '%s' depends on no float param: nothing to train", tr->loss);
    goto done;
  }
  for (int i = 0; i < nparams; i++)
    if (params[i]->dtype != KL_F32) {
      rc = kl_fail(err, params[i]->loc, "param '%s' is %s; training keeps f32 master weights "
                   "(declare it f32; --precision=fp16 makes the half copies)",
                   params[i]->name, kl_dtype_name(params[i]->dtype));
      goto done;
    }
  tr->in_lr = scalar_input(&t, "train_lr");
  tr->in_bias1 = scalar_input(&t, "train_bias1");
  tr->in_bias2 = scalar_input(&t, "train_bias2");
  tr->in_scale = scalar_input(&t, "train_loss_scale");
  tr->in_apply = scalar_input(&t, "train_apply");
  kl_value **grads = calloc((size_t)nparams + 1, sizeof *grads);
  if (!grads) abort();
  if (kl_autodiff_seeded(g, loss, tr->in_scale, params, nparams, grads, err)) {
    free(grads);
    goto done;
  }
  kl_grad_ctx *c = &t.c;
  if (tr->data_parallel) {
    tr->in_world = scalar_input(&t, "train_world");
    for (int i = 0; i < nparams; i++) grads[i] = to_f32(&t, grads[i]);
    if (c->failed || exchange_gradients(&t, tr, grads, nparams)) {
      free(grads);
      goto done;
    }
  }
  /* global norm of the unscaled gradients: sqrt(sum g^2) / scale (and,
   * data-parallel, of their mean over the ranks: / world) */
  kl_value *total = NULL;
  for (int first = 0; first < nparams; first += KL_SUMSQ_TENSORS) {
    int count = nparams - first < KL_SUMSQ_TENSORS ? nparams - first : KL_SUMSQ_TENSORS;
    kl_value *part = kl_gb_node(c, KL_OP_SUM_SQUARES, grads + first, count, NULL, 0);
    total = total ? kl_gb2(c, KL_OP_ADD, total, part) : part;
  }
  total = to_f32(&t, total);
  kl_value *inv = kl_gb1(c, KL_OP_RECIPROCAL, tr->in_world ? kl_gb2(c, KL_OP_MUL, tr->in_scale, tr->in_world)
                                                          : tr->in_scale);
  kl_value *norm = kl_gb2(c, KL_OP_MUL, kl_gb1(c, KL_OP_SQRT, total), inv);
  kl_value *bad = kl_gb2(c, KL_OP_LOGICAL_OR, kl_gb1(c, KL_OP_ISNAN, norm), kl_gb1(c, KL_OP_ISINF, norm));
  kl_value *go = kl_gb2(c, KL_OP_GT, tr->in_apply, kl_gb_scalar(c, KL_F32, 0.5));
  /* only a loss-scaled (fp16) step is skipped when its gradients are not
   * finite; fp32 and bf16 steps use them as computed (docs/DSL.md) */
  kl_value *ok = to_f32(&t, loss_scaling ? kl_gb2(c, KL_OP_LOGICAL_AND, kl_gb1(c, KL_OP_LOGICAL_NOT, bad), go) : go);
  tr->loss_scaling = loss_scaling;
  kl_value *mult = inv;
  if (tr->clip > 0) { /* min(1, clip / (norm + 1e-6)) */
    kl_value *f = kl_gb2(c, KL_OP_DIV, kl_gb_scalar(c, KL_F32, tr->clip),
                         kl_gb2(c, KL_OP_ADD, norm, kl_gb_scalar(c, KL_F32, 1e-6)));
    mult = kl_gb2(c, KL_OP_MUL, inv, kl_gb2(c, KL_OP_MINIMUM, f, kl_gb_scalar(c, KL_F32, 1)));
  }
  /* the update, KL_OPTIM_TENSORS params per node */
  const char *algo = tr->optimizer;
  double momentum = hyper(tr, "momentum", 0);
  int ns = !strcmp(algo, "sgd") ? (momentum > 0 ? 1 : 0) : 2;
  double wd = hyper(tr, "weight_decay", !strcmp(algo, "adamw") ? 0.01 : 0);
  kl_attr at[8] = {{.name = "algo", .kind = KL_ATTR_STRING, .s = algo},
                   {.name = "count", .kind = KL_ATTR_INT},
                   {.name = "beta1", .kind = KL_ATTR_FLOAT, .f = hyper(tr, "beta1", 0.9)},
                   {.name = "beta2", .kind = KL_ATTR_FLOAT, .f = hyper(tr, "beta2", 0.999)},
                   {.name = "eps", .kind = KL_ATTR_FLOAT, .f = hyper(tr, "eps", 1e-8)},
                   {.name = "weight_decay", .kind = KL_ATTR_FLOAT, .f = wd},
                   {.name = "momentum", .kind = KL_ATTR_FLOAT, .f = momentum},
                   {.name = "nesterov", .kind = KL_ATTR_INT, .i = hyper(tr, "nesterov", 0) != 0}};
  tr->nstates = nparams * (1 + ns);
  tr->nparams = nparams;
  tr->states = kl_arena_alloc(&g->arena, (size_t)(tr->nstates + 1) * sizeof *tr->states);
  kl_value **news = calloc((size_t)tr->nstates + 1, sizeof *news);
  kl_value **ins = calloc((size_t)(5 + KL_OPTIM_TENSORS * (2 + ns)), sizeof *ins);
  if (!news || !ins) abort();
  for (int i = 0; i < nparams; i++) tr->states[i] = params[i];
  for (int i = 0; i < nparams; i++)
    for (int s = 0; s < ns; s++)
      tr->states[nparams + i * ns + s] = state_like(&t, params[i], ns == 1 ? "momentum" : s ? "v" : "m");
  for (int first = 0; first < nparams && !c->failed; first += KL_OPTIM_TENSORS) {
    int count = nparams - first < KL_OPTIM_TENSORS ? nparams - first : KL_OPTIM_TENSORS, nin = 0;
    ins[nin++] = tr->in_lr, ins[nin++] = tr->in_bias1, ins[nin++] = tr->in_bias2;
    ins[nin++] = mult, ins[nin++] = ok;
    for (int i = first; i < first + count; i++) {
      ins[nin++] = params[i];
      ins[nin++] = to_f32(&t, grads[i]);
      for (int s = 0; s < ns; s++) ins[nin++] = tr->states[nparams + i * ns + s];
    }
    at[1].i = count;
    for (int k = 0; k < nin; k++)
      if (!ins[k]) c->failed = true;
    if (c->failed) break;
    kl_node *n = kl_graph_add_node(g, KL_OP_OPTIM_STEP, "optim_step", ins, nin, at, 8, NULL, 0, tr->loc, err);
    if (!n) {
      c->failed = true;
      break;
    }
    for (int i = first; i < first + count; i++) {
      kl_value **out = n->outputs + (i - first) * (1 + ns);
      news[i] = out[0];
      for (int s = 0; s < ns; s++) news[nparams + i * ns + s] = out[1 + s];
    }
  }
  free(ins);
  free(grads);
  if (c->failed) goto free_news;
  tr->out_loss = loss;
  tr->out_ok = ok;
  tr->out_norm = norm;
  if ((tr->out_logits && mark_output(&t, tr->out_logits, NULL)) || mark_output(&t, loss, NULL) ||
      mark_output(&t, ok, "train_ok") || mark_output(&t, norm, "train_grad_norm"))
    goto free_news;
  char nbuf[300];
  for (int i = 0; i < tr->nstates; i++) {
    kl_graph_rename_value(g, news[i], kl_graph_fresh_value_name(g, next_name(tr->states[i]->name, nbuf, sizeof nbuf)));
    news[i]->updates = tr->states[i];
    if (kl_graph_mark_output(g, news[i], err)) goto free_news;
  }
  tr->built = true;
  rc = 0;
free_news:
  free(news);
done:
  free(params);
  return rc;
}
