/* util.c - dtypes, shapes, errors, the arena and the random generator. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "op_impl.h"

_Static_assert((int)KL_F32 == (int)KRT_F32 && (int)KL_BOOL == (int)KRT_BOOL &&
                   (int)KL_DTYPE_COUNT == (int)KRT_DTYPE_COUNT,
               "kl_dtype and krt_dtype must agree");

static const char *const dtype_names[KL_DTYPE_COUNT] = {
    "f32", "f16", "bf16", "f64", "i8", "i32", "i64", "bool",
    "u8", "i16", "u16", "u32", "u64",
    "f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz", "u4", "i4",
    "f4e2m1", "f8e8m0", "u2", "i2"};
/* The narrow types take one byte each inside Kiln (see ir.h). */
static const size_t dtype_sizes[KL_DTYPE_COUNT] = {4, 2, 2, 8, 1, 4, 8, 1,
                                                   1, 2, 2, 4, 8,
                                                   1, 1, 1, 1, 1, 1,
                                                   1, 1, 1, 1};

const char *kl_dtype_name(kl_dtype t) {
  return (unsigned)t < KL_DTYPE_COUNT ? dtype_names[t] : "?";
}

int kl_dtype_from_name(const char *s, kl_dtype *out) {
  for (int i = 0; i < KL_DTYPE_COUNT; i++)
    if (strcmp(s, dtype_names[i]) == 0) {
      *out = (kl_dtype)i;
      return 0;
    }
  return -1;
}

size_t kl_dtype_size(kl_dtype t) { return dtype_sizes[t]; }

bool kl_dtype_is_float(kl_dtype t) {
  return t == KL_F32 || t == KL_F16 || t == KL_BF16 || t == KL_F64;
}

bool kl_dtype_is_int(kl_dtype t) {
  return t == KL_I8 || t == KL_I32 || t == KL_I64 || t == KL_I16 || t == KL_I4 ||
         t == KL_I2 || kl_dtype_is_unsigned(t);
}

bool kl_dtype_is_unsigned(kl_dtype t) {
  return t == KL_U8 || t == KL_U16 || t == KL_U32 || t == KL_U64 || t == KL_U4 || t == KL_U2;
}

bool kl_dtype_is_small_float(kl_dtype t) { return krt_dtype_is_small_float((krt_dtype)t); }

int kl_dtype_bits(kl_dtype t) { return krt_dtype_bits((krt_dtype)t); }

/* Width in bits of an integer dtype. */
static int int_bits(kl_dtype t) {
  switch (t) {
  case KL_I2: case KL_U2: return 2;
  case KL_I4: case KL_U4: return 4;
  case KL_I8: case KL_U8: return 8;
  case KL_I16: case KL_U16: return 16;
  case KL_I32: case KL_U32: return 32;
  default: return 64;
  }
}

/* Integer conversion as C does it for in-range values, and wrap-around
 * (two's complement) instead of undefined behaviour for the rest. */
static double wrap_int(double v, int bits, bool is_unsigned) {
  if (isnan(v)) return 0;
  v = trunc(v);
  double span = ldexp(1.0, bits), lo = is_unsigned ? 0 : -span / 2;
  if (v >= lo && v < lo + span) return v;
  if (bits == 64) return v < lo ? lo : lo + span - 1; /* saturate */
  v = fmod(v, span);
  if (v < lo) v += span;
  if (v >= lo + span) v -= span;
  return v;
}

/* Through f32 to the small float's code and back, as the kernels do. */
static double small_float_round(kl_dtype t, double v, bool saturate, int round_mode) {
  uint8_t code = krt_f32_to_small_float((krt_dtype)t, (float)v, saturate, round_mode);
  return krt_small_float_to_f32((krt_dtype)t, code);
}

double kl_dtype_round(kl_dtype t, double v) {
  switch (t) {
  case KL_F32: return (double)(float)v;
  case KL_F16: return krt_f16_to_f32(krt_f32_to_f16((float)v));
  case KL_BF16: return krt_bf16_to_f32(krt_f32_to_bf16((float)v));
  case KL_F64: return v;
  case KL_BOOL: return v != 0 ? 1 : 0;
  case KL_I8: case KL_I16: case KL_I32: case KL_I64:
  case KL_U8: case KL_U16: case KL_U32: case KL_U64:
  case KL_I4: case KL_U4: case KL_I2: case KL_U2:
    return wrap_int(v, int_bits(t), kl_dtype_is_unsigned(t));
  case KL_F8E4M3FN: case KL_F8E4M3FNUZ: case KL_F8E5M2: case KL_F8E5M2FNUZ:
  case KL_F4E2M1: case KL_F8E8M0:
    /* E8M0 rounds down here: that keeps every E8M0 value, also code 0
     * (2^-127, an f32 subnormal, which "up" would move) */
    return small_float_round(t, v, false, KL_ROUND_DOWN);
  default: return v;
  }
}

double kl_dtype_cast(kl_dtype from, kl_dtype to, double v, bool saturate, int round_mode) {
  if (kl_dtype_is_small_float(to)) return small_float_round(to, v, saturate, round_mode);
  bool narrow_int = to == KL_I4 || to == KL_U4 || to == KL_I2 || to == KL_U2;
  if (narrow_int && !kl_dtype_is_int(from) && from != KL_BOOL) {
    /* float to a 4- or 2-bit integer: out of range is undefined by the
     * spec; ONNX's reference (ml_dtypes) gives 0, and so do the kernels */
    double t = trunc(v), span = ldexp(1.0, int_bits(to));
    double lo = kl_dtype_is_unsigned(to) ? 0 : -span / 2;
    return t >= lo && t < lo + span ? t : 0;
  }
  return kl_dtype_round(to, v);
}

int64_t kl_shape_numel(const kl_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}

bool kl_shape_equal(const kl_shape *a, const kl_shape *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

const char *kl_shape_str(const kl_shape *s, char *buf, size_t n) {
  size_t used = 0;
  used += (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < s->rank && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "",
                             (long long)s->dims[i]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

void kl_shape_strides(const kl_shape *s, int64_t *strides) {
  int64_t st = 1;
  for (int i = s->rank - 1; i >= 0; i--) {
    strides[i] = st;
    st *= s->dims[i];
  }
}

int64_t kl_broadcast_index(const kl_shape *src, const kl_shape *dst,
                           const int64_t *idx) {
  int64_t flat = 0, st = 1;
  int off = dst->rank - src->rank;
  for (int i = src->rank - 1; i >= 0; i--) {
    if (src->dims[i] != 1) flat += idx[i + off] * st;
    st *= src->dims[i];
  }
  return flat;
}

bool kl_index_next(const kl_shape *s, int64_t *idx) {
  for (int i = s->rank - 1; i >= 0; i--) {
    if (++idx[i] < s->dims[i]) return true;
    idx[i] = 0;
  }
  return false;
}

int kl_broadcast_shapes(const kl_shape *a, const kl_shape *b, kl_shape *out,
                        kl_error *err, kl_loc loc) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  kl_shape s = {.rank = r};
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[128], sb[128];
      return kl_fail(err, loc, "cannot broadcast %s with %s (axis %d: %lld vs %lld)",
                     kl_shape_str(a, sa, sizeof sa), kl_shape_str(b, sb, sizeof sb),
                     i, (long long)da, (long long)db);
    }
    s.dims[i] = da == 1 ? db : da;
  }
  *out = s;
  return 0;
}

int kl_fail(kl_error *err, kl_loc loc, const char *fmt, ...) {
  if (!err) return -1;
  va_list ap;
  va_start(ap, fmt);
  err->loc = loc;
  err->unsupported = false;
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return -1;
}

int kl_node_fail(const kl_node *n, kl_error *err, const char *fmt, ...) {
  if (!err) return -1;
  char body[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  return kl_fail(err, n->loc, "%s (node '%s'): %s", kl_ops[n->op].name,
                 n->name ? n->name : "?", body);
}

int kl_norm_axis(int64_t axis, int rank, int *out, const kl_node *n,
                 kl_error *err) {
  if (axis < -rank || axis >= rank || (rank == 0 && axis != 0))
    return kl_node_fail(n, err, "axis %lld is out of range for rank %d",
                        (long long)axis, rank);
  *out = (int)(axis < 0 ? axis + rank : axis);
  return 0;
}

/* ---- helpers for op rows (op_impl.h) --------------------------------- */
const char *kl_value_str(const kl_value *v, char *buf, size_t n) {
  char s[256];
  snprintf(buf, n, "%s%s", kl_dtype_name(v->dtype),
           kl_shape_str(&v->shape, s, sizeof s));
  return buf;
}

/* Divides before multiplying so nothing overflows. */
int64_t kl_checked_numel(const kl_shape *s) {
  bool zero = false;
  for (int i = 0; i < s->rank; i++) {
    if (s->dims[i] < 0) return -1;
    if (s->dims[i] == 0) zero = true;
  }
  if (zero) return 0;
  int64_t p = 1;
  for (int i = 0; i < s->rank; i++) {
    if (s->dims[i] > KL_MAX_NUMEL / p) return -1;
    p *= s->dims[i];
  }
  return p;
}

int kl_set_checked_output(kl_node *n, kl_error *err, int k, kl_dtype t,
                          const kl_shape *s) {
  if (kl_checked_numel(s) < 0) {
    char b[256];
    return KL_NODE_FAIL(n, err, "output shape %s is too large (limit %lld "
                        "elements)", kl_shape_str(s, b, sizeof b),
                        (long long)KL_MAX_NUMEL);
  }
  kl_set_output(n, k, t, s);
  return 0;
}

int kl_attr_flag(const kl_node *n, kl_error *err, const char *name,
                 int64_t dflt, bool *out) {
  int64_t v = kl_attr_int(n, name, dflt);
  if (v != 0 && v != 1)
    return KL_NODE_FAIL(n, err, "%s must be 0 or 1, got %lld", name,
                        (long long)v);
  *out = v == 1;
  return 0;
}

/* Interpreter values of integer dtypes are integral and in range, so the
 * conversion is exact; the clamps only guard against undefined behaviour. */
int64_t kl_to_i64(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

double kl_wrap_to(kl_dtype t, uint64_t u) {
  int bits = int_bits(t);
  if (bits < 64) u &= ((uint64_t)1 << bits) - 1;
  if (kl_dtype_is_unsigned(t)) return (double)u;
  if (bits < 64) return u >> (bits - 1) ? (double)u - ldexp(1.0, bits) : (double)u;
  return u >> 63 ? -(double)(~u) - 1.0 : (double)u;
}

/* Print the offending source line with a caret under the column. */
void kl_error_print(FILE *f, const kl_error *err) {
  const kl_loc *l = &err->loc;
  if (!l->file) {
    fprintf(f, "kiln: error: %s\n", err->msg);
    return;
  }
  if (l->line <= 0) {
    fprintf(f, "%s: error: %s\n", l->file, err->msg);
    return;
  }
  fprintf(f, "%s:%d:%d: error: %s\n", l->file, l->line, l->col, err->msg);
  FILE *src = fopen(l->file, "r");
  if (!src) return;
  char buf[512];
  int line = 1;
  while (fgets(buf, sizeof buf, src)) {
    size_t len = strlen(buf);
    bool whole = len > 0 && buf[len - 1] == '\n';
    if (line == l->line) {
      if (whole) buf[--len] = 0;
      fprintf(f, "  %s\n  ", buf);
      for (int i = 1; i < l->col && (size_t)(i - 1) < len; i++)
        fputc(buf[i - 1] == '\t' ? '\t' : ' ', f);
      fputs("^\n", f);
      break;
    }
    if (whole) line++;
  }
  fclose(src);
}

/* ---- arena ----------------------------------------------------------- */
struct kl_arena_block {
  kl_arena_block *next;
  size_t used, cap;
  max_align_t data[];
};

void *kl_arena_alloc(kl_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  kl_arena_block *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    b = malloc(sizeof *b + cap);
    if (!b) {
      fprintf(stderr, "kiln: out of memory (%zu bytes)\n", n);
      exit(3);
    }
    b->next = a->head;
    b->used = 0;
    b->cap = cap;
    a->head = b;
  }
  void *p = (char *)b->data + b->used;
  b->used += n;
  memset(p, 0, n);
  return p;
}

char *kl_arena_strdup(kl_arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = kl_arena_alloc(a, n);
  memcpy(p, s, n);
  return p;
}

void kl_arena_free(kl_arena *a) {
  for (kl_arena_block *b = a->head, *next; b; b = next) {
    next = b->next;
    free(b);
  }
  a->head = NULL;
}

/* ---- random numbers -------------------------------------------------- */
/* the runtime's generator (runtime/random.c): the same seed gives the same
 * numbers in the interpreter, in kiln run and in a compiled program */
void kl_rng_seed(kl_rng *r, uint64_t seed) { r->state = seed; }
uint64_t kl_rng_next(kl_rng *r) { return krt_rng_next(&r->state); }
double kl_rng_uniform(kl_rng *r) { return krt_rng_uniform(&r->state); }
double kl_rng_normal(kl_rng *r) { return krt_rng_normal(&r->state); }

int kl_need_float(const kl_node *n, kl_error *err, const kl_value *v) {
  if (kl_dtype_is_float(v->dtype)) return 0;
  char b[256];
  return kl_node_fail(n, err, "needs a floating-point input, got %s",
                      kl_value_str(v, b, sizeof b));
}

int kl_need_numeric(const kl_node *n, kl_error *err, const kl_value *v) {
  if (v->dtype != KL_BOOL) return 0;
  char b[256];
  return kl_node_fail(n, err, "does not accept bool, got %s (cast it first)",
                      kl_value_str(v, b, sizeof b));
}
