/* test_frontend.c - the .kl frontend: examples parse, the printer's text
 * parses back to the same text and the same results, literals take the
 * dtype they meet, dims can be overridden, errors carry locations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../../frontend/frontend.h"

static char *print_to_string(const kl_graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  kl_print_graph(f, g);
  fclose(f);
  return buf;
}

static kl_graph *parse(const char *text) {
  kl_error err;
  kl_graph *g = kl_parse_string(text, strlen(text), "test.kl", NULL, &err);
  if (!g) fprintf(stderr, "%d:%d: %s\n", err.loc.line, err.loc.col, err.msg);
  return g;
}

static void random_inputs(const kl_graph *g, kl_tensor **in) {
  for (int i = 0; i < g->inputs.len; i++) {
    const kl_value *v = g->inputs.items[i];
    in[i] = kl_tensor_new(v->dtype, &v->shape);
    kl_rng r;
    kl_rng_seed(&r, (uint64_t)i + 7);
    for (int64_t k = 0; k < in[i]->numel; k++)
      in[i]->data[k] = kl_dtype_round(v->dtype, kl_dtype_is_float(v->dtype)
                                                    ? kl_rng_normal(&r)
                                                    : (double)(kl_rng_next(&r) % 3));
  }
}

/* print(parse(file)) parses back to the same text, and both graphs give
 * bit-identical outputs on the same inputs. */
static void roundtrip(const char *example) {
  char path[4096];
  snprintf(path, sizeof path, "%s/examples/%s", KILN_SOURCE_ROOT, example);
  kl_error err;
  kl_graph *g1 = kl_parse_file(path, NULL, &err);
  if (!g1) fprintf(stderr, "%s:%d:%d: %s\n", path, err.loc.line, err.loc.col, err.msg);
  assert_non_null(g1);
  char *t1 = print_to_string(g1);
  kl_graph *g2 = parse(t1);
  assert_non_null(g2);
  char *t2 = print_to_string(g2);
  assert_string_equal(t1, t2);

  kl_tensor *in[16], *o1[16], *o2[16];
  assert_true(g1->inputs.len <= 16 && g1->outputs.len <= 16);
  random_inputs(g1, in);
  assert_int_equal(kl_interpret(g1, in, o1, &err), 0);
  assert_int_equal(kl_interpret(g2, in, o2, &err), 0);
  for (int i = 0; i < g1->outputs.len; i++) {
    assert_int_equal(o1[i]->numel, o2[i]->numel);
    assert_memory_equal(o1[i]->data, o2[i]->data, (size_t)o1[i]->numel * sizeof(double));
    kl_tensor_free(o1[i]);
    kl_tensor_free(o2[i]);
  }
  for (int i = 0; i < g1->inputs.len; i++) kl_tensor_free(in[i]);
  free(t1);
  free(t2);
  kl_graph_free(g1);
  kl_graph_free(g2);
}

static void test_roundtrip_mlp(void **s) { (void)s; roundtrip("mlp.kl"); }
static void test_roundtrip_cnn(void **s) { (void)s; roundtrip("cnn.kl"); }
static void test_roundtrip_transformer(void **s) { (void)s; roundtrip("transformer.kl"); }

static void test_literal_takes_dtype(void **state) {
  (void)state;
  kl_graph *g = parse("input x: f16[2, 3]\noutput y = x * 0.5 + 1\n");
  assert_non_null(g);
  for (int i = 0; i < g->nodes.len; i++)
    if (g->nodes.items[i]->op == KL_OP_CONSTANT)
      assert_int_equal(g->nodes.items[i]->outputs[0]->dtype, KL_F16);
  assert_int_equal(g->outputs.items[0]->dtype, KL_F16);
  kl_graph_free(g);
  /* folded literals and named numbers */
  g = parse("input x: f32[2]\nlet eps = 1e-3 * 2\noutput y = x + eps\n");
  assert_non_null(g);
  kl_graph_free(g);
}

static void test_dim_override(void **state) {
  (void)state;
  const char *src = "dim B = 4\ninput x: f32[B, 3]\noutput y = relu(x)\n";
  kl_dim_override d = {"B", 9};
  kl_parse_options opt = {.dims = &d, .ndims = 1};
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", &opt, &err);
  assert_non_null(g);
  assert_int_equal(g->inputs.items[0]->shape.dims[0], 9);
  kl_graph_free(g);
  kl_dim_override bad = {"Q", 9};
  opt.dims = &bad;
  assert_null(kl_parse_string(src, strlen(src), "t.kl", &opt, &err));
  assert_non_null(strstr(err.msg, "no dim named 'Q'"));
}

static void test_let_alias_and_names(void **state) {
  (void)state;
  kl_graph *g = parse("input x: f32[2]\nlet y = x\nlet z = relu(y)\noutput z\noutput y\n");
  assert_non_null(g);
  assert_string_equal(g->outputs.items[0]->name, "z");
  assert_string_equal(g->outputs.items[1]->name, "x"); /* y aliases x */
  kl_graph_free(g);
  /* a user's name wins over a generated one */
  g = parse("input x: f32[2]\nlet a = relu(x) + 1.0\nlet relu_1 = exp(a)\noutput relu_1\n");
  assert_non_null(g);
  assert_string_equal(g->outputs.items[0]->name, "relu_1");
  kl_error err;
  assert_int_equal(kl_verify(g, &err), 0);
  kl_graph_free(g);
}

static void test_train_block_kept(void **state) {
  (void)state;
  kl_graph *g = parse("input x: f32[4, 3]\ninput t: i64[4]\n"
                      "param w: f32[3, 3] = randn(0.1, seed=3)\n"
                      "output p = softmax(x @ w)\n"
                      "train {\n  loss = cross_entropy(x @ w, t)\n"
                      "  optimizer = adam(lr=0.001, beta1=0.9)\n}\n");
  assert_non_null(g);
  assert_non_null(g->train);
  assert_string_equal(g->train->loss, "loss");
  assert_string_equal(g->train->optimizer, "adam");
  assert_int_equal(g->train->nattrs, 2);
  assert_true(g->train->attrs[0].f == 0.001);
  kl_graph_free(g);
}

static const kl_attr *setting(const kl_attr *attrs, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(attrs[i].name, name) == 0) return &attrs[i];
  return NULL;
}

static void assert_setting(const kl_attr *attrs, int n, const char *name, double want) {
  const kl_attr *a = setting(attrs, n, name);
  if (!a) fprintf(stderr, "setting '%s' missing\n", name);
  assert_non_null(a);
  assert_int_equal(a->kind, KL_ATTR_FLOAT);
  assert_true(a->f == want);
}

/* Every item of a train block lands in g->train, only the keywords given
 * are stored, `schedule` and `clip` stay usable as value names outside the
 * block's item keywords, and the printed block parses back the same. */
static void test_train_block_full(void **state) {
  (void)state;
  const char *src =
      "input x: f32[4, 3]\ninput t: i64[4]\n"
      "param w: f32[3, 3] = randn(0.1, seed=3)\n"
      "let clip = x @ w\nlet schedule = clip * 2.0\n"
      "output p = softmax(schedule)\n"
      "let max_norm = 0.25 * 2\n"
      "train {\n"
      "  clip = max_norm\n"
      "  schedule = cosine(warmup=100, total=2000, min_lr=0)\n"
      "  loss = cross_entropy(schedule, t)\n"
      "  optimizer = adamw(lr=1e-3, weight_decay=0.05, eps=1e-6)\n"
      "}\n";
  kl_graph *g = parse(src);
  assert_non_null(g);
  const kl_train *tr = g->train;
  assert_non_null(tr);
  assert_string_equal(tr->loss, "loss");
  assert_string_equal(tr->optimizer, "adamw");
  assert_int_equal(tr->nattrs, 3);
  assert_setting(tr->attrs, tr->nattrs, "lr", 1e-3);
  assert_setting(tr->attrs, tr->nattrs, "weight_decay", 0.05);
  assert_setting(tr->attrs, tr->nattrs, "eps", 1e-6);
  assert_null(setting(tr->attrs, tr->nattrs, "beta1")); /* defaults are the consumer's */
  assert_string_equal(tr->schedule, "cosine");
  assert_int_equal(tr->nschedule_attrs, 3);
  assert_setting(tr->schedule_attrs, tr->nschedule_attrs, "warmup", 100);
  assert_setting(tr->schedule_attrs, tr->nschedule_attrs, "total", 2000);
  assert_setting(tr->schedule_attrs, tr->nschedule_attrs, "min_lr", 0);
  assert_true(tr->clip == 0.5);
  assert_non_null(kl_graph_find_value(g, "clip"));
  assert_non_null(kl_graph_find_value(g, "schedule"));

  char *t1 = print_to_string(g);
  kl_graph *g2 = parse(t1);
  assert_non_null(g2);
  char *t2 = print_to_string(g2);
  assert_string_equal(t1, t2);
  assert_true(g2->train->clip == 0.5);
  assert_string_equal(g2->train->schedule, "cosine");
  free(t1);
  free(t2);
  kl_graph_free(g2);
  kl_graph_free(g);

  /* sgd with momentum and a step schedule; no clip means 0 */
  g = parse("input x: f32[2]\noutput y = reduce_sum(x * x)\n"
            "train { loss = y optimizer = sgd(lr=0.5, momentum=0.9, nesterov=true)"
            " schedule = step(step_size=30, gamma=0.5) }\n");
  assert_non_null(g);
  tr = g->train;
  assert_string_equal(tr->optimizer, "sgd");
  assert_setting(tr->attrs, tr->nattrs, "nesterov", 1);
  assert_setting(tr->attrs, tr->nattrs, "momentum", 0.9);
  assert_string_equal(tr->schedule, "step");
  assert_setting(tr->schedule_attrs, tr->nschedule_attrs, "step_size", 30);
  assert_setting(tr->schedule_attrs, tr->nschedule_attrs, "gamma", 0.5);
  assert_true(tr->clip == 0);
  kl_graph_free(g);

  /* no schedule item: NULL (constant) */
  g = parse("input x: f32[2]\noutput y = reduce_sum(x * x)\n"
            "train { loss = y optimizer = adam(lr=0.01) }\n");
  assert_non_null(g);
  assert_null(g->train->schedule);
  assert_int_equal(g->train->nschedule_attrs, 0);
  kl_graph_free(g);
}

static void test_error_locations(void **state) {
  (void)state;
  const char *src = "input a: f32[2, 3]\ninput b: f32[4]\nlet c = a +\n  b\noutput c\n";
  kl_error err;
  assert_null(kl_parse_string(src, strlen(src), "t.kl", NULL, &err));
  assert_string_equal(err.loc.file, "t.kl");
  assert_int_equal(err.loc.line, 3);
  assert_int_equal(err.loc.col, 11);
  assert_non_null(strstr(err.msg, "cannot broadcast"));
  /* empty input */
  assert_null(kl_parse_string("", 0, "t.kl", NULL, &err));
  assert_non_null(strstr(err.msg, "no outputs"));
  /* NUL bytes are rejected, not read past */
  assert_null(kl_parse_string("input\0x", 7, "t.kl", NULL, &err));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_mlp),
      cmocka_unit_test(test_roundtrip_cnn),
      cmocka_unit_test(test_roundtrip_transformer),
      cmocka_unit_test(test_literal_takes_dtype),
      cmocka_unit_test(test_dim_override),
      cmocka_unit_test(test_let_alias_and_names),
      cmocka_unit_test(test_train_block_kept),
      cmocka_unit_test(test_train_block_full),
      cmocka_unit_test(test_error_locations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
