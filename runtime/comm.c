/* comm.c - the collectives' interface (kilnrt.h): one rank without a
 * communicator, else the communicator's vtable (comm_mpi.c), and the
 * gradient exchange of compiled data-parallel steps on a device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "device_impl.h"

int krt_comm_rank(const krt_comm *c) { return c ? c->rank : 0; }
int krt_comm_size(const krt_comm *c) { return c ? c->size : 1; }

void krt_comm_set_step(krt_comm *c, int64_t step) {
  if (c) c->step = step;
}

void krt_comm_get_stats(const krt_comm *c, krt_comm_stats *out) {
  if (c) *out = c->stats;
  else memset(out, 0, sizeof *out);
}

void krt_comm_close(krt_comm *c) {
  if (c) c->ops->close(c);
}

static int reducible(krt_dtype t) {
  return t == KRT_F32 || t == KRT_F64 || t == KRT_I32 || t == KRT_I64;
}

int krt_comm_all_reduce(krt_comm *c, void *buf, int64_t count, krt_dtype dtype, krt_reduce_op op,
                        char *err, size_t errlen) {
  if (!reducible(dtype) || count < 0 || (count && !buf))
    return krt_err(err, errlen, "all-reduce: %lld elements of dtype %d: f32, f64, i32 or i64 only",
                   (long long)count, (int)dtype);
  if (!c || c->size == 1 || !count) return 0;
  return c->ops->all_reduce(c, buf, count, dtype, op, err, errlen);
}

int krt_comm_broadcast(krt_comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen) {
  if (root < 0 || root >= krt_comm_size(c))
    return krt_err(err, errlen, "broadcast: root %d of %d ranks", root, krt_comm_size(c));
  if (!c || c->size == 1 || !bytes) return 0;
  return c->ops->broadcast(c, buf, bytes, root, err, errlen);
}

int krt_comm_barrier(krt_comm *c, char *err, size_t errlen) {
  if (!c || c->size == 1) return 0;
  return c->ops->barrier(c, err, errlen);
}

/* ---- one rank that still exchanges ---------------------------------------
 * KILN_EXCHANGE_ONE_RANK=1: a communicator of one rank whose step still goes
 * through the device's exchange (NCCL on a GPU, with one rank), where the
 * plain one-rank path copies: the GPU check's NCCL smoke test, without
 * mpirun.  On the host its exchange is the copy. */
static int local_start(krt_comm *c, krt_device *d, int bucket, int count, void *const *src,
                       void *const *dst, const int64_t *numel, krt_dtype dtype, char *err, size_t errlen) {
  (void)c, (void)bucket;
  size_t size = krt_dtype_size(dtype);
  for (int i = 0; i < count; i++)
    if (numel[i] && d->ops->copy(d, dst[i], src[i], (size_t)numel[i] * size, err, errlen)) return -1;
  return 0;
}
static int local_wait(krt_comm *c, krt_device *d, int bucket, char *err, size_t errlen) {
  (void)c, (void)d, (void)bucket, (void)err, (void)errlen;
  return 0;
}
static int local_bcast(krt_comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen) {
  (void)c, (void)buf, (void)bytes, (void)root, (void)err, (void)errlen;
  return 0;
}
static void local_close(krt_comm *c) { free(c); }
static void local_abort(krt_comm *c, const char *what) {
  fprintf(stderr, "kiln: step %lld: %s did not complete within %g s\n", (long long)c->step, what, c->timeout_s);
  exit(1);
}
static const krt_comm_ops local_ops = {.start = local_start, .wait = local_wait, .broadcast = local_bcast,
                                       .close = local_close, .abort = local_abort};

int krt_comm_open_local(double timeout_s, krt_comm **out, char *err, size_t errlen) {
  krt_comm *c = calloc(1, sizeof *c);
  if (!c) return krt_err(err, errlen, "out of memory");
  c->ops = &local_ops, c->size = 1, c->timeout_s = timeout_s, c->exchange_alone = 1;
  *out = c;
  return 0;
}

void krt_device_set_comm(krt_device *d, krt_comm *c) {
  if (d) d->comm = c;
}

int krt_all_reduce_start(krt_device *d, int bucket, int count, void *const *src, void *const *dst,
                         const int64_t *numel, krt_dtype dtype, char *err, size_t errlen) {
  if (!d || bucket < 0 || count < 1 || !src || !dst || !numel || (dtype != KRT_F32 && dtype != KRT_F64))
    return krt_err(err, errlen, "krt_all_reduce_start: bucket %d of %d tensors: bad arguments", bucket, count);
  if (!d->comm || (d->comm->size == 1 && !d->comm->exchange_alone)) { /* the sum over one rank */
    size_t size = krt_dtype_size(dtype);
    for (int i = 0; i < count; i++)
      if (numel[i] && d->ops->copy(d, dst[i], src[i], (size_t)numel[i] * size, err, errlen)) return -1;
    return 0;
  }
  if (d->ops->comm_start) return d->ops->comm_start(d, d->comm, bucket, count, src, dst, numel, dtype, err, errlen);
  return d->comm->ops->start(d->comm, d, bucket, count, src, dst, numel, dtype, err, errlen);
}

int krt_all_reduce_wait(krt_device *d, int bucket, char *err, size_t errlen) {
  if (!d || bucket < 0) return krt_err(err, errlen, "krt_all_reduce_wait: bucket %d: bad arguments", bucket);
  if (!d->comm || (d->comm->size == 1 && !d->comm->exchange_alone)) return 0;
  if (d->ops->comm_wait) return d->ops->comm_wait(d, d->comm, bucket, err, errlen);
  return d->comm->ops->wait(d->comm, d, bucket, err, errlen);
}
