/* plan_views.c - which movement nodes become views (views.c) that GEMMs
 * read through, and which matmuls write their result through a transpose:
 * the head split and merge of attention then cost no kernels at all. */
#include "passes.h"

static bool computed(const kl_plan *p, const kl_node *n) {
  return p->live[n->id] && !p->folded[n->id];
}

static bool is_float_matmul(const kl_node *n) {
  return n->op == KL_OP_MATMUL && kl_dtype_is_float(n->outputs[0]->dtype) &&
         n->inputs[0]->shape.rank >= 2 && n->inputs[1]->shape.rank >= 2;
}

bool kl_plan_in_group(const kl_plan *p, const kl_node *n) {
  return p->fusion.groups[p->fusion.group_of[n->id]].count > 1;
}

/* The view of every value under the current choice of view nodes. */
static void compute_views(kl_plan *p) {
  const kl_graph *g = p->g;
  for (int v = 0; v < g->values.len; v++) kl_view_identity(g->values.items[v], &p->view[v]);
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (!p->view_node[n->id]) continue;
    for (int k = 0; k < n->noutputs; k++) {
      kl_view out;
      if (kl_view_apply(n, k, &p->view[n->inputs[0]->id], &out))
        p->view[n->outputs[k]->id] = out;
      else
        p->view_node[n->id] = false; /* a reshape across strides: a copy after all */
    }
  }
}

void kl_plan_result_view(const kl_plan *p, const kl_node *mm, kl_view *out) {
  const kl_node *t = p->writes_into[mm->id];
  kl_view_identity(p->epi_last[mm->id] ? p->epi_last[mm->id]->outputs[0] : mm->outputs[0], out);
  if (!t) return;
  /* out[i] = y[perm[i]]: y's dim perm[i] steps by the output's stride i */
  kl_view tv;
  kl_view_identity(t->outputs[0], &tv);
  const int64_t *perm;
  int r = out->shape.rank, np = kl_attr_ints(t, "perm", &perm);
  out->base = t->outputs[0];
  for (int i = 0; i < r; i++) {
    int64_t q = np == r ? perm[i] : r - 1 - i;
    if (q < 0) q += r;
    out->strides[q] = tv.strides[i];
  }
}

/* Does matmul mm take its operands and result as one GEMM call? */
static bool matmul_fits(const kl_plan *p, const kl_node *mm) {
  kl_view cv;
  kl_mm_layout L;
  kl_plan_result_view(p, mm, &cv);
  return kl_matmul_layout(&p->view[mm->inputs[0]->id], &p->view[mm->inputs[1]->id], &cv, &L);
}

/* Node n reads its operands as views: n is a view node itself, or a
 * matmul whose GEMM takes them. */
static bool reads_as_view(const kl_plan *p, const kl_node *n) {
  return p->view_node[n->id] || (is_float_matmul(n) && !kl_plan_in_group(p, n) &&
                                 (p->attn_head[n->id] || matmul_fits(p, n)));
}

/* Is every output of view node n read (by one node at least), and only
 * by nodes that take views? */
static bool view_stays(const kl_plan *p, const kl_node *n) {
  for (int k = 0; k < n->noutputs; k++) {
    const kl_value *o = n->outputs[k];
    int from = p->reader_at[o->id], to = p->reader_at[o->id + 1];
    if (o->is_output || to == from) return false;
    for (int r = from; r < to; r++)
      if (!reads_as_view(p, p->readers[r])) return false;
  }
  return true;
}

/* Start from every movement node a view, then drop those read by anything
 * that is not a view or a fitting GEMM, until nothing changes: what is left
 * is a set of chains from a stored value into GEMM operands.  Then let each
 * matmul whose one reader is a transpose write through it.  (--no-fuse:
 * no views, every value read as itself.) */
void kl_plan_views(kl_plan *p) {
  const kl_graph *g = p->g;
  int nn = g->nodes.len;
  if (!p->fuse) {
    compute_views(p);
    return;
  }
  for (int i = 0; i < nn; i++) {
    const kl_node *n = p->order[i];
    p->view_node[n->id] = computed(p, n) && kl_view_op(n) && !kl_plan_in_group(p, n);
  }
  for (bool changed = true; changed;) {
    changed = false;
    compute_views(p);
    for (int i = 0; i < nn; i++) {
      const kl_node *n = p->order[i];
      if (p->view_node[n->id] && !view_stays(p, n)) p->view_node[n->id] = false, changed = true;
    }
  }
  /* matmul -> transpose: the GEMM writes the transposed result */
  for (int i = 0; i < nn; i++) {
    const kl_node *mm = p->order[i];
    if (!computed(p, mm) || !is_float_matmul(mm) || mm->outputs[0]->is_output ||
        kl_plan_in_group(p, mm))
      continue;
    const kl_value *y = mm->outputs[0];
    int from = p->reader_at[y->id], to = p->reader_at[y->id + 1];
    const kl_node *only = to - from == 1 ? p->readers[from] : NULL;
    if (!only || only->op != KL_OP_TRANSPOSE || p->view_node[only->id] ||
        only->outputs[0]->dtype != y->dtype)
      continue;
    p->writes_into[mm->id] = only;
    if (p->attn_head[mm->id] || matmul_fits(p, mm)) p->absorbed[only->id] = true;
    else p->writes_into[mm->id] = NULL;
  }
  compute_views(p);
}
