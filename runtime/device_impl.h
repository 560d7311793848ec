/* device_impl.h - what device.c shares with the device files (device_host.c,
 * device_cuda.c, blas_host.c).  Not installed: programs see only kilnrt.h.
 *
 * A device is a vtable plus that device's private state.  device.c checks
 * the arguments every device would check the same way (NULL pointers, kernel
 * index, GEMM shapes) so that the device files hold only what differs. */
#ifndef KILN_DEVICE_IMPL_H
#define KILN_DEVICE_IMPL_H

#include <stdarg.h>
#include <stddef.h>

#include "kilnrt.h"

typedef struct krt_device_ops {
  krt_device_kind kind;
  /* Fill d->name and d->priv; on failure leave nothing to close. */
  int (*open)(krt_device *d, char *err, size_t errlen);
  void (*close)(krt_device *d);
  /* bytes > 0 here; device.c handles 0. */
  int (*alloc)(krt_device *d, size_t bytes, void **ptr, char *err, size_t errlen);
  void (*release)(krt_device *d, void *ptr); /* ptr != NULL */
  int (*upload)(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                size_t errlen);
  int (*download)(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                  size_t errlen);
  int (*memset_zero)(krt_device *d, void *dst, size_t bytes, char *err, size_t errlen);
  int (*synchronize)(krt_device *d, char *err, size_t errlen);
  /* m->dev, m->names and m->host are filled; set m->priv. */
  int (*module_load)(krt_module *m, const krt_module_desc *desc, char *err, size_t errlen);
  void (*module_unload)(krt_module *m);
  /* index already checked against m->nkernels. */
  int (*launch)(krt_module *m, int index, krt_dim3 grid, krt_dim3 block, size_t dyn_shared,
                void **args, char *err, size_t errlen);
  /* Shapes, strides and pointers already checked (krt_gemm_check); m, n and
   * batch > 0. */
  int (*gemm)(krt_device *d, const krt_gemm_desc *g, char *err, size_t errlen);
  /* The profiler (profile.c): record mark `i` (0 <= i < d->nmarks) where
   * the device's work has got to, and later the ms between two recorded
   * marks; a device-to-device copy, for the bandwidth every kernel is
   * measured against. */
  int (*mark)(krt_device *d, int i, char *err, size_t errlen);
  int (*between)(krt_device *d, int from, int to, double *ms, char *err, size_t errlen);
  void (*marks_free)(krt_device *d);
  int (*copy)(krt_device *d, void *dst, const void *src, size_t bytes, char *err, size_t errlen);
  /* A data-parallel step's gradient exchange on the device's own library
   * (cuda: NCCL); NULL: the communicator sums device memory itself (host). */
  int (*comm_start)(krt_device *d, krt_comm *c, int bucket, int count, void *const *src,
                    void *const *dst, const int64_t *numel, krt_dtype dtype, char *err, size_t errlen);
  int (*comm_wait)(krt_device *d, krt_comm *c, int bucket, char *err, size_t errlen);
  /* CUDA Graphs (NULL: the device has none, krt_graph_run calls compute):
   * capture what is enqueued between begin and end into an executable
   * graph, launch one, destroy one. */
  int (*graph_begin)(krt_device *d, char *err, size_t errlen);
  int (*graph_end)(krt_device *d, void **exec, char *err, size_t errlen);
  int (*graph_launch)(krt_device *d, void *exec, char *err, size_t errlen);
  void (*graph_destroy)(krt_device *d, void *exec);
} krt_device_ops;

struct krt_device {
  const krt_device_ops *ops;
  char name[160];
  void *priv;
  int nmarks;       /* 0: profiling off */
  double *mark_ms;  /* host: the clock at each mark */
  void **mark_events; /* cuda: an event per mark */
  krt_comm *comm;     /* data-parallel: the ranks' communicator (NULL: one) */
  int sm;             /* cuda: compute capability x 10 (90: 9.0); host: 0 */
  int graphs_off;     /* krt_device_set_graphs(d, 0), KILN_NO_GRAPH=1 */
  int nvtx_open;      /* krt_step_mark pushed an NVTX range not yet popped */
  long graph_captures, graph_replays;
};

/* The module keeps its own copy of the kernel names and host entries, so the
 * caller's krt_module_desc may be temporary. */
struct krt_module {
  krt_device *dev;
  int nkernels;
  char **names;
  const krt_host_kernel **host;
  void *priv;
};

extern const krt_device_ops krt_host_ops;
extern const krt_device_ops krt_cuda_ops;

/* printf into err (NULL-safe); always returns -1 so callers can
 * `return krt_err(...)`. */
int krt_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The image a GPU of compute capability sm (x 10) runs, by the driver's
 * rules (device_cuda.c): the index of the newest cubin of the same major
 * version and a minor at most the GPU's; else -1 for the PTX when its
 * .target (krt_ptx_target, 0 when it says none) is at most sm; else -2. */
int krt_pick_image(int sm, const krt_cubin *cubins, int n, const char *ptx);
int krt_ptx_target(const char *ptx);

/* Host GEMM through CBLAS on plain host pointers (blas_host.c). */
int krt_blas_gemm(const krt_gemm_desc *g, char *err, size_t errlen);

#endif
