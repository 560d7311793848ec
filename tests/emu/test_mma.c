/* test_mma.c - kiln_prelude.h's warp matrix multiply-add against a double
 * reference: C (16x8) = C0 + A (16x32) * B (32x8) in two k steps, f16 and
 * bf16 operands, f32 sums.  Built twice (meson.build): one lane a warp
 * (the host device's tiles) and KL_LANES=32 (the GPU's register layout,
 * the product gathered by shuffles).  Every entry of C must be written,
 * each within the bound of 32 f32 additions of its terms. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mma_kernels.cu"

static uint32_t seed = 12345;
static float next_float(void) { /* in [-2, 2) */
  seed = seed * 1664525u + 1013904223u;
  return (float)(seed >> 8) / 4194304.0f - 2.0f;
}

/* v's code in the half type, and its value back as a float */
static uint16_t to_half(float v, bool bf16, float *back) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16(v);
    *back = __bfloat162float(h);
    return h.kl_bits;
  }
  __half h = __float2half(v);
  *back = __half2float(h);
  return h.kl_bits;
}

static void run(const kl_emu_kernel *k, bool bf16, int round) {
  uint16_t a[16 * MMA_LD], b[8 * MMA_LD];
  float fa[16 * MMA_LD], fb[8 * MMA_LD], c0[128], c[128];
  for (int i = 0; i < 16 * MMA_LD; i++) /* round 1: zeros among them */
    a[i] = to_half(round == 1 && i % 7 == 0 ? 0.0f : next_float(), bf16, &fa[i]);
  for (int i = 0; i < 8 * MMA_LD; i++) /* round 2: large values */
    b[i] = to_half(next_float() * (round == 2 ? 1000.0f : 1.0f), bf16, &fb[i]);
  for (int i = 0; i < 128; i++) c0[i] = next_float(), c[i] = NAN;
  const void *pa = a, *pb = b, *pc0 = c0;
  void *pc = c;
  void *args[4] = {&pa, &pb, &pc0, &pc};
  kl_dim3 grid = {1, 1, 1}, block = {32, 1, 1};
  char err[256];
  if (kl_emu_launch(k, grid, block, 0, args, err, sizeof err)) fail_msg("%s", err);
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 8; n++) {
      double want = c0[r * 8 + n], mag = fabs(want);
      for (int kk = 0; kk < 32; kk++) {
        double p = (double)fa[r * MMA_LD + kk] * fb[n * MMA_LD + kk];
        want += p, mag += fabs(p);
      }
      double got = c[r * 8 + n], bound = 33 * ldexp(1.0, -24) * mag;
      if (!(fabs(got - want) <= bound))
        fail_msg("%s round %d C(%d, %d) = %.9g, want %.9g (bound %.3g)", bf16 ? "bf16" : "f16", round, r, n, got,
                 want, bound);
    }
}

static void test_mma_f16(void **state) {
  (void)state;
  for (int round = 0; round < 3; round++) run(&mma_f16__emu, false, round);
}

static void test_mma_bf16(void **state) {
  (void)state;
  for (int round = 0; round < 3; round++) run(&mma_bf16__emu, true, round);
}

int main(void) {
  printf("kiln_prelude.h mma with KL_LANES %d\n", KL_LANES);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mma_f16),
      cmocka_unit_test(test_mma_bf16),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
