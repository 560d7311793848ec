/* test_tensor_io.c - unit tests for runtime/ dtypes, half conversions, and
 * the .npy and .safetensors readers and writers.  Bad files are written into
 * a fresh mkdtemp directory, removed at the end. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../runtime/kilnrt.h"

static char tmpdir[64];

static int make_tmpdir(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln-tensor-io-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
  (void)state;
  DIR *d = opendir(tmpdir);
  if (!d) return -1;
  struct dirent *de;
  char p[512];
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
      snprintf(p, sizeof p, "%s/%s", tmpdir, de->d_name);
      unlink(p);
    }
  closedir(d);
  return rmdir(tmpdir);
}

/* Path of `name` inside the temp dir, in a small ring of static buffers. */
static const char *tpath(const char *name) {
  static char bufs[4][512];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, sizeof bufs[0], "%s/%s", tmpdir, name);
  return b;
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  unsigned char *buf = malloc(1 << 16);
  assert_non_null(buf);
  *n = fread(buf, 1, 1 << 16, f);
  fclose(f);
  return buf;
}

static void expect_msg(int rc, const char *err, const char *path,
                       const char *want) {
  if (rc != -1 || !strstr(err, path) || !strstr(err, want))
    fail_msg("rc=%d, error '%s'; wanted -1 and '%s'", rc, err, want);
}

/* ---- half conversions ------------------------------------------------ */
static void test_f16_values(void **state) {
  (void)state;
  assert_int_equal(krt_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(krt_f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(krt_f32_to_f16(0.0f), 0x0000);
  assert_int_equal(krt_f32_to_f16(-0.0f), 0x8000);
  assert_int_equal(krt_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(krt_f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
  assert_int_equal(krt_f32_to_f16(0x1p-14f), 0x0400); /* smallest normal */
  /* 1023.5 units of 2^-24: the tie rounds up into the normal range. */
  assert_int_equal(krt_f32_to_f16(0x1.ffcp-15f), 0x0400);
  assert_int_equal(krt_f32_to_f16(0x1.ff8p-15f), 0x03ff);
  /* Overflow: 65520 is halfway to 65536 and rounds to Inf (even). */
  assert_int_equal(krt_f32_to_f16(65519.99f), 0x7bff);
  assert_int_equal(krt_f32_to_f16(65520.0f), 0x7c00);
  assert_int_equal(krt_f32_to_f16(1e10f), 0x7c00);
  assert_int_equal(krt_f32_to_f16(-1e10f), 0xfc00);
  assert_int_equal(krt_f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(krt_f32_to_f16(-INFINITY), 0xfc00);
  /* Ties to even, normal range: 1 + 2^-11 sits halfway between 1 and
   * 1 + 2^-10; 1 + 3 * 2^-11 halfway between 1 + 2^-10 and 1 + 2^-9. */
  assert_int_equal(krt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(krt_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);
  assert_int_equal(krt_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  /* Ties to even, subnormal range. */
  assert_int_equal(krt_f32_to_f16(0x1p-25f), 0x0000);
  assert_int_equal(krt_f32_to_f16(0x3p-25f), 0x0002);
  assert_int_equal(krt_f32_to_f16(0x1.000002p-25f), 0x0001);
  assert_int_equal(krt_f32_to_f16(0x1p-30f), 0x0000);
  /* NaN stays NaN. */
  uint16_t h = krt_f32_to_f16(NAN);
  assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
  assert_true(isnan(krt_f16_to_f32(0x7c01)));
  /* Back to float. */
  assert_true(krt_f16_to_f32(0x3c00) == 1.0f);
  assert_true(krt_f16_to_f32(0x7bff) == 65504.0f);
  assert_true(krt_f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(krt_f16_to_f32(0x7c00) == INFINITY);
  assert_true(krt_f16_to_f32(0xfc00) == -INFINITY);
  assert_true(signbit(krt_f16_to_f32(0x8000)));
  /* Every half survives half -> float -> half. */
  for (uint32_t i = 0; i <= 0xffff; i++) {
    float f = krt_f16_to_f32((uint16_t)i);
    uint16_t back = krt_f32_to_f16(f);
    if (isnan(f))
      assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
    else
      assert_int_equal(back, i);
  }
}

static float bits(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

static void test_bf16_values(void **state) {
  (void)state;
  assert_int_equal(krt_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(krt_f32_to_bf16(-0.0f), 0x8000);
  assert_int_equal(krt_f32_to_bf16(0x1p-133f), 0x0001); /* smallest subnormal */
  assert_int_equal(krt_f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(krt_f32_to_bf16(-INFINITY), 0xff80);
  /* Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7. */
  assert_int_equal(krt_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(krt_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
  assert_int_equal(krt_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  /* Overflow: the largest float rounds past the largest bf16 to Inf. */
  assert_int_equal(krt_f32_to_bf16(bits(0x7f7fffff)), 0x7f80);
  assert_int_equal(krt_f32_to_bf16(bits(0x7f7f7fff)), 0x7f7f);
  /* NaN stays NaN, even with its payload only in the dropped low bits. */
  assert_true(isnan(krt_bf16_to_f32(krt_f32_to_bf16(NAN))));
  assert_true(isnan(krt_bf16_to_f32(krt_f32_to_bf16(bits(0x7f800001)))));
  assert_true(isnan(krt_bf16_to_f32(krt_f32_to_bf16(bits(0xff800001)))));
  assert_true(krt_bf16_to_f32(0x3f80) == 1.0f);
  assert_true(krt_bf16_to_f32(0x0001) == 0x1p-133f);
  for (uint32_t i = 0; i <= 0xffff; i++) {
    float f = krt_bf16_to_f32((uint16_t)i);
    if (isnan(f))
      assert_true(isnan(krt_bf16_to_f32(krt_f32_to_bf16(f))));
    else
      assert_int_equal(krt_f32_to_bf16(f), i);
  }
}

/* ---- one-byte floats ------------------------------------------------- */
typedef struct {
  krt_dtype t;
  int mbits, bias;
  unsigned sign, max_code; /* sign bit; largest finite magnitude's code */
} small_fmt;

static const small_fmt small_fmts[] = {
    {KRT_F8E4M3FN, 3, 7, 0x80, 0x7e},   {KRT_F8E4M3FNUZ, 3, 8, 0x80, 0x7f},
    {KRT_F8E5M2, 2, 15, 0x80, 0x7b},    {KRT_F8E5M2FNUZ, 2, 16, 0x80, 0x7f},
    {KRT_F4E2M1, 1, 1, 0x8, 0x7},
};

/* Code c's value from the formats' definitions, written apart from the
 * conversions under test: sign, biased exponent, mantissa; NaN and Inf as
 * each format reserves them. */
static double small_by_definition(const small_fmt *f, unsigned c) {
  unsigned mag = c & (f->sign - 1), e = mag >> f->mbits, m = mag & ((1u << f->mbits) - 1);
  double s = c & f->sign ? -1 : 1;
  switch (f->t) {
  case KRT_F8E4M3FN: if (mag == 0x7f) return NAN; break;
  case KRT_F8E5M2: if (e == 31) return m ? NAN : s * INFINITY; break;
  case KRT_F8E4M3FNUZ: case KRT_F8E5M2FNUZ: if (c == 0x80) return NAN; break;
  default: break;
  }
  if (e == 0) return s * ldexp(m, 1 - f->bias - f->mbits);
  return s * ldexp(1.0 + ldexp(m, -f->mbits), (int)e - f->bias);
}

static void test_small_float_values(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof small_fmts / sizeof *small_fmts; k++) {
    const small_fmt *f = &small_fmts[k];
    unsigned ncodes = f->sign << 1;
    for (unsigned c = 0; c < ncodes; c++) {
      double want = small_by_definition(f, c);
      float got = krt_small_float_to_f32(f->t, (uint8_t)c);
      if (isnan(want)) {
        assert_true(isnan(got));
        assert_true(isnan(krt_small_float_to_f32(f->t, krt_f32_to_small_float(f->t, got, 0, 0))));
        continue;
      }
      assert_true((double)got == want);
      if (!isinf(want)) /* every value converts back to its code */
        assert_int_equal(krt_f32_to_small_float(f->t, got, 1, 0), c);
      /* halfway to the next positive magnitude: ties to the even code */
      if (c < f->max_code) {
        double next = small_by_definition(f, c + 1), mid = (want + next) / 2;
        assert_int_equal(krt_f32_to_small_float(f->t, (float)mid, 1, 0), c & 1 ? c + 1 : c);
        assert_int_equal(krt_f32_to_small_float(f->t, nextafterf((float)mid, INFINITY), 1, 0), c + 1);
        assert_int_equal(krt_f32_to_small_float(f->t, nextafterf((float)mid, 0), 1, 0), c);
      }
    }
    /* overflow and Inf: saturate clamps; otherwise Inf (E5M2) or NaN, and
     * fp4, which has neither, saturates always */
    float max = krt_small_float_to_f32(f->t, (uint8_t)f->max_code);
    uint8_t over = krt_f32_to_small_float(f->t, 4 * max, 0, 0);
    assert_int_equal(krt_f32_to_small_float(f->t, 4 * max, 1, 0), f->max_code);
    assert_int_equal(krt_f32_to_small_float(f->t, -INFINITY, 1, 0), f->sign | f->max_code);
    if (f->t == KRT_F8E5M2) assert_true(isinf(krt_small_float_to_f32(f->t, over)));
    else if (f->t == KRT_F4E2M1) assert_int_equal(over, f->max_code);
    else assert_true(isnan(krt_small_float_to_f32(f->t, over)));
  }
  /* FNUZ has no -0 */
  assert_int_equal(krt_f32_to_small_float(KRT_F8E4M3FNUZ, -0.0f, 1, 0), 0);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E4M3FN, -0.0f, 1, 0), 0x80);
  /* E8M0: 2^(c - 127), 0xff NaN; ONNX's three round modes and saturate */
  for (unsigned c = 0; c < 255; c++)
    assert_true(krt_small_float_to_f32(KRT_F8E8M0, (uint8_t)c) == ldexpf(1.0f, (int)c - 127));
  assert_true(isnan(krt_small_float_to_f32(KRT_F8E8M0, 0xff)));
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, 3.0f, 1, KRT_ROUND_UP), 129);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, 3.0f, 1, KRT_ROUND_DOWN), 128);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, 3.0f, 1, KRT_ROUND_NEAREST), 129);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, 2.9f, 1, KRT_ROUND_NEAREST), 128);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, 0.0f, 1, KRT_ROUND_UP), 0);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, 0x1.8p127f, 1, KRT_ROUND_UP), 254);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, 0x1.8p127f, 0, KRT_ROUND_UP), 255);
  assert_int_equal(krt_f32_to_small_float(KRT_F8E8M0, NAN, 1, KRT_ROUND_UP), 255);
}

static void test_dtype_basics(void **state) {
  (void)state;
  static const char *names[] = {"f32", "f16", "bf16", "f64", "i8",  "i32", "i64",
                                "bool", "u8", "i16", "u16", "u32", "u64",
                                "f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz", "u4", "i4",
                                "f4e2m1", "f8e8m0", "u2", "i2"};
  static const size_t sizes[] = {4, 2, 2, 8, 1, 4, 8, 1, 1, 2, 2, 4, 8,
                                 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  /* bits as ONNX packs them; Kiln holds every one of these in a byte */
  static const int bits[] = {32, 16, 16, 64, 8, 32, 64, 8, 8, 16, 16, 32, 64,
                             8, 8, 8, 8, 4, 4, 4, 8, 2, 2};
  assert_int_equal(sizeof names / sizeof *names, KRT_DTYPE_COUNT);
  for (int d = 0; d < KRT_DTYPE_COUNT; d++) {
    assert_string_equal(krt_dtype_name((krt_dtype)d), names[d]);
    assert_int_equal(krt_dtype_size((krt_dtype)d), sizes[d]);
    assert_int_equal(krt_dtype_bits((krt_dtype)d), bits[d]);
  }
  assert_int_equal(krt_dtype_size(KRT_DTYPE_COUNT), 0);
  krt_tensor t = {.rank = 0};
  assert_int_equal(krt_tensor_numel(&t), 1);
  t = (krt_tensor){.rank = 3, .dims = {2, 0, 5}};
  assert_int_equal(krt_tensor_numel(&t), 0);
  t = (krt_tensor){.rank = 2, .dims = {65536, 32768}};
  assert_int_equal(krt_tensor_numel(&t), -1);
  t = (krt_tensor){.rank = 1, .dims = {-1}};
  assert_int_equal(krt_tensor_numel(&t), -1);
  t.rank = KRT_MAX_RANK + 1;
  assert_int_equal(krt_tensor_numel(&t), -1);
  krt_tensor_free(NULL);
  krt_tensor_set_free(NULL);
}

/* ---- round trips ----------------------------------------------------- */
/* A tensor of `dtype` and the given shape, filled with distinct values. */
static krt_tensor make_tensor(krt_dtype dtype, int rank, const int64_t *dims) {
  krt_tensor t = {.dtype = dtype, .rank = rank};
  memcpy(t.dims, dims, sizeof *dims * (size_t)rank);
  int64_t n = krt_tensor_numel(&t);
  assert_true(n >= 0);
  t.data = malloc((size_t)n * krt_dtype_size(dtype) + 1);
  assert_non_null(t.data);
  for (int64_t i = 0; i < n; i++) {
    float f = (float)i * 0.75f - 3.0f;
    switch (dtype) {
    case KRT_F32: ((float *)t.data)[i] = f; break;
    case KRT_F16: ((uint16_t *)t.data)[i] = krt_f32_to_f16(f); break;
    case KRT_BF16: ((uint16_t *)t.data)[i] = krt_f32_to_bf16(f); break;
    case KRT_F64: ((double *)t.data)[i] = (double)i / 3.0; break;
    case KRT_I8: ((int8_t *)t.data)[i] = (int8_t)(i * 37); break;
    case KRT_I32: ((int32_t *)t.data)[i] = (int32_t)(i * -100003); break;
    case KRT_I64: ((int64_t *)t.data)[i] = i * 1000000000007LL; break;
    case KRT_BOOL: ((uint8_t *)t.data)[i] = i % 3 == 0; break;
    case KRT_U8: ((uint8_t *)t.data)[i] = (uint8_t)(i * 37); break;
    case KRT_I16: ((int16_t *)t.data)[i] = (int16_t)(i * -1003); break;
    case KRT_U16: ((uint16_t *)t.data)[i] = (uint16_t)(i * 40009); break;
    case KRT_U32: ((uint32_t *)t.data)[i] = (uint32_t)(i * 4000000007u); break;
    case KRT_U64: ((uint64_t *)t.data)[i] = (uint64_t)i * 18000000000000000007ull; break;
    /* a code each; the narrow integers' values in range */
    case KRT_F8E4M3FN: case KRT_F8E4M3FNUZ: case KRT_F8E5M2: case KRT_F8E5M2FNUZ:
    case KRT_F8E8M0: ((uint8_t *)t.data)[i] = (uint8_t)(i * 37); break;
    case KRT_F4E2M1: case KRT_U4: ((uint8_t *)t.data)[i] = (uint8_t)(i % 16); break;
    case KRT_I4: ((int8_t *)t.data)[i] = (int8_t)(i % 16 - 8); break;
    case KRT_U2: ((uint8_t *)t.data)[i] = (uint8_t)(i % 4); break;
    case KRT_I2: ((int8_t *)t.data)[i] = (int8_t)(i % 4 - 2); break;
    default: fail();
    }
  }
  return t;
}

static void assert_same(const krt_tensor *a, const krt_tensor *b) {
  assert_int_equal(a->dtype, b->dtype);
  assert_int_equal(a->rank, b->rank);
  assert_memory_equal(a->dims, b->dims, sizeof *a->dims * (size_t)a->rank);
  size_t n = (size_t)krt_tensor_numel(a) * krt_dtype_size(a->dtype);
  if (n) assert_memory_equal(a->data, b->data, n);
}

static const struct {
  int rank;
  int64_t dims[3];
} shapes[] = {{0, {0}}, {1, {5}}, {3, {2, 3, 4}}, {2, {0, 3}}};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void test_npy_round_trip(void **state) {
  (void)state;
  char err[256];
  for (int d = 0; d < KRT_DTYPE_COUNT; d++)
    for (int s = 0; s < NSHAPES; s++) {
      krt_tensor t = make_tensor((krt_dtype)d, shapes[s].rank, shapes[s].dims);
      const char *p = tpath("rt.npy");
      assert_int_equal(krt_npy_write(p, &t, err, sizeof err), 0);
      krt_tensor back;
      if (krt_npy_read(p, &back, err, sizeof err)) fail_msg("%s", err);
      if (d == KRT_BF16) { /* stored as f32 */
        assert_int_equal(back.dtype, KRT_F32);
        assert_int_equal(back.rank, t.rank);
        for (int64_t i = 0; i < krt_tensor_numel(&t); i++)
          assert_true(((float *)back.data)[i] ==
                      krt_bf16_to_f32(((uint16_t *)t.data)[i]));
      } else if (d >= KRT_F8E4M3FN) { /* NumPy has none: the bytes as u8/i8 */
        assert_int_equal(back.dtype, d == KRT_I4 || d == KRT_I2 ? KRT_I8 : KRT_U8);
        back.dtype = t.dtype;
        assert_same(&t, &back);
      } else {
        assert_same(&t, &back);
      }
      krt_tensor_free(&t);
      krt_tensor_free(&back);
    }
}

static void test_safetensors_round_trip(void **state) {
  (void)state;
  char err[256], names[KRT_DTYPE_COUNT * NSHAPES][16];
  krt_named_tensor items[KRT_DTYPE_COUNT * NSHAPES];
  krt_tensor_set set = {items, 0};
  for (int d = 0; d < KRT_DTYPE_COUNT; d++)
    for (int s = 0; s < NSHAPES; s++) {
      /* safetensors names three of the narrow types: F8_E4M3, F8_E5M2, F8_E8M0 */
      if (d >= KRT_F8E4M3FN && d != KRT_F8E4M3FN && d != KRT_F8E5M2 && d != KRT_F8E8M0)
        continue;
      snprintf(names[set.count], sizeof names[0], "%s.%d",
               krt_dtype_name((krt_dtype)d), s);
      items[set.count].name = names[set.count];
      items[set.count].tensor =
          make_tensor((krt_dtype)d, shapes[s].rank, shapes[s].dims);
      set.count++;
    }
  const char *p = tpath("rt.safetensors");
  assert_int_equal(krt_safetensors_write(p, &set, err, sizeof err), 0);

  size_t n;
  unsigned char *raw = read_file(p, &n);
  uint64_t hlen = 0;
  memcpy(&hlen, raw, 8);
  assert_int_equal(hlen % 8, 0);
  assert_int_equal(raw[8], '{');
  free(raw);

  krt_tensor_set back;
  if (krt_safetensors_read(p, &back, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(back.count, set.count);
  for (int i = 0; i < set.count; i++) {
    assert_string_equal(back.items[i].name, items[i].name); /* order kept */
    assert_same(&items[i].tensor, &back.items[i].tensor);
    assert_ptr_equal(krt_tensor_set_find(&back, items[i].name),
                     &back.items[i].tensor);
  }
  assert_null(krt_tensor_set_find(&back, "nope"));
  krt_tensor_set_free(&back);
  assert_int_equal(back.count, 0);
  for (int i = 0; i < set.count; i++) krt_tensor_free(&items[i].tensor);

  /* An empty set is a valid file. */
  set.count = 0;
  assert_int_equal(krt_safetensors_write(p, &set, err, sizeof err), 0);
  assert_int_equal(krt_safetensors_read(p, &back, err, sizeof err), 0);
  assert_int_equal(back.count, 0);
  krt_tensor_set_free(&back);
}

/* ---- npy: interop and header variants -------------------------------- */
/* np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)) with NumPy 2.x. */
static const unsigned char numpy_2x3_f4[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27,
    0x64, 0x65, 0x73, 0x63, 0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34,
    0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74, 0x72, 0x61, 0x6e, 0x5f,
    0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20,
    0x28, 0x32, 0x2c, 0x20, 0x33, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x40,
    0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xa0, 0x40,
};

static void test_npy_numpy_interop(void **state) {
  (void)state;
  char err[256];
  const char *p = tpath("numpy.npy");
  write_file(p, numpy_2x3_f4, sizeof numpy_2x3_f4);
  krt_tensor t;
  if (krt_npy_read(p, &t, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(t.dtype, KRT_F32);
  assert_int_equal(t.rank, 2);
  assert_int_equal(t.dims[0], 2);
  assert_int_equal(t.dims[1], 3);
  for (int i = 0; i < 6; i++) assert_true(((float *)t.data)[i] == (float)i);
  /* Our writer produces the very same bytes. */
  const char *q = tpath("ours.npy");
  assert_int_equal(krt_npy_write(q, &t, err, sizeof err), 0);
  size_t n;
  unsigned char *raw = read_file(q, &n);
  assert_int_equal(n, sizeof numpy_2x3_f4);
  assert_memory_equal(raw, numpy_2x3_f4, n);
  free(raw);
  krt_tensor_free(&t);
}

/* Writes a .npy with version major.0, header `dict` and `ndata` data bytes
 * (0x01 each). */
static const char *npy_file(const char *name, int major, const char *dict,
                            size_t ndata) {
  unsigned char buf[1024] = {0x93, 'N', 'U', 'M', 'P', 'Y',
                             (unsigned char)major};
  size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
  size_t hlen = dl + 1;
  assert_true(pre + hlen + ndata <= sizeof buf);
  for (size_t i = 0; i < pre - 8; i++) /* little-endian header length */
    buf[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(buf + pre, dict, dl);
  buf[pre + dl] = '\n';
  memset(buf + pre + hlen, 1, ndata);
  const char *p = tpath(name);
  write_file(p, buf, pre + hlen + ndata);
  return p;
}

static void test_npy_header_variants(void **state) {
  (void)state;
  static const struct {
    int major;
    const char *dict;
    krt_dtype dtype;
    int rank;
    size_t ndata;
  } ok[] = {
      {1, "{ \"shape\" : ( 2 , 3 , ) ,'fortran_order':False,'descr':'<f4',}",
       KRT_F32, 2, 24},
      {2, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
       KRT_I64, 1, 24},
      {3, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }",
       KRT_BOOL, 0, 1},
      {1, "{'descr': '<i1', 'fortran_order': False, 'shape': (2L, 2L)}",
       KRT_I8, 2, 4},
      {1, "\t{'descr':'<f2','fortran_order':False,'shape':(1,1,1,1,1,1,1,1)}",
       KRT_F16, 8, 2},
  };
  char err[256];
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    const char *p = npy_file("variant.npy", ok[i].major, ok[i].dict,
                             ok[i].ndata);
    krt_tensor t;
    if (krt_npy_read(p, &t, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(t.dtype, ok[i].dtype);
    assert_int_equal(t.rank, ok[i].rank);
    if (t.dtype == KRT_BOOL) assert_int_equal(((uint8_t *)t.data)[0], 1);
    krt_tensor_free(&t);
  }
}

/* ---- npy: malformed files -------------------------------------------- */
static void test_npy_malformed(void **state) {
  (void)state;
  static const struct {
    const char *dict;
    size_t ndata;
    const char *want;
  } bad[] = {
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8,
       "big-endian"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8,
       "Fortran-order arrays are not supported"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), ", 8,
       "malformed header"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", 8,
       "malformed header"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", 8,
       "malformed header"},
      {"{'descr': '<f4', 'fortran_order': False}", 8, "missing 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8,
       "unexpected key"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
       "'shape': (2,)}", 8, "duplicate key"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", 8,
       "malformed header"},
      {"[1, 2]", 8, "malformed header"},
      {"", 8, "malformed header"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", 8,
       "structured dtypes"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,)}", 8,
       "unsupported dtype '<c8'"},
      {"{'descr': 'abcdefghijklmnopqrstuvwxyzabcdefghij', "
       "'fortran_order': False, 'shape': (2,)}", 8, "malformed header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 0,
       "negative dimension"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (65536, 65536)}", 0,
       "more than 2147483647 elements"},
      {"{'descr': '<f4', 'fortran_order': False, "
       "'shape': (99999999999999999999999,)}", 0, "too large"},
      {"{'descr': '<f4', 'fortran_order': False, "
       "'shape': (1,1,1,1,1,1,1,1,1)}", 4, "more than 8 dimensions"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,)}", 8,
       "malformed header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", 0,
       "malformed header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': 2}", 8,
       "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 20,
       "truncated: header says 24 bytes of data, file has 20"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 28,
       "trailing bytes: header says 24 bytes of data, file has 28"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ()}", 0,
       "truncated: header says 4 bytes of data, file has 0"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *p = npy_file("bad.npy", 1, bad[i].dict, bad[i].ndata);
    krt_tensor t = {.data = (void *)1};
    expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, bad[i].want);
    assert_null(t.data);
  }

  /* Broken preambles. */
  const char *p = tpath("pre.npy");
  krt_tensor t;
  write_file(p, "", 0);
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, "too short");
  write_file(p, "\x93NUMPZ\x01\x00\x00\x00", 10);
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, "bad magic");
  write_file(p, "\x93NUMPY\x04\x00\x00\x00", 10);
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p,
             "unsupported .npy format version 4.0");
  write_file(p, "\x93NUMPY\x02\x00\x00\x00\x00", 11);
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, "truncated");
  write_file(p, "\x93NUMPY\x01", 7);
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, "too short");
  write_file(p, "\x93NUMPY\x01\x00\xe8\x03{}", 12);
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, "truncated");
  write_file(p, "\x93NUMPY\x03\x00\xff\xff\xff\xff{}", 14);
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, "truncated");

  p = tpath("missing.npy");
  expect_msg(krt_npy_read(p, &t, err, sizeof err), err, p, "No such file");
  expect_msg(krt_npy_read(tmpdir, &t, err, sizeof err), err, tmpdir,
             "not a regular file");
  /* errbuf is optional. */
  assert_int_equal(krt_npy_read(p, &t, NULL, 0), -1);
}

static void test_npy_write_errors(void **state) {
  (void)state;
  char err[256];
  float x = 1;
  krt_tensor t = {.dtype = KRT_F32, .rank = 9, .data = &x};
  const char *p = tpath("w.npy");
  expect_msg(krt_npy_write(p, &t, err, sizeof err), err, p, "invalid tensor");
  t = (krt_tensor){.dtype = KRT_DTYPE_COUNT, .data = &x};
  expect_msg(krt_npy_write(p, &t, err, sizeof err), err, p, "invalid tensor");
  t = (krt_tensor){.dtype = KRT_F32, .rank = 1, .dims = {3}};
  expect_msg(krt_npy_write(p, &t, err, sizeof err), err, p, "invalid tensor");
  t = (krt_tensor){.dtype = KRT_F32, .data = &x};
  p = tpath("no-such-dir/w.npy");
  expect_msg(krt_npy_write(p, &t, err, sizeof err), err, p, "No such file");
}

/* ---- safetensors: malformed files ------------------------------------ */
/* Writes a .safetensors with header `json`, its length `hlen` (the JSON's
 * own when UINT64_MAX) and `ndata` data bytes. */
static const char *st_file(const char *name, const char *json, uint64_t hlen,
                           size_t ndata) {
  unsigned char buf[1024];
  size_t jl = strlen(json);
  if (hlen == UINT64_MAX) hlen = jl;
  assert_true(8 + jl + ndata <= sizeof buf);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
  memcpy(buf + 8, json, jl);
  memset(buf + 8 + jl, 0, ndata);
  const char *p = tpath(name);
  write_file(p, buf, 8 + jl + ndata);
  return p;
}

static void test_safetensors_metadata(void **state) {
  (void)state;
  char err[256];
  const char *p = st_file(
      "meta.safetensors",
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[8,9]}}   ",
      UINT64_MAX, 9);
  krt_tensor_set set;
  if (krt_safetensors_read(p, &set, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(set.count, 2);
  assert_string_equal(set.items[0].name, "b");
  assert_string_equal(set.items[1].name, "a");
  assert_int_equal(set.items[1].tensor.rank, 0);
  assert_non_null(krt_tensor_set_find(&set, "a"));
  assert_null(krt_tensor_set_find(&set, "__metadata__"));
  krt_tensor_set_free(&set);
}

#define ENTRY(dtype, shape, offs) \
  "{\"t\":{\"dtype\":" dtype ",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static void test_safetensors_malformed(void **state) {
  (void)state;
  static const struct {
    const char *json;
    size_t ndata;
    const char *want;
  } bad[] = {
      {"{\"t\":", 0, "bad JSON header"},
      {"[1, 2]", 0, "not an object"},
      {"{\"t\":1,\"t\":2}", 0, "bad JSON header"}, /* duplicate key */
      {"{\"t\":1}", 0, "entry is not an object"},
      {"{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'dtype'"},
      {ENTRY("\"C64\"", "[1]", "[0,8]"), 1, "unsupported dtype 'C64'"},
      {ENTRY("7", "[1]", "[0,4]"), 4, "'dtype'"},
      {"{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'shape'"},
      {ENTRY("\"F32\"", "[-1]", "[0,0]"), 0, "shape dimension 0"},
      {ENTRY("\"F32\"", "[2.0]", "[0,8]"), 8, "shape dimension 0"},
      {ENTRY("\"F32\"", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4,
       "more than 8 dimensions"},
      {ENTRY("\"F32\"", "[65536,65536]", "[0,4]"), 4,
       "more than 2147483647 elements"},
      {ENTRY("\"F32\"", "[3000000000]", "[0,4]"), 4, "shape dimension 0"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'data_offsets'"},
      {ENTRY("\"F32\"", "[1]", "[4]"), 4, "'data_offsets'"},
      {ENTRY("\"F32\"", "[1]", "[-4,0]"), 4, "'data_offsets'"},
      {ENTRY("\"F32\"", "[1]", "[0,1e30]"), 4, "'data_offsets'"},
      {ENTRY("\"F32\"", "[1]", "[0,100000000000000000000]"), 4,
       "bad JSON header"},
      {ENTRY("\"F32\"", "[1]", "[0,12]"), 8, "out of bounds"},
      {ENTRY("\"F32\"", "[1]", "[8,4]"), 8, "out of bounds"},
      {ENTRY("\"F32\"", "[3]", "[0,8]"), 8,
       "data_offsets span 8 bytes but shape and dtype need 12"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *p = st_file("bad.safetensors", bad[i].json, UINT64_MAX,
                            bad[i].ndata);
    krt_tensor_set set = {.count = 5};
    expect_msg(krt_safetensors_read(p, &set, err, sizeof err), err, p,
               bad[i].want);
    assert_int_equal(set.count, 0);
    assert_null(set.items);
  }

  krt_tensor_set set;
  const char *p = tpath("short.safetensors");
  write_file(p, "\x02\0\0\0", 4);
  expect_msg(krt_safetensors_read(p, &set, err, sizeof err), err, p,
             "shorter than 8 bytes");
  p = st_file("huge.safetensors", "{}", 200u * 1000 * 1000, 0);
  expect_msg(krt_safetensors_read(p, &set, err, sizeof err), err, p,
             "100 MB limit");
  p = st_file("long.safetensors", "{}", 3, 0);
  expect_msg(krt_safetensors_read(p, &set, err, sizeof err), err, p,
             "truncated");
  p = st_file("max.safetensors", "{}", UINT64_MAX - 1, 0);
  expect_msg(krt_safetensors_read(p, &set, err, sizeof err), err, p,
             "100 MB limit");
  p = tpath("missing.safetensors");
  expect_msg(krt_safetensors_read(p, &set, err, sizeof err), err, p,
             "No such file");
}

static void test_safetensors_write_errors(void **state) {
  (void)state;
  char err[256];
  float x = 1;
  krt_named_tensor items[2] = {
      {"a", {.dtype = KRT_F32, .data = &x}},
      {"a", {.dtype = KRT_F32, .data = &x}},
  };
  krt_tensor_set set = {items, 2};
  const char *p = tpath("w.safetensors");
  expect_msg(krt_safetensors_write(p, &set, err, sizeof err), err, p,
             "duplicate name 'a'");
  items[1].name = "__metadata__";
  expect_msg(krt_safetensors_write(p, &set, err, sizeof err), err, p,
             "reserved");
  items[1].name = "\xff\xfe";
  expect_msg(krt_safetensors_write(p, &set, err, sizeof err), err, p,
             "not UTF-8");
  items[1].name = "b";
  items[1].tensor.rank = -1;
  expect_msg(krt_safetensors_write(p, &set, err, sizeof err), err, p,
             "invalid tensor");
  set.count = -1;
  expect_msg(krt_safetensors_write(p, &set, err, sizeof err), err, p,
             "invalid tensor set");
}

/* ---- robustness: truncations and byte flips -------------------------- */
static uint32_t rng = 12345;
static uint32_t next_rand(void) {
  rng = rng * 1103515245u + 12345u;
  return rng >> 8;
}

/* Reads every truncation and many random corruptions of a valid file;
 * under ASan/UBSan this checks we never over-read or crash. */
static void mangle(const char *path, bool npy) {
  size_t n;
  unsigned char *orig = read_file(path, &n), *buf = malloc(n);
  assert_non_null(buf);
  const char *p = tpath(npy ? "fuzz.npy" : "fuzz.safetensors");
  char err[256];
  for (size_t len = 0; len < n; len++) {
    write_file(p, orig, len);
    krt_tensor t;
    krt_tensor_set s;
    int rc = npy ? krt_npy_read(p, &t, err, sizeof err)
                 : krt_safetensors_read(p, &s, err, sizeof err);
    assert_int_equal(rc, -1); /* every truncation is caught */
  }
  for (int iter = 0; iter < 3000; iter++) {
    memcpy(buf, orig, n);
    int flips = 1 + (int)(next_rand() % 4);
    for (int k = 0; k < flips; k++) {
      size_t at = next_rand() % (iter % 2 ? n : 40); /* favour the header */
      static const char syntax[] = "0-9,:{}[]\"'L";
      buf[at] = next_rand() % 3 ? (unsigned char)next_rand()
                                : (unsigned char)syntax[next_rand() % 12];
    }
    write_file(p, buf, n);
    krt_tensor t;
    krt_tensor_set s;
    if (npy) {
      if (krt_npy_read(p, &t, err, sizeof err) == 0) krt_tensor_free(&t);
    } else if (krt_safetensors_read(p, &s, err, sizeof err) == 0) {
      krt_tensor_set_free(&s);
    }
  }
  free(orig);
  free(buf);
}

static void test_fuzz_light(void **state) {
  (void)state;
  char err[256];
  int64_t dims[] = {2, 3};
  krt_tensor t = make_tensor(KRT_F16, 2, dims);
  const char *p = tpath("seed.npy");
  assert_int_equal(krt_npy_write(p, &t, err, sizeof err), 0);
  mangle(p, true);

  krt_named_tensor items[] = {
      {"w", make_tensor(KRT_I32, 2, dims)},
      {"b", t},
  };
  krt_tensor_set set = {items, 2};
  p = tpath("seed.safetensors");
  assert_int_equal(krt_safetensors_write(p, &set, err, sizeof err), 0);
  mangle(p, false);
  krt_tensor_free(&items[0].tensor);
  krt_tensor_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16_values),
      cmocka_unit_test(test_bf16_values),
      cmocka_unit_test(test_dtype_basics),
      cmocka_unit_test(test_small_float_values),
      cmocka_unit_test(test_npy_round_trip),
      cmocka_unit_test(test_safetensors_round_trip),
      cmocka_unit_test(test_npy_numpy_interop),
      cmocka_unit_test(test_npy_header_variants),
      cmocka_unit_test(test_npy_malformed),
      cmocka_unit_test(test_npy_write_errors),
      cmocka_unit_test(test_safetensors_metadata),
      cmocka_unit_test(test_safetensors_malformed),
      cmocka_unit_test(test_safetensors_write_errors),
      cmocka_unit_test(test_fuzz_light),
  };
  return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
