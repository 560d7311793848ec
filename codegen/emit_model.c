/* emit_model.c - the text of one plan (passes/pipeline.c): a kernel or
 * GEMM call per step, the weights blob, and the host code and header
 * around them.  Every decision (groups, GEMMs, views, where each value
 * lives) is the plan's; this file only writes it out, and checks that every
 * pointer a template asks for is one the memory plan made room for. */
#include <limits.h>
#include <stdarg.h>
#include "../runtime/kilnrt.h"
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

enum { BLOCK = 256, MAX_BLOCKS = 4096 };


typedef struct {
  const kl_graph *g;
  const kl_plan *p;       /* the passes' decisions: groups, GEMMs, views */
  kl_error *err;
  unsigned char *params;
  int nkernels, ngemms, nlaunches;
  int step;               /* the step being written */
  int next_scratch;       /* the step's next scratch buffer */
  char plan_error[400];   /* a pointer asked for outside the memory plan */
  size_t dram_bytes;
  /* the profiler's steps: those that launch something */
  int step_launches, nprofile, cap_profile;
  struct profile_step { char name[96]; int launches; size_t bytes; } *profile;
} cg_ctx;

static size_t value_bytes(const kl_value *v) {
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}


/* n zeroed elements and one more (n may be 0); out of memory aborts, as
 * everywhere in the compiler. */
static void *zalloc(size_t n, size_t size) {
  void *p = calloc(n + 1, size);
  if (!p) abort();
  return p;
}

/* ---- the weights blob ------------------------------------------------ */
/* Weights, constants and folded values at the offsets the memory pass
 * gave them. */
static int write_params(cg_ctx *c) {
  const kl_plan *p = c->p;
  const kl_graph *g = c->g;
  c->params = calloc(p->param_bytes + 1, 1);
  if (!c->params) abort();
  for (int i = 0; i < g->params.len; i++) {
    kl_tensor *t;
    const kl_value *v = g->params.items[i];
    if (kl_value_materialize(v, &t, c->err)) return -1;
    kl_tensor_to_raw(t, c->params + p->loc[v->id].offset);
    kl_tensor_free(t);
  }
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    for (int k = 0; p->live[n->id] && p->folded[n->id] && k < n->noutputs; k++)
      kl_tensor_to_raw(p->known[n->outputs[k]->id], c->params + p->loc[n->outputs[k]->id].offset);
  }
  return 0;
}

/* Name of buffer b's offset in model.c, defined before run(). */
static const char *buf_macro(const cg_ctx *c, int b, char *buf, size_t len) {
  snprintf(buf, len, "%s_%d", b < c->p->nvalue_bufs ? "ARENA" : "SCRATCH", b);
  return buf;
}

/* C expression for a value's device pointer inside run(). */
static const char *ptr_expr(const cg_ctx *c, const kl_value *v, char *buf, size_t len) {
  const kl_location *l = &c->p->loc[v->id];
  char name[32];
  switch (l->kind) {
  case KL_LOC_PARAM: snprintf(buf, len, "(void *)(m->params + %zu)", l->offset); break;
  case KL_LOC_ARENA:
    snprintf(buf, len, "(void *)(m->arena + %s)", buf_macro(c, l->index, name, sizeof name));
    break;
  case KL_LOC_INPUT: snprintf(buf, len, "m->io[%d]", l->index); break;
  case KL_LOC_OUTPUT: snprintf(buf, len, "m->io[%d]", c->g->inputs.len + l->index); break;
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

/* The memory pass declared what each step touches; a pointer outside it
 * would be a buffer another value may hold: an internal error, loudly. */
const char *kl_cg_ptr(kl_cg_emitter *e, const kl_value *v, char *buf, size_t len) {
  cg_ctx *c = e->c;
  const kl_location *l = &c->p->loc[v->id];
  if (l->kind == KL_LOC_ARENA) {
    const kl_membuf *m = &c->p->bufs[l->index];
    if ((m->first > c->step || m->last < c->step) && !c->plan_error[0])
      snprintf(c->plan_error, sizeof c->plan_error,
               "internal error: step %d reads '%s', which the memory plan keeps for steps %d-%d",
               c->step, v->name, m->first, m->last);
  }
  return ptr_expr(c, v, buf, len);
}

void kl_cg_read_view(kl_cg_emitter *e, const kl_value *v, kl_view *out) {
  *out = e->c->p->view[v->id];
}

void kl_cg_write_view(kl_cg_emitter *e, const kl_node *n, kl_view *out) {
  kl_plan_result_view(e->c->p, n, out);
}

const char *kl_cg_view_ptr(kl_cg_emitter *e, const kl_view *v, char *buf, size_t len) {
  char base[160];
  kl_cg_ptr(e, v->base, base, sizeof base);
  if (!v->offset) snprintf(buf, len, "%s", base);
  else snprintf(buf, len, "(void *)((char *)%s + %lld)", base,
                (long long)(v->offset * (int64_t)kl_dtype_size(v->base->dtype)));
  return buf;
}

void kl_cg_gemm_epilogue(kl_cg_emitter *e, const kl_node *n, kl_cg_gemm *g, char bufs[2][160]) {
  cg_ctx *c = e->c;
  if (c->p->epi_bias[n->id]) {
    g->bias = kl_cg_ptr(e, c->p->epi_bias[n->id], bufs[0], 160);
    c->dram_bytes += value_bytes(c->p->epi_bias[n->id]);
  }
  if (c->p->epi_residual[n->id]) {
    g->c_in = kl_cg_ptr(e, c->p->epi_residual[n->id], bufs[1], 160);
    g->beta = 1;
    c->dram_bytes += value_bytes(c->p->epi_residual[n->id]);
  }
  g->relu = c->p->epi_relu[n->id];
}

void kl_cg_count_dram(kl_cg_emitter *e, size_t bytes) { e->c->dram_bytes += bytes; }

/* Scratch lives in the arena during its node's step only: the next of
 * the buffers the template declared (kl_cg_template.scratch). */
const char *kl_cg_scratch(kl_cg_emitter *e, size_t bytes, char *buf, size_t len) {
  cg_ctx *c = e->c;
  char name[32];
  int b = c->next_scratch++;
  if ((b >= c->p->scratch_at[c->step + 1] || c->p->bufs[b].bytes != bytes) && !c->plan_error[0])
    snprintf(c->plan_error, sizeof c->plan_error,
             "internal error: %s asks for %zu bytes of scratch its template did not declare",
             e->node ? e->node->name : "?", bytes);
  snprintf(buf, len, "(void *)(m->arena + %s)", buf_macro(c, b, name, sizeof name));
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
  fprintf(f, "};\n    if (krt_launch(m->mod, %d, (kl_dim3){%lld, 1, 1}, (kl_dim3){%d, 1, 1}, 0, args, "
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

const kl_cg_template *kl_cg_find_template(const kl_node *n) {
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

/* The offsets of the plan, for run(). */
static void write_offsets(FILE *f, const cg_ctx *c) {
  fprintf(f, "/* The memory plan: arena offsets (bytes, live steps), %zu bytes in all; the\n"
             " * most alive at one step is %zu, every buffer apart would take %zu. */\n",
          c->p->mem.arena, c->p->mem.lower_bound, c->p->mem.naive);
  for (int b = 0; b < c->p->nbufs; b++) {
    const kl_membuf *m = &c->p->bufs[b];
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

/* A group of two or more nodes: one elementwise or row kernel. */
static void emit_fused_group(kl_cg_emitter *e, const kl_group *gr, kl_node *const *members,
                             int count) {
  cg_ctx *c = e->c;
  kl_group_io io;
  kl_group_io_of(members, count, c->p->fusion.stored, &io);
  char name[32], bufs[2 * KL_MAX_GROUP_IO][160], shape[160];
  const char *args[2 * KL_MAX_GROUP_IO];
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
static void emit_attention(kl_cg_emitter *e, const kl_attention *a) {
  cg_ctx *c = e->c;
  kl_group_io io;
  memset(&io, 0, sizeof io);
  kl_node *chain[2 * KL_MAX_CHAIN];
  int n = 0;
  for (int m = 0; m < a->npre; m++) chain[n++] = a->pre[m];
  for (int m = 0; m < a->npost; m++) chain[n++] = a->post[m];
  for (int m = 0; m < n; m++)
    for (int i = 0; i < chain[m]->ninputs; i++) {
      const kl_value *v = chain[m]->inputs[i];
      if (v->producer && c->p->attn_head[v->producer->id] == a->qk) continue; /* made inside */
      int k = 0;
      while (k < io.nin && io.in[k] != v) k++;
      if (k == io.nin) io.in[io.nin++] = v, c->dram_bytes += value_bytes(v);
    }
  kl_view q, k, v, out;
  kl_cg_read_view(e, a->qk->inputs[0], &q);
  kl_cg_read_view(e, a->qk->inputs[1], &k);
  kl_cg_read_view(e, a->pv->inputs[1], &v);
  kl_cg_write_view(e, a->pv, &out);
  io.in[io.nin++] = q.base, io.in[io.nin++] = k.base, io.in[io.nin++] = v.base;
  io.out[io.nout++] = out.base;
  c->dram_bytes += value_bytes(a->qk->inputs[0]) + value_bytes(a->qk->inputs[1]) +
                   value_bytes(a->pv->inputs[1]) + value_bytes(a->pv->outputs[0]);
  char name[32], bufs[KL_MAX_GROUP_IO + 1][160];
  const char *args[KL_MAX_GROUP_IO + 1];
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
  else if (kl_plan_epilogue_gemm(c->p, last))
    snprintf(p->name, sizeof p->name, "%s: %s .. %s",
             c->p->attn_head[last->id] ? "attention" : "gemm+epilogue", kl_plan_epilogue_gemm(c->p, last)->name,
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
  for (int gi = 0; gi < c->p->fusion.ngroups && !rc; gi++) {
    char *step_text = NULL;
    size_t step_len = 0;
    e.rf = open_memstream(&step_text, &step_len);
    int launches0 = c->step_launches;
    size_t bytes0 = c->dram_bytes;
    const kl_group *gr = &c->p->fusion.groups[gi];
    kl_node *const *members = c->p->fusion.nodes + gr->first;
    e.node = members[gr->count - 1];
    c->step = gi;
    c->next_scratch = c->p->scratch_at[gi];
    const kl_node *n = members[0], *gemm = gr->count == 1 ? kl_plan_epilogue_gemm(c->p, n) : NULL;
    char shape[160];
    switch (kl_plan_step_kind(c->p, gi)) {
    case KL_STEP_NONE:
      if (c->p->epi_last[n->id]) /* the GEMM runs at its epilogue's last node, when all it adds exists */
        fprintf(e.rf, "  /* %s: %s, with its epilogue at %s */\n", n->name, kl_ops[n->op].name,
                c->p->epi_last[n->id]->name);
      else
        fprintf(e.rf, "  /* %s: %s -> %s, %s: no kernel */\n", n->name, kl_ops[n->op].name,
                kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape),
                c->p->alias[n->id]         ? "the input's buffer"
                : c->p->view_node[n->id]   ? "a view its GEMMs read through"
                : n->op == KL_OP_TRANSPOSE ? "written there by its input's GEMM"
                                           : "in the epilogue of the GEMM before it");
      break;
    case KL_STEP_ATTENTION: emit_attention(&e, &c->p->attn[gemm->id]); break;
    case KL_STEP_GEMM:
    case KL_STEP_NODE:
      if (gemm) { /* the GEMM, at its epilogue's last node: it writes that node's output */
        e.node = gemm;
        for (int k = 0; k < gemm->ninputs; k++) c->dram_bytes += value_bytes(gemm->inputs[k]);
        c->dram_bytes += value_bytes(n->outputs[0]);
        n = gemm;
      } else {
        for (int k = 0; k < n->ninputs; k++) c->dram_bytes += value_bytes(n->inputs[k]);
        for (int k = 0; k < n->noutputs; k++) c->dram_bytes += value_bytes(n->outputs[k]);
      }
      rc = kl_cg_find_template(n)->emit(&e, n);
      break;
    default: /* a group, or one elementwise node: the same generator */
      emit_fused_group(&e, gr, members, gr->count);
      break;
    }
    if (!rc && c->plan_error[0]) rc = kl_fail(c->err, (kl_loc){0}, "%s", c->plan_error);
    fclose(e.rf);
    if (c->step_launches > launches0) {
      profile_step(c, gr, members, c->step_launches - launches0, c->dram_bytes - bytes0);
      fprintf(run_f, "  if (krt_mark(m->dev, %d, err, errlen)) return -1;\n", c->nprofile - 1);
    }
    fwrite(step_text, 1, step_len, run_f);
    free(step_text);
  }
  fprintf(run_f, "  if (krt_mark(m->dev, %d, err, errlen)) return -1;\n", c->nprofile);
  fclose(run_f);
  /* every launch and GEMM call of run() */
  for (const char *p = run_text; p && (p = strstr(p, "krt_launch(")); p++) c->nlaunches++;
  for (const char *p = run_text; p && (p = strstr(p, "krt_gemm(")); p++) c->nlaunches++;
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
  fprintf(hf, "#define %s_ARENA_BYTES %zu /* intermediates, one allocation */\n", prefix, c->p->mem.arena);
  fprintf(hf, "#define %s_PARAM_BYTES %zu /* weights and constants */\n", prefix, c->p->param_bytes);
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
  for (int k = 0; k < kernel; k++) fprintf(mf, "extern const kl_emu_kernel k%d__emu;\n", k);
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
          c->p->param_bytes, prefix, prefix, prefix);
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
              "    destroy(m);\n    return -1;\n  }\n", kernel, kernel, c->p->mem.arena ? c->p->mem.arena : 1,
          c->p->param_bytes ? c->p->param_bytes : 1, c->p->param_bytes);
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
          g->name, g->inputs.len, g->outputs.len, c->p->mem.arena, c->p->param_bytes, kernel,
          c->nprofile, prefix);
  fclose(kf);
  fclose(mf);
  fclose(hf);
  return 0;
}


int kl_codegen(const kl_plan *p, const kl_codegen_options *opt, kl_codegen_result *out,
               kl_error *err) {
  memset(out, 0, sizeof *out);
  const kl_graph *g = p->g;
  cg_ctx c = {.g = g, .p = p, .err = err};
  int nn = g->nodes.len, rc = 0;
  /* Every op without a template, at once. */
  char msg[900];
  size_t used = 0;
  int missing = 0;
  for (int i = 0; i < nn; i++) {
    const kl_node *n = p->order[i];
    if (!p->live[n->id] || p->folded[n->id] || kl_cg_find_template(n)) continue;
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
  if ((rc = write_params(&c)) || (rc = write_all(&c, opt && opt->prefix ? opt->prefix : "model", out)))
    goto done;
  out->nkernels = c.nkernels;
  out->ngemms = c.ngemms;
  out->nlaunches = c.nlaunches;
  out->passes_ms = p->passes_ms;
  out->dram_bytes = c.dram_bytes;
  int ng = p->fusion.ngroups;
  out->ngroups = ng;
  out->node_group = zalloc((size_t)nn, sizeof *out->node_group);
  out->group_kind = zalloc((size_t)ng, sizeof *out->group_kind);
  for (int i = 0; i < nn; i++) {
    int gi = p->fusion.group_of[i];
    out->node_group[i] = gi >= 0 && !p->alias[i] && !p->view_node[i] && !p->absorbed[i] ? gi : -1;
  }
  for (int gi = 0; gi < ng; gi++) out->group_kind[gi] = p->fusion.groups[gi].kind;
  for (int gi = 0; gi < ng; gi++)
    if (p->fusion.groups[gi].count > 1) out->nfused_nodes += p->fusion.groups[gi].count;
  out->arena_bytes = p->mem.arena;
  out->arena_lower_bound = p->mem.lower_bound;
  out->naive_bytes = p->mem.naive;
  out->param_bytes = p->param_bytes;
  out->params = c.params;
  c.params = NULL;
  /* the memory plan, for pictures and reports: a copy that outlives the plan */
  out->membufs = zalloc((size_t)p->nbufs, sizeof *out->membufs);
  for (int b = 0; b < p->nbufs; b++) {
    out->membufs[b] = p->bufs[b];
    if (!(out->membufs[b].name = strdup(p->bufs[b].name))) abort();
  }
  out->nmembufs = p->nbufs;
  out->nvalue_membufs = p->nvalue_bufs;
  out->nsteps = ng;
  out->peak_step = p->mem.peak_step;
  out->step_names = zalloc((size_t)ng, sizeof *out->step_names);
  for (int s = 0; s < ng; s++)
    if (!(out->step_names[s] = strdup(kl_plan_step_node(p, s)->name))) abort();
done:
  free(c.profile);
  free(c.params);
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
