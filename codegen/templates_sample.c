/* templates_sample.c - kernel templates for sampling at coordinates read at
 * run time (see codegen_impl.h for the template interface): grid_sample,
 * linear, nearest and cubic, over any number of spatial axes; roi_align;
 * deform_conv2d (a convolution whose taps are bilinear samples).
 *
 * The kernel mirrors kl_eval_GRID_SAMPLE (ir/ops_sample.c) step by step,
 * in the tensors' real type (float for f32 and half, double for f64; the
 * interpreter's double is the oracle): the same coordinate formulas, the same
 * padding of the point and of each tap, and the same sum (taps in the same
 * order, products of weights built axis by axis, zero weights skipped so
 * that 0 * inf never turns into NaN).  mode, padding_mode, align_corners
 * and the sizes are written into the helpers as constants. */
#include <string.h>

#include "codegen_impl.h"

typedef long long ll;

enum { LINEAR, NEAREST, CUBIC };
enum { ZEROS, BORDER, REFLECTION };

static int pick(const char *s, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

static int gs_mode(const kl_node *n) {
  static const char *const names[] = {"linear", "nearest", "cubic"};
  return pick(kl_attr_string(n, "mode", "linear"), names, 3);
}

static int gs_padding(const kl_node *n) {
  static const char *const names[] = {"zeros", "border", "reflection"};
  return pick(kl_attr_string(n, "padding_mode", "zeros"), names, 3);
}

static int gs_ntaps(int mode) { return mode == NEAREST ? 1 : mode == LINEAR ? 2 : 4; }

static bool handles_grid_sample(const kl_node *n) {
  return n->op == KL_OP_GRID_SAMPLE && gs_mode(n) >= 0 && gs_padding(n) >= 0 &&
         kl_dtype_is_float(n->inputs[0]->dtype) && kl_dtype_is_float(n->inputs[1]->dtype);
}

/* The real type the kernels of n compute in (kl_cg_real_type): float when
 * its float inputs are f32 or half, double when any is f64. */
static const char *node_real(const kl_node *n) {
  bool wide = false;
  for (int i = 0; i < n->ninputs; i++)
    wide |= n->inputs[i] && n->inputs[i]->dtype == KL_F64;
  return kl_cg_real_type(wide ? KL_F64 : KL_F32);
}

/* `name`_reflect (gs_reflect): v reflected into [lo, hi] by the nearer
 * border, as often as needed. */
static void write_reflect(FILE *f, const char *name, const char *ct) {
  const char *sf = kl_cg_real_suffix(ct);
  fprintf(f, "__device__ %s %s_reflect(%s v, %s lo, %s hi) {\n"
             "  const %s range = hi - lo;\n"
             "  if (range <= 0) return lo;\n"
             "  if (v >= lo && v <= hi) return v;\n"
             "  const %s dx = v < lo ? lo - v : v - hi;\n"
             "  const %s m = floor%s(dx / range), r = dx - m * range;\n"
             "  const bool even = fmod%s(m, (%s)2) == 0;\n"
             "  return (v < lo) == even ? lo + r : hi - r;\n}\n",
          ct, name, ct, ct, ct, ct, ct, ct, sf, sf, ct);
}

/* `name`_tap (gs_tap): tap index i of an axis of length d moved inside by
 * the padding mode, or -1 for a zero. */
static void write_tap(FILE *f, const char *name, int pad, const char *ct) {
  fprintf(f, "__device__ int64_t %s_tap(int64_t i, int64_t d, %s lo, %s hi) {\n", name, ct, ct);
  if (pad == ZEROS) {
    fprintf(f, "  (void)lo;\n  (void)hi;\n  return i >= 0 && i < d ? i : -1;\n}\n");
  } else if (pad == BORDER) {
    fprintf(f, "  (void)lo;\n  (void)hi;\n  return i < 0 ? 0 : i >= d ? d - 1 : i;\n}\n");
  } else { /* the reflected coordinate truncates, as ONNX */
    fprintf(f, "  const int64_t r = (int64_t)%s_reflect((%s)i, lo, hi);\n"
               "  return r < 0 ? 0 : r >= d ? d - 1 : r;\n}\n", name, ct);
  }
}

/* `name`_taps (gs_axis_taps): the taps of one axis of length d for the
 * normalised coordinate g: indices (-1 for a zero) and weights. */
static void write_taps(FILE *f, const char *name, int mode, int pad, bool ac, const char *ct) {
  const char *sf = kl_cg_real_suffix(ct);
  fprintf(f, "__device__ void %s_taps(%s g, int64_t d, int64_t *idx, %s *w) {\n", name, ct, ct);
  if (ac)
    fprintf(f, "  const %s lo = 0, hi = (%s)d - 1;\n"
               "  %s v = (g + 1) / 2 * (%s)(d - 1);\n", ct, ct, ct, ct);
  else
    fprintf(f, "  const %s lo = (%s)-0.5, hi = (%s)d - (%s)0.5;\n"
               "  %s v = ((g + 1) * (%s)d - 1) / 2;\n", ct, ct, ct, ct, ct, ct);
  if (mode == NEAREST) fprintf(f, "  v = rint%s(v); /* halves to even */\n", sf);
  /* a point outside: border and reflection move it in, zeros keeps it */
  if (pad == BORDER)
    fprintf(f, "  if (v < lo || v > hi) v = v < 0 ? 0 : v > (%s)d - 1 ? (%s)d - 1 : v;\n", ct, ct);
  else if (pad == REFLECTION)
    fprintf(f, "  if (v < lo || v > hi) v = %s_reflect(v, lo, hi);\n", name);
  fprintf(f, "  if (v != v) v = lo;\n"
             "  const %s v0 = floor%s(v), t = v - v0;\n"
             "  const int64_t i0 = (int64_t)fmax%s(fmin%s(v0, (%s)1e15), (%s)-1e15);\n",
          ct, sf, sf, sf, ct, ct);
  if (mode == NEAREST) {
    fprintf(f, "  (void)t;\n  w[0] = 1;\n  idx[0] = %s_tap(i0, d, lo, hi);\n", name);
  } else if (mode == LINEAR) {
    fprintf(f, "  w[0] = 1 - t;\n  w[1] = t;\n"
               "  for (int j = 0; j < 2; j++) idx[j] = %s_tap(i0 + j, d, lo, hi);\n", name);
  } else { /* Keys cubic, a = -0.75, taps at -1, 0, 1, 2 */
    fprintf(f, "  const %s a = (%s)-0.75, dist[4] = {t + 1, t, 1 - t, 2 - t};\n"
               "  for (int j = 0; j < 4; j++) {\n"
               "    const %s x = dist[j];\n"
               "    w[j] = x <= 1 ? ((a + 2) * x - (a + 3)) * x * x + 1\n"
               "                  : ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;\n"
               "    idx[j] = %s_tap(i0 - 1 + j, d, lo, hi);\n  }\n", ct, ct, ct, name);
  }
  fprintf(f, "}\n");
}

/* One thread per output element (b, c, o1..ok): the taps of each axis,
 * then the weighted sum over every combination of one tap per axis. */
static void write_kernel(FILE *f, const char *name, const kl_node *n) {
  const kl_value *x = n->inputs[0], *g = n->inputs[1], *y = n->outputs[0];
  int k = x->shape.rank - 2, nt = gs_ntaps(gs_mode(n));
  int64_t xs[KL_MAX_RANK], xin = 1, yout = 1;
  kl_shape_strides(&x->shape, xs);
  for (int a = 0; a < k; a++) xin *= x->shape.dims[2 + a], yout *= y->shape.dims[2 + a];
  char b1[128], at[160], shape[160];
  const char *ct = node_real(n);
  fprintf(f, "/* mode %s, padding_mode %s, align_corners %d; x %s%s */\n",
          kl_attr_string(n, "mode", "linear"), kl_attr_string(n, "padding_mode", "zeros"),
          (int)kl_attr_int(n, "align_corners", 0), kl_dtype_name(x->dtype),
          kl_shape_str(&x->shape, shape, sizeof shape));
  fprintf(f, "KL_KERNEL void %s(const %s *__restrict__ x, const %s *__restrict__ grid, "
             "%s *__restrict__ out) {\n", name, kl_cg_storage(x->dtype), kl_cg_storage(g->dtype),
          kl_cg_storage(y->dtype));
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n", (ll)kl_shape_numel(&y->shape));
  /* i = (b * C + c) * yout + o; the grid row of (b, o) holds k coordinates */
  fprintf(f, "    const int64_t o = i %% %lldLL, b = i / %lldLL;\n", (ll)yout,
          (ll)(yout * x->shape.dims[1]));
  fprintf(f, "    const %s *const xp = x + (i / %lldLL) * %lldLL;\n", kl_cg_storage(x->dtype),
          (ll)yout, (ll)xin);
  fprintf(f, "    const %s *const gp = grid + (b * %lldLL + o) * %d;\n", kl_cg_storage(g->dtype),
          (ll)yout, k);
  for (int a = 0; a < k; a++) { /* grid[..., 0] addresses the last axis */
    snprintf(at, sizeof at, "gp[%d]", k - 1 - a);
    fprintf(f, "    int64_t i%d[%d];\n    %s w%d[%d];\n    %s_taps(%s, %lldLL, i%d, w%d);\n",
            a, nt, ct, a, nt, name, kl_cg_load(b1, sizeof b1, g->dtype, ct, at),
            (ll)x->shape.dims[2 + a], a, a);
  }
  fprintf(f, "    %s acc = 0;\n", ct);
  for (int a = 0; a < k; a++) {
    int ind = 4 + 2 * a;
    fprintf(f, "%*sfor (int t%d = 0; t%d < %d; t%d++) {\n", ind, "", a, a, nt, a);
    fprintf(f, "%*s  if (i%d[t%d] < 0) continue;\n", ind, "", a, a);
    /* p: the product of the weights so far; f: the offset so far */
    if (a == 0) fprintf(f, "%*s  const %s p0 = w0[t0];\n", ind, "", ct);
    else fprintf(f, "%*s  const %s p%d = p%d * w%d[t%d];\n", ind, "", ct, a, a - 1, a, a);
    fprintf(f, "%*s  if (p%d == 0) continue;\n", ind, "", a);
    fprintf(f, "%*s  const int64_t f%d = ", ind, "", a);
    if (a > 0) fprintf(f, "f%d + ", a - 1);
    fprintf(f, "i%d[t%d] * %lldLL;\n", a, a, (ll)xs[2 + a]);
  }
  snprintf(at, sizeof at, "xp[f%d]", k - 1);
  fprintf(f, "%*s  acc += p%d * %s;\n", 2 + 2 * k, "", k - 1,
          kl_cg_load(b1, sizeof b1, x->dtype, ct, at));
  for (int a = k - 1; a >= 0; a--) fprintf(f, "%*s}\n", 4 + 2 * a, "");
  fprintf(f, "    ");
  kl_cg_store(f, y->dtype, "out[i]", "acc");
  fprintf(f, "  }\n}\nKL_EMU_ENTRY(%s, KL_ARG(const %s *, 0), KL_ARG(const %s *, 1), "
             "KL_ARG(%s *, 2));\n\n", name, kl_cg_storage(x->dtype), kl_cg_storage(g->dtype),
          kl_cg_storage(y->dtype));
}

static int emit_grid_sample(kl_cg_emitter *e, const kl_node *n) {
  kl_cg_comment(e, n);
  int64_t threads = kl_shape_numel(&n->outputs[0]->shape);
  if (threads == 0) return 0; /* no kernel: its index math would divide by 0 */
  char name[32];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  int pad = gs_padding(n);
  const char *ct = node_real(n);
  if (pad == REFLECTION) write_reflect(f, name, ct);
  write_tap(f, name, pad, ct);
  write_taps(f, name, gs_mode(n), pad, kl_attr_int(n, "align_corners", 0) != 0, ct);
  write_kernel(f, name, n);
  kl_cg_launch_node(e, k, threads, n);
  return 0;
}

/* ---- roi_align ------------------------------------------------------------ */

static bool handles_roi_align(const kl_node *n) {
  static const char *const modes[] = {"avg", "max"};
  static const char *const coords[] = {"half_pixel", "output_half_pixel"};
  return n->op == KL_OP_ROI_ALIGN && kl_dtype_is_float(n->inputs[0]->dtype) &&
         pick(kl_attr_string(n, "mode", "avg"), modes, 2) >= 0 &&
         pick(kl_attr_string(n, "coordinate_transformation_mode", "half_pixel"), coords, 2) >= 0;
}

/* `name`_bin (roi_bin in ir/ops_sample.c): one bin of the plane xp, the
 * same samples, terms and order, in the real type ct. */
static void write_roi_bin(FILE *f, const char *name, const kl_node *n, bool is_max,
                          const char *ct) {
  const kl_value *x = n->inputs[0];
  int64_t h = x->shape.dims[2], w = x->shape.dims[3];
  char b1[128];
  fprintf(f, "__device__ %s %s_at(const %s *xp, int64_t i) {\n  return %s;\n}\n", ct, name,
          kl_cg_storage(x->dtype), kl_cg_load(b1, sizeof b1, x->dtype, ct, "xp[i]"));
  /* T: the real type, typedef'd once so the helper text reads as one */
  fprintf(f, "typedef %s %s_real;\n", ct, name);
  fprintf(f, "__device__ %s_real %s_bin(const %s *xp, %s_real y0, %s_real x0, %s_real bh,\n"
             "                       %s_real bw, int64_t gh, int64_t gw) {\n"
             "  typedef %s_real T;\n"
             "  const int64_t h = %lldLL, w = %lldLL;\n"
             "  T acc = 0;\n%s"
             "  for (int64_t iy = 0; iy < gh; iy++) {\n"
             "    const T yy = y0 + ((T)iy + (T)0.5) * bh / (T)gh;\n"
             "    for (int64_t ix = 0; ix < gw; ix++) {\n"
             "      const T xx = x0 + ((T)ix + (T)0.5) * bw / (T)gw;\n"
             "      T t0 = 0, t1 = 0, t2 = 0, t3 = 0;\n"
             "      if (!(yy < -1 || yy > (T)h || xx < -1 || xx > (T)w)) {\n"
             "        T y = yy > 0 ? yy : 0, x = xx > 0 ? xx : 0;\n"
             "        int64_t ylo = (int64_t)y, xlo = (int64_t)x, yhi, xhi;\n"
             "        if (ylo >= h - 1) {\n          yhi = ylo = h - 1;\n          y = (T)ylo;\n"
             "        } else {\n          yhi = ylo + 1;\n        }\n"
             "        if (xlo >= w - 1) {\n          xhi = xlo = w - 1;\n          x = (T)xlo;\n"
             "        } else {\n          xhi = xlo + 1;\n        }\n"
             "        const T ly = y - (T)ylo, lx = x - (T)xlo, hy = 1 - ly, hx = 1 - lx;\n"
             "        t0 = hy * hx * %s_at(xp, ylo * w + xlo);\n"
             "        t1 = hy * lx * %s_at(xp, ylo * w + xhi);\n"
             "        t2 = ly * hx * %s_at(xp, yhi * w + xlo);\n"
             "        t3 = ly * lx * %s_at(xp, yhi * w + xhi);\n"
             "      }\n", name, name, kl_cg_storage(x->dtype), name, name, name, name, name,
          (ll)h, (ll)w, is_max ? "  bool first = true;\n" : "", name, name, name, name);
  const char *sf = kl_cg_real_suffix(ct);
  if (is_max)
    fprintf(f, "      const T m = fmax%s(fmax%s(t0, t1), fmax%s(t2, t3));\n"
               "      acc = first ? m : fmax%s(acc, m);\n      first = false;\n"
               "    }\n  }\n  return acc;\n}\n", sf, sf, sf, sf);
  else
    fprintf(f, "      acc += t0 + t1 + t2 + t3;\n"
               "    }\n  }\n"
               "  const int64_t count = gh * gw;\n"
               "  return acc / (T)(count > 1 ? count : 1);\n}\n");
}

/* One thread per output element (r, c, ph, pw): the region's geometry
 * (as kl_eval_ROI_ALIGN), then its bin.  A batch index out of range
 * gives NaN and raises the flag: run() then fails as the interpreter. */
static int emit_roi_align(kl_cg_emitter *e, const kl_node *n) {
  kl_cg_comment(e, n);
  const kl_value *x = n->inputs[0], *r = n->inputs[1], *bi = n->inputs[2], *y = n->outputs[0];
  int64_t total = kl_shape_numel(&y->shape);
  if (total == 0) return 0;
  bool is_max = !strcmp(kl_attr_string(n, "mode", "avg"), "max");
  bool half = !strcmp(kl_attr_string(n, "coordinate_transformation_mode", "half_pixel"),
                      "half_pixel");
  int64_t oh = y->shape.dims[2], ow = y->shape.dims[3], ch = x->shape.dims[1];
  int64_t ratio = kl_attr_int(n, "sampling_ratio", 0), plane = x->shape.dims[2] * x->shape.dims[3];
  double scale = kl_attr_float(n, "spatial_scale", 1.0);
  char name[32], b1[128], b2[128], at[64];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  const char *ct = node_real(n);
  write_roi_bin(f, name, n, is_max, ct);
  /* samples per bin on an axis (roi_grid) */
  fprintf(f, "__device__ int64_t %s_grid(%s bin) {\n", name, ct);
  if (ratio > 0) fprintf(f, "  (void)bin;\n  return %lldLL;\n}\n", (ll)ratio);
  else fprintf(f, "  const %s g = ceil%s(bin);\n"
                  "  return g > 0 ? (g < (%s)1e9 ? (int64_t)g : 1000000000LL) : 0;\n}\n",
               ct, kl_cg_real_suffix(ct), ct);
  fprintf(f, "/* roi_align mode %s, %s, x %s */\n", is_max ? "max" : "avg",
          half ? "half_pixel" : "output_half_pixel", kl_dtype_name(x->dtype));
  fprintf(f, "KL_KERNEL void %s(const %s *__restrict__ x, const %s *__restrict__ rois, "
             "const %s *__restrict__ bi, %s *__restrict__ out, unsigned *__restrict__ bad) {\n", name,
          kl_cg_storage(x->dtype), kl_cg_storage(r->dtype), kl_cg_storage(bi->dtype),
          kl_cg_storage(y->dtype));
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n", (ll)total);
  fprintf(f, "    const int64_t pw = i %% %lldLL, ph = (i / %lldLL) %% %lldLL;\n"
             "    const int64_t c = (i / %lldLL) %% %lldLL, r = i / %lldLL;\n",
          (ll)ow, (ll)ow, (ll)oh, (ll)(oh * ow), (ll)ch, (ll)(oh * ow * ch));
  /* the batch index is range-checked exactly, in double, once a thread */
  fprintf(f, "    const double bd = %s;\n", kl_cg_load(b1, sizeof b1, bi->dtype, "double", "bi[r]"));
  fprintf(f, "    %s v = KL_NAN;\n"
             "    if (!(bd >= 0 && bd < %lldLL)) atomicMax(bad, 0xFFFFFFFFu - (unsigned)r);\n"
             "    else {\n", ct, (ll)x->shape.dims[0]);
  fprintf(f, "      %s rp[4];\n      for (int j = 0; j < 4; j++) rp[j] = %s;\n", ct,
          kl_cg_load(b2, sizeof b2, r->dtype, ct, "rois[r * 4 + j]"));
  fprintf(f, "      const %s scale = (%s)%.17g, off = (%s)%s;\n"
             "      const %s x0 = rp[0] * scale - off, y0 = rp[1] * scale - off;\n"
             "      %s rw = rp[2] * scale - off - x0, rh = rp[3] * scale - off - y0;\n",
          ct, ct, scale, ct, half ? "0.5" : "0.0", ct, ct);
  if (!half) fprintf(f, "      rw = rw > 1 ? rw : 1;\n      rh = rh > 1 ? rh : 1;\n");
  fprintf(f, "      const %s bh = rh / (%s)%lld, bw = rw / (%s)%lld;\n"
             "      const %s *const xp = x + ((int64_t)bd * %lldLL + c) * %lldLL;\n"
             "      v = %s_bin(xp, y0 + (%s)ph * bh, x0 + (%s)pw * bw, bh, bw, "
             "%s_grid(bh), %s_grid(bw));\n    }\n    ",
          ct, ct, (ll)oh, ct, (ll)ow, kl_cg_storage(x->dtype), (ll)ch, (ll)plane, name, ct, ct,
          name, name);
  snprintf(at, sizeof at, "out[i]");
  kl_cg_store(f, y->dtype, at, "v");
  fprintf(f, "  }\n}\nKL_EMU_ENTRY(%s, KL_ARG(const %s *, 0), KL_ARG(const %s *, 1), "
             "KL_ARG(const %s *, 2), KL_ARG(%s *, 3), KL_ARG(unsigned *, 4));\n\n", name,
          kl_cg_storage(x->dtype), kl_cg_storage(r->dtype), kl_cg_storage(bi->dtype),
          kl_cg_storage(y->dtype));
  char flag[160], px[160], pr[160], pb[160], py[160];
  int flag_no = kl_cg_flag(e, flag, sizeof flag);
  const char *args[5] = {kl_cg_ptr(e, x, px, sizeof px), kl_cg_ptr(e, r, pr, sizeof pr),
                         kl_cg_ptr(e, bi, pb, sizeof pb), kl_cg_ptr(e, y, py, sizeof py), flag};
  kl_cg_launch(e, k, total, args, 5);
  kl_cg_flag_check(e, flag_no, n, "a batch index of roi", x->shape.dims[0]);
  return 0;
}

/* ---- deform_conv2d -------------------------------------------------------- */

static bool handles_deform_conv(const kl_node *n) {
  return n->op == KL_OP_DEFORM_CONV2D && kl_dtype_is_float(n->outputs[0]->dtype);
}

static void attr_ints_or(const kl_node *n, const char *attr, int len, int64_t dflt, int64_t *out) {
  const int64_t *v;
  int got = kl_attr_ints(n, attr, &v);
  for (int i = 0; i < len; i++) out[i] = got == len ? v[i] : dflt;
}

/* One thread per output element (b, oc, oy, ox), as kl_eval_DEFORM_CONV2D:
 * for each input channel of the group and each tap, the moved point's
 * bilinear value (zero outside; `name`_at), times the mask and the weight,
 * summed in the real type (float, double for f64) in the interpreter's order. */
static int emit_deform_conv(kl_cg_emitter *e, const kl_node *n) {
  kl_cg_comment(e, n);
  const kl_value *x = n->inputs[0], *w = n->inputs[1], *off = n->inputs[2], *y = n->outputs[0];
  const kl_value *bias = n->ninputs > 3 ? n->inputs[3] : NULL;
  const kl_value *mask = n->ninputs > 4 ? n->inputs[4] : NULL;
  int64_t total = kl_shape_numel(&y->shape);
  if (total == 0) return 0;
  int64_t stride[2], pad[4], dil[2];
  attr_ints_or(n, "strides", 2, 1, stride);
  attr_ints_or(n, "pads", 4, 0, pad);
  attr_ints_or(n, "dilations", 2, 1, dil);
  int64_t groups = kl_attr_int(n, "groups", 1), ogroups = kl_attr_int(n, "offset_groups", 1);
  const int64_t *xd = x->shape.dims;
  int64_t c = xd[1], h = xd[2], wi = xd[3], m = w->shape.dims[0], kh = w->shape.dims[2],
          kw = w->shape.dims[3], oh = y->shape.dims[2], ow = y->shape.dims[3];
  int64_t cpg = c / groups, mpg = m / groups, cpo = c / ogroups, taps = kh * kw, plane = oh * ow;
  char name[32], b1[128], b2[128], b3[128], px[64];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  snprintf(px, sizeof px, "p[yy * %lldLL + xx]", (ll)wi);
  const char *ct = node_real(n), *sf = kl_cg_real_suffix(ct);
  /* bilinear_zero of ir/ops_contract.c over one plane; T the real type */
  fprintf(f, "typedef %s %s_real;\n", ct, name);
  fprintf(f, "__device__ %s_real %s_at(const %s *p, %s_real y, %s_real x) {\n"
             "  typedef %s_real T;\n"
             "  if (y != y || x != x) return KL_NAN;\n"
             "  y = fmax%s(fmin%s(y, (T)1e9), (T)-1e9);\n  x = fmax%s(fmin%s(x, (T)1e9), (T)-1e9);\n"
             "  const T fy = floor%s(y), fx = floor%s(x), ly = y - fy, lx = x - fx;\n"
             "  const int64_t y0 = (int64_t)fy, x0 = (int64_t)fx;\n"
             "  const T wy[2] = {1 - ly, ly}, wx[2] = {1 - lx, lx};\n"
             "  T acc = 0;\n"
             "  for (int i = 0; i < 2; i++)\n"
             "    for (int j = 0; j < 2; j++) {\n"
             "      const int64_t yy = y0 + i, xx = x0 + j;\n"
             "      if (yy >= 0 && yy < %lldLL && xx >= 0 && xx < %lldLL && wy[i] * wx[j] != 0)\n"
             "        acc += wy[i] * wx[j] * %s;\n"
             "    }\n  return acc;\n}\n",
          name, name, kl_cg_storage(x->dtype), name, name, name, sf, sf, sf, sf, sf, sf, (ll)h,
          (ll)wi, kl_cg_load(b1, sizeof b1, x->dtype, ct, px));
  fprintf(f, "/* deform_conv2d, x %s */\n", kl_dtype_name(x->dtype));
  fprintf(f, "KL_KERNEL void %s(const %s *__restrict__ x, const %s *__restrict__ w, "
             "const %s *__restrict__ off, ", name, kl_cg_storage(x->dtype),
          kl_cg_storage(w->dtype), kl_cg_storage(off->dtype));
  if (bias) fprintf(f, "const %s *__restrict__ bias, ", kl_cg_storage(bias->dtype));
  if (mask) fprintf(f, "const %s *__restrict__ mask, ", kl_cg_storage(mask->dtype));
  fprintf(f, "%s *__restrict__ out) {\n", kl_cg_storage(y->dtype));
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n", (ll)total);
  fprintf(f, "    const int64_t at = i %% %lldLL, ox = at %% %lldLL, oy = at / %lldLL;\n"
             "    const int64_t oc = (i / %lldLL) %% %lldLL, b = i / %lldLL;\n",
          (ll)plane, (ll)ow, (ll)ow, (ll)plane, (ll)m, (ll)(plane * m));
  if (bias)
    fprintf(f, "    %s acc = %s;\n", ct, kl_cg_load(b1, sizeof b1, bias->dtype, ct, "bias[oc]"));
  else
    fprintf(f, "    %s acc = 0;\n", ct);
  fprintf(f, "    for (int64_t icl = 0; icl < %lldLL; icl++) {\n"
             "      const int64_t ic = oc / %lldLL * %lldLL + icl, og = ic / %lldLL;\n"
             "      const %s *const xp = x + (b * %lldLL + ic) * %lldLL;\n"
             "      for (int64_t t = 0; t < %lldLL; t++) {\n"
             "        const int64_t ky = t / %lldLL, kx = t %% %lldLL;\n"
             "        const int64_t ob = ((b * %lldLL + og) * %lldLL + t) * %lldLL + at;\n",
          (ll)cpg, (ll)mpg, (ll)cpg, (ll)cpo, kl_cg_storage(x->dtype), (ll)c, (ll)(h * wi),
          (ll)taps, (ll)kw, (ll)kw, (ll)ogroups, (ll)taps, (ll)(2 * plane));
  fprintf(f, "        const %s yy = (%s)(oy * %lldLL - %lldLL + ky * %lldLL) + %s;\n", ct, ct,
          (ll)stride[0], (ll)pad[0], (ll)dil[0],
          kl_cg_load(b1, sizeof b1, off->dtype, ct, "off[ob]"));
  char at[96];
  snprintf(at, sizeof at, "off[ob + %lldLL]", (ll)plane);
  fprintf(f, "        const %s xx = (%s)(ox * %lldLL - %lldLL + kx * %lldLL) + %s;\n", ct, ct,
          (ll)stride[1], (ll)pad[1], (ll)dil[1], kl_cg_load(b2, sizeof b2, off->dtype, ct, at));
  fprintf(f, "        %s v = %s_at(xp, yy, xx);\n", ct, name);
  if (mask) {
    snprintf(at, sizeof at, "mask[((b * %lldLL + og) * %lldLL + t) * %lldLL + at]", (ll)ogroups,
             (ll)taps, (ll)plane);
    fprintf(f, "        v *= %s;\n", kl_cg_load(b3, sizeof b3, mask->dtype, ct, at));
  }
  snprintf(at, sizeof at, "w[(oc * %lldLL + icl) * %lldLL + t]", (ll)cpg, (ll)taps);
  fprintf(f, "        acc += %s * v;\n      }\n    }\n    ",
          kl_cg_load(b1, sizeof b1, w->dtype, ct, at));
  kl_cg_store(f, y->dtype, "out[i]", "acc");
  fprintf(f, "  }\n}\nKL_EMU_ENTRY(%s, KL_ARG(const %s *, 0), KL_ARG(const %s *, 1), "
             "KL_ARG(const %s *, 2)", name, kl_cg_storage(x->dtype), kl_cg_storage(w->dtype),
          kl_cg_storage(off->dtype));
  int na = 3;
  if (bias) fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(bias->dtype), na++);
  if (mask) fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(mask->dtype), na++);
  fprintf(f, ", KL_ARG(%s *, %d));\n\n", kl_cg_storage(y->dtype), na);
  kl_cg_launch_node(e, k, total, n);
  return 0;
}

const kl_cg_template kl_cg_templates_sample[] = {
    {handles_grid_sample, emit_grid_sample, NULL},
    {handles_roi_align, emit_roi_align, NULL},
    {handles_deform_conv, emit_deform_conv, NULL},
    {NULL, NULL, NULL},
};
