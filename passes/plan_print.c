/* plan_print.c - the plan as text (kiln compile --dump-after=fuse): each
 * step, what it runs and which nodes it holds, then the views. */
#include "passes.h"

const char *const kl_step_kind_names[] = {"none", "node", "elementwise", "rows", "direct conv",
                                          "direct gemm", "gemm", "attention"};

const kl_node *kl_plan_epilogue_gemm(const kl_plan *p, const kl_node *n) {
  if (!p->absorbed[n->id] || p->epi_inner[n->id] || n->op == KL_OP_TRANSPOSE) return NULL;
  return p->epi_gemm[n->id];
}

kl_step_kind kl_plan_step_kind(const kl_plan *p, int group) {
  const kl_group *gr = &p->fusion.groups[group];
  kl_node *const *m = p->fusion.nodes + gr->first;
  if (gr->count == 1) {
    const kl_node *n = m[0], *gemm = kl_plan_epilogue_gemm(p, n);
    if (p->epi_last[n->id]) return KL_STEP_NONE; /* it runs at its epilogue's end */
    if (gemm) return p->attn_head[gemm->id] ? KL_STEP_ATTENTION : KL_STEP_GEMM;
    if (p->alias[n->id] || p->view_node[n->id] || p->absorbed[n->id]) return KL_STEP_NONE;
    if (!kl_is_fusible(n, p->target) &&
        !(p->fuse && (kl_is_direct_conv(n, p->target) || kl_is_direct_conv_transpose(n, p->target))))
      return n->op == KL_OP_MATMUL && kl_dtype_is_float(n->outputs[0]->dtype) ? KL_STEP_GEMM
                                                                               : KL_STEP_NODE;
  }
  if (gr->kind == KL_GROUP_ROWS) return KL_STEP_ROWS;
  for (int k = 0; k < gr->count; k++) {
    if (m[k]->op == KL_OP_CONV2D || m[k]->op == KL_OP_CONV_TRANSPOSE2D) return KL_STEP_DIRECT_CONV;
    if (m[k]->op == KL_OP_MATMUL) return KL_STEP_DIRECT_GEMM;
  }
  return KL_STEP_ELEMENTWISE;
}

static void print_value(FILE *f, const kl_value *v) {
  char shape[160];
  fprintf(f, "%s %s%s", v->name, kl_dtype_name(v->dtype), kl_shape_str(&v->shape, shape, sizeof shape));
}

static void print_step(FILE *f, const kl_plan *p, int gi) {
  const kl_group *gr = &p->fusion.groups[gi];
  kl_node *const *m = p->fusion.nodes + gr->first;
  kl_step_kind kind = kl_plan_step_kind(p, gi);
  fprintf(f, "  step %d: %s", gi, kl_step_kind_names[kind]);
  if (kind == KL_STEP_ROWS) fprintf(f, " (rows of %d axes)", gr->row_axes);
  fprintf(f, ":");
  for (int k = 0; k < gr->count; k++) fprintf(f, " %s", m[k]->name);
  const kl_node *n = m[0], *gemm = gr->count == 1 ? kl_plan_epilogue_gemm(p, n) : NULL;
  if (kind == KL_STEP_GEMM && gemm) {
    fprintf(f, " <- %s", gemm->name);
    if (p->epi_bias[gemm->id]) fprintf(f, ", bias %s", p->epi_bias[gemm->id]->name);
    if (p->epi_residual[gemm->id]) fprintf(f, ", residual %s", p->epi_residual[gemm->id]->name);
    if (p->epi_relu[gemm->id]) fprintf(f, ", relu");
  } else if (kind == KL_STEP_ATTENTION && gemm) {
    const kl_attention *a = &p->attn[gemm->id];
    fprintf(f, " <- %s, %d before softmax %s, %d after", a->qk->name, a->npre, a->softmax->name,
            a->npost);
  } else if (kind == KL_STEP_NONE && p->epi_last[n->id]) {
    fprintf(f, " (runs at %s)", p->epi_last[n->id]->name);
  } else if (kind == KL_STEP_NONE && p->alias[n->id]) {
    fprintf(f, n->op == KL_OP_CONCAT ? " (its inputs written in place)" : " (its input's buffer)");
  } else if (kind == KL_STEP_NONE && p->view_node[n->id]) {
    fprintf(f, " (a view)");
  } else if (kind == KL_STEP_NONE && p->attn_head[n->id]) {
    fprintf(f, " (in attention %s)", p->attn_head[n->id]->name);
  } else if (kind == KL_STEP_NONE && n->op == KL_OP_TRANSPOSE) {
    fprintf(f, " (written there by its input's GEMM)");
  } else if (kind == KL_STEP_NONE) {
    fprintf(f, " (in the epilogue of a GEMM)");
  }
  /* aliases are the memory pass's to decide (it knows where the input lives) */
  if (kind == KL_STEP_NODE && !p->loc[n->outputs[0]->id].kind &&
      (n->op == KL_OP_RESHAPE || n->op == KL_OP_FLATTEN || n->op == KL_OP_SQUEEZE ||
       n->op == KL_OP_UNSQUEEZE))
    fprintf(f, " (a copy, unless the memory pass makes it its input's buffer)");
  if (gr->count == 1 && p->writes_into[n->id])
    fprintf(f, ", writes through %s", p->writes_into[n->id]->name);
  int stored = 0;
  for (int k = 0; k < gr->count && gr->count > 1; k++)
    for (int o = 0; o < m[k]->noutputs; o++)
      if (p->fusion.stored[m[k]->outputs[o]->id])
        fprintf(f, "%s", stored++ ? ", " : "; stores "), print_value(f, m[k]->outputs[o]);
  fprintf(f, "\n");
}

void kl_plan_print(FILE *f, const kl_plan *p) {
  for (int gi = 0; gi < p->fusion.ngroups; gi++) print_step(f, p, gi);
  for (int v = 0; v < p->g->values.len; v++) {
    const kl_view *w = &p->view[v];
    const kl_value *val = p->g->values.items[v];
    if (w->base == val || !val->producer || !p->view_node[val->producer->id]) continue;
    fprintf(f, "  view %s = %s + %lld, strides", val->name, w->base->name, (long long)w->offset);
    for (int d = 0; d < w->shape.rank; d++) fprintf(f, " %lld", (long long)w->strides[d]);
    fprintf(f, "\n");
  }
}
