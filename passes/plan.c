/* plan.c - the plan's storage, its reader lists, and fusion as a pass:
 * the groups formed around what the GEMM pass pinned. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static void *zalloc(size_t n, size_t size) {
  void *p = calloc(n + 1, size);
  if (!p) abort();
  return p;
}

void kl_plan_init(kl_plan *p, const kl_graph *g, const kl_target *t, bool fuse) {
  int nn = g->nodes.len, nv = g->values.len;
  memset(p, 0, sizeof *p);
  p->g = g;
  p->target = t;
  p->fuse = fuse;
  p->order = zalloc((size_t)nn, sizeof *p->order);
  p->live = zalloc((size_t)nn, sizeof *p->live);
  p->folded = zalloc((size_t)nn, sizeof *p->folded);
  p->known = zalloc((size_t)nv, sizeof *p->known);
  p->epi_bias = zalloc((size_t)nn, sizeof *p->epi_bias);
  p->epi_residual = zalloc((size_t)nn, sizeof *p->epi_residual);
  p->epi_relu = zalloc((size_t)nn, sizeof *p->epi_relu);
  p->epi_inner = zalloc((size_t)nn, sizeof *p->epi_inner);
  p->epi_last = zalloc((size_t)nn, sizeof *p->epi_last);
  p->epi_gemm = zalloc((size_t)nn, sizeof *p->epi_gemm);
  p->direct = zalloc((size_t)nn, sizeof *p->direct);
  p->attn_head = zalloc((size_t)nn, sizeof *p->attn_head);
  p->attn = zalloc((size_t)nn, sizeof *p->attn);
  p->view_node = zalloc((size_t)nn, sizeof *p->view_node);
  p->absorbed = zalloc((size_t)nn, sizeof *p->absorbed);
  p->writes_into = zalloc((size_t)nn, sizeof *p->writes_into);
  p->view = zalloc((size_t)nv, sizeof *p->view);
  p->reader_at = zalloc((size_t)nv + 1, sizeof *p->reader_at);
  p->loc = zalloc((size_t)nv, sizeof *p->loc);
  p->alias = zalloc((size_t)nn, sizeof *p->alias);
  p->piece_of = zalloc((size_t)nv, sizeof *p->piece_of);
}

void kl_plan_free(kl_plan *p) {
  if (!p->g) return;
  for (int v = 0; v < p->g->values.len && p->known; v++) kl_tensor_free(p->known[v]);
  free(p->known);
  free(p->order), free(p->live), free(p->folded);
  free(p->epi_bias), free(p->epi_residual), free(p->epi_relu), free(p->epi_inner);
  free(p->epi_last), free(p->epi_gemm), free(p->direct), free(p->attn_head), free(p->attn);
  free(p->view_node), free(p->absorbed), free(p->writes_into), free(p->view);
  free(p->readers), free(p->reader_at);
  free(p->loc), free(p->alias), free(p->piece_of), free(p->scratch_at);
  for (int b = 0; b < p->nbufs; b++) free((char *)p->bufs[b].name);
  free(p->bufs);
  kl_fusion_free(&p->fusion);
  memset(p, 0, sizeof *p);
}

/* Which nodes some output depends on. */
void kl_plan_live(kl_plan *p) {
  const kl_graph *g = p->g;
  for (int i = 0; i < g->outputs.len; i++)
    if (g->outputs.items[i]->producer) p->live[g->outputs.items[i]->producer->id] = true;
  for (int i = g->nodes.len - 1; i >= 0; i--)
    if (p->live[p->order[i]->id])
      for (int k = 0; k < p->order[i]->ninputs; k++)
        if (p->order[i]->inputs[k]->producer) p->live[p->order[i]->inputs[k]->producer->id] = true;
}

/* Counting sort of (value, reader) pairs: every question "who reads v"
 * after this is a slice, not a scan of the graph. */
void kl_plan_readers(kl_plan *p) {
  const kl_graph *g = p->g;
  int nv = g->values.len, total = 0;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (!p->live[n->id] || p->folded[n->id]) continue;
    for (int k = 0; k < n->ninputs; k++) p->reader_at[n->inputs[k]->id + 1]++, total++;
  }
  for (int v = 0; v < nv; v++) p->reader_at[v + 1] += p->reader_at[v];
  int *fill = zalloc((size_t)nv, sizeof *fill);
  free(p->readers);
  p->readers = zalloc((size_t)total, sizeof *p->readers);
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (!p->live[n->id] || p->folded[n->id]) continue;
    for (int k = 0; k < n->ninputs; k++) {
      int v = n->inputs[k]->id;
      p->readers[p->reader_at[v] + fill[v]++] = n;
    }
  }
  free(fill);
}

const kl_node *kl_plan_only_reader(const kl_plan *p, const kl_value *v) {
  if (v->is_output) return NULL;
  int from = p->reader_at[v->id], to = p->reader_at[v->id + 1];
  return to - from == 1 ? p->readers[from] : NULL;
}

int kl_plan_fuse(kl_plan *p, kl_error *err) {
  const kl_graph *g = p->g;
  int nn = g->nodes.len, ntodo = 0;
  kl_node **todo = zalloc((size_t)nn, sizeof *todo);
  for (int i = 0; i < nn; i++)
    if (p->live[p->order[i]->id] && !p->folded[p->order[i]->id]) todo[ntodo++] = p->order[i];
  kl_fusion_options fo = {.enabled = p->fuse, .target = p->target};
  if (p->fuse) {
    fo.direct = p->direct;
    fo.pinned = p->absorbed; /* GEMM epilogues and attentions stay out of other groups */
  }
  int rc = kl_fuse(g, todo, ntodo, &fo, &p->fusion);
  free(todo);
  if (rc) return kl_fail(err, (kl_loc){0}, "internal error: the fusion groups form a cycle");
  /* the GEMM a chain's last node belongs to (the first in schedule order) */
  for (int i = nn - 1; i >= 0; i--) {
    const kl_node *mm = p->order[i];
    if (p->epi_last[mm->id]) p->epi_gemm[p->epi_last[mm->id]->id] = mm;
  }
  return 0;
}

static bool is_member(kl_node *const *nodes, int n, const kl_node *x) {
  for (int i = 0; i < n; i++)
    if (nodes[i] == x) return true;
  return false;
}

void kl_group_io_of(kl_node *const *nodes, int n, const bool *stored, kl_group_io *io) {
  io->nin = io->nout = 0;
  for (int m = 0; m < n; m++) {
    const kl_node *nd = nodes[m];
    for (int i = 0; i < nd->ninputs; i++) {
      const kl_value *v = nd->inputs[i];
      if (v->producer && is_member(nodes, n, v->producer)) continue;
      int k = 0;
      while (k < io->nin && io->in[k] != v) k++;
      if (k == io->nin) {
        if (io->nin == KL_MAX_GROUP_IO) continue;
        io->in[io->nin] = v;
        io->window_read[io->nin] = false;
        io->elementwise_read[io->nin++] = false;
      }
      /* a batch_norm's parameters are read by channel, a convolution's
       * operands by window */
      if (nd->op == KL_OP_CONV2D || nd->op == KL_OP_CONV_TRANSPOSE2D || nd->op == KL_OP_MATMUL ||
          nd->op == KL_OP_RESIZE)
        io->window_read[k] = true;
      else if (!(kl_is_channel_affine(nd) && i > 0)) io->elementwise_read[k] = true;
    }
    if (stored[nd->outputs[0]->id] && io->nout < KL_MAX_GROUP_IO)
      io->out[io->nout++] = nd->outputs[0];
  }
}
