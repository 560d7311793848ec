/* onnx_ops_rnn.c - ONNX recurrent cells (RNN, GRU, LSTM), unrolled over
 * the static sequence length into gemms and activations. */
#include <stdio.h>
#include <string.h>

#include "onnx_emit.h"

enum { MAX_UNROLLED_STEPS = 4096 };

/* ---- RNN, GRU, LSTM --------------------------------------------------- */
/* Unrolled over the static sequence length: the input projections of all
 * steps are one gemm per gate, then each step adds h @ R_g^T (a gemm whose
 * C is that step's projection) and applies the gate's activation.
 * Directions run apart and their outputs are concatenated.  Gate orders are
 * ONNX's: GRU z, r, h; LSTM i, o, f, c (peepholes i, o, f). */

enum { MAX_GATES = 4 };

/* One of the cell's activation functions with its alpha and beta. */
typedef struct {
  const char *name;
  double alpha, beta;
} activation;

/* The ONNX activations a recurrent node may name, with their default
 * parameters and how many of alpha, beta they take. */
static const struct {
  const char *name;
  int nparams;
  double alpha, beta;
} act_kinds[] = {
    {"Tanh", 0, 0, 0},           {"Sigmoid", 0, 0, 0},       {"Relu", 0, 0, 0},
    {"Softsign", 0, 0, 0},       {"Softplus", 0, 0, 0},      {"LeakyRelu", 1, 0.01, 0},
    {"ThresholdedRelu", 1, 1.0, 0}, {"Elu", 1, 1.0, 0},      {"HardSigmoid", 2, 0.2, 0.5},
    {"Affine", 2, 1.0, 0.0},     {"ScaledTanh", 2, 1.0, 1.0},
};

static kl_value *with_scalar(kl_onnx_ctx *c, kl_op op, kl_value *x, double v) {
  return x ? binary(c, op, x, kl_onnx_scalar(c, x->dtype, v)) : NULL;
}

static kl_value *apply_act(kl_onnx_ctx *c, const activation *f, kl_value *x) {
  const char *s = f->name;
  double a = f->alpha, b = f->beta;
  if (!strcmp(s, "Tanh")) return unary(c, KL_OP_TANH, x, NULL, 0);
  if (!strcmp(s, "Sigmoid")) return unary(c, KL_OP_SIGMOID, x, NULL, 0);
  if (!strcmp(s, "Relu")) return unary(c, KL_OP_RELU, x, NULL, 0);
  if (!strcmp(s, "Softplus")) return unary(c, KL_OP_SOFTPLUS, x, NULL, 0);
  if (!strcmp(s, "Softsign"))
    return binary(c, KL_OP_DIV, x, with_scalar(c, KL_OP_ADD, unary(c, KL_OP_ABS, x, NULL, 0), 1));
  if (!strcmp(s, "LeakyRelu")) {
    kl_attr at = kl_af("alpha", a);
    return unary(c, KL_OP_LEAKY_RELU, x, &at, 1);
  }
  if (!strcmp(s, "Elu")) {
    kl_attr at = kl_af("alpha", a);
    return unary(c, KL_OP_ELU, x, &at, 1);
  }
  if (!strcmp(s, "ThresholdedRelu")) {
    kl_value *ins[3] = {with_scalar(c, KL_OP_GT, x, a), x, kl_onnx_scalar(c, x->dtype, 0)};
    return ins[0] ? kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0) : NULL;
  }
  kl_value *ax = with_scalar(c, KL_OP_MUL, x, a);
  if (!strcmp(s, "Affine")) return with_scalar(c, KL_OP_ADD, ax, b);
  if (!strcmp(s, "HardSigmoid")) {
    kl_value *y = with_scalar(c, KL_OP_ADD, ax, b);
    return with_scalar(c, KL_OP_MAXIMUM, with_scalar(c, KL_OP_MINIMUM, y, 1), 0);
  }
  /* ScaledTanh: alpha * tanh(beta * x) */
  kl_value *t = unary(c, KL_OP_TANH, with_scalar(c, KL_OP_MUL, x, b), NULL, 0);
  return with_scalar(c, KL_OP_MUL, t, a);
}

/* What differs between RNN, GRU and LSTM. */
typedef struct {
  int gates;            /* G: W is [dirs, G*H, in] */
  int nacts;            /* activations per direction */
  const char *acts[3];  /* their defaults */
} cell_kind;

static const cell_kind k_rnn = {1, 1, {"Tanh"}};
static const cell_kind k_gru = {3, 2, {"Sigmoid", "Tanh"}};
static const cell_kind k_lstm = {4, 3, {"Sigmoid", "Tanh", "Tanh"}};

/* A node's reading of its inputs and attributes. */
typedef struct {
  const cell_kind *kind;
  kl_value *x, *w, *r, *b, *lens, *h0, *c0, *p;
  int64_t seq, batch, in, hidden;
  int dirs;
  bool reverse_only, layout1, lbr;
  double clip;          /* 0: none */
  activation act[2][3]; /* per direction */
} rnn_spec;

static kl_value *slice_axis(kl_onnx_ctx *c, kl_value *x, int64_t axis, int64_t start,
                            int64_t end) {
  int64_t one = 1;
  kl_attr a[4] = {kl_ais("starts", &start, 1), kl_ais("ends", &end, 1),
                  kl_ais("axes", &axis, 1), kl_ais("steps", &one, 1)};
  return unary(c, KL_OP_SLICE, x, a, 4);
}

static kl_value *reshape_to(kl_onnx_ctx *c, kl_value *x, int rank, int64_t d0, int64_t d1,
                            int64_t d2) {
  kl_shape s = {.rank = rank, .dims = {d0, d1, d2}};
  return reshape(c, x, &s);
}

static kl_value *transpose(kl_onnx_ctx *c, kl_value *x, const int64_t *perm) {
  kl_attr a = kl_ais("perm", perm, x ? x->shape.rank : 0);
  return unary(c, KL_OP_TRANSPOSE, x, &a, 1);
}

static kl_value *concat(kl_onnx_ctx *c, kl_value **xs, int n, int64_t axis) {
  for (int i = 0; i < n; i++)
    if (!xs[i]) return NULL;
  kl_attr a = kl_ai("axis", axis);
  return kl_onnx_emit(c, KL_OP_CONCAT, xs, n, &a, 1);
}

/* gemm(a, b^T) + c (c may be NULL). */
static kl_value *gemm_bt(kl_onnx_ctx *c, kl_value *a, kl_value *b, kl_value *cc) {
  kl_attr at = kl_ai("trans_b", 1);
  kl_value *ins[3] = {a, b, cc};
  return a && b ? kl_onnx_emit(c, KL_OP_GEMM, ins, cc ? 3 : 2, &at, 1) : NULL;
}

/* Row block `blk` (H rows) of direction d of a [dirs, k*H, cols] weight,
 * as [H, cols]. */
static kl_value *weight_block(kl_onnx_ctx *c, kl_value *w, int d, int blk, int64_t h) {
  int64_t cols = w->shape.dims[2];
  kl_value *v = slice_axis(c, slice_axis(c, w, 0, d, d + 1), 1, blk * h, (blk + 1) * h);
  return reshape_to(c, v, 2, h, cols, 0);
}

/* Block `blk` of direction d of a [dirs, k*H] vector (bias, peepholes) as
 * [H]; a zero constant when v is absent. */
static kl_value *vector_block(kl_onnx_ctx *c, kl_value *v, int d, int blk, int64_t h,
                              kl_dtype t) {
  kl_shape s = {.rank = 1, .dims = {h}};
  double zero = 0;
  if (!v) return kl_onnx_constant(c, t, &s, &zero, 1);
  return reshape(c, slice_axis(c, slice_axis(c, v, 0, d, d + 1), 1, blk * h, (blk + 1) * h), &s);
}

/* Direction d's initial state from [dirs, batch, H] (zeros when absent). */
static kl_value *initial_state(kl_onnx_ctx *c, const rnn_spec *sp, kl_value *v, int d) {
  kl_shape s = {.rank = 2, .dims = {sp->batch, sp->hidden}};
  double zero = 0;
  if (!v) return kl_onnx_constant(c, sp->x->dtype, &s, &zero, 1);
  return reshape(c, slice_axis(c, v, 0, d, d + 1), &s);
}

static kl_value *clipped(kl_onnx_ctx *c, const rnn_spec *sp, kl_value *v) {
  if (!sp->clip) return v;
  return with_scalar(c, KL_OP_MINIMUM, with_scalar(c, KL_OP_MAXIMUM, v, -sp->clip), sp->clip);
}

/* where(mask, a, b) (a when mask is NULL). */
static kl_value *select(kl_onnx_ctx *c, kl_value *mask, kl_value *a, kl_value *b) {
  if (!mask) return a;
  kl_value *ins[3] = {mask, a, b};
  return a && b ? kl_onnx_emit(c, KL_OP_WHERE, ins, 3, NULL, 0) : NULL;
}

/* One direction: y receives the per-step outputs [1, 1, batch, H] in time
 * order; *h_out (and *c_out for LSTM) the final states [batch, H]. */
static int run_direction(kl_onnx_ctx *c, const rnn_spec *sp, int d, bool backward, kl_value **y,
                         kl_value **h_out, kl_value **c_out) {
  const cell_kind *k = sp->kind;
  int64_t h = sp->hidden, nb = sp->batch;
  kl_dtype t = sp->x->dtype;
  bool gru = k == &k_gru, lstm = k == &k_lstm;
  const activation *act = sp->act[d];
  kl_value *xflat = reshape_to(c, sp->x, 2, sp->seq * nb, sp->in, 0);
  kl_value *xw[MAX_GATES], *rg[MAX_GATES], *rb_h = NULL, *peep[3] = {NULL, NULL, NULL};
  for (int g = 0; g < k->gates; g++) {
    kl_value *wb = vector_block(c, sp->b, d, g, h, t);
    kl_value *rb = vector_block(c, sp->b, d, k->gates + g, h, t);
    /* GRU with linear_before_reset keeps Rbh inside the reset product. */
    if (gru && g == 2 && sp->lbr) rb_h = rb;
    else wb = binary(c, KL_OP_ADD, wb, rb);
    kl_value *proj = gemm_bt(c, xflat, weight_block(c, sp->w, d, g, h), wb);
    xw[g] = reshape_to(c, proj, 3, sp->seq, nb, h);
    rg[g] = weight_block(c, sp->r, d, g, h);
    if (!xw[g] || !rg[g]) return -1;
  }
  if (lstm && sp->p)
    for (int g = 0; g < 3; g++) peep[g] = vector_block(c, sp->p, d, g, h, t);
  kl_value *hs = initial_state(c, sp, sp->h0, d);
  kl_value *cs = lstm ? initial_state(c, sp, sp->c0, d) : NULL;
  kl_value *zeros = sp->lens ? initial_state(c, sp, NULL, d) : NULL;
  kl_value *lens = sp->lens ? reshape_to(c, cast(c, sp->lens, KL_I64), 2, nb, 1, 0) : NULL;
  for (int64_t i = 0; i < sp->seq; i++) {
    int64_t step = backward ? sp->seq - 1 - i : i;
    kl_value *pre[MAX_GATES];
    for (int g = 0; g < k->gates; g++)
      pre[g] = reshape_to(c, slice_axis(c, xw[g], 0, step, step + 1), 2, nb, h, 0);
    kl_value *hn, *cn = NULL;
    if (!gru && !lstm) {
      hn = apply_act(c, &act[0], clipped(c, sp, gemm_bt(c, hs, rg[0], pre[0])));
    } else if (gru) {
      kl_value *z = apply_act(c, &act[0], clipped(c, sp, gemm_bt(c, hs, rg[0], pre[0])));
      kl_value *r = apply_act(c, &act[0], clipped(c, sp, gemm_bt(c, hs, rg[1], pre[1])));
      kl_value *hh = sp->lbr
          ? binary(c, KL_OP_ADD, pre[2], binary(c, KL_OP_MUL, r, gemm_bt(c, hs, rg[2], rb_h)))
          : gemm_bt(c, binary(c, KL_OP_MUL, r, hs), rg[2], pre[2]);
      hh = apply_act(c, &act[1], clipped(c, sp, hh));
      /* (1 - z) * hh + z * h = hh + z * (h - hh) */
      hn = binary(c, KL_OP_ADD, hh, binary(c, KL_OP_MUL, z, binary(c, KL_OP_SUB, hs, hh)));
    } else {
      kl_value *gi = gemm_bt(c, hs, rg[0], pre[0]), *go = gemm_bt(c, hs, rg[1], pre[1]);
      kl_value *gf = gemm_bt(c, hs, rg[2], pre[2]), *gc = gemm_bt(c, hs, rg[3], pre[3]);
      if (peep[0]) {
        gi = binary(c, KL_OP_ADD, gi, binary(c, KL_OP_MUL, peep[0], cs));
        gf = binary(c, KL_OP_ADD, gf, binary(c, KL_OP_MUL, peep[2], cs));
      }
      kl_value *ig = apply_act(c, &act[0], clipped(c, sp, gi));
      kl_value *fg = apply_act(c, &act[0], clipped(c, sp, gf));
      kl_value *cg = apply_act(c, &act[1], clipped(c, sp, gc));
      cn = binary(c, KL_OP_ADD, binary(c, KL_OP_MUL, fg, cs), binary(c, KL_OP_MUL, ig, cg));
      if (peep[1]) go = binary(c, KL_OP_ADD, go, binary(c, KL_OP_MUL, peep[1], cn));
      kl_value *og = apply_act(c, &act[0], clipped(c, sp, go));
      hn = binary(c, KL_OP_MUL, og, apply_act(c, &act[2], cn));
    }
    /* Steps past a batch item's length keep its state and output 0. */
    kl_value *mask = lens ? with_scalar(c, KL_OP_GT, lens, (double)step) : NULL;
    if (lens && !mask) return -1;
    kl_value *out = select(c, mask, hn, zeros);
    hs = select(c, mask, hn, hs);
    if (lstm) cs = select(c, mask, cn, cs);
    kl_shape s4 = {.rank = 4, .dims = {1, 1, nb, h}};
    y[step] = reshape(c, out, &s4);
    if (!y[step] || !hs || (lstm && !cs)) return -1;
  }
  *h_out = hs;
  if (c_out) *c_out = cs;
  return 0;
}

/* Activation names and parameters for both directions. */
static int read_activations(kl_onnx_ctx *c, const Onnx__NodeProto *n, rnn_spec *sp) {
  const cell_kind *k = sp->kind;
  const Onnx__AttributeProto *names = kl_onnx_attr(n, "activations");
  const Onnx__AttributeProto *al = kl_onnx_attr(n, "activation_alpha");
  const Onnx__AttributeProto *be = kl_onnx_attr(n, "activation_beta");
  size_t nn = names ? names->n_strings : 0, ia = 0, ib = 0;
  if (nn && nn != (size_t)(k->nacts * sp->dirs))
    return kl_onnx_fail(c, "activations lists %zu functions, expected %d", nn,
                        k->nacts * sp->dirs);
  for (int d = 0; d < sp->dirs; d++)
    for (int j = 0; j < k->nacts; j++) {
      activation *f = &sp->act[d][j];
      if (nn) {
        const ProtobufCBinaryData *s = &names->strings[d * k->nacts + j];
        char *copy = kl_arena_alloc(&c->g->arena, s->len + 1);
        if (s->len) memcpy(copy, s->data, s->len);
        f->name = copy;
      } else {
        f->name = k->acts[j];
      }
      size_t kind = 0, nk = sizeof act_kinds / sizeof *act_kinds;
      while (kind < nk && strcmp(act_kinds[kind].name, f->name)) kind++;
      if (kind == nk) return kl_onnx_unsupported(c, "activation \"%s\" is not supported", f->name);
      int np = act_kinds[kind].nparams;
      f->alpha = np >= 1 && al && ia < al->n_floats ? al->floats[ia++] : act_kinds[kind].alpha;
      f->beta = np >= 2 && be && ib < be->n_floats ? be->floats[ib++] : act_kinds[kind].beta;
    }
  return 0;
}

/* x's dims and hidden_size, checked against W and R. */
static int read_rnn(kl_onnx_ctx *c, const Onnx__NodeProto *n, rnn_spec *sp) {
  char b1[128], b2[128];
  kl_value *x = sp->x = need_input(c, n, 0);
  sp->w = need_input(c, n, 1);
  sp->r = need_input(c, n, 2);
  sp->b = kl_onnx_input(c, n, 3);
  sp->lens = kl_onnx_input(c, n, 4);
  sp->h0 = kl_onnx_input(c, n, 5);
  sp->c0 = sp->kind == &k_lstm ? kl_onnx_input(c, n, 6) : NULL;
  sp->p = sp->kind == &k_lstm ? kl_onnx_input(c, n, 7) : NULL;
  if (!x || !sp->w || !sp->r) return -1;
  const char *dir = kl_onnx_attr_string(c, n, "direction", "forward");
  sp->dirs = !strcmp(dir, "bidirectional") ? 2 : 1;
  sp->reverse_only = !strcmp(dir, "reverse");
  if (sp->dirs == 1 && !sp->reverse_only && strcmp(dir, "forward"))
    return kl_onnx_fail(c, "direction \"%s\" is not forward, reverse or bidirectional", dir);
  sp->layout1 = kl_onnx_attr_int(n, "layout", 0) != 0;
  sp->lbr = kl_onnx_attr_int(n, "linear_before_reset", 0) != 0;
  sp->clip = kl_onnx_attr(n, "clip") ? kl_onnx_attr_float(n, "clip", 0) : 0;
  if (kl_onnx_attr_int(n, "input_forget", 0))
    return kl_onnx_unsupported(c, "input_forget = 1 is not supported");
  if (!kl_dtype_is_float(x->dtype) || x->shape.rank != 3)
    return kl_onnx_fail(c, "X must be a 3-D float tensor, got %s%s", kl_dtype_name(x->dtype),
                        kl_shape_str(&x->shape, b1, sizeof b1));
  /* Backward runs would start at each item's own last step. */
  if (sp->lens && (sp->dirs == 2 || sp->reverse_only))
    return kl_onnx_unsupported(c, "sequence_lens with a reverse or bidirectional cell is not "
                                  "supported");
  if (sp->lens && !kl_dtype_is_int(sp->lens->dtype))
    return kl_onnx_fail(c, "sequence_lens must be an integer tensor");
  static const int64_t swap01[3] = {1, 0, 2};
  if (sp->layout1 && !(sp->x = x = transpose(c, x, swap01))) return -1;
  sp->seq = x->shape.dims[0], sp->batch = x->shape.dims[1], sp->in = x->shape.dims[2];
  /* Unrolling makes a dozen nodes a step: keep graphs of sane size. */
  if (sp->seq > MAX_UNROLLED_STEPS)
    return kl_onnx_unsupported(c, "a sequence of %lld steps (at most %d are unrolled)",
                               (long long)sp->seq, MAX_UNROLLED_STEPS);
  sp->hidden = kl_onnx_attr_int(n, "hidden_size", sp->r->shape.rank == 3 ? sp->r->shape.dims[2] : 0);
  int64_t gh = sp->kind->gates * sp->hidden;
  const kl_shape *ws = &sp->w->shape, *rs = &sp->r->shape;
  if (sp->hidden < 1 || ws->rank != 3 || ws->dims[0] != sp->dirs || ws->dims[1] != gh ||
      ws->dims[2] != sp->in || rs->rank != 3 || rs->dims[0] != sp->dirs || rs->dims[1] != gh ||
      rs->dims[2] != sp->hidden)
    return kl_onnx_fail(c, "W %s or R %s do not fit %d direction(s), %d gates, hidden size %lld "
                        "and input size %lld", kl_shape_str(ws, b1, sizeof b1),
                        kl_shape_str(rs, b2, sizeof b2), sp->dirs, sp->kind->gates,
                        (long long)sp->hidden, (long long)sp->in);
  static const int64_t to_dbh[3] = {1, 0, 2};
  if (sp->layout1 && sp->h0) sp->h0 = transpose(c, sp->h0, to_dbh);
  if (sp->layout1 && sp->c0) sp->c0 = transpose(c, sp->c0, to_dbh);
  if (sp->w->dtype != x->dtype || sp->r->dtype != x->dtype || (sp->b && sp->b->dtype != x->dtype))
    return kl_onnx_fail(c, "X, W, R and B must share a dtype");
  return read_activations(c, n, sp);
}

/* Outputs Y [seq, dirs, batch, H], Y_h [dirs, batch, H] (and Y_c), or
 * their layout-1 forms [batch, seq, dirs, H] and [batch, dirs, H]. */
static int convert_recurrent(kl_onnx_ctx *c, const Onnx__NodeProto *n, const cell_kind *k) {
  rnn_spec sp = {.kind = k};
  if (read_rnn(c, n, &sp)) return -1;
  if (sp.seq < 1) return kl_onnx_unsupported(c, "an empty sequence is not supported");
  kl_value **y[2], *hf[2], *cf[2];
  for (int d = 0; d < sp.dirs; d++) {
    y[d] = kl_arena_alloc(&c->g->arena, (size_t)sp.seq * sizeof *y[d]);
    bool backward = sp.reverse_only || d == 1;
    if (run_direction(c, &sp, d, backward, y[d], &hf[d], k == &k_lstm ? &cf[d] : NULL))
      return -1;
  }
  /* Y: each direction's steps along axis 0, then directions along axis 1. */
  kl_value *ydirs[2];
  for (int d = 0; d < sp.dirs; d++) ydirs[d] = concat(c, y[d], (int)sp.seq, 0);
  kl_value *yall = sp.dirs == 1 ? ydirs[0] : concat(c, ydirs, 2, 1);
  kl_value *states[2][2];
  for (int d = 0; d < sp.dirs; d++) {
    states[0][d] = reshape_to(c, hf[d], 3, 1, sp.batch, sp.hidden);
    if (k == &k_lstm) states[1][d] = reshape_to(c, cf[d], 3, 1, sp.batch, sp.hidden);
  }
  kl_value *yh = sp.dirs == 1 ? states[0][0] : concat(c, states[0], 2, 0);
  kl_value *yc = k != &k_lstm ? NULL : sp.dirs == 1 ? states[1][0] : concat(c, states[1], 2, 0);
  if (sp.layout1) {
    static const int64_t y_perm[4] = {2, 0, 1, 3}, s_perm[3] = {1, 0, 2};
    yall = transpose(c, yall, y_perm);
    yh = transpose(c, yh, s_perm);
    if (yc) yc = transpose(c, yc, s_perm);
  }
  if (bind(c, n, 0, yall) || bind(c, n, 1, yh)) return -1;
  return k == &k_lstm ? bind(c, n, 2, yc) : 0;
}

static int convert_rnn(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return convert_recurrent(c, n, &k_rnn);
}
static int convert_gru(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return convert_recurrent(c, n, &k_gru);
}
static int convert_lstm(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  return convert_recurrent(c, n, &k_lstm);
}

const kl_onnx_op kl_onnx_ops_rnn[] = {
    {"RNN", 7, convert_rnn},
    {"GRU", 7, convert_gru},
    {"LSTM", 7, convert_lstm},
    {NULL, 0, NULL},
};
