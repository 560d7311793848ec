/* test_train.c - the training compile's pieces that need no device: whole
 * example models differentiated and checked against central finite
 * differences through the interpreter (the examples in f64), the training
 * step's graph (every trained param gets an optim_step output that updates
 * it), and the loss scaler's rules. */
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
#include "../../runtime/kilnrt.h"

/* An example's text with every f32 made f64, so finite differences are
 * exact enough to check against. */
static char *example_f64(const char *name, size_t *len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/examples/%s", KILN_SOURCE_ROOT, name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot read %s", path);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  for (char *p = buf; (p = strstr(p, "f32")); p += 3) p[2] = '4', p[1] = '6';
  *len = n;
  return buf;
}

static int loss_index; /* the loss's place among the outputs */

static double loss_at(const kl_graph *g, kl_tensor **in) {
  kl_tensor *out[16];
  kl_error err;
  if (kl_interpret(g, in, out, &err)) fail_msg("%s", err.msg);
  double v = out[loss_index]->data[0];
  for (int k = 0; k < g->outputs.len; k++) kl_tensor_free(out[k]);
  return v;
}

/* d loss / d param by autodiff against central differences, at `probes`
 * elements of every param. */
static void check_model(const char *name, int probes) {
  size_t len;
  char *src = example_f64(name, &len);
  kl_dim_override b = {"B", 3};
  kl_parse_options po = {.dims = &b, .ndims = 1};
  kl_error err;
  kl_graph *g = kl_parse_string(src, len, name, &po, &err);
  if (!g) fail_msg("%s", err.msg);
  assert_non_null(g->train);
  kl_value *loss = kl_graph_find_value(g, g->train->loss);
  assert_non_null(loss);
  loss_index = g->outputs.len;
  assert_int_equal(kl_graph_mark_output(g, loss, &err), 0);
  int np = 0;
  kl_value *params[32], *grads[32];
  for (int i = 0; i < g->params.len; i++)
    if (g->params.items[i]->kind == KL_VAL_PARAM) params[np++] = g->params.items[i];
  assert_true(np >= 4);
  /* the params' values as data the probes can nudge (f64: raw doubles) */
  for (int i = 0; i < np; i++) {
    kl_tensor *t;
    assert_int_equal(kl_value_materialize(params[i], &t, &err), 0);
    double *raw = kl_arena_alloc(&g->arena, sizeof(double) * (size_t)t->numel);
    memcpy(raw, t->data, sizeof(double) * (size_t)t->numel);
    params[i]->data = raw;
    params[i]->init = (kl_init){.kind = KL_INIT_DATA};
    kl_tensor_free(t);
  }
  if (kl_autodiff(g, loss, params, np, grads, &err)) fail_msg("%s", err.msg);
  for (int i = 0; i < np; i++) assert_int_equal(kl_graph_mark_output(g, grads[i], &err), 0);
  if (kl_verify(g, &err)) fail_msg("%s", err.msg);
  /* inputs: pixels in [0, 1], labels 0..9 */
  kl_rng r;
  kl_rng_seed(&r, 5);
  kl_tensor *in[2];
  for (int i = 0; i < 2; i++) {
    const kl_value *v = g->inputs.items[i];
    in[i] = kl_tensor_new(v->dtype, &v->shape);
    for (int64_t k = 0; k < in[i]->numel; k++)
      in[i]->data[k] = kl_dtype_is_float(v->dtype) ? kl_rng_uniform(&r) : (double)(kl_rng_next(&r) % 10);
  }
  /* the gradients at these inputs (outputs: probs, loss, then grads) */
  kl_tensor *out[48];
  if (kl_interpret(g, in, out, &err)) fail_msg("%s", err.msg);
  int first_grad = g->outputs.len - np, checked = 0;
  /* finite differences of the loss alone: a graph with the loss as its
   * only output would be cleaner, but the params are the same values */
  for (int i = 0; i < np; i++) {
    kl_value *p = params[i];
    kl_tensor *pt;
    assert_int_equal(kl_value_materialize(p, &pt, &err), 0);
    double *data = p->data;
    assert_non_null(data);
    for (int s = 0; s < probes; s++) {
      int64_t k = (int64_t)(kl_rng_next(&r) % (uint64_t)pt->numel);
      double keep = data[k], h = 1e-6;
      data[k] = keep + h;
      double up = loss_at(g, in);
      data[k] = keep - h;
      double down = loss_at(g, in);
      data[k] = keep;
      double numeric = (up - down) / (2 * h), analytic = out[first_grad + i]->data[k];
      if (fabs(numeric - analytic) > 1e-6 + 1e-5 * fabs(numeric))
        fail_msg("%s: d loss / d %s[%lld]: autodiff %.10g, finite difference %.10g", name,
                 p->name, (long long)k, analytic, numeric);
      checked++;
    }
    kl_tensor_free(pt);
  }
  printf("%s: %d gradient elements of %d params match finite differences\n", name, checked, np);
  for (int k = 0; k < g->outputs.len; k++) kl_tensor_free(out[k]);
  kl_tensor_free(in[0]);
  kl_tensor_free(in[1]);
  kl_graph_free(g);
}

static void test_mlp_gradients(void **s) {
  (void)s;
  check_model("train_mlp.kl", 12);
}

static void test_cnn_gradients(void **s) {
  (void)s;
  check_model("train_cnn.kl", 12);
}

/* The step appended by kl_train_build: five scalar inputs, loss/ok/norm
 * outputs, and an update output for every param and state tensor. */
static void test_step_graph(void **s) {
  (void)s;
  size_t len;
  char *src = example_f64("train_mlp.kl", &len);
  for (char *p = src; (p = strstr(p, "f64")); p += 3) p[2] = '2', p[1] = '3'; /* back to f32 */
  kl_error err;
  kl_graph *g = kl_parse_string(src, len, "train_mlp.kl", NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  int inputs = g->inputs.len;
  if (kl_train_build(g, false, &err)) fail_msg("%s", err.msg);
  if (kl_verify(g, &err)) fail_msg("%s", err.msg);
  kl_train *t = g->train;
  assert_true(t->built);
  assert_int_equal(g->inputs.len, inputs + 5);
  assert_int_equal(t->nparams, 6);
  assert_int_equal(t->nstates, 18); /* adamw: m and v per param */
  int updates = 0;
  for (int i = 0; i < g->outputs.len; i++) {
    const kl_value *v = g->outputs.items[i];
    if (!v->updates) continue;
    updates++;
    assert_int_equal(v->producer->op, KL_OP_OPTIM_STEP);
    assert_true(kl_shape_equal(&v->shape, &v->updates->shape));
  }
  assert_int_equal(updates, 18);
  assert_int_equal(kl_train_build(g, false, &err), 0); /* a second call adds nothing */
  assert_int_equal(g->inputs.len, inputs + 5);
  kl_graph_free(g);
}

static void test_loss_scaler(void **s) {
  (void)s;
  krt_loss_scaler ls;
  krt_loss_scaler_init(&ls, 1);
  assert_true(ls.scale == 65536.0);
  for (int i = 0; i < 1999; i++) assert_int_equal(krt_loss_scaler_update(&ls, 1), 0);
  assert_true(ls.scale == 65536.0);
  assert_int_equal(krt_loss_scaler_update(&ls, 1), 1); /* the 2000th finite step */
  assert_true(ls.scale == 131072.0);
  for (int i = 0; i < 1000; i++) krt_loss_scaler_update(&ls, 1);
  assert_int_equal(krt_loss_scaler_update(&ls, 0), 1); /* halved, and the count restarts */
  assert_true(ls.scale == 65536.0);
  for (int i = 0; i < 1999; i++) krt_loss_scaler_update(&ls, 1);
  assert_true(ls.scale == 65536.0);
  for (int i = 0; i < 40; i++) krt_loss_scaler_update(&ls, 0);
  assert_true(ls.scale == 1.0); /* never below 1 */
  krt_loss_scaler off;
  krt_loss_scaler_init(&off, 0); /* fp32, bf16 */
  for (int i = 0; i < 3000; i++) assert_int_equal(krt_loss_scaler_update(&off, i % 7 != 0), 0);
  assert_true(off.scale == 1.0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_gradients), cmocka_unit_test(test_cnn_gradients),
      cmocka_unit_test(test_step_graph), cmocka_unit_test(test_loss_scaler),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
