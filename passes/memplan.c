/* memplan.c - offsets in one arena for buffers with known lifetimes.
 *
 * Buffers joined in place become one slot (the union of their steps, the
 * largest of their sizes).  Slots are placed one at a time, largest first,
 * each into the smallest gap left by the slots already placed that are alive
 * at some of the same steps, or above them all when no gap fits ("greedy by
 * size, best fit", as TFLite's arena planner).  Five orders of placement
 * are tried, then (while the arena is above its lower bound, and the plan
 * small enough) up to 64 more with the sizes shaken by a fixed
 * pseudo-random factor, and the smallest arena kept: the same answer on
 * every compile.  The checker at the end shares no code with the planner:
 * it re-derives every conflict from the answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static size_t align_up(size_t n) { return (n + KL_MEM_ALIGN - 1) / KL_MEM_ALIGN * KL_MEM_ALIGN; }

typedef struct {
  size_t size; /* aligned */
  int first, last;
  int index;   /* of its root buffer, for stable ties */
  double key;  /* larger first: what the current order of placement sorts by */
  size_t offset;
} slot;

/* Orders of placement: by size, by size x lifetime, by first step, by
 * lifetime, by last step; then sizes shaken by a fixed pseudo-random
 * factor (the same every compile), while the arena is above its bound. */
enum { NUM_FIXED_ORDERS = 5 };

static double order_key(const slot *s, int order, unsigned *rng) {
  double life = (double)s->last - s->first + 1;
  switch (order) {
  case 0: return (double)s->size;
  case 1: return (double)s->size * life;
  case 2: return -(double)s->first;
  case 3: return life;
  case 4: return (double)s->last;
  default:
    *rng = *rng * 1103515245u + 12345u;
    return (double)s->size * (1.0 + (double)(*rng >> 16 & 0x7fff) / 32768.0);
  }
}

static int cmp_slots(const void *pa, const void *pb) {
  const slot *a = pa, *b = pb;
  if (a->key != b->key) return a->key > b->key ? -1 : 1;
  if (a->size != b->size) return a->size > b->size ? -1 : 1;
  int la = a->last - a->first, lb = b->last - b->first;
  if (la != lb) return la > lb ? -1 : 1;
  return a->index - b->index;
}

static int cmp_index(const void *pa, const void *pb) {
  return ((const slot *)pa)->index - ((const slot *)pb)->index;
}

typedef struct {
  size_t start, end;
} extent;

static int cmp_extents(const void *pa, const void *pb) {
  const extent *a = pa, *b = pb;
  if (a->start != b->start) return a->start < b->start ? -1 : 1;
  return a->end < b->end ? -1 : a->end > b->end;
}

/* Place slots[0..n) in their current order; returns the arena size. */
static size_t place(slot *slots, int n, extent *busy) {
  size_t arena = 0;
  for (int i = 0; i < n; i++) {
    slot *s = &slots[i];
    s->offset = 0;
    if (!s->size) continue;
    int nb = 0;
    for (int j = 0; j < i; j++)
      if (slots[j].size && slots[j].first <= s->last && s->first <= slots[j].last)
        busy[nb++] = (extent){slots[j].offset, slots[j].offset + slots[j].size};
    qsort(busy, (size_t)nb, sizeof *busy, cmp_extents);
    size_t top = 0, best = 0, best_gap = SIZE_MAX;
    for (int j = 0; j < nb; j++) {
      if (busy[j].start >= top && busy[j].start - top >= s->size && busy[j].start - top < best_gap) {
        best_gap = busy[j].start - top;
        best = top;
      }
      if (busy[j].end > top) top = busy[j].end;
    }
    s->offset = best_gap == SIZE_MAX ? top : best;
    if (s->offset + s->size > arena) arena = s->offset + s->size;
  }
  return arena;
}

void kl_memplan(kl_membuf *bufs, int n, kl_memplan_stats *st) {
  memset(st, 0, sizeof *st);
  int *root = malloc(((size_t)n + 1) * sizeof *root);
  int *slot_of = malloc(((size_t)n + 1) * sizeof *slot_of);
  slot *slots = calloc((size_t)n + 1, sizeof *slots);
  extent *busy = malloc(((size_t)n + 1) * sizeof *busy);
  if (!root || !slot_of || !slots || !busy) abort();
  /* in-place chains: one slot per root */
  int ns = 0, nsteps = 0;
  for (int i = 0; i < n; i++) {
    const kl_membuf *b = &bufs[i];
    st->naive += align_up(b->bytes);
    if (b->last + 1 > nsteps) nsteps = b->last + 1;
    int p = b->inplace_of;
    root[i] = p >= 0 && p < i ? root[p] : i;
    if (root[i] == i) {
      slot_of[i] = ns;
      slots[ns++] = (slot){align_up(b->bytes), b->first, b->last, i, 0, 0};
      continue;
    }
    slot *s = &slots[slot_of[root[i]]];
    slot_of[i] = slot_of[root[i]];
    if (align_up(b->bytes) > s->size) s->size = align_up(b->bytes);
    if (b->first < s->first) s->first = b->first;
    if (b->last > s->last) s->last = b->last;
  }
  /* lower bound: the most slot bytes alive at one step */
  size_t *delta = calloc((size_t)nsteps + 2, sizeof *delta);
  size_t *ends = calloc((size_t)nsteps + 2, sizeof *ends);
  if (!delta || !ends) abort();
  for (int i = 0; i < ns; i++) {
    if (slots[i].first < 0 || slots[i].last < slots[i].first) continue;
    delta[slots[i].first] += slots[i].size;
    ends[slots[i].last + 1] += slots[i].size;
  }
  size_t alive = 0;
  for (int s = 0; s < nsteps; s++) {
    alive = alive + delta[s] - ends[s];
    if (alive > st->lower_bound) st->lower_bound = alive, st->peak_step = s;
  }
  free(delta);
  free(ends);
  /* each order of placement in turn; the smallest arena wins (the first
   * on ties, so the result never depends on anything but the input) */
  size_t *best = malloc(((size_t)ns + 1) * sizeof *best);
  if (!best) abort();
  st->arena = SIZE_MAX;
  unsigned rng = 1;
  /* each order costs a placement, quadratic in the slots: shake small plans */
  int orders = NUM_FIXED_ORDERS + (ns <= 512 ? 64 : ns <= 4096 ? 8 : 0);
  for (int o = 0; o < orders && st->arena > st->lower_bound; o++) {
    /* the shaken orders start from the same order each time */
    if (o >= NUM_FIXED_ORDERS) qsort(slots, (size_t)ns, sizeof *slots, cmp_index);
    for (int i = 0; i < ns; i++) slots[i].key = order_key(&slots[i], o, &rng);
    qsort(slots, (size_t)ns, sizeof *slots, cmp_slots);
    size_t arena = place(slots, ns, busy);
    if (arena >= st->arena) continue;
    st->arena = arena;
    for (int i = 0; i < ns; i++) best[slot_of[slots[i].index]] = slots[i].offset;
  }
  if (!ns) st->arena = 0;
  for (int i = 0; i < n; i++) bufs[i].offset = best[slot_of[i]];
  free(best);
  free(root);
  free(slot_of);
  free(slots);
  free(busy);
}

/* ---- the checker ------------------------------------------------------- */
typedef struct {
  size_t offset;
  int index;
} placed;

static int cmp_placed(const void *pa, const void *pb) {
  const placed *a = pa, *b = pb;
  if (a->offset != b->offset) return a->offset < b->offset ? -1 : 1;
  return a->index - b->index;
}

/* i takes over j's space in place: same offset, and they meet at one step. */
static bool in_place_pair(const kl_membuf *bufs, int i, int j) {
  const kl_membuf *c = &bufs[i], *p = &bufs[j];
  return c->inplace_of == j && c->offset == p->offset && p->last == c->first &&
         p->first < c->first;
}

int kl_memplan_check(const kl_membuf *bufs, int n, size_t arena, char *msg, size_t len) {
  placed *idx = malloc(((size_t)n + 1) * sizeof *idx);
  if (!idx) abort();
  int m = 0;
  for (int i = 0; i < n; i++) {
    const kl_membuf *b = &bufs[i];
    if (!b->bytes) continue;
    if (b->offset % KL_MEM_ALIGN || b->offset > arena || b->bytes > arena - b->offset) {
      snprintf(msg, len, "buffer '%s' (%zu bytes at offset %zu) is misaligned or ends past the "
                         "arena (%zu bytes)", b->name, b->bytes, b->offset, arena);
      free(idx);
      return -1;
    }
    idx[m++] = (placed){b->offset, i};
  }
  qsort(idx, (size_t)m, sizeof *idx, cmp_placed);
  /* every pair that shares a byte is met: b starts inside a */
  for (int x = 0; x < m; x++) {
    int i = idx[x].index;
    const kl_membuf *a = &bufs[i];
    for (int y = x + 1; y < m && idx[y].offset < a->offset + a->bytes; y++) {
      int j = idx[y].index;
      const kl_membuf *b = &bufs[j];
      if (a->first > b->last || b->first > a->last) continue;
      if (in_place_pair(bufs, i, j) || in_place_pair(bufs, j, i)) continue;
      snprintf(msg, len, "buffers '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap while both are "
                         "alive (steps %d-%d and %d-%d)", a->name, a->offset, a->offset + a->bytes,
               b->name, b->offset, b->offset + b->bytes, a->first, a->last, b->first, b->last);
      free(idx);
      return -1;
    }
  }
  free(idx);
  return 0;
}
