/* test_ir.c - unit tests of the IR: shapes and broadcasting, node building,
 * attributes, the verifier, topological order and dtype rounding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "../../ir/ir.h"

static kl_shape S(int rank, ...) {
  kl_shape s = {.rank = rank};
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) s.dims[i] = va_arg(ap, int);
  va_end(ap);
  return s;
}

static const kl_loc noloc = {0};

typedef struct {
  kl_shape a, b;
  bool ok;
  kl_shape want;
} bcast_case;

static void test_broadcast_rules(void **state) {
  (void)state;
  bcast_case cases[] = {
      {S(2, 2, 3), S(1, 3), true, S(2, 2, 3)},
      {S(2, 2, 3), S(2, 2, 3), true, S(2, 2, 3)},
      {S(3, 4, 1, 3), S(2, 2, 1), true, S(3, 4, 2, 3)},
      {S(4, 8, 1, 6, 1), S(3, 7, 1, 5), true, S(4, 8, 7, 6, 5)},
      {S(0), S(1, 5), true, S(1, 5)},           /* scalar */
      {S(1, 5), S(0), true, S(1, 5)},
      {S(0), S(0), true, S(0)},
      {S(1, 0), S(1, 1), true, S(1, 0)},        /* empty stays empty */
      {S(2, 2, 1), S(2, 1, 3), true, S(2, 2, 3)},
      {S(1, 1), S(3, 2, 1, 4), true, S(3, 2, 1, 4)},
      {S(2, 2, 3), S(1, 4), false, S(0)},
      {S(1, 0), S(1, 3), false, S(0)},          /* 0 vs 3 is not 1 */
      {S(2, 3, 4), S(2, 2, 4), false, S(0)},
      {S(3, 2, 3, 4), S(2, 2, 4), false, S(0)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kl_shape out;
    kl_error err = {0};
    int rc = kl_broadcast_shapes(&cases[i].a, &cases[i].b, &out, &err, noloc);
    if (cases[i].ok) {
      assert_int_equal(rc, 0);
      assert_true(kl_shape_equal(&out, &cases[i].want));
    } else {
      assert_int_equal(rc, -1);
      assert_non_null(strstr(err.msg, "cannot broadcast"));
    }
  }
}

static kl_value *input(kl_graph *g, const char *name, kl_dtype t, kl_shape s) {
  return kl_graph_add_input(g, name, t, &s, noloc);
}

static void test_add_node_infers_shapes(void **state) {
  (void)state;
  kl_graph *g = kl_graph_new("t");
  kl_value *a = input(g, "a", KL_F32, S(3, 4, 1, 3));
  kl_value *b = input(g, "b", KL_F32, S(2, 2, 1));
  kl_error err;
  kl_node *n = kl_graph_add_node(g, KL_OP_ADD, NULL, (kl_value *[]){a, b}, 2, NULL,
                                 0, NULL, 0, noloc, &err);
  assert_non_null(n);
  kl_shape want = S(3, 4, 2, 3);
  assert_true(kl_shape_equal(&n->outputs[0]->shape, &want));
  assert_int_equal(n->outputs[0]->dtype, KL_F32);
  /* comparisons give bool */
  n = kl_graph_add_node(g, KL_OP_LT, NULL, (kl_value *[]){a, b}, 2, NULL, 0, NULL,
                        0, noloc, &err);
  assert_non_null(n);
  assert_int_equal(n->outputs[0]->dtype, KL_BOOL);
  /* matmul with batch broadcast */
  kl_value *x = input(g, "x", KL_F32, S(3, 5, 2, 3));
  kl_value *w = input(g, "w", KL_F32, S(2, 3, 7));
  n = kl_graph_add_node(g, KL_OP_MATMUL, NULL, (kl_value *[]){x, w}, 2, NULL, 0,
                        NULL, 0, noloc, &err);
  assert_non_null(n);
  want = S(3, 5, 2, 7);
  assert_true(kl_shape_equal(&n->outputs[0]->shape, &want));
  kl_graph_free(g);
}

static void test_add_node_rejects(void **state) {
  (void)state;
  kl_graph *g = kl_graph_new("t");
  kl_value *a = input(g, "a", KL_F32, S(2, 2, 3));
  kl_value *b = input(g, "b", KL_F32, S(1, 4));
  kl_value *i = input(g, "i", KL_I32, S(1, 3));
  kl_error err;
  int nvalues = g->values.len;
  assert_null(kl_graph_add_node(g, KL_OP_ADD, NULL, (kl_value *[]){a, b}, 2, NULL, 0,
                                NULL, 0, noloc, &err));
  assert_non_null(strstr(err.msg, "broadcast"));
  assert_int_equal(g->values.len, nvalues); /* failed outputs are dropped */
  assert_int_equal(g->nodes.len, 0);
  assert_null(kl_graph_add_node(g, KL_OP_ADD, NULL, (kl_value *[]){a, i}, 2, NULL, 0,
                                NULL, 0, noloc, &err));
  assert_null(kl_graph_add_node(g, KL_OP_RELU, NULL, (kl_value *[]){a, a}, 2, NULL, 0,
                                NULL, 0, noloc, &err));
  assert_non_null(strstr(err.msg, "relu takes 1 input, got 2"));
  assert_null(kl_graph_add_node(g, KL_OP_EXP, NULL, (kl_value *[]){i}, 1, NULL, 0,
                                NULL, 0, noloc, &err));
  kl_attr bad = {.name = "axs", .kind = KL_ATTR_INT, .i = 1};
  assert_null(kl_graph_add_node(g, KL_OP_SOFTMAX, NULL, (kl_value *[]){a}, 1, &bad, 1,
                                NULL, 0, noloc, &err));
  assert_non_null(strstr(err.msg, "unknown attribute 'axs'"));
  kl_attr str = {.name = "axis", .kind = KL_ATTR_STRING, .s = "one"};
  assert_null(kl_graph_add_node(g, KL_OP_SOFTMAX, NULL, (kl_value *[]){a}, 1, &str, 1,
                                NULL, 0, noloc, &err));
  assert_non_null(strstr(err.msg, "must be int"));
  kl_graph_free(g);
}

static void test_attr_conversions(void **state) {
  (void)state;
  kl_graph *g = kl_graph_new("t");
  kl_value *a = input(g, "a", KL_F32, S(2, 2, 3));
  kl_error err;
  /* an int written where a float goes, a number where a list goes */
  kl_attr eps = {.name = "epsilon", .kind = KL_ATTR_INT, .i = 1};
  kl_node *n = kl_graph_add_node(g, KL_OP_LAYER_NORM, NULL, (kl_value *[]){a}, 1, &eps,
                                 1, NULL, 0, noloc, &err);
  assert_non_null(n);
  assert_true(kl_attr_float(n, "epsilon", 0) == 1.0);
  kl_attr axes = {.name = "axes", .kind = KL_ATTR_INT, .i = -1};
  n = kl_graph_add_node(g, KL_OP_REDUCE_SUM, NULL, (kl_value *[]){a}, 1, &axes, 1, NULL,
                        0, noloc, &err);
  assert_non_null(n);
  kl_shape want = S(1, 2);
  assert_true(kl_shape_equal(&n->outputs[0]->shape, &want));
  assert_int_equal(kl_attr_int(n, "keepdims", 7), 7); /* default when absent */
  kl_graph_free(g);
}

static kl_graph *small_graph(void) {
  kl_graph *g = kl_graph_new("t");
  kl_value *x = input(g, "x", KL_F32, S(2, 2, 3));
  kl_error err;
  kl_node *r = kl_graph_add_node(g, KL_OP_RELU, "r", (kl_value *[]){x}, 1, NULL, 0, NULL,
                                 0, noloc, &err);
  kl_node *e = kl_graph_add_node(g, KL_OP_EXP, "e", (kl_value *[]){r->outputs[0]}, 1,
                                 NULL, 0, NULL, 0, noloc, &err);
  kl_graph_mark_output(g, e->outputs[0], &err);
  return g;
}

static void test_verify_accepts_good_graph(void **state) {
  (void)state;
  kl_graph *g = small_graph();
  kl_error err;
  assert_int_equal(kl_verify(g, &err), 0);
  kl_graph_free(g);
}

static void test_verify_catches_errors(void **state) {
  (void)state;
  kl_error err;
  /* duplicate names */
  kl_graph *g = small_graph();
  input(g, "x", KL_F32, S(1, 1));
  assert_int_equal(kl_verify(g, &err), -1);
  assert_non_null(strstr(err.msg, "duplicate value name 'x'"));
  kl_graph_free(g);
  /* a cycle: relu reads exp's output */
  g = small_graph();
  kl_node *r = g->nodes.items[0], *e = g->nodes.items[1];
  r->inputs[0] = e->outputs[0];
  r->outputs[0]->shape = e->outputs[0]->shape;
  assert_int_equal(kl_verify(g, &err), -1);
  assert_non_null(strstr(err.msg, "cycle"));
  kl_graph_free(g);
  /* a dangling input from another graph */
  g = small_graph();
  kl_graph *other = small_graph();
  g->nodes.items[0]->inputs[0] = other->inputs.items[0];
  other->inputs.items[0]->id = 99;
  assert_int_equal(kl_verify(g, &err), -1);
  assert_non_null(strstr(err.msg, "dangling"));
  kl_graph_free(other);
  kl_graph_free(g);
  /* a recorded shape that inference disagrees with */
  g = small_graph();
  g->nodes.items[1]->outputs[0]->shape.dims[0] = 5;
  assert_int_equal(kl_verify(g, &err), -1);
  assert_non_null(strstr(err.msg, "infers to"));
  kl_graph_free(g);
  /* a recorded dtype that inference disagrees with */
  g = small_graph();
  g->nodes.items[0]->outputs[0]->dtype = KL_F16;
  assert_int_equal(kl_verify(g, &err), -1);
  kl_graph_free(g);
  /* no outputs */
  g = kl_graph_new("t");
  input(g, "x", KL_F32, S(1, 2));
  assert_int_equal(kl_verify(g, &err), -1);
  assert_non_null(strstr(err.msg, "no outputs"));
  kl_graph_free(g);
  /* a negative dim */
  g = small_graph();
  g->inputs.items[0]->shape.dims[0] = -1;
  assert_int_equal(kl_verify(g, &err), -1);
  kl_graph_free(g);
}

static void test_topo_order(void **state) {
  (void)state;
  kl_graph *g = small_graph();
  /* swap creation order: topo order must still put relu first */
  kl_node *tmp = g->nodes.items[0];
  g->nodes.items[0] = g->nodes.items[1];
  g->nodes.items[1] = tmp;
  g->nodes.items[0]->id = 0;
  g->nodes.items[1]->id = 1;
  kl_node *order[2];
  kl_error err;
  assert_int_equal(kl_topo_order(g, order, &err), 0);
  assert_int_equal(order[0]->op, KL_OP_RELU);
  assert_int_equal(order[1]->op, KL_OP_EXP);
  kl_graph_free(g);
}

static void test_dtype_round(void **state) {
  (void)state;
  assert_true(kl_dtype_round(KL_F16, 1.0 / 3.0) == 0.333251953125);
  assert_true(kl_dtype_round(KL_BF16, 1.0 / 3.0) == 0.333984375);
  assert_true(kl_dtype_round(KL_F32, 0.1) == (double)0.1f);
  assert_true(kl_dtype_round(KL_I8, 200) == -56);
  assert_true(kl_dtype_round(KL_I32, -2.7) == -2);
  assert_true(kl_dtype_round(KL_BOOL, -3) == 1);
  assert_true(isinf(kl_dtype_round(KL_F16, 70000)));
  assert_true(isnan(kl_dtype_round(KL_F32, NAN)));
  kl_dtype t;
  assert_int_equal(kl_dtype_from_name("bf16", &t), 0);
  assert_int_equal(t, KL_BF16);
  assert_int_equal(kl_dtype_from_name("f8", &t), -1);
}

static void test_interpret_broadcast_add(void **state) {
  (void)state;
  kl_graph *g = kl_graph_new("t");
  kl_value *a = input(g, "a", KL_F32, S(2, 2, 1));
  kl_value *b = input(g, "b", KL_F32, S(1, 3));
  kl_error err;
  kl_node *n = kl_graph_add_node(g, KL_OP_ADD, NULL, (kl_value *[]){a, b}, 2, NULL, 0,
                                 NULL, 0, noloc, &err);
  kl_graph_mark_output(g, n->outputs[0], &err);
  kl_tensor *in[2] = {kl_tensor_new(KL_F32, &a->shape), kl_tensor_new(KL_F32, &b->shape)};
  in[0]->data[0] = 1, in[0]->data[1] = 2;
  in[1]->data[0] = 10, in[1]->data[1] = 20, in[1]->data[2] = 30;
  kl_tensor *out[1];
  assert_int_equal(kl_interpret(g, in, out, &err), 0);
  double want[] = {11, 21, 31, 12, 22, 32};
  for (int i = 0; i < 6; i++) assert_true(out[0]->data[i] == want[i]);
  kl_tensor_free(out[0]);
  /* a wrongly shaped input is an error naming it */
  kl_tensor_free(in[1]);
  kl_shape wrong = S(1, 4);
  in[1] = kl_tensor_new(KL_F32, &wrong);
  assert_int_equal(kl_interpret(g, in, out, &err), -1);
  assert_non_null(strstr(err.msg, "input 'b'"));
  kl_tensor_free(in[0]);
  kl_tensor_free(in[1]);
  kl_graph_free(g);
}

static void test_rng_is_deterministic(void **state) {
  (void)state;
  kl_rng a, b;
  kl_rng_seed(&a, 42);
  kl_rng_seed(&b, 42);
  double sum = 0, sq = 0;
  for (int i = 0; i < 20000; i++) {
    double x = kl_rng_normal(&a);
    assert_true(x == kl_rng_normal(&b));
    sum += x;
    sq += x * x;
  }
  /* mean ~0, variance ~1: loose bounds, 20000 samples */
  assert_true(fabs(sum / 20000) < 0.05);
  assert_true(fabs(sq / 20000 - 1) < 0.05);
}

/* The op table's own rules: ONNX names are unique (the ONNX frontend looks
 * rows up by them), only elementwise rows have a CUDA expression, and a
 * template's only conversion is %s (it is used as a format). */
/* Params no node reads (consumed while loading an ONNX model) leave the
 * graph; read ones and outputs stay, values renumbered, names found. */
static void test_drop_unread_params(void **state) {
  (void)state;
  kl_graph *g = kl_graph_new("t");
  kl_value *x = input(g, "x", KL_F32, S(1, 2));
  kl_init zeros = {.kind = KL_INIT_ZEROS};
  kl_shape one = S(1, 1), row = S(1, 2);
  kl_value *unread = kl_graph_add_param(g, "unread", KL_I64, &one, KL_VAL_CONST, zeros, noloc);
  kl_value *w = kl_graph_add_param(g, "w", KL_F32, &row, KL_VAL_PARAM, zeros, noloc);
  kl_value *out = kl_graph_add_param(g, "out", KL_F32, &row, KL_VAL_PARAM, zeros, noloc);
  kl_error err;
  kl_node *n = kl_graph_add_node(g, KL_OP_ADD, NULL, (kl_value *[]){x, w}, 2, NULL, 0, NULL, 0,
                                 noloc, &err);
  assert_non_null(n);
  assert_int_equal(kl_graph_mark_output(g, n->outputs[0], &err), 0);
  assert_int_equal(kl_graph_mark_output(g, out, &err), 0);
  (void)unread;
  assert_int_equal(kl_graph_drop_unread_params(g), 1);
  assert_int_equal(g->params.len, 2);
  assert_ptr_equal(g->params.items[0], w);
  assert_ptr_equal(g->params.items[1], out);
  assert_null(kl_graph_find_value(g, "unread"));
  assert_ptr_equal(kl_graph_find_value(g, "w"), w);
  for (int i = 0; i < g->values.len; i++) assert_int_equal(g->values.items[i]->id, i);
  assert_int_equal(kl_verify(g, &err), 0);
  assert_int_equal(kl_graph_drop_unread_params(g), 0);
  kl_graph_free(g);
}

static void test_op_table_columns(void **state) {
  (void)state;
  for (int i = 0; i < KL_OP_COUNT; i++) {
    const kl_op_info *r = &kl_ops[i];
    if (r->onnx) {
      kl_op op;
      assert_int_equal(kl_op_lookup_onnx(r->onnx, &op), 0);
      if ((int)op != i) fail_msg("ONNX name %s is on two rows", r->onnx);
    }
    if (r->precision < KL_PREC_ALLOW || r->precision > KL_PREC_KEEP)
      fail_msg("op %s has no precision class", r->name);
    if (!r->cuda || r->cuda == kl_op_cuda_custom) continue;
    if (r->kind != KL_KIND_ELEMENTWISE) fail_msg("op %s: a CUDA expression but not elementwise", r->name);
    for (const char *p = strchr(r->cuda, '%'); p; p = strchr(p + 2, '%'))
      if (p[1] != 's') fail_msg("op %s: CUDA template \"%s\" has a %% other than %%s", r->name, r->cuda);
  }
  kl_op op;
  assert_int_equal(kl_op_lookup_onnx("Exp", &op), 0);
  assert_int_equal(op, KL_OP_EXP);
  assert_int_equal(kl_op_lookup_onnx("NoSuchOp", &op), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_broadcast_rules),
      cmocka_unit_test(test_add_node_infers_shapes),
      cmocka_unit_test(test_add_node_rejects),
      cmocka_unit_test(test_attr_conversions),
      cmocka_unit_test(test_verify_accepts_good_graph),
      cmocka_unit_test(test_verify_catches_errors),
      cmocka_unit_test(test_topo_order),
      cmocka_unit_test(test_drop_unread_params),
      cmocka_unit_test(test_dtype_round),
      cmocka_unit_test(test_interpret_broadcast_add),
      cmocka_unit_test(test_rng_is_deterministic),
      cmocka_unit_test(test_op_table_columns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
