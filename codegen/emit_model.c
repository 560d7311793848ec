/* emit_model.c - the text of one plan (passes/pipeline.c): each step in
 * order, as the node's template, one fused or row kernel, one attention
 * kernel, or nothing (views, aliases, epilogue nodes), timed steps marked
 * for the profiler; then host_code.c writes the C around them.  Every
 * decision (groups, GEMMs, views, where each value lives) is the plan's;
 * this file only writes it out. */
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

/* n zeroed elements and one more (n may be 0); out of memory aborts, as
 * everywhere in the compiler. */
static void *zalloc(size_t n, size_t size) {
  void *p = calloc(n + 1, size);
  if (!p) abort();
  return p;
}

/* A group of two or more nodes: one elementwise or row kernel. */
static void emit_fused_group(kl_cg_emitter *e, const kl_group *gr, kl_node *const *members,
                             int count) {
  kl_cg_ctx *c = e->c;
  kl_group_io io;
  kl_group_io_of(members, count, c->p->fusion.stored, &io);
  char name[32], bufs[2 * KL_MAX_GROUP_IO][160], shape[160];
  const char *args[2 * KL_MAX_GROUP_IO];
  int k = kl_cg_new_kernel(e, name, sizeof name), na = 0;
  kl_cg_grid grid = {0, 0};
  if (gr->kind == KL_GROUP_ROWS)
    grid = kl_cg_fused_rows(e->kf, name, members, count, &gr->shape, gr->row_axes, &io);
  else grid = kl_cg_fused_elementwise(e->kf, name, members, count, &io);
  const kl_shape *s = &gr->shape;
  fprintf(e->rf, "  /* fused: %d nodes, %s .. %s -> %s */\n", count, members[0]->name,
          members[count - 1]->name, kl_shape_str(s, shape, sizeof shape));
  for (int i = 0; i < io.nin; i++, na++) {
    args[na] = kl_cg_ptr(e, io.in[i], bufs[na], sizeof bufs[na]);
    c->dram_bytes += kl_cg_value_bytes(io.in[i]);
  }
  for (int i = 0; i < io.nout; i++, na++) {
    args[na] = kl_cg_ptr(e, io.out[i], bufs[na], sizeof bufs[na]);
    c->dram_bytes += kl_cg_value_bytes(io.out[i]);
  }
  if (grid.threads) kl_cg_launch_grid(e, k, grid.blocks, grid.threads, args, na);
  else kl_cg_launch(e, k, kl_shape_numel(s), args, na);
}

/* An attention (emit_attention.c) at its second matmul's step: the
 * chains' inputs, then the bases of Q, K and V; the output's base. */
static void emit_attention(kl_cg_emitter *e, const kl_attention *a) {
  kl_cg_ctx *c = e->c;
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
      if (k == io.nin) io.in[io.nin++] = v, c->dram_bytes += kl_cg_value_bytes(v);
    }
  kl_view q, k, v, out;
  kl_cg_read_view(e, a->qk->inputs[0], &q);
  kl_cg_read_view(e, a->qk->inputs[1], &k);
  kl_cg_read_view(e, a->pv->inputs[1], &v);
  kl_cg_write_view(e, a->pv, &out);
  io.in[io.nin++] = q.base, io.in[io.nin++] = k.base, io.in[io.nin++] = v.base;
  io.out[io.nout++] = out.base;
  c->dram_bytes += kl_cg_value_bytes(a->qk->inputs[0]) + kl_cg_value_bytes(a->qk->inputs[1]) +
                   kl_cg_value_bytes(a->pv->inputs[1]) + kl_cg_value_bytes(a->pv->outputs[0]);
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
static void profile_step(kl_cg_ctx *c, const kl_group *gr, kl_node *const *members, int launches,
                         size_t bytes, const char *part) {
  if (c->nprofile == c->cap_profile) {
    c->cap_profile = c->cap_profile ? 2 * c->cap_profile : 32;
    c->profile = realloc(c->profile, (size_t)c->cap_profile * sizeof *c->profile);
    if (!c->profile) abort();
  }
  struct kl_cg_profile_step *p = &c->profile[c->nprofile++];
  const kl_node *last = members[gr->count - 1];
  if (gr->count > 1)
    snprintf(p->name, sizeof p->name, "fused %d: %s .. %s", gr->count, members[0]->name, last->name);
  else if (kl_plan_epilogue_gemm(c->p, last))
    snprintf(p->name, sizeof p->name, "%s: %s .. %s",
             c->p->attn_head[last->id] ? "attention" : "gemm+epilogue", kl_plan_epilogue_gemm(c->p, last)->name,
             last->name);
  else
    snprintf(p->name, sizeof p->name, "%s: %s", kl_ops[last->op].name, last->name);
  if (part) { /* one of the step's several launches */
    size_t len = strlen(p->name);
    snprintf(p->name + len, sizeof p->name - len, " [%s]", part);
  }
  for (char *q = p->name; *q; q++)
    if (*q == '"' || *q == '\\' || *q == '?' || (unsigned char)*q < 32) *q = '_';
  p->launches = launches;
  p->bytes = bytes;
}

static int write_all(kl_cg_ctx *c, const char *prefix, kl_codegen_result *out) {
  const kl_graph *g = c->g;
  snprintf(out->header, sizeof out->header, "%s.h", prefix);
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
  c->checks_f = open_memstream(&c->checks, &c->checks_len);
  c->prechecks_f = open_memstream(&c->prechecks, &c->prechecks_len);
  if (!run_f || !c->checks_f || !c->prechecks_f) abort();
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
      if (n->op == KL_OP_ALL_REDUCE_WAIT) /* the sum lies where the exchange put it */
        fprintf(e.rf, "  /* %s: the sums of bucket %lld are read from here on */\n"
                      "  if (krt_all_reduce_wait(m->dev, %lld, err, errlen)) return -1;\n", n->name,
                (long long)kl_attr_int(n, "bucket", 0), (long long)kl_attr_int(n, "bucket", 0));
      else if (c->p->epi_last[n->id]) /* the GEMM runs at its epilogue's last node, when all it adds exists */
        fprintf(e.rf, "  /* %s: %s, with its epilogue at %s */\n", n->name, kl_ops[n->op].name,
                c->p->epi_last[n->id]->name);
      else
        fprintf(e.rf, "  /* %s: %s -> %s, %s: no kernel */\n", n->name, kl_ops[n->op].name,
                kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape),
                c->p->alias[n->id]         ? (n->op == KL_OP_CONCAT ? "its inputs written in place" : "the input's buffer")
                : c->p->view_node[n->id]   ? "a view its GEMMs read through"
                : n->op == KL_OP_TRANSPOSE ? "written there by its input's GEMM"
                                           : "in the epilogue of the GEMM before it");
      break;
    case KL_STEP_ATTENTION: emit_attention(&e, &c->p->attn[gemm->id]); break;
    case KL_STEP_GEMM:
    case KL_STEP_NODE:
      if (gemm) { /* the GEMM, at its epilogue's last node: it writes that node's output */
        e.node = gemm;
        for (int k = 0; k < gemm->ninputs; k++) c->dram_bytes += kl_cg_value_bytes(gemm->inputs[k]);
        c->dram_bytes += kl_cg_value_bytes(n->outputs[0]);
        n = gemm;
      } else {
        for (int k = 0; k < n->ninputs; k++) c->dram_bytes += kl_cg_value_bytes(n->inputs[k]);
        for (int k = 0; k < n->noutputs; k++) c->dram_bytes += kl_cg_value_bytes(n->outputs[k]);
      }
      rc = kl_cg_find_template(n)->emit(&e, n);
      break;
    default: /* a group, or one elementwise node: the same generator */
      emit_fused_group(&e, gr, members, gr->count);
      break;
    }
    if (!rc && c->plan_error[0]) rc = kl_fail(c->err, (kl_loc){0}, "%s", c->plan_error);
    fclose(e.rf);
    /* a profiler step per kernel or library call: each launch's mark
     * where the emitter left its place; the group's DRAM bytes go to its
     * last launch, the one that writes the group's output */
    int nmarks = 0;
    for (const char *q = step_text; q && (q = strstr(q, "/*@mark ")); q++) nmarks++;
    (void)launches0;
    const char *at = step_text;
    for (int mk = 0; mk < nmarks; mk++) {
      const char *q = strstr(at, "  /*@mark ");
      char what[32] = "", line[200];
      int launches = 1;
      sscanf(q + 10, "%31s %d", what, &launches);
      fwrite(at, 1, (size_t)(q - at), run_f);
      profile_step(c, gr, members, launches, mk == nmarks - 1 ? c->dram_bytes - bytes0 : 0,
                   nmarks > 1 ? what : NULL);
      snprintf(line, sizeof line, "  if (krt_step_mark(m->dev, %d, steps[%d].name, err, errlen)) return -1;\n",
               c->nprofile - 1, c->nprofile - 1);
      fputs(line, run_f);
      at = strchr(q, '\n') + 1;
    }
    fputs(at, run_f);
    free(step_text);
  }
  fprintf(run_f, "  if (krt_step_mark(m->dev, %d, NULL, err, errlen)) return -1;\n", c->nprofile);
  fclose(run_f);
  fclose(c->checks_f);
  c->checks_f = NULL;
  fclose(c->prechecks_f);
  c->prechecks_f = NULL;
  /* every launch and GEMM call of run() */
  for (const char *p = run_text; p && (p = strstr(p, "krt_launch(")); p++) c->nlaunches++;
  for (const char *p = run_text; p && (p = strstr(p, "krt_gemm(")); p++) c->nlaunches++;
  int kernel = e.nkernels;
  c->nkernels = e.nkernels;
  c->ngemms = e.ngemms;
  if (rc) {
    free(run_text);
    free(c->checks);
    free(c->prechecks);
    fclose(kf);
    fclose(mf);
    fclose(hf);
    return -1;
  }
  kl_cg_write_host(c, prefix, run_text, run_len, mf, hf, kernel);
  free(run_text);
  free(c->checks);
  free(c->prechecks);
  c->checks = c->prechecks = NULL;
  fclose(kf);
  fclose(mf);
  fclose(hf);
  return 0;
}


int kl_codegen(const kl_plan *p, const kl_codegen_options *opt, kl_codegen_result *out,
               kl_error *err) {
  memset(out, 0, sizeof *out);
  const kl_graph *g = p->g;
  kl_cg_ctx c = {.g = g, .p = p, .err = err};
  int nn = g->nodes.len, rc = 0;
  kl_cg_min_blocks = p->target ? p->target->tile_min_blocks : kl_cg_target.tile_min_blocks;
  kl_cg_plan_target = p->target ? p->target : &kl_cg_target;
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
  if ((rc = kl_cg_list_weights(&c)) || (rc = write_all(&c, opt && opt->prefix ? opt->prefix : "model", out)))
    goto done;
  out->nkernels = c.nkernels;
  out->ngemms = c.ngemms;
  out->nlaunches = c.nlaunches;
  out->data_parallel = g->train && g->train->built && g->train->data_parallel;
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
  out->pieces = c.pieces;
  out->npieces = c.npieces;
  c.pieces = NULL;
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
  kl_cg_free_pieces(c.pieces, c.npieces);
  if (rc) kl_codegen_result_free(out);
  return rc;
}

void kl_codegen_result_free(kl_codegen_result *r) {
  free(r->node_group);
  free(r->group_kind);
  r->node_group = NULL;
  r->group_kind = NULL;
  kl_cg_free_pieces(r->pieces, r->npieces);
  r->pieces = NULL;
  r->npieces = 0;
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
