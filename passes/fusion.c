/* fusion.c - partition a scheduled graph into groups, each of which
 * becomes one kernel.  Unfused compilation is the same partition with
 * singleton groups, so fused and unfused go through one pipeline.
 *
 * Groups grow greedily in schedule order.  A node joins a group that holds
 * its producer (vertical fusion) or a sibling reading one of its inputs
 * (horizontal fusion) when the group's kind accepts it, and only when the
 * groups stay a DAG: no path may leave the group and come back.  Nodes are
 * never duplicated, so fusion never recomputes a value; every merge only
 * removes a store and a load of an intermediate, which the DRAM byte count
 * (kl_group_dram_bytes) shows.
 *
 * The groups keep a topological rank (a group's producers rank lower),
 * repaired as edges are added (Pearce and Kelly's dynamic topological
 * order), so that the test for a path back into a group only visits the
 * groups ranked between the two: compile time stays near linear in the
 * graph's size. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  const kl_fusion_options *opt;
  kl_fusion *f;
  int *group_of;    /* node id -> group */
  int **preds;      /* group -> groups it reads from (may repeat) */
  int *npreds, *cap;
  int **succs;      /* group -> groups reading from it (may repeat) */
  int *nsuccs, *scap;
  int *rank;        /* group -> its place in a topological order of the groups */
  int *at_rank;     /* rank -> group */
  int *seen;        /* DFS stamps per group */
  int stamp;
  int *stack, *fwd, *bwd, *ranks; /* the searches' work lists, a slot per group */
  int *tried, tries; /* per group: the last pick_group that asked it (a sibling's) */
  kl_node ***members;
  int *nmembers, *mcap;
  kl_node ***readers; /* value id -> nodes reading it, so far */
  int *nreaders, *rcap;
  kl_node *const *order; /* the nodes in order, and where pick_group is */
  int norder, at;
} fuse_ctx;

static void push_node(kl_node ***arr, int *n, int *cap, kl_node *x) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 4;
    kl_node **grown = realloc(*arr, (size_t)*cap * sizeof **arr);
    if (!grown) abort();
    *arr = grown;
  }
  (*arr)[(*n)++] = x;
}

static void push_int(int **arr, int *n, int *cap, int x) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 4;
    int *grown = realloc(*arr, (size_t)*cap * sizeof *grown);
    if (!grown) abort();
    *arr = grown;
  }
  (*arr)[(*n)++] = x;
}

/* The groups reachable from `from` along one kind of edge (preds: what it
 * reads from; succs: what reads it) whose rank lies strictly between lo
 * and hi, `from` included, into out; returns how many. */
static int search(fuse_ctx *c, int from, int **edges, const int *nedges, int lo, int hi,
                  int *out) {
  int n = 0, top = 0;
  c->stamp++;
  c->seen[from] = c->stamp;
  c->stack[top++] = from;
  while (top) {
    int g = c->stack[--top];
    out[n++] = g;
    for (int i = 0; i < nedges[g]; i++) {
      int x = edges[g][i];
      if (c->seen[x] == c->stamp || c->rank[x] <= lo || c->rank[x] >= hi) continue;
      c->seen[x] = c->stamp;
      c->stack[top++] = x;
    }
  }
  return n;
}

static int cmp_int(const void *pa, const void *pb) {
  int a = *(const int *)pa, b = *(const int *)pb;
  return a < b ? -1 : a > b;
}

/* The ranks of list[0..n), sorted. */
static void sorted_ranks(const fuse_ctx *c, int *list, int n) {
  for (int i = 0; i < n; i++) list[i] = c->rank[list[i]];
  qsort(list, (size_t)n, sizeof *list, cmp_int);
}

/* Group g now reads from p, which ranks above it: move p and what it
 * reads (ranked above g) before g and what reads g (ranked below p),
 * reusing their ranks, each side in its old order. */
static void repair_ranks(fuse_ctx *c, int g, int p) {
  int lo = c->rank[g], hi = c->rank[p];
  int nf = search(c, g, c->succs, c->nsuccs, lo - 1, hi, c->fwd);
  int nb = search(c, p, c->preds, c->npreds, lo, hi + 1, c->bwd);
  sorted_ranks(c, c->fwd, nf);
  sorted_ranks(c, c->bwd, nb);
  int *moved = c->stack; /* free again: p's side first, then g's */
  for (int i = 0; i < nb; i++) moved[i] = c->at_rank[c->bwd[i]], c->ranks[i] = c->bwd[i];
  for (int i = 0; i < nf; i++) moved[nb + i] = c->at_rank[c->fwd[i]], c->ranks[nb + i] = c->fwd[i];
  qsort(c->ranks, (size_t)(nb + nf), sizeof *c->ranks, cmp_int);
  for (int i = 0; i < nb + nf; i++) {
    c->rank[moved[i]] = c->ranks[i];
    c->at_rank[c->ranks[i]] = moved[i];
  }
}

static void push_pred(fuse_ctx *c, int g, int p) {
  if (p < 0 || p == g) return;
  push_int(&c->preds[g], &c->npreds[g], &c->cap[g], p);
  push_int(&c->succs[p], &c->nsuccs[p], &c->scap[p], g);
  if (c->rank[p] > c->rank[g]) repair_ranks(c, g, p);
}

/* Does group `from` reach group `target` along producer edges?  Every step
 * back goes to a lower rank, so only groups ranked above the target are
 * searched. */
static bool reaches(fuse_ctx *c, int from, int target) {
  if (from == target) return true;
  if (c->rank[from] < c->rank[target]) return false;
  int n = search(c, from, c->preds, c->npreds, c->rank[target] - 1, c->rank[from] + 1, c->fwd);
  for (int i = 0; i < n; i++)
    if (c->fwd[i] == target) return true;
  return false;
}

static int producer_group(const fuse_ctx *c, const kl_value *v) {
  return v->producer ? c->group_of[v->producer->id] : -1;
}

static int row_kind(const fuse_ctx *c, const kl_node *n) {
  (void)c;
  return kl_row_kind(n);
}

static int row_axes(const fuse_ctx *c, const kl_node *n) {
  (void)c;
  return kl_row_axes(n);
}

/* an elementwise-group node that reads its inputs around its element (a
 * direct convolution): it never joins a group that makes one of them */
static bool reads_window(const fuse_ctx *c, const kl_node *n) {
  int64_t ratio[KL_MAX_RANK];
  return kl_is_direct_conv(n, c->opt->target) || kl_is_direct_conv_transpose(n, c->opt->target) ||
         kl_resize_ratios(n, ratio);
}

/* what a row kernel takes besides its reductions */
static bool row_elementwise(const fuse_ctx *c, const kl_node *n) {
  return kl_is_fusible(n, c->opt->target);
}

/* The rows' shape with its `axes` innermost dims 1: a row's scalars. */
static bool is_row_scalar(const kl_shape *v, const kl_shape *rows, int axes) {
  if (v->rank != rows->rank || axes > v->rank) return false;
  for (int d = 0; d < v->rank; d++)
    if (v->dims[d] != (d < v->rank - axes ? rows->dims[d] : 1)) return false;
  return true;
}

enum { NO, JOIN, JOIN_AS_ROWS };

static bool is_direct(const fuse_ctx *c, const kl_node *n) {
  return c->opt->direct && c->opt->direct[n->id];
}

/* ... and an elementwise kernel: inference batch_norm too (a per-channel
 * scale and shift: conv -> batch_norm -> relu becomes GEMM + one kernel),
 * and direct convolutions and GEMMs */
static bool elementwise(const fuse_ctx *c, const kl_node *n) {
  return row_elementwise(c, n) || kl_is_channel_affine(n) || reads_window(c, n) || is_direct(c, n);
}

/* How n may join group g (by kind and shape). */
static int fits(const fuse_ctx *c, const kl_node *n, int g) {
  const kl_group *gr = &c->f->groups[g];
  const kl_shape *out = &n->outputs[0]->shape;
  if (gr->kind == KL_GROUP_ELEMENTWISE) {
    if (reads_window(c, n) || is_direct(c, n)) {
      /* the other threads' values are not there yet: only siblings */
      for (int i = 0; i < n->ninputs; i++)
        if (producer_group(c, n->inputs[i]) == g) return NO;
      return kl_shape_equal(out, &gr->shape) ? JOIN : NO;
    }
    if (elementwise(c, n) && kl_shape_equal(out, &gr->shape)) return JOIN;
    /* a reduction of the group's values: the group becomes a row group,
     * when the row kernel can take all its members */
    if (row_kind(c, n) && kl_shape_equal(&n->inputs[0]->shape, &gr->shape) &&
        n->inputs[0]->producer && c->group_of[n->inputs[0]->producer->id] == g) {
      /* direct convolutions too before a plain reduction (its one pass
       * computes each output once: conv -> relu -> global pool is one kernel) */
      for (int m = 0; m < c->nmembers[g]; m++)
        if (!row_elementwise(c, c->members[g][m]) &&
            !(reads_window(c, c->members[g][m]) && row_kind(c, n) == 1 &&
              !kl_is_split_conv(c->members[g][m], c->opt->target)))
          return NO;
      return JOIN_AS_ROWS;
    }
    return NO;
  }
  if (gr->kind == KL_GROUP_ROWS) {
    if (row_elementwise(c, n) && (kl_shape_equal(out, &gr->shape) || is_row_scalar(out, &gr->shape, gr->row_axes)))
      return JOIN;
    if (row_kind(c, n) && kl_shape_equal(&n->inputs[0]->shape, &gr->shape) &&
        row_axes(c, n) == gr->row_axes)
      return JOIN;
  }
  return NO;
}

/* The group of the value n waits for (kl_node.after), or -1: an edge
 * like an input's, so that a recomputed node never joins a group that
 * runs before the value it waits for. */
static int after_group(const fuse_ctx *c, const kl_node *n) {
  return n->after ? producer_group(c, n->after) : -1;
}

/* n may join group g when g's kind takes it and every input of n that
 * comes from elsewhere does not itself depend on g. */
static int can_join(fuse_ctx *c, const kl_node *n, int g) {
  int how = fits(c, n, g);
  if (how == NO || c->nmembers[g] >= c->opt->target->max_group_nodes) return NO;
  for (int i = 0; i < n->ninputs; i++) {
    int p = producer_group(c, n->inputs[i]);
    if (p < 0 || p == g) continue;
    if (reaches(c, p, g)) return NO;
  }
  int a = after_group(c, n);
  if (a >= 0 && a != g && reaches(c, a, g)) return NO;
  return how;
}

static int new_group(fuse_ctx *c, kl_group_kind kind, const kl_shape *shape, int axes) {
  kl_fusion *f = c->f;
  int g = f->ngroups++;
  f->groups[g] = (kl_group){.kind = kind, .shape = *shape, .row_axes = axes};
  c->rank[g] = c->at_rank[g] = g; /* a new group reads nothing yet: last */
  return g;
}

/* An elementwise group that a reduction of its values joined. */
static void become_rows(fuse_ctx *c, int g, const kl_node *n) {
  c->f->groups[g].kind = KL_GROUP_ROWS;
  c->f->groups[g].row_axes = row_axes(c, n);
}

static void add_member(fuse_ctx *c, int g, kl_node *n) {
  c->group_of[n->id] = g;
  push_node(&c->members[g], &c->nmembers[g], &c->mcap[g], n);
  for (int i = 0; i < n->ninputs; i++) push_pred(c, g, producer_group(c, n->inputs[i]));
  push_pred(c, g, after_group(c, n));
}

/* The group n joins, best first: a producer's group, then the group of a
 * sibling that reads the same input; -1 for none. */
static int pick_group(fuse_ctx *c, kl_node *n) {
  if (!c->opt->enabled || (!elementwise(c, n) && !row_kind(c, n))) return -1;
  if (c->opt->pinned && c->opt->pinned[n->id]) return -1;
  int how;
  for (int i = 0; i < n->ninputs; i++) {
    int p = producer_group(c, n->inputs[i]);
    if (p >= 0 && (how = can_join(c, n, p)) != NO) {
      if (how == JOIN_AS_ROWS) become_rows(c, p, n);
      return p;
    }
  }
  c->tries++; /* a group that said no once says no again: asked once */
  for (int i = 0; i < n->ninputs; i++) {
    const kl_value *v = n->inputs[i];
    for (int r = 0; r < c->nreaders[v->id]; r++) {
      int s = c->group_of[c->readers[v->id][r]->id];
      if (s < 0 || c->tried[s] == c->tries) continue;
      c->tried[s] = c->tries;
      if ((how = can_join(c, n, s)) != NO) {
        if (how == JOIN_AS_ROWS) become_rows(c, s, n);
        return s;
      }
    }
  }
  /* A window reader (an upsample, a convolution) whose result a later node
   * combines with a value of another group: into that group, so that the
   * combining node finds both there (lateral + upsample in an FPN is then
   * one kernel, not two). */
  if (reads_window(c, n))
    for (int j = c->at + 1; j < c->norder; j++) {
      const kl_node *r = c->order[j];
      bool reads_n = false;
      for (int i = 0; i < r->ninputs; i++) reads_n |= r->inputs[i] == n->outputs[0];
      if (!reads_n || !elementwise(c, r)) continue;
      for (int i = 0; i < r->ninputs; i++) {
        int s = producer_group(c, r->inputs[i]);
        if (r->inputs[i] == n->outputs[0] || s < 0) continue;
        if ((how = can_join(c, n, s)) == JOIN) return s;
      }
    }
  return -1;
}

/* A binary heap of group numbers, the smallest on top. */
static void heap_push(int *heap, int *n, int x) {
  int i = (*n)++;
  for (; i > 0 && heap[(i - 1) / 2] > x; i = (i - 1) / 2) heap[i] = heap[(i - 1) / 2];
  heap[i] = x;
}

static int heap_pop(int *heap, int *n) {
  int top = heap[0], x = heap[--*n], i = 0;
  for (;;) {
    int k = 2 * i + 1;
    if (k >= *n) break;
    if (k + 1 < *n && heap[k + 1] < heap[k]) k++;
    if (heap[k] >= x) break;
    heap[i] = heap[k];
    i = k;
  }
  if (*n) heap[i] = x;
  return top;
}

/* Groups in an order that respects their edges (a group runs once all
 * it reads is written): groups grow after they are made, so the order they
 * were made in is not enough.  Kahn's algorithm, the smallest group first
 * (a heap), which keeps the schedule's order where it can.  Returns how
 * many groups it ordered into queue (fewer than all: a cycle). */
static int sort_groups(const fuse_ctx *c, int *queue) {
  int ng = c->f->ngroups, head = 0, nready = 0;
  int *indeg = malloc(((size_t)ng + 1) * sizeof *indeg), *ready = malloc(((size_t)ng + 1) * sizeof *ready);
  if (!indeg || !ready) abort();
  for (int gi = 0; gi < ng; gi++)
    if (!(indeg[gi] = c->npreds[gi])) heap_push(ready, &nready, gi);
  while (nready) {
    int gi = heap_pop(ready, &nready);
    queue[head++] = gi;
    for (int k = 0; k < c->nsuccs[gi]; k++)
      if (--indeg[c->succs[gi][k]] == 0) heap_push(ready, &nready, c->succs[gi][k]);
  }
  free(indeg), free(ready);
  return head;
}

/* Lay the groups and their nodes out in the sorted order; renumber. */
static void apply_order(fuse_ctx *c, const int *queue, int nn) {
  kl_fusion *f = c->f;
  int ng = f->ngroups, at = 0, *pos = calloc((size_t)ng + 1, sizeof *pos);
  kl_group *sorted = calloc((size_t)ng + 1, sizeof *sorted);
  if (!pos || !sorted) abort();
  for (int q = 0; q < ng; q++) {
    int gi = queue[q];
    pos[gi] = q;
    sorted[q] = f->groups[gi];
    sorted[q].first = at;
    sorted[q].count = c->nmembers[gi];
    for (int k = 0; k < c->nmembers[gi]; k++) f->nodes[at++] = c->members[gi][k];
  }
  for (int i = 0; i < nn; i++)
    if (c->group_of[i] >= 0) c->group_of[i] = pos[c->group_of[i]];
  free(f->groups);
  f->groups = sorted;
  f->nnodes = at;
  free(pos);
}

/* A value is written to memory when it is a graph output or another group
 * reads it; the rest live in registers inside their kernel. */
static void mark_stored(kl_fusion *f, int nv) {
  if (!(f->stored = calloc((size_t)nv + 1, sizeof *f->stored))) abort();
  for (int k = 0; k < f->nnodes; k++) {
    const kl_node *node = f->nodes[k];
    for (int o = 0; o < node->noutputs; o++)
      f->stored[node->outputs[o]->id] |= node->outputs[o]->is_output;
    for (int i = 0; i < node->ninputs; i++) {
      const kl_value *v = node->inputs[i];
      if (v->producer && f->group_of[v->producer->id] != f->group_of[node->id])
        f->stored[v->id] = true;
    }
  }
}

int kl_fuse(const kl_graph *g, kl_node *const *order, int n, const kl_fusion_options *opt,
            kl_fusion *f) {
  memset(f, 0, sizeof *f);
  int nn = g->nodes.len, nv = g->values.len;
  fuse_ctx c = {.opt = opt, .f = f};
  f->groups = calloc((size_t)n + 1, sizeof *f->groups);
  f->nodes = calloc((size_t)n + 1, sizeof *f->nodes);
  f->group_of = c.group_of = malloc(((size_t)nn + 1) * sizeof *c.group_of);
  c.preds = calloc((size_t)n + 1, sizeof *c.preds);
  c.npreds = calloc((size_t)n + 1, sizeof *c.npreds);
  c.cap = calloc((size_t)n + 1, sizeof *c.cap);
  c.seen = calloc((size_t)n + 1, sizeof *c.seen);
  c.succs = calloc((size_t)n + 1, sizeof *c.succs);
  c.nsuccs = calloc((size_t)n + 1, sizeof *c.nsuccs);
  c.scap = calloc((size_t)n + 1, sizeof *c.scap);
  c.rank = calloc((size_t)n + 1, sizeof *c.rank);
  c.at_rank = calloc((size_t)n + 1, sizeof *c.at_rank);
  c.stack = calloc((size_t)n + 1, sizeof *c.stack);
  c.fwd = calloc((size_t)n + 1, sizeof *c.fwd);
  c.bwd = calloc((size_t)n + 1, sizeof *c.bwd);
  c.ranks = calloc((size_t)n + 1, sizeof *c.ranks);
  c.tried = calloc((size_t)n + 1, sizeof *c.tried);
  c.members = calloc((size_t)n + 1, sizeof *c.members);
  c.nmembers = calloc((size_t)n + 1, sizeof *c.nmembers);
  c.mcap = calloc((size_t)n + 1, sizeof *c.mcap);
  c.readers = calloc((size_t)nv + 1, sizeof *c.readers);
  c.nreaders = calloc((size_t)nv + 1, sizeof *c.nreaders);
  c.rcap = calloc((size_t)nv + 1, sizeof *c.rcap);
  if (!f->groups || !f->nodes || !c.group_of || !c.preds || !c.npreds || !c.cap || !c.seen ||
      !c.succs || !c.nsuccs || !c.scap || !c.rank || !c.at_rank || !c.stack || !c.fwd || !c.bwd ||
      !c.ranks || !c.tried ||
      !c.members || !c.nmembers || !c.mcap || !c.readers || !c.nreaders || !c.rcap)
    abort();
  for (int i = 0; i < nn; i++) c.group_of[i] = -1;
  c.order = order, c.norder = n;
  for (int i = 0; i < n; i++) {
    kl_node *node = order[i];
    c.at = i;
    int gi = pick_group(&c, node);
    bool pinned = opt->pinned && opt->pinned[node->id];
    if (gi < 0 && pinned)
      gi = new_group(&c, KL_GROUP_SINGLE, &node->outputs[0]->shape, 0);
    else if (gi < 0 && opt->enabled && elementwise(&c, node))
      gi = new_group(&c, KL_GROUP_ELEMENTWISE, &node->outputs[0]->shape, 0);
    else if (gi < 0 && opt->enabled && row_kind(&c, node))
      gi = new_group(&c, KL_GROUP_ROWS, &node->inputs[0]->shape, row_axes(&c, node));
    else if (gi < 0)
      gi = new_group(&c, KL_GROUP_SINGLE, &node->outputs[0]->shape, 0);
    add_member(&c, gi, node);
    for (int k = 0; k < node->ninputs; k++) {
      const kl_value *v = node->inputs[k];
      push_node(&c.readers[v->id], &c.nreaders[v->id], &c.rcap[v->id], node);
    }
  }
  int ng = f->ngroups, *queue = calloc((size_t)ng + 1, sizeof *queue);
  if (!queue) abort();
  int sorted = sort_groups(&c, queue);
  int rc = sorted == ng ? 0 : -1; /* a cycle would be a bug in can_join */
  if (!rc) {
    apply_order(&c, queue, nn);
    mark_stored(f, nv);
  }
  for (int gi = 0; gi < ng; gi++) {
    free(c.preds[gi]);
    free(c.succs[gi]);
    free(c.members[gi]);
  }
  for (int v = 0; v < nv; v++) free(c.readers[v]);
  free(c.preds), free(c.npreds), free(c.cap), free(c.seen), free(c.members), free(c.nmembers);
  free(c.succs), free(c.nsuccs), free(c.scap), free(c.rank), free(c.at_rank), free(c.stack);
  free(c.fwd), free(c.bwd), free(c.ranks), free(c.tried);
  free(c.mcap), free(c.readers), free(c.nreaders), free(c.rcap), free(queue);
  if (rc) kl_fusion_free(f);
  return rc;
}

void kl_fusion_free(kl_fusion *f) {
  free(f->groups);
  free(f->nodes);
  free(f->group_of);
  free(f->stored);
  memset(f, 0, sizeof *f);
}
