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

/* KL_PRELUDE_CONVERSIONS_ONLY: only the portable helpers at the end (the
 * one-byte float conversions and integer powers), for runtime/half.c, which
 * defines __device__, __forceinline__, __float_as_uint and __uint_as_float
 * itself. */
#ifndef KL_PRELUDE_CONVERSIONS_ONLY
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

/* The lanes of a warp that share one output's dot product in a
 * warp-an-output kernel (emit_fused.c): the whole warp on a GPU; one on
 * the host device, where every shuffle would switch the block to fibers:
 * there the kernel takes its strip form (KL_STRIP, below) instead.  A test
 * may ask the host for 32. */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define KL_CONV_LANES 32
#elif !defined(KL_CONV_LANES) /* a test may ask for a GPU's 32 */
#define KL_CONV_LANES 1
#endif

/* Four halves in one 8-byte load or store (the vectorised path of
 * elementwise kernels, as float4 is for f32). */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
struct __align__(8) kl_half4 { __half v[4]; };
struct __align__(8) kl_bf164 { __nv_bfloat16 v[4]; };
typedef struct kl_half4 kl_half4;
typedef struct kl_bf164 kl_bf164;
#else
typedef struct { _Alignas(8) __half v[4]; } kl_half4;
typedef struct { _Alignas(8) __nv_bfloat16 v[4]; } kl_bf164;
#endif

/* The lanes of a warp at work in a kernel written over virtual lanes
 * (emit_attention.c's tiled kernel, where virtual lane j of a warp is
 * lane j % KL_LANES, slot j / KL_LANES of KL_VLANES): all 32 on a GPU;
 * one on the host device, which then runs each warp as a loop over its 32
 * virtual lanes (vectorisable), where 32 lanes would switch fibers at
 * every shuffle.  A test may ask the host for 32. */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define KL_LANES 32
#elif !defined(KL_LANES)
#define KL_LANES 1
#endif
#define KL_VLANES (32 / KL_LANES)

/* The threads that share a row in a row kernel (softmax, norms,
 * reductions, fused row groups: node_kernels.c's kl_cg_rows): all of them
 * on a GPU (KL_ROW_LANES 32; KL_ROW_SPAN(n) = n, a warp or the block);
 * one on the host device, which takes each row in a single thread, in
 * order, where a warp's shuffles would switch fibers 32 times each.  A
 * test may ask the host for 32. */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define KL_ROW_LANES 32
#elif !defined(KL_ROW_LANES)
#define KL_ROW_LANES 1
#endif
#define KL_ROW_SPAN(n) (KL_ROW_LANES == 1 ? 1 : (n))

/* The outputs of a row one thread of a convolution's or GEMM's kernel
 * sums (emit_fused.c's strip kernels), and their sums as one value:
 *   - a GPU: one output a thread (threads are many), the sums a float or
 *     double;
 *   - the host device: 16, the sums four (eight for f64) 16-byte GCC
 *     vectors, so that a strip's multiply-adds are SSE instructions on
 *     registers whatever the compiler's vectoriser makes of a loop (one
 *     output a thread is scalar code; an array of sums indexed by a loop,
 *     or one wide vector, lives in memory).
 * kl_strip_fma_T(&acc, x, w): lane j += x[j] * w for the KL_STRIP lanes
 * (T: f32, f64, and f16 or bf16 into f32 sums);
 * kl_strip_fma_keep_T(&acc, x, w, lo, hi) (f32, f64): the same for lanes
 * in [lo, hi),
 * the others adding an exact +0 (their product's bits cleared, so a padded
 * tap adds nothing even against an inf or NaN: as skipping it does);
 * kl_strip_store_T(dst, &acc): the lanes to dst[0 .. KL_STRIP);
 * kl_strip_widen_T(dst, src, n): n halves (f16, bf16) to floats. */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define KL_STRIP 1
#define KL_STRIP_ZERO 0
typedef float kl_strip_f32;
typedef double kl_strip_f64;
#define KL_STRIP_OPS(T, S)                                                                   \
  __device__ __forceinline__ void kl_strip_fma_##S(T *acc, const T *x, T w) { *acc += x[0] * w; } \
  __device__ __forceinline__ void kl_strip_fma_keep_##S(T *acc, const T *x, T w, int64_t lo, int64_t hi) { \
    if (lo <= 0 && hi > 0) *acc += x[0] * w;                                                 \
  }                                                                                          \
  __device__ __forceinline__ void kl_strip_store_##S(T *dst, const T *acc) { dst[0] = *acc; }
KL_STRIP_OPS(float, f32)
KL_STRIP_OPS(double, f64)
#define KL_STRIP_HALF_OPS(T, S, CVT)                                                         \
  __device__ __forceinline__ void kl_strip_fma_##S(float *acc, const T *x, float w) { *acc += CVT(x[0]) * w; }
KL_STRIP_HALF_OPS(__half, f16, __half2float)
KL_STRIP_HALF_OPS(__nv_bfloat16, bf16, __bfloat162float)
__device__ __forceinline__ void kl_strip_widen_f16(float *dst, const __half *src, int n) {
  for (int j = 0; j < n; j++) dst[j] = __half2float(src[j]);
}
__device__ __forceinline__ void kl_strip_widen_bf16(float *dst, const __nv_bfloat16 *src, int n) {
  for (int j = 0; j < n; j++) dst[j] = __bfloat162float(src[j]);
}
#else
#ifndef KL_STRIP /* a test may ask for another multiple of 4 */
#define KL_STRIP 16
#endif
#define KL_STRIP_ZERO {{{0}}}
typedef float kl_v4f32 __attribute__((vector_size(16)));
typedef double kl_v2f64 __attribute__((vector_size(16)));
typedef int32_t kl_v4i32 __attribute__((vector_size(16)));
typedef int64_t kl_v2i64 __attribute__((vector_size(16)));
typedef struct { kl_v4f32 v[KL_STRIP / 4]; } kl_strip_f32;
typedef struct { kl_v2f64 v[KL_STRIP / 2]; } kl_strip_f64;
/* T the element, S the suffix, N lanes a vector, V/I the vector types, E
 * I's element (lo and hi are within 0 .. KL_STRIP) */
#define KL_STRIP_OPS(T, S, N, V, I, E)                                                          \
  static inline __attribute__((always_inline)) void kl_strip_fma_##S(kl_strip_##S *acc, const T *x, T w) { \
    _Pragma("GCC unroll 16") for (int i = 0; i < KL_STRIP / N; i++) {                         \
      V t;                                                                                   \
      memcpy(&t, x + N * i, sizeof t);                                                       \
      acc->v[i] += t * w;                                                                    \
    }                                                                                        \
  }                                                                                          \
  static inline __attribute__((always_inline)) void kl_strip_fma_keep_##S(kl_strip_##S *acc, const T *x, T w, \
                                                                          int64_t lo, int64_t hi) { \
    _Pragma("GCC unroll 16") for (int i = 0; i < KL_STRIP / N; i++) {                         \
      V t;                                                                                   \
      I lane, bits;                                                                          \
      memcpy(&t, x + N * i, sizeof t);                                                       \
      t *= w;                                                                                \
      for (int j = 0; j < N; j++) lane[j] = N * i + j;                                        \
      memcpy(&bits, &t, sizeof t);                                                           \
      bits &= (lane >= (E)lo) & (lane < (E)hi);                                              \
      memcpy(&t, &bits, sizeof t);                                                           \
      acc->v[i] += t;                                                                        \
    }                                                                                        \
  }                                                                                          \
  static inline __attribute__((always_inline)) void kl_strip_store_##S(T *dst, const kl_strip_##S *acc) { \
    memcpy(dst, acc->v, sizeof acc->v);                                                      \
  }
KL_STRIP_OPS(float, f32, 4, kl_v4f32, kl_v4i32, int32_t)
KL_STRIP_OPS(double, f64, 2, kl_v2f64, kl_v2i64, int64_t)
/* Four halves (f16, bf16) to floats at once, bit for bit as __half2float
 * and __bfloat162float (a NaN becomes the canonical NaN; subnormals by the
 * exact 2^-14 subtraction); f32 sums, as the GPU's. */
typedef uint16_t kl_v4u16 __attribute__((vector_size(8)));
typedef uint32_t kl_v4u32 __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) kl_v4f32 kl_v4_f16(const void *p) {
  kl_v4u16 h16;
  memcpy(&h16, p, sizeof h16);
  kl_v4u32 h = __builtin_convertvector(h16, kl_v4u32);
  kl_v4u32 sign = (h & 0x8000u) << 16, hs = h & 0x7fffu, e = hs & 0x7c00u;
  kl_v4u32 special = (kl_v4u32)(e == 0x7c00u), small = (kl_v4u32)(e == 0u);
  kl_v4u32 o = (hs << 13) + (112u << 23) + (special & (112u << 23)) + (small & (1u << 23));
  kl_v4u32 magic = small & (113u << 23), bits;
  kl_v4f32 f, mf;
  memcpy(&f, &o, sizeof f);
  memcpy(&mf, &magic, sizeof mf);
  f -= mf; /* m * 2^-24 where the half is subnormal; - 0 elsewhere */
  memcpy(&bits, &f, sizeof bits);
  kl_v4u32 nan = special & (kl_v4u32)((hs & 0x3ffu) != 0u);
  bits = ((bits | sign) & ~nan) | (nan & 0x7fffffffu);
  memcpy(&f, &bits, sizeof f);
  return f;
}
static inline __attribute__((always_inline)) kl_v4f32 kl_v4_bf16(const void *p) {
  kl_v4u16 h16;
  memcpy(&h16, p, sizeof h16);
  kl_v4u32 bits = __builtin_convertvector(h16, kl_v4u32) << 16;
  kl_v4f32 f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
#define KL_STRIP_HALF_OPS(T, S)                                                              \
  static inline __attribute__((always_inline)) void kl_strip_fma_##S(kl_strip_f32 *acc, const T *x, float w) { \
    _Pragma("GCC unroll 16") for (int i = 0; i < KL_STRIP / 4; i++) acc->v[i] += kl_v4_##S(x + 4 * i) * w; \
  }
KL_STRIP_HALF_OPS(__half, f16)
KL_STRIP_HALF_OPS(__nv_bfloat16, bf16)
/* n halves of a row widened once into dst, four at a time: a strip
 * convolution's taps then read floats (each half would be widened once a
 * tap otherwise) */
#define KL_STRIP_WIDEN(T, S, CVT)                                                            \
  static inline void kl_strip_widen_##S(float *dst, const T *src, int n) {                   \
    int j = 0;                                                                               \
    for (; j + 4 <= n; j += 4) {                                                             \
      kl_v4f32 v = kl_v4_##S(src + j);                                                       \
      memcpy(dst + j, &v, sizeof v);                                                         \
    }                                                                                        \
    for (; j < n; j++) dst[j] = CVT(src[j]);                                                 \
  }
KL_STRIP_WIDEN(__half, f16, __half2float)
KL_STRIP_WIDEN(__nv_bfloat16, bf16, __bfloat162float)
#endif

/* ---- warp matrix multiply-add (tensor cores) ------------------------------
 * A warp computes C (16x8, f32) += A (16x16) * B (16x8) from halves (f16
 * or bf16), the PTX shape mma.m16n8k16 (sm_80 on), the products exact and
 * summed in f32.  The kernels (emit_attention.c, emit_fused.c) see only:
 *   kl_mma_a, kl_mma_b, kl_mma_c: a warp's fragments of A, B and C;
 *   kl_mma_load_a_T(&a, s, ld, lane): A from a kl_mma_stage array in
 *     shared memory (below), row-major (A(r, k) at s[r * ld + k]);
 *   kl_mma_load_b_T(&b, s, ld, lane): B, column-major (B(k, n) at
 *     s[n * ld + k]: K's rows for Q @ K^T);
 *   kl_mma_T(&c, &a, &b): c += a * b (T: f16 or bf16);
 *   kl_mma_zero(&c); KL_MMA_C entries c.c[i] a lane holds, at row
 *   kl_mma_row(lane, i) and column kl_mma_col(lane, i) of C.
 * (ld even, s 4-byte aligned.)  Three forms of one contract:
 *   - a GPU, sm_80 on: the registers as the PTX ISA lays them out (lane l,
 *     g = l / 4, t = l % 4; two halves a register, the lower column low):
 *     A: (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8); B: (k 2t,
 *     n g), (k 2t + 8, n g); C: (g, 2t), (g, 2t + 1), (g + 8, 2t),
 *     (g + 8, 2t + 1); one mma instruction;
 *   - older GPUs, and the host device asked for 32 lanes (a test): the
 *     same registers, the product gathered by shuffles from the lanes
 *     that hold each operand (so the host checks the GPU's layout);
 *   - the host device's one lane a warp (KL_LANES 1): lane 0 holds the
 *     whole tiles as floats, C row-major, and sums with plain loops. */
#if KL_LANES != 1 && KL_LANES != 32
#error "kiln_prelude.h: the warp matrix multiply-add needs KL_LANES 1 or 32"
#endif
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define KL_UNROLL _Pragma("unroll")
#else
#define KL_UNROLL
#endif
#define KL_MMA_C (KL_LANES == 1 ? 128 : 4)
/* How a kernel stages halves in shared memory for the loads below
 * (kl_mma_stage arrays): kl_mma_stage_T(h) of a half, kl_mma_stage_zero,
 * kl_mma_stage_round_T(v) of a float rounded to the half type.  Their bits
 * on a GPU; floats on the host device, widened once when staged rather
 * than at every warp's load. */
#if KL_LANES == 32
typedef uint16_t kl_mma_stage;
#define kl_mma_stage_f16(h) __half_as_ushort(h)
#define kl_mma_stage_bf16(h) __bfloat16_as_ushort(h)
#define kl_mma_stage_zero ((uint16_t)0)
#define kl_mma_stage_round_f16(v) __half_as_ushort(__float2half(v))
#define kl_mma_stage_round_bf16(v) __bfloat16_as_ushort(__float2bfloat16(v))
#else
typedef float kl_mma_stage;
#define kl_mma_stage_f16(h) __half2float(h)
#define kl_mma_stage_bf16(h) __bfloat162float(h)
#define kl_mma_stage_zero 0.0f
#define kl_mma_stage_round_f16(v) __half2float(__float2half(v))
#define kl_mma_stage_round_bf16(v) __bfloat162float(__float2bfloat16(v))
#endif
#if KL_LANES == 32
typedef struct { uint32_t r[4]; } kl_mma_a;
typedef struct { uint32_t r[2]; } kl_mma_b;
typedef struct { float c[4]; } kl_mma_c;
__device__ __forceinline__ int kl_mma_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
__device__ __forceinline__ int kl_mma_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }
__device__ __forceinline__ uint32_t kl_mma_pair(const void *s, int at) {
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
  return *(const uint32_t *)((const uint16_t *)s + at);
#else
  uint32_t v;
  memcpy(&v, (const uint16_t *)s + at, sizeof v);
  return v;
#endif
}
/* the same registers for f16 and bf16: a pair of halves is a pair of bits */
#define KL_MMA_LOADS(S)                                                                      \
  __device__ __forceinline__ void kl_mma_load_a_##S(kl_mma_a *a, const void *s, int ld, int lane) { \
    const int g = lane >> 2, t = lane & 3;                                                   \
    a->r[0] = kl_mma_pair(s, g * ld + 2 * t);                                                \
    a->r[1] = kl_mma_pair(s, (g + 8) * ld + 2 * t);                                          \
    a->r[2] = kl_mma_pair(s, g * ld + 2 * t + 8);                                            \
    a->r[3] = kl_mma_pair(s, (g + 8) * ld + 2 * t + 8);                                      \
  }                                                                                          \
  __device__ __forceinline__ void kl_mma_load_b_##S(kl_mma_b *b, const void *s, int ld, int lane) { \
    const int g = lane >> 2, t = lane & 3;                                                   \
    b->r[0] = kl_mma_pair(s, g * ld + 2 * t);                                                \
    b->r[1] = kl_mma_pair(s, g * ld + 2 * t + 8);                                            \
  }
KL_MMA_LOADS(f16)
KL_MMA_LOADS(bf16)
__device__ __forceinline__ float kl_mma_lo_f16(uint32_t r) { return __half2float(__ushort_as_half((unsigned short)(r & 0xffffu))); }
__device__ __forceinline__ float kl_mma_hi_f16(uint32_t r) { return __half2float(__ushort_as_half((unsigned short)(r >> 16))); }
__device__ __forceinline__ float kl_mma_lo_bf16(uint32_t r) { return __uint_as_float(r << 16); }
__device__ __forceinline__ float kl_mma_hi_bf16(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }
/* Lane (g, t) needs rows g and g + 8 of A (the registers of lanes 4g ..
 * 4g + 3) and columns 2t and 2t + 1 of B (lanes 8t .. 8t + 3 and 8t + 4
 * .. 8t + 7): source s gives k = 2s, 2s + 1, 2s + 8, 2s + 9.  Every lane
 * shuffles alike (a warp collective). */
#define KL_MMA_SHUFFLED(S)                                                                   \
  __device__ __forceinline__ void kl_mma_shuffled_##S(kl_mma_c *c, const kl_mma_a *a, const kl_mma_b *b) { \
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;                   \
    float d[4] = {0, 0, 0, 0};                                                               \
    for (int s = 0; s < 4; s++) {                                                            \
      uint32_t ar[4], b0[2], b1[2];                                                          \
      for (int q = 0; q < 4; q++) ar[q] = __shfl_sync(0xffffffffu, a->r[q], 4 * g + s);      \
      for (int q = 0; q < 2; q++) {                                                          \
        b0[q] = __shfl_sync(0xffffffffu, b->r[q], 8 * t + s);                                \
        b1[q] = __shfl_sync(0xffffffffu, b->r[q], 8 * t + 4 + s);                            \
      }                                                                                      \
      for (int h = 0; h < 2; h++) { /* row g, then g + 8 */                                  \
        const uint32_t lo = ar[h], hi = ar[2 + h];                                           \
        d[2 * h] += kl_mma_lo_##S(lo) * kl_mma_lo_##S(b0[0]) + kl_mma_hi_##S(lo) * kl_mma_hi_##S(b0[0]) + \
                    kl_mma_lo_##S(hi) * kl_mma_lo_##S(b0[1]) + kl_mma_hi_##S(hi) * kl_mma_hi_##S(b0[1]); \
        d[2 * h + 1] += kl_mma_lo_##S(lo) * kl_mma_lo_##S(b1[0]) + kl_mma_hi_##S(lo) * kl_mma_hi_##S(b1[0]) + \
                        kl_mma_lo_##S(hi) * kl_mma_lo_##S(b1[1]) + kl_mma_hi_##S(hi) * kl_mma_hi_##S(b1[1]); \
      }                                                                                      \
    }                                                                                        \
    for (int q = 0; q < 4; q++) c->c[q] += d[q];                                             \
  }
KL_MMA_SHUFFLED(f16)
KL_MMA_SHUFFLED(bf16)
#if (defined(__CUDACC_RTC__) || defined(__CUDACC__)) && __CUDA_ARCH__ >= 800
#define KL_MMA_INSTR(S, PTX)                                                                 \
  __device__ __forceinline__ void kl_mma_##S(kl_mma_c *c, const kl_mma_a *a, const kl_mma_b *b) { \
    asm("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
        : "+f"(c->c[0]), "+f"(c->c[1]), "+f"(c->c[2]), "+f"(c->c[3])                         \
        : "r"(a->r[0]), "r"(a->r[1]), "r"(a->r[2]), "r"(a->r[3]), "r"(b->r[0]), "r"(b->r[1])); \
  }
KL_MMA_INSTR(f16, "f16")
KL_MMA_INSTR(bf16, "bf16")
#else
#define kl_mma_f16 kl_mma_shuffled_f16
#define kl_mma_bf16 kl_mma_shuffled_bf16
#endif
#else /* the host's one lane a warp: whole tiles */
typedef struct { float m[16][16]; } kl_mma_a;
typedef struct { float m[16][8]; } kl_mma_b; /* [k][n] */
typedef struct { float c[128]; } kl_mma_c;   /* [row][col] */
static inline int kl_mma_row(int lane, int i) { (void)lane; return i >> 3; }
static inline int kl_mma_col(int lane, int i) { (void)lane; return i & 7; }
/* (the staged tiles are floats already: f16 and bf16 load alike) */
#define KL_MMA_HOST(S, T)                                                                    \
  static inline void kl_mma_load_a_##S(kl_mma_a *a, const void *s, int ld, int lane) {       \
    (void)lane;                                                                              \
    for (int r = 0; r < 16; r++) memcpy(a->m[r], (const float *)s + r * ld, sizeof a->m[r]); \
  }                                                                                          \
  static inline void kl_mma_load_b_##S(kl_mma_b *b, const void *s, int ld, int lane) {       \
    (void)lane;                                                                              \
    for (int n = 0; n < 8; n++)                                                              \
      for (int k = 0; k < 16; k++) b->m[k][n] = ((const float *)s)[n * ld + k];              \
  }                                                                                          \
  static inline void kl_mma_##S(kl_mma_c *c, const kl_mma_a *a, const kl_mma_b *b) {         \
    /* two rows at a time: four independent vector sums (one would wait on \
     * its own additions); each entry still sums k in order, then joins C */ \
    for (int r = 0; r < 16; r += 2) {                                                        \
      kl_v4f32 d00 = {0, 0, 0, 0}, d01 = d00, d10 = d00, d11 = d00, b0, b1, t;               \
      for (int k = 0; k < 16; k++) {                                                         \
        memcpy(&b0, &b->m[k][0], sizeof b0);                                                 \
        memcpy(&b1, &b->m[k][4], sizeof b1);                                                 \
        d00 += a->m[r][k] * b0, d01 += a->m[r][k] * b1;                                      \
        d10 += a->m[r + 1][k] * b0, d11 += a->m[r + 1][k] * b1;                              \
      }                                                                                      \
      memcpy(&t, &c->c[8 * r], sizeof t), t += d00, memcpy(&c->c[8 * r], &t, sizeof t);      \
      memcpy(&t, &c->c[8 * r + 4], sizeof t), t += d01, memcpy(&c->c[8 * r + 4], &t, sizeof t); \
      memcpy(&t, &c->c[8 * r + 8], sizeof t), t += d10, memcpy(&c->c[8 * r + 8], &t, sizeof t); \
      memcpy(&t, &c->c[8 * r + 12], sizeof t), t += d11, memcpy(&c->c[8 * r + 12], &t, sizeof t); \
    }                                                                                        \
  }
KL_MMA_HOST(f16, __half)
KL_MMA_HOST(bf16, __nv_bfloat16)
#endif
__device__ __forceinline__ void kl_mma_zero(kl_mma_c *c) {
  for (int i = 0; i < KL_MMA_C; i++) c->c[i] = 0;
}
#endif /* KL_PRELUDE_CONVERSIONS_ONLY */

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

/* ---- one-byte floats ------------------------------------------------
 * fp8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ), fp4 (E2M1, its code in the low
 * four bits of a byte) and E8M0 (a bare power of two), converted to and from
 * float.  Written once, here, in the C both compilers take, so that the GPU
 * (NVRTC), the host emulation and libkilnrt (runtime/half.c includes this
 * part alone, for the interpreter and the tensor files) convert bit for bit
 * alike.  cuda_fp8.h has GPU conversions, but not on the host, not for the
 * FNUZ types or E8M0's round modes.  The rules are ONNX's Cast (round to
 * nearest even; saturate clamps finite overflow and Inf to the largest
 * finite value; without it overflow gives Inf (E5M2) or NaN) with the NaN
 * and fp4 details of ONNX's reference (ml_dtypes). */
#define KL_MF_E4M3FN 0
#define KL_MF_E4M3FNUZ 1
#define KL_MF_E5M2 2
#define KL_MF_E5M2FNUZ 3
#define KL_MF_E2M1 4

__device__ __forceinline__ int kl_mf_mbits(int fmt) {
  return fmt == KL_MF_E5M2 || fmt == KL_MF_E5M2FNUZ ? 2 : fmt == KL_MF_E2M1 ? 1 : 3;
}
__device__ __forceinline__ int kl_mf_bias(int fmt) {
  return fmt == KL_MF_E4M3FN ? 7 : fmt == KL_MF_E4M3FNUZ ? 8 : fmt == KL_MF_E5M2 ? 15
       : fmt == KL_MF_E5M2FNUZ ? 16 : 1;
}
/* Code of the largest finite magnitude: 448, 240, 57344, 57344, 6. */
__device__ __forceinline__ unsigned kl_mf_max_code(int fmt) {
  return fmt == KL_MF_E4M3FN ? 0x7eu : fmt == KL_MF_E5M2 ? 0x7bu : fmt == KL_MF_E2M1 ? 0x7u : 0x7fu;
}
__device__ __forceinline__ unsigned kl_mf_sign_bit(int fmt) {
  return fmt == KL_MF_E2M1 ? 0x8u : 0x80u;
}
__device__ __forceinline__ int kl_mf_is_fnuz(int fmt) {
  return fmt == KL_MF_E4M3FNUZ || fmt == KL_MF_E5M2FNUZ;
}
/* m >> s (1 <= s <= 31), rounded to nearest, ties to even. */
__device__ __forceinline__ unsigned kl_mf_rne(unsigned m, int s) {
  unsigned r = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
  return r + (rem > half || (rem == half && (r & 1u)));
}

__device__ __forceinline__ unsigned kl_mf_from_f32(float f, int fmt, int saturate) {
  unsigned x = __float_as_uint(f), ax = x & 0x7fffffffu;
  unsigned sign = (x >> 31) ? kl_mf_sign_bit(fmt) : 0u, maxc = kl_mf_max_code(fmt);
  int mbits = kl_mf_mbits(fmt), bias = kl_mf_bias(fmt);
  if (ax > 0x7f800000u) { /* NaN; fp4 has none and ml_dtypes gives a zero */
    if (kl_mf_is_fnuz(fmt)) return 0x80u;
    if (fmt == KL_MF_E2M1) return sign ^ 0x8u;
    return sign | (fmt == KL_MF_E5M2 ? 0x7eu : 0x7fu);
  }
  unsigned q = maxc + 1u; /* Inf overflows */
  if (ax < 0x7f800000u) {
    int e = (int)(ax >> 23) - 127, emin = 1 - bias;
    if (e >= emin) { /* rebias; a carry out of the mantissa bumps the exponent */
      q = kl_mf_rne(((unsigned)(e + bias) << 23) | (ax & 0x7fffffu), 23 - mbits);
    } else { /* subnormal in the small format: units of 2^(emin - mbits) */
      int s = 23 - mbits + (emin - e);
      q = s > 25 ? 0u : kl_mf_rne((ax & 0x7fffffu) | 0x800000u, s);
    }
  }
  if (q > maxc) {
    if (saturate || fmt == KL_MF_E2M1) q = maxc;
    else if (kl_mf_is_fnuz(fmt)) return 0x80u;
    else return sign | (fmt == KL_MF_E5M2 ? 0x7cu : 0x7fu); /* Inf, NaN */
  }
  if (q == 0u && kl_mf_is_fnuz(fmt)) return 0u; /* no -0 */
  return sign | q;
}

__device__ __forceinline__ float kl_mf_to_f32(unsigned c, int fmt) {
  unsigned sb = kl_mf_sign_bit(fmt), mag = c & (sb - 1u);
  int mbits = kl_mf_mbits(fmt), bias = kl_mf_bias(fmt);
  if (kl_mf_is_fnuz(fmt) && c == 0x80u) return __uint_as_float(0x7fc00000u);
  if ((fmt == KL_MF_E4M3FN && mag == 0x7fu) || (fmt == KL_MF_E5M2 && mag > 0x7cu))
    return __uint_as_float(0x7fc00000u | (c & sb ? 0x80000000u : 0u)); /* keeps its sign */
  if (fmt == KL_MF_E5M2 && mag == 0x7cu) return __uint_as_float(0x7f800000u | (c & sb ? 0x80000000u : 0u));
  int e = (int)(mag >> mbits);
  unsigned m = mag & ((1u << mbits) - 1u);
  float v = e ? __uint_as_float((unsigned)(e - bias + 127) << 23 | m << (23 - mbits))
              : (float)m * __uint_as_float((unsigned)(128 - bias - mbits) << 23);
  return (c & sb) ? -v : v;
}

/* Cast's saturate as ONNX's reference does it: clamped to the largest
 * finite value (Inf too, NaN kept), so that the store rounds in range. */
__device__ __forceinline__ float kl_mf_saturate(float f, int fmt) {
  float m = kl_mf_to_f32(kl_mf_max_code(fmt), fmt);
  return f != f ? f : f > m ? m : f < -m ? -m : f;
}

/* E8M0: 2^(c - 127), 0xff NaN.  From float by the exponent alone (the sign
 * is ignored), as ONNX's reference: round_mode up (any fraction rounds up),
 * down, or nearest (its guard/round/sticky rule); saturate keeps the
 * largest exponent from rounding up into NaN. */
#define KL_E8M0_UP 0
#define KL_E8M0_DOWN 1
#define KL_E8M0_NEAREST 2
__device__ __forceinline__ unsigned kl_e8m0_from_f32(float f, int saturate, int round_mode) {
  unsigned x = __float_as_uint(f), e = (x >> 23) & 0xffu;
  if (e == 0xffu) return 0xffu;
  int up = 0;
  if (round_mode == KL_E8M0_UP) up = (x & 0x7fffffu) != 0;
  else if (round_mode == KL_E8M0_NEAREST)
    up = (x & 0x400000u) && ((x & 0x200000u) || (x & 0x1fffffu) || e > 0);
  if (up && e == 0xfeu && saturate) up = 0;
  return e + (unsigned)up;
}
__device__ __forceinline__ float kl_e8m0_to_f32(unsigned c) {
  c &= 0xffu;
  return c == 0xffu ? __uint_as_float(0x7fc00000u) : __uint_as_float(c ? c << 23 : 0x400000u);
}

/* Sub-byte integers live one per byte (int8_t / uint8_t); stores wrap to
 * their width, two's complement, as ONNX's Cast between integers. */
__device__ __forceinline__ int64_t kl_wrap_signed(int64_t v, int bits) {
  uint64_t sb = 1ull << (bits - 1);
  return (int64_t)(((uint64_t)v & ((1ull << bits) - 1u)) ^ sb) - (int64_t)sb;
}
__device__ __forceinline__ uint64_t kl_wrap_unsigned(uint64_t v, int bits) {
  return v & ((1ull << bits) - 1u);
}

#endif
