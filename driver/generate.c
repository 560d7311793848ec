/* generate.c - a loaded graph to generated code: the planning passes
 * (passes/pipeline.c), then the code generator. */
#include <string.h>

#include "driver.h"

int kiln_cutoff_sm;

void kiln_cutoffs_for_device(krt_device_kind kind) {
  krt_device *probe = NULL;
  char msg[256];
  kiln_cutoff_sm = 0;
  if (!krt_device_open(kind, &probe, msg, sizeof msg)) kiln_cutoff_sm = krt_device_sm(probe);
  krt_device_close(probe);
}

int kiln_generate(const kl_graph *g, const kiln_compile_opts *co, kl_codegen_result *cg) {
  kl_error err;
  if (!kiln_generate_err(g, co, cg, &err)) return 0;
  kl_error_print(stderr, &err);
  return -1;
}

int kiln_generate_err(const kl_graph *g, const kiln_compile_opts *co, kl_codegen_result *cg,
                      kl_error *err) {
  kl_plan plan;
  kl_pipeline_options po = {.target = kl_cg_target_for(kiln_cutoff_sm), .no_fuse = co->no_fuse,
                            .mem_limit = co->mem_limit, .dump = stdout,
                            .dump_after = co->dump_after};
  kl_codegen_options copt = {.prefix = co->prefix ? co->prefix : g->name};
  kiln_progress("planning and generating code: %d nodes", g->nodes.len);
  int rc = kl_pipeline(g, &po, &plan, err);
  if (!rc) rc = kl_codegen(&plan, &copt, cg, err);
  else memset(cg, 0, sizeof *cg);
  kl_plan_free(&plan);
  return rc;
}
