/* emit_rows.c - the kernel of a row group: reductions over the innermost
 * axes (sum, mean, max, min with keepdims; global_avg_pool), softmax /
 * log_softmax over the innermost axis, layer_norm and rms_norm,
 * with the elementwise nodes before, between and after them, as one row
 * kernel (a warp or a block per row, as node_kernels.c's row kernels).
 * This is how softmax, layer norm and the reduce-then-scale patterns that
 * exporters spell out op by op become one kernel.
 *
 * Values are of two kinds: row values (the group's row shape, one per
 * element) and row scalars (the row shape with its last dim 1).  Scalars
 * are computed once per row, in order; every reduction is a pass over the
 * row that recomputes the elementwise row values it reads from the inputs
 * (cheap arithmetic, never a reduction), and a last pass writes the row
 * values the group stores.  Every value is rounded through its storage
 * type, as in the unfused kernels. */
#include <string.h>

#include "codegen_impl.h"

typedef struct {
  FILE *f;
  kl_node *const *nodes;
  int n;
  const kl_group_io *io;
  const kl_shape *shape; /* rows */
  kl_shape scalar;       /* the row shape with its last dim 1 */
  int64_t len;           /* elements per row */
  kl_cg_rows plan;
  int passes;
} rows_ctx;

static bool is_row_value(const rows_ctx *c, const kl_value *v) {
  return kl_shape_equal(&v->shape, c->shape);
}

static int member_index(const rows_ctx *c, const kl_value *v) {
  for (int m = 0; m < c->n; m++)
    if (v->producer == c->nodes[m]) return m;
  return -1;
}

static int input_index(const rows_ctx *c, const kl_value *v) {
  for (int k = 0; k < c->io->nin; k++)
    if (c->io->in[k] == v) return k;
  return -1;
}

/* The register of v in a row context (inside a pass) or scalar context. */
static const char *reg(const rows_ctx *c, const kl_value *v, bool row, char *buf, size_t len) {
  int k = input_index(c, v);
  if (k >= 0) snprintf(buf, len, "%s%d", row ? "xr" : "xs", k);
  else if (is_row_value(c, v) && kl_row_kind(v->producer) != 1) snprintf(buf, len, "r%d", v->id);
  else snprintf(buf, len, "s%d", v->id);
  return buf;
}

/* Statements computing elementwise node nd into `dst` (a declared
 * register), its operands from reg(); `out` >= 0 also stores it. */
static void elementwise(const rows_ctx *c, const kl_node *nd, bool row, const char *indent,
                        const char *dst, const char *store_at) {
  FILE *f = c->f;
  const kl_value *out = nd->outputs[0];
  const char *ct = kl_cg_operand_type(nd);
  char buf[256], r[32];
  const char *expr = kl_cg_expression(nd, ct, buf, sizeof buf);
  fprintf(f, "%s{ /* %s: %s */\n", indent, nd->name, kl_ops[nd->op].name);
  for (int i = 0; i < nd->ninputs; i++) {
    const char *t = nd->op == KL_OP_WHERE && i == 0 ? "int64_t" : ct;
    fprintf(f, "%s  const %s %c = (%s)%s;\n", indent, t, 'a' + i, t,
            reg(c, nd->inputs[i], row, r, sizeof r));
  }
  fprintf(f, "%s  %s s; ", indent, kl_cg_storage(out->dtype));
  kl_cg_store(f, out->dtype, "s", expr);
  if (store_at) fprintf(f, "%s  %s = s;\n", indent, store_at);
  char load[160];
  if (dst)
    fprintf(f, "%s  %s = %s;\n", indent, dst,
            kl_cg_load(load, sizeof load, out->dtype, kl_cg_compute_type(out->dtype), "s"));
  fprintf(f, "%s}\n", indent);
}

/* Mark the row values (members) that computing v needs, and the inputs
 * loaded in a row context. */
static void need_row(const rows_ctx *c, const kl_value *v, bool *member, bool *input) {
  int k = input_index(c, v);
  if (k >= 0) {
    input[k] = true;
    return;
  }
  int m = member_index(c, v);
  if (m < 0 || !is_row_value(c, v) || kl_row_kind(c->nodes[m]) == 1 || member[m]) return;
  member[m] = true;
  const kl_node *nd = c->nodes[m];
  /* softmax's value reads its input; other row values (norms: with their
   * scale and bias) their operands; a convolution reads its window
   * itself */
  if (nd->op == KL_OP_CONV2D || nd->op == KL_OP_CONV_TRANSPOSE2D || nd->op == KL_OP_RESIZE) return;
  for (int i = 0; i < (kl_row_kind(nd) == 2 ? 1 : nd->ninputs); i++)
    need_row(c, nd->inputs[i], member, input);
}

/* Inside a pass over the row: the loads and row values that `want` needs;
 * with `store`, also write the row values the group stores. */
static void row_body(const rows_ctx *c, const kl_value *want, bool store) {
  FILE *f = c->f;
  bool member[64] = {0}, input[KL_MAX_GROUP_IO] = {0};
  if (want) need_row(c, want, member, input);
  int ko_of[64];
  for (int m = 0; m < c->n; m++) {
    ko_of[m] = -1;
    const kl_value *v = c->nodes[m]->outputs[0];
    for (int k = 0; store && k < c->io->nout; k++)
      if (c->io->out[k] == v && is_row_value(c, v) && kl_row_kind(c->nodes[m]) != 1) {
        ko_of[m] = k;
        need_row(c, v, member, input);
      }
  }
  const kl_value *loads[KL_MAX_GROUP_IO];
  int nloads = 0, slot[KL_MAX_GROUP_IO];
  for (int k = 0; k < c->io->nin; k++)
    if (input[k]) slot[nloads] = k, loads[nloads++] = c->io->in[k];
  fprintf(f, "      const int64_t i = row * %lldLL + j;\n      (void)i;\n", (long long)c->len);
  if (nloads) kl_cg_index_math(f, c->shape, loads, nloads);
  for (int q = 0; q < nloads; q++) {
    char at[32], buf[160];
    const kl_value *v = loads[q];
    snprintf(at, sizeof at, "in%d[o%d]", slot[q], q);
    fprintf(f, "      const %s xr%d = %s;\n", kl_cg_compute_type(v->dtype), slot[q],
            kl_cg_load(buf, sizeof buf, v->dtype, kl_cg_compute_type(v->dtype), at));
  }
  for (int m = 0; m < c->n; m++) {
    if (!member[m]) continue;
    const kl_node *nd = c->nodes[m];
    const kl_value *out = nd->outputs[0];
    /* a register only for a value read after (NVRTC warns of one set and
     * never read) */
    bool read = out == want;
    for (int j = m + 1; j < c->n && !read; j++)
      for (int i = 0; i < c->nodes[j]->ninputs && member[j]; i++) read |= c->nodes[j]->inputs[i] == out;
    char dst[32], at[32];
    snprintf(dst, sizeof dst, "r%d", out->id);
    snprintf(at, sizeof at, "out%d[i]", ko_of[m]);
    if (read) fprintf(f, "      %s r%d;\n", kl_cg_compute_type(out->dtype), out->id);
    if (nd->op == KL_OP_CONV2D || nd->op == KL_OP_CONV_TRANSPOSE2D || nd->op == KL_OP_RESIZE) { /* its window, at i */
      kl_cg_conv_at(f, nd, c->io, "i", read ? dst : NULL, ko_of[m] >= 0);
      continue;
    }
    if (kl_row_kind(nd) == 3) { /* a norm: of the row's mean and 1/deviation */
      char val[400], r[32], t[96];
      const char *rt = kl_cg_real_type(nd->inputs[0]->dtype);
      snprintf(val, sizeof val, "((%s)%s - mean%d) * inv%d", rt, reg(c, nd->inputs[0], true, r, sizeof r),
               out->id, out->id);
      for (int i = 1; i < nd->ninputs; i++) {
        strncat(val, i == 1 ? " * (" : " + (", sizeof val - strlen(val) - 1);
        strncat(val, rt, sizeof val - strlen(val) - 1);
        strncat(val, ")", sizeof val - strlen(val) - 1);
        strncat(val, reg(c, nd->inputs[i], true, t, sizeof t), sizeof val - strlen(val) - 1);
      }
      char buf[160];
      fprintf(f, "      { /* %s: %s */\n        %s s; ", nd->name, kl_ops[nd->op].name,
              kl_cg_storage(out->dtype));
      kl_cg_store(f, out->dtype, "s", val);
      if (ko_of[m] >= 0) fprintf(f, "        %s = s;\n", at);
      if (read)
        fprintf(f, "        r%d = %s;\n", out->id,
                kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), "s"));
      fprintf(f, "      }\n");
    } else if (kl_row_kind(nd) == 2) { /* softmax: of the row's max and sum */
      const kl_value *in = nd->inputs[0];
      const char *ct = kl_cg_compute_type(in->dtype);
      char r[32], buf[160];
      fprintf(f, "      { /* %s: %s */\n        const %s v = (%s)%s, m = m%d;\n"
                 "        const %s sum = sum%d;\n        %s s; ",
              nd->name, kl_ops[nd->op].name, ct, ct, reg(c, in, true, r, sizeof r), out->id,
              ct, out->id, kl_cg_storage(out->dtype));
      kl_cg_store(f, out->dtype, "s", kl_cg_softmax_value(nd, !strcmp(ct, "double")));
      if (ko_of[m] >= 0) fprintf(f, "        %s = s;\n", at);
      if (read)
        fprintf(f, "        r%d = %s;\n", out->id,
                kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), "s"));
      fprintf(f, "      }\n");
    } else {
      elementwise(c, nd, true, "      ", read ? dst : NULL, ko_of[m] >= 0 ? at : NULL);
    }
  }
}

/* One pass: acc (of type acc_t, from init) folds `value` (an expression of
 * the row values of want) over the row; every lane ends with the total. */
static void pass(rows_ctx *c, const kl_value *want, const char *acc_t, const char *init,
                 const char *value, const char *update) {
  FILE *f = c->f;
  char shared[16];
  snprintf(shared, sizeof shared, "part%d", c->passes++);
  fprintf(f, "  {\n    %s acc = %s;\n", acc_t, init);
  kl_cg_rows_sum_loop(f, &c->plan, "    ");
  row_body(c, want, false);
  fprintf(f, "      const %s v = %s;\n      %s\n    }\n", acc_t, value, update);
  kl_cg_rows_combine(f, &c->plan, "    ", acc_t, update, shared);
}

/* Does a member after m read m's value? */
static bool used_later(const rows_ctx *c, int m) {
  for (int j = m + 1; j < c->n; j++)
    for (int i = 0; i < c->nodes[j]->ninputs; i++)
      if (c->nodes[j]->inputs[i] == c->nodes[m]->outputs[0]) return true;
  return false;
}

kl_cg_grid kl_cg_fused_rows(FILE *f, const char *name, kl_node *const *nodes, int n,
                            const kl_shape *shape, int axes, const kl_group_io *io) {
  rows_ctx c = {.f = f, .nodes = nodes, .n = n, .io = io, .shape = shape, .len = 1};
  c.scalar = *shape;
  for (int d = shape->rank - axes; d < shape->rank; d++) {
    c.len *= shape->dims[d];
    c.scalar.dims[d] = 1;
  }
  c.plan = kl_cg_plan_rows(kl_shape_numel(shape) / c.len, c.len);
  char text[160], r[32], buf[160];
  fprintf(f, "/* fused row group of %d nodes over %s, rows of its last %d dims, %s per row:", n,
          kl_shape_str(shape, text, sizeof text), axes, c.plan.threads == 32 ? "a warp" : "a block");
  for (int m = 0; m < n; m++) fprintf(f, " %s(%s)", nodes[m]->name, kl_ops[nodes[m]->op].name);
  fprintf(f, " */\n");
  kl_cg_fused_params(f, name, io);
  /* the shared arrays of every combine, declared up front */
  int npasses = 0;
  for (int m = 0; m < n; m++) {
    int kind = kl_row_kind(nodes[m]);
    if (kind == 1) {
      const char *acc, *init, *update;
      kl_cg_reduce_ops(nodes[m], &acc, &init, &update);
      snprintf(buf, sizeof buf, "part%d", npasses++);
      kl_cg_rows_shared(f, &c.plan, acc, buf);
    } else if (kind == 2) {
      snprintf(buf, sizeof buf, "part%d", npasses++);
      kl_cg_rows_shared(f, &c.plan, kl_cg_compute_type(nodes[m]->inputs[0]->dtype), buf);
      snprintf(buf, sizeof buf, "part%d", npasses++);
      kl_cg_rows_shared(f, &c.plan, kl_cg_compute_type(nodes[m]->inputs[0]->dtype), buf);
    } else if (kind == 3) {
      for (int k = nodes[m]->op == KL_OP_LAYER_NORM ? 0 : 1; k < 2; k++) {
        snprintf(buf, sizeof buf, "part%d", npasses++);
        kl_cg_rows_shared(f, &c.plan, kl_cg_real_type(nodes[m]->inputs[0]->dtype), buf);
      }
    }
  }
  kl_cg_rows_begin(f, &c.plan);
  /* the inputs scalars read: loaded once per row */
  bool scalar_in[KL_MAX_GROUP_IO] = {0};
  for (int m = 0; m < n; m++)
    if (!kl_row_kind(nodes[m]) && !is_row_value(&c, nodes[m]->outputs[0]))
      for (int i = 0; i < nodes[m]->ninputs; i++) {
        int k = input_index(&c, nodes[m]->inputs[i]);
        if (k >= 0) scalar_in[k] = true;
      }
  const kl_value *loads[KL_MAX_GROUP_IO];
  int nloads = 0, slot[KL_MAX_GROUP_IO];
  for (int k = 0; k < io->nin; k++)
    if (scalar_in[k]) slot[nloads] = k, loads[nloads++] = io->in[k];
  for (int q = 0; q < nloads; q++)
    fprintf(f, "  %s xs%d;\n", kl_cg_compute_type(loads[q]->dtype), slot[q]);
  if (nloads) {
    fprintf(f, "  {\n    const int64_t i = row;\n    (void)i;\n");
    kl_cg_index_math(f, &c.scalar, loads, nloads);
  }
  for (int q = 0; q < nloads; q++) {
    char at[32];
    snprintf(at, sizeof at, "in%d[o%d]", slot[q], q);
    fprintf(f, "    xs%d = %s;\n", slot[q],
            kl_cg_load(buf, sizeof buf, loads[q]->dtype, kl_cg_compute_type(loads[q]->dtype), at));
  }
  if (nloads) fprintf(f, "  }\n");
  /* members in order: scalars now, row values inside the passes */
  for (int m = 0; m < n; m++) {
    const kl_node *nd = nodes[m];
    const kl_value *out = nd->outputs[0];
    int kind = kl_row_kind(nd), ko = -1;
    for (int k = 0; k < io->nout; k++)
      if (io->out[k] == out) ko = k;
    if (kind == 1) {
      const char *acc, *init, *update;
      kl_cg_reduce_ops(nd, &acc, &init, &update);
      const kl_value *in = nd->inputs[0];
      char value[64];
      snprintf(value, sizeof value, "(%s)%s", acc, reg(&c, in, true, r, sizeof r));
      bool used = used_later(&c, m); /* NVRTC warns of a register never read */
      if (used) fprintf(f, "  %s s%d;\n", kl_cg_compute_type(out->dtype), out->id);
      pass(&c, in, acc, init, value, update);
      char result[64], at[32];
      bool mean = nd->op == KL_OP_REDUCE_MEAN || nd->op == KL_OP_GLOBAL_AVG_POOL;
      snprintf(result, sizeof result, mean ? "acc / %lld" : "acc", (long long)c.len);
      fprintf(f, "    %s s; ", kl_cg_storage(out->dtype));
      kl_cg_store(f, out->dtype, "s", result);
      snprintf(at, sizeof at, "out%d[row]", ko);
      if (ko >= 0) fprintf(f, "    if (lane == 0) %s = s;\n", at);
      if (used)
        fprintf(f, "    s%d = %s;\n", out->id,
                kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), "s"));
      fprintf(f, "  }\n");
    } else if (kind == 2) {
      const kl_value *in = nd->inputs[0];
      const char *ct = kl_cg_compute_type(in->dtype), *s = !strcmp(ct, "double") ? "" : "f";
      char value[96];
      fprintf(f, "  %s m%d, sum%d;\n", ct, out->id, out->id);
      snprintf(value, sizeof value, "(%s)%s", ct, reg(&c, in, true, r, sizeof r));
      pass(&c, in, ct, "-KL_INF", value, "acc = (v != v || v > acc) ? v : acc;");
      fprintf(f, "    m%d = acc;\n  }\n", out->id);
      snprintf(value, sizeof value, "exp%s((%s)%s - m%d)", s, ct,
               reg(&c, in, true, r, sizeof r), out->id);
      pass(&c, in, ct, "0", value, "acc += v;");
      fprintf(f, "    sum%d = acc;\n  }\n", out->id);
    } else if (kind == 3) { /* as templates_nn.c's norms: two passes, in the real type */
      const kl_value *in = nd->inputs[0];
      const char *at = kl_cg_real_type(in->dtype), *sf = kl_cg_real_suffix(at);
      char value[160];
      fprintf(f, "  %s mean%d = 0, inv%d;\n", at, out->id, out->id);
      snprintf(value, sizeof value, "(%s)%s", at, reg(&c, in, true, r, sizeof r));
      if (nd->op == KL_OP_LAYER_NORM) {
        pass(&c, in, at, "0", value, "acc += v;");
        fprintf(f, "    mean%d = acc / (%s)%lldLL;\n  }\n", out->id, at, (long long)c.len);
      }
      snprintf(value, sizeof value, "((%s)%s - mean%d) * ((%s)%s - mean%d)", at,
               reg(&c, in, true, r, sizeof r), out->id, at, reg(&c, in, true, buf, sizeof buf), out->id);
      pass(&c, in, at, "0", value, "acc += v;");
      fprintf(f, "    inv%d = (%s)1 / sqrt%s(acc / (%s)%lldLL + (%s)%.17g);\n  }\n", out->id, at, sf,
              at, (long long)c.len, at, kl_attr_float(nd, "epsilon", 1e-5));
    } else if (!is_row_value(&c, out)) { /* a row scalar */
      char dst[32], at[32];
      snprintf(dst, sizeof dst, "s%d", out->id);
      snprintf(at, sizeof at, "if (lane == 0) out%d[row]", ko);
      bool used = used_later(&c, m);
      if (used) fprintf(f, "  %s s%d;\n", kl_cg_compute_type(out->dtype), out->id);
      elementwise(&c, nd, false, "  ", used ? dst : NULL, ko >= 0 ? at : NULL);
    }
  }
  /* the stored row values */
  kl_cg_rows_loop(f, &c.plan, "  ");
  row_body(&c, NULL, true);
  fprintf(f, "  }\n}\n");
  kl_cg_fused_entry(f, name, io);
  return kl_cg_rows_grid(&c.plan);
}
