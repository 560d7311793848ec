/* ops_train.c - the training ops: optim_step, one optimizer step over many
 * tensors (ops.def documents it; docs/DSL.md has the formulas). */
#include <math.h>
#include <string.h>

#include "op_impl.h"

enum { STEP_SCALARS = 5 };

typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAMW } optim_algo;

static int algo_of(const kl_node *n, optim_algo *out) {
  const char *a = kl_attr_string(n, "algo", "");
  if (!strcmp(a, "sgd")) *out = OPT_SGD;
  else if (!strcmp(a, "adam")) *out = OPT_ADAM;
  else if (!strcmp(a, "adamw")) *out = OPT_ADAMW;
  else return -1;
  return 0;
}

int kl_optim_state_count(const kl_node *n) {
  optim_algo a;
  if (algo_of(n, &a)) return -1;
  if (a == OPT_SGD) return kl_attr_float(n, "momentum", 0) > 0 ? 1 : 0;
  return 2;
}

int kl_optim_step_noutputs(const kl_node *n) {
  int ns = kl_optim_state_count(n);
  int64_t count = kl_attr_int(n, "count", 0);
  if (ns < 0 || count < 1 || count > 4096) return -1;
  return (int)count * (1 + ns);
}

int kl_infer_OPTIM_STEP(kl_node *n, kl_error *err) {
  optim_algo a;
  char sv[300];
  if (algo_of(n, &a)) return KL_NODE_FAIL(n, err, "algo must be sgd, adam or adamw");
  int ns = kl_optim_state_count(n), per = 2 + ns;
  int64_t count = kl_attr_int(n, "count", 0);
  if (count < 1 || n->ninputs != STEP_SCALARS + count * per)
    return KL_NODE_FAIL(n, err, "%d inputs for count = %lld (%d scalars, then %d per tensor)",
                        n->ninputs, (long long)count, STEP_SCALARS, per);
  for (int i = 0; i < STEP_SCALARS; i++)
    if (n->inputs[i]->dtype != KL_F32 || kl_shape_numel(&n->inputs[i]->shape) != 1)
      return KL_NODE_FAIL(n, err, "input %d must be an f32 scalar, got %s", i,
                          kl_value_str(n->inputs[i], sv, sizeof sv));
  for (int64_t t = 0; t < count; t++) {
    const kl_value *p = n->inputs[STEP_SCALARS + t * per];
    if (!kl_dtype_is_float(p->dtype) || p->dtype == KL_F64 || kl_dtype_size(p->dtype) != 4)
      return KL_NODE_FAIL(n, err, "tensor %lld must be f32 (master weights), got %s", (long long)t,
                          kl_value_str(p, sv, sizeof sv));
    for (int k = 1; k < per; k++) {
      const kl_value *v = n->inputs[STEP_SCALARS + t * per + k];
      if (v->dtype != p->dtype || !kl_shape_equal(&v->shape, &p->shape))
        return KL_NODE_FAIL(n, err, "tensor %lld: %s does not match the param %s", (long long)t,
                            kl_value_str(v, sv, sizeof sv), p->name);
    }
    for (int k = 0; k < 1 + ns; k++) kl_set_output(n, (int)t * (1 + ns) + k, p->dtype, &p->shape);
  }
  return 0;
}

/* One element's step; state s[0..ns), in float64 (the interpreter). */
static void step_element(optim_algo a, const double *h, double lr, double bias1, double bias2,
                         double grad, double *p, double *s) {
  double beta1 = h[0], beta2 = h[1], eps = h[2], wd = h[3], momentum = h[4];
  bool nesterov = h[5] != 0;
  if (a == OPT_ADAMW) *p *= 1 - lr * wd;
  else grad += wd * *p;
  if (a == OPT_SGD) {
    double d = grad;
    if (momentum > 0) {
      s[0] = momentum * s[0] + grad;
      d = nesterov ? grad + momentum * s[0] : s[0];
    }
    *p -= lr * d;
    return;
  }
  s[0] = beta1 * s[0] + (1 - beta1) * grad;
  s[1] = beta2 * s[1] + (1 - beta2) * grad * grad;
  *p -= lr * (s[0] * bias1) / (sqrt(s[1] * bias2) + eps);
}

void kl_optim_hyper(const kl_node *n, double h[6]) {
  h[0] = kl_attr_float(n, "beta1", 0.9);
  h[1] = kl_attr_float(n, "beta2", 0.999);
  h[2] = kl_attr_float(n, "eps", 1e-8);
  h[3] = kl_attr_float(n, "weight_decay", 0);
  h[4] = kl_attr_float(n, "momentum", 0);
  h[5] = (double)kl_attr_int(n, "nesterov", 0);
}

int kl_eval_OPTIM_STEP(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  (void)err;
  optim_algo a;
  algo_of(n, &a);
  int ns = kl_optim_state_count(n), per = 2 + ns;
  int64_t count = kl_attr_int(n, "count", 0);
  double h[6];
  kl_optim_hyper(n, h);
  double lr = in[0]->data[0], bias1 = in[1]->data[0], bias2 = in[2]->data[0];
  double mult = in[3]->data[0];
  bool ok = in[4]->data[0] != 0;
  for (int64_t t = 0; t < count; t++) {
    kl_tensor *const *ti = in + STEP_SCALARS + t * per;
    kl_tensor **to = out + t * (1 + ns);
    for (int64_t i = 0; i < ti[0]->numel; i++) {
      double p = ti[0]->data[i], s[2] = {0, 0};
      for (int k = 0; k < ns; k++) s[k] = ti[2 + k]->data[i];
      /* the gradient as the kernels see it: rounded to the param's type */
      if (ok) step_element(a, h, lr, bias1, bias2, ti[1]->data[i] * mult, &p, s);
      to[0]->data[i] = p;
      for (int k = 0; k < ns; k++) to[1 + k]->data[i] = s[k];
    }
  }
  return 0;
}

int kl_infer_SUM_SQUARES(kl_node *n, kl_error *err) {
  char sv[300];
  kl_dtype t = n->inputs[0]->dtype;
  for (int i = 0; i < n->ninputs; i++)
    if (!kl_dtype_is_float(n->inputs[i]->dtype) || kl_dtype_size(n->inputs[i]->dtype) > 8 ||
        (n->inputs[i]->dtype == KL_F64) != (t == KL_F64))
      return KL_NODE_FAIL(n, err, "input %d must be a float tensor like input 0 (f64 with f64), got %s",
                          i, kl_value_str(n->inputs[i], sv, sizeof sv));
  kl_shape scalar = {0, {0}};
  kl_set_output(n, 0, t == KL_F64 ? KL_F64 : KL_F32, &scalar);
  return 0;
}

int kl_eval_SUM_SQUARES(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  (void)err;
  double s = 0;
  for (int i = 0; i < n->ninputs; i++)
    for (int64_t k = 0; k < in[i]->numel; k++) s += in[i]->data[k] * in[i]->data[k];
  out[0]->data[0] = s;
  return 0;
}

/* ---- the gradient exchange of data-parallel training --------------------- */
int kl_infer_ALL_REDUCE(kl_node *n, kl_error *err) {
  char sv[300];
  if (n->noutputs != n->ninputs)
    return KL_NODE_FAIL(n, err, "%d outputs for %d inputs: one sum per input", n->noutputs, n->ninputs);
  for (int i = 0; i < n->ninputs; i++) {
    const kl_value *g = n->inputs[i];
    if (g->dtype != KL_F32 && g->dtype != KL_F64)
      return KL_NODE_FAIL(n, err, "input %d must be f32 or f64 (gradients are exchanged at full "
                          "precision), got %s", i, kl_value_str(g, sv, sizeof sv));
    kl_set_output(n, i, g->dtype, &g->shape);
  }
  return 0;
}

int kl_eval_ALL_REDUCE(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  (void)err;
  for (int i = 0; i < n->ninputs; i++)
    memcpy(out[i]->data, in[i]->data, (size_t)in[i]->numel * sizeof *in[i]->data);
  return 0;
}

int kl_infer_ALL_REDUCE_WAIT(kl_node *n, kl_error *err) {
  char sv[300];
  const kl_value *s = n->inputs[0], *g = n->inputs[1];
  if (!s->producer || s->producer->op != KL_OP_ALL_REDUCE)
    return KL_NODE_FAIL(n, err, "input 0 must be an output of all_reduce, got %s",
                        kl_value_str(s, sv, sizeof sv));
  if (g->dtype != s->dtype || !kl_shape_equal(&g->shape, &s->shape))
    return KL_NODE_FAIL(n, err, "input 1 (the source) must match input 0, got %s",
                        kl_value_str(g, sv, sizeof sv));
  kl_set_output(n, 0, s->dtype, &s->shape);
  return 0;
}

int kl_eval_ALL_REDUCE_WAIT(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  (void)n, (void)err;
  memcpy(out[0]->data, in[0]->data, (size_t)in[0]->numel * sizeof *in[0]->data);
  return 0;
}
