/* emit_model.c - the whole of code generation for one graph: decide where
 * every value lives (weights blob, one arena for intermediates, input and
 * output buffers), write one kernel or GEMM call per node, and the host code
 * and header around them. */
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

typedef enum { EMIT_SKIP, EMIT_KERNEL, EMIT_GEMM, EMIT_UNSUPPORTED } emit_kind;

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

static bool is_copy_op(kl_op op) {
  return op == KL_OP_RESHAPE || op == KL_OP_FLATTEN || op == KL_OP_SQUEEZE ||
         op == KL_OP_UNSQUEEZE || op == KL_OP_EXPAND || op == KL_OP_TRANSPOSE;
}

static bool is_reduce_op(kl_op op) {
  return op == KL_OP_REDUCE_SUM || op == KL_OP_REDUCE_MEAN || op == KL_OP_REDUCE_MAX ||
         op == KL_OP_REDUCE_MIN || op == KL_OP_REDUCE_PROD;
}

/* matmul operands as batch x [m, k] @ [k, n]: 1-D operands promoted, and
 * each operand's batch either full or broadcast whole (stride 0). */
typedef struct {
  int64_t m, n, k, batch, stride_a, stride_b;
} mm_plan;

static int plan_matmul(const kl_node *nd, mm_plan *p) {
  const kl_shape *a = &nd->inputs[0]->shape, *b = &nd->inputs[1]->shape, *o = &nd->outputs[0]->shape;
  p->k = a->dims[a->rank - 1];
  p->m = a->rank >= 2 ? a->dims[a->rank - 2] : 1;
  p->n = b->rank >= 2 ? b->dims[b->rank - 1] : 1;
  int64_t ab = 1, bb = 1;
  for (int d = 0; d < a->rank - 2; d++) ab *= a->dims[d];
  for (int d = 0; d < b->rank - 2; d++) bb *= b->dims[d];
  p->batch = 1;
  for (int d = 0; d < o->rank - (a->rank >= 2 && b->rank >= 2 ? 2 : 1); d++) p->batch *= o->dims[d];
  if (a->rank == 1 || b->rank == 1) p->batch = ab * bb; /* one of them is 1 */
  if ((ab != 1 && ab != p->batch) || (bb != 1 && bb != p->batch)) return -1;
  p->stride_a = ab == 1 ? 0 : p->m * p->k;
  p->stride_b = bb == 1 ? 0 : p->k * p->n;
  return 0;
}

static emit_kind classify(const kl_node *n, char *why, size_t len) {
  *why = 0;
  if (n->op == KL_OP_CONSTANT) return EMIT_SKIP; /* folded into the weights */
  if (kl_cg_is_elementwise(n) || is_copy_op(n->op) || is_reduce_op(n->op) ||
      n->op == KL_OP_SOFTMAX || n->op == KL_OP_LOG_SOFTMAX)
    return EMIT_KERNEL;
  if (n->op == KL_OP_MATMUL || n->op == KL_OP_GEMM) {
    mm_plan p;
    if (!kl_dtype_is_float(n->outputs[0]->dtype)) snprintf(why, len, "integer GEMM");
    else if (n->op == KL_OP_MATMUL && plan_matmul(n, &p))
      snprintf(why, len, "partly broadcast batch dims");
    else return EMIT_GEMM;
  }
  return EMIT_UNSUPPORTED;
}

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

/* ---- the three files ------------------------------------------------- */
static void launch(FILE *f, const cg_ctx *c, const kl_node *n, int kernel, const kl_value *const *ins,
                   int nins, const kl_value *out) {
  int64_t numel = kl_shape_numel(&out->shape);
  if (numel == 0) return;
  if (n->op == KL_OP_SOFTMAX || n->op == KL_OP_LOG_SOFTMAX) /* one thread per row */
    numel /= out->shape.dims[(kl_attr_int(n, "axis", -1) + out->shape.rank) % out->shape.rank];
  int64_t blocks = (numel + BLOCK - 1) / BLOCK;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  fprintf(f, "  {\n");
  for (int k = 0; k < nins; k++) {
    fprintf(f, "    void *a%d = ", k);
    ptr(f, c, ins[k]);
    fprintf(f, ";\n");
  }
  fprintf(f, "    void *y = ");
  ptr(f, c, out);
  fprintf(f, ";\n    void *args[] = {");
  for (int k = 0; k < nins; k++) fprintf(f, "&a%d, ", k);
  fprintf(f, "&y};\n    if (krt_launch(m->mod, %d, (kl_dim3){%lld, 1, 1}, (kl_dim3){%d, 1, 1}, 0, args, err, errlen))\n"
             "      return -1;\n  }\n", kernel, (long long)blocks, BLOCK);
}

static void gemm_call(FILE *f, const cg_ctx *c, const kl_node *n, int *kernel, FILE *kf) {
  const kl_value *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
  int64_t m, nn, k, batch = 1, sa = 0, sb = 0;
  int ta = 0, tb = 0;
  double alpha = 1, beta = 0;
  if (n->op == KL_OP_MATMUL) {
    mm_plan p;
    plan_matmul(n, &p);
    m = p.m, nn = p.n, k = p.k, batch = p.batch, sa = p.stride_a, sb = p.stride_b;
  } else {
    ta = (int)kl_attr_int(n, "trans_a", 0), tb = (int)kl_attr_int(n, "trans_b", 0);
    alpha = kl_attr_float(n, "alpha", 1), beta = n->ninputs > 2 ? kl_attr_float(n, "beta", 1) : 0;
    m = a->shape.dims[ta ? 1 : 0], k = a->shape.dims[ta ? 0 : 1], nn = b->shape.dims[tb ? 0 : 1];
    if (n->ninputs > 2) { /* C broadcast into the output first, then += */
      kl_node copy = *n;
      copy.op = KL_OP_EXPAND;
      kl_value *cin = n->inputs[2];
      copy.inputs = &cin;
      copy.ninputs = 1;
      char name[32];
      snprintf(name, sizeof name, "k%d", *kernel);
      kl_cg_gather_copy(kf, name, &copy);
      launch(f, c, n, (*kernel)++, (const kl_value *const *)&cin, 1, out);
    }
  }
  char shape[160];
  fprintf(f, "  { /* %s: %s -> %s%s */\n    krt_gemm_desc d = {.dtype = (krt_dtype)%d, .trans_a = %d, "
             ".trans_b = %d,\n      .m = %lld, .n = %lld, .k = %lld, .batch = %lld,\n      .a = ",
          n->name, kl_ops[n->op].name, kl_dtype_name(out->dtype),
          kl_shape_str(&out->shape, shape, sizeof shape), (int)out->dtype, ta, tb, (long long)m,
          (long long)nn, (long long)k, (long long)batch);
  ptr(f, c, a);
  fprintf(f, ", .lda = %lld, .stride_a = %lld,\n      .b = ", (long long)(ta ? m : k), (long long)sa);
  ptr(f, c, b);
  fprintf(f, ", .ldb = %lld, .stride_b = %lld,\n      .c = ", (long long)(tb ? k : nn), (long long)sb);
  ptr(f, c, out);
  fprintf(f, ", .ldc = %lld, .stride_c = %lld, .alpha = %.17g, .beta = %.17g};\n"
             "    if (krt_gemm(m->dev, &d, err, errlen)) return -1;\n  }\n",
          (long long)nn, (long long)(m * nn), alpha, beta);
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
  FILE *rf = open_memstream(&run_text, &run_len);
  int kernel = 0;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = c->order[i];
    char why[128], name[32];
    if (!c->live[n->id]) continue;
    emit_kind k = classify(n, why, sizeof why);
    if (k == EMIT_SKIP) continue;
    if (k == EMIT_GEMM) {
      gemm_call(rf, c, n, &kernel, kf);
      c->ngemms++;
      continue;
    }
    snprintf(name, sizeof name, "k%d", kernel);
    if (kl_cg_is_elementwise(n)) kl_cg_elementwise(kf, name, n);
    else if (is_copy_op(n->op)) kl_cg_gather_copy(kf, name, n);
    else if (is_reduce_op(n->op)) kl_cg_reduce(kf, name, n);
    else kl_cg_softmax(kf, name, n);
    char shape[160];
    fprintf(rf, "  /* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name,
            kl_dtype_name(n->outputs[0]->dtype), kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape));
    launch(rf, c, n, kernel++, (const kl_value *const *)n->inputs, n->ninputs, n->outputs[0]);
  }
  fclose(rf);
  c->nkernels = kernel;

  fprintf(hf, "/* model.h - generated by kiln: the compiled model '%s'. */\n#ifndef KILN_MODEL_%s_H\n"
              "#define KILN_MODEL_%s_H\n#include \"kilnrt.h\"\n\n", g->name, prefix, prefix);
  fprintf(hf, "#define %s_ARENA_BYTES %zu /* intermediates, one allocation */\n", prefix, c->arena_bytes);
  fprintf(hf, "#define %s_PARAM_BYTES %zu /* weights and constants */\n", prefix, c->param_bytes);
  fprintf(hf, "#define %s_NUM_INPUTS %d\n#define %s_NUM_OUTPUTS %d\n\n", prefix, g->inputs.len, prefix,
          g->outputs.len);
  fprintf(hf, "/* Inputs, outputs, sizes and create/run/destroy. */\nconst krt_model_api *kiln_model_%s(void);\n"
              "\n#endif\n", prefix);

  fprintf(mf, "/* model.c - generated by kiln: host code of model '%s'.  Build it with\n"
              " * -DKILN_HOST_KERNELS to run kernels.cu on the host device. */\n"
              "#include <stdlib.h>\n#include <string.h>\n#include \"model.h\"\n\n", g->name);
  fprintf(mf, "#ifdef KILN_HOST_KERNELS\n");
  for (int k = 0; k < kernel; k++) fprintf(mf, "extern const kl_emu_kernel k%d__emu;\n", k);
  fprintf(mf, "#define HOST_ENTRY(k) (&k##__emu)\n#else\n#define HOST_ENTRY(k) NULL\n#endif\n\n");
  fprintf(mf, "static const krt_kernel_desc kernels[] = {\n");
  for (int k = 0; k < kernel; k++) fprintf(mf, "  {\"k%d\", HOST_ENTRY(k%d)},\n", k, k);
  if (!kernel) fprintf(mf, "  {NULL, NULL},\n");
  fprintf(mf, "};\n\n");
  fprintf(mf, "/* weights and constants, %zu bytes */\nstatic const unsigned char params_blob[%zu] = {", c->param_bytes,
          c->param_bytes ? c->param_bytes : 1);
  for (size_t i = 0; i < c->param_bytes; i++) fprintf(mf, "%s%u,", i % 24 ? "" : "\n  ", c->params[i]);
  fprintf(mf, "\n};\n\n");
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
              "  krt_module_desc md = {kernels, %d, NULL, 0, NULL};\n"
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
              "const krt_model_api *kiln_model(void);\n"
              "const krt_model_api *kiln_model(void) { return &api; }\n",
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
    char why[128];
    if (!c.live[n->id] || classify(n, why, sizeof why) != EMIT_UNSUPPORTED) continue;
    if (missing++ < 12 && used < sizeof msg - 160)
      used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s (node '%s')%s%s",
                               missing > 1 ? ", " : "", kl_ops[n->op].name, n->name,
                               *why ? ": " : "", why);
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
done:
  free(c.loc);
  free(c.order);
  free(c.live);
  free(c.params);
  if (rc) kl_codegen_result_free(out);
  return rc;
}

void kl_codegen_result_free(kl_codegen_result *r) {
  free(r->kernels_cu);
  free(r->model_c);
  free(r->model_h);
  r->kernels_cu = r->model_c = r->model_h = NULL;
}
