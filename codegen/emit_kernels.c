/* emit_kernels.c - CUDA C kernel templates, one per kind of node.  Shapes
 * are static, so sizes, strides and broadcast index maps are written into
 * each kernel as constants.  Kernels use the portable vocabulary of
 * runtime/emu/kiln_prelude.h, so the same source builds with NVRTC and with
 * the host compiler.  Today each node gets its own kernel, written plainly
 * (grid-stride loops, one thread per row for row kernels); fusion and tuned
 * templates come with the next issues. */
#include <string.h>

#include "codegen_impl.h"

/* Storage type of a dtype in kernels.cu. */
const char *kl_cg_storage(kl_dtype t) {
  switch (t) {
  case KL_F32: return "float";
  case KL_F16: return "__half";
  case KL_BF16: return "__nv_bfloat16";
  case KL_F64: return "double";
  case KL_I8: return "int8_t";
  case KL_I16: return "int16_t";
  case KL_I32: return "int32_t";
  case KL_I64: return "int64_t";
  case KL_U8: case KL_BOOL: return "uint8_t";
  case KL_U16: return "uint16_t";
  case KL_U32: return "uint32_t";
  case KL_U64: return "uint64_t";
  default: return "?";
  }
}

/* Arithmetic happens in float for the 16- and 32-bit floats, in double
 * for f64, and in 64-bit integers for the integer types. */
const char *kl_cg_compute_type(kl_dtype t) {
  if (t == KL_F64) return "double";
  if (kl_dtype_is_float(t)) return "float";
  return kl_dtype_is_unsigned(t) ? "uint64_t" : "int64_t";
}

static void load(FILE *f, kl_dtype t, const char *expr) {
  if (t == KL_F16) fprintf(f, "__half2float(%s)", expr);
  else if (t == KL_BF16) fprintf(f, "__bfloat162float(%s)", expr);
  else fprintf(f, "(%s)%s", kl_cg_compute_type(t), expr);
}

const char *kl_cg_load(char *buf, size_t len, kl_dtype t, const char *to, const char *expr) {
  if (t == KL_F16) snprintf(buf, len, "(%s)__half2float(%s)", to, expr);
  else if (t == KL_BF16) snprintf(buf, len, "(%s)__bfloat162float(%s)", to, expr);
  else snprintf(buf, len, "(%s)%s", to, expr);
  return buf;
}

void kl_cg_store(FILE *f, kl_dtype t, const char *dst, const char *value) {
  if (t == KL_F16) fprintf(f, "%s = __float2half((float)(%s));\n", dst, value);
  else if (t == KL_BF16) fprintf(f, "%s = __float2bfloat16((float)(%s));\n", dst, value);
  else if (t == KL_BOOL) fprintf(f, "%s = (uint8_t)((%s) != 0);\n", dst, value);
  else fprintf(f, "%s = (%s)(%s);\n", dst, kl_cg_storage(t), value);
}

/* The scalar expression of an elementwise op over operands a, b, c in
 * compute type `ct` ("float", "double" or an integer type); NULL when the
 * op has no template. */
static const char *expression(const kl_node *n, const char *ct, char *buf, size_t len) {
  bool flt = !strcmp(ct, "float"), dbl = !strcmp(ct, "double"), is_f = flt || dbl;
  const char *s = flt ? "f" : "";
#define F(fmt, ...) (snprintf(buf, len, fmt, __VA_ARGS__), buf)
  switch (n->op) {
  case KL_OP_NEG: return "-a";
  case KL_OP_ABS: return is_f ? F("fabs%s(a)", s) : "(a < 0 ? -a : a)";
  case KL_OP_EXP: return F("exp%s(a)", s);
  case KL_OP_LOG: return F("log%s(a)", s);
  case KL_OP_SQRT: return F("sqrt%s(a)", s);
  case KL_OP_RSQRT: return F("1 / sqrt%s(a)", s);
  case KL_OP_RECIPROCAL: return "1 / a";
  case KL_OP_TANH: return F("tanh%s(a)", s);
  case KL_OP_SIGMOID: return F("1 / (1 + exp%s(-a))", s);
  case KL_OP_RELU: return "(a > 0 ? a : (a != a ? a : 0))";
  case KL_OP_LEAKY_RELU: return F("(a >= 0 ? a : a * %.17g)", kl_attr_float(n, "alpha", 0.01));
  case KL_OP_GELU:
    if (!strcmp(kl_attr_string(n, "approximate", "none"), "tanh"))
      return F("0.5 * a * (1 + tanh%s(0.7978845608028654 * (a + 0.044715 * a * a * a)))", s);
    return F("0.5 * a * (1 + erf%s(a * 0.7071067811865476))", s);
  case KL_OP_SILU: return F("a / (1 + exp%s(-a))", s);
  case KL_OP_ERF: return F("erf%s(a)", s);
  case KL_OP_CAST: return "a";
  case KL_OP_ADD: return "a + b";
  case KL_OP_SUB: return "a - b";
  case KL_OP_MUL: return "a * b";
  case KL_OP_DIV: return is_f ? "a / b" : "(b == 0 ? 0 : a / b)"; /* the GPU traps nothing */
  case KL_OP_POW: return is_f ? F("pow%s(a, b)", s) : NULL;
  case KL_OP_MAXIMUM: return is_f ? "(a != a || a > b ? a : b)" : "(a > b ? a : b)";
  case KL_OP_MINIMUM: return is_f ? "(a != a || a < b ? a : b)" : "(a < b ? a : b)";
  case KL_OP_EQ: return "a == b";
  case KL_OP_NE: return "a != b";
  case KL_OP_LT: return "a < b";
  case KL_OP_LE: return "a <= b";
  case KL_OP_GT: return "a > b";
  case KL_OP_GE: return "a >= b";
  case KL_OP_WHERE: return "a ? b : c";
  case KL_OP_SIN: return F("sin%s(a)", s);
  case KL_OP_COS: return F("cos%s(a)", s);
  case KL_OP_TAN: return F("tan%s(a)", s);
  case KL_OP_ASIN: return F("asin%s(a)", s);
  case KL_OP_ACOS: return F("acos%s(a)", s);
  case KL_OP_ATAN: return F("atan%s(a)", s);
  case KL_OP_SINH: return F("sinh%s(a)", s);
  case KL_OP_COSH: return F("cosh%s(a)", s);
  case KL_OP_ASINH: return F("asinh%s(a)", s);
  case KL_OP_ACOSH: return F("acosh%s(a)", s);
  case KL_OP_ATANH: return F("atanh%s(a)", s);
  case KL_OP_FLOOR: return F("floor%s(a)", s);
  case KL_OP_CEIL: return F("ceil%s(a)", s);
  case KL_OP_ROUND: return F("rint%s(a)", s); /* halves to even */
  case KL_OP_SIGN:
    return !is_f && ct[0] == 'u' ? "(a > 0 ? 1 : 0)" : "(a > 0 ? 1 : a < 0 ? -1 : a)";
  case KL_OP_ISNAN: return "a != a";
  case KL_OP_ELU:
    return is_f ? F("(a >= 0 ? a : %.17g * expm1%s(a))", kl_attr_float(n, "alpha", 1.0), s) : NULL;
  case KL_OP_SOFTPLUS: /* log(1 + e^a) without overflow */
    return is_f ? F("(log1p%s(exp%s(-fabs%s(a))) + (a > 0 ? a : 0))", s, s, s) : NULL;
  case KL_OP_ISINF:
    return F("((a == KL_INF && %d) || (a == -KL_INF && %d))",
             (int)kl_attr_int(n, "detect_positive", 1), (int)kl_attr_int(n, "detect_negative", 1));
  case KL_OP_MOD:
    if (kl_attr_int(n, "fmod", 0)) return is_f ? F("fmod%s(a, b)", s) : "(b == 0 ? 0 : a % b)";
    /* the divisor's sign, as Python's %; integer modulo by zero gives 0 on
     * a device (the interpreter reports it) */
    if (is_f)
      return F("(fmod%s(a, b) != 0 && ((fmod%s(a, b) < 0) != (b < 0)) ? fmod%s(a, b) + b : "
               "fmod%s(a, b))", s, s, s, s);
    if (ct[0] == 'u') return "(b == 0 ? 0 : a % b)";
    return "(b == 0 ? 0 : (a % b != 0 && ((a % b < 0) != (b < 0))) ? a % b + b : a % b)";
  case KL_OP_BITSHIFT: {
    int bits = (int)kl_dtype_size(n->inputs[0]->dtype) * 8;
    bool left = !strcmp(kl_attr_string(n, "direction", "left"), "left");
    return F("(b >= %d ? 0 : a %s b)", bits, left ? "<<" : ">>");
  }
  case KL_OP_LOGICAL_NOT: return "!a";
  case KL_OP_LOGICAL_AND: return "a && b";
  case KL_OP_LOGICAL_OR: return "a || b";
  case KL_OP_LOGICAL_XOR: return "(a != 0) != (b != 0)";
  default: return NULL;
  }
#undef F
}

/* Compute type of a node's operands: that of its first data input (where's
 * second). */
static kl_dtype operand_dtype(const kl_node *n) {
  return n->op == KL_OP_WHERE ? n->inputs[1]->dtype : n->inputs[0]->dtype;
}

bool kl_cg_is_elementwise(const kl_node *n) {
  char buf[256];
  if (kl_ops[n->op].kind != KL_KIND_ELEMENTWISE || n->noutputs != 1) return false;
  return expression(n, kl_cg_compute_type(operand_dtype(n)), buf, sizeof buf) != NULL;
}

/* Flat offset of each input for output element i, as a chain of div/mod
 * by the output dims with each input's broadcast strides.  Only the dims
 * some input moves along are taken apart (no unused variables: NVRTC warns
 * about them). */
static void index_math(FILE *f, const kl_shape *out, const kl_value *const *ins, int nins) {
  int64_t stride[64][KL_MAX_RANK] = {{0}};
  bool used[KL_MAX_RANK] = {0};
  int outermost = out->rank;
  /* an empty output runs no thread: no index math (and no % 0) */
  for (int d = out->rank - 1; d >= 0 && kl_shape_numel(out) > 0; d--) {
    for (int k = 0; k < nins && k < 64; k++) {
      const kl_shape *s = &ins[k]->shape;
      int sd = d - (out->rank - s->rank);
      if (sd < 0 || s->dims[sd] == 1 || out->dims[d] == 1) continue;
      int64_t st = 1;
      for (int e = sd + 1; e < s->rank; e++) st *= s->dims[e];
      stride[k][d] = st;
      used[d] = true;
    }
    if (used[d]) outermost = d;
  }
  fprintf(f, "    int64_t ");
  for (int k = 0; k < nins; k++) fprintf(f, "%so%d = 0", k ? ", " : "", k);
  if (outermost < out->rank) fprintf(f, ", r = i");
  fprintf(f, ";\n");
  for (int d = out->rank - 1; d >= outermost; d--) {
    long long dim = (long long)out->dims[d];
    if (!used[d]) {
      if (dim != 1) fprintf(f, "    r /= %lld;\n", dim);
      continue;
    }
    fprintf(f, "    { int64_t q = r %% %lld;", dim);
    if (d > outermost) fprintf(f, " r /= %lld;", dim);
    for (int k = 0; k < nins && k < 64; k++)
      if (stride[k][d]) fprintf(f, " o%d += q * %lld;", k, (long long)stride[k][d]);
    fprintf(f, " }\n");
  }
}

static void grid_stride_loop(FILE *f, int64_t n) {
  fprintf(f, "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < %lldLL;\n"
             "       i += (int64_t)blockDim.x * gridDim.x) {\n", (long long)n);
}

static void params_extra(FILE *f, const char *name, const kl_value *const *ins, int nins,
                         const kl_value *out, const char *extra) {
  fprintf(f, "KL_KERNEL void %s(", name);
  for (int k = 0; k < nins; k++)
    fprintf(f, "const %s *__restrict__ in%d, ", kl_cg_storage(ins[k]->dtype), k);
  fprintf(f, "%s *__restrict__ out%s) {\n", kl_cg_storage(out->dtype), extra);
}

static void params(FILE *f, const char *name, const kl_value *const *ins, int nins,
                   const kl_value *out) {
  params_extra(f, name, ins, nins, out, "");
}

static void entry(FILE *f, const char *name, const kl_value *const *ins, int nins,
                  const kl_value *out) {
  fprintf(f, "KL_EMU_ENTRY(%s", name);
  for (int k = 0; k < nins; k++)
    fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(ins[k]->dtype), k);
  fprintf(f, ", KL_ARG(%s *, %d));\n\n", kl_cg_storage(out->dtype), nins);
}

bool kl_cg_traps_zero_divisor(const kl_node *n) {
  return (n->op == KL_OP_DIV || n->op == KL_OP_MOD) && !kl_dtype_is_float(n->inputs[0]->dtype);
}

void kl_cg_elementwise(FILE *f, const char *name, const kl_node *n) {
  const kl_value *out = n->outputs[0];
  const char *ct = kl_cg_compute_type(operand_dtype(n));
  /* Integer division by zero is an error in the interpreter; a kernel
   * cannot stop, so it raises a flag that run() checks afterwards. */
  bool flag = kl_cg_traps_zero_divisor(n);
  char buf[256];
  const char *expr = expression(n, ct, buf, sizeof buf);
  char shape[160];
  fprintf(f, "/* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name, kl_dtype_name(out->dtype),
          kl_shape_str(&out->shape, shape, sizeof shape));
  params_extra(f, name, (const kl_value *const *)n->inputs, n->ninputs, out,
               flag ? ", int *__restrict__ zero_divisor" : "");
  grid_stride_loop(f, kl_shape_numel(&out->shape));
  index_math(f, &out->shape, (const kl_value *const *)n->inputs, n->ninputs);
  for (int k = 0; k < n->ninputs; k++) {
    const kl_value *in = n->inputs[k];
    /* where's condition stays a bool; its branches use the compute type */
    const char *t = n->op == KL_OP_WHERE && k == 0 ? "int64_t" : ct;
    char src[32];
    snprintf(src, sizeof src, "in%d[o%d]", k, k);
    fprintf(f, "    const %s %c = ", t, 'a' + k);
    if (n->op == KL_OP_WHERE && k == 0) fprintf(f, "(int64_t)%s", src);
    else if (in->dtype == KL_F16 || in->dtype == KL_BF16) load(f, in->dtype, src);
    else fprintf(f, "(%s)%s", t, src);
    fprintf(f, ";\n");
  }
  if (flag) fprintf(f, "    if (b == 0) zero_divisor[0] = 1;\n");
  fprintf(f, "    ");
  kl_cg_store(f, out->dtype, "out[i]", expr);
  fprintf(f, "  }\n}\n");
  if (!flag) {
    entry(f, name, (const kl_value *const *)n->inputs, n->ninputs, out);
    return;
  }
  fprintf(f, "KL_EMU_ENTRY(%s", name);
  for (int k = 0; k < n->ninputs; k++)
    fprintf(f, ", KL_ARG(const %s *, %d)", kl_cg_storage(n->inputs[k]->dtype), k);
  fprintf(f, ", KL_ARG(%s *, %d), KL_ARG(int *, %d));\n\n", kl_cg_storage(out->dtype), n->ninputs,
          n->ninputs + 1);
}

/* Data movement that only renumbers elements (reshape & co, expand,
 * transpose): out[i] = in[map(i)]. */
void kl_cg_gather_copy(FILE *f, const char *name, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  char shape[160];
  fprintf(f, "/* %s: %s -> %s%s */\n", n->name, kl_ops[n->op].name, kl_dtype_name(out->dtype),
          kl_shape_str(&out->shape, shape, sizeof shape));
  params(f, name, &in, 1, out);
  grid_stride_loop(f, kl_shape_numel(&out->shape));
  if (n->op == KL_OP_TRANSPOSE) {
    /* out index d comes from input axis perm[d] */
    int r = in->shape.rank;
    int64_t perm[KL_MAX_RANK], in_strides[KL_MAX_RANK];
    const int64_t *p;
    int np = kl_attr_ints(n, "perm", &p);
    for (int d = 0; d < r; d++) perm[d] = np == r ? (p[d] + r) % r : r - 1 - d;
    kl_shape_strides(&in->shape, in_strides);
    fprintf(f, "    int64_t r = i, o0 = 0;\n");
    for (int d = r - 1; d >= 0; d--)
      fprintf(f, "    { int64_t q = r %% %lld; r /= %lld; o0 += q * %lld; }\n",
              (long long)out->shape.dims[d], (long long)out->shape.dims[d],
              (long long)in_strides[perm[d]]);
  } else if (n->op == KL_OP_EXPAND) {
    index_math(f, &out->shape, &in, 1);
  } else { /* same element order */
    fprintf(f, "    int64_t o0 = i;\n");
  }
  fprintf(f, "    out[i] = in0[o0];\n  }\n}\n");
  entry(f, name, &in, 1, out);
}

/* softmax / log_softmax over one axis: one thread per row, two passes in
 * float (max, then sum of exponentials). */
void kl_cg_softmax(FILE *f, const char *name, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  int r = in->shape.rank, axis = (int)kl_attr_int(n, "axis", -1);
  if (axis < 0) axis += r;
  int64_t len = in->shape.dims[axis], inner = 1, outer = 1;
  for (int d = axis + 1; d < r; d++) inner *= in->shape.dims[d];
  for (int d = 0; d < axis; d++) outer *= in->shape.dims[d];
  const char *ct = kl_cg_compute_type(in->dtype), *s = !strcmp(ct, "double") ? "" : "f";
  char shape[160];
  fprintf(f, "/* %s: %s over axis %d of %s%s */\n", n->name, kl_ops[n->op].name, axis,
          kl_dtype_name(in->dtype), kl_shape_str(&in->shape, shape, sizeof shape));
  params(f, name, &in, 1, out);
  grid_stride_loop(f, outer * inner);
  fprintf(f, "    const int64_t base = (i / %lld) * %lld + i %% %lld;\n", (long long)inner,
          (long long)(len * inner), (long long)inner);
  char at[64], dst[64];
  snprintf(at, sizeof at, "in0[base + j * %lld]", (long long)inner);
  snprintf(dst, sizeof dst, "out[base + j * %lld]", (long long)inner);
  fprintf(f, "    %s m = -KL_INF;\n    double sum = 0; /* summed in double, as the interpreter */\n", ct);
  fprintf(f, "    for (int64_t j = 0; j < %lld; j++) { %s v = ", (long long)len, ct);
  load(f, in->dtype, at);
  fprintf(f, "; m = v > m ? v : m; }\n");
  fprintf(f, "    for (int64_t j = 0; j < %lld; j++) { %s v = ", (long long)len, ct);
  load(f, in->dtype, at);
  fprintf(f, "; sum += exp%s(v - m); }\n", s);
  fprintf(f, "    for (int64_t j = 0; j < %lld; j++) { %s v = ", (long long)len, ct);
  load(f, in->dtype, at);
  fprintf(f, ";\n      ");
  kl_cg_store(f, out->dtype, dst,
        n->op == KL_OP_SOFTMAX ? (s[0] ? "expf(v - m) / (float)sum" : "exp(v - m) / sum")
                               : (s[0] ? "v - m - logf((float)sum)" : "v - m - log(sum)"));
  fprintf(f, "    }\n  }\n}\n");
  entry(f, name, &in, 1, out);
}

/* reduce_*: one thread per output element walks its reduced elements,
 * accumulating in double (floats) or 64-bit integers. */
void kl_cg_reduce(FILE *f, const char *name, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  int r = in->shape.rank;
  bool reduced[KL_MAX_RANK] = {0};
  const int64_t *axes;
  int na = kl_attr_ints(n, "axes", &axes);
  for (int d = 0; d < r; d++) reduced[d] = na < 0;
  for (int k = 0; k < na; k++) reduced[(axes[k] % r + r) % r] = true;
  int64_t strides[KL_MAX_RANK], count = 1;
  kl_shape_strides(&in->shape, strides);
  for (int d = 0; d < r; d++)
    if (reduced[d]) count *= in->shape.dims[d];
  bool is_f = kl_dtype_is_float(in->dtype);
  const char *acc = is_f ? "double" : kl_dtype_is_unsigned(in->dtype) ? "uint64_t" : "int64_t";
  char shape[160], at[32];
  fprintf(f, "/* %s: %s of %s%s */\n", n->name, kl_ops[n->op].name, kl_dtype_name(in->dtype),
          kl_shape_str(&in->shape, shape, sizeof shape));
  params(f, name, &in, 1, out);
  grid_stride_loop(f, kl_shape_numel(&out->shape));
  bool kept = false;
  for (int d = 0; d < r; d++) kept |= !reduced[d] && in->shape.dims[d] != 1;
  fprintf(f, kept ? "    int64_t r = i, base = 0;\n" : "    const int64_t base = 0;\n");
  for (int d = r - 1; d >= 0 && kept; d--)
    if (!reduced[d] && in->shape.dims[d] != 1)
      fprintf(f, "    { int64_t q = r %% %lld; r /= %lld; base += q * %lld; }\n",
              (long long)in->shape.dims[d], (long long)in->shape.dims[d], (long long)strides[d]);
  const char *init = "0";
  switch (n->op) {
  case KL_OP_REDUCE_PROD: init = "1"; break;
  /* limits spelled out: NVRTC has no <stdint.h> macros */
  case KL_OP_REDUCE_MAX: init = is_f ? "-KL_INF" : "(-9223372036854775807LL - 1)"; break;
  case KL_OP_REDUCE_MIN: init = is_f ? "KL_INF" : "9223372036854775807LL"; break;
  default: break;
  }
  if (!is_f && kl_dtype_is_unsigned(in->dtype) && n->op == KL_OP_REDUCE_MAX) init = "0";
  if (!is_f && kl_dtype_is_unsigned(in->dtype) && n->op == KL_OP_REDUCE_MIN)
    init = "18446744073709551615ULL";
  fprintf(f, "    %s acc = %s;\n", acc, init);
  fprintf(f, "    for (int64_t j = 0; j < %lldLL; j++) {\n      int64_t %soff = base;\n",
          (long long)count, count > 0 ? "s = j, " : "");
  for (int d = r - 1; d >= 0 && count > 0; d--) /* count 0: the loop never runs */
    if (reduced[d])
      fprintf(f, "      { int64_t q = s %% %lld; s /= %lld; off += q * %lld; }\n",
              (long long)in->shape.dims[d], (long long)in->shape.dims[d], (long long)strides[d]);
  snprintf(at, sizeof at, "in0[off]");
  fprintf(f, "      const %s v = ", acc);
  if (in->dtype == KL_F16 || in->dtype == KL_BF16) load(f, in->dtype, at);
  else fprintf(f, "(%s)%s", acc, at);
  fprintf(f, ";\n      ");
  switch (n->op) {
  case KL_OP_REDUCE_PROD: fprintf(f, "acc *= v;\n"); break;
  case KL_OP_REDUCE_MAX: fprintf(f, "acc = (v != v || v > acc) ? v : acc;\n"); break;
  case KL_OP_REDUCE_MIN: fprintf(f, "acc = (v != v || v < acc) ? v : acc;\n"); break;
  default: fprintf(f, "acc += v;\n"); break;
  }
  fprintf(f, "    }\n    ");
  char value[64];
  if (n->op == KL_OP_REDUCE_MEAN) snprintf(value, sizeof value, "acc / %lld", (long long)count);
  else snprintf(value, sizeof value, "acc");
  kl_cg_store(f, out->dtype, "out[i]", value);
  fprintf(f, "  }\n}\n");
  entry(f, name, &in, 1, out);
}
