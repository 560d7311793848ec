/* node_kernels.c - scalar expressions and the kernels of single nodes.  Shapes
 * are static, so sizes, strides and broadcast index maps are written into
 * each kernel as constants.  Kernels use the portable vocabulary of
 * runtime/emu/kiln_prelude.h, so the same source builds with NVRTC and with
 * the host compiler.  These are the kernels of single nodes: grid-stride
 * loops for elementwise ops and copies, row kernels (a warp or a block per
 * row, combined by shuffles and shared memory) for reductions and softmax,
 * shared-memory tiles for transposes.  Groups of fused nodes get theirs
 * from emit_fused.c and emit_rows.c, built from the pieces exported here. */
#include <math.h>
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
  /* one byte an element (ir.h): the floats' codes, the small integers'
   * values */
  case KL_I4: case KL_I2: return "int8_t";
  case KL_F8E4M3FN: case KL_F8E4M3FNUZ: case KL_F8E5M2: case KL_F8E5M2FNUZ:
  case KL_F4E2M1: case KL_F8E8M0: case KL_U4: case KL_U2: return "uint8_t";
  default: return "?";
  }
}

/* Arithmetic happens in float for the 16- and 32-bit floats and the small
 * floats (every fp8, fp4 and E8M0 value is a float), in double for f64,
 * and in 64-bit integers for the integer types. */
const char *kl_cg_compute_type(kl_dtype t) {
  if (t == KL_F64) return "double";
  if (kl_dtype_is_float(t) || kl_dtype_is_small_float(t)) return "float";
  return kl_dtype_is_unsigned(t) ? "uint64_t" : "int64_t";
}

/* kiln_prelude.h's KL_MF_* format name of an fp8 or fp4 dtype, else NULL. */
static const char *mf_format(kl_dtype t) {
  switch (t) {
  case KL_F8E4M3FN: return "KL_MF_E4M3FN";
  case KL_F8E4M3FNUZ: return "KL_MF_E4M3FNUZ";
  case KL_F8E5M2: return "KL_MF_E5M2";
  case KL_F8E5M2FNUZ: return "KL_MF_E5M2FNUZ";
  case KL_F4E2M1: return "KL_MF_E2M1";
  default: return NULL;
  }
}

/* The float (or integer, for the rest) value of a stored element. */
static const char *load_value(char *buf, size_t len, kl_dtype t, const char *expr) {
  if (t == KL_F16) snprintf(buf, len, "__half2float(%s)", expr);
  else if (t == KL_BF16) snprintf(buf, len, "__bfloat162float(%s)", expr);
  else if (mf_format(t)) snprintf(buf, len, "kl_mf_to_f32(%s, %s)", expr, mf_format(t));
  else if (t == KL_F8E8M0) snprintf(buf, len, "kl_e8m0_to_f32(%s)", expr);
  else return NULL;
  return buf;
}

/* Is t's stored element converted on load (not a C type's value)? */
static bool converts(kl_dtype t) {
  return t == KL_F16 || t == KL_BF16 || kl_dtype_is_small_float(t);
}

const char *kl_cg_real_type(kl_dtype t) {
  return (kl_dtype_is_float(t) && t != KL_F64) || kl_dtype_is_small_float(t) ? "float" : "double";
}

const char *kl_cg_real_suffix(const char *ct) { return strcmp(ct, "float") ? "" : "f"; }

static void load(FILE *f, kl_dtype t, const char *expr) {
  char buf[512];
  if (load_value(buf, sizeof buf, t, expr)) fputs(buf, f);
  else fprintf(f, "(%s)%s", kl_cg_compute_type(t), expr);
}

const char *kl_cg_load(char *buf, size_t len, kl_dtype t, const char *to, const char *expr) {
  char v[512];
  if (load_value(v, sizeof v, t, expr)) snprintf(buf, len, "(%s)%s", to, v);
  else snprintf(buf, len, "(%s)%s", to, expr);
  return buf;
}

/* A small float is stored without saturation and E8M0 rounding down: both
 * keep every value of the type (ir/util.c's kl_dtype_round); Cast's own
 * modes are in its expression.  Small integers wrap to their width. */
void kl_cg_store(FILE *f, kl_dtype t, const char *dst, const char *value) {
  int bits = kl_dtype_bits(t);
  if (t == KL_F16) fprintf(f, "%s = __float2half((float)(%s));\n", dst, value);
  else if (t == KL_BF16) fprintf(f, "%s = __float2bfloat16((float)(%s));\n", dst, value);
  else if (t == KL_BOOL) fprintf(f, "%s = (uint8_t)((%s) != 0);\n", dst, value);
  else if (mf_format(t))
    fprintf(f, "%s = (uint8_t)kl_mf_from_f32((float)(%s), %s, 0);\n", dst, value, mf_format(t));
  else if (t == KL_F8E8M0)
    fprintf(f, "%s = (uint8_t)kl_e8m0_from_f32((float)(%s), 0, KL_E8M0_DOWN);\n", dst, value);
  else if (bits < 8 && kl_dtype_is_unsigned(t))
    fprintf(f, "%s = (uint8_t)kl_wrap_unsigned((uint64_t)(%s), %d);\n", dst, value, bits);
  else if (bits < 8)
    fprintf(f, "%s = (int8_t)kl_wrap_signed((int64_t)(%s), %d);\n", dst, value, bits);
  else fprintf(f, "%s = (%s)(%s);\n", dst, kl_cg_storage(t), value);
}

/* Cast's expression over operand a (in the input's compute type `ct`): the
 * store to the output type does most casts; Cast's saturate and round_mode
 * for small floats and the out-of-range rule of float to 4- and 2-bit
 * integers (kl_dtype_cast in ir/util.c) are done here. */
static const char *cast_expression(const kl_node *n, const char *ct, char *buf, size_t len) {
  kl_dtype from = n->inputs[0]->dtype, to = n->outputs[0]->dtype;
  int sat = kl_attr_int(n, "saturate", 1) != 0, bits = kl_dtype_bits(to);
  if (mf_format(to) && sat) /* clamped, then rounded by the store */
    snprintf(buf, len, "kl_mf_saturate((float)a, %s)", mf_format(to));
  else if (to == KL_F8E8M0)
    snprintf(buf, len, "kl_e8m0_to_f32(kl_e8m0_from_f32((float)a, %d, %d))", sat,
             kl_cast_round_mode(n));
  else if (bits < 8 && strcmp(ct, "float") == 0 && !kl_dtype_is_int(from) && from != KL_BOOL) {
    double lo = kl_dtype_is_unsigned(to) ? 0 : -ldexp(1, bits - 1), span = ldexp(1, bits);
    snprintf(buf, len, "(a > %.1ff && a < %.1ff ? a : 0.0f)", lo - 1, lo + span);
  } else if (bits < 8 && strcmp(ct, "double") == 0) {
    double lo = kl_dtype_is_unsigned(to) ? 0 : -ldexp(1, bits - 1), span = ldexp(1, bits);
    snprintf(buf, len, "(a > %.1f && a < %.1f ? a : 0.0)", lo - 1, lo + span);
  } else {
    return "a";
  }
  return buf;
}

/* The scalar expression of an elementwise op over operands a, b, c in
 * compute type `ct` ("float", "double" or an integer type), for the ops
 * whose row in ir/ops.def says CUSTOM in its `cuda` column: the expression
 * depends on attributes or on the compute type. */
static const char *custom_expression(const kl_node *n, const char *ct, char *buf, size_t len) {
  bool flt = !strcmp(ct, "float"), dbl = !strcmp(ct, "double"), is_f = flt || dbl;
  /* s: the math functions' suffix; lc: a literal's cast, so that a float
   * expression stays in float (a bare 0.5 is a double) */
  const char *s = flt ? "f" : "", *lc = flt ? "(float)" : "";
#define F(fmt, ...) (snprintf(buf, len, fmt, __VA_ARGS__), buf)
  switch (n->op) {
  case KL_OP_CAST: return cast_expression(n, ct, buf, len);
  case KL_OP_ABS: return is_f ? F("fabs%s(a)", s) : "(a < 0 ? -a : a)";
  case KL_OP_LEAKY_RELU: return F("(a >= 0 ? a : a * %s%.17g)", lc, kl_attr_float(n, "alpha", 0.01));
  case KL_OP_GELU:
    if (!strcmp(kl_attr_string(n, "approximate", "none"), "tanh"))
      return F("%s0.5 * a * (1 + tanh%s(%s0.7978845608028654 * (a + %s0.044715 * a * a * a)))", lc, s, lc, lc);
    return F("%s0.5 * a * (1 + erf%s(a * %s0.7071067811865476))", lc, s, lc);
  case KL_OP_SWISH: /* a * sigmoid(alpha * a) */
    return is_f ? F("a / (1 + exp%s(-(%s)%.17g * a))", s, ct, kl_attr_float(n, "alpha", 1.0)) : NULL;
  case KL_OP_MISH: /* a * tanh(softplus(a)), softplus as below */
    return is_f ? F("a * tanh%s(log1p%s(exp%s(-fabs%s(a))) + (a > 0 ? a : 0))", s, s, s, s) : NULL;
  case KL_OP_DIV: return is_f ? "a / b" : "(b == 0 ? 0 : a / b)"; /* the GPU traps nothing */
  case KL_OP_POW: /* integers: kiln_prelude.h's powers by squaring */
    return is_f ? F("pow%s(a, b)", s) : ct[0] == 'u' ? "kl_upow(a, b)" : "kl_ipow(a, b)";
  case KL_OP_MAXIMUM: return is_f ? "(a != a || a > b ? a : b)" : "(a > b ? a : b)";
  case KL_OP_MINIMUM: return is_f ? "(a != a || a < b ? a : b)" : "(a < b ? a : b)";
  case KL_OP_SIGN:
    return !is_f && ct[0] == 'u' ? "(a > 0 ? 1 : 0)" : "(a > 0 ? 1 : a < 0 ? -1 : a)";
  case KL_OP_ELU:
    return is_f ? F("(a >= 0 ? a : %s%.17g * expm1%s(a))", lc, kl_attr_float(n, "alpha", 1.0), s) : NULL;
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
    if (ct[0] == 'u') return F("(b >= %d ? 0 : a %s b)", bits, left ? "<<" : ">>");
    /* signed (int64_t operands): a negative shift is out of range too;
     * left shifts go through uint64_t (no overflow), right ones are
     * arithmetic (NVRTC and the host compilers shift signed values so) */
    if (left) return F("((uint64_t)b >= %d ? 0 : (int64_t)((uint64_t)a << b))", bits);
    return F("((uint64_t)b >= %d ? (a < 0 ? -1 : 0) : a >> b)", bits);
  }
  default: return NULL;
  }
#undef F
}

/* The scalar expression of an elementwise op over operands a, b, c in
 * compute type `ct` ("float", "double" or an integer type), from the `cuda`
 * column of the op's row in ir/ops.def; NULL when the op has none.  A
 * template's %s is the float suffix: "f" for float, "" otherwise. */
static const char *op_expression(const kl_node *n, const char *ct, char *buf, size_t len) {
  const char *t = kl_ops[n->op].cuda;
  if (!t) return NULL;
  if (t == kl_op_cuda_custom) return custom_expression(n, ct, buf, len);
  if (!strchr(t, '%')) return t;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  snprintf(buf, len, t, !strcmp(ct, "float") ? "f" : "");
#pragma GCC diagnostic pop
  return buf;
}

const char *kl_cg_test_break_op;
double kl_cg_test_break_scale;

/* The expression, made wrong when a test build asked for it
 * (kl_cg_test_break_op): for negative a it adds a/2 (a relu then leaks
 * a/2), or with kl_cg_test_break_scale it is scaled by that factor (a
 * small error, for the suites whose tolerances must still catch it). */
static const char *expression(const kl_node *n, const char *ct, char *buf, size_t len) {
  const char *e = op_expression(n, ct, buf, len);
  if (!e || !kl_cg_test_break_op || strcmp(kl_ops[n->op].name, kl_cg_test_break_op)) return e;
  char good[512];
  snprintf(good, sizeof good, "%s", e);
  if (kl_cg_test_break_scale != 0)
    snprintf(buf, len, "((%s) * %.17g)", good, kl_cg_test_break_scale);
  else
    snprintf(buf, len, "((%s) + (a < 0 ? a / 2 : 0))", good);
  return buf;
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

void kl_cg_elementwise(FILE *f, const char *name, const kl_node *n) {
  const kl_value *out = n->outputs[0];
  const char *ct = kl_cg_compute_type(operand_dtype(n));
  /* Integer division by zero is an error in the interpreter; a kernel
   * cannot stop, so it raises a flag that run() checks afterwards. */
  bool flag = kl_traps_zero_divisor(n);
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
    else if (converts(in->dtype)) load(f, in->dtype, src);
    else fprintf(f, "(%s)%s", t, src);
    fprintf(f, ";\n");
  }
  if (flag) /* pow: 0 to a negative power divides by zero */
    fprintf(f, "    if (%s) zero_divisor[0] = 1;\n",
            n->op == KL_OP_POW ? "a == 0 && b < 0" : "b == 0");
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

/* ---- grids and row kernels ------------------------------------------------ */
enum { GRID_BLOCK = 256, GRID_MAX_BLOCKS = 4096 };

/* The grid of a grid-stride kernel over n threads (as kl_cg_launch). */
static kl_cg_grid grid_stride(int64_t n) {
  int64_t blocks = (n + GRID_BLOCK - 1) / GRID_BLOCK;
  kl_cg_grid g = {n > 0 ? (blocks < GRID_MAX_BLOCKS ? blocks : GRID_MAX_BLOCKS) : 0, GRID_BLOCK};
  return g;
}

/* A warp per row up to 1024 elements (32 per lane); beyond, a block of 256
 * threads per row, or of 1024 for very long rows (a whole-tensor
 * reduction has one row). */
kl_cg_rows kl_cg_plan_rows(int64_t rows, int64_t len) {
  kl_cg_rows p = {rows, len, 32, rows > 0 && rows < 8 ? (int)rows : 8, true};
  if (len > 1024) {
    p.threads = len > 16384 ? 1024 : 256;
    p.rows_per_block = 1;
  }
  return p;
}

kl_cg_grid kl_cg_rows_grid(const kl_cg_rows *p) {
  kl_cg_grid g = {0, p->threads * p->rows_per_block};
  if (p->rows > 0 && p->len > 0) g.blocks = (p->rows + p->rows_per_block - 1) / p->rows_per_block;
  return g;
}

void kl_cg_rows_shared(FILE *f, const kl_cg_rows *p, const char *type, const char *name) {
  if (p->threads > 32) fprintf(f, "  KL_SHARED(%s, %s, [%d]);\n", type, name, p->threads / 32);
}

void kl_cg_rows_begin(FILE *f, const kl_cg_rows *p) {
  if (p->threads > 32 || p->rows_per_block == 1) {
    fprintf(f, "  const int64_t row = blockIdx.x;\n  const int lane = (int)threadIdx.x;\n");
  } else {
    fprintf(f, "  const int64_t row = (int64_t)blockIdx.x * %d + (threadIdx.x >> 5);\n",
            p->rows_per_block);
    if (p->rows % p->rows_per_block) /* whole warps leave: the shuffles stay full */
      fprintf(f, "  if (row >= %lldLL) return;\n", (long long)p->rows);
    fprintf(f, "  const int lane = (int)(threadIdx.x & 31);\n");
  }
  /* the host device: lane 0 takes the whole row (the others leave at once) */
  if (p->device_lanes) fprintf(f, "  if (lane >= KL_ROW_SPAN(%d)) return;\n", p->threads);
}

void kl_cg_rows_loop(FILE *f, const kl_cg_rows *p, const char *indent) {
  if (p->device_lanes)
    fprintf(f, "%sfor (int64_t j = lane; j < %lldLL; j += KL_ROW_SPAN(%d)) {\n", indent, (long long)p->len,
            p->threads);
  else
    fprintf(f, "%sfor (int64_t j = lane; j < %lldLL; j += %d) {\n", indent, (long long)p->len,
            p->threads);
}

/* A loop that folds the row into `acc`.  With device_lanes, the host
 * device's one thread (KL_ROW_LANES 1) runs a GPU's threads of the row one
 * after another, each from acc's first value, and kl_cg_rows_combine then
 * meets their partials in the order of the GPU's shuffles and shared
 * memory: a row sums in the same order on both devices. */
void kl_cg_rows_sum_loop(FILE *f, const kl_cg_rows *p, const char *in) {
  if (!p->device_lanes) {
    kl_cg_rows_loop(f, p, in);
    return;
  }
  fprintf(f, "#if KL_ROW_LANES == 1\n%s__typeof__(acc) const kl_init = acc;\n%s__typeof__(acc) kl_part[%d];\n"
             "%sfor (int kl_vl = 0; kl_vl < %d; kl_vl++) {\n%sacc = kl_init;\n"
             "%sfor (int64_t j = kl_vl; j < %lldLL; j += %d) {\n#else\n%s{\n"
             "%sfor (int64_t j = lane; j < %lldLL; j += %d) {\n#endif\n",
          in, in, p->threads, in, p->threads, in, in, (long long)p->len, p->threads, in, in, (long long)p->len,
          p->threads);
}

/* Butterfly shuffles leave the warp's result in every lane; with a block
 * per row, each warp's result goes through shared memory and every thread
 * combines them in the same order, so all agree bit for bit.  After a
 * kl_cg_rows_sum_loop with device_lanes, the host device (KL_ROW_LANES 1)
 * meets the partials of its sequential lanes the same way: the lower lane
 * of each pair is acc, the other v. */
void kl_cg_rows_combine(FILE *f, const kl_cg_rows *p, const char *in, const char *type,
                        const char *update, const char *shared) {
  if (p->device_lanes) {
    fprintf(f, "#if KL_ROW_LANES == 1\n%s  kl_part[kl_vl] = acc;\n%s}\n"
               "%sfor (int kl_w = 0; kl_w < %d; kl_w++)\n"
               "%s  for (int kl_m = 16; kl_m > 0; kl_m >>= 1)\n"
               "%s    for (int kl_u = 0; kl_u < kl_m; kl_u++) {\n"
               "%s      acc = kl_part[kl_w * 32 + kl_u];\n"
               "%s      { const %s v = kl_part[kl_w * 32 + kl_u + kl_m]; %s }\n"
               "%s      kl_part[kl_w * 32 + kl_u] = acc;\n%s    }\n"
               "%sacc = kl_part[0];\n%sfor (int kl_w = 1; kl_w < %d; kl_w++) {\n"
               "%s  const %s v = kl_part[kl_w * 32];\n%s  %s\n%s}\n#else\n%s}\n",
            in, in, in, p->threads / 32, in, in, in, in, type, update, in, in, in, in, p->threads / 32, in, type,
            in, update, in, in);
  }
  fprintf(f, "%sfor (int o = 16; o > 0; o >>= 1) {\n"
             "%s  const %s v = __shfl_xor_sync(0xffffffffu, acc, o);\n%s  %s\n%s}\n",
          in, in, type, in, update, in);
  if (p->threads > 32) {
    fprintf(f, "%sif ((lane & 31) == 0) %s[lane >> 5] = acc;\n%s__syncthreads();\n%sacc = %s[0];\n",
            in, shared, in, in, shared);
    fprintf(f, "%sfor (int w = 1; w < %d; w++) {\n%s  const %s v = %s[w];\n%s  %s\n%s}\n", in,
            p->threads / 32, in, type, shared, in, update, in);
  }
  if (p->device_lanes) fprintf(f, "#endif\n");
}

/* An empty output: a kernel that is never launched (its index math would
 * divide by the zero dims). */
static kl_cg_grid empty_kernel(FILE *f, const char *name, const kl_node *n) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  char shape[160];
  fprintf(f, "/* %s: %s -> %s%s, empty */\n", n->name, kl_ops[n->op].name,
          kl_dtype_name(out->dtype), kl_shape_str(&out->shape, shape, sizeof shape));
  params(f, name, &in, 1, out);
  fprintf(f, "  (void)in0;\n  (void)out;\n}\n");
  entry(f, name, &in, 1, out);
  kl_cg_grid g = {0, GRID_BLOCK};
  return g;
}

/* ---- transpose ------------------------------------------------------------ */
/* A transpose with size-1 axes dropped and runs of axes that stay adjacent
 * merged: dims (input order), and perm (output axis d is input axis
 * perm[d]). */
typedef struct {
  int rank;
  int64_t dims[KL_MAX_RANK];
  int perm[KL_MAX_RANK];
} perm_view;

static perm_view simplify_transpose(const kl_node *n) {
  const kl_shape *s = &n->inputs[0]->shape;
  int r = s->rank, packed[KL_MAX_RANK], nk = 0, out_axis[KL_MAX_RANK], no = 0;
  const int64_t *p;
  int np = kl_attr_ints(n, "perm", &p);
  for (int a = 0; a < r; a++) packed[a] = s->dims[a] == 1 ? -1 : nk++;
  for (int d = 0; d < r; d++) { /* the packed input axes, in output order */
    int a = np == r ? (int)((p[d] + r) % r) : r - 1 - d;
    if (packed[a] >= 0) out_axis[no++] = packed[a];
  }
  int64_t packed_dims[KL_MAX_RANK];
  for (int a = 0; a < r; a++)
    if (packed[a] >= 0) packed_dims[packed[a]] = s->dims[a];
  /* groups: runs of consecutive input axes in output order */
  int lo[KL_MAX_RANK], hi[KL_MAX_RANK], ng = 0;
  for (int k = 0; k < no; k++) {
    if (ng && out_axis[k] == hi[ng - 1] + 1) {
      hi[ng - 1] = out_axis[k];
    } else {
      lo[ng] = hi[ng] = out_axis[k];
      ng++;
    }
  }
  perm_view v = {.rank = ng};
  for (int g = 0; g < ng; g++) {
    int at = 0; /* the group's place in input order */
    for (int h = 0; h < ng; h++) at += lo[h] < lo[g];
    v.dims[at] = 1;
    for (int a = lo[g]; a <= hi[g]; a++) v.dims[at] *= packed_dims[a];
    v.perm[g] = at;
  }
  return v;
}

/* Tiles pay when the output's innermost axis is not the input's and both
 * are long enough; with a short one the plain gather's strided side is
 * nearly coalesced already. */
static bool tiled_transpose(const perm_view *v) {
  int r = v->rank;
  return r >= 2 && v->perm[r - 1] != r - 1 && v->dims[r - 1] >= 8 && v->dims[v->perm[r - 1]] >= 8;
}

/* 32x32 tiles through shared memory (a padding column against bank
 * conflicts), blocks of 32x8 threads, one block per tile: reads run along
 * the input's innermost axis (a), writes along the output's (input axis
 * b); the other axes are the batch, taken apart from the block index. */
static kl_cg_grid transpose_tiles(FILE *f, const char *name, const kl_node *n,
                                  const perm_view *v) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  int r = v->rank, b = v->perm[r - 1], pa = 0, outermost = -1;
  int64_t in_str[KL_MAX_RANK], out_str[KL_MAX_RANK], out_dims[KL_MAX_RANK];
  for (int d = 0; d < r; d++) out_dims[d] = v->dims[v->perm[d]];
  in_str[r - 1] = out_str[r - 1] = 1;
  for (int d = r - 2; d >= 0; d--) {
    in_str[d] = in_str[d + 1] * v->dims[d + 1];
    out_str[d] = out_str[d + 1] * out_dims[d + 1];
  }
  long long batch = 1;
  for (int d = r - 1; d >= 0; d--) {
    if (v->perm[d] == r - 1) {
      pa = d;
    } else if (d != r - 1) {
      batch *= out_dims[d];
      outermost = d;
    }
  }
  long long A = v->dims[r - 1], B = v->dims[b], ta = (A + 31) / 32, tb = (B + 31) / 32;
  char shape[160];
  fprintf(f, "/* %s: %s -> %s%s, 32x32 tiles through shared memory */\n", n->name,
          kl_ops[n->op].name, kl_dtype_name(out->dtype),
          kl_shape_str(&out->shape, shape, sizeof shape));
  params(f, name, &in, 1, out);
  fprintf(f, "  KL_SHARED(%s, tile, [32][33]);\n", kl_cg_storage(in->dtype));
  fprintf(f, "  const int tx = (int)(threadIdx.x & 31), ty = (int)(threadIdx.x >> 5);\n");
  fprintf(f, "  const int64_t t = blockIdx.x, a0 = t %% %lldLL * 32, "
             "b0 = t / %lldLL %% %lldLL * 32;\n", ta, ta, tb);
  if (batch == 1) {
    fprintf(f, "  const int64_t ib = 0, ob = 0;\n");
  } else { /* innermost batch axis first */
    fprintf(f, "  int64_t rest = t / %lldLL, ib = 0, ob = 0;\n", ta * tb);
    for (int d = r - 2; d >= 0; d--) {
      if (d == pa) continue;
      fprintf(f, "  { const int64_t q = rest %% %lldLL;", (long long)out_dims[d]);
      if (d > outermost) fprintf(f, " rest /= %lldLL;", (long long)out_dims[d]);
      fprintf(f, " ib += q * %lldLL; ob += q * %lldLL; }\n", (long long)in_str[v->perm[d]],
              (long long)out_str[d]);
    }
  }
  fprintf(f, "  for (int y = ty; y < 32; y += 8) {\n    const int64_t a = a0 + tx, b = b0 + y;\n"
             "    if (a < %lldLL && b < %lldLL) tile[y][tx] = in0[ib + b * %lldLL + a];\n  }\n"
             "  __syncthreads();\n", A, B, (long long)in_str[b]);
  fprintf(f, "  for (int y = ty; y < 32; y += 8) {\n    const int64_t a = a0 + y, b = b0 + tx;\n"
             "    if (a < %lldLL && b < %lldLL) out[ob + a * %lldLL + b] = tile[tx][y];\n  }\n}\n",
          A, B, (long long)out_str[pa]);
  entry(f, name, &in, 1, out);
  kl_cg_grid g = {ta * tb * batch, 256};
  return g;
}

kl_cg_grid kl_cg_transpose(FILE *f, const char *name, const kl_node *n) {
  perm_view v = simplify_transpose(n);
  if (kl_shape_numel(&n->outputs[0]->shape) == 0) return empty_kernel(f, name, n);
  if (tiled_transpose(&v)) return transpose_tiles(f, name, n, &v);
  kl_cg_gather_copy(f, name, n);
  return grid_stride(kl_shape_numel(&n->outputs[0]->shape));
}

/* ---- softmax ------------------------------------------------------------- */
/* Max and the sum of exponentials in the compute type (float; double for
 * f64), the result from both; a NaN anywhere in the row makes the row
 * NaN. */
static const char *softmax_value(const kl_node *n, bool dbl) {
  if (n->op == KL_OP_SOFTMAX) return dbl ? "exp(v - m) / sum" : "expf(v - m) / (float)sum";
  return dbl ? "v - m - log(sum)" : "v - m - logf((float)sum)";
}

/* Contiguous rows (axis innermost): a row kernel. */
static kl_cg_grid softmax_rows(FILE *f, const char *name, const kl_node *n, int64_t rows,
                               int64_t len) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  const char *ct = kl_cg_compute_type(in->dtype), *s = !strcmp(ct, "double") ? "" : "f";
  kl_cg_rows p = kl_cg_plan_rows(rows, len);
  char shape[160];
  fprintf(f, "/* %s: %s over the rows of %s%s, %s per row */\n", n->name, kl_ops[n->op].name,
          kl_dtype_name(in->dtype), kl_shape_str(&in->shape, shape, sizeof shape),
          p.threads == 32 ? "a warp" : "a block");
  params(f, name, &in, 1, out);
  kl_cg_rows_shared(f, &p, ct, "part_max");
  kl_cg_rows_shared(f, &p, ct, "part_sum");
  kl_cg_rows_begin(f, &p);
  fprintf(f, "  const int64_t base = row * %lldLL;\n  %s m, sum;\n", (long long)len, ct);
  const char *max = "acc = (v != v || v > acc) ? v : acc;";
  fprintf(f, "  {\n    %s acc = -KL_INF;\n", ct);
  kl_cg_rows_sum_loop(f, &p, "    ");
  fprintf(f, "      const %s v = ", ct);
  load(f, in->dtype, "in0[base + j]");
  fprintf(f, ";\n      %s\n    }\n", max);
  kl_cg_rows_combine(f, &p, "    ", ct, max, "part_max");
  fprintf(f, "    m = acc;\n  }\n  {\n    %s acc = 0;\n", ct);
  kl_cg_rows_sum_loop(f, &p, "    ");
  fprintf(f, "      const %s v = ", ct);
  load(f, in->dtype, "in0[base + j]");
  fprintf(f, ";\n      acc += exp%s(v - m);\n    }\n", s);
  kl_cg_rows_combine(f, &p, "    ", ct, "acc += v;", "part_sum");
  fprintf(f, "    sum = acc;\n  }\n");
  kl_cg_rows_loop(f, &p, "  ");
  fprintf(f, "    const %s v = ", ct);
  load(f, in->dtype, "in0[base + j]");
  fprintf(f, ";\n    ");
  kl_cg_store(f, out->dtype, "out[base + j]", softmax_value(n, !s[0]));
  fprintf(f, "  }\n}\n");
  entry(f, name, &in, 1, out);
  return kl_cg_rows_grid(&p);
}

/* Strided rows (axis not innermost): one thread per row. */
static kl_cg_grid softmax_strided(FILE *f, const char *name, const kl_node *n, int axis,
                                  int64_t outer, int64_t len, int64_t inner) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
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
  fprintf(f, "    %s m = -KL_INF, sum = 0;\n", ct);
  fprintf(f, "    for (int64_t j = 0; j < %lld; j++) { %s v = ", (long long)len, ct);
  load(f, in->dtype, at);
  fprintf(f, "; m = (v != v || v > m) ? v : m; }\n");
  fprintf(f, "    for (int64_t j = 0; j < %lld; j++) { %s v = ", (long long)len, ct);
  load(f, in->dtype, at);
  fprintf(f, "; sum += exp%s(v - m); }\n", s);
  fprintf(f, "    for (int64_t j = 0; j < %lld; j++) { %s v = ", (long long)len, ct);
  load(f, in->dtype, at);
  fprintf(f, ";\n      ");
  kl_cg_store(f, out->dtype, dst, softmax_value(n, !s[0]));
  fprintf(f, "    }\n  }\n}\n");
  entry(f, name, &in, 1, out);
  return grid_stride(outer * inner);
}

/* softmax / log_softmax over one axis. */
kl_cg_grid kl_cg_softmax(FILE *f, const char *name, const kl_node *n) {
  const kl_shape *s = &n->inputs[0]->shape;
  int r = s->rank, axis = (int)kl_attr_int(n, "axis", -1);
  if (axis < 0) axis += r;
  int64_t len = s->dims[axis], inner = 1, outer = 1;
  for (int d = axis + 1; d < r; d++) inner *= s->dims[d];
  for (int d = 0; d < axis; d++) outer *= s->dims[d];
  if (kl_shape_numel(s) == 0) return empty_kernel(f, name, n);
  if (inner == 1) return softmax_rows(f, name, n, outer, len);
  return softmax_strided(f, name, n, axis, outer, len, inner);
}

/* ---- reductions ------------------------------------------------------------ */
/* How a reduction accumulates: in the real type (float; double for f64;
 * partial sums combined as a tree across threads) or 64-bit integers, with
 * integer products wrapping as uint64_t like the interpreter's; max/min
 * let a NaN win.  `update` folds v into acc, in any order. */
typedef struct {
  const char *acc, *init, *update;
} reduce_ops;

/* The smallest and largest value of integer (or bool) dtype t, spelled
 * out: NVRTC has no <stdint.h> macros. */
static const char *int_limit(kl_dtype t, bool max) {
  switch (t) {
  case KL_BOOL: return max ? "1" : "0";
  case KL_I8: return max ? "127" : "(-128)";
  case KL_I16: return max ? "32767" : "(-32768)";
  case KL_I32: return max ? "2147483647" : "(-2147483647 - 1)";
  case KL_U8: return max ? "255" : "0";
  case KL_U16: return max ? "65535" : "0";
  case KL_U32: return max ? "4294967295U" : "0";
  case KL_U64: return max ? "18446744073709551615ULL" : "0";
  default: return max ? "9223372036854775807LL" : "(-9223372036854775807LL - 1)";
  }
}

static reduce_ops reduce_ops_of(const kl_node *n) {
  kl_dtype t = n->inputs[0]->dtype;
  bool is_f = kl_dtype_is_float(t), uns = kl_dtype_is_unsigned(t) || t == KL_BOOL;
  reduce_ops r = {is_f ? kl_cg_real_type(t) : uns ? "uint64_t" : "int64_t", "0", "acc += v;"};
  switch (n->op) {
  case KL_OP_REDUCE_PROD:
    r.init = "1";
    r.update = "acc *= v;";
    if (!is_f) r.acc = "uint64_t";
    break;
  /* an empty max (min) is the dtype's lowest (highest) value, as ONNX */
  case KL_OP_REDUCE_MAX:
    r.init = is_f ? "-KL_INF" : int_limit(t, false);
    r.update = is_f ? "acc = (v != v || v > acc) ? v : acc;" : "acc = v > acc ? v : acc;";
    break;
  case KL_OP_REDUCE_MIN:
    r.init = is_f ? "KL_INF" : int_limit(t, true);
    r.update = is_f ? "acc = (v != v || v < acc) ? v : acc;" : "acc = v < acc ? v : acc;";
    break;
  default: break;
  }
  return r;
}

/* Statement `const ACC v = in0[at];` (converted to the accumulator). */
static void reduce_load(FILE *f, const char *indent, const kl_value *in, const reduce_ops *r,
                        const char *at) {
  fprintf(f, "%sconst %s v = (%s)", indent, r->acc, r->acc);
  if (converts(in->dtype)) load(f, in->dtype, at);
  else fprintf(f, "%s", at);
  fprintf(f, ";\n");
}

/* `dst = result;`: the mean divides by the count. */
static void reduce_store(FILE *f, const kl_node *n, const char *dst, int64_t count) {
  char value[64];
  if (n->op == KL_OP_REDUCE_MEAN) snprintf(value, sizeof value, "acc / %lld", (long long)count);
  else snprintf(value, sizeof value, "acc");
  kl_cg_store(f, n->outputs[0]->dtype, dst, value);
}

static void reduce_head(FILE *f, const char *name, const kl_node *n, const char *how) {
  const kl_value *in = n->inputs[0];
  char shape[160];
  fprintf(f, "/* %s: %s of %s%s%s */\n", n->name, kl_ops[n->op].name, kl_dtype_name(in->dtype),
          kl_shape_str(&in->shape, shape, sizeof shape), how);
  params(f, name, &in, 1, n->outputs[0]);
}

/* Reduced axes innermost: rows of len contiguous elements. */
static kl_cg_grid reduce_rows(FILE *f, const char *name, const kl_node *n, int64_t rows,
                              int64_t len) {
  reduce_ops r = reduce_ops_of(n);
  kl_cg_rows p = kl_cg_plan_rows(rows, len);
  reduce_head(f, name, n, p.threads == 32 ? ", a warp per row" : ", a block per row");
  kl_cg_rows_shared(f, &p, r.acc, "part");
  kl_cg_rows_begin(f, &p);
  fprintf(f, "  %s acc = %s;\n", r.acc, r.init);
  kl_cg_rows_sum_loop(f, &p, "  ");
  char at[64];
  snprintf(at, sizeof at, "in0[row * %lldLL + j]", (long long)len);
  reduce_load(f, "    ", n->inputs[0], &r, at);
  fprintf(f, "    %s\n  }\n", r.update);
  kl_cg_rows_combine(f, &p, "  ", r.acc, r.update, "part");
  fprintf(f, "  if (lane == 0) ");
  reduce_store(f, n, "out[row]", len);
  fprintf(f, "}\n");
  entry(f, name, (const kl_value *const *)n->inputs, 1, n->outputs[0]);
  return kl_cg_rows_grid(&p);
}

/* A reduced axis of len with `inner` contiguous kept elements after it:
 * each output element (column) is a thread's, so neighbouring threads
 * read neighbouring elements; a block is C columns by S slices of the
 * reduced axis, the slices' partials combined through shared memory. */
static kl_cg_grid reduce_columns(FILE *f, const char *name, const kl_node *n, int64_t outer,
                                 int64_t len, int64_t inner) {
  reduce_ops r = reduce_ops_of(n);
  int64_t cols = outer * inner;
  int c = 1, s = 1;
  while (c < 32 && c < cols) c *= 2;
  while (s < 256 / c && s < len) s *= 2;
  c = 256 / s;
  char how[64];
  snprintf(how, sizeof how, ", %d columns x %d slices per block", c, s);
  reduce_head(f, name, n, how);
  if (s > 1) fprintf(f, "  KL_SHARED(%s, part, [%d][%d]);\n", r.acc, s, c);
  fprintf(f, "  const int col = (int)(threadIdx.x %% %d);\n", c);
  if (s > 1) fprintf(f, "  const int slice = (int)(threadIdx.x / %d);\n", c);
  fprintf(f, "  const int64_t q = (int64_t)blockIdx.x * %d + col;\n", c);
  fprintf(f, "  %s acc = %s;\n", r.acc, r.init);
  fprintf(f, "  if (q < %lldLL) {\n", (long long)cols);
  if (outer == 1) fprintf(f, "    const int64_t base = q;\n");
  else fprintf(f, "    const int64_t base = q / %lldLL * %lldLL + q %% %lldLL;\n", (long long)inner,
               (long long)(len * inner), (long long)inner);
  fprintf(f, "    for (int64_t j = %s; j < %lldLL; j += %d) {\n", s > 1 ? "slice" : "0",
          (long long)len, s);
  char at[64];
  snprintf(at, sizeof at, "in0[base + j * %lldLL]", (long long)inner);
  reduce_load(f, "      ", n->inputs[0], &r, at);
  fprintf(f, "      %s\n    }\n  }\n", r.update);
  if (s > 1) {
    fprintf(f, "  part[slice][col] = acc;\n  __syncthreads();\n"
               "  if (slice != 0 || q >= %lldLL) return;\n", (long long)cols);
    fprintf(f, "  for (int k = 1; k < %d; k++) {\n    const %s v = part[k][col];\n    %s\n  }\n", s,
            r.acc, r.update);
  } else {
    fprintf(f, "  if (q >= %lldLL) return;\n", (long long)cols);
  }
  fprintf(f, "  ");
  reduce_store(f, n, "out[q]", len);
  fprintf(f, "}\n");
  entry(f, name, (const kl_value *const *)n->inputs, 1, n->outputs[0]);
  kl_cg_grid g = {(cols + c - 1) / c, 256};
  return g;
}

/* Any other set of axes: one thread per output element walks its reduced
 * elements. */
static kl_cg_grid reduce_generic(FILE *f, const char *name, const kl_node *n, const bool *reduced) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  int r = in->shape.rank;
  int64_t strides[KL_MAX_RANK], count = 1;
  kl_shape_strides(&in->shape, strides);
  for (int d = 0; d < r; d++)
    if (reduced[d]) count *= in->shape.dims[d];
  reduce_ops ops = reduce_ops_of(n);
  reduce_head(f, name, n, "");
  grid_stride_loop(f, kl_shape_numel(&out->shape));
  bool kept = false;
  for (int d = 0; d < r; d++) kept |= !reduced[d] && in->shape.dims[d] != 1;
  fprintf(f, kept ? "    int64_t r = i, base = 0;\n" : "    const int64_t base = 0;\n");
  for (int d = r - 1; d >= 0 && kept; d--)
    if (!reduced[d] && in->shape.dims[d] != 1)
      fprintf(f, "    { int64_t q = r %% %lld; r /= %lld; base += q * %lld; }\n",
              (long long)in->shape.dims[d], (long long)in->shape.dims[d], (long long)strides[d]);
  fprintf(f, "    %s acc = %s;\n", ops.acc, ops.init);
  fprintf(f, "    for (int64_t j = 0; j < %lldLL; j++) {\n      int64_t %soff = base;\n",
          (long long)count, count > 0 ? "s = j, " : "");
  for (int d = r - 1; d >= 0 && count > 0; d--) /* count 0: the loop never runs */
    if (reduced[d])
      fprintf(f, "      { int64_t q = s %% %lld; s /= %lld; off += q * %lld; }\n",
              (long long)in->shape.dims[d], (long long)in->shape.dims[d], (long long)strides[d]);
  reduce_load(f, "      ", in, &ops, "in0[off]");
  fprintf(f, "      %s\n    }\n    ", ops.update);
  reduce_store(f, n, "out[i]", count);
  fprintf(f, "  }\n}\n");
  entry(f, name, &in, 1, out);
  return grid_stride(kl_shape_numel(&out->shape));
}

/* C literal of a value of dtype t (already rounded to it). */
static const char *literal(kl_dtype t, double v, char *buf, size_t len) {
  if (kl_dtype_is_float(t)) {
    if (isnan(v)) snprintf(buf, len, "KL_NAN");
    else if (isinf(v)) snprintf(buf, len, v > 0 ? "KL_INF" : "-KL_INF");
    else snprintf(buf, len, "%.17g", v);
  } else if (kl_dtype_is_unsigned(t) || t == KL_BOOL) {
    /* a double holds UINT64_MAX (INT64_MAX) as 2^64 (2^63): saturate */
    if (v >= 0x1p64) snprintf(buf, len, "18446744073709551615ULL");
    else snprintf(buf, len, "%lluULL", (unsigned long long)v);
  } else if (v <= -9223372036854775808.0) {
    snprintf(buf, len, "(-9223372036854775807LL - 1)");
  } else if (v >= 9223372036854775807.0) {
    snprintf(buf, len, "9223372036854775807LL");
  } else {
    snprintf(buf, len, "%lldLL", (long long)v);
  }
  return buf;
}

/* Nothing to reduce: every output is the interpreter's value for an empty
 * reduction (its identity, rounded to the dtype; NaN for a mean), which
 * it computes now. */
static bool reduce_empty(FILE *f, const char *name, const kl_node *n, kl_cg_grid *g) {
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  kl_tensor *x = kl_tensor_new(in->dtype, &in->shape), *y = kl_tensor_new(out->dtype, &out->shape);
  kl_error err;
  bool ok = kl_ops[n->op].eval(n, &x, &y, &err) == 0;
  double v = kl_dtype_round(out->dtype, y->data[0]);
  kl_tensor_free(x);
  kl_tensor_free(y);
  if (!ok) return false;
  char lit[64];
  reduce_head(f, name, n, ", empty");
  fprintf(f, "  (void)in0;\n");
  grid_stride_loop(f, kl_shape_numel(&out->shape));
  fprintf(f, "    ");
  kl_cg_store(f, out->dtype, "out[i]", literal(out->dtype, v, lit, sizeof lit));
  fprintf(f, "  }\n}\n");
  entry(f, name, &in, 1, out);
  *g = grid_stride(kl_shape_numel(&out->shape));
  return true;
}

/* reduce_*: size-1 axes dropped and neighbours of the same kind merged,
 * the input is [rows, len] with len reduced (a row kernel), or [outer,
 * len, inner] with len reduced (columns); else the generic kernel. */
kl_cg_grid kl_cg_reduce(FILE *f, const char *name, const kl_node *n) {
  const kl_shape *s = &n->inputs[0]->shape;
  int r = s->rank;
  bool reduced[KL_MAX_RANK] = {0};
  const int64_t *axes;
  int na = kl_attr_ints(n, "axes", &axes);
  for (int d = 0; d < r; d++) reduced[d] = na < 0;
  for (int k = 0; k < na; k++) reduced[(axes[k] % r + r) % r] = true;
  int64_t count = 1, numel_out = kl_shape_numel(&n->outputs[0]->shape);
  for (int d = 0; d < r; d++)
    if (reduced[d]) count *= s->dims[d];
  kl_cg_grid g;
  if (numel_out == 0) return empty_kernel(f, name, n);
  if (count == 0 && reduce_empty(f, name, n, &g)) return g;
  int64_t dims[KL_MAX_RANK];
  bool red[KL_MAX_RANK];
  int k = 0;
  for (int d = 0; d < r && count > 0; d++) {
    if (s->dims[d] == 1) continue;
    if (k && red[k - 1] == reduced[d]) {
      dims[k - 1] *= s->dims[d];
    } else {
      dims[k] = s->dims[d];
      red[k++] = reduced[d];
    }
  }
  if (k >= 1 && k <= 2 && red[k - 1] && (k == 1 || !red[0]))
    return reduce_rows(f, name, n, k == 2 ? dims[0] : 1, dims[k - 1]);
  if (k >= 2 && k <= 3 && !red[k - 1] && red[k - 2] && (k == 2 || !red[0]))
    return reduce_columns(f, name, n, k == 3 ? dims[0] : 1, dims[k - 2], dims[k - 1]);
  return reduce_generic(f, name, n, reduced);
}

/* ---- for the fused kernels of emit_fused.c ----------------------------- */
const char *kl_cg_expression(const kl_node *n, const char *ct, char *buf, size_t len) {
  return expression(n, ct, buf, len);
}

const char *kl_cg_operand_type(const kl_node *n) {
  return kl_cg_compute_type(operand_dtype(n));
}

void kl_cg_index_math(FILE *f, const kl_shape *out, const kl_value *const *ins, int nins) {
  index_math(f, out, ins, nins);
}

void kl_cg_grid_stride_loop(FILE *f, int64_t n) { grid_stride_loop(f, n); }

/* How a row reduction accumulates (see reduce_ops_of). */
void kl_cg_reduce_ops(const kl_node *n, const char **acc, const char **init, const char **update) {
  reduce_ops r = reduce_ops_of(n);
  *acc = r.acc, *init = r.init, *update = r.update;
}

/* softmax / log_softmax of v given the row's max m and sum of exp(v - m). */
const char *kl_cg_softmax_value(const kl_node *n, bool dbl) { return softmax_value(n, dbl); }
