/* rules.c - what a fusion group can hold: the classes of nodes the passes
 * put into elementwise kernels, row kernels and direct GEMMs.  Only the
 * target's numbers and its one question (kl_target.scalar) come from the
 * code generator. */
#include "passes.h"

/* The fewest innermost axes a reduction from s to o spans (the other dims
 * unchanged; axes of size 1 may count either way); 0 for none.  Without
 * kept dims, o is s's leading dims: the same rows, laid out alike. */
static int reduced_axes(const kl_node *n, const kl_shape *s, const kl_shape *o) {
  if (o->rank < s->rank) { /* the axes say which: equal sizes could mislead */
    int k = s->rank - o->rank;
    const int64_t *axes;
    int na = kl_attr_ints(n, "axes", &axes);
    if (na <= 0) return o->rank == 0 ? k : 0; /* no axes: all of them */
    if (na != k) return 0;
    bool inner[KL_MAX_RANK] = {0};
    for (int i = 0; i < na; i++) {
      int64_t a = axes[i] < 0 ? axes[i] + s->rank : axes[i];
      if (a < s->rank - k || a >= s->rank || inner[a]) return 0;
      inner[a] = true;
    }
    return k;
  }
  if (o->rank != s->rank) return 0;
  for (int k = 1; k <= s->rank; k++) {
    bool fits = true;
    for (int d = 0; d < s->rank && fits; d++)
      fits = o->dims[d] == (d < s->rank - k ? s->dims[d] : 1);
    if (fits) return k;
  }
  return 0;
}

int kl_row_axes(const kl_node *n) {
  const kl_shape *s = &n->inputs[0]->shape;
  if (n->op == KL_OP_LAYER_NORM || n->op == KL_OP_RMS_NORM) { /* axis .. the last */
    int64_t axis = kl_attr_int(n, "axis", -1);
    if (axis < 0) axis += s->rank;
    return axis >= 0 && axis < s->rank ? (int)(s->rank - axis) : 0;
  }
  if (n->op == KL_OP_SOFTMAX || n->op == KL_OP_LOG_SOFTMAX) {
    int64_t axis = kl_attr_int(n, "axis", -1);
    return axis == -1 || axis == s->rank - 1 ? 1 : 0;
  }
  return reduced_axes(n, s, &n->outputs[0]->shape);
}

int kl_row_kind(const kl_node *n) {
  const kl_value *in = n->inputs[0];
  const kl_shape *s = &in->shape;
  if (n->noutputs != 1 || s->rank < 1 || !kl_dtype_is_float(in->dtype)) return 0;
  int k = kl_row_axes(n);
  int64_t len = 1;
  for (int d = s->rank - k; d < s->rank; d++) len *= s->dims[d];
  if (k < 1 || len < 2) return 0;
  if (n->op == KL_OP_SOFTMAX || n->op == KL_OP_LOG_SOFTMAX) return 2;
  if (n->op == KL_OP_LAYER_NORM || n->op == KL_OP_RMS_NORM) return 3;
  /* kept dims: the result broadcasts back over its row */
  return n->op == KL_OP_REDUCE_SUM || n->op == KL_OP_REDUCE_MEAN || n->op == KL_OP_REDUCE_MAX ||
                 n->op == KL_OP_REDUCE_MIN || n->op == KL_OP_GLOBAL_AVG_POOL
             ? 1
             : 0;
}

bool kl_traps_zero_divisor(const kl_node *n) {
  kl_dtype t = n->inputs[0]->dtype;
  if (n->op == KL_OP_POW) return kl_dtype_is_int(t) && !kl_dtype_is_unsigned(t); /* 0 ** -1 */
  return (n->op == KL_OP_DIV || n->op == KL_OP_MOD) && !kl_dtype_is_float(t);
}

bool kl_is_channel_affine(const kl_node *n) {
  if (n->op != KL_OP_BATCH_NORM || n->ninputs != 5 || n->noutputs != 1) return false;
  const kl_value *x = n->inputs[0];
  if (!kl_dtype_is_float(x->dtype) || x->shape.rank < 2) return false;
  for (int i = 1; i < 5; i++) {
    const kl_value *p = n->inputs[i];
    if (!kl_dtype_is_float(p->dtype) || p->shape.rank != 1 || p->shape.dims[0] != x->shape.dims[1])
      return false;
  }
  return true;
}

/* A direct convolution of `outputs` dot products of length k within the
 * target's bounds: the multiply-adds (divided, not multiplied: no
 * overflow), the outputs per unit of k, and k, unless a warp sums each
 * output (split: few outputs, where the library's tiles have little to
 * reuse across and a warp's lanes share the length). */
static bool direct_size_ok(int64_t outputs, int64_t k, const kl_target *t, bool can_split) {
  if (k < 1 || outputs > t->direct_conv_max_macs / k || outputs / k < t->direct_conv_min_outputs_per_k)
    return false;
  return k <= t->direct_conv_max_k || (can_split && outputs / k < t->direct_conv_split_below);
}

/* Longer dot products go to im2col + the GEMM library, whose tiles reuse
 * each loaded value where the direct kernel relies on the caches (but a
 * split one takes any length). */
bool kl_is_direct_conv(const kl_node *n, const kl_target *t) {
  if (n->op != KL_OP_CONV2D || n->noutputs != 1) return false;
  const kl_value *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
  return kl_dtype_is_float(y->dtype) && x->dtype == y->dtype && w->dtype == y->dtype &&
         (n->ninputs < 3 || n->inputs[2]->dtype == y->dtype) && x->shape.rank == 4 &&
         w->shape.rank == 4 && kl_shape_numel(&y->shape) > 0 &&
         direct_size_ok(kl_shape_numel(&y->shape), w->shape.dims[1] * w->shape.dims[2] * w->shape.dims[3],
                        t, true);
}

bool kl_is_split_conv(const kl_node *n, const kl_target *t) {
  if (!kl_is_direct_conv(n, t)) return false;
  const kl_value *w = n->inputs[1];
  int64_t k = w->shape.dims[1] * w->shape.dims[2] * w->shape.dims[3];
  return kl_shape_numel(&n->outputs[0]->shape) / k < t->direct_conv_split_below;
}

/* The same for a transposed convolution: each output gathers the inputs
 * its window reaches (K = input channels per group x window), so its
 * batch norm and activation run in the same kernel. */
bool kl_is_direct_conv_transpose(const kl_node *n, const kl_target *t) {
  if (n->op != KL_OP_CONV_TRANSPOSE2D || n->noutputs != 1) return false;
  const kl_value *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
  int64_t groups = kl_attr_int(n, "groups", 1);
  if (!kl_dtype_is_float(y->dtype) || x->dtype != y->dtype || w->dtype != y->dtype ||
      (n->ninputs > 2 && n->inputs[2]->dtype != y->dtype) || x->shape.rank != 4 ||
      w->shape.rank != 4 || kl_shape_numel(&y->shape) <= 0 || groups < 1)
    return false;
  return direct_size_ok(kl_shape_numel(&y->shape), x->shape.dims[1] / groups * w->shape.dims[2] * w->shape.dims[3],
                        t, false);
}

/* A resize that only repeats: every output position reads the one input
 * position o / r of its axis (r = out / in, whole), with weight 1, by the
 * interpreter's own taps (nearest, asymmetric + floor or half-pixel +
 * round-prefer, at whole-number scales: an FPN's or a U-Net's upsample). */
bool kl_resize_ratios(const kl_node *n, int64_t *ratio) {
  if (n->op != KL_OP_RESIZE || n->noutputs != 1) return false;
  const kl_shape *in = &n->inputs[0]->shape, *out = &n->outputs[0]->shape;
  if (in->rank < 1 || in->rank != out->rank || kl_shape_numel(out) <= 0) return false;
  int64_t total = 0;
  for (int d = 0; d < in->rank; d++) {
    if (out->dims[d] % in->dims[d]) return false;
    ratio[d] = out->dims[d] / in->dims[d];
    total += out->dims[d];
  }
  if (total > (1 << 20)) return false; /* the check below stays cheap */
  kl_resize_taps tp;
  for (int d = 0; d < in->rank; d++)
    for (int64_t o = 0; o < out->dims[d]; o++)
      if (kl_resize_tap_at(n, d, o, &tp) || tp.ntap != 1 || tp.w[0] != 1.0 || tp.idx[0] != o / ratio[d])
        return false;
  return true;
}

bool kl_is_direct_matmul(const kl_node *n, const kl_target *t) {
  if (n->op != KL_OP_MATMUL || n->noutputs != 1) return false;
  const kl_value *a = n->inputs[0], *b = n->inputs[1], *y = n->outputs[0];
  /* f32 and f64 only: f16 and bf16 GEMMs belong on the tensor cores */
  return (y->dtype == KL_F32 || y->dtype == KL_F64) && a->dtype == y->dtype &&
         b->dtype == y->dtype && a->shape.rank >= 2 && b->shape.rank >= 2 &&
         kl_shape_numel(&y->shape) > 0 && a->shape.dims[a->shape.rank - 1] >= 1 &&
         a->shape.dims[a->shape.rank - 1] <= t->direct_matmul_max_k &&
         kl_shape_numel(&y->shape) <= t->direct_matmul_max_macs / a->shape.dims[a->shape.rank - 1];
}

bool kl_is_fusible(const kl_node *n, const kl_target *t) {
  return kl_ops[n->op].kind == KL_KIND_ELEMENTWISE && n->noutputs == 1 && t->scalar(n) &&
         !kl_traps_zero_divisor(n);
}

/* The tiled attention kernel's shared memory (codegen/emit_attention.c):
 * Q's tile (4 warps of R rows, rows padded by one) and 32 keys of K
 * (transposed, 33 a head element: against bank conflicts), in the first
 * product's type; 32 rows of V and each warp's probabilities (33 a row)
 * in the second's.  Heads up to 128 wide: wider ones keep the row kernel
 * or the library. */
int kl_attention_rows_per_warp(int64_t d, int64_t dv, int qk_bytes, int pv_bytes) {
  if (d < 1 || dv < 1 || d > 128 || dv > 128) return 0;
  for (int r = 8; r >= 1; r /= 2) {
    int64_t bq = 4 * r;
    int64_t bytes = (bq * (d + 1) + 33 * d) * qk_bytes + (32 * dv + bq * 33) * pv_bytes;
    if (bytes <= 48 * 1024) return r;
  }
  return 0;
}
