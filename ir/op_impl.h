/* op_impl.h - prototypes of the per-op functions named by ops.def, shared by
 * the files that implement op rows (internal to ir/). */
#ifndef KILN_OP_IMPL_H
#define KILN_OP_IMPL_H
#include "ir.h"

#define KL_OP(id, name, onnx, kind, min_in, max_in, nout, attrs, prec, cuda) \
  int kl_infer_##id(kl_node *n, kl_error *err);                              \
  int kl_eval_##id(const kl_node *n, kl_tensor **in, kl_tensor **out,        \
                   kl_error *err);
#include "ops.def"
#undef KL_OP

/* The gradient rules ir/grads.def lists (ir.h, kl_grad_fn). */
#define KL_GRAD(id) \
  int kl_grad_##id(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx);
#include "grads.def"
#undef KL_GRAD

/* A rule that cannot differentiate this node: "no gradient for OP (node
 * 'NAME'): why", named as the autodiff pass names nodes without a rule
 * (the ONNX node's name when it came from one); -1, c->failed set. */
#define KL_GRAD_FAIL(c, n, ...) kl_grad_fail((c), (n), __VA_ARGS__)
int kl_grad_fail(kl_grad_ctx *c, const kl_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Error at the node's source location, prefixed with its op name. */
#define KL_NODE_FAIL(n, err, ...) kl_node_fail((n), (err), __VA_ARGS__)
int kl_node_fail(const kl_node *n, kl_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Flat index into a tensor of shape `src` for output multi-index `idx` of
 * shape `dst`, under NumPy broadcasting (src right-aligned against dst). */
int64_t kl_broadcast_index(const kl_shape *src, const kl_shape *dst,
                           const int64_t *idx);
/* Advance a multi-index over `s` in row-major order; false after the end. */
bool kl_index_next(const kl_shape *s, int64_t *idx);

/* Unmap g's file mappings (kl_graph_free). */
void kl_graph_unmap(kl_graph *g);

/* "f32[2, 3]": a value's dtype and shape, for error messages. */
const char *kl_value_str(const kl_value *v, char *buf, size_t n);
/* Element count of s; -1 for a negative dim or over KL_MAX_NUMEL. */
int64_t kl_checked_numel(const kl_shape *s);
/* kl_set_output after checking the shape is one we can hold. */
int kl_set_checked_output(kl_node *n, kl_error *err, int k, kl_dtype t,
                          const kl_shape *s);
/* A 0/1 flag attribute (`dflt` when absent) into *out; else an error. */
int kl_attr_flag(const kl_node *n, kl_error *err, const char *name,
                 int64_t dflt, bool *out);
/* An integer-dtype element value as int64, clamped (NaN gives 0). */
int64_t kl_to_i64(double v);
/* Two's-complement wrap of a 64-bit pattern to integer dtype t's width. */
double kl_wrap_to(kl_dtype t, uint64_t u);
/* Dtype checks shared by op rows: 0, or -1 with a message naming the
 * input (floats only; anything but bool). */
int kl_need_float(const kl_node *n, kl_error *err, const kl_value *v);
int kl_need_numeric(const kl_node *n, kl_error *err, const kl_value *v);
#endif
