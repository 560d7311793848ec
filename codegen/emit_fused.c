/* emit_fused.c - the kernel of a fusion group: elementwise nodes of one
 * output shape computed together, one thread per element.  Values that
 * stay inside the group live in registers; each is still rounded through
 * its storage type (f16, an i32's wrap, a bool's 0/1), so a fused kernel
 * computes exactly what the unfused kernels do. */
#include <string.h>

#include "codegen_impl.h"


static int index_of(const kl_value *const *vals, int n, const kl_value *v) {
  for (int k = 0; k < n; k++)
    if (vals[k] == v) return k;
  return -1;
}

/* Is v read by a member after position m? */
static bool read_later(kl_node *const *nodes, int n, int m, const kl_value *v) {
  for (int j = m + 1; j < n; j++)
    for (int i = 0; i < nodes[j]->ninputs; i++)
      if (nodes[j]->inputs[i] == v) return true;
  return false;
}

/* The register holding value v inside the kernel. */
static const char *reg(const kl_group_io *io, const kl_value *v, char *buf, size_t len) {
  int k = index_of(io->in, io->nin, v);
  if (k >= 0) snprintf(buf, len, "x%d", k);
  else snprintf(buf, len, "v%d", v->id);
  return buf;
}

void kl_cg_fused_params(FILE *f, const char *name, const kl_group_io *io) {
  fprintf(f, "KL_KERNEL void %s(", name);
  for (int k = 0; k < io->nin; k++)
    fprintf(f, "const %s *__restrict__ in%d, ", kl_cg_storage(io->in[k]->dtype), k);
  for (int k = 0; k < io->nout; k++)
    fprintf(f, "%s *__restrict__ out%d%s", kl_cg_storage(io->out[k]->dtype), k,
            k + 1 < io->nout ? ", " : ") {\n");
}

void kl_cg_fused_entry(FILE *f, const char *name, const kl_group_io *io) {
  fprintf(f, "KL_EMU_ENTRY(%s", name);
  for (int k = 0; k < io->nin; k++)
    fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(io->in[k]->dtype), k);
  for (int k = 0; k < io->nout; k++)
    fprintf(f, ", KL_ARG(%s *, %d)", kl_cg_storage(io->out[k]->dtype), io->nin + k);
  fprintf(f, ");\n\n");
}

/* A batch_norm member, as templates_nn.c's kernel computes it:
 * (x - mean[ch]) * (scale[ch] / sqrt(var[ch] + eps)) + bias[ch], ch the
 * element's index on axis 1. */
static void channel_affine(FILE *f, const kl_node *nd, const kl_group_io *io, bool later,
                           const char *idx, const char *store) {
  const kl_value *x = nd->inputs[0], *out = nd->outputs[0];
  int64_t inner = 1;
  for (int d = 2; d < x->shape.rank; d++) inner *= x->shape.dims[d];
  const char *ct = x->dtype == KL_F64 ? "double" : "float", *sf = x->dtype == KL_F64 ? "" : "f";
  char p[5][96], src[5][32], r[32];
  for (int i = 1; i < 5; i++) {
    snprintf(src[i], sizeof src[i], "in%d[ch]", index_of(io->in, io->nin, nd->inputs[i]));
    kl_cg_load(p[i], sizeof p[i], nd->inputs[i]->dtype, ct, src[i]);
  }
  if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
  fprintf(f, "    { /* %s: batch_norm, per channel */\n      const int64_t ch = (%s / %lldLL) %% %lldLL;\n",
          nd->name, idx, (long long)inner, (long long)x->shape.dims[1]);
  fprintf(f, "      const %s s = %s / sqrt%s(%s + (%s)%.17g);\n", ct, p[1], sf, p[4], ct,
          kl_attr_float(nd, "epsilon", 1e-5));
  char val[600];
  snprintf(val, sizeof val, "((%s)%s - %s) * s + %s", ct, reg(io, x, r, sizeof r), p[3], p[2]);
  fprintf(f, "      %s so; ", kl_cg_storage(out->dtype));
  kl_cg_store(f, out->dtype, "so", val);
  int ko = index_of(io->out, io->nout, out);
  char at[64];
  snprintf(at, sizeof at, store, ko);
  if (ko >= 0) fprintf(f, "      %s = so;\n", at);
  char buf[160];
  if (later)
    fprintf(f, "      v%d = %s;\n", out->id,
            kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), "so"));
  fprintf(f, "    }\n");
}

/* The end of a direct member's block: `sum` rounded once to the output's
 * type, stored if the group stores it, kept in a register if later
 * members read it. */
static void store_sum(FILE *f, const kl_value *out, const kl_group_io *io, bool later,
                      const char *store) {
  char at[64], buf[160];
  fprintf(f, "      %s so; ", kl_cg_storage(out->dtype));
  kl_cg_store(f, out->dtype, "so", "sum");
  int ko = index_of(io->out, io->nout, out);
  snprintf(at, sizeof at, store, ko);
  if (ko >= 0) fprintf(f, "      %s = so;\n", at);
  if (later)
    fprintf(f, "      v%d = %s;\n", out->id,
            kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), "so"));
  fprintf(f, "    }\n");
}

/* A convolution's strides, dilations and leading pads (top, left), each
 * defaulted as ONNX does. */
static void window_of(const kl_node *nd, int64_t *st, int64_t *dil, int64_t *pad) {
  const int64_t *v;
  st[0] = st[1] = dil[0] = dil[1] = 1;
  pad[0] = pad[1] = 0;
  if (kl_attr_ints(nd, "strides", &v) == 2) st[0] = v[0], st[1] = v[1];
  if (kl_attr_ints(nd, "dilations", &v) == 2) dil[0] = v[0], dil[1] = v[1];
  if (kl_attr_ints(nd, "pads", &v) == 4) pad[0] = v[0], pad[1] = v[1];
}

/* A convolution member's end: its bias (per output channel co) added to
 * `sum`, then rounded and stored as store_sum does. */
static void bias_and_store(FILE *f, const kl_node *nd, const kl_group_io *io, bool later,
                           const char *store, const char *acc) {
  char src[64], lb[96];
  if (nd->ninputs > 2) {
    snprintf(src, sizeof src, "in%d[co]", index_of(io->in, io->nin, nd->inputs[2]));
    fprintf(f, "      sum += %s;\n", kl_cg_load(lb, sizeof lb, nd->inputs[2]->dtype, acc, src));
  }
  store_sum(f, nd->outputs[0], io, later, store);
}

/* A conv2d member computed directly, one output element (idx) a thread:
 * the window's dot product, summed in double (float for f16/bf16, the
 * GEMM's f32 accumulation), plus the bias, rounded once -- what im2col +
 * GEMM computes, with no im2col matrix in memory.  Threads of a warp take
 * neighbouring output columns of one channel, so weight loads are the
 * same address (a broadcast) and input loads are adjacent. */
int64_t kl_cg_min_blocks = 264;

const kl_target *kl_cg_plan_target = &kl_cg_target;

/* The convolution a tiled kernel is being written for, and where its
 * kernel left the sum of the element at hand (tacc[u][t8]: the scalar
 * tiles; cacc[nt].c[i]: the tensor cores'). */
static const kl_node *tiled_conv;
static const char *tiled_conv_sum = "tacc[u][t8]";
/* The convolution a warp-an-output kernel is being written for. */
static const kl_node *split_conv;

/* Where output element idx of a convolution (output dims yd, mpg output
 * and cpg input channels a group) sits: its column (named ox), row oy,
 * channel co, batch item b, and c0, its group's first input channel. */
static void out_position(FILE *f, const int64_t *yd, int64_t mpg, int64_t cpg, const char *idx, const char *ox) {
  typedef long long ll;
  fprintf(f, "      int64_t q = %s;\n      const int64_t %s = q %% %lldLL; q /= %lldLL;\n"
             "      const int64_t oy = q %% %lldLL; q /= %lldLL;\n"
             "      const int64_t co = q %% %lldLL, b = q / %lldLL;\n"
             "      const int64_t c0 = co / %lldLL * %lldLL;\n",
          idx, ox, (ll)yd[3], (ll)yd[3], (ll)yd[2], (ll)yd[2], (ll)yd[1], (ll)yd[1], (ll)mpg, (ll)cpg);
}

/* A split member: the lanes of a warp (KL_CONV_LANES of them: 32 on a GPU)
 * take every KL_CONV_LANES-th element of the dot product, flattened over
 * (input channel, ky, kx) as w's rows are, so a warp's weight loads are
 * one row of w, consecutive; the partial sums meet through shuffles and
 * every lane holds the total (the epilogue runs on each; lane 0 stores).
 * With one lane (the host device) the order is the direct loop's. */
static void split_conv_sum(FILE *f, const kl_node *nd, const kl_group_io *io, const char *idx,
                           const char *acc) {
  typedef long long ll;
  const kl_value *x = nd->inputs[0], *w = nd->inputs[1], *out = nd->outputs[0];
  const int64_t *xd = x->shape.dims, *yd = out->shape.dims, *wd = w->shape.dims;
  int64_t groups = kl_attr_int(nd, "groups", 1), cpg = xd[1] / groups, mpg = yd[1] / groups;
  int64_t st[2], dil[2], pad[2], win = wd[2] * wd[3], K = cpg * win;
  window_of(nd, st, dil, pad);
  char lx[200], lw[160], src[160];
  snprintf(src, sizeof src, "in%d[((b * %lldLL + c0 + ci) * %lldLL + iy) * %lldLL + ix]",
           index_of(io->in, io->nin, x), (ll)xd[1], (ll)xd[2], (ll)xd[3]);
  kl_cg_load(lx, sizeof lx, x->dtype, acc, src);
  snprintf(src, sizeof src, "in%d[co * %lldLL + k]", index_of(io->in, io->nin, w), (ll)K);
  kl_cg_load(lw, sizeof lw, w->dtype, acc, src);
  fprintf(f, "    { /* %s: conv2d, a warp an output (K = %lld) */\n", nd->name, (ll)K);
  out_position(f, yd, mpg, cpg, idx, "ox");
  fprintf(f, "      %s sum = 0;\n      for (int64_t k = lane; k < %lldLL; k += KL_CONV_LANES) {\n"
             "        const int64_t ci = k / %lldLL, r = k %% %lldLL;\n"
             "        const int64_t iy = oy * %lldLL - %lldLL + r / %lldLL * %lldLL;\n"
             "        const int64_t ix = ox * %lldLL - %lldLL + r %% %lldLL * %lldLL;\n"
             "        if (iy >= 0 && iy < %lldLL && ix >= 0 && ix < %lldLL) sum += %s * %s;\n      }\n"
             "      for (int o = KL_CONV_LANES / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);\n",
          acc, (ll)K, (ll)win, (ll)win, (ll)st[0], (ll)pad[0], (ll)wd[3], (ll)dil[0], (ll)st[1], (ll)pad[1],
          (ll)wd[3], (ll)dil[1], (ll)xd[2], (ll)xd[3], lx, lw);
}

/* The member a strip kernel has summed (sout[sj] holds output i0 + sj). */
static const kl_node *strip_core;

/* The kl_strip_fma_* suffix that reads elements of type t straight into
 * sums of type acc (NULL: none; the elements go through a gather). */
static const char *strip_reader(kl_dtype t, const char *acc) {
  if (!strcmp(acc, "double")) return t == KL_F64 ? "f64" : NULL;
  return t == KL_F32 ? "f32" : t == KL_F16 ? "f16" : t == KL_BF16 ? "bf16" : NULL;
}

/* The taps of a strip convolution over f16 or bf16 input (stride 1):
 * each input row's span, the strip plus the window's width, is widened
 * to floats once (four at a time on the host device) and every tap reads
 * its floats there; where the span lies inside x it is read whole (a
 * neighbouring row's values past an edge, cleared by the tap's lanes),
 * else gathered with zeros. */
static void strip_conv_half_rows(FILE *f, const kl_node *nd, const kl_group_io *io, const char *acc,
                                 const char *lw, const char *reader) {
  typedef long long ll;
  const kl_value *x = nd->inputs[0], *w = nd->inputs[1];
  const int64_t *xd = x->shape.dims, *wd = w->shape.dims;
  int64_t st[2], dil[2], pad[2];
  window_of(nd, st, dil, pad);
  int64_t span = (wd[3] - 1) * dil[1];
  char lx[200];
  kl_cg_load(lx, sizeof lx, x->dtype, acc, "xr[b0 + j]");
  fprintf(f, "        for (int64_t ky = 0; ky < %lldLL; ky++) {\n"
             "          const int64_t iy = oy * %lldLL - %lldLL + ky * %lldLL;\n"
             "          if (iy < 0 || iy >= %lldLL) continue;\n"
             "          const %s *xr = xp + iy * %lldLL;\n          const %s *wr = wp + ky * %lldLL;\n",
          (ll)wd[2], (ll)st[0], (ll)pad[0], (ll)dil[0], (ll)xd[2], kl_cg_storage(x->dtype), (ll)xd[3],
          kl_cg_storage(w->dtype), (ll)wd[3]);
  fprintf(f, "          %s xrow[KL_STRIP + %lld];\n          const int64_t b0 = ox0 - %lldLL;\n"
             "          const int64_t at0 = (int64_t)(xr - in%d) + b0;\n"
             "          if (at0 >= 0 && at0 + KL_STRIP + %lldLL <= %lldLL)\n"
             "            kl_strip_widen_%s(xrow, xr + b0, KL_STRIP + %lld);\n"
             "          else\n            for (int j = 0; j < KL_STRIP + %lld; j++)\n"
             "              xrow[j] = b0 + j >= 0 && b0 + j < %lldLL ? %s : 0;\n",
          acc, (ll)span, (ll)pad[1], index_of(io->in, io->nin, x), (ll)span, (ll)kl_shape_numel(&x->shape),
          reader, (ll)span, (ll)span, (ll)xd[3], lx);
  fprintf(f, "          for (int64_t kx = 0; kx < %lldLL; kx++) {\n            const %s wv = %s;\n"
             "            const int64_t base = ox0 - %lldLL + kx * %lldLL;\n"
             "            int64_t lo = base >= 0 ? 0 : -base;\n"
             "            int64_t hi = base >= %lldLL ? 0 : %lldLL - base;\n"
             "            if (hi > ns) hi = ns;\n            if (lo > hi) lo = hi;\n"
             "            if (lo == 0 && hi == KL_STRIP) kl_strip_fma_f32(&sacc, xrow + kx * %lldLL, wv);\n"
             "            else if (lo < hi) kl_strip_fma_keep_f32(&sacc, xrow + kx * %lldLL, wv, lo, hi);\n"
             "          }\n        }\n      }\n    }\n",
          (ll)wd[3], acc, lw, (ll)pad[1], (ll)dil[1], (ll)xd[3], (ll)xd[3], (ll)dil[1], (ll)dil[1]);
}

/* A strip's convolution sums: outputs i0 .. i0 + ns - 1, consecutive
 * columns of one output row; each tap's weight is loaded once for the
 * strip and the columns it reaches are a run whose bounds are worked out
 * once (the padding), so on the host device the run vectorises.  Each
 * output sums in the direct loop's order. */
static void strip_conv_core(FILE *f, const kl_node *nd, const kl_group_io *io, const char *acc) {
  typedef long long ll;
  const kl_value *x = nd->inputs[0], *w = nd->inputs[1], *out = nd->outputs[0];
  const int64_t *xd = x->shape.dims, *yd = out->shape.dims, *wd = w->shape.dims;
  int64_t groups = kl_attr_int(nd, "groups", 1), cpg = xd[1] / groups, mpg = yd[1] / groups;
  int64_t st[2], dil[2], pad[2];
  window_of(nd, st, dil, pad);
  char lx[200], lw[160], src[96];
  kl_cg_load(lw, sizeof lw, w->dtype, acc, "wr[kx]");
  if (st[1] == 1) snprintf(src, sizeof src, "xr[base + sj]");
  else snprintf(src, sizeof src, "xr[base + sj * %lldLL]", (ll)st[1]);
  kl_cg_load(lx, sizeof lx, x->dtype, acc, src);
  fprintf(f, "    { /* %s: conv2d, a strip of columns */\n", nd->name);
  out_position(f, yd, mpg, cpg, "i0", "ox0");
  fprintf(f, "      for (int64_t ci = 0; ci < %lldLL; ci++) {\n"
             "        const %s *xp = in%d + ((b * %lldLL + c0 + ci) * %lldLL) * %lldLL;\n"
             "        const %s *wp = in%d + (co * %lldLL + ci) * %lldLL;\n",
          (ll)cpg, kl_cg_storage(x->dtype), index_of(io->in, io->nin, x), (ll)xd[1], (ll)xd[2], (ll)xd[3],
          kl_cg_storage(w->dtype), index_of(io->in, io->nin, w), (ll)cpg, (ll)(wd[2] * wd[3]));
  /* the strip's inputs straight from memory where they are consecutive
   * values of the sums' type, else gathered into xt */
  const char *sfx = strcmp(acc, "double") ? "f32" : "f64", *reader = strip_reader(x->dtype, acc);
  bool direct_load = st[1] == 1 && reader;
  if (direct_load && (x->dtype == KL_F16 || x->dtype == KL_BF16)) {
    strip_conv_half_rows(f, nd, io, acc, lw, reader);
    return;
  }
  char full[480];
  if (direct_load) snprintf(full, sizeof full, "kl_strip_fma_%s(&sacc, xr + base, wv);", reader);
  else
    snprintf(full, sizeof full, "%s xt[KL_STRIP];\n"
             "              for (int sj = 0; sj < KL_STRIP; sj++) xt[sj] = %s;\n"
             "              kl_strip_fma_%s(&sacc, xt, wv);", acc, lx, sfx);
  fprintf(f, "        for (int64_t ky = 0; ky < %lldLL; ky++) {\n"
             "          const int64_t iy = oy * %lldLL - %lldLL + ky * %lldLL;\n"
             "          if (iy < 0 || iy >= %lldLL) continue;\n"
             "          const %s *xr = xp + iy * %lldLL;\n          const %s *wr = wp + ky * %lldLL;\n"
             "          for (int64_t kx = 0; kx < %lldLL; kx++) {\n"
             "            const %s wv = %s;\n",
          (ll)wd[2], (ll)st[0], (ll)pad[0], (ll)dil[0], (ll)xd[2], kl_cg_storage(x->dtype), (ll)xd[3],
          kl_cg_storage(w->dtype), (ll)wd[3], (ll)wd[3], acc, lw);
  /* the lanes [lo, hi) whose column reaches into the row (the rest is
   * padding, or past the row's end); where the strip's span lies inside
   * x (a neighbouring row's values past the edge), it is read whole and
   * the other lanes' products cleared, else gathered */
  fprintf(f, "            const int64_t base = ox0 * %lldLL - %lldLL + kx * %lldLL;\n"
             "            int64_t lo = base >= 0 ? 0 : (-base + %lldLL) / %lldLL;\n"
             "            int64_t hi = base >= %lldLL ? 0 : (%lldLL - base) / %lldLL + 1;\n"
             "            if (hi > ns) hi = ns;\n            if (lo > hi) lo = hi;\n"
             "            if (lo == 0 && hi == KL_STRIP) {\n              %s\n            } else if (lo < hi) {\n",
          (ll)st[1], (ll)pad[1], (ll)dil[1], (ll)(st[1] - 1), (ll)st[1], (ll)xd[3], (ll)(xd[3] - 1), (ll)st[1], full);
  if (direct_load)
    fprintf(f, "              const int64_t at = (int64_t)(xr - in%d) + base;\n"
               "              if (at >= 0 && at + KL_STRIP <= %lldLL) {\n"
               "                kl_strip_fma_keep_%s(&sacc, xr + base, wv, lo, hi);\n              } else {\n",
            index_of(io->in, io->nin, x), (ll)kl_shape_numel(&x->shape), reader);
  else
    fprintf(f, "              {\n");
  fprintf(f, "                %s xt[KL_STRIP];\n"
             "                for (int sj = 0; sj < KL_STRIP; sj++) xt[sj] = sj >= lo && sj < hi ? %s : 0;\n"
             "                kl_strip_fma_keep_%s(&sacc, xt, wv, lo, hi);\n              }\n            }\n"
             "          }\n        }\n      }\n    }\n",
          acc, lx, sfx);
}

static void direct_conv(FILE *f, const kl_node *nd, const kl_group_io *io, bool later,
                        const char *idx, const char *store) {
  const kl_value *x = nd->inputs[0], *w = nd->inputs[1], *out = nd->outputs[0];
  const int64_t *xd = x->shape.dims, *yd = out->shape.dims, *wd = w->shape.dims;
  int64_t groups = kl_attr_int(nd, "groups", 1), cpg = xd[1] / groups, mpg = yd[1] / groups;
  int64_t st[2], dil[2], pad[2];
  window_of(nd, st, dil, pad);
  const char *acc = kl_cg_real_type(x->dtype); /* f32 sums; f64 for f64 */
  int kx = index_of(io->in, io->nin, x), kw = index_of(io->in, io->nin, w);
  char lx[96], lw[96];
  if (nd == tiled_conv || nd == strip_core) { /* its kernel summed it first: the epilogue only */
    if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
    fprintf(f, "    { /* %s: conv2d, %s */\n      const int64_t co = (%s / %lldLL) %% %lldLL;\n"
               "      (void)co;\n      %s sum = %s;\n",
            nd->name, nd == tiled_conv ? "tiled" : "summed for the strip", idx, (long long)(yd[2] * yd[3]),
            (long long)yd[1], acc, nd == tiled_conv ? tiled_conv_sum : "sout[sj]");
    bias_and_store(f, nd, io, later, store, acc);
    return;
  }
  if (nd == split_conv) {
    if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
    split_conv_sum(f, nd, io, idx, acc);
    bias_and_store(f, nd, io, later, store, acc);
    return;
  }
  kl_cg_load(lx, sizeof lx, x->dtype, acc, "xr[ix]");
  kl_cg_load(lw, sizeof lw, w->dtype, acc, "wr[kx]");
  typedef long long ll;
  if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
  fprintf(f, "    { /* %s: conv2d, direct */\n", nd->name);
  out_position(f, yd, mpg, cpg, idx, "ox");
  fprintf(f, "      %s sum = 0;\n      for (int64_t ci = 0; ci < %lldLL; ci++) {\n"
             "        const %s *xp = in%d + ((b * %lldLL + c0 + ci) * %lldLL) * %lldLL;\n"
             "        const %s *wp = in%d + (co * %lldLL + ci) * %lldLL;\n",
          acc, (ll)cpg, kl_cg_storage(x->dtype), kx, (ll)xd[1], (ll)xd[2], (ll)xd[3],
          kl_cg_storage(w->dtype), kw, (ll)cpg, (ll)(wd[2] * wd[3]));
  fprintf(f, "        for (int64_t ky = 0; ky < %lldLL; ky++) {\n"
             "          const int64_t iy = oy * %lldLL - %lldLL + ky * %lldLL;\n"
             "          if (iy < 0 || iy >= %lldLL) continue;\n"
             "          const %s *xr = xp + iy * %lldLL;\n          const %s *wr = wp + ky * %lldLL;\n"
             "          for (int64_t kx = 0; kx < %lldLL; kx++) {\n"
             "            const int64_t ix = ox * %lldLL - %lldLL + kx * %lldLL;\n"
             "            if (ix >= 0 && ix < %lldLL) sum += %s * %s;\n"
             "          }\n        }\n      }\n",
          (ll)wd[2], (ll)st[0], (ll)pad[0], (ll)dil[0], (ll)xd[2], kl_cg_storage(x->dtype),
          (ll)xd[3], kl_cg_storage(w->dtype), (ll)wd[3], (ll)wd[3], (ll)st[1], (ll)pad[1],
          (ll)dil[1], (ll)xd[3], lx, lw);
  bias_and_store(f, nd, io, later, store, acc);
}

/* A conv_transpose2d member computed directly, one output element (idx) a
 * thread: each (input channel, tap) whose input position lands on a whole
 * stride step adds its product, summed as direct_conv sums, plus the bias,
 * rounded once. */
static void direct_conv_transpose(FILE *f, const kl_node *nd, const kl_group_io *io, bool later,
                                  const char *idx, const char *store) {
  typedef long long ll;
  const kl_value *x = nd->inputs[0], *w = nd->inputs[1], *out = nd->outputs[0];
  const int64_t *xd = x->shape.dims, *yd = out->shape.dims, *wd = w->shape.dims;
  int64_t groups = kl_attr_int(nd, "groups", 1), cpg = xd[1] / groups, mpg = yd[1] / groups;
  int64_t st[2], dil[2], pad[2];
  window_of(nd, st, dil, pad);
  const char *acc = kl_cg_real_type(x->dtype);
  int kx = index_of(io->in, io->nin, x), kw = index_of(io->in, io->nin, w);
  char lx[160], lw[160], src[160];
  snprintf(src, sizeof src, "in%d[((b * %lldLL + ci) * %lldLL + iy) * %lldLL + ix]", kx, (ll)xd[1], (ll)xd[2],
           (ll)xd[3]);
  kl_cg_load(lx, sizeof lx, x->dtype, acc, src);
  snprintf(src, sizeof src, "in%d[((ci * %lldLL + cm) * %lldLL + ky) * %lldLL + kx]", kw, (ll)mpg, (ll)wd[2],
           (ll)wd[3]);
  kl_cg_load(lw, sizeof lw, w->dtype, acc, src);
  if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
  fprintf(f, "    { /* %s: conv_transpose2d, direct */\n", nd->name);
  fprintf(f, "      int64_t q = %s;\n      const int64_t ox = q %% %lldLL; q /= %lldLL;\n"
             "      const int64_t oy = q %% %lldLL; q /= %lldLL;\n"
             "      const int64_t co = q %% %lldLL, b = q / %lldLL;\n"
             "      const int64_t c0 = co / %lldLL * %lldLL, cm = co %% %lldLL;\n      %s sum = 0;\n",
          idx, (ll)yd[3], (ll)yd[3], (ll)yd[2], (ll)yd[2], (ll)yd[1], (ll)yd[1], (ll)mpg, (ll)cpg, (ll)mpg, acc);
  fprintf(f, "      for (int64_t ci = c0; ci < c0 + %lldLL; ci++)\n"
             "        for (int64_t ky = 0; ky < %lldLL; ky++) {\n"
             "          const int64_t ty = oy + %lldLL - ky * %lldLL;\n"
             "          if (ty < 0 || ty %% %lldLL) continue;\n          const int64_t iy = ty / %lldLL;\n"
             "          if (iy >= %lldLL) continue;\n"
             "          for (int64_t kx = 0; kx < %lldLL; kx++) {\n"
             "            const int64_t tx = ox + %lldLL - kx * %lldLL;\n"
             "            if (tx < 0 || tx %% %lldLL) continue;\n            const int64_t ix = tx / %lldLL;\n"
             "            if (ix < %lldLL) sum += %s * %s;\n          }\n        }\n",
          (ll)cpg, (ll)wd[2], (ll)pad[0], (ll)dil[0], (ll)st[0], (ll)st[0], (ll)xd[2], (ll)wd[3], (ll)pad[1],
          (ll)dil[1], (ll)st[1], (ll)st[1], (ll)xd[3], lx, lw);
  bias_and_store(f, nd, io, later, store, acc);
}

/* A resize that repeats (kl_resize_ratios): output element idx reads
 * input position (o_d / r_d) per axis; the value as it is, no arithmetic. */
static void gather_resize(FILE *f, const kl_node *nd, const kl_group_io *io, bool later,
                          const char *idx, const char *store) {
  typedef long long ll;
  const kl_value *x = nd->inputs[0], *out = nd->outputs[0];
  int64_t ratio[KL_MAX_RANK], in_stride = 1;
  kl_resize_ratios(nd, ratio);
  int kx = index_of(io->in, io->nin, x), ko = index_of(io->out, io->nout, out);
  char buf[160], at[64];
  if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
  fprintf(f, "    { /* %s: resize, each input repeated (x%s) */\n      int64_t q = %s, src = 0;\n", nd->name,
          ratio[x->shape.rank - 1] > 1 ? "n" : "1", idx);
  for (int d = x->shape.rank - 1; d >= 0; d--) {
    if (d) fprintf(f, "      src += q %% %lldLL / %lldLL * %lldLL; q /= %lldLL;\n", (ll)out->shape.dims[d],
                   (ll)ratio[d], (ll)in_stride, (ll)out->shape.dims[d]);
    else fprintf(f, "      src += q / %lldLL * %lldLL;\n", (ll)ratio[d], (ll)in_stride);
    in_stride *= x->shape.dims[d];
  }
  fprintf(f, "      const %s s = in%d[src];\n", kl_cg_storage(out->dtype), kx);
  snprintf(at, sizeof at, store, ko);
  if (ko >= 0) fprintf(f, "      %s = s;\n", at);
  if (later)
    fprintf(f, "      v%d = %s;\n", out->id, kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), "s"));
  fprintf(f, "    }\n");
}

void kl_cg_conv_at(FILE *f, const kl_node *nd, const kl_group_io *io, const char *idx,
                   const char *dst, bool store) {
  kl_group_io only_in = *io;
  if (!store) only_in.nout = 0; /* the caller stores, or nothing does */
  fprintf(f, "      {\n");
  if (nd->op == KL_OP_RESIZE) gather_resize(f, nd, &only_in, dst != NULL, idx, "out%d[i]");
  else if (nd->op == KL_OP_CONV_TRANSPOSE2D) direct_conv_transpose(f, nd, &only_in, dst != NULL, idx, "out%d[i]");
  else direct_conv(f, nd, &only_in, dst != NULL, idx, "out%d[i]");
  if (dst) fprintf(f, "      %s = v%d;\n", dst, nd->outputs[0]->id);
  fprintf(f, "      }\n");
}

/* A matmul member (in a group only when emit_model.c chose it direct):
 * y[.., r, c] = sum over k of a[.., r, k] * b[.., k, c], batch dims
 * broadcast, accumulated as direct_conv does and rounded once.  Threads of
 * a warp take neighbouring columns: the same a element (a broadcast) and
 * adjacent b elements. */
static void direct_matmul(FILE *f, const kl_node *nd, const kl_group_io *io, bool later,
                          const char *idx, const char *store) {
  typedef long long ll;
  const kl_value *a = nd->inputs[0], *b = nd->inputs[1], *out = nd->outputs[0];
  const kl_shape *ys = &out->shape, *as = &a->shape, *bs = &b->shape;
  int ry = ys->rank;
  int64_t rows = ys->dims[ry - 2], cols = ys->dims[ry - 1], k = as->dims[as->rank - 1];
  const char *acc = kl_cg_real_type(a->dtype); /* f32 sums; f64 for f64 */
  char la[96], lb[96], buf[160];
  if (nd == strip_core && strcmp(idx, "i0")) { /* the strip's sums are there */
    if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
    fprintf(f, "    { /* %s: matmul, summed for the strip */\n      %s sum = sout[sj];\n", nd->name, acc);
    store_sum(f, out, io, later, store);
    return;
  }
  if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
  fprintf(f, "    { /* %s: matmul, direct */\n      int64_t q = %s;\n"
             "      const int64_t col = q %% %lldLL; q /= %lldLL;\n"
             "      const int64_t rw = q %% %lldLL; q /= %lldLL;\n      (void)q;\n"
             "      int64_t oa = rw * %lldLL, ob = col;\n",
          nd->name, idx, (ll)cols, (ll)cols, (ll)rows, (ll)rows, (ll)k);
  /* batch dims, innermost first: an operand's stride, 0 where it broadcasts */
  int64_t sa = as->dims[as->rank - 2] * k, sb = k * bs->dims[bs->rank - 1];
  for (int d = ry - 3; d >= 0; d--) {
    int da = d - (ry - as->rank), db = d - (ry - bs->rank);
    int64_t ta = da >= 0 && as->dims[da] > 1 ? sa : 0, tb = db >= 0 && bs->dims[db] > 1 ? sb : 0;
    if (ys->dims[d] > 1 && (ta || tb)) {
      fprintf(f, "      { const int64_t bi = q %% %lldLL; q /= %lldLL;", (ll)ys->dims[d], (ll)ys->dims[d]);
      if (ta) fprintf(f, " oa += bi * %lldLL;", (ll)ta);
      if (tb) fprintf(f, " ob += bi * %lldLL;", (ll)tb);
      fprintf(f, " }\n");
    } else if (ys->dims[d] > 1) {
      fprintf(f, "      q /= %lldLL;\n", (ll)ys->dims[d]);
    }
    if (da >= 0) sa *= as->dims[da];
    if (db >= 0) sb *= bs->dims[db];
  }
  snprintf(buf, sizeof buf, "in%d[oa + kk]", index_of(io->in, io->nin, a));
  kl_cg_load(la, sizeof la, a->dtype, acc, buf);
  if (nd == strip_core) { /* the strip's columns: B's row kk, consecutive */
    snprintf(buf, sizeof buf, "in%d[ob + kk * %lldLL + sj]", index_of(io->in, io->nin, b), (ll)cols);
    kl_cg_load(lb, sizeof lb, b->dtype, acc, buf);
    const char *sfx = strcmp(acc, "double") ? "f32" : "f64";
    fprintf(f, "      for (int64_t kk = 0; kk < %lldLL; kk++) {\n        const %s av = %s;\n", (ll)k, acc, la);
    const char *reader = strip_reader(b->dtype, acc);
    if (reader)
      fprintf(f, "        if (ns == KL_STRIP) {\n          kl_strip_fma_%s(&sacc, in%d + ob + kk * %lldLL, av);\n"
                 "          continue;\n        }\n", reader, index_of(io->in, io->nin, b), (ll)cols);
    /* lanes past the row's end multiply zeros, and are never stored */
    fprintf(f, "        %s bt[KL_STRIP];\n        for (int sj = 0; sj < KL_STRIP; sj++) bt[sj] = sj < ns ? %s : 0;\n"
               "        kl_strip_fma_%s(&sacc, bt, av);\n      }\n    }\n",
            acc, lb, sfx);
    return;
  }
  snprintf(buf, sizeof buf, "in%d[ob + kk * %lldLL]", index_of(io->in, io->nin, b), (ll)cols);
  kl_cg_load(lb, sizeof lb, b->dtype, acc, buf);
  fprintf(f, "      %s sum = 0;\n      for (int64_t kk = 0; kk < %lldLL; kk++) sum += %s * %s;\n",
          acc, (ll)k, la, lb);
  store_sum(f, out, io, later, store);
}

/* The members, one block each, after the x registers are loaded; a
 * stored value goes to `store` (a printf format of the output's index:
 * "out%d[i]", or "w%d.x" for a lane of a vector); idx is the element's
 * flat index; `keep` (or NULL) is a value whose register the code after
 * reads. */
void kl_cg_fused_members(FILE *f, kl_node *const *nodes, int n, const kl_group_io *io,
                         const char *store, const char *idx, const kl_value *keep) {
  char buf[256], r[3][32], at[48];
  for (int m = 0; m < n; m++) {
    const kl_node *nd = nodes[m];
    const kl_value *out = nd->outputs[0];
    if (kl_is_channel_affine(nd)) {
      channel_affine(f, nd, io, out == keep || read_later(nodes, n, m, out), idx, store);
      continue;
    }
    if (nd->op == KL_OP_CONV2D) { /* only direct ones join a group */
      direct_conv(f, nd, io, out == keep || read_later(nodes, n, m, out), idx, store);
      continue;
    }
    if (nd->op == KL_OP_CONV_TRANSPOSE2D) {
      direct_conv_transpose(f, nd, io, out == keep || read_later(nodes, n, m, out), idx, store);
      continue;
    }
    if (nd->op == KL_OP_RESIZE) {
      gather_resize(f, nd, io, out == keep || read_later(nodes, n, m, out), idx, store);
      continue;
    }
    if (nd->op == KL_OP_MATMUL) {
      direct_matmul(f, nd, io, out == keep || read_later(nodes, n, m, out), idx, store);
      continue;
    }
    const char *ct = kl_cg_operand_type(nd);
    const char *expr = kl_cg_expression(nd, ct, buf, sizeof buf);
    int ko = index_of(io->out, io->nout, out);
    bool later = out == keep || read_later(nodes, n, m, out);
    if (later) fprintf(f, "    %s v%d;\n", kl_cg_compute_type(out->dtype), out->id);
    fprintf(f, "    { /* %s: %s */\n", nd->name, kl_ops[nd->op].name);
    for (int i = 0; i < nd->ninputs; i++) {
      /* where's condition stays an integer; other operands take ct */
      const char *t = nd->op == KL_OP_WHERE && i == 0 ? "int64_t" : ct;
      fprintf(f, "      const %s %c = (%s)%s;\n", t, 'a' + i, t,
              reg(io, nd->inputs[i], r[i % 3], sizeof r[i % 3]));
    }
    fprintf(f, "      %s s; ", kl_cg_storage(out->dtype));
    kl_cg_store(f, out->dtype, "s", expr);
    snprintf(at, sizeof at, store, ko);
    if (ko >= 0) fprintf(f, "      %s = s;\n", at);
    if (later) {
      char src[8] = "s";
      fprintf(f, "      v%d = %s;\n", out->id,
              kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), src));
    }
    fprintf(f, "    }\n");
  }
}

/* Four consecutive elements a thread when the innermost dim is a multiple
 * of 4: they share a row, so each input is either 4 consecutive elements
 * (its innermost dim is the output's: a float4 for f32) or one element
 * broadcast along the row. */
static bool vectorizable(const kl_shape *shape) {
  int64_t last = shape->rank ? shape->dims[shape->rank - 1] : 1;
  return kl_shape_numel(shape) >= 4 && last % 4 == 0;
}

static bool reads_four(const kl_value *v, const kl_shape *shape) {
  return v->shape.rank && v->shape.dims[v->shape.rank - 1] == shape->dims[shape->rank - 1];
}

/* Element i's offsets for the inputs a group reads element for element
 * (o0.. in their order), and their values into the x registers. */
static void load_element_inputs(FILE *f, const kl_group_io *io, const kl_shape *shape) {
  const kl_value *loads[KL_MAX_GROUP_IO];
  int nloads = 0, slot[KL_MAX_GROUP_IO];
  char src[32], buf[256];
  for (int k = 0; k < io->nin; k++)
    if (io->elementwise_read[k]) slot[nloads] = k, loads[nloads++] = io->in[k];
  if (nloads) kl_cg_index_math(f, shape, loads, nloads);
  for (int q = 0; q < nloads; q++) {
    snprintf(src, sizeof src, "in%d[o%d]", slot[q], q);
    fprintf(f, "    const %s x%d = %s;\n", kl_cg_compute_type(loads[q]->dtype), slot[q],
            kl_cg_load(buf, sizeof buf, loads[q]->dtype, kl_cg_compute_type(loads[q]->dtype), src));
  }
}

/* The vector type of four elements of t (float4, or four halves in 8
 * bytes), NULL for other types; its alignment in bytes. */
static const char *vec4_type(kl_dtype t, int *align) {
  *align = t == KL_F32 ? 16 : 8;
  return t == KL_F32 ? "float4" : t == KL_F16 ? "kl_half4" : t == KL_BF16 ? "kl_bf164" : NULL;
}

/* lane l of vector register name (float4's .x .. .w, else .v[l]) */
static void vec4_lane(char *buf, size_t len, kl_dtype t, const char *name, int l) {
  static const char lanes[] = "xyzw";
  if (t == KL_F32) snprintf(buf, len, "%s.%c", name, lanes[l]);
  else snprintf(buf, len, "%s.v[%d]", name, l);
}

/* The vector path, taken when every vector pointer is aligned (checked at
 * run time: a kernel does not know where its buffers start): four
 * elements a thread, each f32, f16 or bf16 input and output that runs
 * along the row loaded or stored as one float4 (16 bytes) or four halves
 * (8 bytes); else the scalar loop below runs. */
static void vector_path(FILE *f, kl_node *const *nodes, int n, const kl_group_io *io,
                        const kl_shape *shape) {
  int64_t numel = kl_shape_numel(shape);
  const kl_value *loads[KL_MAX_GROUP_IO];
  int nloads = 0, slot[KL_MAX_GROUP_IO], q_of[KL_MAX_GROUP_IO], align;
  for (int k = 0; k < io->nin; k++)
    if (io->elementwise_read[k]) q_of[k] = nloads, slot[nloads] = k, loads[nloads++] = io->in[k];
  /* outputs as vectors only when every one has a vector type, all float4
   * or all halves (the members store through one format: float4's lanes
   * are .x .. .w, the halves' .v[l]); else four stores each */
  bool vec_out = true, all_f32 = true, no_f32 = true, any = false, vec_in[KL_MAX_GROUP_IO] = {0};
  for (int k = 0; k < io->nout; k++) {
    vec_out &= vec4_type(io->out[k]->dtype, &align) != NULL;
    all_f32 &= io->out[k]->dtype == KL_F32, no_f32 &= io->out[k]->dtype != KL_F32;
  }
  vec_out &= all_f32 || no_f32;
  for (int k = 0; k < io->nin; k++) {
    vec_in[k] = io->elementwise_read[k] && vec4_type(io->in[k]->dtype, &align) && reads_four(io->in[k], shape);
    any |= vec_in[k];
  }
  if (!vec_out && !any) return; /* no vector to load or store: nothing to gain */
  fprintf(f, "  if (((0ULL");
  for (int k = 0; k < io->nin; k++)
    if (vec_in[k] && io->in[k]->dtype == KL_F32) fprintf(f, " | (uint64_t)in%d", k);
  for (int k = 0; k < io->nout && vec_out; k++)
    if (io->out[k]->dtype == KL_F32) fprintf(f, " | (uint64_t)out%d", k);
  fprintf(f, ") & 15) == 0 && ((0ULL");
  for (int k = 0; k < io->nin; k++)
    if (vec_in[k] && io->in[k]->dtype != KL_F32) fprintf(f, " | (uint64_t)in%d", k);
  for (int k = 0; k < io->nout && vec_out; k++)
    if (io->out[k]->dtype != KL_F32) fprintf(f, " | (uint64_t)out%d", k);
  fprintf(f, ") & 7) == 0) {\n");
  fprintf(f, "  for (int64_t i4 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i4 < %lldLL;\n"
             "       i4 += (int64_t)blockDim.x * gridDim.x) {\n    const int64_t i = i4 * 4;\n",
          (long long)(numel / 4));
  if (nloads) kl_cg_index_math(f, shape, loads, nloads);
  for (int q = 0; q < nloads; q++)
    if (vec_in[slot[q]]) {
      const char *vt = vec4_type(loads[q]->dtype, &align);
      fprintf(f, "    const %s a%d = *(const %s *)(in%d + o%d);\n", vt, slot[q], vt, slot[q], q);
    }
  for (int k = 0; k < io->nout && vec_out; k++) fprintf(f, "    %s w%d;\n", vec4_type(io->out[k]->dtype, &align), k);
  char buf[160], store[24], idx[16], name[16];
  for (int l = 0; l < 4; l++) {
    fprintf(f, "    {\n");
    for (int k = 0; k < io->nin; k++) {
      if (!io->elementwise_read[k]) continue;
      const kl_value *v = io->in[k];
      int q = q_of[k];
      char src[48];
      snprintf(name, sizeof name, "a%d", k);
      if (!reads_four(v, shape)) snprintf(src, sizeof src, "in%d[o%d]", k, q);
      else if (vec_in[k]) vec4_lane(src, sizeof src, v->dtype, name, l);
      else snprintf(src, sizeof src, "in%d[o%d + %d]", k, q, l);
      fprintf(f, "    const %s x%d = %s;\n", kl_cg_compute_type(v->dtype), k,
              kl_cg_load(buf, sizeof buf, v->dtype, kl_cg_compute_type(v->dtype), src));
    }
    if (vec_out && all_f32) snprintf(store, sizeof store, "w%%d.%c", "xyzw"[l]);
    else if (vec_out && no_f32) snprintf(store, sizeof store, "w%%d.v[%d]", l);
    else snprintf(store, sizeof store, "out%%d[i + %d]", l);
    snprintf(idx, sizeof idx, "(i + %d)", l);
    kl_cg_fused_members(f, nodes, n, io, store, idx, NULL);
    fprintf(f, "    }\n");
  }
  for (int k = 0; k < io->nout && vec_out; k++) {
    const char *vt = vec4_type(io->out[k]->dtype, &align);
    fprintf(f, "    *(%s *)(out%d + i) = w%d;\n", vt, k, k);
  }
  fprintf(f, "  }\n  return;\n  }\n");
}

/* The group's one conv2d; NULL where it has none, or another convolution
 * or GEMM beside it. */
static const kl_node *only_conv(kl_node *const *nodes, int n) {
  const kl_node *conv = NULL;
  for (int m = 0; m < n; m++)
    if (nodes[m]->op == KL_OP_CONV2D || nodes[m]->op == KL_OP_MATMUL || nodes[m]->op == KL_OP_CONV_TRANSPOSE2D) {
      if (conv || nodes[m]->op != KL_OP_CONV2D) return NULL;
      conv = nodes[m];
    }
  return conv;
}

/* ---- a convolution group, tiled (implicit GEMM) ---------------------------
 * The group's one convolution as a GEMM of the weights (OC x K, K = C x KH
 * x KW) by the input patches (K x P, P = batch x output pixels): a block
 * of 256 threads per tile of up to 32 channels x 256 pixels, K in steps.
 * Each step stages the patches (the im2col columns, gathered with the
 * padding, never in memory) and the weights in shared memory, loaded once
 * a block with consecutive threads on consecutive addresses: every input
 * value then serves the tile's channels and every weight its pixels, where
 * one output a thread reloads both for each.  A thread sums 8 channels of
 * up to 4 pixels in registers (the k order of the direct loop, so the sums
 * agree), then runs the group's other members, the epilogue, on each.
 * Grouped convolutions and groups of several keep one output a thread. */
typedef struct {
  int toc, cg, tpx, ppt, tile_px; /* channels, their groups of 8, threads and pixels */
  int64_t ptiles, ctiles;
} conv_tiles;

/* The tile for y (8 channels a thread, 1..4 groups of them; the rest of
 * the 256 threads on pixels, each up to 4, fewer where that leaves the
 * GPU short of blocks). */
static conv_tiles tiles_for(const kl_value *y) {
  const int64_t *yd = y->shape.dims;
  int64_t P = yd[0] * yd[2] * yd[3];
  conv_tiles t;
  t.toc = yd[1] >= 32 ? 32 : yd[1] > 8 ? 16 : 8, t.cg = t.toc / 8, t.tpx = 256 / t.cg;
  t.ctiles = (yd[1] + t.toc - 1) / t.toc;
  for (t.ppt = 256 / t.tpx; ; t.ppt /= 2) {
    t.tile_px = t.tpx * t.ppt, t.ptiles = (P + t.tile_px - 1) / t.tile_px;
    if (t.ppt == 1 || t.ptiles * t.ctiles >= kl_cg_min_blocks) break;
  }
  return t;
}

static const kl_node *tileable_conv(kl_node *const *nodes, int n) {
  const kl_node *conv = only_conv(nodes, n);
  if (!conv || kl_attr_int(conv, "groups", 1) != 1 || conv->inputs[0]->shape.rank != 4) return NULL;
  if (!kl_shape_equal(&conv->outputs[0]->shape, &nodes[n - 1]->outputs[0]->shape)) return NULL;
  /* too few tiles to fill the GPU: one output a thread spreads wider (an
   * H200 measured the small cnn example 3x faster that way) */
  conv_tiles t = tiles_for(conv->outputs[0]);
  return t.ptiles * t.ctiles >= kl_cg_min_blocks ? conv : NULL;
}

static kl_cg_grid tiled_conv_group(FILE *f, const char *name, kl_node *const *nodes, int n,
                                   const kl_group_io *io, const kl_node *conv) {
  typedef long long ll;
  const kl_value *x = conv->inputs[0], *w = conv->inputs[1], *y = conv->outputs[0];
  const int64_t *xd = x->shape.dims, *yd = y->shape.dims, *wd = w->shape.dims;
  int64_t st[2], dil[2], pad[2];
  window_of(conv, st, dil, pad);
  int64_t K = xd[1] * wd[2] * wd[3], win = wd[2] * wd[3], plane = yd[2] * yd[3], P = xd[0] * plane;
  const char *acc = kl_cg_real_type(x->dtype);
  conv_tiles ts = tiles_for(y);
  int toc = ts.toc, tpx = ts.tpx, ppt = ts.ppt, tile_px = ts.tile_px, tk = !strcmp(acc, "double") ? 16 : 32;
  int64_t ptiles = ts.ptiles, ctiles = ts.ctiles;
  int kx = index_of(io->in, io->nin, x), kw = index_of(io->in, io->nin, w);
  char lx[200], lw[160], text[160], src[160];
  fprintf(f, "/* fused group of %d nodes -> %s, %s tiled (implicit GEMM, K = %lld; %d channels x %d pixels a block):",
          n, kl_shape_str(&y->shape, text, sizeof text), conv->name, (ll)K, toc, tile_px);
  for (int m = 0; m < n; m++) fprintf(f, " %s(%s)", nodes[m]->name, kl_ops[nodes[m]->op].name);
  fprintf(f, " */\n");
  kl_cg_fused_params(f, name, io);
  fprintf(f, "  KL_SHARED(%s, xs, [%d]);\n  KL_SHARED(%s, ws, [%d]);\n", acc, tk * tile_px, acc, tk * (toc + 1));
  fprintf(f, "  const int64_t pt = blockIdx.x %% %lldLL, oc0 = (blockIdx.x / %lldLL) * %d;\n"
             "  const int px = (int)(threadIdx.x %% %d), ocg = (int)(threadIdx.x / %d);\n"
             "  %s tacc[%d][8];\n  for (int u = 0; u < %d; u++)\n    for (int t8 = 0; t8 < 8; t8++) tacc[u][t8] = 0;\n",
          (ll)ptiles, (ll)ptiles, toc, tpx, tpx, acc, ppt, ppt);
  fprintf(f, "  for (int64_t k0 = 0; k0 < %lldLL; k0 += %d) {\n    __syncthreads();\n", (ll)K, tk);
  /* the patches: consecutive threads on consecutive pixels */
  snprintf(src, sizeof src, "in%d[((b * %lldLL + ci) * %lldLL + iy) * %lldLL + ix]", kx, (ll)xd[1], (ll)xd[2],
           (ll)xd[3]);
  fprintf(f, "    for (int t = (int)threadIdx.x; t < %d; t += 256) {\n"
             "      const int kk = t / %d, pp = t %% %d;\n      const int64_t k = k0 + kk, q = pt * %d + pp;\n"
             "      %s val = 0;\n      if (k < %lldLL && q < %lldLL) {\n"
             "        const int64_t b = q / %lldLL, op = q %% %lldLL, ci = k / %lldLL, r = k %% %lldLL;\n"
             "        const int64_t iy = op / %lldLL * %lldLL - %lldLL + r / %lldLL * %lldLL;\n"
             "        const int64_t ix = op %% %lldLL * %lldLL - %lldLL + r %% %lldLL * %lldLL;\n"
             "        if (iy >= 0 && iy < %lldLL && ix >= 0 && ix < %lldLL) val = %s;\n"
             "      }\n      xs[kk * %d + pp] = val;\n    }\n",
          tk * tile_px, tile_px, tile_px, tile_px, acc, (ll)K, (ll)P, (ll)plane, (ll)plane, (ll)win, (ll)win,
          (ll)yd[3], (ll)st[0], (ll)pad[0], (ll)wd[3], (ll)dil[0], (ll)yd[3], (ll)st[1], (ll)pad[1], (ll)wd[3],
          (ll)dil[1], (ll)xd[2], (ll)xd[3], kl_cg_load(lx, sizeof lx, x->dtype, acc, src), tile_px);
  /* the weights: consecutive threads along K (a row of w) */
  snprintf(src, sizeof src, "in%d[o * %lldLL + k]", kw, (ll)K);
  fprintf(f, "    for (int t = (int)threadIdx.x; t < %d; t += 256) {\n"
             "      const int oc = t / %d, kk = t %% %d;\n      const int64_t k = k0 + kk, o = oc0 + oc;\n"
             "      ws[kk * %d + oc] = k < %lldLL && o < %lldLL ? %s : (%s)0;\n    }\n    __syncthreads();\n",
          tk * toc, tk, tk, toc + 1, (ll)K, (ll)yd[1], kl_cg_load(lw, sizeof lw, w->dtype, acc, src), acc);
  fprintf(f, "    for (int kk = 0; kk < %d; kk++) {\n      %s wv[8];\n"
             "      for (int t8 = 0; t8 < 8; t8++) wv[t8] = ws[kk * %d + ocg * 8 + t8];\n"
             "      for (int u = 0; u < %d; u++) {\n        const %s xv = xs[kk * %d + px + u * %d];\n"
             "        for (int t8 = 0; t8 < 8; t8++) tacc[u][t8] += wv[t8] * xv;\n      }\n    }\n  }\n",
          tk, acc, toc + 1, ppt, acc, tile_px, tpx);
  /* the epilogue, output by output */
  fprintf(f, "  for (int u = 0; u < %d; u++) {\n    const int64_t q = pt * %d + px + u * %d;\n"
             "    for (int t8 = 0; t8 < 8; t8++) {\n    const int64_t co = oc0 + ocg * 8 + t8;\n"
             "    if (co >= %lldLL || q >= %lldLL) continue;\n"
             "    const int64_t i = (q / %lldLL * %lldLL + co) * %lldLL + q %% %lldLL;\n",
          ppt, tile_px, tpx, (ll)yd[1], (ll)P, (ll)plane, (ll)yd[1], (ll)plane, (ll)plane);
  load_element_inputs(f, io, &y->shape);
  tiled_conv = conv;
  kl_cg_fused_members(f, nodes, n, io, "out%d[i]", "i", NULL);
  tiled_conv = NULL;
  fprintf(f, "  }\n  }\n}\n");
  kl_cg_fused_entry(f, name, io);
  kl_cg_grid g = {ptiles * ctiles, 256};
  return g;
}

/* ---- a convolution group on tensor cores (f16, bf16) ----------------------
 * The implicit GEMM of tiled_conv_group with halves: C (channels x
 * pixels) = W (channels x K) times the patches (K x pixels), as warp
 * matrix multiply-adds (kiln_prelude.h's kl_mma_*, f32 sums).  A block of
 * 8 warps takes up to 64 channels x 64..256 pixels; each warp 16 channels
 * x 32 pixels (four 16 x 8 products a step of 16 along K).  Each step of
 * 32 along K stages the weights (channel-major, the A of the product) and
 * the patches (pixel-major, its column-major B), gathered with the padding
 * and never in memory, in shared memory as halves, rows padded by 8 so a
 * warp's 32-bit fragment loads fall in distinct banks.  Then the group's
 * other members, the epilogue, on each sum where the product left it (a
 * lane's entries of C: kl_mma_row / kl_mma_col). */
typedef struct {
  int toc, wm;     /* channels a block, warps across them (16 channels each) */
  int64_t tpx;     /* pixels a block: 32 for each of the 8 / wm warps along them */
  int64_t ctiles, ptiles;
} mma_tiles;

static mma_tiles mma_tiles_for(const kl_value *y) {
  const int64_t *yd = y->shape.dims;
  mma_tiles t;
  t.toc = yd[1] >= 64 ? 64 : yd[1] > 16 ? 32 : 16, t.wm = t.toc / 16, t.tpx = 32 * (8 / t.wm);
  t.ctiles = (yd[1] + t.toc - 1) / t.toc, t.ptiles = (yd[0] * yd[2] * yd[3] + t.tpx - 1) / t.tpx;
  return t;
}

/* The group's one convolution in halves, of the group's shape, for the
 * tensor cores; NULL where there is none. */
static const kl_node *mma_conv(kl_node *const *nodes, int n) {
  const kl_node *conv = only_conv(nodes, n);
  if (!conv || !kl_cg_plan_target->tensor_cores || kl_attr_int(conv, "groups", 1) != 1 ||
      conv->inputs[0]->shape.rank != 4)
    return NULL;
  kl_dtype h = conv->inputs[0]->dtype;
  if ((h != KL_F16 && h != KL_BF16) || conv->inputs[1]->dtype != h) return NULL;
  return kl_shape_equal(&conv->outputs[0]->shape, &nodes[n - 1]->outputs[0]->shape) ? conv : NULL;
}

static kl_cg_grid mma_conv_group(FILE *f, const char *name, kl_node *const *nodes, int n,
                                 const kl_group_io *io, const kl_node *conv) {
  typedef long long ll;
  const kl_value *x = conv->inputs[0], *w = conv->inputs[1], *y = conv->outputs[0];
  const int64_t *xd = x->shape.dims, *yd = y->shape.dims, *wd = w->shape.dims;
  int64_t st[2], dil[2], pad[2];
  window_of(conv, st, dil, pad);
  int64_t K = xd[1] * wd[2] * wd[3], win = wd[2] * wd[3], plane = yd[2] * yd[3], P = xd[0] * plane;
  mma_tiles ts = mma_tiles_for(y);
  const char *sx = x->dtype == KL_BF16 ? "bf16" : "f16";
  int kx = index_of(io->in, io->nin, x), kw = index_of(io->in, io->nin, w);
  char text[160];
  fprintf(f, "/* fused group of %d nodes -> %s, %s on tensor cores (implicit GEMM, K = %lld; %d channels x %lld "
             "pixels a block):",
          n, kl_shape_str(&y->shape, text, sizeof text), conv->name, (ll)K, ts.toc, (ll)ts.tpx);
  for (int m = 0; m < n; m++) fprintf(f, " %s(%s)", nodes[m]->name, kl_ops[nodes[m]->op].name);
  fprintf(f, " */\n");
  kl_cg_fused_params(f, name, io);
  /* halves staged as kiln_prelude.h's kl_mma_stage: their bits on a GPU,
   * floats on the host device (widened once a block, not once a warp) */
  fprintf(f, "  KL_SHARED(kl_mma_stage, ws, [%lld]);\n  KL_SHARED(kl_mma_stage, xs, [%lld]);\n", (ll)(ts.toc * 40),
          (ll)(ts.tpx * 40));
  /* the host device runs a warp as its lane 0 alone (KL_LANES) */
  fprintf(f, "  const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);\n"
             "  if (lane >= KL_LANES) return;\n  const int tid = warp * KL_LANES + lane;\n"
             "  const int wm = warp %% %d, wn = warp / %d;\n"
             "  const int64_t px0 = (int64_t)(blockIdx.x %% %lldLL) * %lld, oc0 = (int64_t)(blockIdx.x / %lldLL) * %d;\n"
             "  kl_mma_c cacc[4];\n  KL_UNROLL for (int nt = 0; nt < 4; nt++) kl_mma_zero(&cacc[nt]);\n",
          ts.wm, ts.wm, (ll)ts.ptiles, (ll)ts.tpx, (ll)ts.ptiles, ts.toc);
  fprintf(f, "  for (int64_t k0 = 0; k0 < %lldLL; k0 += 32) {\n    __syncthreads();\n", (ll)K);
  /* the weights: consecutive threads along K (a row of w) */
  fprintf(f, "    for (int t = tid; t < %d; t += 8 * KL_LANES) {\n"
             "      const int oc = t / 32, kk = t %% 32;\n      const int64_t k = k0 + kk, o = oc0 + oc;\n"
             "      ws[oc * 40 + kk] = k < %lldLL && o < %lldLL ? kl_mma_stage_%s(in%d[o * %lldLL + k]) : kl_mma_stage_zero;\n"
             "    }\n",
          ts.toc * 32, (ll)K, (ll)yd[1], sx, kw, (ll)K);
  /* the patches: a thread a pixel (consecutive threads on consecutive
   * pixels), its position found once, then the step's 32 elements of K
   * walked through (input channel, ky, kx) by increments */
  fprintf(f, "    for (int pp = tid; pp < %lld; pp += 8 * KL_LANES) {\n"
             "      const int64_t q = px0 + pp;\n      int64_t base = -1, oy = 0, ox = 0;\n"
             "      if (q < %lldLL) {\n        const int64_t b = q / %lldLL, op = q %% %lldLL;\n"
             "        oy = op / %lldLL * %lldLL - %lldLL, ox = op %% %lldLL * %lldLL - %lldLL;\n"
             "        base = b * %lldLL;\n      }\n"
             "      int64_t ci = k0 / %lldLL;\n      int r = (int)(k0 %% %lldLL), ky = r / %lld, kx = r %% %lld;\n"
             "      for (int kk = 0; kk < 32; kk++) {\n"
             "        const int64_t iy = oy + ky * %lldLL, ix = ox + kx * %lldLL;\n"
             "        if (base >= 0 && k0 + kk < %lldLL && iy >= 0 && iy < %lldLL && ix >= 0 && ix < %lldLL)\n"
             "          xs[pp * 40 + kk] = kl_mma_stage_%s(in%d[((base + ci) * %lldLL + iy) * %lldLL + ix]);\n"
             "        else xs[pp * 40 + kk] = kl_mma_stage_zero;\n",
          (ll)ts.tpx, (ll)P, (ll)plane, (ll)plane, (ll)yd[3], (ll)st[0], (ll)pad[0], (ll)yd[3], (ll)st[1], (ll)pad[1],
          (ll)xd[1], (ll)win, (ll)win, (ll)wd[3], (ll)wd[3], (ll)dil[0], (ll)dil[1], (ll)K, (ll)xd[2], (ll)xd[3], sx,
          kx, (ll)xd[2], (ll)xd[3]);
  fprintf(f, "        if (++kx == %lld) {\n          kx = 0;\n          if (++ky == %lld) ky = 0, ci++;\n        }\n"
             "      }\n    }\n    __syncthreads();\n",
          (ll)wd[3], (ll)wd[2]);
  fprintf(f, "    for (int kk = 0; kk < 32; kk += 16) {\n      kl_mma_a fa;\n"
             "      kl_mma_load_a_%s(&fa, ws + wm * 640 + kk, 40, lane);\n"
             "      KL_UNROLL for (int nt = 0; nt < 4; nt++) {\n        kl_mma_b fb;\n"
             "        kl_mma_load_b_%s(&fb, xs + (wn * 32 + nt * 8) * 40 + kk, 40, lane);\n"
             "        kl_mma_%s(&cacc[nt], &fa, &fb);\n      }\n    }\n  }\n",
          sx, sx, sx);
  /* the epilogue, on each of the lane's sums */
  fprintf(f, "  KL_UNROLL for (int nt = 0; nt < 4; nt++)\n  for (int e = 0; e < KL_MMA_C; e++) {\n"
             "    const int64_t co = oc0 + wm * 16 + kl_mma_row(lane, e), q = px0 + wn * 32 + nt * 8 + kl_mma_col(lane, e);\n"
             "    if (co >= %lldLL || q >= %lldLL) continue;\n"
             "    const int64_t i = (q / %lldLL * %lldLL + co) * %lldLL + q %% %lldLL;\n",
          (ll)yd[1], (ll)P, (ll)plane, (ll)yd[1], (ll)plane, (ll)plane);
  load_element_inputs(f, io, &y->shape);
  tiled_conv = conv, tiled_conv_sum = "cacc[nt].c[e]";
  kl_cg_fused_members(f, nodes, n, io, "out%d[i]", "i", NULL);
  tiled_conv = NULL, tiled_conv_sum = "tacc[u][t8]";
  fprintf(f, "  }\n}\n");
  kl_cg_fused_entry(f, name, io);
  kl_cg_grid g = {ts.ptiles * ts.ctiles, 256};
  return g;
}

/* The group's one convolution when the target has a warp sum each of
 * its outputs (few, long dot products) and the group is of its shape. */
static const kl_node *splittable_conv(kl_node *const *nodes, int n) {
  const kl_node *conv = only_conv(nodes, n);
  if (!conv || !kl_is_split_conv(conv, kl_cg_plan_target)) return NULL;
  return kl_shape_equal(&conv->outputs[0]->shape, &nodes[n - 1]->outputs[0]->shape) ? conv : NULL;
}

static void strip_body(FILE *f, kl_node *const *nodes, int n, const kl_group_io *io, const kl_node *core);

/* A warp an output element, KL_CONV_LANES lanes of it at work (32 on a
 * GPU).  With one lane (the host device, whose emulator would run every
 * shuffle through fibers) the kernel is the strip form instead. */
static kl_cg_grid split_conv_group(FILE *f, const char *name, kl_node *const *nodes, int n,
                                   const kl_group_io *io, const kl_node *conv) {
  const kl_shape *shape = &conv->outputs[0]->shape;
  int64_t numel = kl_shape_numel(shape);
  char text[160];
  fprintf(f, "/* fused group of %d nodes -> %s, %s a warp an output:", n, kl_shape_str(shape, text, sizeof text),
          conv->name);
  for (int m = 0; m < n; m++) fprintf(f, " %s(%s)", nodes[m]->name, kl_ops[nodes[m]->op].name);
  fprintf(f, " */\n");
  kl_cg_fused_params(f, name, io);
  /* one lane (the host device): the strip form instead, whose sums
   * vectorise where lane 0 alone would sum K scalar products */
  fprintf(f, "#if KL_CONV_LANES > 1\n");
  fprintf(f, "  const int lane = (int)(threadIdx.x %% 32);\n  if (lane >= KL_CONV_LANES) return;\n"
             "  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < %lldLL;\n"
             "       i += (int64_t)gridDim.x * (blockDim.x / 32)) {\n", (long long)numel);
  load_element_inputs(f, io, shape);
  split_conv = conv;
  kl_cg_fused_members(f, nodes, n, io, "if (lane == 0) out%d[i]", "i", NULL);
  split_conv = NULL;
  fprintf(f, "  }\n#else\n");
  strip_body(f, nodes, n, io, conv);
  fprintf(f, "#endif\n}\n");
  kl_cg_fused_entry(f, name, io);
  int64_t blocks = (numel * 32 + 255) / 256;
  kl_cg_grid g = {blocks < 65535 ? blocks : 65535, 256};
  return g;
}

/* The group's one convolution or GEMM, of the group's shape, for a strip
 * kernel; NULL where there is none or more than one. */
static const kl_node *strip_member(kl_node *const *nodes, int n) {
  const kl_node *core = NULL;
  for (int m = 0; m < n; m++)
    if (nodes[m]->op == KL_OP_CONV2D || nodes[m]->op == KL_OP_MATMUL || nodes[m]->op == KL_OP_CONV_TRANSPOSE2D) {
      if (core || nodes[m]->op == KL_OP_CONV_TRANSPOSE2D) return NULL;
      core = nodes[m];
    }
  if (!core || core->outputs[0]->shape.rank < 2) return NULL;
  return kl_shape_equal(&core->outputs[0]->shape, &nodes[n - 1]->outputs[0]->shape) ? core : NULL;
}

/* A convolution's or GEMM's group, a strip of KL_STRIP consecutive outputs
 * of one row (the last axis) a thread: the strip's sums first, then the
 * other members output by output.  A GPU takes strips of one (a thread an
 * output, as wide as the GPU goes); the host device takes 16, so that
 * its C compiler vectorises the strip's multiply-adds (one thread an
 * output would be scalar code, 1 of 16 threads then has work).  Each
 * output sums in the order of a thread an output's. */
/* A strip kernel's body, between its signature and its closing brace. */
static void strip_body(FILE *f, kl_node *const *nodes, int n, const kl_group_io *io, const kl_node *core) {
  typedef long long ll;
  const kl_shape *shape = &core->outputs[0]->shape;
  int64_t numel = kl_shape_numel(shape), width = shape->dims[shape->rank - 1];
  const char *acc = kl_cg_real_type(core->inputs[0]->dtype);
  fprintf(f, "  const int64_t per_row = (%lldLL + KL_STRIP - 1) / KL_STRIP;\n"
             "  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < %lldLL * per_row;\n"
             "       t += (int64_t)blockDim.x * gridDim.x) {\n"
             "    const int64_t j0 = t %% per_row * KL_STRIP, i0 = t / per_row * %lldLL + j0;\n"
             "    const int ns = %lldLL - j0 < KL_STRIP ? (int)(%lldLL - j0) : KL_STRIP;\n"
             "    %s sacc = KL_STRIP_ZERO;\n",
          (ll)width, (ll)(width ? numel / width : 0), (ll)width, (ll)width, (ll)width,
          strcmp(acc, "double") ? "kl_strip_f32" : "kl_strip_f64");
  strip_core = core;
  if (core->op == KL_OP_CONV2D) strip_conv_core(f, core, io, acc);
  else direct_matmul(f, core, io, false, "i0", "");
  /* the sums leave their registers once, for the members' loop */
  fprintf(f, "    %s sout[KL_STRIP];\n    kl_strip_store_%s(sout, &sacc);\n"
             "    for (int sj = 0; sj < ns; sj++) {\n    const int64_t i = i0 + sj;\n", acc,
          strcmp(acc, "double") ? "f32" : "f64");
  load_element_inputs(f, io, shape);
  kl_cg_fused_members(f, nodes, n, io, "out%d[i]", "i", NULL);
  strip_core = NULL;
  fprintf(f, "    }\n  }\n");
}

static kl_cg_grid strip_group(FILE *f, const char *name, kl_node *const *nodes, int n, const kl_group_io *io,
                              const kl_node *core) {
  char text[160];
  fprintf(f, "/* fused group of %d nodes -> %s, a strip of KL_STRIP outputs a thread:", n,
          kl_shape_str(&core->outputs[0]->shape, text, sizeof text));
  for (int m = 0; m < n; m++) fprintf(f, " %s(%s)", nodes[m]->name, kl_ops[nodes[m]->op].name);
  fprintf(f, " */\n");
  kl_cg_fused_params(f, name, io);
  strip_body(f, nodes, n, io, core);
  fprintf(f, "}\n");
  kl_cg_fused_entry(f, name, io);
  kl_cg_grid none = {0, 0};
  return none;
}

kl_cg_grid kl_cg_fused_elementwise(FILE *f, const char *name, kl_node *const *nodes, int n,
                                   const kl_group_io *io) {
  const kl_node *split = splittable_conv(nodes, n);
  if (split) return split_conv_group(f, name, nodes, n, io, split);
  const kl_node *halves = mma_conv(nodes, n);
  if (halves) return mma_conv_group(f, name, nodes, n, io, halves);
  const kl_node *conv = tileable_conv(nodes, n);
  if (conv) return tiled_conv_group(f, name, nodes, n, io, conv);
  const kl_node *core = strip_member(nodes, n);
  if (core) return strip_group(f, name, nodes, n, io, core);
  const kl_shape *shape = &nodes[n - 1]->outputs[0]->shape;
  int64_t numel = kl_shape_numel(shape);
  char text[160];
  fprintf(f, "/* fused elementwise group of %d nodes -> %s:", n, kl_shape_str(shape, text, sizeof text));
  for (int m = 0; m < n; m++) fprintf(f, " %s(%s)", nodes[m]->name, kl_ops[nodes[m]->op].name);
  fprintf(f, " */\n");
  kl_cg_fused_params(f, name, io);
  /* a convolution's (or a GEMM's) dot product is the work, not the loads: no float4
   * copy of it (four inlined copies would only slow NVRTC down) */
  bool has_conv = false;
  for (int m = 0; m < n; m++)
    has_conv |= nodes[m]->op == KL_OP_CONV2D || nodes[m]->op == KL_OP_MATMUL || nodes[m]->op == KL_OP_CONV_TRANSPOSE2D;
  if (vectorizable(shape) && !has_conv) vector_path(f, nodes, n, io, shape);
  kl_cg_grid_stride_loop(f, numel);
  load_element_inputs(f, io, shape);
  kl_cg_fused_members(f, nodes, n, io, "out%d[i]", "i", NULL);
  fprintf(f, "  }\n}\n");
  kl_cg_fused_entry(f, name, io);
  kl_cg_grid none = {0, 0};
  return none;
}
