/* pipeline.c - the passes, in the order they run.  Read this file to know
 * what the compiler does to a graph between the front end and the code
 * generator:
 *
 *   train      (--train) the backward graph and the optimizer update
 *              appended to the model (train.c)
 *   bnfold     inference batch norms folded into the conv or GEMM before
 *              them (bnfold.c)
 *   precision  f32 values take f16/bf16 where their ops and their numbers
 *              allow (precision.c)
 *   schedule   the order nodes run in, keeping few bytes alive (schedule.c)
 *   fold       nodes of weights alone computed now (fold.c)
 *   fuse       attention, direct GEMMs and GEMM epilogues (plan_gemm.c),
 *              the kernels' groups (fusion.c), the views GEMMs read
 *              through (plan_views.c)
 *   memory     every intermediate's place in one arena (plan_memory.c)
 *
 * Each pass can print what it did: kiln compile --dump-after=PASS|all. */
#include <string.h>
#include <time.h>

#include "passes.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

const char *const kl_pipeline_passes[] = {"train", "bnfold", "precision", "schedule", "fold",
                                          "fuse",   "memory",    NULL};

bool kl_pipeline_has_pass(const char *name) {
  if (!strcmp(name, "all")) return true;
  for (int i = 0; kl_pipeline_passes[i]; i++)
    if (!strcmp(name, kl_pipeline_passes[i])) return true;
  return false;
}

static bool dumps(const kl_pipeline_options *o, const char *pass) {
  return o->dump && o->dump_after && (!strcmp(o->dump_after, "all") || !strcmp(o->dump_after, pass));
}

static void dump_schedule(FILE *f, const kl_plan *p) {
  for (int i = 0; i < p->g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    fprintf(f, "  %4d  %s = %s%s\n", i, n->name, kl_ops[n->op].name,
            p->live[n->id] ? "" : "  (dead: no output depends on it)");
  }
}

static void dump_fold(FILE *f, const kl_plan *p) {
  int count = 0;
  for (int i = 0; i < p->g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (!p->live[n->id] || !p->folded[n->id]) continue;
    char shape[160];
    fprintf(f, "  %s = %s -> %s%s: folded into the weights\n", n->name, kl_ops[n->op].name,
            kl_dtype_name(n->outputs[0]->dtype),
            kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape));
    count++;
  }
  if (!count) fprintf(f, "  (nothing to fold)\n");
}

static void header(FILE *f, const char *pass) { fprintf(f, "# ---- after %s\n", pass); }

int kl_pipeline_rewrite(kl_graph *g, const kl_pipeline_options *o, kl_error *err) {
  /* before precision: the folded weights are rounded once, from float64,
   * and no batch norm statistics reach a low type */
  if (o->train && kl_train_build(g, o->precision && o->precision->low == KL_F16, err)) return -1;
  if (o->train && dumps(o, "train")) header(o->dump, "train"), kl_print_graph(o->dump, g);
  bool dump_bn = dumps(o, "bnfold");
  if (dump_bn) header(o->dump, "bnfold");
  if (kl_fold_batch_norms(g, dump_bn ? o->dump : NULL, err)) return -1;
  if (o->precision && kl_assign_precision(g, o->precision, err)) return -1;
  if (dumps(o, "precision")) header(o->dump, "precision"), kl_print_graph(o->dump, g);
  return 0;
}

int kl_pipeline(const kl_graph *g, const kl_pipeline_options *o, kl_plan *p, kl_error *err) {
  double t0 = now_ms();
  kl_plan_init(p, g, o->target, !o->no_fuse);
  if (kl_schedule(g, p->order, err)) return -1;
  kl_plan_live(p);
  if (dumps(o, "schedule")) header(o->dump, "schedule"), dump_schedule(o->dump, p);
  if (kl_plan_fold(p, err)) return -1;
  if (dumps(o, "fold")) header(o->dump, "fold"), dump_fold(o->dump, p);
  kl_plan_readers(p);
  kl_plan_gemms(p);
  if (kl_plan_fuse(p, err)) return -1;
  kl_plan_views(p);
  if (dumps(o, "fuse")) header(o->dump, "fuse"), kl_plan_print(o->dump, p);
  if (kl_plan_memory(p, o->mem_limit, err)) return -1;
  if (dumps(o, "memory")) header(o->dump, "memory"), kl_plan_print_memory(o->dump, p);
  p->passes_ms = now_ms() - t0;
  return 0;
}
