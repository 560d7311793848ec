/* test_autodiff.c - reverse-mode gradients checked against central finite
 * differences computed with the interpreter (f64, so the check is tight),
 * for every op that has a gradient rule, with broadcasting. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../../frontend/frontend.h"
#include "../../passes/passes.h"

/* Evaluate output 0 of g summed, at the given inputs. */
static double eval_sum(const kl_graph *g, kl_tensor **in) {
  kl_tensor *out[8];
  kl_error err;
  assert_int_equal(kl_interpret(g, in, out, &err), 0);
  double s = 0;
  for (int64_t i = 0; i < out[0]->numel; i++) s += out[0]->data[i];
  for (int k = 0; k < g->outputs.len; k++) kl_tensor_free(out[k]);
  return s;
}

static void check_gradients(const char *src) {
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  int nin = g->inputs.len;
  kl_tensor *in[8];
  kl_rng r;
  kl_rng_seed(&r, 11);
  for (int i = 0; i < nin; i++) {
    in[i] = kl_tensor_new(g->inputs.items[i]->dtype, &g->inputs.items[i]->shape);
    for (int64_t k = 0; k < in[i]->numel; k++) in[i]->data[k] = 0.5 + kl_rng_uniform(&r);
  }
  double base = eval_sum(g, in);
  (void)base;
  /* Differentiate output 0 with respect to every input; the gradients
   * become extra outputs of the same graph. */
  kl_value *grads[8];
  assert_int_equal(kl_autodiff(g, g->outputs.items[0], g->inputs.items, nin, grads, &err), 0);
  for (int i = 0; i < nin; i++) kl_graph_mark_output(g, grads[i], &err);
  assert_int_equal(kl_verify(g, &err), 0);
  kl_tensor *out[16];
  assert_int_equal(kl_interpret(g, in, out, &err), 0);
  const double h = 1e-6;
  for (int i = 0; i < nin; i++) {
    const kl_tensor *gr = out[1 + i];
    assert_int_equal(gr->numel, in[i]->numel);
    for (int64_t k = 0; k < in[i]->numel; k++) {
      double keep = in[i]->data[k];
      in[i]->data[k] = keep + h;
      double up = eval_sum(g, in);
      in[i]->data[k] = keep - h;
      double down = eval_sum(g, in);
      in[i]->data[k] = keep;
      double numeric = (up - down) / (2 * h);
      if (fabs(numeric - gr->data[k]) > 1e-5 * (1 + fabs(numeric)))
        fail_msg("%s\ninput %d element %lld: autodiff %.10g, finite difference %.10g", src, i,
                 (long long)k, gr->data[k], numeric);
    }
  }
  for (int k = 0; k < g->outputs.len; k++) kl_tensor_free(out[k]);
  for (int i = 0; i < nin; i++) kl_tensor_free(in[i]);
  kl_graph_free(g);
}

static void test_elementwise(void **s) {
  (void)s;
  check_gradients("input a: f64[2, 3]\ninput b: f64[2, 3]\n"
                  "output y = (a + b) * a - b / (a + 1.5) + exp(a) * log(b) - sqrt(a * b)\n");
  check_gradients("input a: f64[4]\noutput y = tanh(a) * sigmoid(a) + relu(a - 1.0) - -a\n");
}

static void test_broadcasting(void **s) {
  (void)s;
  check_gradients("input a: f64[2, 3]\ninput b: f64[3]\ninput c: f64[2, 1]\n"
                  "output y = a * b + c / b - c\n");
}

static void test_matmul_and_shapes(void **s) {
  (void)s;
  check_gradients("input a: f64[2, 3]\ninput w: f64[3, 4]\ninput v: f64[4]\n"
                  "output y = reduce_sum(reshape(relu(a @ w + v), shape=[8]) * 2.0, axes=[0])\n");
  check_gradients("input a: f64[2, 2, 3]\ninput w: f64[3, 2]\n"
                  "output y = reduce_sum(a @ w, axes=[1], keepdims=true)\n");
}

static void test_unrelated_input_gets_zeros(void **s) {
  (void)s;
  const char *src = "input a: f64[2]\ninput b: f64[2]\noutput y = exp(a)\n";
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  kl_value *grads[2];
  assert_int_equal(kl_autodiff(g, g->outputs.items[0], g->inputs.items, 2, grads, &err), 0);
  assert_int_equal(grads[1]->producer->op, KL_OP_EXPAND);
  assert_int_equal(grads[1]->producer->inputs[0]->producer->op, KL_OP_CONSTANT);
  kl_graph_free(g);
}

static void test_missing_rule_is_an_error(void **s) {
  (void)s;
  const char *src = "input a: f64[2, 3]\noutput y = sin(a) * sinh(a) * cos(a)\n";
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  kl_value *grads[1];
  assert_int_equal(kl_autodiff(g, g->outputs.items[0], g->inputs.items, 1, grads, &err), -1);
  assert_non_null(strstr(err.msg, "no gradient for sin (node"));
  assert_non_null(strstr(err.msg, "cos (node"));
  kl_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_broadcasting),
      cmocka_unit_test(test_matmul_and_shapes),
      cmocka_unit_test(test_unrelated_input_gets_zeros),
      cmocka_unit_test(test_missing_rule_is_an_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
