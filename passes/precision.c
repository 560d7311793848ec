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
 * --fp32-ops and --fp32-nodes move ops and single nodes to deny.
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

kl_precision_class kl_precision_node_class(const kl_node *n, const kl_precision_options *opt) {
  kl_precision_class c = kl_precision_op_class(n->op);
  if (c == KL_PREC_KEEP) return c;
  if (opt && (in_list(kl_ops[n->op].name, opt->fp32_ops, opt->nfp32_ops) ||
              in_list(n->name, opt->fp32_nodes, opt->nfp32_nodes)))
    return KL_PREC_DENY;
  /* a node is also known by the values it gives (`let h = ...` in .kl) */
  for (int k = 0; opt && k < n->noutputs; k++)
    if (in_list(n->outputs[k]->name, opt->fp32_nodes, opt->nfp32_nodes)) return KL_PREC_DENY;
  /* an op nobody has classified yet stays in fp32 */
  return c == KL_PREC_UNLISTED ? KL_PREC_DENY : c;
}

kl_dtype kl_precision_node_dtype(const kl_node *n) {
  if (n->op != KL_OP_CAST)
    for (int k = 0; k < n->ninputs; k++)
      if (kl_dtype_is_float(n->inputs[k]->dtype)) return n->inputs[k]->dtype;
  return n->noutputs ? n->outputs[0]->dtype : KL_F32;
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
static double finite_max(kl_dtype t) {
  return t == KL_F16 ? 65504.0 : t == KL_BF16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
}

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
  if (is_weight(v) && v->dtype == KL_F32 && t == c->low) {
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
  return rc;
}
