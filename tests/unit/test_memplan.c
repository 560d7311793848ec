/* test_memplan.c - the memory planner and its checker on random lifetimes
 * (a property test over seeded cases), the checker on plans broken on
 * purpose, the schedule on a graph where the program's order peaks high,
 * and the plans of the example models: checked, and within 10% of the
 * liveness lower bound. */
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

/* The planning passes, then the code generator (as kiln does). */
static int generate(const kl_graph *g, bool no_fuse, size_t mem_limit,
                    const kl_codegen_options *opt, kl_codegen_result *cg, kl_error *err) {
  kl_plan plan;
  kl_pipeline_options po = {.target = &kl_cg_target, .no_fuse = no_fuse, .mem_limit = mem_limit};
  int rc = kl_pipeline(g, &po, &plan, err);
  if (!rc) rc = kl_codegen(&plan, opt, cg, err);
  kl_plan_free(&plan);
  return rc;
}
#include "../../passes/passes.h"

static size_t aligned(size_t n) { return (n + KL_MEM_ALIGN - 1) / KL_MEM_ALIGN * KL_MEM_ALIGN; }

static const char *const names[] = {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9"};

/* n buffers over `steps` steps, sizes from 0 to ~1 MB in a spread of
 * scales, and some in-place chains whose parent's last step is the
 * child's first, as codegen makes them. */
static void random_buffers(kl_rng *r, kl_membuf *b, int n, int steps) {
  bool *taken = calloc((size_t)n, sizeof *taken);
  for (int i = 0; i < n; i++) {
    int first = (int)(kl_rng_next(r) % (uint64_t)steps);
    int len = (int)(kl_rng_next(r) % 6 ? kl_rng_next(r) % 4 : kl_rng_next(r) % (uint64_t)steps);
    int scale = (int)(kl_rng_next(r) % 5);
    size_t bytes = scale == 0 ? kl_rng_next(r) % 16 : (size_t)(kl_rng_next(r) % (1u << (4 * scale + 1)));
    b[i] = (kl_membuf){names[i % 10], bytes, first, first + len, -1, 0};
    /* in place of an earlier buffer that ends where this one starts */
    if (i && kl_rng_next(r) % 3 == 0) {
      int p = (int)(kl_rng_next(r) % (uint64_t)i);
      if (!taken[p] && b[p].first < b[p].last) {
        taken[p] = true;
        b[i].first = b[p].last;
        b[i].last = b[p].last + len;
        b[i].bytes = b[p].bytes;
        b[i].inplace_of = p;
      }
    }
  }
  free(taken);
}

/* The lower bound recomputed plainly: in-place children share their
 * first step with their parent. */
static size_t brute_lower_bound(const kl_membuf *b, int n) {
  size_t best = 0;
  for (int s = 0; s < 1000; s++) {
    size_t alive = 0;
    for (int i = 0; i < n; i++)
      if (b[i].first <= s && s <= b[i].last && !(b[i].inplace_of >= 0 && s == b[i].first))
        alive += aligned(b[i].bytes);
    if (alive > best) best = alive;
  }
  return best;
}

static void test_random_plans_are_safe(void **state) {
  (void)state;
  kl_membuf b[80];
  for (int seed = 1; seed <= 400; seed++) {
    kl_rng r;
    kl_rng_seed(&r, (uint64_t)seed);
    int n = 1 + (int)(kl_rng_next(&r) % 80), steps = 1 + (int)(kl_rng_next(&r) % 40);
    random_buffers(&r, b, n, steps);
    kl_memplan_stats st;
    kl_memplan(b, n, &st);
    char msg[512];
    if (kl_memplan_check(b, n, st.arena, msg, sizeof msg)) fail_msg("seed %d: %s", seed, msg);
    size_t naive = 0, biggest = 0;
    for (int i = 0; i < n; i++) {
      naive += aligned(b[i].bytes);
      if (aligned(b[i].bytes) > biggest) biggest = aligned(b[i].bytes);
      if (b[i].inplace_of >= 0) assert_true(b[i].offset == b[b[i].inplace_of].offset);
    }
    assert_int_equal(st.naive, naive);
    assert_int_equal(st.lower_bound, brute_lower_bound(b, n));
    assert_true(st.lower_bound >= biggest);
    assert_true(st.arena >= st.lower_bound);
    assert_true(st.arena <= st.naive);
    /* deterministic */
    kl_membuf again[80];
    memcpy(again, b, sizeof again);
    kl_memplan_stats st2;
    kl_memplan(again, n, &st2);
    assert_int_equal(st2.arena, st.arena);
    for (int i = 0; i < n; i++) assert_int_equal(again[i].offset, b[i].offset);
  }
}

/* Every random plan, broken by moving one buffer onto another that is
 * alive at the same time, is caught. */
static void test_checker_rejects_overlaps(void **state) {
  (void)state;
  kl_membuf b[40];
  int broken = 0;
  for (int seed = 1; seed <= 300; seed++) {
    kl_rng r;
    kl_rng_seed(&r, (uint64_t)seed + 1000);
    int n = 2 + (int)(kl_rng_next(&r) % 38);
    random_buffers(&r, b, n, 12);
    kl_memplan_stats st;
    kl_memplan(b, n, &st);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        if (i == j || !b[i].bytes || !b[j].bytes || b[i].first > b[j].last || b[j].first > b[i].last ||
            b[i].inplace_of == j || b[j].inplace_of == i || b[i].offset == b[j].offset)
          continue;
        size_t keep = b[j].offset;
        b[j].offset = b[i].offset;
        char msg[512];
        assert_int_equal(kl_memplan_check(b, n, st.arena + aligned(b[j].bytes), msg, sizeof msg), -1);
        assert_non_null(strstr(msg, "overlap"));
        b[j].offset = keep;
        broken++;
        goto next;
      }
  next:;
  }
  assert_true(broken > 100);
}

static void test_checker_small_cases(void **state) {
  (void)state;
  char msg[512];
  /* apart in time: one offset for both */
  kl_membuf b[3] = {{"a", 1000, 0, 1, -1, 0}, {"b", 3000, 2, 3, -1, 0}, {"c", 10, 1, 2, -1, 0}};
  kl_memplan_stats st;
  kl_memplan(b, 3, &st);
  assert_int_equal(st.lower_bound, aligned(3000) + 256);
  assert_int_equal(st.arena, st.lower_bound);
  assert_int_equal(kl_memplan_check(b, 3, st.arena, msg, sizeof msg), 0);
  /* misaligned, past the end */
  b[2].offset += 8;
  assert_int_equal(kl_memplan_check(b, 3, st.arena, msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "'c'"));
  b[2].offset -= 8;
  assert_int_equal(kl_memplan_check(b, 3, 1024, msg, sizeof msg), -1);
  /* in place: sharing is fine only where the parent's last step is the
   * child's first */
  kl_membuf ip[2] = {{"x", 4096, 0, 2, -1, 0}, {"y", 4096, 2, 4, 0, 0}};
  kl_memplan(ip, 2, &st);
  assert_int_equal(st.arena, 4096);
  assert_int_equal(st.lower_bound, 4096);
  assert_int_equal(kl_memplan_check(ip, 2, st.arena, msg, sizeof msg), 0);
  ip[0].last = 3; /* the parent still alive after the child starts */
  assert_int_equal(kl_memplan_check(ip, 2, st.arena, msg, sizeof msg), -1);
  ip[0].last = 2;
  ip[1].inplace_of = -1; /* not declared in place */
  assert_int_equal(kl_memplan_check(ip, 2, st.arena, msg, sizeof msg), -1);
}

/* Two wide branches each reduced to a scalar: the program's order keeps
 * both wide values alive at once, the schedule one at a time. */
static void test_schedule_lowers_the_peak(void **state) {
  (void)state;
  const char *src = "input x: f32[4096]\n"
                    "let a = x * 2.0\n"
                    "let b = x * 3.0\n"
                    "let c = x * 4.0\n"
                    "let sa = reduce_sum(a)\n"
                    "let sb = reduce_sum(b)\n"
                    "let sc = reduce_sum(c)\n"
                    "output y = sa + sb + sc\n";
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  kl_node *order[64];
  assert_int_equal(kl_schedule(g, order, &err), 0);
  int pos[64], n = g->nodes.len;
  for (int i = 0; i < n; i++) pos[order[i]->id] = i;
  for (int i = 0; i < n; i++) /* topological */
    for (int k = 0; k < order[i]->ninputs; k++)
      if (order[i]->inputs[k]->producer) assert_true(pos[order[i]->inputs[k]->producer->id] < i);
  const kl_value *sa = kl_graph_find_value(g, "sa"), *b = kl_graph_find_value(g, "b");
  assert_true(pos[sa->producer->id] < pos[b->producer->id]);
  kl_codegen_result cg;
  /* unfused: horizontal fusion would compute a, b and c in one kernel,
   * alive together, by design (it reads x once instead of three times) */
  kl_codegen_options opt = {.prefix = "t"};
  assert_int_equal(generate(g, true, 0, &opt, &cg, &err), 0);
  assert_true(cg.arena_lower_bound < 2 * 4096 * 4);
  kl_codegen_result_free(&cg);
  kl_graph_free(g);
}

/* kl_node.after: a node waits for a value it does not read, in the
 * graph's own order, the schedule and the steps. */
static void test_after_orders_nodes(void **state) {
  (void)state;
  const char *src = "input x: f32[4096]\n"
                    "let a = x * 2.0\n"
                    "let sa = reduce_sum(a)\n"
                    "let b = x * 3.0\n"
                    "let sb = reduce_sum(b)\n"
                    "output y = sa + sb\n";
  kl_error err;
  kl_graph *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  kl_value *sa = kl_graph_find_value(g, "sa"), *sb = kl_graph_find_value(g, "sb");
  kl_value *a = kl_graph_find_value(g, "a");
  a->producer->after = sb; /* a (and so sa) only once sb is there */
  kl_node *order[64];
  int pos[64] = {0}, n = g->nodes.len;
  assert_int_equal(kl_topo_order(g, order, &err), 0);
  for (int i = 0; i < n; i++) pos[order[i]->id] = i;
  assert_true(pos[sb->producer->id] < pos[a->producer->id]);
  assert_int_equal(kl_schedule(g, order, &err), 0);
  for (int i = 0; i < n; i++) pos[order[i]->id] = i;
  assert_true(pos[sb->producer->id] < pos[a->producer->id]);
  /* fused: a may not join a group that runs before sb; it may join sb's
   * own row group (b and both sums one row kernel: its passes run in the
   * schedule's order, sb's before the one that computes a) */
  kl_plan p;
  kl_pipeline_options po = {.target = &kl_cg_target};
  assert_int_equal(kl_pipeline(g, &po, &p, &err), 0);
  int gb = p.fusion.group_of[sb->producer->id], ga = p.fusion.group_of[sa->producer->id];
  assert_true(gb <= p.fusion.group_of[a->producer->id]);
  assert_true(gb < ga || (gb == ga && p.fusion.groups[gb].kind == KL_GROUP_ROWS));
  kl_plan_free(&p);
  kl_graph_free(g);
}

/* A concat whose pieces are contiguous (dims before its axis 1) runs no
 * kernel: its pieces' producers write their parts of its buffer, at their
 * byte offsets, and no in-place choice hands that buffer to another
 * value.  Across a batch of 2, or with a graph input as a piece, it
 * copies as before. */
static void plan_concat(const char *src, kl_plan *p, kl_graph **g) {
  kl_error err;
  *g = kl_parse_string(src, strlen(src), "t.kl", NULL, &err);
  if (!*g) fail_msg("%s", err.msg);
  kl_pipeline_options po = {.target = &kl_cg_target};
  if (kl_pipeline(*g, &po, p, &err)) fail_msg("%s", err.msg);
  char msg[512];
  if (kl_memplan_check(p->bufs, p->nbufs, p->mem.arena, msg, sizeof msg)) fail_msg("%s", msg);
}

static void test_concat_in_place(void **state) {
  (void)state;
  kl_plan p;
  kl_graph *g;
  plan_concat("input x: f32[1, 3, 8, 8]\n"
              "let a = relu(x)\n"
              "let b = tanh(x) * 2.0\n"
              "let c = concat(a, b, axis=1)\n"
              "output y = sigmoid(c) + 1.0\n",
              &p, &g);
  const kl_value *a = kl_graph_find_value(g, "a"), *b = kl_graph_find_value(g, "b"),
                 *c = kl_graph_find_value(g, "c");
  assert_true(p.alias[c->producer->id]);
  assert_ptr_equal(p.piece_of[a->id], c->producer);
  assert_int_equal(p.loc[c->id].kind, KL_LOC_ARENA);
  assert_int_equal(p.loc[a->id].index, p.loc[c->id].index);
  assert_int_equal(p.loc[b->id].index, p.loc[c->id].index);
  assert_int_equal(p.loc[a->id].offset, 0);
  assert_int_equal(p.loc[b->id].offset, 3 * 64 * 4);
  assert_int_equal(p.bufs[p.loc[c->id].index].inplace_of, -1);
  kl_plan_free(&p);
  kl_graph_free(g);
  /* the same across a batch of 2 (pieces interleave), and with a piece
   * that is the graph's input (in the caller's buffer): copies */
  const char *copies[] = {"input x: f32[2, 3, 8, 8]\nlet a = relu(x)\nlet b = tanh(x) * 2.0\n"
                          "let c = concat(a, b, axis=1)\noutput y = sigmoid(c) + 1.0\n",
                          "input x: f32[1, 3, 8, 8]\nlet b = tanh(x) * 2.0\n"
                          "let c = concat(x, b, axis=1)\noutput y = sigmoid(c) + 1.0\n"};
  for (int i = 0; i < 2; i++) {
    plan_concat(copies[i], &p, &g);
    assert_false(p.alias[kl_graph_find_value(g, "c")->producer->id]);
    kl_plan_free(&p);
    kl_graph_free(g);
  }
}

/* Rematerialization on the training example: under a limit below its
 * arena the copies land after the values they wait for, each after the
 * forward pass's steps, and the plan fits. */
static void test_remat_train_cnn(void **state) {
  (void)state;
  char path[1024];
  snprintf(path, sizeof path, "%s/examples/train_cnn.kl", KILN_SOURCE_ROOT);
  kl_error err;
  kl_graph *g = kl_parse_file(path, NULL, &err);
  if (!g) fail_msg("%s", err.msg);
  kl_pipeline_options po = {.target = &kl_cg_target, .train = true};
  assert_int_equal(kl_pipeline_rewrite(g, &po, &err), 0);
  kl_plan p;
  assert_int_equal(kl_pipeline(g, &po, &p, &err), 0);
  size_t arena = p.mem.arena;
  kl_plan_free(&p);
  int before = g->nodes.len;
  po.mem_limit = arena * 60 / 100;
  assert_int_equal(kl_remat(g, &po, NULL, &err), 0);
  assert_true(g->nodes.len > before);
  assert_int_equal(kl_verify(g, &err), 0);
  if (kl_pipeline(g, &po, &p, &err)) fail_msg("%s", err.msg);
  assert_true(p.mem.arena <= po.mem_limit);
  const kl_node *loss = g->train->out_loss->producer;
  int copies = 0;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = g->nodes.items[i];
    if (!n->after || !p.live[n->id]) continue;
    copies++;
    int s = p.fusion.group_of[n->id];
    assert_true(p.fusion.group_of[n->after->producer->id] <= s);
    assert_true(p.fusion.group_of[loss->id] < s);
  }
  assert_true(copies > 0);
  kl_plan_free(&p);
  /* a second call under the same limit finds the plan fits: no more copies */
  int after_first = g->nodes.len;
  assert_int_equal(kl_remat(g, &po, NULL, &err), 0);
  assert_int_equal(g->nodes.len, after_first);
  kl_graph_free(g);
}

/* The examples: every plan checked, and close to the lower bound. */
static void check_example(const char *file, const kl_dim_override *dims, int ndims) {
  char path[1024];
  snprintf(path, sizeof path, "%s/examples/%s", KILN_SOURCE_ROOT, file);
  kl_error err;
  kl_parse_options popt = {.dims = dims, .ndims = ndims};
  kl_graph *g = kl_parse_file(path, &popt, &err);
  if (!g) fail_msg("%s", err.msg);
  kl_codegen_result cg;
  kl_codegen_options opt = {.prefix = g->name};
  if (generate(g, false, 0, &opt, &cg, &err)) fail_msg("%s: %s", file, err.msg);
  char msg[512];
  if (kl_memplan_check(cg.membufs, cg.nmembufs, cg.arena_bytes, msg, sizeof msg))
    fail_msg("%s: %s", file, msg);
  print_message("%s: naive %zu, planned %zu, lower bound %zu\n", file, cg.naive_bytes,
                cg.arena_bytes, cg.arena_lower_bound);
  assert_true(cg.arena_bytes >= cg.arena_lower_bound);
  assert_true((double)cg.arena_bytes <= 1.10 * (double)cg.arena_lower_bound);
  assert_true(cg.arena_bytes < cg.naive_bytes);
  /* a limit below the plan fails, naming what is alive at the peak */
  size_t limit = cg.arena_bytes - 1;
  kl_codegen_result_free(&cg);
  assert_int_equal(generate(g, false, limit, &opt, &cg, &err), -1);
  assert_non_null(strstr(err.msg, "memory limit exceeded"));
  assert_non_null(strstr(err.msg, "the largest: '"));
  assert_int_equal(generate(g, false, limit + 1, &opt, &cg, &err), 0);
  kl_codegen_result_free(&cg);
  kl_graph_free(g);
}

static void test_examples(void **state) {
  (void)state;
  check_example("transformer.kl", NULL, 0);
  check_example("cnn.kl", NULL, 0);
  check_example("mlp.kl", NULL, 0);
  kl_dim_override big[2] = {{"B", 8}, {"T", 128}};
  check_example("transformer.kl", big, 2);
  kl_dim_override batch[1] = {{"B", 64}};
  check_example("cnn.kl", batch, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_plans_are_safe),
      cmocka_unit_test(test_checker_rejects_overlaps),
      cmocka_unit_test(test_checker_small_cases),
      cmocka_unit_test(test_schedule_lowers_the_peak),
      cmocka_unit_test(test_examples),
      cmocka_unit_test(test_after_orders_nodes),
      cmocka_unit_test(test_remat_train_cnn),
      cmocka_unit_test(test_concat_in_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
