/* emit_attention.c - scaled dot-product attention as one kernel:
 *
 *   out = post(softmax(pre(Q @ K))) @ V
 *
 * where pre and post are chains of elementwise nodes (the 1/sqrt(d) scale,
 * a causal or padding mask, the casts of mixed precision).  Unfused, the
 * scores and the probabilities each go to memory and back twice (written
 * by one kernel, read by the next); here a warp takes one row of the
 * scores, keeps the row in registers (each lane a strided slice of it)
 * and writes only the output row.  Nothing is computed twice: each score's
 * dot product is done once, as in the unfused GEMM.
 *
 * Every value is rounded through its storage type where the unfused
 * kernels store it (the scores, each chain value, the probabilities), and
 * softmax is the row kernel's formula (max, then the sum of exp in
 * double), so fused and unfused differ only in the order the two GEMMs
 * add their products.  Dot products accumulate in double for f32 and f64
 * and in float for f16 and bf16, as the direct convolution does.
 *
 * Limits: at most 1024 keys a row (32 scores per lane; the row of
 * probabilities in shared memory), and head widths up to 256 (wider heads
 * make the two products the work, where cuBLAS's tiling pays more than
 * the traffic saved).  Other attentions keep GEMM + softmax + GEMM. */
#include <string.h>

#include "codegen_impl.h"

/* The limits (1024 keys, heads of 256) are kl_cg_target's; a lane keeps
 * 1024 / 32 scores. */
enum { LANES = 32 };

/* Strides of view v over the output's nb batch dims (aligned from the
 * right; 0 where v broadcasts). */
static void batch_strides(const kl_view *v, int nb, int64_t *st) {
  int vb = v->shape.rank - 2;
  for (int d = 0; d < nb; d++) {
    int vd = d - (nb - vb);
    st[d] = vd < 0 || v->shape.dims[vd] == 1 ? 0 : v->strides[vd];
  }
}

static int index_of(const kl_group_io *io, const kl_value *v) {
  for (int k = 0; k < io->nin; k++)
    if (io->in[k] == v) return k;
  return -1;
}

/* The x registers of the inputs that chain nodes[0..n) reads, loaded for
 * element i of the scores. */
static void load_chain_inputs(FILE *f, kl_node *const *nodes, int n, const kl_group_io *io,
                              int nextra, const kl_shape *S) {
  bool want[KL_MAX_GROUP_IO] = {0};
  for (int m = 0; m < n; m++)
    for (int i = 0; i < nodes[m]->ninputs; i++) {
      int k = index_of(io, nodes[m]->inputs[i]);
      if (k >= 0 && k < nextra) want[k] = true;
    }
  const kl_value *loads[KL_MAX_GROUP_IO];
  int nloads = 0, slot[KL_MAX_GROUP_IO];
  for (int k = 0; k < nextra; k++)
    if (want[k]) slot[nloads] = k, loads[nloads++] = io->in[k];
  if (!nloads) return;
  kl_cg_index_math(f, S, loads, nloads);
  for (int q = 0; q < nloads; q++) {
    char src[32], buf[160];
    snprintf(src, sizeof src, "in%d[o%d]", slot[q], q);
    fprintf(f, "    const %s x%d = %s;\n", kl_cg_compute_type(loads[q]->dtype), slot[q],
            kl_cg_load(buf, sizeof buf, loads[q]->dtype, kl_cg_compute_type(loads[q]->dtype), src));
  }
}

kl_cg_grid kl_cg_attention_kernel(FILE *f, const char *name, const kl_attention *a,
                                  const kl_view *q, const kl_view *k, const kl_view *v,
                                  const kl_view *out, const kl_group_io *io) {
  typedef long long ll;
  const kl_value *s = a->qk->outputs[0], *x = a->softmax->inputs[0], *p = a->softmax->outputs[0];
  const kl_value *pl = a->pv->inputs[0], *y = a->pv->outputs[0];
  const kl_shape *S = &s->shape;
  int r = S->rank, nb = r - 2, nextra = io->nin - 3;
  int64_t tq = S->dims[r - 2], tk = S->dims[r - 1], d = q->shape.dims[q->shape.rank - 1];
  int64_t dv = v->shape.dims[v->shape.rank - 1], nj = (tk + LANES - 1) / LANES;
  int64_t rows = kl_shape_numel(S) / tk;
  /* products summed in f32 (f64 for f64 tensors) */
  const char *acc = kl_cg_real_type(s->dtype), *ct = kl_cg_compute_type(x->dtype);
  /* the second product's type: its own (casts may sit between them) */
  const char *acc2 = kl_cg_real_type(y->dtype);
  const char *sf = !strcmp(ct, "double") ? "" : "f";
  kl_cg_rows plan = kl_cg_plan_rows(rows, tk); /* tk <= 1024: a warp per row */
  /* each warp's probabilities in shared memory: at most 32 KB a block */
  int psize = pl->dtype == KL_F64 ? 8 : 4;
  while (plan.rows_per_block > 1 && (int64_t)plan.rows_per_block * tk * psize > 32768)
    plan.rows_per_block /= 2;
  int64_t sq[KL_MAX_RANK], sk[KL_MAX_RANK], sv[KL_MAX_RANK], so[KL_MAX_RANK];
  batch_strides(q, nb, sq), batch_strides(k, nb, sk), batch_strides(v, nb, sv),
      batch_strides(out, nb, so);
  char text[160], buf[256], lq[160], lk[160], lv[160];
  fprintf(f, "/* attention %s .. %s: softmax(", a->qk->name, a->pv->name);
  for (int m = a->npre - 1; m >= 0; m--) fprintf(f, "%s(", kl_ops[a->pre[m]->op].name);
  fprintf(f, "Q @ K");
  for (int m = 0; m < a->npre; m++) fprintf(f, ")");
  fprintf(f, ")");
  for (int m = 0; m < a->npost; m++) fprintf(f, " -> %s", kl_ops[a->post[m]->op].name);
  fprintf(f, " @ V over the rows of %s, a warp per row */\n", kl_shape_str(S, text, sizeof text));
  kl_cg_fused_params(f, name, io);
  fprintf(f, "  KL_SHARED(%s, prob, [%lld]);\n", kl_cg_compute_type(pl->dtype),
          (ll)(plan.rows_per_block * tk));
  kl_cg_rows_begin(f, &plan);
  /* where the row's operands and result start */
  fprintf(f, "  int64_t oq = %lldLL, ok = %lldLL, ov = %lldLL, oo = %lldLL;\n", (ll)q->offset,
          (ll)k->offset, (ll)v->offset, (ll)out->offset);
  fprintf(f, "  {\n    int64_t rest = row;\n    const int64_t iq = rest %% %lldLL;\n", (ll)tq);
  fprintf(f, "    rest /= %lldLL;\n    (void)rest;\n    oq += iq * %lldLL;\n    oo += iq * %lldLL;\n",
          (ll)tq, (ll)q->strides[q->shape.rank - 2], (ll)out->strides[r - 2]);
  for (int bd = nb - 1; bd >= 0; bd--) {
    if (S->dims[bd] == 1) continue;
    fprintf(f, "    { const int64_t b = rest %% %lldLL; rest /= %lldLL;", (ll)S->dims[bd],
            (ll)S->dims[bd]);
    const int64_t *st[4] = {sq, sk, sv, so};
    const char *names[4] = {"oq", "ok", "ov", "oo"};
    for (int w = 0; w < 4; w++)
      if (st[w][bd]) fprintf(f, " %s += b * %lldLL;", names[w], (ll)st[w][bd]);
    fprintf(f, " }\n");
  }
  fprintf(f, "  }\n");
  int kq = io->nin - 3, kk = io->nin - 2, kv = io->nin - 1;
  fprintf(f, "  const %s *qp = in%d + oq;\n  const %s *kp = in%d + ok;\n  const %s *vp = in%d + ov;\n",
          kl_cg_storage(q->base->dtype), kq, kl_cg_storage(k->base->dtype), kk,
          kl_cg_storage(v->base->dtype), kv);
  fprintf(f, "  %s *op = out0 + oo;\n", kl_cg_storage(y->dtype));
  /* 1: each lane's scores (the GEMM's result, then the pre chain) and the
   * row's max */
  fprintf(f, "  %s sc[%lld];\n  %s mx = -KL_INF;\n", ct, (ll)nj, ct);
  fprintf(f, "  for (int t = 0; t < %lld; t++) {\n    const int64_t j = lane + %d * t;\n"
             "    if (j >= %lldLL) break;\n    %s dot = 0;\n",
          (ll)nj, LANES, (ll)tk, acc);
  char qe[64], ke[96];
  snprintf(qe, sizeof qe, "qp[e * %lldLL]", (ll)q->strides[q->shape.rank - 1]);
  snprintf(ke, sizeof ke, "kp[e * %lldLL + j * %lldLL]", (ll)k->strides[k->shape.rank - 2],
           (ll)k->strides[k->shape.rank - 1]);
  fprintf(f, "    for (int64_t e = 0; e < %lldLL; e++)\n      dot += %s * %s;\n", (ll)d,
          kl_cg_load(lq, sizeof lq, q->base->dtype, acc, qe),
          kl_cg_load(lk, sizeof lk, k->base->dtype, acc, ke));
  fprintf(f, "    %s sd; ", kl_cg_storage(s->dtype));
  kl_cg_store(f, s->dtype, "sd", "dot");
  fprintf(f, "    const %s v%d = %s;\n", kl_cg_compute_type(s->dtype), s->id,
          kl_cg_load(buf, sizeof buf, s->dtype, kl_cg_compute_type(s->dtype), "sd"));
  fprintf(f, "    const int64_t i = row * %lldLL + j;\n    (void)i;\n", (ll)tk);
  load_chain_inputs(f, a->pre, a->npre, io, nextra, S);
  kl_cg_fused_members(f, a->pre, a->npre, io, "out%d[i]", "i", x);
  fprintf(f, "    sc[t] = (%s)v%d;\n    mx = (sc[t] != sc[t] || sc[t] > mx) ? sc[t] : mx;\n  }\n",
          ct, x->id);
  const char *max = "acc = (v != v || v > acc) ? v : acc;";
  fprintf(f, "  {\n    %s acc = mx;\n", ct);
  kl_cg_rows_combine(f, &plan, "    ", ct, max, "unused");
  fprintf(f, "    mx = acc;\n  }\n");
  /* 2: the row's sum of exp, in the compute type as the softmax kernel */
  fprintf(f, "  %s sum;\n  {\n    %s acc = 0;\n"
             "    for (int t = 0; t < %lld; t++) {\n      if (lane + %d * t >= %lldLL) break;\n"
             "      acc += exp%s(sc[t] - mx);\n    }\n",
          ct, ct, (ll)nj, LANES, (ll)tk, sf);
  kl_cg_rows_combine(f, &plan, "    ", ct, "acc += v;", "unused");
  fprintf(f, "    sum = acc;\n  }\n");
  /* 3: the probabilities (through the post chain) into the warp's row of
   * shared memory; then each lane takes output columns, reading V's rows
   * across the warp */
  const char *pt = kl_cg_compute_type(pl->dtype);
  fprintf(f, "  %s *pr = prob + (threadIdx.x >> 5) * %lldLL;\n", pt, (ll)tk);
  fprintf(f, "  for (int t = 0; t < %lld; t++) {\n    const int64_t j = lane + %d * t;\n"
             "    if (j >= %lldLL) break;\n    const int64_t i = row * %lldLL + j;\n    (void)i;\n",
          (ll)nj, LANES, (ll)tk, (ll)tk);
  fprintf(f, "    %s v%d;\n    {\n      const %s v = sc[t], m = mx;\n      %s s; ",
          kl_cg_compute_type(p->dtype), p->id, ct, kl_cg_storage(p->dtype));
  kl_cg_store(f, p->dtype, "s", kl_cg_softmax_value(a->softmax, !strcmp(ct, "double")));
  fprintf(f, "      v%d = %s;\n    }\n", p->id,
          kl_cg_load(buf, sizeof buf, p->dtype, kl_cg_compute_type(p->dtype), "s"));
  load_chain_inputs(f, a->post, a->npost, io, nextra, S);
  kl_cg_fused_members(f, a->post, a->npost, io, "out%d[i]", "i", pl);
  fprintf(f, "    pr[j] = v%d;\n  }\n  __syncwarp(0xffffffffu);\n", pl->id);
  char ve[96];
  snprintf(ve, sizeof ve, "vp[j * %lldLL + e * %lldLL]", (ll)v->strides[v->shape.rank - 2],
           (ll)v->strides[v->shape.rank - 1]);
  fprintf(f, "  for (int64_t e = lane; e < %lldLL; e += %d) {\n    %s acc = 0;\n"
             "    for (int64_t j = 0; j < %lldLL; j++)\n      acc += (%s)pr[j] * %s;\n    %s so; ",
          (ll)dv, LANES, acc2, (ll)tk, acc2, kl_cg_load(lv, sizeof lv, v->base->dtype, acc2, ve),
          kl_cg_storage(y->dtype));
  kl_cg_store(f, y->dtype, "so", "acc");
  fprintf(f, "    op[e * %lldLL] = so;\n  }\n}\n", (ll)out->strides[r - 1]);
  kl_cg_fused_entry(f, name, io);
  return kl_cg_rows_grid(&plan);
}
