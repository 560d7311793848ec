/* templates_movement.c - kernel templates for the movement ops (see
 * codegen_impl.h for the template interface): concat, split, slice, gather,
 * pad, trilu, gather_elements, gather_nd, scatter_elements, scatter_nd,
 * cumsum, argmax/argmin and topk.
 *
 * As everywhere in codegen/, shapes are static: every size, stride, slice
 * start and pad is computed here and written into the kernel as a literal,
 * so kernels are plain index arithmetic.  Each template matches the
 * interpreter's kl_eval_<OP> (ir/ops_movement.c,
 * ir/ops_reduce.c) element for element.
 *
 * Indices read at run time (gather family, scatters): the device cannot
 * report an index out of range yet, so kernels never read or write outside
 * their tensors: a gather writes 0 for such an index and a scatter skips its
 * update.  Where the indices are a graph input, run() checks them on the
 * host before launching and fails as the interpreter does ("out of range");
 * indices computed on the device are not checked. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

/* ---- small writers ---------------------------------------------------- */

/* Arithmetic type of a dtype inside a kernel: float for the 16- and 32-bit
 * floats, double for f64, 64-bit integers otherwise (as node_kernels.c). */
static const char *ctype(kl_dtype t) { return kl_cg_compute_type(t); }

/* Expression reading `expr` (an element in storage type t) as ctype(t). */
static const char *ld(kl_dtype t, const char *expr, char *buf, size_t len) {
  return kl_cg_load(buf, len, t, ctype(t), expr);
}

static void st(FILE *f, kl_dtype t, const char *dst, const char *value) {
  kl_cg_store(f, t, dst, value);
}

/* A zero of storage type t (the 16-bit floats are structs). */
static const char *zero(kl_dtype t) {
  if (t == KL_F16) return "__float2half(0.0f)";
  if (t == KL_BF16) return "__float2bfloat16(0.0f)";
  return "0";
}

/* A double as a C literal that both compilers take (inf and NaN too). */
static const char *flit(double v, char *buf, size_t len) {
  if (isnan(v)) snprintf(buf, len, "(double)KL_NAN");
  else if (isinf(v)) snprintf(buf, len, "%s(double)KL_INF", v < 0 ? "-" : "");
  else snprintf(buf, len, "%.17g", v);
  return buf;
}

static void head(FILE *f, const kl_node *n, const char *what) {
  char shape[160];
  const kl_value *o = n->outputs[0];
  fprintf(f, "/* %s: %s%s%s -> %s%s */\n", n->name, kl_ops[n->op].name, what ? " " : "",
          what ? what : "", kl_dtype_name(o->dtype), kl_shape_str(&o->shape, shape, sizeof shape));
}

/* Kernel signature: const inputs in0.., outputs out0.. */
static void sig(FILE *f, const char *name, const kl_value *const *ins, int nins,
                const kl_value *const *outs, int nouts) {
  fprintf(f, "KL_KERNEL void %s(", name);
  for (int k = 0; k < nins; k++)
    fprintf(f, "%sconst %s *__restrict__ in%d", k ? ", " : "", kl_cg_storage(ins[k]->dtype), k);
  for (int k = 0; k < nouts; k++)
    fprintf(f, "%s%s *__restrict__ out%d", nins + k ? ", " : "", kl_cg_storage(outs[k]->dtype), k);
  fprintf(f, ") {\n");
}

static void entry(FILE *f, const char *name, const kl_value *const *ins, int nins,
                  const kl_value *const *outs, int nouts) {
  fprintf(f, "KL_EMU_ENTRY(%s", name);
  for (int k = 0; k < nins; k++)
    fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(ins[k]->dtype), k);
  for (int k = 0; k < nouts; k++)
    fprintf(f, ", KL_ARG(%s *, %d)", kl_cg_storage(outs[k]->dtype), nins + k);
  fprintf(f, ");\n\n");
}

static void loop(FILE *f, int64_t n) {
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n", (long long)n);
}

static void tail(FILE *f) { fprintf(f, "  }\n}\n"); }

/* Launch kernel k over `threads` threads with the given values' pointers as
 * its arguments (inputs then outputs). */
static void launch(kl_cg_emitter *e, int k, int64_t threads, const kl_value *const *ins, int nins,
                   const kl_value *const *outs, int nouts) {
  char bufs[16][160];
  const char *args[16];
  int na = 0;
  for (int i = 0; i < nins && na < 16; i++, na++)
    args[na] = kl_cg_ptr(e, ins[i], bufs[na], sizeof bufs[na]);
  for (int i = 0; i < nouts && na < 16; i++, na++)
    args[na] = kl_cg_ptr(e, outs[i], bufs[na], sizeof bufs[na]);
  kl_cg_launch(e, k, threads, args, na);
}

static void host_comment(kl_cg_emitter *e, const kl_node *n) {
  char shape[160];
  const kl_value *o = n->outputs[0];
  fprintf(kl_cg_host(e), "  /* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name,
          kl_dtype_name(o->dtype), kl_shape_str(&o->shape, shape, sizeof shape));
}

/* A fresh kernel: its index, with its name in `name`. */
static int new_kernel(kl_cg_emitter *e, char *name) { return kl_cg_new_kernel(e, name, 32); }

/* View s as [outer, s[axis], inner]. */
static void split_at(const kl_shape *s, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < axis; d++) *outer *= s->dims[d];
  for (int d = axis + 1; d < s->rank; d++) *inner *= s->dims[d];
  *len = s->dims[axis];
}

static int norm_axis(int64_t axis, int rank) {
  return (int)(axis < 0 ? axis + rank : axis);
}

/* Statement list: the index value `var` (already read) made non-negative,
 * and `bad` set when it lies outside [0, dim). */
static void take_index(FILE *f, const char *ind, const char *var, int64_t dim) {
  fprintf(f, "%sif (%s < 0) %s += %lldLL;\n", ind, var, var, (long long)dim);
  fprintf(f, "%sif (%s < 0 || %s >= %lldLL) bad = 1;\n", ind, var, var, (long long)dim);
}

/* Host check, in run() before the run starts, of indices that are a graph
 * input: every element (component `comp` of each tuple of `m` when m > 0,
 * else every element) must lie in [-dim, dim).  The device cannot report
 * it yet. */
static void host_check_indices(kl_cg_emitter *e, const kl_node *n, const kl_value *ix,
                               const int64_t *dims, int m) {
  const kl_graph *g = n->graph;
  int at = -1;
  if (ix->kind != KL_VAL_INPUT || !g) return;
  for (int i = 0; i < g->inputs.len; i++)
    if (g->inputs.items[i] == ix) at = i;
  int64_t count = kl_shape_numel(&ix->shape);
  if (at < 0 || count == 0) return;
  FILE *f = kl_cg_input_checks(e);
  const char *t = ix->dtype == KL_I32 ? "int32_t" : "int64_t";
  char msg[400];
  snprintf(msg, sizeof msg, "%s (node '%s'): an element of indices '%s' is out of range",
           kl_ops[n->op].name, n->name, ix->name);
  /* the message goes into a C string literal: keep it plain */
  for (char *c = msg; *c; c++)
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 32 || (unsigned char)*c > 126) *c = '?';
  fprintf(f, "  { /* indices from input '%s', checked here: the device does not report an\n"
             "     * index out of range yet (there it reads 0 or skips the update) */\n"
             "    static const int64_t dims[] = {", ix->name);
  for (int c = 0; c < (m > 0 ? m : 1); c++) fprintf(f, "%s%lldLL", c ? ", " : "", (long long)dims[c]);
  fprintf(f, "};\n    const %s *ix = (const %s *)in[%d];\n", t, t, at);
  fprintf(f, "    for (int64_t j = 0; j < %lldLL; j++) {\n", (long long)count);
  if (m > 0) fprintf(f, "      const int64_t d = dims[j %% %d], v = (int64_t)ix[j];\n", m);
  else fprintf(f, "      const int64_t d = dims[0], v = (int64_t)ix[j];\n");
  fprintf(f, "      if (v < -d || v >= d) {\n"
             "        const char *s = \"%s\";\n"
             "        size_t c = 0;\n"
             "        for (; s[c] && c + 1 < errlen; c++) err[c] = s[c];\n"
             "        if (errlen) err[c] = 0;\n"
             "        return -1;\n      }\n    }\n  }\n", msg);
}

/* ---- concat and split: one kernel per piece ---------------------------- */

/* Copy between a piece [outer, len, inner] and the whole [outer, total,
 * inner] at position `at` of the axis, one thread per piece element:
 * to_whole copies piece -> whole (concat), else whole -> piece (split). */
static void slab_kernel(FILE *f, const char *name, const kl_node *n, const kl_value *piece,
                        const kl_value *whole, bool to_whole, int64_t at, int64_t len,
                        int64_t total, int64_t inner) {
  char what[96];
  snprintf(what, sizeof what, "(%s axis positions %lld..%lld)", to_whole ? "into" : "from",
           (long long)at, (long long)(at + len));
  head(f, n, what);
  const kl_value *in = to_whole ? piece : whole, *out = to_whole ? whole : piece;
  sig(f, name, &in, 1, &out, 1);
  int64_t run = len * inner, numel = kl_shape_numel(&piece->shape);
  loop(f, numel);
  fprintf(f, "    const int64_t o = i / %lldLL, r = i %% %lldLL;\n", (long long)run, (long long)run);
  fprintf(f, "    const int64_t w = o * %lldLL + %lldLL + r;\n", (long long)(total * inner),
          (long long)(at * inner));
  fprintf(f, to_whole ? "    out0[w] = in0[i];\n" : "    out0[i] = in0[w];\n");
  tail(f);
  entry(f, name, &in, 1, &out, 1);
}

static bool handles_concat(const kl_node *n) { return n->op == KL_OP_CONCAT; }

/* Concat and split move slabs between one whole tensor and its parts
 * along `axis`: one kernel per non-empty part, to the whole (concat) or
 * from it (split). */
static int emit_slabs(kl_cg_emitter *e, const kl_node *n, const kl_value *whole,
                      const kl_value *const *parts, int nparts, bool to_whole) {
  int axis = norm_axis(kl_attr_int(n, "axis", 0), whole->shape.rank);
  int64_t outer, total, inner, at = 0;
  split_at(&whole->shape, axis, &outer, &total, &inner);
  host_comment(e, n);
  for (int k = 0; k < nparts; k++) {
    const kl_value *part = parts[k];
    int64_t len = part->shape.dims[axis];
    if (kl_shape_numel(&part->shape) > 0) {
      char name[32];
      int kk = new_kernel(e, name);
      slab_kernel(kl_cg_kernels(e), name, n, part, whole, to_whole, at, len, total, inner);
      if (to_whole) launch(e, kk, kl_shape_numel(&part->shape), &part, 1, &whole, 1);
      else launch(e, kk, kl_shape_numel(&part->shape), &whole, 1, &part, 1);
    }
    at += len;
  }
  return 0;
}

static int emit_concat(kl_cg_emitter *e, const kl_node *n) {
  return emit_slabs(e, n, n->outputs[0], (const kl_value *const *)n->inputs, n->ninputs, true);
}

static bool handles_split(const kl_node *n) { return n->op == KL_OP_SPLIT; }

static int emit_split(kl_cg_emitter *e, const kl_node *n) {
  return emit_slabs(e, n, n->inputs[0], (const kl_value *const *)n->outputs, n->noutputs, false);
}

/* ---- renumbering copies: slice, pad, trilu ----------------------------- */

/* Per input axis: first element and step of the slice, as slice_setup in
 * ir/ops_movement.c (the node is verified, so no checks here). */
static void slice_plan(const kl_node *n, const kl_shape *x, int64_t *start, int64_t *step) {
  const int64_t *st, *en, *ax = NULL, *sp = NULL;
  int ns = kl_attr_ints(n, "starts", &st);
  kl_attr_ints(n, "ends", &en);
  if (kl_attr_ints(n, "axes", &ax) < 0) ax = NULL;
  if (kl_attr_ints(n, "steps", &sp) < 0) sp = NULL;
  for (int i = 0; i < x->rank; i++) start[i] = 0, step[i] = 1;
  for (int i = 0; i < ns; i++) {
    int a = ax ? norm_axis(ax[i], x->rank) : i;
    int64_t d = x->dims[a], s = st[i], k = sp ? sp[i] : 1;
    if (s < 0) s += d;
    int64_t hi_s = k > 0 ? d : d - 1;
    s = s < 0 ? 0 : s > hi_s ? hi_s : s;
    start[a] = s;
    step[a] = k;
  }
}

static bool handles_slice(const kl_node *n) { return n->op == KL_OP_SLICE; }

static int emit_slice(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  int64_t start[KL_MAX_RANK], step[KL_MAX_RANK], xst[KL_MAX_RANK], base = 0;
  int64_t numel = kl_shape_numel(&out->shape);
  slice_plan(n, &in->shape, start, step);
  kl_shape_strides(&in->shape, xst);
  host_comment(e, n);
  if (numel == 0) return 0;
  for (int d = 0; d < in->shape.rank; d++) base += start[d] * xst[d];
  char name[32];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  head(f, n, NULL);
  sig(f, name, &in, 1, &out, 1);
  loop(f, numel);
  /* r only when some axis takes it apart: NVRTC warns of a variable set
   * and never read, and (void)r does not count as reading it */
  bool uses_r = false;
  for (int d = 0; d < out->shape.rank; d++) uses_r |= out->shape.dims[d] != 1;
  fprintf(f, "    int64_t %so = %lldLL;\n", uses_r ? "r = i, " : "", (long long)base);
  for (int d = out->shape.rank - 1; d >= 0; d--) {
    int64_t dim = out->shape.dims[d];
    if (dim == 1) continue; /* a huge step only ever selects one element */
    fprintf(f, "    { const int64_t q = r %% %lldLL; r /= %lldLL; o += q * %lldLL; }\n",
            (long long)dim, (long long)dim, (long long)(step[d] * xst[d]));
  }
  fprintf(f, "    out0[i] = in0[o];\n");
  tail(f);
  entry(f, name, &in, 1, &out, 1);
  launch(e, k, numel, &in, 1, &out, 1);
  return 0;
}

static bool handles_pad(const kl_node *n) { return n->op == KL_OP_PAD; }

/* As pad_setup/kl_eval_PAD: negative pads crop first; reflect, edge and
 * wrap then work on the cropped extent. */
static int emit_pad(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  int rank = in->shape.rank;
  const int64_t *pads;
  kl_attr_ints(n, "pads", &pads);
  const char *mode = kl_attr_string(n, "mode", "constant");
  int64_t xst[KL_MAX_RANK], numel = kl_shape_numel(&out->shape);
  kl_shape_strides(&in->shape, xst);
  host_comment(e, n);
  if (numel == 0) return 0;
  char name[32], lit[64], what[64];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  snprintf(what, sizeof what, "(%s)", mode);
  head(f, n, what);
  sig(f, name, &in, 1, &out, 1);
  loop(f, numel);
  fprintf(f, "    int64_t r = i, o = 0;\n");
  if (!strcmp(mode, "constant")) fprintf(f, "    int fill = 0;\n");
  for (int a = rank - 1; a >= 0; a--) {
    int64_t d = in->shape.dims[a], b = pads[a], en = pads[rank + a];
    int64_t crop = b < 0 ? -b : 0, keep = d - crop - (en < 0 ? -en : 0), before = b > 0 ? b : 0;
    int64_t od = out->shape.dims[a];
    fprintf(f, "    { int64_t c = r %% %lldLL - %lldLL; r /= %lldLL;\n", (long long)od,
            (long long)before, (long long)od);
    if (!strcmp(mode, "edge"))
      fprintf(f, "      c = c < 0 ? 0 : c >= %lldLL ? %lldLL : c;\n", (long long)keep,
              (long long)(keep - 1));
    else if (!strcmp(mode, "wrap"))
      fprintf(f, "      c = (c %% %lldLL + %lldLL) %% %lldLL;\n", (long long)keep, (long long)keep,
              (long long)keep);
    else if (!strcmp(mode, "reflect"))
      fprintf(f, "      c = c < 0 ? -c : c >= %lldLL ? %lldLL - c : c; /* one bounce */\n",
              (long long)keep, (long long)(2 * (keep - 1)));
    else
      fprintf(f, "      if (c < 0 || c >= %lldLL) fill = 1;\n", (long long)keep);
    fprintf(f, "      o += (%lldLL + c) * %lldLL; }\n", (long long)crop, (long long)xst[a]);
  }
  if (!strcmp(mode, "constant")) {
    fprintf(f, "    if (fill) ");
    st(f, out->dtype, "out0[i]", flit(kl_attr_float(n, "value", 0.0), lit, sizeof lit));
    fprintf(f, "    else out0[i] = in0[o];\n");
  } else {
    fprintf(f, "    out0[i] = in0[o];\n");
  }
  tail(f);
  entry(f, name, &in, 1, &out, 1);
  launch(e, k, numel, &in, 1, &out, 1);
  return 0;
}

static bool handles_trilu(const kl_node *n) { return n->op == KL_OP_TRILU; }

static int emit_trilu(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  const kl_shape *s = &in->shape;
  int64_t rows = s->dims[s->rank - 2], cols = s->dims[s->rank - 1];
  int64_t numel = kl_shape_numel(&out->shape), kk = kl_attr_int(n, "k", 0);
  bool upper = kl_attr_int(n, "upper", 1) != 0;
  /* beyond +-(rows + cols) every k means the same: keeps literals small */
  int64_t lim = rows + cols + 1;
  kk = kk > lim ? lim : kk < -lim ? -lim : kk;
  host_comment(e, n);
  if (numel == 0) return 0;
  char name[32], what[64];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  snprintf(what, sizeof what, "(%s, k = %lld)", upper ? "upper" : "lower", (long long)kk);
  head(f, n, what);
  sig(f, name, &in, 1, &out, 1);
  loop(f, numel);
  fprintf(f, "    const int64_t row = i / %lldLL %% %lldLL, col = i %% %lldLL;\n", (long long)cols,
          (long long)rows, (long long)cols);
  fprintf(f, "    if (col - row %s %lldLL) out0[i] = in0[i];\n    else out0[i] = %s;\n",
          upper ? ">=" : "<=", (long long)kk, zero(out->dtype));
  tail(f);
  entry(f, name, &in, 1, &out, 1);
  launch(e, k, numel, &in, 1, &out, 1);
  return 0;
}

/* ---- bitcast ---------------------------------------------------------- */

static bool handles_bitcast(const kl_node *n) { return n->op == KL_OP_BITCAST; }

/* Both buffers read as unsigned integers of the width (a byte for the
 * narrow types): a copy, but for bool (0/1 from any byte) and the 4- and
 * 2-bit types (their low bits, the signed ones sign-extended), as
 * kl_eval_BITCAST does. */
static int emit_bitcast(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  int64_t numel = kl_shape_numel(&out->shape);
  static const char *const uint_of[9] = {[1] = "uint8_t", [2] = "uint16_t", [4] = "uint32_t",
                                         [8] = "uint64_t"};
  const char *u = uint_of[kl_dtype_size(out->dtype)];
  int bits = kl_dtype_bits(out->dtype);
  unsigned mask = bits < 8 ? (1u << bits) - 1 : 0xffu, sb = bits < 8 ? 1u << (bits - 1) : 0;
  host_comment(e, n);
  if (numel == 0) return 0;
  char name[32];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  head(f, n, NULL);
  fprintf(f, "KL_KERNEL void %s(const %s *__restrict__ in0, %s *__restrict__ out0) {\n", name, u, u);
  loop(f, numel);
  if (out->dtype == KL_BOOL) fprintf(f, "    out0[i] = (uint8_t)(in0[i] != 0);\n");
  else if (bits < 8 && (out->dtype == KL_I4 || out->dtype == KL_I2))
    fprintf(f, "    out0[i] = (uint8_t)(((int)(in0[i] & %uu) ^ %d) - %d);\n", mask, (int)sb, (int)sb);
  else if (bits < 8) fprintf(f, "    out0[i] = (uint8_t)(in0[i] & %uu);\n", mask);
  else fprintf(f, "    out0[i] = in0[i];\n");
  tail(f);
  fprintf(f, "KL_EMU_ENTRY(%s, KL_ARG(const %s *, 0), KL_ARG(%s *, 1));\n\n", name, u, u);
  launch(e, k, numel, &in, 1, &out, 1);
  return 0;
}

/* ---- gathers ----------------------------------------------------------- */

static bool handles_gather(const kl_node *n) { return n->op == KL_OP_GATHER; }

static int emit_gather(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1], *out = n->outputs[0];
  int axis = norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank);
  int64_t outer, dim, inner, nidx = kl_shape_numel(&ix->shape);
  int64_t numel = kl_shape_numel(&out->shape);
  split_at(&x->shape, axis, &outer, &dim, &inner);
  host_comment(e, n);
  host_check_indices(e, n, ix, &dim, 0);
  if (numel == 0) return 0;
  char name[32];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  head(f, n, "(an index out of range reads 0: not reported by the device yet)");
  sig(f, name, (const kl_value *const *)n->inputs, 2, &out, 1);
  loop(f, numel);
  fprintf(f, "    const int64_t r = i %% %lldLL, t = i / %lldLL, j = t %% %lldLL, o = t / %lldLL;\n",
          (long long)inner, (long long)inner, (long long)nidx, (long long)nidx);
  fprintf(f, "    int64_t q = (int64_t)in1[j];\n    int bad = 0;\n");
  take_index(f, "    ", "q", dim);
  fprintf(f, "    if (bad) out0[i] = %s;\n", zero(out->dtype));
  fprintf(f, "    else out0[i] = in0[(o * %lldLL + q) * %lldLL + r];\n", (long long)dim,
          (long long)inner);
  tail(f);
  entry(f, name, (const kl_value *const *)n->inputs, 2, &out, 1);
  launch(e, k, numel, (const kl_value *const *)n->inputs, 2, &out, 1);
  return 0;
}

static bool handles_gather_elements(const kl_node *n) { return n->op == KL_OP_GATHER_ELEMENTS; }

static int emit_gather_elements(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1], *out = n->outputs[0];
  int r = x->shape.rank, axis = norm_axis(kl_attr_int(n, "axis", 0), r);
  int64_t xst[KL_MAX_RANK], numel = kl_shape_numel(&out->shape), dim = x->shape.dims[axis];
  kl_shape_strides(&x->shape, xst);
  host_comment(e, n);
  host_check_indices(e, n, ix, &dim, 0);
  if (numel == 0) return 0;
  char name[32];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  head(f, n, "(an index out of range reads 0: not reported by the device yet)");
  sig(f, name, (const kl_value *const *)n->inputs, 2, &out, 1);
  loop(f, numel);
  bool uses_r = false; /* as in emit_slice */
  for (int d = 0; d < r; d++) uses_r |= ix->shape.dims[d] != 1;
  fprintf(f, "    int64_t %so = 0, q = (int64_t)in1[i];\n    int bad = 0;\n", uses_r ? "r = i, " : "");
  for (int d = r - 1; d >= 0; d--) {
    int64_t id = ix->shape.dims[d];
    if (id == 1) continue;
    if (d == axis) fprintf(f, "    r /= %lldLL;\n", (long long)id);
    else fprintf(f, "    { const int64_t c = r %% %lldLL; r /= %lldLL; o += c * %lldLL; }\n",
                 (long long)id, (long long)id, (long long)xst[d]);
  }
  take_index(f, "    ", "q", dim);
  fprintf(f, "    if (bad) out0[i] = %s;\n", zero(out->dtype));
  fprintf(f, "    else out0[i] = in0[o + q * %lldLL];\n", (long long)xst[axis]);
  tail(f);
  entry(f, name, (const kl_value *const *)n->inputs, 2, &out, 1);
  launch(e, k, numel, (const kl_value *const *)n->inputs, 2, &out, 1);
  return 0;
}

/* gather_nd / scatter_nd geometry (nd_setup in ir/ops_movement.c):
 * indices [b.., n.., m] address x [b.., m axes, slice..]. */
typedef struct {
  int b, m;
  int64_t batch, count, slice;
} nd_view;

static void nd_plan(const kl_value *x, const kl_value *ix, int b, nd_view *v) {
  int r = x->shape.rank, q = ix->shape.rank;
  v->b = b;
  v->m = (int)ix->shape.dims[q - 1];
  v->batch = v->count = v->slice = 1;
  for (int d = 0; d < b; d++) v->batch *= x->shape.dims[d];
  for (int d = b; d < q - 1; d++) v->count *= ix->shape.dims[d];
  for (int d = b + v->m; d < r; d++) v->slice *= x->shape.dims[d];
}

/* Statements adding to `o` the offset of the tuple of indices starting at
 * element `at` (an expression), setting `bad` on an index out of range. */
static void nd_tuple(FILE *f, const char *ind, const kl_value *x, const nd_view *v,
                     const int64_t *xst, const char *at) {
  for (int c = 0; c < v->m; c++) {
    fprintf(f, "%s{ int64_t q = (int64_t)in1[%s + %d];\n", ind, at, c);
    char ind2[32];
    snprintf(ind2, sizeof ind2, "%s  ", ind);
    take_index(f, ind2, "q", x->shape.dims[v->b + c]);
    fprintf(f, "%s  o += q * %lldLL; }\n", ind, (long long)xst[v->b + c]);
  }
}

static bool handles_gather_nd(const kl_node *n) { return n->op == KL_OP_GATHER_ND; }

static int emit_gather_nd(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1], *out = n->outputs[0];
  nd_view v;
  int64_t xst[KL_MAX_RANK], numel = kl_shape_numel(&out->shape);
  nd_plan(x, ix, (int)kl_attr_int(n, "batch_dims", 0), &v);
  kl_shape_strides(&x->shape, xst);
  host_comment(e, n);
  host_check_indices(e, n, ix, x->shape.dims + v.b, v.m);
  if (numel == 0) return 0;
  char name[32];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  head(f, n, "(an index out of range reads 0: not reported by the device yet)");
  sig(f, name, (const kl_value *const *)n->inputs, 2, &out, 1);
  loop(f, numel);
  char at[96];
  if (v.b) {
    fprintf(f, "    const int64_t s = i %% %lldLL, u = i / %lldLL, t = u %% %lldLL, bi = u / %lldLL;\n",
            (long long)v.slice, (long long)v.slice, (long long)v.count, (long long)v.count);
    fprintf(f, "    int64_t o = bi * %lldLL;\n", (long long)xst[v.b - 1]);
    snprintf(at, sizeof at, "(bi * %lldLL + t) * %dLL", (long long)v.count, v.m);
  } else {
    fprintf(f, "    const int64_t s = i %% %lldLL, t = i / %lldLL;\n    int64_t o = 0;\n",
            (long long)v.slice, (long long)v.slice);
    snprintf(at, sizeof at, "t * %dLL", v.m);
  }
  fprintf(f, "    int bad = 0;\n");
  nd_tuple(f, "    ", x, &v, xst, at);
  fprintf(f, "    if (bad) out0[i] = %s;\n", zero(out->dtype));
  fprintf(f, "    else out0[i] = in0[o + s];\n");
  tail(f);
  entry(f, name, (const kl_value *const *)n->inputs, 2, &out, 1);
  launch(e, k, numel, (const kl_value *const *)n->inputs, 2, &out, 1);
  return 0;
}

/* ---- scatters: copy x, then apply the updates in order ----------------- */

/* Expression combining the old value `a` with the update `b` in compute
 * type ct, as scatter_combine (max/min propagate NaN). */
static const char *combine(const char *red, const char *ct, char *buf, size_t len) {
  bool flt = !strcmp(ct, "float") || !strcmp(ct, "double");
  if (!strcmp(red, "add")) return "a + b";
  if (!strcmp(red, "mul")) return "a * b";
  if (!strcmp(red, "max") || !strcmp(red, "min")) {
    const char *cmp = red[1] == 'a' ? ">" : "<";
    if (flt) snprintf(buf, len, "(a != a || b != b) ? (%s)KL_NAN : (b %s a ? b : a)", ct, cmp);
    else snprintf(buf, len, "b %s a ? b : a", cmp);
    return buf;
  }
  return "b";
}

/* out0 = in0, elementwise (the first step of a scatter). */
static void copy_kernel(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *out = n->outputs[0];
  int64_t numel = kl_shape_numel(&out->shape);
  if (numel == 0) return;
  char name[32];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  head(f, n, "(copy of x)");
  sig(f, name, &x, 1, &out, 1);
  loop(f, numel);
  fprintf(f, "    out0[i] = in0[i];\n");
  tail(f);
  entry(f, name, &x, 1, &out, 1);
  launch(e, k, numel, &x, 1, &out, 1);
}

/* Statements: out0[p] combined with update in2[uexpr]. */
static void apply_update(FILE *f, const char *ind, const kl_value *out, const char *red,
                         const char *p, const char *uexpr) {
  const char *ct = ctype(out->dtype);
  char la[128], lb[128], src[64], cb[160], dst[64];
  snprintf(src, sizeof src, "out0[%s]", p);
  fprintf(f, "%s{ const %s a = %s, b = ", ind, ct, ld(out->dtype, src, la, sizeof la));
  snprintf(src, sizeof src, "in2[%s]", uexpr);
  fprintf(f, "%s; (void)a;\n%s  ", ld(out->dtype, src, lb, sizeof lb), ind);
  snprintf(dst, sizeof dst, "out0[%s]", p);
  st(f, out->dtype, dst, combine(red, ct, cb, sizeof cb));
  fprintf(f, "%s}\n", ind);
}

static bool handles_scatter_elements(const kl_node *n) { return n->op == KL_OP_SCATTER_ELEMENTS; }

/* One thread per line of indices along the axis: the lines of x it writes
 * are its own, and it applies its updates in the interpreter's order. */
static int emit_scatter_elements(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1], *out = n->outputs[0];
  int r = x->shape.rank, axis = norm_axis(kl_attr_int(n, "axis", 0), r);
  const char *red = kl_attr_string(n, "reduction", "none");
  int64_t xst[KL_MAX_RANK], ist[KL_MAX_RANK], dim = x->shape.dims[axis];
  int64_t len = ix->shape.dims[axis], nidx = kl_shape_numel(&ix->shape);
  kl_shape_strides(&x->shape, xst);
  kl_shape_strides(&ix->shape, ist);
  host_comment(e, n);
  host_check_indices(e, n, ix, &dim, 0);
  copy_kernel(e, n);
  if (nidx == 0) return 0;
  int64_t lines = nidx / len;
  char name[32], what[96];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  snprintf(what, sizeof what, "(reduction %s; an index out of range is skipped: not reported yet)", red);
  head(f, n, what);
  sig(f, name, (const kl_value *const *)n->inputs, 3, &out, 1);
  loop(f, lines);
  bool uses_r = false; /* as in emit_slice */
  for (int d = 0; d < r; d++) uses_r |= d != axis && ix->shape.dims[d] != 1;
  fprintf(f, "    int64_t %sxo = 0, io = 0;\n", uses_r ? "r = i, " : "");
  for (int d = r - 1; d >= 0; d--) {
    int64_t id = ix->shape.dims[d];
    if (d == axis || id == 1) continue;
    fprintf(f, "    { const int64_t c = r %% %lldLL; r /= %lldLL; xo += c * %lldLL; io += c * %lldLL; }\n",
            (long long)id, (long long)id, (long long)xst[d], (long long)ist[d]);
  }
  fprintf(f, "    for (int64_t j = 0; j < %lldLL; j++) {\n", (long long)len);
  fprintf(f, "      const int64_t at = io + j * %lldLL;\n", (long long)ist[axis]);
  fprintf(f, "      int64_t q = (int64_t)in1[at];\n      int bad = 0;\n");
  take_index(f, "      ", "q", dim);
  fprintf(f, "      if (bad) continue;\n      const int64_t p = xo + q * %lldLL;\n",
          (long long)xst[axis]);
  apply_update(f, "      ", out, red, "p", "at");
  fprintf(f, "    }\n");
  tail(f);
  entry(f, name, (const kl_value *const *)n->inputs, 3, &out, 1);
  launch(e, k, lines, (const kl_value *const *)n->inputs, 3, &out, 1);
  return 0;
}

static bool handles_scatter_nd(const kl_node *n) { return n->op == KL_OP_SCATTER_ND; }

/* One thread per element of a slice: tuples that address the same slice
 * are applied in order by the same threads. */
static int emit_scatter_nd(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *ix = n->inputs[1], *out = n->outputs[0];
  const char *red = kl_attr_string(n, "reduction", "none");
  nd_view v;
  int64_t xst[KL_MAX_RANK];
  nd_plan(x, ix, 0, &v);
  kl_shape_strides(&x->shape, xst);
  host_comment(e, n);
  host_check_indices(e, n, ix, x->shape.dims, v.m);
  copy_kernel(e, n);
  if (v.count == 0 || v.slice == 0 || kl_shape_numel(&x->shape) == 0) return 0;
  char name[32], what[96];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  snprintf(what, sizeof what, "(reduction %s; an index out of range is skipped: not reported yet)", red);
  head(f, n, what);
  sig(f, name, (const kl_value *const *)n->inputs, 3, &out, 1);
  loop(f, v.slice);
  fprintf(f, "    for (int64_t t = 0; t < %lldLL; t++) {\n      int64_t o = 0;\n      int bad = 0;\n",
          (long long)v.count);
  char at[64];
  snprintf(at, sizeof at, "t * %dLL", v.m);
  nd_tuple(f, "      ", x, &v, xst, at);
  fprintf(f, "      if (bad) continue;\n      const int64_t p = o + i, u = t * %lldLL + i;\n",
          (long long)v.slice);
  apply_update(f, "      ", out, red, "p", "u");
  fprintf(f, "    }\n");
  tail(f);
  entry(f, name, (const kl_value *const *)n->inputs, 3, &out, 1);
  launch(e, k, v.slice, (const kl_value *const *)n->inputs, 3, &out, 1);
  return 0;
}

/* ---- scans and selections along one axis: one thread per line --------- */

static bool handles_cumsum(const kl_node *n) {
  return n->op == KL_OP_CUMSUM || n->op == KL_OP_CUMPROD;
}

/* cumsum and cumprod; a thread per line along the axis, neighbouring
 * threads on neighbouring inner elements (coalesced). */
static int emit_cumsum(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *out = n->outputs[0];
  bool prod = n->op == KL_OP_CUMPROD;
  int axis = norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank);
  bool excl = kl_attr_int(n, "exclusive", 0) != 0, rev = kl_attr_int(n, "reverse", 0) != 0;
  int64_t outer, len, inner;
  split_at(&x->shape, axis, &outer, &len, &inner);
  host_comment(e, n);
  if (kl_shape_numel(&x->shape) == 0) return 0;
  /* floats accumulate in double, as the interpreter; integers in 64 bits,
   * products unsigned (they wrap, no overflow) */
  const char *acc = kl_dtype_is_float(x->dtype) ? "double" : prod ? "uint64_t" : ctype(x->dtype);
  char name[32], what[64], lv[96];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  snprintf(what, sizeof what, "(axis %d%s%s)", axis, excl ? ", exclusive" : "",
           rev ? ", reverse" : "");
  head(f, n, what);
  sig(f, name, &x, 1, &out, 1);
  loop(f, outer * inner);
  fprintf(f, "    const int64_t base = i / %lldLL * %lldLL + i %% %lldLL;\n", (long long)inner,
          (long long)(len * inner), (long long)inner);
  fprintf(f, "    %s acc = %s;\n", acc, prod ? "1" : "0");
  fprintf(f, "    for (int64_t s = 0; s < %lldLL; s++) {\n", (long long)len);
  if (rev) fprintf(f, "      const int64_t at = base + (%lldLL - s) * %lldLL;\n", (long long)(len - 1), (long long)inner);
  else fprintf(f, "      const int64_t at = base + s * %lldLL;\n", (long long)inner);
  fprintf(f, "      const %s v = (%s)%s;\n", acc, acc, ld(x->dtype, "in0[at]", lv, sizeof lv));
  const char *update = prod ? "acc *= v;" : "acc += v;";
  if (!excl) fprintf(f, "      %s\n", update);
  fprintf(f, "      ");
  st(f, out->dtype, "out0[at]", "acc");
  if (excl) fprintf(f, "      %s\n", update);
  fprintf(f, "    }\n");
  tail(f);
  entry(f, name, &x, 1, &out, 1);
  launch(e, k, outer * inner, &x, 1, &out, 1);
  return 0;
}

static bool handles_tfidf(const kl_node *n) { return n->op == KL_OP_TFIDF; }

/* One thread per (row, output column): it counts the n-grams of its
 * column (tables of the column's n-grams: lengths and pool offsets, by
 * column) along its row, at every skip, then weighs the count by mode. */
static int emit_tfidf(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *out = n->outputs[0];
  int64_t numel = kl_shape_numel(&out->shape), ncols = out->shape.dims[out->shape.rank - 1];
  int64_t len = x->shape.dims[x->shape.rank - 1], ng = kl_tfidf_grams(n, NULL, 0);
  host_comment(e, n);
  if (numel == 0) return 0;
  kl_tfidf_gram *g = malloc((size_t)(ng + 1) * sizeof *g);
  if (!g) return -1;
  kl_tfidf_grams(n, g, ng);
  const int64_t *pool;
  int64_t npool = kl_attr_ints(n, "pool", &pool);
  const kl_attr *w = kl_node_attr(n, "weights");
  const char *mode = kl_attr_string(n, "mode", "TF");
  char name[32], what[64];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  /* CSR by column: first[c] .. first[c + 1] index glen/goff; every table
   * has at least one entry (C has no empty arrays) */
  int64_t ptab = npool > 0 ? npool : 1;
  fprintf(f, "__device__ const int64_t %s_pool[%lld] = {", name, (long long)ptab);
  for (int64_t i = 0; i < ptab; i++)
    fprintf(f, "%s%lldLL", i ? ", " : "", (long long)(npool > 0 ? pool[i] : 0));
  fprintf(f, "};\n__device__ const int64_t %s_first[%lld] = {0", name, (long long)(ncols + 1));
  int64_t at = 0;
  for (int64_t c = 0; c < ncols; c++) {
    for (int64_t j = 0; j < ng; j++) at += g[j].col == c;
    fprintf(f, ", %lld", (long long)at);
  }
  for (int t = 0; t < 2; t++) {
    fprintf(f, "};\n__device__ const int64_t %s_%s[%lld] = {", name, t ? "goff" : "glen",
            (long long)(ng > 0 ? ng : 1));
    int put = 0;
    for (int64_t c = 0; c < ncols; c++)
      for (int64_t j = 0; j < ng; j++)
        if (g[j].col == c)
          fprintf(f, "%s%lld", put++ ? ", " : "", (long long)(t ? g[j].off : g[j].len));
    if (!put) fprintf(f, "0");
  }
  fprintf(f, "};\n");
  bool weighted = w && w->n > 0;
  if (weighted) { /* weights by column (infer checked there are enough) */
    fprintf(f, "__device__ const float %s_w[%lld] = {", name, (long long)ncols);
    for (int64_t c = 0; c < ncols; c++) {
      double v = (double)(float)w->floats[c];
      if (isnan(v)) fprintf(f, "%sKL_NAN", c ? ", " : "");
      else if (isinf(v)) fprintf(f, "%s%sKL_INF", c ? ", " : "", v < 0 ? "-" : "");
      else fprintf(f, "%s(float)%.9g", c ? ", " : "", v);
    }
    fprintf(f, "};\n");
  }
  snprintf(what, sizeof what, "(%s, %lld n-grams)", mode, (long long)ng);
  head(f, n, what);
  sig(f, name, &x, 1, &out, 1);
  loop(f, numel);
  int64_t skip = kl_attr_int(n, "max_skip_count", 0);
  fprintf(f, "    const int64_t col = i %% %lldLL, row = i / %lldLL;\n"
             "    const %s *xr = in0 + row * %lldLL;\n"
             "    int64_t cnt = 0;\n"
             "    for (int64_t q = %s_first[col]; q < %s_first[col + 1]; q++) {\n"
             "      const int64_t gl = %s_glen[q], go = %s_goff[q];\n"
             "      const int64_t skips = gl == 1 ? 1 : %lldLL;\n"
             "      for (int64_t d = 1; d <= skips; d++)\n"
             "        for (int64_t s = 0; s + d * (gl - 1) < %lldLL; s++) {\n"
             "          int64_t m = 0;\n"
             "          while (m < gl && (int64_t)xr[s + d * m] == %s_pool[go + m]) m++;\n"
             "          cnt += m == gl;\n"
             "        }\n"
             "    }\n",
          (long long)ncols, (long long)ncols, kl_cg_storage(x->dtype), (long long)len, name, name,
          name, name, (long long)(skip + 1), (long long)len, name);
  if (weighted) fprintf(f, "    const float wt = %s_w[col];\n", name);
  const char *wt = weighted ? "wt" : "1.0f";
  char value[96];
  if (!strcmp(mode, "IDF")) snprintf(value, sizeof value, "cnt > 0 ? %s : 0.0f", wt);
  else if (!strcmp(mode, "TFIDF")) snprintf(value, sizeof value, "%s * (float)cnt", wt);
  else snprintf(value, sizeof value, "(float)cnt");
  fprintf(f, "    ");
  st(f, out->dtype, "out0[i]", value);
  tail(f);
  entry(f, name, &x, 1, &out, 1);
  launch(e, k, numel, &x, 1, &out, 1);
  free(g);
  return 0;
}

static bool handles_arg(const kl_node *n) { return n->op == KL_OP_ARGMAX || n->op == KL_OP_ARGMIN; }

/* First index of the maximum (minimum); the first NaN wins, as numpy. */
static int emit_arg(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0], *out = n->outputs[0];
  int axis = norm_axis(kl_attr_int(n, "axis", 0), x->shape.rank);
  int64_t outer, len, inner, numel = kl_shape_numel(&out->shape);
  split_at(&x->shape, axis, &outer, &len, &inner);
  host_comment(e, n);
  if (numel == 0 || len == 0) return 0;
  const char *ct = ctype(x->dtype), *cmp = n->op == KL_OP_ARGMAX ? ">" : "<";
  bool flt = kl_dtype_is_float(x->dtype);
  char name[32], what[32], lv[96];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  snprintf(what, sizeof what, "(axis %d)", axis);
  head(f, n, what);
  sig(f, name, &x, 1, &out, 1);
  loop(f, numel);
  fprintf(f, "    const int64_t base = i / %lldLL * %lldLL + i %% %lldLL;\n", (long long)inner,
          (long long)(len * inner), (long long)inner);
  fprintf(f, "    %s best = %s;\n    int64_t bi = 0;\n", ct, ld(x->dtype, "in0[base]", lv, sizeof lv));
  fprintf(f, "    for (int64_t j = 1; j < %lldLL; j++) {\n", (long long)len);
  if (flt) fprintf(f, "      if (best != best) break;\n");
  char at[64];
  snprintf(at, sizeof at, "in0[base + j * %lldLL]", (long long)inner);
  fprintf(f, "      const %s v = %s;\n", ct, ld(x->dtype, at, lv, sizeof lv));
  fprintf(f, "      if (%sv %s best) { best = v; bi = j; }\n    }\n", flt ? "v != v || " : "", cmp);
  fprintf(f, "    out0[i] = bi;\n");
  tail(f);
  entry(f, name, &x, 1, &out, 1);
  launch(e, k, numel, &x, 1, &out, 1);
  return 0;
}

static bool handles_topk(const kl_node *n) { return n->op == KL_OP_TOPK; }

/* One thread per row, k rounds of selection: round r takes the best
 * element ranked after the one round r-1 took, in the total order of
 * kl_eval_TOPK (value, NaN above every number when largest and below when
 * smallest, then lower index first).  O(k * len) per row, no scratch. */
static int emit_topk(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *x = n->inputs[0];
  int axis = norm_axis(kl_attr_int(n, "axis", -1), x->shape.rank);
  int64_t kk = kl_attr_int(n, "k", 0), outer, len, inner;
  bool largest = kl_attr_int(n, "largest", 1) != 0, flt = kl_dtype_is_float(x->dtype);
  split_at(&x->shape, axis, &outer, &len, &inner);
  host_comment(e, n);
  if (kk == 0 || outer * inner == 0) return 0;
  const char *ct = ctype(x->dtype);
  char name[32], what[64], lv[96];
  int k = new_kernel(e, name);
  FILE *f = kl_cg_kernels(e);
  /* before(a, ia, b, ib): a ranks ahead of b */
  fprintf(f, "__device__ int %s_before(%s a, int64_t ia, %s b, int64_t ib) {\n", name, ct, ct);
  if (flt)
    fprintf(f, "  const int na = a != a, nb = b != b;\n  if (na != nb) return %s;\n"
               "  if (!na && a != b) return a %s b;\n",
            largest ? "na" : "nb", largest ? ">" : "<");
  else
    fprintf(f, "  if (a != b) return a %s b;\n", largest ? ">" : "<");
  fprintf(f, "  return ia < ib;\n}\n");
  snprintf(what, sizeof what, "(k = %lld, axis %d, %s)", (long long)kk, axis,
           largest ? "largest" : "smallest");
  head(f, n, what);
  sig(f, name, &x, 1, (const kl_value *const *)n->outputs, 2);
  loop(f, outer * inner);
  fprintf(f, "    const int64_t o = i / %lldLL, ii = i %% %lldLL, base = o * %lldLL + ii;\n",
          (long long)inner, (long long)inner, (long long)(len * inner));
  fprintf(f, "    %s pv = 0;\n    int64_t pi = -1;\n", ct);
  fprintf(f, "    for (int64_t r = 0; r < %lldLL; r++) {\n", (long long)kk);
  fprintf(f, "      %s bv = 0;\n      int64_t bi = -1;\n", ct);
  fprintf(f, "      for (int64_t j = 0; j < %lldLL; j++) {\n", (long long)len);
  char at[64];
  snprintf(at, sizeof at, "in0[base + j * %lldLL]", (long long)inner);
  fprintf(f, "        const %s v = %s;\n", ct, ld(x->dtype, at, lv, sizeof lv));
  fprintf(f, "        if (pi >= 0 && !%s_before(pv, pi, v, j)) continue;\n", name);
  fprintf(f, "        if (bi < 0 || %s_before(v, j, bv, bi)) { bv = v; bi = j; }\n      }\n", name);
  fprintf(f, "      const int64_t w = (o * %lldLL + r) * %lldLL + ii;\n", (long long)kk,
          (long long)inner);
  fprintf(f, "      out0[w] = in0[base + bi * %lldLL];\n      out1[w] = bi;\n", (long long)inner);
  fprintf(f, "      pv = bv;\n      pi = bi;\n    }\n");
  tail(f);
  entry(f, name, &x, 1, (const kl_value *const *)n->outputs, 2);
  launch(e, k, outer * inner, &x, 1, (const kl_value *const *)n->outputs, 2);
  return 0;
}

const kl_cg_template kl_cg_templates_movement[] = {
    {handles_concat, emit_concat, NULL},
    {handles_split, emit_split, NULL},
    {handles_slice, emit_slice, NULL},
    {handles_gather, emit_gather, NULL},
    {handles_pad, emit_pad, NULL},
    {handles_trilu, emit_trilu, NULL},
    {handles_bitcast, emit_bitcast, NULL},
    {handles_gather_elements, emit_gather_elements, NULL},
    {handles_scatter_elements, emit_scatter_elements, NULL},
    {handles_scatter_nd, emit_scatter_nd, NULL},
    {handles_gather_nd, emit_gather_nd, NULL},
    {handles_cumsum, emit_cumsum, NULL},
    {handles_tfidf, emit_tfidf, NULL},
    {handles_arg, emit_arg, NULL},
    {handles_topk, emit_topk, NULL},
    {NULL, NULL, NULL},
};
