/* half.c - dtype basics (sizes, names, element counts) and float <-> IEEE
 * fp16 / bfloat16 conversions.
 *
 * The conversions are hand-written: they are a few lines of bit twiddling
 * and no Debian package offers them for C.  float -> half rounds to nearest,
 * ties to even, on the integer bit pattern, so the result does not depend on
 * the FPU rounding mode or on compiler flags. */
#include <stdlib.h>
#include <string.h>

#include "kilnrt.h"

/* ---- dtypes and tensors ---------------------------------------------- */
static const struct {
  const char *name;
  size_t size;
} dtypes[KRT_DTYPE_COUNT] = {
    [KRT_F32] = {"f32", 4}, [KRT_F16] = {"f16", 2}, [KRT_BF16] = {"bf16", 2},
    [KRT_F64] = {"f64", 8}, [KRT_I8] = {"i8", 1},   [KRT_I32] = {"i32", 4},
    [KRT_I64] = {"i64", 8}, [KRT_BOOL] = {"bool", 1}, [KRT_U8] = {"u8", 1},
    [KRT_I16] = {"i16", 2}, [KRT_U16] = {"u16", 2}, [KRT_U32] = {"u32", 4},
    [KRT_U64] = {"u64", 8},
    [KRT_F8E4M3FN] = {"f8e4m3fn", 1}, [KRT_F8E4M3FNUZ] = {"f8e4m3fnuz", 1},
    [KRT_F8E5M2] = {"f8e5m2", 1}, [KRT_F8E5M2FNUZ] = {"f8e5m2fnuz", 1},
    [KRT_U4] = {"u4", 1}, [KRT_I4] = {"i4", 1}, [KRT_F4E2M1] = {"f4e2m1", 1},
    [KRT_F8E8M0] = {"f8e8m0", 1}, [KRT_U2] = {"u2", 1}, [KRT_I2] = {"i2", 1},
};

size_t krt_dtype_size(krt_dtype t) {
  return (unsigned)t < KRT_DTYPE_COUNT ? dtypes[t].size : 0;
}

const char *krt_dtype_name(krt_dtype t) {
  return (unsigned)t < KRT_DTYPE_COUNT ? dtypes[t].name : "?";
}

int64_t krt_tensor_numel(const krt_tensor *t) {
  if (!t || t->rank < 0 || t->rank > KRT_MAX_RANK) return -1;
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++)
    if (t->dims[i] < 0 || t->dims[i] > KRT_MAX_NUMEL) return -1;
  for (int i = 0; i < t->rank; i++) {
    if (t->dims[i] == 0) return 0;
    /* Both factors are <= 2^31 - 1, so the product cannot overflow. */
    n *= t->dims[i];
    if (n > KRT_MAX_NUMEL) return -1;
  }
  return n;
}

void krt_tensor_free(krt_tensor *t) {
  if (!t) return;
  free(t->data);
  t->data = NULL;
}

/* ---- fp16 ------------------------------------------------------------ */
static uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

static float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* Shift `m` right by `s` (1..31) bits, rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t m, int s) {
  uint32_t r = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
  return r + (rem > half || (rem == half && (r & 1)));
}

uint16_t krt_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffff;
  if (ax > 0x7f800000) /* NaN: set the quiet bit so it stays a NaN */
    return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
  if (ax >= 0x477ff000) /* >= 65520, halfway past 65504: rounds to Inf */
    return sign | 0x7c00;
  if (ax >= 0x38800000) /* normal half: rebias exponent 127 -> 15 */
    return sign | (uint16_t)shift_rne(ax - 0x38000000, 13);
  /* Subnormal half (or zero): units of 2^-24.  The value is
   * mant * 2^(e - 150), i.e. mant >> (126 - e) units. */
  int e = (int)(ax >> 23), s = 126 - e;
  if (s > 24) return sign; /* below 2^-25 (the halfway point): zero */
  return sign | (uint16_t)shift_rne((ax & 0x7fffff) | 0x800000, s);
}

float krt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000 | (m << 13));
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- bfloat16: the top half of a float ------------------------------- */
uint16_t krt_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  /* NaN: truncating could drop every payload bit and give Inf, so keep the
   * top bits and set the quiet bit. */
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x0040);
  /* Round to nearest even; a carry out of the mantissa bumps the exponent,
   * which also turns overflow past the largest bf16 into Inf. */
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float krt_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* ---- one-byte floats ------------------------------------------------- */
/* The kernels' own conversions, from kiln_prelude.h's portable part, so the
 * interpreter, the tensor files and both devices agree bit for bit. */
#define KL_PRELUDE_CONVERSIONS_ONLY
#define __device__ static
#define __forceinline__ inline
static inline unsigned __float_as_uint(float f) { return f32_bits(f); }
static inline float __uint_as_float(unsigned u) { return bits_f32(u); }
#include "emu/kiln_prelude.h"
#undef __device__
#undef __forceinline__
_Static_assert(KRT_ROUND_UP == KL_E8M0_UP && KRT_ROUND_DOWN == KL_E8M0_DOWN &&
                   KRT_ROUND_NEAREST == KL_E8M0_NEAREST,
               "round modes must agree with kiln_prelude.h");

/* kiln_prelude.h's KL_MF_* format of a dtype; -1 for E8M0 and the rest. */
static int mf_format(krt_dtype t) {
  switch (t) {
  case KRT_F8E4M3FN: return KL_MF_E4M3FN;
  case KRT_F8E4M3FNUZ: return KL_MF_E4M3FNUZ;
  case KRT_F8E5M2: return KL_MF_E5M2;
  case KRT_F8E5M2FNUZ: return KL_MF_E5M2FNUZ;
  case KRT_F4E2M1: return KL_MF_E2M1;
  default: return -1;
  }
}

int krt_dtype_is_small_float(krt_dtype t) { return t == KRT_F8E8M0 || mf_format(t) >= 0; }

float krt_small_float_to_f32(krt_dtype t, uint8_t code) {
  if (t == KRT_F8E8M0) return kl_e8m0_to_f32(code);
  int fmt = mf_format(t);
  return fmt >= 0 ? kl_mf_to_f32(code, fmt) : 0.0f;
}

uint8_t krt_f32_to_small_float(krt_dtype t, float f, int saturate, int round_mode) {
  if (t == KRT_F8E8M0) return (uint8_t)kl_e8m0_from_f32(f, saturate, round_mode);
  int fmt = mf_format(t);
  return fmt >= 0 ? (uint8_t)kl_mf_from_f32(f, fmt, saturate) : 0;
}

int krt_dtype_bits(krt_dtype t) {
  if (t == KRT_U4 || t == KRT_I4 || t == KRT_F4E2M1) return 4;
  if (t == KRT_U2 || t == KRT_I2) return 2;
  return (int)krt_dtype_size(t) * 8;
}
