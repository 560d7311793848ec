/* passes.h - transformations of IR graphs.  One public header for the
 * passes/ folder. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stdio.h>

#include "../ir/ir.h"

/* Reverse-mode differentiation.  Appends to g the nodes that compute the
 * gradient of sum(y) with respect to each of xs (the seed is ones shaped
 * like y), and sets grads[i] to it; a value y does not depend on gets
 * zeros.  Ops on the path without a gradient rule are one error naming
 * them all.  The rules live beside each op (ir/grads.def lists them).
 * kl_autodiff_seeded starts from `seed` (broadcast to y) instead of ones:
 * a loss scale. */
int kl_autodiff(kl_graph *g, kl_value *y, kl_value *const *xs, int nxs, kl_value **grads,
                kl_error *err);
int kl_autodiff_seeded(kl_graph *g, kl_value *y, kl_value *seed, kl_value *const *xs, int nxs,
                       kl_value **grads, kl_error *err);

/* The training compile (train.c): appends to g, which has a train block,
 * the backward graph, the global norm (clip, finite check) and the
 * optimizer update (kl_train documents what it records); 0 or -1.  A
 * second call does nothing.  loss_scaling: the step is seeded with the
 * loss scale and skipped when its gradients are not finite (fp16). */
int kl_train_build(kl_graph *g, bool loss_scaling, kl_error *err);

/* ---- fusion: groups of nodes, each one kernel (fusion.c) ---------------
 * Groups are listed in an order that runs them correctly; the nodes of
 * group g are nodes[first .. first + count), in schedule order. */
typedef enum {
  KL_GROUP_SINGLE,      /* one node, its own template */
  KL_GROUP_ELEMENTWISE, /* same-shaped elementwise nodes: one fused kernel */
  KL_GROUP_ROWS         /* reductions over the innermost axes (and softmax,
                           norms) with elementwise nodes around them: a row
                           kernel */
} kl_group_kind;

typedef struct {
  kl_group_kind kind;
  kl_shape shape;       /* elementwise: the output shape; rows: the rows */
  int row_axes;         /* rows: how many innermost axes make one row */
  int first, count;
} kl_group;

typedef struct {
  kl_group *groups;
  int ngroups;
  kl_node **nodes;
  int nnodes;
  int *group_of;        /* node id -> group; -1 for nodes not given */
  bool *stored;         /* value id -> written to memory: a graph output or
                           read by another group (else kept in registers) */
} kl_fusion;

typedef struct kl_target kl_target;
typedef struct {
  bool enabled;         /* false: singleton groups (--no-fuse) */
  const kl_target *target; /* what kernels can hold (rules.c) */
  /* per node id: also an elementwise-group node (a GEMM the elementwise
   * kernel computes element by element), by the GEMM pass's choice
   * (NULL: none) */
  const bool *direct;
  /* per node id: keep in a group of its own (NULL: none) */
  const bool *pinned;
} kl_fusion_options;

/* Partition order[0..n) (a topological order of the nodes to compute)
 * into groups; -1 only on an internal error. */
int kl_fuse(const kl_graph *g, kl_node *const *order, int n, const kl_fusion_options *opt,
            kl_fusion *out);
void kl_fusion_free(kl_fusion *f);

/* ---- memory: the order nodes run in, and where intermediates live ------
 * A topological order of g's nodes that keeps few bytes alive at once
 * (schedule.c): the greedy order or the graph's own, whichever peaks
 * lower.  Nodes no output depends on come last.  `order` holds
 * g->nodes.len entries; -1 on a cycle. */
int kl_schedule(const kl_graph *g, kl_node **order, kl_error *err);

/* Buffers are placed at multiples of KL_MEM_ALIGN bytes. */
#define KL_MEM_ALIGN 256

/* One request for arena space: alive from step `first` to step `last`,
 * both included.  A buffer may take over, in place, the space of an
 * earlier one (inplace_of < its own index) whose last step is its first:
 * the two then share one offset. */
typedef struct {
  const char *name;  /* for messages and pictures */
  size_t bytes;
  int first, last;
  int inplace_of;    /* -1: none */
  size_t offset;     /* kl_memplan's answer */
} kl_membuf;

typedef struct {
  size_t arena;       /* planned size: the end of the highest buffer */
  size_t lower_bound; /* most bytes alive at one step, in-place pairs once */
  size_t naive;       /* the sum of all buffers: no reuse at all */
  int peak_step;      /* a step where lower_bound is reached */
} kl_memplan_stats;

/* Sizes count in whole KL_MEM_ALIGN units, so lower_bound <= arena holds
 * for any aligned plan.  Offsets: greedy by size, best fit among the
 * buffers alive at the same time (memplan.c). */
void kl_memplan(kl_membuf *bufs, int n, kl_memplan_stats *st);
/* 0 when no two buffers alive at one step share a byte (in-place pairs
 * aside), every offset is aligned and every buffer ends within `arena`;
 * else -1 with the first offending pair described in msg. */
int kl_memplan_check(const kl_membuf *bufs, int n, size_t arena, char *msg, size_t len);

/* ---- precision assignment (precision.c) --------------------------------
 * Each op is allow (runs in the low type: contractions), deny (runs in
 * fp32: softmax, norms, reductions, exp/log, losses), follow (low when its
 * non-weight float inputs are: elementwise, data movement) or keep (cast,
 * constant); the class is the `precision` column of the op's row in
 * ir/ops.def, and kl_precision_class is declared in ir/ir.h. */

typedef struct {
  kl_dtype low;        /* KL_F16 or KL_BF16; KL_F32 lowers nothing */
  bool io_set;         /* inputs and outputs become `io` (f32/f16/bf16) */
  kl_dtype io;         /* else they keep their declared types */
  const char *const *fp32_ops;   /* op names moved to deny */
  int nfp32_ops;
  const char *const *fp32_nodes; /* nodes moved to deny: their names or
                                  * the names of values they give */
  int nfp32_nodes;
} kl_precision_options;

/* Rewrite g in place: f32 float values take the low type where their
 * nodes' classes say so, f32 weights read only in the low type are
 * converted at compile time, and casts named "<value>_to_<type>" join the
 * rest (fusion folds them into kernels).  f64 and integer values are
 * never changed.  The graph is verified afterwards.  An unknown op or node
 * name in the lists is an error. */
int kl_assign_precision(kl_graph *g, const kl_precision_options *opt, kl_error *err);
/* kl_ops[op].precision (KL_PREC_UNLISTED for an op id out of range). */
kl_precision_class kl_precision_op_class(kl_op op);
/* The class the table and the user's lists give node n (deny for unlisted
 * ops); the pass also denies nodes whose numbers do not fit the low type
 * (kl_precision_fp32_reason). */
kl_precision_class kl_precision_node_class(const kl_node *n, const kl_precision_options *opt);
const char *kl_precision_class_name(kl_precision_class c);
/* Why node n computes in fp32 rather than opt->low, as a sentence in buf:
 * its op's class (deny), --fp32-ops or --fp32-nodes, or a number it works
 * with that the low type cannot hold ("weight 'var' holds 1.05e+07, beyond
 * fp16's 65504", "epsilon 1e-12 flushes to 0 in fp16"; precision.c says
 * which numbers matter).  NULL when nothing keeps it in fp32 (it may
 * still follow an fp32 input). */
const char *kl_precision_fp32_reason(const kl_graph *g, const kl_node *n,
                                     const kl_precision_options *opt, char *buf, size_t len);
/* The type node n computes in: its first float input's (a cast's or a
 * constant's: its output's). */
kl_dtype kl_precision_node_dtype(const kl_node *n);

/* ---- batch norm folding (bnfold.c) -------------------------------------
 * Inference batch norms whose input is the only use of a conv2d,
 * conv_transpose2d, gemm or 2-D matmul output, with weights for scale,
 * bias, mean and var, are folded into that node's weight and bias
 * (computed in float64, rounded once); the batch norm and the weights no
 * one reads any more leave g.  Nothing is folded in a graph with a train
 * block.  With `dump`, one line per batch norm: folded into what, or why
 * not.  0, or -1 with err set. */
int kl_fold_batch_norms(kl_graph *g, FILE *dump, kl_error *err);

/* ---- views (views.c) -----------------------------------------------------
 * A value read in place: element (i0, .., ir-1) of it is element
 * offset + sum(i_d * strides[d]) of `base`, a value with a buffer. */
typedef struct {
  const kl_value *base;
  int64_t offset;
  kl_shape shape;
  int64_t strides[KL_MAX_RANK];
} kl_view;
void kl_view_identity(const kl_value *v, kl_view *out);
/* Ops whose outputs can be views of their input: transpose, split and
 * the reshape family. */
bool kl_view_op(const kl_node *n);
/* Output out_index of n as a view, given its input's; false when the
 * result is not a strided view of it (a reshape across strides). */
bool kl_view_apply(const kl_node *n, int out_index, const kl_view *in, kl_view *out);
/* A matmul C = A @ B (operands of rank >= 2, NumPy batch broadcasting) on
 * views as one GEMM call: offsets in elements of each base. */
typedef struct {
  int64_t m, n, k;
  int trans_a, trans_b;
  int64_t lda, ldb, ldc;
  int64_t batch, stride_a, stride_b, stride_c;
  int64_t batch2, stride_a2, stride_b2, stride_c2;
  int64_t offset_a, offset_b, offset_c;
} kl_mm_layout;
bool kl_matmul_layout(const kl_view *a, const kl_view *b, const kl_view *c, kl_mm_layout *out);

/* ---- the target: what the code generator can do ---------------------------
 * Numbers, not callbacks, except the one question only the code generator
 * can answer: whether it has a scalar expression for a node (its op and
 * types).  codegen provides one (kl_cg_target). */
struct kl_target {
  int max_group_nodes;          /* nodes in one fused kernel */
  int max_kernel_args;          /* pointers one fused kernel takes */
  int64_t direct_conv_max_k;    /* longest dot product of a direct convolution */
  int64_t direct_matmul_max_k;  /* ... of a GEMM inside an elementwise kernel */
  /* and the most multiply-adds of one (past them the library's tiles win
   * whatever the dot product's length) */
  int64_t direct_conv_max_macs, direct_matmul_max_macs;
  /* a direct convolution's outputs (its threads) per unit of its dot
   * product's length, at least: fewer make it latency-bound */
  int64_t direct_conv_min_outputs_per_k;
  /* ... and below this many outputs per unit of it a warp sums each output
   * (its lanes split the dot product): few long dot products keep the GPU
   * busy that way, where one a thread leaves it idle */
  int64_t direct_conv_split_below;
  int64_t tile_min_blocks;      /* a tiled convolution needs this many blocks, else one output a thread */
  /* nonzero: f16 and bf16 attention and convolutions on the tensor cores
   * (warp matrix multiply-adds); 0: their scalar kernels (to compare) */
  int64_t tensor_cores;
  int64_t attention_max_keys;   /* longest key row a fused attention takes */
  int64_t attention_mma_max_keys; /* ... in halves on the tensor cores */
  int64_t attention_row_max_keys, attention_max_head; /* the warp-per-row kernel's */
  int attention_max_chain;      /* elementwise nodes before / after its softmax */
  bool gemm_bias, gemm_residual, gemm_relu; /* epilogues the GEMM library does */
  bool (*scalar)(const kl_node *n);
  /* scratch bytes node n's own kernels need at its step (im2col, flags):
   * into bytes[0..), how many (at most max) */
  int (*scratch)(const kl_node *n, size_t *bytes, int max);
};

/* ---- what fusion groups can hold (rules.c) ------------------------------ */
/* 1 for a reduction over the innermost axes, 2 for softmax / log_softmax
 * over the last axis, 3 for a norm (layer_norm, rms_norm); 0 else. */
int kl_row_kind(const kl_node *n);
/* How many innermost axes of its input such a node takes as one row. */
int kl_row_axes(const kl_node *n);
/* Integer div/mod and signed integer pow: their kernels raise a flag. */
bool kl_traps_zero_divisor(const kl_node *n);
/* Inference batch_norm over axis 1 with 1-D parameters: a per-channel
 * scale and shift. */
bool kl_is_channel_affine(const kl_node *n);
/* A float conv2d an elementwise kernel computes element by element. */
bool kl_is_direct_conv(const kl_node *n, const kl_target *t);
/* ... one whose outputs a warp each sums (few, with long dot products:
 * kl_target.direct_conv_split_below); it never joins a row kernel, whose
 * lanes are its rows' elements. */
bool kl_is_split_conv(const kl_node *n, const kl_target *t);
/* A resize that repeats each input position r times per axis: ratio[d]
 * gets r (an elementwise kernel gathers it). */
bool kl_resize_ratios(const kl_node *n, int64_t *ratio);
/* A float conv_transpose2d the same (each output gathers its window). */
bool kl_is_direct_conv_transpose(const kl_node *n, const kl_target *t);
/* A float matmul short enough for the same. */
bool kl_is_direct_matmul(const kl_node *n, const kl_target *t);
/* An elementwise node with a scalar expression that raises no flag. */
bool kl_is_fusible(const kl_node *n, const kl_target *t);

/* ---- attention: softmax(pre(Q @ K)) -> post -> @ V, one kernel ---------- */
enum { KL_MAX_CHAIN = 12 };
typedef struct {
  const kl_node *qk, *softmax, *pv;
  kl_node *pre[KL_MAX_CHAIN], *post[KL_MAX_CHAIN];
  int npre, npost;
  /* the tiled kernel (any number of keys; a post chain of casts only),
   * else a warp per row of scores (attention_row_max_keys at most) */
  bool tiled;
} kl_attention;
/* Query rows per warp of the tiled attention kernel for heads of d (Q, K)
 * and dv (V) with products in types of these sizes (4 or 8 bytes): its
 * tiles must fit in 48 KB of shared memory; 0 when none fits. */
int kl_attention_rows_per_warp(int64_t d, int64_t dv, int qk_bytes, int pv_bytes);

/* Where a value lives: in the weights blob (offset), the arena (buffer
 * index), the model's input or output buffers (index), or nowhere of its
 * own (a view: read through kl_plan.view; a value inside a fused kernel
 * or a GEMM's epilogue). */
typedef enum { KL_LOC_NONE, KL_LOC_PARAM, KL_LOC_ARENA, KL_LOC_INPUT, KL_LOC_OUTPUT, KL_LOC_VIEW } kl_loc_kind;
typedef struct {
  kl_loc_kind kind;
  size_t offset; /* PARAM; ARENA, OUTPUT: bytes into the buffer (a concat's piece) */
  int index;     /* INPUT, OUTPUT; ARENA: its buffer */
} kl_location;

/* What a group's kernel reads (values made outside it) and writes (values
 * stored: graph outputs and values other groups read), in kernel argument
 * order: inputs, then outputs. */
enum { KL_MAX_GROUP_IO = 48 };
typedef struct {
  const kl_value *in[KL_MAX_GROUP_IO], *out[KL_MAX_GROUP_IO];
  int nin, nout;
  /* in[k] is read element for element (broadcast); else only as a
   * batch_norm's per-channel parameter */
  bool elementwise_read[KL_MAX_GROUP_IO];
  /* in[k] is a convolution's (or direct GEMM's) operand: read around the
   * element too, so no output may take its buffer */
  bool window_read[KL_MAX_GROUP_IO];
} kl_group_io;
void kl_group_io_of(kl_node *const *nodes, int n, const bool *stored, kl_group_io *io);

/* ---- the plan: every decision of the passes, for the code generator -----
 * Per node id unless said otherwise.  The code generator writes text from
 * it and decides nothing. */
typedef struct {
  const kl_graph *g;
  const kl_target *target;
  bool fuse;                /* not --no-fuse */
  kl_node **order;          /* the schedule: every node */
  bool *live;               /* some output depends on it */
  bool *folded;             /* computed at compile time, kept with the weights */
  kl_tensor **known;        /* per value id: folded values and the weights
                               they were computed from */
  kl_fusion fusion;         /* the groups, each one step */
  /* GEMM epilogues: the bias and residual a GEMM adds, relu, the last
   * node of its chain (whose output it writes); a node inside a chain
   * (no buffer); the GEMM a chain's last node belongs to */
  const kl_value **epi_bias, **epi_residual;
  bool *epi_relu, *epi_inner;
  const kl_node **epi_last, **epi_gemm;
  bool *direct;             /* a matmul an elementwise kernel computes */
  const kl_node **attn_head; /* the first matmul of its attention */
  kl_attention *attn;       /* at that matmul: the match */
  bool *view_node;          /* a movement node whose outputs are views */
  bool *absorbed;           /* no kernel of its own (in a GEMM or attention) */
  const kl_node **writes_into; /* a matmul: the transpose it writes through */
  kl_view *view;            /* per value id: how it is read */
  /* readers: per value id, the live computed nodes reading it (a node
   * once per operand), readers[reader_at[v] .. reader_at[v + 1]) */
  const kl_node **readers;
  int *reader_at;
  /* memory (plan_memory.c): where each value lives; arena buffers
   * (values first, then scratch) with their live steps and offsets; a
   * step's scratch is bufs[scratch_at[s] .. scratch_at[s + 1]) */
  kl_location *loc;         /* per value id */
  bool *alias;              /* a reshape & co whose output is its input's buffer,
                             * or a concat its inputs' producers write in place */
  const kl_node **piece_of; /* per value id: the concat it is written into, in place */
  kl_membuf *bufs;
  int nbufs, nvalue_bufs, cap_bufs;
  int *scratch_at;
  kl_memplan_stats mem;
  size_t param_bytes;       /* the weights blob, folded values included */
  double passes_ms;         /* the time the pipeline took */
} kl_plan;

/* What a step (a fusion group) runs, as the code generator will write it. */
typedef enum {
  KL_STEP_NONE,        /* no kernel: a view, an alias, a node inside a
                          GEMM's epilogue or an attention, a GEMM that
                          runs later with its epilogue */
  KL_STEP_NODE,        /* the node's own kernels (its template) */
  KL_STEP_ELEMENTWISE, /* one elementwise kernel */
  KL_STEP_ROWS,        /* one row kernel around reductions */
  KL_STEP_DIRECT_CONV, /* an elementwise kernel that computes a convolution */
  KL_STEP_DIRECT_GEMM, /* ... that computes a short matmul */
  KL_STEP_GEMM,        /* a GEMM library call, with its epilogue if any */
  KL_STEP_ATTENTION    /* one attention kernel */
} kl_step_kind;
extern const char *const kl_step_kind_names[];
kl_step_kind kl_plan_step_kind(const kl_plan *p, int group);
/* The GEMM whose epilogue (or attention) ends at node n, or NULL. */
const kl_node *kl_plan_epilogue_gemm(const kl_plan *p, const kl_node *n);

/* The one node reading v (once), or NULL: none, several, or an output. */
const kl_node *kl_plan_only_reader(const kl_plan *p, const kl_value *v);
/* Where matmul mm's result goes: its buffer, a transpose's, or its
 * epilogue's last node's. */
void kl_plan_result_view(const kl_plan *p, const kl_node *mm, kl_view *out);
/* Does the group hold more than one node? */
bool kl_plan_in_group(const kl_plan *p, const kl_node *n);

/* Evaluate n from tensors of its inputs (the interpreter), each output
 * rounded to its type as a kernel would store it; 0, or -1 with err set
 * and out[] empty. */
int kl_fold_eval(const kl_node *n, kl_tensor *const *in, kl_tensor **out, kl_error *err);

/* The passes that fill it (plan*.c, fold.c), in pipeline order. */
void kl_plan_init(kl_plan *p, const kl_graph *g, const kl_target *t, bool fuse);
void kl_plan_live(kl_plan *p);
int kl_plan_fold(kl_plan *p, kl_error *err);
void kl_plan_readers(kl_plan *p);
void kl_plan_gemms(kl_plan *p);
int kl_plan_fuse(kl_plan *p, kl_error *err);
void kl_plan_views(kl_plan *p);
/* Places every value, declares each step's buffers and scratch, and
 * plans the arena; over `limit` bytes (0: none) an error names the
 * largest buffers alive at the peak. */
int kl_plan_memory(kl_plan *p, size_t limit, kl_error *err);
/* The buffers of the plan as text (--dump-after=memory). */
void kl_plan_print_memory(FILE *f, const kl_plan *p);
/* The node a step is named after (its last). */
const kl_node *kl_plan_step_node(const kl_plan *p, int step);
void kl_plan_free(kl_plan *p);

/* ---- the pipeline (pipeline.c) -------------------------------------------
 * The one ordered list of what the compiler does to a graph:
 *   [train] -> bnfold -> precision -> [remat] -> schedule -> fold -> fuse -> memory
 * train, bnfold, precision and remat rewrite the graph, once per model
 * (kl_pipeline_rewrite; remat plans the graph to know what to rewrite); the
 * rest decide a plan and leave the graph as it is, once per compile (a
 * benchmark plans one graph fused and unfused).  fuse is attention,
 * direct GEMMs and epilogues, then the groups, then the views.  Each pass
 * may print what it did (--dump-after). */
typedef struct {
  const kl_precision_options *precision; /* NULL: none */
  bool train;               /* append the training step (kl_train_build) */
  const kl_target *target;
  bool no_fuse;
  size_t mem_limit;         /* bytes the arena may take; 0: no limit */
  FILE *dump;               /* where dumps go */
  FILE *notes;              /* where remat says what it recomputes (the
                               driver's stderr); NULL: nowhere */
  const char *dump_after;   /* a pass name, "all", or NULL */
} kl_pipeline_options;

/* Rematerialization (remat.c): when o->mem_limit is set and the planned
 * arena of g, a built training step, is over it, copy cheap forward nodes
 * into the backward pass (kl_node.after) instead of keeping their values
 * alive across the peak, cheapest first, planning again after each (with
 * o's target and fusion), until the plan fits.  One line per value on
 * o->notes, and on `log` (--dump-after=remat) also what was undone.  0, or
 * -1 when nothing more fits: the memory pass's error, plus what was
 * recomputed. */
int kl_remat(kl_graph *g, const kl_pipeline_options *o, FILE *log, kl_error *err);

extern const char *const kl_pipeline_passes[]; /* NULL-terminated */
/* The passes that rewrite g; 0 or -1. */
int kl_pipeline_rewrite(kl_graph *g, const kl_pipeline_options *o, kl_error *err);
/* The passes that plan g into *plan (kl_plan_free it, also after an
 * error); 0 or -1. */
int kl_pipeline(const kl_graph *g, const kl_pipeline_options *o, kl_plan *plan, kl_error *err);
/* Is name a pass (or "all")? */
bool kl_pipeline_has_pass(const char *name);
/* The readable text of the plan after fusion. */
void kl_plan_print(FILE *f, const kl_plan *p);

#endif
