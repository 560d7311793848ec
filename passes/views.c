/* views.c - values read through strides instead of copies.
 *
 * A transpose, a split or a reshape moves no arithmetic, only bytes.  When
 * what reads the result is a GEMM, the copy is not needed: cuBLAS and BLAS
 * take a matrix at any offset, row stride (the leading dimension) and
 * transposition, and a batch of them at a fixed stride (two levels here,
 * see krt_gemm_desc).  So the movement ops become views -- a base value, an
 * offset and a stride per dim -- and the matmul reads the base directly.  A
 * transpose of a matmul's result is the same in reverse: the GEMM writes
 * its rows straight into the transposed places.  This turns the head split
 * of attention (split -> reshape -> transpose -> matmul, and matmul ->
 * transpose -> reshape after it) into no kernels at all. */
#include <string.h>

#include "passes.h"

void kl_view_identity(const kl_value *v, kl_view *out) {
  memset(out, 0, sizeof *out);
  out->base = v;
  out->shape = v->shape;
  kl_shape_strides(&v->shape, out->strides);
}

bool kl_view_op(const kl_node *n) {
  switch (n->op) {
  case KL_OP_TRANSPOSE:
  case KL_OP_SPLIT:
  case KL_OP_RESHAPE:
  case KL_OP_FLATTEN:
  case KL_OP_SQUEEZE:
  case KL_OP_UNSQUEEZE: return true;
  default: return false;
  }
}

/* NumPy's rule for reshaping without a copy: each run of old dims that
 * multiplies out to a run of new dims must be contiguous within itself. */
static bool reshape_view(const kl_view *in, const kl_shape *to, kl_view *out) {
  int64_t od[KL_MAX_RANK], os[KL_MAX_RANK], nd[KL_MAX_RANK], ns[KL_MAX_RANK];
  int on = 0, nn = 0;
  for (int d = 0; d < in->shape.rank; d++)
    if (in->shape.dims[d] != 1) od[on] = in->shape.dims[d], os[on++] = in->strides[d];
  for (int d = 0; d < to->rank; d++)
    if (to->dims[d] != 1) nd[nn++] = to->dims[d];
  int oi = 0, ni = 0;
  while (oi < on && ni < nn) {
    int oj = oi + 1, nj = ni + 1;
    int64_t op = od[oi], np = nd[ni];
    while (op != np) {
      if (np < op) {
        if (nj == nn) return false;
        np *= nd[nj++];
      } else {
        if (oj == on) return false;
        op *= od[oj++];
      }
    }
    for (int k = oi; k + 1 < oj; k++)
      if (os[k] != od[k + 1] * os[k + 1]) return false;
    ns[nj - 1] = os[oj - 1];
    for (int k = nj - 1; k > ni; k--) ns[k - 1] = ns[k] * nd[k];
    oi = oj, ni = nj;
  }
  if (oi != on || ni != nn) return false;
  *out = *in;
  out->shape = *to;
  for (int d = 0, k = 0; d < to->rank; d++)
    out->strides[d] = to->dims[d] == 1 ? 0 : ns[k++];
  return true;
}

bool kl_view_apply(const kl_node *n, int out_index, const kl_view *in, kl_view *out) {
  const kl_shape *os = &n->outputs[out_index]->shape;
  if (kl_dtype_size(n->inputs[0]->dtype) != kl_dtype_size(n->outputs[out_index]->dtype))
    return false;
  switch (n->op) {
  case KL_OP_TRANSPOSE: {
    const int64_t *perm;
    int r = in->shape.rank;
    int np = kl_attr_ints(n, "perm", &perm);
    *out = *in;
    out->shape = *os;
    for (int i = 0; i < r; i++) {
      int64_t p = np == r ? perm[i] : r - 1 - i; /* no perm: reverse */
      if (p < 0) p += r;
      if (p < 0 || p >= r) return false;
      out->strides[i] = in->strides[p];
    }
    return true;
  }
  case KL_OP_SPLIT: {
    int r = in->shape.rank;
    int64_t axis = kl_attr_int(n, "axis", 0), at = 0;
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return false;
    for (int k = 0; k < out_index; k++) at += n->outputs[k]->shape.dims[axis];
    *out = *in;
    out->shape = *os;
    out->offset += at * in->strides[axis];
    return true;
  }
  default: return reshape_view(in, os, out);
  }
}

/* ---- a matmul as a strided GEMM ---------------------------------------- */
/* One matrix of a view (its last two dims, rows x cols) as BLAS sees it:
 * row-major with leading dimension ld, or the transpose of one.  Dims of 1
 * have no meaningful stride and take the smallest legal ld. */
static bool matrix(const kl_view *v, int *trans, int64_t *ld, bool may_transpose) {
  int r = v->shape.rank;
  int64_t rows = v->shape.dims[r - 2], cols = v->shape.dims[r - 1];
  int64_t rs = v->strides[r - 2], cs = v->strides[r - 1];
  if (cols == 1 || cs == 1) {
    *trans = 0;
    *ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
    return *ld >= (cols > 1 ? cols : 1);
  }
  if (may_transpose && (rows == 1 || rs == 1)) {
    *trans = 1;
    *ld = cols == 1 ? (rows > 1 ? rows : 1) : cs;
    return *ld >= (rows > 1 ? rows : 1);
  }
  return false;
}

/* Batch dims [from, to) of the output, with the three operands' strides,
 * as one stride each: consecutive dims must nest (stride = next dim times
 * next stride); dims of 1 drop out.  *count gets their product. */
static bool merge_batch(const int64_t *dims, const int64_t st[3][KL_MAX_RANK], int from, int to,
                        int64_t *count, int64_t stride[3]) {
  int last = -1;
  *count = 1;
  stride[0] = stride[1] = stride[2] = 0;
  for (int d = from; d < to; d++) {
    if (dims[d] == 1) continue;
    if (last >= 0)
      for (int o = 0; o < 3; o++)
        if (st[o][last] != dims[d] * st[o][d]) return false;
    last = d;
    *count *= dims[d];
  }
  if (last >= 0)
    for (int o = 0; o < 3; o++) stride[o] = st[o][last];
  return true;
}

bool kl_matmul_layout(const kl_view *a, const kl_view *b, const kl_view *c,
                         kl_mm_layout *L) {
  const kl_shape *as = &a->shape, *bs = &b->shape, *cs = &c->shape;
  if (as->rank < 2 || bs->rank < 2 || cs->rank < 2) return false;
  memset(L, 0, sizeof *L);
  L->m = as->dims[as->rank - 2];
  L->k = as->dims[as->rank - 1];
  L->n = bs->dims[bs->rank - 1];
  if (!matrix(a, &L->trans_a, &L->lda, true) || !matrix(b, &L->trans_b, &L->ldb, true) ||
      !matrix(c, &(int){0}, &L->ldc, false))
    return false;
  /* every output batch dim, with each operand's stride along it (0 where
   * the operand broadcasts) */
  int nb = cs->rank - 2;
  int64_t st[3][KL_MAX_RANK];
  const kl_view *ops[3] = {a, b, c};
  for (int o = 0; o < 3; o++) {
    const kl_view *v = ops[o];
    int vb = v->shape.rank - 2;
    if (vb > nb) return false;
    for (int d = 0; d < nb; d++) {
      int vd = d - (nb - vb);
      st[o][d] = vd < 0 || v->shape.dims[vd] == 1 ? 0 : v->strides[vd];
      if (vd >= 0 && v->shape.dims[vd] != 1 && v->shape.dims[vd] != cs->dims[d]) return false;
    }
  }
  /* one level if the batch dims nest, else the first split into two, the
   * smaller count outside (a GPU makes one cuBLAS call per outer item) */
  for (int split = 0; split <= nb; split++) {
    int64_t s2[3], s1[3];
    if (!merge_batch(cs->dims, st, 0, split, &L->batch2, s2) ||
        !merge_batch(cs->dims, st, split, nb, &L->batch, s1))
      continue;
    if (L->batch2 > L->batch) { /* the fewer calls outside: the groups are independent */
      int64_t t = L->batch;
      L->batch = L->batch2, L->batch2 = t;
      for (int o = 0; o < 3; o++) t = s1[o], s1[o] = s2[o], s2[o] = t;
    }
    L->stride_a = s1[0], L->stride_b = s1[1], L->stride_c = s1[2];
    L->stride_a2 = s2[0], L->stride_b2 = s2[1], L->stride_c2 = s2[2];
    /* GEMMs write C's batch items concurrently: they must not share one */
    if ((L->batch > 1 && !L->stride_c) || (L->batch2 > 1 && !L->stride_c2)) return false;
    L->offset_a = a->offset, L->offset_b = b->offset, L->offset_c = c->offset;
    return true;
  }
  return false;
}
