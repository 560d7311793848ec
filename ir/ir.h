/* ir.h - Kiln's intermediate representation: graphs of nodes over typed values,
 * the op table, shape inference, the verifier, the printer and the reference
 * interpreter.  One public header for the ir/ folder. */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- dtypes ---------------------------------------------------------- */
typedef enum {
  KL_F32, KL_F16, KL_BF16, KL_F64, KL_I8, KL_I32, KL_I64, KL_BOOL,
  KL_U8, KL_I16, KL_U16, KL_U32, KL_U64, /* mostly for ONNX models */
  /* ONNX's narrow types (Cast, QuantizeLinear, ...): fp8, 4- and 2-bit
   * integers, fp4 and E8M0.  Every one takes ONE BYTE PER ELEMENT inside
   * Kiln (IR, interpreter, device buffers, kernels): the sub-byte ones
   * (u4 i4 f4e2m1 u2 i2) are packed only where ONNX packs them, in
   * TensorProto contents and .pb files (runtime/pb/tensor_pb.c), so every
   * kernel and the memory planner stay byte-addressed.  i4/i2 hold their
   * value sign-extended in an int8, u4/u2 in a uint8, the floats their
   * code (fp4 in the low four bits). */
  KL_F8E4M3FN, KL_F8E4M3FNUZ, KL_F8E5M2, KL_F8E5M2FNUZ, KL_U4, KL_I4,
  KL_F4E2M1, KL_F8E8M0, KL_U2, KL_I2,
  KL_DTYPE_COUNT
} kl_dtype;

const char *kl_dtype_name(kl_dtype t);          /* "f32", "bf16", ... */
int kl_dtype_from_name(const char *s, kl_dtype *out); /* 0 on success */
size_t kl_dtype_size(kl_dtype t);               /* bytes per element */
bool kl_dtype_is_float(kl_dtype t);
bool kl_dtype_is_int(kl_dtype t);  /* signed and unsigned integers, not bool */
bool kl_dtype_is_unsigned(kl_dtype t);
/* The one-byte floats: fp8, fp4 and E8M0.  Not kl_dtype_is_float: no
 * arithmetic op takes them; they are cast, quantized and moved. */
bool kl_dtype_is_small_float(kl_dtype t);
/* Width in bits where ONNX packs the type (4 or 2), else 8 * size. */
int kl_dtype_bits(kl_dtype t);
/* Round a double to what `t` can hold (f32/f16/bf16 rounding, integer
 * truncation toward zero with wrap-around, bool to 0/1; the small floats
 * through f32, round to nearest even, overflow to Inf or NaN as ONNX's
 * Cast with saturate=0, E8M0 rounding down). */
double kl_dtype_round(kl_dtype t, double v);
/* E8M0 rounding modes of Cast's round_mode attribute. */
enum { KL_ROUND_UP, KL_ROUND_DOWN, KL_ROUND_NEAREST };
/* ONNX Cast from `from` to `to`: kl_dtype_round, except that saturate
 * clamps finite overflow and Inf to the largest finite value of an fp8 or
 * E8M0 target, E8M0 rounds by round_mode, and a float to a 4- or 2-bit
 * integer gives 0 when out of range (ONNX's reference). */
double kl_dtype_cast(kl_dtype from, kl_dtype to, double v, bool saturate, int round_mode);

/* ---- shapes ---------------------------------------------------------- */
#define KL_MAX_RANK 8
typedef struct {
  int rank;
  int64_t dims[KL_MAX_RANK];
} kl_shape;

int64_t kl_shape_numel(const kl_shape *s);
/* Strides of a row-major shape, in elements. */
void kl_shape_strides(const kl_shape *s, int64_t *strides);
bool kl_shape_equal(const kl_shape *a, const kl_shape *b);
/* Writes "[2, 3, 4]" into buf. */
const char *kl_shape_str(const kl_shape *s, char *buf, size_t n);
/* Largest element count we accept for one tensor (2^31 - 1): keeps every
 * index in 64-bit arithmetic far from overflow and catches absurd dims. */
#define KL_MAX_NUMEL ((int64_t)0x7fffffff)

/* ---- errors ---------------------------------------------------------- */
typedef struct {
  const char *file; /* NULL when unknown */
  int line, col;    /* 1-based; 0 when unknown */
} kl_loc;

typedef struct {
  kl_loc loc;
  char msg[1024];
  bool unsupported; /* a feature Kiln lacks, not a malformed input */
} kl_error;

/* Fill err and return -1, so callers can `return kl_fail(err, loc, ...)`. */
int kl_fail(kl_error *err, kl_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Print "file:line:col: error: msg", then the source line and a caret when
 * the file can be read. */
void kl_error_print(FILE *f, const kl_error *err);

/* ---- memory ---------------------------------------------------------- */
/* Bump allocator: everything a graph owns lives in its arena. */
typedef struct kl_arena_block kl_arena_block;
typedef struct {
  kl_arena_block *head;
} kl_arena;
void *kl_arena_alloc(kl_arena *a, size_t n);    /* zeroed; aborts only on OOM */
char *kl_arena_strdup(kl_arena *a, const char *s);
void kl_arena_free(kl_arena *a);

/* ---- attributes ------------------------------------------------------ */
typedef enum {
  KL_ATTR_INT, KL_ATTR_FLOAT, KL_ATTR_INTS, KL_ATTR_FLOATS, KL_ATTR_STRING,
  KL_ATTR_DTYPE
} kl_attr_kind;

typedef struct {
  const char *name;
  kl_attr_kind kind;
  int64_t i;          /* INT, DTYPE (a kl_dtype), and bools (0/1) */
  double f;           /* FLOAT */
  const char *s;      /* STRING */
  int64_t *ints;      /* INTS */
  double *floats;     /* FLOATS */
  int n;              /* length of ints/floats */
} kl_attr;

/* ---- the op table ---------------------------------------------------- */
typedef enum {
  KL_KIND_ELEMENTWISE, KL_KIND_REDUCTION, KL_KIND_NORMALIZATION,
  KL_KIND_CONTRACTION, KL_KIND_DATA_MOVEMENT, KL_KIND_SOURCE, KL_KIND_OPAQUE
} kl_op_kind;

/* The class of an op for the mixed-precision pass (passes/precision.c), the
 * `precision` column of ops.def: allow (runs in the low type), deny (runs
 * in fp32), follow (low when its non-weight float inputs are) or keep (its
 * type is spelled out).  KL_PREC_UNLISTED is in no row: it is what
 * kl_precision_op_class answers for an op id out of range. */
typedef enum {
  KL_PREC_UNLISTED, KL_PREC_ALLOW, KL_PREC_DENY, KL_PREC_FOLLOW, KL_PREC_KEEP
} kl_precision_class;

typedef enum {
#define KL_OP(id, name, onnx, kind, min_in, max_in, nout, attrs, prec, cuda) KL_OP_##id,
#include "ops.def"
#undef KL_OP
  KL_OP_COUNT
} kl_op;

typedef struct kl_graph kl_graph;
typedef struct kl_node kl_node;
typedef struct kl_value kl_value;

/* Interpreter tensors hold float64 whatever the dtype; results are rounded
 * to the value's dtype after each op, so arithmetic matches the dtype while
 * accumulation stays exact enough to serve as the oracle. */
typedef struct {
  kl_dtype dtype;
  kl_shape shape;
  int64_t numel;
  double *data;
} kl_tensor;

typedef int (*kl_infer_fn)(kl_node *n, kl_error *err);
typedef int (*kl_eval_fn)(const kl_node *n, kl_tensor **in, kl_tensor **out,
                          kl_error *err);

typedef struct {
  const char *name;       /* DSL / IR text name */
  const char *onnx;       /* ONNX op type, or NULL */
  kl_op_kind kind;
  int min_inputs, max_inputs; /* max -1: variadic */
  int noutputs;           /* -1: decided by attributes (split) */
  kl_infer_fn infer;
  kl_eval_fn eval;
  const char *attrs;      /* "name:kind ..." accepted attributes */
  kl_precision_class precision; /* for the mixed-precision pass */
  /* The scalar CUDA expression (codegen/node_kernels.c): a template over
   * operands a, b, c where %s is the float suffix; kl_op_cuda_custom when
   * codegen builds it from attributes or the compute type; NULL: none. */
  const char *cuda;
} kl_op_info;

extern const kl_op_info kl_ops[KL_OP_COUNT];
/* The `cuda` of rows whose expression codegen builds itself (CUSTOM). */
extern const char kl_op_cuda_custom[];
int kl_op_lookup(const char *name, kl_op *out); /* 0 on success */
/* The op whose row names ONNX op type `onnx_type`; 0 on success. */
int kl_op_lookup_onnx(const char *onnx_type, kl_op *out);

/* ---- gradient rules ----------------------------------------------------
 * Reverse-mode rules live beside each op's infer and eval, as
 * kl_grad_<id> in the family's ir/ops_*.c; ir/grads.def lists the ops that
 * have one and kl_op_grads[] holds them (NULL: no rule).  A rule gets the
 * adjoint of each output (dy[k], NULL when nothing reads that output) and
 * sets dx[i] for each float input it differentiates (NULL: none, e.g. an
 * index input).  dx[i] may have a broadcast shape; the autodiff pass
 * (passes/autodiff.c) sums it down to the input's shape and adds the
 * adjoints of values read twice.  Rules build nodes through kl_gb_*, which
 * pass NULL through, so a rule need not check each step. */
typedef struct kl_grad_ctx {
  kl_graph *g;
  kl_error *err;
  kl_loc loc;
  bool failed; /* a node could not be added; err says why */
} kl_grad_ctx;
typedef int (*kl_grad_fn)(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy,
                          kl_value **dx);
extern const kl_grad_fn kl_op_grads[];

/* ---- values, nodes, graphs ------------------------------------------- */
typedef enum {
  KL_VAL_NODE,   /* produced by a node */
  KL_VAL_INPUT,  /* graph input, fed at run time */
  KL_VAL_PARAM,  /* trainable weight */
  KL_VAL_CONST   /* constant (not trained) */
} kl_value_kind;

typedef enum {
  KL_INIT_NONE, KL_INIT_ZEROS, KL_INIT_ONES, KL_INIT_FULL, KL_INIT_RANDN,
  KL_INIT_UNIFORM, KL_INIT_LOAD, KL_INIT_DATA
} kl_init_kind;

/* How a param or const gets its contents. */
typedef struct {
  kl_init_kind kind;
  double a, b;        /* FULL: a = value; RANDN: a = std, b = mean;
                         UNIFORM: [a, b) */
  uint64_t seed;
  const char *path;   /* LOAD: .safetensors file (as written in the source) */
  const char *key;    /* LOAD: tensor name in the file */
} kl_init;

struct kl_value {
  const char *name;
  kl_dtype dtype;
  kl_shape shape;
  kl_value_kind kind;
  kl_node *producer;  /* KL_VAL_NODE only */
  int producer_output;
  kl_init init;       /* PARAM and CONST */
  void *data;         /* raw little-endian contents in `dtype`, or NULL */
  bool is_output;
  int id;             /* index in graph->values */
  kl_loc loc;
  /* A graph input's or output's name as the model spells it, when that is
   * not the IR name (an ONNX "sigmoid_0.tmp_0" is IR sigmoid_0_tmp_0);
   * NULL otherwise.  What users see: kl_value_label. */
  const char *label;
  /* A training step's new value of a param or optimizer state
   * (passes/train.c): a graph output that compiled code writes over
   * `updates` in place, and that is no output of the compiled model's API. */
  struct kl_value *updates;
};

static inline const char *kl_value_label(const kl_value *v) {
  return v->label ? v->label : v->name;
}

struct kl_node {
  kl_op op;
  const char *name;
  kl_value **inputs;
  int ninputs;
  kl_value **outputs;
  int noutputs;
  kl_attr *attrs;
  int nattrs;
  int id;             /* index in graph->nodes */
  kl_loc loc;
  kl_graph *graph;
  /* The ONNX node it was converted from, its name and op type (in the
   * graph's arena), so that messages name what the user wrote; NULL for
   * .kl models (loc says where) and for nodes the compiler adds. */
  const char *onnx_name, *onnx_op;
  /* An order without data: the node runs after this value is computed
   * (NULL: no such constraint).  Rematerialization (passes/remat.c) sets
   * it on the copies of forward nodes it makes for the backward pass, so
   * that they run next to their readers and not right after their inputs;
   * kl_topo_order, the scheduler and fusion respect it. */
  struct kl_value *after;
};

/* A .kl train block (docs/DSL.md): what the training compile
 * (passes/train.c) appends to the graph. */
typedef struct {
  const char *loss;      /* name of the loss value */
  const char *optimizer; /* "sgd", "adam", "adamw" */
  kl_attr *attrs;        /* optimizer hyper-parameters, all KL_ATTR_FLOAT:
                            lr; sgd: momentum, nesterov (0/1),
                            weight_decay; adam/adamw: beta1, beta2, eps,
                            weight_decay */
  int nattrs;
  const char *schedule;  /* NULL (constant), "constant", "step", "cosine" */
  kl_attr *schedule_attrs; /* all KL_ATTR_FLOAT: step: step_size, gamma;
                              cosine: warmup, total (steps), min_lr;
                              every schedule: warmup */
  int nschedule_attrs;
  double clip;           /* global-norm gradient clipping; 0: none */
  /* --data-parallel: the gradients are summed over the ranks of the run
   * (all_reduce nodes, buckets of at most bucket_bytes each, started as
   * soon as they are computed) and the update divides by the rank count,
   * the step's input in_world */
  bool data_parallel;
  size_t bucket_bytes;
  kl_loc loc;
  /* Set by the training compile (passes/train.c) once it has appended the
   * step: the inputs the training program feeds each step (f32 scalars),
   * the outputs it reads, and which user inputs hold the samples and the
   * labels.  The step's outputs are the model's own, then loss, ok and
   * grad_norm, then the update values (kl_value.updates), which are not
   * outputs of the compiled model's API. */
  bool built, loss_scaling;
  kl_value *in_x, *in_labels;           /* NULL when the loss reads none */
  kl_value *in_lr, *in_bias1, *in_bias2, *in_scale, *in_apply;
  kl_value *in_world;                   /* NULL unless data_parallel */
  int nbuckets;                         /* all_reduce nodes (data_parallel) */
  kl_value *out_loss, *out_ok, *out_norm, *out_logits; /* logits: NULL if none */
  int nstates, nparams;                 /* params trained (the first nparams
                                           states), then optimizer state */
  kl_value **states;
} kl_train;

#define KL_VEC(T) struct { T *items; int len, cap; }

/* Hash index from names to values or nodes, so lookups stay O(1) in graphs
 * of many thousands of nodes.  Entries are checked against the current
 * name, so a renamed item's old entry is harmless; renames go through
 * kl_graph_rename_*, which adds the new one. */
typedef struct {
  void **slots;   /* kl_value * or kl_node * */
  int cap, used;
} kl_name_index;

/* A file mapped read-only (mmap) that params' `data` point into: external
 * weights, safetensors, the raw_data of an .onnx file.  Weights are then
 * never copied into memory; pages are read from the page cache as they are
 * touched, and a writer that has passed them can drop them again
 * (kl_pages_release), so memory stays flat whatever the weights' size. */
typedef struct {
  char *path;   /* malloc'd */
  void *base;
  size_t len;
} kl_mapping;

struct kl_graph {
  kl_arena arena;
  const char *name;
  KL_VEC(kl_value *) values;   /* every value, in creation order */
  KL_VEC(kl_node *) nodes;     /* every node, in creation order */
  KL_VEC(kl_value *) inputs;   /* graph inputs, in declaration order */
  KL_VEC(kl_value *) params;   /* params and consts */
  KL_VEC(kl_value *) outputs;  /* graph outputs, in declaration order */
  kl_train *train;             /* NULL unless a train block was given */
  kl_name_index value_names, node_names;
  int auto_names[KL_OP_COUNT]; /* last k used for "<op>_k" node names */
  /* kl_graph_fresh_name / _value_name: the last base asked for and the
   * suffix after the one it got, so that a converter naming thousands of
   * nodes after one ONNX node probes once each, not from _1 every time */
  const char *fresh_base[2];
  int fresh_next[2];
  KL_VEC(kl_mapping) maps;     /* unmapped by kl_graph_free */
};

kl_graph *kl_graph_new(const char *name);
void kl_graph_free(kl_graph *g);

/* Values: names must be unique within a graph (checked by the verifier). */
kl_value *kl_graph_add_input(kl_graph *g, const char *name, kl_dtype t,
                             const kl_shape *s, kl_loc loc);
kl_value *kl_graph_add_param(kl_graph *g, const char *name, kl_dtype t,
                             const kl_shape *s, kl_value_kind kind,
                             kl_init init, kl_loc loc);
/* A constant with the given raw contents (copied). */
kl_value *kl_graph_add_const_data(kl_graph *g, const char *name, kl_dtype t,
                                  const kl_shape *s, const void *data,
                                  kl_loc loc);
int kl_graph_mark_output(kl_graph *g, kl_value *v, kl_error *err);

/* File mappings (mapped.c).  kl_graph_map_file maps the whole of `path`
 * read-only into g, once per path (a second call returns the first
 * mapping), and gives its size in *len; NULL with errno set when it cannot
 * (an empty file gives a non-NULL pointer to nothing).  Pages must never be
 * written.  kl_map_file maps without a graph, for a caller that hands the
 * mapping to one later (kl_graph_add_mapping takes ownership) or unmaps it
 * itself (kl_unmap_file). */
const unsigned char *kl_graph_map_file(kl_graph *g, const char *path, size_t *len);
void *kl_map_file(const char *path, size_t *len);
void kl_unmap_file(void *base, size_t len);
void kl_graph_add_mapping(kl_graph *g, const char *path, void *base, size_t len);
/* Whether [p, p + n) lies inside one of g's mappings. */
bool kl_graph_is_mapped(const kl_graph *g, const void *p, size_t n);
/* Drop the whole pages inside [p, p + n), which must lie in a read-only
 * file mapping, from this process's memory: they are read from the file
 * again if touched later.  Called after streaming weights through, so the
 * resident size does not grow with them. */
void kl_pages_release(const void *p, size_t n);
kl_value *kl_graph_find_value(const kl_graph *g, const char *name);
kl_node *kl_graph_find_node(const kl_graph *g, const char *name);
/* Rename (the name is copied into the graph); the caller keeps names
 * unique. */
void kl_graph_rename_value(kl_graph *g, kl_value *v, const char *name);
void kl_graph_rename_node(kl_graph *g, kl_node *n, const char *name);
/* Drop the params and consts that no node reads and that are not outputs
 * (an ONNX initializer consumed while loading: a Slice bound, a Reshape
 * target), so they are neither checked nor written as weights.  Values are
 * renumbered; returns how many were dropped. */
int kl_graph_drop_unread_params(kl_graph *g);

/* Add a node; runs shape inference, creating its outputs (named from
 * `out_names` when given, else "<name>" / "<name>.K").  Returns NULL and
 * fills err (located at `loc`) when the op rejects its inputs. */
kl_node *kl_graph_add_node(kl_graph *g, kl_op op, const char *name,
                           kl_value **inputs, int ninputs,
                           const kl_attr *attrs, int nattrs,
                           const char **out_names, int nouts_named,
                           kl_loc loc, kl_error *err);
/* A name not yet used in g, made from `base`: by any value or node, or
 * (value_name) by any value, since values and nodes are named apart. */
const char *kl_graph_fresh_name(kl_graph *g, const char *base);
const char *kl_graph_fresh_value_name(kl_graph *g, const char *base);

/* Attribute accessors used by op rows.  get_* return the default when the
 * attribute is absent; kind mismatches are caught by kl_attrs_check. */
const kl_attr *kl_node_attr(const kl_node *n, const char *name);
int64_t kl_attr_int(const kl_node *n, const char *name, int64_t dflt);
double kl_attr_float(const kl_node *n, const char *name, double dflt);
const char *kl_attr_string(const kl_node *n, const char *name,
                           const char *dflt);
/* Returns the list length (or -1 when absent) and points *out at it. */
int kl_attr_ints(const kl_node *n, const char *name, const int64_t **out);
/* A cast node's round_mode as KL_ROUND_*, -1 when it names none. */
int kl_cast_round_mode(const kl_node *n);

/* Output helpers for infer functions. */
void kl_set_output(kl_node *n, int k, kl_dtype t, const kl_shape *s);
/* NumPy broadcasting of two shapes; -1 and err on mismatch. */
int kl_broadcast_shapes(const kl_shape *a, const kl_shape *b, kl_shape *out,
                        kl_error *err, kl_loc loc);
/* Normalise an axis in [-rank, rank) to [0, rank); -1 and err if out. */
int kl_norm_axis(int64_t axis, int rank, int *out, const kl_node *n,
                 kl_error *err);

/* optim_step (ops_train.c): its state tensors per param (-1: bad algo),
 * its output count (-1: bad attributes), and its hyper-parameters
 * beta1, beta2, eps, weight_decay, momentum, nesterov with defaults. */
int kl_optim_state_count(const kl_node *n);
int kl_optim_step_noutputs(const kl_node *n);
void kl_optim_hyper(const kl_node *n, double h[6]);

/* Gradient-rule builders (ir/grad.c); NULL in, NULL out. */
kl_value *kl_gb_node(kl_grad_ctx *c, kl_op op, kl_value *const *ins, int nins,
                     const kl_attr *attrs, int nattrs);
kl_value *kl_gb1(kl_grad_ctx *c, kl_op op, kl_value *x);
kl_value *kl_gb2(kl_grad_ctx *c, kl_op op, kl_value *x, kl_value *y);
kl_value *kl_gb3(kl_grad_ctx *c, kl_op op, kl_value *x, kl_value *y, kl_value *z);
/* A rank-0 constant of dtype t (broadcasts in elementwise ops). */
kl_value *kl_gb_scalar(kl_grad_ctx *c, kl_dtype t, double v);
/* x reshaped to `shape`, and broadcast (expanded) to `shape`. */
kl_value *kl_gb_reshape(kl_grad_ctx *c, kl_value *x, const kl_shape *shape);
kl_value *kl_gb_expand(kl_grad_ctx *c, kl_value *x, const kl_shape *shape);
/* Sum x over `axes` (n of them), keeping those axes as 1. */
kl_value *kl_gb_sum(kl_grad_ctx *c, kl_value *x, const int64_t *axes, int n);
/* Sum a value of a broadcast shape down to `shape` (NumPy's rules). */
kl_value *kl_gb_sum_to(kl_grad_ctx *c, kl_value *x, const kl_shape *shape);
/* x with axes permuted. */
kl_value *kl_gb_transpose(kl_grad_ctx *c, kl_value *x, const int64_t *perm);
kl_value *kl_gb_cast(kl_grad_ctx *c, kl_value *x, kl_dtype t);
/* where(cond, a, 0) */
kl_value *kl_gb_mask(kl_grad_ctx *c, kl_value *cond, kl_value *a);

/* ---- passes over the whole graph ------------------------------------ */
/* Types, shapes (re-inferred and compared), names, dangling inputs,
 * outputs, cycles.  0 when the graph is well formed. */
int kl_verify(const kl_graph *g, kl_error *err);
/* Nodes in an order where every producer precedes its readers; -1 on a
 * cycle.  `order` must hold g->nodes.len entries. */
int kl_topo_order(const kl_graph *g, kl_node **order, kl_error *err);
/* Stable IR text, in the syntax the .kl parser reads back. */
void kl_print_graph(FILE *f, const kl_graph *g);
/* The same, with the contents too large to print (kl_print_inlines false:
 * data, or weights load()ed from elsewhere) as load(weights, key=NAME): the
 * caller writes them, by their names, into that .safetensors file (a path
 * relative to the printed file's folder), so the text parses back to the
 * same graph on its own.  kl_print_graph says only how large data is. */
void kl_print_graph_weights(FILE *f, const kl_graph *g, const char *weights);
bool kl_print_inlines(const kl_value *v);

/* The taps of a resize node (input index, weight) for output position o
 * along axis d, as the interpreter computes them, so that compiled kernels
 * use the very same coordinates; ntap 0 means outside (tf_crop_and_resize
 * extrapolates).  -1 when the node's attributes are invalid. */
enum { KL_RESIZE_MAX_TAPS = 64 }; /* antialias widens the filter up to this */
typedef struct {
  int64_t idx[KL_RESIZE_MAX_TAPS];
  double w[KL_RESIZE_MAX_TAPS];
  int ntap;
} kl_resize_taps;
int kl_resize_tap_at(const kl_node *n, int d, int64_t o, kl_resize_taps *out);

/* The geometry of a col2im node over its s spatial axes: image and block
 * lengths, strides, pads [begins.., ends..], dilations, and the number of
 * block positions per axis (nblk; their product is x's last dim).  -1 when
 * the node's attributes are invalid. */
typedef struct {
  int s;
  int64_t image[KL_MAX_RANK], block[KL_MAX_RANK], stride[KL_MAX_RANK];
  int64_t pad[2 * KL_MAX_RANK], dil[KL_MAX_RANK], nblk[KL_MAX_RANK];
} kl_col2im_geom;
int kl_col2im_geometry(const kl_node *n, kl_col2im_geom *g);

/* The geometry of a dft node: its axis, the transform length n, the
 * signal's length m along the axis and the output's (nout), the products of
 * the dims before the axis (outer) and between it and the last (inner), the
 * last dims of x and y (cin, cout: 1 real, 2 complex), and whether it is an
 * inverse and a one-sided transform.  -1 when the node is invalid. */
typedef struct {
  int axis, cin, cout;
  int64_t n, m, nout, outer, inner;
  bool inverse, onesided;
} kl_dft_geom;
int kl_dft_geometry(const kl_node *n, kl_dft_geom *g);

/* The n-grams of a tfidf node that count (length within [min_gram_length,
 * max_gram_length]), in pool order: length, offset in `pool`, output
 * column.  Returns how many (at most cap), -1 when the attributes are
 * malformed (kl_infer_TFIDF says how). */
typedef struct {
  int64_t len, off, col;
} kl_tfidf_gram;
int kl_tfidf_grams(const kl_node *n, kl_tfidf_gram *g, int64_t cap);

/* ---- reference interpreter ------------------------------------------ */
kl_tensor *kl_tensor_new(kl_dtype t, const kl_shape *s);
void kl_tensor_free(kl_tensor *t);
/* Convert between a tensor and raw little-endian contents in its dtype.
 * from_raw returns -1 when an i64 or u64 value lies beyond 2^53, where float64
 * (the interpreter's element type) is no longer exact: the oracle refuses
 * rather than answer wrongly. */
int kl_tensor_from_raw(kl_tensor *t, const void *raw);
#define KL_MAX_EXACT_I64 ((int64_t)1 << 53)
void kl_tensor_to_raw(const kl_tensor *t, void *raw);
/* One element of raw contents in dtype t: element i as float64 (*inexact
 * set, when not NULL, for an i64 or u64 beyond 2^53), and element i set to
 * v rounded to t.  What the two above do for each element, for code that
 * works through weights in their stored dtype, piece by piece. */
double kl_raw_get(kl_dtype t, const void *raw, int64_t i, bool *inexact);
void kl_raw_set(kl_dtype t, void *raw, int64_t i, double v);
/* Contents of a param/const as a tensor (fills from its init; LOAD must have
 * been resolved into `data` first). */
int kl_value_materialize(const kl_value *v, kl_tensor **out, kl_error *err);

/* Evaluate g.  `inputs` are in g->inputs order; `outputs` receives
 * g->outputs.len new tensors that the caller frees. */
int kl_interpret(const kl_graph *g, kl_tensor **inputs, kl_tensor **outputs,
                 kl_error *err);

/* Deterministic random numbers (splitmix64 + Box-Muller) shared by param
 * initialisation and `kiln run`'s fill-in inputs. */
typedef struct { uint64_t state; } kl_rng;
void kl_rng_seed(kl_rng *r, uint64_t seed);
uint64_t kl_rng_next(kl_rng *r);
double kl_rng_uniform(kl_rng *r);  /* [0, 1) */
double kl_rng_normal(kl_rng *r);   /* mean 0, std 1 */

/* The contents of a param/const with a seeded init (zeros, ones, full,
 * randn, uniform), the bytes kl_value_materialize then kl_tensor_to_raw
 * give, n elements at a time: the next n into raw (v's dtype), `rng`
 * carrying the draws from one call to the next.  Seed it with
 * kl_rng_seed(rng, v->init.seed) before the first call. */
void kl_init_fill_raw(const kl_value *v, kl_rng *rng, int64_t n, void *raw);

#endif
