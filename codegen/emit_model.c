/* emit_model.c - the whole of code generation for one graph: decide where
 * every value lives (weights blob, one arena for intermediates, input and
 * output buffers), write one kernel or GEMM call per node, and the host code
 * and header around them. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

enum { ALIGN = 256, BLOCK = 256, MAX_BLOCKS = 4096 };

typedef enum { LOC_NONE, LOC_PARAM, LOC_ARENA, LOC_INPUT, LOC_OUTPUT } loc_kind;
typedef struct {
  loc_kind kind;
  size_t offset; /* PARAM, ARENA */
  int index;     /* INPUT, OUTPUT */
} location;


typedef struct {
  const kl_graph *g;
  kl_error *err;
  location *loc;      /* per value id */
  unsigned char *params;
  size_t param_bytes, arena_bytes;
  kl_node **order;
  bool *live;
  int nkernels, ngemms;
} cg_ctx;

static size_t value_bytes(const kl_value *v) {
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* ---- where values live ----------------------------------------------- */
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

static int place_values(cg_ctx *c) {
  const kl_graph *g = c->g;
  for (int i = 0; i < g->inputs.len; i++) c->loc[g->inputs.items[i]->id] = (location){LOC_INPUT, 0, i};
  /* A computed output is written straight into its buffer; one that is an
   * input, a weight or a constant is read back from where it lives. */
  for (int i = 0; i < g->outputs.len; i++) {
    const kl_value *v = g->outputs.items[i];
    if (v->kind == KL_VAL_NODE && v->producer->op != KL_OP_CONSTANT)
      c->loc[v->id] = (location){LOC_OUTPUT, 0, i};
  }
  for (int i = 0; i < g->params.len; i++) {
    kl_tensor *t;
    const kl_value *v = g->params.items[i];
    if (kl_value_materialize(v, &t, c->err)) return -1;
    add_param(c, v, t);
    kl_tensor_free(t);
  }
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = c->order[i];
    if (!c->live[n->id]) continue;
    if (n->op == KL_OP_CONSTANT) { /* evaluated now, stored with the weights */
      kl_tensor *t = kl_tensor_new(n->outputs[0]->dtype, &n->outputs[0]->shape);
      if (kl_ops[n->op].eval(n, NULL, &t, c->err)) { kl_tensor_free(t); return -1; }
      for (int64_t k = 0; k < t->numel; k++) t->data[k] = kl_dtype_round(t->dtype, t->data[k]);
      add_param(c, n->outputs[0], t);
      kl_tensor_free(t);
      continue;
    }
    /* One slot each, for now: memory planning (a later issue) will reuse
     * the space of values that are no longer alive. */
    for (int k = 0; k < n->noutputs; k++) {
      kl_value *v = n->outputs[k];
      if (c->loc[v->id].kind != LOC_NONE) continue;
      size_t off = align_up(c->arena_bytes);
      c->loc[v->id] = (location){LOC_ARENA, off, 0};
      c->arena_bytes = off + value_bytes(v);
    }
  }
  return 0;
}

/* C expression for a value's device pointer inside run(). */
static void ptr(FILE *f, const cg_ctx *c, const kl_value *v) {
  const location *l = &c->loc[v->id];
  switch (l->kind) {
  case LOC_PARAM: fprintf(f, "(void *)(m->params + %zu)", l->offset); break;
  case LOC_ARENA: fprintf(f, "(void *)(m->arena + %zu)", l->offset); break;
  case LOC_INPUT: fprintf(f, "m->io[%d]", l->index); break;
  case LOC_OUTPUT: fprintf(f, "m->io[%d]", c->g->inputs.len + l->index); break;
  default: fprintf(f, "NULL"); break;
  }
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

const char *kl_cg_ptr(kl_cg_emitter *e, const kl_value *v, char *buf, size_t len) {
  const location *l = &e->c->loc[v->id];
  switch (l->kind) {
  case LOC_PARAM: snprintf(buf, len, "(void *)(m->params + %zu)", l->offset); break;
  case LOC_ARENA: snprintf(buf, len, "(void *)(m->arena + %zu)", l->offset); break;
  case LOC_INPUT: snprintf(buf, len, "m->io[%d]", l->index); break;
  case LOC_OUTPUT: snprintf(buf, len, "m->io[%d]", e->c->g->inputs.len + l->index); break;
  default: snprintf(buf, len, "NULL"); break;
  }
  return buf;
}

/* Scratch is appended to the arena: one region per request for now (the
 * memory planner will overlap them). */
const char *kl_cg_scratch(kl_cg_emitter *e, size_t bytes, char *buf, size_t len) {
  size_t off = align_up(e->c->arena_bytes);
  e->c->arena_bytes = off + bytes;
  snprintf(buf, len, "(void *)(m->arena + %zu)", off);
  return buf;
}

void kl_cg_launch(kl_cg_emitter *e, int k, int64_t threads, const char *const *args, int nargs) {
  if (threads <= 0) return;
  int64_t blocks = (threads + BLOCK - 1) / BLOCK;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  FILE *f = e->rf;
  fprintf(f, "  {\n");
  for (int i = 0; i < nargs; i++) fprintf(f, "    void *p%d = %s;\n", i, args[i]);
  fprintf(f, "    void *args[] = {");
  for (int i = 0; i < nargs; i++) fprintf(f, "%s&p%d", i ? ", " : "", i);
  fprintf(f, "};\n    if (krt_launch(m->mod, %d, (kl_dim3){%lld, 1, 1}, (kl_dim3){%d, 1, 1}, 0, args, "
             "err, errlen))\n      return -1;\n  }\n", k, (long long)blocks, BLOCK);
}

void kl_cg_launch_node(kl_cg_emitter *e, int k, int64_t threads, const kl_node *n) {
  char bufs[65][160];
  const char *args[65];
  int na = 0;
  for (int i = 0; i < n->ninputs && na < 64; i++, na++)
    args[na] = kl_cg_ptr(e, n->inputs[i], bufs[na], sizeof bufs[na]);
  args[na] = kl_cg_ptr(e, n->outputs[0], bufs[na], sizeof bufs[na]);
  na++;
  kl_cg_launch(e, k, threads, args, na);
}

void kl_cg_emit_gemm(kl_cg_emitter *e, const kl_cg_gemm *g) {
  fprintf(e->rf, "  {\n    krt_gemm_desc d = {.dtype = (krt_dtype)%d, .trans_a = %d, .trans_b = %d,\n"
                 "      .m = %lld, .n = %lld, .k = %lld, .batch = %lld,\n"
                 "      .a = %s, .lda = %lld, .stride_a = %lld,\n"
                 "      .b = %s, .ldb = %lld, .stride_b = %lld,\n"
                 "      .c = %s, .ldc = %lld, .stride_c = %lld, .alpha = %.17g, .beta = %.17g};\n"
                 "    if (krt_gemm(m->dev, &d, err, errlen)) return -1;\n  }\n",
          (int)g->dtype, g->trans_a, g->trans_b, (long long)g->m, (long long)g->n, (long long)g->k,
          (long long)g->batch, g->a, (long long)g->lda, (long long)g->stride_a, g->b,
          (long long)g->ldb, (long long)g->stride_b, g->c, (long long)g->ldc,
          (long long)g->stride_c, g->alpha, g->beta);
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
                                                 kl_cg_templates_nn};

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
  e.rf = open_memstream(&run_text, &run_len);
  int rc = 0;
  for (int i = 0; i < g->nodes.len && !rc; i++) {
    const kl_node *n = c->order[i];
    if (!c->live[n->id] || n->op == KL_OP_CONSTANT) continue; /* constants: in the weights */
    e.node = n;
    rc = find_template(n)->emit(&e, n);
  }
  fclose(e.rf);
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
  fprintf(mf, "static const krt_model_api api = {\"%s\", %d, %d, inputs, outputs, %zu, %zu, %d,\n"
              "                                  create, run, destroy};\n\n"
              "const krt_model_api *kiln_model_%s(void) { return &api; }\n"
              "/* The entry `kiln run` looks up in the shared object. */\n"
              "#ifndef KILN_NO_GENERIC_ENTRY\n"
              "const krt_model_api *kiln_model(void);\n"
              "const krt_model_api *kiln_model(void) { return &api; }\n#endif\n",
          g->name, g->inputs.len, g->outputs.len, c->arena_bytes, c->param_bytes, kernel, prefix);
  fclose(kf);
  fclose(mf);
  fclose(hf);
  return 0;
}

int kl_codegen(const kl_graph *g, const kl_codegen_options *opt, kl_codegen_result *out,
               kl_error *err) {
  memset(out, 0, sizeof *out);
  cg_ctx c = {.g = g, .err = err};
  int nn = g->nodes.len, rc = 0;
  c.loc = calloc((size_t)g->values.len + 1, sizeof *c.loc);
  c.order = calloc((size_t)nn + 1, sizeof *c.order);
  c.live = calloc((size_t)nn + 1, sizeof *c.live);
  if (!c.loc || !c.order || !c.live) abort();
  if ((rc = kl_topo_order(g, c.order, err))) goto done;
  for (int i = 0; i < g->outputs.len; i++)
    if (g->outputs.items[i]->producer) c.live[g->outputs.items[i]->producer->id] = true;
  for (int i = nn - 1; i >= 0; i--)
    if (c.live[c.order[i]->id])
      for (int k = 0; k < c.order[i]->ninputs; k++)
        if (c.order[i]->inputs[k]->producer) c.live[c.order[i]->inputs[k]->producer->id] = true;
  /* Every op without a template, at once. */
  char msg[900];
  size_t used = 0;
  int missing = 0;
  for (int i = 0; i < nn; i++) {
    const kl_node *n = c.order[i];
    if (!c.live[n->id] || n->op == KL_OP_CONSTANT || find_template(n)) continue;
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
  if ((rc = place_values(&c))) goto done;
  rc = write_all(&c, opt && opt->prefix ? opt->prefix : "model", out);
  out->nkernels = c.nkernels;
  out->ngemms = c.ngemms;
  out->arena_bytes = c.arena_bytes;
  out->param_bytes = c.param_bytes;
  out->params = c.params;
  c.params = NULL;
done:
  free(c.loc);
  free(c.order);
  free(c.live);
  free(c.params);
  if (rc) kl_codegen_result_free(out);
  return rc;
}

void kl_codegen_result_free(kl_codegen_result *r) {
  free(r->params);
  r->params = NULL;
  free(r->kernels_cu);
  free(r->model_c);
  free(r->model_h);
  r->kernels_cu = r->model_c = r->model_h = NULL;
}
