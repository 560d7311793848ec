/* templates_train.c - the training ops' kernels: optim_step, one kernel
 * that updates every tensor of the node (a multi-tensor apply: the
 * optimizer is a few launches per step, not one per parameter). */
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

enum { STEP_SCALARS = 5 };

static bool handles_optim_step(const kl_node *n) { return n->op == KL_OP_OPTIM_STEP; }

/* These kernels read every operand whole and contiguous: one that the plan
 * made a strided view (no buffer of its own) is an internal error. */
static int check_buffers(kl_cg_emitter *e, const kl_node *n, const char **args, int na) {
  for (int i = 0; i < na; i++)
    if (!strcmp(args[i], "NULL"))
      return kl_cg_fail(e, n, "internal error: operand %d of %s has no buffer of its own", i,
                        kl_ops[n->op].name);
  return 0;
}

/* A float literal for kernel text. */
static const char *flit(double v, char *buf, size_t len) {
  snprintf(buf, len, "%.9gf", v);
  if (!strchr(buf, '.') && !strchr(buf, 'e') && !strchr(buf, 'n')) {
    snprintf(buf, len, "%.9g.0f", v);
  }
  return buf;
}

/* One thread per element of all tensors together: the element's tensor is
 * found by comparing with the running offsets.  No __restrict__: each
 * output is normally its input's own buffer (updated in place). */
static int emit_optim_step(kl_cg_emitter *e, const kl_node *n) {
  const char *algo = kl_attr_string(n, "algo", "adam");
  int ns = kl_optim_state_count(n), per = 2 + ns;
  int count = (int)kl_attr_int(n, "count", 0);
  double h[6];
  kl_optim_hyper(n, h);
  char b1[32], b2[32], eps[32], wd[32], mom[32], om1[32], om2[32];
  flit(h[0], b1, sizeof b1), flit(h[1], b2, sizeof b2), flit(h[2], eps, sizeof eps);
  flit(h[3], wd, sizeof wd), flit(h[4], mom, sizeof mom);
  flit(1 - h[0], om1, sizeof om1), flit(1 - h[1], om2, sizeof om2);
  int64_t total = 0;
  for (int t = 0; t < count; t++) total += kl_shape_numel(&n->inputs[STEP_SCALARS + t * per]->shape);
  char name[32];
  int k = kl_cg_new_kernel(e, name, sizeof name);
  FILE *f = kl_cg_kernels(e);
  fprintf(f, "/* %s: optim_step (%s) over %d tensors, %lld elements */\nKL_KERNEL void %s(", n->name,
          algo, count, (long long)total, name);
  for (int i = 0; i < n->ninputs; i++) fprintf(f, "%sconst float *in%d", i ? ", " : "", i);
  for (int o = 0; o < n->noutputs; o++) fprintf(f, ", float *out%d", o);
  fprintf(f, ") {\n  const float lr = in0[0], bias1 = in1[0], bias2 = in2[0], mult = in3[0];\n"
             "  const int ok = in4[0] != 0.0f;\n  (void)bias1, (void)bias2;\n");
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n"
             "    const float *P, *G, *S0 = 0, *S1 = 0;\n    float *PO, *SO0 = 0, *SO1 = 0;\n    int64_t j;\n",
          (long long)total);
  int64_t at = 0;
  for (int t = 0; t < count; t++) {
    int in = STEP_SCALARS + t * per, out = t * (1 + ns);
    int64_t numel = kl_shape_numel(&n->inputs[in]->shape);
    fprintf(f, "    %sif (i < %lldLL) { j = i - %lldLL; P = in%d; G = in%d; PO = out%d;", t ? "else " : "",
            (long long)(at + numel), (long long)at, in, in + 1, out);
    for (int s = 0; s < ns; s++) fprintf(f, " S%d = in%d; SO%d = out%d;", s, in + 2 + s, s, out + 1 + s);
    fprintf(f, " }\n");
    at += numel;
  }
  fprintf(f, "    else continue;\n    (void)S0, (void)S1, (void)SO0, (void)SO1;\n");
  /* a skipped step leaves everything as it was (a copy only when the
   * plan could not update in place) */
  fprintf(f, "    if (!ok) {\n      PO[j] = P[j];\n");
  for (int s = 0; s < ns; s++) fprintf(f, "      SO%d[j] = S%d[j];\n", s, s);
  fprintf(f, "      continue;\n    }\n    float p = P[j], g = G[j] * mult;\n");
  if (!strcmp(algo, "adamw")) fprintf(f, "    p = p * (1.0f - lr * %s);\n", wd);
  else if (h[3] != 0) fprintf(f, "    g = g + %s * p;\n", wd);
  if (!strcmp(algo, "sgd")) {
    if (ns) {
      fprintf(f, "    const float buf = %s * S0[j] + g;\n    SO0[j] = buf;\n", mom);
      if (h[5] != 0) fprintf(f, "    p = p - lr * (g + %s * buf);\n", mom); /* nesterov */
      else fprintf(f, "    p = p - lr * buf;\n");
    } else {
      fprintf(f, "    p = p - lr * g;\n");
    }
  } else {
    fprintf(f, "    const float m = %s * S0[j] + %s * g, v = %s * S1[j] + %s * g * g;\n", b1, om1, b2, om2);
    fprintf(f, "    SO0[j] = m;\n    SO1[j] = v;\n");
    fprintf(f, "    p = p - lr * (m * bias1) / (sqrtf(v * bias2) + %s);\n", eps);
  }
  fprintf(f, "    PO[j] = p;\n  }\n}\n");
  fprintf(f, "KL_EMU_ENTRY(%s", name);
  for (int i = 0; i < n->ninputs; i++) fprintf(f, ", KL_ARG(const float *, %d)", i);
  for (int o = 0; o < n->noutputs; o++) fprintf(f, ", KL_ARG(float *, %d)", n->ninputs + o);
  fprintf(f, ");\n\n");
  /* host side: the pointers in the same order */
  int na = n->ninputs + n->noutputs;
  char(*bufs)[160] = calloc((size_t)na, sizeof *bufs);
  const char **args = calloc((size_t)na, sizeof *args);
  if (!bufs || !args) abort();
  for (int i = 0; i < n->ninputs; i++) args[i] = kl_cg_ptr(e, n->inputs[i], bufs[i], sizeof bufs[i]);
  for (int o = 0; o < n->noutputs; o++)
    args[n->ninputs + o] = kl_cg_ptr(e, n->outputs[o], bufs[n->ninputs + o], sizeof bufs[0]);
  int rc = check_buffers(e, n, args, na);
  fprintf(kl_cg_host(e), "  /* %s: optim_step (%s), %d tensors in one kernel */\n", n->name, algo, count);
  if (!rc) kl_cg_launch(e, k, total, args, na);
  free(bufs);
  free(args);
  return rc;
}

/* ---- sum_squares: two kernels whatever the number of tensors ----------- */
enum { SUMSQ_THREADS = 256, SUMSQ_BLOCKS = 256 };

static bool handles_sum_squares(const kl_node *n) { return n->op == KL_OP_SUM_SQUARES; }

static int64_t sumsq_total(const kl_node *n) {
  int64_t total = 0;
  for (int i = 0; i < n->ninputs; i++) total += kl_shape_numel(&n->inputs[i]->shape);
  return total;
}

/* at least 64 elements a thread: enough blocks to fill a GPU only when
 * there is work for them (each block ends in a barrier-bound reduction) */
static int64_t sumsq_blocks(const kl_node *n) {
  int64_t b = (sumsq_total(n) + 64 * SUMSQ_THREADS - 1) / (64 * SUMSQ_THREADS);
  return b < 1 ? 1 : b > SUMSQ_BLOCKS ? SUMSQ_BLOCKS : b;
}

/* the first kernel's partial sums, one per block */
static int scratch_sum_squares(const kl_node *n, size_t *bytes) {
  bytes[0] = (size_t)sumsq_blocks(n) * (n->outputs[0]->dtype == KL_F64 ? 8 : 4);
  return 1;
}

/* A block reduction of acc[] in shared memory, in a fixed order. */
static void block_sum(FILE *f) {
  fprintf(f, "  __syncthreads();\n  for (int w = %d; w > 0; w >>= 1) {\n"
             "    if ((int)threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];\n"
             "    __syncthreads();\n  }\n", SUMSQ_THREADS / 2);
}

/* Pass 1: each thread walks its grid-stride share of every tensor in turn
 * (no per-element search), a block sums its threads; pass 2: one block
 * sums the blocks.  The order is fixed by the grid: reproducible. */
static int emit_sum_squares(kl_cg_emitter *e, const kl_node *n) {
  const kl_value *out = n->outputs[0];
  const char *at = out->dtype == KL_F64 ? "double" : "float";
  int64_t blocks = sumsq_blocks(n);
  char k1[32], k2[32], buf[256], src[64];
  int i1 = kl_cg_new_kernel(e, k1, sizeof k1);
  FILE *f = kl_cg_kernels(e);
  fprintf(f, "/* %s: sum_squares over %d tensors, %lld elements: partial sums */\nKL_KERNEL void %s(",
          n->name, n->ninputs, (long long)sumsq_total(n), k1);
  for (int i = 0; i < n->ninputs; i++)
    fprintf(f, "const %s *__restrict__ in%d, ", kl_cg_storage(n->inputs[i]->dtype), i);
  fprintf(f, "%s *__restrict__ part) {\n  KL_SHARED(%s, acc, [%d]);\n  %s s = 0;\n"
             "  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, "
             "stride = (int64_t)blockDim.x * gridDim.x;\n", at, at, SUMSQ_THREADS, at);
  for (int i = 0; i < n->ninputs; i++) {
    snprintf(src, sizeof src, "in%d[i]", i);
    fprintf(f, "  for (int64_t i = first; i < %lldLL; i += stride) {\n    const %s v = %s;\n"
               "    s += v * v;\n  }\n", (long long)kl_shape_numel(&n->inputs[i]->shape), at,
            kl_cg_load(buf, sizeof buf, n->inputs[i]->dtype, at, src));
  }
  fprintf(f, "  acc[threadIdx.x] = s;\n");
  block_sum(f);
  fprintf(f, "  if (threadIdx.x == 0) part[blockIdx.x] = acc[0];\n}\nKL_EMU_ENTRY(%s", k1);
  for (int i = 0; i < n->ninputs; i++)
    fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(n->inputs[i]->dtype), i);
  fprintf(f, ", KL_ARG(%s *, %d));\n\n", at, n->ninputs);
  int i2 = kl_cg_new_kernel(e, k2, sizeof k2);
  fprintf(f, "/* %s: sum_squares, the blocks' sum */\nKL_KERNEL void %s(const %s *__restrict__ part, "
             "%s *__restrict__ out) {\n  KL_SHARED(%s, acc, [%d]);\n"
             "  acc[threadIdx.x] = (int)threadIdx.x < %lld ? part[threadIdx.x] : 0;\n",
          n->name, k2, at, at, at, SUMSQ_THREADS, (long long)blocks);
  block_sum(f);
  fprintf(f, "  if (threadIdx.x == 0) out[0] = acc[0];\n}\nKL_EMU_ENTRY(%s, KL_ARG(const %s *, 0), "
             "KL_ARG(%s *, 1));\n\n", k2, at, at);
  int na = n->ninputs + 1;
  char(*bufs)[160] = calloc((size_t)na + 1, sizeof *bufs);
  const char **args = calloc((size_t)na + 1, sizeof *args);
  if (!bufs || !args) abort();
  for (int i = 0; i < n->ninputs; i++) args[i] = kl_cg_ptr(e, n->inputs[i], bufs[i], sizeof bufs[i]);
  args[n->ninputs] = kl_cg_scratch(e, (size_t)blocks * (out->dtype == KL_F64 ? 8 : 4),
                                   bufs[n->ninputs], sizeof bufs[0]);
  int rc = check_buffers(e, n, args, na);
  fprintf(kl_cg_host(e), "  /* %s: sum_squares of %d tensors in two kernels */\n", n->name, n->ninputs);
  char out_buf[160];
  const char *args2[2] = {args[n->ninputs], kl_cg_ptr(e, out, out_buf, sizeof out_buf)};
  if (!rc) {
    kl_cg_launch_grid(e, i1, blocks, SUMSQ_THREADS, args, na);
    kl_cg_launch_grid(e, i2, 1, SUMSQ_THREADS, args2, 2);
  }
  free(bufs);
  free(args);
  return rc;
}

/* ---- all_reduce: data-parallel training's gradient exchange ------------
 * No kernel: run() hands the bucket to the device's communicator, which
 * sums it over the ranks while the rest of the backward pass runs; the
 * all_reduce_wait nodes (emit_model.c) wait for it where the sums are
 * first read. */
static bool handles_all_reduce(const kl_node *n) { return n->op == KL_OP_ALL_REDUCE; }

static int emit_all_reduce(kl_cg_emitter *e, const kl_node *n) {
  FILE *f = kl_cg_host(e);
  int count = n->ninputs;
  char(*bufs)[160] = calloc((size_t)2 * count + 1, sizeof *bufs);
  const char **args = calloc((size_t)2 * count + 1, sizeof *args);
  if (!bufs || !args) abort();
  size_t bytes = 0;
  for (int i = 0; i < count; i++) {
    args[i] = kl_cg_ptr(e, n->inputs[i], bufs[i], sizeof bufs[i]);
    args[count + i] = kl_cg_ptr(e, n->outputs[i], bufs[count + i], sizeof bufs[0]);
    bytes += kl_cg_value_bytes(n->inputs[i]);
  }
  int rc = check_buffers(e, n, args, 2 * count);
  if (!rc) {
    fprintf(f, "  /* %s: bucket %lld, %d gradients, %zu bytes: the exchange starts and the backward\n"
               "   * pass goes on */\n  {\n    void *const src[] = {", n->name,
            (long long)kl_attr_int(n, "bucket", 0), count, bytes);
    for (int i = 0; i < count; i++) fprintf(f, "%s(void *)(%s)", i ? ", " : "", args[i]);
    fprintf(f, "};\n    void *const dst[] = {");
    for (int i = 0; i < count; i++) fprintf(f, "%s(void *)(%s)", i ? ", " : "", args[count + i]);
    fprintf(f, "};\n    static const int64_t numel[] = {");
    for (int i = 0; i < count; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)kl_shape_numel(&n->inputs[i]->shape));
    fprintf(f, "};\n    if (krt_all_reduce_start(m->dev, %lld, %d, src, dst, numel, (krt_dtype)%d, err, errlen)) "
               "return -1;\n  }\n",
            (long long)kl_attr_int(n, "bucket", 0), count, (int)n->inputs[0]->dtype);
  }
  free(bufs);
  free(args);
  return rc;
}

/* all_reduce_wait is the sum's own buffer (an alias, passes/plan_memory.c)
 * and emit_model.c writes the wait; reaching here means the plan did not
 * make it one. */
static bool handles_wait(const kl_node *n) { return n->op == KL_OP_ALL_REDUCE_WAIT; }

static int emit_wait(kl_cg_emitter *e, const kl_node *n) {
  return kl_cg_fail(e, n, "internal error: %s does not share its exchange's buffer", n->name);
}

const kl_cg_template kl_cg_templates_train[] = {
    {handles_all_reduce, emit_all_reduce, NULL},
    {handles_wait, emit_wait, NULL},
    {handles_optim_step, emit_optim_step, NULL},
    {handles_sum_squares, emit_sum_squares, scratch_sum_squares},
    {NULL, NULL, NULL},
};
