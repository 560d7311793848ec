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

/* The slots placed so far, found by lifetime, so that placing one visits
 * only those alive at some of its steps: a segment tree over the steps,
 * whose nodes list the slots alive over their whole range (the slots alive
 * at step s lie on the path from the root to leaf s) and count the slots
 * whose first step is in their range (so those are found without visiting
 * the steps where none starts).  Slots whose steps are out of order
 * (first > last, or outside the tree) are listed apart and compared one
 * by one. */
typedef struct {
  int leaves;     /* a power of two, at least the number of steps */
  int *cover;     /* per tree node: its list of slots alive over its range */
  int *starts;    /* per leaf (tree node): its list of slots starting there */
  int *nstart;    /* per tree node: slots starting in its range */
  int odd;        /* the list of the other slots */
  int *entry_slot, *entry_next, nentries; /* the lists' entries; -1 ends one */
} lifetimes;

static void lifetimes_init(lifetimes *t, int nsteps, int nslots) {
  int depth = 1;
  t->leaves = 1;
  while (t->leaves < nsteps) t->leaves *= 2, depth++;
  t->cover = malloc(2 * (size_t)t->leaves * sizeof *t->cover);
  t->starts = malloc(2 * (size_t)t->leaves * sizeof *t->starts);
  t->nstart = malloc(2 * (size_t)t->leaves * sizeof *t->nstart);
  /* an interval covers at most two nodes per level; one start each */
  size_t entries = (size_t)nslots * (2 * (size_t)depth + 1) + 1;
  t->entry_slot = malloc(entries * sizeof *t->entry_slot);
  t->entry_next = malloc(entries * sizeof *t->entry_next);
  if (!t->cover || !t->starts || !t->nstart || !t->entry_slot || !t->entry_next) abort();
}

static void lifetimes_clear(lifetimes *t) {
  memset(t->cover, -1, 2 * (size_t)t->leaves * sizeof *t->cover);
  memset(t->starts, -1, 2 * (size_t)t->leaves * sizeof *t->starts);
  memset(t->nstart, 0, 2 * (size_t)t->leaves * sizeof *t->nstart);
  t->odd = -1;
  t->nentries = 0;
}

static void lifetimes_free(lifetimes *t) {
  free(t->cover), free(t->starts), free(t->nstart), free(t->entry_slot), free(t->entry_next);
}

static void push_entry(lifetimes *t, int *list, int j) {
  t->entry_slot[t->nentries] = j;
  t->entry_next[t->nentries] = *list;
  *list = t->nentries++;
}

static void cover(lifetimes *t, int node, int lo, int hi, const slot *s, int j) {
  if (s->last < lo || hi <= s->first) return;
  if (s->first <= lo && hi - 1 <= s->last) {
    push_entry(t, &t->cover[node], j);
    return;
  }
  int mid = lo + (hi - lo) / 2;
  cover(t, 2 * node, lo, mid, s, j);
  cover(t, 2 * node + 1, mid, hi, s, j);
}

/* Does slot s take steps the tree holds (first <= last inside it)? */
static bool in_tree(const lifetimes *t, const slot *s) {
  return s->first >= 0 && s->last < t->leaves && s->first <= s->last;
}

/* Slot j is placed. */
static void lifetimes_add(lifetimes *t, const slot *slots, int j) {
  const slot *s = &slots[j];
  if (!in_tree(t, s)) {
    push_entry(t, &t->odd, j);
    return;
  }
  cover(t, 1, 0, t->leaves, s, j);
  int node = 1, lo = 0, hi = t->leaves;
  while (hi - lo > 1) {
    t->nstart[node]++;
    int mid = lo + (hi - lo) / 2;
    if (s->first < mid) node = 2 * node, hi = mid;
    else node = 2 * node + 1, lo = mid;
  }
  t->nstart[node]++;
  push_entry(t, &t->starts[node], j);
}

static int list_out(const lifetimes *t, int e, int *out, int n) {
  for (; e >= 0; e = t->entry_next[e]) out[n++] = t->entry_slot[e];
  return n;
}

/* The slots starting in [from, to] under node (its steps [lo, hi)). */
static int starting_in(const lifetimes *t, int node, int lo, int hi, int from, int to, int *out,
                       int n) {
  if (!t->nstart[node] || to < lo || hi <= from) return n;
  if (hi - lo == 1) return list_out(t, t->starts[node], out, n);
  int mid = lo + (hi - lo) / 2;
  n = starting_in(t, 2 * node, lo, mid, from, to, out, n);
  return starting_in(t, 2 * node + 1, mid, hi, from, to, out, n);
}

/* The placed slots alive at some step of [first, last] (first <= last,
 * both in [0, leaves)), each once, into out; returns how many: those alive
 * at step `first`, those starting after it, and the odd ones that meet the
 * plain test. */
static int lifetimes_overlapping(const lifetimes *t, const slot *slots, int first, int last,
                                 int *out) {
  int n = 0, node = 1, lo = 0, hi = t->leaves;
  for (;;) {
    n = list_out(t, t->cover[node], out, n);
    if (hi - lo == 1) break;
    int mid = lo + (hi - lo) / 2;
    if (first < mid) node = 2 * node, hi = mid;
    else node = 2 * node + 1, lo = mid;
  }
  if (first < last) n = starting_in(t, 1, 0, t->leaves, first + 1, last, out, n);
  for (int e = t->odd; e >= 0; e = t->entry_next[e]) {
    const slot *o = &slots[t->entry_slot[e]];
    if (o->first <= last && first <= o->last) out[n++] = t->entry_slot[e];
  }
  return n;
}

/* Place slots[0..n) in their current order, each in the smallest gap the
 * slots before it that share a step leave (the lowest on ties), or above
 * them all; returns the arena size.  `near` holds n entries. */
static size_t place(slot *slots, int n, extent *busy, lifetimes *t, int *near) {
  size_t arena = 0;
  lifetimes_clear(t);
  for (int i = 0; i < n; i++) {
    slot *s = &slots[i];
    s->offset = 0;
    if (!s->size) continue;
    int nb = 0, nnear;
    if (in_tree(t, s)) {
      nnear = lifetimes_overlapping(t, slots, s->first, s->last, near);
    } else { /* steps outside the tree: every slot placed before, plainly */
      nnear = 0;
      for (int j = 0; j < i; j++)
        if (slots[j].size && slots[j].first <= s->last && s->first <= slots[j].last) near[nnear++] = j;
    }
    for (int k = 0; k < nnear; k++) {
      const slot *o = &slots[near[k]];
      busy[nb++] = (extent){o->offset, o->offset + o->size};
    }
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
    lifetimes_add(t, slots, i);
  }
  return arena;
}

void kl_memplan(kl_membuf *bufs, int n, kl_memplan_stats *st) {
  memset(st, 0, sizeof *st);
  int *root = malloc(((size_t)n + 1) * sizeof *root);
  int *slot_of = malloc(((size_t)n + 1) * sizeof *slot_of);
  slot *slots = calloc((size_t)n + 1, sizeof *slots);
  extent *busy = malloc(((size_t)n + 1) * sizeof *busy);
  int *near = malloc(((size_t)n + 1) * sizeof *near);
  if (!root || !slot_of || !slots || !busy || !near) abort();
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
  lifetimes t;
  lifetimes_init(&t, nsteps, ns);
  st->arena = SIZE_MAX;
  unsigned rng = 1;
  /* each order costs a placement: shake small plans (these bounds are part
   * of the answer: a plan is the same on every compile) */
  int orders = NUM_FIXED_ORDERS + (ns <= 512 ? 64 : ns <= 4096 ? 8 : 0);
  for (int o = 0; o < orders && st->arena > st->lower_bound; o++) {
    /* the shaken orders start from the same order each time */
    if (o >= NUM_FIXED_ORDERS) qsort(slots, (size_t)ns, sizeof *slots, cmp_index);
    for (int i = 0; i < ns; i++) slots[i].key = order_key(&slots[i], o, &rng);
    qsort(slots, (size_t)ns, sizeof *slots, cmp_slots);
    size_t arena = place(slots, ns, busy, &t, near);
    if (arena >= st->arena) continue;
    st->arena = arena;
    for (int i = 0; i < ns; i++) best[slot_of[slots[i].index]] = slots[i].offset;
  }
  if (!ns) st->arena = 0;
  for (int i = 0; i < n; i++) bufs[i].offset = best[slot_of[i]];
  free(best);
  lifetimes_free(&t);
  free(near);
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

/* Every pair that shares a byte, in offset order, plainly: quadratic where
 * many buffers share offsets, so only run to name the first offending pair
 * once the sweep below found one. */
static int first_overlap(const kl_membuf *bufs, const placed *idx, int m, char *msg, size_t len) {
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
      return -1;
    }
  }
  return 0;
}

/* Byte ranges alive at once, over the distinct offsets and ends: a segment
 * tree whose nodes add how many ranges cover all their span, and hold the
 * most covering any point below them. */
typedef struct {
  size_t *coord; /* sorted distinct bounds; unit k is [coord[k], coord[k + 1]) */
  int ncoord, units;
  int *add, *most;
} coverage;

static int cmp_size(const void *pa, const void *pb) {
  size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
  return a < b ? -1 : a > b;
}

static int unit_of(const coverage *c, size_t at) {
  int lo = 0, hi = c->ncoord - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (c->coord[mid] < at) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Add d to units [from, to) under node (its units [lo, hi)). */
static void coverage_add(coverage *c, int node, int lo, int hi, int from, int to, int d) {
  if (to <= lo || hi <= from) return;
  if (from <= lo && hi <= to) {
    c->add[node] += d, c->most[node] += d;
    return;
  }
  int mid = lo + (hi - lo) / 2;
  coverage_add(c, 2 * node, lo, mid, from, to, d);
  coverage_add(c, 2 * node + 1, mid, hi, from, to, d);
  int l = c->most[2 * node], r = c->most[2 * node + 1];
  c->most[node] = c->add[node] + (l > r ? l : r);
}

/* The most ranges covering one unit of [from, to). */
static int coverage_most(const coverage *c, int node, int lo, int hi, int from, int to) {
  if (to <= lo || hi <= from) return 0;
  if (from <= lo && hi <= to) return c->most[node];
  int mid = lo + (hi - lo) / 2;
  int l = coverage_most(c, 2 * node, lo, mid, from, to);
  int r = coverage_most(c, 2 * node + 1, mid, hi, from, to);
  return c->add[node] + (l > r ? l : r);
}

static void coverage_range(coverage *c, const kl_membuf *b, int d) {
  coverage_add(c, 1, 0, c->units, unit_of(c, b->offset), unit_of(c, b->offset + b->bytes), d);
}

/* A buffer by one of its steps, to sort on. */
typedef struct {
  int step, index;
} stepped;

static int cmp_stepped(const void *pa, const void *pb) {
  const stepped *a = pa, *b = pb;
  if (a->step != b->step) return a->step < b->step ? -1 : 1;
  return a->index - b->index;
}

/* Does any pair of buffers (bytes > 0, indices in idx) share a byte while
 * both are alive, other than an in-place pair?  A sweep over the steps:
 * each buffer, as it starts, is tested against the byte ranges of those
 * alive then (its in-place parent's aside); buffers whose steps are out of
 * order (first > last) are compared with every other one plainly. */
static bool any_overlap(const kl_membuf *bufs, int n, const placed *idx, int m) {
  stepped *start = malloc(((size_t)m + 1) * sizeof *start), *end = malloc(((size_t)m + 1) * sizeof *end);
  coverage c = {malloc((2 * (size_t)m + 1) * sizeof *c.coord), 0, 0, NULL, NULL};
  if (!start || !end || !c.coord) abort();
  int nrun = 0;
  bool found = false;
  for (int x = 0; x < m && !found; x++) {
    const kl_membuf *a = &bufs[idx[x].index];
    if (a->first <= a->last) {
      start[nrun] = (stepped){a->first, idx[x].index};
      end[nrun++] = (stepped){a->last, idx[x].index};
      c.coord[c.ncoord++] = a->offset;
      c.coord[c.ncoord++] = a->offset + a->bytes;
      continue;
    }
    for (int y = 0; y < m && !found; y++) { /* rare: plainly */
      const kl_membuf *b = &bufs[idx[y].index];
      found = y != x && a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes &&
              a->first <= b->last && b->first <= a->last &&
              !in_place_pair(bufs, idx[x].index, idx[y].index) &&
              !in_place_pair(bufs, idx[y].index, idx[x].index);
    }
  }
  qsort(c.coord, (size_t)c.ncoord, sizeof *c.coord, cmp_size);
  int w = 0;
  for (int k = 0; k < c.ncoord; k++)
    if (!w || c.coord[k] != c.coord[w - 1]) c.coord[w++] = c.coord[k];
  c.ncoord = w;
  c.units = w > 1 ? w - 1 : 1;
  c.add = calloc(4 * (size_t)c.units, sizeof *c.add);
  c.most = calloc(4 * (size_t)c.units, sizeof *c.most);
  if (!c.add || !c.most) abort();
  qsort(start, (size_t)nrun, sizeof *start, cmp_stepped);
  qsort(end, (size_t)nrun, sizeof *end, cmp_stepped);
  for (int s = 0, e = 0; s < nrun && !found; s++) {
    const kl_membuf *b = &bufs[start[s].index];
    for (; e < nrun && end[e].step < b->first; e++) coverage_range(&c, &bufs[end[e].index], -1);
    /* its parent, alive still when it takes the parent's place, aside */
    int p = b->inplace_of;
    bool parent = p >= 0 && p < n && bufs[p].bytes && in_place_pair(bufs, start[s].index, p);
    if (parent) coverage_range(&c, &bufs[p], -1);
    found = coverage_most(&c, 1, 0, c.units, unit_of(&c, b->offset),
                          unit_of(&c, b->offset + b->bytes)) > 0;
    if (parent) coverage_range(&c, &bufs[p], 1);
    coverage_range(&c, b, 1);
  }
  free(start), free(end), free(c.coord), free(c.add), free(c.most);
  return found;
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
  int rc = any_overlap(bufs, n, idx, m) ? first_overlap(bufs, idx, m, msg, len) : 0;
  free(idx);
  return rc;
}
