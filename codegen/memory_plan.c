/* memory_plan.c - the arena of a compiled model: kl_memplan places the
 * buffers, kl_memplan_check proves the placement safe on every compile,
 * and a memory limit, when given, turns into an error that says what is
 * alive at the peak. */
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

/* "12345 bytes (12.1 KiB)": the unit 1024-based, as --mem-limit's. */
static const char *human(size_t n, char *buf, size_t len) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = -1;
  while (v >= 1024 && u < 3) v /= 1024, u++;
  if (u < 0) snprintf(buf, len, "%zu bytes", n);
  else snprintf(buf, len, "%zu bytes (%.1f %s)", n, v, units[u]);
  return buf;
}

static int cmp_bytes_desc(const void *pa, const void *pb) {
  const kl_membuf *a = *(const kl_membuf *const *)pa, *b = *(const kl_membuf *const *)pb;
  if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
  return strcmp(a->name, b->name);
}

static int over_limit(const kl_membuf *bufs, int n, const char *const *step_names, int nsteps,
                      size_t limit, const kl_memplan_stats *st, kl_error *err) {
  const kl_membuf **alive = malloc(((size_t)n + 1) * sizeof *alive);
  if (!alive) abort();
  int na = 0;
  for (int i = 0; i < n; i++)
    if (bufs[i].bytes && bufs[i].first <= st->peak_step && st->peak_step <= bufs[i].last)
      alive[na++] = &bufs[i];
  qsort(alive, (size_t)na, sizeof *alive, cmp_bytes_desc);
  char list[600] = "", h1[64], h2[64], h3[64];
  size_t used = 0;
  for (int i = 0; i < na && i < 5 && used < sizeof list - 120; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s'%.60s' (%zu bytes)", i ? ", " : "",
                             alive[i]->name, alive[i]->bytes);
  if (na > 5 && used < sizeof list - 16)
    snprintf(list + used, sizeof list - used, ", and %d more", na - 5);
  const char *node = st->peak_step < nsteps ? step_names[st->peak_step] : "?";
  kl_fail(err, (kl_loc){0},
          "memory limit exceeded: the planned arena takes %s, the limit is %s; at the peak, step "
          "%d (node '%.60s'), %s are alive, the largest: %s",
          human(st->arena, h1, sizeof h1), human(limit, h2, sizeof h2), st->peak_step, node,
          human(st->lower_bound, h3, sizeof h3), list);
  free(alive);
  return -1;
}

int kl_cg_plan_memory(kl_membuf *bufs, int n, const char *const *step_names, int nsteps,
                      size_t limit, kl_memplan_stats *st, kl_error *err) {
  kl_memplan(bufs, n, st);
  char why[700];
  if (kl_memplan_check(bufs, n, st->arena, why, sizeof why))
    return kl_fail(err, (kl_loc){0}, "internal error: the memory plan is unsafe: %s", why);
  if (limit && st->arena > limit) return over_limit(bufs, n, step_names, nsteps, limit, st, err);
  return 0;
}
