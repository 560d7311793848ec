/* passes.h - transformations of IR graphs.  One public header for the
 * passes/ folder. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "../ir/ir.h"

/* Reverse-mode differentiation.  Appends to g the nodes that compute the
 * gradient of sum(y) with respect to each of xs (the seed is ones shaped
 * like y), and sets grads[i] to it; a value y does not depend on gets
 * zeros.  An op on the path without a gradient rule is an error naming it.
 * The rules live in autodiff.c, one case per op. */
int kl_autodiff(kl_graph *g, kl_value *y, kl_value *const *xs, int nxs, kl_value **grads,
                kl_error *err);

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

typedef struct {
  bool enabled;         /* false: singleton groups (--no-fuse) */
  int max_group_nodes;  /* bounds a kernel's size */
  /* the code generator can fuse this node into an elementwise kernel */
  bool (*elementwise)(const kl_node *n);
  /* ... or take it into a row kernel as a reduction over its input's
   * innermost axes (non-zero); NULL: no row groups */
  int (*row_kind)(const kl_node *n);
  /* how many innermost axes such a node reduces (NULL: one) */
  int (*row_axes)(const kl_node *n);
  /* ... or into a row kernel as an elementwise node (NULL: elementwise) */
  bool (*row_elementwise)(const kl_node *n);
  /* an elementwise-group node that reads its inputs around its element (a
   * direct convolution): it never joins a group that makes one of them
   * (NULL: none) */
  bool (*reads_window)(const kl_node *n);
  /* per node id: also such a node (a GEMM the elementwise kernel computes
   * element by element), by the code generator's choice (NULL: none) */
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
 * constant); the table is in precision.c. */
typedef enum {
  KL_PREC_UNLISTED, KL_PREC_ALLOW, KL_PREC_DENY, KL_PREC_FOLLOW, KL_PREC_KEEP
} kl_precision_class;

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
/* The op's class in the table (KL_PREC_UNLISTED if it has none yet). */
kl_precision_class kl_precision_op_class(kl_op op);
/* The class the pass uses for node n: the table, the user's lists, and
 * deny for unlisted ops. */
kl_precision_class kl_precision_node_class(const kl_node *n, const kl_precision_options *opt);
const char *kl_precision_class_name(kl_precision_class c);
/* The type node n computes in: its first float input's (a cast's or a
 * constant's: its output's). */
kl_dtype kl_precision_node_dtype(const kl_node *n);

#endif
