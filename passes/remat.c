/* remat.c - rematerialization: a training step over its memory limit
 * recomputes cheap forward values in the backward pass instead of keeping
 * them alive from the forward pass.
 *
 * The forward values backward nodes read (activations, relu masks, pooling
 * indices, transposed copies, zeros to scatter into) are alive from the
 * forward pass to the backward one, across the peak.  While the planned
 * arena is over the limit, this pass takes the values alive at the peak
 * that wait there for a backward reader, cheapest first (bytes per FLOP
 * recomputed), copies the nodes that compute such a value from values at
 * hand (inputs, params, constants, values backward reads at that point
 * anyway) and points the backward readers at the copy.  The copies wait
 * (kl_node.after) for the last backward step before their first reader,
 * so the scheduler and fusion put them next to it.  Then it plans again
 * (the planning passes, as the compile will run them): a copy is kept
 * when the plan got tighter, else the next candidate is tried on top of
 * it, and both are undone when that did not help either.
 *
 * A copy runs the same kernels on the same inputs, so its values are the
 * originals' bit for bit, and so are the step's results.  Copied nodes are
 * elementwise, norms, data movement, reductions and pools, pooling
 * indices, and convolutions short enough to run as direct convolutions
 * (an elementwise kernel: the same kernel wherever it lands); GEMMs are
 * never copied (a library call's arithmetic may depend on its epilogue). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* nodes copied for one value; copies tried together; plans made in all
 * (compile time stays bounded on a deep network) */
enum { MAX_CHAIN = 12, LOOKAHEAD = 2, MAX_PLANS = 400 };

typedef struct {
  kl_graph *g;
  const kl_pipeline_options *o;
  kl_pipeline_options trial; /* o without a limit or dumps */
  FILE *log;                 /* --dump-after=remat, or NULL */
  bool *bwd;                 /* per value id: depends on the loss seed */
  int nbwd;                  /* values bwd[] covers */
  bool *rejected;            /* per value id: tried, did not help */
  int nrejected;
  int chosen, undone;        /* values recomputed; tried and undone */
  int plans;                 /* made so far */
  char names[300];           /* the first of them, for the error */
  char undone_names[200];
  size_t names_len, undone_len;
} remat_ctx;

static size_t value_bytes(const kl_value *v) {
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}

/* Which values depend on the loss seed: the backward pass (and the
 * update after it).  Values made later (the copies) read forward values
 * only, so they count as forward. */
static void mark_backward(remat_ctx *c) {
  kl_graph *g = c->g;
  free(c->bwd);
  c->nbwd = g->values.len;
  c->bwd = calloc((size_t)c->nbwd + 1, sizeof *c->bwd);
  kl_node **order = calloc((size_t)g->nodes.len + 1, sizeof *order);
  if (!c->bwd || !order) abort();
  kl_error e;
  if (kl_topo_order(g, order, &e)) {
    free(order);
    return;
  }
  c->bwd[g->train->in_scale->id] = true;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = order[i];
    bool any = false;
    for (int k = 0; k < n->ninputs; k++) any |= c->bwd[n->inputs[k]->id];
    for (int k = 0; k < n->noutputs; k++) c->bwd[n->outputs[k]->id] = any;
  }
  free(order);
}

static bool is_backward(const remat_ctx *c, const kl_node *n) {
  return n->outputs[0]->id < c->nbwd && c->bwd[n->outputs[0]->id];
}

/* Nodes whose copy is cheap and gives the same bits wherever it runs. */
static bool copyable(const kl_plan *p, const kl_node *n) {
  if (n->after || n->noutputs < 1) return false; /* a copy already */
  if (n->op == KL_OP_MAX_POOL2D_INDEX) return true;
  if (n->op == KL_OP_CONV2D) return kl_is_direct_conv(n, p->target);
  if (n->op == KL_OP_CONV_TRANSPOSE2D) return kl_is_direct_conv_transpose(n, p->target);
  switch (kl_ops[n->op].kind) {
  case KL_KIND_ELEMENTWISE: case KL_KIND_NORMALIZATION: case KL_KIND_DATA_MOVEMENT:
  case KL_KIND_REDUCTION: return true;
  default: return false;
  }
}

/* Floating-point operations to recompute n: a convolution's
 * multiply-adds, else one per element of its largest operand. */
static double node_flops(const kl_node *n) {
  double most = 0;
  for (int k = 0; k < n->noutputs; k++) {
    double e = (double)kl_shape_numel(&n->outputs[k]->shape);
    if (e > most) most = e;
  }
  if (n->op == KL_OP_CONV2D) {
    const kl_shape *w = &n->inputs[1]->shape;
    return 2 * most * (double)kl_shape_numel(w) / (double)(w->dims[0] ? w->dims[0] : 1);
  }
  for (int k = 0; k < n->ninputs; k++) {
    double e = (double)kl_shape_numel(&n->inputs[k]->shape);
    if (e > most) most = e;
  }
  return most;
}

static int step_of(const kl_plan *p, const kl_node *n) { return p->fusion.group_of[n->id]; }

/* Is v at hand at step `at` without recomputing it: not made by a kernel
 * (an input, a param, a constant, a folded value), or read by the backward
 * pass at `at` or later anyway? */
static bool at_hand(const remat_ctx *c, const kl_plan *p, const kl_value *v, int at) {
  kl_loc_kind k = p->loc[v->id].kind;
  if (v->kind != KL_VAL_NODE || v->producer->op == KL_OP_CONSTANT || k == KL_LOC_PARAM ||
      k == KL_LOC_INPUT)
    return true;
  for (int r = p->reader_at[v->id]; r < p->reader_at[v->id + 1]; r++)
    if (is_backward(c, p->readers[r]) && step_of(p, p->readers[r]) >= at) return true;
  return false;
}

/* The nodes to copy so that v can be computed again at step `at`, in an
 * order that runs them (producers first); -1 when one cannot be copied
 * or there are too many. */
static int gather(const remat_ctx *c, const kl_plan *p, kl_node *n, int at, kl_node **chain,
                  int count) {
  for (int i = 0; i < count; i++)
    if (chain[i] == n) return count;
  if (!copyable(p, n)) return -1;
  for (int k = 0; k < n->ninputs && count >= 0; k++)
    if (!at_hand(c, p, n->inputs[k], at)) count = gather(c, p, n->inputs[k]->producer, at, chain, count);
  if (count < 0 || count == MAX_CHAIN) return -1;
  chain[count++] = n;
  return count;
}

/* ---- candidates ----------------------------------------------------------- */
typedef struct {
  kl_value *v;
  kl_node *chain[MAX_CHAIN];
  int nchain;
  const kl_node *first_reader; /* its first backward reader, by the plan */
  double flops;
  size_t bytes;
} candidate;

/* The first backward reader of v and the step it runs at, or NULL. */
static const kl_node *first_backward_reader(const remat_ctx *c, const kl_plan *p, const kl_value *v) {
  const kl_node *first = NULL;
  for (int r = p->reader_at[v->id]; r < p->reader_at[v->id + 1]; r++) {
    const kl_node *n = p->readers[r];
    if (is_backward(c, n) && (!first || step_of(p, n) < step_of(p, first))) first = n;
  }
  return first;
}

/* A forward value alive at the peak in an arena buffer, made before it
 * and first read by the backward pass at it (the copy may fuse into the
 * reader's kernel) or after it, and what recomputing it takes; false when
 * it is no candidate. */
static bool consider(const remat_ctx *c, const kl_plan *p, kl_value *v, candidate *out) {
  int peak = p->mem.peak_step;
  if (v->kind != KL_VAL_NODE || v->is_output || v->id >= c->nbwd || c->bwd[v->id] ||
      (v->id < c->nrejected && c->rejected[v->id]) || p->loc[v->id].kind != KL_LOC_ARENA)
    return false;
  const kl_membuf *b = &p->bufs[p->loc[v->id].index];
  const kl_node *first = first_backward_reader(c, p, v);
  if (!b->bytes || b->first >= peak || b->last < peak || !first || step_of(p, first) < peak)
    return false;
  out->v = v;
  out->first_reader = first;
  out->nchain = gather(c, p, v->producer, step_of(p, first), out->chain, 0);
  if (out->nchain < 1) return false;
  out->flops = 0;
  for (int i = 0; i < out->nchain; i++) out->flops += node_flops(out->chain[i]);
  out->bytes = b->bytes;
  return true;
}

/* Bytes kept per FLOP recomputed, then more bytes, then the graph's order. */
static bool cheaper(const candidate *a, const candidate *b) {
  double x = (double)a->bytes / (a->flops + 1), y = (double)b->bytes / (b->flops + 1);
  if (x != y) return x > y;
  if (a->bytes != b->bytes) return a->bytes > b->bytes;
  return a->v->id < b->v->id;
}

static bool best_candidate(const remat_ctx *c, const kl_plan *p, candidate *best) {
  bool found = false;
  candidate cand;
  for (int i = 0; i < c->g->values.len; i++)
    if (consider(c, p, c->g->values.items[i], &cand) && (!found || cheaper(&cand, best)))
      *best = cand, found = true;
  return found;
}

/* ---- the rewrite and its undo --------------------------------------------- */
typedef struct {
  int nnodes, nvalues;        /* the graph's before the copies */
  kl_node *readers[64];       /* backward readers pointed at the copy ... */
  int input[64];              /* ... at this input */
  int nreaders;
} rewrite;

/* The backward input of n computed last by the plan: what n's copies wait
 * for. */
static kl_value *last_backward_input(const remat_ctx *c, const kl_plan *p, const kl_node *n) {
  kl_value *last = NULL;
  for (int k = 0; k < n->ninputs; k++) {
    kl_value *v = n->inputs[k];
    if (v->id < c->nbwd && c->bwd[v->id] && v->producer &&
        (!last || step_of(p, v->producer) > step_of(p, last->producer)))
      last = v;
  }
  return last;
}

/* What the copies for reader n wait for: the backward value of the last
 * step the plan runs before n's (so they run where the value is needed,
 * not where their inputs allow: another value's peak may be there; a
 * forward value, zeros say, may run anywhere), else n's backward input
 * computed last. */
static kl_value *wait_point(const remat_ctx *c, const kl_plan *p, const kl_node *n) {
  for (int s = step_of(p, n) - 1; s > p->mem.peak_step; s--) {
    const kl_node *prev = kl_plan_step_node(p, s);
    if (is_backward(c, prev)) return prev->outputs[0];
  }
  return last_backward_input(c, p, n);
}

static kl_value *copy_of(kl_node *const *chain, kl_node *const *copies, int n, kl_value *v) {
  for (int i = 0; i < n; i++)
    if (v->producer == chain[i]) return copies[i]->outputs[v->producer_output];
  return v;
}

/* Copy the chain, each copy waiting for `after`, and point v's backward
 * readers at the copy of v; false (nothing changed) when a copy does not
 * come out as the original (types, shapes). */
static bool apply(remat_ctx *c, const candidate *cd, kl_value *after, rewrite *rw) {
  kl_graph *g = c->g;
  kl_node *copies[MAX_CHAIN];
  kl_error err;
  rw->nnodes = g->nodes.len, rw->nvalues = g->values.len, rw->nreaders = 0;
  for (int i = 0; i < cd->nchain; i++) {
    const kl_node *n = cd->chain[i];
    kl_value *ins[64];
    const char *outs[16];
    char buf[300];
    if (n->ninputs > 64 || n->noutputs > 16) return false;
    for (int k = 0; k < n->ninputs; k++) ins[k] = copy_of(cd->chain, copies, i, n->inputs[k]);
    for (int k = 0; k < n->noutputs; k++) {
      snprintf(buf, sizeof buf, "%.200s_remat", n->outputs[k]->name);
      outs[k] = kl_graph_fresh_value_name(g, buf);
    }
    snprintf(buf, sizeof buf, "%.200s_remat", n->name);
    kl_node *m = kl_graph_add_node(g, n->op, kl_graph_fresh_name(g, buf), ins, n->ninputs,
                                   n->attrs, n->nattrs, outs, n->noutputs, n->loc, &err);
    if (!m) return false;
    m->after = after;
    m->onnx_name = n->onnx_name, m->onnx_op = n->onnx_op;
    for (int k = 0; k < n->noutputs; k++)
      if (m->outputs[k]->dtype != n->outputs[k]->dtype ||
          !kl_shape_equal(&m->outputs[k]->shape, &n->outputs[k]->shape))
        return false;
    copies[i] = m;
  }
  kl_value *copy = copy_of(cd->chain, copies, cd->nchain, cd->v);
  for (int i = 0; i < rw->nnodes; i++) {
    kl_node *n = g->nodes.items[i];
    if (!is_backward(c, n)) continue;
    for (int k = 0; k < n->ninputs; k++)
      if (n->inputs[k] == cd->v) {
        if (rw->nreaders == 64) return false;
        rw->readers[rw->nreaders] = n, rw->input[rw->nreaders++] = k;
        n->inputs[k] = copy;
      }
  }
  return rw->nreaders > 0;
}

/* Put the readers back and drop the copies (renamed out of the way, as
 * bnfold drops nodes: the name index keeps its entries). */
static void undo(remat_ctx *c, const rewrite *rw, const kl_value *v) {
  kl_graph *g = c->g;
  for (int i = 0; i < rw->nreaders; i++) rw->readers[i]->inputs[rw->input[i]] = (kl_value *)v;
  char buf[300];
  for (int i = rw->nnodes; i < g->nodes.len; i++) {
    snprintf(buf, sizeof buf, "%.200s~remat", g->nodes.items[i]->name);
    kl_graph_rename_node(g, g->nodes.items[i], kl_graph_fresh_name(g, buf));
  }
  for (int i = rw->nvalues; i < g->values.len; i++) {
    snprintf(buf, sizeof buf, "%.200s~remat", g->values.items[i]->name);
    kl_graph_rename_value(g, g->values.items[i], kl_graph_fresh_name(g, buf));
  }
  g->nodes.len = rw->nnodes;
  g->values.len = rw->nvalues;
}

/* ---- the loop ----------------------------------------------------------------- */
/* How tight a plan is: its arena, then the most bytes alive at one step,
 * then bytes times steps alive over all buffers.  A copy is kept when it
 * lowers this: a value gone from one of two equal peaks lowers neither
 * number before it, but makes room for the next copy. */
typedef struct {
  size_t arena, lower_bound;
  double byte_steps;
} pressure;

static pressure pressure_of(const kl_plan *p) {
  pressure x = {p->mem.arena, p->mem.lower_bound, 0};
  for (int b = 0; b < p->nbufs; b++)
    if (p->bufs[b].first <= p->bufs[b].last)
      x.byte_steps += (double)p->bufs[b].bytes * (p->bufs[b].last - p->bufs[b].first + 1);
  return x;
}

static bool lower(pressure a, pressure b) {
  if (a.arena != b.arena) return a.arena < b.arena;
  if (a.lower_bound != b.lower_bound) return a.lower_bound < b.lower_bound;
  return a.byte_steps < b.byte_steps;
}

static int plan(remat_ctx *c, kl_plan *p, kl_error *err) {
  kl_plan_free(p);
  c->plans++;
  return kl_pipeline(c->g, &c->trial, p, err);
}

static void reject(remat_ctx *c, const kl_value *v) {
  if (v->id >= c->nrejected) {
    int n = c->g->values.len + 1;
    c->rejected = realloc(c->rejected, (size_t)n * sizeof *c->rejected);
    if (!c->rejected) abort();
    memset(c->rejected + c->nrejected, 0, (size_t)(n - c->nrejected) * sizeof *c->rejected);
    c->nrejected = n;
  }
  c->rejected[v->id] = true;
}

/* "'a', 'b'" in buf, the nth name added while it fits. */
static void list_name(char *buf, size_t size, size_t *len, int nth, const char *name) {
  if (*len + strlen(name) + 16 < size)
    *len += (size_t)snprintf(buf + *len, size - *len, "%s'%s'", nth > 1 ? ", " : "", name);
  else if (*len >= 3 && *len + 6 < size && strcmp(buf + *len - 3, "...") != 0)
    *len += (size_t)snprintf(buf + *len, size - *len, ", ...");
}

static void note(remat_ctx *c, const candidate *cd, size_t before, size_t after, bool kept) {
  char line[900];
  size_t used = (size_t)snprintf(line, sizeof line, "'%s' (%zu bytes, %s) recomputed before '%s' by",
                                 cd->v->name, value_bytes(cd->v), kl_ops[cd->v->producer->op].name,
                                 cd->first_reader->name);
  for (int i = 0; i < cd->nchain && used < sizeof line - 80; i++)
    used += (size_t)snprintf(line + used, sizeof line - used, " %s", kl_ops[cd->chain[i]->op].name);
  snprintf(line + used, sizeof line - used, " (%.0f flops): arena %zu -> %zu bytes%s", cd->flops,
           before, after, kept ? "" : ", undone");
  if (kept && c->o->notes) fprintf(c->o->notes, "kiln: remat: %s\n", line);
  if (c->log) fprintf(c->log, "  %s\n", line);
  if (!kept) {
    c->undone++;
    list_name(c->undone_names, sizeof c->undone_names, &c->undone_len, c->undone, cd->v->name);
    return;
  }
  c->chosen++;
  list_name(c->names, sizeof c->names, &c->names_len, c->chosen, cd->v->name);
}

/* Still over the limit: the memory pass's error (what is alive at the
 * peak), and what rematerialization did. */
static int give_up(remat_ctx *c, kl_error *err) {
  kl_plan p;
  kl_pipeline_options o = c->trial;
  o.mem_limit = c->o->mem_limit;
  int rc = kl_pipeline(c->g, &o, &p, err);
  kl_plan_free(&p);
  if (!rc) return 0; /* (cannot happen: the trial plan was over) */
  char msg[sizeof err->msg], done[400] = "", undone[300] = "";
  memcpy(msg, err->msg, sizeof msg);
  if (c->chosen)
    snprintf(done, sizeof done, " recomputed %d value%s in the backward pass (%s),", c->chosen,
             c->chosen > 1 ? "s" : "", c->names);
  if (c->undone)
    snprintf(undone, sizeof undone, " undid %d that left the plan no tighter (%s),", c->undone,
             c->undone_names);
  if (!c->chosen && !c->undone && c->plans < MAX_PLANS)
    return kl_fail(err, err->loc, "%.700s; rematerialization found no forward value alive at "
                   "the peak that it could recompute", msg);
  if (c->plans >= MAX_PLANS)
    return kl_fail(err, err->loc, "%.600s; rematerialization%s%s and stopped after %d plans", msg,
                   done, undone, c->plans);
  return kl_fail(err, err->loc, "%.600s; rematerialization%s%s and found nothing more to "
                 "recompute", msg, done, undone);
}

int kl_remat(kl_graph *g, const kl_pipeline_options *o, FILE *log, kl_error *err) {
  if (!o->mem_limit || !o->target || !g->train || !g->train->built) {
    if (log) fprintf(log, "  (nothing: %s)\n", !o->mem_limit ? "no --mem-limit" : "not a training step");
    return 0;
  }
  remat_ctx c = {.g = g, .o = o, .trial = *o, .log = log};
  c.trial.mem_limit = 0, c.trial.dump = NULL, c.trial.dump_after = NULL;
  kl_plan p = {0};
  int rc = plan(&c, &p, err);
  size_t start = p.mem.arena;
  while (!rc && p.mem.arena > o->mem_limit) {
    /* a copy may move the schedule so that another forward value (zeros,
     * say) now sits at the peak: up to LOOKAHEAD copies are tried together
     * before the first is undone */
    pressure before = pressure_of(&p);
    candidate tried[LOOKAHEAD];
    rewrite rw[LOOKAHEAD];
    size_t arena[LOOKAHEAD + 1] = {before.arena};
    int n = 0;
    bool better = false, failed = false;
    while (n < LOOKAHEAD && !better && !failed) {
      mark_backward(&c);
      if (c.plans >= MAX_PLANS || !best_candidate(&c, &p, &tried[n])) break;
      kl_value *after = wait_point(&c, &p, tried[n].first_reader);
      kl_plan_free(&p); /* (sized by the graph, which grows now) */
      rw[n] = (rewrite){g->nodes.len, g->values.len, {0}, {0}, 0};
      failed = !after || !apply(&c, &tried[n], after, &rw[n]);
      n++;
      if (failed || (rc = plan(&c, &p, err))) break;
      arena[n] = p.mem.arena;
      better = lower(pressure_of(&p), before);
    }
    if (rc) break;
    if (!n) {
      rc = give_up(&c, err);
      break;
    }
    for (int i = 0; i < n; i++)
      note(&c, &tried[i], arena[i], failed && i == n - 1 ? arena[i] : arena[i + 1], better);
    if (better) continue;
    kl_plan_free(&p);
    for (int i = n - 1; i >= 0; i--) undo(&c, &rw[i], tried[i].v);
    reject(&c, tried[0].v);
    rc = plan(&c, &p, err);
  }
  if (!rc && log)
    fprintf(log, "  %d value%s recomputed: arena %zu -> %zu bytes (limit %zu)\n", c.chosen,
            c.chosen == 1 ? "" : "s", start, p.mem.arena, o->mem_limit);
  kl_plan_free(&p);
  free(c.bwd);
  free(c.rejected);
  return rc;
}
