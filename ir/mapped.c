/* mapped.c - files mapped read-only into a graph, so that weights stay in
 * the page cache where the file lies instead of being copied into memory
 * (twice the weights' size in RSS, and again per copy). */
#define _DEFAULT_SOURCE /* madvise */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "op_impl.h"

/* What an empty file maps to: a valid pointer to no bytes. */
static unsigned char empty_file[1];

void *kl_map_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  void *base = NULL;
  if (fstat(fd, &st) != 0) {
    base = NULL;
  } else if (!S_ISREG(st.st_mode)) {
    errno = EINVAL;
  } else if (st.st_size == 0) {
    base = empty_file;
    *len = 0;
  } else {
    base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) base = NULL;
    else *len = (size_t)st.st_size;
  }
  int keep = errno;
  close(fd); /* the mapping outlives the descriptor */
  errno = keep;
  return base;
}

void kl_unmap_file(void *base, size_t len) {
  if (base && base != (void *)empty_file) munmap(base, len);
}

void kl_graph_add_mapping(kl_graph *g, const char *path, void *base, size_t len) {
  if (g->maps.len == g->maps.cap) {
    g->maps.cap = g->maps.cap ? 2 * g->maps.cap : 4;
    void *grown = realloc(g->maps.items, (size_t)g->maps.cap * sizeof *g->maps.items);
    if (!grown) abort();
    g->maps.items = grown;
  }
  char *copy = strdup(path);
  if (!copy) abort();
  g->maps.items[g->maps.len++] = (kl_mapping){copy, base, len};
}

const unsigned char *kl_graph_map_file(kl_graph *g, const char *path, size_t *len) {
  for (int i = 0; i < g->maps.len; i++)
    if (!strcmp(g->maps.items[i].path, path)) {
      *len = g->maps.items[i].len;
      return g->maps.items[i].base;
    }
  void *base = kl_map_file(path, len);
  if (base) kl_graph_add_mapping(g, path, base, *len);
  return base;
}

bool kl_graph_is_mapped(const kl_graph *g, const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < g->maps.len; i++) {
    uintptr_t b = (uintptr_t)g->maps.items[i].base;
    if (a >= b && a - b <= g->maps.items[i].len && n <= g->maps.items[i].len - (a - b))
      return true;
  }
  return false;
}

void kl_pages_release(const void *p, size_t n) {
  static size_t page;
  if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + n) / page * page;
  /* best effort: a page that stays is only memory, never a wrong byte */
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void kl_graph_unmap(kl_graph *g) {
  for (int i = 0; i < g->maps.len; i++) {
    kl_unmap_file(g->maps.items[i].base, g->maps.items[i].len);
    free(g->maps.items[i].path);
  }
  free(g->maps.items);
  g->maps.items = NULL;
  g->maps.len = g->maps.cap = 0;
}
