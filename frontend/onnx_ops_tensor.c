/* onnx_ops_tensor.c - ONNX data-movement, shape and reduction ops, and the
 * sources (Constant, Shape) that feed compile-time shape computations. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "onnx_internal.h"

enum { MAX_LIST = 64 }; /* longest integer list a converter reads (split sizes) */

/* ---- helpers --------------------------------------------------------- */

/* Bind output 0 to y (NULL: the error is already set). */
static int bind0(kl_onnx_ctx *c, const Onnx__NodeProto *n, kl_value *y) {
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static kl_value *need_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k) {
  kl_value *v = kl_onnx_input(c, n, k);
  if (!v) kl_onnx_fail(c, "input %d is missing", k);
  return v;
}

/* An integer list that must be known at compile time.  Integer
 * initializers and Constant tensors are read from their raw bytes, so the
 * INT64_MAX that exporters write for "to the end" stays exact (the folding
 * interpreter holds doubles); anything else is folded. */
static int const_ints(kl_onnx_ctx *c, kl_value *v, const char *what, int64_t *out,
                      int cap) {
  if (v && v->data && (v->kind == KL_VAL_PARAM || v->kind == KL_VAL_CONST) &&
      (v->dtype == KL_I64 || v->dtype == KL_I32 || v->dtype == KL_I8)) {
    int64_t numel = kl_shape_numel(&v->shape);
    if (numel > cap)
      return kl_onnx_fail(c, "%s has %lld values (at most %d)", what, (long long)numel, cap);
    const unsigned char *p = v->data; /* may be unaligned: it can lie in a mapped file */
    for (int64_t i = 0; i < numel; i++) {
      int64_t x64;
      int32_t x32;
      if (v->dtype == KL_I64) memcpy(&x64, p + 8 * i, 8), out[i] = x64;
      else if (v->dtype == KL_I32) memcpy(&x32, p + 4 * i, 4), out[i] = x32;
      else out[i] = (int8_t)p[i];
    }
    return (int)numel;
  }
  return kl_onnx_const_ints(c, v, what, out, cap);
}

/* An integer list given as attribute `name` before opset `since` and as
 * input k from it on.  The count; -1 when absent; -2 on error. */
static int ints_arg(kl_onnx_ctx *c, const Onnx__NodeProto *n, const char *name, int k,
                    int since, int64_t *out, int cap) {
  if (c->opset < since) {
    const int64_t *p;
    int len = kl_onnx_attr_ints(n, name, &p);
    if (len > cap) {
      kl_onnx_fail(c, "attribute %s has %d values (at most %d)", name, len, cap);
      return -2;
    }
    if (len > 0) memcpy(out, p, (size_t)len * sizeof *p);
    return len;
  }
  kl_value *v = kl_onnx_input(c, n, k);
  if (!v) return -1;
  char what[64];
  snprintf(what, sizeof what, "the %s", name);
  int len = const_ints(c, v, what, out, cap);
  return len < 0 ? -2 : len;
}

/* A one-element input that must be known at compile time. */
static int const_scalar(kl_onnx_ctx *c, kl_value *v, const char *what, double *out) {
  const kl_tensor *t = kl_onnx_const(c, v, what);
  if (!t) return -1;
  if (t->numel != 1)
    return kl_onnx_fail(c, "%s must hold one value, got %lld", what, (long long)t->numel);
  *out = t->data[0];
  return 0;
}

/* A one-element integer input that must be known at compile time. */
static int const_int(kl_onnx_ctx *c, kl_value *v, const char *what, int64_t *out) {
  int64_t buf[2];
  int len = const_ints(c, v, what, buf, 2);
  if (len < 0) return -1;
  if (len != 1) return kl_onnx_fail(c, "%s must hold one value, got %d", what, len);
  *out = buf[0];
  return 0;
}

static kl_value *emit1(kl_onnx_ctx *c, kl_op op, kl_value *x, const kl_attr *a, int na) {
  return x ? kl_onnx_emit(c, op, &x, 1, a, na) : NULL;
}

static kl_value *emit2(kl_onnx_ctx *c, kl_op op, kl_value *a, kl_value *b) {
  kl_value *ins[2] = {a, b};
  return a && b ? kl_onnx_emit(c, op, ins, 2, NULL, 0) : NULL;
}

static kl_value *reshape_to(kl_onnx_ctx *c, kl_value *x, const kl_shape *s) {
  kl_attr a = kl_ais("shape", s->dims, s->rank);
  return emit1(c, KL_OP_RESHAPE, x, &a, 1);
}

/* A constant of values 0, 1, ..., len-1 (i64) laid along axis `at` of a
 * rank-`rank` shape of ones: it broadcasts against that axis. */
static kl_value *iota_along(kl_onnx_ctx *c, int64_t len, int at, int rank) {
  if (len > (1 << 24)) {
    kl_onnx_fail(c, "an axis of %lld elements is too long to index", (long long)len);
    return NULL;
  }
  kl_shape s = {.rank = rank};
  for (int d = 0; d < rank; d++) s.dims[d] = d == at ? len : 1;
  double *v = malloc((size_t)(len + 1) * sizeof *v);
  if (!v) abort();
  for (int64_t i = 0; i < len; i++) v[i] = (double)i;
  kl_value *y = kl_onnx_constant(c, KL_I64, &s, v, (int)len);
  free(v);
  return y;
}

/* Normalise an ONNX axis in [-rank, rank) (or up to rank when `inclusive`). */
static int onnx_axis(kl_onnx_ctx *c, int64_t axis, int rank, bool inclusive, int *out) {
  int hi = inclusive ? rank + 1 : rank;
  if (axis < -hi || axis >= hi)
    return kl_onnx_fail(c, "axis %lld is out of range for rank %d", (long long)axis, rank);
  *out = (int)(axis < 0 ? axis + hi : axis);
  return 0;
}

/* The contents of an input that decides an output's shape by its values
 * (NonZero, Unique, Compress): it must fold to a constant. */
static const kl_tensor *data_dependent(kl_onnx_ctx *c, kl_value *v, const char *what) {
  const kl_tensor *t = v ? kl_onnx_const(c, v, what) : NULL;
  if (!t)
    kl_onnx_fail(c, "the output shape depends on the values of %s (a data-dependent "
                    "shape); Kiln compiles static shapes, so %s must be a compile-time "
                    "constant", what, what);
  return t;
}

/* ---- sources and shapes ---------------------------------------------- */

static int convert_constant(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "value");
  kl_value *y = NULL;
  if (a && a->t) {
    kl_dtype dt;
    kl_shape s;
    const void *raw;
    void *owned;
    if (kl_onnx_tensor_data(c, a->t, NULL, &dt, &s, &raw, &owned)) return -1;
    char name[64];
    snprintf(name, sizeof name, "const_%d", c->g->values.len);
    y = kl_graph_add_const_data(c->g, kl_graph_fresh_name(c->g, name), dt, &s, raw,
                                (kl_loc){c->path, 0, 0});
    free(owned);
  } else if ((a = kl_onnx_attr(n, "value_float")) && a->has_f) {
    y = kl_onnx_scalar(c, KL_F32, a->f);
  } else if ((a = kl_onnx_attr(n, "value_int")) && a->has_i) {
    y = kl_onnx_scalar(c, KL_I64, (double)a->i);
  } else if ((a = kl_onnx_attr(n, "value_floats"))) {
    kl_shape s = {.rank = 1, .dims = {(int64_t)a->n_floats}};
    double *v = malloc((a->n_floats + 1) * sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < a->n_floats; i++) v[i] = a->floats[i];
    y = kl_onnx_constant(c, KL_F32, &s, v, (int)a->n_floats);
    free(v);
  } else if ((a = kl_onnx_attr(n, "value_ints"))) {
    kl_shape s = {.rank = 1, .dims = {(int64_t)a->n_ints}};
    double *v = malloc((a->n_ints + 1) * sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < a->n_ints; i++) v[i] = (double)a->ints[i];
    y = kl_onnx_constant(c, KL_I64, &s, v, (int)a->n_ints);
    free(v);
  } else {
    return kl_onnx_unsupported(c, "needs a value, value_float(s) or value_int(s) attribute "
                           "(strings and sparse tensors are not supported)");
  }
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

/* Shape is known at compile time: a constant. */
static int convert_shape(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  if (!x) return kl_onnx_fail(c, "input 0 is missing");
  int r = x->shape.rank;
  int64_t start = kl_onnx_attr_int(n, "start", 0), end = kl_onnx_attr_int(n, "end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = start < 0 ? 0 : start > r ? r : start;
  end = end < 0 ? 0 : end > r ? r : end;
  double dims[KL_MAX_RANK];
  int k = 0;
  for (int64_t d = start; d < end; d++) dims[k++] = (double)x->shape.dims[d];
  kl_shape s = {.rank = 1, .dims = {k}};
  kl_value *y = kl_onnx_constant(c, KL_I64, &s, dims, k);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_size(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  return x ? bind0(c, n, kl_onnx_scalar(c, KL_I64, (double)kl_shape_numel(&x->shape))) : -1;
}

/* ConstantOfShape(shape): `value` (a one-element tensor, default f32 0)
 * everywhere. */
static int convert_constant_of_shape(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  int64_t dims[KL_MAX_RANK];
  int r = const_ints(c, need_input(c, n, 0), "the shape", dims, KL_MAX_RANK);
  if (r < 0) return -1;
  kl_shape s = {.rank = r};
  for (int d = 0; d < r; d++) {
    if (dims[d] < 0) return kl_onnx_fail(c, "shape[%d] = %lld is negative", d, (long long)dims[d]);
    s.dims[d] = dims[d];
  }
  kl_dtype dt = KL_F32;
  double v = 0;
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "value");
  if (a && a->t) {
    kl_shape vs;
    const void *raw;
    void *owned;
    if (kl_onnx_tensor_data(c, a->t, NULL, &dt, &vs, &raw, &owned)) return -1;
    kl_tensor *t = kl_tensor_new(dt, &vs);
    int bad = t->numel != 1 || kl_tensor_from_raw(t, raw);
    if (!bad) v = t->data[0];
    kl_tensor_free(t);
    free(owned);
    if (bad) return kl_onnx_fail(c, "value must be a one-element tensor");
  }
  return bind0(c, n, kl_onnx_constant(c, dt, &s, &v, 1));
}

/* Range(start, limit, delta): its length depends on the values, so they
 * must be constants; the result is one. */
static int convert_range(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  static const char *const names[] = {"start", "limit", "delta"};
  double v[3];
  kl_value *start = need_input(c, n, 0);
  for (int k = 0; k < 3; k++)
    if (const_scalar(c, need_input(c, n, k), names[k], &v[k])) return -1;
  if (v[2] == 0) return kl_onnx_fail(c, "delta is 0");
  double len = ceil((v[1] - v[0]) / v[2]);
  if (!(len <= (1 << 24))) return kl_onnx_fail(c, "the range is too long (%g elements)", len);
  int64_t count = len > 0 ? (int64_t)len : 0;
  double *vals = malloc((size_t)(count + 1) * sizeof *vals);
  if (!vals) abort();
  for (int64_t i = 0; i < count; i++) vals[i] = v[0] + (double)i * v[2];
  kl_shape s = {.rank = 1, .dims = {count}};
  kl_value *y = kl_onnx_constant(c, start->dtype, &s, vals, (int)count);
  free(vals);
  return bind0(c, n, y);
}

/* EyeLike(x): a constant of x's 2-D shape, ones on diagonal k. */
static int convert_eye_like(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  if (x->shape.rank != 2) return kl_onnx_fail(c, "input must be 2-D");
  kl_dtype dt = x->dtype;
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "dtype");
  if (a && a->has_i && kl_onnx_dtype((int)a->i, &dt))
    return kl_onnx_unsupported(c, "dtype %lld is not supported", (long long)a->i);
  int64_t k = kl_onnx_attr_int(n, "k", 0), rows = x->shape.dims[0], cols = x->shape.dims[1];
  if (rows * cols > (1 << 24)) return kl_onnx_fail(c, "the input is too large");
  double *v = calloc((size_t)(rows * cols + 1), sizeof *v);
  if (!v) abort();
  for (int64_t i = 0; i < rows; i++)
    if (i + k >= 0 && i + k < cols) v[i * cols + i + k] = 1;
  kl_value *y = kl_onnx_constant(c, dt, &x->shape, v, (int)(rows * cols));
  free(v);
  return bind0(c, n, y);
}

/* ---- data movement --------------------------------------------------- */

/* Reshape: the target shape must be a compile-time constant; 0 copies the
 * input's dim unless allowzero. */
static int convert_reshape(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  int64_t shape[KL_MAX_RANK];
  int k = ints_arg(c, n, "shape", 1, 5, shape, KL_MAX_RANK);
  if (k == -2 || !x) return -1;
  if (k < 0) return kl_onnx_fail(c, "needs a shape");
  if (!kl_onnx_attr_int(n, "allowzero", 0))
    for (int d = 0; d < k; d++)
      if (shape[d] == 0) {
        if (d >= x->shape.rank) return kl_onnx_fail(c, "shape[%d] = 0 has no input dim to copy", d);
        shape[d] = x->shape.dims[d];
      }
  kl_attr a = kl_ais("shape", shape, k);
  return bind0(c, n, emit1(c, KL_OP_RESHAPE, x, &a, 1));
}

static int convert_transpose(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const int64_t *perm = NULL;
  int k = kl_onnx_attr_ints(n, "perm", &perm);
  kl_attr a = kl_ais("perm", perm, k);
  return bind0(c, n, emit1(c, KL_OP_TRANSPOSE, need_input(c, n, 0), &a, k >= 0 ? 1 : 0));
}

/* Concat: axis defaults to 1 before opset 4 and is required after. */
static int convert_concat(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  int nin = kl_onnx_ninputs(n);
  if (nin > 64) return kl_onnx_fail(c, "more than 64 inputs");
  kl_value *ins[64];
  int used = 0;
  for (int k = 0; k < nin; k++)
    if ((ins[used] = kl_onnx_input(c, n, k))) used++;
  if (!kl_onnx_attr(n, "axis") && c->opset >= 4) return kl_onnx_fail(c, "needs an axis");
  kl_attr a = kl_ai("axis", kl_onnx_attr_int(n, "axis", 1));
  return bind0(c, n, kl_onnx_emit(c, KL_OP_CONCAT, ins, used, &a, 1));
}

static int convert_flatten(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_attr a = kl_ai("axis", kl_onnx_attr_int(n, "axis", 1));
  return bind0(c, n, emit1(c, KL_OP_FLATTEN, need_input(c, n, 0), &a, 1));
}

/* Squeeze and Unsqueeze: axes as an attribute before opset 13, a constant
 * input after.  Squeeze without axes (or with none) drops every 1. */
static int convert_squeeze(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  bool un = n->op_type[0] == 'U';
  kl_value *x = need_input(c, n, 0);
  int64_t axes[KL_MAX_RANK];
  int na = ints_arg(c, n, "axes", 1, 13, axes, KL_MAX_RANK);
  if (na == -2 || !x) return -1;
  if (un && na < 0) return kl_onnx_fail(c, "needs axes");
  kl_attr a = kl_ais("axes", axes, na);
  return bind0(c, n, emit1(c, un ? KL_OP_UNSQUEEZE : KL_OP_SQUEEZE, x, &a, un || na > 0));
}

/* Exporters write INT64_MAX or INT64_MIN for "to the end" (PyTorch's
 * x[:, 1:]).  ONNX clamps bounds to the axis anyway, so a bound clamped into
 * [-d - 1, d] for an axis of length d selects the same elements, whatever
 * the step, and stays exact as the double the IR keeps. */
static void clamp_slice_bounds(int64_t *bounds, int nb, const int64_t *axes, int naxes,
                               const kl_value *x) {
  for (int i = 0; i < nb && x; i++) {
    int64_t axis = naxes >= 0 ? (i < naxes ? axes[i] : -KL_MAX_RANK - 1) : i;
    if (axis < 0) axis += x->shape.rank;
    if (axis < 0 || axis >= x->shape.rank) continue; /* the IR reports it */
    int64_t d = x->shape.dims[axis];
    bounds[i] = bounds[i] > d ? d : bounds[i] < -d - 1 ? -d - 1 : bounds[i];
  }
}

/* Slice: starts, ends, axes as attributes before opset 10; constant inputs
 * (with steps) from it on. */
static int convert_slice(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  static const char *const names[] = {"starts", "ends", "axes", "steps"};
  int64_t v[4][KL_MAX_RANK];
  int len[4];
  kl_attr a[4];
  int na = 0;
  kl_value *x = need_input(c, n, 0);
  for (int k = 0; k < 4; k++) {
    len[k] = ints_arg(c, n, names[k], k + 1, 10, v[k], KL_MAX_RANK);
    if (len[k] == -2) return -1;
    if (len[k] < 0 && k < 2) return kl_onnx_fail(c, "needs %s", names[k]);
  }
  for (int k = 0; k < 2; k++) clamp_slice_bounds(v[k], len[k], v[2], len[2], x);
  for (int k = 0; k < 4; k++)
    if (len[k] >= 0) a[na++] = kl_ais(names[k], v[k], len[k]);
  return bind0(c, n, emit1(c, KL_OP_SLICE, x, a, na));
}

/* Split: sizes as an attribute before opset 13, a constant input after;
 * without them equal parts, one per output (or num_outputs from opset 18,
 * the last part smaller). */
static int convert_split(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  int64_t sizes[MAX_LIST];
  int nout = (int)n->n_output, axis = 0;
  if (nout > MAX_LIST) return kl_onnx_fail(c, "more than %d outputs", MAX_LIST);
  int ns = ints_arg(c, n, "split", 1, 13, sizes, MAX_LIST);
  if (ns == -1 && c->opset < 2 && kl_onnx_input(c, n, 1))
    ns = const_ints(c, kl_onnx_input(c, n, 1), "the split", sizes, MAX_LIST);
  if (ns == -2 || !x || onnx_axis(c, kl_onnx_attr_int(n, "axis", 0), x->shape.rank, false, &axis))
    return -1;
  if (ns <= 0) {
    int64_t d = x->shape.dims[axis], parts = nout, part;
    const Onnx__AttributeProto *num = kl_onnx_attr(n, "num_outputs");
    if (c->opset >= 18 && num && num->has_i) {
      parts = num->i;
      if (parts != nout)
        return kl_onnx_fail(c, "num_outputs %lld for %d outputs", (long long)parts, nout);
      part = (d + parts - 1) / parts;
      if (part * (parts - 1) > d)
        return kl_onnx_fail(c, "axis of length %lld cannot make %lld parts", (long long)d,
                            (long long)parts);
    } else {
      if (parts < 1 || d % parts)
        return kl_onnx_fail(c, "axis of length %lld does not split into %lld equal parts",
                            (long long)d, (long long)parts);
      part = d / parts;
    }
    for (int k = 0; k < nout; k++) sizes[k] = k < nout - 1 ? part : d - part * (nout - 1);
    ns = nout;
  }
  if (ns != nout) return kl_onnx_fail(c, "%d sizes for %d outputs", ns, nout);
  kl_attr a[2] = {kl_ai("axis", axis), kl_ais("sizes", sizes, ns)};
  kl_node *node = kl_onnx_emit_node(c, KL_OP_SPLIT, &x, 1, a, 2, ns);
  if (!node) return -1;
  for (int k = 0; k < nout; k++)
    if (kl_onnx_bind(c, n, k, node->outputs[k])) return -1;
  return 0;
}

/* Expand: the target shape is a constant input. */
static int convert_expand(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  int64_t shape[KL_MAX_RANK];
  int k = const_ints(c, need_input(c, n, 1), "the shape", shape, KL_MAX_RANK);
  if (k < 0 || !x) return -1;
  kl_attr a = kl_ais("shape", shape, k);
  return bind0(c, n, emit1(c, KL_OP_EXPAND, x, &a, 1));
}

/* Tile(x, repeats) = reshape(expand(reshape(x))): each repeated axis d
 * becomes [1, d], expanded to [r, d], then merged to r*d.  Axes are done a
 * few at a time when the doubled rank would pass KL_MAX_RANK. */
static int convert_tile(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  int64_t reps[KL_MAX_RANK];
  int k = const_ints(c, need_input(c, n, 1), "the repeats", reps, KL_MAX_RANK);
  if (k < 0 || !x) return -1;
  int r = x->shape.rank;
  if (k != r) return kl_onnx_fail(c, "%d repeats for an input of rank %d", k, r);
  int64_t numel = kl_shape_numel(&x->shape);
  for (int a = 0; a < r; a++) {
    if (reps[a] < 0)
      return kl_onnx_fail(c, "repeats[%d] = %lld is negative", a, (long long)reps[a]);
    /* the tiled tensor must stay within the element limit (and the dim
     * products below within int64) */
    if (reps[a] > KL_MAX_NUMEL || (reps[a] && numel > KL_MAX_NUMEL / reps[a]))
      return kl_onnx_fail(c, "tiling gives more than %lld elements", (long long)KL_MAX_NUMEL);
    numel *= reps[a];
  }
  int a = 0;
  while (x) {
    while (a < r && reps[a] == 1) a++;
    if (a == r) break;
    if (r == KL_MAX_RANK) return kl_onnx_fail(c, "inputs of rank %d cannot be tiled", r);
    kl_shape split = {0}, wide = {0}, merged = x->shape;
    for (int d = 0, room = KL_MAX_RANK - r; d < r; d++) {
      bool take = d >= a && reps[d] != 1 && room > 0;
      if (take) {
        room--;
        split.dims[split.rank++] = 1;
        wide.dims[wide.rank++] = reps[d];
        merged.dims[d] *= reps[d];
        a = d + 1;
      }
      split.dims[split.rank++] = wide.dims[wide.rank++] = x->shape.dims[d];
    }
    kl_attr e = kl_ais("shape", wide.dims, wide.rank);
    x = reshape_to(c, emit1(c, KL_OP_EXPAND, reshape_to(c, x, &split), &e, 1), &merged);
  }
  return bind0(c, n, x);
}

/* Pad: pads (and value) as attributes before opset 11, constant inputs
 * after; axes (opset 18) names the axes the pads are for. */
static int convert_pad(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  int r = x->shape.rank, np, na = -1;
  int64_t pads[2 * KL_MAX_RANK], axes[KL_MAX_RANK], full[2 * KL_MAX_RANK] = {0};
  double value = 0;
  const char *mode = kl_onnx_attr_string(c, n, "mode", "constant");
  if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge") &&
      strcmp(mode, "wrap"))
    return kl_onnx_unsupported(c, "mode \"%s\" is not supported (constant, reflect, edge, wrap)",
                               mode);
  if (c->opset < 11) {
    np = ints_arg(c, n, c->opset < 2 ? "paddings" : "pads", 1, 11, pads, 2 * KL_MAX_RANK);
    value = kl_onnx_attr_float(n, "value", 0.0);
  } else {
    np = ints_arg(c, n, "pads", 1, 11, pads, 2 * KL_MAX_RANK);
    kl_value *v = kl_onnx_input(c, n, 2);
    if (v && const_scalar(c, v, "the constant value", &value)) return -1;
    if (kl_onnx_input(c, n, 3) &&
        (na = const_ints(c, kl_onnx_input(c, n, 3), "the axes", axes, KL_MAX_RANK)) < 0)
      return -1;
  }
  if (np == -2) return -1;
  if (np < 0) return kl_onnx_fail(c, "needs pads");
  if (na >= 0) { /* spread the pads of the named axes over all axes */
    if (np != 2 * na) return kl_onnx_fail(c, "%d pads for %d axes", np, na);
    for (int i = 0; i < na; i++) {
      int ax = 0;
      if (onnx_axis(c, axes[i], r, false, &ax)) return -1;
      full[ax] = pads[i];
      full[r + ax] = pads[na + i];
    }
    np = 2 * r;
    memcpy(pads, full, sizeof full);
  }
  kl_attr a[3] = {kl_ais("pads", pads, np), kl_as("mode", mode), kl_af("value", value)};
  return bind0(c, n, emit1(c, KL_OP_PAD, x, a, 3));
}

/* CenterCropPad: each named axis (default all) cropped or zero-padded to
 * shape[i] about its centre (the odd element goes to the end); one pad
 * node, whose negative pads crop. */
static int convert_center_crop_pad(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *sv = need_input(c, n, 1);
  if (!x || !sv) return -1;
  int r = x->shape.rank, na = r, ns;
  int64_t shape[KL_MAX_RANK], axes[KL_MAX_RANK], pads[2 * KL_MAX_RANK] = {0};
  if ((ns = const_ints(c, sv, "the shape", shape, KL_MAX_RANK)) < 0) return -1;
  const int64_t *ax;
  int k = kl_onnx_attr_ints(n, "axes", &ax);
  if (k > KL_MAX_RANK) return kl_onnx_fail(c, "axes has %d entries for rank %d", k, r);
  if (k >= 0) na = k;
  bool seen[KL_MAX_RANK] = {false};
  for (int i = 0; i < na; i++) {
    int a = i;
    if (k >= 0 && onnx_axis(c, ax[i], r, false, &a)) return -1;
    if (seen[a]) return kl_onnx_fail(c, "axis %d is named twice", a);
    seen[a] = true;
    axes[i] = a;
  }
  if (ns != na) return kl_onnx_fail(c, "shape has %d entries for %d axes", ns, na);
  for (int i = 0; i < na; i++) {
    int64_t a = axes[i], dim = x->shape.dims[a], want = shape[i];
    if (want < 0 || want > KL_MAX_NUMEL)
      return kl_onnx_fail(c, "shape[%d] = %lld is not a length", i, (long long)want);
    int64_t grow = want - dim; /* < 0: crop */
    int64_t half = (grow < 0 ? -grow : grow) / 2;
    pads[a] = grow < 0 ? -half : half;
    pads[r + a] = grow - pads[a];
  }
  kl_attr a[3] = {kl_ais("pads", pads, 2 * r), kl_as("mode", "constant"), kl_af("value", 0.0)};
  return bind0(c, n, emit1(c, KL_OP_PAD, x, a, 3));
}

static int convert_trilu(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  int64_t k = 0;
  if (kl_onnx_input(c, n, 1) && const_int(c, kl_onnx_input(c, n, 1), "k", &k)) return -1;
  kl_attr a[2] = {kl_ai("upper", kl_onnx_attr_int(n, "upper", 1)), kl_ai("k", k)};
  return bind0(c, n, emit1(c, KL_OP_TRILU, need_input(c, n, 0), a, 2));
}

/* ---- indexing -------------------------------------------------------- */

/* Gather, GatherElements (axis); GatherND (batch_dims); ScatterElements,
 * Scatter (axis, reduction); ScatterND (reduction): one IR op each. */
static int convert_indexing(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  static const struct { const char *onnx; kl_op op; int nin; bool axis, red; } rows[] = {
      {"Gather", KL_OP_GATHER, 2, true, false},
      {"GatherElements", KL_OP_GATHER_ELEMENTS, 2, true, false},
      {"GatherND", KL_OP_GATHER_ND, 2, false, false},
      {"ScatterElements", KL_OP_SCATTER_ELEMENTS, 3, true, true},
      {"Scatter", KL_OP_SCATTER_ELEMENTS, 3, true, true},
      {"ScatterND", KL_OP_SCATTER_ND, 3, false, true},
  };
  size_t i = 0;
  while (strcmp(rows[i].onnx, n->op_type)) i++;
  kl_value *ins[3];
  for (int k = 0; k < rows[i].nin; k++)
    if (!(ins[k] = need_input(c, n, k))) return -1;
  kl_attr a[2];
  int na = 0;
  if (rows[i].axis) a[na++] = kl_ai("axis", kl_onnx_attr_int(n, "axis", 0));
  if (rows[i].op == KL_OP_GATHER_ND)
    a[na++] = kl_ai("batch_dims", kl_onnx_attr_int(n, "batch_dims", 0));
  if (rows[i].red) a[na++] = kl_as("reduction", kl_onnx_attr_string(c, n, "reduction", "none"));
  return bind0(c, n, kl_onnx_emit(c, rows[i].op, ins, rows[i].nin, a, na));
}

/* OneHot(indices, depth, values) = where(unsqueeze(indices) == iota,
 * values[1], values[0]); negative indices count from depth. */
static int convert_one_hot(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *ix = need_input(c, n, 0), *vals = need_input(c, n, 2);
  double depth = 0;
  int axis = 0;
  if (!ix || !vals || const_scalar(c, need_input(c, n, 1), "depth", &depth)) return -1;
  if (!(depth >= 1 && depth <= (1 << 24))) return kl_onnx_fail(c, "depth %g is not valid", depth);
  if (vals->shape.rank != 1 || vals->shape.dims[0] != 2)
    return kl_onnx_fail(c, "values must be [off, on], a tensor of 2 elements");
  int r = ix->shape.rank;
  if (r + 1 > KL_MAX_RANK) return kl_onnx_fail(c, "indices of rank %d are too many axes", r);
  if (onnx_axis(c, kl_onnx_attr_int(n, "axis", -1), r, true, &axis)) return -1;
  int64_t at = axis;
  kl_attr to = kl_adt("to", KL_I64), ax = kl_ais("axes", &at, 1), g0 = kl_ai("axis", 0);
  if (ix->dtype != KL_I64) ix = emit1(c, KL_OP_CAST, ix, &to, 1);
  kl_value *d = kl_onnx_scalar(c, KL_I64, (int64_t)depth), *zero = kl_onnx_scalar(c, KL_I64, 0);
  kl_value *neg = emit2(c, KL_OP_LT, ix, zero);
  kl_value *ins[3] = {neg, emit2(c, KL_OP_ADD, ix, d), ix};
  ix = neg && ins[1] ? kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0) : NULL;
  kl_value *hit = emit2(c, KL_OP_EQ, emit1(c, KL_OP_UNSQUEEZE, ix, &ax, 1),
                        iota_along(c, (int64_t)depth, 0, r + 1 - axis));
  kl_value *pick[2];
  for (int k = 0; k < 2; k++) {
    kl_value *gin[2] = {vals, kl_onnx_scalar(c, KL_I64, k)};
    pick[k] = gin[1] ? kl_onnx_emit(c, KL_OP_GATHER, gin, 2, &g0, 1) : NULL;
  }
  kl_value *w[3] = {hit, pick[1], pick[0]};
  return bind0(c, n, hit && w[1] && w[2] ? kl_onnx_emit(c, KL_OP_WHERE, w, 3, NULL, 0) : NULL);
}

/* ReverseSequence: y = gather_elements(x, idx, time_axis) where along time
 * idx = len-1-t for t < len and t beyond it, per batch entry. */
static int convert_reverse_sequence(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0), *lens = need_input(c, n, 1);
  if (!x || !lens) return -1;
  int r = x->shape.rank, ta = 0, ba = 1;
  if (r < 2) return kl_onnx_fail(c, "input must have rank >= 2");
  if (onnx_axis(c, kl_onnx_attr_int(n, "time_axis", 0), r, false, &ta) ||
      onnx_axis(c, kl_onnx_attr_int(n, "batch_axis", 1), r, false, &ba))
    return -1;
  if (ta == ba) return kl_onnx_fail(c, "time_axis and batch_axis are the same");
  if (lens->shape.rank != 1 || lens->shape.dims[0] != x->shape.dims[ba])
    return kl_onnx_fail(c, "sequence_lens must have one entry per batch (%lld)",
                        (long long)x->shape.dims[ba]);
  kl_shape ls = {.rank = r};
  for (int d = 0; d < r; d++) ls.dims[d] = d == ba ? x->shape.dims[ba] : 1;
  kl_attr to = kl_adt("to", KL_I64), ex = kl_ais("shape", x->shape.dims, r), ax = kl_ai("axis", ta);
  if (lens->dtype != KL_I64) lens = emit1(c, KL_OP_CAST, lens, &to, 1);
  lens = reshape_to(c, lens, &ls);
  kl_value *t = iota_along(c, x->shape.dims[ta], ta, r);
  kl_value *rev = emit2(c, KL_OP_SUB, emit2(c, KL_OP_SUB, lens, kl_onnx_scalar(c, KL_I64, 1)), t);
  kl_value *w[3] = {emit2(c, KL_OP_LT, t, lens), rev, t};
  kl_value *idx = w[0] && rev ? kl_onnx_emit(c, KL_OP_WHERE, w, 3, NULL, 0) : NULL;
  kl_value *g[2] = {x, emit1(c, KL_OP_EXPAND, idx, &ex, 1)};
  return bind0(c, n, g[1] ? kl_onnx_emit(c, KL_OP_GATHER_ELEMENTS, g, 2, &ax, 1) : NULL);
}

/* NonZero of a constant: the [rank, count] i64 coordinates, a constant. */
static int convert_non_zero(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const kl_tensor *t = data_dependent(c, need_input(c, n, 0), "the input");
  if (!t) return -1;
  int r = t->shape.rank ? t->shape.rank : 1;
  int64_t count = 0;
  for (int64_t i = 0; i < t->numel; i++) count += t->data[i] != 0;
  double *v = malloc((size_t)(r * count + 1) * sizeof *v);
  if (!v) abort();
  for (int64_t i = 0, j = 0; i < t->numel; i++) {
    if (t->data[i] == 0) continue;
    int64_t rest = i; /* coordinates of flat index i, last axis fastest */
    for (int d = t->shape.rank - 1; d >= 0; d--) {
      v[d * count + j] = (double)(rest % t->shape.dims[d]);
      rest /= t->shape.dims[d];
    }
    if (!t->shape.rank) v[j] = 0;
    j++;
  }
  kl_shape s = {.rank = 2, .dims = {r, count}};
  kl_value *y = kl_onnx_constant(c, KL_I64, &s, v, (int)(r * count));
  free(v);
  return bind0(c, n, y);
}

/* Compress with a constant condition is a gather of the chosen indices
 * (of the flattened input when there is no axis). */
static int convert_compress(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  const kl_tensor *cond = data_dependent(c, need_input(c, n, 1), "the condition");
  if (!x || !cond) return -1;
  int axis = 0;
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "axis");
  if (a && a->has_i) {
    if (onnx_axis(c, a->i, x->shape.rank, false, &axis)) return -1;
  } else {
    kl_shape flat = {.rank = 1, .dims = {kl_shape_numel(&x->shape)}};
    if (!(x = reshape_to(c, x, &flat))) return -1;
  }
  int64_t dim = x->shape.dims[axis], count = 0;
  double *idx = malloc((size_t)(cond->numel + 1) * sizeof *idx);
  if (!idx) abort();
  for (int64_t i = 0; i < cond->numel; i++)
    if (cond->data[i] != 0) idx[count++] = (double)i;
  if (count && idx[count - 1] >= (double)dim) {
    long long bad = (long long)idx[count - 1];
    free(idx);
    return kl_onnx_fail(c, "the condition selects index %lld of an axis of %lld", bad,
                        (long long)dim);
  }
  kl_shape s = {.rank = 1, .dims = {count}};
  kl_value *g[2] = {x, kl_onnx_constant(c, KL_I64, &s, idx, (int)count)};
  free(idx);
  kl_attr ax = kl_ai("axis", axis);
  return bind0(c, n, g[1] ? kl_onnx_emit(c, KL_OP_GATHER, g, 2, &ax, 1) : NULL);
}

/* Unique of a constant: all four outputs are constants.  Items are the
 * slices along `axis` (single elements without one), compared
 * lexicographically. */
typedef struct {
  const double *base;
  int64_t outer, inner, len; /* item j = base[(o * len + j) * inner + i] */
} item_view;

static int item_cmp(const item_view *v, int64_t a, int64_t b) {
  for (int64_t o = 0; o < v->outer; o++)
    for (int64_t i = 0; i < v->inner; i++) {
      double x = v->base[(o * v->len + a) * v->inner + i];
      double y = v->base[(o * v->len + b) * v->inner + i];
      if (x != y) return x < y ? -1 : 1;
    }
  return 0;
}

/* Stable merge sort of item numbers a[0..n) (tmp: n scratch entries). */
static void sort_items(int64_t *a, int64_t *tmp, int64_t n, const item_view *v) {
  if (n < 2) return;
  int64_t h = n / 2, i = 0, j = h, k = 0;
  sort_items(a, tmp, h, v);
  sort_items(a + h, tmp, n - h, v);
  while (i < h || j < n)
    tmp[k++] = j == n || (i < h && item_cmp(v, a[i], a[j]) <= 0) ? a[i++] : a[j++];
  memcpy(a, tmp, (size_t)n * sizeof *a);
}

static int convert_unique(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const kl_tensor *t = data_dependent(c, need_input(c, n, 0), "the input");
  if (!t) return -1;
  item_view v = {t->data, 1, 1, t->numel};
  kl_shape ys = {.rank = 1, .dims = {0}};
  int axis = 0;
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "axis");
  if (a && a->has_i) {
    if (onnx_axis(c, a->i, t->shape.rank, false, &axis)) return -1;
    ys = t->shape;
    v.len = t->shape.dims[axis];
    for (int d = 0; d < t->shape.rank; d++)
      if (d != axis) *(d < axis ? &v.outer : &v.inner) *= t->shape.dims[d];
  }
  /* perm: items sorted (stable, so each run starts at its first
   * occurrence); group[j]: the run of item j; pos[g]: the output position
   * of run g (sorted, or by first occurrence). */
  int64_t len = v.len, nu = 0;
  int64_t *mem = malloc((size_t)(6 * len + 1) * sizeof *mem);
  if (!mem) abort();
  int64_t *perm = mem, *tmp = mem + len, *group = tmp + len, *first = group + len,
          *counts = first + len, *pos = counts + len;
  for (int64_t j = 0; j < len; j++) perm[j] = j;
  sort_items(perm, tmp, len, &v);
  for (int64_t k = 0; k < len; k++) {
    if (!k || item_cmp(&v, perm[k - 1], perm[k])) first[nu] = perm[k], counts[nu++] = 0;
    group[perm[k]] = nu - 1;
    counts[nu - 1]++;
  }
  bool sorted = kl_onnx_attr_int(n, "sorted", 1) != 0;
  for (int64_t g = 0; g < nu; g++) pos[g] = sorted ? g : -1;
  for (int64_t j = 0, next = 0; !sorted && j < len; j++)
    if (pos[group[j]] < 0) pos[group[j]] = next++;
  int64_t *order = tmp; /* order[p]: the run output at position p */
  for (int64_t g = 0; g < nu; g++) order[pos[g]] = g;
  ys.dims[axis] = nu;
  int64_t ny = v.outer * nu * v.inner;
  double *buf = malloc((size_t)(ny + len + 1) * sizeof *buf);
  if (!buf) abort();
  for (int64_t o = 0; o < v.outer; o++)
    for (int64_t p = 0; p < nu; p++)
      for (int64_t i = 0; i < v.inner; i++)
        buf[(o * nu + p) * v.inner + i] = v.base[(o * len + first[order[p]]) * v.inner + i];
  kl_value *outs[4] = {kl_onnx_constant(c, t->dtype, &ys, buf, (int)ny)};
  kl_shape s1 = {.rank = 1, .dims = {nu}}, s2 = {.rank = 1, .dims = {len}};
  for (int64_t p = 0; p < nu; p++) buf[p] = (double)first[order[p]];
  outs[1] = kl_onnx_constant(c, KL_I64, &s1, buf, (int)nu);
  for (int64_t j = 0; j < len; j++) buf[j] = (double)pos[group[j]];
  outs[2] = kl_onnx_constant(c, KL_I64, &s2, buf, (int)len);
  for (int64_t p = 0; p < nu; p++) buf[p] = (double)counts[order[p]];
  outs[3] = kl_onnx_constant(c, KL_I64, &s1, buf, (int)nu);
  free(buf);
  free(mem);
  for (int k = 0; k < 4; k++)
    if (!outs[k] || kl_onnx_bind(c, n, k, outs[k])) return -1;
  return 0;
}

/* ---- reductions ------------------------------------------------------ */

/* The plain reductions map onto an IR reduce; the others wrap reduce_sum
 * (or reduce_max) in elementwise ops. */
typedef enum { F_PLAIN, F_L1, F_L2, F_LOG_SUM, F_LOG_SUM_EXP, F_SUM_SQUARE } reduce_form;

static const struct {
  const char *onnx;
  kl_op op;
  reduce_form form;
} reductions[] = {
    {"ReduceSum", KL_OP_REDUCE_SUM, F_PLAIN},       {"ReduceMean", KL_OP_REDUCE_MEAN, F_PLAIN},
    {"ReduceMax", KL_OP_REDUCE_MAX, F_PLAIN},       {"ReduceMin", KL_OP_REDUCE_MIN, F_PLAIN},
    {"ReduceProd", KL_OP_REDUCE_PROD, F_PLAIN},     {"ReduceL1", KL_OP_REDUCE_SUM, F_L1},
    {"ReduceL2", KL_OP_REDUCE_SUM, F_L2},           {"ReduceLogSum", KL_OP_REDUCE_SUM, F_LOG_SUM},
    {"ReduceLogSumExp", KL_OP_REDUCE_SUM, F_LOG_SUM_EXP},
    {"ReduceSumSquare", KL_OP_REDUCE_SUM, F_SUM_SQUARE},
};

/* reduce over axes (all when na <= 0); with `noop` and no axes, nothing is
 * reduced (ONNX noop_with_empty_axes). */
static kl_value *reduce(kl_onnx_ctx *c, kl_op op, kl_value *x, const int64_t *axes, int na,
                        bool keep, bool noop) {
  if (noop && na <= 0) return x;
  kl_attr a[2] = {kl_ai("keepdims", keep), kl_ais("axes", axes, na)};
  return emit1(c, op, x, a, na > 0 ? 2 : 1);
}

/* The largest finite value of a float dtype. */
static double float_max(kl_dtype t) {
  return t == KL_F16 ? 65504.0 : t == KL_BF16 ? 3.3895313892515355e38
                    : t == KL_F64 ? DBL_MAX : FLT_MAX;
}

static int convert_reduce(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  size_t i = 0;
  while (strcmp(reductions[i].onnx, n->op_type)) i++;
  reduce_form form = reductions[i].form;
  kl_value *x = need_input(c, n, 0), *m = NULL;
  int64_t axes[KL_MAX_RANK];
  /* axes became an input in opset 13 for ReduceSum, 18 for the rest */
  int na = ints_arg(c, n, "axes", 1, !strcmp(n->op_type, "ReduceSum") ? 13 : 18, axes,
                    KL_MAX_RANK);
  if (na == -2 || !x) return -1;
  bool keep = kl_onnx_attr_int(n, "keepdims", 1) != 0;
  bool noop = kl_onnx_attr_int(n, "noop_with_empty_axes", 0) != 0;
  if (form == F_L1) x = emit1(c, KL_OP_ABS, x, NULL, 0);
  if (form == F_L2 || form == F_SUM_SQUARE) x = emit2(c, KL_OP_MUL, x, x);
  if (form == F_LOG_SUM_EXP && !kl_dtype_is_float(x->dtype))
    return kl_onnx_fail(c, "needs a floating-point input, got %s", kl_dtype_name(x->dtype));
  if (form == F_LOG_SUM_EXP) {
    /* max-shifted; the shift is clamped to finite values so that rows of
     * -inf give -inf and rows with +inf give +inf, not NaN */
    double big = float_max(x->dtype);
    m = reduce(c, KL_OP_REDUCE_MAX, x, axes, na, true, noop);
    m = emit2(c, KL_OP_MAXIMUM, m, kl_onnx_scalar(c, x->dtype, -big));
    m = emit2(c, KL_OP_MINIMUM, m, kl_onnx_scalar(c, x->dtype, big));
    x = emit1(c, KL_OP_EXP, emit2(c, KL_OP_SUB, x, m), NULL, 0);
  }
  kl_value *y = x ? reduce(c, reductions[i].op, x, axes, na, keep, noop) : NULL;
  if (form == F_L2) y = emit1(c, KL_OP_SQRT, y, NULL, 0);
  if (form == F_LOG_SUM || form == F_LOG_SUM_EXP) y = emit1(c, KL_OP_LOG, y, NULL, 0);
  if (form == F_LOG_SUM_EXP && y) y = emit2(c, KL_OP_ADD, y, reshape_to(c, m, &y->shape));
  return bind0(c, n, y);
}

/* ArgMax, ArgMin; select_last_index reverses the axis and maps the index
 * back (len - 1 - i). */
static int convert_arg(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  int axis = 0;
  if (!x || onnx_axis(c, kl_onnx_attr_int(n, "axis", 0), x->shape.rank, false, &axis)) return -1;
  bool last = kl_onnx_attr_int(n, "select_last_index", 0) != 0;
  if (last) {
    int64_t st = -1, en = INT64_MIN, ax = axis, sp = -1;
    kl_attr s[4] = {kl_ais("starts", &st, 1), kl_ais("ends", &en, 1), kl_ais("axes", &ax, 1),
                    kl_ais("steps", &sp, 1)};
    x = emit1(c, KL_OP_SLICE, x, s, 4);
  }
  int64_t len = x ? x->shape.dims[axis] : 0;
  kl_attr a[2] = {kl_ai("axis", axis), kl_ai("keepdims", kl_onnx_attr_int(n, "keepdims", 1))};
  kl_value *y = emit1(c, !strcmp(n->op_type, "ArgMax") ? KL_OP_ARGMAX : KL_OP_ARGMIN, x, a, 2);
  if (last) y = emit2(c, KL_OP_SUB, kl_onnx_scalar(c, KL_I64, (double)(len - 1)), y);
  return bind0(c, n, y);
}

/* TensorScatter (a KV cache update): update's rows along `axis` go to
 * past_cache at write_indices[b] + i (mod the axis length when mode is
 * circular), one start per batch entry b (axis 0): scatter_elements with
 * those indices.  A linear write past the end is a run-time error. */
static int convert_tensor_scatter(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *past = need_input(c, n, 0), *upd = need_input(c, n, 1), *wi = kl_onnx_input(c, n, 2);
  if (!past || !upd) return -1;
  int r = past->shape.rank, axis = 0;
  const char *mode = kl_onnx_attr_string(c, n, "mode", "linear");
  bool circular = !strcmp(mode, "circular");
  if (!circular && strcmp(mode, "linear"))
    return kl_onnx_fail(c, "mode must be linear or circular, got \"%s\"", mode);
  if (onnx_axis(c, kl_onnx_attr_int(n, "axis", -2), r, false, &axis)) return -1;
  if (r < 2 || axis == 0) return kl_onnx_fail(c, "axis must not be the batch axis 0");
  if (upd->shape.rank != r) return kl_onnx_fail(c, "update must have past_cache's rank %d", r);
  for (int d = 0; d < r; d++)
    if (d != axis && upd->shape.dims[d] != past->shape.dims[d])
      return kl_onnx_fail(c, "update's axis %d has %lld elements, past_cache's %lld", d,
                          (long long)upd->shape.dims[d], (long long)past->shape.dims[d]);
  int64_t len = past->shape.dims[axis], seq = upd->shape.dims[axis];
  if (seq > len) return kl_onnx_fail(c, "update has %lld rows along axis %d, the cache %lld",
                                     (long long)seq, axis, (long long)len);
  kl_value *start = NULL;
  if (wi) {
    if (wi->dtype != KL_I64 || wi->shape.rank != 1 || wi->shape.dims[0] != past->shape.dims[0])
      return kl_onnx_fail(c, "write_indices must be i64[%lld]", (long long)past->shape.dims[0]);
    kl_shape bs = {.rank = r};
    for (int d = 0; d < r; d++) bs.dims[d] = d ? 1 : wi->shape.dims[0];
    start = reshape_to(c, wi, &bs);
  }
  kl_value *ix = iota_along(c, seq, axis, r);
  if (start) ix = emit2(c, KL_OP_ADD, start, ix);
  if (circular && ix) ix = emit2(c, KL_OP_MOD, ix, kl_onnx_scalar(c, KL_I64, (double)len));
  kl_attr e = kl_ais("shape", upd->shape.dims, r);
  ix = emit1(c, KL_OP_EXPAND, ix, &e, 1);
  if (!ix) return -1;
  kl_value *ins[3] = {past, ix, upd};
  kl_attr a[2] = {kl_ai("axis", axis), kl_as("reduction", "none")};
  return bind0(c, n, kl_onnx_emit(c, KL_OP_SCATTER_ELEMENTS, ins, 3, a, 2));
}

/* TfIdfVectorizer over integer tokens (pool_int64s); string pools are out
 * of scope. */
static int convert_tfidf(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  if (!x) return -1;
  if (kl_onnx_attr(n, "pool_strings"))
    return kl_onnx_unsupported(c, "string pools (pool_strings) are not supported");
  const int64_t *pool = NULL, *counts = NULL, *cols = NULL;
  int np = kl_onnx_attr_ints(n, "pool_int64s", &pool);
  int nc = kl_onnx_attr_ints(n, "ngram_counts", &counts);
  int ni = kl_onnx_attr_ints(n, "ngram_indexes", &cols);
  if (np < 0 || nc < 0 || ni < 0)
    return kl_onnx_fail(c, "pool_int64s, ngram_counts and ngram_indexes are required");
  const Onnx__AttributeProto *wa = kl_onnx_attr(n, "weights");
  size_t nw = wa ? wa->n_floats : 0;
  double *w = malloc((nw + 1) * sizeof *w);
  if (!w) return kl_onnx_fail(c, "out of memory");
  for (size_t i = 0; i < nw; i++) w[i] = wa->floats[i];
  kl_attr a[8] = {kl_ai("min_gram_length", kl_onnx_attr_int(n, "min_gram_length", 1)),
                  kl_ai("max_gram_length", kl_onnx_attr_int(n, "max_gram_length", 1)),
                  kl_ai("max_skip_count", kl_onnx_attr_int(n, "max_skip_count", 0)),
                  kl_as("mode", kl_onnx_attr_string(c, n, "mode", "")),
                  kl_ais("pool", pool, np), kl_ais("ngram_counts", counts, nc),
                  kl_ais("ngram_indexes", cols, ni),
                  {.name = "weights", .kind = KL_ATTR_FLOATS, .floats = w, .n = (int)nw}};
  kl_value *y = emit1(c, KL_OP_TFIDF, x, a, 8);
  free(w);
  return bind0(c, n, y);
}

/* CumSum and CumProd: the axis is a constant input. */
static int convert_cumsum(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  int64_t axis = 0;
  if (const_int(c, need_input(c, n, 1), "the axis", &axis)) return -1;
  kl_attr a[3] = {kl_ai("axis", axis), kl_ai("exclusive", kl_onnx_attr_int(n, "exclusive", 0)),
                  kl_ai("reverse", kl_onnx_attr_int(n, "reverse", 0))};
  kl_op op = !strcmp(n->op_type, "CumProd") ? KL_OP_CUMPROD : KL_OP_CUMSUM;
  return bind0(c, n, emit1(c, op, need_input(c, n, 0), a, 3));
}

/* TopK: k is an attribute before opset 10, a constant input after. */
static int convert_topk(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = need_input(c, n, 0);
  int64_t k = kl_onnx_attr_int(n, "k", -1);
  if (c->opset >= 10 && const_int(c, need_input(c, n, 1), "k", &k)) return -1;
  if (!x) return -1;
  kl_attr a[4] = {kl_ai("k", k), kl_ai("axis", kl_onnx_attr_int(n, "axis", -1)),
                  kl_ai("largest", kl_onnx_attr_int(n, "largest", 1)),
                  kl_ai("sorted", kl_onnx_attr_int(n, "sorted", 1))};
  kl_node *node = kl_onnx_emit_node(c, KL_OP_TOPK, &x, 1, a, 4, 2);
  if (!node) return -1;
  for (int o = 0; o < 2; o++)
    if (kl_onnx_bind(c, n, o, node->outputs[o])) return -1;
  return 0;
}

const kl_onnx_op kl_onnx_ops_tensor[] = {
    {"Constant", 1, convert_constant},
    {"Shape", 1, convert_shape},
    {"Size", 1, convert_size},
    {"ConstantOfShape", 9, convert_constant_of_shape},
    {"Range", 11, convert_range},
    {"EyeLike", 9, convert_eye_like},
    {"Reshape", 1, convert_reshape},
    {"Transpose", 1, convert_transpose},
    {"Concat", 1, convert_concat},
    {"Flatten", 1, convert_flatten},
    {"Squeeze", 1, convert_squeeze},
    {"Unsqueeze", 1, convert_squeeze},
    {"Slice", 1, convert_slice},
    {"Split", 1, convert_split},
    {"Expand", 8, convert_expand},
    {"Tile", 6, convert_tile},
    {"Pad", 1, convert_pad},
    {"CenterCropPad", 18, convert_center_crop_pad},
    {"Trilu", 14, convert_trilu},
    {"Gather", 1, convert_indexing},
    {"GatherElements", 11, convert_indexing},
    {"GatherND", 11, convert_indexing},
    {"Scatter", 9, convert_indexing},
    {"ScatterElements", 11, convert_indexing},
    {"ScatterND", 11, convert_indexing},
    {"OneHot", 9, convert_one_hot},
    {"ReverseSequence", 10, convert_reverse_sequence},
    {"NonZero", 9, convert_non_zero},
    {"Compress", 9, convert_compress},
    {"Unique", 11, convert_unique},
    {"ReduceSum", 1, convert_reduce},
    {"ReduceMean", 1, convert_reduce},
    {"ReduceMax", 1, convert_reduce},
    {"ReduceMin", 1, convert_reduce},
    {"ReduceProd", 1, convert_reduce},
    {"ReduceL1", 1, convert_reduce},
    {"ReduceL2", 1, convert_reduce},
    {"ReduceLogSum", 1, convert_reduce},
    {"ReduceLogSumExp", 1, convert_reduce},
    {"ReduceSumSquare", 1, convert_reduce},
    {"ArgMax", 1, convert_arg},
    {"ArgMin", 1, convert_arg},
    {"CumSum", 11, convert_cumsum},
    {"CumProd", 26, convert_cumsum},
    {"TensorScatter", 24, convert_tensor_scatter},
    {"TfIdfVectorizer", 9, convert_tfidf},
    {"TopK", 1, convert_topk},
    {NULL, 0, NULL},
};
