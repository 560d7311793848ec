/* host_code.c - the C around the kernels: NAME.h (sizes and the entry
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

/* NAME.h: each input's and output's position by its C name (the IR name,
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

/* The outputs of the compiled model's API, in order, into out (NULL: just
 * count): a training step's update values are none (they overwrite the
 * state in place). */
int kl_cg_api_outputs(const kl_graph *g, const kl_value **out) {
  int n = 0;
  for (int i = 0; i < g->outputs.len; i++)
    if (!g->outputs.items[i]->updates) {
      if (out) out[n] = g->outputs.items[i];
      n++;
    }
  return n;
}

static int index_of(const kl_value *const *vals, int n, const kl_value *v) {
  for (int i = 0; v && i < n; i++)
    if (vals[i] == v) return i;
  return -1;
}

/* The training step's description and its state's place in the params
 * buffer (krt_train_info). */
static void write_train(FILE *mf, const kl_cg_ctx *c) {
  const kl_graph *g = c->g;
  const kl_train *t = g->train;
  const kl_value *const *in = (const kl_value *const *)g->inputs.items;
  const kl_value **out = calloc((size_t)g->outputs.len + 1, sizeof *out);
  if (!out) abort();
  int ni = g->inputs.len, no = kl_cg_api_outputs(g, out);
  double lr = 0, b1 = 0.9, b2 = 0.999, warmup = 0, step_size = 0, gamma = 0.1, total = 0, min_lr = 0;
  for (int i = 0; i < t->nattrs; i++) {
    const kl_attr *a = &t->attrs[i];
    if (!strcmp(a->name, "lr")) lr = a->f;
    if (!strcmp(a->name, "beta1")) b1 = a->f;
    if (!strcmp(a->name, "beta2")) b2 = a->f;
  }
  for (int i = 0; i < t->nschedule_attrs; i++) {
    const kl_attr *a = &t->schedule_attrs[i];
    double v = a->kind == KL_ATTR_INT ? (double)a->i : a->f;
    if (!strcmp(a->name, "warmup")) warmup = v;
    if (!strcmp(a->name, "step_size")) step_size = v;
    if (!strcmp(a->name, "gamma")) gamma = v;
    if (!strcmp(a->name, "total")) total = v;
    if (!strcmp(a->name, "min_lr")) min_lr = v;
  }
  bool half = t->loss_scaling;
  io_table(mf, "states", (const kl_value *const *)t->states, t->nstates);
  fprintf(mf, "static const size_t state_offsets[] = {");
  for (int i = 0; i < t->nstates; i++) fprintf(mf, "%s%zu", i ? ", " : "", c->p->loc[t->states[i]->id].offset);
  fprintf(mf, "%s};\n\n", t->nstates ? "" : "0");
  fprintf(mf, "static const krt_train_info train = {\"%s\", %.17g, %.17g, %.17g, \"%s\", %.17g, %.17g, %.17g,\n"
              "  %.17g, %.17g, %.17g, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, states, %d, %d};\n\n",
          t->optimizer, lr, b1, b2, t->schedule ? t->schedule : "constant", warmup, step_size, gamma,
          total, min_lr, t->clip, half, index_of(in, ni, t->in_x), index_of(in, ni, t->in_labels),
          index_of(in, ni, t->in_lr), index_of(in, ni, t->in_bias1), index_of(in, ni, t->in_bias2),
          index_of(in, ni, t->in_scale), index_of(in, ni, t->in_apply), index_of(out, no, t->out_loss),
          index_of(out, no, t->out_ok), index_of(out, no, t->out_norm), index_of(out, no, t->out_logits),
          t->nstates, t->nparams, index_of(in, ni, t->in_world), t->nbuckets);
  fprintf(mf, "static int read_state(void *self, int i, void *host, char *err, size_t errlen) {\n"
              "  model *m = self;\n  if (i < 0 || i >= %d) {\n"
              "    snprintf(err, errlen, \"state %%d: the step has %d\", i);\n    return -1;\n  }\n"
              "  return krt_download(m->dev, host, m->params + state_offsets[i], io_bytes(&states[i]), err, errlen);\n}\n\n"
              "static int write_state(void *self, int i, const void *host, char *err, size_t errlen) {\n"
              "  model *m = self;\n  if (i < 0 || i >= %d) {\n"
              "    snprintf(err, errlen, \"state %%d: the step has %d\", i);\n    return -1;\n  }\n"
              "  return krt_upload(m->dev, m->params + state_offsets[i], host, io_bytes(&states[i]), err, errlen);\n}\n\n",
          t->nstates, t->nstates, t->nstates, t->nstates);
  free(out);
}

void kl_cg_write_host(kl_cg_ctx *c, const char *prefix, const char *run_text, size_t run_len,
                      FILE *mf, FILE *hf, int kernel) {
  const kl_graph *g = c->g;
  const kl_value **api_out = calloc((size_t)g->outputs.len + 1, sizeof *api_out);
  if (!api_out) abort();
  int nout = kl_cg_api_outputs(g, api_out);
  bool trains = g->train && g->train->built;
  fprintf(hf, "/* %s.h - generated by kiln: the compiled model '%s'. */\n#ifndef KILN_MODEL_%s_H\n"
              "#define KILN_MODEL_%s_H\n#include \"kilnrt.h\"\n\n", prefix, g->name, prefix, prefix);
  fprintf(hf, "#define %s_ARENA_BYTES %zu /* intermediates, one allocation */\n", prefix, c->p->mem.arena);
  fprintf(hf, "#define %s_PARAM_BYTES %zu /* weights and constants */\n", prefix, c->p->param_bytes);
  fprintf(hf, "#define %s_NUM_INPUTS %d\n#define %s_NUM_OUTPUTS %d\n\n", prefix, g->inputs.len, prefix,
          nout);
  io_macros(hf, prefix, "INPUT", (const kl_value *const *)g->inputs.items, g->inputs.len);
  io_macros(hf, prefix, "OUTPUT", api_out, nout);
  /* default visibility: a static library hides everything else, so that
   * two compiled models link into one program */
  fprintf(hf, "/* Inputs, outputs, sizes and create/run/destroy. */\n"
              "__attribute__((visibility(\"default\"))) const krt_model_api *kiln_model_%s(void);\n"
              "\n#endif\n", prefix);

  fprintf(mf, "/* model.c - generated by kiln: host code of model '%s'.  Build it with\n"
              " * -DKILN_HOST_KERNELS to run kernels.cu on the host device. */\n"
              "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include \"%s.h\"\n\n", g->name,
          prefix);
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
  fprintf(mf, "/* weights and constants, %zu bytes, from weights.bin; or, built with\n"
              " * -DKILN_WEIGHTS_EXTERNAL=\"FILE\" (kiln compile --weights-file), in FILE\n"
              " * beside the program, mapped at create (krt_weights_map) */\n"
              "#ifdef KILN_WEIGHTS_EXTERNAL\n#define params_blob ((const unsigned char *)m->weights.data)\n"
              "#else\n#ifndef KILN_WEIGHTS_FILE\n"
              "#define KILN_WEIGHTS_FILE \"weights.bin\"\n#endif\n"
              "__asm__(\".section .rodata\\n.balign 64\\nkiln_weights_%s:\\n.incbin \\\"\" KILN_WEIGHTS_FILE "
              "\"\\\"\\n.byte 0\\n.previous\\n\");\n"
              "extern const unsigned char kiln_weights_%s[];\n#define params_blob kiln_weights_%s\n#endif\n\n",
          c->p->param_bytes, prefix, prefix, prefix);
  io_table(mf, "inputs", (const kl_value *const *)g->inputs.items, g->inputs.len);
  io_table(mf, "outputs", api_out, nout);
  int nio = g->inputs.len + nout;
  /* trace: KILN_PROFILE=FILE.json, a Chrome trace of every run, written
   * at destroy (runtime/trace.c) */
  /* graph: the run captured as a CUDA graph (krt_graph_run); flags: the
   * run-time error flags (kl_cg_flag) */
  fprintf(mf, "\ntypedef struct {\n  krt_device *dev;\n  krt_module *mod;\n  char *arena, *params;\n"
              "  void *io[%d];\n  krt_trace *trace;\n  double *trace_ms;\n  krt_graph *graph;\n"
              "  unsigned *flags;\n  krt_weights weights;\n"
              "  int params_mapped; /* params is the mapping itself (the host device) */\n} model;\n\n"
              "static const krt_model_api api;\n\n", nio ? nio : 1);
  fprintf(mf, "static size_t io_bytes(const krt_io_desc *d) {\n  size_t n = krt_dtype_size(d->dtype);\n"
              "  for (int i = 0; i < d->rank; i++) n *= (size_t)d->dims[i];\n  return n;\n}\n\n");
  fprintf(mf, "static void destroy(void *self) {\n  model *m = self;\n  if (!m) return;\n"
              "  if (m->trace) {\n    char err[512];\n"
              "    if (krt_trace_write(m->trace, getenv(\"KILN_PROFILE\"), err, sizeof err))\n"
              "      fprintf(stderr, \"kiln: %%s\\n\", err);\n"
              "    else krt_trace_summary(m->trace, stderr);\n"
              "    krt_trace_free(m->trace);\n    free(m->trace_ms);\n  }\n"
              "  krt_graph_free(m->dev, m->graph);\n  krt_free(m->dev, m->flags);\n"
              "  for (int i = 0; i < %d; i++) krt_free(m->dev, m->io[i]);\n"
              "  krt_free(m->dev, m->arena);\n  if (!m->params_mapped) krt_free(m->dev, m->params);\n"
              "  krt_weights_unmap(&m->weights);\n  krt_module_unload(m->mod);\n"
              "  free(m);\n}\n\n", nio);
  fprintf(mf, "static int create(krt_device *dev, void **out, char *err, size_t errlen) {\n"
              "  model *m = calloc(1, sizeof *m);\n  if (!m) return -1;\n  m->dev = dev;\n"
              "#ifdef KILN_WEIGHTS_EXTERNAL\n"
              "  if (krt_weights_map(&m->weights, KILN_WEIGHTS_EXTERNAL, KILN_WEIGHTS_COMPILED_DIR, %zu,\n"
              "                      KILN_WEIGHTS_CRC, (const void *)&api, err, errlen)) {\n"
              "    destroy(m);\n    return -1;\n  }\n"
              "  /* inference never writes its weights: the host device reads the mapping */\n"
              "  m->params_mapped = %d && krt_device_kind_of(dev) == KRT_DEVICE_HOST;\n"
              "  if (m->params_mapped) m->params = (char *)m->weights.data;\n"
              "#endif\n"
              "  krt_module_desc md = {kernels, %d, CUBINS};\n"
              "  if ((%d && krt_module_load(dev, &md, &m->mod, err, errlen)) ||\n"
              "      krt_malloc(dev, %zu, (void **)&m->arena, err, errlen) ||\n"
              "      (!m->params_mapped && (krt_malloc(dev, %zu, (void **)&m->params, err, errlen) ||\n"
              "                             krt_upload(dev, m->params, params_blob, %zu, err, errlen))) ||\n"
              "      (%d && krt_malloc(dev, %d * sizeof(unsigned), (void **)&m->flags, err, errlen))) {\n"
              "    destroy(m);\n    return -1;\n  }\n", c->p->param_bytes, !trains && c->p->param_bytes > 0,
          kernel, kernel, c->p->mem.arena ? c->p->mem.arena : 1,
          c->p->param_bytes ? c->p->param_bytes : 1, c->p->param_bytes, c->nflags, c->nflags);
  fprintf(mf, "  for (int i = 0; i < %d; i++) {\n"
              "    const krt_io_desc *d = i < %d ? &inputs[i] : &outputs[i - %d];\n"
              "    if (krt_malloc(dev, io_bytes(d) ? io_bytes(d) : 1, &m->io[i], err, errlen)) {\n"
              "      destroy(m);\n      return -1;\n    }\n  }\n"
              "  const char *trace = getenv(\"KILN_PROFILE\");\n"
              "  if (trace && *trace && (krt_profile_enable(dev, %d, err, errlen) ||\n"
              "                         !(m->trace = krt_trace_new(&api, dev)) ||\n"
              "                         !(m->trace_ms = calloc(%d, sizeof(double))))) {\n"
              "    destroy(m);\n    return -1;\n  }\n"
              "  *out = m;\n  return 0;\n}\n\n",
          nio, g->inputs.len, g->inputs.len, c->nprofile + 1, c->nprofile + 1);
  write_offsets(mf, c);
  /* an input nothing computed reads (a training step's labels, run for
   * inference) may be NULL; a read one may not */
  fprintf(mf, "static const unsigned char input_read[] = {");
  for (int i = 0; i < g->inputs.len; i++) {
    const kl_value *v = g->inputs.items[i];
    bool read = v->is_output || c->p->reader_at[v->id + 1] > c->p->reader_at[v->id];
    fprintf(mf, "%s%d", i ? ", " : "", read);
  }
  fprintf(mf, "%s};\n\n", g->inputs.len ? "" : "0");
  fprintf(mf, "/* The steps run() marks for the profiler (kernels and GEMM calls, est. DRAM bytes). */\n"
              "static const krt_step_info steps[] = {\n");
  for (int i = 0; i < c->nprofile; i++)
    fprintf(mf, "  {\"%s\", %d, %zu},\n", c->profile[i].name, c->profile[i].launches,
            c->profile[i].bytes);
  if (!c->nprofile) fprintf(mf, "  {\"\", 0, 0}\n");
  fprintf(mf, "};\n\n");
  /* compute: what run() enqueues between the uploads and the downloads,
   * the same every run, so a CUDA graph can capture it (krt_graph_run);
   * not a data-parallel step, whose exchange waits on the host mid-way */
  bool capturable = !strstr(run_text, "krt_all_reduce");
  fprintf(mf, "/* Everything a run enqueues on the device: captured once as a CUDA graph\n"
              " * and replayed, on a GPU with graphs on (krt_graph_run). */\n"
              "static int compute(void *self, char *err, size_t errlen) {\n  model *m = self;\n");
  if (c->nflags)
    fprintf(mf, "  if (krt_memset_zero(m->dev, m->flags, %d * sizeof(unsigned), err, errlen)) return -1;\n",
            c->nflags);
  fwrite(run_text, 1, run_len, mf);
  fprintf(mf, "  return 0;\n}\n\n");
  fprintf(mf, "static int run(void *self, const void *const *in, void *const *out, char *err, size_t errlen) {\n"
              "  model *m = self;\n  const double t0 = m->trace ? krt_now_ms() : 0;\n"
              "  for (int i = 0; i < %d; i++) {\n"
              "    if (!in[i] && !input_read[i]) continue;\n"
              "    if (!in[i]) {\n"
              "      snprintf(err, errlen, \"run: input %%d '%%s' is NULL, and the model reads it\", i, inputs[i].name);\n"
              "      return -1;\n    }\n"
              "    if (krt_upload(m->dev, m->io[i], in[i], io_bytes(&inputs[i]), err, errlen)) return -1;\n  }\n",
          g->inputs.len);
  fwrite(c->prechecks, 1, c->prechecks_len, mf);
  fprintf(mf, "  if (krt_graph_run(m->dev, &m->graph, %d && !m->trace, compute, m, err, errlen)) return -1;\n",
          capturable);
  fprintf(mf, "  if (krt_synchronize(m->dev, err, errlen)) return -1;\n");
  if (c->nflags) { /* the kernels' run-time errors, the first node's first */
    fprintf(mf, "  unsigned flags[%d];\n"
                "  if (krt_download(m->dev, flags, m->flags, sizeof flags, err, errlen)) return -1;\n",
            c->nflags);
    fwrite(c->checks, 1, c->checks_len, mf);
  }
  for (int i = 0; i < nout; i++) {
    fprintf(mf, "  if (krt_download(m->dev, out[%d], ", i);
    ptr(mf, c, api_out[i]);
    fprintf(mf, ", io_bytes(&outputs[%d]), err, errlen)) return -1;\n", i);
  }
  fprintf(mf, "  if (m->trace && (krt_profile_read(m->dev, m->trace_ms, %d, err, errlen) ||\n"
              "                   krt_trace_add_run(m->trace, m->trace_ms, krt_now_ms() - t0))) return -1;\n",
          c->nprofile);
  fprintf(mf, "  return 0;\n}\n\n");

  if (trains) write_train(mf, c);
  fprintf(mf, "static const krt_model_api api = {\"%s\", %d, %d, inputs, outputs, %zu, %zu, %d,\n"
              "                                  create, run, destroy, %d, steps, %s};\n\n"
              "const krt_model_api *kiln_model_%s(void) { return &api; }\n"
              "/* The entry `kiln run` looks up in the shared object. */\n"
              "#ifndef KILN_NO_GENERIC_ENTRY\n"
              "const krt_model_api *kiln_model(void);\n"
              "const krt_model_api *kiln_model(void) { return &api; }\n#endif\n",
          g->name, g->inputs.len, nout, c->p->mem.arena, c->p->param_bytes, kernel,
          c->nprofile, trains ? "&train, read_state, write_state" : "NULL, NULL, NULL", prefix);
  free(api_out);
}
