/* device_host.c - the host device: memory is ordinary memory, kernels run
 * through the CUDA emulator (runtime/emu), GEMM through CBLAS (blas_host.c).
 *
 * It exists to test the whole system without a GPU, so it keeps the GPU's
 * contract where that is cheap (64-byte aligned allocations, the same launch
 * limits via kl_emu_launch) rather than being fast. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "device_impl.h"
#include "emu/emu.h"

/* cudaMalloc gives 256-byte alignment and kernels may rely on some of it for
 * vector loads (float4, double2: 16 bytes); 64 bytes covers those and a
 * cache line without wasting much on small buffers. */
#define HOST_ALIGN 64

static int host_open(krt_device *d, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  int n = kl_emu_threads();
  snprintf(d->name, sizeof d->name, "host (%d thread%s)", n, n == 1 ? "" : "s");
  /* The emulator's workers take every core, and OpenBLAS's own threads
   * spin a while after each GEMM: the kernels that follow then run on what
   * they leave (bench/models/matmul_block fp16 on the 2-core test VM, 22.9
   * ms fused with OpenBLAS's threads, 17.2 ms with one).  So one BLAS
   * thread, unless the user chose a count. */
  if (!getenv("OPENBLAS_NUM_THREADS") && !getenv("GOTO_NUM_THREADS") && !getenv("OMP_NUM_THREADS"))
    openblas_set_num_threads(1);
  return 0;
}

/* The emulator's worker threads stop with the device (the next launch
 * starts them again): a program that closes its device leaves no threads
 * behind, parked or otherwise, for whatever runs at exit. */
static void host_close(krt_device *d) {
  (void)d;
  kl_emu_shutdown();
}

static int host_alloc(krt_device *d, size_t bytes, void **ptr, char *err, size_t errlen) {
  (void)d;
  /* aligned_alloc wants a multiple of the alignment. */
  size_t rounded = (bytes + HOST_ALIGN - 1) & ~(size_t)(HOST_ALIGN - 1);
  void *p = rounded >= bytes ? aligned_alloc(HOST_ALIGN, rounded) : NULL;
  if (!p) return krt_err(err, errlen, "krt_malloc: out of host memory (%zu bytes asked)", bytes);
  *ptr = p;
  return 0;
}

static void host_release(krt_device *d, void *ptr) {
  (void)d;
  free(ptr);
}

static int host_copy(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                     size_t errlen) {
  (void)d;
  (void)err;
  (void)errlen;
  memmove(dst, src, bytes); /* overlapping device-to-device copies stay defined */
  return 0;
}

static int host_memset_zero(krt_device *d, void *dst, size_t bytes, char *err, size_t errlen) {
  (void)d;
  (void)err;
  (void)errlen;
  memset(dst, 0, bytes);
  return 0;
}

/* kl_emu_launch returns only when the grid has finished: nothing is queued. */
static int host_synchronize(krt_device *d, char *err, size_t errlen) {
  (void)d;
  (void)err;
  (void)errlen;
  return 0;
}

static int no_host_entry(const krt_module *m, int i, char *err, size_t errlen) {
  return krt_err(err, errlen,
                 "kernel %s was not built for the host (the program was compiled for the GPU "
                 "only)",
                 m->names[i]);
}

/* Check the entries up front so that a GPU-only program fails at load, not
 * in the middle of a run. */
static int host_module_load(krt_module *m, const krt_module_desc *desc, char *err,
                            size_t errlen) {
  (void)desc;
  for (int i = 0; i < m->nkernels; i++)
    if (!m->host[i] || !m->host[i]->fn) return no_host_entry(m, i, err, errlen);
  m->priv = m; /* nothing to keep; non-NULL marks the module as loaded */
  return 0;
}

static void host_module_unload(krt_module *m) { m->priv = NULL; }

static int host_launch(krt_module *m, int index, krt_dim3 grid, krt_dim3 block,
                       size_t dyn_shared, void **args, char *err, size_t errlen) {
  if (!m->host[index] || !m->host[index]->fn) return no_host_entry(m, index, err, errlen);
  return kl_emu_launch(m->host[index], grid, block, dyn_shared, args, err, errlen);
}

static int host_gemm(krt_device *d, const krt_gemm_desc *g, char *err, size_t errlen) {
  (void)d;
  return krt_blas_gemm(g, err, errlen);
}

/* ---- the profiler: launches return when done, so the clock will do ---- */
static int host_mark(krt_device *d, int i, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  d->mark_ms[i] = krt_now_ms();
  return 0;
}

static int host_between(krt_device *d, int from, int to, double *ms, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  *ms = d->mark_ms[to] - d->mark_ms[from];
  return 0;
}

const krt_device_ops krt_host_ops = {
    .kind = KRT_DEVICE_HOST,
    .open = host_open,
    .close = host_close,
    .alloc = host_alloc,
    .release = host_release,
    .upload = host_copy,
    .download = host_copy,
    .memset_zero = host_memset_zero,
    .synchronize = host_synchronize,
    .module_load = host_module_load,
    .module_unload = host_module_unload,
    .launch = host_launch,
    .gemm = host_gemm,
    .mark = host_mark,
    .between = host_between,
    .copy = host_copy,
};
