/* onnx_internal.h - the ONNX loader's context and the helpers that op
 * converters use (internal to frontend/).  Each converter turns one ONNX
 * node into IR nodes; converters live in onnx_ops_*.c, one family a file,
 * each file exporting a table that onnx_load.c searches. */
#ifndef KILN_ONNX_INTERNAL_H
#define KILN_ONNX_INTERNAL_H

#include "frontend.h"
#include "onnx.pb-c.h"

typedef struct kl_onnx_ctx kl_onnx_ctx;
typedef int (*kl_onnx_convert_fn)(kl_onnx_ctx *c, const Onnx__NodeProto *n);

/* One row per (op, first opset the converter handles).  A node binds to the
 * row of its op with the highest `since` not above the model's opset. */
typedef struct {
  const char *op;
  int since;
  kl_onnx_convert_fn convert;
} kl_onnx_op;

/* The newest opset Kiln reads, per domain: a model importing a newer one is
 * refused with the number (an op may have changed meaning since).  The
 * default domain's is the newest of ONNX 1.23 (onnx.defs.onnx_opset_version());
 * raise it when converters for a newer opset land. */
enum {
  KL_ONNX_MAX_OPSET = 28,        /* ai.onnx */
  KL_ONNX_MAX_OPSET_ML = 5,      /* ai.onnx.ml */
  KL_ONNX_MAX_OPSET_PREVIEW = 1  /* ai.onnx.preview, ai.onnx.preview.training */
};

/* The family tables, each ended by a row with op == NULL. */
extern const kl_onnx_op kl_onnx_ops_math[];      /* onnx_ops_math.c */
extern const kl_onnx_op kl_onnx_ops_nn[];        /* onnx_ops_nn.c */
extern const kl_onnx_op kl_onnx_ops_tensor[];    /* onnx_ops_tensor.c */
extern const kl_onnx_op kl_onnx_ops_sequence[];  /* onnx_ops_sequence.c */
extern const kl_onnx_op kl_onnx_ops_quant[];     /* onnx_ops_quant.c */
extern const kl_onnx_op kl_onnx_ops_rnn[];       /* onnx_ops_rnn.c */
extern const kl_onnx_op kl_onnx_ops_training[];  /* onnx_ops_training.c */
/* Rows for ops outside the default domain are named "domain.Op". */

/* A value is an IR tensor, or a sequence of them.  Sequences exist only
 * while loading: every position is a compile-time constant, so they unroll
 * into plain tensors and the IR never sees them. */
typedef struct {
  const char *name;     /* ONNX value name */
  kl_value *v;          /* its IR value (NULL for a sequence) */
  kl_value **seq;       /* a sequence's items */
  int seq_len;
  bool is_seq;
  kl_dtype seq_dtype;
  kl_tensor *konst;     /* its contents once known to be constant */
  bool const_checked;   /* konst was computed (or found impossible) */
} kl_onnx_binding;

struct kl_onnx_ctx {
  kl_graph *g;
  const char *path;     /* the model file, for messages and external data */
  int opset;            /* default-domain opset */
  kl_error *err;
  kl_onnx_binding *vals;
  int nvals, capvals;
  /* hash indexes into vals (index + 1; 0 is empty): by ONNX name (the
   * latest binding wins) and by IR value */
  int *by_name, *by_value;
  int index_cap;
  const Onnx__NodeProto *node; /* the node being converted */
  const char *blocking_input;  /* a graph input a compile-time value needs */
  const Onnx__ModelProto *model;
  const struct kl_onnx_file *file; /* the mapped model file, or NULL */
};

/* ---- for converters -------------------------------------------------- */
/* Fail naming the current node and op: "node 'n' (Op): ...". */
int kl_onnx_fail(kl_onnx_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The same for a feature Kiln lacks (an attribute value, a mode, a dtype)
 * rather than a malformed model: the conformance runner counts the test as
 * unsupported instead of failed. */
int kl_onnx_unsupported(kl_onnx_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Number of inputs given (trailing empty names do not count). */
int kl_onnx_ninputs(const Onnx__NodeProto *n);
/* Input k, or NULL when absent or given as "". */
kl_value *kl_onnx_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k);
/* Bind output k of the ONNX node to an IR value. */
int kl_onnx_bind(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value *v);

/* Sequence inputs and outputs: -1 with the error set when input k is not a
 * sequence.  *items stays owned by the graph. */
int kl_onnx_input_seq(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value ***items,
                      int *len, kl_dtype *dtype);
int kl_onnx_bind_seq(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value **items,
                     int len, kl_dtype dtype);

/* Add an IR node for the current ONNX node; returns its first output, or
 * NULL with the error set (located at the ONNX node). */
kl_value *kl_onnx_emit(kl_onnx_ctx *c, kl_op op, kl_value **ins, int nins,
                       const kl_attr *attrs, int nattrs);
/* The same, returning the node (for several outputs). */
kl_node *kl_onnx_emit_node(kl_onnx_ctx *c, kl_op op, kl_value **ins, int nins,
                           const kl_attr *attrs, int nattrs, int nouts);
/* A constant tensor of given dtype/shape from doubles (n values, or one
 * value broadcast). */
kl_value *kl_onnx_constant(kl_onnx_ctx *c, kl_dtype t, const kl_shape *s,
                           const double *vals, int n);
/* Scalar constant of the dtype of `like`. */
kl_value *kl_onnx_scalar(kl_onnx_ctx *c, kl_dtype t, double v);

/* Attributes of the ONNX node, with defaults. */
const Onnx__AttributeProto *kl_onnx_attr(const Onnx__NodeProto *n, const char *name);
int64_t kl_onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt);
double kl_onnx_attr_float(const Onnx__NodeProto *n, const char *name, double dflt);
/* NULL when absent; the string is NUL-terminated (copied into the graph). */
const char *kl_onnx_attr_string(kl_onnx_ctx *c, const Onnx__NodeProto *n,
                                const char *name, const char *dflt);
/* -1 when absent, else the count and *out. */
int kl_onnx_attr_ints(const Onnx__NodeProto *n, const char *name, const int64_t **out);

/* The contents of a value that must be known at compile time (a shape, a
 * slice bound, ...): initializers, Constant nodes and anything computed from
 * them alone.  NULL with the error set otherwise.  Owned by the context. */
const kl_tensor *kl_onnx_const(kl_onnx_ctx *c, kl_value *v, const char *what);
/* Same, as a list of integers (at most `cap`); -1 with the error set. */
int kl_onnx_const_ints(kl_onnx_ctx *c, kl_value *v, const char *what,
                       int64_t *out, int cap);

/* ONNX data type -> IR dtype; -1 when the IR has no such type. */
int kl_onnx_dtype(int onnx_type, kl_dtype *out);
/* TensorProto -> contents and shape.  Bytes in a file stay there: external
 * data (resolved against the model's folder) in a mapping the graph keeps,
 * and raw_data the loader took out of the protobuf, at `span` of the mapped
 * model file (span NULL or not .has: none); *raw then points into the
 * mapping and *owned is NULL.  Anything else is decoded into *owned
 * (malloc'd, *raw == *owned) for the caller to free.  -1 with c->err on a
 * malformed tensor. */
typedef struct kl_onnx_span kl_onnx_span;
int kl_onnx_tensor_data(kl_onnx_ctx *c, const Onnx__TensorProto *t, const kl_onnx_span *span,
                        kl_dtype *dtype, kl_shape *shape, const void **raw, void **owned);

/* An .onnx file mapped, not read (onnx_map.c): the model is parsed
 * without its main graph's initializers' raw_data, and spans[k] tells where
 * initializer k's lies in the file (.has false: it had none).  base is NULL
 * when the file could not be mapped and was read as it is. */
struct kl_onnx_span {
  size_t off, len;
  bool has;
};
typedef struct kl_onnx_file {
  unsigned char *base;
  size_t len;
  kl_onnx_span *spans;
  int nspans;
} kl_onnx_file;
/* NULL with err when the file cannot be read or does not parse. */
Onnx__ModelProto *kl_onnx_unpack_file(const char *path, kl_onnx_file *file, kl_error *err);
/* Unmaps (unless base was set to NULL: a graph took the mapping) and frees
 * the spans. */
void kl_onnx_file_close(kl_onnx_file *file);

/* A whole file into memory (malloc'd). */
unsigned char *kl_onnx_read_file(const char *path, size_t *len, kl_error *err);

/* Attribute builders for emit. */
static inline kl_attr kl_ai(const char *name, int64_t v) {
  return (kl_attr){.name = name, .kind = KL_ATTR_INT, .i = v};
}
static inline kl_attr kl_af(const char *name, double v) {
  return (kl_attr){.name = name, .kind = KL_ATTR_FLOAT, .f = v};
}
static inline kl_attr kl_ais(const char *name, const int64_t *v, int n) {
  return (kl_attr){.name = name, .kind = KL_ATTR_INTS, .ints = (int64_t *)v, .n = n};
}
static inline kl_attr kl_as(const char *name, const char *s) {
  return (kl_attr){.name = name, .kind = KL_ATTR_STRING, .s = s};
}
static inline kl_attr kl_adt(const char *name, kl_dtype t) {
  return (kl_attr){.name = name, .kind = KL_ATTR_DTYPE, .i = t};
}

#endif
