/* test_strip.c - the host device's strip helpers in kiln_prelude.h
 * (kl_strip_*: 16 sums a thread held in SSE vectors) against the scalar
 * forms every other kernel uses: the four-at-once half and bf16 widening
 * bit for bit over all 65536 codes, and the kept lanes of a multiply-add,
 * whose other lanes must add nothing even against an infinite weight. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kiln_prelude.h"

static uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

static void test_widen_every_code(void **state) {
  (void)state;
  for (uint32_t c = 0; c < 0x10000; c += 4) {
    uint16_t codes[4] = {(uint16_t)c, (uint16_t)(c + 1), (uint16_t)(c + 2), (uint16_t)(c + 3)};
    kl_v4f32 h = kl_v4_f16(codes), b = kl_v4_bf16(codes);
    for (int j = 0; j < 4; j++) {
      __half hv = {codes[j]};
      __nv_bfloat16 bv = {codes[j]};
      if (bits_of(h[j]) != bits_of(__half2float(hv)))
        fail_msg("f16 0x%04x: 0x%08x, __half2float 0x%08x", codes[j], bits_of(h[j]), bits_of(__half2float(hv)));
      if (bits_of(b[j]) != bits_of(__bfloat162float(bv)))
        fail_msg("bf16 0x%04x: 0x%08x", codes[j], bits_of(b[j]));
    }
  }
}

/* lanes outside [lo, hi) add +0: each sum stays as it was, bit for bit,
 * whatever the input there (a neighbouring row's inf or NaN) and even
 * with an infinite weight; kept lanes add x * w */
static void test_keep_lanes(void **state) {
  (void)state;
  float x[KL_STRIP], want[KL_STRIP], got[KL_STRIP];
  for (int lo = 0; lo <= KL_STRIP; lo++)
    for (int hi = lo; hi <= KL_STRIP; hi++)
      for (int k = 0; k < 2; k++) {
        float w = k ? INFINITY : -1.5f;
        kl_strip_f32 acc = KL_STRIP_ZERO;
        for (int j = 0; j < KL_STRIP; j++) x[j] = j % 3 ? (float)j : NAN;
        kl_strip_fma_f32(&acc, x, 2.0f); /* sums of 2j (NaN on every third) */
        for (int j = 0; j < KL_STRIP; j++) x[j] = j % 2 ? INFINITY : (float)(j + 1);
        kl_strip_fma_keep_f32(&acc, x, w, lo, hi);
        kl_strip_store_f32(got, &acc);
        for (int j = 0; j < KL_STRIP; j++) {
          float before = j % 3 ? 2.0f * (float)j : NAN;
          want[j] = j >= lo && j < hi ? before + x[j] * w : before;
          if (isnan(want[j]) ? !isnan(got[j]) : bits_of(got[j]) != bits_of(want[j]))
            fail_msg("lo %d hi %d w %g lane %d: %a, want %a", lo, hi, (double)w, j, (double)got[j],
                     (double)want[j]);
        }
      }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_widen_every_code),
      cmocka_unit_test(test_keep_lanes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
