/* tensor_file.c - file handling shared by the .npy and .safetensors readers
 * and writers: error messages, opening, exact reads, and writes that leave
 * no partial file behind. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io_util.h"

int krt_fail(char *errbuf, size_t errlen, const char *path, const char *fmt,
             ...) {
  if (errbuf && errlen) {
    int n = snprintf(errbuf, errlen, "%s: ", path ? path : "(null)");
    if (n >= 0 && (size_t)n < errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(errbuf + n, errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}

bool krt_read_exact(FILE *f, void *buf, size_t n) {
  return fread(buf, 1, n, f) == n;
}

/* ---- reading --------------------------------------------------------- */
FILE *krt_open_read(const char *path, int64_t *size, char *errbuf,
                    size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    krt_fail(errbuf, errlen, path, "%s", strerror(errno));
    return NULL;
  }
  /* A directory or FIFO has no meaningful size to check lengths against. */
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    krt_fail(errbuf, errlen, path, "not a regular file");
    fclose(f);
    return NULL;
  }
  *size = (int64_t)st.st_size;
  return f;
}

char *krt_read_header(FILE *f, size_t n, const char *path, char *errbuf,
                      size_t errlen) {
  char *hdr = malloc(n ? n : 1);
  if (!hdr) {
    krt_fail(errbuf, errlen, path, "out of memory");
    return NULL;
  }
  if (!krt_read_exact(f, hdr, n)) {
    krt_fail(errbuf, errlen, path, "read error in header");
    free(hdr);
    return NULL;
  }
  return hdr;
}

bool krt_read_data(FILE *f, krt_tensor *t, size_t nbytes) {
  if (!krt_read_exact(f, t->data, nbytes)) return false;
  /* Both formats store any nonzero byte as true; we promise 0 or 1. */
  if (t->dtype == KRT_BOOL)
    for (size_t i = 0; i < nbytes; i++)
      ((unsigned char *)t->data)[i] = ((unsigned char *)t->data)[i] != 0;
  return true;
}

/* ---- writing --------------------------------------------------------- */
FILE *krt_open_write(const char *path, char *errbuf, size_t errlen) {
  FILE *f = fopen(path, "wb");
  if (!f) krt_fail(errbuf, errlen, path, "%s", strerror(errno));
  return f;
}

int krt_close_write(FILE *f, bool ok, const char *path, char *errbuf,
                    size_t errlen) {
  int err = errno; /* the failed write's, before fclose can change it */
  if (fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    remove(path);
    return krt_fail(errbuf, errlen, path, "write failed: %s", strerror(err));
  }
  return 0;
}
