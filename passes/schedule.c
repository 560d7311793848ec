/* schedule.c - the order compiled code runs nodes in, chosen to keep few
 * bytes alive.  Greedy: of the nodes whose inputs are computed, run the one
 * that grows the live set least (the bytes of its outputs less those of the
 * inputs it reads last), ties to the graph's own order.  Greedy can lose to
 * the program's order, so both are measured and the lower peak wins.
 *
 * The ready nodes wait in a heap by (growth, place in the graph's order).
 * A node's growth only changes (downwards) when the last other reader of
 * one of its inputs runs, so that is when it goes into the heap again; the
 * entries left behind are recognised and skipped.
 *
 * The bytes counted are the arena's: values computed by nodes, less graph
 * outputs (they have buffers of their own) and constants (stored with the
 * weights).
 *
 * A data-parallel step's gradient exchanges come first and what waits for
 * them last (sched_ctx.cls), whatever the bytes: the exchanges then run
 * during the rest of the backward pass. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  const kl_graph *g;
  bool *needed;      /* per node id: some output depends on it */
  size_t *bytes;     /* per value id: arena bytes, 0 when not in the arena */
  /* per node id, data-parallel training: 0 an all_reduce (started as soon
   * as its gradients exist), 2 a node that depends on an exchange's result
   * (run as late as possible, so the exchanges overlap the rest of the
   * backward pass), 1 the others; NULL: all 1 */
  int *cls;
} sched_ctx;

static size_t arena_bytes(const kl_value *v) {
  if (v->kind != KL_VAL_NODE || v->is_output || v->producer->op == KL_OP_CONSTANT) return 0;
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}

/* The most bytes alive at one step of `order` (needed nodes only). */
static size_t peak_bytes(const sched_ctx *s, kl_node *const *order) {
  const kl_graph *g = s->g;
  int nn = g->nodes.len;
  int *last = malloc(((size_t)g->values.len + 1) * sizeof *last);
  size_t *freed = calloc((size_t)nn + 1, sizeof *freed);
  if (!last || !freed) abort();
  for (int i = 0; i < nn; i++)
    for (int k = 0; k < order[i]->noutputs; k++) last[order[i]->outputs[k]->id] = i;
  for (int i = 0; i < nn; i++)
    if (s->needed[order[i]->id])
      for (int k = 0; k < order[i]->ninputs; k++)
        if (order[i]->inputs[k]->kind == KL_VAL_NODE) last[order[i]->inputs[k]->id] = i;
  size_t alive = 0, peak = 0;
  for (int i = 0; i < nn; i++) {
    const kl_node *n = order[i];
    if (!s->needed[n->id]) continue;
    for (int k = 0; k < n->noutputs; k++) {
      alive += s->bytes[n->outputs[k]->id];
      freed[last[n->outputs[k]->id]] += s->bytes[n->outputs[k]->id];
    }
    if (alive > peak) peak = alive;
    alive -= freed[i];
  }
  free(last);
  free(freed);
  return peak;
}

/* A node that waits for a value it does not read (kl_node.after: a
 * recomputed value runs next to its readers); such a value's readers
 * list holds it too. */
static bool waits_for(const sched_ctx *s, const kl_node *n) {
  return n->after && n->after->producer && s->needed[n->after->producer->id];
}

/* The greedy search's state. */
/* A ready node in the heap, under the growth it had when put there. */
typedef struct {
  int cls;            /* first: gradient exchanges, then compute, then
                         what waits for an exchange (sched_ctx.cls) */
  int64_t growth;
  int pos;            /* in the graph's own order: ties */
  kl_node *n;
} heap_entry;

typedef struct {
  const sched_ctx *s;
  const int *pos;     /* per node id: place in the graph's own order */
  int *reads_left;    /* per value id: reads by nodes not yet scheduled */
  int *readers_left;  /* per value id: nodes not yet scheduled that read it */
  int64_t *growth;    /* per node id: its growth now, once ready */
  bool *done_node;    /* per node id: scheduled */
  int *waiting;       /* per node id: inputs whose producer is not yet scheduled */
  int *start;         /* the readers of value v are readers[start[v]..start[v + 1]) */
  kl_node **readers;
  heap_entry *ready;  /* nodes whose inputs are all computed (and stale entries) */
  kl_node **cheap;    /* ready constants (no arena bytes), taken in turn */
  int nready, ncheap, cheap_next, cap_ready;
  kl_node **order;
  int done;
} greedy_state;

/* Bytes n's outputs add, less the bytes of the inputs n is the last to
 * read. */
static int64_t growth(const greedy_state *st, const kl_node *n) {
  const size_t *bytes = st->s->bytes;
  int64_t d = 0;
  for (int k = 0; k < n->noutputs; k++) d += (int64_t)bytes[n->outputs[k]->id];
  for (int k = 0; k < n->ninputs; k++) {
    const kl_value *v = n->inputs[k];
    int here = 0;
    bool seen = false;
    for (int j = 0; j < n->ninputs; j++) {
      if (n->inputs[j] != v) continue;
      if (j < k) seen = true;
      here++;
    }
    if (!seen && st->reads_left[v->id] == here) d -= (int64_t)bytes[v->id];
  }
  return d;
}

static bool before(const heap_entry *a, const heap_entry *b) {
  if (a->cls != b->cls) return a->cls < b->cls;
  return a->growth < b->growth || (a->growth == b->growth && a->pos < b->pos);
}

/* n goes into the heap under its growth now. */
static void heap_push(greedy_state *st, kl_node *n) {
  if (st->nready == st->cap_ready) {
    st->cap_ready = st->cap_ready ? 2 * st->cap_ready : 64;
    heap_entry *grown = realloc(st->ready, (size_t)st->cap_ready * sizeof *grown);
    if (!grown) abort();
    st->ready = grown;
  }
  heap_entry e = {st->s->cls ? st->s->cls[n->id] : 1, st->growth[n->id] = growth(st, n), st->pos[n->id], n};
  int i = st->nready++;
  for (; i > 0 && before(&e, &st->ready[(i - 1) / 2]); i = (i - 1) / 2)
    st->ready[i] = st->ready[(i - 1) / 2];
  st->ready[i] = e;
}

static heap_entry heap_pop(greedy_state *st) {
  heap_entry top = st->ready[0], last = st->ready[--st->nready];
  int i = 0;
  for (;;) {
    int k = 2 * i + 1;
    if (k >= st->nready) break;
    if (k + 1 < st->nready && before(&st->ready[k + 1], &st->ready[k])) k++;
    if (!before(&st->ready[k], &last)) break;
    st->ready[i] = st->ready[k];
    i = k;
  }
  if (st->nready) st->ready[i] = last;
  return top;
}

static void push_ready(greedy_state *st, kl_node *n) {
  if (n->op == KL_OP_CONSTANT) st->cheap[st->ncheap++] = n;
  else heap_push(st, n);
}

static bool reads(const kl_node *n, const kl_value *v) {
  for (int k = 0; k < n->ninputs; k++)
    if (n->inputs[k] == v) return true;
  return false;
}

/* v has one reader left to run: when that node is ready, its growth may
 * have dropped (it now reads v last).  (The list also holds the nodes that
 * only wait for v: kl_node.after.) */
static void last_reader_left(greedy_state *st, const kl_value *v) {
  for (int r = st->start[v->id]; r < st->start[v->id + 1]; r++) {
    kl_node *n = st->readers[r];
    if (st->done_node[n->id] || !reads(n, v)) continue;
    if (!st->waiting[n->id] && n->op != KL_OP_CONSTANT && growth(st, n) != st->growth[n->id])
      heap_push(st, n);
    return;
  }
}

/* Is input k of n the first place n reads that value? */
static bool first_read(const kl_node *n, int k) {
  for (int j = 0; j < k; j++)
    if (n->inputs[j] == n->inputs[k]) return false;
  return true;
}

/* Append n to the order; its readers may become ready, and the last
 * readers left of its inputs may grow less. */
static void schedule_node(greedy_state *st, kl_node *n) {
  st->order[st->done++] = n;
  st->done_node[n->id] = true;
  for (int k = 0; k < n->ninputs; k++) st->reads_left[n->inputs[k]->id]--;
  for (int k = 0; k < n->noutputs; k++) {
    int v = n->outputs[k]->id;
    for (int r = st->start[v]; r < st->start[v + 1]; r++)
      if (--st->waiting[st->readers[r]->id] == 0) push_ready(st, st->readers[r]);
  }
  for (int k = 0; k < n->ninputs; k++) {
    const kl_value *v = n->inputs[k];
    if (first_read(n, k) && v->kind == KL_VAL_NODE && --st->readers_left[v->id] == 1 &&
        st->s->bytes[v->id])
      last_reader_left(st, v);
  }
}

/* The greedy order of the needed nodes into order[], then the others in
 * `base` order; base[] is a topological order, pos[] its inverse. */
static void greedy(const sched_ctx *s, kl_node *const *base, const int *pos, kl_node **order) {
  const kl_graph *g = s->g;
  int nn = g->nodes.len, nv = g->values.len;
  greedy_state st = {.s = s, .pos = pos, .order = order};
  st.reads_left = calloc((size_t)nv + 1, sizeof *st.reads_left);
  st.readers_left = calloc((size_t)nv + 1, sizeof *st.readers_left);
  st.growth = calloc((size_t)nn + 1, sizeof *st.growth);
  st.done_node = calloc((size_t)nn + 1, sizeof *st.done_node);
  st.waiting = calloc((size_t)nn + 1, sizeof *st.waiting);
  st.start = calloc((size_t)nv + 2, sizeof *st.start);
  st.cheap = malloc(((size_t)nn + 1) * sizeof *st.cheap);
  if (!st.reads_left || !st.readers_left || !st.growth || !st.done_node || !st.waiting ||
      !st.start || !st.cheap)
    abort();
  int nreads = 0;
  for (int i = 0; i < nn; i++) {
    const kl_node *n = base[i];
    if (!s->needed[n->id]) continue;
    for (int k = 0; k < n->ninputs; k++) {
      st.reads_left[n->inputs[k]->id]++;
      if (first_read(n, k)) st.readers_left[n->inputs[k]->id]++;
      if (n->inputs[k]->kind == KL_VAL_NODE) st.waiting[n->id]++, st.start[n->inputs[k]->id + 1]++;
      nreads++;
    }
    if (waits_for(s, n)) st.waiting[n->id]++, st.start[n->after->id + 1]++, nreads++;
  }
  for (int v = 0; v < nv; v++) st.start[v + 1] += st.start[v];
  st.readers = malloc(((size_t)nreads + 1) * sizeof *st.readers);
  int *fill = malloc(((size_t)nv + 1) * sizeof *fill);
  if (!st.readers || !fill) abort();
  memcpy(fill, st.start, (size_t)nv * sizeof *fill);
  for (int i = 0; i < nn; i++) {
    kl_node *n = base[i];
    if (!s->needed[n->id]) continue;
    for (int k = 0; k < n->ninputs; k++)
      if (n->inputs[k]->kind == KL_VAL_NODE) st.readers[fill[n->inputs[k]->id]++] = n;
    if (waits_for(s, n)) st.readers[fill[n->after->id]++] = n;
    if (!st.waiting[n->id]) push_ready(&st, n);
  }
  free(fill);
  while (st.nready || st.cheap_next < st.ncheap) {
    if (st.cheap_next < st.ncheap) { /* no search for what costs nothing */
      schedule_node(&st, st.cheap[st.cheap_next++]);
      continue;
    }
    heap_entry e = heap_pop(&st);
    if (!st.done_node[e.n->id] && e.growth == st.growth[e.n->id]) schedule_node(&st, e.n);
  }
  for (int i = 0; i < nn; i++)
    if (!s->needed[base[i]->id]) order[st.done++] = base[i];
  free(st.reads_left);
  free(st.readers_left);
  free(st.growth);
  free(st.done_node);
  free(st.waiting);
  free(st.start);
  free(st.readers);
  free(st.ready);
  free(st.cheap);
}

int kl_schedule(const kl_graph *g, kl_node **order, kl_error *err) {
  int nn = g->nodes.len, nv = g->values.len, rc;
  kl_node **base = malloc(((size_t)nn + 1) * sizeof *base);
  int *pos = malloc(((size_t)nn + 1) * sizeof *pos);
  sched_ctx s = {g, calloc((size_t)nn + 1, sizeof *s.needed), calloc((size_t)nv + 1, sizeof *s.bytes), NULL};
  if (!base || !pos || !s.needed || !s.bytes) abort();
  if ((rc = kl_topo_order(g, base, err))) goto done;
  for (int i = 0; i < nn; i++) pos[base[i]->id] = i;
  for (int i = 0; i < nv; i++) s.bytes[i] = arena_bytes(g->values.items[i]);
  for (int i = 0; i < g->outputs.len; i++)
    if (g->outputs.items[i]->producer) s.needed[g->outputs.items[i]->producer->id] = true;
  for (int i = nn - 1; i >= 0; i--)
    if (s.needed[base[i]->id])
      for (int k = 0; k < base[i]->ninputs; k++)
        if (base[i]->inputs[k]->producer) s.needed[base[i]->inputs[k]->producer->id] = true;
  /* the exchange classes, in topological order: a node depends on an
   * exchange when it reads a wait's result or a value that does */
  for (int i = 0; i < nn && !s.cls; i++)
    if (base[i]->op == KL_OP_ALL_REDUCE) {
      s.cls = malloc(((size_t)nn + 1) * sizeof *s.cls);
      if (!s.cls) abort();
      for (int j = 0; j < nn; j++) s.cls[j] = 1;
    }
  for (int i = 0; s.cls && i < nn; i++) {
    const kl_node *n = base[i];
    if (n->op == KL_OP_ALL_REDUCE) {
      s.cls[n->id] = 0;
      continue;
    }
    if (n->op == KL_OP_ALL_REDUCE_WAIT) s.cls[n->id] = 2;
    for (int k = 0; k < n->ninputs; k++) {
      const kl_node *p = n->inputs[k]->producer;
      if (p && p->op != KL_OP_ALL_REDUCE && s.cls[p->id] == 2) s.cls[n->id] = 2;
    }
  }
  greedy(&s, base, pos, order);
  /* the graph's own order may keep fewer bytes alive, but it starts no
   * exchange early: with exchanges, the greedy order stands */
  if (!s.cls && peak_bytes(&s, base) <= peak_bytes(&s, order)) memcpy(order, base, (size_t)nn * sizeof *order);
done:
  free(s.cls);
  free(base);
  free(pos);
  free(s.needed);
  free(s.bytes);
  return rc;
}
