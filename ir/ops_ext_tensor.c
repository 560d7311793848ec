/* ops_ext_tensor.c - shape inference and evaluation of the rows in
 * ops_ext_tensor.def: element-wise gathers and scatters, cumsum, argmin and
 * topk. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* ---- shared helpers -------------------------------------------------- */

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

/* View s as [outer, s[axis], inner]. */
static void split_at(const kl_shape *s, int axis, int64_t *outer, int64_t *k,
                     int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < axis; d++) *outer *= s->dims[d];
  for (int d = axis + 1; d < s->rank; d++) *inner *= s->dims[d];
  *k = s->dims[axis];
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

/* ---- cumsum ---------------------------------------------------------- */

int kl_infer_CUMSUM(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int axis;
  bool excl, rev;
  if (kl_need_numeric(n, err, x) ||
      kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err) ||
      kl_attr_flag(n, err, "exclusive", 0, &excl) ||
      kl_attr_flag(n, err, "reverse", 0, &rev))
    return -1;
  return kl_set_checked_output(n, err, 0, x->dtype, &x->shape);
}

int kl_eval_CUMSUM(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  const kl_tensor *x = in[0];
  int axis;
  int64_t outer, k, inner;
  if (x->numel == 0) return 0;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  bool excl = kl_attr_int(n, "exclusive", 0) != 0;
  bool rev = kl_attr_int(n, "reverse", 0) != 0;
  split_at(&x->shape, axis, &outer, &k, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * k * inner + i;
      double acc = 0;
      for (int64_t s = 0; s < k; s++) {
        int64_t at = base + (rev ? k - 1 - s : s) * inner;
        if (!excl) acc += x->data[at];
        out[0]->data[at] = acc;
        if (excl) acc += x->data[at];
      }
    }
  return 0;
}

/* ---- argmin ---------------------------------------------------------- */

int kl_infer_ARGMIN(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int axis;
  bool keep = true;
  char b[300];
  if (kl_need_numeric(n, err, x) ||
      kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err) ||
      kl_attr_flag(n, err, "keepdims", 1, &keep))
    return -1;
  kl_shape s = {0};
  for (int d = 0; d < x->shape.rank; d++)
    if (d != axis) s.dims[s.rank++] = x->shape.dims[d];
    else if (keep) s.dims[s.rank++] = 1;
  if (x->shape.dims[axis] == 0 && kl_shape_numel(&s) > 0)
    return KL_NODE_FAIL(n, err, "axis %d of %s is empty, so it has no minimum",
                        axis, kl_value_str(x, b, sizeof b));
  return kl_set_checked_output(n, err, 0, KL_I64, &s);
}

int kl_eval_ARGMIN(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  const kl_tensor *x = in[0];
  int axis;
  int64_t outer, k, inner;
  if (out[0]->numel == 0) return 0;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  split_at(&x->shape, axis, &outer, &k, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const double *row = x->data + o * k * inner + i;
      int64_t best = 0;
      /* Strict < keeps the first minimum; the first NaN wins, as numpy. */
      for (int64_t j = 1; j < k && !isnan(row[best * inner]); j++)
        if (isnan(row[j * inner]) || row[j * inner] < row[best * inner])
          best = j;
      out[0]->data[o * inner + i] = (double)best;
    }
  return 0;
}

/* ---- topk ------------------------------------------------------------ */

static int topk_setup(const kl_node *n, kl_error *err, const kl_value *x,
                      int *axis, int64_t *k) {
  char b[300];
  bool largest, sorted;
  if (kl_need_numeric(n, err, x)) return -1;
  if (!kl_node_attr(n, "k")) return KL_NODE_FAIL(n, err, "k is required");
  if (x->shape.rank < 1)
    return KL_NODE_FAIL(n, err, "x must have rank >= 1, got %s",
                        kl_value_str(x, b, sizeof b));
  if (kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, axis, n, err) ||
      kl_attr_flag(n, err, "largest", 1, &largest) ||
      kl_attr_flag(n, err, "sorted", 1, &sorted))
    return -1;
  *k = kl_attr_int(n, "k", 0);
  if (*k < 0 || *k > x->shape.dims[*axis])
    return KL_NODE_FAIL(n, err, "k = %lld must lie in [0, %lld], the length "
                        "of axis %d of %s", (long long)*k,
                        (long long)x->shape.dims[*axis], *axis,
                        kl_value_str(x, b, sizeof b));
  return 0;
}

int kl_infer_TOPK(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int axis;
  int64_t k;
  if (topk_setup(n, err, x, &axis, &k)) return -1;
  kl_shape s = x->shape;
  s.dims[axis] = k;
  if (kl_set_checked_output(n, err, 0, x->dtype, &s)) return -1;
  return kl_set_checked_output(n, err, 1, KL_I64, &s);
}

typedef struct {
  double v;
  int64_t i;
} ranked;

/* Larger first, NaN above everything, ties by lower index. */
static int rank_desc(const void *pa, const void *pb) {
  const ranked *a = pa, *b = pb;
  bool na = isnan(a->v), nb = isnan(b->v);
  if (na != nb) return na ? -1 : 1;
  if (!na && a->v != b->v) return a->v > b->v ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

/* Smaller first, NaN below nothing (last), ties by lower index. */
static int rank_asc(const void *pa, const void *pb) {
  const ranked *a = pa, *b = pb;
  bool na = isnan(a->v), nb = isnan(b->v);
  if (na != nb) return na ? 1 : -1;
  if (!na && a->v != b->v) return a->v < b->v ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

int kl_eval_TOPK(const kl_node *n, kl_tensor **in, kl_tensor **out,
                 kl_error *err) {
  const kl_tensor *x = in[0];
  int axis;
  int64_t k, outer, len, inner;
  if (out[0]->numel == 0) return 0;
  if (topk_setup(n, err, n->inputs[0], &axis, &k)) return -1;
  bool largest = kl_attr_int(n, "largest", 1) != 0;
  split_at(&x->shape, axis, &outer, &len, &inner);
  ranked *row = malloc((size_t)len * sizeof *row);
  if (!row) return KL_NODE_FAIL(n, err, "out of memory");
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      for (int64_t j = 0; j < len; j++)
        row[j] = (ranked){x->data[(o * len + j) * inner + i], j};
      qsort(row, (size_t)len, sizeof *row, largest ? rank_desc : rank_asc);
      for (int64_t j = 0; j < k; j++) {
        int64_t at = (o * k + j) * inner + i;
        out[0]->data[at] = row[j].v;
        out[1]->data[at] = (double)row[j].i;
      }
    }
  free(row);
  return 0;
}
