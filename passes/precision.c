/* precision.c - precision assignment (automatic mixed precision): choose a
 * storage and compute type for every float value of a graph and insert the
 * casts between them.
 *
 * Every op has one class, the `precision` column of its row in ir/ops.def
 * (kl_ops[op].precision):
 *   allow   contractions, which gain most from fp16/bf16 (tensor cores, half
 *           the bytes); they run in the low type and accumulate in fp32
 *           (the runtime GEMM and the kernels' float arithmetic do);
 *   deny    ops whose result suffers from a short mantissa or range
 *           (softmax, norms, reductions, exp/log, losses): they run in fp32;
 *   follow  elementwise and data movement ops: low when every float input
 *           that is not a weight already is, so they never add a cast of
 *           their own;
 *   keep    casts and constants, whose types are spelled out.
 * --fp32-ops and --fp32-nodes move ops and single nodes to deny, and so do
 * the numbers a node works with when the low type cannot hold them (below,
 * "numbers the low type cannot hold"): an allow or follow node reading a
 * running variance of 1.05e7 stays in fp32 instead of saturating it to
 * fp16's 65504.
 *
 * Weights (params, consts, constant nodes) and the follow nodes computed
 * from weights alone take the type their readers want, converted at compile
 * time: the weights region halves instead of paying a cast at every run.
 * f64 and integer values are never touched.
 *
 * The pass works in three steps over the original nodes: decide (forward:
 * the type each node computes in), resolve (backward: what the weights and
 * weight-only nodes become), rewrite (forward: convert weights, insert casts,
 * re-infer each node), then verifies the graph. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "passes.h"

const char *kl_precision_class_name(kl_precision_class c) {
  switch (c) {
  case KL_PREC_ALLOW: return "allow";
  case KL_PREC_DENY: return "deny";
  case KL_PREC_FOLLOW: return "follow";
  case KL_PREC_KEEP: return "keep";
  default: return "unlisted";
  }
}

kl_precision_class kl_precision_op_class(kl_op op) {
  return (unsigned)op < KL_OP_COUNT ? kl_ops[op].precision : KL_PREC_UNLISTED;
}

static bool in_list(const char *name, const char *const *list, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(list[i], name) == 0) return true;
  return false;
}

kl_dtype kl_precision_node_dtype(const kl_node *n) {
  if (n->op != KL_OP_CAST)
    for (int k = 0; k < n->ninputs; k++)
      if (kl_dtype_is_float(n->inputs[k]->dtype)) return n->inputs[k]->dtype;
  return n->noutputs ? n->outputs[0]->dtype : KL_F32;
}

/* ---- numbers the low type cannot hold ----------------------------------
 * A node runs in the low type only if the numbers it works with fit it.
 * Which numbers matter, and when:
 *  - every float weight it reads (a param, a const, a constant node, also
 *    through reshapes, slices, concats and other data movement): a finite
 *    value beyond the low type's largest would be saturated (1.05e7 becomes
 *    65504), so any such value keeps the node in fp32;
 *  - the weights it scales by (the operands of matmul, gemm and the
 *    convolutions but not their bias, both factors of mul, the divisor of
 *    div, batch_norm's scale and var): judged by their largest magnitude.
 *    When even that flushes to 0, or keeps fewer than 8 significant bits
 *    in the low type's subnormals (below 2^-16 in fp16), the whole product
 *    loses its digits.  A tensor's tiny elements beside normal ones do not
 *    matter: in a sum of products they are below the rounding of the
 *    larger terms.  Additive weights (a bias, the constant of an add, a pad)
 *    are never judged by their small values, for the same reason;
 *  - float attributes: beyond the range as weights are; and an epsilon
 *    (which guards a division: flushed, it brings back the inf it is there
 *    to prevent) or gemm's alpha and beta (which scale the whole result)
 *    when they flush to 0.
 * Values computed from weights by arithmetic are not evaluated here (fold
 * computes them later); NaN and infinities convert exactly. */
static double finite_max(kl_dtype t) {
  return t == KL_F16 ? 65504.0 : t == KL_BF16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
}

/* 2^-16 in fp16, 2^-125 in bf16: eight bits above the smallest subnormal. */
static double digits_floor(kl_dtype t) {
  return t == KL_F16 ? ldexp(1, -16) : t == KL_BF16 ? ldexp(1, -125) : ldexp(1, -141);
}

/* For each weight, its peak: the value of largest finite magnitude, with
 * its sign, and the weight it comes from; memoised per value id when
 * `state` is given (the pass), computed afresh when not (inspect). */
typedef struct {
  const kl_graph *g;
  kl_dtype low;
  int nvalues;       /* ids below it are memoised */
  signed char *state; /* value id -> 0 not yet, 1 known, -1 unknown */
  double *peak;
  const kl_value **source;
} range_ctx;

static void note_peak(double x, double *peak) {
  if (isfinite(x) && fabs(x) > fabs(*peak)) *peak = x;
}

/* The peak of n raw elements of dtype t.  f32, the weights of a large
 * model, is read as bits: the largest finite magnitude of each sign is
 * the largest of its bits (a loop the compiler can vectorise). */
static void raw_peak(kl_dtype t, const void *raw, int64_t n, double *peak) {
  if (t == KL_F32) {
    uint32_t top[2] = {0, 0}; /* positive, negative */
    for (int64_t i = 0; i < n; i++) {
      uint32_t u;
      memcpy(&u, (const char *)raw + 4 * i, 4);
      uint32_t a = u & 0x7fffffffu, finite = a < 0x7f800000u, neg = u >> 31;
      uint32_t p = finite && !neg ? a : 0, m = finite && neg ? a : 0;
      top[0] = p > top[0] ? p : top[0];
      top[1] = m > top[1] ? m : top[1];
    }
    for (int s = 0; s < 2; s++) {
      float x;
      memcpy(&x, &top[s], 4);
      note_peak(s ? -x : x, peak);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) note_peak(kl_raw_get(t, raw, i, NULL), peak);
}

/* A param's or const's peak: from its bytes, a slice at a time (a mapped
 * file's pages dropped once passed), or from its seeded init. */
static bool param_peak(const kl_graph *g, const kl_value *v, double *peak) {
  int64_t n = kl_shape_numel(&v->shape);
  *peak = 0;
  switch (v->init.kind) {
  case KL_INIT_ZEROS: return true;
  case KL_INIT_ONES: *peak = n ? 1 : 0; return true;
  case KL_INIT_FULL: if (n) note_peak(v->init.a, peak); return true;
  case KL_INIT_UNIFORM:
    if (n) note_peak(v->init.a, peak), note_peak(v->init.b, peak);
    return true;
  case KL_INIT_DATA: case KL_INIT_LOAD: {
    if (!v->data) return false;
    size_t size = kl_dtype_size(v->dtype);
    bool mapped = kl_graph_is_mapped(g, v->data, (size_t)n * size);
    enum { SLICE = 1 << 20 };
    for (int64_t lo = 0; lo < n; lo += SLICE) {
      int64_t k = n - lo < SLICE ? n - lo : SLICE;
      const char *in = (const char *)v->data + lo * (int64_t)size;
      raw_peak(v->dtype, in, k, peak);
      if (mapped) kl_pages_release(in, (size_t)k * size);
    }
    return true;
  }
  case KL_INIT_RANDN: {
    enum { SLICE = 1 << 16 };
    unsigned char *drawn = malloc(SLICE * kl_dtype_size(v->dtype));
    if (!drawn) abort();
    kl_rng rng;
    kl_rng_seed(&rng, v->init.seed);
    for (int64_t lo = 0; lo < n; lo += SLICE) {
      int64_t k = n - lo < SLICE ? n - lo : SLICE;
      kl_init_fill_raw(v, &rng, k, drawn);
      raw_peak(v->dtype, drawn, k, peak);
    }
    free(drawn);
    return true;
  }
  default: return false;
  }
}

static bool peak_of(range_ctx *r, const kl_value *v, int depth, double *peak,
                    const kl_value **source);

/* Data movement (and casts between float types) keeps the values it
 * moves: its output's peak is at most its inputs'. */
static bool moved_peak(range_ctx *r, const kl_node *p, int depth, double *peak,
                       const kl_value **source) {
  bool moves = kl_ops[p->op].kind == KL_KIND_DATA_MOVEMENT || p->op == KL_OP_CAST;
  if (!moves || p->op == KL_OP_CONSTANT || depth > 32) return false;
  *peak = 0;
  bool any = false;
  for (int k = 0; k < p->ninputs; k++) {
    double x;
    const kl_value *s;
    if (!kl_dtype_is_float(p->inputs[k]->dtype)) continue;
    if (!peak_of(r, p->inputs[k], depth + 1, &x, &s)) return false;
    if (!any || fabs(x) > fabs(*peak)) *peak = x, *source = s;
    any = true;
  }
  if (p->op == KL_OP_PAD) note_peak(kl_attr_float(p, "value", 0.0), peak);
  return any;
}

/* The peak of a weight, or of data movement over weights; false when v
 * is computed otherwise (or its contents are unknown). */
static bool peak_of(range_ctx *r, const kl_value *v, int depth, double *peak,
                    const kl_value **source) {
  bool memo = r->state && v->id < r->nvalues;
  if (memo && r->state[v->id]) {
    *peak = r->peak[v->id], *source = r->source[v->id];
    return r->state[v->id] > 0;
  }
  bool known;
  *source = v;
  *peak = 0;
  if (v->kind == KL_VAL_PARAM || v->kind == KL_VAL_CONST) {
    known = param_peak(r->g, v, peak);
  } else if (v->kind == KL_VAL_NODE && v->producer->op == KL_OP_CONSTANT) {
    const kl_attr *a = kl_node_attr(v->producer, "value");
    known = a && a->kind == KL_ATTR_FLOATS;
    for (int i = 0; known && i < a->n; i++) note_peak(a->floats[i], peak);
  } else {
    known = v->kind == KL_VAL_NODE && moved_peak(r, v->producer, depth, peak, source);
  }
  if (memo) {
    r->state[v->id] = known ? 1 : -1;
    r->peak[v->id] = *peak, r->source[v->id] = *source;
  }
  return known;
}

/* Input k of n is a factor of its result (see the comment above). */
static bool scales_by(const kl_node *n, int k) {
  switch (n->op) {
  case KL_OP_MATMUL: case KL_OP_MUL: return true;
  case KL_OP_GEMM: case KL_OP_CONV2D: case KL_OP_CONV_TRANSPOSE2D: case KL_OP_CONV2D_WEIGHT_GRAD:
    return k < 2;
  case KL_OP_DIV: return k == 1;
  case KL_OP_BATCH_NORM: return k == 1 || k == 4;
  default: return false;
  }
}

/* An attribute whose loss to 0 changes the result. */
static bool attr_must_not_flush(const kl_node *n, const char *name) {
  return !strcmp(name, "epsilon") ||
         (n->op == KL_OP_GEMM && (!strcmp(name, "alpha") || !strcmp(name, "beta")));
}

static const char *low_name(kl_dtype t) { return t == KL_F16 ? "fp16" : "bf16"; }

/* NULL when the numbers node n works with fit r->low, else why not. */
static const char *numbers_misfit(range_ctx *r, const kl_node *n, char *buf, size_t len) {
  kl_dtype low = r->low;
  double big = finite_max(low);
  for (int k = 0; k < n->ninputs; k++) {
    double x;
    const kl_value *s;
    kl_dtype t = n->inputs[k]->dtype; /* f64 is never lowered */
    if ((t != KL_F32 && t != KL_F16 && t != KL_BF16) || !peak_of(r, n->inputs[k], 0, &x, &s))
      continue;
    const char *what = s->kind == KL_VAL_PARAM ? "weight" : "constant";
    if (fabs(x) > big) {
      snprintf(buf, len, "%s '%s' holds %g, beyond %s's %g", what, s->name, x, low_name(low), big);
      return buf;
    }
    if (x == 0 || !scales_by(n, k) || fabs(x) >= digits_floor(low)) continue;
    if (kl_dtype_round(low, x) == 0)
      snprintf(buf, len, "%s '%s' holds at most %g in magnitude, which flushes to 0 in %s", what,
               s->name, fabs(x), low_name(low));
    else
      snprintf(buf, len, "%s '%s' holds at most %g in magnitude, which keeps under 8 significant "
               "bits in %s's subnormals", what, s->name, fabs(x), low_name(low));
    return buf;
  }
  for (int i = 0; i < n->nattrs; i++) {
    const kl_attr *a = &n->attrs[i];
    if (a->kind != KL_ATTR_FLOAT || !isfinite(a->f)) continue;
    if (fabs(a->f) > big) {
      snprintf(buf, len, "%s %g is beyond %s's %g", a->name, a->f, low_name(low), big);
      return buf;
    }
    if (a->f != 0 && kl_dtype_round(low, a->f) == 0 && attr_must_not_flush(n, a->name)) {
      snprintf(buf, len, "%s %g flushes to 0 in %s", a->name, a->f, low_name(low));
      return buf;
    }
  }
  return NULL;
}

/* The class the op table and the user's lists give n, and why that is
 * deny (NULL: it is not). */
static kl_precision_class listed_class(const kl_node *n, const kl_precision_options *opt,
                                       const char **why) {
  kl_precision_class c = kl_precision_op_class(n->op);
  *why = NULL;
  if (c == KL_PREC_KEEP) return c;
  if (opt && in_list(kl_ops[n->op].name, opt->fp32_ops, opt->nfp32_ops)) {
    *why = "--fp32-ops names its op";
    return KL_PREC_DENY;
  }
  bool named = opt && in_list(n->name, opt->fp32_nodes, opt->nfp32_nodes);
  /* a node is also known by the values it gives (`let h = ...` in .kl) */
  for (int k = 0; opt && k < n->noutputs && !named; k++)
    named = in_list(n->outputs[k]->name, opt->fp32_nodes, opt->nfp32_nodes);
  if (named) {
    *why = "--fp32-nodes names it";
    return KL_PREC_DENY;
  }
  if (c == KL_PREC_DENY) *why = "its op is in the deny class (fp32)";
  /* an op nobody has classified yet stays in fp32 */
  if (c == KL_PREC_UNLISTED) *why = "its op has no precision class", c = KL_PREC_DENY;
  return c;
}

const char *kl_precision_fp32_reason(const kl_graph *g, const kl_node *n,
                                     const kl_precision_options *opt, char *buf, size_t len) {
  const char *why;
  kl_precision_class c = listed_class(n, opt, &why);
  if (why) return snprintf(buf, len, "%s", why), buf;
  if (c == KL_PREC_KEEP || !opt || (opt->low != KL_F16 && opt->low != KL_BF16)) return NULL;
  range_ctx r = {.g = g, .low = opt->low};
  return numbers_misfit(&r, n, buf, len);
}

kl_precision_class kl_precision_node_class(const kl_node *n, const kl_precision_options *opt) {
  const char *why;
  return listed_class(n, opt, &why);
}

/* ---- pass state ------------------------------------------------------ */
/* What a node wants of its float inputs. */
typedef enum {
  WANT_FIXED, /* their original types: the node is left as it was */
  WANT_ANY,   /* whatever comes (a cast) */
  WANT_AT,    /* all of them in node_type[] */
  WANT_FLEX   /* a follow node over weights only: decided by its readers */
} want_mode;

/* A value's type while deciding: a dtype, or FLEX (a weight, or computed
 * from weights alone: it becomes what its readers want). */
#define FLEX KL_DTYPE_COUNT

typedef struct {
  kl_node *node;
  int k;
} reader;

typedef struct {
  kl_graph *g;
  const kl_precision_options *opt;
  kl_error *err;
  kl_dtype low;
  int nvalues, nnodes;   /* before the pass added any */
  kl_node **order;       /* original nodes, topologically */
  kl_dtype *orig;        /* value id -> its dtype before the pass */
  int *vtype;            /* value id -> kl_dtype or FLEX, while deciding */
  want_mode *mode;       /* node id -> */
  kl_dtype *node_type;   /* node id -> the type of WANT_AT */
  int *rstart;           /* value id -> first reader in readers[] */
  reader *readers;
  kl_value **cast_memo;  /* value id * 3 + slot -> the cast or converted copy */
  range_ctx range;       /* the weights' peaks, memoised */
} prec_ctx;

static bool is_fp(kl_dtype t) { return t == KL_F32 || t == KL_F16 || t == KL_BF16; }

static int memo_slot(kl_dtype t) { return t == KL_F32 ? 0 : t == KL_F16 ? 1 : 2; }

static bool is_weight(const kl_value *v) {
  return v->kind == KL_VAL_PARAM || v->kind == KL_VAL_CONST ||
         (v->kind == KL_VAL_NODE && v->producer->op == KL_OP_CONSTANT);
}

/* The type graph output i must have in the end. */
static kl_dtype output_type(const prec_ctx *c, const kl_value *v) {
  kl_dtype t = c->orig[v->id];
  return c->opt->io_set && is_fp(t) ? c->opt->io : t;
}

/* What reader (n, k) wants of its input; KL_DTYPE_COUNT for nothing. */
static kl_dtype wanted(const prec_ctx *c, const kl_node *n, int k) {
  const kl_value *v = n->inputs[k];
  if (v->id >= c->nvalues || !kl_dtype_is_float(c->orig[v->id])) return KL_DTYPE_COUNT;
  switch (c->mode[n->id]) {
  case WANT_ANY: return KL_DTYPE_COUNT;
  case WANT_FIXED: return c->orig[v->id];
  default: return c->node_type[n->id];
  }
}

/* ---- step 1: decide, forward ---------------------------------------- */
static void decide_node(prec_ctx *c, kl_node *n) {
  kl_precision_class cls = kl_precision_node_class(n, c->opt);
  char why[512];
  if ((cls == KL_PREC_ALLOW || cls == KL_PREC_FOLLOW) && c->low != KL_F32 &&
      numbers_misfit(&c->range, n, why, sizeof why))
    cls = KL_PREC_DENY;
  int nfloat = 0, nflex = 0, nlow = 0;
  bool eligible = true;
  for (int k = 0; k < n->ninputs; k++) {
    kl_value *v = n->inputs[k];
    if (!kl_dtype_is_float(c->orig[v->id])) continue;
    int t = c->vtype[v->id];
    nfloat++;
    if (t == FLEX) nflex++;
    else if (t == (int)c->low) nlow++;
    else if (t != KL_F32) eligible = false; /* f64, or the other 16-bit type */
  }
  want_mode m = WANT_FIXED;
  kl_dtype at = KL_F32;
  if (n->op == KL_OP_CAST) {
    m = WANT_ANY;
  } else if (n->op == KL_OP_CONSTANT) {
    m = c->orig[n->outputs[0]->id] == KL_F32 ? WANT_FLEX : WANT_FIXED;
  } else if (eligible && nfloat) {
    m = WANT_AT;
    if (cls == KL_PREC_ALLOW) at = c->low;
    else if (cls == KL_PREC_FOLLOW && nflex == nfloat) m = WANT_FLEX;
    else if (cls == KL_PREC_FOLLOW && nlow == nfloat - nflex) at = c->low;
  }
  c->mode[n->id] = m;
  c->node_type[n->id] = at;
  for (int k = 0; k < n->noutputs; k++) {
    kl_value *o = n->outputs[k];
    bool fp = is_fp(c->orig[o->id]);
    c->vtype[o->id] = !fp ? (int)c->orig[o->id]
                      : m == WANT_FLEX ? FLEX
                      : m == WANT_AT ? (int)at
                                     : (int)c->orig[o->id];
  }
}

/* ---- step 2: resolve, backward --------------------------------------- */
/* Over v's readers and its use as a graph output: does anyone want it in
 * the low type, and does anyone want another type? */
static void wants_of(const prec_ctx *c, const kl_value *v, bool *low, bool *other) {
  for (int r = c->rstart[v->id]; r < c->rstart[v->id + 1]; r++) {
    kl_dtype w = wanted(c, c->readers[r].node, c->readers[r].k);
    if (w == KL_DTYPE_COUNT) continue;
    if (w == c->low) *low = true;
    else *other = true;
  }
  if (v->is_output) {
    if (output_type(c, v) == c->low) *low = true;
    else *other = true;
  }
}

/* A weight-only follow node runs low when every reader of its float
 * outputs wants them low. */
static void resolve_flex_node(prec_ctx *c, kl_node *n) {
  bool low = false, other = false;
  for (int k = 0; k < n->noutputs; k++)
    if (is_fp(c->orig[n->outputs[k]->id])) wants_of(c, n->outputs[k], &low, &other);
  c->mode[n->id] = WANT_AT;
  c->node_type[n->id] = low && !other ? c->low : KL_F32;
}

/* ---- step 3: rewrite ------------------------------------------------- */

/* A finite weight stays finite in the low type: -1e9 as a mask value
 * becomes -65504, not -inf (which would turn 0 * mask into NaN). */
static double saturate(kl_dtype t, double v) {
  double m = finite_max(t);
  return isfinite(v) && v > m ? m : isfinite(v) && v < -m ? -m : v;
}

/* n elements of raw contents `in` (dtype from) into `out` (dtype t),
 * saturated.  f32 -> f16/bf16, the common case, converts directly: the
 * same bits kl_raw_set gives, without its rounding twice. */
static void convert_slice(kl_dtype from, const void *in, kl_dtype t, void *out, int64_t n) {
  if (from == KL_F32 && (t == KL_F16 || t == KL_BF16)) {
    for (int64_t i = 0; i < n; i++) {
      float x;
      memcpy(&x, (const char *)in + 4 * i, 4);
      x = (float)saturate(t, x);
      uint16_t h = t == KL_F16 ? krt_f32_to_f16(x) : krt_f32_to_bf16(x);
      memcpy((char *)out + 2 * i, &h, 2);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) kl_raw_set(t, out, i, saturate(t, kl_raw_get(from, in, i, NULL)));
}

/* Raw contents of weight v converted to dtype t, in the graph's arena, a
 * slice at a time: from the bytes where they lie (no float64 copy of the
 * whole weight; a mapped file's pages are dropped once passed), or drawn
 * from v's seeded init. */
static int convert_data(prec_ctx *c, const kl_value *v, kl_dtype t, void **out) {
  bool seeded = v->init.kind != KL_INIT_DATA && v->init.kind != KL_INIT_LOAD;
  if (!seeded && !v->data)
    return kl_fail(c->err, v->loc, "'%s' has no contents: its weights were not loaded", v->name);
  enum { SLICE = 1 << 20 }; /* elements */
  int64_t n = kl_shape_numel(&v->shape);
  size_t in_size = kl_dtype_size(v->dtype), out_size = kl_dtype_size(t);
  bool mapped = !seeded && kl_graph_is_mapped(c->g, v->data, (size_t)n * in_size);
  unsigned char *drawn = seeded ? malloc(SLICE * in_size) : NULL;
  if (seeded && !drawn) abort();
  kl_rng rng;
  kl_rng_seed(&rng, v->init.seed);
  *out = kl_arena_alloc(&c->g->arena, n ? (size_t)n * out_size : 1);
  for (int64_t lo = 0; lo < n; lo += SLICE) {
    int64_t k = n - lo < SLICE ? n - lo : SLICE;
    const char *in = seeded ? (const char *)drawn : (const char *)v->data + lo * in_size;
    if (seeded) kl_init_fill_raw(v, &rng, k, drawn);
    convert_slice(v->dtype, in, t, (char *)*out + lo * out_size, k);
    if (mapped) kl_pages_release(in, (size_t)k * in_size);
  }
  free(drawn);
  return 0;
}

/* Convert a param or const to dtype t where it stands. */
static int convert_weight(prec_ctx *c, kl_value *v, kl_dtype t) {
  if (v->init.kind == KL_INIT_DATA || v->init.kind == KL_INIT_LOAD) {
    void *raw;
    if (convert_data(c, v, t, &raw)) return -1;
    v->data = raw;
    v->init = (kl_init){.kind = KL_INIT_DATA}; /* the file holds the old type */
  } else if (v->init.kind == KL_INIT_FULL) {
    v->init.a = saturate(t, v->init.a);
  }
  v->dtype = t; /* seeded inits are drawn as before, then rounded to t */
  return 0;
}

/* The attributes of constant node n with its dtype set to t. */
static kl_attr *constant_attrs(prec_ctx *c, const kl_node *n, kl_dtype t, int *nattrs) {
  kl_attr *a = kl_arena_alloc(&c->g->arena, (size_t)(n->nattrs + 1) * sizeof *a);
  int na = 0;
  for (int i = 0; i < n->nattrs; i++) {
    a[na] = n->attrs[i];
    if (!strcmp(a[na].name, "dtype")) continue;
    if (!strcmp(a[na].name, "value") && a[na].kind == KL_ATTR_FLOATS) {
      double *f = kl_arena_alloc(&c->g->arena, (size_t)(a[na].n + 1) * sizeof *f);
      for (int j = 0; j < a[na].n; j++) f[j] = saturate(t, a[na].floats[j]);
      a[na].floats = f;
    }
    na++;
  }
  a[na++] = (kl_attr){.name = "dtype", .kind = KL_ATTR_DTYPE, .i = t};
  *nattrs = na;
  return a;
}

static const char *typed_name(prec_ctx *c, const char *base, const char *sep, kl_dtype t) {
  char buf[300];
  snprintf(buf, sizeof buf, "%.200s%s%s", base, sep, kl_dtype_name(t));
  return kl_graph_fresh_name(c->g, buf);
}

/* v as dtype t, memoised: a weight converted at compile time, anything
 * else a cast node "<v>_to_<t>". */
static kl_value *as_type(prec_ctx *c, kl_value *v, kl_dtype t, kl_loc loc) {
  kl_value **memo = &c->cast_memo[v->id * 3 + memo_slot(t)];
  if (*memo) return *memo;
  kl_value *out = NULL;
  /* a training step's params change every step: cast at run time */
  bool trained = v->kind == KL_VAL_PARAM && c->g->train && c->g->train->built;
  if (is_weight(v) && !trained && v->dtype == KL_F32 && t == c->low) {
    if (v->kind == KL_VAL_NODE) { /* constant node: a twin of type t */
      int na;
      kl_attr *a = constant_attrs(c, v->producer, t, &na);
      kl_node *n = kl_graph_add_node(c->g, KL_OP_CONSTANT, typed_name(c, v->name, "_", t), NULL,
                                     0, a, na, NULL, 0, v->producer->loc, c->err);
      out = n ? n->outputs[0] : NULL;
    } else {
      void *raw; /* in the arena already: the twin takes it as it is */
      if (convert_data(c, v, t, &raw)) return NULL;
      out = kl_graph_add_param(c->g, typed_name(c, v->name, "_", t), t, &v->shape, KL_VAL_CONST,
                               (kl_init){.kind = KL_INIT_DATA}, v->loc);
      out->data = raw;
    }
  } else {
    kl_attr to = {.name = "to", .kind = KL_ATTR_DTYPE, .i = t};
    kl_node *n = kl_graph_add_node(c->g, KL_OP_CAST, typed_name(c, v->name, "_to_", t), &v, 1,
                                   &to, 1, NULL, 0, loc, c->err);
    out = n ? n->outputs[0] : NULL;
  }
  return *memo = out;
}

static int reinfer(prec_ctx *c, kl_node *n) {
  if (!kl_ops[n->op].infer(n, c->err)) return 0;
  char msg[sizeof c->err->msg];
  snprintf(msg, sizeof msg, "%s", c->err->msg);
  return kl_fail(c->err, n->loc, "precision assignment broke node '%s': %s", n->name, msg);
}

static int rewrite_node(prec_ctx *c, kl_node *n) {
  if (n->op == KL_OP_CONSTANT && c->mode[n->id] == WANT_AT && c->node_type[n->id] == c->low &&
      n->outputs[0]->dtype != c->low) {
    n->attrs = constant_attrs(c, n, c->low, &n->nattrs);
    return reinfer(c, n);
  }
  bool changed = false;
  for (int k = 0; k < n->ninputs; k++) {
    kl_value *v = n->inputs[k];
    kl_dtype w = wanted(c, n, k);
    changed |= v->dtype != c->orig[v->id];
    if (w == KL_DTYPE_COUNT || w == v->dtype) continue;
    if (!(n->inputs[k] = as_type(c, v, w, n->loc))) return -1;
    changed = true;
  }
  return changed ? reinfer(c, n) : 0;
}

/* Graph output i in its final type: the low value is renamed and a cast
 * takes over the output's name, so callers see the name they declared. */
static int fix_output(prec_ctx *c, int i) {
  kl_value *v = c->g->outputs.items[i];
  kl_dtype t = output_type(c, v);
  if (v->dtype == t) return 0;
  const char *name = v->name;
  if (v->kind == KL_VAL_NODE)
    kl_graph_rename_value(c->g, v, typed_name(c, name, "_", v->dtype));
  kl_attr to = {.name = "to", .kind = KL_ATTR_DTYPE, .i = t};
  const char *out_name = v->kind == KL_VAL_NODE ? name : NULL;
  kl_node *n = kl_graph_add_node(c->g, KL_OP_CAST, typed_name(c, name, "_to_", t), &v, 1, &to,
                                 1, out_name ? &out_name : NULL, out_name ? 1 : 0, v->loc, c->err);
  if (!n) return -1;
  v->is_output = false;
  n->outputs[0]->is_output = true;
  n->outputs[0]->label = v->label; /* the name the model's user knows */
  c->g->outputs.items[i] = n->outputs[0];
  kl_train *tr = c->g->train; /* the training step reads its outputs by value */
  if (tr && tr->built) {
    kl_value **outs[] = {&tr->out_loss, &tr->out_ok, &tr->out_norm, &tr->out_logits};
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++)
      if (*outs[k] == v) *outs[k] = n->outputs[0];
  }
  return 0;
}

/* ---- the pass ---------------------------------------------------------- */
static int check_options(const kl_graph *g, const kl_precision_options *opt, kl_error *err) {
  kl_loc none = {0};
  if (!is_fp(opt->low) || (opt->io_set && !is_fp(opt->io)))
    return kl_fail(err, none, "precision: the types are fp32, fp16 and bf16");
  for (int i = 0; i < opt->nfp32_ops; i++) {
    kl_op op;
    if (kl_op_lookup(opt->fp32_ops[i], &op))
      return kl_fail(err, none, "--fp32-ops: no op is named '%s'", opt->fp32_ops[i]);
  }
  for (int i = 0; i < opt->nfp32_nodes; i++) {
    const kl_value *v = kl_graph_find_value(g, opt->fp32_nodes[i]);
    if (!kl_graph_find_node(g, opt->fp32_nodes[i]) && !(v && v->producer))
      return kl_fail(err, none, "--fp32-nodes: the model has no node or node output named '%s'",
                     opt->fp32_nodes[i]);
  }
  return 0;
}

int kl_assign_precision(kl_graph *g, const kl_precision_options *opt, kl_error *err) {
  if (check_options(g, opt, err)) return -1;
  prec_ctx c = {.g = g, .opt = opt, .err = err, .low = opt->low, .nvalues = g->values.len,
                .nnodes = g->nodes.len};
  size_t nv = (size_t)c.nvalues + 1, nn = (size_t)c.nnodes + 1;
  c.order = calloc(nn, sizeof *c.order);
  c.orig = calloc(nv, sizeof *c.orig);
  c.vtype = calloc(nv, sizeof *c.vtype);
  c.mode = calloc(nn, sizeof *c.mode);
  c.node_type = calloc(nn, sizeof *c.node_type);
  c.rstart = calloc(nv + 1, sizeof *c.rstart);
  c.cast_memo = calloc(nv * 3, sizeof *c.cast_memo);
  c.range = (range_ctx){.g = g, .low = opt->low, .nvalues = c.nvalues,
                        .state = calloc(nv, 1), .peak = calloc(nv, sizeof(double)),
                        .source = calloc(nv, sizeof(kl_value *))};
  if (!c.range.state || !c.range.peak || !c.range.source) abort();
  if (!c.order || !c.orig || !c.vtype || !c.mode || !c.node_type || !c.rstart || !c.cast_memo)
    abort();
  int rc = kl_topo_order(g, c.order, err);
  if (rc) goto done;

  /* readers of each value, grouped by value (counting sort) */
  int nreads = 0;
  for (int i = 0; i < c.nnodes; i++) {
    const kl_node *n = g->nodes.items[i];
    for (int k = 0; k < n->ninputs; k++) c.rstart[n->inputs[k]->id + 1]++;
    nreads += n->ninputs;
  }
  for (int v = 0; v < c.nvalues; v++) c.rstart[v + 1] += c.rstart[v];
  c.readers = calloc((size_t)nreads + 1, sizeof *c.readers);
  int *fill = calloc(nv, sizeof *fill);
  if (!c.readers || !fill) abort();
  for (int i = 0; i < c.nnodes; i++) {
    kl_node *n = g->nodes.items[i];
    for (int k = 0; k < n->ninputs; k++) {
      int id = n->inputs[k]->id;
      c.readers[c.rstart[id] + fill[id]++] = (reader){n, k};
    }
  }
  free(fill);

  for (int v = 0; v < c.nvalues; v++) {
    const kl_value *x = g->values.items[v];
    c.orig[v] = x->dtype;
    c.vtype[v] = x->dtype;
    if (x->kind == KL_VAL_INPUT && opt->io_set && is_fp(x->dtype)) c.vtype[v] = opt->io;
    if ((x->kind == KL_VAL_PARAM || x->kind == KL_VAL_CONST) && x->dtype == KL_F32)
      c.vtype[v] = FLEX;
  }
  for (int i = 0; i < c.nnodes; i++) decide_node(&c, c.order[i]);
  for (int i = c.nnodes - 1; i >= 0; i--)
    if (c.mode[c.order[i]->id] == WANT_FLEX) resolve_flex_node(&c, c.order[i]);

  /* weights every reader wants low are converted where they stand; the
   * others get a converted twin (as_type) for their low readers */
  for (int i = 0; i < g->params.len && !rc && c.low != KL_F32; i++) {
    kl_value *w = g->params.items[i];
    bool low = false, other = false;
    if (w->dtype != KL_F32) continue;
    wants_of(&c, w, &low, &other);
    if (low && !other) rc = convert_weight(&c, w, c.low);
  }
  for (int i = 0; i < g->inputs.len; i++) {
    kl_value *x = g->inputs.items[i];
    if (opt->io_set && is_fp(x->dtype)) x->dtype = opt->io;
  }
  for (int i = 0; i < c.nnodes && !rc; i++) rc = rewrite_node(&c, c.order[i]);
  for (int i = 0; i < g->outputs.len && !rc; i++) rc = fix_output(&c, i);
  if (!rc) rc = kl_verify(g, err);
done:
  free(c.order); free(c.orig); free(c.vtype); free(c.mode); free(c.node_type);
  free(c.rstart); free(c.readers); free(c.cast_memo);
  free(c.range.state); free(c.range.peak); free(c.range.source);
  return rc;
}
