/* codegen.h - from a verified graph to CUDA C kernels (kernels.cu), the host
 * code that runs them (model.c) and its public header (model.h).  One
 * public header for the codegen/ folder.
 *
 * Today every node is its own group, so every kernel computes one node
 * (fusion, the next issue, makes groups of many); contractions are calls to
 * the runtime's GEMM.  Ops without a kernel template yet are reported, all
 * at once, as an error. */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "../ir/ir.h"

typedef struct {
  const char *prefix;   /* C identifier for the model's symbols ("mlp") */
} kl_codegen_options;

typedef struct {
  char *kernels_cu;     /* malloc'd, NUL-terminated */
  char *model_c;
  char *model_h;
  int nkernels;         /* kernels emitted */
  int ngemms;           /* runtime GEMM calls emitted */
  size_t arena_bytes;   /* intermediates */
  size_t param_bytes;   /* weights and constants */
} kl_codegen_result;

int kl_codegen(const kl_graph *g, const kl_codegen_options *opt, kl_codegen_result *out,
               kl_error *err);
void kl_codegen_result_free(kl_codegen_result *r);

#endif
