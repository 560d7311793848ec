/* kiln_prelude.h - included first by every generated kernels.cu, so that the
 * one source builds for both devices:
 *   - NVRTC (or nvcc): a few macros and types, defined here;
 *   - the host C compiler: kiln_emu.h, the CUDA emulation header.
 * The portable vocabulary (KL_KERNEL, KL_SHARED, KL_DYN_SHARED, KL_EMU_ENTRY,
 * KL_ARG, KL_INF, KL_NAN, KL_FLT_MAX, int8_t..uint64_t, __half,
 * __nv_bfloat16 and their conversions) is listed in kiln_emu.h; the integer
 * powers kl_upow and kl_ipow, defined at the end, work on both.
 *
 * NVRTC has no system headers: this file must reach it either through
 * -I<dir of this file> or as a named header in nvrtcCreateProgram (the code
 * generator embeds it).  __half and __nv_bfloat16 are defined here, with the
 * GPU's conversion instructions, so no CUDA include directory is needed;
 * define KL_CUDA_FP16_HEADERS to use cuda_fp16.h/cuda_bf16.h instead (then
 * NVRTC needs -I<cuda>/include). */
#ifndef KILN_PRELUDE_H
#define KILN_PRELUDE_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)

#define KL_KERNEL extern "C" __global__
#define KL_SHARED(T, name, dims) __shared__ __align__(16) T name dims
#define KL_DYN_SHARED(T, name) extern __shared__ __align__(16) T name[]
#define KL_EMU_ENTRY(...)
#define KL_EMU_ENTRY0(name)
#define KL_ARG(T, i)
#define KL_INF (__int_as_float(0x7f800000))
#define KL_NAN (__int_as_float(0x7fffffff))
#define KL_FLT_MAX 3.402823466e+38f

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#if defined(KL_CUDA_FP16_HEADERS) || !defined(__CUDACC_RTC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
/* The host header's opaque structs, converted by the same PTX instructions
 * cuda_fp16.h uses (round to nearest even; NaN -> canonical NaN). */
typedef struct { unsigned short kl_bits; } __half;
typedef struct { unsigned short kl_bits; } __nv_bfloat16;
__device__ __forceinline__ __half __float2half(float f) {
  __half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.kl_bits) : "f"(f));
  return h;
}
__device__ __forceinline__ float __half2float(__half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.kl_bits));
  return f;
}
__device__ __forceinline__ __nv_bfloat16 __float2bfloat16(float f) {
  __nv_bfloat16 b;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.kl_bits) : "f"(f));
#else
  unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    b.kl_bits = 0x7fffu;
  else
    b.kl_bits = (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
  return b;
}
__device__ __forceinline__ float __bfloat162float(__nv_bfloat16 b) {
  return __uint_as_float((unsigned)b.kl_bits << 16);
}
#define __float2half_rn __float2half
#define __float2bfloat16_rn __float2bfloat16
__device__ __forceinline__ unsigned short __half_as_ushort(__half h) { return h.kl_bits; }
__device__ __forceinline__ __half __ushort_as_half(unsigned short u) {
  __half h;
  h.kl_bits = u;
  return h;
}
__device__ __forceinline__ unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) {
  return b.kl_bits;
}
__device__ __forceinline__ __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b;
  b.kl_bits = u;
  return b;
}
#endif /* fp16 types */

#else /* host */
#include "kiln_emu.h"
#endif

/* Integer power as the interpreter computes it (i_pow in
 * ir/ops_elementwise.c): by squaring, wrapping modulo 2^64.  A negative
 * exponent truncates 1/a^|b| toward zero, so only a = 1 and a = -1 give
 * nonzero results; 0 to a negative power gives 0 here and run() reports it. */
__device__ __forceinline__ uint64_t kl_upow(uint64_t a, uint64_t b) {
  uint64_t acc = 1;
  for (; b; b >>= 1) {
    if (b & 1) acc *= a;
    a *= a;
  }
  return acc;
}
__device__ __forceinline__ int64_t kl_ipow(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
  return (int64_t)kl_upow((uint64_t)a, (uint64_t)b);
}

#endif
