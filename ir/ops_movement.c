/* ops_movement.c - shape inference and reference evaluation of the data
 * movement rows (reshape ... trilu) and the constant source. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* ---- shared helpers -------------------------------------------------- */

/* An ints attribute that must be present. */
static int req_ints(const kl_node *n, kl_error *err, const char *name,
                    const int64_t **out) {
  int len = kl_attr_ints(n, name, out);
  if (len < 0) return KL_NODE_FAIL(n, err, "%s is required", name);
  return len;
}

/* Turns a list of axes into a mask over `rank` axes; rejects repeats. */
static int axes_mask(const kl_node *n, kl_error *err, const int64_t *axes,
                     int len, int rank, bool *mask) {
  memset(mask, 0, sizeof(bool) * KL_MAX_RANK);
  for (int i = 0; i < len; i++) {
    int a;
    if (kl_norm_axis(axes[i], rank, &a, n, err)) return -1;
    if (mask[a])
      return KL_NODE_FAIL(n, err, "axis %lld is repeated", (long long)axes[i]);
    mask[a] = true;
  }
  return 0;
}

/* Normalises the `axis` attribute (default 0) against s and views s as
 * [outer, s[axis], inner]: the setup of concat, split and gather. */
static int axis_view(const kl_node *n, kl_error *err, const kl_shape *s,
                     int *axis, int64_t *outer, int64_t *inner) {
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), s->rank, axis, n, err))
    return -1;
  *outer = *inner = 1;
  for (int i = 0; i < *axis; i++) *outer *= s->dims[i];
  for (int i = *axis + 1; i < s->rank; i++) *inner *= s->dims[i];
  return 0;
}

static int copy_eval(kl_tensor **in, kl_tensor **out) {
  if (out[0]->numel > 0)
    memcpy(out[0]->data, in[0]->data, sizeof(double) * (size_t)out[0]->numel);
  return 0;
}

/* y[idx] = x[base + sum idx[k] * coef[k]] over every index of y: the one
 * loop behind transpose, slice and expand. */
static void affine_copy(const kl_tensor *x, kl_tensor *y, int64_t base,
                        const int64_t *coef) {
  if (y->numel == 0) return;
  int64_t idx[KL_MAX_RANK] = {0}, i = 0;
  do {
    int64_t off = base;
    for (int k = 0; k < y->shape.rank; k++) off += idx[k] * coef[k];
    y->data[i++] = x->data[off];
  } while (kl_index_next(&y->shape, idx));
}

/* Copies `outer` runs of len*inner elements between tensors viewed as
 * [outer, axis, inner]: from position src_at of an axis of src_len to
 * dst_at of an axis of dst_len.  Concat, split and gather. */
static void copy_slab(const double *src, int64_t src_len, int64_t src_at,
                      double *dst, int64_t dst_len, int64_t dst_at,
                      int64_t outer, int64_t len, int64_t inner) {
  for (int64_t o = 0; o < outer; o++)
    memcpy(dst + (o * dst_len + dst_at) * inner,
           src + (o * src_len + src_at) * inner,
           sizeof(double) * (size_t)(len * inner));
}

/* ---- reshape --------------------------------------------------------- */

int kl_infer_RESHAPE(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  const int64_t *sh;
  char sx[300];
  int len = req_ints(n, err, "shape", &sh);
  if (len < 0) return -1;
  if (len > KL_MAX_RANK)
    return KL_NODE_FAIL(n, err, "shape has %d entries; rank is at most %d",
                        len, KL_MAX_RANK);
  kl_shape out = {len, {0}};
  int infer_at = -1;
  for (int i = 0; i < len; i++) {
    if (sh[i] == -1) {
      if (infer_at >= 0)
        return KL_NODE_FAIL(n, err, "shape has more than one -1");
      infer_at = i;
      out.dims[i] = 1; /* placeholder so the product below skips it */
    } else if (sh[i] < 0) {
      return KL_NODE_FAIL(n, err, "shape[%d] = %lld is negative", i,
                          (long long)sh[i]);
    } else {
      out.dims[i] = sh[i];
    }
  }
  int64_t known = kl_checked_numel(&out), numel = kl_shape_numel(&x->shape);
  char so[256];
  if (known < 0)
    return KL_NODE_FAIL(n, err, "shape %s is too large",
                        kl_shape_str(&out, so, sizeof so));
  if (infer_at >= 0) {
    if (known == 0 || numel % known != 0) {
      out.dims[infer_at] = -1;
      return KL_NODE_FAIL(n, err, "cannot reshape %s (%lld elements) to %s",
                          kl_value_str(x, sx, sizeof sx), (long long)numel,
                          kl_shape_str(&out, so, sizeof so));
    }
    out.dims[infer_at] = numel / known;
  } else if (known != numel) {
    return KL_NODE_FAIL(n, err, "cannot reshape %s (%lld elements) to %s "
                        "(%lld elements)", kl_value_str(x, sx, sizeof sx),
                        (long long)numel, kl_shape_str(&out, so, sizeof so),
                        (long long)known);
  }
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_RESHAPE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                    kl_error *err) {
  (void)n;
  (void)err;
  return copy_eval(in, out);
}

/* ---- bitcast --------------------------------------------------------- */

static bool is_int64(kl_dtype t) { return t == KL_I64 || t == KL_U64; }

int kl_infer_BITCAST(kl_node *n, kl_error *err) {
  const kl_attr *to = kl_node_attr(n, "to");
  kl_dtype from = n->inputs[0]->dtype;
  if (!to) return KL_NODE_FAIL(n, err, "attribute 'to' (the target dtype) is required");
  if (to->i < 0 || to->i >= KL_DTYPE_COUNT)
    return KL_NODE_FAIL(n, err, "attribute 'to' is not a dtype (%lld)", (long long)to->i);
  kl_dtype t = (kl_dtype)to->i;
  if (kl_dtype_bits(t) != kl_dtype_bits(from))
    return KL_NODE_FAIL(n, err, "bitcast needs types of one width: %s has %d bits, %s %d",
                        kl_dtype_name(from), kl_dtype_bits(from), kl_dtype_name(t), kl_dtype_bits(t));
  if (is_int64(t) != is_int64(from) || (is_int64(t) && t != from)) {
    KL_NODE_FAIL(n, err, "bitcast between %s and %s is not supported: the interpreter holds "
                 "integers in float64, exact only below 2^53", kl_dtype_name(from), kl_dtype_name(t));
    if (err) err->unsupported = true;
    return -1;
  }
  return kl_set_checked_output(n, err, 0, t, &n->inputs[0]->shape);
}

/* Element by element through its bytes: written as `from`, the low bits
 * kept (4 or 2 for the narrow types, which Kiln holds one a byte) and read
 * back as `to`. */
int kl_eval_BITCAST(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  (void)n;
  (void)err;
  kl_dtype from = in[0]->dtype, to = out[0]->dtype;
  int bits = kl_dtype_bits(to);
  for (int64_t i = 0; i < in[0]->numel; i++) {
    unsigned char raw[8] = {0};
    kl_raw_set(from, raw, 0, in[0]->data[i]);
    if (bits < 8) {
      unsigned v = raw[0] & ((1u << bits) - 1);
      bool sign = (to == KL_I4 || to == KL_I2) && (v >> (bits - 1));
      raw[0] = (unsigned char)(sign ? v | (0xffu << bits) : v);
    }
    out[0]->data[i] = kl_raw_get(to, raw, 0, NULL);
  }
  return 0;
}

/* ---- transpose ------------------------------------------------------- */

static int get_perm(const kl_node *n, kl_error *err, int rank, int *perm) {
  const int64_t *p;
  int len = kl_attr_ints(n, "perm", &p);
  if (len < 0) {
    for (int i = 0; i < rank; i++) perm[i] = rank - 1 - i;
    return 0;
  }
  bool seen[KL_MAX_RANK] = {false};
  if (len != rank)
    return KL_NODE_FAIL(n, err, "perm has %d entries for an input of rank %d",
                        len, rank);
  for (int i = 0; i < len; i++) {
    if (p[i] < 0 || p[i] >= rank || seen[p[i]])
      return KL_NODE_FAIL(n, err, "perm is not a permutation of 0..%d "
                          "(entry %d is %lld)", rank - 1, i, (long long)p[i]);
    seen[p[i]] = true;
    perm[i] = (int)p[i];
  }
  return 0;
}

int kl_infer_TRANSPOSE(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int perm[KL_MAX_RANK];
  if (get_perm(n, err, x->shape.rank, perm)) return -1;
  kl_shape out = {x->shape.rank, {0}};
  for (int i = 0; i < out.rank; i++) out.dims[i] = x->shape.dims[perm[i]];
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_TRANSPOSE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                      kl_error *err) {
  int perm[KL_MAX_RANK];
  int64_t st[KL_MAX_RANK], coef[KL_MAX_RANK];
  if (out[0]->numel == 0) return 0;
  if (get_perm(n, err, in[0]->shape.rank, perm)) return -1;
  kl_shape_strides(&in[0]->shape, st);
  for (int i = 0; i < in[0]->shape.rank; i++) coef[i] = st[perm[i]];
  affine_copy(in[0], out[0], 0, coef);
  return 0;
}

/* ---- concat and split ------------------------------------------------ */

int kl_infer_CONCAT(kl_node *n, kl_error *err) {
  const kl_value *x0 = n->inputs[0];
  char s0[300], si[300];
  if (!kl_node_attr(n, "axis"))
    return KL_NODE_FAIL(n, err, "axis is required");
  if (x0->shape.rank < 1)
    return KL_NODE_FAIL(n, err, "inputs must have rank >= 1, got %s",
                        kl_value_str(x0, s0, sizeof s0));
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x0->shape.rank, &axis, n, err))
    return -1;
  kl_shape out = x0->shape;
  for (int i = 1; i < n->ninputs; i++) {
    const kl_value *xi = n->inputs[i];
    bool ok = xi->dtype == x0->dtype && xi->shape.rank == x0->shape.rank;
    for (int d = 0; ok && d < out.rank; d++)
      ok = d == axis || xi->shape.dims[d] == x0->shape.dims[d];
    if (!ok)
      return KL_NODE_FAIL(n, err, "input %d %s does not match input 0 %s "
                          "outside axis %d", i, kl_value_str(xi, si, sizeof si),
                          kl_value_str(x0, s0, sizeof s0), axis);
    if (__builtin_add_overflow(out.dims[axis], xi->shape.dims[axis],
                               &out.dims[axis]))
      return KL_NODE_FAIL(n, err, "concatenated axis %d overflows", axis);
  }
  return kl_set_checked_output(n, err, 0, x0->dtype, &out);
}

int kl_eval_CONCAT(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  const kl_shape *os = &out[0]->shape;
  int axis;
  int64_t outer, inner, at = 0;
  if (out[0]->numel == 0) return 0;
  if (axis_view(n, err, os, &axis, &outer, &inner)) return -1;
  for (int i = 0; i < n->ninputs; i++) {
    int64_t len = in[i]->shape.dims[axis];
    if (len > 0)
      copy_slab(in[i]->data, len, 0, out[0]->data, os->dims[axis], at, outer,
                len, inner);
    at += len;
  }
  return 0;
}

int kl_infer_SPLIT(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  const int64_t *sizes;
  char sx[300];
  int len = req_ints(n, err, "sizes", &sizes);
  if (len < 0) return -1;
  if (len != n->noutputs)
    return KL_NODE_FAIL(n, err, "%d sizes for %d outputs", len, n->noutputs);
  if (x->shape.rank < 1)
    return KL_NODE_FAIL(n, err, "input must have rank >= 1, got %s",
                        kl_value_str(x, sx, sizeof sx));
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  int64_t total = 0;
  for (int i = 0; i < len; i++) {
    if (sizes[i] < 0)
      return KL_NODE_FAIL(n, err, "sizes[%d] = %lld is negative", i,
                          (long long)sizes[i]);
    if (__builtin_add_overflow(total, sizes[i], &total)) break;
  }
  if (total != x->shape.dims[axis])
    return KL_NODE_FAIL(n, err, "sizes do not sum to %lld, the length of "
                        "axis %d of %s", (long long)x->shape.dims[axis], axis,
                        kl_value_str(x, sx, sizeof sx));
  for (int i = 0; i < len; i++) {
    kl_shape out = x->shape;
    out.dims[axis] = sizes[i];
    if (kl_set_checked_output(n, err, i, x->dtype, &out)) return -1;
  }
  return 0;
}

int kl_eval_SPLIT(const kl_node *n, kl_tensor **in, kl_tensor **out,
                  kl_error *err) {
  const kl_shape *xs = &in[0]->shape;
  int axis;
  int64_t outer, inner, at = 0;
  if (in[0]->numel == 0) return 0;
  if (axis_view(n, err, xs, &axis, &outer, &inner)) return -1;
  for (int i = 0; i < n->noutputs; i++) {
    int64_t len = out[i]->shape.dims[axis];
    if (len > 0)
      copy_slab(in[0]->data, xs->dims[axis], at, out[i]->data, len, 0, outer,
                len, inner);
    at += len;
  }
  return 0;
}

/* ---- slice ----------------------------------------------------------- */

/* Per input axis: first element and step of the slice; out gets the
 * result shape.  Axes not named keep start 0, step 1. */
static int slice_setup(const kl_node *n, kl_error *err, const kl_shape *x,
                       int64_t *start, int64_t *step, kl_shape *out) {
  const int64_t *st, *en, *ax = NULL, *sp = NULL;
  int ns = req_ints(n, err, "starts", &st);
  if (ns < 0) return -1;
  int ne = req_ints(n, err, "ends", &en);
  if (ne < 0) return -1;
  int na = kl_attr_ints(n, "axes", &ax), np = kl_attr_ints(n, "steps", &sp);
  if (ne != ns || (na >= 0 && na != ns) || (np >= 0 && np != ns))
    return KL_NODE_FAIL(n, err, "starts, ends, axes and steps must have the "
                        "same length (%d, %d, %d, %d)", ns, ne, na, np);
  if (ns > x->rank)
    return KL_NODE_FAIL(n, err, "%d starts for an input of rank %d", ns,
                        x->rank);
  *out = *x;
  for (int i = 0; i < x->rank; i++) start[i] = 0, step[i] = 1;
  bool seen[KL_MAX_RANK] = {false};
  for (int i = 0; i < ns; i++) {
    int a = i;
    if (ax && kl_norm_axis(ax[i], x->rank, &a, n, err)) return -1;
    if (seen[a])
      return KL_NODE_FAIL(n, err, "axis %d is sliced twice", a);
    seen[a] = true;
    int64_t d = x->dims[a], s = st[i], e = en[i], k = sp ? sp[i] : 1;
    if (k == 0) return KL_NODE_FAIL(n, err, "steps[%d] is 0", i);
    /* ONNX: negative positions count from the end, then clamp; a negative
     * step may end at -1, i.e. before element 0. */
    if (s < 0) s += d;
    if (e < 0) e += d;
    int64_t lo = k > 0 ? 0 : -1, hi_s = k > 0 ? d : d - 1;
    s = s < 0 ? 0 : s > hi_s ? hi_s : s;
    e = e < lo ? lo : e > hi_s ? hi_s : e;
    int64_t span = k > 0 ? e - s : s - e;
    /* |step| without negating INT64_MIN. */
    uint64_t mag = k > 0 ? (uint64_t)k : (uint64_t)(-(k + 1)) + 1;
    out->dims[a] = span <= 0 ? 0 : (int64_t)((uint64_t)(span - 1) / mag) + 1;
    start[a] = s;
    step[a] = k;
  }
  return 0;
}

int kl_infer_SLICE(kl_node *n, kl_error *err) {
  int64_t start[KL_MAX_RANK], step[KL_MAX_RANK];
  kl_shape out;
  if (slice_setup(n, err, &n->inputs[0]->shape, start, step, &out)) return -1;
  return kl_set_checked_output(n, err, 0, n->inputs[0]->dtype, &out);
}

int kl_eval_SLICE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                  kl_error *err) {
  int64_t start[KL_MAX_RANK], step[KL_MAX_RANK], st[KL_MAX_RANK];
  kl_shape shape;
  if (out[0]->numel == 0) return 0;
  if (slice_setup(n, err, &in[0]->shape, start, step, &shape)) return -1;
  kl_shape_strides(&in[0]->shape, st);
  int64_t base = 0;
  for (int i = 0; i < shape.rank; i++) {
    base += start[i] * st[i];
    /* A huge step only ever selects one element; skip the product. */
    step[i] = shape.dims[i] > 1 ? step[i] * st[i] : 0;
  }
  affine_copy(in[0], out[0], base, step);
  return 0;
}

/* ---- gather ---------------------------------------------------------- */

int kl_infer_GATHER(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1];
  char sx[300], si[300];
  if (ix->dtype != KL_I32 && ix->dtype != KL_I64)
    return KL_NODE_FAIL(n, err, "indices must be i32 or i64, got %s",
                        kl_value_str(ix, si, sizeof si));
  if (x->shape.rank < 1)
    return KL_NODE_FAIL(n, err, "data must have rank >= 1, got %s",
                        kl_value_str(x, sx, sizeof sx));
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  int rank = x->shape.rank - 1 + ix->shape.rank;
  if (rank > KL_MAX_RANK)
    return KL_NODE_FAIL(n, err, "result of gathering %s from %s would have "
                        "rank %d (at most %d)", kl_value_str(ix, si, sizeof si),
                        kl_value_str(x, sx, sizeof sx), rank, KL_MAX_RANK);
  kl_shape out = {0, {0}};
  for (int i = 0; i < axis; i++) out.dims[out.rank++] = x->shape.dims[i];
  for (int i = 0; i < ix->shape.rank; i++)
    out.dims[out.rank++] = ix->shape.dims[i];
  for (int i = axis + 1; i < x->shape.rank; i++)
    out.dims[out.rank++] = x->shape.dims[i];
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_GATHER(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  const kl_shape *xs = &in[0]->shape;
  int axis;
  int64_t outer, inner;
  if (out[0]->numel == 0) return 0;
  if (axis_view(n, err, xs, &axis, &outer, &inner)) return -1;
  int64_t dim = xs->dims[axis], nidx = in[1]->numel;
  for (int64_t j = 0; j < nidx; j++) {
    double v = in[1]->data[j];
    /* Compare as doubles first so a huge i64 never converts out of range. */
    if (!(v >= -(double)dim && v < (double)dim))
      return KL_NODE_FAIL(n, err, "index %.0f (indices element %lld) is out "
                          "of range for axis %d of size %lld", v,
                          (long long)j, axis, (long long)dim);
    int64_t k = (int64_t)v;
    if (k < 0) k += dim;
    copy_slab(in[0]->data, dim, k, out[0]->data, nidx, j, outer, 1, inner);
  }
  return 0;
}

/* ---- expand ---------------------------------------------------------- */

int kl_infer_EXPAND(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  const int64_t *sh;
  char sx[300], st[256];
  int len = req_ints(n, err, "shape", &sh);
  if (len < 0) return -1;
  if (len > KL_MAX_RANK)
    return KL_NODE_FAIL(n, err, "shape has %d entries; rank is at most %d",
                        len, KL_MAX_RANK);
  kl_shape target = {len, {0}}, out;
  for (int i = 0; i < len; i++) {
    if (sh[i] < 0)
      return KL_NODE_FAIL(n, err, "shape[%d] = %lld is negative", i,
                          (long long)sh[i]);
    target.dims[i] = sh[i];
  }
  kl_error scratch;
  if (kl_broadcast_shapes(&x->shape, &target, &out, &scratch, n->loc))
    return KL_NODE_FAIL(n, err, "cannot broadcast %s to %s",
                        kl_value_str(x, sx, sizeof sx),
                        kl_shape_str(&target, st, sizeof st));
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_EXPAND(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  (void)n;
  (void)err;
  const kl_shape *xs = &in[0]->shape;
  int64_t st[KL_MAX_RANK], coef[KL_MAX_RANK];
  if (out[0]->numel == 0) return 0;
  kl_shape_strides(xs, st);
  /* Axes x lacks or has as 1 repeat the same element: stride 0. */
  int lead = out[0]->shape.rank - xs->rank;
  for (int k = 0; k < out[0]->shape.rank; k++)
    coef[k] = k < lead || xs->dims[k - lead] == 1 ? 0 : st[k - lead];
  affine_copy(in[0], out[0], 0, coef);
  return 0;
}

/* ---- squeeze, unsqueeze, flatten ------------------------------------- */

int kl_infer_SQUEEZE(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  const int64_t *axes;
  bool mask[KL_MAX_RANK];
  char sx[300];
  int len = kl_attr_ints(n, "axes", &axes);
  if (len < 0) {
    for (int i = 0; i < x->shape.rank; i++) mask[i] = x->shape.dims[i] == 1;
  } else {
    if (axes_mask(n, err, axes, len, x->shape.rank, mask)) return -1;
    for (int i = 0; i < x->shape.rank; i++)
      if (mask[i] && x->shape.dims[i] != 1)
        return KL_NODE_FAIL(n, err, "cannot squeeze axis %d of %s: size is "
                            "not 1", i, kl_value_str(x, sx, sizeof sx));
  }
  kl_shape out = {0, {0}};
  for (int i = 0; i < x->shape.rank; i++)
    if (!mask[i]) out.dims[out.rank++] = x->shape.dims[i];
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_SQUEEZE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                    kl_error *err) {
  (void)n;
  (void)err;
  return copy_eval(in, out);
}

int kl_infer_UNSQUEEZE(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  const int64_t *axes;
  bool mask[KL_MAX_RANK];
  int len = req_ints(n, err, "axes", &axes);
  if (len < 0) return -1;
  int rank = x->shape.rank + len;
  if (rank > KL_MAX_RANK)
    return KL_NODE_FAIL(n, err, "result would have rank %d (at most %d)",
                        rank, KL_MAX_RANK);
  if (axes_mask(n, err, axes, len, rank, mask)) return -1;
  kl_shape out = {rank, {0}};
  for (int i = 0, j = 0; i < rank; i++)
    out.dims[i] = mask[i] ? 1 : x->shape.dims[j++];
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_UNSQUEEZE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                      kl_error *err) {
  (void)n;
  (void)err;
  return copy_eval(in, out);
}

int kl_infer_FLATTEN(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int rank = x->shape.rank;
  int64_t axis = kl_attr_int(n, "axis", 1);
  /* ONNX allows axis == rank (everything in the first dim). */
  if (axis < -rank || axis > rank)
    return KL_NODE_FAIL(n, err, "axis %lld is out of range [%d, %d]",
                        (long long)axis, -rank, rank);
  if (axis < 0) axis += rank;
  kl_shape head = x->shape, tail = x->shape;
  head.rank = (int)axis;
  tail.rank = rank - (int)axis;
  memmove(tail.dims, x->shape.dims + axis, sizeof(int64_t) * (size_t)tail.rank);
  kl_shape out = {2, {kl_checked_numel(&head), kl_checked_numel(&tail)}};
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_FLATTEN(const kl_node *n, kl_tensor **in, kl_tensor **out,
                    kl_error *err) {
  (void)n;
  (void)err;
  return copy_eval(in, out);
}

/* ---- pad ------------------------------------------------------------- */

enum { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

/* Negative pads crop first; reflect and edge then work on the cropped
 * extent (as ONNX Runtime).  Per axis: crop[a] elements dropped at the
 * start, before[a] added at the start, keep[a] elements kept. */
typedef struct {
  int mode;
  int64_t crop[KL_MAX_RANK], before[KL_MAX_RANK], keep[KL_MAX_RANK];
} pad_cfg;

static int pad_setup(const kl_node *n, kl_error *err, const kl_value *x,
                     pad_cfg *p, kl_shape *out) {
  const int64_t *pads;
  char sx[300];
  int rank = x->shape.rank;
  const char *mode = kl_attr_string(n, "mode", "constant");
  if (strcmp(mode, "constant") == 0) p->mode = PAD_CONSTANT;
  else if (strcmp(mode, "reflect") == 0) p->mode = PAD_REFLECT;
  else if (strcmp(mode, "edge") == 0) p->mode = PAD_EDGE;
  else if (strcmp(mode, "wrap") == 0) p->mode = PAD_WRAP;
  else
    return KL_NODE_FAIL(n, err, "mode must be constant, reflect, edge or "
                        "wrap, got \"%s\"", mode);
  int len = req_ints(n, err, "pads", &pads);
  if (len < 0) return -1;
  if (len != 2 * rank)
    return KL_NODE_FAIL(n, err, "pads must have %d entries (2 * rank of %s), "
                        "got %d", 2 * rank, kl_value_str(x, sx, sizeof sx),
                        len);
  *out = x->shape;
  for (int a = 0; a < rank; a++) {
    int64_t d = x->shape.dims[a], b = pads[a], e = pads[rank + a];
    /* Compare before negating so INT64_MIN never overflows. */
    if ((b < 0 && b < -d) || (e < 0 && e < -(d - (b < 0 ? -b : 0))))
      return KL_NODE_FAIL(n, err, "pads [%lld, %lld] crop more than axis %d "
                          "of %s holds", (long long)b, (long long)e, a,
                          kl_value_str(x, sx, sizeof sx));
    p->crop[a] = b < 0 ? -b : 0;
    p->keep[a] = d - p->crop[a] - (e < 0 ? -e : 0);
    p->before[a] = b > 0 ? b : 0;
    int64_t after = e > 0 ? e : 0;
    if (p->mode == PAD_REFLECT &&
        (p->before[a] >= p->keep[a] || after >= p->keep[a]) &&
        (p->before[a] > 0 || after > 0))
      return KL_NODE_FAIL(n, err, "reflect pads [%lld, %lld] of axis %d must "
                          "be smaller than its length %lld (after cropping) "
                          "in %s", (long long)b, (long long)e, a,
                          (long long)p->keep[a],
                          kl_value_str(x, sx, sizeof sx));
    if ((p->mode == PAD_EDGE || p->mode == PAD_WRAP) && p->keep[a] == 0 &&
        (p->before[a] > 0 || after > 0))
      return KL_NODE_FAIL(n, err, "%s padding of empty axis %d of %s",
                          p->mode == PAD_EDGE ? "edge" : "wrap", a,
                          kl_value_str(x, sx, sizeof sx));
    if (__builtin_add_overflow(p->keep[a], p->before[a], &out->dims[a]) ||
        __builtin_add_overflow(out->dims[a], after, &out->dims[a]))
      return KL_NODE_FAIL(n, err, "padded axis %d overflows", a);
  }
  return 0;
}

int kl_infer_PAD(kl_node *n, kl_error *err) {
  pad_cfg p;
  kl_shape out;
  if (pad_setup(n, err, n->inputs[0], &p, &out)) return -1;
  return kl_set_checked_output(n, err, 0, n->inputs[0]->dtype, &out);
}

int kl_eval_PAD(const kl_node *n, kl_tensor **in, kl_tensor **out,
                kl_error *err) {
  pad_cfg p;
  kl_shape shape;
  int64_t st[KL_MAX_RANK], idx[KL_MAX_RANK] = {0}, i = 0;
  if (out[0]->numel == 0) return 0;
  /* n->inputs[0] is the value behind in[0]; it names it in messages. */
  if (pad_setup(n, err, n->inputs[0], &p, &shape)) return -1;
  double value = kl_attr_float(n, "value", 0.0);
  kl_shape_strides(&in[0]->shape, st);
  do {
    int64_t off = 0;
    bool fill = false;
    for (int a = 0; a < shape.rank && !fill; a++) {
      int64_t c = idx[a] - p.before[a], d = p.keep[a];
      if (c < 0 || c >= d) {
        if (p.mode == PAD_CONSTANT) fill = true;
        else if (p.mode == PAD_EDGE) c = c < 0 ? 0 : d - 1;
        else if (p.mode == PAD_WRAP) c = (c % d + d) % d; /* any number of turns */
        else c = c < 0 ? -c : 2 * (d - 1) - c; /* one bounce: pad < d */
      }
      off += (p.crop[a] + c) * st[a];
    }
    out[0]->data[i++] = fill ? value : in[0]->data[off];
  } while (kl_index_next(&shape, idx));
  return 0;
}

/* ---- trilu ----------------------------------------------------------- */

int kl_infer_TRILU(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char sx[300];
  int64_t upper = kl_attr_int(n, "upper", 1);
  if (upper != 0 && upper != 1)
    return KL_NODE_FAIL(n, err, "upper must be 0 or 1, got %lld",
                        (long long)upper);
  if (x->shape.rank < 2)
    return KL_NODE_FAIL(n, err, "input must have rank >= 2, got %s",
                        kl_value_str(x, sx, sizeof sx));
  return kl_set_checked_output(n, err, 0, x->dtype, &x->shape);
}

int kl_eval_TRILU(const kl_node *n, kl_tensor **in, kl_tensor **out,
                  kl_error *err) {
  (void)err;
  const kl_shape *s = &in[0]->shape;
  if (out[0]->numel == 0) return 0;
  bool upper = kl_attr_int(n, "upper", 1) != 0;
  int64_t k = kl_attr_int(n, "k", 0);
  int64_t rows = s->dims[s->rank - 2], cols = s->dims[s->rank - 1];
  for (int64_t f = 0; f < out[0]->numel; f++) {
    int64_t i = f / cols % rows, j = f % cols;
    bool keep = upper ? j - i >= k : j - i <= k;
    out[0]->data[f] = keep ? in[0]->data[f] : 0.0;
  }
  return 0;
}

/* ---- shared helpers of the element and nd gathers and scatters -------- */

static int need_indices(const kl_node *n, kl_error *err, const kl_value *ix) {
  if (ix->dtype == KL_I32 || ix->dtype == KL_I64) return 0;
  char b[300];
  return KL_NODE_FAIL(n, err, "indices must be i32 or i64, got %s",
                      kl_value_str(ix, b, sizeof b));
}

/* An index element checked against an axis of size dim, negative counting
 * from the end.  Compared as a double first so a huge i64 never converts
 * out of range. */
static int take_index(const kl_node *n, kl_error *err, double v, int64_t dim,
                      int64_t at, int64_t *out) {
  if (!(v >= -(double)dim && v < (double)dim))
    return KL_NODE_FAIL(n, err, "index %.0f (indices element %lld) is out of "
                        "range for an axis of size %lld", v, (long long)at,
                        (long long)dim);
  *out = (int64_t)v < 0 ? (int64_t)v + dim : (int64_t)v;
  return 0;
}

/* ---- gather_elements, scatter_elements -------------------------------- */

/* indices must have x's rank and, off `axis`, dims no larger than x's. */
static int check_elements(const kl_node *n, kl_error *err, const kl_value *x,
                          const kl_value *ix, int *axis) {
  char sx[300], si[300];
  if (need_indices(n, err, ix)) return -1;
  if (x->shape.rank < 1)
    return KL_NODE_FAIL(n, err, "x must have rank >= 1, got %s",
                        kl_value_str(x, sx, sizeof sx));
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, axis, n, err))
    return -1;
  bool ok = ix->shape.rank == x->shape.rank;
  for (int d = 0; ok && d < x->shape.rank; d++)
    ok = d == *axis || ix->shape.dims[d] <= x->shape.dims[d];
  if (!ok)
    return KL_NODE_FAIL(n, err, "indices %s must have the rank of x %s and no "
                        "larger dims outside axis %d",
                        kl_value_str(ix, si, sizeof si),
                        kl_value_str(x, sx, sizeof sx), *axis);
  return 0;
}

/* Flat offset into x of element `idx` of indices (value k on the axis). */
static int64_t element_offset(const int64_t *xst, int rank, const int64_t *idx,
                              int axis, int64_t k) {
  int64_t off = 0;
  for (int d = 0; d < rank; d++) off += (d == axis ? k : idx[d]) * xst[d];
  return off;
}

int kl_infer_GATHER_ELEMENTS(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1];
  int axis;
  if (check_elements(n, err, x, ix, &axis)) return -1;
  return kl_set_checked_output(n, err, 0, x->dtype, &ix->shape);
}

int kl_eval_GATHER_ELEMENTS(const kl_node *n, kl_tensor **in, kl_tensor **out,
                            kl_error *err) {
  const kl_tensor *x = in[0], *ix = in[1];
  int axis;
  int64_t xst[KL_MAX_RANK], idx[KL_MAX_RANK] = {0};
  if (out[0]->numel == 0) return 0;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  kl_shape_strides(&x->shape, xst);
  for (int64_t i = 0; i < ix->numel; i++, kl_index_next(&ix->shape, idx)) {
    int64_t k = 0;
    if (take_index(n, err, ix->data[i], x->shape.dims[axis], i, &k)) return -1;
    out[0]->data[i] = x->data[element_offset(xst, x->shape.rank, idx, axis, k)];
  }
  return 0;
}

typedef enum { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN } scatter_red;

static int get_reduction(const kl_node *n, kl_error *err, scatter_red *r) {
  static const char *const names[] = {"none", "add", "mul", "max", "min"};
  const char *s = kl_attr_string(n, "reduction", "none");
  for (int i = 0; i < 5; i++)
    if (strcmp(s, names[i]) == 0) {
      *r = (scatter_red)i;
      return 0;
    }
  return KL_NODE_FAIL(n, err, "reduction must be none, add, mul, max or min, "
                      "got \"%s\"", s);
}

static double scatter_combine(scatter_red r, double old, double v) {
  switch (r) {
  case RED_ADD: return old + v;
  case RED_MUL: return old * v;
  case RED_MAX: return isnan(old) || isnan(v) ? NAN : v > old ? v : old;
  case RED_MIN: return isnan(old) || isnan(v) ? NAN : v < old ? v : old;
  default: return v;
  }
}

/* updates must have x's dtype and the shape `want`. */
static int check_updates(const kl_node *n, kl_error *err, const kl_value *x,
                         const kl_value *u, const kl_shape *want) {
  char sx[300], su[300], sw[200];
  if (u->dtype != x->dtype || !kl_shape_equal(&u->shape, want))
    return KL_NODE_FAIL(n, err, "updates must be %s%s (x is %s), got %s",
                        kl_dtype_name(x->dtype), kl_shape_str(want, sw, sizeof sw),
                        kl_value_str(x, sx, sizeof sx),
                        kl_value_str(u, su, sizeof su));
  return 0;
}

int kl_infer_SCATTER_ELEMENTS(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1], *u = n->inputs[2];
  int axis;
  scatter_red r;
  if (check_elements(n, err, x, ix, &axis) || get_reduction(n, err, &r) ||
      check_updates(n, err, x, u, &ix->shape))
    return -1;
  return kl_set_checked_output(n, err, 0, x->dtype, &x->shape);
}

int kl_eval_SCATTER_ELEMENTS(const kl_node *n, kl_tensor **in,
                             kl_tensor **out, kl_error *err) {
  const kl_tensor *x = in[0], *ix = in[1], *u = in[2];
  int axis;
  scatter_red r;
  int64_t xst[KL_MAX_RANK], idx[KL_MAX_RANK] = {0};
  if (x->numel == 0) return 0;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err) ||
      get_reduction(n, err, &r))
    return -1;
  memcpy(out[0]->data, x->data, sizeof(double) * (size_t)x->numel);
  kl_shape_strides(&x->shape, xst);
  for (int64_t i = 0; i < ix->numel; i++, kl_index_next(&ix->shape, idx)) {
    int64_t k = 0;
    if (take_index(n, err, ix->data[i], x->shape.dims[axis], i, &k)) return -1;
    double *y = &out[0]->data[element_offset(xst, x->shape.rank, idx, axis, k)];
    *y = scatter_combine(r, *y, u->data[i]);
  }
  return 0;
}

/* ---- gather_nd, scatter_nd ------------------------------------------- */

/* The geometry shared by gather_nd and scatter_nd: indices [b.., n.., m]
 * address x [b.., m axes, slice..]; `batch` = prod b, `count` = prod n
 * (per batch), `slice` = prod of the trailing axes of x. */
typedef struct {
  int b, m;
  int64_t batch, count, slice;
} nd_view;

static int nd_setup(const kl_node *n, kl_error *err, const kl_value *x,
                    const kl_value *ix, int64_t batch_dims, nd_view *v,
                    kl_shape *out) {
  char sx[300], si[300];
  int r = x->shape.rank, q = ix->shape.rank;
  if (need_indices(n, err, ix)) return -1;
  if (q < 1)
    return KL_NODE_FAIL(n, err, "indices must have rank >= 1, got %s",
                        kl_value_str(ix, si, sizeof si));
  if (batch_dims < 0 || batch_dims >= q || batch_dims > r)
    return KL_NODE_FAIL(n, err, "batch_dims %lld must lie in [0, %d) for "
                        "indices %s and x %s", (long long)batch_dims,
                        q < r + 1 ? q : r + 1, kl_value_str(ix, si, sizeof si),
                        kl_value_str(x, sx, sizeof sx));
  v->b = (int)batch_dims;
  int64_t m = ix->shape.dims[q - 1];
  if (m < 1 || m > r - v->b)
    return KL_NODE_FAIL(n, err, "the last axis of indices %s must have length "
                        "1..%d (the axes of x %s after batch_dims %d)",
                        kl_value_str(ix, si, sizeof si), r - v->b,
                        kl_value_str(x, sx, sizeof sx), v->b);
  v->m = (int)m;
  v->batch = v->count = v->slice = 1;
  for (int d = 0; d < v->b; d++) {
    if (ix->shape.dims[d] != x->shape.dims[d])
      return KL_NODE_FAIL(n, err, "the first %d (batch) dims of indices %s and "
                          "x %s must agree", v->b,
                          kl_value_str(ix, si, sizeof si),
                          kl_value_str(x, sx, sizeof sx));
    v->batch *= x->shape.dims[d];
  }
  for (int d = v->b; d < q - 1; d++) v->count *= ix->shape.dims[d];
  for (int d = v->b + v->m; d < r; d++) v->slice *= x->shape.dims[d];
  out->rank = q - 1 + r - v->b - v->m;
  if (out->rank > KL_MAX_RANK)
    return KL_NODE_FAIL(n, err, "result would have rank %d (at most %d)",
                        out->rank, KL_MAX_RANK);
  int k = 0;
  for (int d = 0; d < q - 1; d++) out->dims[k++] = ix->shape.dims[d];
  for (int d = v->b + v->m; d < r; d++) out->dims[k++] = x->shape.dims[d];
  return 0;
}

/* Offset in x of the slice addressed by tuple t of batch bi. */
static int nd_offset(const kl_node *n, kl_error *err, const kl_tensor *x,
                     const kl_tensor *ix, const nd_view *v, int64_t bi,
                     int64_t t, int64_t *off) {
  int64_t st[KL_MAX_RANK];
  kl_shape_strides(&x->shape, st);
  *off = v->b ? bi * st[v->b - 1] : 0;
  for (int j = 0; j < v->m; j++) {
    int64_t k = 0, at = (bi * v->count + t) * v->m + j;
    if (take_index(n, err, ix->data[at], x->shape.dims[v->b + j], at, &k))
      return -1;
    *off += k * st[v->b + j];
  }
  return 0;
}

int kl_infer_GATHER_ND(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  nd_view v;
  kl_shape out;
  if (nd_setup(n, err, x, n->inputs[1], kl_attr_int(n, "batch_dims", 0), &v,
               &out))
    return -1;
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

int kl_eval_GATHER_ND(const kl_node *n, kl_tensor **in, kl_tensor **out,
                      kl_error *err) {
  nd_view v;
  kl_shape shape;
  if (out[0]->numel == 0) return 0;
  if (nd_setup(n, err, n->inputs[0], n->inputs[1],
               kl_attr_int(n, "batch_dims", 0), &v, &shape))
    return -1;
  double *y = out[0]->data;
  for (int64_t bi = 0; bi < v.batch; bi++)
    for (int64_t t = 0; t < v.count; t++, y += v.slice) {
      int64_t off;
      if (nd_offset(n, err, in[0], in[1], &v, bi, t, &off)) return -1;
      memcpy(y, in[0]->data + off, sizeof(double) * (size_t)v.slice);
    }
  return 0;
}

int kl_infer_SCATTER_ND(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  nd_view v;
  kl_shape want;
  scatter_red r;
  if (get_reduction(n, err, &r) ||
      nd_setup(n, err, x, n->inputs[1], 0, &v, &want) ||
      check_updates(n, err, x, n->inputs[2], &want))
    return -1;
  return kl_set_checked_output(n, err, 0, x->dtype, &x->shape);
}

int kl_eval_SCATTER_ND(const kl_node *n, kl_tensor **in, kl_tensor **out,
                       kl_error *err) {
  nd_view v;
  kl_shape want;
  scatter_red r;
  if (in[0]->numel == 0) return 0;
  if (get_reduction(n, err, &r) ||
      nd_setup(n, err, n->inputs[0], n->inputs[1], 0, &v, &want))
    return -1;
  memcpy(out[0]->data, in[0]->data, sizeof(double) * (size_t)in[0]->numel);
  const double *u = in[2]->data;
  for (int64_t t = 0; t < v.count; t++, u += v.slice) {
    int64_t off;
    if (nd_offset(n, err, in[0], in[1], &v, 0, t, &off)) return -1;
    for (int64_t j = 0; j < v.slice; j++)
      out[0]->data[off + j] = scatter_combine(r, out[0]->data[off + j], u[j]);
  }
  return 0;
}

/* ---- constant -------------------------------------------------------- */

int kl_infer_CONSTANT(kl_node *n, kl_error *err) {
  const kl_attr *value = kl_node_attr(n, "value");
  const kl_attr *dt = kl_node_attr(n, "dtype");
  const int64_t *sh;
  char so[256];
  if (!value) return KL_NODE_FAIL(n, err, "value is required");
  kl_dtype t = dt ? (kl_dtype)dt->i : KL_F32;
  int len = kl_attr_ints(n, "shape", &sh);
  kl_shape out = {1, {value->n}};
  if (len >= 0) {
    if (len > KL_MAX_RANK)
      return KL_NODE_FAIL(n, err, "shape has %d entries; rank is at most %d",
                          len, KL_MAX_RANK);
    out.rank = len;
    memcpy(out.dims, sh, sizeof(int64_t) * (size_t)len);
  }
  int64_t numel = kl_checked_numel(&out);
  if (numel < 0)
    return KL_NODE_FAIL(n, err, "shape %s is negative or too large",
                        kl_shape_str(&out, so, sizeof so));
  if (value->n != 1 && value->n != numel)
    return KL_NODE_FAIL(n, err, "%d values for shape %s (%lld elements); "
                        "give 1 or %lld", value->n,
                        kl_shape_str(&out, so, sizeof so), (long long)numel,
                        (long long)numel);
  return kl_set_checked_output(n, err, 0, t, &out);
}

int kl_eval_CONSTANT(const kl_node *n, kl_tensor **in, kl_tensor **out,
                     kl_error *err) {
  (void)in;
  (void)err;
  const kl_attr *value = kl_node_attr(n, "value");
  for (int64_t i = 0; i < out[0]->numel; i++)
    out[0]->data[i] = value->floats[value->n == 1 ? 0 : i];
  return 0;
}

/* ---- gradient rules (ir.h, kl_grad_fn) -------------------------------- */
/* Ops that only relabel the elements: the gradient is dy in x's shape. */
static int grad_same_elements(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = kl_gb_reshape(c, dy[0], &n->inputs[0]->shape);
  return 0;
}

int kl_grad_RESHAPE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_same_elements(c, n, dy, dx);
}
int kl_grad_FLATTEN(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_same_elements(c, n, dy, dx);
}
int kl_grad_SQUEEZE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_same_elements(c, n, dy, dx);
}
int kl_grad_UNSQUEEZE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_same_elements(c, n, dy, dx);
}

/* expand: dy as it is; the autodiff pass sums it back to x's shape. */
int kl_grad_EXPAND(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  (void)c, (void)n;
  dx[0] = dy[0];
  return 0;
}

int kl_grad_TRANSPOSE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  int r = n->inputs[0]->shape.rank;
  const int64_t *perm;
  int64_t inv[KL_MAX_RANK];
  int np = kl_attr_ints(n, "perm", &perm);
  for (int d = 0; d < r; d++) inv[np < 0 ? r - 1 - d : perm[d]] = d;
  dx[0] = kl_gb_transpose(c, dy[0], inv);
  return 0;
}

/* ---- gradients of copies that pick, place or cut ----------------------- */
static kl_attr ints_attr(const char *name, int64_t *v, int n) {
  return (kl_attr){.name = name, .kind = KL_ATTR_INTS, .ints = v, .n = n};
}

static kl_value *zeros_of(kl_grad_ctx *c, kl_dtype t, const kl_shape *s) {
  return kl_gb_expand(c, kl_gb_scalar(c, t, 0), s);
}

/* v[start:end] along one axis. */
static kl_value *cut(kl_grad_ctx *c, kl_value *v, int64_t axis, int64_t start, int64_t end) {
  kl_attr a[3] = {ints_attr("starts", &start, 1), ints_attr("ends", &end, 1), ints_attr("axes", &axis, 1)};
  return kl_gb_node(c, KL_OP_SLICE, &v, 1, a, 3);
}

/* v with zeros added: before[a] at the start and after[a] at the end of
 * each axis a. */
static kl_value *zero_pad(kl_grad_ctx *c, kl_value *v, const int64_t *before, const int64_t *after) {
  if (!v) return NULL;
  int r = v->shape.rank;
  int64_t pads[2 * KL_MAX_RANK];
  bool any = false;
  for (int a = 0; a < r; a++) {
    pads[a] = before[a], pads[r + a] = after[a];
    any |= before[a] || after[a];
  }
  if (!any) return v;
  kl_attr at = ints_attr("pads", pads, 2 * r);
  return kl_gb_node(c, KL_OP_PAD, &v, 1, &at, 1);
}

static kl_value *scatter(kl_grad_ctx *c, kl_op op, kl_value *x, kl_value *ix, kl_value *u,
                         int64_t axis, const char *reduction) {
  kl_value *ins[3] = {x, ix, u};
  kl_attr a[2] = {{.name = "reduction", .kind = KL_ATTR_STRING, .s = reduction},
                  {.name = "axis", .kind = KL_ATTR_INT, .i = axis}};
  return kl_gb_node(c, op, ins, 3, a, op == KL_OP_SCATTER_ELEMENTS ? 2 : 1);
}

static kl_value *gather_back(kl_grad_ctx *c, kl_op op, kl_value *x, kl_value *ix, int64_t axis) {
  kl_value *ins[2] = {x, ix};
  kl_attr a = {.name = "axis", .kind = KL_ATTR_INT, .i = axis};
  return kl_gb_node(c, op, ins, 2, &a, op == KL_OP_GATHER_ELEMENTS ? 1 : 0);
}

/* g's elements along `axis` sent to the positions pos[0..len) of an axis
 * of size `size` (zeros elsewhere): a scatter along the axis, "none" when
 * the positions are distinct, "add" when several land on one. */
static kl_value *place_along(kl_grad_ctx *c, kl_value *g, int axis, const int64_t *pos,
                             int64_t size, const char *reduction) {
  if (!g) return NULL;
  int64_t len = g->shape.dims[axis];
  kl_shape is = {g->shape.rank, {0}}, zs = g->shape;
  for (int k = 0; k < is.rank; k++) is.dims[k] = k == axis ? len : 1;
  zs.dims[axis] = size;
  double *v = malloc(sizeof(double) * (size_t)(len ? len : 1));
  if (!v) abort();
  for (int64_t j = 0; j < len; j++) v[j] = (double)pos[j];
  kl_attr k[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = v, .n = (int)len},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = KL_I64},
                  ints_attr("shape", is.dims, is.rank)};
  kl_value *ix = kl_gb_expand(c, kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, k, 3), &g->shape);
  free(v);
  return scatter(c, KL_OP_SCATTER_ELEMENTS, zeros_of(c, g->dtype, &zs), ix, g, axis, reduction);
}

/* Each input's stretch of dy along the axis. */
int kl_grad_CONCAT(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), n->inputs[0]->shape.rank, &axis, n, c->err)) return -1;
  int64_t at = 0;
  for (int i = 0; i < n->ninputs; i++) {
    int64_t len = n->inputs[i]->shape.dims[axis];
    dx[i] = cut(c, dy[0], axis, at, at + len);
    at += len;
  }
  return 0;
}

/* The outputs' adjoints put back together; an output nothing reads
 * contributes zeros. */
int kl_grad_SPLIT(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), n->inputs[0]->shape.rank, &axis, n, c->err)) return -1;
  kl_value *parts[64];
  if (n->noutputs > 64)
    return KL_GRAD_FAIL(c, n, "%d outputs (at most 64)", n->noutputs);
  for (int k = 0; k < n->noutputs; k++) {
    const kl_value *o = n->outputs[k];
    parts[k] = dy[k] ? dy[k] : zeros_of(c, o->dtype, &o->shape);
  }
  kl_attr a = {.name = "axis", .kind = KL_ATTR_INT, .i = axis};
  dx[0] = kl_gb_node(c, KL_OP_CONCAT, parts, n->noutputs, &a, 1);
  return 0;
}

/* dy placed back where the slice read, axis by axis: zeros padded around a
 * unit-step range, a scatter for other steps (each read element is
 * distinct, so the scatter only places). */
int kl_grad_SLICE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  const kl_value *x = n->inputs[0];
  int64_t start[KL_MAX_RANK], step[KL_MAX_RANK];
  kl_shape out;
  if (slice_setup(n, c->err, &x->shape, start, step, &out)) return -1;
  if (kl_shape_numel(&out) == 0) return 0; /* nothing read: no gradient */
  kl_value *g = dy[0];
  for (int a = 0; a < x->shape.rank && g; a++) {
    int64_t d = x->shape.dims[a], len = out.dims[a];
    if (step[a] == 1) {
      int64_t before[KL_MAX_RANK] = {0}, after[KL_MAX_RANK] = {0};
      before[a] = start[a], after[a] = d - start[a] - len;
      g = zero_pad(c, g, before, after);
      continue;
    }
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)len);
    if (!pos) abort();
    for (int64_t j = 0; j < len; j++) pos[j] = start[a] + j * step[a];
    g = place_along(c, g, a, pos, d, "none");
    free(pos);
  }
  dx[0] = g;
  return 0;
}

/* Scatter-add of dy at the indices: x viewed as [outer, D, inner] and the
 * indices, flattened, broadcast over outer and inner. */
int kl_grad_GATHER(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0], *ix = n->inputs[1];
  int axis;
  int64_t outer, inner;
  if (axis_view(n, c->err, &x->shape, &axis, &outer, &inner)) return -1;
  int64_t d = x->shape.dims[axis], m = kl_shape_numel(&ix->shape);
  if (m == 0 || kl_shape_numel(&x->shape) == 0) return 0;
  kl_shape gs = {3, {outer, m, inner}}, is = {3, {1, m, 1}}, xs = {3, {outer, d, inner}};
  kl_value *idx = kl_gb_expand(c, kl_gb_reshape(c, ix, &is), &gs);
  kl_value *s = scatter(c, KL_OP_SCATTER_ELEMENTS, zeros_of(c, x->dtype, &xs), idx,
                        kl_gb_reshape(c, dy[0], &gs), 1, "add");
  dx[0] = kl_gb_reshape(c, s, &x->shape);
  return 0;
}

int kl_grad_GATHER_ELEMENTS(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0];
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, c->err)) return -1;
  dx[0] = scatter(c, KL_OP_SCATTER_ELEMENTS, zeros_of(c, x->dtype, &x->shape), n->inputs[1], dy[0],
                  axis, "add");
  return 0;
}

/* A scatter-add of dy at the indices.  With batch_dims, the batch axes are
 * flattened into one and its index put in front of each index tuple, so
 * that scatter_nd (which has no batch axes) places it. */
int kl_grad_GATHER_ND(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0], *ix = n->inputs[1], *g = dy[0];
  int64_t nb = kl_attr_int(n, "batch_dims", 0);
  if (nb == 0) {
    dx[0] = scatter(c, KL_OP_SCATTER_ND, zeros_of(c, x->dtype, &x->shape), ix, g, 0, "add");
    return 0;
  }
  const kl_shape *is = &ix->shape;
  int64_t batch = 1;
  for (int d = 0; d < nb; d++) batch *= x->shape.dims[d];
  kl_shape xs = {x->shape.rank - (int)nb + 1, {batch}}, ts = {is->rank - (int)nb + 1, {batch}},
           gs = {g->shape.rank - (int)nb + 1, {batch}};
  for (int d = (int)nb; d < x->shape.rank; d++) xs.dims[d - nb + 1] = x->shape.dims[d];
  for (int d = (int)nb; d < is->rank; d++) ts.dims[d - nb + 1] = is->dims[d];
  for (int d = (int)nb; d < g->shape.rank; d++) gs.dims[d - nb + 1] = g->shape.dims[d];
  kl_shape one = {ts.rank, {batch}}, lead = ts;
  for (int d = 1; d < one.rank; d++) one.dims[d] = 1;
  lead.dims[lead.rank - 1] = 1;
  double *v = malloc(sizeof(double) * (size_t)(batch ? batch : 1));
  if (!v) abort();
  for (int64_t b = 0; b < batch; b++) v[b] = (double)b;
  kl_attr k[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = v, .n = (int)batch},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = ix->dtype},
                  ints_attr("shape", one.dims, one.rank)};
  kl_value *parts[2] = {kl_gb_expand(c, kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, k, 3), &lead),
                        kl_gb_reshape(c, ix, &ts)};
  free(v);
  kl_attr cat = {.name = "axis", .kind = KL_ATTR_INT, .i = ts.rank - 1};
  kl_value *full = kl_gb_node(c, KL_OP_CONCAT, parts, 2, &cat, 1);
  kl_value *s = scatter(c, KL_OP_SCATTER_ND, zeros_of(c, x->dtype, &xs), full,
                        kl_gb_reshape(c, g, &gs), 0, "add");
  dx[0] = kl_gb_reshape(c, s, &x->shape);
  return 0;
}

/* reduction "none": the places written take nothing from dy, and an update
 * gets dy at its place only if it was the one kept there (the last of
 * repeated indices, as the interpreter): its position, scattered as an i64
 * and read back, is its own.  "add": dy passes to x, and each update gets
 * dy at its place. */
static int grad_scatter(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx,
                        kl_op gather_op) {
  kl_value *x = n->inputs[0], *ix = n->inputs[1], *u = n->inputs[2];
  const char *red = kl_attr_string(n, "reduction", "none");
  int64_t axis = 0;
  int ax;
  if (n->op == KL_OP_SCATTER_ELEMENTS) {
    if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &ax, n, c->err)) return -1;
    axis = ax;
  }
  dx[2] = gather_back(c, gather_op, dy[0], ix, axis);
  if (strcmp(red, "add") == 0) {
    dx[0] = dy[0];
    return 0;
  }
  if (strcmp(red, "none") != 0)
    return KL_GRAD_FAIL(c, n, "reduction \"%s\"; \"none\" and \"add\" have one", red);
  dx[0] = scatter(c, n->op, dy[0], ix, zeros_of(c, u->dtype, &u->shape), axis, "none");
  int64_t m = kl_shape_numel(&u->shape);
  double *pos = malloc(sizeof(double) * (size_t)(m ? m : 1));
  if (!pos) abort();
  for (int64_t j = 0; j < m; j++) pos[j] = (double)j;
  kl_attr k[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = pos, .n = (int)m},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = KL_I64},
                  ints_attr("shape", u->shape.dims, u->shape.rank)};
  kl_value *iota = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, k, 3);
  free(pos);
  kl_value *none = kl_gb_expand(c, kl_gb_scalar(c, KL_I64, -1), &x->shape);
  kl_value *kept = gather_back(c, gather_op, scatter(c, n->op, none, ix, iota, axis, "none"), ix, axis);
  dx[2] = kl_gb_mask(c, kl_gb2(c, KL_OP_EQ, kept, iota), dx[2]);
  return 0;
}

int kl_grad_SCATTER_ELEMENTS(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_scatter(c, n, dy, dx, KL_OP_GATHER_ELEMENTS);
}

int kl_grad_SCATTER_ND(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_scatter(c, n, dy, dx, KL_OP_GATHER_ND);
}

/* constant mode: the padded area cut away, and zeros where negative pads
 * cropped x; the others add dy back where each element was copied from. */
int kl_grad_PAD(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  const kl_value *x = n->inputs[0];
  pad_cfg p;
  kl_shape out;
  if (pad_setup(n, c->err, x, &p, &out)) return -1;
  int r = x->shape.rank;
  if (p.mode != PAD_CONSTANT) {
    /* every output element copies one of x's: per axis, dy added back at
     * the source of each position, as kl_eval_PAD finds it */
    kl_value *g = dy[0];
    for (int a = 0; a < r && g; a++) {
      int64_t len = out.dims[a], d = p.keep[a];
      int64_t *src = malloc(sizeof(int64_t) * (size_t)(len ? len : 1));
      if (!src) abort();
      for (int64_t j = 0; j < len; j++) {
        int64_t k = j - p.before[a];
        if (k < 0 || k >= d) {
          if (p.mode == PAD_EDGE) k = k < 0 ? 0 : d - 1;
          else if (p.mode == PAD_WRAP) k = (k % d + d) % d;
          else k = k < 0 ? -k : 2 * (d - 1) - k;
        }
        src[j] = p.crop[a] + k;
      }
      g = place_along(c, g, a, src, x->shape.dims[a], "add");
      free(src);
    }
    dx[0] = g;
    return 0;
  }
  int64_t st[KL_MAX_RANK], en[KL_MAX_RANK], ax[KL_MAX_RANK], after[KL_MAX_RANK];
  for (int a = 0; a < r; a++) {
    st[a] = p.before[a], en[a] = p.before[a] + p.keep[a], ax[a] = a;
    after[a] = x->shape.dims[a] - p.crop[a] - p.keep[a];
  }
  kl_value *g = dy[0];
  kl_attr sl[3] = {ints_attr("starts", st, r), ints_attr("ends", en, r), ints_attr("axes", ax, r)};
  if (r > 0) g = kl_gb_node(c, KL_OP_SLICE, &g, 1, sl, 3);
  dx[0] = zero_pad(c, g, p.crop, after);
  return 0;
}

/* The same triangle of dy. */
int kl_grad_TRILU(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = kl_gb_node(c, KL_OP_TRILU, dy, 1, n->attrs, n->nattrs);
  return 0;
}
