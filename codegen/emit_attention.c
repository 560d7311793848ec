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


/* ---- the tiled kernel (FlashAttention-2's scheme) -------------------------
 * A block of 4 warps per (batch, tile of 4R query rows); K and V pass
 * through shared memory 32 keys at a time, loaded once per tile with
 * consecutive threads on consecutive elements, and every query row of the
 * tile reuses them: global loads per key element are one per query tile,
 * not per query row, and any number of keys fits.  A warp owns R rows:
 * lane j scores key j of the tile, the pre chain applied (its index the
 * score's flat index, as unfused); each row keeps its running max and sum,
 * and its output row in registers (lane e holds columns e, e + 32, ...).
 *
 * One pass when the probabilities go to the second product as softmax
 * computes them (in f32 or f64, no post chain): the output is rescaled by
 * exp(m_old - m_new) when a tile raises the max and divided by the sum at
 * the end.  Otherwise (a post chain, probabilities stored in a half type,
 * log_softmax) two: the first finds each row's max and sum, the second
 * recomputes the scores and forms the probabilities exactly as the
 * softmax kernel would, through the post chain, so that fused and unfused
 * round alike; the scores' product is done twice there. */
typedef struct {
  FILE *f;
  const kl_attention *a;
  const kl_view *q, *k, *v, *out;
  const kl_group_io *io;
  const char *acc, *acc2, *ct, *sf;
  int R, nextra;
  int64_t tq, tk, d, dv, bq, nc, batches;
} tiled;

/* The live threads of a block (4 warps of KL_LANES lanes) share the
 * loads: tid counts them, 4 * KL_LANES of them. */
static void tile_loads(const tiled *t, bool with_v) {
  typedef long long ll;
  FILE *f = t->f;
  char ld[200], src[160];
  int kk = t->io->nin - 2, kv = t->io->nin - 1, kr = t->k->shape.rank, vr = t->v->shape.rank;
  fprintf(f, "    __syncthreads();\n");
  /* K transposed (ks[e * 33 + key]): a lane's keys are consecutive for
   * each e, and the stores, 33 apart, fall in distinct banks */
  fprintf(f, "    for (int t = tid; t < %lld; t += 4 * KL_LANES) {\n"
             "      const int jj = t / %lld, e = t %% %lld;\n      const int64_t key = k0 + jj;\n",
          (ll)(32 * t->d), (ll)t->d, (ll)t->d);
  snprintf(src, sizeof src, "in%d[ok + key * %lldLL + e * %lldLL]", kk, (ll)t->k->strides[kr - 1],
           (ll)t->k->strides[kr - 2]);
  fprintf(f, "      ks[e * 33 + jj] = key < %lldLL ? %s : (%s)0;\n    }\n", (ll)t->tk,
          kl_cg_load(ld, sizeof ld, t->k->base->dtype, t->acc, src), t->acc);
  if (with_v) {
    fprintf(f, "    for (int t = tid; t < %lld; t += 4 * KL_LANES) {\n"
               "      const int jj = t / %lld, e = t %% %lld;\n      const int64_t key = k0 + jj;\n",
            (ll)(32 * t->dv), (ll)t->dv, (ll)t->dv);
    snprintf(src, sizeof src, "in%d[ov + key * %lldLL + e * %lldLL]", kv, (ll)t->v->strides[vr - 2],
             (ll)t->v->strides[vr - 1]);
    fprintf(f, "      vs[jj * %lld + e] = key < %lldLL ? %s : (%s)0;\n    }\n", (ll)t->dv, (ll)t->tk,
            kl_cg_load(ld, sizeof ld, t->v->base->dtype, t->acc2, src), t->acc2);
  }
  fprintf(f, "    __syncthreads();\n");
}

/* Opens the loop over the warp's rows with xv[u], the softmax's inputs
 * (-inf where there is no score) for virtual lane j = lane + KL_LANES * u
 * (key k0 + j), from dot, the score's product (an expression of rr and
 * u). */
static void tile_rows(const tiled *t, const char *dot) {
  typedef long long ll;
  FILE *f = t->f;
  const kl_value *s = t->a->qk->outputs[0], *x = t->a->softmax->inputs[0];
  char buf[256];
  fprintf(f, "    for (int rr = 0; rr < %d; rr++) {\n      const int64_t iq = q0 + warp * %d + rr;\n"
             "      %s xv[KL_VLANES];\n      for (int u = 0; u < KL_VLANES; u++) {\n"
             "      const int64_t j = k0 + lane + KL_LANES * u;\n"
             "      xv[u] = -KL_INF;\n      if (iq < %lldLL && j < %lldLL) {\n",
          t->R, t->R, t->ct, (ll)t->tq, (ll)t->tk);
  fprintf(f, "        const int64_t row = batch * %lldLL + iq, i = row * %lldLL + j;\n        (void)i;\n",
          (ll)t->tq, (ll)t->tk);
  fprintf(f, "        %s sd; ", kl_cg_storage(s->dtype));
  kl_cg_store(f, s->dtype, "sd", dot);
  fprintf(f, "        const %s v%d = %s;\n", kl_cg_compute_type(s->dtype), s->id,
          kl_cg_load(buf, sizeof buf, s->dtype, kl_cg_compute_type(s->dtype), "sd"));
  load_chain_inputs(f, t->a->pre, t->a->npre, t->io, t->nextra, &s->shape);
  kl_cg_fused_members(f, t->a->pre, t->a->npre, t->io, "out%d[i]", "i", x);
  fprintf(f, "        xv[u] = (%s)v%d;\n      }\n      }\n", t->ct, x->id);
}

/* The tile's scores for the warp's rows, summed from qs and ks, then
 * the loop over its rows (tile_rows). */
static void tile_scores(const tiled *t) {
  typedef long long ll;
  FILE *f = t->f;
  fprintf(f, "    %s dot[%d][KL_VLANES];\n    for (int rr = 0; rr < %d; rr++)\n"
             "      for (int u = 0; u < KL_VLANES; u++) dot[rr][u] = 0;\n",
          t->acc, t->R, t->R);
  fprintf(f, "    for (int e = 0; e < %lld; e++) {\n      for (int rr = 0; rr < %d; rr++) {\n"
             "        const %s qv = qs[(warp * %d + rr) * %lld + e];\n"
             "        for (int u = 0; u < KL_VLANES; u++) dot[rr][u] += qv * ks[e * 33 + lane + KL_LANES * u];\n"
             "      }\n    }\n",
          (ll)t->d, t->R, t->acc, t->R, (ll)(t->d + 1));
  tile_rows(t, "dot[rr][u]");
}

/* The online max and sum of the row rr over this tile's scores: first
 * over a lane's virtual lanes, halving (the pairs of the shuffles' xor
 * tree, widest first), then across lanes by the shuffles, so the sum is
 * added in the same order for any KL_LANES; with `scale_out`, the output
 * row rescaled and pj[u] (the unnormalised probabilities) left for the
 * product. */
static void online_softmax(const tiled *t, bool scale_out) {
  typedef long long ll;
  FILE *f = t->f;
  const char *ct = t->ct, *sf = t->sf;
  fprintf(f, "      %s tm = xv[0];\n"
             "      for (int u = 1; u < KL_VLANES; u++) tm = (xv[u] != xv[u] || xv[u] > tm) ? xv[u] : tm;\n"
             "      for (int w = KL_LANES / 2; w > 0; w >>= 1) {\n"
             "        const %s sh = __shfl_xor_sync(0xffffffffu, tm, w);\n        tm = (sh != sh || sh > tm) ? sh : tm;\n      }\n",
          ct, ct);
  /* NaN wins, as in the row kernel; a row masked so far to -inf subtracts
   * 0 (exp(-inf) = 0, not NaN) */
  fprintf(f, "      const %s mn = (tm != tm || rm[rr] != rm[rr]) ? tm + rm[rr] : (tm > rm[rr] ? tm : rm[rr]);\n", ct);
  fprintf(f, "      const %s base = mn == -KL_INF ? (%s)0 : mn;\n", ct, ct);
  fprintf(f, "      const %s scale = exp%s(rm[rr] - base);\n", ct, sf);
  fprintf(f, "      %s pj[KL_VLANES], sv[KL_VLANES];\n      for (int u = 0; u < KL_VLANES; u++) {\n"
             "        const int64_t j = k0 + lane + KL_LANES * u;\n"
             "        pj[u] = iq < %lldLL && j < %lldLL ? exp%s(xv[u] - base) : (%s)0;\n        sv[u] = pj[u];\n      }\n",
          ct, (ll)t->tq, (ll)t->tk, sf, ct);
  fprintf(f, "      for (int m = KL_VLANES / 2; m > 0; m >>= 1)\n        for (int u = 0; u < m; u++) sv[u] += sv[u + m];\n"
             "      %s sum = sv[0];\n      for (int w = KL_LANES / 2; w > 0; w >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, w);\n",
          ct);
  fprintf(f, "      rl[rr] = rl[rr] * scale + sum;\n      rm[rr] = mn;\n");
  if (scale_out) fprintf(f, "      for (int c = 0; c < NCV; c++) o[rr][c] *= (%s)scale;\n", t->acc2);
}

/* Closes the row loop: the probabilities (pvalue, an expression of u)
 * into ps, then the second product (a lane's columns of V, e = lane +
 * KL_LANES * c, the rows' probabilities broadcast). */
static void tile_product(const tiled *t, const char *pvalue) {
  typedef long long ll;
  FILE *f = t->f;
  fprintf(f, "      for (int u = 0; u < KL_VLANES; u++) ps[(warp * %d + rr) * 33 + lane + KL_LANES * u] = %s;\n"
             "    }\n    __syncwarp(0xffffffffu);\n", t->R, pvalue);
  fprintf(f, "    for (int jj = 0; jj < 32; jj++) {\n      for (int rr = 0; rr < %d; rr++) {\n"
             "        const %s pr = ps[(warp * %d + rr) * 33 + jj];\n"
             "        for (int c = 0; c < NCV; c++) {\n          const int e = lane + KL_LANES * c;\n"
             "          o[rr][c] += pr * (e < %lld ? vs[jj * %lld + e] : (%s)0);\n        }\n      }\n    }\n"
             "    __syncwarp(0xffffffffu);\n",
          t->R, t->acc2, t->R, (ll)t->dv, (ll)t->dv, t->acc2);
}

/* What both tiled kernels know of the attention before choosing tiles. */
static tiled tile_init(FILE *f, const kl_attention *a, const kl_view *q, const kl_view *k, const kl_view *v,
                       const kl_view *out, const kl_group_io *io) {
  const kl_value *s = a->qk->outputs[0], *x = a->softmax->inputs[0], *y = a->pv->outputs[0];
  const kl_shape *S = &s->shape;
  int r = S->rank;
  tiled t = {.f = f, .a = a, .q = q, .k = k, .v = v, .out = out, .io = io};
  t.acc = kl_cg_real_type(s->dtype), t.acc2 = kl_cg_real_type(y->dtype);
  t.ct = kl_cg_compute_type(x->dtype), t.sf = !strcmp(t.ct, "double") ? "" : "f";
  t.nextra = io->nin - 3;
  t.tq = S->dims[r - 2], t.tk = S->dims[r - 1], t.d = q->shape.dims[q->shape.rank - 1];
  t.dv = v->shape.dims[v->shape.rank - 1];
  t.batches = kl_shape_numel(S) / (t.tq * t.tk);
  return t;
}

/* The kernel's opening comment: its formula and shape. */
static void tile_header(const tiled *t, const char *how) {
  typedef long long ll;
  FILE *f = t->f;
  const kl_attention *a = t->a;
  char text[160];
  fprintf(f, "/* attention %s .. %s, tiled: softmax(", a->qk->name, a->pv->name);
  for (int m = a->npre - 1; m >= 0; m--) fprintf(f, "%s(", kl_ops[a->pre[m]->op].name);
  fprintf(f, "Q @ K");
  for (int m = 0; m < a->npre; m++) fprintf(f, ")");
  fprintf(f, ")");
  for (int m = 0; m < a->npost; m++) fprintf(f, " -> %s", kl_ops[a->post[m]->op].name);
  fprintf(f, " @ V over the scores %s: a block per %lld query rows, keys 32 at a time, %s */\n",
          kl_shape_str(&a->qk->outputs[0]->shape, text, sizeof text), (ll)t->bq, how);
}

/* The thread's lane, warp and rank among the block's live threads (the
 * host device runs a warp as its lane 0 alone, over 32 virtual lanes:
 * kiln_prelude.h's KL_LANES; the other threads leave, and count as
 * arrived at every barrier), the block's batch and first query row, and
 * where Q, K, V and the output start for that batch. */
static void tile_origin(const tiled *t) {
  typedef long long ll;
  FILE *f = t->f;
  const kl_shape *S = &t->a->qk->outputs[0]->shape;
  int nb = S->rank - 2;
  int64_t qtiles = (t->tq + t->bq - 1) / t->bq, batches = kl_shape_numel(S) / (t->tq * t->tk);
  int64_t sq[KL_MAX_RANK], sk[KL_MAX_RANK], sv[KL_MAX_RANK], so[KL_MAX_RANK];
  batch_strides(t->q, nb, sq), batch_strides(t->k, nb, sk), batch_strides(t->v, nb, sv),
      batch_strides(t->out, nb, so);
  fprintf(f, "  const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);\n"
             "  if (lane >= KL_LANES) return;\n  const int tid = warp * KL_LANES + lane;\n");
  fprintf(f, "  const int64_t batch = blockIdx.x / %lldLL, q0 = (blockIdx.x %% %lldLL) * %lldLL;\n",
          (ll)qtiles, (ll)qtiles, (ll)t->bq);
  fprintf(f, "  int64_t oq = %lldLL, ok = %lldLL, ov = %lldLL, oo = %lldLL;\n", (ll)t->q->offset,
          (ll)t->k->offset, (ll)t->v->offset, (ll)t->out->offset);
  /* each batch dim's offsets (none when the scores have no batch) */
  if (batches > 1) fprintf(f, "  {\n    int64_t rest = batch;\n");
  for (int bd = nb - 1; bd >= 0 && batches > 1; bd--) {
    if (S->dims[bd] == 1) continue;
    fprintf(f, "    { const int64_t b = rest %% %lldLL; rest /= %lldLL;", (ll)S->dims[bd], (ll)S->dims[bd]);
    const int64_t *st[4] = {sq, sk, sv, so};
    const char *names[4] = {"oq", "ok", "ov", "oo"};
    for (int w = 0; w < 4; w++)
      if (st[w][bd]) fprintf(f, " %s += b * %lldLL;", names[w], (ll)st[w][bd]);
    fprintf(f, " }\n");
  }
  if (batches > 1) fprintf(f, "  }\n");
}

/* Inside the row loop of the second pass: pvv[u], the probabilities as
 * the softmax kernel writes them (from the row's max and sum), through
 * the post chain. */
static void tile_probabilities(const tiled *t) {
  typedef long long ll;
  FILE *f = t->f;
  const kl_attention *a = t->a;
  const kl_value *p = a->softmax->outputs[0], *pl = a->pv->inputs[0];
  char buf[256];
  fprintf(f, "      %s pvv[KL_VLANES];\n      for (int u = 0; u < KL_VLANES; u++) {\n"
             "      const int64_t j = k0 + lane + KL_LANES * u;\n      pvv[u] = 0;\n"
             "      if (iq < %lldLL && j < %lldLL) {\n", t->acc2, (ll)t->tq, (ll)t->tk);
  fprintf(f, "        const int64_t i = (batch * %lldLL + iq) * %lldLL + j;\n        (void)i;\n", (ll)t->tq, (ll)t->tk);
  fprintf(f, "        const %s v = xv[u], m = rm[rr], sum = rl[rr];\n        %s sp; ", t->ct, kl_cg_storage(p->dtype));
  kl_cg_store(f, p->dtype, "sp", kl_cg_softmax_value(a->softmax, !strcmp(t->ct, "double")));
  fprintf(f, "        const %s v%d = %s;\n", kl_cg_compute_type(p->dtype), p->id,
          kl_cg_load(buf, sizeof buf, p->dtype, kl_cg_compute_type(p->dtype), "sp"));
  load_chain_inputs(f, a->post, a->npost, t->io, t->nextra, &a->qk->outputs[0]->shape);
  kl_cg_fused_members(f, a->post, a->npost, t->io, "out%d[i]", "i", pl);
  fprintf(f, "        pvv[u] = (%s)v%d;\n      }\n      }\n", t->acc2, pl->id);
}

static kl_cg_grid tiled_kernel(FILE *f, const char *name, const kl_attention *a, const kl_view *q,
                               const kl_view *k, const kl_view *v, const kl_view *out,
                               const kl_group_io *io) {
  typedef long long ll;
  const kl_value *pl = a->pv->inputs[0], *y = a->pv->outputs[0];
  int r = a->qk->outputs[0]->shape.rank;
  tiled t = tile_init(f, a, q, k, v, out, io);
  t.R = kl_attention_rows_per_warp(t.d, t.dv, !strcmp(t.acc, "double") ? 8 : 4, !strcmp(t.acc2, "double") ? 8 : 4);
  t.bq = 4 * t.R, t.nc = (t.dv + 31) / 32;
  int64_t batches = t.batches, qtiles = (t.tq + t.bq - 1) / t.bq;
  bool one_pass = a->softmax->op == KL_OP_SOFTMAX && a->npost == 0 && (pl->dtype == KL_F32 || pl->dtype == KL_F64);
  char buf[256], ld[200], src[160];
  tile_header(&t, one_pass ? "one pass" : "two passes");
  kl_cg_fused_params(f, name, io);
  fprintf(f, "  KL_SHARED(%s, qs, [%lld]);\n  KL_SHARED(%s, ks, [%lld]);\n", t.acc, (ll)(t.bq * (t.d + 1)),
          t.acc, (ll)(33 * t.d));
  fprintf(f, "  KL_SHARED(%s, vs, [%lld]);\n  KL_SHARED(%s, ps, [%lld]);\n", t.acc2, (ll)(32 * t.dv), t.acc2,
          (ll)(t.bq * 33));
  /* the host device runs a warp as its lane 0 alone, over 32 virtual
   * lanes (kiln_prelude.h's KL_LANES); the other threads leave, and
   * count as arrived at every barrier */
  fprintf(f, "#define NCV ((%lld + KL_LANES - 1) / KL_LANES)\n", (ll)t.dv);
  tile_origin(&t);
  int kq = io->nin - 3, qr = q->shape.rank;
  /* Q's tile, coalesced along the head */
  fprintf(f, "  for (int t = tid; t < %lld; t += 4 * KL_LANES) {\n"
             "    const int rr = t / %lld, e = t %% %lld;\n    const int64_t iq = q0 + rr;\n",
          (ll)(t.bq * t.d), (ll)t.d, (ll)t.d);
  snprintf(src, sizeof src, "in%d[oq + iq * %lldLL + e * %lldLL]", kq, (ll)q->strides[qr - 2], (ll)q->strides[qr - 1]);
  fprintf(f, "    qs[rr * %lld + e] = iq < %lldLL ? %s : (%s)0;\n  }\n", (ll)(t.d + 1), (ll)t.tq,
          kl_cg_load(ld, sizeof ld, q->base->dtype, t.acc, src), t.acc);
  fprintf(f, "  %s rm[%d], rl[%d];\n  %s o[%d][NCV];\n", t.ct, t.R, t.R, t.acc2, t.R);
  fprintf(f, "  for (int rr = 0; rr < %d; rr++) {\n    rm[rr] = -KL_INF;\n    rl[rr] = 0;\n"
             "    for (int c = 0; c < NCV; c++) o[rr][c] = 0;\n  }\n", t.R);
  if (one_pass) {
    fprintf(f, "  for (int64_t k0 = 0; k0 < %lldLL; k0 += 32) {\n", (ll)t.tk);
    tile_loads(&t, true);
    tile_scores(&t);
    online_softmax(&t, true);
    snprintf(buf, sizeof buf, "(%s)pj[u]", t.acc2);
    tile_product(&t, buf);
    fprintf(f, "  }\n");
  } else {
    /* 1: each row's max and sum */
    fprintf(f, "  for (int64_t k0 = 0; k0 < %lldLL; k0 += 32) {\n", (ll)t.tk);
    tile_loads(&t, false);
    tile_scores(&t);
    online_softmax(&t, false);
    fprintf(f, "    }\n  }\n");
    /* 2: the probabilities as the softmax kernel writes them, the post
     * chain, the product */
    fprintf(f, "  for (int64_t k0 = 0; k0 < %lldLL; k0 += 32) {\n", (ll)t.tk);
    tile_loads(&t, true);
    tile_scores(&t);
    tile_probabilities(&t);
    tile_product(&t, "pvv[u]");
    fprintf(f, "  }\n");
  }
  /* the rows out (divided by their sums after one pass) */
  fprintf(f, "  for (int rr = 0; rr < %d; rr++) {\n    const int64_t iq = q0 + warp * %d + rr;\n"
             "    if (iq >= %lldLL) continue;\n    for (int c = 0; c < NCV; c++) {\n      const int e = lane + KL_LANES * c;\n"
             "      if (e >= %lld) continue;\n      const %s val = o[rr][c]%s;\n      %s so; ",
          t.R, t.R, (ll)t.tq, (ll)t.dv, t.acc2, one_pass ? " / rl[rr]" : "", kl_cg_storage(y->dtype));
  kl_cg_store(f, y->dtype, "so", "val");
  fprintf(f, "      out0[oo + iq * %lldLL + e * %lldLL] = so;\n    }\n  }\n}\n#undef NCV\n", (ll)out->strides[r - 2],
          (ll)out->strides[r - 1]);
  kl_cg_fused_entry(f, name, io);
  kl_cg_grid g = {batches * qtiles, 128};
  return g;
}

/* ---- the tiled kernel on tensor cores (f16 and bf16) ----------------------
 * Q, K and V in halves: the two products are warp matrix multiply-adds
 * (kiln_prelude.h's kl_mma_*: the mma.m16n8k16 instruction, f32 sums).
 * A warp owns 16 query rows, a block W warps; per tile of 32 keys:
 *   1. the scores S = Q K^T, 16 x 32 a warp (four 16 x 8 products per 16
 *      head elements), into shared memory as f32;
 *   2. each row through the pre chain and softmax as in the scalar tiled
 *      kernel (lane j: key k0 + j): the first pass the max and sum, the
 *      second the probabilities as the softmax kernel stores them, through
 *      the post chain, in their half type into shared memory;
 *   3. (second pass) O += P V, 16 x dv a warp, in registers.
 * Q, K and V tiles sit in shared memory in halves, rows padded by 8 (a
 * row's 32-bit pairs then fall in distinct banks); K as loaded (key-major
 * is the column-major B of Q K^T), V transposed (B of P V).  The halves
 * always take two passes (their probabilities are stored in a half type),
 * so O needs no rescaling. */
/* Warps a block of the tensor-core kernel, 0 where it does not apply:
 * Q, K, V and the probabilities in one half type, heads up to 128 (the
 * scalar tiled kernel's bound), the target's tensor_cores on; 4 warps
 * where the tiles fit in 48 KB of shared memory, else 2. */
static int mma_warps(const kl_attention *a, const kl_view *q, const kl_view *k, const kl_view *v) {
  kl_dtype h = v->base->dtype;
  if ((h != KL_F16 && h != KL_BF16) || q->base->dtype != h || k->base->dtype != h ||
      a->pv->inputs[0]->dtype != h || !kl_cg_plan_target || !kl_cg_plan_target->tensor_cores)
    return 0;
  int64_t d = q->shape.dims[q->shape.rank - 1], dv = v->shape.dims[v->shape.rank - 1];
  if (d > 128 || dv > 128) return 0;
  int64_t ldq = (d + 15) / 16 * 16 + 8, dv8 = (dv + 7) / 8 * 8;
  for (int w = 4; w >= 2; w /= 2)
    if ((16 * w * ldq + 32 * ldq + dv8 * 40 + 16 * w * 40) * 2 + 16 * w * 36 * 4 <= 48 * 1024) return w;
  return 0;
}

static kl_cg_grid mma_kernel(FILE *f, const char *name, const kl_attention *a, const kl_view *q,
                             const kl_view *k, const kl_view *v, const kl_view *out, const kl_group_io *io,
                             int warps) {
  typedef long long ll;
  const kl_value *y = a->pv->outputs[0];
  int r = a->qk->outputs[0]->shape.rank;
  tiled t = tile_init(f, a, q, k, v, out, io);
  t.R = 16, t.bq = 16 * warps;
  const char *sx = v->base->dtype == KL_BF16 ? "bf16" : "f16"; /* Q, K, V and P alike (mma_warps) */
  int64_t d16 = (t.d + 15) / 16 * 16, ldq = d16 + 8, dv8 = (t.dv + 7) / 8 * 8, ntv = dv8 / 8;
  int64_t qtiles = (t.tq + t.bq - 1) / t.bq;
  char src[160], dst[160];
  tile_header(&t, "two passes, products on tensor cores");
  kl_cg_fused_params(f, name, io);
  /* halves staged as kiln_prelude.h's kl_mma_stage: their bits on a GPU,
   * floats on the host device (widened once a block, not once a warp) */
  fprintf(f, "  KL_SHARED(kl_mma_stage, qs, [%lld]);\n  KL_SHARED(kl_mma_stage, ks, [%lld]);\n"
             "  KL_SHARED(kl_mma_stage, vt, [%lld]);\n",
          (ll)(t.bq * ldq), (ll)(32 * ldq), (ll)(dv8 * 40));
  fprintf(f, "  KL_SHARED(float, ss, [%lld]);\n  KL_SHARED(kl_mma_stage, ps, [%lld]);\n", (ll)(t.bq * 36),
          (ll)(t.bq * 40));
  tile_origin(&t);
  int kq = io->nin - 3, kk = io->nin - 2, kv = io->nin - 1;
  int qr = q->shape.rank, kr = k->shape.rank, vr = v->shape.rank;
  /* a half tile of rows x cols from global memory (coalesced along cols),
   * zero outside [rows_in, cols_in): dst indexed by (rr, e) */
  #define HALF_TILE(rows, cols, row0, rows_in, cols_in, src_expr, dst_expr)                                  \
    do {                                                                                                     \
      fprintf(f, "  for (int t = tid; t < %lld; t += %d * KL_LANES) {\n"                                     \
                 "    const int rr = t / %lld, e = t %% %lld;\n    const int64_t at = %s + rr;\n",             \
              (ll)((rows) * (cols)), warps, (ll)(cols), (ll)(cols), row0);                                    \
      fprintf(f, "    %s = at < %lldLL && e < %lld ? kl_mma_stage_%s(%s) : kl_mma_stage_zero;\n  }\n",          \
              dst_expr, (ll)(rows_in), (ll)(cols_in), sx, src_expr);                                         \
    } while (0)
  /* Q's tile, once */
  snprintf(src, sizeof src, "in%d[oq + at * %lldLL + e * %lldLL]", kq, (ll)q->strides[qr - 2], (ll)q->strides[qr - 1]);
  snprintf(dst, sizeof dst, "qs[rr * %lld + e]", (ll)ldq);
  HALF_TILE(t.bq, d16, "q0", t.tq, t.d, src, dst);
  fprintf(f, "  %s rm[16], rl[16];\n  kl_mma_c oacc[%lld];\n", t.ct, (ll)ntv);
  fprintf(f, "  for (int rr = 0; rr < 16; rr++) rm[rr] = -KL_INF, rl[rr] = 0;\n"
             "  for (int c = 0; c < %lld; c++) kl_mma_zero(&oacc[c]);\n", (ll)ntv);
  for (int pass = 1; pass <= 2; pass++) {
    fprintf(f, "  /* pass %d: %s */\n  for (int64_t k0 = 0; k0 < %lldLL; k0 += 32) {\n  __syncthreads();\n", pass,
            pass == 1 ? "each row's max and sum" : "the probabilities, the product", (ll)t.tk);
    snprintf(src, sizeof src, "in%d[ok + at * %lldLL + e * %lldLL]", kk, (ll)k->strides[kr - 1], (ll)k->strides[kr - 2]);
    snprintf(dst, sizeof dst, "ks[rr * %lld + e]", (ll)ldq);
    HALF_TILE(32, d16, "k0", t.tk, t.d, src, dst);
    if (pass == 2) {
      snprintf(src, sizeof src, "in%d[ov + at * %lldLL + e * %lldLL]", kv, (ll)v->strides[vr - 2], (ll)v->strides[vr - 1]);
      HALF_TILE(32, dv8, "k0", t.tk, t.dv, src, "vt[e * 40 + rr]");
    }
    fprintf(f, "  __syncthreads();\n");
    /* 1. the warp's 16 x 32 scores */
    fprintf(f, "    {\n      kl_mma_c sacc[4];\n      KL_UNROLL for (int nt = 0; nt < 4; nt++) kl_mma_zero(&sacc[nt]);\n"
               "      for (int e0 = 0; e0 < %lld; e0 += 16) {\n        kl_mma_a fa;\n"
               "        kl_mma_load_a_%s(&fa, qs + warp * %lld + e0, %lld, lane);\n"
               "        KL_UNROLL for (int nt = 0; nt < 4; nt++) {\n          kl_mma_b fb;\n"
               "          kl_mma_load_b_%s(&fb, ks + nt * %lld + e0, %lld, lane);\n"
               "          kl_mma_%s(&sacc[nt], &fa, &fb);\n        }\n      }\n",
            (ll)d16, sx, (ll)(16 * ldq), (ll)ldq, sx, (ll)(8 * ldq), (ll)ldq, sx);
    fprintf(f, "      KL_UNROLL for (int nt = 0; nt < 4; nt++)\n        for (int c = 0; c < KL_MMA_C; c++)\n"
               "          ss[(warp * 16 + kl_mma_row(lane, c)) * 36 + nt * 8 + kl_mma_col(lane, c)] = sacc[nt].c[c];\n"
               "    }\n    __syncwarp(0xffffffffu);\n");
    /* 2. the rows */
    tile_rows(&t, "ss[(warp * 16 + rr) * 36 + lane + KL_LANES * u]");
    if (pass == 1) {
      online_softmax(&t, false);
      fprintf(f, "    }\n  }\n");
      continue;
    }
    tile_probabilities(&t);
    fprintf(f, "      for (int u = 0; u < KL_VLANES; u++) {\n");
    fprintf(f, "        ps[(warp * 16 + rr) * 40 + lane + KL_LANES * u] = kl_mma_stage_round_%s(pvv[u]);\n", sx);
    fprintf(f, "      }\n    }\n    __syncwarp(0xffffffffu);\n");
    /* 3. O += P V */
    fprintf(f, "    {\n      kl_mma_a pa[2];\n      kl_mma_load_a_%s(&pa[0], ps + warp * 640, 40, lane);\n"
               "      kl_mma_load_a_%s(&pa[1], ps + warp * 640 + 16, 40, lane);\n"
               "      KL_UNROLL for (int c = 0; c < %lld; c++) {\n        kl_mma_b fb;\n"
               "        kl_mma_load_b_%s(&fb, vt + c * 320, 40, lane);\n        kl_mma_%s(&oacc[c], &pa[0], &fb);\n"
               "        kl_mma_load_b_%s(&fb, vt + c * 320 + 16, 40, lane);\n        kl_mma_%s(&oacc[c], &pa[1], &fb);\n"
               "      }\n    }\n    __syncwarp(0xffffffffu);\n  }\n",
            sx, sx, (ll)ntv, sx, sx, sx, sx);
  }
  #undef HALF_TILE
  /* the warp's rows out */
  fprintf(f, "  KL_UNROLL for (int c = 0; c < %lld; c++)\n    for (int i = 0; i < KL_MMA_C; i++) {\n"
             "      const int64_t iq = q0 + warp * 16 + kl_mma_row(lane, i);\n"
             "      const int e = c * 8 + kl_mma_col(lane, i);\n      if (iq >= %lldLL || e >= %lld) continue;\n"
             "      %s so; ",
          (ll)ntv, (ll)t.tq, (ll)t.dv, kl_cg_storage(y->dtype));
  kl_cg_store(f, y->dtype, "so", "oacc[c].c[i]");
  fprintf(f, "      out0[oo + iq * %lldLL + e * %lldLL] = so;\n    }\n}\n", (ll)out->strides[r - 2],
          (ll)out->strides[r - 1]);
  kl_cg_fused_entry(f, name, io);
  kl_cg_grid g = {t.batches * qtiles, 32 * warps};
  return g;
}

kl_cg_grid kl_cg_attention_kernel(FILE *f, const char *name, const kl_attention *a,
                                  const kl_view *q, const kl_view *k, const kl_view *v,
                                  const kl_view *out, const kl_group_io *io) {
  typedef long long ll;
  if (a->tiled) {
    int warps = mma_warps(a, q, k, v);
    if (warps) return mma_kernel(f, name, a, q, k, v, out, io, warps);
    return tiled_kernel(f, name, a, q, k, v, out, io);
  }
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
  plan.device_lanes = false; /* its loops are over 32 lanes */
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
