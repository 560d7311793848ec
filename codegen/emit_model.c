/* emit_model.c - the whole of code generation for one graph: decide where
 * every value lives (weights blob, one arena for intermediates, input and
 * output buffers), write one kernel or GEMM call per node, and the host code
 * and header around them. */
#include <limits.h>
#include <stdarg.h>
#include "../runtime/kilnrt.h"
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

enum { ALIGN = KL_MEM_ALIGN, BLOCK = 256, MAX_BLOCKS = 4096 };

/* LOC_VIEW: no buffer; read through kl_cg_read_view (views.c) */
typedef enum { LOC_NONE, LOC_PARAM, LOC_ARENA, LOC_INPUT, LOC_OUTPUT, LOC_VIEW } loc_kind;
typedef struct {
  loc_kind kind;
  size_t offset; /* PARAM */
  int index;     /* INPUT, OUTPUT; ARENA: its buffer in the memory plan */
} location;


typedef struct {
  const kl_graph *g;
  kl_error *err;
  location *loc;      /* per value id */
  unsigned char *params;
  size_t param_bytes, arena_bytes;
  kl_node **order;
  bool *live;
  int nkernels, ngemms, nlaunches;
  /* The memory plan: arena buffers (values first, then scratch) whose
   * offsets are names in run() until kl_memplan decides them. */
  kl_membuf *bufs;
  int nbufs, cap_bufs, nvalue_bufs;
  int step, nsteps;       /* the node being emitted, and how many were */
  const kl_node **at_step; /* per step */
  kl_memplan_stats mem;
  size_t mem_limit;       /* 0: none */
  kl_fusion fusion;       /* the groups, one kernel each */
  double passes_ms;       /* schedule, folding, fusion, memory plan */
  int *step_group;        /* per step: its group */
  bool *alias;            /* per node id: its output is its input's buffer */
  bool *folded;           /* per node id: computed now, from weights alone */
  kl_tensor **known;      /* per value id: weights and folded values, while placing */
  size_t dram_bytes;
  bool fusion_enabled;    /* not --no-fuse */
  /* the profiler's steps: those that launch something */
  int step_launches, nprofile, cap_profile;
  struct profile_step { char name[96]; int launches; size_t bytes; } *profile;
  /* GEMM epilogues: per GEMM node id, the bias and residual it adds, relu,
   * and the last node of the chain (whose output it writes); per node id,
   * an epilogue node whose output has no buffer (all but the last) */
  const kl_value **epi_bias, **epi_residual;
  bool *epi_relu, *epi_inner;
  const kl_node **epi_last;
  /* views.c: per node id, a movement node whose outputs are views read by
   * GEMMs, and a node with no kernel of its own (a transpose a GEMM writes
   * through, an epilogue node); per matmul node id, the transpose it
   * writes through (else NULL); per value id, how it is read */
  bool *view_node, *absorbed;
  /* attention (emit_attention.c): per node id, the first matmul of the
   * attention it belongs to (else NULL); at that matmul's id, the match */
  const kl_node **attn_head;
  kl_cg_attention *attn;
  /* per node id: a matmul computed inside an elementwise kernel, with the
   * elementwise work after it that cuBLASLt's epilogues cannot do */
  bool *direct;
  const kl_node **writes_into;
  kl_cg_view *view;
} cg_ctx;

static size_t value_bytes(const kl_value *v) {
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* ---- where values live ----------------------------------------------- */
/* A request for arena space, alive at no step until a node uses it. */
static int add_buf(cg_ctx *c, const char *name, size_t bytes) {
  if (c->nbufs == c->cap_bufs) {
    c->cap_bufs = c->cap_bufs ? 2 * c->cap_bufs : 64;
    c->bufs = realloc(c->bufs, (size_t)c->cap_bufs * sizeof *c->bufs);
    if (!c->bufs) abort();
  }
  char *copy = strdup(name);
  if (!copy) abort();
  c->bufs[c->nbufs] = (kl_membuf){copy, bytes, INT_MAX, -1, -1, 0};
  return c->nbufs++;
}

/* Buffer b is used at the current step. */
static void use_buf(cg_ctx *c, int b) {
  kl_membuf *m = &c->bufs[b];
  if (c->step < m->first) m->first = c->step;
  if (c->step > m->last) m->last = c->step;
}

static int add_param(cg_ctx *c, const kl_value *v, const kl_tensor *t) {
  size_t off = align_up(c->param_bytes), bytes = value_bytes(v);
  unsigned char *grown = realloc(c->params, off + bytes + 1);
  if (!grown) abort();
  c->params = grown;
  memset(c->params + c->param_bytes, 0, off - c->param_bytes);
  kl_tensor_to_raw(t, c->params + off);
  c->param_bytes = off + bytes;
  c->loc[v->id] = (location){LOC_PARAM, off, 0};
  return 0;
}

/* A node whose output can be its input's bytes: same element order and
 * width, and an output that need not be a buffer of its own. */
static bool is_alias(const cg_ctx *c, const kl_node *n) {
  if (n->op != KL_OP_RESHAPE && n->op != KL_OP_FLATTEN && n->op != KL_OP_SQUEEZE &&
      n->op != KL_OP_UNSQUEEZE)
    return false;
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  location l = c->loc[in->id];
  return c->loc[out->id].kind == LOC_NONE && l.kind != LOC_NONE && l.kind != LOC_VIEW &&
         kl_dtype_size(in->dtype) == kl_dtype_size(out->dtype) &&
         kl_shape_numel(&in->shape) == kl_shape_numel(&out->shape);
}

/* Constant folding: a node computed from weights and constants alone
 * (a causal mask, a scale) is evaluated at compile time by the
 * interpreter, and its result stored with the weights.  Small inputs only,
 * so compile time stays short, and no result larger than its inputs, so
 * the weights do not grow (an expand of a scalar stays a kernel). */
enum { FOLD_MAX_INPUT_ELEMENTS = 1 << 16 };

static void choose_folded(cg_ctx *c) {
  const kl_graph *g = c->g;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = c->order[i];
    if (!c->live[n->id]) continue;
    if (n->op == KL_OP_CONSTANT) {
      c->folded[n->id] = true;
      continue;
    }
    size_t in_bytes = 0, out_bytes = 0;
    int64_t elements = 0;
    bool fold = n->ninputs > 0;
    for (int k = 0; k < n->ninputs && fold; k++) {
      const kl_value *v = n->inputs[k];
      fold = v->kind == KL_VAL_PARAM || v->kind == KL_VAL_CONST ||
             (v->kind == KL_VAL_NODE && c->folded[v->producer->id]);
      in_bytes += value_bytes(v);
      elements += kl_shape_numel(&v->shape);
    }
    for (int k = 0; k < n->noutputs; k++) out_bytes += value_bytes(n->outputs[k]);
    c->folded[n->id] = fold && elements <= FOLD_MAX_INPUT_ELEMENTS && out_bytes <= in_bytes;
  }
}

/* ---- views: movement nodes that GEMMs read through (views.c) ----------- */
static bool is_float_matmul(const kl_node *n) {
  return n->op == KL_OP_MATMUL && kl_dtype_is_float(n->outputs[0]->dtype) &&
         n->inputs[0]->shape.rank >= 2 && n->inputs[1]->shape.rank >= 2;
}

/* The view of every value under the current choice of view nodes. */
static void compute_views(cg_ctx *c) {
  const kl_graph *g = c->g;
  for (int v = 0; v < g->values.len; v++) kl_cg_view_identity(g->values.items[v], &c->view[v]);
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = c->order[i];
    if (!c->view_node[n->id]) continue;
    for (int k = 0; k < n->noutputs; k++) {
      kl_cg_view out;
      if (kl_cg_view_apply(n, k, &c->view[n->inputs[0]->id], &out))
        c->view[n->outputs[k]->id] = out;
      else
        c->view_node[n->id] = false; /* a reshape across strides: a copy after all */
    }
  }
}

/* The matmul's result: its own buffer, the transpose it writes through,
 * or the last node of its epilogue. */
static void result_view(const cg_ctx *c, const kl_node *mm, kl_cg_view *out) {
  const kl_node *t = c->writes_into[mm->id];
  kl_cg_view_identity(c->epi_last[mm->id] ? c->epi_last[mm->id]->outputs[0] : mm->outputs[0], out);
  if (!t) return;
  /* out[i] = y[perm[i]]: y's dim perm[i] steps by the output's stride i */
  kl_cg_view tv;
  kl_cg_view_identity(t->outputs[0], &tv);
  const int64_t *perm;
  int r = out->shape.rank, np = kl_attr_ints(t, "perm", &perm);
  out->base = t->outputs[0];
  for (int i = 0; i < r; i++) {
    int64_t p = np == r ? perm[i] : r - 1 - i;
    if (p < 0) p += r;
    out->strides[p] = tv.strides[i];
  }
}

/* Does matmul mm take its operands and result as one GEMM call? */
static bool matmul_fits(const cg_ctx *c, const kl_node *mm) {
  kl_cg_view cv;
  kl_cg_mm_layout L;
  result_view(c, mm, &cv);
  return kl_cg_matmul_layout(&c->view[mm->inputs[0]->id], &c->view[mm->inputs[1]->id], &cv, &L);
}

/* Node n reads value v as a view: n is a view node itself, or a matmul
 * whose GEMM takes the view. */
static bool in_group(const cg_ctx *c, const kl_node *n) {
  return c->fusion.groups[c->fusion.group_of[n->id]].count > 1;
}

static bool reads_as_view(const cg_ctx *c, const kl_node *n) {
  return c->view_node[n->id] || (is_float_matmul(n) && !in_group(c, n) &&
                                 (c->attn_head[n->id] || matmul_fits(c, n)));
}

/* ---- GEMM epilogues ------------------------------------------------------
 * What cuBLASLt (and the host BLAS wrapper) compute inside the GEMM call:
 * act(A @ B + bias + residual).  A matmul takes the add of a row vector
 * (bias), the add of a tensor of its result's shape made before it
 * (residual) and a relu, in that order or with the adds swapped, while
 * each value in between has no other reader. */
static const kl_node *only_reader(const cg_ctx *c, const kl_value *v) {
  const kl_node *only = NULL;
  int count = 0;
  if (v->is_output) return NULL;
  for (int j = 0; j < c->g->nodes.len; j++) {
    const kl_node *r = c->order[j];
    if (!c->live[r->id] || c->folded[r->id]) continue;
    for (int q = 0; q < r->ninputs; q++)
      if (r->inputs[q] == v) only = r, count++;
  }
  return count == 1 ? only : NULL;
}

static const kl_node *only_reader_cb(void *ctx, const kl_value *v) { return only_reader(ctx, v); }

/* Attention: its nodes after the first matmul run in one kernel at the
 * second matmul's step, as a GEMM's epilogue does (and are pinned out of
 * other groups the same way). */
static void choose_attention(cg_ctx *c) {
  for (int i = 0; i < c->g->nodes.len; i++) {
    const kl_node *qk = c->order[i];
    kl_cg_attention a;
    if (!c->live[qk->id] || c->folded[qk->id] || c->attn_head[qk->id] ||
        !kl_cg_match_attention(qk, only_reader_cb, c, &a))
      continue;
    int extra = 0; /* the chains' inputs from outside, bounded by the kernel's arguments */
    for (int m = 0; m < a.npre; m++) extra += a.pre[m]->ninputs - 1;
    for (int m = 0; m < a.npost; m++) extra += a.post[m]->ninputs - 1;
    if (extra > KL_CG_MAX_FUSED_IO - 4) continue;
    const kl_node *inner[2 * KL_CG_MAX_CHAIN + 1];
    int n = 0;
    for (int m = 0; m < a.npre; m++) inner[n++] = a.pre[m];
    inner[n++] = a.softmax;
    for (int m = 0; m < a.npost; m++) inner[n++] = a.post[m];
    /* two score products added before one softmax: the first takes it,
     * the second stays a GEMM whose result the kernel reads */
    bool taken = c->attn_head[a.pv->id] || c->absorbed[a.pv->id];
    for (int m = 0; m < n; m++) taken |= c->attn_head[inner[m]->id] || c->absorbed[inner[m]->id];
    if (taken) continue;
    c->attn[qk->id] = a;
    for (int m = 0; m < n; m++) {
      c->attn_head[inner[m]->id] = qk;
      c->absorbed[inner[m]->id] = c->epi_inner[inner[m]->id] = true;
    }
    c->attn_head[qk->id] = c->attn_head[a.pv->id] = qk;
    c->absorbed[a.pv->id] = true;
    c->epi_last[qk->id] = a.pv;
  }
}

/* A matmul is direct when it is short (kl_cg_is_direct_matmul), reads
 * values that are no views, and after the bias, residual and relu that
 * cuBLASLt's epilogues take (single readers of its shape), its result goes
 * on to elementwise work they cannot do (a GELU, spelled out or not): with
 * cuBLAS that work would read the GEMM's result back from memory; in one
 * kernel the result never goes there. */
static bool fusible_in_rows(const kl_node *n);

static bool is_epilogue_op(const kl_node *n, const kl_value *cur) {
  return n->op == KL_OP_RELU ||
         (n->op == KL_OP_ADD && (n->inputs[0] == cur) != (n->inputs[1] == cur));
}

/* Do all of v's readers (one at least) fuse with it element for element
 * (none taken by an attention or a GEMM's epilogue)? */
static bool readers_fuse(const cg_ctx *c, const kl_value *v) {
  int count = 0;
  for (int j = 0; j < c->g->nodes.len; j++) {
    const kl_node *r = c->order[j];
    if (!c->live[r->id] || c->folded[r->id]) continue;
    for (int q = 0; q < r->ninputs; q++) {
      if (r->inputs[q] != v) continue;
      if (c->absorbed[r->id] || !fusible_in_rows(r) || r->noutputs != 1 ||
          !kl_shape_equal(&r->outputs[0]->shape, &v->shape))
        return false;
      count++;
    }
  }
  return count > 0;
}

static bool pays_direct(const cg_ctx *c, const kl_node *mm) {
  for (int k = 0; k < 2; k++) {
    const kl_node *p = mm->inputs[k]->producer;
    if (p && kl_cg_view_op(p)) return false;
  }
  const kl_value *cur = mm->outputs[0];
  for (;;) {
    const kl_node *r = only_reader(c, cur);
    if (!r || c->absorbed[r->id] || !is_epilogue_op(r, cur) ||
        !kl_shape_equal(&r->outputs[0]->shape, &cur->shape))
      return readers_fuse(c, cur);
    cur = r->outputs[0];
  }
}

/* Before the epilogues are chosen; then again (recheck) after, when one
 * may have taken a node a direct GEMM counted on: that GEMM goes back to
 * cuBLAS, and the next round of epilogues gives it its own.  Returns
 * whether a recheck sent one back. */
static bool choose_direct(cg_ctx *c, bool recheck) {
  bool changed = false;
  for (int i = 0; i < c->g->nodes.len; i++) {
    const kl_node *mm = c->order[i];
    if (recheck) {
      if (c->direct[mm->id] && !pays_direct(c, mm)) c->direct[mm->id] = false, changed = true;
    } else if (c->live[mm->id] && !c->folded[mm->id] && !c->attn_head[mm->id] &&
               kl_cg_is_direct_matmul(mm)) {
      c->direct[mm->id] = pays_direct(c, mm);
    }
  }
  return changed;
}

/* The GEMM whose epilogue ends at node n, or NULL. */
static const kl_node *epilogue_gemm(const cg_ctx *c, const kl_node *n) {
  if (!c->absorbed[n->id] || c->epi_inner[n->id] || n->op == KL_OP_TRANSPOSE) return NULL;
  for (int i = 0; i < c->g->nodes.len; i++)
    if (c->epi_last[c->order[i]->id] == n) return c->order[i];
  return NULL;
}

/* (The GEMM runs at the last node of its epilogue, so a residual made
 * anywhere before that is there.) */
static void choose_epilogues(cg_ctx *c) {
  const kl_graph *g = c->g;
  int nn = g->nodes.len;
  for (int i = 0; i < nn; i++) {
    const kl_node *mm = c->order[i];
    if (!c->live[mm->id] || c->folded[mm->id] || !is_float_matmul(mm) || c->attn_head[mm->id] ||
        c->direct[mm->id])
      continue;
    const kl_value *y = mm->outputs[0];
    int64_t n = y->shape.dims[y->shape.rank - 1];
    const kl_value *cur = y;
    for (;;) {
      const kl_node *r = only_reader(c, cur);
      /* (a node in another GEMM's chain already stays there: with two
       * GEMMs meeting in an add, the first to reach it takes it) */
      if (!r || c->absorbed[r->id] || r->outputs[0]->dtype != y->dtype ||
          !kl_shape_equal(&r->outputs[0]->shape, &y->shape))
        break;
      if (c->epi_relu[mm->id]) break; /* the activation comes last */
      if (r->op == KL_OP_RELU) {
        c->epi_relu[mm->id] = true;
      } else if (r->op == KL_OP_ADD && (r->inputs[0] == cur) != (r->inputs[1] == cur)) {
        const kl_value *other = r->inputs[r->inputs[0] == cur ? 1 : 0];
        bool row = kl_shape_numel(&other->shape) == n && other->shape.rank >= 1 &&
                   other->shape.dims[other->shape.rank - 1] == n;
        if (other->dtype != y->dtype) break;
        if (row && !c->epi_bias[mm->id] && other->shape.rank <= y->shape.rank)
          c->epi_bias[mm->id] = other;
        else if (kl_shape_equal(&other->shape, &y->shape) && !c->epi_residual[mm->id])
          c->epi_residual[mm->id] = other;
        else
          break;
      } else {
        break;
      }
      if (c->epi_last[mm->id]) c->epi_inner[c->epi_last[mm->id]->id] = true;
      c->epi_last[mm->id] = r;
      c->absorbed[r->id] = true;
      cur = r->outputs[0];
    }
  }
}

/* Start from every movement node a view, then drop those read by anything
 * that is not a view or a fitting GEMM, until nothing changes: what is left
 * is a set of chains from a stored value into GEMM operands.  Then let each
 * matmul whose one reader is a transpose write through it. */
static void choose_views(cg_ctx *c) {
  const kl_graph *g = c->g;
  int nn = g->nodes.len;
  for (int i = 0; i < nn; i++) {
    const kl_node *n = c->order[i];
    c->view_node[n->id] = c->live[n->id] && !c->folded[n->id] && kl_cg_view_op(n) &&
                          c->fusion.groups[c->fusion.group_of[n->id]].count == 1;
  }
  for (bool changed = true; changed;) {
    changed = false;
    compute_views(c);
    for (int i = 0; i < nn; i++) {
      const kl_node *n = c->order[i];
      if (!c->view_node[n->id]) continue;
      bool ok = true;
      for (int k = 0; k < n->noutputs && ok; k++) {
        const kl_value *o = n->outputs[k];
        int nreaders = 0;
        ok = !o->is_output;
        for (int j = 0; j < nn && ok; j++) {
          const kl_node *r = c->order[j];
          if (!c->live[r->id] || c->folded[r->id]) continue;
          for (int q = 0; q < r->ninputs && ok; q++)
            if (r->inputs[q] == o) ok = reads_as_view(c, r), nreaders++;
        }
        ok = ok && nreaders > 0;
      }
      if (!ok) c->view_node[n->id] = false, changed = true;
    }
  }
  /* matmul -> transpose: the GEMM writes the transposed result */
  for (int i = 0; i < nn; i++) {
    const kl_node *mm = c->order[i];
    if (!c->live[mm->id] || c->folded[mm->id] || !is_float_matmul(mm) || mm->outputs[0]->is_output ||
        in_group(c, mm))
      continue;
    const kl_node *only = NULL;
    int nreaders = 0;
    for (int j = 0; j < nn; j++) {
      const kl_node *r = c->order[j];
      if (!c->live[r->id] || c->folded[r->id]) continue;
      for (int q = 0; q < r->ninputs; q++)
        if (r->inputs[q] == mm->outputs[0]) only = r, nreaders++;
    }
    if (nreaders != 1 || only->op != KL_OP_TRANSPOSE || c->view_node[only->id] ||
        only->outputs[0]->dtype != mm->outputs[0]->dtype)
      continue;
    c->writes_into[mm->id] = only;
    if (c->attn_head[mm->id] || matmul_fits(c, mm)) c->absorbed[only->id] = true;
    else c->writes_into[mm->id] = NULL;
  }
  compute_views(c);
}

static int fold_node(cg_ctx *c, const kl_node *n) {
  kl_tensor *in[64] = {0}, *out[16] = {0};
  if (n->ninputs > 64 || n->noutputs > 16)
    return kl_fail(c->err, n->loc, "internal error: %s (node '%s') has too many operands to fold",
                   kl_ops[n->op].name, n->name);
  for (int k = 0; k < n->ninputs; k++) in[k] = c->known[n->inputs[k]->id];
  for (int k = 0; k < n->noutputs; k++)
    out[k] = kl_tensor_new(n->outputs[k]->dtype, &n->outputs[k]->shape);
  int rc = kl_ops[n->op].eval(n, in, out, c->err);
  for (int k = 0; k < n->noutputs; k++) {
    kl_tensor *t = out[k];
    if (!rc) {
      for (int64_t e = 0; e < t->numel; e++) t->data[e] = kl_dtype_round(t->dtype, t->data[e]);
      add_param(c, n->outputs[k], t);
      c->known[n->outputs[k]->id] = t;
    } else {
      kl_tensor_free(t);
    }
  }
  return rc;
}

static int place_values(cg_ctx *c) {
  const kl_graph *g = c->g;
  for (int i = 0; i < g->inputs.len; i++) c->loc[g->inputs.items[i]->id] = (location){LOC_INPUT, 0, i};
  /* A computed output is written straight into its buffer; one that is an
   * input, a weight or a constant is read back from where it lives. */
  for (int i = 0; i < g->outputs.len; i++) {
    const kl_value *v = g->outputs.items[i];
    if (v->kind == KL_VAL_NODE && !c->folded[v->producer->id])
      c->loc[v->id] = (location){LOC_OUTPUT, 0, i};
  }
  for (int i = 0; i < g->params.len; i++) {
    kl_tensor *t;
    const kl_value *v = g->params.items[i];
    if (kl_value_materialize(v, &t, c->err)) return -1;
    add_param(c, v, t);
    c->known[v->id] = t;
  }
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = c->order[i];
    if (!c->live[n->id]) continue;
    if (c->folded[n->id]) { /* evaluated now, stored with the weights */
      if (fold_node(c, n)) return -1;
      continue;
    }
    /* views and a matmul's result written through a transpose: no buffer */
    if (c->view_node[n->id]) {
      for (int k = 0; k < n->noutputs; k++) c->loc[n->outputs[k]->id] = (location){LOC_VIEW, 0, 0};
      continue;
    }
    if (c->writes_into[n->id] || c->epi_last[n->id] || c->epi_inner[n->id]) {
      c->loc[n->outputs[0]->id] = (location){LOC_VIEW, 0, 0};
      continue;
    }
    /* reshape & co renumber nothing: the output is the input's buffer
     * under another shape, and no kernel runs */
    if (is_alias(c, n)) {
      c->alias[n->id] = true;
      c->loc[n->outputs[0]->id] = c->loc[n->inputs[0]->id];
      continue;
    }
    /* an arena buffer each: plan_memory gives them offsets; a value that
     * stays inside its fused kernel needs none */
    bool fused = c->fusion.groups[c->fusion.group_of[n->id]].count > 1;
    for (int k = 0; k < n->noutputs; k++) {
      kl_value *v = n->outputs[k];
      if (c->loc[v->id].kind != LOC_NONE || (fused && !c->fusion.stored[v->id])) continue;
      c->loc[v->id] = (location){LOC_ARENA, 0, add_buf(c, v->name, value_bytes(v))};
    }
  }
  c->nvalue_bufs = c->nbufs;
  return 0;
}

/* Name of buffer b's offset in model.c, defined before run(). */
static const char *buf_macro(const cg_ctx *c, int b, char *buf, size_t len) {
  snprintf(buf, len, "%s_%d", b < c->nvalue_bufs ? "ARENA" : "SCRATCH", b);
  return buf;
}

/* C expression for a value's device pointer inside run(). */
static const char *ptr_expr(const cg_ctx *c, const kl_value *v, char *buf, size_t len) {
  const location *l = &c->loc[v->id];
  char name[32];
  switch (l->kind) {
  case LOC_PARAM: snprintf(buf, len, "(void *)(m->params + %zu)", l->offset); break;
  case LOC_ARENA:
    snprintf(buf, len, "(void *)(m->arena + %s)", buf_macro(c, l->index, name, sizeof name));
    break;
  case LOC_INPUT: snprintf(buf, len, "m->io[%d]", l->index); break;
  case LOC_OUTPUT: snprintf(buf, len, "m->io[%d]", c->g->inputs.len + l->index); break;
  default: snprintf(buf, len, "NULL"); break;
  }
  return buf;
}

static void ptr(FILE *f, const cg_ctx *c, const kl_value *v) {
  char buf[160];
  fputs(ptr_expr(c, v, buf, sizeof buf), f);
}

/* ---- the emitter: what templates write through ---------------------- */
struct kl_cg_emitter {
  cg_ctx *c;
  FILE *kf, *rf;
  int nkernels, ngemms;
  const kl_node *node;
};

FILE *kl_cg_kernels(kl_cg_emitter *e) { return e->kf; }
FILE *kl_cg_host(kl_cg_emitter *e) { return e->rf; }

int kl_cg_new_kernel(kl_cg_emitter *e, char *name, size_t len) {
  snprintf(name, len, "k%d", e->nkernels);
  return e->nkernels++;
}

/* A pointer asked for is a use: it keeps an arena value alive at this step. */
const char *kl_cg_ptr(kl_cg_emitter *e, const kl_value *v, char *buf, size_t len) {
  const location *l = &e->c->loc[v->id];
  if (l->kind == LOC_ARENA) use_buf(e->c, l->index);
  return ptr_expr(e->c, v, buf, len);
}

void kl_cg_read_view(kl_cg_emitter *e, const kl_value *v, kl_cg_view *out) {
  *out = e->c->view[v->id];
}

void kl_cg_write_view(kl_cg_emitter *e, const kl_node *n, kl_cg_view *out) {
  result_view(e->c, n, out);
}

const char *kl_cg_view_ptr(kl_cg_emitter *e, const kl_cg_view *v, char *buf, size_t len) {
  char base[160];
  kl_cg_ptr(e, v->base, base, sizeof base);
  if (!v->offset) snprintf(buf, len, "%s", base);
  else snprintf(buf, len, "(void *)((char *)%s + %lld)", base,
                (long long)(v->offset * (int64_t)kl_dtype_size(v->base->dtype)));
  return buf;
}

void kl_cg_gemm_epilogue(kl_cg_emitter *e, const kl_node *n, kl_cg_gemm *g, char bufs[2][160]) {
  cg_ctx *c = e->c;
  if (c->epi_bias[n->id]) {
    g->bias = kl_cg_ptr(e, c->epi_bias[n->id], bufs[0], 160);
    c->dram_bytes += value_bytes(c->epi_bias[n->id]);
  }
  if (c->epi_residual[n->id]) {
    g->c_in = kl_cg_ptr(e, c->epi_residual[n->id], bufs[1], 160);
    g->beta = 1;
    c->dram_bytes += value_bytes(c->epi_residual[n->id]);
  }
  g->relu = c->epi_relu[n->id];
}

void kl_cg_count_dram(kl_cg_emitter *e, size_t bytes) { e->c->dram_bytes += bytes; }

/* Scratch lives in the arena during its node's step only. */
const char *kl_cg_scratch(kl_cg_emitter *e, size_t bytes, char *buf, size_t len) {
  char what[300], name[32];
  snprintf(what, sizeof what, "scratch of %s", e->node ? e->node->name : "?");
  int b = add_buf(e->c, what, bytes);
  use_buf(e->c, b);
  snprintf(buf, len, "(void *)(m->arena + %s)", buf_macro(e->c, b, name, sizeof name));
  return buf;
}

void kl_cg_launch(kl_cg_emitter *e, int k, int64_t threads, const char *const *args, int nargs) {
  if (threads <= 0) return;
  int64_t blocks = (threads + BLOCK - 1) / BLOCK; /* grid-stride: capped */
  kl_cg_launch_grid(e, k, blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks, BLOCK, args, nargs);
}

void kl_cg_launch_node(kl_cg_emitter *e, int k, int64_t threads, const kl_node *n) {
  if (threads <= 0) return;
  int64_t blocks = (threads + BLOCK - 1) / BLOCK; /* grid-stride: capped */
  kl_cg_launch_node_grid(e, k, blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks, BLOCK, n);
}

void kl_cg_launch_grid(kl_cg_emitter *e, int k, int64_t grid_x, int block_x,
                       const char *const *args, int nargs) {
  if (grid_x <= 0) return;
  e->c->step_launches++;
  FILE *f = e->rf;
  fprintf(f, "  {\n");
  for (int i = 0; i < nargs; i++) fprintf(f, "    void *p%d = %s;\n", i, args[i]);
  fprintf(f, "    void *args[] = {");
  for (int i = 0; i < nargs; i++) fprintf(f, "%s&p%d", i ? ", " : "", i);
  fprintf(f, "};\n    if (krt_launch(m->mod, %d, (krt_dim3){%lld, 1, 1}, (krt_dim3){%d, 1, 1}, 0, args, "
             "err, errlen))\n      return -1;\n  }\n", k, (long long)grid_x, block_x);
}

void kl_cg_launch_node_grid(kl_cg_emitter *e, int k, int64_t grid_x, int block_x,
                            const kl_node *n) {
  char bufs[65][160];
  const char *args[65];
  int na = 0;
  for (int i = 0; i < n->ninputs && na < 64; i++, na++)
    args[na] = kl_cg_ptr(e, n->inputs[i], bufs[na], sizeof bufs[na]);
  args[na] = kl_cg_ptr(e, n->outputs[0], bufs[na], sizeof bufs[na]);
  na++;
  kl_cg_launch_grid(e, k, grid_x, block_x, args, na);
}

void kl_cg_emit_gemm(kl_cg_emitter *e, const kl_cg_gemm *g) {
  fprintf(e->rf, "  {\n    krt_gemm_desc d = {.dtype = (krt_dtype)%d, .trans_a = %d, .trans_b = %d,\n"
                 "      .m = %lld, .n = %lld, .k = %lld, .batch = %lld,\n"
                 "      .a = %s, .lda = %lld, .stride_a = %lld,\n"
                 "      .b = %s, .ldb = %lld, .stride_b = %lld,\n"
                 "      .c = %s, .ldc = %lld, .stride_c = %lld, .alpha = %.17g, .beta = %.17g",
          (int)g->dtype, g->trans_a, g->trans_b, (long long)g->m, (long long)g->n, (long long)g->k,
          (long long)g->batch, g->a, (long long)g->lda, (long long)g->stride_a, g->b,
          (long long)g->ldb, (long long)g->stride_b, g->c, (long long)g->ldc,
          (long long)g->stride_c, g->alpha, g->beta);
  if (g->batch2 > 1) /* an outer batch at strides *_2: one call per item on a GPU */
    e->c->nlaunches += (int)g->batch2 - 1;
  e->c->step_launches += g->batch2 > 1 ? (int)g->batch2 : 1;
  if (g->batch2 > 1)
    fprintf(e->rf, ",\n      .batch2 = %lld, .stride_a2 = %lld, .stride_b2 = %lld, .stride_c2 = %lld",
            (long long)g->batch2, (long long)g->stride_a2, (long long)g->stride_b2,
            (long long)g->stride_c2);
  if (g->c_in) fprintf(e->rf, ",\n      .c_in = %s", g->c_in);
  if (g->bias) fprintf(e->rf, ",\n      .bias = %s", g->bias);
  if (g->relu) fprintf(e->rf, ",\n      .relu = 1");
  fprintf(e->rf, "};\n    if (krt_gemm(m->dev, &d, err, errlen)) return -1;\n  }\n");
  e->ngemms++;
}

int kl_cg_fail(kl_cg_emitter *e, const kl_node *n, const char *fmt, ...) {
  char body[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  return kl_fail(e->c->err, n->loc, "%s (node '%s'): %s", kl_ops[n->op].name, n->name, body);
}

void kl_cg_comment(kl_cg_emitter *e, const kl_node *n) {
  char shape[160];
  const kl_value *o = n->outputs[0];
  kl_shape_str(&o->shape, shape, sizeof shape);
  fprintf(e->kf, "/* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name, kl_dtype_name(o->dtype), shape);
  fprintf(e->rf, "  /* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name, kl_dtype_name(o->dtype), shape);
}

static const kl_cg_template *const families[] = {kl_cg_templates_basic, kl_cg_templates_movement,
                                                 kl_cg_templates_nn, kl_cg_templates_sample,
                                                 kl_cg_templates_integer};

static const kl_cg_template *find_template(const kl_node *n) {
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    for (const kl_cg_template *t = families[f]; t->handles; t++)
      if (t->handles(n)) return t;
  return NULL;
}

static void io_table(FILE *f, const char *name, const kl_value *const *vals, int n) {
  fprintf(f, "static const krt_io_desc %s[] = {\n", name);
  for (int i = 0; i < n; i++) {
    fprintf(f, "  {\"%s\", (krt_dtype)%d, %d, {", vals[i]->name, (int)vals[i]->dtype,
            vals[i]->shape.rank);
    for (int d = 0; d < vals[i]->shape.rank; d++)
      fprintf(f, "%s%lld", d ? ", " : "", (long long)vals[i]->shape.dims[d]);
    fprintf(f, "}},\n");
  }
  if (!n) fprintf(f, "  {0}\n");
  fprintf(f, "};\n");
}

/* ---- the memory plan ---------------------------------------------------- */
/* A node's arena inputs and outputs are alive at its step, whether or not
 * its template asks for their pointers. */
static void use_node_values(cg_ctx *c, const kl_node *n) {
  for (int k = 0; k < n->ninputs; k++)
    if (c->loc[n->inputs[k]->id].kind == LOC_ARENA) use_buf(c, c->loc[n->inputs[k]->id].index);
  for (int k = 0; k < n->noutputs; k++)
    if (c->loc[n->outputs[k]->id].kind == LOC_ARENA) use_buf(c, c->loc[n->outputs[k]->id].index);
}

/* Nodes whose one kernel reads element i of an input, then writes element
 * i of the output, and nothing else: the output may overwrite that input.
 * (Their kernels declare the pointers __restrict__; that stays sound since
 * each element is read before it is written, by the same thread.) */
static bool runs_in_place(const kl_node *n) {
  if (kl_cg_is_elementwise(n)) return true;
  return n->op == KL_OP_RESHAPE || n->op == KL_OP_FLATTEN || n->op == KL_OP_SQUEEZE ||
         n->op == KL_OP_UNSQUEEZE;
}

/* Does a convolution of the group read arena buffer b (under any name:
 * a reshape is the same buffer)?  Then no output may overwrite it. */
static bool window_buffer(const cg_ctx *c, const kl_cg_fused_args *io, int b) {
  for (int k = 0; k < io->nin; k++)
    if (io->window_read[k] && c->loc[io->in[k]->id].kind == LOC_ARENA &&
        c->loc[io->in[k]->id].index == b)
      return true;
  return false;
}

/* Let an output take the buffer of an input its kernel is the last to
 * read, when they match element for element (no broadcast, same width):
 * such a node's output, or the one output of a fused group.  An input's
 * buffer goes to one output at most. */
static void choose_in_place(cg_ctx *c) {
  bool *taken = calloc((size_t)c->nbufs + 1, sizeof *taken);
  if (!taken) abort();
  for (int s = 0; s < c->nsteps; s++) {
    const kl_group *gr = &c->fusion.groups[c->step_group[s]];
    kl_node *const *members = c->fusion.nodes + gr->first;
    kl_cg_fused_args io;
    if (gr->count == 1) {
      const kl_node *n = members[0];
      if (n->noutputs != 1 || !runs_in_place(n)) continue;
      io.nin = io.nout = 0;
      for (int k = 0; k < n->ninputs && k < KL_CG_MAX_FUSED_IO; k++) io.in[io.nin++] = n->inputs[k];
      io.out[io.nout++] = n->outputs[0];
    } else {
      kl_cg_fused_io(members, gr->count, c->fusion.stored, &io);
      /* The kernel's pointers are __restrict__, so the compiler may move a
       * load past a store to another pointer.  With one output, every load
       * feeds that store and must come first; with more, an input loaded
       * for a later output could be read after an earlier output took its
       * place. */
      if (io.nout != 1) continue;
    }
    for (int o = 0; o < io.nout; o++) {
      const location *lo = &c->loc[io.out[o]->id];
      if (lo->kind != LOC_ARENA) continue;
      /* a row kernel's lane 0 writes a row's scalars while other lanes may
       * still read that row's inputs: only its row values go in place */
      if (gr->kind == KL_GROUP_ROWS && !kl_shape_equal(&io.out[o]->shape, &gr->shape)) continue;
      kl_membuf *out = &c->bufs[lo->index];
      int64_t numel = kl_shape_numel(&io.out[o]->shape);
      for (int k = 0; k < io.nin && out->inplace_of < 0; k++) {
        const kl_value *in = io.in[k];
        const location *li = &c->loc[in->id];
        if (li->kind != LOC_ARENA || li->index >= lo->index || taken[li->index] ||
            (gr->count > 1 && window_buffer(c, &io, li->index)) ||
            kl_shape_numel(&in->shape) != numel ||
            kl_dtype_size(in->dtype) != kl_dtype_size(io.out[o]->dtype) || !out->bytes)
          continue;
        const kl_membuf *b = &c->bufs[li->index];
        if (b->last == s && b->first < s && out->first == s) {
          out->inplace_of = li->index;
          taken[li->index] = true;
        }
      }
    }
  }
  free(taken);
}

static int plan_memory(cg_ctx *c) {
  choose_in_place(c);
  const char **step_names = malloc(((size_t)c->nsteps + 1) * sizeof *step_names);
  if (!step_names) abort();
  for (int s = 0; s < c->nsteps; s++) step_names[s] = c->at_step[s]->name;
  int rc = kl_cg_plan_memory(c->bufs, c->nbufs, step_names, c->nsteps, c->mem_limit, &c->mem,
                             c->err);
  free(step_names);
  c->arena_bytes = c->mem.arena;
  return rc;
}

/* The offsets of the plan, for run(). */
static void write_offsets(FILE *f, const cg_ctx *c) {
  fprintf(f, "/* The memory plan: arena offsets (bytes, live steps), %zu bytes in all; the\n"
             " * most alive at one step is %zu, every buffer apart would take %zu. */\n",
          c->mem.arena, c->mem.lower_bound, c->mem.naive);
  for (int b = 0; b < c->nbufs; b++) {
    const kl_membuf *m = &c->bufs[b];
    char name[32];
    fprintf(f, "#define %s ((size_t)%zu) /* ", buf_macro(c, b, name, sizeof name), m->offset);
    for (const char *p = m->name; *p; p++) /* a name must not end the comment */
      if (*p != '\n' && !(p[0] == '*' && p[1] == '/')) fputc(*p, f);
    fprintf(f, ": %zu bytes, steps %d-%d", m->bytes, m->first, m->last);
    if (m->inplace_of >= 0) fprintf(f, ", in place of %s", buf_macro(c, m->inplace_of, name, sizeof name));
    fprintf(f, " */\n");
  }
  fprintf(f, "\n");
}

/* Nodes an elementwise kernel can take together: those with a scalar
 * expression, except integer division and the like, whose kernels raise
 * an error flag of their own. */
static bool fusible_in_rows(const kl_node *n) {
  return kl_cg_is_elementwise(n) && !kl_cg_traps_zero_divisor(n);
}

/* ... and, in elementwise kernels, inference batch_norm too: a per-channel
 * scale and shift (conv -> batch_norm -> relu becomes GEMM + one kernel). */
static bool fusible_elementwise(const kl_node *n) {
  return fusible_in_rows(n) || kl_cg_is_channel_affine(n) || kl_cg_is_direct_conv(n);
}

/* A group of two or more nodes: one elementwise or row kernel. */
static void emit_fused_group(kl_cg_emitter *e, const kl_group *gr, kl_node *const *members,
                             int count) {
  cg_ctx *c = e->c;
  kl_cg_fused_args io;
  kl_cg_fused_io(members, count, c->fusion.stored, &io);
  char name[32], bufs[2 * KL_CG_MAX_FUSED_IO][160], shape[160];
  const char *args[2 * KL_CG_MAX_FUSED_IO];
  int k = kl_cg_new_kernel(e, name, sizeof name), na = 0;
  kl_cg_grid grid = {0, 0};
  if (gr->kind == KL_GROUP_ROWS)
    grid = kl_cg_fused_rows(e->kf, name, members, count, &gr->shape, gr->row_axes, &io);
  else kl_cg_fused_elementwise(e->kf, name, members, count, &io);
  const kl_shape *s = &gr->shape;
  fprintf(e->rf, "  /* fused: %d nodes, %s .. %s -> %s */\n", count, members[0]->name,
          members[count - 1]->name, kl_shape_str(s, shape, sizeof shape));
  for (int i = 0; i < io.nin; i++, na++) {
    args[na] = kl_cg_ptr(e, io.in[i], bufs[na], sizeof bufs[na]);
    c->dram_bytes += value_bytes(io.in[i]);
  }
  for (int i = 0; i < io.nout; i++, na++) {
    args[na] = kl_cg_ptr(e, io.out[i], bufs[na], sizeof bufs[na]);
    c->dram_bytes += value_bytes(io.out[i]);
  }
  if (grid.threads) kl_cg_launch_grid(e, k, grid.blocks, grid.threads, args, na);
  else kl_cg_launch(e, k, kl_shape_numel(s), args, na);
}

/* An attention (emit_attention.c) at its second matmul's step: the
 * chains' inputs, then the bases of Q, K and V; the output's base. */
static void emit_attention(kl_cg_emitter *e, const kl_cg_attention *a) {
  cg_ctx *c = e->c;
  kl_cg_fused_args io;
  memset(&io, 0, sizeof io);
  kl_node *chain[2 * KL_CG_MAX_CHAIN];
  int n = 0;
  for (int m = 0; m < a->npre; m++) chain[n++] = a->pre[m];
  for (int m = 0; m < a->npost; m++) chain[n++] = a->post[m];
  for (int m = 0; m < n; m++)
    for (int i = 0; i < chain[m]->ninputs; i++) {
      const kl_value *v = chain[m]->inputs[i];
      if (v->producer && c->attn_head[v->producer->id] == a->qk) continue; /* made inside */
      int k = 0;
      while (k < io.nin && io.in[k] != v) k++;
      if (k == io.nin) io.in[io.nin++] = v, c->dram_bytes += value_bytes(v);
    }
  kl_cg_view q, k, v, out;
  kl_cg_read_view(e, a->qk->inputs[0], &q);
  kl_cg_read_view(e, a->qk->inputs[1], &k);
  kl_cg_read_view(e, a->pv->inputs[1], &v);
  kl_cg_write_view(e, a->pv, &out);
  io.in[io.nin++] = q.base, io.in[io.nin++] = k.base, io.in[io.nin++] = v.base;
  io.out[io.nout++] = out.base;
  c->dram_bytes += value_bytes(a->qk->inputs[0]) + value_bytes(a->qk->inputs[1]) +
                   value_bytes(a->pv->inputs[1]) + value_bytes(a->pv->outputs[0]);
  char name[32], bufs[KL_CG_MAX_FUSED_IO + 1][160];
  const char *args[KL_CG_MAX_FUSED_IO + 1];
  int kn = kl_cg_new_kernel(e, name, sizeof name), na = 0;
  kl_cg_grid grid = kl_cg_attention_kernel(e->kf, name, a, &q, &k, &v, &out, &io);
  fprintf(e->rf, "  /* attention: %s .. %s in one kernel */\n", a->qk->name, a->pv->name);
  for (int i = 0; i < io.nin; i++, na++) args[na] = kl_cg_ptr(e, io.in[i], bufs[na], sizeof bufs[na]);
  args[na] = kl_cg_ptr(e, io.out[0], bufs[na], sizeof bufs[na]);
  na++;
  kl_cg_launch_grid(e, kn, grid.blocks, grid.threads, args, na);
}

/* A step the profiler times: a name a C string can hold as it is. */
static void profile_step(cg_ctx *c, const kl_group *gr, kl_node *const *members, int launches,
                         size_t bytes) {
  if (c->nprofile == c->cap_profile) {
    c->cap_profile = c->cap_profile ? 2 * c->cap_profile : 32;
    c->profile = realloc(c->profile, (size_t)c->cap_profile * sizeof *c->profile);
    if (!c->profile) abort();
  }
  struct profile_step *p = &c->profile[c->nprofile++];
  const kl_node *last = members[gr->count - 1];
  if (gr->count > 1)
    snprintf(p->name, sizeof p->name, "fused %d: %s .. %s", gr->count, members[0]->name, last->name);
  else if (epilogue_gemm(c, last))
    snprintf(p->name, sizeof p->name, "%s: %s .. %s",
             c->attn_head[last->id] ? "attention" : "gemm+epilogue", epilogue_gemm(c, last)->name,
             last->name);
  else
    snprintf(p->name, sizeof p->name, "%s: %s", kl_ops[last->op].name, last->name);
  for (char *q = p->name; *q; q++)
    if (*q == '"' || *q == '\\' || *q == '?' || (unsigned char)*q < 32) *q = '_';
  p->launches = launches;
  p->bytes = bytes;
}

static int write_all(cg_ctx *c, const char *prefix, kl_codegen_result *out) {
  const kl_graph *g = c->g;
  size_t klen, mlen, hlen;
  FILE *kf = open_memstream(&out->kernels_cu, &klen);
  FILE *mf = open_memstream(&out->model_c, &mlen);
  FILE *hf = open_memstream(&out->model_h, &hlen);
  if (!kf || !mf || !hf) abort();
  fprintf(kf, "/* kernels.cu - generated by kiln for model '%s'; CUDA C for NVRTC and, through\n"
              " * runtime/emu, for the host compiler. */\n#include \"kiln_prelude.h\"\n\n", g->name);
  /* run() first into a buffer: it numbers the kernels as it goes */
  char *run_text;
  size_t run_len;
  kl_cg_emitter e = {.c = c, .kf = kf};
  FILE *run_f = open_memstream(&run_text, &run_len);
  int rc = 0;
  /* one step per group: a node's own template, or one fused kernel; each
   * step's text goes through a buffer of its own, so that the steps that
   * launch something can be marked for the profiler */
  for (int gi = 0; gi < c->fusion.ngroups && !rc; gi++) {
    char *step_text = NULL;
    size_t step_len = 0;
    e.rf = open_memstream(&step_text, &step_len);
    int launches0 = c->step_launches;
    size_t bytes0 = c->dram_bytes;
    const kl_group *gr = &c->fusion.groups[gi];
    kl_node *const *members = c->fusion.nodes + gr->first;
    e.node = members[gr->count - 1];
    c->at_step[c->step] = e.node;
    c->step_group[c->step] = gi;
    for (int m = 0; m < gr->count; m++) use_node_values(c, members[m]);
    const kl_node *gemm = gr->count == 1 ? epilogue_gemm(c, members[0]) : NULL;
    if (gr->count == 1 && c->epi_last[members[0]->id]) {
      /* the GEMM runs at its epilogue's last node, when all it adds exists */
      fprintf(e.rf, "  /* %s: %s, with its epilogue at %s */\n", members[0]->name,
              kl_ops[members[0]->op].name, c->epi_last[members[0]->id]->name);
    } else if (gemm && c->attn_head[gemm->id]) {
      emit_attention(&e, &c->attn[gemm->id]);
    } else if (gemm) {
      const kl_node *n = gemm;
      e.node = n;
      for (int k = 0; k < n->ninputs; k++) c->dram_bytes += value_bytes(n->inputs[k]);
      c->dram_bytes += value_bytes(members[0]->outputs[0]);
      rc = find_template(n)->emit(&e, n);
    } else if (gr->count == 1 && (c->alias[members[0]->id] || c->view_node[members[0]->id] ||
                                  c->absorbed[members[0]->id])) {
      const kl_node *n = members[0];
      char shape[160];
      fprintf(e.rf, "  /* %s: %s -> %s, %s: no kernel */\n", n->name, kl_ops[n->op].name,
              kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape),
              c->alias[n->id]          ? "the input's buffer"
              : c->view_node[n->id]    ? "a view its GEMMs read through"
              : n->op == KL_OP_TRANSPOSE ? "written there by its input's GEMM"
                                       : "in the epilogue of the GEMM before it");
    } else if (gr->count == 1 && !fusible_in_rows(members[0]) &&
               !(c->fusion_enabled && kl_cg_is_direct_conv(members[0]))) {
      const kl_node *n = members[0];
      for (int k = 0; k < n->ninputs; k++) c->dram_bytes += value_bytes(n->inputs[k]);
      for (int k = 0; k < n->noutputs; k++) c->dram_bytes += value_bytes(n->outputs[k]);
      rc = find_template(n)->emit(&e, n);
    } else { /* a group, or one elementwise node: the same generator */
      emit_fused_group(&e, gr, members, gr->count);
    }
    fclose(e.rf);
    if (c->step_launches > launches0) {
      profile_step(c, gr, members, c->step_launches - launches0, c->dram_bytes - bytes0);
      fprintf(run_f, "  if (krt_mark(m->dev, %d, err, errlen)) return -1;\n", c->nprofile - 1);
    }
    fwrite(step_text, 1, step_len, run_f);
    free(step_text);
    c->step++;
  }
  c->nsteps = c->step;
  fprintf(run_f, "  if (krt_mark(m->dev, %d, err, errlen)) return -1;\n", c->nprofile);
  fclose(run_f);
  /* every launch and GEMM call of run() */
  for (const char *p = run_text; p && (p = strstr(p, "krt_launch(")); p++) c->nlaunches++;
  for (const char *p = run_text; p && (p = strstr(p, "krt_gemm(")); p++) c->nlaunches++;
  double t0 = krt_now_ms();
  if (!rc) rc = plan_memory(c);
  c->passes_ms += krt_now_ms() - t0;
  int kernel = e.nkernels;
  c->nkernels = e.nkernels;
  c->ngemms = e.ngemms;
  if (rc) {
    free(run_text);
    fclose(kf);
    fclose(mf);
    fclose(hf);
    return -1;
  }

  fprintf(hf, "/* model.h - generated by kiln: the compiled model '%s'. */\n#ifndef KILN_MODEL_%s_H\n"
              "#define KILN_MODEL_%s_H\n#include \"kilnrt.h\"\n\n", g->name, prefix, prefix);
  fprintf(hf, "#define %s_ARENA_BYTES %zu /* intermediates, one allocation */\n", prefix, c->arena_bytes);
  fprintf(hf, "#define %s_PARAM_BYTES %zu /* weights and constants */\n", prefix, c->param_bytes);
  fprintf(hf, "#define %s_NUM_INPUTS %d\n#define %s_NUM_OUTPUTS %d\n\n", prefix, g->inputs.len, prefix,
          g->outputs.len);
  /* default visibility: a static library hides everything else, so that
   * two compiled models link into one program */
  fprintf(hf, "/* Inputs, outputs, sizes and create/run/destroy. */\n"
              "__attribute__((visibility(\"default\"))) const krt_model_api *kiln_model_%s(void);\n"
              "\n#endif\n", prefix);

  fprintf(mf, "/* model.c - generated by kiln: host code of model '%s'.  Build it with\n"
              " * -DKILN_HOST_KERNELS to run kernels.cu on the host device. */\n"
              "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include \"model.h\"\n\n", g->name);
  fprintf(mf, "#ifdef KILN_HOST_KERNELS\n");
  for (int k = 0; k < kernel; k++) fprintf(mf, "extern const krt_host_kernel k%d__emu;\n", k);
  fprintf(mf, "#define HOST_ENTRY(k) (&k##__emu)\n#else\n#define HOST_ENTRY(k) NULL\n#endif\n\n");
  /* GPU images (cubins per architecture and PTX), compiled by NVRTC from
   * kernels.cu, come in gpu_images.c when kiln compile wrote one. */
  fprintf(mf, "#ifdef KILN_GPU_IMAGES\nextern const krt_cubin kiln_cubins[];\nextern const int kiln_ncubins;\n"
              "extern const char kiln_ptx[];\n#define CUBINS kiln_cubins, kiln_ncubins, kiln_ptx\n#else\n"
              "#define CUBINS NULL, 0, NULL\n#endif\n\n");
  fprintf(mf, "static const krt_kernel_desc kernels[] = {\n");
  for (int k = 0; k < kernel; k++) fprintf(mf, "  {\"k%d\", HOST_ENTRY(k%d)},\n", k, k);
  if (!kernel) fprintf(mf, "  {NULL, NULL},\n");
  fprintf(mf, "};\n\n");
  /* The weights are not C text (megabytes of it would take the C compiler
   * longer than everything else): they sit in weights.bin beside this file
   * and the assembler includes them as they are. */
  fprintf(mf, "/* weights and constants, %zu bytes, from weights.bin */\n#ifndef KILN_WEIGHTS_FILE\n"
              "#define KILN_WEIGHTS_FILE \"weights.bin\"\n#endif\n"
              "__asm__(\".section .rodata\\n.balign 64\\nkiln_weights_%s:\\n.incbin \\\"\" KILN_WEIGHTS_FILE "
              "\"\\\"\\n.byte 0\\n.previous\\n\");\n"
              "extern const unsigned char kiln_weights_%s[];\n#define params_blob kiln_weights_%s\n\n",
          c->param_bytes, prefix, prefix, prefix);
  io_table(mf, "inputs", (const kl_value *const *)g->inputs.items, g->inputs.len);
  io_table(mf, "outputs", (const kl_value *const *)g->outputs.items, g->outputs.len);
  int nio = g->inputs.len + g->outputs.len;
  fprintf(mf, "\ntypedef struct {\n  krt_device *dev;\n  krt_module *mod;\n  char *arena, *params;\n"
              "  void *io[%d];\n} model;\n\n", nio ? nio : 1);
  fprintf(mf, "static size_t io_bytes(const krt_io_desc *d) {\n  size_t n = krt_dtype_size(d->dtype);\n"
              "  for (int i = 0; i < d->rank; i++) n *= (size_t)d->dims[i];\n  return n;\n}\n\n");
  fprintf(mf, "static void destroy(void *self) {\n  model *m = self;\n  if (!m) return;\n"
              "  for (int i = 0; i < %d; i++) krt_free(m->dev, m->io[i]);\n"
              "  krt_free(m->dev, m->arena);\n  krt_free(m->dev, m->params);\n  krt_module_unload(m->mod);\n"
              "  free(m);\n}\n\n", nio);
  fprintf(mf, "static int create(krt_device *dev, void **out, char *err, size_t errlen) {\n"
              "  model *m = calloc(1, sizeof *m);\n  if (!m) return -1;\n  m->dev = dev;\n"
              "  krt_module_desc md = {kernels, %d, CUBINS};\n"
              "  if ((%d && krt_module_load(dev, &md, &m->mod, err, errlen)) ||\n"
              "      krt_malloc(dev, %zu, (void **)&m->arena, err, errlen) ||\n"
              "      krt_malloc(dev, %zu, (void **)&m->params, err, errlen) ||\n"
              "      krt_upload(dev, m->params, params_blob, %zu, err, errlen)) {\n"
              "    destroy(m);\n    return -1;\n  }\n", kernel, kernel, c->arena_bytes ? c->arena_bytes : 1,
          c->param_bytes ? c->param_bytes : 1, c->param_bytes);
  fprintf(mf, "  for (int i = 0; i < %d; i++) {\n"
              "    const krt_io_desc *d = i < %d ? &inputs[i] : &outputs[i - %d];\n"
              "    if (krt_malloc(dev, io_bytes(d) ? io_bytes(d) : 1, &m->io[i], err, errlen)) {\n"
              "      destroy(m);\n      return -1;\n    }\n  }\n  *out = m;\n  return 0;\n}\n\n",
          nio, g->inputs.len, g->inputs.len);
  write_offsets(mf, c);
  fprintf(mf, "static int run(void *self, const void *const *in, void *const *out, char *err, size_t errlen) {\n"
              "  model *m = self;\n"
              "  for (int i = 0; i < %d; i++)\n"
              "    if (krt_upload(m->dev, m->io[i], in[i], io_bytes(&inputs[i]), err, errlen)) return -1;\n",
          g->inputs.len);
  fwrite(run_text, 1, run_len, mf);
  free(run_text);
  fprintf(mf, "  if (krt_synchronize(m->dev, err, errlen)) return -1;\n");
  for (int i = 0; i < g->outputs.len; i++) {
    fprintf(mf, "  if (krt_download(m->dev, out[%d], ", i);
    ptr(mf, c, g->outputs.items[i]);
    fprintf(mf, ", io_bytes(&outputs[%d]), err, errlen)) return -1;\n", i);
  }
  fprintf(mf, "  return 0;\n}\n\n");
  fprintf(mf, "/* The steps run() marks for the profiler (kernels and GEMM calls, est. DRAM bytes). */\n"
              "static const krt_step_info steps[] = {\n");
  for (int i = 0; i < c->nprofile; i++)
    fprintf(mf, "  {\"%s\", %d, %zu},\n", c->profile[i].name, c->profile[i].launches,
            c->profile[i].bytes);
  if (!c->nprofile) fprintf(mf, "  {\"\", 0, 0}\n");
  fprintf(mf, "};\n\n");
  fprintf(mf, "static const krt_model_api api = {\"%s\", %d, %d, inputs, outputs, %zu, %zu, %d,\n"
              "                                  create, run, destroy, %d, steps};\n\n"
              "const krt_model_api *kiln_model_%s(void) { return &api; }\n"
              "/* The entry `kiln run` looks up in the shared object. */\n"
              "#ifndef KILN_NO_GENERIC_ENTRY\n"
              "const krt_model_api *kiln_model(void);\n"
              "const krt_model_api *kiln_model(void) { return &api; }\n#endif\n",
          g->name, g->inputs.len, g->outputs.len, c->arena_bytes, c->param_bytes, kernel,
          c->nprofile, prefix);
  fclose(kf);
  fclose(mf);
  fclose(hf);
  return 0;
}

/* n zeroed elements and one more (n may be 0); out of memory aborts, as
 * everywhere in the compiler. */
static void *zalloc(size_t n, size_t size) {
  void *p = calloc(n + 1, size);
  if (!p) abort();
  return p;
}

int kl_codegen(const kl_graph *g, const kl_codegen_options *opt, kl_codegen_result *out,
               kl_error *err) {
  memset(out, 0, sizeof *out);
  cg_ctx c = {.g = g, .err = err, .mem_limit = opt ? opt->mem_limit : 0};
  int nn = g->nodes.len, rc = 0;
  c.loc = zalloc((size_t)g->values.len, sizeof *c.loc);
  c.order = zalloc((size_t)nn, sizeof *c.order);
  c.live = zalloc((size_t)nn, sizeof *c.live);
  c.at_step = zalloc((size_t)nn, sizeof *c.at_step);
  c.step_group = zalloc((size_t)nn, sizeof *c.step_group);
  c.alias = zalloc((size_t)nn, sizeof *c.alias);
  c.folded = zalloc((size_t)nn, sizeof *c.folded);
  c.known = zalloc((size_t)g->values.len, sizeof *c.known);
  c.view_node = zalloc((size_t)nn, sizeof *c.view_node);
  c.absorbed = zalloc((size_t)nn, sizeof *c.absorbed);
  c.writes_into = zalloc((size_t)nn, sizeof *c.writes_into);
  c.view = zalloc((size_t)g->values.len, sizeof *c.view);
  c.epi_bias = zalloc((size_t)nn, sizeof *c.epi_bias);
  c.epi_residual = zalloc((size_t)nn, sizeof *c.epi_residual);
  c.epi_relu = zalloc((size_t)nn, sizeof *c.epi_relu);
  c.epi_inner = zalloc((size_t)nn, sizeof *c.epi_inner);
  c.epi_last = zalloc((size_t)nn, sizeof *c.epi_last);
  c.attn_head = zalloc((size_t)nn, sizeof *c.attn_head);
  c.attn = zalloc((size_t)nn, sizeof *c.attn);
  c.direct = zalloc((size_t)nn, sizeof *c.direct);
  double t0 = krt_now_ms();
  if ((rc = kl_schedule(g, c.order, err))) goto done;
  c.passes_ms = krt_now_ms() - t0;
  for (int i = 0; i < g->outputs.len; i++)
    if (g->outputs.items[i]->producer) c.live[g->outputs.items[i]->producer->id] = true;
  for (int i = nn - 1; i >= 0; i--)
    if (c.live[c.order[i]->id])
      for (int k = 0; k < c.order[i]->ninputs; k++)
        if (c.order[i]->inputs[k]->producer) c.live[c.order[i]->inputs[k]->producer->id] = true;
  t0 = krt_now_ms();
  choose_folded(&c);
  c.passes_ms += krt_now_ms() - t0;
  /* Every op without a template, at once. */
  char msg[900];
  size_t used = 0;
  int missing = 0;
  for (int i = 0; i < nn; i++) {
    const kl_node *n = c.order[i];
    if (!c.live[n->id] || c.folded[n->id] || find_template(n)) continue;
    if (missing++ < 12 && used < sizeof msg - 160)
      used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s (node '%s')",
                               missing > 1 ? ", " : "", kl_ops[n->op].name, n->name);
  }
  if (missing) {
    rc = kl_fail(err, (kl_loc){0}, "%d node%s cannot be compiled yet: %s%s", missing,
                 missing == 1 ? "" : "s", msg, missing > 12 ? ", ..." : "");
    err->unsupported = true;
    goto done;
  }
  /* the groups: elementwise nodes fuse unless --no-fuse */
  kl_node **todo = calloc((size_t)nn + 1, sizeof *todo);
  int ntodo = 0;
  if (!todo) abort();
  for (int i = 0; i < nn; i++)
    if (c.live[c.order[i]->id] && !c.folded[c.order[i]->id]) todo[ntodo++] = c.order[i];
  kl_fusion_options fo = {.enabled = !(opt && opt->no_fuse), .max_group_nodes = 16,
                          .elementwise = fusible_elementwise, .row_kind = kl_cg_row_kind,
                          .row_axes = kl_cg_row_axes,
                          .row_elementwise = fusible_in_rows,
                          .reads_window = kl_cg_is_direct_conv};
  c.fusion_enabled = fo.enabled;
  /* GEMM epilogues: their nodes stay out of other groups */
  if (fo.enabled) {
    choose_attention(&c);
    choose_direct(&c, false);
    /* until no GEMM goes back to cuBLAS (each round sends one back at
     * least, so this ends; a GEMM that has its epilogue keeps it) */
    do choose_epilogues(&c);
    while (choose_direct(&c, true));
    fo.direct = c.direct;
    fo.pinned = c.absorbed;
  }
  t0 = krt_now_ms();
  int fuse_rc = kl_fuse(g, todo, ntodo, &fo, &c.fusion);
  c.passes_ms += krt_now_ms() - t0;
  free(todo);
  if (fuse_rc) {
    rc = kl_fail(err, (kl_loc){0}, "internal error: the fusion groups form a cycle");
    goto done;
  }
  /* views fold movement into GEMMs: fusion too, off with --no-fuse */
  t0 = krt_now_ms();
  if (fo.enabled) choose_views(&c);
  else compute_views(&c);
  c.passes_ms += krt_now_ms() - t0;
  if ((rc = place_values(&c))) goto done;
  rc = write_all(&c, opt && opt->prefix ? opt->prefix : "model", out);
  out->nkernels = c.nkernels;
  out->ngemms = c.ngemms;
  out->nlaunches = c.nlaunches;
  out->passes_ms = c.passes_ms;
  out->dram_bytes = c.dram_bytes;
  out->ngroups = c.fusion.ngroups;
  out->node_group = malloc(((size_t)nn + 1) * sizeof *out->node_group);
  out->group_kind = malloc(((size_t)c.fusion.ngroups + 1) * sizeof *out->group_kind);
  if (!out->node_group || !out->group_kind) abort();
  for (int i = 0; i < nn; i++) {
    int gi = c.fusion.group_of[i];
    out->node_group[i] = gi >= 0 && !c.alias[i] && !c.view_node[i] && !c.absorbed[i] ? gi : -1;
  }
  for (int gi = 0; gi < c.fusion.ngroups; gi++) out->group_kind[gi] = c.fusion.groups[gi].kind;
  for (int gi = 0; gi < c.fusion.ngroups; gi++)
    if (c.fusion.groups[gi].count > 1) out->nfused_nodes += c.fusion.groups[gi].count;
  out->arena_bytes = c.arena_bytes;
  out->arena_lower_bound = c.mem.lower_bound;
  out->naive_bytes = c.mem.naive;
  out->param_bytes = c.param_bytes;
  out->params = c.params;
  c.params = NULL;
  /* the plan, for pictures and reports: it owns the names from here */
  out->membufs = c.bufs;
  out->nmembufs = c.nbufs;
  out->nvalue_membufs = c.nvalue_bufs;
  c.bufs = NULL;
  out->nsteps = c.nsteps;
  out->peak_step = c.mem.peak_step;
  out->step_names = calloc((size_t)c.nsteps + 1, sizeof *out->step_names);
  if (!out->step_names) abort();
  for (int s = 0; s < c.nsteps; s++)
    if (!(out->step_names[s] = strdup(c.at_step[s]->name))) abort();
done:
  free(c.loc);
  free(c.order);
  free(c.live);
  free(c.at_step);
  free(c.step_group);
  free(c.alias);
  free(c.folded);
  free(c.view_node);
  free(c.absorbed);
  free(c.writes_into);
  free(c.view);
  free(c.epi_bias);
  free(c.epi_residual);
  free(c.epi_relu);
  free(c.epi_inner);
  free(c.epi_last);
  free(c.attn_head);
  free(c.attn);
  free(c.direct);
  free(c.profile);
  for (int v = 0; v < g->values.len; v++) kl_tensor_free(c.known[v]);
  free(c.known);
  kl_fusion_free(&c.fusion);
  free(c.params);
  for (int b = 0; b < c.nbufs && c.bufs; b++) free((char *)c.bufs[b].name);
  free(c.bufs);
  if (rc) kl_codegen_result_free(out);
  return rc;
}

void kl_codegen_result_free(kl_codegen_result *r) {
  free(r->node_group);
  free(r->group_kind);
  r->node_group = NULL;
  r->group_kind = NULL;
  free(r->params);
  r->params = NULL;
  for (int b = 0; b < r->nmembufs; b++) free((char *)r->membufs[b].name);
  free(r->membufs);
  r->membufs = NULL;
  r->nmembufs = 0;
  for (int s = 0; s < r->nsteps && r->step_names; s++) free(r->step_names[s]);
  free(r->step_names);
  r->step_names = NULL;
  r->nsteps = 0;
  free(r->kernels_cu);
  free(r->model_c);
  free(r->model_h);
  r->kernels_cu = r->model_c = r->model_h = NULL;
}
