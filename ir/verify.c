/* verify.c - the verifier and topological ordering. */
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

int kl_topo_order(const kl_graph *g, kl_node **order, kl_error *err) {
  int n = g->nodes.len, done = 0;
  int *pending = calloc((size_t)n + 1, sizeof *pending);
  int *queue = calloc((size_t)n + 1, sizeof *queue);
  /* readers[i]: nodes reading an output of node i, as a CSR list */
  int *start = calloc((size_t)n + 2, sizeof *start);
  int total = 0;
  for (int i = 0; i < n; i++) total += g->nodes.items[i]->ninputs + 1;
  int *readers = calloc((size_t)total + 1, sizeof *readers);
  if (!pending || !queue || !start || !readers) abort();
  for (int i = 0; i < n; i++) {
    kl_node *node = g->nodes.items[i];
    for (int k = 0; k < node->ninputs; k++) {
      kl_node *p = node->inputs[k]->producer;
      if (node->inputs[k]->kind == KL_VAL_NODE && p) {
        pending[i]++;
        start[p->id + 1]++;
      }
    }
    if (node->after && node->after->producer) pending[i]++, start[node->after->producer->id + 1]++;
  }
  for (int i = 0; i < n; i++) start[i + 1] += start[i];
  int *fill = calloc((size_t)n + 1, sizeof *fill);
  if (!fill) abort();
  for (int i = 0; i < n; i++) {
    kl_node *node = g->nodes.items[i];
    for (int k = 0; k < node->ninputs; k++) {
      kl_node *p = node->inputs[k]->producer;
      if (node->inputs[k]->kind == KL_VAL_NODE && p)
        readers[start[p->id] + fill[p->id]++] = i;
    }
    kl_node *a = node->after ? node->after->producer : NULL;
    if (a) readers[start[a->id] + fill[a->id]++] = i;
  }
  int head = 0, tail = 0;
  for (int i = 0; i < n; i++)
    if (!pending[i]) queue[tail++] = i;
  while (head < tail) {
    int i = queue[head++];
    order[done++] = g->nodes.items[i];
    for (int r = start[i]; r < start[i + 1]; r++)
      if (--pending[readers[r]] == 0) queue[tail++] = readers[r];
  }
  int rc = 0;
  if (done != n) {
    for (int i = 0; i < n; i++)
      if (pending[i]) {
        kl_node *node = g->nodes.items[i];
        rc = kl_fail(err, node->loc, "the graph has a cycle through node '%s' (%s)",
                     node->name, kl_ops[node->op].name);
        break;
      }
  }
  free(pending); free(queue); free(start); free(readers); free(fill);
  return rc;
}

static int check_value(const kl_graph *g, const kl_value *v, kl_error *err) {
  if ((unsigned)v->dtype >= KL_DTYPE_COUNT)
    return kl_fail(err, v->loc, "value '%s' has an invalid dtype", v->name);
  if (v->shape.rank < 0 || v->shape.rank > KL_MAX_RANK)
    return kl_fail(err, v->loc, "value '%s' has rank %d (at most %d)", v->name,
                   v->shape.rank, KL_MAX_RANK);
  int64_t numel = 1;
  for (int d = 0; d < v->shape.rank; d++) {
    int64_t dim = v->shape.dims[d];
    if (dim < 0 || dim > KL_MAX_NUMEL || (dim && numel > KL_MAX_NUMEL / dim))
      return kl_fail(err, v->loc, "value '%s' has a negative or too large shape",
                     v->name);
    numel *= dim;
  }
  if (v->id < 0 || v->id >= g->values.len || g->values.items[v->id] != v)
    return kl_fail(err, v->loc, "value '%s' does not belong to the graph", v->name);
  return 0;
}

/* Names are compared through a sorted copy, so the check is n log n. */
static int cmp_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_unique(const char **names, int n, const char *what,
                        kl_error *err) {
  qsort(names, (size_t)n, sizeof *names, cmp_names);
  for (int i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0)
      return kl_fail(err, (kl_loc){0}, "duplicate %s name '%s'", what, names[i]);
  return 0;
}

static int check_names(const kl_graph *g, kl_error *err) {
  int n = g->values.len > g->nodes.len ? g->values.len : g->nodes.len;
  const char **names = malloc(((size_t)n + 1) * sizeof *names);
  if (!names) abort();
  for (int i = 0; i < g->values.len; i++) names[i] = g->values.items[i]->name;
  int rc = check_unique(names, g->values.len, "value", err);
  if (!rc) {
    for (int i = 0; i < g->nodes.len; i++) names[i] = g->nodes.items[i]->name;
    rc = check_unique(names, g->nodes.len, "node", err);
  }
  free(names);
  return rc;
}

/* Run the op's inference again and compare with what the graph records. */
static int recheck_node(kl_node *n, kl_error *err) {
  kl_dtype dt[64];
  kl_shape sh[64];
  int nout = n->noutputs < 64 ? n->noutputs : 64;
  for (int k = 0; k < nout; k++) {
    dt[k] = n->outputs[k]->dtype;
    sh[k] = n->outputs[k]->shape;
  }
  int rc = kl_ops[n->op].infer(n, err);
  for (int k = 0; k < nout && !rc; k++)
    if (dt[k] != n->outputs[k]->dtype || !kl_shape_equal(&sh[k], &n->outputs[k]->shape)) {
      char a[128], b[128];
      rc = kl_fail(err, n->loc, "node '%s' (%s): output %d is recorded as %s%s but infers to %s%s",
                   n->name, kl_ops[n->op].name, k, kl_dtype_name(dt[k]),
                   kl_shape_str(&sh[k], a, sizeof a),
                   kl_dtype_name(n->outputs[k]->dtype),
                   kl_shape_str(&n->outputs[k]->shape, b, sizeof b));
    }
  for (int k = 0; k < nout; k++) {
    n->outputs[k]->dtype = dt[k];
    n->outputs[k]->shape = sh[k];
  }
  return rc;
}

int kl_verify(const kl_graph *g, kl_error *err) {
  for (int i = 0; i < g->values.len; i++)
    if (check_value(g, g->values.items[i], err)) return -1;
  if (check_names(g, err)) return -1;
  for (int i = 0; i < g->nodes.len; i++) {
    kl_node *n = g->nodes.items[i];
    if ((unsigned)n->op >= KL_OP_COUNT)
      return kl_fail(err, n->loc, "node '%s' has an unknown op", n->name);
    for (int k = 0; k < n->ninputs; k++) {
      kl_value *in = n->inputs[k];
      if (!in || in->id < 0 || in->id >= g->values.len || g->values.items[in->id] != in)
        return kl_fail(err, n->loc, "node '%s' (%s): input %d is dangling",
                       n->name, kl_ops[n->op].name, k);
      if (in->kind == KL_VAL_NODE && !in->producer)
        return kl_fail(err, n->loc, "node '%s' (%s): input '%s' has no producer",
                       n->name, kl_ops[n->op].name, in->name);
    }
    for (int k = 0; k < n->noutputs; k++)
      if (n->outputs[k]->producer != n || n->outputs[k]->producer_output != k)
        return kl_fail(err, n->loc, "node '%s': output %d is not linked back",
                       n->name, k);
    if (recheck_node(n, err)) return -1;
  }
  if (g->outputs.len == 0)
    return kl_fail(err, (kl_loc){0}, "the model has no outputs");
  for (int i = 0; i < g->outputs.len; i++)
    if (check_value(g, g->outputs.items[i], err)) return -1;
  kl_node **order = malloc(((size_t)g->nodes.len + 1) * sizeof *order);
  if (!order) abort();
  int rc = kl_topo_order(g, order, err);
  free(order);
  return rc;
}
