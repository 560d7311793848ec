/* random.c - the seeded numbers of test inputs and weight inits: splitmix64
 * (tiny, fast, the same on every platform) and Box-Muller normals.  The
 * interpreter's kl_rng (ir/util.c) is this generator, so `kiln run` and a
 * compiled program given no input files draw the same inputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kilnrt.h"

uint64_t krt_rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double krt_rng_uniform(uint64_t *state) { return (double)(krt_rng_next(state) >> 11) * 0x1.0p-53; }

double krt_rng_normal(uint64_t *state) {
  double u1 = krt_rng_uniform(state), u2 = krt_rng_uniform(state);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* v, a float's draw or a small integer, stored as element i of dtype t */
static void store(krt_dtype t, void *data, int64_t i, double v) {
  unsigned char *p = (unsigned char *)data + (size_t)i * krt_dtype_size(t);
  float f = (float)v;
  uint16_t h;
  switch (t) {
  case KRT_F32: memcpy(p, &f, 4); return;
  case KRT_F64: memcpy(p, &v, 8); return;
  case KRT_F16: h = krt_f32_to_f16(f); memcpy(p, &h, 2); return;
  case KRT_BF16: h = krt_f32_to_bf16(f); memcpy(p, &h, 2); return;
  case KRT_I16: case KRT_U16: { int16_t x = (int16_t)v; memcpy(p, &x, 2); return; }
  case KRT_I32: case KRT_U32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); return; }
  case KRT_I64: case KRT_U64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); return; }
  default:
    *p = krt_dtype_is_small_float(t) ? krt_f32_to_small_float(t, f, 1, 0) : (unsigned char)(int)v;
    return;
  }
}

int krt_tensor_random(krt_dtype dtype, int rank, const int64_t *dims, uint64_t seed, krt_tensor *out) {
  memset(out, 0, sizeof *out);
  if (!krt_dtype_size(dtype) || rank < 0 || rank > KRT_MAX_RANK) return -1;
  out->dtype = dtype, out->rank = rank;
  memcpy(out->dims, dims, (size_t)rank * sizeof *dims);
  int64_t n = krt_tensor_numel(out);
  if (n < 0 || !(out->data = malloc((size_t)n * krt_dtype_size(dtype) + 1))) return -1;
  int is_float = dtype == KRT_F32 || dtype == KRT_F64 || dtype == KRT_F16 || dtype == KRT_BF16 ||
                 krt_dtype_is_small_float(dtype);
  for (int64_t i = 0; i < n; i++) {
    double v = is_float ? krt_rng_normal(&seed)
               : dtype == KRT_BOOL ? (double)(krt_rng_next(&seed) & 1)
                                   : (double)(krt_rng_next(&seed) % 4);
    store(dtype, out->data, i, v);
  }
  return 0;
}
