/* bnfold.c - inference batch norms folded into the convolution or GEMM that
 * feeds them.  Per output channel c, with s[c] = scale[c] / sqrt(var[c] + eps):
 *
 *   batch_norm(conv(x, w) + b)[c] = conv(x, w * s)[c] + (b[c] - mean[c]) * s[c] + bias[c]
 *
 * The shift (the last two terms) is gemm's C, or an add after the
 * convolution or matmul: the elementwise kernel after it takes the add as
 * it took the batch norm, where a convolution's own bias would cost a
 * kernel of its own (codegen writes it before the GEMM).
 *
 * The new weights are computed in float64 and rounded once to their type,
 * before the precision pass: the graph loses a node and a rounding per
 * convolution, and the statistics (a running variance of 1e7 that no fp16
 * holds) never reach a low-precision kernel.
 *
 * A batch norm is folded only when nothing else can tell: its input is the
 * only use of a conv2d, conv_transpose2d, gemm or 2-D matmul output (not a
 * graph output), and its scale, bias, mean and var are weights, as are the
 * contraction's weight and bias.  Training-mode batch norms read computed
 * batch statistics, and graphs with a train block update their params, so
 * neither is folded.  Folded nodes, the contraction's old output and the
 * weights nobody reads any more leave the graph. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  kl_graph *g;
  kl_error *err;
  int *nreads;        /* value id -> times read by a node */
  bool *dead_node;    /* node id -> */
  bool *dead_value;   /* value id -> removed, or a candidate (params) */
  FILE *dump;
} fold_ctx;

static bool is_weight(const kl_value *v) {
  return v->kind == KL_VAL_PARAM || v->kind == KL_VAL_CONST ||
         (v->kind == KL_VAL_NODE && v->producer->op == KL_OP_CONSTANT);
}

/* A weight's contents as a tensor (float64); NULL with err set when it has
 * none (weights that were never loaded). */
static kl_tensor *weight_tensor(const kl_value *v, kl_error *err) {
  kl_tensor *t = NULL;
  if (v->kind != KL_VAL_NODE) return kl_value_materialize(v, &t, err) ? NULL : t;
  return kl_fold_eval(v->producer, NULL, &t, err) ? NULL : t;
}

/* The output channels of contraction p and how its weight's elements map
 * to them. */
typedef struct {
  int64_t channels;
  int64_t inner;        /* element e of the weight: channel (e / inner) % channels */
  int64_t per_group;    /* conv_transpose2d: channels of one group; 0 else */
  int64_t in_per_group; /* conv_transpose2d: input channels of one group */
} channel_map;

static int64_t channel_of(const channel_map *m, const kl_value *w, int64_t e) {
  if (m->per_group) { /* w[Cin, M/groups, kH, kW]: group of the input channel */
    int64_t plane = w->shape.dims[2] * w->shape.dims[3];
    int64_t j = (e / plane) % w->shape.dims[1], ci = e / (plane * w->shape.dims[1]);
    return (ci / m->in_per_group) * m->per_group + j;
  }
  return (e / m->inner) % m->channels;
}

/* NULL when contraction p's output channels can be scaled through its
 * weight (filling *m), else why not. */
static const char *channels_of(const kl_node *p, int64_t channels, channel_map *m) {
  const kl_value *w = p->inputs[1], *y = p->outputs[0];
  *m = (channel_map){.channels = channels, .inner = 1};
  switch (p->op) {
  case KL_OP_CONV2D: /* w[M, C/groups, kH, kW] */
    if (w->shape.rank != 4 || w->shape.dims[0] != channels) return "an unexpected weight shape";
    m->inner = w->shape.dims[1] * w->shape.dims[2] * w->shape.dims[3];
    return NULL;
  case KL_OP_CONV_TRANSPOSE2D: { /* w[Cin, M/groups, kH, kW] */
    int64_t groups = kl_attr_int(p, "groups", 1);
    if (w->shape.rank != 4 || groups < 1 || w->shape.dims[1] * groups != channels ||
        w->shape.dims[0] % groups)
      return "an unexpected weight shape";
    m->per_group = w->shape.dims[1];
    m->in_per_group = w->shape.dims[0] / groups;
    return NULL;
  }
  case KL_OP_GEMM: /* y[M, N] = A' B', B'[K, N] is B or B^T */
    if (w->shape.rank != 2) return "an unexpected weight shape";
    if (kl_attr_int(p, "trans_b", 0)) m->inner = w->shape.dims[1]; /* B[N, K]: rows */
    if (p->ninputs > 2) { /* C: a scalar or one row of N, [N] or [1, N] */
      const kl_shape *cs = &p->inputs[2]->shape;
      int64_t n = kl_shape_numel(cs);
      if (n != 1 && (n != channels || cs->dims[cs->rank - 1] != channels))
        return "its C is not a scalar or one row of N";
    }
    return NULL;
  case KL_OP_MATMUL: /* y[M, N] = x @ w[K, N]: columns */
    if (w->shape.rank != 2 || y->shape.rank != 2) return "it is not a 2-D matmul";
    return NULL;
  default: return "its input is not made by a conv2d, conv_transpose2d, gemm or matmul";
  }
}

/* Weights whose bytes were never given (a load the driver did not
 * resolve) are left for the pass that needs them to report. */
static bool has_contents(const kl_value *v) {
  bool stored = v->init.kind == KL_INIT_DATA || v->init.kind == KL_INIT_LOAD;
  return v->kind == KL_VAL_NODE || !stored || v->data;
}

/* NULL when batch norm n folds into the node making its input, else why
 * not (for --dump-after). */
static const char *why_not(const fold_ctx *c, const kl_node *n, channel_map *m) {
  if (!kl_is_channel_affine(n)) return "its statistics are not one per channel";
  for (int k = 1; k < 5; k++)
    if (!is_weight(n->inputs[k]))
      return "its statistics or affine are computed (training mode), not weights";
  const kl_value *x = n->inputs[0];
  const kl_node *p = x->kind == KL_VAL_NODE ? x->producer : NULL;
  if (!p || x->producer_output != 0)
    return "its input is not made by a conv2d, conv_transpose2d, gemm or matmul";
  if (x->is_output) return "its input is also a graph output";
  if (c->nreads[x->id] != 1) return "its input has another reader";
  const char *why = channels_of(p, x->shape.dims[1], m);
  if (why) return why;
  if (!is_weight(p->inputs[1]) || !kl_dtype_is_float(p->inputs[1]->dtype))
    return "the contraction's weight is not a float weight";
  if (p->ninputs > 2 && !is_weight(p->inputs[2])) return "the contraction's bias is computed";
  if (p->op == KL_OP_MATMUL && is_weight(p->inputs[0])) return "both matmul operands are weights";
  for (int k = 1; k < 5; k++)
    if (!has_contents(n->inputs[k])) return "its weights were not loaded";
  for (int k = 1; k < p->ninputs; k++)
    if (!has_contents(p->inputs[k])) return "the contraction's weights were not loaded";
  return NULL;
}

/* A new weight of `like`'s kind (a param when it is one, as ONNX
 * initializers are, else a const), holding `raw` (in the graph's arena). */
static kl_value *new_weight(fold_ctx *c, const kl_value *like, kl_dtype dtype, const kl_shape *s,
                            const char *name, void *raw) {
  kl_value_kind kind = like->kind == KL_VAL_PARAM ? KL_VAL_PARAM : KL_VAL_CONST;
  kl_value *v = kl_graph_add_param(c->g, kl_graph_fresh_value_name(c->g, name), dtype, s, kind,
                                   (kl_init){.kind = KL_INIT_DATA}, like->loc);
  v->data = raw;
  return v;
}

/* The folded weight (raw, in the graph's arena) and shift (a tensor). */
typedef struct {
  void *w;
  kl_tensor *b;
} folded;

/* Weight w scaled per output channel by s, into the arena, rounded once to
 * w's type: read where its bytes lie (a mapped file's pages dropped once
 * passed; f32, the common case, directly), or from its materialized
 * contents.  1 when a scaled value is not finite in w's type. */
static int scale_weight(fold_ctx *c, const kl_value *w, const channel_map *m, const double *s,
                        void **out) {
  int64_t n = kl_shape_numel(&w->shape);
  size_t size = kl_dtype_size(w->dtype);
  *out = kl_arena_alloc(&c->g->arena, n ? (size_t)n * size : 1);
  const unsigned char *raw = w->kind == KL_VAL_NODE ? NULL : w->data;
  unsigned char *drawn = NULL;
  if (!raw) { /* seeded, or a constant node: its values as bytes */
    kl_tensor *t = weight_tensor(w, c->err);
    if (!t) return -1;
    drawn = malloc((size_t)n * size + 1);
    if (!drawn) abort();
    kl_tensor_to_raw(t, drawn);
    kl_tensor_free(t);
    raw = drawn;
  }
  bool mapped = !drawn && kl_graph_is_mapped(c->g, raw, (size_t)n * size), finite = true;
  enum { SLICE = 1 << 20 };
  for (int64_t lo = 0; lo < n; lo += SLICE) {
    int64_t hi = n - lo < SLICE ? n : lo + SLICE;
    for (int64_t e = lo; e < hi; e++) {
      double f = s[channel_of(m, w, e)];
      if (w->dtype == KL_F32) {
        float x;
        memcpy(&x, raw + 4 * e, 4);
        x = (float)(x * f);
        finite &= isfinite(x) != 0;
        memcpy((char *)*out + 4 * e, &x, 4);
      } else {
        double x = kl_dtype_round(w->dtype, kl_raw_get(w->dtype, raw, e, NULL) * f);
        finite &= isfinite(x) != 0;
        kl_raw_set(w->dtype, *out, e, x);
      }
    }
    if (mapped) kl_pages_release(raw + lo * (int64_t)size, (size_t)(hi - lo) * size);
  }
  free(drawn);
  return finite ? 0 : 1;
}

/* 0 with *out filled; 1 when the numbers do not allow it (a non-finite
 * scale, or a weight beyond its type once scaled); -1 on an error. */
static int compute(fold_ctx *c, const kl_node *n, const kl_node *p, const channel_map *m,
                   folded *out) {
  kl_tensor *t[4] = {0}, *b = NULL;
  double *s = NULL;
  int rc = -1;
  for (int k = 0; k < 4; k++)
    if (!(t[k] = weight_tensor(n->inputs[k + 1], c->err))) goto done;
  const kl_value *pb = p->ninputs > 2 ? p->inputs[2] : NULL;
  if (pb && !(b = weight_tensor(pb, c->err))) goto done;
  double eps = kl_attr_float(n, "epsilon", 1e-5);
  double beta = p->op == KL_OP_GEMM ? kl_attr_float(p, "beta", 1.0) : 1.0;
  int64_t ch = m->channels;
  s = malloc((size_t)ch * sizeof *s + 1);
  if (!s) abort();
  kl_shape bs = {.rank = 1, .dims = {ch}};
  out->b = kl_tensor_new(pb ? pb->dtype : p->outputs[0]->dtype, &bs);
  rc = 0;
  for (int64_t i = 0; i < ch; i++) {
    double scale = t[0]->data[i], bias = t[1]->data[i], mean = t[2]->data[i], var = t[3]->data[i];
    s[i] = scale / sqrt(var + eps);
    double before = b ? beta * b->data[b->numel == 1 ? 0 : i] : 0.0;
    out->b->data[i] = kl_dtype_round(out->b->dtype, (before - mean) * s[i] + bias);
    if (!isfinite(s[i]) || !isfinite(out->b->data[i])) rc = 1;
  }
  if (!rc) rc = scale_weight(c, p->inputs[1], m, s, &out->w);
  if (rc) kl_tensor_free(out->b), out->b = NULL;
done:
  for (int k = 0; k < 4; k++) kl_tensor_free(t[k]);
  kl_tensor_free(b);
  free(s);
  return rc;
}

/* Node q now produces value y, the batch norm's output (its readers and
 * name stay); q's own output leaves the graph. */
static void take_output(fold_ctx *c, kl_node *q, kl_value *y) {
  c->dead_value[q->outputs[0]->id] = true;
  q->outputs[0] = y;
  y->producer = q;
  y->producer_output = 0;
}

static void read_less(fold_ctx *c, kl_value *v) {
  c->nreads[v->id]--;
  if (v->kind != KL_VAL_NODE) c->dead_value[v->id] = true; /* a candidate */
}

/* The attributes of p with beta = 1 (gemm: beta is now in the bias). */
static kl_attr *beta_one(fold_ctx *c, const kl_node *p, int *nattrs) {
  kl_attr *a = kl_arena_alloc(&c->g->arena, (size_t)(p->nattrs + 1) * sizeof *a);
  int na = 0;
  for (int i = 0; i < p->nattrs; i++)
    if (strcmp(p->attrs[i].name, "beta")) a[na++] = p->attrs[i];
  a[na++] = (kl_attr){.name = "beta", .kind = KL_ATTR_FLOAT, .f = 1.0};
  *nattrs = na;
  return a;
}

/* 1 when folded, 0 when the numbers forbid it, -1 on an error. */
static int fold(fold_ctx *c, kl_node *n, const channel_map *m) {
  kl_node *p = n->inputs[0]->producer;
  folded f = {0};
  int rc = compute(c, n, p, m, &f);
  if (rc < 0) return -1;
  if (rc > 0) {
    if (c->dump)
      fprintf(c->dump, "  %s = batch_norm: not folded: its folded weights would not be finite\n",
              n->outputs[0]->name);
    return 0;
  }
  char name[300];
  kl_value *w = p->inputs[1], *y = n->outputs[0];
  snprintf(name, sizeof name, "%.200s_bn", w->name);
  kl_value *nw = new_weight(c, w, w->dtype, &w->shape, name, f.w);
  /* gemm adds the shift as its C; the others as an add after them, one
   * per channel ([C, 1, 1] after a convolution), which the kernel after
   * them takes as the batch norm's was: a convolution's own bias is a
   * kernel of its own */
  kl_shape shift = f.b->shape;
  for (int d = 2; p->op != KL_OP_GEMM && d < y->shape.rank; d++) shift.dims[shift.rank++] = 1;
  snprintf(name, sizeof name, "%.200s_shift", y->name);
  size_t shift_bytes = (size_t)f.b->numel * kl_dtype_size(f.b->dtype);
  void *shift_raw = kl_arena_alloc(&c->g->arena, shift_bytes + 1);
  kl_tensor_to_raw(f.b, shift_raw);
  kl_value *nb = new_weight(c, n->inputs[2], f.b->dtype, &shift, name, shift_raw);
  kl_tensor_free(f.b);
  for (int k = 1; k < 5; k++) read_less(c, n->inputs[k]);
  c->nreads[n->inputs[0]->id]--;
  read_less(c, w);
  if (p->ninputs > 2) read_less(c, p->inputs[2]);
  kl_value **in = kl_arena_alloc(&c->g->arena, 3 * sizeof *in);
  in[0] = p->inputs[0];
  in[1] = nw;
  in[2] = nb;
  p->inputs = in;
  p->ninputs = p->op == KL_OP_GEMM ? 3 : 2;
  kl_node *last = p;
  if (p->op == KL_OP_GEMM) {
    p->attrs = beta_one(c, p, &p->nattrs);
  } else {
    kl_value *ins[2] = {p->outputs[0], nb};
    snprintf(name, sizeof name, "%.200s_shift", n->name);
    last = kl_graph_add_node(c->g, KL_OP_ADD, kl_graph_fresh_name(c->g, name), ins, 2, NULL, 0,
                             NULL, 0, n->loc, c->err);
    if (!last) return -1;
    c->nreads[p->outputs[0]->id]++;
  }
  c->nreads[nw->id]++;
  c->nreads[nb->id]++;
  take_output(c, last, y);
  c->dead_node[n->id] = true;
  if (c->dump)
    fprintf(c->dump, "  %s = batch_norm: folded into %s (%s): weight %s, %s %s\n", y->name,
            p->name, kl_ops[p->op].name, nw->name, last == p ? "bias" : "shift added after it",
            nb->name);
  return 1;
}

/* Removed values and nodes keep no name a lookup could find. */
static void unname_value(fold_ctx *c, kl_value *v) {
  char buf[300];
  snprintf(buf, sizeof buf, "%.200s~bnfold", v->name);
  kl_graph_rename_value(c->g, v, kl_graph_fresh_name(c->g, buf));
}

/* Drop the dead nodes and values from the graph's lists and number the
 * rest again. */
static void compact(fold_ctx *c) {
  kl_graph *g = c->g;
  int nn = 0, nv = 0, np = 0;
  for (int i = 0; i < g->nodes.len; i++) {
    kl_node *n = g->nodes.items[i];
    if (c->dead_node[i]) {
      char buf[300];
      snprintf(buf, sizeof buf, "%.200s~bnfold", n->name);
      kl_graph_rename_node(g, n, kl_graph_fresh_name(g, buf));
      continue;
    }
    n->id = nn;
    g->nodes.items[nn++] = n;
  }
  g->nodes.len = nn;
  for (int i = 0; i < g->params.len; i++)
    if (!c->dead_value[g->params.items[i]->id]) g->params.items[np++] = g->params.items[i];
  g->params.len = np;
  for (int i = 0; i < g->values.len; i++) {
    kl_value *v = g->values.items[i];
    if (c->dead_value[i]) {
      unname_value(c, v);
      continue;
    }
    v->id = nv;
    g->values.items[nv++] = v;
  }
  g->values.len = nv;
}

int kl_fold_batch_norms(kl_graph *g, FILE *dump, kl_error *err) {
  if (g->train) {
    if (dump) fprintf(dump, "  (nothing folded: the graph trains its params)\n");
    return 0;
  }
  int nvalues = g->values.len, nnodes = g->nodes.len, nbn = 0;
  for (int i = 0; i < nnodes; i++) nbn += g->nodes.items[i]->op == KL_OP_BATCH_NORM;
  if (!nbn) { /* most graphs: nothing to order, count or verify */
    if (dump) fprintf(dump, "  (no batch_norm)\n");
    return 0;
  }
  /* values and nodes added below get ids past these; room for them */
  size_t vcap = (size_t)nvalues * 2 + (size_t)nnodes * 4 + 8;
  fold_ctx c = {.g = g, .err = err, .dump = dump};
  c.nreads = calloc(vcap, sizeof *c.nreads);
  c.dead_value = calloc(vcap, sizeof *c.dead_value);
  c.dead_node = calloc((size_t)nnodes * 2 + 8, sizeof *c.dead_node);
  kl_node **order = calloc((size_t)nnodes + 1, sizeof *order);
  if (!c.nreads || !c.dead_value || !c.dead_node || !order) abort();
  int rc = kl_topo_order(g, order, err), nfolded = 0;
  for (int i = 0; i < nnodes && !rc; i++) {
    const kl_node *n = g->nodes.items[i];
    for (int k = 0; k < n->ninputs; k++) c.nreads[n->inputs[k]->id]++;
  }
  for (int i = 0; i < nnodes && !rc; i++) {
    kl_node *n = order[i];
    if (n->op != KL_OP_BATCH_NORM) continue;
    channel_map m;
    const char *why = why_not(&c, n, &m);
    if (why) {
      if (dump) fprintf(dump, "  %s = batch_norm: not folded: %s\n", n->outputs[0]->name, why);
      continue;
    }
    int r = fold(&c, n, &m);
    if (r < 0) rc = -1;
    else nfolded += r;
  }
  if (!rc) {
    /* the weights the folded nodes read, unless something still does */
    for (int i = 0; i < g->values.len; i++) {
      const kl_value *v = g->values.items[i];
      if (c.dead_value[i] && v->kind != KL_VAL_NODE && (c.nreads[i] > 0 || v->is_output))
        c.dead_value[i] = false;
    }
    if (nfolded) compact(&c);
  }
  free(c.nreads);
  free(c.dead_value);
  free(c.dead_node);
  free(order);
  return rc || !nfolded ? rc : kl_verify(g, err);
}
