/* emu.h - the host device's kernel launcher: run CUDA C kernels on the CPU.
 *
 * Two audiences, two sections:
 *   1. the launch API, used by generated host code (model.c) and the runtime;
 *      it defines no CUDA names, so any C file may include it;
 *   2. the kernel-side ABI, used only by kiln_emu.h's inline functions and
 *      macros (threadIdx, __syncthreads, KL_SHARED, ...).
 * The execution model is explained at the top of kiln_emu.h. */
#ifndef KILN_EMU_API_H
#define KILN_EMU_API_H

#include <stddef.h>
#include <stdint.h>

/* The two types a launch shares with the runtime (krt_dim3 and
 * krt_host_kernel): defined once, there, so that a kernels.cu defining
 * `const kl_emu_kernel k0__emu` and the model.c declaring it as
 * `extern const krt_host_kernel k0__emu` name the same struct. */
#include "../kilnrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- 1. launch API ---------------------------------------------------- */

/* CUDA's dim3/uint3 under a name that clashes with nothing. */
typedef krt_dim3 kl_dim3;

/* A kernel's host-side entry ("trampoline"): unpacks `args` - the same array
 * cuLaunchKernel takes, args[i] pointing at the i-th argument's value - and
 * calls the kernel.  KL_EMU_ENTRY in kiln_emu.h writes it. */
typedef void (*kl_emu_kernel_fn)(void **args);

/* What KL_EMU_ENTRY(name, ...) defines as `name__emu`, with external linkage,
 * for the host code to pass to kl_emu_launch: {name for messages, fn}. */
typedef krt_host_kernel kl_emu_kernel;

/* Limits checked at launch; they are sm_90's (but the one noted). */
#define KL_EMU_MAX_BLOCK_THREADS 1024
#define KL_EMU_MAX_DYN_SHARED (227u * 1024u)    /* opt-in maximum per block */
/* all KL_SHARED of a block: twice sm_90's 48 KB, because the host stages
 * halves for the tensor cores as floats (kiln_prelude.h's kl_mma_stage);
 * a GPU's own bound is ptxas's to check (nvrtc_generated_kernels) */
#define KL_EMU_MAX_STATIC_SHARED (96u * 1024u)

/* Run every block of `grid` (each `block` threads) to completion, spread over
 * the worker pool; returns when all are done, like a launch followed by a
 * synchronize.  `dyn_shared` bytes of KL_DYN_SHARED memory per block.
 * Returns 0, or -1 with a message naming the kernel in err (errlen bytes,
 * err may be NULL): bad configuration, static shared memory over 48 KiB,
 * a deadlock in a block (then the kernel still ran to the end, with the
 * waiting threads released, and its results are not to be trusted).
 * Launches from several host threads are serialised. */
int kl_emu_launch(const kl_emu_kernel *k, kl_dim3 grid, kl_dim3 block,
                  size_t dyn_shared, void **args, char *err, size_t errlen);

/* Use n workers (n >= 1; the launching thread is one of them) from the next
 * launch on; n <= 0 goes back to the default: $KL_EMU_THREADS, else the CPUs
 * this process may run on.  One worker makes float atomics deterministic. */
void kl_emu_set_threads(int n);
/* The number of workers the next launch uses. */
int kl_emu_threads(void);

/* Stop the workers and free their stacks and buffers (also fine to never
 * call; a later launch starts them again). */
void kl_emu_shutdown(void);

/* Counters since the start, for tests and `kiln bench`. */
typedef struct kl_emu_stats {
  unsigned long long launches;
  unsigned long long blocks;        /* blocks run */
  unsigned long long fiber_blocks;  /* of which switched to fibers */
  unsigned long long switches;      /* fiber context switches */
} kl_emu_stats;
void kl_emu_get_stats(kl_emu_stats *s);

/* ---- 2. kernel-side ABI (for kiln_emu.h only) -------------------------- */

/* The executing CUDA thread as kernels see it.  One per OS thread: a block
 * runs entirely on one worker, and the worker rewrites thread_idx before it
 * runs (or resumes) each CUDA thread of the block. */
typedef struct kl_emu_state {
  kl_dim3 thread_idx, block_idx, block_dim, grid_dim;
  unsigned long long block_epoch; /* changes with every block run here */
  void *dyn_shared;               /* this block's KL_DYN_SHARED memory */
  struct kl_emu_worker *worker;   /* NULL outside a launch */
} kl_emu_state;

#if defined(__cplusplus)
extern thread_local kl_emu_state kl_emu_tls;
#else
extern _Thread_local kl_emu_state kl_emu_tls;
#endif

/* Block barrier: op 0 __syncthreads, 1 _count, 2 _and, 3 _or. */
enum { KL_EMU_BAR_SYNC, KL_EMU_BAR_COUNT, KL_EMU_BAR_AND, KL_EMU_BAR_OR };
int kl_emu_bar(int op, int pred);

/* Warp collective over the lanes in `mask`: every lane deposits `val`, the
 * last to arrive computes each lane's result.  `arg` is the lane/delta/xor
 * mask of a shuffle, `width` its segment width. */
enum {
  KL_EMU_SHFL_IDX, KL_EMU_SHFL_UP, KL_EMU_SHFL_DOWN, KL_EMU_SHFL_XOR,
  KL_EMU_VOTE_BALLOT, KL_EMU_VOTE_ANY, KL_EMU_VOTE_ALL, KL_EMU_WARP_SYNC
};
uint64_t kl_emu_warp(int op, unsigned mask, uint64_t val, int arg, int width);

/* One KL_SHARED declaration: where its array is in the block running on this
 * OS thread (valid while epoch == kl_emu_tls.block_epoch). */
typedef struct kl_emu_site {
  unsigned long long epoch;
  void *ptr;
} kl_emu_site;
void *kl_emu_shared_alloc(kl_emu_site *site, size_t size);

#ifdef __cplusplus
}
#endif
#endif
