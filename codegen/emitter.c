/* emitter.c - what templates write through: fresh kernels, launches,
 * GEMM calls, pointers into the plan's buffers (each checked against the
 * memory plan's live ranges), views and scratch, and the template tables. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

enum { BLOCK = 256, MAX_BLOCKS = 4096 };

/* Name of buffer b's offset in model.c, defined before run(). */
const char *kl_cg_buf_macro(const kl_cg_ctx *c, int b, char *buf, size_t len) {
  snprintf(buf, len, "%s_%d", b < c->p->nvalue_bufs ? "ARENA" : "SCRATCH", b);
  return buf;
}

/* C expression for a value's device pointer inside run(). */
const char *kl_cg_ptr_expr(const kl_cg_ctx *c, const kl_value *v, char *buf, size_t len) {
  const kl_location *l = &c->p->loc[v->id];
  char name[32];
  switch (l->kind) {
  case KL_LOC_PARAM: snprintf(buf, len, "(void *)(m->params + %zu)", l->offset); break;
  case KL_LOC_ARENA:
    if (l->offset)
      snprintf(buf, len, "(void *)(m->arena + %s + %zu)", kl_cg_buf_macro(c, l->index, name, sizeof name),
               l->offset);
    else
      snprintf(buf, len, "(void *)(m->arena + %s)", kl_cg_buf_macro(c, l->index, name, sizeof name));
    break;
  case KL_LOC_INPUT: snprintf(buf, len, "m->io[%d]", l->index); break;
  case KL_LOC_OUTPUT:
    if (l->offset)
      snprintf(buf, len, "(void *)((char *)m->io[%d] + %zu)", c->g->inputs.len + l->index, l->offset);
    else
      snprintf(buf, len, "m->io[%d]", c->g->inputs.len + l->index);
    break;
  default: snprintf(buf, len, "NULL"); break;
  }
  return buf;
}

FILE *kl_cg_kernels(kl_cg_emitter *e) { return e->kf; }
FILE *kl_cg_host(kl_cg_emitter *e) { return e->rf; }

int kl_cg_new_kernel(kl_cg_emitter *e, char *name, size_t len) {
  snprintf(name, len, "k%d", e->nkernels);
  return e->nkernels++;
}

/* The memory pass declared what each step touches; a pointer outside it
 * would be a buffer another value may hold: an internal error, loudly. */
const char *kl_cg_ptr(kl_cg_emitter *e, const kl_value *v, char *buf, size_t len) {
  kl_cg_ctx *c = e->c;
  const kl_location *l = &c->p->loc[v->id];
  if (l->kind == KL_LOC_ARENA) {
    const kl_membuf *m = &c->p->bufs[l->index];
    if ((m->first > c->step || m->last < c->step) && !c->plan_error[0])
      snprintf(c->plan_error, sizeof c->plan_error,
               "internal error: step %d reads '%s', which the memory plan keeps for steps %d-%d",
               c->step, v->name, m->first, m->last);
  }
  return kl_cg_ptr_expr(c, v, buf, len);
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
  kl_cg_ctx *c = e->c;
  if (c->p->epi_bias[n->id]) {
    g->bias = kl_cg_ptr(e, c->p->epi_bias[n->id], bufs[0], 160);
    c->dram_bytes += kl_cg_value_bytes(c->p->epi_bias[n->id]);
  }
  if (c->p->epi_residual[n->id]) {
    g->c_in = kl_cg_ptr(e, c->p->epi_residual[n->id], bufs[1], 160);
    g->beta = 1;
    c->dram_bytes += kl_cg_value_bytes(c->p->epi_residual[n->id]);
  }
  g->relu = c->p->epi_relu[n->id];
}

void kl_cg_count_dram(kl_cg_emitter *e, size_t bytes) { e->c->dram_bytes += bytes; }

/* Scratch lives in the arena during its node's step only: the next of
 * the buffers the template declared (kl_cg_template.scratch). */
const char *kl_cg_scratch(kl_cg_emitter *e, size_t bytes, char *buf, size_t len) {
  kl_cg_ctx *c = e->c;
  char name[32];
  int b = c->next_scratch++;
  if ((b >= c->p->scratch_at[c->step + 1] || c->p->bufs[b].bytes != bytes) && !c->plan_error[0])
    snprintf(c->plan_error, sizeof c->plan_error,
             "internal error: %s asks for %zu bytes of scratch its template did not declare",
             e->node ? e->node->name : "?", bytes);
  snprintf(buf, len, "(void *)(m->arena + %s)", kl_cg_buf_macro(c, b, name, sizeof name));
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
  /* where the profiler's mark of this launch goes (emit_model.c) */
  fprintf(f, "  /*@mark k%d 1*/\n  {\n", k);
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
  fprintf(e->rf, "  /*@mark gemm %lld*/\n", (long long)(g->batch2 > 1 ? g->batch2 : 1));
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
                                                 kl_cg_templates_integer, kl_cg_templates_train};

const kl_cg_template *kl_cg_find_template(const kl_node *n) {
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    for (const kl_cg_template *t = families[f]; t->handles; t++)
      if (t->handles(n)) return t;
  return NULL;
}
