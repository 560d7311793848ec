/* host_code.c - the C around the kernels: model.h (sizes and the entry
 * point), model.c (the I/O tables, create/destroy, the memory plan's
 * offsets, run() and the profiler's steps) and the weights blob. */
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

/* ---- the weights ------------------------------------------------------ */
/* v's piece of weights.bin, at the offset the memory pass gave it, its
 * bytes to come from `data` (NULL: v's seeded init). */
static void add_piece(kl_cg_ctx *c, const kl_value *v, const void *data, bool owned) {
  kl_weight_piece *pc = &c->pieces[c->npieces++];
  size_t bytes = kl_cg_value_bytes(v);
  bool mapped = data && !owned && kl_graph_is_mapped(c->g, data, bytes);
  *pc = (kl_weight_piece){c->p->loc[v->id].offset, bytes, data, v, mapped, owned};
}

/* A tensor's bytes, owned by their piece. */
static void add_tensor(kl_cg_ctx *c, const kl_value *v, const kl_tensor *t) {
  unsigned char *raw = malloc(kl_cg_value_bytes(v) + 1);
  if (!raw) abort();
  kl_tensor_to_raw(t, raw);
  add_piece(c, v, raw, true);
}

/* A param or const: its bytes stay where the graph holds them (a mapped
 * file, the arena) or are drawn from its seeded init as weights.bin is
 * written.  Bool, i64 and u64 contents go through a tensor as before
 * (bools made 0/1, 64-bit integers checked to be exact); without its data,
 * materializing fails and says why. */
static int add_weight(kl_cg_ctx *c, const kl_value *v) {
  bool has_data = v->init.kind == KL_INIT_DATA || v->init.kind == KL_INIT_LOAD;
  if (has_data && v->data && v->dtype != KL_BOOL && v->dtype != KL_I64 && v->dtype != KL_U64) {
    add_piece(c, v, v->data, false);
    return 0;
  }
  if (!has_data) {
    add_piece(c, v, NULL, false);
    return 0;
  }
  kl_tensor *t;
  if (kl_value_materialize(v, &t, c->err)) return -1;
  add_tensor(c, v, t);
  kl_tensor_free(t);
  return 0;
}

static int by_offset(const void *a, const void *b) {
  size_t x = ((const kl_weight_piece *)a)->offset, y = ((const kl_weight_piece *)b)->offset;
  return x < y ? -1 : x > y;
}

/* Weights, constants and folded values at the offsets the memory pass
 * gave them: no copy of a weight is made here, only the list of where
 * each lies, which kl_codegen_write_weights streams. */
int kl_cg_list_weights(kl_cg_ctx *c) {
  const kl_plan *p = c->p;
  const kl_graph *g = c->g;
  c->pieces = calloc((size_t)g->values.len + 1, sizeof *c->pieces);
  if (!c->pieces) abort();
  for (int i = 0; i < g->params.len; i++)
    if (add_weight(c, g->params.items[i])) return -1;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    for (int k = 0; p->live[n->id] && p->folded[n->id] && k < n->noutputs; k++)
      add_tensor(c, n->outputs[k], p->known[n->outputs[k]->id]);
  }
  qsort(c->pieces, (size_t)c->npieces, sizeof *c->pieces, by_offset); /* the writer streams */
  return 0;
}

static void ptr(FILE *f, const kl_cg_ctx *c, const kl_value *v) {
  char buf[160];
  fputs(kl_cg_ptr_expr(c, v, buf, sizeof buf), f);
}

/* s as a C string literal (a model's names may hold any character). */
static void c_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20 || ch >= 0x7f) fprintf(f, "\\%03o", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

/* The I/O tables carry the names as the model spells them (the label). */
static void io_table(FILE *f, const char *name, const kl_value *const *vals, int n) {
  fprintf(f, "static const krt_io_desc %s[] = {\n", name);
  for (int i = 0; i < n; i++) {
    fputs("  {", f);
    c_string(f, kl_value_label(vals[i]));
    fprintf(f, ", (krt_dtype)%d, %d, {", (int)vals[i]->dtype, vals[i]->shape.rank);
    for (int d = 0; d < vals[i]->shape.rank; d++)
      fprintf(f, "%s%lld", d ? ", " : "", (long long)vals[i]->shape.dims[d]);
    fprintf(f, "}},\n");
  }
  if (!n) fprintf(f, "  {0}\n");
  fprintf(f, "};\n");
}

/* The offsets of the plan, for run(). */
static void write_offsets(FILE *f, const kl_cg_ctx *c) {
  fprintf(f, "/* The memory plan: arena offsets (bytes, live steps), %zu bytes in all; the\n"
             " * most alive at one step is %zu, every buffer apart would take %zu. */\n",
          c->p->mem.arena, c->p->mem.lower_bound, c->p->mem.naive);
  for (int b = 0; b < c->p->nbufs; b++) {
    const kl_membuf *m = &c->p->bufs[b];
    char name[32];
    fprintf(f, "#define %s ((size_t)%zu) /* ", kl_cg_buf_macro(c, b, name, sizeof name), m->offset);
    for (const char *p = m->name; *p; p++) /* a name must not end the comment */
      if (*p != '\n' && !(p[0] == '*' && p[1] == '/')) fputc(*p, f);
    fprintf(f, ": %zu bytes, steps %d-%d", m->bytes, m->first, m->last);
    if (m->inplace_of >= 0) fprintf(f, ", in place of %s", kl_cg_buf_macro(c, m->inplace_of, name, sizeof name));
    fprintf(f, " */\n");
  }
  fprintf(f, "\n");
}

/* model.h: each input's and output's position by its C name (the IR name,
 * an identifier: an ONNX "sigmoid_0.tmp_0" is PREFIX_OUTPUT_sigmoid_0_tmp_0),
 * and the names as the model spells them, which the I/O tables hold too.
 * NAMES_OF_ cannot clash with an INPUT_ or OUTPUT_ macro. */
static void io_macros(FILE *hf, const char *prefix, const char *kind, const kl_value *const *vals,
                      int n) {
  const char *word = kind[0] == 'I' ? "inputs" : "outputs";
  fprintf(hf, "/* The %s by position (%s_%s_<C name>); %s_NAMES_OF_%sS: their names as the\n"
              " * model spells them, as in kiln_model_%s()'s tables. */\n",
          word, prefix, kind, prefix, kind, prefix);
  for (int i = 0; i < n; i++) {
    fprintf(hf, "#define %s_%s_%s %d", prefix, kind, vals[i]->name, i);
    if (vals[i]->label) {
      fputs(" /* ", hf);
      for (const char *p = vals[i]->label; *p; p++) /* a name must not end the comment */
        if (*p != '\n' && !(p[0] == '*' && p[1] == '/')) fputc(*p, hf);
      fputs(" */", hf);
    }
    fputc('\n', hf);
  }
  fprintf(hf, "#define %s_NAMES_OF_%sS {", prefix, kind);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", hf);
    c_string(hf, kl_value_label(vals[i]));
  }
  fprintf(hf, "}\n\n");
}

void kl_cg_write_host(kl_cg_ctx *c, const char *prefix, const char *run_text, size_t run_len,
                      FILE *mf, FILE *hf, int kernel) {
  const kl_graph *g = c->g;
  fprintf(hf, "/* model.h - generated by kiln: the compiled model '%s'. */\n#ifndef KILN_MODEL_%s_H\n"
              "#define KILN_MODEL_%s_H\n#include \"kilnrt.h\"\n\n", g->name, prefix, prefix);
  fprintf(hf, "#define %s_ARENA_BYTES %zu /* intermediates, one allocation */\n", prefix, c->p->mem.arena);
  fprintf(hf, "#define %s_PARAM_BYTES %zu /* weights and constants */\n", prefix, c->p->param_bytes);
  fprintf(hf, "#define %s_NUM_INPUTS %d\n#define %s_NUM_OUTPUTS %d\n\n", prefix, g->inputs.len, prefix,
          g->outputs.len);
  io_macros(hf, prefix, "INPUT", (const kl_value *const *)g->inputs.items, g->inputs.len);
  io_macros(hf, prefix, "OUTPUT", (const kl_value *const *)g->outputs.items, g->outputs.len);
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
}
