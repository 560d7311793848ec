/* templates_basic.c - templates for the ops every model has: elementwise
 * ops, renumbering copies (reshape & co, expand, transpose), reductions,
 * softmax, and the contractions that are runtime GEMMs. */
#include <string.h>

#include "codegen_impl.h"

static bool is_copy_op(kl_op op) {
  return op == KL_OP_RESHAPE || op == KL_OP_FLATTEN || op == KL_OP_SQUEEZE ||
         op == KL_OP_UNSQUEEZE || op == KL_OP_EXPAND || op == KL_OP_TRANSPOSE;
}

static bool is_reduce_op(kl_op op) {
  return op == KL_OP_REDUCE_SUM || op == KL_OP_REDUCE_MEAN || op == KL_OP_REDUCE_MAX ||
         op == KL_OP_REDUCE_MIN || op == KL_OP_REDUCE_PROD;
}

/* matmul operands as batch x [m, k] @ [k, n]: 1-D operands promoted, and
 * each operand's batch either full or broadcast whole (stride 0). */
typedef struct {
  int64_t m, n, k, batch, stride_a, stride_b;
} mm_plan;

static int plan_matmul(const kl_node *nd, mm_plan *p) {
  const kl_shape *a = &nd->inputs[0]->shape, *b = &nd->inputs[1]->shape, *o = &nd->outputs[0]->shape;
  p->k = a->dims[a->rank - 1];
  p->m = a->rank >= 2 ? a->dims[a->rank - 2] : 1;
  p->n = b->rank >= 2 ? b->dims[b->rank - 1] : 1;
  int64_t ab = 1, bb = 1;
  for (int d = 0; d < a->rank - 2; d++) ab *= a->dims[d];
  for (int d = 0; d < b->rank - 2; d++) bb *= b->dims[d];
  p->batch = 1;
  for (int d = 0; d < o->rank - (a->rank >= 2 && b->rank >= 2 ? 2 : 1); d++) p->batch *= o->dims[d];
  if (a->rank == 1 || b->rank == 1) p->batch = ab * bb; /* one of them is 1 */
  if ((ab != 1 && ab != p->batch) || (bb != 1 && bb != p->batch)) return -1;
  p->stride_a = ab == 1 ? 0 : p->m * p->k;
  p->stride_b = bb == 1 ? 0 : p->k * p->n;
  return 0;
}

/* ---- elementwise, copies, reductions, softmax ------------------------ */
static bool handles_elementwise(const kl_node *n) { return kl_cg_is_elementwise(n); }
static bool handles_copy(const kl_node *n) { return is_copy_op(n->op); }
static bool handles_reduce(const kl_node *n) { return is_reduce_op(n->op); }
static bool handles_softmax(const kl_node *n) {
  return n->op == KL_OP_SOFTMAX || n->op == KL_OP_LOG_SOFTMAX;
}

/* One kernel: a grid-stride one over the output's elements, or one that
 * chose its own grid (row and column reductions, tiled transposes). */
static int emit_simple(kl_cg_emitter *e, const kl_node *n) {
  char name[32];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *kf = kl_cg_kernels(e);
  int64_t threads = kl_shape_numel(&n->outputs[0]->shape);
  kl_cg_grid grid = {0, 0}; /* no threads: grid-stride */
  if (kl_cg_is_elementwise(n)) kl_cg_elementwise(kf, name, n);
  else if (n->op == KL_OP_TRANSPOSE) grid = kl_cg_transpose(kf, name, n);
  else if (is_copy_op(n->op)) kl_cg_gather_copy(kf, name, n);
  else if (is_reduce_op(n->op)) grid = kl_cg_reduce(kf, name, n);
  else grid = kl_cg_softmax(kf, name, n);
  char shape[160];
  fprintf(kl_cg_host(e), "  /* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name,
          kl_dtype_name(n->outputs[0]->dtype), kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape));
  if (grid.threads) {
    kl_cg_launch_node_grid(e, k, grid.blocks, grid.threads, n);
    return 0;
  }
  if (!kl_traps_zero_divisor(n)) {
    kl_cg_launch_node(e, k, threads, n);
    return 0;
  }
  char bufs[4][160], flag[160];
  const char *args[4];
  for (int i = 0; i < 2; i++) args[i] = kl_cg_ptr(e, n->inputs[i], bufs[i], sizeof bufs[i]);
  args[2] = kl_cg_ptr(e, n->outputs[0], bufs[2], sizeof bufs[2]);
  int flag_no = kl_cg_flag(e, flag, sizeof flag);
  args[3] = flag;
  kl_cg_launch(e, k, threads, args, 4);
  kl_cg_flag_raised(e, flag_no, n,
                    n->op == KL_OP_POW ? "zero raised to a negative power"
                    : n->op == KL_OP_DIV ? "integer division by zero" : "integer modulo by zero");
  return 0;
}

/* ---- contractions ------------------------------------------------------ */
static bool handles_gemm(const kl_node *n) {
  mm_plan p;
  if (n->op != KL_OP_MATMUL && n->op != KL_OP_GEMM) return false;
  if (!kl_dtype_is_float(n->outputs[0]->dtype)) return false; /* integer GEMM: not yet */
  if (n->op == KL_OP_GEMM || plan_matmul(n, &p) == 0) return true;
  /* operands of rank >= 2 broadcasting dim by dim: strided batches */
  kl_view a, b, c;
  kl_mm_layout L;
  kl_view_identity(n->inputs[0], &a);
  kl_view_identity(n->inputs[1], &b);
  kl_view_identity(n->outputs[0], &c);
  return kl_matmul_layout(&a, &b, &c, &L);
}

/* A matmul of operands of rank >= 2, read and written through views (a
 * head split, a transposed result) as one strided GEMM. */
static void matmul_from_views(kl_cg_emitter *e, const kl_node *n, kl_cg_gemm *g, char pa[160],
                              char pb[160], char pc[160]) {
  kl_view a, b, c;
  kl_mm_layout L;
  kl_cg_read_view(e, n->inputs[0], &a);
  kl_cg_read_view(e, n->inputs[1], &b);
  kl_cg_write_view(e, n, &c);
  kl_matmul_layout(&a, &b, &c, &L); /* chosen by emit_model.c only when it fits */
  g->a = kl_cg_view_ptr(e, &a, pa, 160);
  g->b = kl_cg_view_ptr(e, &b, pb, 160);
  g->c = kl_cg_view_ptr(e, &c, pc, 160);
  g->m = L.m, g->n = L.n, g->k = L.k, g->trans_a = L.trans_a, g->trans_b = L.trans_b;
  g->lda = L.lda, g->ldb = L.ldb, g->ldc = L.ldc;
  g->batch = L.batch, g->stride_a = L.stride_a, g->stride_b = L.stride_b, g->stride_c = L.stride_c;
  g->batch2 = L.batch2, g->stride_a2 = L.stride_a2, g->stride_b2 = L.stride_b2;
  g->stride_c2 = L.stride_c2;
}

static int emit_gemm(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
  char pa[160], pb[160], pc[160], pbias[160], shape[160];
  kl_cg_gemm g = {.dtype = out->dtype, .batch = 1, .alpha = 1};
  fprintf(kl_cg_host(e), "  /* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name,
          kl_dtype_name(out->dtype), kl_shape_str(&out->shape, shape, sizeof shape));
  if (n->op == KL_OP_MATMUL && a->shape.rank >= 2 && b->shape.rank >= 2) {
    char epi[2][160];
    matmul_from_views(e, n, &g, pa, pb, pc);
    kl_cg_gemm_epilogue(e, n, &g, epi);
    kl_cg_emit_gemm(e, &g);
    return 0;
  }
  g.a = kl_cg_ptr(e, a, pa, sizeof pa);
  g.b = kl_cg_ptr(e, b, pb, sizeof pb);
  g.c = kl_cg_ptr(e, out, pc, sizeof pc);
  if (n->op == KL_OP_MATMUL) {
    mm_plan p;
    plan_matmul(n, &p);
    g.m = p.m, g.n = p.n, g.k = p.k, g.batch = p.batch, g.stride_a = p.stride_a,
    g.stride_b = p.stride_b;
  } else {
    g.trans_a = (int)kl_attr_int(n, "trans_a", 0), g.trans_b = (int)kl_attr_int(n, "trans_b", 0);
    g.alpha = kl_attr_float(n, "alpha", 1);
    g.m = a->shape.dims[g.trans_a ? 1 : 0], g.k = a->shape.dims[g.trans_a ? 0 : 1];
    g.n = b->shape.dims[g.trans_b ? 0 : 1];
    const kl_value *cv = n->ninputs > 2 ? n->inputs[2] : NULL;
    double beta = kl_attr_float(n, "beta", 1);
    bool same = cv && cv->dtype == out->dtype;
    if (same && beta == 1 && kl_shape_numel(&cv->shape) == g.n && cv->shape.rank >= 1 &&
        cv->shape.dims[cv->shape.rank - 1] == g.n) {
      g.bias = kl_cg_ptr(e, cv, pbias, sizeof pbias); /* a row vector: the epilogue's bias */
    } else if (same && kl_shape_equal(&cv->shape, &out->shape)) {
      g.c_in = kl_cg_ptr(e, cv, pbias, sizeof pbias); /* read in place, scaled by beta */
      g.beta = beta;
    } else if (n->ninputs > 2) { /* C broadcast into the output first, then += beta * C */
      g.beta = kl_attr_float(n, "beta", 1);
      kl_node copy = *n;
      kl_value *cin = n->inputs[2];
      copy.op = KL_OP_EXPAND;
      copy.inputs = &cin;
      copy.ninputs = 1;
      char name[32];
      int k = kl_cg_new_kernel(e, name, sizeof name);
      kl_cg_gather_copy(kl_cg_kernels(e), name, &copy);
      kl_cg_launch_node(e, k, kl_shape_numel(&out->shape), &copy);
    }
  }
  g.lda = g.trans_a ? g.m : g.k;
  g.ldb = g.trans_b ? g.k : g.n;
  g.ldc = g.n;
  g.stride_c = g.m * g.n;
  kl_cg_emit_gemm(e, &g);
  return 0;
}

const kl_cg_template kl_cg_templates_basic[] = {
    {handles_elementwise, emit_simple, NULL},
    {handles_copy, emit_simple, NULL},
    {handles_reduce, emit_simple, NULL},
    {handles_softmax, emit_simple, NULL},
    {handles_gemm, emit_gemm, NULL},
    {NULL, NULL, NULL},
};
