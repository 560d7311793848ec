/* weights_file.c - a compiled model's weights kept in a file beside the
 * program instead of inside it (kiln compile --weights-file): mapped
 * read-only at create time, so a large model's program stays small, the
 * kernel's page cache holds one copy for every process that maps it, and
 * the host device runs straight from the mapping.
 *
 * The file is looked for by its name, in KILN_WEIGHTS_DIR, then beside the
 * program or shared library that holds the model, then in the folder it was
 * written to at compile time; its size and CRC-32 (zlib) must be the ones
 * the model was compiled with, so a stale or foreign file is refused with
 * what was expected. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "device_impl.h"

/* the folder of the program or library holding `anchor` */
static int object_dir(const void *anchor, char *dir, size_t n) {
  Dl_info info;
  const char *path = NULL;
  char exe[4096];
  if (dladdr(anchor, &info) && info.dli_fname && info.dli_fname[0] == '/') path = info.dli_fname;
  if (!path) { /* the main program, which glibc names as it was started (maybe relative) */
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return -1;
    exe[len] = 0;
    path = exe;
  }
  snprintf(dir, n, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) return -1;
  if (slash == dir) slash[1] = 0;
  else *slash = 0;
  return 0;
}

static uint32_t crc_of(const unsigned char *p, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n) { /* zlib takes 32-bit lengths */
    uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
    crc = crc32(crc, p, chunk);
    p += chunk, n -= chunk;
  }
  return (uint32_t)crc;
}

int krt_weights_map(krt_weights *w, const char *name, const char *compiled_dir, size_t bytes,
                    uint32_t crc, const void *anchor, char *err, size_t errlen) {
  memset(w, 0, sizeof *w);
  char dirs[3][4096], path[4096 + 1024], tried[3 * 4200] = "";
  int ndirs = 0;
  const char *env = getenv("KILN_WEIGHTS_DIR");
  if (env && *env) snprintf(dirs[ndirs++], sizeof dirs[0], "%s", env);
  if (object_dir(anchor, dirs[ndirs], sizeof dirs[0]) == 0) ndirs++;
  if (compiled_dir && *compiled_dir) snprintf(dirs[ndirs++], sizeof dirs[0], "%s", compiled_dir);
  int fd = -1;
  for (int i = 0; i < ndirs && fd < 0; i++) {
    snprintf(path, sizeof path, "%.4000s/%.1000s", dirs[i], name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      size_t k = strlen(tried);
      snprintf(tried + k, sizeof tried - k, "%s%s", k ? ", " : "", dirs[i]);
    }
  }
  if (fd < 0)
    return krt_err(err, errlen, "the weights file %s was not found (looked in %s; KILN_WEIGHTS_DIR "
                   "names another folder)", name, tried[0] ? tried : "no folder");
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) {
    close(fd);
    return krt_err(err, errlen, "the weights file %s is %lld bytes; the model was compiled with %zu",
                   path, (long long)st.st_size, bytes);
  }
  void *p = bytes ? mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0) : NULL;
  int e = errno;
  close(fd);
  if (bytes && p == MAP_FAILED)
    return krt_err(err, errlen, "cannot map the weights file %s: %s", path, strerror(e));
  uint32_t got = crc_of(p, bytes);
  if (got != crc) {
    munmap(p, bytes);
    return krt_err(err, errlen, "the weights file %s has CRC-32 %08x; the model was compiled with "
                   "%08x (a file from another compile?)", path, got, crc);
  }
  w->data = p;
  w->bytes = bytes;
  return 0;
}

void krt_weights_unmap(krt_weights *w) {
  if (w && w->data && w->bytes) munmap(w->data, w->bytes);
  if (w) memset(w, 0, sizeof *w);
}

uint32_t krt_crc32(const void *data, size_t bytes) { return crc_of(data, bytes); }
