/* comm_impl.h - what a communicator implementation (comm_mpi.c) shares
 * with comm.c.  Not installed: programs see only kilnrt.h.
 *
 * A communicator is a vtable plus its private state, like a device
 * (device_impl.h); comm.c handles the one-rank case (no communicator) and
 * the arguments, so that an implementation holds only the exchange. */
#ifndef KILN_COMM_IMPL_H
#define KILN_COMM_IMPL_H

#include "kilnrt.h"

typedef struct krt_comm_ops {
  /* the gradient exchange of a compiled step (krt_all_reduce_start/wait) */
  int (*start)(krt_comm *c, krt_device *d, int bucket, int count, void *const *src,
               void *const *dst, const int64_t *numel, krt_dtype dtype, char *err, size_t errlen);
  int (*wait)(krt_comm *c, krt_device *d, int bucket, char *err, size_t errlen);
  /* blocking, host memory */
  int (*all_reduce)(krt_comm *c, void *buf, int64_t count, krt_dtype dtype, krt_reduce_op op,
                    char *err, size_t errlen);
  int (*broadcast)(krt_comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen);
  int (*barrier)(krt_comm *c, char *err, size_t errlen);
  void (*close)(krt_comm *c);
  /* A collective outlived the timeout: say so (naming this rank, the
   * step and `what`) and end every rank; does not return. */
  void (*abort)(krt_comm *c, const char *what);
} krt_comm_ops;

struct krt_comm {
  const krt_comm_ops *ops;
  int rank, size, local_rank;
  int64_t step;          /* for messages */
  double timeout_s;
  krt_comm_stats stats;
  int exchange_alone;    /* one rank that still exchanges (krt_comm_open_local) */
  void *priv;
};

/* KILN_EXCHANGE_ONE_RANK=1's communicator (comm.c): one rank whose
 * compiled step still calls the device's exchange. */
int krt_comm_open_local(double timeout_s, krt_comm **out, char *err, size_t errlen);

#endif
