/* comm_mpi.c - libkilnrt_mpi: the communicator of a data-parallel run over
 * MPI (mpirun -np N; OpenMPI from Debian), and krt_exe_main_mpi, the main
 * of a program compiled with --data-parallel.
 *
 * One thread of the communicator's own makes every MPI call after
 * MPI_Init: the compute side queues a job (a bucket's exchange, a blocking
 * all-reduce, a broadcast, a barrier) and, when it needs the result, waits
 * for it with a deadline.  A bucket's exchange is non-blocking MPI
 * (MPI_Iallreduce per tensor, then MPI_Waitall) progressed by that thread,
 * so it overlaps the backward pass: MPI libraries progress a non-blocking
 * collective only inside MPI calls, which the compute thread, busy with
 * kernels, does not make.  A job not done by the deadline (--timeout: a
 * rank died or stalled) ends every rank through MPI_Abort, after a message
 * naming this rank, the step and the job; a rank that dies outright is
 * named by mpirun, which ends the others. */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../comm_impl.h"
#include "../device_impl.h"
#include "kilnrt_mpi.h"

enum { JOB_BUCKET, JOB_ALL_REDUCE, JOB_BROADCAST, JOB_BARRIER };
enum { MAX_BUCKETS = 4096 };

typedef struct job {
  int kind, bucket, count, root;
  void **src, **dst;       /* JOB_BUCKET: count tensors; else buf in dst[0] */
  int64_t *numel;
  krt_dtype dtype;
  krt_reduce_op op;
  size_t bytes;
  double queued_ms, done_ms;
  int done, rc;
  char msg[300];
  struct job *next;
} job;

typedef struct {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  job *head, *tail;        /* queued, not yet taken */
  job *bucket[MAX_BUCKETS]; /* a started bucket's job until it is waited for */
  int stop, thread_started;
} mpi_state;

static double now_ms(void) { return krt_now_ms(); }

static MPI_Datatype mpi_type(krt_dtype t) {
  switch (t) {
  case KRT_F32: return MPI_FLOAT;
  case KRT_F64: return MPI_DOUBLE;
  case KRT_I32: return MPI_INT32_T;
  default: return MPI_INT64_T;
  }
}

/* "MPI_Iallreduce: <MPI's message>" into j->msg; -1 */
static int mpi_fail(job *j, const char *call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", code);
  snprintf(j->msg, sizeof j->msg, "%s: %s", call, text);
  return -1;
}

/* MPI counts are ints: a tensor of more elements goes in pieces */
enum { MPI_PIECE = 1 << 30 };

static int run_bucket(job *j) {
  int npieces = 0;
  for (int i = 0; i < j->count; i++) npieces += (int)((j->numel[i] + MPI_PIECE - 1) / MPI_PIECE);
  MPI_Request *req = calloc((size_t)npieces + 1, sizeof *req);
  if (!req) return snprintf(j->msg, sizeof j->msg, "out of memory"), -1;
  size_t size = krt_dtype_size(j->dtype);
  int r = 0, rc = 0;
  for (int i = 0; i < j->count && !rc; i++)
    for (int64_t at = 0; at < j->numel[i] && !rc; at += MPI_PIECE) {
      int n = (int)(j->numel[i] - at < MPI_PIECE ? j->numel[i] - at : MPI_PIECE);
      int code = MPI_Iallreduce((char *)j->src[i] + at * size, (char *)j->dst[i] + at * size, n,
                                mpi_type(j->dtype), MPI_SUM, MPI_COMM_WORLD, &req[r]);
      if (code != MPI_SUCCESS) rc = mpi_fail(j, "MPI_Iallreduce", code);
      else r++;
    }
  int code = MPI_Waitall(r, req, MPI_STATUSES_IGNORE);
  if (!rc && code != MPI_SUCCESS) rc = mpi_fail(j, "MPI_Waitall", code);
  free(req);
  return rc;
}

static int run_job(job *j) {
  int code;
  switch (j->kind) {
  case JOB_BUCKET: return run_bucket(j);
  case JOB_ALL_REDUCE:
    code = MPI_Allreduce(MPI_IN_PLACE, j->dst[0], (int)j->bytes, mpi_type(j->dtype),
                         j->op == KRT_REDUCE_MAX ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD);
    return code == MPI_SUCCESS ? 0 : mpi_fail(j, "MPI_Allreduce", code);
  case JOB_BROADCAST:
    for (size_t at = 0; at < j->bytes; at += MPI_PIECE) {
      int n = (int)(j->bytes - at < MPI_PIECE ? j->bytes - at : MPI_PIECE);
      code = MPI_Bcast((char *)j->dst[0] + at, n, MPI_BYTE, j->root, MPI_COMM_WORLD);
      if (code != MPI_SUCCESS) return mpi_fail(j, "MPI_Bcast", code);
    }
    return 0;
  default:
    code = MPI_Barrier(MPI_COMM_WORLD);
    return code == MPI_SUCCESS ? 0 : mpi_fail(j, "MPI_Barrier", code);
  }
}

static void *comm_thread(void *arg) {
  mpi_state *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->changed, &s->lock);
    if (!s->head) break;
    job *j = s->head;
    s->head = j->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->lock);
    int rc = run_job(j);
    pthread_mutex_lock(&s->lock);
    j->rc = rc, j->done = 1, j->done_ms = now_ms();
    pthread_cond_broadcast(&s->changed);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static const char *job_name(const job *j, char *buf, size_t len) {
  static const char *const names[] = {"the exchange of gradient bucket", "an all-reduce", "a broadcast",
                                      "a barrier"};
  if (j->kind == JOB_BUCKET) snprintf(buf, len, "%s %d", names[0], j->bucket);
  else snprintf(buf, len, "%s", names[j->kind]);
  return buf;
}

static void enqueue(mpi_state *s, job *j) {
  j->queued_ms = now_ms();
  pthread_mutex_lock(&s->lock);
  if (s->tail) s->tail->next = j;
  else s->head = j;
  s->tail = j;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
}

static void mpi_abort(krt_comm *c, const char *what) {
  fprintf(stderr, "kiln: rank %d of %d: step %lld: %s did not complete within %g s: a rank was "
                  "lost or stalled; ending every rank (--timeout)\n",
          c->rank, c->size, (long long)c->step, what, c->timeout_s);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}

/* Wait for j until the deadline; past it, every rank ends. */
static int finish(krt_comm *c, job *j, char *err, size_t errlen) {
  mpi_state *s = c->priv;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  double secs = c->timeout_s;
  until.tv_sec += (time_t)secs;
  until.tv_nsec += (long)((secs - (double)(time_t)secs) * 1e9);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&s->lock);
  int timed_out = 0;
  while (!j->done && !timed_out) timed_out = pthread_cond_timedwait(&s->changed, &s->lock, &until) == ETIMEDOUT;
  pthread_mutex_unlock(&s->lock);
  char what[64];
  if (!j->done) mpi_abort(c, job_name(j, what, sizeof what));
  if (j->rc)
    return krt_err(err, errlen, "rank %d of %d: step %lld: %s: %s", c->rank, c->size, (long long)c->step,
                   job_name(j, what, sizeof what), j->msg);
  return 0;
}

static int blocking(krt_comm *c, job *j, char *err, size_t errlen) {
  enqueue(c->priv, j);
  return finish(c, j, err, errlen);
}

static int mpi_all_reduce(krt_comm *c, void *buf, int64_t count, krt_dtype dtype, krt_reduce_op op,
                          char *err, size_t errlen) {
  if (count > MPI_PIECE) return krt_err(err, errlen, "all-reduce of %lld elements: at most 2^30", (long long)count);
  void *dst[1] = {buf};
  job j = {.kind = JOB_ALL_REDUCE, .dst = dst, .bytes = (size_t)count, .dtype = dtype, .op = op};
  return blocking(c, &j, err, errlen);
}

static int mpi_broadcast(krt_comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen) {
  void *dst[1] = {buf};
  job j = {.kind = JOB_BROADCAST, .dst = dst, .bytes = bytes, .root = root};
  return blocking(c, &j, err, errlen);
}

static int mpi_barrier(krt_comm *c, char *err, size_t errlen) {
  job j = {.kind = JOB_BARRIER};
  return blocking(c, &j, err, errlen);
}

static void free_job(job *j) {
  if (!j) return;
  free(j->src);
  free(j->dst);
  free(j->numel);
  free(j);
}

static int mpi_start(krt_comm *c, krt_device *d, int bucket, int count, void *const *src,
                     void *const *dst, const int64_t *numel, krt_dtype dtype, char *err, size_t errlen) {
  mpi_state *s = c->priv;
  (void)d; /* host memory: the cuda device exchanges through NCCL (device_cuda.c) */
  if (bucket >= MAX_BUCKETS) return krt_err(err, errlen, "gradient bucket %d: at most %d", bucket, MAX_BUCKETS);
  if (s->bucket[bucket])
    return krt_err(err, errlen, "rank %d: step %lld: gradient bucket %d started twice", c->rank,
                   (long long)c->step, bucket);
  job *j = calloc(1, sizeof *j);
  if (j) {
    j->src = calloc((size_t)count, sizeof *j->src);
    j->dst = calloc((size_t)count, sizeof *j->dst);
    j->numel = calloc((size_t)count, sizeof *j->numel);
  }
  if (!j || !j->src || !j->dst || !j->numel) {
    free_job(j);
    return krt_err(err, errlen, "out of memory");
  }
  j->kind = JOB_BUCKET, j->bucket = bucket, j->count = count, j->dtype = dtype;
  memcpy(j->src, src, (size_t)count * sizeof *src);
  memcpy(j->dst, dst, (size_t)count * sizeof *dst);
  memcpy(j->numel, numel, (size_t)count * sizeof *numel);
  s->bucket[bucket] = j;
  enqueue(s, j);
  return 0;
}

static int mpi_wait(krt_comm *c, krt_device *d, int bucket, char *err, size_t errlen) {
  (void)d;
  mpi_state *s = c->priv;
  if (bucket >= MAX_BUCKETS) return krt_err(err, errlen, "gradient bucket %d: at most %d", bucket, MAX_BUCKETS);
  job *j = s->bucket[bucket];
  if (!j) return 0; /* waited for already */
  double t0 = now_ms();
  int rc = finish(c, j, err, errlen);
  double t1 = now_ms();
  c->stats.exposed_ms += t1 - t0;
  c->stats.busy_ms += j->done_ms - j->queued_ms;
  c->stats.buckets++;
  s->bucket[bucket] = NULL;
  free_job(j);
  return rc;
}

static void mpi_close(krt_comm *c) {
  mpi_state *s = c->priv;
  if (s) {
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    if (s->thread_started) pthread_join(s->thread, NULL);
    for (int b = 0; b < MAX_BUCKETS; b++) free_job(s->bucket[b]);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->changed);
    free(s);
  }
  free(c);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

static const krt_comm_ops mpi_ops = {mpi_start, mpi_wait, mpi_all_reduce, mpi_broadcast, mpi_barrier,
                                     mpi_close, mpi_abort};

/* Started by an MPI launcher?  Without one there is one rank, and MPI is
 * not initialised at all (a singleton MPI_Init is slow and may want a
 * daemon). */
static int launched_by_mpi(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE",
                                     "SLURM_NTASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

static int local_rank(int rank) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                                     "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return rank;
}

int krt_comm_mpi_open(int *argc, char ***argv, double timeout_s, krt_comm **out, char *err,
                      size_t errlen) {
  *out = NULL;
  if (!launched_by_mpi()) {
    const char *one = getenv("KILN_EXCHANGE_ONE_RANK");
    return one && *one && strcmp(one, "0") ? krt_comm_open_local(timeout_s, out, err, errlen) : 0;
  }
  int provided = 0, code = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (code != MPI_SUCCESS) return krt_err(err, errlen, "MPI_Init_thread failed (error %d)", code);
  /* errors come back as codes, to be reported with the rank and step */
  int rank = 0, size = 0;
  if ((code = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
      (code = MPI_Comm_rank(MPI_COMM_WORLD, &rank)) != MPI_SUCCESS ||
      (code = MPI_Comm_size(MPI_COMM_WORLD, &size)) != MPI_SUCCESS) {
    MPI_Finalize();
    return krt_err(err, errlen, "MPI_COMM_WORLD's error handler, rank or size: MPI error %d", code);
  }
  krt_comm *c = calloc(1, sizeof *c);
  mpi_state *s = c ? calloc(1, sizeof *s) : NULL;
  if (!c || !s) {
    free(c);
    MPI_Finalize();
    return krt_err(err, errlen, "out of memory");
  }
  c->ops = &mpi_ops, c->priv = s, c->timeout_s = timeout_s;
  c->rank = rank, c->size = size;
  c->local_rank = local_rank(c->rank);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->changed, NULL);
  if (provided < MPI_THREAD_MULTIPLE) {
    /* the compute thread never calls MPI after this, but MPI_Abort on a
     * timeout may come from it while the communicator's thread waits */
    krt_err(err, errlen, "rank %d: MPI gives thread level %d; the gradient exchange needs "
            "MPI_THREAD_MULTIPLE (%d)", c->rank, provided, MPI_THREAD_MULTIPLE);
    mpi_close(c);
    return -1;
  }
  if (pthread_create(&s->thread, NULL, comm_thread, s)) {
    krt_err(err, errlen, "rank %d: cannot start the communicator's thread", c->rank);
    mpi_close(c);
    return -1;
  }
  s->thread_started = 1;
  *out = c;
  return 0;
}

int krt_exe_main_mpi(const krt_model_api *api, int argc, char **argv) {
  if (api->train) return krt_train_main_with(api, argc, argv, krt_comm_mpi_open);
  return krt_exe_main(api, argc, argv);
}
