/* test_fusion.c - the fusion groups and step kinds the passes choose on
 * small hand-built graphs: each kind of group forms (elementwise, rows,
 * direct convolution, direct GEMM, GEMM with its epilogue, attention, a
 * view a GEMM reads through), and fusion refuses where it must (a row
 * group's consumer of another shape, rows of another length, a cycle
 * through a GEMM, elementwise nodes of different shapes, a direct
 * convolution reading its own group's values, a reshape no view can
 * express, --no-fuse).  Every plan's memory passes kl_memplan_check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../../codegen/codegen.h"
#include "../../frontend/frontend.h"
#include "../../passes/passes.h"

typedef struct {
  kl_graph *g;
  kl_plan plan;
} planned;

/* Parse src and plan it (fused unless no_fuse); the memory plan is
 * checked. */
static void plan_for(planned *t, const char *src, bool no_fuse, const kl_target *target) {
  kl_error err;
  t->g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!t->g) fail_msg("%s", err.msg);
  kl_pipeline_options po = {.target = target, .no_fuse = no_fuse};
  if (kl_pipeline(t->g, &po, &t->plan, &err)) {
    kl_plan_free(&t->plan);
    kl_graph_free(t->g);
    fail_msg("pipeline: %s", err.msg);
  }
  char msg[512];
  if (kl_memplan_check(t->plan.bufs, t->plan.nbufs, t->plan.mem.arena, msg, sizeof msg))
    fail_msg("memory plan: %s", msg);
}

static void plan_src(planned *t, const char *src, bool no_fuse) { plan_for(t, src, no_fuse, &kl_cg_target); }

static void done(planned *t) {
  kl_plan_free(&t->plan);
  kl_graph_free(t->g);
}

/* The node that makes the value called name. */
static const kl_node *node(const planned *t, const char *name) {
  const kl_value *v = kl_graph_find_value(t->g, name);
  if (!v || !v->producer) fail_msg("no node makes '%s'", name);
  return v->producer;
}

static int group(const planned *t, const char *name) {
  int g = t->plan.fusion.group_of[node(t, name)->id];
  if (g < 0) fail_msg("'%s' is in no group", name);
  return g;
}

static const kl_group *group_at(const planned *t, const char *name) {
  return &t->plan.fusion.groups[group(t, name)];
}

static kl_step_kind step(const planned *t, const char *name) {
  return kl_plan_step_kind(&t->plan, group(t, name));
}

/* ---- each kind of group forms ------------------------------------------- */

static void test_elementwise_chain(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 8]\n"
           "let a = x * 2.0\n"
           "let b = a + 1.0\n"
           "output y = relu(b)\n",
           false);
  assert_int_equal(group(&t, "a"), group(&t, "b"));
  assert_int_equal(group(&t, "a"), group(&t, "y"));
  assert_int_equal(group_at(&t, "y")->kind, KL_GROUP_ELEMENTWISE);
  assert_int_equal(group_at(&t, "y")->count, 3);
  assert_int_equal(step(&t, "y"), KL_STEP_ELEMENTWISE);
  /* a and b live in registers: only the output is stored */
  assert_false(t.plan.fusion.stored[kl_graph_find_value(t.g, "a")->id]);
  assert_false(t.plan.fusion.stored[kl_graph_find_value(t.g, "b")->id]);
  assert_true(t.plan.fusion.stored[kl_graph_find_value(t.g, "y")->id]);
  done(&t);
}

static void test_rows_softmax(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 8]\n"
           "let a = x * 2.0\n"
           "let s = softmax(a, axis=-1)\n"
           "output y = s + 1.0\n",
           false);
  assert_int_equal(group(&t, "a"), group(&t, "s"));
  assert_int_equal(group(&t, "s"), group(&t, "y"));
  assert_int_equal(group_at(&t, "s")->kind, KL_GROUP_ROWS);
  assert_int_equal(group_at(&t, "s")->row_axes, 1);
  assert_int_equal(group_at(&t, "s")->count, 3);
  assert_int_equal(step(&t, "s"), KL_STEP_ROWS);
  done(&t);
}

static void test_rows_layer_norm(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 8, 16]\n"
           "let a = x + 1.0\n"
           "let n = layer_norm(a, axis=-2)\n"
           "output y = relu(n)\n",
           false);
  assert_int_equal(group(&t, "a"), group(&t, "n"));
  assert_int_equal(group(&t, "n"), group(&t, "y"));
  assert_int_equal(group_at(&t, "n")->kind, KL_GROUP_ROWS);
  assert_int_equal(group_at(&t, "n")->row_axes, 2);
  assert_int_equal(step(&t, "y"), KL_STEP_ROWS);
  done(&t);
}

/* a - mean(a): the row scalar broadcasts back over its row in the kernel */
static void test_rows_reduce_mean(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 8]\n"
           "let a = x * 3.0\n"
           "let m = reduce_mean(a, axes=[-1], keepdims=1)\n"
           "let c = a - m\n"
           "let m2 = m * 0.5\n"
           "output y = c * c + m2\n",
           false);
  int g = group(&t, "a");
  assert_int_equal(group(&t, "m"), g);
  assert_int_equal(group(&t, "c"), g);
  assert_int_equal(group(&t, "m2"), g); /* a row scalar joins too */
  assert_int_equal(group(&t, "y"), g);
  assert_int_equal(t.plan.fusion.groups[g].kind, KL_GROUP_ROWS);
  assert_int_equal(step(&t, "y"), KL_STEP_ROWS);
  assert_false(t.plan.fusion.stored[kl_graph_find_value(t.g, "m")->id]);
  done(&t);
}

/* K = 4 * 3 * 3 = 36 <= direct_conv_max_k */
static void test_direct_conv(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[2, 4, 8, 8]\n"
           "param w: f32[8, 4, 3, 3] = randn(0.1, seed=1)\n"
           "param s: f32[8] = ones\n"
           "param b: f32[8] = zeros\n"
           "const mu: f32[8] = zeros\n"
           "const var: f32[8] = ones\n"
           "let c = conv2d(x, w, pads=[1, 1, 1, 1])\n"
           "let n = batch_norm(c, s, b, mu, var)\n"
           "output y = relu(n)\n",
           false);
  assert_true(kl_is_direct_conv(node(&t, "c"), &kl_cg_target));
  assert_int_equal(group(&t, "c"), group(&t, "n"));
  assert_int_equal(group(&t, "n"), group(&t, "y"));
  assert_int_equal(group_at(&t, "y")->kind, KL_GROUP_ELEMENTWISE);
  assert_int_equal(group_at(&t, "y")->count, 3);
  assert_int_equal(step(&t, "y"), KL_STEP_DIRECT_CONV);
  done(&t);
}

/* A direct convolution with few outputs for its dot product (128 of
 * K = 576) is summed a warp an output: it keeps its own kernel before a
 * global pool, whose row kernel's lanes are the rows' elements; below the
 * target's split threshold it joins the pool's row kernel. */
static void test_split_conv_keeps_out_of_rows(void **state) {
  (void)state;
  const char *src = "input x: f32[1, 64, 4, 4]\n"
                    "param w: f32[8, 64, 3, 3] = randn(0.05, seed=1)\n"
                    "let c = conv2d(x, w, pads=[1, 1, 1, 1])\n"
                    "let r = relu(c)\n"
                    "output y = reduce_mean(r, axes=[2, 3], keepdims=0)\n";
  planned t;
  plan_src(&t, src, false);
  assert_true(kl_is_split_conv(node(&t, "c"), &kl_cg_target));
  assert_int_equal(group(&t, "c"), group(&t, "r"));
  assert_true(group(&t, "r") != group(&t, "y"));
  done(&t);
  kl_target whole = kl_cg_target;
  whole.direct_conv_split_below = 0;
  plan_for(&t, src, false, &whole);
  assert_false(kl_is_split_conv(node(&t, "c"), &whole));
  assert_true(kl_is_direct_conv(node(&t, "c"), &whole));
  assert_int_equal(group(&t, "c"), group(&t, "y"));
  assert_int_equal(group_at(&t, "y")->kind, KL_GROUP_ROWS);
  done(&t);
}

/* K = 16 <= direct_matmul_max_k, f32, then a GELU no epilogue does */
static void test_direct_gemm(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 16]\n"
           "input w: f32[16, 8]\n"
           "let m = x @ w\n"
           "output y = gelu(m)\n",
           false);
  assert_true(t.plan.direct[node(&t, "m")->id]);
  assert_int_equal(group(&t, "m"), group(&t, "y"));
  assert_int_equal(group_at(&t, "y")->count, 2);
  assert_int_equal(step(&t, "y"), KL_STEP_DIRECT_GEMM);
  assert_false(t.plan.fusion.stored[kl_graph_find_value(t.g, "m")->id]);
  done(&t);
}

/* K = 256: the library's GEMM, taking the bias and the relu */
static void test_gemm_epilogue(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 256]\n"
           "input w: f32[256, 64]\n"
           "input b: f32[64]\n"
           "let m = x @ w\n"
           "let h = m + b\n"
           "output y = relu(h)\n",
           false);
  const kl_node *mm = node(&t, "m");
  assert_false(t.plan.direct[mm->id]);
  assert_ptr_equal(t.plan.epi_bias[mm->id], kl_graph_find_value(t.g, "b"));
  assert_null(t.plan.epi_residual[mm->id]);
  assert_true(t.plan.epi_relu[mm->id]);
  assert_ptr_equal(t.plan.epi_last[mm->id], node(&t, "y"));
  /* three singleton steps: the GEMM runs at its epilogue's end */
  assert_int_not_equal(group(&t, "m"), group(&t, "h"));
  assert_int_not_equal(group(&t, "h"), group(&t, "y"));
  assert_int_equal(step(&t, "m"), KL_STEP_NONE);
  assert_int_equal(step(&t, "h"), KL_STEP_NONE);
  assert_int_equal(step(&t, "y"), KL_STEP_GEMM);
  assert_ptr_equal(kl_plan_epilogue_gemm(&t.plan, node(&t, "y")), mm);
  done(&t);
}

/* The cut-off table: an architecture takes its own row, else the closest
 * older one of its major version, else the defaults; KILN_CUTOFFS overrides
 * a knob and refuses what it does not know. */
static void test_cutoffs(void **state) {
  (void)state;
  unsetenv("KILN_CUTOFFS");
  const kl_target *t = kl_cg_target_for(0);
  assert_int_equal(t->direct_conv_max_k, kl_cg_target.direct_conv_max_k);
  assert_true(t->attention_max_keys == kl_cg_target.attention_max_keys);
  t = kl_cg_target_for(90); /* the H200's measured row */
  assert_int_equal(t->direct_conv_max_k, 2304);
  assert_int_equal(t->attention_max_keys, 0);
  assert_true(t->direct_conv_max_macs == kl_cg_target.direct_conv_max_macs); /* -1: the default */
  assert_int_equal(t->direct_conv_min_outputs_per_k, 16);
  assert_int_equal(t->direct_conv_split_below, kl_cg_target.direct_conv_split_below);
  assert_int_equal(kl_cg_target_for(89)->direct_conv_max_k, kl_cg_target.direct_conv_max_k);
  assert_int_equal(kl_cg_target_for(100)->direct_conv_max_k, kl_cg_target.direct_conv_max_k);
  assert_non_null(strstr(kl_cg_cutoff_source(90), "H200"));
  kl_target o = kl_cg_target;
  char why[300];
  assert_int_equal(kl_cg_apply_cutoffs(&o, "direct_conv_max_k=7, tile_min_blocks=1", why, sizeof why), 0);
  assert_int_equal(o.direct_conv_max_k, 7);
  assert_int_equal(o.tile_min_blocks, 1);
  assert_int_equal(kl_cg_apply_cutoffs(&o, "direct_conv_max_k=x", why, sizeof why), -1);
  assert_non_null(strstr(why, "'direct_conv_max_k' is not NAME=COUNT"));
  assert_int_equal(kl_cg_apply_cutoffs(&o, "warp_size=32", why, sizeof why), -1);
  assert_int_equal(kl_cg_apply_cutoffs(&o, "direct_conv_max_k=-3", why, sizeof why), -1);
  setenv("KILN_CUTOFFS", "direct_conv_max_k=5", 1);
  assert_int_equal(kl_cg_target_for(90)->direct_conv_max_k, 5);
  setenv("KILN_CUTOFFS", "direct_conv_max_k=5,bogus=1", 1); /* refused whole, said once */
  assert_int_equal(kl_cg_target_for(90)->direct_conv_max_k, 2304);
  unsetenv("KILN_CUTOFFS");
}

static void test_attention(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input q: f32[2, 16, 32]\n"
           "input k: f32[2, 32, 16]\n"
           "input v: f32[2, 16, 32]\n"
           "let s = q @ k\n"
           "let c = s * 0.125\n"
           "let p = softmax(c, axis=-1)\n"
           "output o = p @ v\n",
           false);
  const kl_node *qk = node(&t, "s");
  assert_ptr_equal(t.plan.attn[qk->id].softmax, node(&t, "p"));
  assert_ptr_equal(t.plan.attn[qk->id].pv, node(&t, "o"));
  assert_int_equal(t.plan.attn[qk->id].npre, 1);
  assert_int_equal(t.plan.attn[qk->id].npost, 0);
  const char *names[] = {"s", "c", "p", "o"};
  int kernels = 0;
  for (int i = 0; i < 4; i++) {
    assert_ptr_equal(t.plan.attn_head[node(&t, names[i])->id], qk);
    kl_step_kind k = step(&t, names[i]);
    if (k != KL_STEP_NONE) kernels++;
  }
  assert_int_equal(kernels, 1);
  assert_int_equal(step(&t, "o"), KL_STEP_ATTENTION);
  for (int gi = 0; gi < t.plan.fusion.ngroups; gi++)
    if (kl_plan_step_kind(&t.plan, gi) == KL_STEP_ATTENTION) kernels--;
  assert_int_equal(kernels, 0); /* one attention step in the plan */
  done(&t);
}

static void test_transpose_is_a_view(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input a: f32[8, 16]\n"
           "input b: f32[8, 32]\n"
           "let at = transpose(a, perm=[1, 0])\n"
           "output y = at @ b\n",
           false);
  assert_true(t.plan.view_node[node(&t, "at")->id]);
  assert_int_equal(step(&t, "at"), KL_STEP_NONE);
  assert_int_equal(t.plan.loc[kl_graph_find_value(t.g, "at")->id].kind, KL_LOC_VIEW);
  assert_ptr_equal(t.plan.view[kl_graph_find_value(t.g, "at")->id].base,
                   kl_graph_find_value(t.g, "a"));
  assert_int_equal(step(&t, "y"), KL_STEP_GEMM);
  done(&t);
}

/* ---- where fusion refuses ------------------------------------------------ */

/* A row group takes elementwise nodes of its rows' shape or of its row
 * scalars' only: s + z has neither ([4, 16] from a [4, 1] row scalar). */
static void test_rows_refuse_other_shape(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 8]\n"
           "input z: f32[4, 16]\n"
           "let a = x * 2.0\n"
           "let s = reduce_sum(a, axes=[-1], keepdims=1)\n"
           "output y = s + z\n",
           false);
  assert_int_equal(group(&t, "a"), group(&t, "s"));
  assert_int_equal(group_at(&t, "s")->kind, KL_GROUP_ROWS);
  assert_int_not_equal(group(&t, "y"), group(&t, "s"));
  assert_int_equal(group_at(&t, "y")->kind, KL_GROUP_ELEMENTWISE);
  assert_int_equal(step(&t, "s"), KL_STEP_ROWS);
  /* the row group stores s for the other kernel */
  assert_true(t.plan.fusion.stored[kl_graph_find_value(t.g, "s")->id]);
  done(&t);
}

/* One row kernel has one row length: a reduction over two axes does not
 * join a group whose rows are one axis long. */
static void test_rows_refuse_other_row_axes(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 8, 16]\n"
           "let a = x * 2.0\n"
           "let s1 = reduce_sum(a, axes=[-1], keepdims=1)\n"
           "let s2 = reduce_max(a, axes=[-2, -1], keepdims=1)\n"
           "output y1 = s1 * 1.0\n"
           "output y2 = s2 * 1.0\n",
           false);
  assert_int_equal(group(&t, "a"), group(&t, "s1"));
  assert_int_equal(group_at(&t, "s1")->row_axes, 1);
  assert_int_not_equal(group(&t, "s2"), group(&t, "s1"));
  assert_int_equal(group_at(&t, "s2")->kind, KL_GROUP_ROWS);
  assert_int_equal(group_at(&t, "s2")->row_axes, 2);
  done(&t);
}

/* e1 -> GEMM -> y, and y reads e1 too: y in e1's group would make the
 * groups e1 -> GEMM -> e1 a cycle. */
static void test_refuse_cycle_through_gemm(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[8, 256]\n"
           "input w: f32[256, 256]\n"
           "let e1 = x * 2.0\n"
           "let m = e1 @ w\n"
           "output y = m * e1\n",
           false);
  assert_false(t.plan.direct[node(&t, "m")->id]);
  assert_int_equal(step(&t, "m"), KL_STEP_GEMM);
  assert_int_not_equal(group(&t, "y"), group(&t, "e1"));
  assert_int_not_equal(group(&t, "y"), group(&t, "m"));
  assert_int_equal(group_at(&t, "e1")->count, 1);
  assert_int_equal(group_at(&t, "y")->count, 1);
  /* the groups run in an order that respects the edges */
  assert_true(group(&t, "e1") < group(&t, "m"));
  assert_true(group(&t, "m") < group(&t, "y"));
  done(&t);
}

/* Elementwise nodes of different output shapes (here a broadcast) are
 * two kernels. */
static void test_refuse_shape_mismatch(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 8]\n"
           "input z: f32[3, 4, 8]\n"
           "let a = x * 2.0\n"
           "let b = exp(a)\n"
           "output y = b + z\n",
           false);
  assert_int_equal(group(&t, "a"), group(&t, "b"));
  assert_int_not_equal(group(&t, "y"), group(&t, "b"));
  assert_int_equal(group_at(&t, "b")->shape.rank, 2);
  assert_int_equal(group_at(&t, "y")->shape.rank, 3);
  assert_true(t.plan.fusion.stored[kl_graph_find_value(t.g, "b")->id]);
  done(&t);
}

/* A direct convolution reads around its element: it never joins the group
 * that makes its input (other threads' values are not there yet), even
 * one of its own shape. */
static void test_direct_conv_refuses_its_producer(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[2, 4, 8, 8]\n"
           "param w: f32[4, 4, 3, 3] = randn(0.1, seed=1)\n"
           "let r = relu(x)\n"
           "let c = conv2d(r, w, pads=[1, 1, 1, 1])\n"
           "output y = relu(c)\n",
           false);
  /* same shape as r: only the window read keeps them apart */
  assert_true(kl_shape_equal(&kl_graph_find_value(t.g, "c")->shape,
                             &kl_graph_find_value(t.g, "r")->shape));
  assert_int_not_equal(group(&t, "c"), group(&t, "r"));
  assert_int_equal(group(&t, "c"), group(&t, "y"));
  assert_int_equal(step(&t, "c"), KL_STEP_DIRECT_CONV);
  assert_int_equal(step(&t, "r"), KL_STEP_ELEMENTWISE);
  done(&t);
}

/* transpose then reshape across its strides: no strided view of a, so the
 * movement runs as a kernel and the GEMM reads a buffer. */
static void test_reshape_across_strides_is_no_view(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input a: f32[4, 6]\n"
           "input b: f32[6, 5]\n"
           "let at = transpose(a, perm=[1, 0])\n"
           "let r = reshape(at, shape=[4, 6])\n"
           "output y = r @ b\n",
           false);
  kl_view v;
  kl_view_identity(kl_graph_find_value(t.g, "a"), &v);
  kl_view tv, rv;
  assert_true(kl_view_apply(node(&t, "at"), 0, &v, &tv));
  assert_false(kl_view_apply(node(&t, "r"), 0, &tv, &rv));
  assert_false(t.plan.view_node[node(&t, "r")->id]);
  assert_false(t.plan.view_node[node(&t, "at")->id]);
  /* the transpose is a kernel of its own; the GEMM reads r's buffer */
  assert_int_equal(step(&t, "at"), KL_STEP_NODE);
  assert_int_not_equal(t.plan.loc[kl_graph_find_value(t.g, "at")->id].kind, KL_LOC_VIEW);
  assert_int_not_equal(t.plan.loc[kl_graph_find_value(t.g, "r")->id].kind, KL_LOC_VIEW);
  assert_ptr_equal(t.plan.view[kl_graph_find_value(t.g, "r")->id].base,
                   kl_graph_find_value(t.g, "r"));
  assert_int_equal(step(&t, "y"), KL_STEP_GEMM);
  done(&t);
}

/* --no-fuse: one node a group, no views, epilogues, attention or direct
 * GEMMs. */
static void test_no_fuse_singletons(void **state) {
  (void)state;
  planned t;
  plan_src(&t,
           "input x: f32[4, 16]\n"
           "input w: f32[16, 16]\n"
           "input b: f32[16]\n"
           "let a = x * 2.0\n"
           "let e = relu(a + 1.0)\n"
           "let s = softmax(e, axis=-1)\n"
           "let wt = transpose(w, perm=[1, 0])\n"
           "let m = s @ wt\n"
           "let h = relu(m + b)\n"
           "output y = gelu(h)\n",
           true);
  int computed = 0;
  for (int i = 0; i < t.g->nodes.len; i++) {
    const kl_node *n = t.g->nodes.items[i];
    if (t.plan.fusion.group_of[n->id] >= 0) computed++;
    assert_false(t.plan.view_node[n->id]);
    assert_false(t.plan.direct[n->id]);
    assert_false(t.plan.absorbed[n->id]);
    assert_null(t.plan.epi_last[n->id]);
    assert_null(t.plan.attn_head[n->id]);
  }
  assert_int_equal(t.plan.fusion.ngroups, computed);
  assert_true(computed >= 9);
  for (int gi = 0; gi < t.plan.fusion.ngroups; gi++) {
    assert_int_equal(t.plan.fusion.groups[gi].count, 1);
    assert_int_equal(t.plan.fusion.groups[gi].kind, KL_GROUP_SINGLE);
  }
  assert_int_equal(step(&t, "s"), KL_STEP_NODE);
  assert_int_equal(step(&t, "m"), KL_STEP_GEMM);
  assert_int_equal(step(&t, "wt"), KL_STEP_NODE);
  done(&t);
}

/* ... and the same graph fused is fewer steps. */
static void test_fused_is_fewer_groups(void **state) {
  (void)state;
  const char *src = "input x: f32[4, 16]\n"
                    "let a = x * 2.0\n"
                    "let e = relu(a + 1.0)\n"
                    "let s = softmax(e, axis=-1)\n"
                    "output y = s * 3.0\n";
  planned f, u;
  plan_src(&f, src, false);
  plan_src(&u, src, true);
  assert_int_equal(f.plan.fusion.ngroups, 1);
  assert_int_equal(u.plan.fusion.ngroups, 5);
  done(&f);
  done(&u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_elementwise_chain),
      cmocka_unit_test(test_rows_softmax),
      cmocka_unit_test(test_rows_layer_norm),
      cmocka_unit_test(test_rows_reduce_mean),
      cmocka_unit_test(test_split_conv_keeps_out_of_rows),
      cmocka_unit_test(test_direct_conv),
      cmocka_unit_test(test_direct_gemm),
      cmocka_unit_test(test_gemm_epilogue),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_cutoffs),
      cmocka_unit_test(test_transpose_is_a_view),
      cmocka_unit_test(test_rows_refuse_other_shape),
      cmocka_unit_test(test_rows_refuse_other_row_axes),
      cmocka_unit_test(test_refuse_cycle_through_gemm),
      cmocka_unit_test(test_refuse_shape_mismatch),
      cmocka_unit_test(test_direct_conv_refuses_its_producer),
      cmocka_unit_test(test_reshape_across_strides_is_no_view),
      cmocka_unit_test(test_no_fuse_singletons),
      cmocka_unit_test(test_fused_is_fewer_groups),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
