/* templates_integer.c - kernel templates for the integer contractions that
 * the runtime's GEMM (cuBLAS, OpenBLAS) has no routine for (see
 * codegen_impl.h for the template interface): matmul of integer tensors.
 *
 * Sums wrap modulo 2^64 and the result wraps to the output type, as the
 * elementwise integer ops do.  The interpreter (kl_eval_MATMUL) sums in
 * double, then wraps to the type: the same result whenever its sums are
 * exact, that is below 2^53 (8-bit and 16-bit operands at any size the IR
 * holds, which is what MatMulInteger lowers to). */
#include "codegen_impl.h"

typedef long long ll;

static bool handles_int_matmul(const kl_node *n) {
  return n->op == KL_OP_MATMUL && kl_dtype_is_int(n->outputs[0]->dtype);
}

/* The operands as batch x [m, k] @ [k, n] after NumPy's promotion of 1-D
 * operands, with the batch dims of each right-aligned to the output's. */
typedef struct {
  int64_t m, k, n;
  kl_shape abatch, bbatch, obatch;
} mm_dims;

static void split(const kl_shape *a, const kl_shape *b, const kl_shape *o, mm_dims *d) {
  d->k = a->dims[a->rank - 1];
  d->m = a->rank >= 2 ? a->dims[a->rank - 2] : 1;
  d->n = b->rank >= 2 ? b->dims[b->rank - 1] : 1;
  d->abatch.rank = a->rank >= 2 ? a->rank - 2 : 0;
  d->bbatch.rank = b->rank >= 2 ? b->rank - 2 : 0;
  for (int i = 0; i < d->abatch.rank; i++) d->abatch.dims[i] = a->dims[i];
  for (int i = 0; i < d->bbatch.rank; i++) d->bbatch.dims[i] = b->dims[i];
  /* the output's batch dims: all but its matrix dims (fewer for vectors) */
  d->obatch.rank = o->rank - (a->rank >= 2) - (b->rank >= 2);
  for (int i = 0; i < d->obatch.rank; i++) d->obatch.dims[i] = o->dims[i];
}

/* Stride (in elements) of an operand with batch dims s and matrices of
 * `mat` elements along output batch dim od, 0 where it broadcasts. */
static int64_t batch_stride(const kl_shape *s, const kl_shape *ob, int od, int64_t mat) {
  int sd = od - (ob->rank - s->rank);
  if (sd < 0 || s->dims[sd] == 1) return 0;
  int64_t st = mat;
  for (int e = sd + 1; e < s->rank; e++) st *= s->dims[e];
  return st;
}

/* Statements setting oa and ob, the offsets of the batch's matrices in a
 * and b, from r, the flat batch index (only the dims that move either). */
static void batch_offsets(FILE *f, const mm_dims *d) {
  int64_t sa[KL_MAX_RANK], sb[KL_MAX_RANK];
  int outermost = d->obatch.rank;
  for (int od = d->obatch.rank - 1; od >= 0; od--) {
    sa[od] = batch_stride(&d->abatch, &d->obatch, od, d->m * d->k);
    sb[od] = batch_stride(&d->bbatch, &d->obatch, od, d->k * d->n);
    if (sa[od] || sb[od]) outermost = od;
  }
  if (outermost == d->obatch.rank) {
    fprintf(f, "    const int64_t oa = 0, ob = 0;\n");
    return;
  }
  fprintf(f, "    int64_t r = i / %lldLL, oa = 0, ob = 0;\n", (ll)(d->m * d->n));
  for (int od = d->obatch.rank - 1; od >= outermost; od--) {
    ll dim = (ll)d->obatch.dims[od];
    if (!sa[od] && !sb[od]) {
      fprintf(f, "    r /= %lldLL;\n", dim);
      continue;
    }
    fprintf(f, "    { const int64_t q = r %% %lldLL;", dim);
    if (od > outermost) fprintf(f, " r /= %lldLL;", dim);
    if (sa[od]) fprintf(f, " oa += q * %lldLL;", (ll)sa[od]);
    if (sb[od]) fprintf(f, " ob += q * %lldLL;", (ll)sb[od]);
    fprintf(f, " }\n");
  }
}

/* One thread per output element: a dot product of a row of a and a
 * column of b, in uint64_t so that overflow wraps instead of being
 * undefined. */
static void write_kernel(FILE *f, const char *name, const kl_node *n, const mm_dims *d) {
  const char *ta = kl_cg_storage(n->inputs[0]->dtype), *tb = kl_cg_storage(n->inputs[1]->dtype);
  const kl_value *y = n->outputs[0];
  fprintf(f, "KL_KERNEL void %s(const %s *__restrict__ a, const %s *__restrict__ b, "
             "%s *__restrict__ out) {\n", name, ta, tb, kl_cg_storage(y->dtype));
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n", (ll)kl_shape_numel(&y->shape));
  batch_offsets(f, d);
  fprintf(f, "    const %s *const row = a + oa + (i / %lldLL %% %lldLL) * %lldLL;\n", ta, (ll)d->n,
          (ll)d->m, (ll)d->k);
  fprintf(f, "    const %s *const col = b + ob + i %% %lldLL;\n", tb, (ll)d->n);
  fprintf(f, "    uint64_t acc = 0;\n"
             "    for (int64_t p = 0; p < %lldLL; p++)\n"
             "      acc += (uint64_t)row[p] * (uint64_t)col[p * %lldLL];\n"
             "    ", (ll)d->k, (ll)d->n);
  kl_cg_store(f, y->dtype, "out[i]", "acc");
  fprintf(f, "  }\n}\nKL_EMU_ENTRY(%s, KL_ARG(const %s *, 0), KL_ARG(const %s *, 1), "
             "KL_ARG(%s *, 2));\n\n", name, ta, tb, kl_cg_storage(y->dtype));
}

static int emit_int_matmul(kl_cg_emitter *e, const kl_node *n) {
  kl_cg_comment(e, n);
  int64_t threads = kl_shape_numel(&n->outputs[0]->shape);
  if (threads == 0) return 0; /* no kernel: its index math would divide by 0 */
  mm_dims d;
  split(&n->inputs[0]->shape, &n->inputs[1]->shape, &n->outputs[0]->shape, &d);
  char name[32];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  write_kernel(kl_cg_kernels(e), name, n, &d);
  kl_cg_launch_node(e, k, threads, n);
  return 0;
}

const kl_cg_template kl_cg_templates_integer[] = {
    {handles_int_matmul, emit_int_matmul, NULL},
    {NULL, NULL, NULL},
};
