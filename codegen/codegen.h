/* codegen.h - from a plan (passes/pipeline.c: the groups, GEMMs, views and
 * memory the passes decided) to CUDA C kernels (kernels.cu), the host code
 * that runs them (model.c), its public header (model.h) and the weights
 * blob.  One public header for the codegen/ folder.  The code generator
 * decides nothing: it writes each step the plan lists, and tells the
 * passes what its kernels can do (kl_cg_target).  Ops without a kernel
 * template are reported, all at once, as an error. */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "../ir/ir.h"
#include "../passes/passes.h"

typedef struct {
  const char *prefix;   /* C identifier for the model's symbols ("mlp") */
} kl_codegen_options;

/* What this code generator's kernels can do, for the passes (target.c). */
extern const kl_target kl_cg_target;
/* kl_cg_target with the cut-offs measured for GPU architecture sm (90 for
 * sm_90; 0: unknown) and KILN_CUTOFFS's overrides (cutoffs.c); points at
 * static storage that the next call replaces. */
const kl_target *kl_cg_target_for(int sm);
/* Apply "name=count,..." to *t; -1 with the reason in why. */
int kl_cg_apply_cutoffs(kl_target *t, const char *spec, char *why, size_t why_len);
/* Where the row used for sm came from (a GPU and date, or the guesses). */
const char *kl_cg_cutoff_source(int sm);

/* For tests only: the IR name of an elementwise op ("relu") whose scalar
 * expression is made wrong (a/2 is added where operand a < 0), so that
 * `kiln check` has a known bug to find.  NULL (always, in kiln itself);
 * only the test build of the driver (main.c with KILN_TEST_BREAK_OP, the
 * kiln_test_break program) sets it, from the environment. */
extern const char *kl_cg_test_break_op;
/* ... or, when not 0 (KILN_TEST_BREAK_SCALE), that op's result times this
 * factor instead: a small error, for the mutation checks of the suites'
 * tolerances (tests/meta/test_mutation.sh). */
extern double kl_cg_test_break_scale;
/* For tests only (kiln_test_break, KILN_TEST_HIDE_NVRTC): act as if NVRTC
 * were not installed, so the tests that need it can show they fail. */
extern bool kl_cg_test_hide_nvrtc;

/* A stretch of weights.bin: `bytes` bytes at `offset`, taken from `data`
 * (a param's contents where the graph holds them, perhaps in a mapped
 * file, so the graph must outlive the result; or, `owned`, a folded value
 * that the result frees), or, when data is NULL, drawn from the seeded
 * init of `value` as they are written.  Between pieces: zeros. */
typedef struct {
  size_t offset, bytes;
  const void *data;
  const kl_value *value;
  bool mapped;          /* data lies in a file mapping: its pages are
                           dropped once written */
  bool owned;
} kl_weight_piece;

typedef struct {
  char *kernels_cu;     /* malloc'd, NUL-terminated */
  char *model_c;
  char *model_h;
  char header[160];     /* model_h's file name: "<prefix>.h", so that any
                           number of models' headers sit side by side */
  int nkernels;         /* kernels emitted */
  int ngemms;           /* runtime GEMM calls emitted */
  int nlaunches;        /* kernel launches and GEMM calls per run */
  bool data_parallel;   /* a training step that exchanges gradients over
                           ranks: its program links libkilnrt_mpi */
  double passes_ms;     /* the planning passes' time (kl_pipeline), before
                           kl_codegen ran */
  int ngroups, nfused_nodes; /* fusion groups; nodes in groups of two or more */
  /* per node id (malloc'd): its group, or -1 for nodes that run no kernel
   * of their own: dead, folded into the weights, or views (reshape) */
  int *node_group;
  kl_group_kind *group_kind; /* per group */
  size_t dram_bytes;    /* estimated bytes each run reads and writes in
                           device memory: per group, what it reads from
                           outside and what it stores */
  size_t arena_bytes;   /* intermediates: the planned arena */
  size_t arena_lower_bound; /* the most bytes alive at one step */
  size_t naive_bytes;   /* every intermediate in a place of its own */
  kl_membuf *membufs;   /* the plan (names malloc'd): values, then scratch */
  int nmembufs, nvalue_membufs; /* [0, nvalue_membufs) are values */
  char **step_names;    /* the node run at each step */
  int nsteps, peak_step;
  size_t param_bytes;   /* weights and constants: the size of weights.bin,
                           which model.c includes */
  kl_weight_piece *pieces; /* its contents, in offset order: no copy of the
                           weights is made until kl_codegen_write_weights */
  int npieces;
} kl_codegen_result;

/* NVRTC, loaded at run time: false (and why) when the library is not
 * there.  kl_nvrtc_compile builds `src` (kernels.cu) against the prelude
 * text for sm_XX (a cubin) or, with KL_NVRTC_PTX, compute_XX (PTX text);
 * *out is malloc'd.  *log (malloc'd, may be NULL) receives NVRTC's
 * messages: warnings are there even when the compile succeeds, and with
 * KL_NVRTC_RESOURCES (a cubin) ptxas's report of each kernel's registers,
 * spills, stack and shared memory (kl_nvrtc_resources reads it). */
enum { KL_NVRTC_PTX = 1, KL_NVRTC_RESOURCES = 2 };
bool kl_nvrtc_available(char *why, size_t len);
int kl_nvrtc_compile(const char *src, const char *prelude, int sm, int flags, unsigned char **out,
                     size_t *out_len, char **log, kl_error *err);

/* One kernel's resources, from ptxas's report in an NVRTC log. */
typedef struct {
  char name[64];
  int registers;
  long stack_bytes, spill_bytes, shared_bytes;
} kl_kernel_resources;
/* The kernels of a log, up to cap; how many there were. */
int kl_nvrtc_resources(const char *log, kl_kernel_resources *out, int cap);
/* Instructions with a .f64 type in PTX text (cvt.f64.f32, fma.rn.f64, ...). */
int kl_ptx_f64_instructions(const char *ptx);

/* The text of the plan the pipeline (passes/pipeline.c) made. */
int kl_codegen(const kl_plan *plan, const kl_codegen_options *opt, kl_codegen_result *out,
               kl_error *err);
void kl_codegen_result_free(kl_codegen_result *r);

/* weights.bin into file descriptor fd, each piece streamed from where it
 * lies a few MB at a time (mapped pages dropped once written), so memory
 * stays flat whatever the weights' size.  -1 with err on a failed write. */
int kl_codegen_write_weights(const kl_codegen_result *r, int fd, kl_error *err);
/* weights.bin in memory (malloc'd, param_bytes bytes and one more), for
 * small models and tests. */
unsigned char *kl_codegen_weights_blob(const kl_codegen_result *r);

#endif
