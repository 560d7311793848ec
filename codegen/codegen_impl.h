/* codegen_impl.h - shared by the files of codegen/ (internal). */
#ifndef KILN_CODEGEN_IMPL_H
#define KILN_CODEGEN_IMPL_H

#include <stdio.h>

#include "codegen.h"

/* ---- types, scalar expressions, kernels of single nodes (node_kernels.c) */
const char *kl_cg_storage(kl_dtype t);
/* Arithmetic type of a dtype in kernels: float for f16/bf16/f32, double
 * for f64, int64_t/uint64_t for integers. */
const char *kl_cg_compute_type(kl_dtype t);
/* Real arithmetic type for a template that weighs or averages elements of
 * dtype t: float for f16/bf16/f32 (a GPU's fast path), double for f64 and
 * for integers (whose values a float cannot all hold). */
const char *kl_cg_real_type(kl_dtype t);
/* The math-function suffix for real type ct: "f" for float (floorf), ""
 * for double. */
const char *kl_cg_real_suffix(const char *ct);
/* Expression of a stored element `expr` of dtype t converted to `to`. */
const char *kl_cg_load(char *buf, size_t len, kl_dtype t, const char *to, const char *expr);
/* Statement `dst = value;` rounding value to dtype t's storage. */
void kl_cg_store(FILE *f, kl_dtype t, const char *dst, const char *value);

/* ---- templates (templates_*.c), written through the emitter (emit_model.c)
 * A template turns one node into kernels (written to kernels.cu) and the
 * host code of run() that launches them or calls the runtime's GEMM.  The
 * families of templates are tables; emit_model.c asks each in turn. */
typedef struct kl_cg_emitter kl_cg_emitter;

typedef struct {
  bool (*handles)(const kl_node *n);
  /* 0, or -1 with the emitter's error set (kl_cg_fail) */
  int (*emit)(kl_cg_emitter *e, const kl_node *n);
  /* The scratch buffers emit asks for (kl_cg_scratch), in order, declared
   * before any code is written so the memory plan can place them: their
   * sizes into bytes[0..KL_CG_MAX_SCRATCH), how many (NULL: none). */
  int (*scratch)(const kl_node *n, size_t *bytes);
} kl_cg_template;
enum { KL_CG_MAX_SCRATCH = 4 };
/* The template that writes node n (emit_model.c asks each family in
 * turn), or NULL. */
const kl_cg_template *kl_cg_find_template(const kl_node *n);
/* kl_cg_target.scratch: the node's template's scratch. */
int kl_cg_node_scratch(const kl_node *n, size_t *bytes, int max);

extern const kl_cg_template kl_cg_templates_basic[];    /* templates_basic.c */
extern const kl_cg_template kl_cg_templates_movement[]; /* templates_movement.c */
extern const kl_cg_template kl_cg_templates_nn[];       /* templates_nn.c */
extern const kl_cg_template kl_cg_templates_sample[];   /* templates_sample.c */
extern const kl_cg_template kl_cg_templates_integer[];  /* templates_integer.c */
extern const kl_cg_template kl_cg_templates_train[];    /* templates_train.c */

/* The kernels.cu stream, and a fresh kernel: its name ("k7") and index. */
FILE *kl_cg_kernels(kl_cg_emitter *e);
int kl_cg_new_kernel(kl_cg_emitter *e, char *name, size_t len);
/* The run() stream, for comments and custom host code (the model is `m`,
 * errors go to err/errlen, a failing call is followed by `return -1;`). */
FILE *kl_cg_host(kl_cg_emitter *e);
/* C expression of a value's device pointer in run(), and of a scratch
 * buffer of `bytes` private to the current node (im2col and the like). */
const char *kl_cg_ptr(kl_cg_emitter *e, const kl_value *v, char *buf, size_t len);
const char *kl_cg_scratch(kl_cg_emitter *e, size_t bytes, char *buf, size_t len);
/* DRAM traffic of the current node beyond reading its inputs and writing
 * its outputs once (an im2col matrix written and read back). */
void kl_cg_count_dram(kl_cg_emitter *e, size_t bytes);
/* Run-time errors a kernel finds (templates_nn.c).  A kernel cannot stop
 * the run, so it raises a flag word of its own in m->flags: an index out
 * of range with atomicMax(flag, 0xFFFFFFFF - item), an integer division by
 * zero by writing 1.  compute() zeroes every flag first; run() reads them
 * all once, after the last kernel, and checks them in node order, so the
 * first failing node is the one reported, in the interpreter's words, and
 * nothing mid-way waits for the host (a CUDA graph captures the run).
 * flag: a new flag's pointer expression in buf; its number is returned. */
int kl_cg_flag(kl_cg_emitter *e, char *buf, size_t len);
/* Where run() checks the host copy of its inputs (in[i]) before the run
 * starts: the code written here may `return -1` with err set. */
FILE *kl_cg_input_checks(kl_cg_emitter *e);
/* "<op> (node '<name>'): <what> is out of range [0, c) (item i)" */
void kl_cg_flag_check(kl_cg_emitter *e, int flag, const kl_node *n, const char *what, int64_t c);
/* "<op> (node '<name>'): <message>" when the flag is not 0 */
void kl_cg_flag_raised(kl_cg_emitter *e, int flag, const kl_node *n, const char *message);
/* Launch kernel `k` over `threads` threads (grid-stride kernels: blocks of
 * 256, at most 4096 blocks) with the given pointer expressions as its
 * arguments, in order. */
void kl_cg_launch(kl_cg_emitter *e, int k, int64_t threads, const char *const *args, int nargs);
/* The same with the node's inputs then its output as arguments. */
void kl_cg_launch_node(kl_cg_emitter *e, int k, int64_t threads, const kl_node *n);
/* Launch kernel `k` on an explicit 1-D grid of `grid_x` blocks of `block_x`
 * threads (kernels that map blocks to rows or tiles); nothing when grid_x
 * is 0.  The _node form passes the node's inputs then its output. */
void kl_cg_launch_grid(kl_cg_emitter *e, int k, int64_t grid_x, int block_x,
                       const char *const *args, int nargs);
void kl_cg_launch_node_grid(kl_cg_emitter *e, int k, int64_t grid_x, int block_x,
                            const kl_node *n);
/* A runtime GEMM (see krt_gemm_desc): pointers as expressions.  batch2
 * (0 or 1: none) is an outer batch at strides *_2. */
typedef struct {
  kl_dtype dtype;
  int trans_a, trans_b;
  int64_t m, n, k, batch;
  const char *a; int64_t lda, stride_a;
  const char *b; int64_t ldb, stride_b;
  const char *c; int64_t ldc, stride_c;
  double alpha, beta;
  int64_t batch2, stride_a2, stride_b2, stride_c2;
  const char *c_in, *bias; /* the epilogue (krt_gemm_desc), NULL: none */
  int relu;
} kl_cg_gemm;
/* The epilogue emit_model.c chose for GEMM node n (bias, residual, relu
 * nodes after it, computed in the GEMM call): into g, with bufs holding
 * the pointer expressions. */
void kl_cg_gemm_epilogue(kl_cg_emitter *e, const kl_node *n, kl_cg_gemm *g, char bufs[2][160]);

/* How the current template reads value v (itself, or through views), and
 * where matmul n writes its result (its buffer, or a transpose's). */
void kl_cg_read_view(kl_cg_emitter *e, const kl_value *v, kl_view *out);
void kl_cg_write_view(kl_cg_emitter *e, const kl_node *n, kl_view *out);
/* The device pointer of a view's first element. */
const char *kl_cg_view_ptr(kl_cg_emitter *e, const kl_view *v, char *buf, size_t len);
void kl_cg_emit_gemm(kl_cg_emitter *e, const kl_cg_gemm *g);
int kl_cg_fail(kl_cg_emitter *e, const kl_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A one-line comment naming the node, its op and output, in both streams. */
void kl_cg_comment(kl_cg_emitter *e, const kl_node *n);
/* ---- scalar expressions and single-node kernels (node_kernels.c) -------- */
/* Has n a scalar expression (kl_target.scalar)?  An integer div/mod or
 * signed pow (kl_traps_zero_divisor) takes one more kernel argument, an
 * int flag it sets when a divisor is zero. */
bool kl_cg_is_elementwise(const kl_node *n);
/* Kernel writers: each emits one kernel named `name` and its emulator
 * entry for node n.  The first two are grid-stride kernels over the
 * output's elements (kl_cg_launch); the others return their grid. */
typedef struct {
  int64_t blocks; /* 0: nothing to launch */
  int threads;    /* per block */
} kl_cg_grid;
void kl_cg_elementwise(FILE *f, const char *name, const kl_node *n);
void kl_cg_gather_copy(FILE *f, const char *name, const kl_node *n);
kl_cg_grid kl_cg_transpose(FILE *f, const char *name, const kl_node *n);
kl_cg_grid kl_cg_softmax(FILE *f, const char *name, const kl_node *n);
kl_cg_grid kl_cg_reduce(FILE *f, const char *name, const kl_node *n);

/* ---- row kernels (node_kernels.c) ----------------------------------------
 * `rows` contiguous rows of `len` elements: a warp per row when rows are
 * short (up to 8 rows per block), else a block per row.  A kernel declares
 * its shared arrays, begins (row, lane), loops over its row's elements
 * (j), and combines a per-thread `acc` across the row's threads. */
typedef struct {
  int64_t rows, len;
  int threads;        /* per row: 32 (a warp) or the whole block */
  int rows_per_block; /* up to 8 (a warp each), or 1 */
  /* The row's threads as kiln_prelude.h's KL_ROW_LANES says: all of them
   * on a GPU, one on the host device (which would switch fibers at every
   * shuffle); false for a kernel whose own loops assume 32 lanes. */
  bool device_lanes;
} kl_cg_rows;
kl_cg_rows kl_cg_plan_rows(int64_t rows, int64_t len);
kl_cg_grid kl_cg_rows_grid(const kl_cg_rows *p);
/* At the top of the kernel: the per-warp partials of one combine (nothing
 * when a warp has the row). */
void kl_cg_rows_shared(FILE *f, const kl_cg_rows *p, const char *type, const char *name);
/* `row` (int64_t) and `lane` (int, 0..threads-1); threads past the last
 * row return, and with device_lanes the lanes past KL_ROW_SPAN(threads). */
void kl_cg_rows_begin(FILE *f, const kl_cg_rows *p);
/* Opens `for (int64_t j = lane; j < len; j += threads) {` (the stride
 * KL_ROW_SPAN(threads) with device_lanes). */
void kl_cg_rows_loop(FILE *f, const kl_cg_rows *p, const char *indent);
/* The same loop where its body folds the row into `acc`, for
 * kl_cg_rows_combine (which closes it). */
void kl_cg_rows_sum_loop(FILE *f, const kl_cg_rows *p, const char *indent);
/* Combines `acc` (a `type`) over the row's threads with `update`, a
 * statement of acc and v (v the other partial): every thread of the row
 * ends with the same acc.  `shared` names the array of kl_cg_rows_shared. */
void kl_cg_rows_combine(FILE *f, const kl_cg_rows *p, const char *indent, const char *type,
                        const char *update, const char *shared);

/* Pieces of node_kernels.c the fused kernels share. */
const char *kl_cg_expression(const kl_node *n, const char *ct, char *buf, size_t len);
const char *kl_cg_operand_type(const kl_node *n); /* compute type of n's operands */
void kl_cg_index_math(FILE *f, const kl_shape *out, const kl_value *const *ins, int nins);
void kl_cg_grid_stride_loop(FILE *f, int64_t n);

/* ---- fusion groups (emit_fused.c) --------------------------------------- */
/* The members' code (one thread's element idx, after the x registers are
 * loaded); `keep` (or NULL) keeps a register for the code after. */
void kl_cg_fused_members(FILE *f, kl_node *const *nodes, int n, const kl_group_io *io,
                         const char *store, const char *idx, const kl_value *keep);
/* A fused kernel's signature (`KL_KERNEL void name(in0.., out0..) {`)
 * and its emulator entry. */
void kl_cg_fused_params(FILE *f, const char *name, const kl_group_io *io);
void kl_cg_fused_entry(FILE *f, const char *name, const kl_group_io *io);
/* The kernel of an elementwise group: nodes[0..n) of one output shape in
 * schedule order. */
/* Blocks a tiled convolution needs (kl_target.tile_min_blocks of the
 * plan being written; kl_codegen sets it). */
extern int64_t kl_cg_min_blocks;
/* The target of that plan (which convolutions a warp an output sums). */
extern const kl_target *kl_cg_plan_target;
/* A direct convolution member at element idx (emit_rows.c's row groups):
 * into dst (a declared register) when not NULL, stored to its group
 * output when `store`. */
void kl_cg_conv_at(FILE *f, const kl_node *nd, const kl_group_io *io, const char *idx,
                   const char *dst, bool store);
/* The launch of a tiled convolution group; {0, 0}: one thread an element. */
kl_cg_grid kl_cg_fused_elementwise(FILE *f, const char *name, kl_node *const *nodes, int n,
                             const kl_group_io *io);

/* ---- row groups (emit_rows.c) -------------------------------------------
 * Elementwise nodes around reductions over the innermost axes (sum, mean,
 * max, min with keepdims; global_avg_pool), softmax / log_softmax and the
 * norms: one row kernel. */
void kl_cg_reduce_ops(const kl_node *n, const char **acc, const char **init, const char **update);
const char *kl_cg_softmax_value(const kl_node *n, bool dbl);
/* The kernel of a row group over `shape`, a row its last `axes` dims;
 * returns its grid. */
kl_cg_grid kl_cg_fused_rows(FILE *f, const char *name, kl_node *const *nodes, int n,
                            const kl_shape *shape, int axes, const kl_group_io *io);

/* ---- attention (emit_attention.c) ----------------------------------------
 * softmax(pre(Q @ K)) -> post -> @ V as one kernel, a warp per row of the
 * scores: the scores and the probabilities never reach memory.  pre and
 * post are chains of elementwise nodes (a scale, a mask, casts), each
 * value read by the next node only. */
/* The kernel: io holds the inputs of pre and post first, then the bases of
 * q, k and v, and the base of out; returns the grid. */
kl_cg_grid kl_cg_attention_kernel(FILE *f, const char *name, const kl_attention *a,
                                  const kl_view *q, const kl_view *k, const kl_view *v,
                                  const kl_view *out, const kl_group_io *io);

/* ---- one kl_codegen's state (emit_model.c: the steps; emitter.c: what
 * templates write through; host_code.c: model.c, model.h, the weights) */
typedef struct {
  const kl_graph *g;
  const kl_plan *p;       /* the passes' decisions: groups, GEMMs, views, memory */
  kl_error *err;
  kl_weight_piece *pieces; /* weights.bin, in offset order */
  int npieces;
  int nkernels, ngemms, nlaunches;
  int step;               /* the step being written */
  int next_scratch;       /* the step's next scratch buffer */
  char plan_error[400];   /* a pointer asked for outside the memory plan */
  size_t dram_bytes;
  /* the profiler's steps: those that launch something */
  int step_launches, nprofile, cap_profile;
  /* run-time error flags (kl_cg_flag) and run()'s checks of them */
  int nflags;
  FILE *checks_f;
  char *checks;
  size_t checks_len;
  /* run()'s checks of host input data, before anything runs */
  FILE *prechecks_f;
  char *prechecks;
  size_t prechecks_len;
  struct kl_cg_profile_step { char name[96]; int launches; size_t bytes; } *profile;
} kl_cg_ctx;

struct kl_cg_emitter {
  kl_cg_ctx *c;
  FILE *kf, *rf;          /* kernels.cu, and the current step's run() text */
  int nkernels, ngemms;
  const kl_node *node;    /* the node being written */
};

static inline size_t kl_cg_value_bytes(const kl_value *v) {
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}
/* Name of arena buffer b's offset in model.c (ARENA_3, SCRATCH_9), and the
 * C expression of a value's device pointer inside run(). */
const char *kl_cg_buf_macro(const kl_cg_ctx *c, int b, char *buf, size_t len);
const char *kl_cg_ptr_expr(const kl_cg_ctx *c, const kl_value *v, char *buf, size_t len);
/* What weights.bin holds at the memory plan's offsets (c->pieces): where
 * each weight lies, and folded values' bytes. */
int kl_cg_list_weights(kl_cg_ctx *c);
/* Free a list of weight pieces and the bytes they own (weights.c). */
void kl_cg_free_pieces(kl_weight_piece *pieces, int n);
/* model.h into hf; model.c into mf around run()'s body (run_text). */
int kl_cg_api_outputs(const kl_graph *g, const kl_value **out);
void kl_cg_write_host(kl_cg_ctx *c, const char *prefix, const char *run_text, size_t run_len,
                      FILE *mf, FILE *hf, int nkernels);

#endif
