/* weights.c - weights.bin from the pieces codegen lists: streamed from
 * where each weight lies (the model file's pages, a folded value, a seeded
 * init drawn as it goes), never gathered into one blob, so writing the
 * weights of a model larger than memory takes a few MB. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen_impl.h"

enum { CHUNK = 8 << 20 }; /* bytes per write */

/* Where pieces' bytes go: a file, or memory. */
typedef int (*sink_fn)(void *ctx, const void *p, size_t n, kl_error *err);

static int put_zeros(sink_fn sink, void *ctx, size_t n, kl_error *err) {
  static const unsigned char zeros[4096];
  for (size_t k; n; n -= k)
    if (sink(ctx, zeros, k = n < sizeof zeros ? n : sizeof zeros, err)) return -1;
  return 0;
}

/* A piece's bytes, a chunk at a time: straight from its data, or its
 * seeded init drawn into buf with the generator carried across chunks. */
static int put_piece(const kl_weight_piece *pc, unsigned char *buf, sink_fn sink, void *ctx,
                     kl_error *err) {
  size_t esize = pc->value ? kl_dtype_size(pc->value->dtype) : 1;
  kl_rng rng;
  if (!pc->data) kl_rng_seed(&rng, pc->value->init.seed);
  for (size_t done = 0, n; done < pc->bytes; done += n) {
    n = pc->bytes - done < CHUNK ? pc->bytes - done : CHUNK;
    const unsigned char *src;
    if (pc->data) {
      src = (const unsigned char *)pc->data + done;
    } else {
      n = n / esize * esize; /* whole elements (CHUNK is a multiple of 8) */
      kl_init_fill_raw(pc->value, &rng, (int64_t)(n / esize), buf);
      src = buf;
    }
    if (sink(ctx, src, n, err)) return -1;
    if (pc->mapped) kl_pages_release(src, n);
  }
  return 0;
}

static int put_all(const kl_codegen_result *r, sink_fn sink, void *ctx, kl_error *err) {
  unsigned char *buf = NULL;
  size_t pos = 0;
  int rc = 0;
  for (int i = 0; i < r->npieces && !rc; i++) {
    const kl_weight_piece *pc = &r->pieces[i];
    if (!pc->bytes) continue; /* an empty tensor may share the next one's offset */
    if (!pc->data && !buf && !(buf = malloc(CHUNK))) abort();
    if (pc->offset < pos)
      rc = kl_fail(err, (kl_loc){0}, "internal error: weights overlap at byte %zu", pc->offset);
    else
      rc = put_zeros(sink, ctx, pc->offset - pos, err) || put_piece(pc, buf, sink, ctx, err);
    pos = pc->offset + pc->bytes;
  }
  if (!rc) rc = put_zeros(sink, ctx, r->param_bytes - pos, err);
  free(buf);
  return rc;
}

static int to_fd(void *ctx, const void *p, size_t n, kl_error *err) {
  int fd = *(int *)ctx;
  const char *at = p;
  while (n) {
    ssize_t k = write(fd, at, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return kl_fail(err, (kl_loc){0}, "writing the weights failed: %s", strerror(errno));
    at += k;
    n -= (size_t)k;
  }
  return 0;
}

int kl_codegen_write_weights(const kl_codegen_result *r, int fd, kl_error *err) {
  return put_all(r, to_fd, &fd, err);
}

static int to_memory(void *ctx, const void *p, size_t n, kl_error *err) {
  (void)err;
  unsigned char **at = ctx;
  memcpy(*at, p, n);
  *at += n;
  return 0;
}

unsigned char *kl_codegen_weights_blob(const kl_codegen_result *r) {
  unsigned char *blob = malloc(r->param_bytes + 1), *at = blob;
  kl_error err;
  if (!blob) abort();
  put_all(r, to_memory, &at, &err); /* memory does not fail */
  return blob;
}

void kl_cg_free_pieces(kl_weight_piece *pieces, int n) {
  for (int i = 0; i < n && pieces; i++)
    if (pieces[i].owned) free((void *)pieces[i].data);
  free(pieces);
}
