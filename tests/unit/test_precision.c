/* test_precision.c - the precision pass: interpreter(graph) against
 * interpreter(pass(graph)) within 1e-2 relative, the casts and types it
 * chooses, compile-time weight conversion, and what it must leave alone. */
#define _GNU_SOURCE /* open_memstream */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../../frontend/frontend.h"
#include "../../passes/passes.h"

static kl_graph *parse(const char *src) {
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  return g;
}

static kl_precision_options low(kl_dtype t) { return (kl_precision_options){.low = t}; }

static void run_pass(kl_graph *g, const kl_precision_options *opt) {
  kl_error err;
  if (kl_assign_precision(g, opt, &err)) fail_msg("precision pass: %s", err.msg);
}

/* Seeded inputs in [-1, 1) of each input's (current) type. */
static void make_inputs(const kl_graph *g, kl_tensor **in) {
  kl_rng r;
  kl_rng_seed(&r, 5);
  for (int i = 0; i < g->inputs.len; i++) {
    const kl_value *v = g->inputs.items[i];
    in[i] = kl_tensor_new(v->dtype, &v->shape);
    for (int64_t k = 0; k < in[i]->numel; k++)
      in[i]->data[k] = kl_dtype_round(v->dtype, kl_dtype_is_float(v->dtype)
                                                    ? 2 * kl_rng_uniform(&r) - 1
                                                    : (double)(kl_rng_next(&r) % 4));
  }
}

/* Every output of pass(src) within rtol of src's, no NaN, and of the
 * declared type and name. */
static void check_close(const char *src, const kl_precision_options *opt, double rtol) {
  kl_graph *ref = parse(src), *g = parse(src);
  run_pass(g, opt);
  kl_tensor *in[8], *in2[8], *want[8], *got[8];
  kl_error err;
  make_inputs(ref, in);
  make_inputs(g, in2);
  assert_int_equal(kl_interpret(ref, in, want, &err), 0);
  if (kl_interpret(g, in2, got, &err)) fail_msg("interpreting the rewritten graph: %s", err.msg);
  for (int i = 0; i < ref->outputs.len; i++) {
    assert_string_equal(g->outputs.items[i]->name, ref->outputs.items[i]->name);
    if (!opt->io_set) assert_int_equal(got[i]->dtype, want[i]->dtype);
    double scale = 0;
    for (int64_t k = 0; k < want[i]->numel; k++) scale = fmax(scale, fabs(want[i]->data[k]));
    for (int64_t k = 0; k < want[i]->numel; k++) {
      double d = fabs(got[i]->data[k] - want[i]->data[k]);
      if (isnan(got[i]->data[k]) || !(d <= rtol * (fabs(want[i]->data[k]) + scale)))
        fail_msg("output '%s' element %lld: %g, fp32 gives %g", ref->outputs.items[i]->name,
                 (long long)k, got[i]->data[k], want[i]->data[k]);
    }
    kl_tensor_free(want[i]);
    kl_tensor_free(got[i]);
  }
  for (int i = 0; i < ref->inputs.len; i++) {
    kl_tensor_free(in[i]);
    kl_tensor_free(in2[i]);
  }
  kl_graph_free(ref);
  kl_graph_free(g);
}

static const kl_node *node_of(const kl_graph *g, const char *value) {
  const kl_value *v = kl_graph_find_value(g, value);
  if (!v || !v->producer) fail_msg("no node gives '%s'", value);
  return v->producer;
}

static const char mlp[] =
    "input x: f32[4, 16]\n"
    "param w1: f32[16, 32] = randn(0.3, seed=1)\n"
    "param b1: f32[32] = uniform(-0.1, 0.1, seed=2)\n"
    "param w2: f32[32, 8] = randn(0.3, seed=3)\n"
    "let h = relu(x @ w1 + b1)\n"
    "let logits = h @ w2\n"
    "output p = softmax(logits, axis=-1)\n"
    "output s = reduce_sum(exp(logits), axes=[1])\n";

static void test_every_op_has_a_class(void **s) {
  (void)s;
  for (int op = 0; op < KL_OP_COUNT; op++)
    if (kl_precision_op_class((kl_op)op) == KL_PREC_UNLISTED)
      fail_msg("op %s has no precision class: give its row in ir/ops.def one",
               kl_ops[op].name);
}

static void test_close_to_fp32(void **s) {
  (void)s;
  kl_precision_options f16 = low(KL_F16), bf16 = low(KL_BF16);
  check_close(mlp, &f16, 1e-2);
  check_close(mlp, &bf16, 1e-2);
  const char *conv =
      "input x: f32[2, 3, 8, 8]\n"
      "param w: f32[4, 3, 3, 3] = randn(0.3, seed=1)\n"
      "param g: f32[4] = uniform(0.5, 1.5, seed=2)\n"
      "param b: f32[4] = zeros\nconst m: f32[4] = zeros\nconst v: f32[4] = ones\n"
      "let y = relu(batch_norm(conv2d(x, w, pads=[1, 1, 1, 1]), g, b, m, v))\n"
      "output z = flatten(global_avg_pool(max_pool2d(y, kernel=[2, 2])))\n";
  check_close(conv, &f16, 1e-2);
  check_close(conv, &bf16, 1e-2);
  kl_precision_options io = {.low = KL_F16, .io_set = true, .io = KL_F16};
  check_close(mlp, &io, 1e-2);
}

static void test_types_and_casts(void **s) {
  (void)s;
  kl_graph *g = parse(mlp);
  kl_precision_options opt = low(KL_F16);
  run_pass(g, &opt);
  /* matmuls and the elementwise ops between them run in f16 ... */
  assert_int_equal(kl_precision_node_dtype(node_of(g, "h")), KL_F16);
  assert_int_equal(kl_graph_find_value(g, "logits")->dtype, KL_F16);
  /* ... softmax, exp and the reduction in f32, outputs as declared */
  assert_int_equal(kl_precision_node_dtype(node_of(g, "p")), KL_F32);
  assert_int_equal(g->outputs.items[0]->dtype, KL_F32);
  assert_int_equal(g->outputs.items[1]->dtype, KL_F32);
  /* the input keeps its type: one cast, named for what it does */
  assert_int_equal(g->inputs.items[0]->dtype, KL_F32);
  assert_int_equal(node_of(g, "x_to_f16")->op, KL_OP_CAST);
  /* softmax and exp read one shared cast of logits */
  int casts = 0;
  for (int i = 0; i < g->nodes.len; i++) casts += g->nodes.items[i]->op == KL_OP_CAST;
  assert_int_equal(casts, 2);
  /* weights are converted at compile time */
  for (int i = 0; i < g->params.len; i++) assert_int_equal(g->params.items[i]->dtype, KL_F16);
  kl_graph_free(g);
}

static void test_io_precision(void **s) {
  (void)s;
  kl_graph *g = parse(mlp);
  kl_precision_options opt = {.low = KL_BF16, .io_set = true, .io = KL_BF16};
  run_pass(g, &opt);
  assert_int_equal(g->inputs.items[0]->dtype, KL_BF16);
  assert_int_equal(g->outputs.items[0]->dtype, KL_BF16);
  assert_string_equal(g->outputs.items[0]->name, "p");
  assert_int_equal(node_of(g, "p")->op, KL_OP_CAST);
  kl_graph_free(g);
  /* fp32 inside, f16 at the edges */
  g = parse(mlp);
  opt = (kl_precision_options){.low = KL_F32, .io_set = true, .io = KL_F16};
  run_pass(g, &opt);
  assert_int_equal(g->inputs.items[0]->dtype, KL_F16);
  assert_int_equal(kl_graph_find_value(g, "logits")->dtype, KL_F32);
  assert_int_equal(g->outputs.items[1]->dtype, KL_F16);
  kl_graph_free(g);
}

static void test_user_lists(void **s) {
  (void)s;
  const char *ops[] = {"relu"}, *nodes[] = {"logits"};
  kl_precision_options opt = {.low = KL_F16, .fp32_ops = ops, .nfp32_ops = 1,
                              .fp32_nodes = nodes, .nfp32_nodes = 1};
  kl_graph *g = parse(mlp);
  run_pass(g, &opt);
  assert_int_equal(kl_precision_node_class(node_of(g, "h"), &opt), KL_PREC_DENY);
  assert_int_equal(kl_graph_find_value(g, "h")->dtype, KL_F32);
  assert_int_equal(kl_graph_find_value(g, "logits")->dtype, KL_F32);
  /* w2 is read by an fp32 matmul only: it stays f32 */
  assert_int_equal(kl_graph_find_value(g, "w2")->dtype, KL_F32);
  kl_graph_free(g);
  check_close(mlp, &opt, 1e-2);

  kl_error err;
  const char *bad_op[] = {"softmaxx"}, *bad_node[] = {"nowhere"};
  g = parse(mlp);
  opt = (kl_precision_options){.low = KL_F16, .fp32_ops = bad_op, .nfp32_ops = 1};
  assert_int_equal(kl_assign_precision(g, &opt, &err), -1);
  assert_non_null(strstr(err.msg, "softmaxx"));
  opt = (kl_precision_options){.low = KL_F16, .fp32_nodes = bad_node, .nfp32_nodes = 1};
  assert_int_equal(kl_assign_precision(g, &opt, &err), -1);
  assert_non_null(strstr(err.msg, "nowhere"));
  kl_graph_free(g);
}

/* A weight read in both types keeps its f32 self and gains an f16 twin made
 * at compile time; a mask constant beyond fp16 keeps its where in fp32
 * rather than being saturated. */
static void test_weights_and_constants(void **s) {
  (void)s;
  const char *src =
      "input x: f32[4, 4]\n"
      "param w: f32[4, 4] = randn(1.0, seed=1)\n"
      "const keep: bool[4, 4] = values([1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1])\n"
      "let s = where(keep, x @ w, -1e9)\n"
      "output p = softmax(s, axis=-1)\n"
      "output n = reduce_sum(w * w)\n";
  kl_precision_options opt = low(KL_F16);
  check_close(src, &opt, 1e-2);
  kl_graph *g = parse(src);
  int nparams = g->params.len;
  run_pass(g, &opt);
  assert_int_equal(kl_graph_find_value(g, "w")->dtype, KL_F32);
  assert_int_equal(g->params.len, nparams + 1);
  const kl_value *twin = kl_graph_find_value(g, "w_f16");
  assert_non_null(twin);
  assert_int_equal(twin->dtype, KL_F16);
  const kl_node *where = node_of(g, "s");
  assert_int_equal(kl_precision_node_dtype(where), KL_F32);
  const kl_node *mask = where->inputs[2]->producer;
  assert_int_equal(mask->op, KL_OP_CONSTANT);
  assert_int_equal(mask->outputs[0]->dtype, KL_F32);
  assert_true(kl_node_attr(mask, "value")->floats[0] == -1e9);
  char why[256];
  assert_non_null(kl_precision_fp32_reason(g, where, &opt, why, sizeof why));
  assert_non_null(strstr(why, "holds -1e+09, beyond fp16's 65504"));
  kl_graph_free(g);
}

/* The node computing a graph output (not the cast to its declared type). */
static const kl_node *computing(const kl_graph *g, const char *value) {
  const kl_node *n = node_of(g, value);
  return n->op == KL_OP_CAST ? n->inputs[0]->producer : n;
}

/* The numbers a node works with keep it in fp32 when the low type cannot
 * hold them: beyond its range, a factor that flushes, an epsilon that
 * flushes; small additive values and bf16's wide range do not. */
static void test_numbers_keep_fp32(void **s) {
  (void)s;
  const char *src =
      "input x: f32[2, 4, 3, 3]\n"
      "param w: f32[4, 4, 1, 1] = randn(0.5, seed=1)\n"
      "const big: f32[4, 1, 1] = full(100000)\n"
      "const tiny: f32[4, 1, 1] = full(1e-9)\n"
      "const few: f32[4, 1, 1] = full(3e-7)\n"
      "const fine: f32[4, 1, 1] = uniform(0.5, 2, seed=2)\n"
      "param g: f32[4] = ones\nparam b: f32[4] = zeros\nconst m: f32[4] = zeros\n"
      "const v: f32[4] = ones\n"
      "let h = conv2d(x, w)\n"
      "output a = h * big\n"
      "output c = h * tiny\n"
      "output d = h * few\n"
      "output e = h + tiny\n"
      "output f = h * fine\n"
      "output k = h * reshape(big, shape=[1, 4, 1, 1])\n"
      "output n = batch_norm(h, g, b, m, v, epsilon=1e-12)\n";
  static const struct { const char *value, *f16_why; bool bf16_low; } want[] = {
      {"a", "constant 'big' holds 100000, beyond fp16's 65504", true},
      {"c", "constant 'tiny' holds at most 1e-09 in magnitude, which flushes to 0 in fp16", true},
      {"d", "constant 'few' holds at most 3e-07 in magnitude, which keeps under 8 significant "
            "bits in fp16's subnormals", true},
      {"e", NULL, true},
      {"f", NULL, true},
      {"k", "constant 'big' holds 100000, beyond fp16's 65504", true},
      {"n", "epsilon 1e-12 flushes to 0 in fp16", true},
  };
  for (int low16 = 0; low16 < 2; low16++) {
    kl_precision_options opt = low(low16 ? KL_F16 : KL_BF16);
    check_close(src, &opt, 2e-2);
    kl_graph *g = parse(src);
    run_pass(g, &opt);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      const kl_node *n = computing(g, want[i].value);
      char buf[256];
      const char *why = kl_precision_fp32_reason(g, n, &opt, buf, sizeof buf);
      const char *expect = low16 ? want[i].f16_why : NULL;
      if (!expect != !why || (why && strcmp(why, expect)))
        fail_msg("%s (%s): '%s', want '%s'", want[i].value, low16 ? "fp16" : "bf16",
                 why ? why : "(low)", expect ? expect : "(low)");
      assert_int_equal(kl_precision_node_dtype(n), expect ? KL_F32 : opt.low);
    }
    kl_graph_free(g);
  }
}

/* kl_fold_batch_norms: the batch norm leaves the graph, which computes
 * what it did; not when the convolution has another reader, nor in a
 * graph that trains.  A variance of 1.05e7 then runs in fp16. */
static int count_op(const kl_graph *g, kl_op op) {
  int k = 0;
  for (int i = 0; i < g->nodes.len; i++) k += g->nodes.items[i]->op == op;
  return k;
}

static void fold_bn(kl_graph *g) {
  kl_error err;
  if (kl_fold_batch_norms(g, NULL, &err)) fail_msg("bnfold: %s", err.msg);
}

static void check_outputs_close(kl_graph *ref, kl_graph *g, double rtol) {
  kl_tensor *in[4], *want[4], *got[4];
  kl_error err;
  make_inputs(ref, in);
  assert_int_equal(kl_interpret(ref, in, want, &err), 0);
  if (kl_interpret(g, in, got, &err)) fail_msg("interpreting the folded graph: %s", err.msg);
  for (int i = 0; i < ref->outputs.len; i++) {
    assert_string_equal(g->outputs.items[i]->name, ref->outputs.items[i]->name);
    double scale = 0;
    for (int64_t k = 0; k < want[i]->numel; k++) scale = fmax(scale, fabs(want[i]->data[k]));
    for (int64_t k = 0; k < want[i]->numel; k++)
      if (!(fabs(got[i]->data[k] - want[i]->data[k]) <= rtol * (fabs(want[i]->data[k]) + scale)))
        fail_msg("output %d element %lld: %g, want %g", i, (long long)k, got[i]->data[k],
                 want[i]->data[k]);
    kl_tensor_free(want[i]);
    kl_tensor_free(got[i]);
  }
  for (int i = 0; i < ref->inputs.len; i++) kl_tensor_free(in[i]);
}

static void test_bn_fold(void **s) {
  (void)s;
  const char *src =
      "input x: f32[2, 3, 6, 6]\n"
      "param w: f32[4, 3, 3, 3] = randn(300, seed=1)\n"
      "param cb: f32[4] = uniform(-50, 50, seed=5)\n"
      "param g: f32[4] = uniform(0.5, 1.5, seed=2)\n"
      "param b: f32[4] = uniform(-1, 1, seed=3)\n"
      "const m: f32[4] = uniform(-100, 100, seed=4)\n"
      "const v: f32[4] = full(1.05e7)\n"
      "output y = relu(batch_norm(conv2d(x, w, cb, pads=[1, 1, 1, 1]), g, b, m, v))\n";
  kl_graph *ref = parse(src), *g = parse(src);
  fold_bn(g);
  assert_int_equal(count_op(g, KL_OP_BATCH_NORM), 0);
  /* the old weights are gone, the new ones replace them */
  assert_null(kl_graph_find_value(g, "w"));
  assert_null(kl_graph_find_value(g, "v"));
  assert_non_null(kl_graph_find_value(g, "w_bn"));
  assert_int_equal(g->params.len, 2);
  check_outputs_close(ref, g, 1e-5);
  /* then fp16 runs the whole graph, close to fp32 */
  kl_precision_options opt = low(KL_F16);
  run_pass(g, &opt);
  assert_int_equal(kl_precision_node_dtype(computing(g, "y")), KL_F16);
  check_outputs_close(ref, g, 1e-2);
  kl_graph_free(g);
  kl_graph_free(ref);

  /* matmul with a 2-D weight, and gemm with trans_b */
  const char *mm =
      "input x: f32[5, 6]\n"
      "param w: f32[6, 4] = randn(1, seed=1)\nparam wt: f32[4, 6] = randn(1, seed=6)\n"
      "param c: f32[4] = uniform(-1, 1, seed=7)\n"
      "param g: f32[4] = uniform(0.5, 1.5, seed=2)\nparam b: f32[4] = uniform(-1, 1, seed=3)\n"
      "const m: f32[4] = uniform(-1, 1, seed=4)\nconst v: f32[4] = uniform(0.5, 2, seed=5)\n"
      "output y = batch_norm(x @ w, g, b, m, v)\n"
      "output z = batch_norm(gemm(x, wt, c, trans_b=1, alpha=0.5, beta=2), g, b, m, v)\n";
  ref = parse(mm), g = parse(mm);
  fold_bn(g);
  assert_int_equal(count_op(g, KL_OP_BATCH_NORM), 0);
  check_outputs_close(ref, g, 1e-5);
  kl_graph_free(g);
  kl_graph_free(ref);

  /* gemm's C: a scalar folds; a column [M, 1] (one value per row, not
   * per channel) does not */
  const char *gemm_c =
      "input x: f32[4, 6]\n"
      "param wt: f32[4, 6] = randn(1, seed=6)\n"
      "param s: f32[1] = full(0.75)\nparam col: f32[4, 1] = uniform(-1, 1, seed=7)\n"
      "param g: f32[4] = uniform(0.5, 1.5, seed=2)\nparam b: f32[4] = uniform(-1, 1, seed=3)\n"
      "const m: f32[4] = uniform(-1, 1, seed=4)\nconst v: f32[4] = uniform(0.5, 2, seed=5)\n"
      "output y = batch_norm(gemm(x, wt, s, trans_b=1, beta=3), g, b, m, v)\n"
      "output z = batch_norm(gemm(x, wt, col, trans_b=1), g, b, m, v)\n";
  ref = parse(gemm_c), g = parse(gemm_c);
  fold_bn(g);
  assert_int_equal(count_op(g, KL_OP_BATCH_NORM), 1);
  assert_int_equal(computing(g, "z")->op, KL_OP_BATCH_NORM);
  check_outputs_close(ref, g, 1e-5);
  kl_graph_free(g);
  kl_graph_free(ref);

  /* the convolution's output has another reader: nothing changes */
  const char *shared =
      "input x: f32[1, 3, 4, 4]\n"
      "param w: f32[4, 3, 1, 1] = randn(1, seed=1)\n"
      "param g: f32[4] = ones\nparam b: f32[4] = zeros\nconst m: f32[4] = zeros\n"
      "const v: f32[4] = full(1.05e7)\n"
      "let c = conv2d(x, w)\n"
      "output y = batch_norm(c, g, b, m, v)\n"
      "output r = relu(c)\n";
  g = parse(shared);
  int nodes = g->nodes.len;
  fold_bn(g);
  assert_int_equal(g->nodes.len, nodes);
  assert_int_equal(count_op(g, KL_OP_BATCH_NORM), 1);
  /* ... and precision keeps that batch norm in fp32 */
  run_pass(g, &opt);
  assert_int_equal(kl_precision_node_dtype(node_of(g, "y")), KL_F32);
  assert_int_equal(kl_precision_node_dtype(node_of(g, "c")), KL_F16);
  kl_graph_free(g);

  /* a graph that trains keeps its batch norms */
  const char *train =
      "input x: f32[2, 3, 4, 4]\ninput t: i64[2]\n"
      "param w: f32[4, 3, 1, 1] = randn(1, seed=1)\n"
      "param g: f32[4] = ones\nparam b: f32[4] = zeros\nconst m: f32[4] = zeros\n"
      "const v: f32[4] = ones\n"
      "let y = batch_norm(conv2d(x, w), g, b, m, v)\n"
      "output loss = cross_entropy(reduce_mean(y, axes=[2, 3]), t)\n"
      "train {\n  loss = loss\n  optimizer = sgd(lr=0.1)\n}\n";
  g = parse(train);
  fold_bn(g);
  assert_int_equal(count_op(g, KL_OP_BATCH_NORM), 1);
  kl_graph_free(g);
}

/* f64 and integer values are never touched; fp32 lowers nothing. */
static void test_leaves_alone(void **s) {
  (void)s;
  const char *src =
      "input x: f64[3, 4]\ninput i: i64[2]\n"
      "param w: f64[4, 4] = randn(0.5, seed=1)\n"
      "output y = gather(x @ w, i, axis=0)\n"
      "output j = i * 2\n";
  kl_precision_options opt = low(KL_F16);
  kl_graph *g = parse(src);
  int nnodes = g->nodes.len;
  run_pass(g, &opt);
  assert_int_equal(g->nodes.len, nnodes);
  for (int i = 0; i < g->values.len; i++)
    assert_true(g->values.items[i]->dtype == KL_F64 || g->values.items[i]->dtype == KL_I64);
  kl_graph_free(g);
  g = parse(mlp);
  nnodes = g->nodes.len;
  opt = low(KL_F32);
  run_pass(g, &opt);
  assert_int_equal(g->nodes.len, nnodes);
  kl_graph_free(g);
}

/* The rewritten graph prints as .kl that parses back to the same types. */
static void test_prints_back(void **s) {
  (void)s;
  kl_graph *g = parse(mlp);
  kl_precision_options opt = low(KL_BF16);
  run_pass(g, &opt);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  kl_print_graph(f, g);
  fclose(f);
  kl_error err;
  kl_graph *back = kl_parse_string(text, len, "printed.kl", NULL, &err);
  if (!back) fail_msg("%s\n%s", err.msg, text);
  assert_int_equal(kl_graph_find_value(back, "logits")->dtype, KL_BF16);
  assert_int_equal(kl_graph_find_value(back, "w1")->dtype, KL_BF16);
  kl_graph_free(back);
  kl_graph_free(g);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_op_has_a_class),
      cmocka_unit_test(test_close_to_fp32),
      cmocka_unit_test(test_types_and_casts),
      cmocka_unit_test(test_io_precision),
      cmocka_unit_test(test_user_lists),
      cmocka_unit_test(test_weights_and_constants),
      cmocka_unit_test(test_numbers_keep_fp32),
      cmocka_unit_test(test_bn_fold),
      cmocka_unit_test(test_leaves_alone),
      cmocka_unit_test(test_prints_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
