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
  unsigned char *params; /* their bytes: weights.bin, which model.c includes */
} kl_codegen_result;

/* NVRTC, loaded at run time: false (and why) when the library is not
 * there.  kl_nvrtc_compile builds `src` (kernels.cu) against the prelude
 * text for sm_XX (a cubin) or, with ptx, compute_XX (PTX text); *out is
 * malloc'd.  *log (malloc'd, may be NULL) receives NVRTC's messages:
 * warnings are there even when the compile succeeds. */
bool kl_nvrtc_available(char *why, size_t len);
int kl_nvrtc_compile(const char *src, const char *prelude, int sm, bool ptx, unsigned char **out,
                     size_t *out_len, char **log, kl_error *err);

int kl_codegen(const kl_graph *g, const kl_codegen_options *opt, kl_codegen_result *out,
               kl_error *err);
void kl_codegen_result_free(kl_codegen_result *r);

#endif
