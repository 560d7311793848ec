/* emit_fused.c - the kernel of a fusion group: elementwise nodes of one
 * output shape computed together, one thread per element.  Values that
 * stay inside the group live in registers; each is still rounded through
 * its storage type (f16, an i32's wrap, a bool's 0/1), so a fused kernel
 * computes exactly what the unfused kernels do. */
#include <string.h>

#include "codegen_impl.h"

static bool is_member(kl_node *const *nodes, int n, const kl_node *x) {
  for (int i = 0; i < n; i++)
    if (nodes[i] == x) return true;
  return false;
}

bool kl_cg_is_channel_affine(const kl_node *n) {
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

void kl_cg_fused_io(kl_node *const *nodes, int n, const bool *stored, kl_cg_fused_args *io) {
  io->nin = io->nout = 0;
  for (int m = 0; m < n; m++) {
    const kl_node *nd = nodes[m];
    for (int i = 0; i < nd->ninputs; i++) {
      const kl_value *v = nd->inputs[i];
      if (v->producer && is_member(nodes, n, v->producer)) continue;
      int k = 0;
      while (k < io->nin && io->in[k] != v) k++;
      if (k == io->nin) {
        if (io->nin == KL_CG_MAX_FUSED_IO) continue;
        io->in[io->nin] = v;
        io->elementwise_read[io->nin++] = false;
      }
      /* a batch_norm's parameters are read by channel */
      if (!(kl_cg_is_channel_affine(nd) && i > 0)) io->elementwise_read[k] = true;
    }
    if (stored[nd->outputs[0]->id] && io->nout < KL_CG_MAX_FUSED_IO)
      io->out[io->nout++] = nd->outputs[0];
  }
}

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
static const char *reg(const kl_cg_fused_args *io, const kl_value *v, char *buf, size_t len) {
  int k = index_of(io->in, io->nin, v);
  if (k >= 0) snprintf(buf, len, "x%d", k);
  else snprintf(buf, len, "v%d", v->id);
  return buf;
}

/* A batch_norm member, as templates_nn.c's kernel computes it:
 * (x - mean[ch]) * (scale[ch] / sqrt(var[ch] + eps)) + bias[ch], ch the
 * element's index on axis 1. */
static void channel_affine(FILE *f, const kl_node *nd, const kl_cg_fused_args *io, bool later) {
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
  fprintf(f, "    { /* %s: batch_norm, per channel */\n      const int64_t ch = (i / %lldLL) %% %lldLL;\n",
          nd->name, (long long)inner, (long long)x->shape.dims[1]);
  fprintf(f, "      const %s s = %s / sqrt%s(%s + (%s)%.17g);\n", ct, p[1], sf, p[4], ct,
          kl_attr_float(nd, "epsilon", 1e-5));
  char val[600];
  snprintf(val, sizeof val, "((%s)%s - %s) * s + %s", ct, reg(io, x, r, sizeof r), p[3], p[2]);
  fprintf(f, "      %s so; ", kl_cg_storage(out->dtype));
  kl_cg_store(f, out->dtype, "so", val);
  int ko = index_of(io->out, io->nout, out);
  if (ko >= 0) fprintf(f, "      out%d[i] = so;\n", ko);
  char buf[160];
  if (later)
    fprintf(f, "      v%d = %s;\n", out->id,
            kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), "so"));
  fprintf(f, "    }\n");
}

void kl_cg_fused_elementwise(FILE *f, const char *name, kl_node *const *nodes, int n,
                             const kl_cg_fused_args *io) {
  const kl_shape *shape = &nodes[n - 1]->outputs[0]->shape;
  char text[160], buf[256], r[3][32];
  fprintf(f, "/* fused elementwise group of %d nodes -> %s:", n, kl_shape_str(shape, text, sizeof text));
  for (int m = 0; m < n; m++) fprintf(f, " %s(%s)", nodes[m]->name, kl_ops[nodes[m]->op].name);
  fprintf(f, " */\nKL_KERNEL void %s(", name);
  for (int k = 0; k < io->nin; k++)
    fprintf(f, "const %s *__restrict__ in%d, ", kl_cg_storage(io->in[k]->dtype), k);
  for (int k = 0; k < io->nout; k++)
    fprintf(f, "%s *__restrict__ out%d%s", kl_cg_storage(io->out[k]->dtype), k,
            k + 1 < io->nout ? ", " : ") {\n");
  kl_cg_grid_stride_loop(f, kl_shape_numel(shape));
  /* offsets for the inputs read element for element (o0.. in their order) */
  const kl_value *loads[KL_CG_MAX_FUSED_IO];
  int nloads = 0, slot[KL_CG_MAX_FUSED_IO];
  for (int k = 0; k < io->nin; k++)
    if (io->elementwise_read[k]) slot[nloads] = k, loads[nloads++] = io->in[k];
  if (nloads) kl_cg_index_math(f, shape, loads, nloads);
  for (int q = 0; q < nloads; q++) {
    const kl_value *v = loads[q];
    char src[32];
    snprintf(src, sizeof src, "in%d[o%d]", slot[q], q);
    fprintf(f, "    const %s x%d = %s;\n", kl_cg_compute_type(v->dtype), slot[q],
            kl_cg_load(buf, sizeof buf, v->dtype, kl_cg_compute_type(v->dtype), src));
  }
  for (int m = 0; m < n; m++) {
    const kl_node *nd = nodes[m];
    const kl_value *out = nd->outputs[0];
    if (kl_cg_is_channel_affine(nd)) {
      channel_affine(f, nd, io, read_later(nodes, n, m, out));
      continue;
    }
    const char *ct = kl_cg_operand_type(nd);
    const char *expr = kl_cg_expression(nd, ct, buf, sizeof buf);
    int ko = index_of(io->out, io->nout, out);
    bool later = read_later(nodes, n, m, out);
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
    if (ko >= 0) fprintf(f, "      out%d[i] = s;\n", ko);
    if (later) {
      char src[8] = "s";
      fprintf(f, "      v%d = %s;\n", out->id,
              kl_cg_load(buf, sizeof buf, out->dtype, kl_cg_compute_type(out->dtype), src));
    }
    fprintf(f, "    }\n");
  }
  fprintf(f, "  }\n}\nKL_EMU_ENTRY(%s", name);
  for (int k = 0; k < io->nin; k++)
    fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(io->in[k]->dtype), k);
  for (int k = 0; k < io->nout; k++)
    fprintf(f, ", KL_ARG(%s *, %d)", kl_cg_storage(io->out[k]->dtype), io->nin + k);
  fprintf(f, ");\n\n");
}
