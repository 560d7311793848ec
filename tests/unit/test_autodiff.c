/* test_autodiff.c - reverse-mode gradients checked against central finite
 * differences computed with the interpreter (f64, so the check is tight).
 * One row of `cases` per op with a rule (ir/grads.def), more where an op
 * has attributes or modes that take another path; the last test fails if
 * an op with a rule has no row. */
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

/* A gradient check: `src` is a .kl model whose f64 inputs are the
 * variables; output 0 is the function.  Every input element is drawn
 * uniformly from [lo, hi) ([0.5, 1.5) when both are 0): choose a range
 * away from kinks and ties (relu at 0, equal maxima), where finite
 * differences are the gradient.  Index inputs are consts in the source. */
typedef struct {
  const char *name;
  const char *src;
  double lo, hi;
} grad_case;

/* Ops that appear in a case that ran. */
static bool exercised[KL_OP_COUNT];
static int cases_run;

/* sum(output 0 * w) at the given inputs: a weighted sum, so each output
 * element has its own adjoint (a plain sum would hide rules that mix
 * elements up, and softmax's gradient of a sum is 0). */
static double eval_weighted(const kl_graph *g, kl_tensor **in, const double *w) {
  kl_tensor *out[16];
  kl_error err;
  if (kl_interpret(g, in, out, &err)) fail_msg("interpreter: %s", err.msg);
  double s = 0;
  for (int64_t i = 0; i < out[0]->numel; i++) s += out[0]->data[i] * w[i];
  for (int k = 0; k < g->outputs.len; k++) kl_tensor_free(out[k]);
  return s;
}

static void check_gradients_in(const char *src, double lo, double hi) {
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!g) fail_msg("%s\n%s", src, err.msg);
  for (int i = 0; i < g->nodes.len; i++) exercised[g->nodes.items[i]->op] = true;
  if (lo == 0 && hi == 0) lo = 0.5, hi = 1.5;
  int nin = g->inputs.len;
  assert_true(nin <= 8);
  kl_tensor *in[8];
  kl_rng r;
  kl_rng_seed(&r, 11);
  for (int i = 0; i < nin; i++) {
    in[i] = kl_tensor_new(g->inputs.items[i]->dtype, &g->inputs.items[i]->shape);
    for (int64_t k = 0; k < in[i]->numel; k++) in[i]->data[k] = lo + (hi - lo) * kl_rng_uniform(&r);
  }
  /* The weights of the sum, in [-1, 1), are the seed of the reverse pass. */
  kl_value *y = g->outputs.items[0];
  int64_t ny = kl_shape_numel(&y->shape);
  double *w = malloc(sizeof *w * (size_t)(ny ? ny : 1));
  assert_non_null(w);
  for (int64_t k = 0; k < ny; k++) w[k] = 2 * kl_rng_uniform(&r) - 1;
  kl_value *seed = kl_graph_add_const_data(g, "grad_seed", KL_F64, &y->shape, w, y->loc);
  assert_non_null(seed);
  /* Differentiate with respect to every input; the gradients become extra
   * outputs of the same graph. */
  kl_value *grads[8];
  if (kl_autodiff_seeded(g, y, seed, g->inputs.items, nin, grads, &err))
    fail_msg("%s\nautodiff: %s", src, err.msg);
  for (int i = 0; i < nin; i++) kl_graph_mark_output(g, grads[i], &err);
  if (kl_verify(g, &err)) fail_msg("%s\nverify: %s", src, err.msg);
  kl_tensor *out[24];
  if (kl_interpret(g, in, out, &err)) fail_msg("%s\ninterpreter: %s", src, err.msg);
  int nout = g->outputs.len;
  const double h = 1e-6;
  for (int i = 0; i < nin; i++) {
    const kl_tensor *gr = out[nout - nin + i];
    assert_int_equal(gr->numel, in[i]->numel);
    for (int64_t k = 0; k < in[i]->numel; k++) {
      double keep = in[i]->data[k];
      in[i]->data[k] = keep + h;
      double up = eval_weighted(g, in, w);
      in[i]->data[k] = keep - h;
      double down = eval_weighted(g, in, w);
      in[i]->data[k] = keep;
      double numeric = (up - down) / (2 * h);
      if (!(fabs(numeric - gr->data[k]) <= 1e-5 * (1 + fabs(numeric))))
        fail_msg("%s\ninput %d element %lld: autodiff %.10g, finite difference %.10g", src, i,
                 (long long)k, gr->data[k], numeric);
    }
  }
  for (int k = 0; k < nout; k++) kl_tensor_free(out[k]);
  for (int i = 0; i < nin; i++) kl_tensor_free(in[i]);
  free(w);
  kl_graph_free(g);
  cases_run++;
}


/* ---- the cases ------------------------------------------------------- */
#define A23 "input a: f64[2, 3]\n"
static const grad_case cases[] = {
    /* elementwise arithmetic and activations (ir/ops_elementwise.c) */
    {"arith", A23 "input b: f64[2, 3]\n"
              "output y = (a + b) * a - b / (a + 1.5) + exp(a) * log(b) - sqrt(a * b)\n", 0, 0},
    {"broadcast", A23 "input b: f64[3]\ninput c: f64[2, 1]\noutput y = a * b + c / b - c\n", 0, 0},
    {"unary", "input a: f64[6]\noutput y = tanh(a) * sigmoid(a) + relu(a - 1.0) - -a + rsqrt(a)"
              " + reciprocal(a) + silu(a) + leaky_relu(a - 1.0, alpha=0.2) + abs(a - 1.0)\n", 0, 0},
    {"cast", A23 "output y = cast(a * a, to=f64) * a\n", 0, 0},
    {"max_min", A23 "input b: f64[3]\ninput c: f64[2, 1]\n"
                "output y = maximum(a, b) * 2.0 - minimum(a, c)\n", 0, 0},
    {"where", A23 "input b: f64[2, 3]\ninput c: f64[3]\noutput y = where(a > b, a * b, a - c)\n", 0, 0},
    {"pow", A23 "input b: f64[3]\noutput y = pow(a, b) + pow(b, 3.0)\n", 0, 0},
    {"pow_negative_base", A23 "input b: f64[2, 3]\nconst e: f64[3] = values([2, 3, -1])\n"
                          "output y = pow(a - 2.0, e) * b\n", 0, 0},
    {"erf_gelu", "input a: f64[8]\noutput y = erf(a) + gelu(a) * 2.0 + gelu(a * 0.5, approximate=tanh)\n",
     -2, 2},
    {"swish_mish", "input a: f64[8]\noutput y = swish(a, alpha=0.7) + mish(a) * 0.5 + swish(a)\n", -2, 2},
    {"softplus_elu", "input a: f64[8]\noutput y = softplus(a) + elu(a, alpha=0.5) * 2.0 + elu(a)\n", -2, 2},
    /* float math (ir/ops_math.c) */
    {"trig", "input a: f64[6]\noutput y = sin(a) + cos(a) * 2.0 + tan(a) * 0.5 + atan(a) - sinh(a)"
             " + cosh(a) * 0.3 + asinh(a) + acosh(a + 1.0)\n", 0, 0},
    {"inverse_trig", "input a: f64[6]\noutput y = asin(a) + acos(a) * 2.0 + atanh(a) * 0.5\n", -0.9, 0.9},
    {"piecewise_constant", "input a: f64[6]\noutput y = floor(a * 3.0) * a + ceil(a * 3.0) * a"
                           " + round(a * 3.0) * a + sign(a - 1.0) * a + floor(a)\n", 0, 0},
    {"mod", A23 "input b: f64[3]\noutput y = mod(a * 3.0, b) + mod(a * -3.0, b) * 2.0"
            " + mod(a * -3.0, b, fmod=1) * 0.5\n", 0, 0},
    /* the last matrix is singular (two equal rows): cofactors need no inverse */
    {"det", "input a: f64[2, 3, 3]\ninput b: f64[2, 2]\ninput u: f64[1, 1]\ninput r: f64[1, 3]\n"
            "input q: f64[1, 3]\n"
            "output y = concat(det(a), reshape(det(b), shape=[1]), reshape(det(u), shape=[1]),"
            " reshape(det(concat(r, q, r, axis=0)), shape=[1]), axis=0)\n", -1, 1},
    /* reductions and scans (ir/ops_reduce.c) */
    {"reduce_sum_mean", "input a: f64[2, 3, 2]\n"
                        "output y = reduce_sum(a, axes=[1], keepdims=true) * reduce_mean(a, axes=[1])\n", 0, 0},
    {"reduce_max_min", "input a: f64[2, 3, 2]\n"
                       "output y = reduce_max(a, axes=[1], keepdims=true) + reduce_min(a, axes=[0, 2], keepdims=true)"
                       " + reduce_max(a)\n", -1, 1},
    {"reduce_prod", "input a: f64[2, 3, 2]\n"
                    "output y = reduce_prod(a, axes=[0, 1]) + reduce_prod(a, axes=[1], keepdims=true)\n", 0, 0},
    {"reduce_prod_zero", "input a: f64[2, 3]\nconst z: f64[2, 3] = values([1, 0, 1, 1, 1, 0])\n"
                         "output y = reduce_prod(a * z, axes=[1], keepdims=true) + reduce_prod(a, axes=[0])\n", 0, 0},
    {"cumsum", "input a: f64[2, 4]\noutput y = cumsum(a, axis=1) + cumsum(a, axis=1, exclusive=1, reverse=1)"
               " * 2.0 + cumsum(a, axis=0, reverse=1)\n", 0, 0},
    {"cumprod", "input a: f64[2, 4]\noutput y = cumprod(a, axis=1) + cumprod(a, axis=1, exclusive=1) * 2.0"
                " + cumprod(a, axis=-1, exclusive=1, reverse=1) + cumprod(a, axis=0, reverse=1)\n", 0, 0},
    {"topk", "input a: f64[3, 4]\nlet v, i = topk(a, k=2)\nlet w, j = topk(a, k=2, axis=0, largest=0)\n"
             "output y = concat(reshape(v * v, shape=[6]), reshape(w, shape=[8]), axis=0)\n", 0, 0},
    /* normalisations and losses (ir/ops_nn.c) */
    {"softmax", A23 "output y = softmax(a, axis=0) + log_softmax(a * 2.0, axis=1)\n", 0, 0},
    {"cross_entropy", "input a: f64[3, 4]\nconst l: i64[3] = values([1, 3, 0])\n"
                      "output y = cross_entropy(a, l)\n", 0, 0},
    {"cross_entropy_probs", "input a: f64[3, 4]\ninput p: f64[3, 4]\n"
                            "output y = cross_entropy(a * 2.0, p, reduction=\"sum\")\n", 0, 0},
    {"cross_entropy_none", "input a: f64[2, 3, 2]\nconst l: i64[2, 2] = values([0, 2, 1, 1])\n"
                           "output y = cross_entropy(a, l, axis=1, reduction=\"none\")\n", 0, 0},
    {"layer_norm", "input x: f64[2, 3, 4]\ninput s: f64[4]\ninput b: f64[3, 4]\n"
                   "output y = layer_norm(x, s, b, axis=1, epsilon=0.001)\n", 0, 0},
    {"layer_norm_plain", "input x: f64[3, 5]\noutput y = layer_norm(x) * x\n", 0, 0},
    {"rms_norm", "input x: f64[2, 3, 4]\ninput s: f64[3, 1]\n"
                 "output y = rms_norm(x, s, axis=1) + rms_norm(x, epsilon=0.01)\n", 0, 0},
    {"batch_norm", "input x: f64[2, 3, 2, 2]\ninput s: f64[3]\ninput b: f64[3]\ninput m: f64[3]\n"
                   "input v: f64[3]\noutput y = batch_norm(x, s, b, m, v, epsilon=0.01)\n", 0, 0},
    /* training mode, as the ONNX front end writes it: the batch's own
     * statistics as the mean and var inputs */
    {"batch_norm_training", "input x: f64[2, 3, 2, 2]\ninput s: f64[3]\ninput b: f64[3]\n"
                            "let m = reduce_mean(x, axes=[0, 2, 3])\n"
                            "let d = x - reshape(m, shape=[1, 3, 1, 1])\n"
                            "let v = reduce_mean(d * d, axes=[0, 2, 3])\n"
                            "output y = batch_norm(x, s, b, m, v)\n", 0, 0},
    {"nll_loss", "input x: f64[3, 4]\ninput w: f64[4]\nconst t: i64[3] = values([1, 3, 0])\n"
                 "output y = nll_loss(x, t, w, ignore_index=3) + nll_loss(x * x, t, w)\n", 0, 0},
    {"nll_loss_sum", "input x: f64[3, 4]\ninput w: f64[4]\nconst t: i32[3] = values([1, 3, 1])\n"
                     "output y = nll_loss(x, t, w, reduction=\"sum\", ignore_index=0)"
                     " + nll_loss(x, t, reduction=\"sum\")\n", 0, 0},
    {"nll_loss_none", "input x: f64[2, 3, 2]\ninput w: f64[3]\nconst t: i64[2, 2] = values([0, 2, 1, 2])\n"
                      "output y = nll_loss(x, t, w, reduction=\"none\", ignore_index=1)\n", 0, 0},
    {"rotary", "input x: f64[2, 2, 3, 6]\ninput c: f64[2, 3, 2]\ninput s: f64[2, 3, 2]\n"
               "output y = rotary(x, c, s, rotary_dim=4) + rotary(x, c, s, interleaved=1, rotary_dim=4)\n",
     -1, 1},
    {"rotary_packed", "input x: f64[2, 3, 8]\ninput c: f64[3, 2]\ninput s: f64[3, 2]\n"
                      "output y = rotary(x, c, s, num_heads=2) * rotary(x, c * c, s, num_heads=2, interleaved=1)\n",
     -1, 1},
    /* contractions and windows (ir/ops_contract.c) */
    {"matmul", "input a: f64[2, 3]\ninput w: f64[3, 4]\ninput v: f64[4]\n"
               "output y = reduce_sum(reshape(relu(a @ w + v), shape=[8]) * 2.0, axes=[0])\n", 0, 0},
    {"matmul_batched", "input a: f64[2, 2, 3]\ninput w: f64[3, 2]\ninput v: f64[2]\ninput u: f64[3]\n"
                       "output y = reduce_sum(a @ w, axes=[1], keepdims=true) + (a @ w) @ v + u @ w\n", 0, 0},
    {"gemm", "input a: f64[3, 2]\ninput b: f64[4, 3]\ninput c: f64[4]\n"
             "output y = gemm(a, b, c, alpha=0.5, beta=2.0, trans_a=1, trans_b=1)\n", 0, 0},
    {"conv2d", "input x: f64[2, 2, 5, 5]\ninput w: f64[3, 2, 3, 3]\ninput b: f64[3]\n"
               "output y = concat(reshape(conv2d(x, w, b, strides=[2, 2], pads=[1, 0, 1, 1]), shape=[-1]),"
               " reshape(conv2d(x, w, b, dilations=[2, 1], pads=[1, 1, 0, 1]), shape=[-1]), axis=0)\n", 0, 0},
    {"conv2d_groups", "input x: f64[1, 4, 5, 5]\ninput w: f64[6, 2, 3, 3]\ninput b: f64[6]\n"
                      "output y = conv2d(x, w, b, groups=2, strides=[2, 1], pads=[1, 1, 1, 1])\n", 0, 0},
    {"conv2d_depthwise", "input x: f64[2, 3, 4, 4]\ninput w: f64[3, 1, 3, 3]\n"
                         "output y = conv2d(x, w, groups=3, dilations=[1, 2], pads=[1, 1, 1, 2])\n", 0, 0},
    {"conv2d_weight_grad", "input x: f64[2, 4, 5, 5]\ninput dy: f64[2, 6, 3, 4]\n"
                           "output y = conv2d_weight_grad(x, dy, kernel=[3, 2], strides=[2, 1],"
                           " pads=[1, 1, 1, 0], groups=2)\n", 0, 0},
    {"conv2d_weight_grad_wide", "input x: f64[1, 2, 4, 4]\ninput dy: f64[1, 3, 4, 5]\n"
                                "output y = conv2d_weight_grad(x, dy, kernel=[2, 2], dilations=[2, 1])\n", 0, 0},
    {"conv_transpose2d", "input x: f64[2, 2, 3, 3]\ninput w: f64[2, 3, 3, 3]\ninput b: f64[3]\n"
                         "output y = conv_transpose2d(x, w, b, strides=[2, 2], pads=[1, 0, 1, 1],"
                         " output_padding=[1, 0])\n", 0, 0},
    {"conv_transpose2d_groups", "input x: f64[1, 4, 3, 3]\ninput w: f64[4, 1, 2, 2]\n"
                                "output y = conv_transpose2d(x, w, groups=2, dilations=[2, 1])\n", 0, 0},
    {"attention", "input q: f64[2, 4, 3, 2]\ninput k: f64[2, 2, 5, 2]\ninput v: f64[2, 2, 5, 3]\n"
                  "input m: f64[3, 4]\n"
                  "output y = attention(q, k * 2.0, v, m, scale=0.7, softcap=1.5)\n", -1, 1},
    {"attention_causal", "input q: f64[2, 2, 3, 2]\ninput k: f64[2, 1, 4, 2]\ninput v: f64[2, 1, 4, 2]\n"
                         "const m: bool[2, 1, 1, 4] = values([1, 1, 0, 1, 1, 1, 1, 1])\n"
                         "const l: i64[2] = values([4, 3])\n"
                         "output y = attention(q, k, v, m, l, causal=1) + attention(q, k, v, past=1,"
                         " window_left=1, causal=1)\n", -1, 1},
    {"linear_attention", "input q: f64[2, 3, 4]\ninput k: f64[2, 3, 2]\ninput v: f64[2, 3, 6]\n"
                         "input s: f64[2, 1, 2, 6]\n"
                         "let y1, st1 = linear_attention(q, k, v, q_heads=2, kv_heads=1, rule=linear)\n"
                         "let y2, st2 = linear_attention(q, k, v, s, q_heads=2, kv_heads=1, rule=linear,"
                         " past=1, scale=0.3)\n"
                         "output y = concat(reshape(y1, shape=[-1]), reshape(st2 * st2, shape=[-1]),"
                         " reshape(y2, shape=[-1]), axis=0)\n", -1, 1},
    {"deform_conv2d", "input x: f64[1, 4, 4, 5]\ninput w: f64[4, 2, 2, 2]\ninput o: f64[1, 16, 4, 4]\n"
                      "input b: f64[4]\ninput m: f64[1, 8, 4, 4]\n"
                      "output y = deform_conv2d(x, w, o * 3.0 - 2.0, b, m, groups=2, offset_groups=2,"
                      " pads=[1, 0, 0, 1], dilations=[1, 2])\n", 0.1, 0.9},
    {"deform_conv2d_plain", "input x: f64[2, 2, 5, 5]\ninput w: f64[3, 2, 3, 3]\ninput o: f64[2, 18, 2, 2]\n"
                            "output y = deform_conv2d(x, w, o, strides=[2, 2])\n", -0.9, 0.9},
    {"pools", "input x: f64[1, 2, 5, 5]\n"
              "output y = max_pool2d(x, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])"
              " + avg_pool2d(x, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)"
              " * global_avg_pool(x)\n", 0, 0},
    {"avg_pool_excluding_pad", "input x: f64[2, 1, 5, 6]\n"
                               "output y = avg_pool2d(x, kernel=[3, 2], strides=[2, 3], pads=[1, 1, 2, 0])\n", 0, 0},
    {"pools_ceil_mode", "input x: f64[1, 2, 5, 5]\n"
                        "output y = concat(reshape(avg_pool2d(x, kernel=[2, 3], strides=[2, 2], ceil_mode=1),"
                        " shape=[-1]), reshape(avg_pool2d(x, kernel=[3, 2], strides=[3, 2], pads=[1, 0, 0, 1],"
                        " ceil_mode=1, count_include_pad=1), shape=[-1]),"
                        " reshape(max_pool2d(x, kernel=[2, 2], ceil_mode=1), shape=[-1]), axis=0)\n", 0, 0},
    {"avg_pool_dilated", "input x: f64[1, 1, 6, 6]\n"
                         "output y = avg_pool2d(x, kernel=[2, 2], strides=[1, 2], dilations=[2, 2],"
                         " pads=[1, 1, 1, 1])\n", 0, 0},
    {"col2im", "input x: f64[2, 8, 12]\n"
               "output y = col2im(x, image_shape=[4, 5], block_shape=[2, 2], strides=[2, 1],"
               " pads=[1, 0, 1, 1], dilations=[1, 2])\n", 0, 0},
    {"dft", "input r: f64[2, 5, 3, 1]\ninput z: f64[2, 6, 2]\n"
            "output y = concat(reshape(dft(r, axis=1), shape=[-1]), reshape(dft(r, axis=1, onesided=1,"
            " length=7), shape=[-1]), reshape(dft(z, axis=1, inverse=1), shape=[-1]),"
            " reshape(dft(z, axis=1, inverse=1, onesided=1), shape=[-1]),"
            " reshape(dft(z, axis=-2, length=4), shape=[-1]), axis=0)\n", -1, 1},
    /* data movement (ir/ops_movement.c) */
    {"shapes", "input a: f64[2, 3]\ninput b: f64[2, 1]\n"
               "output y = transpose(reshape(a, shape=[3, 2]), perm=[1, 0]) * flatten(a, axis=1)"
               " + squeeze(unsqueeze(a, axes=[0]), axes=[0]) - expand(b, shape=[3, 2, 3])\n", 0, 0},
    {"concat", "input a: f64[2, 3]\ninput b: f64[2, 1]\ninput c: f64[2, 2]\n"
               "output y = concat(a, b, c * c, a, axis=1)\n", 0, 0},
    {"split", "input a: f64[2, 5]\nlet p, q, r = split(a, axis=1, sizes=[2, 1, 2])\n"
              "output y = p * 2.0 + r * r\n", 0, 0},
    {"slice", "input a: f64[4, 5]\n"
              "output y = slice(a, starts=[1, -1], ends=[3, -6], axes=[0, 1], steps=[1, -2])"
              " + slice(a, starts=[0, 1], ends=[10, 4], steps=[3, 1])\n", 0, 0},
    {"slice_steps", "input a: f64[3, 7]\noutput y = slice(a, starts=[5, 1], ends=[0, 1000], axes=[1, 0], "
                    "steps=[-2, 2])\n", 0, 0},
    {"gather", "input a: f64[2, 3, 2]\nconst i: i64[2, 2] = values([0, 2, 2, -1])\n"
               "const k: i32[3] = values([1, -2, 1])\n"
               "output y = concat(reshape(gather(a, i, axis=1), shape=[16]),"
               " reshape(gather(a, k, axis=-1), shape=[18]), axis=0)\n", 0, 0},
    {"gather_elements", "input a: f64[3, 3]\nconst i: i32[2, 3] = values([0, 2, 1, 2, 2, -3])\n"
                        "output y = gather_elements(a, i) + gather_elements(a, i, axis=1)\n", 0, 0},
    {"gather_nd", "input a: f64[3, 2, 2]\nconst i: i64[3, 2] = values([0, 1, 2, 0, 0, 1])\n"
                  "output y = gather_nd(a, i)\n", 0, 0},
    {"gather_nd_batch", "input a: f64[2, 3, 2, 2]\nconst i: i32[2, 3, 1] = values([1, 0, -1, 0, 1, 1])\n"
                        "const j: i64[2, 3, 2, 2] = values([0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 1,"
                        " 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0])\n"
                        "output y = concat(reshape(gather_nd(a, i, batch_dims=2), shape=[-1]),"
                        " reshape(gather_nd(a, j, batch_dims=2), shape=[-1]), axis=0)\n", 0, 0},
    {"scatter_elements", "input a: f64[3, 3]\ninput u: f64[2, 3]\n"
                         "const i: i64[2, 3] = values([0, 2, 1, 2, 0, 0])\n"
                         "output y = scatter_elements(a, i, u) * scatter_elements(a, i, u * u, reduction=\"add\")\n", 0, 0},
    {"scatter_nd", "input a: f64[4, 2]\ninput u: f64[2, 2]\nconst i: i64[2, 1] = values([1, 3])\n"
                   "output y = scatter_nd(a, i, u) * scatter_nd(a, i, u * u, reduction=\"add\")\n", 0, 0},
    {"pad", "input a: f64[2, 3]\noutput y = pad(a, pads=[1, -1, 0, 2], value=0.5) * 2.0\n", 0, 0},
    {"pad_modes", "input a: f64[3, 4]\n"
                  "output y = concat(reshape(pad(a, pads=[2, 1, 1, 3], mode=reflect), shape=[-1]),"
                  " reshape(pad(a, pads=[1, -1, 3, 2], mode=edge), shape=[-1]),"
                  " reshape(pad(a, pads=[4, 0, -1, 6], mode=wrap), shape=[-1]), axis=0)\n", 0, 0},
    /* sampling (ir/ops_sample.c) */
    {"resize", "input a: f64[1, 2, 3, 4]\n"
               "output y = concat(reshape(resize(a, sizes=[1, 2, 6, 7], mode=linear), shape=[-1]),"
               " reshape(resize(a, sizes=[1, 2, 2, 9], mode=nearest, nearest_mode=floor,"
               " coordinate_transformation_mode=asymmetric), shape=[-1]),"
               " reshape(resize(a, sizes=[1, 2, 5, 3], mode=cubic, coordinate_transformation_mode=align_corners,"
               " exclude_outside=1), shape=[-1]), axis=0)\n", 0, 0},
    {"resize_antialias_crop", "input a: f64[2, 9, 8]\n"
                              "output y = concat(reshape(resize(a, sizes=[2, 4, 3], mode=linear, antialias=1),"
                              " shape=[-1]), reshape(resize(a, sizes=[2, 5, 4], mode=linear,"
                              " coordinate_transformation_mode=tf_crop_and_resize,"
                              " roi=[0, -0.2, 0.1, 1, 0.9, 1.3], extrapolation_value=3.0), shape=[-1]),"
                              " axis=0)\n", 0, 0},
    {"grid_sample", "input x: f64[2, 2, 3, 4]\ninput g: f64[2, 2, 3, 2]\n"
                    "output y = concat(grid_sample(x, g), grid_sample(x, g, padding_mode=border, align_corners=1),"
                    " grid_sample(x, g * 1.7, padding_mode=reflection),"
                    " grid_sample(x, g * 2.9, padding_mode=reflection, align_corners=1),"
                    " grid_sample(x, g * 1.5, padding_mode=zeros, align_corners=1), axis=1)\n", -1.3, 1.3},
    {"grid_sample_nearest_3d", "input x: f64[1, 2, 2, 3, 4]\ninput g: f64[1, 2, 2, 2, 3]\n"
                               "output y = grid_sample(x, g, mode=nearest, padding_mode=reflection) * 2.0"
                               " + grid_sample(x, g * g, padding_mode=border) + grid_sample(x, g)\n", -1.2, 1.2},
    {"grid_sample_cubic", "input x: f64[1, 2, 4, 5]\ninput g: f64[1, 3, 2, 2]\n"
                          "output y = concat(grid_sample(x, g, mode=cubic), grid_sample(x, g * 1.6, mode=cubic,"
                          " padding_mode=border, align_corners=1), grid_sample(x, g * 2.2, mode=cubic,"
                          " padding_mode=reflection), axis=1)\n", -1.2, 1.2},
    {"roi_align", "input x: f64[2, 2, 5, 6]\ninput r: f64[3, 4]\nconst i: i64[3] = values([1, 0, 1])\n"
                  "const k: f64[3, 4] = values([0.5, -0.7, 3, 2.5, 2.1, 1.2, 4.4, 5.3, 5.6, 0.3, 6.8, 3.9])\n"
                  "output y = concat(reshape(roi_align(x, r * 2.0 + k, i, output_height=2, output_width=3,"
                  " sampling_ratio=2), shape=[-1]), reshape(roi_align(x, r + k, i, output_height=3,"
                  " output_width=2, sampling_ratio=1, spatial_scale=0.8,"
                  " coordinate_transformation_mode=output_half_pixel), shape=[-1]), axis=0)\n", 0.1, 0.9},
    {"grid_sample_1d", "input x: f64[2, 3, 5]\ninput g: f64[2, 4, 1]\n"
                       "output y = grid_sample(x, g) + grid_sample(x, g, mode=nearest)\n", -1.2, 1.2},
    {"trilu", "input a: f64[3, 4]\noutput y = trilu(a, upper=0, k=1) + trilu(a * a)\n", 0, 0},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static void test_case(void **state) {
  const grad_case *c = *state;
  check_gradients_in(c->src, c->lo, c->hi);
}

/* Every op with a rule has been differentiated by some case above. */
static void test_every_rule_is_checked(void **s) {
  (void)s;
  char missing[2000] = "";
  for (int op = 0; op < KL_OP_COUNT; op++)
    if (kl_op_grads[op] && !exercised[op])
      snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", kl_ops[op].name);
  printf("gradient checks: %d cases ran\n", cases_run);
  if (missing[0]) fail_msg("ops with a gradient rule but no case in test_autodiff.c:%s", missing);
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

/* bitcast (between f16 and bf16: floats both sides) has no rule: every
 * such node is named at once. */
static void test_missing_rule_is_an_error(void **s) {
  (void)s;
  const char *src = "input a: f16[2]\ninput b: bf16[2]\nlet p = bitcast(a, to=bf16)\n"
                    "let q = bitcast(b, to=f16)\noutput y = cast(p, to=f32) * cast(q, to=f32)\n";
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  assert_false(kl_op_grads[KL_OP_BITCAST]);
  kl_value *grads[2];
  assert_int_equal(kl_autodiff(g, g->outputs.items[0], g->inputs.items, 2, grads, &err), -1);
  assert_non_null(strstr(err.msg, "no gradient for "));
  assert_non_null(strstr(err.msg, "bitcast (node 'p')"));
  assert_non_null(strstr(err.msg, "bitcast (node 'q')"));
  kl_graph_free(g);
}

/* A rule that cannot take a node's attributes says why, naming the node. */
static void test_rule_refusal_names_the_node(void **s) {
  (void)s;
  const char *src = "input a: f64[3, 3]\ninput u: f64[1, 3]\nconst i: i64[1, 3] = values([0, 2, 1])\n"
                    "output y = scatter_elements(a, i, u, reduction=\"mul\")\n";
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  kl_value *grads[2];
  assert_int_equal(kl_autodiff(g, g->outputs.items[0], g->inputs.items, 2, grads, &err), -1);
  assert_non_null(strstr(err.msg, "no gradient for scatter_elements (node 'y'): reduction \"mul\""));
  kl_graph_free(g);
}

int main(void) {
  static struct CMUnitTest tests[NCASES + 4];
  int n = 0;
  for (int i = 0; i < NCASES; i++)
    tests[n++] = (struct CMUnitTest){cases[i].name, test_case, NULL, NULL, (void *)&cases[i]};
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_unrelated_input_gets_zeros);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_missing_rule_is_an_error);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_rule_refusal_names_the_node);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_every_rule_is_checked);
  return _cmocka_run_group_tests("autodiff", tests, (size_t)n, NULL, NULL);
}
