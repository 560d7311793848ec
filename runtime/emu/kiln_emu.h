/* kiln_emu.h - CUDA C on the CPU: the header a kernels.cu is compiled
 * against when the host C compiler (C11) builds it for Kiln's host device.
 * Kernels do not include it directly: they include kiln_prelude.h, which
 * includes this file on the host and is a few macros under NVRTC.
 *
 * THE MODEL, in one sitting
 *
 * - A launch (kl_emu_launch, emu.h) runs every block of the grid.  Blocks go
 *   to a pool of worker threads (one per CPU; the launching thread is one of
 *   them), one block at a time per worker, in any order - as on a GPU.
 *
 * - Inside a block the CUDA threads first run as a plain loop: thread 0 to
 *   its end, then thread 1, ...  No stacks, no switches.  That is exact for
 *   the many kernels that never synchronise.
 *
 * - The first time a thread calls __syncthreads() or a warp collective
 *   (__shfl*_sync, __ballot_sync, __syncwarp, ...) the block turns into
 *   fibers: every thread still to come gets its own 64 KiB stack, and the
 *   caller waits.  This is exact too: CUDA requires a barrier to be reached by
 *   every thread of the block that has not exited, so every thread before the
 *   caller has exited (and exited threads count as arrived, as on sm_70+).
 *   From then on each wait switches to the next runnable thread of the block
 *   (round robin); the last thread to arrive releases the others.  Warp
 *   collectives wait only for the live lanes of their mask; the last to
 *   arrive computes every lane's result (PTX shfl rules: out-of-segment lanes
 *   read their own value, and so do reads from lanes that have exited).
 *   A wait that can never end (divergent barriers) is reported as an error;
 *   the threads are released so the launch still finishes.
 *
 * - threadIdx, blockIdx, blockDim and gridDim read a thread-local record
 *   (kl_emu_tls) that the worker rewrites before it runs each CUDA thread;
 *   fibers never leave the worker that runs their block, so thread-local is
 *   per block.  They are unsigned, as in CUDA.
 *
 * - Shared memory is per block.  A kernel declares it with
 *   KL_SHARED(float, tile, [32][33]) - `__shared__ float tile[32][33]` under
 *   NVRTC, and here a pointer `float (*const tile)[33]` into the worker's
 *   per-block arena, handed out on first use in each block.  `tile[i][j]`
 *   means the same on both devices; `sizeof tile` does not (never use it).
 *   Every block's shared memory starts filled with 0xFF bytes (NaN for float,
 *   -1 for ints), so reading before writing shows up in results; under ASan
 *   the arrays have redzones, so overruns are reported.
 *
 * - Atomics are real atomics (blocks run in parallel); float atomicAdd is a
 *   compare-and-swap loop, so, as on a GPU, float sums by atomics depend on
 *   block order unless kl_emu_set_threads(1).
 *
 * - __half and __nv_bfloat16 are opaque 16-bit structs: convert with
 *   __half2float / __float2half (and the bf16 pair), round to nearest even,
 *   bit-identical to the GPU (a NaN becomes the canonical NaN, as there).
 *   There is no half arithmetic: compute in float.
 *
 * - Math: the C library (expf, logf, tanhf, erff, ...); the fast intrinsics
 *   (__expf, __fdividef, ...) map to the exact functions, so they can differ
 *   from the GPU in the last bits, as the exact ones may too.
 *
 * WHAT A KERNEL SOURCE MAY USE (the "CUDA C" contract; see kiln_prelude.h)
 *   KL_KERNEL void name(args)   - a kernel (extern "C" __global__ on NVRTC)
 *   __device__ [__forceinline__] - helpers; never write `static` yourself
 *   KL_SHARED(T, name, [n]...)  - static shared arrays, at function scope
 *   KL_DYN_SHARED(T, name)      - the launch's dynamic shared memory
 *   KL_EMU_ENTRY(name, KL_ARG(T0, 0), KL_ARG(T1, 1), ...) after each kernel,
 *   KL_EMU_ENTRY0(name) for a kernel without parameters - define the host
 *     entry `const kl_emu_kernel name__emu` (nothing under NVRTC)
 *   KL_INF, KL_NAN, KL_FLT_MAX  - constants (math.h's are not in NVRTC)
 *   int8_t ... uint64_t         - fixed-width types (both devices)
 *   threadIdx blockIdx blockDim gridDim warpSize, __syncthreads and its
 *   _count/_and/_or forms, __syncwarp(mask) (mask required), __shfl_sync,
 *   __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync (width optional; int,
 *   unsigned, long, long long, float, double; shuffle a half as its bits),
 *   __ballot_sync, __any_sync, __all_sync, atomicAdd (int, unsigned, ull,
 *   float, double), atomicSub, atomicMax, atomicMin (int, unsigned),
 *   atomicExch, atomicCAS (int, unsigned, ull), __threadfence, __ldg,
 *   __float_as_int & co, the conversions above, <math.h> float functions,
 *   rsqrtf, __expf/__logf/__fdividef/__saturatef/..., __float2int_rn/rz.
 *   Not available: templates, references, overloading, `max`/`min`, half
 *   arithmetic, __activemask, spin-waits on other threads (a waiting thread
 *   never yields unless it reaches a barrier).
 *
 * Build: the host C compiler with -std=c11 (or gnu11), this folder on the
 * include path, and kernels.cu compiled as C (`-x c`, or a .c file that
 * #includes it); link emu.c and -lm -lpthread. */
#ifndef KILN_EMU_H
#define KILN_EMU_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "emu.h"

/* ---- qualifiers -------------------------------------------------------- */
/* Kernels and helpers are file-local: the only symbols a kernels.cu exports
 * on the host are its `name__emu` descriptors. */
#define KL_KERNEL static
#define __global__ static
#define __device__ static __attribute__((unused))
#define __host__
#define __constant__ static
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
/* A bare __shared__ would be one array for all blocks: refuse it by name. */
#define __shared__ kl_use_KL_SHARED_instead_of___shared__

/* ---- built-in variables ------------------------------------------------ */
typedef kl_dim3 uint3;
typedef kl_dim3 dim3;
#define threadIdx (kl_emu_tls.thread_idx)
#define blockIdx (kl_emu_tls.block_idx)
#define blockDim (kl_emu_tls.block_dim)
#define gridDim (kl_emu_tls.grid_dim)
#define warpSize 32

/* ---- constants ---------------------------------------------------------- */
#define KL_INF (__int_as_float(0x7f800000))
#define KL_NAN (__int_as_float(0x7fffffff)) /* the GPU's canonical NaN */
#define KL_FLT_MAX 3.402823466e+38f

/* ---- shared memory -------------------------------------------------------- */
/* KL_SHARED(float, tile, [32][33]) declares `float (*const tile)[33]`: the
 * __typeof__ names the array's element type (float[33]).  The site is
 * thread-local because each worker runs its own block. */
#define KL_SHARED_ELEM_(T, dims) __typeof__((*(T(*) dims)0)[0])
#define KL_SHARED(T, name, dims)                                         \
  static _Thread_local kl_emu_site kl_site_##name;                       \
  KL_SHARED_ELEM_(T, dims) *const name =                                 \
      (KL_SHARED_ELEM_(T, dims) *)kl_emu_shared_get(&kl_site_##name,     \
                                                    sizeof(T dims))
#define KL_DYN_SHARED(T, name) T *const name = (T *)kl_emu_tls.dyn_shared

static inline void *kl_emu_shared_get(kl_emu_site *s, size_t size) {
  return s->epoch == kl_emu_tls.block_epoch ? s->ptr : kl_emu_shared_alloc(s, size);
}

/* ---- host entries ---------------------------------------------------------- */
/* After each kernel:
 *   KL_EMU_ENTRY(vec_add, KL_ARG(const float *, 0), KL_ARG(float *, 1),
 *                KL_ARG(int, 2));
 * defines `static void vec_add__emu_fn(void **)` calling the kernel with the
 * unpacked arguments, and `const kl_emu_kernel vec_add__emu`.  KL_ARG(T, i)
 * reads the i-th argument as a T, as cuLaunchKernel would. */
#define KL_ARG(T, i) (*(T *)kl_args[i])
#define KL_EMU_ENTRY(name, ...)                                          \
  static void name##__emu_fn(void **kl_args) { name(__VA_ARGS__); }      \
  const kl_emu_kernel name##__emu = {#name, name##__emu_fn}
#define KL_EMU_ENTRY0(name)                                              \
  static void name##__emu_fn(void **kl_args) {                           \
    (void)kl_args;                                                       \
    name();                                                              \
  }                                                                      \
  const kl_emu_kernel name##__emu = {#name, name##__emu_fn}

/* ---- barriers ---------------------------------------------------------------- */
#define __syncthreads() ((void)kl_emu_bar(KL_EMU_BAR_SYNC, 0))
#define __syncthreads_count(p) kl_emu_bar(KL_EMU_BAR_COUNT, (p) != 0)
#define __syncthreads_and(p) kl_emu_bar(KL_EMU_BAR_AND, (p) != 0)
#define __syncthreads_or(p) kl_emu_bar(KL_EMU_BAR_OR, (p) != 0)
#define __syncwarp(mask) ((void)kl_emu_warp(KL_EMU_WARP_SYNC, (mask), 0, 0, 32))
/* Blocks run on separate OS threads; a full fence is the honest mapping. */
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* ---- bit casts ------------------------------------------------------------------ */
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }

/* ---- half and bfloat16 --------------------------------------------------------- */
/* Opaque so that host code cannot do arithmetic NVRTC's C++ types would allow
 * but this C header could not mean the same way. */
typedef struct { unsigned short kl_bits; } __half;
typedef struct { unsigned short kl_bits; } __nv_bfloat16;
/* CUDA's float4: four floats, 16-byte aligned, for vectorised loads. */
typedef struct __attribute__((aligned(16))) { float x, y, z, w; } float4;

/* Shift right by s (1..31) rounding to nearest, ties to even. */
static inline uint32_t kl_shift_rne_(uint32_t m, int s) {
  uint32_t r = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
  return r + (rem > half || (rem == half && (r & 1u)));
}

#if defined(__F16C__)
/* The CPU's conversion instructions where the build allows them (the
 * in-process build asks for -mf16c on a CPU that has them): the same bits
 * as the code below, the NaN made the GPU's canonical one.  Called by
 * their compiler builtins (GCC's and Clang's names): <immintrin.h> would
 * add a fifth of a second to every model's build. */
typedef short kl_f16c_v8hi_ __attribute__((vector_size(16)));
typedef float kl_f16c_v4sf_ __attribute__((vector_size(16)));
static inline __half __float2half(float f) {
  kl_f16c_v4sf_ v = {f, 0.0f, 0.0f, 0.0f};
  kl_f16c_v8hi_ h = __builtin_ia32_vcvtps2ph(v, 0); /* round to nearest even */
  __half r = {f != f ? (unsigned short)0x7fffu : (unsigned short)h[0]};
  return r;
}
static inline float __half2float(__half h) {
  kl_f16c_v8hi_ v = {(short)h.kl_bits, 0, 0, 0, 0, 0, 0, 0};
  float f = __builtin_ia32_vcvtph2ps(v)[0];
  return f != f ? KL_NAN : f;
}
#else
static inline __half __float2half(float f) {
  uint32_t x = __float_as_uint(f), ax = x & 0x7fffffffu;
  unsigned short sign = (unsigned short)((x >> 16) & 0x8000u), h;
  if (ax > 0x7f800000u)
    h = 0x7fffu;                          /* NaN -> canonical, as on the GPU */
  else if (ax >= 0x477ff000u)
    h = sign | 0x7c00u;                   /* >= 65520 rounds to infinity */
  else if (ax >= 0x38800000u)             /* normal: rebias 127 -> 15 */
    h = sign | (unsigned short)kl_shift_rne_(ax - (112u << 23), 13);
  else if (ax >= 0x33000000u)             /* subnormal: units of 2^-24 */
    h = sign | (unsigned short)kl_shift_rne_((ax & 0x7fffffu) | 0x800000u,
                                             126 - (int)(ax >> 23));
  else
    h = sign;                             /* below 2^-25: signed zero */
  __half r = {h};
  return r;
}

static inline float __half2float(__half h) {
  uint32_t sign = (uint32_t)(h.kl_bits & 0x8000u) << 16;
  uint32_t e = (h.kl_bits >> 10) & 0x1fu, m = h.kl_bits & 0x3ffu;
  if (e == 0x1f) /* inf; a NaN becomes the canonical NaN like cuda_fp16.hpp */
    return m ? KL_NAN : __uint_as_float(sign | 0x7f800000u);
  if (e == 0) { /* zero or subnormal: m * 2^-24 is exact in float */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
#endif

static inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t x = __float_as_uint(f);
  __nv_bfloat16 r;
  if ((x & 0x7fffffffu) > 0x7f800000u)
    r.kl_bits = 0x7fffu; /* canonical NaN, as on the GPU */
  else               /* rounding may carry into the exponent: that is right */
    r.kl_bits = (unsigned short)kl_shift_rne_(x, 16);
  return r;
}

static inline float __bfloat162float(__nv_bfloat16 b) {
  return __uint_as_float((uint32_t)b.kl_bits << 16);
}

#define __float2half_rn __float2half
#define __float2bfloat16_rn __float2bfloat16
static inline unsigned short __half_as_ushort(__half h) { return h.kl_bits; }
static inline __half __ushort_as_half(unsigned short u) { __half h = {u}; return h; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.kl_bits; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b = {u};
  return b;
}

/* ---- warp collectives ------------------------------------------------------------ */
/* Values travel as 64-bit patterns; C has no overloading, so _Generic picks
 * the packing by the value's type (like CUDA's overloads). */
#define KL_WARP_DEF_(suffix, T, to_bits, from_bits)                                   \
  static inline T kl_shfl_##suffix(int op, unsigned mask, T v, int arg, int width) {  \
    uint64_t b = kl_emu_warp(op, mask, to_bits, arg, width);                          \
    return from_bits;                                                                 \
  }
KL_WARP_DEF_(i32, int, (uint64_t)(uint32_t)v, (int)(uint32_t)b)
KL_WARP_DEF_(u32, unsigned, (uint64_t)v, (unsigned)b)
KL_WARP_DEF_(i64, long long, (uint64_t)v, (long long)b)
KL_WARP_DEF_(u64, unsigned long long, (uint64_t)v, (unsigned long long)b)
KL_WARP_DEF_(l64, long, (uint64_t)v, (long)b)
KL_WARP_DEF_(ul64, unsigned long, (uint64_t)v, (unsigned long)b)
KL_WARP_DEF_(f32, float, (uint64_t)__float_as_uint(v), __uint_as_float((uint32_t)b))
KL_WARP_DEF_(f64, double, (uint64_t)__double_as_longlong(v), __longlong_as_double((long long)b))
#undef KL_WARP_DEF_

#define KL_SHFL_(op, mask, v, arg, width)                                              \
  _Generic((v), float: kl_shfl_f32, double: kl_shfl_f64, unsigned: kl_shfl_u32,      \
           long long: kl_shfl_i64, unsigned long long: kl_shfl_u64, long: kl_shfl_l64, \
           unsigned long: kl_shfl_ul64, default: kl_shfl_i32)(op, mask, v, arg, width)
/* The optional width argument: pick the 3- or 4-argument form by count. */
#define KL_PICK4_(a, b, c, d, name, ...) name
#define KL_SHFL3_(op, m, v, a) KL_SHFL_(op, m, v, a, 32)
#define KL_SHFL4_(op, m, v, a, w) KL_SHFL_(op, m, v, a, w)
#define KL_SHFLN_(op, ...) \
  KL_PICK4_(__VA_ARGS__, KL_SHFL4_, KL_SHFL3_, unused, unused)(op, __VA_ARGS__)
#define __shfl_sync(...) KL_SHFLN_(KL_EMU_SHFL_IDX, __VA_ARGS__)
#define __shfl_up_sync(...) KL_SHFLN_(KL_EMU_SHFL_UP, __VA_ARGS__)
#define __shfl_down_sync(...) KL_SHFLN_(KL_EMU_SHFL_DOWN, __VA_ARGS__)
#define __shfl_xor_sync(...) KL_SHFLN_(KL_EMU_SHFL_XOR, __VA_ARGS__)

#define __ballot_sync(mask, p) ((unsigned)kl_emu_warp(KL_EMU_VOTE_BALLOT, (mask), (p) != 0, 0, 32))
#define __any_sync(mask, p) ((int)kl_emu_warp(KL_EMU_VOTE_ANY, (mask), (p) != 0, 0, 32))
#define __all_sync(mask, p) ((int)kl_emu_warp(KL_EMU_VOTE_ALL, (mask), (p) != 0, 0, 32))

/* ---- atomics --------------------------------------------------------------------- */
/* Relaxed, like CUDA's plain atomics; each returns the old value. */
#define KL_ATOMIC_INT_(T, suffix)                                                         \
  static inline T kl_atomic_add_##suffix(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
  static inline T kl_atomic_sub_##suffix(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
  static inline T kl_atomic_exch_##suffix(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
  static inline T kl_atomic_cas_##suffix(T *p, T cmp, T v) {                              \
    __atomic_compare_exchange_n(p, &cmp, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);       \
    return cmp;                                                                           \
  }                                                                                       \
  static inline T kl_atomic_max_##suffix(T *p, T v) {                                     \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                         \
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED,       \
                                                   __ATOMIC_RELAXED)) {}                  \
    return old;                                                                           \
  }                                                                                       \
  static inline T kl_atomic_min_##suffix(T *p, T v) {                                     \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                         \
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED,       \
                                                   __ATOMIC_RELAXED)) {}                  \
    return old;                                                                           \
  }
KL_ATOMIC_INT_(int, i32)
KL_ATOMIC_INT_(unsigned, u32)
KL_ATOMIC_INT_(unsigned long long, u64)
#undef KL_ATOMIC_INT_

/* Float adds: compare-and-swap on the bit pattern. */
static inline float kl_atomic_add_f32(float *p, float v) {
  uint32_t *u = (uint32_t *)(void *)p, old = __atomic_load_n(u, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(u, &old, __float_as_uint(__uint_as_float(old) + v), 1,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return __uint_as_float(old);
}
static inline double kl_atomic_add_f64(double *p, double v) {
  uint64_t *u = (uint64_t *)(void *)p, old = __atomic_load_n(u, __ATOMIC_RELAXED);
  for (;;) {
    uint64_t nw = (uint64_t)__double_as_longlong(__longlong_as_double((long long)old) + v);
    if (__atomic_compare_exchange_n(u, &old, nw, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
  }
  return __longlong_as_double((long long)old);
}

#define atomicAdd(p, v)                                                    \
  _Generic((p), float *: kl_atomic_add_f32, double *: kl_atomic_add_f64,   \
           unsigned *: kl_atomic_add_u32, unsigned long long *: kl_atomic_add_u64, \
           int *: kl_atomic_add_i32)(p, v)
#define atomicSub(p, v) \
  _Generic((p), unsigned *: kl_atomic_sub_u32, int *: kl_atomic_sub_i32)(p, v)
#define atomicMax(p, v) \
  _Generic((p), unsigned *: kl_atomic_max_u32, unsigned long long *: kl_atomic_max_u64, \
           int *: kl_atomic_max_i32)(p, v)
#define atomicMin(p, v) \
  _Generic((p), unsigned *: kl_atomic_min_u32, unsigned long long *: kl_atomic_min_u64, \
           int *: kl_atomic_min_i32)(p, v)
#define atomicExch(p, v) \
  _Generic((p), unsigned *: kl_atomic_exch_u32, unsigned long long *: kl_atomic_exch_u64, \
           int *: kl_atomic_exch_i32)(p, v)
#define atomicCAS(p, c, v) \
  _Generic((p), unsigned *: kl_atomic_cas_u32, unsigned long long *: kl_atomic_cas_u64, \
           int *: kl_atomic_cas_i32)(p, c, v)

/* ---- math intrinsics ---------------------------------------------------------------- */
/* The GPU's fast versions differ in the last bits; tests use tolerances. */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define __expf(x) expf(x)
#define __exp10f(x) powf(10.0f, x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf(x, y)
#define __fdividef(x, y) ((x) / (y))
#define __frcp_rn(x) (1.0f / (x))
#define __fsqrt_rn(x) sqrtf(x)
#define __fmaf_rn(x, y, z) fmaf(x, y, z)
#define __fadd_rn(x, y) ((x) + (y))
#define __fmul_rn(x, y) ((x) * (y))
#define __ldg(p) (*(p))
static inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }

/* float -> int as the GPU does it: saturating, NaN -> 0 (a C cast of an
 * out-of-range float is undefined). */
static inline int kl_f2i_sat_(float r) {
  if (r != r) return 0;
  if (r >= 2147483648.0f) return 2147483647;
  if (r < -2147483648.0f) return (-2147483647 - 1);
  return (int)r;
}
static inline int __float2int_rn(float x) { return kl_f2i_sat_(nearbyintf(x)); }
static inline int __float2int_rz(float x) { return kl_f2i_sat_(truncf(x)); }
static inline int __float2int_rd(float x) { return kl_f2i_sat_(floorf(x)); }
static inline int __float2int_ru(float x) { return kl_f2i_sat_(ceilf(x)); }
#define __popc(x) __builtin_popcount(x)
#define __clz(x) ((x) ? __builtin_clz(x) : 32)
#define __ffs(x) __builtin_ffs(x)

#endif
