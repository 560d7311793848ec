/* ops_reduce.c - reductions, argmax, argmin, cumsum, cumprod and topk: shape
 * inference and reference evaluation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* View shape s as [outer, s[axis], inner]. */
static void split_at(const kl_shape *s, int axis, int64_t *outer, int64_t *k,
                     int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < axis; d++) *outer *= s->dims[d];
  for (int d = axis + 1; d < s->rank; d++) *inner *= s->dims[d];
  *k = s->dims[axis];
}

/* s without axis `axis` (keep: with it set to 1). */
static kl_shape drop_axis(const kl_shape *s, int axis, bool keep) {
  kl_shape r = {0};
  for (int d = 0; d < s->rank; d++)
    if (d != axis) r.dims[r.rank++] = s->dims[d];
    else if (keep) r.dims[r.rank++] = 1;
  return r;
}

/* ---- reductions ------------------------------------------------------ */
typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD } reduce_kind;

/* Reduced axes from the `axes` attribute; absent means all axes. */
static int reduce_mask(const kl_node *n, kl_error *err, int rank, bool *mask) {
  const int64_t *axes;
  int na = kl_attr_ints(n, "axes", &axes);
  for (int d = 0; d < rank; d++) mask[d] = na < 0;
  for (int i = 0; i < na; i++) {
    int ax;
    if (kl_norm_axis(axes[i], rank, &ax, n, err)) return -1;
    if (mask[ax])
      return KL_NODE_FAIL(n, err, "axis %d appears twice in axes", ax);
    mask[ax] = true;
  }
  return 0;
}

static int infer_reduce(kl_node *n, kl_error *err, reduce_kind kind) {
  const kl_value *x = n->inputs[0];
  bool mask[KL_MAX_RANK], keep = false;
  /* max and min of bools are any and all */
  bool bool_ok = (kind == R_MAX || kind == R_MIN) && x->dtype == KL_BOOL;
  if ((!bool_ok && kl_need_numeric(n, err, x)) || reduce_mask(n, err, x->shape.rank, mask) ||
      kl_attr_flag(n, err, "keepdims", 0, &keep))
    return -1;
  kl_shape s = {0};
  int64_t count = 1;
  for (int d = 0; d < x->shape.rank; d++) {
    if (mask[d]) count *= x->shape.dims[d];
    if (!mask[d]) s.dims[s.rank++] = x->shape.dims[d];
    else if (keep) s.dims[s.rank++] = 1;
  }
  /* NaN has no integer value. */
  if (kind == R_MEAN && count == 0 && kl_dtype_is_int(x->dtype) &&
      kl_shape_numel(&s) > 0) {
    char b[256];
    return KL_NODE_FAIL(n, err, "mean over zero elements of %s is undefined "
                        "for an integer dtype", kl_value_str(x, b, sizeof b));
  }
  kl_set_output(n, 0, x->dtype, &s);
  return 0;
}

/* The result of reducing nothing; integer and bool max/min use the
 * dtype's limits since they have no infinities. */
static double identity(reduce_kind kind, kl_dtype t) {
  int bits = t == KL_BOOL ? 1 : (int)kl_dtype_size(t) * 8;
  bool uns = t == KL_BOOL || kl_dtype_is_unsigned(t);
  double lo = uns ? 0 : -ldexp(1.0, bits - 1);
  double hi = uns ? ldexp(1.0, bits) - 1 : ldexp(1.0, bits - 1) - 1;
  bool limited = t == KL_BOOL || kl_dtype_is_int(t);
  switch (kind) {
  case R_MAX: return limited ? lo : -INFINITY;
  case R_MIN: return limited ? hi : INFINITY;
  case R_PROD: return 1.0;
  default: return 0.0;
  }
}

/* NaN wins in max/min, as numpy's reductions do. */
static double combine(reduce_kind kind, double acc, double v) {
  switch (kind) {
  case R_MAX: return isnan(acc) || isnan(v) ? NAN : v > acc ? v : acc;
  case R_MIN: return isnan(acc) || isnan(v) ? NAN : v < acc ? v : acc;
  case R_PROD: return acc * v;
  default: return acc + v;
  }
}

static int eval_reduce(const kl_node *n, const kl_tensor *x, kl_tensor *y,
                       reduce_kind kind, kl_error *err) {
  bool mask[KL_MAX_RANK];
  if (reduce_mask(n, err, x->shape.rank, mask)) return -1;
  /* Output offset of an input index: strides of the keepdims shape, with
   * the reduced axes contributing nothing. */
  kl_shape ks = x->shape;
  int64_t ostr[KL_MAX_RANK], count = 1;
  for (int d = 0; d < ks.rank; d++)
    if (mask[d]) {
      count *= ks.dims[d];
      ks.dims[d] = 1;
    }
  kl_shape_strides(&ks, ostr);
  for (int d = 0; d < ks.rank; d++)
    if (mask[d]) ostr[d] = 0;

  /* Integer products overflow a double's 53 bits long before they wrap, so
   * they are accumulated as wrapping 64-bit integers. */
  uint64_t *iacc = NULL;
  if (kind == R_PROD && kl_dtype_is_int(x->dtype)) {
    iacc = malloc((size_t)(y->numel ? y->numel : 1) * sizeof *iacc);
    if (!iacc) return KL_NODE_FAIL(n, err, "out of memory");
    for (int64_t j = 0; j < y->numel; j++) iacc[j] = 1;
  }
  for (int64_t j = 0; j < y->numel; j++) y->data[j] = identity(kind, x->dtype);

  int64_t idx[KL_MAX_RANK] = {0};
  for (int64_t i = 0; i < x->numel; i++, kl_index_next(&x->shape, idx)) {
    int64_t o = 0;
    for (int d = 0; d < ks.rank; d++) o += idx[d] * ostr[d];
    if (iacc) iacc[o] *= (uint64_t)kl_to_i64(x->data[i]);
    else y->data[o] = combine(kind, y->data[o], x->data[i]);
  }
  for (int64_t j = 0; j < y->numel; j++) {
    if (iacc) y->data[j] = kl_wrap_to(y->dtype, iacc[j]);
    if (kind == R_MEAN) y->data[j] /= (double)count; /* 0/0: NaN */
  }
  free(iacc);
  return 0;
}

#define REDUCE_ROW(ID, KIND)                                                   \
  int kl_infer_##ID(kl_node *n, kl_error *err) {                               \
    return infer_reduce(n, err, KIND);                                         \
  }                                                                            \
  int kl_eval_##ID(const kl_node *n, kl_tensor **in, kl_tensor **out,          \
                   kl_error *err) {                                            \
    return eval_reduce(n, in[0], out[0], KIND, err);                           \
  }

REDUCE_ROW(REDUCE_SUM, R_SUM)
REDUCE_ROW(REDUCE_MEAN, R_MEAN)
REDUCE_ROW(REDUCE_MAX, R_MAX)
REDUCE_ROW(REDUCE_MIN, R_MIN)
REDUCE_ROW(REDUCE_PROD, R_PROD)

/* ---- argmax ---------------------------------------------------------- */
int kl_infer_ARGMAX(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  int axis;
  bool keep = false;
  if (kl_need_numeric(n, err, x) ||
      kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err) ||
      kl_attr_flag(n, err, "keepdims", 1, &keep))
    return -1;
  kl_shape s = drop_axis(&x->shape, axis, keep);
  if (x->shape.dims[axis] == 0 && kl_shape_numel(&s) > 0) {
    char b[256];
    return KL_NODE_FAIL(n, err, "axis %d of %s is empty, so it has no maximum",
                        axis, kl_value_str(x, b, sizeof b));
  }
  kl_set_output(n, 0, KL_I64, &s);
  return 0;
}

int kl_eval_ARGMAX(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  const kl_tensor *x = in[0];
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  int64_t outer, k, inner;
  split_at(&x->shape, axis, &outer, &k, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const double *row = x->data + o * k * inner + i;
      int64_t best = 0;
      /* Strict > keeps the first maximum; the first NaN wins, as numpy. */
      for (int64_t j = 1; j < k && !isnan(row[best * inner]); j++)
        if (isnan(row[j * inner]) || row[j * inner] > row[best * inner])
          best = j;
      out[0]->data[o * inner + i] = (double)best;
    }
  return 0;
}

/* ---- cumsum, cumprod ------------------------------------------------- */

static int infer_scan(kl_node *n, kl_error *err) {
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

int kl_infer_CUMSUM(kl_node *n, kl_error *err) { return infer_scan(n, err); }
int kl_infer_CUMPROD(kl_node *n, kl_error *err) { return infer_scan(n, err); }

/* Running sums (prod: products) along the axis.  Integer products
 * overflow a double's 53 bits long before they wrap, so they run as
 * wrapping 64-bit integers, as reduce_prod's. */
static int eval_scan(const kl_node *n, const kl_tensor *x, kl_tensor *y, bool prod,
                     kl_error *err) {
  int axis;
  int64_t outer, k, inner;
  if (x->numel == 0) return 0;
  if (kl_norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank, &axis, n, err))
    return -1;
  bool excl = kl_attr_int(n, "exclusive", 0) != 0;
  bool rev = kl_attr_int(n, "reverse", 0) != 0;
  bool iprod = prod && kl_dtype_is_int(x->dtype);
  split_at(&x->shape, axis, &outer, &k, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * k * inner + i;
      double acc = prod ? 1 : 0;
      uint64_t iacc = 1;
      for (int64_t s = 0; s < k; s++) {
        int64_t at = base + (rev ? k - 1 - s : s) * inner;
        double v = x->data[at];
        if (!excl) {
          if (iprod) iacc *= (uint64_t)kl_to_i64(v);
          else acc = prod ? acc * v : acc + v;
        }
        y->data[at] = iprod ? kl_wrap_to(y->dtype, iacc) : acc;
        if (excl) {
          if (iprod) iacc *= (uint64_t)kl_to_i64(v);
          else acc = prod ? acc * v : acc + v;
        }
      }
    }
  return 0;
}

int kl_eval_CUMSUM(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  return eval_scan(n, in[0], out[0], false, err);
}

int kl_eval_CUMPROD(const kl_node *n, kl_tensor **in, kl_tensor **out,
                    kl_error *err) {
  return eval_scan(n, in[0], out[0], true, err);
}

/* ---- tfidf ----------------------------------------------------------- */

/* The pool's n-grams: checks the attributes (a message into why), and
 * fills g (when not NULL) with those that count; *ncols gets the output
 * width.  Returns the count, or -1. */
static int64_t tfidf_layout(const kl_node *n, kl_tfidf_gram *g, int64_t cap, int64_t *ncols,
                            char *why, size_t wlen) {
  const int64_t *pool, *counts, *cols;
  int64_t npool = kl_attr_ints(n, "pool", &pool), nc = kl_attr_ints(n, "ngram_counts", &counts);
  int64_t ni = kl_attr_ints(n, "ngram_indexes", &cols);
  int64_t lo = kl_attr_int(n, "min_gram_length", 1), hi = kl_attr_int(n, "max_gram_length", 1);
  if (npool < 0) npool = 0;
  if (nc < 1 || ni < 1)
    return snprintf(why, wlen, "ngram_counts and ngram_indexes are required"), -1;
  if (lo < 1 || hi < lo)
    return snprintf(why, wlen, "min_gram_length %lld and max_gram_length %lld must satisfy "
                    "1 <= min <= max", (long long)lo, (long long)hi), -1;
  int64_t k = 0, used = 0, total = 0;
  *ncols = 0;
  for (int64_t i = 0; i < nc; i++) {
    int64_t start = counts[i], end = i + 1 < nc ? counts[i + 1] : npool, len = i + 1;
    if (start < 0 || end < start || end > npool || (end - start) % len)
      return snprintf(why, wlen, "ngram_counts[%lld] = %lld does not start a whole number of "
                      "%lld-grams of the pool", (long long)i, (long long)start, (long long)len), -1;
    total += (end - start) / len;
  }
  if (total != ni)
    return snprintf(why, wlen, "ngram_indexes has %lld entries for %lld n-grams", (long long)ni,
                    (long long)total), -1;
  for (int64_t i = 0; i < nc; i++) {
    int64_t start = counts[i], end = i + 1 < nc ? counts[i + 1] : npool, len = i + 1;
    for (int64_t off = start; off < end; off += len, k++) {
      if (cols[k] < 0 || cols[k] >= KL_MAX_NUMEL)
        return snprintf(why, wlen, "ngram_indexes[%lld] = %lld is out of range", (long long)k,
                        (long long)cols[k]), -1;
      if (cols[k] + 1 > *ncols) *ncols = cols[k] + 1;
      if (len < lo || len > hi) continue;
      if (g && used < cap) g[used] = (kl_tfidf_gram){len, off, cols[k]};
      used++;
    }
  }
  return used;
}

int kl_tfidf_grams(const kl_node *n, kl_tfidf_gram *g, int64_t cap) {
  char why[200];
  int64_t ncols;
  return tfidf_layout(n, g, cap, &ncols, why, sizeof why);
}

int kl_infer_TFIDF(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char why[200], b[300];
  int64_t ncols;
  if ((x->dtype != KL_I32 && x->dtype != KL_I64) || x->shape.rank < 1 || x->shape.rank > 2)
    return KL_NODE_FAIL(n, err, "needs i32 or i64 tokens [C] or [B, C], got %s",
                        kl_value_str(x, b, sizeof b));
  if (tfidf_layout(n, NULL, 0, &ncols, why, sizeof why) < 0) return KL_NODE_FAIL(n, err, "%s", why);
  const char *mode = kl_attr_string(n, "mode", "");
  if (strcmp(mode, "TF") && strcmp(mode, "IDF") && strcmp(mode, "TFIDF"))
    return KL_NODE_FAIL(n, err, "mode must be \"TF\", \"IDF\" or \"TFIDF\", got \"%s\"", mode);
  if (kl_attr_int(n, "max_skip_count", 0) < 0)
    return KL_NODE_FAIL(n, err, "max_skip_count must be >= 0");
  const kl_attr *w = kl_node_attr(n, "weights");
  if (w && w->n > 0 && w->n < ncols)
    return KL_NODE_FAIL(n, err, "weights has %d entries for %lld output columns", w->n,
                        (long long)ncols);
  kl_shape s = {x->shape.rank, {x->shape.dims[0], ncols}};
  if (x->shape.rank == 1) s.dims[0] = ncols;
  return kl_set_checked_output(n, err, 0, KL_F32, &s);
}

/* Occurrences of n-gram g in tokens x[0..len): at every start, for skips
 * 0..max_skip (one skip for a unigram). */
static int64_t tfidf_count(const double *x, int64_t len, const kl_tfidf_gram *g,
                           const int64_t *pool, int64_t max_skip) {
  int64_t cnt = 0;
  for (int64_t d = 1; d <= (g->len == 1 ? 1 : max_skip + 1); d++)
    for (int64_t i = 0; i + d * (g->len - 1) < len; i++) {
      int64_t m = 0;
      while (m < g->len && x[i + d * m] == (double)pool[g->off + m]) m++;
      cnt += m == g->len;
    }
  return cnt;
}

int kl_eval_TFIDF(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  const kl_tensor *x = in[0];
  int64_t rows = x->shape.rank == 2 ? x->shape.dims[0] : 1;
  int64_t len = x->shape.dims[x->shape.rank - 1];
  int64_t ncols = out[0]->shape.dims[out[0]->shape.rank - 1];
  int64_t ng = kl_tfidf_grams(n, NULL, 0);
  kl_tfidf_gram *g = malloc((size_t)(ng + 1) * sizeof *g);
  if (!g) return KL_NODE_FAIL(n, err, "out of memory");
  kl_tfidf_grams(n, g, ng);
  const int64_t *pool;
  kl_attr_ints(n, "pool", &pool);
  const kl_attr *w = kl_node_attr(n, "weights");
  const char *mode = kl_attr_string(n, "mode", "TF");
  int64_t skip = kl_attr_int(n, "max_skip_count", 0);
  double *y = out[0]->data;
  for (int64_t i = 0; i < out[0]->numel; i++) y[i] = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < ng; k++)
      y[r * ncols + g[k].col] += (double)tfidf_count(x->data + r * len, len, &g[k], pool, skip);
  for (int64_t i = 0; i < out[0]->numel; i++) {
    double wt = w && w->n > 0 ? w->floats[i % ncols] : 1.0;
    if (!strcmp(mode, "IDF")) y[i] = y[i] > 0 ? wt : 0;
    else if (!strcmp(mode, "TFIDF")) y[i] *= wt;
  }
  free(g);
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

/* ---- gradient rules (ir.h, kl_grad_fn) -------------------------------- */
/* dy spread back over the reduced axes (scaled by `scale`). */
static kl_value *spread(kl_grad_ctx *c, const kl_node *n, kl_value *dy, double scale) {
  const kl_value *x = n->inputs[0];
  kl_shape kept = x->shape;
  const int64_t *axes;
  int na = kl_attr_ints(n, "axes", &axes);
  for (int d = 0; d < kept.rank; d++) {
    bool reduced = na < 0;
    for (int i = 0; i < na; i++) reduced |= (axes[i] + kept.rank) % kept.rank == d;
    if (reduced) kept.dims[d] = 1;
  }
  kl_value *k = kl_gb_reshape(c, dy, &kept);
  if (scale != 1) k = kl_gb2(c, KL_OP_MUL, k, kl_gb_scalar(c, dy->dtype, scale));
  return kl_gb_expand(c, k, &x->shape);
}

int kl_grad_REDUCE_SUM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = spread(c, n, dy[0], 1);
  return 0;
}

int kl_grad_REDUCE_MEAN(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  int64_t in = kl_shape_numel(&n->inputs[0]->shape), out = kl_shape_numel(&n->outputs[0]->shape);
  dx[0] = spread(c, n, dy[0], out ? (double)out / (double)(in ? in : 1) : 1);
  return 0;
}

/* The reduced axes of a reduction node, normalised, in order; their count. */
static int reduced_axes(const kl_node *n, int64_t *axes) {
  const int64_t *at;
  int rank = n->inputs[0]->shape.rank, na = kl_attr_ints(n, "axes", &at), k = 0;
  for (int d = 0; d < rank; d++) {
    bool reduced = na < 0;
    for (int i = 0; i < na; i++) reduced |= (at[i] + rank) % rank == d;
    if (reduced) axes[k++] = d;
  }
  return k;
}

/* max and min: the gradient goes to the elements equal to the result,
 * split evenly among ties (a tie has no derivative; the even split is the
 * mean of its one-sided ones). */
static int grad_extreme(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0];
  int64_t axes[KL_MAX_RANK];
  int na = reduced_axes(n, axes);
  kl_value *hit = kl_gb_cast(c, kl_gb2(c, KL_OP_EQ, x, spread(c, n, n->outputs[0], 1)), x->dtype);
  kl_value *share = kl_gb2(c, KL_OP_DIV, spread(c, n, dy[0], 1), kl_gb_sum(c, hit, axes, na));
  dx[0] = kl_gb2(c, KL_OP_MUL, hit, share);
  return 0;
}

int kl_grad_REDUCE_MAX(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_extreme(c, n, dy, dx);
}

int kl_grad_REDUCE_MIN(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  return grad_extreme(c, n, dy, dx);
}

static kl_value *scan(kl_grad_ctx *c, kl_op op, kl_value *x, int64_t axis, bool exclusive,
                      bool reverse) {
  kl_attr a[3] = {{.name = "axis", .kind = KL_ATTR_INT, .i = axis},
                  {.name = "exclusive", .kind = KL_ATTR_INT, .i = exclusive},
                  {.name = "reverse", .kind = KL_ATTR_INT, .i = reverse}};
  return kl_gb_node(c, op, &x, 1, a, 3);
}

/* The product of the other elements of each reduced set, without dividing
 * (exact where x has zeros): the reduced axes moved last and flattened,
 * then an exclusive cumprod from each end, multiplied. */
int kl_grad_REDUCE_PROD(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0];
  const kl_shape *xs = &x->shape;
  int64_t axes[KL_MAX_RANK], perm[KL_MAX_RANK], inv[KL_MAX_RANK];
  int na = reduced_axes(n, axes), np = 0;
  bool red[KL_MAX_RANK] = {false};
  for (int i = 0; i < na; i++) red[axes[i]] = true;
  kl_shape moved = {xs->rank, {0}}, flat = {0, {0}};
  int64_t count = 1;
  for (int d = 0; d < xs->rank; d++)
    if (!red[d]) flat.dims[flat.rank++] = xs->dims[d], perm[np++] = d;
  for (int i = 0; i < na; i++) perm[np++] = axes[i], count *= xs->dims[axes[i]];
  flat.dims[flat.rank++] = count;
  for (int d = 0; d < xs->rank; d++) moved.dims[d] = xs->dims[perm[d]], inv[perm[d]] = d;
  kl_value *rows = kl_gb_reshape(c, kl_gb_transpose(c, x, perm), &flat);
  int64_t last = flat.rank - 1;
  kl_value *others = kl_gb2(c, KL_OP_MUL, scan(c, KL_OP_CUMPROD, rows, last, true, false),
                            scan(c, KL_OP_CUMPROD, rows, last, true, true));
  others = kl_gb_transpose(c, kl_gb_reshape(c, others, &moved), inv);
  dx[0] = kl_gb2(c, KL_OP_MUL, others, spread(c, n, dy[0], 1));
  return 0;
}

/* Each x[j] adds to the outputs after it (before it when reversed): a scan
 * of dy the other way, exclusive as the op. */
int kl_grad_CUMSUM(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  dx[0] = scan(c, KL_OP_CUMSUM, dy[0], kl_attr_int(n, "axis", 0), kl_attr_int(n, "exclusive", 0),
               !kl_attr_int(n, "reverse", 0));
  return 0;
}

/* dx[j] = sum over the outputs y[i] x[j] is a factor of, of dy[i] y[i] /
 * x[j]: a reversed scan of dy y, divided by x.  Exact for nonzero x; a
 * zero x gives NaN or Inf (not a wrong finite number). */
int kl_grad_CUMPROD(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *t = scan(c, KL_OP_CUMSUM, kl_gb2(c, KL_OP_MUL, dy[0], n->outputs[0]),
                     kl_attr_int(n, "axis", 0), kl_attr_int(n, "exclusive", 0),
                     !kl_attr_int(n, "reverse", 0));
  dx[0] = kl_gb2(c, KL_OP_DIV, t, n->inputs[0]);
  return 0;
}

/* The values' gradient goes back to where the indices (output 1) point. */
int kl_grad_TOPK(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0];
  if (!dy[0]) return 0;
  int axis;
  if (kl_norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank, &axis, n, c->err)) return -1;
  kl_attr a[2] = {{.name = "axis", .kind = KL_ATTR_INT, .i = axis},
                  {.name = "reduction", .kind = KL_ATTR_STRING, .s = "add"}};
  kl_value *ins[3] = {kl_gb_expand(c, kl_gb_scalar(c, x->dtype, 0), &x->shape), n->outputs[1], dy[0]};
  dx[0] = kl_gb_node(c, KL_OP_SCATTER_ELEMENTS, ins, 3, a, 2);
  return 0;
}
