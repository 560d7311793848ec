/* cmd_check.c - `kiln check`: run the compiled model and the reference
 * interpreter on the same inputs, compare each output, and when one is
 * beyond tolerance find the first node whose value diverges.
 *
 * Two graphs: the reference R is the model as written (f32, no precision
 * rewrite), evaluated by the interpreter in float64; the compiled graph C
 * is the model after the precision options.  Values are matched by name
 * (the precision pass keeps them; its casts have no counterpart in R).
 *
 * The bisection compiles variants of C where chosen intermediate values are
 * graph outputs too: an output is materialized, so the compiled value can
 * be read and compared with the interpreter's.  Each round exposes up to
 * BATCH candidates spread over the schedule; a divergent one becomes the
 * new target, and an agreeing one clears its ancestors (an error flows
 * downstream).  When few candidates are left, one last compile exposes all
 * of them and their inputs, and the first that diverges while its inputs
 * agree is the culprit.  Rounds: about log(N) / log(BATCH). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static const char check_help[] =
    "usage: kiln check MODEL [options]\n"
    "Run MODEL (.kl or .onnx) compiled and in the reference interpreter (float64\n"
    "arithmetic, the model as written: fp32 even when --precision lowers the\n"
    "compiled one) on the same inputs; print each output's max abs and relative\n"
    "error and where.  When one is beyond tolerance, bisect to the first node\n"
    "whose value diverges (compiling variants that expose intermediate values)\n"
    "and name it, with its ONNX node.\n"
    "  --input NAME=FILE     feed input NAME from a .npy or .pb file (repeatable)\n"
    "  --inputs-dir DIR      read input_0.npy (or .pb), input_1... in input order\n"
    "  --seed N              seed for inputs that are not given (default 0)\n"
    "  --device=DEVICE       host, cuda, or auto (default: cuda when one works,\n"
    "                        else host; KILN_DEVICE=host|cuda|auto overrides auto)\n"
    "  --mem-limit=SIZE      fail when the planned arena exceeds SIZE bytes\n"
    "  --no-fuse             one kernel per node\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n"
    "Tolerance: an element agrees when |got - want| <= rtol * (|want| + rms),\n"
    "rms over the whole reference tensor (values that cancel to near zero are\n"
    "judged at the tensor's scale); `rel err` is |got - want| / (|want| + rms).\n"
    "rtol follows from the lowest precision the value is computed from (its\n"
    "own type and every value before it in the compiled graph): 1e-4 for fp32,\n"
    "1e-2 for fp16, 5e-2 for bf16, 1e-9 for f64 alone; times sqrt(K / 256) when\n"
    "K, the longest reduction before it (matmul or conv inner length, reduce,\n"
    "norm or softmax length), is above 256.  Integers and bools must match\n"
    "exactly; NaN matches NaN, and an infinity the same infinity.\n"
    "Exit status: 0 when every output is within tolerance, 1 when one is not\n"
    "(the first divergent node printed), 2 on a bad command line or model, or\n"
    "any other error.\n";

enum { OPT_INPUT = 2000, OPT_INPUTS_DIR, OPT_DEVICE, OPT_SEED, OPT_MEM_LIMIT, OPT_NO_FUSE };
enum { CHECK_OK = 0, CHECK_DIVERGES = 1, CHECK_ERROR = 2 };
/* Values a bisection round exposes, and the candidates few enough for the
 * last round to expose them all (with their inputs). */
enum { BATCH = 32, FINAL = 48, MAX_ROUNDS = 64 };

/* ---- tolerance ------------------------------------------------------- */

/* The longest reduction a node performs, estimated from shapes (an upper
 * estimate is harmless: it only widens the tolerance, by a square root). */
static double node_reduction(const kl_node *n) {
  if (!n->ninputs || !n->noutputs) return 1;
  const kl_shape *in = &n->inputs[0]->shape;
  double last = in->rank ? (double)in->dims[in->rank - 1] : 1;
  double in_n = (double)kl_shape_numel(in), out_n = (double)kl_shape_numel(&n->outputs[0]->shape);
  switch (kl_ops[n->op].kind) {
  case KL_KIND_REDUCTION: return out_n > 0 ? in_n / out_n : 1;
  case KL_KIND_NORMALIZATION: return last;
  case KL_KIND_CONTRACTION: {
    double k = last; /* matmul's inner dim; a weight's fan-in (conv) */
    if (n->ninputs > 1 && n->inputs[1]->shape.rank > 1) {
      const kl_shape *w = &n->inputs[1]->shape;
      double fan_in = (double)kl_shape_numel(w) / (double)(w->dims[0] ? w->dims[0] : 1);
      k = fan_in > k ? fan_in : k;
    }
    return k;
  }
  default: return 1;
  }
}

/* The unit roundoff-like step of a float type; 0 for integers and bools. */
static double dtype_step(kl_dtype t) {
  switch (t) {
  case KL_F64: return 0x1p-52;
  case KL_F32: return 0x1p-23;
  case KL_F16: return 0x1p-10;
  case KL_BF16: return 0x1p-7;
  default: return 0;
  }
}

/* Per value of the compiled graph: the coarsest float step and the longest
 * reduction among it and everything before it. */
typedef struct {
  double *step, *reduction;
} ancestry;

static void ancestry_init(ancestry *a, const kl_graph *g, kl_node *const *order) {
  a->step = calloc((size_t)g->values.len + 1, sizeof *a->step);
  a->reduction = calloc((size_t)g->values.len + 1, sizeof *a->reduction);
  if (!a->step || !a->reduction) abort();
  for (int i = 0; i < g->values.len; i++) {
    a->step[i] = dtype_step(g->values.items[i]->dtype);
    a->reduction[i] = 1;
  }
  for (int i = 0; i < g->nodes.len; i++) { /* schedule order: producers first */
    const kl_node *n = order[i];
    double step = 0, red = node_reduction(n);
    for (int k = 0; k < n->ninputs; k++) {
      int id = n->inputs[k]->id;
      step = a->step[id] > step ? a->step[id] : step;
      red = a->reduction[id] > red ? a->reduction[id] : red;
    }
    for (int k = 0; k < n->noutputs; k++) {
      int id = n->outputs[k]->id;
      a->step[id] = step > a->step[id] ? step : a->step[id];
      a->reduction[id] = red;
    }
  }
}

/* The relative tolerance of a value (the help text states it too): by the
 * coarsest float type it is computed from, its own or any before it,
 * fp32 1e-4, fp16 1e-2, bf16 5e-2, f64 alone 1e-9: some 800, 10 and 6
 * units of that type's last place, room for what a chain of rounded ops
 * gathers; times sqrt(K / 256) past a reduction of K > 256 terms, since the
 * rounding errors of a sum grow like the square root of its length.
 * Integers and bools: exact. */
static double tolerance(const ancestry *a, const kl_value *v) {
  if (!kl_dtype_is_float(v->dtype)) return 0;
  double step = a->step[v->id], base;
  if (step >= 0x1p-7) base = 5e-2;
  else if (step >= 0x1p-10) base = 1e-2;
  else if (step >= 0x1p-23) base = 1e-4;
  else base = 1e-9;
  double k = a->reduction[v->id];
  return k > 256 ? base * sqrt(k / 256) : base;
}

/* ---- comparing two tensors ------------------------------------------- */

typedef struct {
  double rtol;
  double max_abs, max_rel; /* rel: |got - want| / (|want| + rms) */
  int64_t at_abs, at_rel;  /* flat indices; -1 when every element is equal */
  double got_abs, want_abs;
  bool ok;
} diff;

static bool same_nonfinite(double a, double b) {
  return (isnan(a) && isnan(b)) || (isinf(a) && a == b);
}

static void compare(const kl_tensor *got, const kl_tensor *want, double rtol, diff *d) {
  *d = (diff){.rtol = rtol, .at_abs = -1, .at_rel = -1, .ok = true};
  double sq = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < want->numel; i++)
    if (isfinite(want->data[i])) sq += want->data[i] * want->data[i], finite++;
  double rms = finite ? sqrt(sq / (double)finite) : 0;
  for (int64_t i = 0; i < want->numel; i++) {
    double g = got->data[i], w = want->data[i];
    double abs_err, rel;
    if (g == w || same_nonfinite(g, w)) continue;
    if (!isfinite(g) || !isfinite(w)) abs_err = rel = INFINITY;
    else {
      abs_err = fabs(g - w);
      double scale = fabs(w) + rms;
      rel = scale > 0 ? abs_err / scale : INFINITY;
    }
    if (d->at_abs < 0 || abs_err > d->max_abs) {
      d->max_abs = abs_err, d->at_abs = i;
      d->got_abs = g, d->want_abs = w;
    }
    if (d->at_rel < 0 || rel > d->max_rel) d->max_rel = rel, d->at_rel = i;
    if (!(rel <= rtol)) d->ok = false;
  }
}

/* "[2, 0, 3]": flat index i of shape s. */
static const char *index_str(const kl_shape *s, int64_t i, char *buf, size_t n) {
  int64_t idx[KL_MAX_RANK];
  for (int d = s->rank - 1; d >= 0; d--) {
    idx[d] = s->dims[d] ? i % s->dims[d] : 0;
    i = s->dims[d] ? i / s->dims[d] : 0;
  }
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < s->rank && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)idx[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

static void print_diff(FILE *f, const diff *d, const kl_shape *s) {
  char at[160];
  if (d->at_abs < 0) {
    fprintf(f, "identical (tolerance %.0e)", d->rtol);
    return;
  }
  fprintf(f, "max abs err %.3g at %s (got %.7g, want %.7g), ", d->max_abs,
          index_str(s, d->at_abs, at, sizeof at), d->got_abs, d->want_abs);
  fprintf(f, "max rel err %.3g at %s (tolerance %.1e)", d->max_rel,
          index_str(s, d->at_rel, at, sizeof at), d->rtol);
}

/* ---- the two graphs, run with some values exposed ----------------------- */

typedef struct {
  kl_graph *ref, *cmp;    /* ref may be cmp (no precision options) */
  kl_tensor **ref_in, **cmp_in;
  krt_device_kind kind;
  kiln_compile_opts copt;
  char device[128];
  int compiles;
  kl_node **order;        /* cmp's schedule */
  int *pos;               /* node id -> place in order */
  kl_value **twin;        /* cmp value id -> ref value of that name, or NULL */
  ancestry anc;
} checker;

/* The reference value of a compiled value: same name, same shape. */
static kl_value *find_twin(const kl_graph *ref, const kl_value *v) {
  kl_value *r = kl_graph_find_value(ref, v->name);
  if (!r || !kl_shape_equal(&r->shape, &v->shape)) return NULL;
  return r;
}

/* A node can be compared when each of its outputs has a twin.  A constant
 * node holds its value in both graphs: not a suspect. */
static bool comparable(const checker *c, const kl_node *n) {
  if (n->op == KL_OP_CONSTANT) return false;
  for (int k = 0; k < n->noutputs; k++)
    if (!c->twin[n->outputs[k]->id] || !c->twin[n->outputs[k]->id]->producer) return false;
  return n->noutputs > 0;
}

/* The index of v among g's outputs, marking it an output first if need
 * be; the caller truncates g->outputs afterwards. */
static int expose(kl_graph *g, kl_value *v) {
  for (int i = 0; i < g->outputs.len; i++)
    if (g->outputs.items[i] == v) return i;
  kl_error err;
  if (kl_graph_mark_output(g, v, &err)) abort(); /* cannot fail: not an output */
  return g->outputs.len - 1;
}

static void unexpose(kl_graph *g, int nout) {
  for (int i = nout; i < g->outputs.len; i++) g->outputs.items[i]->is_output = false;
  g->outputs.len = nout;
}

static void free_tensors(kl_tensor **t, int n) {
  for (int i = 0; t && i < n; i++) kl_tensor_free(t[i]);
  free(t);
}

/* Run both graphs with values vals[0..n) of cmp exposed; got[k] and
 * want[k] receive their compiled and reference tensors (k < n), and the
 * first `nout` entries of *all_got / *all_want the graph outputs' (freed
 * by the caller with free_tensors and the returned count).  -1 after
 * printing the error. */
static int run_exposed(checker *c, kl_value *const *vals, int n, kl_tensor **got,
                       kl_tensor **want) {
  int nout_c = c->cmp->outputs.len, nout_r = c->ref->outputs.len;
  int *ic = malloc(((size_t)n + 1) * sizeof *ic), *ir = malloc(((size_t)n + 1) * sizeof *ir);
  if (!ic || !ir) abort();
  for (int k = 0; k < n; k++) ic[k] = expose(c->cmp, vals[k]);
  for (int k = 0; k < n; k++) ir[k] = expose(c->ref, c->twin[vals[k]->id]);
  int nc = c->cmp->outputs.len, nr = c->ref->outputs.len;
  kl_tensor **oc = calloc((size_t)nc + 1, sizeof *oc), **orf = calloc((size_t)nr + 1, sizeof *orf);
  if (!oc || !orf) abort();
  kl_error err;
  int rc = kiln_run_compiled(c->cmp, c->kind, &c->copt, c->cmp_in, oc, c->device,
                             sizeof c->device);
  c->compiles++;
  if (!rc && (rc = kl_interpret(c->ref, c->ref_in, orf, &err))) kl_error_print(stderr, &err);
  for (int k = 0; k < n && !rc; k++) {
    got[k] = oc[ic[k]], want[k] = orf[ir[k]];
    oc[ic[k]] = orf[ir[k]] = NULL; /* now got's and want's */
  }
  unexpose(c->cmp, nout_c);
  unexpose(c->ref, nout_r);
  free_tensors(oc, nc);
  free_tensors(orf, nr);
  free(ic);
  free(ir);
  return rc;
}

/* ---- naming a node --------------------------------------------------- */

static void describe_node(FILE *f, const kl_node *n) {
  fprintf(f, "'%s' (", n->name);
  if (n->onnx_name) fprintf(f, "ONNX %s '%s'", n->onnx_op, n->onnx_name);
  else if (n->loc.file && n->loc.line)
    fprintf(f, "%s at %s:%d:%d", kl_ops[n->op].name, n->loc.file, n->loc.line, n->loc.col);
  else fprintf(f, "%s", kl_ops[n->op].name);
  fprintf(f, ")");
}

/* ---- bisection --------------------------------------------------------- */

/* mark[] |= the nodes `v` depends on (through any node), itself included
 * when v has a producer. */
static void mark_ancestors(const checker *c, const kl_value *v, bool *mark) {
  int nn = c->cmp->nodes.len, top = 0;
  const kl_node **stack = malloc(((size_t)nn + 1) * sizeof *stack);
  if (!stack) abort();
  if (v->producer && !mark[v->producer->id]) mark[v->producer->id] = true, stack[top++] = v->producer;
  while (top) {
    const kl_node *n = stack[--top];
    for (int k = 0; k < n->ninputs; k++) {
      const kl_node *p = n->inputs[k]->producer;
      if (p && !mark[p->id]) mark[p->id] = true, stack[top++] = p;
    }
  }
  free(stack);
}

/* The candidates, in schedule order, into list; their count. */
static int candidate_list(const checker *c, const bool *cand, kl_node **list) {
  int m = 0;
  for (int i = 0; i < c->cmp->nodes.len; i++)
    if (cand[c->order[i]->id]) list[m++] = c->order[i];
  return m;
}

/* Every output of the nodes, deduplicated, into vals; their count. */
static int node_values(kl_node *const *nodes, int n, kl_value **vals, bool *seen) {
  int k = 0;
  for (int i = 0; i < n; i++)
    for (int o = 0; o < nodes[i]->noutputs; o++) {
      kl_value *v = nodes[i]->outputs[o];
      if (!seen[v->id]) seen[v->id] = true, vals[k++] = v;
    }
  for (int i = 0; i < k; i++) seen[vals[i]->id] = false;
  return k;
}

typedef struct {
  kl_value **vals;
  kl_tensor **got, **want;
  diff *d;
  int n;
} round_result;

static void round_free(round_result *r) {
  for (int k = 0; k < r->n; k++) kl_tensor_free(r->got[k]), kl_tensor_free(r->want[k]);
  free(r->vals), free(r->got), free(r->want), free(r->d);
}

/* Expose the outputs of nodes[0..n), run and compare them. */
static int run_round(checker *c, kl_node *const *nodes, int n, round_result *r) {
  int cap = 0;
  for (int i = 0; i < n; i++) cap += nodes[i]->noutputs;
  bool *seen = calloc((size_t)c->cmp->values.len + 1, sizeof *seen);
  r->vals = calloc((size_t)cap + 1, sizeof *r->vals);
  r->got = calloc((size_t)cap + 1, sizeof *r->got);
  r->want = calloc((size_t)cap + 1, sizeof *r->want);
  r->d = calloc((size_t)cap + 1, sizeof *r->d);
  if (!seen || !r->vals || !r->got || !r->want || !r->d) abort();
  r->n = node_values(nodes, n, r->vals, seen);
  free(seen);
  if (run_exposed(c, r->vals, r->n, r->got, r->want)) {
    r->n = 0;
    return -1;
  }
  for (int k = 0; k < r->n; k++)
    compare(r->got[k], r->want[k], tolerance(&c->anc, r->vals[k]), &r->d[k]);
  return 0;
}

/* The result for value v in r, or NULL. */
static const diff *result_of(const round_result *r, const kl_value *v) {
  for (int k = 0; k < r->n; k++)
    if (r->vals[k] == v) return &r->d[k];
  return NULL;
}

static bool node_agrees(const round_result *r, const kl_node *n) {
  for (int k = 0; k < n->noutputs; k++) {
    const diff *d = result_of(r, n->outputs[k]);
    if (d && !d->ok) return false;
  }
  return true;
}

/* The culprit's report: its worst output, then what its inputs did. */
static void report_culprit(const round_result *r, const kl_node *n) {
  const kl_value *worst = NULL;
  const diff *wd = NULL;
  for (int k = 0; k < n->noutputs; k++) {
    const diff *d = result_of(r, n->outputs[k]);
    if (d && !d->ok && (!wd || d->max_rel > wd->max_rel)) wd = d, worst = n->outputs[k];
  }
  printf("first divergent node: ");
  describe_node(stdout, n);
  printf(", output '%s': ", kl_value_label(worst));
  print_diff(stdout, wd, &worst->shape);
  /* inputs, weights and constants are the same numbers in both graphs; a
   * value the precision pass added (a cast) has nothing to compare with */
  bool agree = true;
  for (int k = 0; k < n->ninputs; k++) {
    const kl_value *in = n->inputs[k];
    const diff *d = result_of(r, in);
    if (d ? !d->ok : in->producer && in->producer->op != KL_OP_CONSTANT) agree = false;
  }
  printf("\n  %s\n", agree ? "its inputs agree:" : "its inputs:");
  for (int k = 0; k < n->ninputs; k++) {
    const kl_value *in = n->inputs[k];
    const diff *d = result_of(r, in);
    printf("    '%s': ", kl_value_label(in));
    if (!in->producer) printf("%s\n", in->kind == KL_VAL_INPUT ? "graph input" : "weight");
    else if (d) {
      print_diff(stdout, d, &in->shape);
      printf("%s\n", d->ok ? "" : "  BEYOND tolerance");
    } else if (in->producer->op == KL_OP_CONSTANT) printf("constant\n");
    else printf("not compared: the reference has no such value (the precision pass added it)\n");
  }
}

/* The input of n, exposed in r, that diverges and runs first; NULL when
 * its inputs agree. */
static kl_value *divergent_input(const checker *c, const round_result *r, const kl_node *n) {
  kl_value *first = NULL;
  for (int k = 0; k < n->ninputs; k++) {
    kl_value *in = n->inputs[k];
    const diff *d = result_of(r, in);
    if (d && !d->ok && in->producer &&
        (!first || c->pos[in->producer->id] < c->pos[first->producer->id]))
      first = in;
  }
  return first;
}

/* Find the first divergent node before `target` (a divergent value).
 * CHECK_DIVERGES after printing it, CHECK_ERROR on a failed compile. */
static int bisect(checker *c, kl_value *target) {
  int nn = c->cmp->nodes.len;
  bool *cand = calloc((size_t)nn + 1, sizeof *cand), *mark = calloc((size_t)nn + 1, sizeof *mark);
  kl_node **list = calloc((size_t)nn + 1, sizeof *list), **pick = calloc((size_t)nn + 1, sizeof *pick);
  bool *in_pick = calloc((size_t)nn + 1, sizeof *in_pick);
  if (!cand || !mark || !list || !pick || !in_pick) abort();
  mark_ancestors(c, target, cand);
  for (int i = 0; i < nn; i++)
    if (cand[i] && !comparable(c, c->cmp->nodes.items[i])) cand[i] = false;
  int rc = CHECK_ERROR, round;
  for (round = 1; round <= MAX_ROUNDS; round++) {
    int m = candidate_list(c, cand, list);
    if (!m) {
      printf("no node before '%s' can be compared with the reference (the precision "
             "pass made them)\n", target->name);
      rc = CHECK_DIVERGES;
      break;
    }
    bool final = m <= FINAL;
    int np = 0;
    if (final) { /* all of them, and the nodes that feed them */
      for (int i = 0; i < m; i++) in_pick[list[i]->id] = true;
      for (int i = 0; i < m; i++)
        for (int k = 0; k < list[i]->ninputs; k++) {
          kl_node *p = list[i]->inputs[k]->producer;
          if (p && !in_pick[p->id] && comparable(c, p)) in_pick[p->id] = true;
        }
      for (int i = 0; i < nn; i++)
        if (in_pick[c->order[i]->id]) pick[np++] = c->order[i];
      memset(in_pick, 0, (size_t)nn * sizeof *in_pick);
    } else { /* BATCH spread evenly, the target's producer (last) left out */
      for (int j = 0; j < BATCH; j++) {
        kl_node *n = list[(int64_t)(j + 1) * (m - 1) / (BATCH + 1)];
        if (!np || pick[np - 1] != n) pick[np++] = n;
      }
    }
    printf("bisect round %d: %d candidate nodes before '%s', compiling with %d exposed\n",
           round, m, target->name, np);
    fflush(stdout);
    round_result r = {0};
    if (run_round(c, pick, np, &r)) {
      fprintf(stderr, "kiln check: error: the variant with %d values exposed failed\n", np);
      break;
    }
    if (final) {
      const kl_node *culprit = NULL;
      for (int i = 0; i < m && !culprit; i++)
        if (!node_agrees(&r, list[i])) culprit = list[i];
      kl_value *bad_in = culprit ? divergent_input(c, &r, culprit) : NULL;
      if (bad_in) {
        /* Exposing other values changed how an input was computed (a GEMM
         * epilogue, an attention kernel, a fusion group): an earlier round
         * cleared it.  Search again before that input, clearing nothing. */
        target = bad_in;
        memset(cand, 0, (size_t)nn * sizeof *cand);
        mark_ancestors(c, target, cand);
        for (int i = 0; i < nn; i++)
          if (cand[i] && !comparable(c, c->cmp->nodes.items[i])) cand[i] = false;
        round_free(&r);
        continue;
      }
      if (culprit) report_culprit(&r, culprit);
      else
        printf("no single node diverges when the %d values before '%s' are materialized: the "
               "error comes from how they are fused (compare with --no-fuse)\n", m, target->name);
      round_free(&r);
      rc = CHECK_DIVERGES;
      break;
    }
    /* an agreeing value clears what it depends on; the first divergent
     * one becomes the target */
    const kl_node *first = NULL;
    memset(mark, 0, (size_t)nn * sizeof *mark);
    for (int i = 0; i < np; i++) {
      if (node_agrees(&r, pick[i])) {
        for (int k = 0; k < pick[i]->noutputs; k++) mark_ancestors(c, pick[i]->outputs[k], mark);
      } else if (!first) first = pick[i];
    }
    if (first) {
      int worst = 0;
      for (int k = 0; k < first->noutputs; k++) {
        const diff *d = result_of(&r, first->outputs[k]);
        if (d && !d->ok) { worst = k; break; }
      }
      target = first->outputs[worst];
      bool *keep = calloc((size_t)nn + 1, sizeof *keep);
      if (!keep) abort();
      mark_ancestors(c, target, keep);
      for (int i = 0; i < nn; i++) cand[i] = cand[i] && keep[i];
      free(keep);
    }
    for (int i = 0; i < nn; i++) cand[i] = cand[i] && !mark[i];
    if (first) cand[first->id] = true; /* its own value: known divergent */
    round_free(&r);
  }
  if (round > MAX_ROUNDS) {
    printf("bisection stopped after %d rounds; the last divergent value: '%s'\n", MAX_ROUNDS,
           target->name);
    rc = CHECK_DIVERGES;
  }
  free(cand), free(mark), free(list), free(pick), free(in_pick);
  return rc;
}

/* ---- the command ------------------------------------------------------- */

/* The compiled graph's inputs: the reference's values, in its types (an
 * --io-precision input is rounded, and the reference takes the rounded
 * values too, so both see the same numbers). */
static int match_inputs(checker *c) {
  if (c->ref->inputs.len != c->cmp->inputs.len || c->ref->outputs.len != c->cmp->outputs.len) {
    fprintf(stderr, "kiln check: error: the precision options changed the model's inputs or "
                    "outputs\n");
    return -1;
  }
  c->cmp_in = calloc((size_t)c->cmp->inputs.len + 1, sizeof *c->cmp_in);
  if (!c->cmp_in) abort();
  for (int i = 0; i < c->cmp->inputs.len; i++) {
    kl_tensor *t = c->ref_in[i];
    kl_dtype to = c->cmp->inputs.items[i]->dtype;
    for (int64_t j = 0; j < t->numel; j++) t->data[j] = kl_dtype_round(to, t->data[j]);
    c->cmp_in[i] = kl_tensor_new(to, &t->shape);
    memcpy(c->cmp_in[i]->data, t->data, (size_t)t->numel * sizeof *t->data);
  }
  return 0;
}

static int setup(checker *c) {
  int nn = c->cmp->nodes.len, nv = c->cmp->values.len;
  c->order = calloc((size_t)nn + 1, sizeof *c->order);
  c->pos = calloc((size_t)nn + 1, sizeof *c->pos);
  c->twin = calloc((size_t)nv + 1, sizeof *c->twin);
  if (!c->order || !c->pos || !c->twin) abort();
  kl_error err;
  if (kl_schedule(c->cmp, c->order, &err)) {
    kl_error_print(stderr, &err);
    return -1;
  }
  for (int i = 0; i < nn; i++) c->pos[c->order[i]->id] = i;
  for (int i = 0; i < nv; i++) c->twin[i] = find_twin(c->ref, c->cmp->values.items[i]);
  ancestry_init(&c->anc, c->cmp, c->order);
  return match_inputs(c);
}

/* Round 0: the model as compiled.  Prints each output; *first gets the
 * divergent output whose producer runs first (NULL: all agree). */
static int check_outputs(checker *c, kl_value **first, const char *model, const char *prec) {
  kl_graph *g = c->cmp;
  int n = g->outputs.len;
  kl_tensor **got = calloc((size_t)n + 1, sizeof *got), **want = calloc((size_t)n + 1, sizeof *want);
  if (!got || !want) abort();
  kl_error err;
  int rc = kiln_run_compiled(g, c->kind, &c->copt, c->cmp_in, got, c->device, sizeof c->device);
  c->compiles++;
  if (!rc && (rc = kl_interpret(c->ref, c->ref_in, want, &err))) kl_error_print(stderr, &err);
  *first = NULL;
  if (!rc) {
    printf("kiln check: %s on %s, %s, %s, against the interpreter (float64)\n", model, c->device,
           prec, c->copt.no_fuse ? "unfused" : "fused");
    for (int i = 0; i < n; i++) {
      kl_value *v = g->outputs.items[i];
      diff d;
      compare(got[i], want[i], tolerance(&c->anc, v), &d);
      char shape[160];
      printf("output %d '%s' %s%s: %s\n  ", i, kl_value_label(v), kl_dtype_name(v->dtype),
             kl_shape_str(&v->shape, shape, sizeof shape), d.ok ? "ok" : "BEYOND tolerance");
      print_diff(stdout, &d, &v->shape);
      printf("\n");
      if (!d.ok && v->producer && (!*first || c->pos[v->producer->id] < c->pos[(*first)->producer->id]))
        *first = v;
      if (!d.ok && !v->producer && !*first) rc = 1; /* an input or weight passed through */
    }
  }
  free_tensors(got, n);
  free_tensors(want, n);
  return rc < 0 ? -1 : rc;
}

static int parse_seed(const char *arg, uint64_t *seed) {
  char *end;
  errno = 0;
  *seed = strtoull(arg, &end, 10);
  if (*end || end == arg || errno || arg[0] == '-') {
    fprintf(stderr, "kiln check: --seed takes a non-negative integer\n");
    return -1;
  }
  return 0;
}

int kiln_cmd_check(int argc, char **argv) {
  static const struct option longopts[] = {
      {"input", required_argument, NULL, OPT_INPUT},
      {"inputs-dir", required_argument, NULL, OPT_INPUTS_DIR},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"seed", required_argument, NULL, OPT_SEED},
      {"mem-limit", required_argument, NULL, OPT_MEM_LIMIT},
      {"no-fuse", no_argument, NULL, OPT_NO_FUSE},
      {"help", no_argument, NULL, 'h'},
      KILN_MODEL_LONGOPTS,
      {0}};
  kiln_model_opts mo = {0};
  kiln_named_file files[256];
  kiln_input_opts io = {.files = files};
  checker c = {.kind = KRT_DEVICE_AUTO};
  int opt;
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
    case 'h': fputs(check_help, stdout); return CHECK_OK;
    case OPT_INPUT:
      if (kiln_input_file_opt("check", optarg, files, &io.nfiles, 256)) return CHECK_ERROR;
      break;
    case OPT_INPUTS_DIR: io.dir = optarg; break;
    case OPT_SEED:
      if (parse_seed(optarg, &io.seed)) return CHECK_ERROR;
      break;
    case OPT_DEVICE:
      if (strcmp(optarg, "interp") == 0 || krt_device_kind_parse(optarg, &c.kind)) {
        fprintf(stderr, "kiln check: --device=%s: choose host, cuda or auto\n", optarg);
        return CHECK_ERROR;
      }
      break;
    case OPT_NO_FUSE: c.copt.no_fuse = true; break;
    case OPT_MEM_LIMIT:
      if (kiln_parse_mem_limit("check", optarg, &c.copt.mem_limit)) return CHECK_ERROR;
      break;
    default:
      if (kiln_model_opt_or_usage(&mo, opt, optarg, check_help)) return CHECK_ERROR;
      break;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln check: expected one MODEL file\n%s", check_help);
    return CHECK_ERROR;
  }
  const char *model = argv[optind];
  kiln_model_opts ref_opts = mo;
  ref_opts.precision = false; /* the reference: the model as written */
  int rc = CHECK_ERROR;
  c.ref = kiln_load_for_run(model, &ref_opts, &io, &c.ref_in);
  if (!c.ref) return CHECK_ERROR;
  c.cmp = mo.precision ? kiln_load_for_run(model, &mo, &io, NULL) : c.ref;
  if (!c.cmp || setup(&c)) goto done;
  char prec[32];
  snprintf(prec, sizeof prec, "%s", !mo.precision ? "fp32"
                                    : mo.prec.low == KL_F16 ? "fp16"
                                    : mo.prec.low == KL_BF16 ? "bf16" : "fp32");
  kl_value *first;
  int out = check_outputs(&c, &first, model, prec);
  if (out < 0) goto done;
  if (!first) {
    rc = out ? CHECK_DIVERGES : CHECK_OK;
    printf("%s\n", rc == CHECK_OK ? "all outputs within tolerance" : "outputs differ");
    goto done;
  }
  printf("bisecting from output '%s'\n", kl_value_label(first));
  rc = bisect(&c, first);
  if (rc != CHECK_ERROR) printf("compiles: %d\n", c.compiles);
done:
  if (c.cmp_in) free_tensors(c.cmp_in, c.cmp->inputs.len);
  if (c.ref_in) free_tensors(c.ref_in, c.ref->inputs.len);
  free(c.order), free(c.pos), free(c.twin);
  free(c.anc.step), free(c.anc.reduction);
  if (c.cmp && c.cmp != c.ref) kl_graph_free(c.cmp);
  kl_graph_free(c.ref);
  return rc;
}
