/* frontend.h - reading models into the IR: the .kl DSL (flex + bison). */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "../ir/ir.h"

typedef struct {
  const char *name;
  int64_t value;
} kl_dim_override;

typedef struct {
  const kl_dim_override *dims; /* --dim NAME=V: replaces `dim NAME = ...` */
  int ndims;
  bool no_load;                /* refuse load("...") (fuzzing) */
} kl_parse_options;

/* Parse a .kl file into a verified graph.  NULL and err (file:line:col) on
 * any syntax, name, type or shape error.  `path` must outlive the graph's
 * locations (it is not copied). */
kl_graph *kl_parse_file(const char *path, const kl_parse_options *opt,
                        kl_error *err);
/* The same from memory; `filename` is used in locations and to resolve
 * load() paths. */
kl_graph *kl_parse_string(const char *text, size_t len, const char *filename,
                          const kl_parse_options *opt, kl_error *err);

/* A tensor of a .safetensors file whose bytes stay in the file: `data`
 * points into a read-only mapping of it that graph g keeps, so weights are
 * never copied (bool tensors are: into g's arena, each byte made 0 or 1). */
typedef struct {
  const char *name; /* in g's arena */
  kl_dtype dtype;
  kl_shape shape;
  const void *data;
} kl_mapped_tensor;
/* Every tensor of `path`, in header order, into *out (malloc'd, *n of
 * them); -1 with the reason (naming the file) in msg. */
int kl_safetensors_map(kl_graph *g, const char *path, kl_mapped_tensor **out, int *n,
                       char *msg, size_t len);

/* Read an ONNX model into a verified graph.  Symbolic or unknown input
 * dims are bound by `shapes` (--shape NAME=d0,d1,...).  Unsupported ops are
 * reported all at once: (op, opset, node name) for each. */
typedef struct {
  const char *input;
  kl_shape shape;
} kl_shape_binding;

/* An input frozen to a value at compile time: it becomes a constant, so
 * the shapes it decides (a Reshape target, Slice bounds, TopK's k) are
 * known, as Kiln's static shapes require. */
typedef struct {
  const char *input;
  const kl_tensor *value;
} kl_frozen_input;

typedef struct {
  const kl_shape_binding *shapes; /* checked against the declared rank and dims */
  int nshapes;
  const kl_dim_override *dims;    /* --dim NAME=V: every symbolic dim named NAME */
  int ndims;
  const kl_frozen_input *frozen;
  int nfrozen;
  bool unsupported_only; /* set on return when every error is "unsupported" */
  /* Set on return when loading failed because this graph input decides a
   * shape: freezing it would let the model compile (a name in the model's
   * protobuf, valid until the next load). */
  char needs_const[256];
} kl_onnx_options;

kl_graph *kl_onnx_load(const char *path, kl_onnx_options *opt, kl_error *err);

/* A graph input or output as the model declares it, before any binding.
 * A dim is symbolic when the model gives a dim_param (its name), nothing,
 * or, on an input, a dim_value <= 0 (exporters write -1 or 0 for "dynamic"):
 * those take the name NAME_dimK.  --dim binds a symbolic dim by its name. */
typedef struct {
  char name[256];               /* as the model spells it */
  bool tensor;                  /* false: a sequence, map or optional */
  int dtype;                    /* a kl_dtype, -1 when Kiln has none for it */
  int rank;                     /* -1: no shape declared */
  int64_t dims[KL_MAX_RANK];    /* the static dims */
  char dim_names[KL_MAX_RANK][80]; /* a symbolic dim's name; "" when static */
} kl_onnx_io;
typedef struct {
  kl_onnx_io *inputs, *outputs; /* malloc'd; inputs exclude initializers */
  int ninputs, noutputs;
  int nsymbolic;                /* symbolic dims over all inputs */
} kl_onnx_signature;
int kl_onnx_read_signature(const char *path, kl_onnx_signature *sig, kl_error *err);
void kl_onnx_signature_free(kl_onnx_signature *sig);
/* "f32[N, 3, 224, 224]" into buf. */
const char *kl_onnx_io_str(const kl_onnx_io *io, char *buf, size_t n);
/* Names of the model's graph inputs that are not initializers, in order
 * (the order of input_K.pb files); -1 with err when the file does not
 * load. */
int kl_onnx_input_names(const char *path, char (*names)[256], int cap, kl_error *err);
/* Load a model specialised to given input values (values[k] for the k-th
 * name of kl_onnx_input_names, NULL when not given), as `kiln run` and the
 * conformance runner do: symbolic dims are bound to the values' shapes, and
 * an input that decides a shape (a Reshape target, Slice bounds) is frozen
 * to its value, which sets frozen[k]. */
kl_graph *kl_onnx_load_for_inputs(const char *path, const char *const *names,
                                  kl_tensor *const *values, int n, bool *frozen,
                                  kl_onnx_options *opt, kl_error *err);
/* The same from memory (fuzzing); external data resolves against `path`. */
kl_graph *kl_onnx_load_bytes(const unsigned char *data, size_t len,
                             const char *path, kl_onnx_options *opt,
                             kl_error *err);
/* An ONNX TensorProto file (.pb) as a tensor (read by krt_pb_read of
 * libkilnrt_pb). */
kl_tensor *kl_read_tensor_pb(const char *path, kl_error *err);

#endif
