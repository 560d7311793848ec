/* data_loader.c - the training input pipeline: batches of (x, y) samples
 * from two memory-mapped .npy files, shuffled per epoch, assembled by
 * worker threads ahead of the caller (kilnrt.h, krt_loader_*).
 *
 * Tickets.  Batches are numbered from the last seek (or the open): ticket t
 * is the batch at position start + t, epochs crossed every
 * batches_per_epoch batches.  There are nslots = threads + 1 buffers (at
 * least 2) and ticket t always goes to slot t % nslots.  The caller holds
 * the slot of the ticket it was handed last; the workers claim the next
 * tickets in order as long as their slot is free.  So handing out batch i
 * frees batch i - 1's slot, and a worker starts on the batch that goes
 * there at once: the workers stay nslots - 1 batches ahead.  What a batch
 * holds depends on its position alone, never on which worker filled it or
 * when, so any thread count gives the same batches.
 *
 * Orders.  Epoch e visits the rows in a permutation made from (seed, e)
 * alone: xoshiro256** seeded by four splitmix64 outputs from
 * seed ^ mix(e) (mix: splitmix64's output function), then Fisher-Yates,
 * for i = N-1 down to 1, swapping i with an unbiased draw from [0, i].  The
 * first worker that needs an epoch's order computes it; orders are kept in
 * a cache of threads + 1 entries (a busy worker pins one, so one is always
 * free to reuse), typically two: the epoch ending and the one starting.
 *
 * Locking.  One mutex guards the tickets, the slots' states and the cache.
 * A worker fills its slot's buffers, and computes an order, without it;
 * the state change to ready (or failed) under the mutex publishes them. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "io_util.h"

#define DEFAULT_THREADS 2
#define MAX_THREADS 64
#define BUFFER_ALIGN 64

/* ---- one mapped .npy file ---------------------------------------------- */
typedef struct {
  char *path;                       /* copied from the config */
  krt_dtype file_dtype, dtype;      /* in the file, and as batches hold it */
  int rank;                         /* of one sample */
  int64_t dims[KRT_MAX_RANK];
  int64_t n;                        /* samples: the first dim */
  int64_t numel;                    /* elements per sample */
  size_t in_bytes, out_bytes;       /* one sample in the file, in a batch */
  void *map;
  size_t map_len;
  const unsigned char *data;        /* row r at data + r * in_bytes */
} loader_file;

typedef enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_FAILED } slot_state;

typedef struct {
  int64_t ticket;                   /* -1: none yet */
  slot_state state;
  int count;                        /* samples filled */
  void *x, *y;                      /* batch * out_bytes each, aligned */
  char err[512];                    /* when SLOT_FAILED */
} slot;

typedef struct {
  int64_t epoch;                    /* -1: unused */
  uint32_t *order;                  /* N row indices; N <= KRT_MAX_NUMEL */
  int users;                        /* workers filling a batch with it */
  bool ready;                       /* false while its first user computes it */
} epoch_order;

struct krt_loader {
  loader_file x, y;
  int64_t n, batch, batches_per_epoch;
  int64_t global, offset;           /* a global batch's samples; this rank's first */
  uint64_t seed;
  bool shuffle;
  int nthreads, nslots, norders;
  pthread_t *threads;
  slot *slots;
  epoch_order *orders;

  pthread_mutex_t lock;
  pthread_cond_t work;              /* to workers: a ticket may be claimable */
  pthread_cond_t done;              /* from workers: a slot or order is ready,
                                       or a worker went idle */
  int64_t start_epoch, start_batch; /* ticket 0's position */
  int64_t handed;                   /* tickets handed to the caller */
  int64_t released;                 /* tickets below gave their slot back */
  int64_t claimed;                  /* tickets claimed by workers */
  int busy;                         /* workers filling a slot */
  bool seeking, stopping;
};

/* ---- the permutation ----------------------------------------------------- */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t *state) {
  return mix64(*state += 0x9e3779b97f4a7c15u);
}

static uint64_t rotl(uint64_t v, int k) { return (v << k) | (v >> (64 - k)); }

static uint64_t xoshiro256ss(uint64_t s[4]) {
  uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

/* Uniform in [0, bound): draws below 2^64 mod bound are rejected, so every
 * residue is equally likely. */
static uint64_t draw_below(uint64_t s[4], uint64_t bound) {
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = xoshiro256ss(s);
    if (r >= threshold) return r % bound;
  }
}

static void make_order(uint32_t *order, int64_t n, uint64_t seed, int64_t epoch) {
  uint64_t sm = seed ^ mix64((uint64_t)epoch), s[4];
  for (int i = 0; i < 4; i++) s[i] = splitmix64(&sm);
  for (int64_t i = 0; i < n; i++) order[i] = (uint32_t)i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)draw_below(s, (uint64_t)i + 1);
    uint32_t tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
}

/* Epoch `epoch`'s order, pinned for the caller (users + 1); under the lock,
 * which it drops while computing.  NULL when out of memory. */
static epoch_order *order_acquire(krt_loader *l, int64_t epoch) {
  epoch_order *victim = NULL;
  for (int i = 0; i < l->norders; i++) {
    epoch_order *o = &l->orders[i];
    if (o->epoch == epoch) {
      o->users++;
      while (!o->ready) pthread_cond_wait(&l->done, &l->lock);
      return o;
    }
    /* Reuse an unpinned buffer, the oldest epoch first; else an empty
     * entry.  Pinned entries are at most nthreads - 1 here: one is free. */
    if (o->users == 0 &&
        (!victim || (o->order && (!victim->order || o->epoch < victim->epoch))))
      victim = o;
  }
  if (!victim->order) {
    victim->order = malloc((size_t)l->n * sizeof *victim->order);
    if (!victim->order) return NULL;
  }
  victim->epoch = epoch;
  victim->users = 1;
  victim->ready = false;
  pthread_mutex_unlock(&l->lock);
  make_order(victim->order, l->n, l->seed, epoch);
  pthread_mutex_lock(&l->lock);
  victim->ready = true;
  pthread_cond_broadcast(&l->done);
  return victim;
}

/* ---- dtype conversion ---------------------------------------------------- */
static bool is_float(krt_dtype t) {
  return t == KRT_F16 || t == KRT_BF16 || t == KRT_F32 || t == KRT_F64;
}

static bool is_integer(krt_dtype t) {
  switch (t) {
  case KRT_I8: case KRT_I16: case KRT_I32: case KRT_I64:
  case KRT_U8: case KRT_U16: case KRT_U32: case KRT_U64: case KRT_BOOL:
    return true;
  default:
    return false;
  }
}

/* A double holds every value of these exactly: they convert through one. */
static bool exact_in_double(krt_dtype t) {
  return is_float(t) || (is_integer(t) && t != KRT_I64 && t != KRT_U64);
}

static bool conversion_supported(krt_dtype from, krt_dtype to) {
  if (from == to) return true;
  if (to == KRT_I32 || to == KRT_I64) return is_float(from) || is_integer(from);
  if (is_float(to)) return exact_in_double(from);
  return false;
}

/* Rows convert in chunks through doubles: one switch per chunk, and loops
 * the compiler can vectorize. */
#define CHUNK 1024

#define LOAD_LOOP(type, expr)                                                   \
  for (int64_t i = 0; i < n; i++) {                                             \
    type v;                                                                     \
    memcpy(&v, p + i * (int64_t)sizeof v, sizeof v);                            \
    out[i] = (expr);                                                            \
  }                                                                             \
  break

/* n elements from p in the file's dtype as doubles (exact_in_double). */
static void load_doubles(krt_dtype t, const unsigned char *p, int64_t n, double *out) {
  switch (t) {
  case KRT_F16: LOAD_LOOP(uint16_t, krt_f16_to_f32(v));
  case KRT_F32: LOAD_LOOP(float, v);
  case KRT_F64: LOAD_LOOP(double, v);
  case KRT_I8: LOAD_LOOP(int8_t, v);
  case KRT_U8: LOAD_LOOP(uint8_t, v);
  case KRT_BOOL: LOAD_LOOP(uint8_t, v != 0);
  case KRT_I16: LOAD_LOOP(int16_t, v);
  case KRT_U16: LOAD_LOOP(uint16_t, v);
  case KRT_I32: LOAD_LOOP(int32_t, v);
  case KRT_U32: LOAD_LOOP(uint32_t, v);
  default: break; /* not reached: the open checks the pair */
  }
}

/* d rounded to float with round-to-odd (an inexact result gets an odd last
 * bit).  Rounding that float to f16 or bf16 then gives d correctly rounded:
 * the usual (float)d would round twice. */
static float f64_to_f32_odd(double d) {
  float f = (float)d;
  if ((double)f == d || isnan(d) || isinf(f)) return f;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if (bits & 1) return f;
  return nextafterf(f, d > f ? INFINITY : -INFINITY);
}

#define STORE_LOOP(type, expr)                                                  \
  for (int64_t i = 0; i < n; i++) {                                             \
    type v = (expr);                                                            \
    memcpy(p + i * (int64_t)sizeof v, &v, sizeof v);                            \
  }                                                                             \
  break

static void store_floats(krt_dtype t, unsigned char *p, int64_t n, const double *in) {
  switch (t) {
  case KRT_F16: STORE_LOOP(uint16_t, krt_f32_to_f16(f64_to_f32_odd(in[i])));
  case KRT_BF16: STORE_LOOP(uint16_t, krt_f32_to_bf16(f64_to_f32_odd(in[i])));
  case KRT_F32: STORE_LOOP(float, (float)in[i]);
  default: STORE_LOOP(double, in[i]);
  }
}

static int fail_row(const loader_file *f, int64_t row, int64_t i, char *err,
                    size_t errlen, const char *what) {
  if (f->numel == 1)
    return krt_fail(err, errlen, f->path, "row %lld: %s", (long long)row, what);
  return krt_fail(err, errlen, f->path, "row %lld, element %lld: %s",
                  (long long)row, (long long)i, what);
}

/* Doubles to i32 or i64, each checked to be an integer in range; element
 * `base` + i of `row` in messages. */
static int store_checked_ints(const loader_file *f, int64_t row, int64_t base,
                              const double *in, int64_t n, unsigned char *p,
                              char *err, size_t errlen) {
  bool to32 = f->dtype == KRT_I32;
  double lo = to32 ? -2147483648.0 : -9223372036854775808.0;
  double hi = to32 ? 2147483648.0 : 9223372036854775808.0;
  char what[160];
  for (int64_t i = 0; i < n; i++) {
    double d = in[i];
    if (d != floor(d) || isinf(d)) {   /* NaN too */
      snprintf(what, sizeof what, "%.17g is not an integer (converting %s to %s)",
               d, krt_dtype_name(f->file_dtype), krt_dtype_name(f->dtype));
      return fail_row(f, row, base + i, err, errlen, what);
    }
    if (d < lo || d >= hi) {
      snprintf(what, sizeof what, "%.17g is out of range for %s", d,
               krt_dtype_name(f->dtype));
      return fail_row(f, row, base + i, err, errlen, what);
    }
    if (to32) {
      int32_t v = (int32_t)d;
      memcpy(p + 4 * i, &v, 4);
    } else {
      int64_t v = (int64_t)d;
      memcpy(p + 8 * i, &v, 8);
    }
  }
  return 0;
}

/* i64 or u64 to i32 or i64, checked. */
static int convert_wide_ints(const loader_file *f, int64_t row, const unsigned char *src,
                             unsigned char *dst, char *err, size_t errlen) {
  char what[160];
  for (int64_t i = 0; i < f->numel; i++) {
    uint64_t u;
    memcpy(&u, src + 8 * i, 8);
    bool neg = f->file_dtype == KRT_I64 && (int64_t)u < 0;
    bool fits = f->dtype == KRT_I64 ? neg || u <= (uint64_t)INT64_MAX
                : neg ? (int64_t)u >= INT32_MIN : u <= (uint64_t)INT32_MAX;
    if (!fits) {
      if (neg) snprintf(what, sizeof what, "%lld is out of range for %s",
                        (long long)(int64_t)u, krt_dtype_name(f->dtype));
      else snprintf(what, sizeof what, "%llu is out of range for %s",
                    (unsigned long long)u, krt_dtype_name(f->dtype));
      return fail_row(f, row, i, err, errlen, what);
    }
    if (f->dtype == KRT_I32) {
      int32_t v = (int32_t)(int64_t)u;
      memcpy(dst + 4 * i, &v, 4);
    } else {
      memcpy(dst + 8 * i, &u, 8);
    }
  }
  return 0;
}

/* Sample `row` of f into dst in f->dtype. */
static int convert_row(const loader_file *f, int64_t row, unsigned char *dst,
                       char *err, size_t errlen) {
  const unsigned char *src = f->data + (size_t)row * f->in_bytes;
  krt_dtype from = f->file_dtype, to = f->dtype;
  if (from == to && from != KRT_BOOL) {
    memcpy(dst, src, f->in_bytes);
    return 0;
  }
  if (from == KRT_BOOL && to == KRT_BOOL) {   /* any nonzero byte is true */
    for (int64_t i = 0; i < f->numel; i++) dst[i] = src[i] != 0;
    return 0;
  }
  if (!exact_in_double(from)) return convert_wide_ints(f, row, src, dst, err, errlen);
  bool to_int = to == KRT_I32 || to == KRT_I64;
  size_t in_size = krt_dtype_size(from), out_size = krt_dtype_size(to);
  double buf[CHUNK];
  for (int64_t base = 0; base < f->numel; base += CHUNK) {
    int64_t n = f->numel - base < CHUNK ? f->numel - base : CHUNK;
    load_doubles(from, src + base * (int64_t)in_size, n, buf);
    unsigned char *out = dst + base * (int64_t)out_size;
    if (!to_int)
      store_floats(to, out, n, buf);
    else if (store_checked_ints(f, row, base, buf, n, out, err, errlen))
      return -1;
  }
  return 0;
}

/* ---- the workers --------------------------------------------------------- */
static void position_of(const krt_loader *l, int64_t ticket, int64_t *epoch,
                        int64_t *index) {
  int64_t b = l->start_batch + ticket;
  *epoch = l->start_epoch + b / l->batches_per_epoch;
  *index = b % l->batches_per_epoch;
}

/* Batch `index` of an epoch into s: rows order[k] (file order without one)
 * for k in the batch's range; the tail of a short batch is zeroed. */
static int fill_slot(const krt_loader *l, slot *s, int64_t index,
                     const uint32_t *order) {
  int64_t first = index * l->global + l->offset;
  int64_t count = l->n - first < l->batch ? l->n - first : l->batch;
  unsigned char *x = s->x, *y = s->y;
  for (int64_t k = 0; k < count; k++) {
    int64_t row = order ? order[first + k] : first + k;
    if (convert_row(&l->x, row, x + k * l->x.out_bytes, s->err, sizeof s->err) ||
        convert_row(&l->y, row, y + k * l->y.out_bytes, s->err, sizeof s->err))
      return -1;
  }
  size_t short_by = (size_t)(l->batch - count);
  memset(x + count * l->x.out_bytes, 0, short_by * l->x.out_bytes);
  memset(y + count * l->y.out_bytes, 0, short_by * l->y.out_bytes);
  s->count = (int)count;
  return 0;
}

static bool claimable(const krt_loader *l) {
  return !l->seeking && l->claimed < l->released + l->nslots;
}

static void *worker_main(void *arg) {
  krt_loader *l = arg;
  pthread_mutex_lock(&l->lock);
  for (;;) {
    while (!l->stopping && !claimable(l)) pthread_cond_wait(&l->work, &l->lock);
    if (l->stopping) break;
    int64_t ticket = l->claimed++, epoch, index;
    slot *s = &l->slots[ticket % l->nslots];
    s->ticket = ticket;
    s->state = SLOT_FILLING;
    l->busy++;
    position_of(l, ticket, &epoch, &index);
    epoch_order *o = l->shuffle ? order_acquire(l, epoch) : NULL;
    int rc;
    if (l->shuffle && !o) {
      rc = krt_fail(s->err, sizeof s->err, l->x.path,
                    "out of memory for epoch %lld's order of %lld samples",
                    (long long)epoch, (long long)l->n);
    } else {
      pthread_mutex_unlock(&l->lock);
      rc = fill_slot(l, s, index, o ? o->order : NULL);
      pthread_mutex_lock(&l->lock);
    }
    if (o) o->users--;
    s->state = rc ? SLOT_FAILED : SLOT_READY;
    l->busy--;
    pthread_cond_broadcast(&l->done);
  }
  pthread_mutex_unlock(&l->lock);
  return NULL;
}

/* ---- opening ------------------------------------------------------------- */
static const char *conversion_help =
    "floats convert to f16/bf16/f32/f64, integers and bool to i32/i64 "
    "(checked), those of up to 32 bits to floats too, and floats holding "
    "integers to i32/i64";

/* f's samples from the header h: N, the sample shape and sizes, checked
 * against the file's size and the dtype asked for. */
static int read_samples(loader_file *f, const krt_npy_header *h, int64_t size,
                        krt_dtype dtype, char *err, size_t errlen) {
  if (h->rank == 0)
    return krt_fail(err, errlen, f->path, "holds a scalar, not an array of samples");
  f->n = h->dims[0];
  f->file_dtype = h->dtype;
  f->dtype = dtype;
  f->rank = h->rank - 1;
  memcpy(f->dims, h->dims + 1, (size_t)f->rank * sizeof f->dims[0]);
  krt_tensor sample = {.dtype = h->dtype, .rank = f->rank};
  memcpy(sample.dims, f->dims, sizeof sample.dims);
  f->numel = krt_tensor_numel(&sample);
  if (f->n == 0)
    return krt_fail(err, errlen, f->path, "has no samples (its first dim is 0)");
  if (f->numel == 0)
    return krt_fail(err, errlen, f->path, "has empty samples (a dim is 0)");
  if (f->numel < 0)
    return krt_fail(err, errlen, f->path, "a sample has more than %lld elements",
                    (long long)KRT_MAX_NUMEL);
  f->in_bytes = (size_t)f->numel * krt_dtype_size(h->dtype);
  f->out_bytes = (size_t)f->numel * krt_dtype_size(dtype);
  /* N < 2^31 and a sample < 2^34 bytes: the product may pass 2^63. */
  if ((uint64_t)f->n > (uint64_t)INT64_MAX / f->in_bytes)
    return krt_fail(err, errlen, f->path, "%lld samples of %zu bytes overflow",
                    (long long)f->n, f->in_bytes);
  if (krt_npy_check_data_size(h, size, f->n * (int64_t)f->in_bytes, f->path, err,
                              errlen))
    return -1;
  if (!conversion_supported(h->dtype, dtype))
    return krt_fail(err, errlen, f->path, "cannot convert the file's %s to %s (%s)",
                    krt_dtype_name(h->dtype), krt_dtype_name(dtype), conversion_help);
  return 0;
}

/* Opens `path`, checks it holds samples that convert to `dtype`, and maps
 * it (read-only; the file must not shrink while the loader is open). */
static int map_file(loader_file *f, const char *path, krt_dtype dtype, bool shuffle,
                    char *err, size_t errlen) {
  f->path = strdup(path);
  if (!f->path) return krt_fail(err, errlen, path, "out of memory");
  int64_t size;
  FILE *fp = krt_open_read(path, &size, err, errlen);
  if (!fp) return -1;
  krt_npy_header h;
  int rc = krt_npy_read_header(fp, size, path, &h, err, errlen);
  if (rc == 0) rc = read_samples(f, &h, size, dtype, err, errlen);
  if (rc == 0) {
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fileno(fp), 0);
    if (map == MAP_FAILED) {
      rc = krt_fail(err, errlen, path, "mmap of %lld bytes failed", (long long)size);
    } else {
      f->map = map;
      f->map_len = (size_t)size;
      f->data = (const unsigned char *)map + h.data_offset;
      /* A shuffled epoch reads rows anywhere: read-ahead would be waste. */
      posix_madvise(map, f->map_len, shuffle ? POSIX_MADV_RANDOM : POSIX_MADV_SEQUENTIAL);
    }
  }
  fclose(fp);  /* the mapping stays */
  return rc;
}

static int check_config(const krt_loader_config *c, char *err, size_t errlen) {
  const char *who = "krt_loader_open";
  if (!c || !c->x_path || !c->y_path)
    return krt_fail(err, errlen, who, "no config, or no x_path or y_path");
  if (c->ranks < 0 || c->rank < 0 || (c->ranks > 1 && (c->rank >= c->ranks || !c->drop_last)))
    return krt_fail(err, errlen, c->x_path, "rank %d of %d ranks: a data-parallel loader takes "
                    "0 <= rank < ranks, and drops an epoch's last partial batch", c->rank, c->ranks);
  if (c->batch < 1)
    return krt_fail(err, errlen, who, "batch must be at least 1, not %d", c->batch);
  if (c->threads < 0 || c->threads > MAX_THREADS)
    return krt_fail(err, errlen, who, "threads must be 0 (the default, %d) to %d, not %d",
                    DEFAULT_THREADS, MAX_THREADS, c->threads);
  if (krt_dtype_size(c->x_dtype) == 0 || krt_dtype_size(c->y_dtype) == 0)
    return krt_fail(err, errlen, who, "invalid x_dtype or y_dtype");
  return 0;
}

/* Buffers for every slot.  Plain aligned host memory for now; for the GPU
 * these are to become pinned (cuMemHostAlloc) so uploads run as DMA. */
static int alloc_slots(krt_loader *l, char *err, size_t errlen) {
  l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
  if (!l->slots) return krt_fail(err, errlen, l->x.path, "out of memory");
  for (int i = 0; i < l->nslots; i++) {
    slot *s = &l->slots[i];
    s->ticket = -1;
    const loader_file *files[2] = {&l->x, &l->y};
    void **bufs[2] = {&s->x, &s->y};
    for (int k = 0; k < 2; k++) {
      size_t per = files[k]->out_bytes;
      if ((size_t)l->batch > (SIZE_MAX - BUFFER_ALIGN) / per)
        return krt_fail(err, errlen, files[k]->path, "a batch of %lld samples of "
                        "%zu bytes is too large", (long long)l->batch, per);
      size_t bytes = (l->batch * per + BUFFER_ALIGN - 1) / BUFFER_ALIGN * BUFFER_ALIGN;
      if (posix_memalign(bufs[k], BUFFER_ALIGN, bytes) != 0) {
        *bufs[k] = NULL;
        return krt_fail(err, errlen, files[k]->path, "out of memory for a batch "
                        "buffer of %zu bytes", bytes);
      }
    }
  }
  return 0;
}

static int start_workers(krt_loader *l, char *err, size_t errlen) {
  l->threads = calloc((size_t)l->nthreads, sizeof *l->threads);
  if (!l->threads) return krt_fail(err, errlen, l->x.path, "out of memory");
  for (int i = 0; i < l->nthreads; i++)
    if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0) {
      l->nthreads = i;  /* close joins those that started */
      return krt_fail(err, errlen, l->x.path, "cannot start worker thread %d", i);
    }
  return 0;
}

int krt_loader_open(const krt_loader_config *cfg, krt_loader **out, char *err,
                    size_t errlen) {
  if (!out) return krt_fail(err, errlen, "krt_loader_open", "no output pointer");
  *out = NULL;
  if (check_config(cfg, err, errlen)) return -1;
  krt_loader *l = calloc(1, sizeof *l);
  if (!l) return krt_fail(err, errlen, cfg->x_path, "out of memory");
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->work, NULL);
  pthread_cond_init(&l->done, NULL);
  l->batch = cfg->batch;
  l->seed = cfg->seed;
  l->shuffle = cfg->shuffle != 0;
  l->nthreads = cfg->threads ? cfg->threads : DEFAULT_THREADS;
  l->nslots = l->nthreads + 1;
  l->norders = l->nthreads + 1;
  int threads = l->nthreads;
  l->nthreads = 0;  /* none to join until start_workers */
  if (map_file(&l->x, cfg->x_path, cfg->x_dtype, l->shuffle, err, errlen) ||
      map_file(&l->y, cfg->y_path, cfg->y_dtype, l->shuffle, err, errlen))
    goto fail;
  l->n = l->x.n;
  if (l->x.n != l->y.n) {
    krt_fail(err, errlen, l->x.path, "has %lld samples but %s has %lld: the "
             "first dims of x and y must agree", (long long)l->x.n, l->y.path,
             (long long)l->y.n);
    goto fail;
  }
  int ranks = cfg->ranks > 1 ? cfg->ranks : 1;
  l->global = l->batch * ranks;
  l->offset = (int64_t)(cfg->ranks > 1 ? cfg->rank : 0) * l->batch;
  l->batches_per_epoch = cfg->drop_last ? l->n / l->global
                                        : (l->n + l->batch - 1) / l->batch;
  if (l->batches_per_epoch == 0) {
    krt_fail(err, errlen, l->x.path, "%lld samples are fewer than one batch of "
             "%lld, and drop_last leaves no batch", (long long)l->n,
             (long long)l->global);
    goto fail;
  }
  l->orders = calloc((size_t)l->norders, sizeof *l->orders);
  if (!l->orders) {
    krt_fail(err, errlen, l->x.path, "out of memory");
    goto fail;
  }
  for (int i = 0; i < l->norders; i++) l->orders[i].epoch = -1;
  if (alloc_slots(l, err, errlen)) goto fail;
  l->nthreads = threads;
  if (start_workers(l, err, errlen)) goto fail;
  *out = l;
  return 0;
fail:
  krt_loader_close(l);
  return -1;
}

/* ---- the caller's side --------------------------------------------------
 * One thread calls these.  It alone writes start_*, handed and released
 * (under the lock, as workers read them), so it reads them without. */
int64_t krt_loader_samples(const krt_loader *l) { return l ? l->n : 0; }

int64_t krt_loader_batches_per_epoch(const krt_loader *l) {
  return l ? l->batches_per_epoch : 0;
}

static void describe(const loader_file *f, krt_io_desc *d) {
  memset(d, 0, sizeof *d);
  d->name = f->path;
  d->dtype = f->dtype;
  d->rank = f->rank;
  memcpy(d->dims, f->dims, sizeof d->dims);
}

void krt_loader_sample_desc(const krt_loader *l, krt_io_desc *x, krt_io_desc *y) {
  static const loader_file none;
  if (x) describe(l ? &l->x : &none, x);
  if (y) describe(l ? &l->y : &none, y);
}

int krt_loader_next(krt_loader *l, const void **x, const void **y, int *count,
                    double *wait_ms, char *err, size_t errlen) {
  if (!l || !x || !y || !count)
    return krt_fail(err, errlen, "krt_loader_next", "NULL loader or output");
  pthread_mutex_lock(&l->lock);
  l->released = l->handed;  /* the batch handed out last is given back */
  pthread_cond_broadcast(&l->work);
  slot *s = &l->slots[l->handed % l->nslots];
  double t0 = krt_now_ms();
  while (s->ticket != l->handed || (s->state != SLOT_READY && s->state != SLOT_FAILED))
    pthread_cond_wait(&l->done, &l->lock);
  if (wait_ms) *wait_ms = krt_now_ms() - t0;
  int rc = 0;
  if (s->state == SLOT_FAILED) {
    if (err && errlen) snprintf(err, errlen, "%s", s->err);
    rc = -1;
  } else {
    *x = s->x;
    *y = s->y;
    *count = s->count;
    l->handed++;
  }
  pthread_mutex_unlock(&l->lock);
  return rc;
}

void krt_loader_position(const krt_loader *l, int64_t *epoch, int64_t *batch_index) {
  int64_t e = 0, b = 0;
  if (l) position_of(l, l->handed, &e, &b);
  if (epoch) *epoch = e;
  if (batch_index) *batch_index = b;
}

int krt_loader_seek(krt_loader *l, int64_t epoch, int64_t batch_index, char *err,
                    size_t errlen) {
  if (!l) return krt_fail(err, errlen, "krt_loader_seek", "NULL loader");
  if (epoch < 0 || batch_index < 0 || batch_index >= l->batches_per_epoch)
    return krt_fail(err, errlen, l->x.path, "cannot seek to epoch %lld, batch %lld: "
                    "an epoch has batches 0 to %lld", (long long)epoch,
                    (long long)batch_index, (long long)l->batches_per_epoch - 1);
  pthread_mutex_lock(&l->lock);
  /* No new claims; let the batches being filled finish, then start over. */
  l->seeking = true;
  while (l->busy > 0) pthread_cond_wait(&l->done, &l->lock);
  l->start_epoch = epoch;
  l->start_batch = batch_index;
  l->handed = l->released = l->claimed = 0;
  for (int i = 0; i < l->nslots; i++) {
    l->slots[i].ticket = -1;
    l->slots[i].state = SLOT_FREE;
  }
  l->seeking = false;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
  return 0;
}

static void unmap(loader_file *f) {
  if (f->map) munmap(f->map, f->map_len);
  free(f->path);
}

void krt_loader_close(krt_loader *l) {
  if (!l) return;
  pthread_mutex_lock(&l->lock);
  l->stopping = true;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
  for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
  free(l->threads);
  for (int i = 0; l->slots && i < l->nslots; i++) {
    free(l->slots[i].x);
    free(l->slots[i].y);
  }
  free(l->slots);
  for (int i = 0; l->orders && i < l->norders; i++) free(l->orders[i].order);
  free(l->orders);
  unmap(&l->x);
  unmap(&l->y);
  pthread_cond_destroy(&l->work);
  pthread_cond_destroy(&l->done);
  pthread_mutex_destroy(&l->lock);
  free(l);
}
