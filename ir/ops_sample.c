/* ops_sample.c - shape inference and evaluation of the sampling rows of
 * ops.def: resize, roi_align and grid_sample, interpolation at computed
 * coordinates. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* ---- shared helpers -------------------------------------------------- */

/* A floats attribute of exactly `len` entries into out; 0 when absent (out
 * untouched), 1 when read, -1 on a wrong length. */
static int floats_attr(const kl_node *n, kl_error *err, const char *name,
                       int len, double *out) {
  const kl_attr *a = kl_node_attr(n, name);
  if (!a) return 0;
  if (a->kind != KL_ATTR_FLOATS || a->n != len)
    return KL_NODE_FAIL(n, err, "%s must be %d floats, got %d", name, len,
                        a->n);
  memcpy(out, a->floats, sizeof(double) * (size_t)len);
  return 1;
}

/* Index of `s` in the NULL-terminated list, or a failure naming them. */
static int pick(const kl_node *n, kl_error *err, const char *attr,
                const char *dflt, const char *const *names, int *out) {
  const char *s = kl_attr_string(n, attr, dflt);
  char all[400] = "";
  for (int i = 0; names[i]; i++) {
    if (!strcmp(s, names[i])) {
      *out = i;
      return 0;
    }
    snprintf(all + strlen(all), sizeof all - strlen(all), "%s\"%s\"",
             i ? ", " : "", names[i]);
  }
  return KL_NODE_FAIL(n, err, "%s must be one of %s, not \"%s\"", attr, all,
                      s);
}

/* ---- resize ---------------------------------------------------------- */

enum { R_NEAREST, R_LINEAR, R_CUBIC };
static const char *const resize_modes[] = {"nearest", "linear", "cubic", NULL};
enum {
  C_HALF_PIXEL, C_HALF_PIXEL_SYM, C_PYTORCH_HALF_PIXEL, C_ALIGN_CORNERS,
  C_ASYMMETRIC, C_TF_HALF_PIXEL_NN, C_TF_CROP_AND_RESIZE
};
static const char *const coord_modes[] = {
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
    "align_corners", "asymmetric", "tf_half_pixel_for_nn",
    "tf_crop_and_resize", NULL};
enum { N_ROUND_FLOOR, N_ROUND_CEIL, N_FLOOR, N_CEIL };
static const char *const nearest_modes[] = {
    "round_prefer_floor", "round_prefer_ceil", "floor", "ceil", NULL};

typedef struct {
  int mode, coord, nearest;
  double a, extrapolation;
  bool exclude_outside, antialias;
  int64_t sizes[KL_MAX_RANK];
  double scales[KL_MAX_RANK], roi[2 * KL_MAX_RANK];
} resize_cfg;

/* With antialias, the first tap's offset from the left neighbour: the
 * filter (support 1 linear, 2 cubic) stretched by 1 / scale when
 * downscaling, as the ONNX reference.  The taps run to 1 - start. */
static int64_t antialias_start(const resize_cfg *r, int d) {
  double s = r->scales[d] < 1 ? r->scales[d] : 1.0;
  double support = r->mode == R_CUBIC ? 2.0 : 1.0;
  double start = floor(-support / s) + 1;
  return start < -1e6 ? -1000000 : (int64_t)start;
}

static int resize_setup(const kl_node *n, kl_error *err, resize_cfg *r) {
  const kl_value *x = n->inputs[0];
  int rank = x->shape.rank;
  char sx[300];
  if (pick(n, err, "mode", "nearest", resize_modes, &r->mode) ||
      pick(n, err, "coordinate_transformation_mode", "half_pixel",
           coord_modes, &r->coord) ||
      pick(n, err, "nearest_mode", "round_prefer_floor", nearest_modes,
           &r->nearest) ||
      kl_attr_flag(n, err, "exclude_outside", 0, &r->exclude_outside) ||
      kl_attr_flag(n, err, "antialias", 0, &r->antialias))
    return -1;
  if (r->mode == R_NEAREST) r->antialias = false; /* a filter of linear and cubic only */
  r->a = kl_attr_float(n, "cubic_coeff_a", -0.75);
  r->extrapolation = kl_attr_float(n, "extrapolation_value", 0.0);
  const int64_t *sizes;
  if (kl_attr_ints(n, "sizes", &sizes) != rank)
    return KL_NODE_FAIL(n, err, "sizes must have one entry per axis of x %s",
                        kl_value_str(x, sx, sizeof sx));
  for (int d = 0; d < rank; d++) {
    if (sizes[d] < 1 || sizes[d] > KL_MAX_NUMEL || x->shape.dims[d] < 1)
      return KL_NODE_FAIL(n, err, "sizes[%d] = %lld and the dims of x %s must "
                          "be >= 1", d, (long long)sizes[d],
                          kl_value_str(x, sx, sizeof sx));
    r->sizes[d] = sizes[d];
    r->scales[d] = (double)sizes[d] / (double)x->shape.dims[d];
    r->roi[d] = 0.0;
    r->roi[rank + d] = 1.0;
  }
  if (floats_attr(n, err, "scales", rank, r->scales) < 0 ||
      floats_attr(n, err, "roi", 2 * rank, r->roi) < 0)
    return -1;
  for (int d = 0; d < rank; d++) {
    if (!(r->scales[d] > 0) || !isfinite(r->scales[d]))
      return KL_NODE_FAIL(n, err, "scales[%d] = %g must be positive", d,
                          r->scales[d]);
    if (r->antialias && antialias_start(r, d) < 1 - KL_RESIZE_MAX_TAPS / 2)
      return KL_NODE_FAIL(n, err, "antialias at scales[%d] = %g needs more than "
                          "%d taps", d, r->scales[d], KL_RESIZE_MAX_TAPS);
  }
  return 0;
}

int kl_infer_RESIZE(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0];
  char sx[300];
  if (x->dtype == KL_BOOL)
    return KL_NODE_FAIL(n, err, "does not accept bool, got %s",
                        kl_value_str(x, sx, sizeof sx));
  resize_cfg r;
  if (resize_setup(n, err, &r)) return -1;
  kl_shape out = {x->shape.rank, {0}};
  memcpy(out.dims, r.sizes, sizeof(int64_t) * (size_t)out.rank);
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

/* The taps (input index, weight) for one output index on one axis;
 * ntap 0 means "outside the crop: use the extrapolation value". */
typedef kl_resize_taps taps;

/* The input coordinate of output index o on an axis (ONNX's formulas,
 * with the fractional output width scale * in); *outside for
 * tf_crop_and_resize points beyond the input. */
static double source_coord(const resize_cfg *r, int d, int rank, int64_t o,
                           int64_t in, bool *outside) {
  double s = r->scales[d], width = s * (double)in, x = (double)o;
  *outside = false;
  switch (r->coord) {
  case C_HALF_PIXEL: return (x + 0.5) / s - 0.5;
  case C_HALF_PIXEL_SYM: {
    double adj = (double)r->sizes[d] / width, center = (double)in / 2;
    return center * (1 - adj) + (x + 0.5) / s - 0.5;
  }
  case C_PYTORCH_HALF_PIXEL: return width == 1 ? -0.5 : (x + 0.5) / s - 0.5;
  case C_ALIGN_CORNERS:
    return width == 1 ? 0.0 : x * (double)(in - 1) / (width - 1);
  case C_ASYMMETRIC: return x / s;
  case C_TF_HALF_PIXEL_NN: return (x + 0.5) / s;
  default: {
    double r0 = r->roi[d], r1 = r->roi[rank + d], v;
    if (width == 1) v = (r1 - r0) * (double)(in - 1) / 2;
    else v = x * (r1 - r0) * (double)(in - 1) / (width - 1);
    v += r0 * (double)(in - 1);
    *outside = v < 0 || v > (double)(in - 1);
    return v;
  }
  }
}

/* Keys' cubic kernel at distance x. */
static double cubic_kernel(double x, double a) {
  x = fabs(x);
  if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0;
}

/* Antialias weights of the taps base + start .. base + 1 - start: the
 * filter at (i - t) * scale (scale at most 1), normalised to sum 1. */
static int antialias_coeffs(const resize_cfg *r, int d, double t, double *c) {
  double s = r->scales[d] < 1 ? r->scales[d] : 1.0, sum = 0;
  int64_t start = antialias_start(r, d);
  int nt = (int)(2 - 2 * start);
  for (int k = 0; k < nt; k++) {
    double x = ((double)(start + k) - t) * s;
    c[k] = r->mode == R_CUBIC ? cubic_kernel(x, r->a) : fmax(0.0, 1 - fabs(x));
    sum += c[k];
  }
  for (int k = 0; k < nt; k++) c[k] /= sum;
  return nt;
}

static void cubic_coeffs(double t, double a, double *c) {
  double u = 1 - t;
  c[0] = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a;
  c[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
  c[2] = ((a + 2) * u - (a + 3)) * u * u + 1;
  c[3] = ((a * (u + 1) - 5 * a) * (u + 1) + 8 * a) * (u + 1) - 4 * a;
}

/* As the ONNX reference: the left neighbour `base` and ratio t in (0, 1]
 * (an integral coordinate is the right end of the interval to its left);
 * taps beyond the edges are clamped, or dropped with exclude_outside. */
static void make_taps(const resize_cfg *r, int d, int rank, int64_t o,
                      int64_t in, taps *tp) {
  bool outside;
  double x = source_coord(r, d, rank, o, in, &outside);
  tp->ntap = 0;
  if (outside) return;
  /* Odd scales or roi can send x anywhere (or to NaN); far outside, every
   * tap reads an edge anyway, and int64 conversion stays defined. */
  if (!(x > -1e9)) x = -1e9;
  if (!(x < 1e9)) x = 1e9;
  double fl = floor(x), t = x - fl;
  int64_t base = (int64_t)fl;
  if (t == 0) {
    base--;
    t = 1;
  }
  int64_t first;
  double c[KL_RESIZE_MAX_TAPS];
  if (r->antialias) {
    tp->ntap = antialias_coeffs(r, d, t, c);
    first = base + antialias_start(r, d);
  } else if (r->mode == R_NEAREST) {
    bool right = true;
    if (t < 1) {
      switch (r->nearest) {
      case N_ROUND_FLOOR: right = t > 0.5; break;
      case N_ROUND_CEIL: right = t >= 0.5; break;
      case N_FLOOR: right = false; break;
      default: right = true; break;
      }
    }
    first = base + (right ? 1 : 0);
    tp->ntap = 1;
    c[0] = 1;
  } else if (r->mode == R_LINEAR) {
    first = base;
    tp->ntap = 2;
    c[0] = 1 - t;
    c[1] = t;
  } else {
    first = base - 1;
    tp->ntap = 4;
    cubic_coeffs(t, r->a, c);
  }
  double sum = 0;
  for (int k = 0; k < tp->ntap; k++) {
    int64_t i = first + k;
    if (r->exclude_outside && (i < 0 || i >= in)) c[k] = 0;
    sum += c[k];
    tp->idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
    tp->w[k] = c[k];
  }
  if (r->exclude_outside && sum != 0)
    for (int k = 0; k < tp->ntap; k++) tp->w[k] /= sum;
}

int kl_resize_tap_at(const kl_node *n, int d, int64_t o, kl_resize_taps *out) {
  resize_cfg r;
  const kl_value *x = n->inputs[0];
  if (n->op != KL_OP_RESIZE || d < 0 || d >= x->shape.rank || resize_setup(n, NULL, &r)) return -1;
  make_taps(&r, d, x->shape.rank, o, x->shape.dims[d], out);
  return 0;
}

/* The most taps make_taps gives on axis d. */
static int max_taps(const resize_cfg *r, int d) {
  if (r->antialias) return (int)(2 - 2 * antialias_start(r, d));
  return r->mode == R_NEAREST ? 1 : r->mode == R_LINEAR ? 2 : 4;
}

int kl_eval_RESIZE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                   kl_error *err) {
  resize_cfg r;
  if (resize_setup(n, err, &r)) return -1;
  const kl_tensor *x = in[0];
  kl_tensor *y = out[0];
  int rank = x->shape.rank;
  if (y->numel == 0) return 0;
  /* Per axis, the taps of each output index o: ntap[o] of them at
   * idx/w[o * nt[d] ..] (a wide antialias filter would not fit in a
   * kl_resize_taps per index). */
  int nt[KL_MAX_RANK];
  int64_t total = 0;
  for (int d = 0; d < rank; d++) nt[d] = max_taps(&r, d), total += r.sizes[d] * nt[d];
  int64_t *idx_all = malloc(sizeof *idx_all * (size_t)total);
  double *w_all = malloc(sizeof *w_all * (size_t)total);
  int *ntap_all = malloc(sizeof *ntap_all * (size_t)total);
  if (!idx_all || !w_all || !ntap_all) {
    free(idx_all), free(w_all), free(ntap_all);
    return KL_NODE_FAIL(n, err, "out of memory");
  }
  int64_t *tidx[KL_MAX_RANK];
  double *tw[KL_MAX_RANK];
  int *tn[KL_MAX_RANK];
  taps tp;
  for (int d = 0, at = 0; d < rank; at += (int)(r.sizes[d] * nt[d]), d++) {
    tidx[d] = idx_all + at, tw[d] = w_all + at, tn[d] = ntap_all + at;
    for (int64_t o = 0; o < r.sizes[d]; o++) {
      make_taps(&r, d, rank, o, x->shape.dims[d], &tp);
      tn[d][o] = tp.ntap;
      memcpy(tidx[d] + o * nt[d], tp.idx, sizeof *tp.idx * (size_t)tp.ntap);
      memcpy(tw[d] + o * nt[d], tp.w, sizeof *tp.w * (size_t)tp.ntap);
    }
  }
  int64_t xs[KL_MAX_RANK], idx[KL_MAX_RANK] = {0}, i = 0;
  kl_shape_strides(&x->shape, xs);
  do {
    bool extrapolate = false;
    for (int d = 0; d < rank; d++) extrapolate |= tn[d][idx[d]] == 0;
    double acc = 0;
    if (extrapolate) {
      acc = r.extrapolation;
    } else {
      /* Sum over every combination of one tap per axis. */
      int k[KL_MAX_RANK] = {0};
      for (;;) {
        double w = 1;
        int64_t off = 0;
        for (int d = 0; d < rank; d++) {
          int64_t at = idx[d] * nt[d] + k[d];
          w *= tw[d][at];
          off += tidx[d][at] * xs[d];
        }
        if (w != 0) acc += w * x->data[off];
        int d = rank - 1;
        while (d >= 0 && ++k[d] == tn[d][idx[d]]) k[d--] = 0;
        if (d < 0) break;
      }
    }
    y->data[i++] = acc;
  } while (kl_index_next(&y->shape, idx));
  free(idx_all), free(w_all), free(ntap_all);
  return 0;
}

/* ---- roi_align ------------------------------------------------------- */

typedef struct {
  bool max, half_pixel;
  int64_t oh, ow, ratio;
  double scale;
} roi_cfg;

static int roi_setup(const kl_node *n, kl_error *err, roi_cfg *c) {
  static const char *const modes[] = {"avg", "max", NULL};
  static const char *const coords[] = {"half_pixel", "output_half_pixel", NULL};
  int mode, coord;
  if (pick(n, err, "mode", "avg", modes, &mode) ||
      pick(n, err, "coordinate_transformation_mode", "half_pixel", coords, &coord))
    return -1;
  c->max = mode == 1;
  c->half_pixel = coord == 0;
  c->oh = kl_attr_int(n, "output_height", 1);
  c->ow = kl_attr_int(n, "output_width", 1);
  c->ratio = kl_attr_int(n, "sampling_ratio", 0);
  c->scale = kl_attr_float(n, "spatial_scale", 1.0);
  if (c->oh < 1 || c->ow < 1 || c->oh > KL_MAX_NUMEL || c->ow > KL_MAX_NUMEL)
    return KL_NODE_FAIL(n, err, "output_height and output_width must be >= 1, got %lld and %lld",
                        (long long)c->oh, (long long)c->ow);
  if (c->ratio < 0 || c->ratio > 65536)
    return KL_NODE_FAIL(n, err, "sampling_ratio must be in [0, 65536], got %lld",
                        (long long)c->ratio);
  if (!isfinite(c->scale)) return KL_NODE_FAIL(n, err, "spatial_scale must be finite");
  return 0;
}

int kl_infer_ROI_ALIGN(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0], *r = n->inputs[1], *b = n->inputs[2];
  char sx[300], sr[300], sb[300];
  roi_cfg c;
  if (roi_setup(n, err, &c) || kl_need_float(n, err, x)) return -1;
  if (x->shape.rank != 4 || r->shape.rank != 2 || r->shape.dims[1] != 4 || r->dtype != x->dtype ||
      b->shape.rank != 1 || b->shape.dims[0] != r->shape.dims[0] ||
      (b->dtype != KL_I32 && b->dtype != KL_I64))
    return KL_NODE_FAIL(n, err, "needs x [N, C, H, W], rois [R, 4] of x's dtype and "
                        "batch_indices [R] (i32 or i64), got %s, %s and %s",
                        kl_value_str(x, sx, sizeof sx), kl_value_str(r, sr, sizeof sr),
                        kl_value_str(b, sb, sizeof sb));
  kl_shape out = {4, {r->shape.dims[0], x->shape.dims[1], c.oh, c.ow}};
  return kl_set_checked_output(n, err, 0, x->dtype, &out);
}

/* Samples per bin along an axis: sampling_ratio, else ceil(bin size)
 * (0 for an empty or NaN region). */
static int64_t roi_grid(int64_t ratio, double bin) {
  if (ratio > 0) return ratio;
  double g = ceil(bin);
  return g > 0 ? (g < 1e9 ? (int64_t)g : 1000000000) : 0;
}

/* One bin of one channel plane xp [h, w], as the ONNX reference: samples
 * at the centres of a grid over the bin, each a bilinear interpolation
 * (points beyond a pixel outside the plane count as 0, points in the
 * last half pixel read the edge); their mean, or the greatest of the
 * four weighted terms of every sample. */
static double roi_bin(const roi_cfg *c, const double *xp, int64_t h, int64_t w, double y0,
                      double x0, double bh, double bw, int64_t gh, int64_t gw) {
  double acc = 0;
  bool first = true;
  for (int64_t iy = 0; iy < gh; iy++) {
    double yy = y0 + ((double)iy + 0.5) * bh / (double)gh;
    for (int64_t ix = 0; ix < gw; ix++) {
      double xx = x0 + ((double)ix + 0.5) * bw / (double)gw;
      double t[4] = {0, 0, 0, 0};
      if (!(yy < -1 || yy > (double)h || xx < -1 || xx > (double)w)) {
        double y = yy > 0 ? yy : 0, x = xx > 0 ? xx : 0;
        int64_t ylo = (int64_t)y, xlo = (int64_t)x, yhi, xhi;
        if (ylo >= h - 1) yhi = ylo = h - 1, y = (double)ylo;
        else yhi = ylo + 1;
        if (xlo >= w - 1) xhi = xlo = w - 1, x = (double)xlo;
        else xhi = xlo + 1;
        double ly = y - (double)ylo, lx = x - (double)xlo, hy = 1 - ly, hx = 1 - lx;
        t[0] = hy * hx * xp[ylo * w + xlo];
        t[1] = hy * lx * xp[ylo * w + xhi];
        t[2] = ly * hx * xp[yhi * w + xlo];
        t[3] = ly * lx * xp[yhi * w + xhi];
      }
      if (!c->max) {
        acc += t[0] + t[1] + t[2] + t[3];
        continue;
      }
      double m = fmax(fmax(t[0], t[1]), fmax(t[2], t[3]));
      acc = first ? m : fmax(acc, m);
      first = false;
    }
  }
  if (c->max) return acc;
  int64_t count = gh * gw;
  return acc / (double)(count > 1 ? count : 1);
}

int kl_eval_ROI_ALIGN(const kl_node *n, kl_tensor **in, kl_tensor **out, kl_error *err) {
  roi_cfg c;
  if (roi_setup(n, err, &c)) return -1;
  const kl_tensor *x = in[0], *rois = in[1], *bi = in[2];
  int64_t nb = x->shape.dims[0], ch = x->shape.dims[1], h = x->shape.dims[2],
          w = x->shape.dims[3], nr = rois->shape.dims[0];
  double off = c.half_pixel ? 0.5 : 0.0;
  double *y = out[0]->data;
  for (int64_t r = 0; r < nr; r++) {
    double bd = bi->data[r];
    if (!(bd >= 0 && bd < (double)nb))
      return KL_NODE_FAIL(n, err, "batch_indices[%lld] = %g is out of range [0, %lld)",
                          (long long)r, bd, (long long)nb);
    int64_t b = (int64_t)bd;
    const double *rp = rois->data + r * 4;
    double x0 = rp[0] * c.scale - off, y0 = rp[1] * c.scale - off;
    double rw = rp[2] * c.scale - off - x0, rh = rp[3] * c.scale - off - y0;
    if (!c.half_pixel) { /* malformed regions become 1x1 */
      rw = rw > 1 ? rw : 1;
      rh = rh > 1 ? rh : 1;
    }
    double bh = rh / (double)c.oh, bw = rw / (double)c.ow;
    int64_t gh = roi_grid(c.ratio, bh), gw = roi_grid(c.ratio, bw);
    for (int64_t cc = 0; cc < ch; cc++) {
      const double *xp = x->data + (b * ch + cc) * h * w;
      for (int64_t ph = 0; ph < c.oh; ph++)
        for (int64_t pw = 0; pw < c.ow; pw++)
          *y++ = roi_bin(&c, xp, h, w, y0 + (double)ph * bh, x0 + (double)pw * bw, bh, bw, gh,
                         gw);
    }
  }
  return 0;
}

/* ---- grid_sample ----------------------------------------------------- */
enum { GS_LINEAR, GS_NEAREST, GS_CUBIC };
enum { GS_ZEROS, GS_BORDER, GS_REFLECTION };

static int gs_pick(const char *s, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

static const char *const gs_modes[] = {"linear", "nearest", "cubic"};
static const char *const gs_pads[] = {"zeros", "border", "reflection"};

int kl_infer_GRID_SAMPLE(kl_node *n, kl_error *err) {
  const kl_value *x = n->inputs[0], *g = n->inputs[1];
  char bx[256], bg[256];
  bool ac;
  const char *mode = kl_attr_string(n, "mode", "linear");
  const char *pad = kl_attr_string(n, "padding_mode", "zeros");
  if (gs_pick(mode, gs_modes, 3) < 0)
    return KL_NODE_FAIL(n, err, "mode must be \"linear\", \"nearest\" or \"cubic\", got \"%s\"",
                        mode);
  if (gs_pick(pad, gs_pads, 3) < 0)
    return KL_NODE_FAIL(n, err, "padding_mode must be \"zeros\", \"border\" or \"reflection\", "
                        "got \"%s\"", pad);
  if (kl_attr_flag(n, err, "align_corners", 0, &ac)) return -1;
  if (kl_need_float(n, err, x) || kl_need_float(n, err, g)) return -1;
  int k = x->shape.rank - 2;
  if (k < 1 || g->shape.rank != k + 2 || g->shape.dims[0] != x->shape.dims[0] ||
      g->shape.dims[k + 1] != k)
    return KL_NODE_FAIL(n, err, "needs x [N, C, d1..dk] and grid [N, o1..ok, k], got %s and %s",
                        kl_value_str(x, bx, sizeof bx), kl_value_str(g, bg, sizeof bg));
  kl_shape s = x->shape;
  for (int i = 0; i < k; i++) s.dims[2 + i] = g->shape.dims[1 + i];
  return kl_set_checked_output(n, err, 0, x->dtype, &s);
}

/* Reflect v into [lo, hi] by the nearer border, as often as needed. */
static double gs_reflect(double v, double lo, double hi) {
  double range = hi - lo;
  if (range <= 0) return lo;
  if (v >= lo && v <= hi) return v;
  double dx = v < lo ? lo - v : v - hi;
  double m = floor(dx / range), r = dx - m * range;
  bool even = fmod(m, 2) == 0;
  return (v < lo) == even ? lo + r : hi - r;
}

/* Keys cubic weights for the taps at -1, 0, 1, 2 of fraction t. */
static void gs_cubic(double t, double *w) {
  const double a = -0.75;
  double d[4] = {t + 1, t, 1 - t, 2 - t};
  for (int i = 0; i < 4; i++) {
    double x = d[i];
    w[i] = x <= 1 ? ((a + 2) * x - (a + 3)) * x * x + 1
                  : ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  }
}

/* Taps of one axis: up to 4 indices (already moved inside by the padding
 * mode, or -1 for a zero) and their weights. */
typedef struct {
  int ntaps;
  int64_t idx[4];
  double w[4];
} gs_axis;

static int64_t gs_tap(int64_t i, int64_t d, int pad, double lo, double hi) {
  if (pad == GS_ZEROS) return i >= 0 && i < d ? i : -1;
  if (pad == GS_BORDER) return i < 0 ? 0 : i >= d ? d - 1 : i;
  int64_t r = (int64_t)gs_reflect((double)i, lo, hi); /* truncates, as ONNX */
  return r < 0 ? 0 : r >= d ? d - 1 : r;
}

static void gs_axis_taps(double g, int64_t d, int mode, int pad, bool ac, gs_axis *a) {
  double v = ac ? (g + 1) / 2 * (double)(d - 1) : ((g + 1) * (double)d - 1) / 2;
  double lo = ac ? 0 : -0.5, hi = ac ? (double)d - 1 : (double)d - 0.5;
  if (mode == GS_NEAREST) v = nearbyint(v);
  if (v < lo || v > hi) { /* the point itself outside: border / reflection move it */
    if (pad == GS_BORDER) v = v < 0 ? 0 : v > (double)d - 1 ? (double)d - 1 : v;
    else if (pad == GS_REFLECTION) v = gs_reflect(v, lo, hi);
  }
  if (isnan(v)) v = lo;
  double v0 = floor(v), t = v - v0;
  int64_t i0 = (int64_t)fmax(fmin(v0, 1e15), -1e15);
  if (mode == GS_NEAREST) {
    a->ntaps = 1, a->w[0] = 1, a->idx[0] = gs_tap(i0, d, pad, lo, hi);
  } else if (mode == GS_LINEAR) {
    a->ntaps = 2, a->w[0] = 1 - t, a->w[1] = t;
    for (int j = 0; j < 2; j++) a->idx[j] = gs_tap(i0 + j, d, pad, lo, hi);
  } else {
    a->ntaps = 4;
    gs_cubic(t, a->w);
    for (int j = 0; j < 4; j++) a->idx[j] = gs_tap(i0 - 1 + j, d, pad, lo, hi);
  }
}

int kl_eval_GRID_SAMPLE(const kl_node *n, kl_tensor **in, kl_tensor **out,
                        kl_error *err) {
  (void)err;
  const kl_tensor *x = in[0], *g = in[1];
  kl_tensor *y = out[0];
  int mode = gs_pick(kl_attr_string(n, "mode", "linear"), gs_modes, 3);
  int pad = gs_pick(kl_attr_string(n, "padding_mode", "zeros"), gs_pads, 3);
  bool ac = kl_attr_int(n, "align_corners", 0) != 0;
  int k = x->shape.rank - 2;
  int64_t nb = x->shape.dims[0], ch = x->shape.dims[1], xin = 1, yout = 1;
  int64_t xs[KL_MAX_RANK];
  kl_shape_strides(&x->shape, xs);
  for (int i = 0; i < k; i++) xin *= x->shape.dims[2 + i], yout *= y->shape.dims[2 + i];
  for (int64_t b = 0; b < nb; b++)
    for (int64_t o = 0; o < yout; o++) {
      const double *gp = g->data + (b * yout + o) * k;
      gs_axis ax[KL_MAX_RANK];
      for (int i = 0; i < k; i++) /* grid[..., 0] is the last axis */
        gs_axis_taps(gp[k - 1 - i], x->shape.dims[2 + i], mode, pad, ac, &ax[i]);
      for (int64_t cc = 0; cc < ch; cc++) {
        const double *xp = x->data + (b * ch + cc) * xin;
        double acc = 0;
        int t[KL_MAX_RANK] = {0};
        for (;;) { /* every combination of one tap per axis */
          double w = 1;
          int64_t off = 0;
          for (int i = 0; i < k && w != 0; i++) {
            int64_t idx = ax[i].idx[t[i]];
            if (idx < 0) w = 0;
            else w *= ax[i].w[t[i]], off += idx * xs[2 + i];
          }
          if (w != 0) acc += w * xp[off];
          int i = k - 1;
          while (i >= 0 && ++t[i] == ax[i].ntaps) t[i--] = 0;
          if (i < 0) break;
        }
        y->data[(b * ch + cc) * yout + o] = acc;
      }
    }
  return 0;
}

/* ---- gradient rules (ir.h, kl_grad_fn) -------------------------------- */
/* resize is separable: on each axis d, y = A_d x with A_d [out, in] the
 * taps' weights (a tf_crop_and_resize point outside the crop takes the
 * extrapolation value: a zero row, no gradient).  dx is dy times A_d on
 * each axis that is not the identity: the axis moved last, a matmul with
 * A_d as a constant, moved back. */
static kl_value *apply_axis(kl_grad_ctx *c, kl_value *g, int d, const double *a, int64_t out,
                            int64_t in) {
  int rank = g->shape.rank;
  int64_t perm[KL_MAX_RANK], inv[KL_MAX_RANK], ms[2] = {out, in};
  for (int k = 0, j = 0; k < rank; k++)
    if (k != d) perm[j++] = k;
  perm[rank - 1] = d;
  for (int k = 0; k < rank; k++) inv[perm[k]] = k;
  kl_attr at[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = (double *)a, .n = (int)(out * in)},
                   {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = g->dtype},
                   {.name = "shape", .kind = KL_ATTR_INTS, .ints = ms, .n = 2}};
  kl_value *m = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, at, 3);
  kl_value *t = d == rank - 1 ? g : kl_gb_transpose(c, g, perm);
  t = kl_gb2(c, KL_OP_MATMUL, t, m);
  return d == rank - 1 ? t : kl_gb_transpose(c, t, inv);
}

int kl_grad_RESIZE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  const kl_value *x = n->inputs[0];
  resize_cfg r;
  if (resize_setup(n, c->err, &r)) return -1;
  int rank = x->shape.rank;
  kl_value *g = dy[0];
  taps tp;
  for (int d = rank - 1; d >= 0 && g; d--) {
    int64_t in = x->shape.dims[d], out = r.sizes[d];
    if ((double)in * (double)out > (double)INT32_MAX)
      return KL_GRAD_FAIL(c, n, "axis %d, %lld to %lld, is too large for its weight matrix", d,
                          (long long)in, (long long)out);
    double *a = calloc((size_t)(in * out), sizeof *a);
    if (!a) abort();
    bool identity = in == out;
    for (int64_t o = 0; o < out; o++) {
      make_taps(&r, d, rank, o, in, &tp);
      for (int k = 0; k < tp.ntap; k++) a[o * in + tp.idx[k]] += tp.w[k];
    }
    for (int64_t o = 0; o < out && identity; o++)
      for (int64_t i = 0; i < in && identity; i++) identity = a[o * in + i] == (o == i ? 1.0 : 0.0);
    if (!identity) g = apply_axis(c, g, d, a, out, in);
    free(a);
  }
  dx[0] = g;
  return 0;
}

/* ---- grid_sample's gradient ---------------------------------------------
 * The sampling of gs_axis_taps rebuilt from IR ops over the grid, so that
 * the taps' places and weights are values: per axis, the point v (moved
 * inside by border or reflection, with dv/dg through the move), its taps'
 * indices, their weights and the weights' slopes in v. */
typedef struct {
  kl_grad_ctx *c;
  kl_dtype t; /* the grid's dtype: coordinates are computed in it */
} gs_build;

static kl_value *gk(gs_build *b, double v) { return kl_gb_scalar(b->c, b->t, v); }
static kl_value *gadd(gs_build *b, kl_value *x, kl_value *y) { return kl_gb2(b->c, KL_OP_ADD, x, y); }
static kl_value *gsub(gs_build *b, kl_value *x, kl_value *y) { return kl_gb2(b->c, KL_OP_SUB, x, y); }
static kl_value *gmul(gs_build *b, kl_value *x, kl_value *y) { return kl_gb2(b->c, KL_OP_MUL, x, y); }
static kl_value *gsel(gs_build *b, kl_value *cond, kl_value *x, kl_value *y) {
  return kl_gb3(b->c, KL_OP_WHERE, cond, x, y);
}
static kl_value *gclamp(gs_build *b, kl_value *x, double lo, double hi) {
  return kl_gb2(b->c, KL_OP_MINIMUM, kl_gb2(b->c, KL_OP_MAXIMUM, x, gk(b, lo)), gk(b, hi));
}

/* gs_reflect of v (outside [lo, hi]) and its slope, +-1 (0 when the range
 * is empty). */
static kl_value *gs_reflect_v(gs_build *b, kl_value *v, double lo, double hi, kl_value **slope) {
  double range = hi - lo;
  if (range <= 0) {
    *slope = gk(b, 0);
    return kl_gb_expand(b->c, gk(b, lo), &v->shape);
  }
  kl_value *below = kl_gb2(b->c, KL_OP_LT, v, gk(b, lo));
  kl_value *dist = gsel(b, below, gsub(b, gk(b, lo), v), gsub(b, v, gk(b, hi)));
  kl_value *m = kl_gb1(b->c, KL_OP_FLOOR, kl_gb2(b->c, KL_OP_DIV, dist, gk(b, range)));
  kl_value *r = gsub(b, dist, gmul(b, m, gk(b, range)));
  kl_value *even = kl_gb2(b->c, KL_OP_EQ, kl_gb2(b->c, KL_OP_MOD, m, gk(b, 2)), gk(b, 0));
  kl_value *from_lo = kl_gb1(b->c, KL_OP_LOGICAL_NOT, kl_gb2(b->c, KL_OP_LOGICAL_XOR, below, even));
  /* d dist / dv is -1 below and 1 above; lo + r keeps it, hi - r flips it */
  kl_value *ddist = gsel(b, below, gk(b, -1), gk(b, 1));
  *slope = gsel(b, from_lo, ddist, kl_gb1(b->c, KL_OP_NEG, ddist));
  return gsel(b, from_lo, gadd(b, gk(b, lo), r), gsub(b, gk(b, hi), r));
}

/* One axis's taps: index (float, already inside x or invalid), whether
 * valid (zeros padding), weight, and the weight's slope in the grid value. */
typedef struct {
  int ntaps;
  kl_value *idx[4], *valid[4], *w[4], *dw[4];
} gs_taps_v;

/* Keys' cubic (a = -0.75, as gs_cubic) at distance x, near (x <= 1) or far
 * (1 < x < 2) branch, and its slope in x. */
static kl_value *gs_keys(gs_build *b, kl_value *x, bool far, kl_value **slope) {
  const double a = -0.75;
  kl_value *x2 = gmul(b, x, x);
  if (far) {
    *slope = gadd(b, gsub(b, gmul(b, x2, gk(b, 3 * a)), gmul(b, x, gk(b, 10 * a))), gk(b, 8 * a));
    kl_value *inner = gadd(b, gmul(b, gsub(b, gmul(b, x, gk(b, a)), gk(b, 5 * a)), x), gk(b, 8 * a));
    return gsub(b, gmul(b, inner, x), gk(b, 4 * a));
  }
  *slope = gsub(b, gmul(b, x2, gk(b, 3 * (a + 2))), gmul(b, x, gk(b, 2 * (a + 3))));
  return gadd(b, gmul(b, gsub(b, gmul(b, x, gk(b, a + 2)), gk(b, a + 3)), x2), gk(b, 1));
}

static void gs_axis_values(gs_build *b, kl_value *g, int64_t d, int mode, int pad, bool ac,
                           gs_taps_v *a) {
  double lo = ac ? 0 : -0.5, hi = ac ? (double)d - 1 : (double)d - 0.5;
  double dvdg = ac ? (double)(d - 1) / 2 : (double)d / 2;
  kl_value *v = ac ? gmul(b, gadd(b, g, gk(b, 1)), gk(b, dvdg))
                   : gmul(b, gsub(b, gmul(b, gadd(b, g, gk(b, 1)), gk(b, (double)d)), gk(b, 1)), gk(b, 0.5));
  kl_value *slope = gk(b, dvdg);
  if (mode == GS_NEAREST) v = kl_gb1(b->c, KL_OP_ROUND, v);
  if (pad != GS_ZEROS) {
    kl_value *outside = kl_gb2(b->c, KL_OP_LOGICAL_OR, kl_gb2(b->c, KL_OP_LT, v, gk(b, lo)),
                               kl_gb2(b->c, KL_OP_GT, v, gk(b, hi)));
    kl_value *moved, *mslope;
    if (pad == GS_BORDER) {
      moved = gclamp(b, v, 0, (double)d - 1);
      mslope = gk(b, 0);
    } else {
      moved = gs_reflect_v(b, v, lo, hi, &mslope);
    }
    v = gsel(b, outside, moved, v);
    slope = gsel(b, outside, gmul(b, mslope, slope), slope);
  }
  kl_value *v0 = kl_gb1(b->c, KL_OP_FLOOR, v), *t = gsub(b, v, v0);
  a->ntaps = mode == GS_NEAREST ? 1 : mode == GS_LINEAR ? 2 : 4;
  int first = mode == GS_CUBIC ? -1 : 0;
  for (int j = 0; j < a->ntaps; j++) {
    kl_value *i = j + first ? gadd(b, v0, gk(b, (double)(j + first))) : v0;
    a->valid[j] = NULL;
    if (pad == GS_ZEROS) {
      a->valid[j] = kl_gb2(b->c, KL_OP_LOGICAL_AND, kl_gb2(b->c, KL_OP_GE, i, gk(b, 0)),
                           kl_gb2(b->c, KL_OP_LT, i, gk(b, (double)d)));
    } else if (pad == GS_REFLECTION) {
      kl_value *ignored;
      kl_value *out = kl_gb2(b->c, KL_OP_LOGICAL_OR, kl_gb2(b->c, KL_OP_LT, i, gk(b, lo)),
                             kl_gb2(b->c, KL_OP_GT, i, gk(b, hi)));
      i = kl_gb1(b->c, KL_OP_FLOOR, gsel(b, out, gs_reflect_v(b, i, lo, hi, &ignored), i));
    }
    a->idx[j] = gclamp(b, i, 0, (double)d - 1);
    if (mode == GS_NEAREST) {
      a->w[j] = kl_gb_expand(b->c, gk(b, 1), &g->shape), a->dw[j] = gk(b, 0);
    } else if (mode == GS_CUBIC) {
      /* distances t + 1, t, 1 - t, 2 - t: the first two grow with v */
      kl_value *dist = j < 2 ? gadd(b, t, gk(b, 1 - j)) : gsub(b, gk(b, j - 1), t), *dk;
      a->w[j] = gs_keys(b, dist, j == 0 || j == 3, &dk);
      a->dw[j] = gmul(b, j < 2 ? dk : kl_gb1(b->c, KL_OP_NEG, dk), slope);
    } else {
      a->w[j] = j ? t : gsub(b, gk(b, 1), t);
      a->dw[j] = j ? slope : kl_gb1(b->c, KL_OP_NEG, slope);
    }
    if (a->valid[j]) {
      a->w[j] = kl_gb_mask(b->c, a->valid[j], a->w[j]);
      a->dw[j] = kl_gb_mask(b->c, a->valid[j], a->dw[j]);
    }
  }
}

/* Every combination of one tap per axis: its flat index into x's spatial
 * elements, its weight and, per axis, its weight's slope in that axis's
 * grid value.  dx: dy times each weight, scatter-added at the indices (all
 * combinations in one scatter); dgrid: per axis, the sum over combinations
 * of the slope times sum over channels of dy times x at the index. */
int kl_grad_GRID_SAMPLE(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  kl_value *x = n->inputs[0], *grid = n->inputs[1];
  int mode = gs_pick(kl_attr_string(n, "mode", "linear"), gs_modes, 3);
  int pad = gs_pick(kl_attr_string(n, "padding_mode", "zeros"), gs_pads, 3);
  bool ac = kl_attr_int(n, "align_corners", 0) != 0;
  int k = x->shape.rank - 2;
  if (k > 3) return KL_GRAD_FAIL(c, n, "%d spatial axes (at most 3)", k);
  int64_t nb = x->shape.dims[0], ch = x->shape.dims[1], sp = 1, o = 1;
  for (int i = 0; i < k; i++) sp *= x->shape.dims[2 + i], o *= grid->shape.dims[1 + i];
  gs_build b = {c, grid->dtype};
  kl_shape g3 = {3, {nb, o, k}}, no = {2, {nb, o}}, n1o = {3, {nb, 1, o}}, nco = {3, {nb, ch, o}},
           ncs = {3, {nb, ch, sp}};
  kl_value *gf = kl_gb_reshape(c, grid, &g3);
  gs_taps_v ax[3];
  for (int i = 0; i < k; i++) {
    int64_t comp = k - 1 - i, end = comp + 1, last = 2; /* grid[..., 0] is the last axis */
    kl_attr sl[3] = {{.name = "starts", .kind = KL_ATTR_INTS, .ints = &comp, .n = 1},
                     {.name = "ends", .kind = KL_ATTR_INTS, .ints = &end, .n = 1},
                     {.name = "axes", .kind = KL_ATTR_INTS, .ints = &last, .n = 1}};
    kl_value *gi = kl_gb_reshape(c, kl_gb_node(c, KL_OP_SLICE, &gf, 1, sl, 3), &no);
    gs_axis_values(&b, gi, x->shape.dims[2 + i], mode, pad, ac, &ax[i]);
  }
  kl_value *g = kl_gb_reshape(c, dy[0], &nco), *xf = kl_gb_reshape(c, x, &ncs);
  kl_value *where_[64], *upd[64], *dv[3] = {NULL, NULL, NULL};
  int ncomb = 1;
  for (int i = 0; i < k; i++) ncomb *= ax[i].ntaps;
  for (int cb = 0; cb < ncomb; cb++) {
    int tap[3];
    for (int i = k - 1, r = cb; i >= 0; i--) tap[i] = r % ax[i].ntaps, r /= ax[i].ntaps;
    kl_value *flat = NULL, *w = NULL;
    int64_t stride = 1;
    for (int i = k - 1; i >= 0; i--) {
      kl_value *term = gmul(&b, ax[i].idx[tap[i]], gk(&b, (double)stride));
      flat = flat ? gadd(&b, flat, term) : term;
      stride *= x->shape.dims[2 + i];
    }
    for (int i = 0; i < k; i++) w = w ? gmul(&b, w, ax[i].w[tap[i]]) : ax[i].w[tap[i]];
    kl_value *ix = kl_gb_expand(c, kl_gb_reshape(c, kl_gb_cast(c, flat, KL_I64), &n1o), &nco);
    where_[cb] = ix;
    upd[cb] = kl_gb2(c, KL_OP_MUL, g, kl_gb_reshape(c, kl_gb_cast(c, w, x->dtype), &n1o));
    /* sum over channels of dy x[index], in the grid's dtype */
    kl_value *ins[2] = {xf, ix};
    kl_attr a2 = {.name = "axis", .kind = KL_ATTR_INT, .i = 2};
    kl_value *xs = kl_gb_node(c, KL_OP_GATHER_ELEMENTS, ins, 2, &a2, 1);
    int64_t one = 1;
    kl_value *p = kl_gb_cast(c, kl_gb_reshape(c, kl_gb_sum(c, kl_gb2(c, KL_OP_MUL, g, xs), &one, 1), &no),
                             grid->dtype);
    for (int i = 0; i < k && mode != GS_NEAREST; i++) {
      kl_value *s = ax[i].dw[tap[i]];
      for (int j = 0; j < k; j++)
        if (j != i) s = gmul(&b, s, ax[j].w[tap[j]]);
      kl_value *term = gmul(&b, p, s);
      dv[i] = dv[i] ? gadd(&b, dv[i], term) : term;
    }
  }
  kl_attr a2 = {.name = "axis", .kind = KL_ATTR_INT, .i = 2};
  kl_value *all_ix = ncomb > 1 ? kl_gb_node(c, KL_OP_CONCAT, where_, ncomb, &a2, 1) : where_[0];
  kl_value *all_up = ncomb > 1 ? kl_gb_node(c, KL_OP_CONCAT, upd, ncomb, &a2, 1) : upd[0];
  kl_value *sins[3] = {kl_gb_expand(c, kl_gb_scalar(c, x->dtype, 0), &ncs), all_ix, all_up};
  kl_attr sa[2] = {a2, {.name = "reduction", .kind = KL_ATTR_STRING, .s = "add"}};
  dx[0] = kl_gb_reshape(c, kl_gb_node(c, KL_OP_SCATTER_ELEMENTS, sins, 3, sa, 2), &x->shape);
  if (mode == GS_NEAREST) return 0; /* piecewise constant in the grid */
  kl_shape no1 = {3, {nb, o, 1}};
  kl_value *parts[3];
  for (int j = 0; j < k; j++) parts[j] = kl_gb_reshape(c, dv[k - 1 - j], &no1);
  kl_value *dg = k > 1 ? kl_gb_node(c, KL_OP_CONCAT, parts, k, &a2, 1) : parts[0];
  dx[1] = kl_gb_reshape(c, dg, &grid->shape);
  return 0;
}

/* ---- roi_align's gradient ------------------------------------------------ */
/* One axis of the samples: coordinate u [R, S] (S = bins * ratio), as
 * roi_bin reads it: valid when in [-1, len]; u clamped at 0; the low
 * neighbour, the high one (both the last pixel at the edge), the high
 * weight and its slope in u (0 where clamped or at the edge). */
typedef struct {
  kl_value *valid, *lo, *hi, *wl, *wh, *dwh;
} roi_axis;

static void roi_axis_values(gs_build *b, kl_value *u, int64_t len, roi_axis *a) {
  kl_grad_ctx *c = b->c;
  a->valid = kl_gb2(c, KL_OP_LOGICAL_AND, kl_gb2(c, KL_OP_GE, u, gk(b, -1)),
                    kl_gb2(c, KL_OP_LE, u, gk(b, (double)len)));
  kl_value *v = kl_gb2(c, KL_OP_MAXIMUM, u, gk(b, 0));
  kl_value *fl = kl_gb1(c, KL_OP_FLOOR, v);
  kl_value *edge = kl_gb2(c, KL_OP_GE, fl, gk(b, (double)len - 1));
  kl_value *last = gk(b, (double)len - 1);
  a->lo = gsel(b, edge, last, fl);
  a->hi = gsel(b, edge, last, gadd(b, fl, gk(b, 1)));
  a->wh = kl_gb_mask(c, kl_gb1(c, KL_OP_LOGICAL_NOT, edge), gsub(b, v, fl));
  a->wl = gsub(b, gk(b, 1), a->wh);
  kl_value *moving = kl_gb2(c, KL_OP_LOGICAL_AND, kl_gb1(c, KL_OP_LOGICAL_NOT, edge),
                            kl_gb2(c, KL_OP_GT, u, gk(b, 0)));
  a->dwh = gsel(b, moving, gk(b, 1), gk(b, 0));
}

/* [S] constant: sample s of bin p at (p + (i + 0.5) / ratio) / bins of the
 * region's extent. */
static kl_value *roi_fractions(kl_grad_ctx *c, kl_dtype t, int64_t bins, int64_t ratio) {
  int64_t s = bins * ratio;
  double *v = malloc(sizeof(double) * (size_t)s);
  if (!v) abort();
  for (int64_t p = 0; p < bins; p++)
    for (int64_t i = 0; i < ratio; i++)
      v[p * ratio + i] = ((double)p + ((double)i + 0.5) / (double)ratio) / (double)bins;
  int64_t sh[2] = {1, s};
  kl_attr a[3] = {{.name = "value", .kind = KL_ATTR_FLOATS, .floats = v, .n = (int)s},
                  {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = t},
                  {.name = "shape", .kind = KL_ATTR_INTS, .ints = sh, .n = 2}};
  kl_value *r = kl_gb_node(c, KL_OP_CONSTANT, NULL, 0, a, 3);
  free(v);
  return r;
}

static kl_value *roi_col(kl_grad_ctx *c, kl_value *rois, int64_t k) {
  int64_t st = k, en = k + 1, ax = 1;
  kl_attr sl[3] = {{.name = "starts", .kind = KL_ATTR_INTS, .ints = &st, .n = 1},
                   {.name = "ends", .kind = KL_ATTR_INTS, .ints = &en, .n = 1},
                   {.name = "axes", .kind = KL_ATTR_INTS, .ints = &ax, .n = 1}};
  return kl_gb_node(c, KL_OP_SLICE, &rois, 1, sl, 3); /* [R, 1] */
}

/* mode "avg" with a fixed sampling_ratio: the samples' places are values
 * computed from the regions (a bilinear sample of x each, as roi_bin), so
 * x gets dy / samples times each corner's weight, scatter-added over
 * x as [N * H * W, C], and the regions get the weights' slopes through the
 * sample coordinates (their start and extent). */
int kl_grad_ROI_ALIGN(kl_grad_ctx *c, const kl_node *n, kl_value *const *dy, kl_value **dx) {
  roi_cfg rc;
  if (roi_setup(n, c->err, &rc)) return -1;
  if (rc.max) return KL_GRAD_FAIL(c, n, "mode \"max\"; \"avg\" has one");
  if (rc.ratio == 0)
    return KL_GRAD_FAIL(c, n, "sampling_ratio 0 (samples per bin from each region's size); a "
                        "fixed sampling_ratio has one");
  kl_value *x = n->inputs[0], *rois = n->inputs[1], *bi = n->inputs[2];
  kl_dtype t = x->dtype;
  gs_build b = {c, t};
  const int64_t *xd = x->shape.dims;
  int64_t nb = xd[0], ch = xd[1], h = xd[2], w = xd[3], nr = rois->shape.dims[0];
  int64_t g = rc.ratio, sy = rc.oh * g, sx = rc.ow * g;
  double off = rc.half_pixel ? 0.5 : 0.0, s = rc.scale;
  /* start and extent of each region per axis (y: columns 1, 3; x: 0, 2) */
  kl_value *start[2], *ext[2], *live[2], *frac[2] = {roi_fractions(c, t, rc.oh, g),
                                                    roi_fractions(c, t, rc.ow, g)};
  roi_axis ax[2];
  for (int a = 0; a < 2; a++) {
    kl_value *r0 = roi_col(c, rois, a ? 0 : 1), *r1 = roi_col(c, rois, a ? 2 : 3);
    start[a] = gsub(&b, gmul(&b, r0, gk(&b, s)), gk(&b, off));
    ext[a] = gmul(&b, gsub(&b, r1, r0), gk(&b, s));
    live[a] = gk(&b, 1);
    if (!rc.half_pixel) { /* extents below 1 become 1 */
      live[a] = kl_gb_cast(c, kl_gb2(c, KL_OP_GT, ext[a], gk(&b, 1)), t);
      ext[a] = kl_gb2(c, KL_OP_MAXIMUM, ext[a], gk(&b, 1));
    }
    roi_axis_values(&b, gadd(&b, start[a], gmul(&b, ext[a], frac[a])), a ? w : h, &ax[a]);
  }
  /* [R, Sy, 1] and [R, 1, Sx] views of the two axes */
  kl_shape ys = {3, {nr, sy, 1}}, xs = {3, {nr, 1, sx}}, rs = {3, {nr, 1, 1}};
  kl_shape u2 = {2, {nr * sy * sx, 1}}, uc = {2, {nr * sy * sx, ch}}, hw = {2, {nb * h * w, ch}};
  kl_value *valid = kl_gb_cast(c, kl_gb2(c, KL_OP_LOGICAL_AND, kl_gb_reshape(c, ax[0].valid, &ys),
                                         kl_gb_reshape(c, ax[1].valid, &xs)), t);
  valid = gmul(&b, valid, gk(&b, 1.0 / (double)(g * g)));
  kl_value *base = gmul(&b, kl_gb_reshape(c, kl_gb_cast(c, bi, t), &rs), gk(&b, (double)(h * w)));
  /* dy per sample, [R * Sy * Sx, C] */
  kl_shape d6 = {6, {nr, ch, rc.oh, 1, rc.ow, 1}}, e6 = {6, {nr, ch, rc.oh, g, rc.ow, g}},
           d4 = {4, {nr, ch, sy, sx}};
  int64_t p4[4] = {0, 2, 3, 1}, pin[4] = {0, 3, 1, 2};
  kl_value *gs = kl_gb_reshape(c, kl_gb_expand(c, kl_gb_reshape(c, dy[0], &d6), &e6), &d4);
  gs = kl_gb_reshape(c, kl_gb_transpose(c, gs, p4), &uc);
  kl_shape x4t = {4, {nb, h, w, ch}};
  kl_value *xt = kl_gb_reshape(c, kl_gb_transpose(c, x, p4), &hw);
  kl_value *places[4], *updates[4], *dyy = NULL, *dxx = NULL;
  int64_t one = 1;
  for (int corner = 0; corner < 4; corner++) {
    int i = corner / 2, j = corner % 2;
    kl_value *wy = kl_gb_reshape(c, i ? ax[0].wh : ax[0].wl, &ys);
    kl_value *wx = kl_gb_reshape(c, j ? ax[1].wh : ax[1].wl, &xs);
    kl_value *dwy = kl_gb_reshape(c, i ? ax[0].dwh : kl_gb1(c, KL_OP_NEG, ax[0].dwh), &ys);
    kl_value *dwx = kl_gb_reshape(c, j ? ax[1].dwh : kl_gb1(c, KL_OP_NEG, ax[1].dwh), &xs);
    kl_value *flat = gadd(&b, base, gadd(&b, gmul(&b, kl_gb_reshape(c, i ? ax[0].hi : ax[0].lo, &ys),
                                                  gk(&b, (double)w)),
                                         kl_gb_reshape(c, j ? ax[1].hi : ax[1].lo, &xs)));
    kl_value *ix = kl_gb_expand(c, kl_gb_reshape(c, kl_gb_cast(c, flat, KL_I64), &u2), &uc);
    kl_value *wv = kl_gb_reshape(c, gmul(&b, gmul(&b, wy, wx), valid), &u2);
    places[corner] = ix;
    updates[corner] = gmul(&b, gs, wv);
    kl_value *ins[2] = {xt, ix};
    kl_attr a0 = {.name = "axis", .kind = KL_ATTR_INT, .i = 0};
    kl_value *xv = kl_gb_node(c, KL_OP_GATHER_ELEMENTS, ins, 2, &a0, 1);
    kl_value *p = kl_gb_reshape(c, kl_gb_sum(c, gmul(&b, gs, xv), &one, 1), &(kl_shape){3, {nr, sy, sx}});
    kl_value *ty = gmul(&b, p, gmul(&b, gmul(&b, dwy, wx), valid));
    kl_value *tx = gmul(&b, p, gmul(&b, gmul(&b, wy, dwx), valid));
    dyy = dyy ? gadd(&b, dyy, ty) : ty;
    dxx = dxx ? gadd(&b, dxx, tx) : tx;
  }
  kl_attr cat0[2] = {{.name = "axis", .kind = KL_ATTR_INT, .i = 0},
                     {.name = "reduction", .kind = KL_ATTR_STRING, .s = "add"}};
  kl_value *sins[3] = {kl_gb_expand(c, kl_gb_scalar(c, t, 0), &hw),
                       kl_gb_node(c, KL_OP_CONCAT, places, 4, cat0, 1),
                       kl_gb_node(c, KL_OP_CONCAT, updates, 4, cat0, 1)};
  kl_value *gx = kl_gb_node(c, KL_OP_SCATTER_ELEMENTS, sins, 3, cat0, 2);
  dx[0] = kl_gb_transpose(c, kl_gb_reshape(c, gx, &x4t), pin);
  /* regions: d start = sum of the samples' slopes, d extent = the same
   * weighted by each sample's fraction; then to the columns */
  kl_value *dcol[4];
  kl_value *du[2] = {dyy, dxx};
  kl_shape r1 = {2, {nr, 1}};
  for (int a = 0; a < 2; a++) {
    kl_value *fr = kl_gb_reshape(c, frac[a], a ? &(kl_shape){3, {1, 1, sx}} : &(kl_shape){3, {1, sy, 1}});
    int64_t both[2] = {1, 2};
    kl_value *dstart = kl_gb_reshape(c, kl_gb_sum(c, du[a], both, 2), &r1);
    kl_value *dext = gmul(&b, kl_gb_reshape(c, kl_gb_sum(c, gmul(&b, du[a], fr), both, 2), &r1), live[a]);
    kl_value *d0 = gmul(&b, gsub(&b, dstart, dext), gk(&b, s)), *d1 = gmul(&b, dext, gk(&b, s));
    dcol[a ? 0 : 1] = d0;
    dcol[a ? 2 : 3] = d1;
  }
  kl_attr cat1 = {.name = "axis", .kind = KL_ATTR_INT, .i = 1};
  dx[1] = kl_gb_node(c, KL_OP_CONCAT, dcol, 4, &cat1, 1);
  return 0;
}
