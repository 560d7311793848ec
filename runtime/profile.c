/* profile.c - the profiler: marks between a model's steps, and the
 * device-to-device copy bandwidth the steps' bandwidth is compared with.
 * The devices record the marks (device_host.c: the clock; device_cuda.c:
 * events on the stream the kernels run on). */
#include <stdlib.h>
#include <string.h>

/* NVTX (header only, in the CUDA toolkit): the ranges Nsight Systems and
 * Nsight Compute show.  Without a tool attached each call is a check of a
 * function pointer; the library a tool injects is loaded only then. */
#include <nvtx3/nvToolsExt.h>

#include "device_impl.h"

int krt_profile_enable(krt_device *d, int nmarks, char *err, size_t errlen) {
  if (!d) return krt_err(err, errlen, "krt_profile_enable: device is NULL");
  if (nmarks < 0 || nmarks > 1 << 20)
    return krt_err(err, errlen, "krt_profile_enable: %d marks (0..%d)", nmarks, 1 << 20);
  if (d->ops->marks_free) d->ops->marks_free(d);
  free(d->mark_ms);
  free(d->mark_events);
  d->mark_ms = NULL;
  d->mark_events = NULL;
  d->nmarks = 0;
  if (!nmarks) return 0;
  d->mark_ms = calloc((size_t)nmarks, sizeof *d->mark_ms);
  d->mark_events = calloc((size_t)nmarks, sizeof *d->mark_events);
  if (!d->mark_ms || !d->mark_events) {
    free(d->mark_ms);
    free(d->mark_events);
    d->mark_ms = NULL;
    d->mark_events = NULL;
    return krt_err(err, errlen, "krt_profile_enable: out of host memory");
  }
  d->nmarks = nmarks;
  return 0;
}

int krt_mark(krt_device *d, int i, char *err, size_t errlen) {
  if (!d || !d->nmarks) return 0;
  if (i < 0 || i >= d->nmarks)
    return krt_err(err, errlen, "krt_mark: mark %d, profiling has %d", i, d->nmarks);
  return d->ops->mark(d, i, err, errlen);
}

int krt_step_mark(krt_device *d, int i, const char *name, char *err, size_t errlen) {
  if (!d) return 0;
  if (d->nvtx_open) nvtxRangePop();
  d->nvtx_open = name != NULL;
  if (name) nvtxRangePushA(name);
  return krt_mark(d, i, err, errlen);
}

int krt_profile_read(krt_device *d, double *ms, int nsteps, char *err, size_t errlen) {
  if (!d || !ms) return krt_err(err, errlen, "krt_profile_read: device or ms is NULL");
  if (nsteps < 0 || nsteps + 1 > d->nmarks)
    return krt_err(err, errlen, "krt_profile_read: %d steps need %d marks, profiling has %d",
                   nsteps, nsteps + 1, d->nmarks);
  if (d->ops->synchronize(d, err, errlen)) return -1;
  for (int i = 0; i < nsteps; i++)
    if (d->ops->between(d, i, i + 1, &ms[i], err, errlen)) return -1;
  return 0;
}

int krt_copy_bandwidth(krt_device *d, size_t bytes, int iters, double *gbps, char *err,
                       size_t errlen) {
  if (!d || !gbps || !bytes || iters < 1)
    return krt_err(err, errlen, "krt_copy_bandwidth: bad arguments");
  void *a = NULL, *b = NULL;
  double *ms = calloc((size_t)iters, sizeof *ms);
  int saved = d->nmarks, rc = 0;
  double *saved_ms = d->mark_ms;
  void **saved_ev = d->mark_events;
  d->nmarks = 0, d->mark_ms = NULL, d->mark_events = NULL; /* the model's marks stay */
  if (!ms || krt_malloc(d, bytes, &a, err, errlen) || krt_malloc(d, bytes, &b, err, errlen) ||
      krt_memset_zero(d, a, bytes, err, errlen) || krt_profile_enable(d, 2, err, errlen)) {
    rc = -1;
    goto out;
  }
  for (int i = 0; i <= iters && !rc; i++) { /* the first copy warms up */
    rc = d->ops->mark(d, 0, err, errlen) || d->ops->copy(d, b, a, bytes, err, errlen) ||
         d->ops->mark(d, 1, err, errlen) || d->ops->synchronize(d, err, errlen) ||
         d->ops->between(d, 0, 1, i ? &ms[i - 1] : &(double){0}, err, errlen);
  }
  if (!rc) {
    double med = krt_median(ms, (size_t)iters);
    *gbps = med > 0 ? 2.0 * (double)bytes / (med * 1e6) : 0;
  }
out:
  krt_profile_enable(d, 0, NULL, 0);
  d->nmarks = saved, d->mark_ms = saved_ms, d->mark_events = saved_ev;
  krt_free(d, a);
  krt_free(d, b);
  free(ms);
  return rc ? -1 : 0;
}
