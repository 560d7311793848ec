/* templates_nn.c - kernel templates for the nn ops (see codegen_impl.h for
 * the template interface): layer_norm, rms_norm, batch_norm, conv2d (im2col
 * + runtime GEMM, or straight to GEMM for 1x1), max/avg pools,
 * global_avg_pool, cross_entropy, nll_loss, conv_transpose2d, resize,
 * col2im, dft and det.  Each kernel mirrors the interpreter's code in ir/ (ops_nn.c,
 * ops_contract.c, ops_sample.c, ops_math.c): same index math, same
 * order of operations where it decides NaN and rounding.  conv_transpose2d,
 * col2im, resize and dft compute in the tensor's real type (kl_cg_real_type:
 * float for f32 and half tensors, double for f64); the others sum in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

/* ---- small emitters ---------------------------------------------------- */

typedef long long ll;

/* One kernel parameter: its C type ("const float *") and name. */
typedef struct {
  char type[48];
  const char *name;
} karg;

static karg in_arg(const kl_value *v, const char *name) {
  karg a = {.name = name};
  snprintf(a.type, sizeof a.type, "const %s *", kl_cg_storage(v->dtype));
  return a;
}

static karg out_arg(kl_dtype t, const char *name) {
  karg a = {.name = name};
  snprintf(a.type, sizeof a.type, "%s *", kl_cg_storage(t));
  return a;
}

static void kbegin(FILE *f, const kl_node *n, const char *name, const char *what, const karg *a,
                   int na) {
  char shape[160];
  fprintf(f, "/* %s: %s%s -> %s%s */\n", n->name, kl_ops[n->op].name, what,
          kl_dtype_name(n->outputs[0]->dtype),
          kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape));
  fprintf(f, "KL_KERNEL void %s(", name);
  for (int i = 0; i < na; i++) fprintf(f, "%s%s__restrict__ %s", i ? ", " : "", a[i].type, a[i].name);
  fprintf(f, ") {\n");
}

static void kend(FILE *f, const char *name, const karg *a, int na) {
  fprintf(f, "}\nKL_EMU_ENTRY(%s", name);
  for (int i = 0; i < na; i++) fprintf(f, ", KL_ARG(%s, %d)", a[i].type, i);
  fprintf(f, ");\n\n");
}

static void loop(FILE *f, int64_t n) {
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n", (ll)n);
}

/* Compute type: double for f64, float for the other floats, 64-bit
 * integers for the integer types. */
static const char *ctype(kl_dtype t) { return kl_cg_compute_type(t); }

static const char *ld(char *buf, size_t len, kl_dtype t, const char *to, const char *expr) {
  return kl_cg_load(buf, len, t, to, expr);
}

static void st(FILE *f, kl_dtype t, const char *dst, const char *value) {
  kl_cg_store(f, t, dst, value);
}

static const char *off_bytes(const char *base, int64_t bytes, char *buf, size_t len) {
  if (!bytes) snprintf(buf, len, "%s", base);
  else snprintf(buf, len, "(void *)((char *)%s + %lld)", base, (ll)bytes);
  return buf;
}

static void host_comment(kl_cg_emitter *e, const kl_node *n) {
  char shape[160];
  fprintf(kl_cg_host(e), "  /* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name,
          kl_dtype_name(n->outputs[0]->dtype),
          kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape));
}

/* Statements computing `dst`, the flat offset into a tensor of shape ps
 * that broadcasts (NumPy, right-aligned) to shape ns, of flat index `src`
 * of ns. */
static void bcast_offset(FILE *f, const char *indent, const char *src, const char *dst,
                         const kl_shape *ps, const kl_shape *ns) {
  if (kl_shape_numel(ps) == kl_shape_numel(ns)) {
    fprintf(f, "%sconst int64_t %s = %s;\n", indent, dst, src);
    return;
  }
  fprintf(f, "%sint64_t %s = 0;\n%s{\n%s  int64_t q = %s;\n", indent, dst, indent, indent, src);
  int64_t stride = 1;
  for (int d = ns->rank - 1; d >= 0; d--) {
    int sd = d - (ns->rank - ps->rank);
    if (sd < 0) break;
    int64_t dim = ns->dims[d];
    if (ps->dims[sd] != 1) {
      fprintf(f, "%s  %s += (q %% %lld) * %lld;\n", indent, dst, (ll)dim, (ll)stride);
      stride *= ps->dims[sd];
    }
    fprintf(f, "%s  q /= %lld;\n", indent, (ll)dim);
  }
  fprintf(f, "%s  (void)q;\n%s}\n", indent, indent);
}

/* ---- layer_norm, rms_norm ---------------------------------------------- */
static bool handles_norm(const kl_node *n) {
  return (n->op == KL_OP_LAYER_NORM || n->op == KL_OP_RMS_NORM) &&
         kl_dtype_is_float(n->inputs[0]->dtype);
}

/* A row kernel (kl_cg_rows): the mean, then the sum of squared deviations
 * (two passes over the row, which cancels less than one pass or Welford),
 * each combined across the row's threads, then the normalised row. */
static int emit_norm(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  int r = x->shape.rank, axis = (int)kl_attr_int(n, "axis", -1);
  if (axis < 0) axis += r;
  bool center = n->op == KL_OP_LAYER_NORM;
  double eps = kl_attr_float(n, "epsilon", 1e-5);
  kl_shape ns = {.rank = r - axis};
  for (int d = axis; d < r; d++) ns.dims[d - axis] = x->shape.dims[d];
  int64_t m = kl_shape_numel(&ns), numel = kl_shape_numel(&x->shape);
  host_comment(e, n);
  if (m == 0 || numel == 0) return 0;
  kl_cg_rows p = kl_cg_plan_rows(numel / m, m);
  char name[32], b1[128], what[96];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  static const char *const pnames[] = {"x", "scale", "bias"};
  karg a[4];
  int na = 0;
  for (int i = 0; i < n->ninputs; i++) a[na++] = in_arg(n->inputs[i], pnames[i]);
  a[na++] = out_arg(y->dtype, "out");
  snprintf(what, sizeof what, " over axes %d.. (rows of %lld, a %s each)", axis, (ll)m,
           p.threads == 32 ? "warp" : "block");
  kbegin(f, n, name, what, a, na);
  /* sums in the real type (f32 for f32 and half rows: each thread's part,
   * then a tree across the row's threads) */
  const char *at = kl_cg_real_type(x->dtype), *sf = kl_cg_real_suffix(at);
  if (center) kl_cg_rows_shared(f, &p, at, "part_mean");
  kl_cg_rows_shared(f, &p, at, "part_sq");
  kl_cg_rows_begin(f, &p);
  const char *xj = ld(b1, sizeof b1, x->dtype, at, "x[base + j]");
  fprintf(f, "  const int64_t base = row * %lldLL;\n  %s mean = 0, sq;\n", (ll)m, at);
  if (center) {
    fprintf(f, "  {\n    %s acc = 0;\n", at);
    kl_cg_rows_sum_loop(f, &p, "    ");
    fprintf(f, "      acc += %s;\n    }\n", xj);
    kl_cg_rows_combine(f, &p, "    ", at, "acc += v;", "part_mean");
    fprintf(f, "    mean = acc / (%s)%lldLL;\n  }\n", at, (ll)m);
  }
  fprintf(f, "  {\n    %s acc = 0;\n", at);
  kl_cg_rows_sum_loop(f, &p, "    ");
  fprintf(f, "      const %s d = %s - mean;\n      acc += d * d;\n    }\n", at, xj);
  kl_cg_rows_combine(f, &p, "    ", at, "acc += v;", "part_sq");
  fprintf(f, "    sq = acc;\n  }\n");
  fprintf(f, "  const %s inv = (%s)1 / sqrt%s(sq / (%s)%lldLL + (%s)%.17g);\n", at, at, sf, at, (ll)m, at, eps);
  kl_cg_rows_loop(f, &p, "  ");
  char val[256];
  snprintf(val, sizeof val, "(%s - mean) * inv", xj);
  if (n->ninputs > 1) {
    bcast_offset(f, "    ", "j", "os", &n->inputs[1]->shape, &ns);
    char s[96];
    strncat(val, " * ", sizeof val - strlen(val) - 1);
    strncat(val, ld(s, sizeof s, n->inputs[1]->dtype, at, "scale[os]"), sizeof val - strlen(val) - 1);
  }
  if (n->ninputs > 2) {
    bcast_offset(f, "    ", "j", "ob", &n->inputs[2]->shape, &ns);
    char s[96];
    strncat(val, " + ", sizeof val - strlen(val) - 1);
    strncat(val, ld(s, sizeof s, n->inputs[2]->dtype, at, "bias[ob]"), sizeof val - strlen(val) - 1);
  }
  fprintf(f, "    ");
  st(f, y->dtype, "out[base + j]", val);
  fprintf(f, "  }\n");
  kend(f, name, a, na);
  kl_cg_grid g = kl_cg_rows_grid(&p);
  kl_cg_launch_node_grid(e, k, g.blocks, g.threads, n);
  return 0;
}

/* ---- batch_norm ---------------------------------------------------------- */
static bool handles_batch_norm(const kl_node *n) {
  return n->op == KL_OP_BATCH_NORM && kl_dtype_is_float(n->inputs[0]->dtype);
}

/* Elementwise: y = (x - mean[c]) * (scale[c] / sqrt(var[c] + eps)) + bias[c],
 * c the index on axis 1. */
static int emit_batch_norm(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  int64_t c = x->shape.dims[1], inner = 1, numel = kl_shape_numel(&x->shape);
  for (int d = 2; d < x->shape.rank; d++) inner *= x->shape.dims[d];
  double eps = kl_attr_float(n, "epsilon", 1e-5);
  host_comment(e, n);
  if (numel == 0) return 0;
  char name[32], b[5][96];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  static const char *const pnames[] = {"x", "scale", "bias", "mean", "var"};
  karg a[6];
  for (int i = 0; i < 5; i++) a[i] = in_arg(n->inputs[i], pnames[i]);
  a[5] = out_arg(y->dtype, "out");
  kbegin(f, n, name, " (inference)", a, 6);
  const char *ct = x->dtype == KL_F64 ? "double" : "float", *sf = x->dtype == KL_F64 ? "" : "f";
  loop(f, numel);
  fprintf(f, "    const int64_t ch = (i / %lldLL) %% %lldLL;\n", (ll)inner, (ll)c);
  fprintf(f, "    const %s s = %s / sqrt%s(%s + (%s)%.17g);\n", ct,
          ld(b[1], sizeof b[1], n->inputs[1]->dtype, ct, "scale[ch]"), sf,
          ld(b[4], sizeof b[4], n->inputs[4]->dtype, ct, "var[ch]"), ct, eps);
  char val[400];
  snprintf(val, sizeof val, "(%s - %s) * s + %s", ld(b[0], sizeof b[0], x->dtype, ct, "x[i]"),
           ld(b[3], sizeof b[3], n->inputs[3]->dtype, ct, "mean[ch]"),
           ld(b[2], sizeof b[2], n->inputs[2]->dtype, ct, "bias[ch]"));
  fprintf(f, "    ");
  st(f, y->dtype, "out[i]", val);
  fprintf(f, "  }\n");
  kend(f, name, a, 6);
  kl_cg_launch_node(e, k, numel, n);
  return 0;
}

/* ---- conv2d: im2col + GEMM ------------------------------------------------ */
typedef struct {
  int64_t k[2], stride[2], dil[2], pad[4];
} win;

/* ints attribute into out[len], or dflt when absent. */
static void ints_or(const kl_node *n, const char *attr, int len, int64_t dflt, int64_t *out) {
  const int64_t *v;
  int got = kl_attr_ints(n, attr, &v);
  for (int i = 0; i < len; i++) out[i] = got == len ? v[i] : dflt;
}

static bool handles_conv(const kl_node *n) {
  return n->op == KL_OP_CONV2D && kl_dtype_is_float(n->outputs[0]->dtype) &&
         n->inputs[0]->dtype == n->outputs[0]->dtype && n->inputs[1]->dtype == n->outputs[0]->dtype;
}

/* Per group g and batch item b:
 *   out[b, g*mpg .. , P] = w[g*mpg .., K] @ col[b, g*K .., P]
 * with K = cpg*kH*kW, P = OH*OW, and col the im2col matrix of x (or x
 * itself for an unpadded 1x1 stride-1 convolution).  The bias, when there
 * is one, is written first and the GEMM adds to it (beta = 1). */
/* Batch items per im2col chunk: the im2col matrix of the whole batch is
 * kH*kW*C/M times the output, so it is built for as many items as fit in
 * the output's size (one at least), and the GEMMs run chunk by chunk: a
 * workspace bounded by the tensors the step holds anyway, for a launch or
 * two more per chunk. */
static int64_t conv_chunk(const kl_node *n) {
  const kl_value *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
  int64_t item = x->shape.dims[1] * w->shape.dims[2] * w->shape.dims[3] * y->shape.dims[2] *
                 y->shape.dims[3];
  int64_t fit = item ? kl_shape_numel(&y->shape) / item : 1;
  if (fit > x->shape.dims[0]) fit = x->shape.dims[0];
  return fit < 1 ? 1 : fit;
}

/* The im2col matrix of a chunk of the batch (conv_chunk), unless the
 * convolution reads x as it is (1x1, stride 1, no padding). */
static int scratch_conv(const kl_node *n, size_t *bytes) {
  const kl_value *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
  win wn = {{w->shape.dims[2], w->shape.dims[3]}, {1, 1}, {1, 1}, {0, 0, 0, 0}};
  ints_or(n, "strides", 2, 1, wn.stride);
  ints_or(n, "pads", 4, 0, wn.pad);
  bool direct = wn.k[0] == 1 && wn.k[1] == 1 && wn.stride[0] == 1 && wn.stride[1] == 1 &&
                !wn.pad[0] && !wn.pad[1] && !wn.pad[2] && !wn.pad[3];
  if (kl_shape_numel(&y->shape) == 0 || direct) return 0;
  int64_t p = y->shape.dims[2] * y->shape.dims[3];
  bytes[0] = (size_t)(conv_chunk(n) * x->shape.dims[1] * wn.k[0] * wn.k[1] * p) *
             kl_dtype_size(x->dtype);
  return 1;
}

/* The im2col kernel for `items` batch items from x's first (the launch
 * offsets x): col[b, (c, ky, kx), (oy, ox)]. */
static int im2col_kernel(kl_cg_emitter *e, const kl_node *n, const win *wn, int64_t items) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  int64_t c = x->shape.dims[1], h = x->shape.dims[2], wi = x->shape.dims[3];
  int64_t oh = y->shape.dims[2], ow = y->shape.dims[3], p = oh * ow;
  FILE *f = kl_cg_kernels(e);
  char name[32], what[160];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  karg a[2] = {in_arg(x, "x"), out_arg(x->dtype, "col")};
  snprintf(what, sizeof what, " im2col [%lld, %lld, %lld]", (ll)items, (ll)(c * wn->k[0] * wn->k[1]),
           (ll)p);
  kbegin(f, n, name, what, a, 2);
  loop(f, items * c * wn->k[0] * wn->k[1] * p);
  fprintf(f, "    int64_t r = i;\n"
             "    const int64_t ox = r %% %lldLL; r /= %lldLL;\n"
             "    const int64_t oy = r %% %lldLL; r /= %lldLL;\n"
             "    const int64_t kx = r %% %lldLL; r /= %lldLL;\n"
             "    const int64_t ky = r %% %lldLL; r /= %lldLL;\n"
             "    const int64_t iy = oy * %lldLL - %lldLL + ky * %lldLL;\n"
             "    const int64_t ix = ox * %lldLL - %lldLL + kx * %lldLL;\n",
          (ll)ow, (ll)ow, (ll)oh, (ll)oh, (ll)wn->k[1], (ll)wn->k[1], (ll)wn->k[0], (ll)wn->k[0],
          (ll)wn->stride[0], (ll)wn->pad[0], (ll)wn->dil[0], (ll)wn->stride[1], (ll)wn->pad[1],
          (ll)wn->dil[1]);
  /* r is now b * C + c: the plane of x */
  const char *zero = x->dtype == KL_F16 ? "__float2half(0.0f)"
                     : x->dtype == KL_BF16 ? "__float2bfloat16(0.0f)" : "0";
  fprintf(f, "    if (iy >= 0 && iy < %lldLL && ix >= 0 && ix < %lldLL)\n"
             "      col[i] = x[(r * %lldLL + iy) * %lldLL + ix];\n"
             "    else\n      col[i] = %s;\n  }\n",
          (ll)h, (ll)wi, (ll)h, (ll)wi, zero);
  kend(f, name, a, 2);
  return k;
}

static int emit_conv(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
  const int64_t *xd = x->shape.dims, *yd = y->shape.dims;
  int64_t nb = xd[0], c = xd[1], h = xd[2], wi = xd[3], m = w->shape.dims[0];
  int64_t groups = kl_attr_int(n, "groups", 1), cpg = c / groups, mpg = m / groups;
  win wn = {{w->shape.dims[2], w->shape.dims[3]}, {1, 1}, {1, 1}, {0, 0, 0, 0}};
  ints_or(n, "strides", 2, 1, wn.stride);
  ints_or(n, "dilations", 2, 1, wn.dil);
  ints_or(n, "pads", 4, 0, wn.pad);
  int64_t oh = yd[2], ow = yd[3], p = oh * ow, kk = cpg * wn.k[0] * wn.k[1];
  size_t es = kl_dtype_size(x->dtype);
  host_comment(e, n);
  if (kl_shape_numel(&y->shape) == 0) return 0;
  FILE *f = kl_cg_kernels(e);
  char name[32], px[160], py[160], pw[160], pcol[160], tmp[4][400];
  kl_cg_ptr(e, x, px, sizeof px);
  kl_cg_ptr(e, y, py, sizeof py);
  kl_cg_ptr(e, w, pw, sizeof pw);
  bool direct = wn.k[0] == 1 && wn.k[1] == 1 && wn.stride[0] == 1 && wn.stride[1] == 1 &&
                !wn.pad[0] && !wn.pad[1] && !wn.pad[2] && !wn.pad[3];
  int64_t chunk = direct ? nb : conv_chunk(n), last = nb % chunk;
  /* col row stride between batch items: C*kH*kW*P (im2col) or C*P (x) */
  int64_t col_item = c * wn.k[0] * wn.k[1] * p;
  int k_full = -1, k_last = -1;
  if (!direct) {
    kl_cg_scratch(e, (size_t)(chunk * col_item) * es, pcol, sizeof pcol);
    kl_cg_count_dram(e, 2 * (size_t)(nb * col_item) * es); /* written by im2col, read by the GEMM */
    k_full = im2col_kernel(e, n, &wn, chunk);
    if (last) k_last = im2col_kernel(e, n, &wn, last);
  }
  double beta = 0;
  if (n->ninputs > 2) {
    const kl_value *bias = n->inputs[2];
    int k = kl_cg_new_kernel(e, name, sizeof name);
    karg a[2] = {in_arg(bias, "bias"), out_arg(y->dtype, "out")};
    kbegin(f, n, name, " bias", a, 2);
    int64_t total = kl_shape_numel(&y->shape);
    loop(f, total);
    char b1[96], at[64];
    snprintf(at, sizeof at, "bias[(i / %lldLL) %% %lldLL]", (ll)p, (ll)m);
    fprintf(f, "    ");
    st(f, y->dtype, "out[i]", ld(b1, sizeof b1, bias->dtype, ctype(bias->dtype), at));
    fprintf(f, "  }\n");
    kend(f, name, a, 2);
    char pb[160];
    const char *args[2] = {kl_cg_ptr(e, bias, pb, sizeof pb), py};
    kl_cg_launch(e, k, total, args, 2);
    beta = 1;
  }
  kl_cg_gemm g = {.dtype = y->dtype, .m = mpg, .n = p, .k = kk, .lda = kk, .ldb = p, .ldc = p,
                  .alpha = 1, .beta = beta};
  for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
    int64_t items = nb - b0 < chunk ? nb - b0 : chunk;
    char pxb[240], pyb[240], pcb[240];
    off_bytes(px, b0 * c * h * wi * (int64_t)es, pxb, sizeof pxb);
    off_bytes(py, b0 * m * p * (int64_t)es, pyb, sizeof pyb);
    if (direct) {
      snprintf(pcb, sizeof pcb, "%s", pxb);
    } else {
      snprintf(pcb, sizeof pcb, "%s", pcol);
      const char *args[2] = {pxb, pcol};
      kl_cg_launch(e, items == chunk ? k_full : k_last, items * col_item, args, 2);
    }
    if (groups <= items) { /* one batched GEMM per group, over the items */
      for (int64_t gi = 0; gi < groups; gi++) {
        g.batch = items;
        g.a = off_bytes(pw, gi * mpg * kk * (int64_t)es, tmp[0], sizeof tmp[0]);
        g.stride_a = 0;
        g.b = off_bytes(pcb, gi * kk * p * (int64_t)es, tmp[1], sizeof tmp[1]);
        g.stride_b = col_item;
        g.c = off_bytes(pyb, gi * mpg * p * (int64_t)es, tmp[2], sizeof tmp[2]);
        g.stride_c = m * p;
        kl_cg_emit_gemm(e, &g);
      }
    } else { /* one batched GEMM per item, over the groups */
      for (int64_t b = 0; b < items; b++) {
        g.batch = groups;
        g.a = pw;
        g.stride_a = mpg * kk;
        g.b = off_bytes(pcb, b * col_item * (int64_t)es, tmp[1], sizeof tmp[1]);
        g.stride_b = kk * p;
        g.c = off_bytes(pyb, b * m * p * (int64_t)es, tmp[2], sizeof tmp[2]);
        g.stride_c = mpg * p;
        kl_cg_emit_gemm(e, &g);
      }
    }
  }
  return 0;
}

/* ---- conv2d_weight_grad: a tiled GEMM over the batch, split along it ---- */
/* dW[m, k] = sum over r of dy[m, r] * col[r, k], per group, with k = (ci,
 * ky, kx) a weight tap and r = (n, oy, ox) an output position: a GEMM whose
 * reduction runs over the batch, so neither operand is a matrix in memory
 * (dy's rows are strided by the batch, col is never built).  A block of
 * 16x16 threads owns a 16x16 tile of dW and walks its share of r in steps
 * of 16, staging a tile of dy and one of gathered x in shared memory;
 * consecutive threads read consecutive output positions (coalesced).  A
 * small dW over a long reduction (the first layer's) is split along r into
 * partial tiles summed by a second kernel in a fixed order: reproducible
 * bits, and enough blocks to fill the GPU. */
enum { WG_TILE = 16, WG_STEP = 64, WG_THREADS = WG_TILE * WG_TILE, WG_MIN_CHUNK = 256,
       WG_WANT_BLOCKS = 256 };

typedef struct {
  int64_t nb, c, h, w, m, groups, cpg, mpg, k, p, r;
  int64_t tiles, splits, chunk;
  win wn;
  int64_t oh, ow;
} wgrad_plan;

static wgrad_plan plan_wgrad(const kl_node *n) {
  const kl_value *x = n->inputs[0], *dy = n->inputs[1];
  wgrad_plan q = {.nb = x->shape.dims[0], .c = x->shape.dims[1], .h = x->shape.dims[2],
                  .w = x->shape.dims[3], .m = dy->shape.dims[1],
                  .groups = kl_attr_int(n, "groups", 1), .oh = dy->shape.dims[2],
                  .ow = dy->shape.dims[3]};
  ints_or(n, "kernel", 2, 1, q.wn.k);
  ints_or(n, "strides", 2, 1, q.wn.stride);
  ints_or(n, "dilations", 2, 1, q.wn.dil);
  ints_or(n, "pads", 4, 0, q.wn.pad);
  q.cpg = q.c / q.groups, q.mpg = q.m / q.groups;
  q.k = q.cpg * q.wn.k[0] * q.wn.k[1], q.p = q.oh * q.ow, q.r = q.nb * q.p;
  q.tiles = q.groups * ((q.mpg + WG_TILE - 1) / WG_TILE) * ((q.k + WG_TILE - 1) / WG_TILE);
  int64_t want = q.tiles ? (WG_WANT_BLOCKS + q.tiles - 1) / q.tiles : 1; /* 0: an empty dW */
  int64_t most = (q.r + WG_MIN_CHUNK - 1) / WG_MIN_CHUNK;
  /* the partials stay within a quarter of dy: the workspace never rivals
   * the gradients the step holds at that point */
  int64_t part = q.m * q.k * (n->outputs[0]->dtype == KL_F64 ? 8 : 4);
  int64_t room = part ? (int64_t)(kl_shape_numel(&dy->shape) * kl_dtype_size(dy->dtype) / 4) / part : 1;
  int64_t splits = want < most ? want : most;
  if (splits > room) splits = room;
  if (splits < 1) splits = 1;
  q.chunk = (q.r + splits - 1) / splits;
  q.chunk = (q.chunk + WG_STEP - 1) / WG_STEP * WG_STEP;
  q.splits = q.chunk ? (q.r + q.chunk - 1) / q.chunk : 1;
  if (q.splits < 1) q.splits = 1;
  return q;
}

static bool handles_wgrad(const kl_node *n) {
  return n->op == KL_OP_CONV2D_WEIGHT_GRAD && kl_dtype_is_float(n->outputs[0]->dtype);
}

/* the partial tiles, when the reduction is split */
static int scratch_wgrad(const kl_node *n, size_t *bytes) {
  wgrad_plan q = plan_wgrad(n);
  if (q.splits < 2 || kl_shape_numel(&n->outputs[0]->shape) == 0) return 0;
  bytes[0] = (size_t)(q.splits * q.m * q.k) * (n->outputs[0]->dtype == KL_F64 ? 8 : 4);
  return 1;
}

static int emit_wgrad(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *dy = n->inputs[1], *y = n->outputs[0];
  wgrad_plan q = plan_wgrad(n);
  const char *rt = kl_cg_real_type(y->dtype);
  int64_t total = kl_shape_numel(&y->shape);
  host_comment(e, n);
  if (total == 0) return 0;
  FILE *f = kl_cg_kernels(e);
  char name[32], what[200], at[200], b1[256], px[160], pdy[160], py[160], ppart[160];
  kl_cg_ptr(e, x, px, sizeof px);
  kl_cg_ptr(e, dy, pdy, sizeof pdy);
  kl_cg_ptr(e, y, py, sizeof py);
  bool split = q.splits > 1;
  size_t part_bytes = (size_t)(q.splits * q.m * q.k) * (y->dtype == KL_F64 ? 8 : 4);
  if (split) {
    kl_cg_scratch(e, part_bytes, ppart, sizeof ppart);
    kl_cg_count_dram(e, 2 * part_bytes); /* written by the tiles, read by the sum */
  }
  int k1 = kl_cg_new_kernel(e, name, sizeof name);
  karg a[3] = {in_arg(x, "x"), in_arg(dy, "dy"), out_arg(y->dtype, "out")};
  if (split) snprintf(a[2].type, sizeof a[2].type, "%s *", rt);
  snprintf(what, sizeof what, " [%lld x %lld] over %lld positions in %lld parts", (ll)q.m, (ll)q.k,
           (ll)q.r, (ll)q.splits);
  kbegin(f, n, name, what, a, 3);
  int64_t tm = (q.mpg + WG_TILE - 1) / WG_TILE, tk = (q.k + WG_TILE - 1) / WG_TILE;
  fprintf(f, "  KL_SHARED(%s, dys, [%d][%d]);\n  KL_SHARED(%s, xs, [%d][%d]);\n", rt, WG_TILE,
          WG_STEP + 1, rt, WG_STEP, WG_TILE + 1);
  fprintf(f, "  const int tx = (int)threadIdx.x %% %d, ty = (int)threadIdx.x / %d;\n"
             "  int64_t blk = blockIdx.x;\n"
             "  const int64_t part = blk %% %lldLL; blk /= %lldLL;\n"
             "  const int64_t t_k = blk %% %lldLL; blk /= %lldLL;\n"
             "  const int64_t t_m = blk %% %lldLL, grp = blk / %lldLL;\n"
             "  const int64_t r_begin = part * %lldLL;\n"
             "  const int64_t r_end = r_begin + %lldLL < %lldLL ? r_begin + %lldLL : %lldLL;\n"
             "  %s acc = 0;\n",
          WG_TILE, WG_TILE, (ll)q.splits, (ll)q.splits, (ll)tk, (ll)tk, (ll)tm, (ll)tm,
          (ll)q.chunk, (ll)q.chunk, (ll)q.r, (ll)q.chunk, (ll)q.r, rt);
  /* a stage covers WG_STEP positions: thread (ty, tx) loads positions
   * r0 + tx + 16 j, of dy at row ty and of x at tap ty (consecutive
   * threads, consecutive positions), then 64 multiply-adds between two
   * barriers */
  fprintf(f, "  for (int64_t r0 = r_begin; r0 < r_end; r0 += %d) {\n"
             "    for (int j = 0; j < %d; j += %d) {\n"
             "    const int64_t r = r0 + tx + j, b = r / %lldLL, pos = r %% %lldLL;\n"
             "    const int64_t mm = t_m * %d + ty, kk = t_k * %d + ty;\n"
             "    %s dv = 0, xv = 0;\n",
          WG_STEP, WG_STEP, WG_TILE, (ll)q.p, (ll)q.p, WG_TILE, WG_TILE, rt);
  snprintf(at, sizeof at, "dy[(b * %lldLL + grp * %lldLL + mm) * %lldLL + pos]", (ll)q.m, (ll)q.mpg,
           (ll)q.p);
  fprintf(f, "    if (r < r_end && mm < %lldLL) dv = %s;\n", (ll)q.mpg,
          ld(b1, sizeof b1, dy->dtype, rt, at));
  fprintf(f, "    if (r < r_end && kk < %lldLL) {\n"
             "      const int64_t oy = pos / %lldLL, ox = pos %% %lldLL;\n"
             "      const int64_t kx = kk %% %lldLL, ky = kk / %lldLL %% %lldLL, ci = kk / %lldLL;\n"
             "      const int64_t iy = oy * %lldLL - %lldLL + ky * %lldLL;\n"
             "      const int64_t ix = ox * %lldLL - %lldLL + kx * %lldLL;\n",
          (ll)q.k, (ll)q.ow, (ll)q.ow, (ll)q.wn.k[1], (ll)q.wn.k[1], (ll)q.wn.k[0],
          (ll)(q.wn.k[0] * q.wn.k[1]), (ll)q.wn.stride[0], (ll)q.wn.pad[0], (ll)q.wn.dil[0],
          (ll)q.wn.stride[1], (ll)q.wn.pad[1], (ll)q.wn.dil[1]);
  snprintf(at, sizeof at, "x[((b * %lldLL + grp * %lldLL + ci) * %lldLL + iy) * %lldLL + ix]",
           (ll)q.c, (ll)q.cpg, (ll)q.h, (ll)q.w);
  fprintf(f, "      if (iy >= 0 && iy < %lldLL && ix >= 0 && ix < %lldLL) xv = %s;\n    }\n",
          (ll)q.h, (ll)q.w, ld(b1, sizeof b1, x->dtype, rt, at));
  fprintf(f, "    dys[ty][tx + j] = dv;\n    xs[tx + j][ty] = xv;\n    }\n    __syncthreads();\n"
             "    for (int t = 0; t < %d; t++) acc += dys[ty][t] * xs[t][tx];\n"
             "    __syncthreads();\n  }\n",
          WG_STEP);
  fprintf(f, "  const int64_t row = t_m * %d + ty, col = t_k * %d + tx;\n"
             "  if (row < %lldLL && col < %lldLL) {\n",
          WG_TILE, WG_TILE, (ll)q.mpg, (ll)q.k);
  if (split) {
    fprintf(f, "    out[(part * %lldLL + grp * %lldLL + row) * %lldLL + col] = acc;\n  }\n", (ll)q.m,
            (ll)q.mpg, (ll)q.k);
  } else {
    snprintf(at, sizeof at, "out[(grp * %lldLL + row) * %lldLL + col]", (ll)q.mpg, (ll)q.k);
    fprintf(f, "    ");
    st(f, y->dtype, at, "acc");
    fprintf(f, "  }\n");
  }
  kend(f, name, a, 3);
  const char *args[3] = {px, pdy, split ? ppart : py};
  kl_cg_launch_grid(e, k1, q.tiles * q.splits, WG_THREADS, args, 3);
  if (!split) return 0;
  int k2 = kl_cg_new_kernel(e, name, sizeof name);
  karg a2[2] = {{.name = "part"}, out_arg(y->dtype, "out")};
  snprintf(a2[0].type, sizeof a2[0].type, "const %s *", rt);
  kbegin(f, n, name, " the parts' sum", a2, 2);
  loop(f, total);
  fprintf(f, "    %s s = part[i];\n    for (int64_t j = 1; j < %lldLL; j++) s += part[j * %lldLL + i];\n    ",
          rt, (ll)q.splits, (ll)total);
  st(f, y->dtype, "out[i]", "s");
  fprintf(f, "  }\n");
  kend(f, name, a2, 2);
  const char *args2[2] = {ppart, py};
  kl_cg_launch(e, k2, total, args2, 2);
  return 0;
}

/* ---- max_pool2d, avg_pool2d ---------------------------------------------- */
static bool handles_pool(const kl_node *n) {
  return (n->op == KL_OP_MAX_POOL2D || n->op == KL_OP_AVG_POOL2D) &&
         kl_dtype_is_float(n->inputs[0]->dtype);
}

/* One thread per output element, as pool_eval: max propagates NaN and is
 * -inf over an empty window; avg sums in the real type (float; double for
 * f64) and divides by the count
 * of positions inside the input, or inside the padded input with
 * count_include_pad. */
static int emit_pool(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  bool is_max = n->op == KL_OP_MAX_POOL2D;
  win wn;
  ints_or(n, "kernel", 2, 1, wn.k);
  int64_t dstride[2];
  ints_or(n, "strides", 2, -1, dstride);
  for (int a = 0; a < 2; a++) wn.stride[a] = dstride[a] < 0 ? wn.k[a] : dstride[a];
  ints_or(n, "pads", 4, 0, wn.pad);
  ints_or(n, "dilations", 2, 1, wn.dil);
  bool include_pad = !is_max && kl_attr_int(n, "count_include_pad", 0) != 0;
  int64_t h = x->shape.dims[2], wi = x->shape.dims[3], oh = y->shape.dims[2], ow = y->shape.dims[3];
  int64_t total = kl_shape_numel(&y->shape);
  host_comment(e, n);
  if (total == 0) return 0;
  char name[32], b1[96], what[160];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[2] = {in_arg(x, "x"), out_arg(y->dtype, "out")};
  snprintf(what, sizeof what, " %lldx%lld/%lldx%lld", (ll)wn.k[0], (ll)wn.k[1], (ll)wn.stride[0],
           (ll)wn.stride[1]);
  kbegin(f, n, name, what, a, 2);
  const char *ct = kl_cg_real_type(x->dtype);
  loop(f, total);
  fprintf(f, "    const int64_t ox = i %% %lldLL, oy = (i / %lldLL) %% %lldLL, pl = i / %lldLL;\n",
          (ll)ow, (ll)ow, (ll)oh, (ll)(oh * ow));
  fprintf(f, "    const int64_t y0 = oy * %lldLL - %lldLL, x0 = ox * %lldLL - %lldLL;\n",
          (ll)wn.stride[0], (ll)wn.pad[0], (ll)wn.stride[1], (ll)wn.pad[1]);
  fprintf(f, "    %s acc = %s;\n", ct, is_max ? "-KL_INF" : "0");
  if (!is_max && !include_pad) fprintf(f, "    int64_t count = 0;\n");
  fprintf(f, "    for (int64_t ky = 0; ky < %lldLL; ky++) {\n"
             "      const int64_t iy = y0 + ky * %lldLL;\n"
             "      if (iy < 0 || iy >= %lldLL) continue;\n"
             "      for (int64_t kx = 0; kx < %lldLL; kx++) {\n"
             "        const int64_t ix = x0 + kx * %lldLL;\n"
             "        if (ix < 0 || ix >= %lldLL) continue;\n",
          (ll)wn.k[0], (ll)wn.dil[0], (ll)h, (ll)wn.k[1], (ll)wn.dil[1], (ll)wi);
  char at[96];
  snprintf(at, sizeof at, "x[(pl * %lldLL + iy) * %lldLL + ix]", (ll)h, (ll)wi);
  fprintf(f, "        const %s v = %s;\n", ct, ld(b1, sizeof b1, x->dtype, ct, at));
  if (is_max) fprintf(f, "        if (v > acc || v != v) acc = v;\n");
  else fprintf(f, "        acc += v;\n%s", include_pad ? "" : "        count++;\n");
  fprintf(f, "      }\n    }\n");
  if (!is_max && include_pad) {
    /* taps inside the padded input, not beyond it (y0, x0 lie before its end) */
    fprintf(f, "    const int64_t ny = (%lldLL - y0 + %lldLL) / %lldLL, nx = (%lldLL - x0 + %lldLL) / %lldLL;\n"
               "    const int64_t count = (ny < %lldLL ? ny : %lldLL) * (nx < %lldLL ? nx : %lldLL);\n",
            (ll)(h + wn.pad[2]), (ll)(wn.dil[0] - 1), (ll)wn.dil[0], (ll)(wi + wn.pad[3]),
            (ll)(wn.dil[1] - 1), (ll)wn.dil[1], (ll)wn.k[0], (ll)wn.k[0], (ll)wn.k[1], (ll)wn.k[1]);
  }
  fprintf(f, "    ");
  char mean[48];
  snprintf(mean, sizeof mean, "acc / (%s)count", ct);
  st(f, y->dtype, "out[i]", is_max ? "acc" : mean);
  fprintf(f, "  }\n");
  kend(f, name, a, 2);
  kl_cg_launch_node(e, k, total, n);
  return 0;
}

static bool handles_pool_index(const kl_node *n) {
  return n->op == KL_OP_MAX_POOL2D_INDEX && kl_dtype_is_float(n->inputs[0]->dtype);
}

/* One thread per output element, as kl_eval_MAX_POOL2D_INDEX: the flat
 * index (row or column major) of the first maximum, or of the first NaN. */
static int emit_pool_index(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  win wn;
  ints_or(n, "kernel", 2, 1, wn.k);
  int64_t dstride[2];
  ints_or(n, "strides", 2, -1, dstride);
  for (int a = 0; a < 2; a++) wn.stride[a] = dstride[a] < 0 ? wn.k[a] : dstride[a];
  ints_or(n, "pads", 4, 0, wn.pad);
  ints_or(n, "dilations", 2, 1, wn.dil);
  bool col = kl_attr_int(n, "storage_order", 0) != 0;
  int64_t h = x->shape.dims[2], wi = x->shape.dims[3], oh = y->shape.dims[2], ow = y->shape.dims[3];
  int64_t total = kl_shape_numel(&y->shape);
  host_comment(e, n);
  if (total == 0) return 0;
  char name[32], b1[96], what[160];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[2] = {in_arg(x, "x"), out_arg(y->dtype, "out")};
  snprintf(what, sizeof what, " %lldx%lld/%lldx%lld%s", (ll)wn.k[0], (ll)wn.k[1],
           (ll)wn.stride[0], (ll)wn.stride[1], col ? ", column major" : "");
  kbegin(f, n, name, what, a, 2);
  const char *ct = ctype(x->dtype);
  loop(f, total);
  fprintf(f, "    const int64_t ox = i %% %lldLL, oy = (i / %lldLL) %% %lldLL, pl = i / %lldLL;\n",
          (ll)ow, (ll)ow, (ll)oh, (ll)(oh * ow));
  fprintf(f, "    const int64_t y0 = oy * %lldLL - %lldLL, x0 = ox * %lldLL - %lldLL;\n",
          (ll)wn.stride[0], (ll)wn.pad[0], (ll)wn.stride[1], (ll)wn.pad[1]);
  fprintf(f, "    %s acc = -KL_INF;\n    int64_t at = -1;\n", ct);
  fprintf(f, "    for (int64_t ky = 0; ky < %lldLL; ky++) {\n"
             "      const int64_t iy = y0 + ky * %lldLL;\n"
             "      if (iy < 0 || iy >= %lldLL) continue;\n"
             "      for (int64_t kx = 0; kx < %lldLL; kx++) {\n"
             "        const int64_t ix = x0 + kx * %lldLL;\n"
             "        if (ix < 0 || ix >= %lldLL || acc != acc) continue;\n",
          (ll)wn.k[0], (ll)wn.dil[0], (ll)h, (ll)wn.k[1], (ll)wn.dil[1], (ll)wi);
  char at[96];
  snprintf(at, sizeof at, "x[(pl * %lldLL + iy) * %lldLL + ix]", (ll)h, (ll)wi);
  fprintf(f, "        const %s v = %s;\n", ct, ld(b1, sizeof b1, x->dtype, ct, at));
  char pos[64];
  if (col) snprintf(pos, sizeof pos, "iy + ix * %lldLL", (ll)h);
  else snprintf(pos, sizeof pos, "iy * %lldLL + ix", (ll)wi);
  fprintf(f, "        if (at < 0 || v > acc || v != v) {\n"
             "          acc = v;\n"
             "          at = pl * %lldLL + %s;\n"
             "        }\n      }\n    }\n",
          (ll)(h * wi), pos);
  fprintf(f, "    ");
  st(f, y->dtype, "out[i]", "at");
  fprintf(f, "  }\n");
  kend(f, name, a, 2);
  kl_cg_launch_node(e, k, total, n);
  return 0;
}

/* ---- global_avg_pool -------------------------------------------------------- */
static bool handles_gap(const kl_node *n) {
  return n->op == KL_OP_GLOBAL_AVG_POOL && kl_dtype_is_float(n->inputs[0]->dtype);
}

/* One thread per plane, summing in the real type (f32; f64 for f64),
 * compensated (Kahan) for planes long enough for the rounding of a plain
 * running sum to show. */
static int emit_gap(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  int64_t planes = kl_shape_numel(&y->shape);
  host_comment(e, n);
  if (planes == 0) return 0;
  int64_t size = kl_shape_numel(&x->shape) / planes;
  char name[32], b1[96];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[2] = {in_arg(x, "x"), out_arg(y->dtype, "out")};
  kbegin(f, n, name, "", a, 2);
  loop(f, planes);
  char at[64];
  snprintf(at, sizeof at, "x[i * %lldLL + j]", (ll)size);
  const char *rt = kl_cg_real_type(x->dtype);
  if (size > 256)
    fprintf(f, "    %s acc = 0, lost = 0;\n    for (int64_t j = 0; j < %lldLL; j++) {\n"
               "      const %s y = %s - lost, t = acc + y;\n      lost = (t - acc) - y;\n      acc = t;\n    }\n    ",
            rt, (ll)size, rt, ld(b1, sizeof b1, x->dtype, rt, at));
  else
    fprintf(f, "    %s acc = 0;\n    for (int64_t j = 0; j < %lldLL; j++) acc += %s;\n    ", rt,
            (ll)size, ld(b1, sizeof b1, x->dtype, rt, at));
  char val[64];
  snprintf(val, sizeof val, "acc / (%s)%lldLL", rt, (ll)size);
  st(f, y->dtype, "out[i]", val);
  fprintf(f, "  }\n");
  kend(f, name, a, 2);
  kl_cg_launch_node(e, k, planes, n);
  return 0;
}


/* ---- run-time errors (kl_cg_flag in codegen_impl.h) --------------------- */
static void c_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 32 || ch >= 127) fprintf(f, "\\%03o", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

FILE *kl_cg_input_checks(kl_cg_emitter *e) { return e->c->prechecks_f; }

int kl_cg_flag(kl_cg_emitter *e, char *buf, size_t len) {
  int flag = e->c->nflags++;
  snprintf(buf, len, "(void *)(m->flags + %d)", flag);
  return flag;
}

void kl_cg_flag_check(kl_cg_emitter *e, int flag, const kl_node *n, const char *what, int64_t c) {
  FILE *h = e->c->checks_f;
  char msg[600];
  snprintf(msg, sizeof msg, "%s (node '%s'): %s is out of range [0, %lld) (item ", kl_ops[n->op].name,
           n->name, what, (long long)c);
  fprintf(h, "  if (flags[%d]) {\n"
             "    if (err && errlen) {\n"
             "      static const char msg[] = ", flag);
  c_string(h, msg);
  fprintf(h, ";\n"
             "      unsigned long long item = 0xFFFFFFFFull - flags[%d];\n"
             "      char digits[24];\n"
             "      int nd = 0;\n"
             "      size_t k = 0;\n"
             "      do {\n        digits[nd++] = (char)('0' + item %% 10);\n        item /= 10;\n"
             "      } while (item);\n"
             "      for (; msg[k] && k + 1 < errlen; k++) err[k] = msg[k];\n"
             "      while (nd && k + 1 < errlen) err[k++] = digits[--nd];\n"
             "      if (k + 1 < errlen) err[k++] = ')';\n"
             "      err[k] = 0;\n"
             "    }\n    return -1;\n  }\n", flag);
}

void kl_cg_flag_raised(kl_cg_emitter *e, int flag, const kl_node *n, const char *message) {
  FILE *h = e->c->checks_f;
  char msg[600];
  snprintf(msg, sizeof msg, "%s (node '%s'): %s", kl_ops[n->op].name, n->name, message);
  fprintf(h, "  if (flags[%d]) {\n    if (err && errlen) snprintf(err, errlen, \"%%s\", ", flag);
  c_string(h, msg);
  fprintf(h, ");\n    return -1;\n  }\n");
}

/* ---- cross_entropy, nll_loss ---------------------------------------------- */
typedef enum { RED_MEAN, RED_SUM, RED_NONE } reduction;

static reduction get_reduction(const kl_node *n) {
  const char *s = kl_attr_string(n, "reduction", "mean");
  return !strcmp(s, "sum") ? RED_SUM : !strcmp(s, "none") ? RED_NONE : RED_MEAN;
}

/* The type of the per-item losses: the real type of the logits (f32 for
 * f32 and half logits, f64 for f64). */
static const char *loss_type(const kl_node *n) { return kl_cg_real_type(n->inputs[0]->dtype); }

/* The final reduction: one thread sums the per-item losses (scratch, in
 * loss_type) in order, compensated (Kahan); with `pairs` the scratch holds
 * (loss, weight) per item and the mean divides by the sum of the weights. */
static void emit_final(kl_cg_emitter *e, const kl_node *n, const char *scr, int64_t items,
                       reduction red, bool pairs) {
  const kl_value *y = n->outputs[0];
  const char *lt = loss_type(n);
  char name[32], py[160];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[2] = {{"", "loss"}, out_arg(y->dtype, "out")};
  snprintf(a[0].type, sizeof a[0].type, "const %s *", lt);
  kbegin(f, n, name, red == RED_SUM ? " sum" : " mean", a, 2);
  loop(f, 1);
  fprintf(f, "    %s total = 0, lost = 0, wsum = 0;\n"
             "    for (int64_t j = 0; j < %lldLL; j++) {\n", lt, (ll)items);
  fprintf(f, "      const %s y = loss[%s] - lost, t = total + y;\n"
             "      lost = (t - total) - y;\n      total = t;\n", lt, pairs ? "2 * j" : "j");
  if (pairs) fprintf(f, "      wsum += loss[2 * j + 1];\n");
  else fprintf(f, "      wsum += 1;\n");
  fprintf(f, "    }\n    ");
  st(f, y->dtype, "out[i]", red == RED_SUM ? "total" : "total / wsum");
  fprintf(f, "  }\n");
  kend(f, name, a, 2);
  const char *args[2] = {scr, kl_cg_ptr(e, y, py, sizeof py)};
  kl_cg_launch(e, k, 1, args, 2);
}

static bool handles_cross_entropy(const kl_node *n) {
  return n->op == KL_OP_CROSS_ENTROPY && kl_dtype_is_float(n->inputs[0]->dtype);
}

/* One thread per item: log-sum-exp over the class axis in the real type, then the
 * loss of an index label (NaN for a label out of range: a GPU cannot stop
 * the run) or of a probability row. */
/* The per-item losses before the reduction (16 bytes for none), and the
 * bad-label flag of index labels. */
static int scratch_cross_entropy(const kl_node *n, size_t *bytes) {
  const kl_value *x = n->inputs[0];
  int r = x->shape.rank, axis = (int)kl_attr_int(n, "axis", -1), count = 0;
  if (axis < 0) axis += r;
  int64_t items = 1; /* every dim but the class axis */
  for (int d = 0; d < r; d++)
    if (d != axis) items *= x->shape.dims[d];
  reduction red = get_reduction(n);
  if (items == 0) {
    if (red != RED_NONE) bytes[count++] = 16;
    return count;
  }
  if (red != RED_NONE) bytes[count++] = (size_t)items * (x->dtype == KL_F64 ? 8 : 4);
  return count;
}

static int emit_cross_entropy(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *l = n->inputs[1], *y = n->outputs[0];
  int r = x->shape.rank, axis = (int)kl_attr_int(n, "axis", -1);
  if (axis < 0) axis += r;
  reduction red = get_reduction(n);
  int64_t c = x->shape.dims[axis], inner = 1, outer = 1;
  for (int d = axis + 1; d < r; d++) inner *= x->shape.dims[d];
  for (int d = 0; d < axis; d++) outer *= x->shape.dims[d];
  int64_t items = outer * inner;
  bool indices = !kl_dtype_is_float(l->dtype);
  host_comment(e, n);
  char scr[160], px[160], pl[160], py[160];
  if (items == 0) {
    if (red == RED_NONE) return 0;
    /* sum 0, mean 0/0 */
    kl_cg_scratch(e, 16, scr, sizeof scr);
    emit_final(e, n, scr, 0, red, false);
    return 0;
  }
  const char *lt = loss_type(n), *sf = kl_cg_real_suffix(lt);
  if (red != RED_NONE) kl_cg_scratch(e, (size_t)items * (x->dtype == KL_F64 ? 8 : 4), scr, sizeof scr);
  char name[32], b1[128], at[96];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[4] = {in_arg(x, "x"), in_arg(l, "labels"),
               red == RED_NONE ? out_arg(y->dtype, "out") : (karg){"", "loss_"},
               {"unsigned *", "bad_"}};
  if (red != RED_NONE) snprintf(a[2].type, sizeof a[2].type, "%s *", lt);
  int na = indices ? 4 : 3;
  char flag[160] = "";
  int flag_no = indices ? kl_cg_flag(e, flag, sizeof flag) : -1;
  kbegin(f, n, name, red == RED_NONE ? " per item" : " per item (then reduced)", a, na);
  loop(f, items);
  fprintf(f, "    const int64_t base = (i / %lldLL) * %lldLL + i %% %lldLL;\n", (ll)inner,
          (ll)(c * inner), (ll)inner);
  snprintf(at, sizeof at, "x[base + j * %lldLL]", (ll)inner);
  fprintf(f, "    %s m = -KL_INF;\n"
             "    for (int64_t j = 0; j < %lldLL; j++) {\n"
             "      const %s v = %s;\n"
             "      if (v > m || v != v) m = v;\n    }\n", lt, (ll)c, lt, ld(b1, sizeof b1, x->dtype, lt, at));
  fprintf(f, "    %s s = 0;\n"
             "    for (int64_t j = 0; j < %lldLL; j++) s += exp%s(%s - m);\n"
             "    const %s lse = m + log%s(s);\n", lt, (ll)c, sf, ld(b1, sizeof b1, x->dtype, lt, at), lt, sf);
  if (indices) {
    snprintf(at, sizeof at, "x[base + lab * %lldLL]", (ll)inner);
    fprintf(f, "    const int64_t lab = (int64_t)labels[i];\n"
               "    %s loss = KL_NAN;\n"
               "    if (lab >= 0 && lab < %lldLL) loss = lse - %s;\n"
               "    else atomicMax(bad_, 0xFFFFFFFFu - (unsigned)i);\n", lt, (ll)c,
            ld(b1, sizeof b1, x->dtype, lt, at));
  } else {
    char b2[128], at2[96];
    snprintf(at2, sizeof at2, "labels[base + j * %lldLL]", (ll)inner);
    fprintf(f, "    %s loss = 0;\n"
               "    for (int64_t j = 0; j < %lldLL; j++) {\n"
               "      const %s p = %s;\n"
               "      if (p != 0) loss -= p * (%s - lse);\n    }\n", lt, (ll)c, lt,
            ld(b2, sizeof b2, l->dtype, lt, at2), ld(b1, sizeof b1, x->dtype, lt, at));
  }
  fprintf(f, "    ");
  if (red == RED_NONE) st(f, y->dtype, "out[i]", "loss");
  else fprintf(f, "loss_[i] = loss;\n");
  fprintf(f, "  }\n");
  kend(f, name, a, na);
  const char *args[4] = {kl_cg_ptr(e, x, px, sizeof px), kl_cg_ptr(e, l, pl, sizeof pl),
                         red == RED_NONE ? kl_cg_ptr(e, y, py, sizeof py) : scr, flag};
  kl_cg_launch(e, k, items, args, na);
  if (indices) kl_cg_flag_check(e, flag_no, n, "label", c);
  if (red != RED_NONE) emit_final(e, n, scr, items, red, false);
  return 0;
}

static bool handles_nll(const kl_node *n) {
  return n->op == KL_OP_NLL_LOSS && kl_dtype_is_float(n->inputs[0]->dtype);
}

/* One thread per item: loss = -x[b, t, ...] * weight[t] and its weight,
 * both 0 where t is the ignore_index; NaN for a target out of range (the
 * interpreter's run-time error). */
/* The per-item losses and weights before the reduction (16 bytes for
 * none), and the bad-target flag. */
static int scratch_nll(const kl_node *n, size_t *bytes) {
  const kl_value *x = n->inputs[0];
  int64_t nb = x->shape.dims[0], c = x->shape.dims[1], count = 0;
  int64_t inner = nb > 0 && c > 0 ? kl_shape_numel(&x->shape) / (nb * c) : 0;
  int64_t items = nb * inner;
  reduction red = get_reduction(n);
  if (items == 0) {
    if (red != RED_NONE) bytes[count++] = 16;
    return (int)count;
  }
  if (red != RED_NONE) bytes[count++] = (size_t)items * 2 * (x->dtype == KL_F64 ? 8 : 4);
  return (int)count;
}

static int emit_nll(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *t = n->inputs[1], *y = n->outputs[0];
  const kl_value *w = n->ninputs > 2 ? n->inputs[2] : NULL;
  reduction red = get_reduction(n);
  bool has_ii = kl_node_attr(n, "ignore_index") != NULL;
  int64_t ii = kl_attr_int(n, "ignore_index", 0);
  int64_t nb = x->shape.dims[0], c = x->shape.dims[1];
  int64_t inner = nb > 0 && c > 0 ? kl_shape_numel(&x->shape) / (nb * c) : 0;
  int64_t items = nb * inner;
  host_comment(e, n);
  char scr[160];
  if (items == 0) {
    if (red == RED_NONE) return 0;
    kl_cg_scratch(e, 16, scr, sizeof scr);
    emit_final(e, n, scr, 0, red, true);
    return 0;
  }
  const char *lt = loss_type(n);
  char one[32];
  snprintf(one, sizeof one, "(%s)1", lt);
  if (red != RED_NONE) kl_cg_scratch(e, (size_t)items * 2 * (x->dtype == KL_F64 ? 8 : 4), scr, sizeof scr);
  char name[32], b1[128], b2[128];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[5];
  int na = 0;
  char flag[160];
  int flag_no = kl_cg_flag(e, flag, sizeof flag);
  a[na++] = in_arg(x, "x");
  a[na++] = in_arg(t, "target");
  if (w) a[na++] = in_arg(w, "weight");
  a[na++] = red == RED_NONE ? out_arg(y->dtype, "out") : (karg){"", "loss_"};
  if (red != RED_NONE) snprintf(a[na - 1].type, sizeof a[na - 1].type, "%s *", lt);
  a[na++] = (karg){"unsigned *", "bad_"};
  kbegin(f, n, name, red == RED_NONE ? " per item" : " per item (then reduced)", a, na);
  loop(f, items);
  fprintf(f, "    const int64_t cls = (int64_t)target[i];\n"
             "    %s loss = 0, wt = 0;\n", lt);
  if (has_ii) fprintf(f, "    if (cls != %lldLL) {\n", (ll)ii);
  else fprintf(f, "    {\n");
  char at[96];
  snprintf(at, sizeof at, "x[((i / %lldLL) * %lldLL + cls) * %lldLL + i %% %lldLL]", (ll)inner,
           (ll)c, (ll)inner, (ll)inner);
  fprintf(f, "      if (cls < 0 || cls >= %lldLL) {\n"
             "        loss = KL_NAN;\n        wt = KL_NAN;\n"
             "        atomicMax(bad_, 0xFFFFFFFFu - (unsigned)i);\n"
             "      } else {\n"
             "        wt = %s;\n"
             "        loss = -%s * wt;\n      }\n    }\n",
          (ll)c, w ? ld(b2, sizeof b2, w->dtype, lt, "weight[cls]") : one,
          ld(b1, sizeof b1, x->dtype, lt, at));
  fprintf(f, "    ");
  if (red == RED_NONE) {
    st(f, y->dtype, "out[i]", "loss");
    fprintf(f, "    (void)wt;\n");
  } else {
    fprintf(f, "loss_[2 * i] = loss;\n    loss_[2 * i + 1] = wt;\n");
  }
  fprintf(f, "  }\n");
  kend(f, name, a, na);
  char bufs[4][160];
  const char *args[5];
  int nargs = 0;
  for (int i = 0; i < n->ninputs; i++) args[nargs] = kl_cg_ptr(e, n->inputs[i], bufs[nargs], 160), nargs++;
  args[nargs++] = red == RED_NONE ? kl_cg_ptr(e, y, bufs[3], 160) : scr;
  args[nargs++] = flag;
  kl_cg_launch(e, k, items, args, nargs);
  kl_cg_flag_check(e, flag_no, n, "target", c);
  if (red != RED_NONE) emit_final(e, n, scr, items, red, true);
  return 0;
}

/* ---- conv_transpose2d ------------------------------------------------------ */
static bool handles_tconv(const kl_node *n) {
  return n->op == KL_OP_CONV_TRANSPOSE2D && kl_dtype_is_float(n->outputs[0]->dtype);
}

/* One thread per output element (b, oc, oy, ox), gathering what the
 * interpreter scatters: input pixel (iy, ix) reaches oy when
 * oy = iy * stride - pad + ky * dil. */
static int emit_tconv(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
  const int64_t *xd = x->shape.dims;
  int64_t nb = xd[0], c = xd[1], h = xd[2], wi = xd[3];
  int64_t groups = kl_attr_int(n, "groups", 1), cpg = c / groups, mpg = w->shape.dims[1];
  int64_t m = mpg * groups, kh = w->shape.dims[2], kw = w->shape.dims[3];
  int64_t stride[2], pad[4], dil[2];
  ints_or(n, "strides", 2, 1, stride);
  ints_or(n, "pads", 4, 0, pad);
  ints_or(n, "dilations", 2, 1, dil);
  int64_t oh = y->shape.dims[2], ow = y->shape.dims[3], total = kl_shape_numel(&y->shape);
  host_comment(e, n);
  if (total == 0) return 0;
  char name[32], b1[128], b2[128];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[4];
  int na = 0;
  a[na++] = in_arg(x, "x");
  a[na++] = in_arg(w, "w");
  if (n->ninputs > 2) a[na++] = in_arg(n->inputs[2], "bias");
  a[na++] = out_arg(y->dtype, "out");
  kbegin(f, n, name, "", a, na);
  loop(f, total);
  fprintf(f, "    const int64_t ox = i %% %lldLL, oy = (i / %lldLL) %% %lldLL;\n"
             "    const int64_t oc = (i / %lldLL) %% %lldLL, b = i / %lldLL;\n"
             "    const int64_t g = oc / %lldLL, j = oc %% %lldLL;\n",
          (ll)ow, (ll)ow, (ll)oh, (ll)(oh * ow), (ll)m, (ll)(m * oh * ow), (ll)mpg, (ll)mpg);
  const char *ct = kl_cg_real_type(y->dtype);
  if (n->ninputs > 2)
    fprintf(f, "    %s acc = %s;\n", ct, ld(b1, sizeof b1, n->inputs[2]->dtype, ct, "bias[oc]"));
  else
    fprintf(f, "    %s acc = 0;\n", ct);
  fprintf(f, "    for (int64_t icl = 0; icl < %lldLL; icl++) {\n"
             "      const int64_t ic = g * %lldLL + icl;\n"
             "      for (int64_t ky = 0; ky < %lldLL; ky++) {\n"
             "        const int64_t ty = oy + %lldLL - ky * %lldLL;\n"
             "        if (ty < 0 || ty %% %lldLL != 0 || ty / %lldLL >= %lldLL) continue;\n"
             "        const int64_t iy = ty / %lldLL;\n"
             "        for (int64_t kx = 0; kx < %lldLL; kx++) {\n"
             "          const int64_t tx = ox + %lldLL - kx * %lldLL;\n"
             "          if (tx < 0 || tx %% %lldLL != 0 || tx / %lldLL >= %lldLL) continue;\n"
             "          const int64_t ix = tx / %lldLL;\n",
          (ll)cpg, (ll)cpg, (ll)kh, (ll)pad[0], (ll)dil[0], (ll)stride[0], (ll)stride[0], (ll)h,
          (ll)stride[0], (ll)kw, (ll)pad[1], (ll)dil[1], (ll)stride[1], (ll)stride[1], (ll)wi,
          (ll)stride[1]);
  char ax[96], aw[96];
  snprintf(ax, sizeof ax, "x[((b * %lldLL + ic) * %lldLL + iy) * %lldLL + ix]", (ll)c, (ll)h, (ll)wi);
  snprintf(aw, sizeof aw, "w[((ic * %lldLL + j) * %lldLL + ky) * %lldLL + kx]", (ll)mpg, (ll)kh, (ll)kw);
  fprintf(f, "          acc += %s * %s;\n        }\n      }\n    }\n    ",
          ld(b1, sizeof b1, x->dtype, ct, ax), ld(b2, sizeof b2, w->dtype, ct, aw));
  st(f, y->dtype, "out[i]", "acc");
  fprintf(f, "  }\n");
  kend(f, name, a, na);
  kl_cg_launch_node(e, k, total, n);
  (void)nb;
  return 0;
}

/* ---- col2im -------------------------------------------------------------------- */
static bool handles_col2im(const kl_node *n) {
  kl_col2im_geom g;
  return n->op == KL_OP_COL2IM && kl_dtype_is_float(n->outputs[0]->dtype) &&
         !kl_col2im_geometry(n, &g);
}

/* One thread per image element (plane, p..), gathering what the
 * interpreter scatters: block element b lands on p when
 * p = q * stride - pad + b * dil for a block position q; the blocks are
 * visited in the interpreter's order, so each sum has its order. */
static int emit_col2im(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  kl_col2im_geom g;
  kl_col2im_geometry(n, &g);
  int s = g.s;
  int64_t k = 1, l = x->shape.dims[2], img = 1, total = kl_shape_numel(&y->shape);
  for (int i = 0; i < s; i++) k *= g.block[i], img *= g.image[i];
  host_comment(e, n);
  if (total == 0) return 0;
  char name[32], b1[128];
  int kn = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[2] = {in_arg(x, "x"), out_arg(y->dtype, "out")};
  kbegin(f, n, name, "", a, 2);
  loop(f, total);
  fprintf(f, "    const int64_t pl = i / %lldLL;\n    int64_t r = i %% %lldLL;\n", (ll)img, (ll)img);
  for (int d = s - 1; d >= 0; d--)
    fprintf(f, "    const int64_t p%d = r %% %lldLL;\n    r /= %lldLL;\n", d, (ll)g.image[d],
            (ll)g.image[d]);
  const char *ct = kl_cg_real_type(y->dtype);
  fprintf(f, "    %s acc = 0;\n"
             "    for (int64_t b = 0; b < %lldLL; b++) {\n"
             "      int64_t rb = b, q = 0;\n", ct, (ll)k);
  /* t%d: the padded position of block element b's row on axis d, a
   * multiple of the stride below nblk strides when it comes from a block */
  for (int d = s - 1; d >= 0; d--)
    fprintf(f, "      const int64_t t%d = p%d + %lldLL - (rb %% %lldLL) * %lldLL;\n"
               "      rb /= %lldLL;\n"
               "      if (t%d < 0 || t%d %% %lldLL != 0 || t%d / %lldLL >= %lldLL) continue;\n",
            d, d, (ll)g.pad[d], (ll)g.block[d], (ll)g.dil[d], (ll)g.block[d], d, d,
            (ll)g.stride[d], d, (ll)g.stride[d], (ll)g.nblk[d]);
  int64_t qs = 1;
  for (int d = s - 1; d >= 0; d--) {
    fprintf(f, "      q += t%d / %lldLL * %lldLL;\n", d, (ll)g.stride[d], (ll)qs);
    qs *= g.nblk[d];
  }
  fprintf(f, "      (void)rb;\n");
  char at[96];
  snprintf(at, sizeof at, "x[(pl * %lldLL + b) * %lldLL + q]", (ll)k, (ll)l);
  fprintf(f, "      acc += %s;\n    }\n    (void)r;\n    ", ld(b1, sizeof b1, x->dtype, ct, at));
  st(f, y->dtype, "out[i]", "acc");
  fprintf(f, "  }\n");
  kend(f, name, a, 2);
  kl_cg_launch_node(e, kn, total, n);
  return 0;
}

/* ---- resize ------------------------------------------------------------------ */
/* The interpreter's tap computation (ir/ops_sample.c) runs here, at compile
 * time: shapes are static, so every axis's taps (input index, weight) are
 * tables in kernels.cu and the kernel only sums. */
enum { RESIZE_MAX_TABLE = 1 << 20 }; /* taps in all, beyond which: no template */

static bool handles_resize(const kl_node *n) {
  kl_resize_taps tp;
  if (n->op != KL_OP_RESIZE || n->inputs[0]->dtype == KL_BOOL || n->inputs[0]->shape.rank < 1 ||
      kl_resize_tap_at(n, 0, 0, &tp))
    return false;
  int64_t total = 0; /* every output index of an axis has as many taps */
  for (int d = 0; d < n->outputs[0]->shape.rank; d++) {
    if (kl_resize_tap_at(n, d, 0, &tp)) return false;
    total += (tp.ntap > 4 ? tp.ntap : 4) * n->outputs[0]->shape.dims[d];
  }
  return total <= RESIZE_MAX_TABLE;
}

static int emit_resize(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  int rank = x->shape.rank;
  const int64_t *sizes = y->shape.dims;
  int64_t total = kl_shape_numel(&y->shape);
  host_comment(e, n);
  if (total == 0) return 0;
  char name[32], b1[128];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  int64_t xs[KL_MAX_RANK];
  kl_shape_strides(&x->shape, xs);
  /* weights and sums in float for half and f32 tensors; double for f64 and
   * integers (an int64 element needs more than a float's 24 bits) */
  const char *ct = kl_cg_real_type(x->dtype);
  /* Per axis: nt[d] taps per output index (the nonzero ones, in order; the
   * rest padded with weight 0, which the sum skips as the interpreter
   * does); index -1 on the first tap marks "extrapolate". */
  int nt[KL_MAX_RANK];
  bool any_outside = false;
  for (int d = 0; d < rank; d++) {
    nt[d] = 1;
    for (int64_t o = 0; o < sizes[d]; o++) {
      kl_resize_taps tp;
      kl_resize_tap_at(n, d, o, &tp);
      int nz = 0;
      for (int t = 0; t < tp.ntap; t++) nz += tp.w[t] != 0;
      if (nz > nt[d]) nt[d] = nz;
      any_outside |= tp.ntap == 0;
    }
    fprintf(f, "__device__ const int64_t %s_i%d[%lld] = {", name, d, (ll)(sizes[d] * nt[d]));
    for (int64_t o = 0; o < sizes[d]; o++) {
      kl_resize_taps tp;
      kl_resize_tap_at(n, d, o, &tp);
      int put = 0;
      for (int t = 0; t < tp.ntap; t++)
        if (tp.w[t] != 0) fprintf(f, "%s%lld", o || put ? ", " : "", (ll)(tp.idx[t] * xs[d])), put++;
      for (; put < nt[d]; put++) fprintf(f, "%s%d", o || put ? ", " : "", tp.ntap == 0 && put == 0 ? -1 : 0);
    }
    fprintf(f, "};\n__device__ const %s %s_w%d[%lld] = {", ct, name, d, (ll)(sizes[d] * nt[d]));
    for (int64_t o = 0; o < sizes[d]; o++) {
      kl_resize_taps tp;
      kl_resize_tap_at(n, d, o, &tp);
      int put = 0;
      for (int t = 0; t < tp.ntap; t++)
        if (tp.w[t] != 0) fprintf(f, "%s%.17g", o || put ? ", " : "", tp.w[t]), put++;
      for (; put < nt[d]; put++) fprintf(f, "%s0", o || put ? ", " : "");
    }
    fprintf(f, "};\n");
  }
  karg a[2] = {in_arg(x, "x"), out_arg(y->dtype, "out")};
  kbegin(f, n, name, "", a, 2);
  loop(f, total);
  fprintf(f, "    int64_t r = i;\n");
  for (int d = rank - 1; d >= 0; d--)
    fprintf(f, "    const int64_t o%d = (r %% %lldLL) * %d;\n    r /= %lldLL;\n", d, (ll)sizes[d],
            nt[d], (ll)sizes[d]);
  fprintf(f, "    %s acc = 0;\n", ct);
  if (any_outside) {
    fprintf(f, "    if (");
    for (int d = 0; d < rank; d++) fprintf(f, "%s%s_i%d[o%d] < 0", d ? " || " : "", name, d, d);
    fprintf(f, ") {\n      acc = (%s)%.17g;\n    } else {\n", ct,
            kl_attr_float(n, "extrapolation_value", 0.0));
  } else {
    fprintf(f, "    {\n");
  }
  for (int d = 0; d < rank; d++) {
    int ind = 6 + 2 * d;
    fprintf(f, "%*sfor (int t%d = 0; t%d < %d; t%d++) {\n", ind, "", d, d, nt[d], d);
    if (d == 0)
      fprintf(f, "%*s  const %s w0 = %s_w0[o0 + t0];\n"
                 "%*s  const int64_t f0 = %s_i0[o0 + t0];\n", ind, "", ct, name, ind, "", name);
    else
      fprintf(f, "%*s  const %s w%d = w%d * %s_w%d[o%d + t%d];\n"
                 "%*s  const int64_t f%d = f%d + %s_i%d[o%d + t%d];\n",
              ind, "", ct, d, d - 1, name, d, d, d, ind, "", d, d - 1, name, d, d, d);
  }
  char at[32];
  snprintf(at, sizeof at, "x[f%d]", rank - 1);
  fprintf(f, "%*s  if (w%d != 0) acc += w%d * %s;\n", 6 + 2 * rank - 2, "", rank - 1, rank - 1,
          ld(b1, sizeof b1, x->dtype, ct, at));
  for (int d = rank - 1; d >= 0; d--) fprintf(f, "%*s}\n", 6 + 2 * d, "");
  fprintf(f, "    }\n    ");
  if (kl_dtype_is_float(y->dtype)) st(f, y->dtype, "out[i]", "acc");
  else st(f, y->dtype, "out[i]", "acc != acc ? 0 : (int64_t)acc");
  fprintf(f, "  }\n");
  kend(f, name, a, 2);
  kl_cg_launch_node(e, k, total, n);
  return 0;
}

/* ---- det ------------------------------------------------------------------------ */
static bool handles_det(const kl_node *n) {
  return n->op == KL_OP_DET && kl_dtype_is_float(n->inputs[0]->dtype);
}

/* One thread per matrix: Gaussian elimination with partial pivoting in
 * double on a private copy in scratch, as the interpreter's lu_det. */
/* A private copy of each matrix, in double. */
static int scratch_det(const kl_node *n, size_t *bytes) {
  const kl_value *x = n->inputs[0];
  int64_t nn = x->shape.dims[x->shape.rank - 1], batch = kl_shape_numel(&n->outputs[0]->shape);
  if (batch == 0) return 0;
  bytes[0] = (size_t)(batch * nn * nn) * sizeof(double) + 8;
  return 1;
}

static int emit_det(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  int64_t nn = x->shape.dims[x->shape.rank - 1], sz = nn * nn, batch = kl_shape_numel(&y->shape);
  host_comment(e, n);
  if (batch == 0) return 0;
  char name[32], b1[128], scr[160], px[160], py[160];
  kl_cg_scratch(e, (size_t)(batch * sz) * sizeof(double) + 8, scr, sizeof scr);
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[3] = {in_arg(x, "x"), {"double *", "work"}, out_arg(y->dtype, "out")};
  kbegin(f, n, name, "", a, 3);
  loop(f, batch);
  char at[64];
  snprintf(at, sizeof at, "x[i * %lldLL + j]", (ll)sz);
  fprintf(f, "    double *const w = work + i * %lldLL;\n"
             "    for (int64_t j = 0; j < %lldLL; j++) w[j] = %s;\n"
             "    double det = 1.0;\n"
             "    for (int64_t k = 0; k < %lldLL; k++) {\n"
             "      int64_t p = k;\n"
             "      for (int64_t r = k + 1; r < %lldLL; r++)\n"
             "        if (fabs(w[r * %lldLL + k]) > fabs(w[p * %lldLL + k])) p = r;\n"
             "      if (w[p * %lldLL + k] == 0) {\n        det = 0.0;\n        break;\n      }\n"
             "      if (p != k) {\n"
             "        for (int64_t j = 0; j < %lldLL; j++) {\n"
             "          const double t = w[k * %lldLL + j];\n"
             "          w[k * %lldLL + j] = w[p * %lldLL + j];\n"
             "          w[p * %lldLL + j] = t;\n"
             "        }\n        det = -det;\n      }\n"
             "      const double piv = w[k * %lldLL + k];\n"
             "      det *= piv;\n"
             "      for (int64_t r = k + 1; r < %lldLL; r++) {\n"
             "        const double q = w[r * %lldLL + k] / piv;\n"
             "        for (int64_t j = k + 1; j < %lldLL; j++) w[r * %lldLL + j] -= q * w[k * %lldLL + j];\n"
             "      }\n    }\n    ",
          (ll)sz, (ll)sz, ld(b1, sizeof b1, x->dtype, "double", at), (ll)nn, (ll)nn, (ll)nn, (ll)nn,
          (ll)nn, (ll)nn, (ll)nn, (ll)nn, (ll)nn, (ll)nn, (ll)nn, (ll)nn, (ll)nn, (ll)nn, (ll)nn,
          (ll)nn);
  st(f, y->dtype, "out[i]", "det");
  fprintf(f, "  }\n");
  kend(f, name, a, 3);
  const char *args[3] = {kl_cg_ptr(e, x, px, sizeof px), scr, kl_cg_ptr(e, y, py, sizeof py)};
  kl_cg_launch(e, k, batch, args, 3);
  return 0;
}

/* ---- attention ------------------------------------------------------------
 * softmax(softcap(scale * q @ k^T) + bias) @ v in one kernel, a warp per
 * query row, the scores never in memory: pass 1 has the lanes over the
 * keys, each keeping a running max and sum of exp (online softmax),
 * combined across the warp; pass 2 recomputes each lane's scores in
 * chunks of 32 keys, turns them into probabilities, and the warp
 * multiplies them into V with the lanes over V's columns (coalesced rows
 * of V, each probability shuffled from its lane).  Any number of keys; the
 * dot products are done twice rather than the scores stored.  The bias is
 * the interpreter's (ir/ops_contract.c, bias_at), in the same order;
 * arithmetic in float (double for f64), the probabilities kept in it for
 * the second product (ONNX rounds them to the input type first: for f16
 * that moves results by an ulp, the interpreter agrees).  scores >= 0: the
 * scores themselves are the output (pass 1, then the probabilities for
 * mode 3). */
static bool handles_attention(const kl_node *n) { return n->op == KL_OP_ATTENTION; }

typedef struct {
  const kl_node *n;
  const char *ct, *sf;
  int mask, lengths; /* input indices, -1 when absent */
  int64_t d, skv, sq, hq, mstride[4], mlen;
} attn_cg;

/* Statements setting `x` (the biased score), `s` (before the bias) and
 * `bias` of key j for query i, as bias_at in the interpreter. */
static void attention_score(FILE *f, const attn_cg *a, const char *ind) {
  const kl_node *n = a->n;
  const kl_value *q = n->inputs[0], *k = n->inputs[1];
  char b1[96], b2[96];
  double scale = kl_attr_float(n, "scale", 0), cap = kl_attr_float(n, "softcap", 0);
  if (scale == 0) scale = 1 / sqrt((double)a->d);
  fprintf(f, "%s%s dot = 0;\n%sfor (int64_t e = 0; e < %lldLL; e++)\n%s  dot += %s * %s;\n", ind,
          a->ct, ind, (ll)a->d, ind, ld(b1, sizeof b1, q->dtype, a->ct, "qr[e]"),
          ld(b2, sizeof b2, k->dtype, a->ct, "kb[j * D + e]"));
  fprintf(f, "%s%s s = dot * (%s)%.17g;\n", ind, a->ct, a->ct, scale);
  if (cap > 0)
    fprintf(f, "%ss = (%s)%.17g * tanh%s(s / (%s)%.17g);\n", ind, a->ct, cap, a->sf, a->ct, cap);
  fprintf(f, "%s%s bias = 0;\n", ind, a->ct);
  if (a->lengths >= 0) fprintf(f, "%sif (j >= klen) bias = -KL_INF;\n", ind);
  if (kl_attr_int(n, "causal", 0)) fprintf(f, "%sif (j > i + off) bias = -KL_INF;\n", ind);
  int64_t left = kl_attr_int(n, "window_left", -1), right = kl_attr_int(n, "window_right", -1);
  if (left >= 0) fprintf(f, "%sif (i + off - j > %lldLL) bias = -KL_INF;\n", ind, (ll)left);
  if (right >= 0) fprintf(f, "%sif (j - (i + off) > %lldLL) bias = -KL_INF;\n", ind, (ll)right);
  if (a->mask >= 0) {
    const kl_value *m = n->inputs[a->mask];
    char src[160], b3[200];
    snprintf(src, sizeof src, "mask[moff + j * %lldLL]", (ll)a->mstride[3]);
    fprintf(f, "%sif (bias != -KL_INF) {\n%s  if (j >= %lldLL) bias = -KL_INF;\n", ind, ind,
            (ll)a->mlen);
    if (m->dtype == KL_BOOL) fprintf(f, "%s  else if (!%s) bias = -KL_INF;\n", ind, src);
    else fprintf(f, "%s  else bias = %s;\n", ind, ld(b3, sizeof b3, m->dtype, a->ct, src));
    fprintf(f, "%s}\n", ind);
  }
  fprintf(f, "%sconst %s x = s + bias;\n", ind, a->ct);
}

/* The probability of the score x, after pass 1 (m, l, any). */
static const char *attention_prob(const attn_cg *a, char *buf, size_t len) {
  snprintf(buf, len, "(!any || x == -KL_INF) ? (%s)0 : exp%s(x - m) / l", a->ct, a->sf);
  return buf;
}

static int emit_attention(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2], *y = n->outputs[0];
  const int64_t *Q = q->shape.dims, *K = k->shape.dims;
  int mode = (int)kl_attr_int(n, "scores", -1);
  attn_cg a = {.n = n, .mask = -1, .lengths = -1, .d = Q[3], .skv = K[2], .sq = Q[2], .hq = Q[1]};
  bool dbl = q->dtype == KL_F64;
  a.ct = dbl ? "double" : "float", a.sf = dbl ? "" : "f";
  for (int i = 3; i < n->ninputs; i++) {
    kl_dtype t = n->inputs[i]->dtype;
    if (t == KL_I64 || t == KL_I32) a.lengths = i;
    else a.mask = i;
  }
  if (a.mask >= 0) {
    const kl_shape *ms = &n->inputs[a.mask]->shape;
    int64_t d4[4], st = 1;
    for (int d = 0; d < 4; d++) d4[d] = d < 4 - ms->rank ? 1 : ms->dims[d - (4 - ms->rank)];
    for (int d = 3; d >= 0; d--) a.mstride[d] = d4[d] == 1 ? 0 : st, st *= d4[d];
    a.mstride[3] = 1, a.mlen = d4[3];
  }
  int64_t rows = Q[0] * Q[1] * Q[2], dv = v->shape.dims[3], ncols = mode < 0 ? dv : a.skv;
  int64_t group = Q[1] / K[1], nt = (dv + 31) / 32;
  host_comment(e, n);
  if (rows == 0 || ncols == 0) return 0;
  char name[32], what[64], b1[160], b2[200];
  int kn = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  static const char *const pnames[] = {"q", "k", "v", NULL, NULL};
  karg args[6];
  int na = 0;
  for (int i = 0; i < n->ninputs; i++)
    args[na++] = in_arg(n->inputs[i], i == a.mask ? "mask" : i == a.lengths ? "lens" : pnames[i]);
  args[na++] = out_arg(y->dtype, "out");
  snprintf(what, sizeof what, mode < 0 ? " (a warp per query row)" : " (scores, mode %d)", mode);
  kbegin(f, n, name, what, args, na);
  fprintf(f, "  const int lane = threadIdx.x & 31;\n"
             "  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);\n"
             "  if (row >= %lldLL) return;\n  const int64_t D = %lldLL;\n"
             "  const int64_t i = row %% %lldLL, h = (row / %lldLL) %% %lldLL, b = row / %lldLL;\n"
             "  (void)i;\n  (void)b;\n",
          (ll)rows, (ll)a.d, (ll)a.sq, (ll)a.sq, (ll)a.hq, (ll)(a.sq * a.hq));
  fprintf(f, "  const int64_t kvh = b * %lldLL + h / %lldLL;\n  (void)kvh;\n", (ll)K[1], (ll)group);
  fprintf(f, "  const %s *qr = q + row * D;\n  const %s *kb = k + kvh * %lldLL;\n",
          kl_cg_storage(q->dtype), kl_cg_storage(k->dtype), (ll)(a.skv * a.d));
  /* the keys before query 0 (causal and window rules), and the key count */
  bool offset = kl_attr_int(n, "causal", 0) || kl_attr_int(n, "window_left", -1) >= 0 ||
                kl_attr_int(n, "window_right", -1) >= 0;
  if (a.lengths >= 0) fprintf(f, "  const int64_t klen = lens[b];\n");
  if (offset && a.lengths >= 0) fprintf(f, "  const int64_t off = klen - %lldLL;\n", (ll)a.sq);
  else if (offset) fprintf(f, "  const int64_t off = %lldLL;\n", (ll)kl_attr_int(n, "past", 0));
  if (a.mask >= 0)
    fprintf(f, "  const int64_t moff = b * %lldLL + h * %lldLL + i * %lldLL;\n", (ll)a.mstride[0],
            (ll)a.mstride[1], (ll)a.mstride[2]);
  fprintf(f, "  const int64_t SKV = %lldLL, DV = %lldLL;\n  (void)SKV;\n  (void)DV;\n", (ll)a.skv,
          (ll)dv);
  if (mode >= 0 && mode <= 2) { /* the scores, no softmax */
    fprintf(f, "  for (int64_t j = lane; j < SKV; j += 32) {\n");
    attention_score(f, &a, "    ");
    fprintf(f, "    (void)x;\n    (void)s;\n    ");
    st(f, y->dtype, "out[row * SKV + j]", mode == 2 ? "x" : "s");
    fprintf(f, "  }\n");
    kend(f, name, args, na);
    kl_cg_launch_node_grid(e, kn, (rows + 3) / 4, 128, n);
    return 0;
  }
  /* pass 1: each lane's running max m and sum l over its keys; any: a key
   * with a bias other than -inf */
  fprintf(f, "  %s m = -KL_INF, l = 0;\n  int any = 0;\n", a.ct);
  fprintf(f, "  for (int64_t j = lane; j < %lldLL; j += 32) {\n", (ll)a.skv);
  attention_score(f, &a, "    ");
  fprintf(f, "    (void)s;\n    any |= bias != -KL_INF;\n"
             "    if (x > m || x != x) {\n      l = m == -KL_INF ? (%s)0 : l * exp%s(m - x);\n"
             "      m = x;\n    }\n    if (x != -KL_INF) l += exp%s(x - m);\n  }\n",
          a.ct, a.sf, a.sf);
  fprintf(f, "  for (int o = 16; o > 0; o >>= 1) {\n"
             "    const %s m2 = __shfl_xor_sync(0xffffffffu, m, o);\n"
             "    const %s l2 = __shfl_xor_sync(0xffffffffu, l, o);\n"
             "    any |= __shfl_xor_sync(0xffffffffu, any, o);\n"
             "    const %s mn = m != m ? m : (m2 > m || m2 != m2) ? m2 : m;\n"
             "    l = (m == -KL_INF ? (%s)0 : l * exp%s(m - mn)) + (m2 == -KL_INF ? (%s)0 : l2 * exp%s(m2 - mn));\n"
             "    m = mn;\n  }\n",
          a.ct, a.ct, a.ct, a.ct, a.sf, a.ct, a.sf);
  if (mode == 3) {
    fprintf(f, "  for (int64_t j = lane; j < %lldLL; j += 32) {\n", (ll)a.skv);
    attention_score(f, &a, "    ");
    fprintf(f, "    (void)s;\n    ");
    st(f, y->dtype, "out[row * SKV + j]", attention_prob(&a, b2, sizeof b2));
    fprintf(f, "  }\n");
  } else {
    /* pass 2: chunks of 32 keys, a probability per lane, then each lane's
     * columns of V */
    fprintf(f, "  const %s *vb = v + kvh * %lldLL;\n  %s acc[%lld];\n"
               "  for (int t = 0; t < %lld; t++) acc[t] = 0;\n",
            kl_cg_storage(v->dtype), (ll)(a.skv * dv), a.ct, (ll)nt, (ll)nt);
    fprintf(f, "  for (int64_t j0 = 0; j0 < %lldLL; j0 += 32) {\n    %s p = 0;\n"
               "    {\n      const int64_t j = j0 + lane;\n      if (j < %lldLL) {\n",
            (ll)a.skv, a.ct, (ll)a.skv);
    attention_score(f, &a, "        ");
    fprintf(f, "        (void)s;\n        p = %s;\n      }\n    }\n",
            attention_prob(&a, b2, sizeof b2));
    fprintf(f, "    const int64_t nj = %lldLL - j0 < 32 ? %lldLL - j0 : 32;\n"
               "    for (int jj = 0; jj < nj; jj++) {\n"
               "      const %s pj = __shfl_sync(0xffffffffu, p, jj);\n"
               "      for (int t = 0; t < %lld; t++) {\n        const int64_t c = lane + 32 * t;\n"
               "        if (c < %lldLL) acc[t] += pj * %s;\n      }\n    }\n  }\n",
            (ll)a.skv, (ll)a.skv, a.ct, (ll)nt, (ll)dv,
            ld(b1, sizeof b1, v->dtype, a.ct, "vb[(j0 + jj) * DV + c]"));
    fprintf(f, "  for (int t = 0; t < %lld; t++) {\n    const int64_t c = lane + 32 * t;\n"
               "    if (c < %lldLL) ", (ll)nt, (ll)dv);
    st(f, y->dtype, "out[row * DV + c]", "acc[t]");
    fprintf(f, "  }\n");
  }
  kend(f, name, args, na);
  kl_cg_launch_node_grid(e, kn, (rows + 3) / 4, 128, n);
  return 0;
}

/* ---- rotary ---------------------------------------------------------------
 * Elementwise over x: each output reads its pair's two entries and the
 * (b, s) row of cos and sin, as the interpreter (ir/ops_nn.c). */
static bool handles_rotary(const kl_node *n) { return n->op == KL_OP_ROTARY; }

static int emit_rotary(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  const kl_shape *xs = &x->shape, *cs = &n->inputs[1]->shape;
  /* heads h, positions s, head size d, and the stride of s in x */
  int64_t numel = kl_shape_numel(xs), h, s, d, ss;
  if (xs->rank == 4) {
    h = xs->dims[1], s = xs->dims[2], d = xs->dims[3], ss = d;
  } else {
    h = kl_attr_int(n, "num_heads", 1), s = xs->dims[1], d = xs->dims[2] / h, ss = h * d;
  }
  int64_t r = kl_attr_int(n, "rotary_dim", 0);
  if (r == 0) r = d;
  int64_t half = r / 2, cb = cs->rank == 3 && cs->dims[0] > 1 ? s * half : 0;
  bool inter = kl_attr_int(n, "interleaved", 0) != 0;
  host_comment(e, n);
  if (numel == 0) return 0;
  char name[32], b1[96], b2[96], b3[96], b4[96], val[256];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  karg a[4] = {in_arg(x, "x"), in_arg(n->inputs[1], "cs"), in_arg(n->inputs[2], "sn"),
               out_arg(y->dtype, "out")};
  kbegin(f, n, name, inter ? " (interleaved pairs)" : " (pairs of halves)", a, 4);
  const char *ct = x->dtype == KL_F64 ? "double" : "float";
  loop(f, numel);
  fprintf(f, "    const int64_t d = i %% %lldLL, s = (i / %lldLL) %% %lldLL, bt = i / %lldLL;\n",
          (ll)d, (ll)ss, (ll)s, (ll)(h * s * d));
  fprintf(f, "    if (d >= %lldLL) {\n      out[i] = x[i];\n      continue;\n    }\n", (ll)r);
  if (inter)
    fprintf(f, "    const int64_t p = d / 2, i1 = i - d + 2 * p, i2 = i1 + 1;\n"
               "    const int first = (d & 1) == 0;\n");
  else
    fprintf(f, "    const int64_t p = d %% %lldLL, i1 = i - d + p, i2 = i1 + %lldLL;\n"
               "    const int first = d < %lldLL;\n", (ll)half, (ll)half, (ll)half);
  fprintf(f, "    const int64_t o = bt * %lldLL + s * %lldLL + p;\n", (ll)cb, (ll)half);
  fprintf(f, "    const %s x1 = %s, x2 = %s, c = %s, sv = %s;\n", ct, ld(b1, sizeof b1, x->dtype, ct, "x[i1]"),
          ld(b2, sizeof b2, x->dtype, ct, "x[i2]"), ld(b3, sizeof b3, n->inputs[1]->dtype, ct, "cs[o]"),
          ld(b4, sizeof b4, n->inputs[2]->dtype, ct, "sn[o]"));
  snprintf(val, sizeof val, "first ? x1 * c - x2 * sv : x1 * sv + x2 * c");
  fprintf(f, "    ");
  st(f, y->dtype, "out[i]", val);
  fprintf(f, "  }\n");
  kend(f, name, a, 4);
  kl_cg_launch_node(e, k, numel, n);
  return 0;
}

/* ---- linear_attention -------------------------------------------------------
 * A thread per (batch, key/value head, state column m): column m of the
 * state evolves on its own (the decay, the delta rule's S^T k and the
 * write touch only it), so each thread keeps its Dk entries in registers
 * and walks the time steps, writing every query head's output column m;
 * the threads of a warp read the same q and k entries (broadcast loads)
 * and neighbouring v, y and state entries.  As ir/ops_contract.c, in
 * float (double for f64). */
static bool handles_linear_attention(const kl_node *n) { return n->op == KL_OP_LINEAR_ATTENTION; }

static int emit_linear_attention(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *q = n->inputs[0], *kv = n->inputs[1], *v = n->inputs[2];
  const kl_value *y = n->outputs[0], *sv = n->outputs[1];
  const char *rule = kl_attr_string(n, "rule", "");
  bool gated = !strcmp(rule, "gated") || !strcmp(rule, "gated_delta");
  bool delta = !strcmp(rule, "delta") || !strcmp(rule, "gated_delta");
  int past = kl_attr_int(n, "past", 0) ? 3 : -1, k = 3 + (past > 0);
  int decay = gated ? k++ : -1, beta = delta ? k++ : -1;
  int64_t hq = kl_attr_int(n, "q_heads", 1), hkv = kl_attr_int(n, "kv_heads", 1);
  int64_t B = q->shape.dims[0], T = q->shape.dims[1], dk = kv->shape.dims[2] / hkv;
  int64_t dv = v->shape.dims[2] / hkv, group = hq / hkv, threads = B * hkv * dv;
  int64_t dl = decay > 0 ? n->inputs[decay]->shape.dims[2] : 0;
  int64_t bl = beta > 0 ? n->inputs[beta]->shape.dims[2] : 0;
  double scale = kl_attr_float(n, "scale", 0);
  if (scale == 0) scale = 1 / sqrt((double)dk);
  bool dbl = q->dtype == KL_F64;
  const char *ct = dbl ? "double" : "float", *sf = dbl ? "" : "f";
  host_comment(e, n);
  if (threads == 0) return 0;
  char name[32], b1[128], b2[128];
  int kn = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  static const char *const pnames[] = {"q", "k", "v", "past", "decay", "beta"};
  karg a[8];
  int na = 0;
  for (int i = 0; i < n->ninputs; i++)
    a[na++] = in_arg(n->inputs[i], pnames[i == past ? 3 : i == decay ? 4 : i == beta ? 5 : i]);
  a[na++] = out_arg(y->dtype, "y");
  a[na++] = out_arg(sv->dtype, "state");
  kbegin(f, n, name, " (a thread per state column)", a, na);
  loop(f, threads);
  fprintf(f, "    const int64_t DK = %lldLL, DV = %lldLL, HKV = %lldLL;\n", (ll)dk, (ll)dv, (ll)hkv);
  fprintf(f, "    const int64_t m = i %% %lldLL, h = (i / %lldLL) %% %lldLL, b = i / %lldLL;\n", (ll)dv,
          (ll)dv, (ll)hkv, (ll)(dv * hkv));
  fprintf(f, "    %s S[%lld];\n    const int64_t so = (b * %lldLL + h) * %lldLL * %lldLL + m;\n", ct,
          (ll)dk, (ll)hkv, (ll)dk, (ll)dv);
  fprintf(f, "    for (int64_t d = 0; d < %lldLL; d++) S[d] = %s;\n", (ll)dk,
          past > 0 ? ld(b1, sizeof b1, n->inputs[past]->dtype, ct, "past[so + d * DV]") : "0");
  fprintf(f, "    for (int64_t t = 0; t < %lldLL; t++) {\n      const int64_t bt = b * %lldLL + t;\n",
          (ll)T, (ll)T);
  fprintf(f, "      const int64_t ko = (bt * %lldLL + h) * %lldLL;\n", (ll)hkv, (ll)dk);
  if (gated) {
    snprintf(b2, sizeof b2, "decay[bt * %lldLL + %s]", (ll)dl, dl == hkv ? "h" : "h * DK + d");
    fprintf(f, "      for (int64_t d = 0; d < %lldLL; d++) S[d] *= exp%s(%s);\n", (ll)dk, sf,
            ld(b1, sizeof b1, n->inputs[decay]->dtype, ct, b2));
  }
  fprintf(f, "      %s vt = %s;\n", ct, ld(b1, sizeof b1, v->dtype, ct, "v[(bt * HKV + h) * DV + m]"));
  if (delta) {
    fprintf(f, "      {\n        %s got = 0;\n        for (int64_t d = 0; d < %lldLL; d++)\n"
               "          got += S[d] * %s;\n",
            ct, (ll)dk, ld(b1, sizeof b1, kv->dtype, ct, "k[ko + d]"));
    snprintf(b2, sizeof b2, "beta[bt * %lldLL + %s]", (ll)bl, bl == 1 ? "0" : "h");
    fprintf(f, "        vt = %s * (vt - got);\n      }\n",
            ld(b1, sizeof b1, n->inputs[beta]->dtype, ct, b2));
  }
  fprintf(f, "      for (int64_t d = 0; d < %lldLL; d++) S[d] += %s * vt;\n", (ll)dk,
          ld(b1, sizeof b1, kv->dtype, ct, "k[ko + d]"));
  fprintf(f, "      for (int64_t g = 0; g < %lldLL; g++) {\n"
             "        const int64_t qo = (bt * %lldLL + h * %lldLL + g) * %lldLL;\n"
             "        %s acc = 0;\n        for (int64_t d = 0; d < %lldLL; d++) acc += %s * S[d];\n"
             "        ",
          (ll)group, (ll)hq, (ll)group, (ll)dk, ct, (ll)dk, ld(b1, sizeof b1, q->dtype, ct, "q[qo + d]"));
  snprintf(b2, sizeof b2, "(%s)%.17g * acc", ct, scale);
  st(f, y->dtype, "y[qo / DK * DV + m]", b2);
  fprintf(f, "      }\n    }\n    for (int64_t d = 0; d < %lldLL; d++) ", (ll)dk);
  st(f, sv->dtype, "state[so + d * DV]", "S[d]");
  fprintf(f, "  }\n");
  kend(f, name, a, na);
  char bufs[8][160];
  const char *args[8];
  for (int i = 0; i < n->ninputs; i++) args[i] = kl_cg_ptr(e, n->inputs[i], bufs[i], sizeof bufs[i]);
  args[n->ninputs] = kl_cg_ptr(e, y, bufs[n->ninputs], sizeof bufs[n->ninputs]);
  args[n->ninputs + 1] = kl_cg_ptr(e, sv, bufs[n->ninputs + 1], sizeof bufs[n->ninputs + 1]);
  kl_cg_launch(e, kn, threads, args, n->ninputs + 2);
  return 0;
}

/* ---- dft ---------------------------------------------------------------------- */
/* A direct O(n^2) transform, one thread per output bin: cuFFT is not there
 * on the host device (and the transforms ONNX models hold are short), so
 * the same summation runs everywhere.  The twiddles cos, sin(2 pi j / n)
 * are a table computed here in double, indexed by (k t) mod n: exact angles
 * without trigonometry in the kernel. */
enum { DFT_MAX_TABLE = 1 << 16 };

static bool handles_dft(const kl_node *n) {
  kl_dft_geom g;
  return n->op == KL_OP_DFT && kl_dtype_is_float(n->inputs[0]->dtype) &&
         !kl_dft_geometry(n, &g) && g.n <= DFT_MAX_TABLE;
}

static int emit_dft(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *y = n->outputs[0];
  kl_dft_geom g;
  kl_dft_geometry(n, &g);
  int64_t total = g.outer * g.nout * g.inner;
  host_comment(e, n);
  if (total == 0) return 0;
  const char *ct = ctype(y->dtype), *sfx = strcmp(ct, "double") ? "f" : "";
  char name[32], b1[160], b2[160];
  int kn = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  fprintf(f, "__device__ const %s %s_tw[%lld] = {", ct, name, (ll)(2 * g.n));
  for (int64_t j = 0; j < g.n; j++) {
    double a = 6.28318530717958647692528676655900577 * (double)j / (double)g.n; /* 2 pi j / n */
    fprintf(f, "%s%.17e%s, %.17e%s", j ? ", " : "", cos(a), sfx, sin(a), sfx);
  }
  fprintf(f, "};\n");
  bool irfft = g.inverse && g.onesided;
  int64_t terms = irfft ? g.n / 2 + 1 : g.n;
  if (terms > g.m) terms = g.m;
  karg a[2] = {in_arg(x, "x"), out_arg(y->dtype, "out")};
  kbegin(f, n, name, "", a, 2);
  loop(f, total);
  fprintf(f, "    const int64_t o = i / %lldLL, k = i / %lldLL %% %lldLL, in = i %% %lldLL;\n"
             "    %s re = 0%s;\n"
             "    for (int64_t t = 0; t < %lldLL; t++) {\n"
             "      const int64_t at = ((o * %lldLL + t) * %lldLL + in) * %d, j = (k * t) %% %lldLL;\n"
             "      const %s c = %s_tw[2 * j], s = %s%s_tw[2 * j + 1];\n",
          (ll)(g.nout * g.inner), (ll)g.inner, (ll)g.nout, (ll)g.inner, ct, irfft ? "" : ", im = 0", (ll)terms, (ll)g.m,
          (ll)g.inner, g.cin, (ll)g.n, ct, name, g.inverse ? "" : "-", name);
  fprintf(f, "      const %s xr = %s", ct, ld(b1, sizeof b1, x->dtype, ct, "x[at]"));
  if (g.cin == 2) fprintf(f, ", xi = %s;\n", ld(b2, sizeof b2, x->dtype, ct, "x[at + 1]"));
  else fprintf(f, ", xi = 0;\n");
  if (irfft)
    fprintf(f, "      re += (t == 0 || 2 * t == %lldLL ? 1 : 2) * (xr * c - xi * s);\n"
               "    }\n", (ll)g.n);
  else
    fprintf(f, "      re += xr * c - xi * s;\n      im += xr * s + xi * c;\n    }\n");
  char v[96];
  if (g.inverse) snprintf(v, sizeof v, "re / (%s)%lld", ct, (ll)g.n);
  else snprintf(v, sizeof v, "re");
  fprintf(f, "    ");
  st(f, y->dtype, g.cout == 2 ? "out[2 * i]" : "out[i]", v);
  if (g.cout == 2) {
    if (g.inverse) snprintf(v, sizeof v, "im / (%s)%lld", ct, (ll)g.n);
    else snprintf(v, sizeof v, "im");
    fprintf(f, "    ");
    st(f, y->dtype, "out[2 * i + 1]", v);
  }
  fprintf(f, "  }\n");
  kend(f, name, a, 2);
  kl_cg_launch_node(e, kn, total, n);
  return 0;
}

const kl_cg_template kl_cg_templates_nn[] = {
    {handles_linear_attention, emit_linear_attention, NULL},
    {handles_rotary, emit_rotary, NULL},
    {handles_attention, emit_attention, NULL},
    {handles_norm, emit_norm, NULL},
    {handles_batch_norm, emit_batch_norm, NULL},
    {handles_conv, emit_conv, scratch_conv},
    {handles_wgrad, emit_wgrad, scratch_wgrad},
    {handles_pool, emit_pool, NULL},
    {handles_pool_index, emit_pool_index, NULL},
    {handles_gap, emit_gap, NULL},
    {handles_cross_entropy, emit_cross_entropy, scratch_cross_entropy},
    {handles_nll, emit_nll, scratch_nll},
    {handles_tconv, emit_tconv, NULL},
    {handles_resize, emit_resize, NULL},
    {handles_col2im, emit_col2im, NULL},
    {handles_dft, emit_dft, NULL},
    {handles_det, emit_det, scratch_det},
    {NULL, NULL, NULL},
};
