/* plan_gemm.c - what happens around each matmul, decided before fusion:
 *
 * - attention: softmax(pre(Q @ K)) -> post -> @ V as one kernel, a warp
 *   per row of scores; the scores and probabilities never reach memory;
 * - direct GEMMs: a short matmul whose result goes on to elementwise work
 *   the GEMM library cannot do (a GELU) is computed inside that
 *   elementwise kernel, so its result never goes to memory either;
 * - epilogues: the bias, residual and relu after a GEMM, computed in the
 *   GEMM call (cuBLASLt's epilogues; the host BLAS wrapper's).
 *
 * Their nodes are pinned out of other fusion groups (kl_plan.absorbed). */
#include <string.h>

#include "passes.h"

static bool is_float_value(const kl_value *v) { return kl_dtype_is_float(v->dtype); }

static bool computed(const kl_plan *p, const kl_node *n) {
  return p->live[n->id] && !p->folded[n->id];
}

static bool is_float_matmul(const kl_node *n) {
  return n->op == KL_OP_MATMUL && n->noutputs == 1 && is_float_value(n->outputs[0]) &&
         n->inputs[0]->shape.rank >= 2 && n->inputs[1]->shape.rank >= 2;
}

/* ---- attention ------------------------------------------------------------ */
/* An elementwise node that continues the chain at cur: it reads cur and
 * keeps the scores' shape. */
static bool continues_chain(const kl_plan *p, const kl_node *n, const kl_value *cur,
                            const kl_shape *shape) {
  if (!kl_is_fusible(n, p->target)) return false;
  if (!is_float_value(n->outputs[0]) || !kl_shape_equal(&n->outputs[0]->shape, shape)) return false;
  for (int i = 0; i < n->ninputs; i++)
    if (n->inputs[i] == cur) return true;
  return false;
}

static bool match_attention(const kl_plan *p, const kl_node *qk, kl_attention *out) {
  const kl_target *t = p->target;
  int max_chain = t->attention_max_chain < KL_MAX_CHAIN ? t->attention_max_chain : KL_MAX_CHAIN;
  memset(out, 0, sizeof *out);
  if (!is_float_matmul(qk)) return false;
  const kl_value *s = qk->outputs[0];
  const kl_shape *S = &s->shape;
  int r = S->rank;
  int64_t tk = S->dims[r - 1], d = qk->inputs[0]->shape.dims[qk->inputs[0]->shape.rank - 1];
  /* halves on the tensor cores have a bound of their own (the kernel's
   * products differ; codegen/emit_attention.c's mma_warps) */
  const kl_value *qv = qk->inputs[0];
  bool halves = t->tensor_cores && (qv->dtype == KL_F16 || qv->dtype == KL_BF16) && qk->inputs[1]->dtype == qv->dtype;
  if (kl_shape_numel(S) == 0 || d < 1 || tk > (halves ? t->attention_mma_max_keys : t->attention_max_keys))
    return false;
  out->qk = qk;
  const kl_value *cur = s;
  const kl_node *n;
  while ((n = kl_plan_only_reader(p, cur)) && n->op != KL_OP_SOFTMAX) {
    if (out->npre == max_chain || !continues_chain(p, n, cur, S)) return false;
    out->pre[out->npre++] = (kl_node *)n;
    cur = n->outputs[0];
  }
  /* over the last axis, from a float row (row kind 2 says both) */
  if (!n || kl_row_kind(n) != 2 || n->inputs[0] != cur) return false;
  out->softmax = n;
  cur = n->outputs[0];
  while ((n = kl_plan_only_reader(p, cur)) && n->op != KL_OP_MATMUL) {
    if (out->npost == max_chain || !continues_chain(p, n, cur, S)) return false;
    out->post[out->npost++] = (kl_node *)n;
    cur = n->outputs[0];
  }
  if (!n || !is_float_matmul(n) || n->inputs[0] != cur || n->inputs[1] == cur) return false;
  /* V is [.., keys, dv]; the output has the scores' batch dims (V only
   * broadcasts into them), so one row of scores makes one output row */
  const kl_value *v = n->inputs[1], *o = n->outputs[0];
  int64_t dv = v->shape.dims[v->shape.rank - 1];
  if (v->shape.dims[v->shape.rank - 2] != tk || dv < 1 || o->shape.rank != r ||
      v->dtype != o->dtype || cur->dtype != o->dtype ||
      (halves && v->dtype != qv->dtype && tk > t->attention_max_keys))
    return false;
  for (int i = 0; i < r - 2; i++)
    if (o->shape.dims[i] != S->dims[i]) return false;
  out->pv = n;
  /* the tiled kernel where its tiles fit (heads up to 128); else the row
   * kernel */
  int qk_bytes = s->dtype == KL_F64 ? 8 : 4, pv_bytes = o->dtype == KL_F64 ? 8 : 4;
  out->tiled = kl_attention_rows_per_warp(d, dv, qk_bytes, pv_bytes) > 0;
  return out->tiled || (tk <= t->attention_row_max_keys && d <= t->attention_max_head &&
                        dv <= t->attention_max_head);
}

/* Its nodes after the first matmul run in one kernel at the second
 * matmul's step, as a GEMM's epilogue does (and are pinned out of other
 * groups the same way). */
static void choose_attention(kl_plan *p) {
  for (int i = 0; i < p->g->nodes.len; i++) {
    const kl_node *qk = p->order[i];
    kl_attention a;
    if (!computed(p, qk) || p->attn_head[qk->id] || !match_attention(p, qk, &a)) continue;
    int extra = 0; /* the chains' inputs from outside, bounded by the kernel's arguments */
    for (int m = 0; m < a.npre; m++) extra += a.pre[m]->ninputs - 1;
    for (int m = 0; m < a.npost; m++) extra += a.post[m]->ninputs - 1;
    if (extra > p->target->max_kernel_args - 4) continue;
    const kl_node *inner[2 * KL_MAX_CHAIN + 1];
    int n = 0;
    for (int m = 0; m < a.npre; m++) inner[n++] = a.pre[m];
    inner[n++] = a.softmax;
    for (int m = 0; m < a.npost; m++) inner[n++] = a.post[m];
    /* two score products added before one softmax: the first takes it,
     * the second stays a GEMM whose result the kernel reads */
    bool taken = p->attn_head[a.pv->id] || p->absorbed[a.pv->id];
    for (int m = 0; m < n; m++) taken |= p->attn_head[inner[m]->id] || p->absorbed[inner[m]->id];
    if (taken) continue;
    p->attn[qk->id] = a;
    for (int m = 0; m < n; m++) {
      p->attn_head[inner[m]->id] = qk;
      p->absorbed[inner[m]->id] = p->epi_inner[inner[m]->id] = true;
    }
    p->attn_head[qk->id] = p->attn_head[a.pv->id] = qk;
    p->absorbed[a.pv->id] = true;
    p->epi_last[qk->id] = a.pv;
  }
}

/* ---- direct GEMMs ---------------------------------------------------------
 * A matmul is direct when it is short (kl_is_direct_matmul), reads values
 * that are no views, and after the bias, residual and relu that the
 * epilogues take (single readers of its shape), its result goes on to
 * elementwise work they cannot do (a GELU, spelled out or not): with the
 * library that work would read the GEMM's result back from memory; in one
 * kernel the result never goes there. */
static bool is_epilogue_op(const kl_node *n, const kl_value *cur) {
  return n->op == KL_OP_RELU ||
         (n->op == KL_OP_ADD && (n->inputs[0] == cur) != (n->inputs[1] == cur));
}

/* Do all of v's readers (one at least) fuse with it element for element
 * (none taken by an attention or a GEMM's epilogue)? */
static bool readers_fuse(const kl_plan *p, const kl_value *v) {
  int from = p->reader_at[v->id], to = p->reader_at[v->id + 1];
  for (int k = from; k < to; k++) {
    const kl_node *r = p->readers[k];
    if (p->absorbed[r->id] || !kl_is_fusible(r, p->target) || r->noutputs != 1 ||
        !kl_shape_equal(&r->outputs[0]->shape, &v->shape))
      return false;
  }
  return to > from;
}

static bool pays_direct(const kl_plan *p, const kl_node *mm) {
  for (int k = 0; k < 2; k++) {
    const kl_node *pr = mm->inputs[k]->producer;
    if (pr && kl_view_op(pr)) return false;
  }
  const kl_value *cur = mm->outputs[0];
  for (;;) {
    const kl_node *r = kl_plan_only_reader(p, cur);
    if (!r || p->absorbed[r->id] || !is_epilogue_op(r, cur) ||
        !kl_shape_equal(&r->outputs[0]->shape, &cur->shape))
      return readers_fuse(p, cur);
    cur = r->outputs[0];
  }
}

/* Before the epilogues are chosen; then again (recheck) after, when one
 * may have taken a node a direct GEMM counted on: that GEMM goes back to
 * the library, and the next round of epilogues gives it its own.  Returns
 * whether a recheck sent one back. */
static bool choose_direct(kl_plan *p, bool recheck) {
  bool changed = false;
  for (int i = 0; i < p->g->nodes.len; i++) {
    const kl_node *mm = p->order[i];
    if (recheck) {
      if (p->direct[mm->id] && !pays_direct(p, mm)) p->direct[mm->id] = false, changed = true;
    } else if (computed(p, mm) && !p->attn_head[mm->id] && kl_is_direct_matmul(mm, p->target)) {
      p->direct[mm->id] = pays_direct(p, mm);
    }
  }
  return changed;
}

/* ---- epilogues ------------------------------------------------------------
 * act(A @ B + bias + residual): a matmul takes the add of a row vector
 * (bias), the add of a tensor of its result's shape (residual) and a
 * relu, in that order or with the adds swapped, while each value in
 * between has no other reader.  (The GEMM runs at the last node of its
 * epilogue, so a residual made anywhere before that is there.) */
static void choose_epilogues(kl_plan *p) {
  const kl_target *t = p->target;
  for (int i = 0; i < p->g->nodes.len; i++) {
    const kl_node *mm = p->order[i];
    if (!computed(p, mm) || !is_float_matmul(mm) || p->attn_head[mm->id] || p->direct[mm->id])
      continue;
    const kl_value *y = mm->outputs[0];
    int64_t n = y->shape.dims[y->shape.rank - 1];
    const kl_value *cur = y;
    for (;;) {
      const kl_node *r = kl_plan_only_reader(p, cur);
      /* (a node in another GEMM's chain already stays there: with two
       * GEMMs meeting in an add, the first to reach it takes it) */
      if (!r || p->absorbed[r->id] || r->outputs[0]->dtype != y->dtype ||
          !kl_shape_equal(&r->outputs[0]->shape, &y->shape))
        break;
      if (p->epi_relu[mm->id]) break; /* the activation comes last */
      if (r->op == KL_OP_RELU && t->gemm_relu) {
        p->epi_relu[mm->id] = true;
      } else if (r->op == KL_OP_ADD && (r->inputs[0] == cur) != (r->inputs[1] == cur)) {
        const kl_value *other = r->inputs[r->inputs[0] == cur ? 1 : 0];
        bool row = kl_shape_numel(&other->shape) == n && other->shape.rank >= 1 &&
                   other->shape.dims[other->shape.rank - 1] == n;
        if (other->dtype != y->dtype) break;
        if (row && t->gemm_bias && !p->epi_bias[mm->id] && other->shape.rank <= y->shape.rank)
          p->epi_bias[mm->id] = other;
        else if (kl_shape_equal(&other->shape, &y->shape) && t->gemm_residual &&
                 !p->epi_residual[mm->id])
          p->epi_residual[mm->id] = other;
        else
          break;
      } else {
        break;
      }
      if (p->epi_last[mm->id]) p->epi_inner[p->epi_last[mm->id]->id] = true;
      p->epi_last[mm->id] = r;
      p->absorbed[r->id] = true;
      cur = r->outputs[0];
    }
  }
}

void kl_plan_gemms(kl_plan *p) {
  if (!p->fuse) return;
  choose_attention(p);
  choose_direct(p, false);
  /* until no GEMM goes back to the library (each round sends one back at
   * least, so this ends; a GEMM that has its epilogue keeps it) */
  do choose_epilogues(p);
  while (choose_direct(p, true));
}
