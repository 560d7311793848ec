/* plan_memory.c - the memory pass: where every value lives, decided from
 * the plan before any code is written.
 *
 * Weights and folded values get offsets in one blob; inputs and outputs
 * their own buffers; every other stored value an arena buffer.  Each step
 * (a group) declares what it touches: its members' inputs and outputs,
 * the bases of the views its GEMMs read and write, a GEMM epilogue's bias
 * and residual, an attention's operands, and its template's scratch
 * (kl_target.scratch).  Those uses are the buffers' live ranges; an output
 * may take over the buffer of an input its step is the last to read (in
 * place); kl_memplan places the buffers, kl_memplan_check proves the
 * placement safe on every compile, and a memory limit, when given, turns
 * into an error that says what is alive at the peak.  The code generator
 * checks every pointer it asks for against these ranges. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

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

static size_t value_bytes(const kl_value *v) {
  return (size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype);
}

static size_t align_up(size_t n) { return (n + KL_MEM_ALIGN - 1) / KL_MEM_ALIGN * KL_MEM_ALIGN; }

/* ---- where values live -------------------------------------------------- */
/* A request for arena space, alive at no step until a step uses it. */
static int add_buf(kl_plan *p, const char *name, size_t bytes) {
  if (p->nbufs == p->cap_bufs) {
    p->cap_bufs = p->cap_bufs ? 2 * p->cap_bufs : 64;
    p->bufs = realloc(p->bufs, (size_t)p->cap_bufs * sizeof *p->bufs);
    if (!p->bufs) abort();
  }
  char *copy = strdup(name);
  if (!copy) abort();
  p->bufs[p->nbufs] = (kl_membuf){copy, bytes, INT_MAX, -1, -1, 0};
  return p->nbufs++;
}

static void add_param(kl_plan *p, const kl_value *v) {
  size_t off = align_up(p->param_bytes);
  p->loc[v->id] = (kl_location){KL_LOC_PARAM, off, 0};
  p->param_bytes = off + value_bytes(v);
}

/* reshape & co renumber nothing: the output is the input's buffer under
 * another shape (same element order and width), and no kernel runs */
static bool is_alias(const kl_plan *p, const kl_node *n) {
  if (n->op != KL_OP_RESHAPE && n->op != KL_OP_FLATTEN && n->op != KL_OP_SQUEEZE &&
      n->op != KL_OP_UNSQUEEZE && n->op != KL_OP_ALL_REDUCE_WAIT)
    return false;
  const kl_value *in = n->inputs[0], *out = n->outputs[0];
  kl_location l = p->loc[in->id];
  return p->loc[out->id].kind == KL_LOC_NONE && l.kind != KL_LOC_NONE && l.kind != KL_LOC_VIEW &&
         kl_dtype_size(in->dtype) == kl_dtype_size(out->dtype) &&
         kl_shape_numel(&in->shape) == kl_shape_numel(&out->shape);
}

/* A concat whose pieces are contiguous in its output (every dim before
 * the axis is 1: a batch-1 channel concat, a flat one) is written in
 * place: each piece's producer writes its part of the concat's buffer and
 * the concat runs no kernel.  A piece qualifies when a kernel of its own
 * group or a GEMM writes it, straight: not a graph output (its buffer is
 * the caller's), not a view, an alias or a GEMM's epilogue value, not
 * another concat's output, and once in this concat. */
static bool piece_ok(const kl_plan *p, const kl_node *n, int k) {
  const kl_value *x = n->inputs[k];
  if (x->kind != KL_VAL_NODE || x->dtype != n->outputs[0]->dtype || x->is_output ||
      p->loc[x->id].kind != KL_LOC_NONE || p->piece_of[x->id])
    return false;
  for (int j = 0; j < k; j++)
    if (n->inputs[j] == x) return false;
  const kl_node *pr = x->producer;
  if (!p->live[pr->id] || p->folded[pr->id] || p->view_node[pr->id] || p->writes_into[pr->id] ||
      p->epi_last[pr->id] || p->epi_inner[pr->id] || pr->op == KL_OP_CONCAT || pr->op == KL_OP_RESHAPE ||
      pr->op == KL_OP_FLATTEN || pr->op == KL_OP_SQUEEZE || pr->op == KL_OP_UNSQUEEZE ||
      pr->op == KL_OP_ALL_REDUCE_WAIT || pr->op == KL_OP_CONSTANT)
    return false;
  return !kl_plan_in_group(p, pr) || p->fusion.stored[x->id];
}

static void choose_concats_in_place(kl_plan *p) {
  const kl_graph *g = p->g;
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (n->op != KL_OP_CONCAT || n->noutputs != 1 || !p->live[n->id] || p->folded[n->id] ||
        p->view_node[n->id] || kl_plan_in_group(p, n) || !kl_dtype_size(n->outputs[0]->dtype))
      continue;
    const kl_shape *y = &n->outputs[0]->shape;
    int64_t axis = kl_attr_int(n, "axis", 0);
    if (axis < 0) axis += y->rank;
    bool ok = axis >= 0 && axis < y->rank && kl_shape_numel(y) > 0;
    for (int d = 0; d < axis && ok; d++) ok = y->dims[d] == 1;
    for (int k = 0; k < n->ninputs && ok; k++) ok = piece_ok(p, n, k);
    if (!ok) continue;
    for (int k = 0; k < n->ninputs; k++) p->piece_of[n->inputs[k]->id] = n;
    p->alias[n->id] = true;
  }
}

/* Piece v's place: its part of the concat's buffer, which the first piece
 * made asks for (the concat's output may be a graph output: then the
 * caller's buffer). */
static void place_piece(kl_plan *p, const kl_value *v) {
  const kl_node *c = p->piece_of[v->id];
  const kl_value *y = c->outputs[0];
  if (p->loc[y->id].kind == KL_LOC_NONE)
    p->loc[y->id] = (kl_location){KL_LOC_ARENA, 0, add_buf(p, y->name, value_bytes(y))};
  size_t off = 0;
  for (int k = 0; k < c->ninputs && c->inputs[k] != v; k++) off += value_bytes(c->inputs[k]);
  kl_location l = p->loc[y->id];
  l.offset += off;
  p->loc[v->id] = l;
}

static void place_values(kl_plan *p) {
  const kl_graph *g = p->g;
  for (int i = 0; i < g->inputs.len; i++)
    p->loc[g->inputs.items[i]->id] = (kl_location){KL_LOC_INPUT, 0, i};
  /* A computed output is written straight into its buffer; one that is an
   * input, a weight or a constant is read back from where it lives. */
  /* (numbered as the compiled API's outputs: update values are none) */
  for (int i = 0, api = 0; i < g->outputs.len; i++) {
    const kl_value *v = g->outputs.items[i];
    if (v->updates) continue;
    if (v->kind == KL_VAL_NODE && !p->folded[v->producer->id])
      p->loc[v->id] = (kl_location){KL_LOC_OUTPUT, 0, api};
    api++;
  }
  for (int i = 0; i < g->params.len; i++) add_param(p, g->params.items[i]);
  choose_concats_in_place(p);
  /* a training step's new params and optimizer state overwrite the old
   * (check_updates says that nothing reads the old after) */
  for (int i = 0; i < g->outputs.len; i++)
    if (g->outputs.items[i]->updates)
      p->loc[g->outputs.items[i]->id] = p->loc[g->outputs.items[i]->updates->id];
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (!p->live[n->id]) continue;
    if (p->folded[n->id]) { /* stored with the weights */
      for (int k = 0; k < n->noutputs; k++) add_param(p, n->outputs[k]);
      continue;
    }
    /* views and a matmul's result written through a transpose: no buffer */
    if (p->view_node[n->id]) {
      for (int k = 0; k < n->noutputs; k++) p->loc[n->outputs[k]->id] = (kl_location){KL_LOC_VIEW, 0, 0};
      continue;
    }
    if (p->writes_into[n->id] || p->epi_last[n->id] || p->epi_inner[n->id]) {
      p->loc[n->outputs[0]->id] = (kl_location){KL_LOC_VIEW, 0, 0};
      continue;
    }
    if (p->alias[n->id]) continue; /* a concat written in place: its pieces placed it */
    if (is_alias(p, n)) {
      p->alias[n->id] = true;
      p->loc[n->outputs[0]->id] = p->loc[n->inputs[0]->id];
      continue;
    }
    /* an arena buffer each; a value that stays inside its fused kernel
     * needs none */
    bool fused = kl_plan_in_group(p, n);
    for (int k = 0; k < n->noutputs; k++) {
      kl_value *v = n->outputs[k];
      if (p->loc[v->id].kind != KL_LOC_NONE || (fused && !p->fusion.stored[v->id])) continue;
      if (p->piece_of[v->id]) place_piece(p, v);
      else p->loc[v->id] = (kl_location){KL_LOC_ARENA, 0, add_buf(p, v->name, value_bytes(v))};
    }
  }
  p->nvalue_bufs = p->nbufs;
}

/* ---- what each step touches --------------------------------------------- */
static void use_value(kl_plan *p, const kl_value *v, int step) {
  if (p->loc[v->id].kind != KL_LOC_ARENA) return;
  kl_membuf *m = &p->bufs[p->loc[v->id].index];
  if (step < m->first) m->first = step;
  if (step > m->last) m->last = step;
}

/* A GEMM call of matmul mm: its operands and result through their views,
 * and its epilogue's bias and residual. */
static void use_gemm(kl_plan *p, const kl_node *mm, int step) {
  kl_view out;
  use_value(p, p->view[mm->inputs[0]->id].base, step);
  use_value(p, p->view[mm->inputs[1]->id].base, step);
  kl_plan_result_view(p, mm, &out);
  use_value(p, out.base, step);
  if (p->epi_bias[mm->id]) use_value(p, p->epi_bias[mm->id], step);
  if (p->epi_residual[mm->id]) use_value(p, p->epi_residual[mm->id], step);
}

/* An attention: its chains' inputs, Q, K and V, and its result. */
static void use_attention(kl_plan *p, const kl_attention *a, int step) {
  for (int m = 0; m < a->npre + a->npost; m++) {
    const kl_node *n = m < a->npre ? a->pre[m] : a->post[m - a->npre];
    for (int i = 0; i < n->ninputs; i++) use_value(p, n->inputs[i], step);
  }
  use_gemm(p, a->qk, step);
  use_gemm(p, a->pv, step);
}

static void declare_scratch(kl_plan *p, const kl_node *n) {
  size_t bytes[8];
  int count = p->target->scratch ? p->target->scratch(n, bytes, 8) : 0;
  char name[300];
  snprintf(name, sizeof name, "scratch of %s", n->name);
  for (int k = 0; k < count; k++) add_buf(p, name, bytes[k]);
}

static void declare_uses(kl_plan *p) {
  for (int s = 0; s < p->fusion.ngroups; s++) {
    const kl_group *gr = &p->fusion.groups[s];
    kl_node *const *m = p->fusion.nodes + gr->first;
    /* a node's arena inputs and outputs are alive at its step, whether or
     * not its kernel reads them */
    for (int k = 0; k < gr->count; k++) {
      for (int i = 0; i < m[k]->ninputs; i++) use_value(p, m[k]->inputs[i], s);
      for (int o = 0; o < m[k]->noutputs; o++) use_value(p, m[k]->outputs[o], s);
    }
    p->scratch_at[s] = p->nbufs;
    const kl_node *gemm = gr->count == 1 ? kl_plan_epilogue_gemm(p, m[0]) : NULL;
    switch (kl_plan_step_kind(p, s)) {
    case KL_STEP_ATTENTION: use_attention(p, &p->attn[gemm->id], s); break;
    case KL_STEP_GEMM:
      use_gemm(p, gemm ? gemm : m[0], s);
      declare_scratch(p, gemm ? gemm : m[0]);
      break;
    case KL_STEP_NODE: declare_scratch(p, m[0]); break;
    default: break;
    }
    for (int b = p->scratch_at[s]; b < p->nbufs; b++) p->bufs[b].first = p->bufs[b].last = s;
  }
  p->scratch_at[p->fusion.ngroups] = p->nbufs;
}

/* ---- in place ------------------------------------------------------------ */
static bool is_scatter(const kl_node *n);
/* Nodes whose one kernel reads element i of an input, then writes element
 * i of the output, and nothing else: the output may overwrite that input.
 * (Their kernels declare the pointers __restrict__; that stays sound since
 * each element is read before it is written, by the same thread.) */
static bool runs_in_place(const kl_plan *p, const kl_node *n) {
  if (p->target->scalar(n)) return true;
  return n->op == KL_OP_RESHAPE || n->op == KL_OP_FLATTEN || n->op == KL_OP_SQUEEZE ||
         n->op == KL_OP_UNSQUEEZE || is_scatter(n);
}

/* A scatter copies its data input element for element, then writes its
 * updates over the copy, reading only the indices and the updates: its
 * output may take the data's buffer (a gradient's zeros), and no other
 * input's. */
static bool is_scatter(const kl_node *n) {
  return n->op == KL_OP_SCATTER_ELEMENTS || n->op == KL_OP_SCATTER_ND;
}

/* May input k of a single node's step give its buffer to the output? */
static bool in_place_input(const kl_node *n, int k) { return !is_scatter(n) || k == 0; }

/* Does a convolution of the group read arena buffer b (under any name:
 * a reshape is the same buffer)?  Then no output may overwrite it. */
static bool window_buffer(const kl_plan *p, const kl_group_io *io, int b) {
  for (int k = 0; k < io->nin; k++)
    if (io->window_read[k] && p->loc[io->in[k]->id].kind == KL_LOC_ARENA &&
        p->loc[io->in[k]->id].index == b)
      return true;
  return false;
}

static bool one_row_value(const kl_group_io *io, const kl_shape *rows) {
  int n = 0;
  for (int o = 0; o < io->nout; o++) n += kl_shape_equal(&io->out[o]->shape, rows);
  return n == 1;
}

/* Let an output take the buffer of an input its kernel is the last to
 * read, when they match element for element (no broadcast, same width):
 * such a node's output, or the one output of a fused group.  An input's
 * buffer goes to one output at most. */
static void choose_in_place(kl_plan *p) {
  bool *taken = calloc((size_t)p->nbufs + 1, sizeof *taken);
  /* a buffer that holds a concat's pieces neither takes another's place
   * nor gives its own: a piece is part of it, its other parts written at
   * other steps */
  bool *pieces = calloc((size_t)p->nbufs + 1, sizeof *pieces);
  if (!taken || !pieces) abort();
  for (int v = 0; v < p->g->values.len; v++)
    if (p->piece_of[v] && p->loc[v].kind == KL_LOC_ARENA) pieces[p->loc[v].index] = true;
  for (int s = 0; s < p->fusion.ngroups; s++) {
    const kl_group *gr = &p->fusion.groups[s];
    kl_node *const *members = p->fusion.nodes + gr->first;
    kl_group_io io;
    if (gr->count == 1) {
      const kl_node *n = members[0];
      if (n->noutputs != 1 || !runs_in_place(p, n)) continue;
      io.nin = io.nout = 0;
      for (int k = 0; k < n->ninputs && k < KL_MAX_GROUP_IO; k++)
        if (in_place_input(n, k)) io.in[io.nin++] = n->inputs[k];
      io.out[io.nout++] = n->outputs[0];
    } else {
      kl_group_io_of(members, gr->count, p->fusion.stored, &io);
      /* The kernel's pointers are __restrict__, so the compiler may move a
       * load past a store to another pointer.  With one output, every load
       * feeds that store and must come first; with more, an input loaded
       * for a later output could be read after an earlier output took its
       * place.  A row kernel stores its row values in a last pass of their
       * own and its row scalars after the passes (emit_rows.c): with one
       * row value among its outputs, that one is like a sole output. */
      if (io.nout != 1 && !(gr->kind == KL_GROUP_ROWS && one_row_value(&io, &gr->shape))) continue;
    }
    for (int o = 0; o < io.nout; o++) {
      const kl_location *lo = &p->loc[io.out[o]->id];
      if (lo->kind != KL_LOC_ARENA || pieces[lo->index]) continue;
      /* a row kernel's lane 0 writes a row's scalars while other lanes may
       * still read that row's inputs: only its row values go in place */
      if (gr->kind == KL_GROUP_ROWS && !kl_shape_equal(&io.out[o]->shape, &gr->shape)) continue;
      kl_membuf *out = &p->bufs[lo->index];
      int64_t numel = kl_shape_numel(&io.out[o]->shape);
      for (int k = 0; k < io.nin && out->inplace_of < 0; k++) {
        const kl_value *in = io.in[k];
        const kl_location *li = &p->loc[in->id];
        if (li->kind != KL_LOC_ARENA || li->index >= lo->index || taken[li->index] ||
            pieces[li->index] ||
            (gr->count > 1 && window_buffer(p, &io, li->index)) ||
            kl_shape_numel(&in->shape) != numel ||
            kl_dtype_size(in->dtype) != kl_dtype_size(io.out[o]->dtype) || !out->bytes)
          continue;
        const kl_membuf *b = &p->bufs[li->index];
        if (b->last == s && b->first < s && out->first == s) {
          out->inplace_of = li->index;
          taken[li->index] = true;
        }
      }
    }
  }
  free(taken), free(pieces);
}

const kl_node *kl_plan_step_node(const kl_plan *p, int step) {
  const kl_group *gr = &p->fusion.groups[step];
  return p->fusion.nodes[gr->first + gr->count - 1];
}

/* The step that last reads state value v: its readers' steps, and through
 * nodes that read v in place (aliases, views), their readers'. */
static int last_read_step(const kl_plan *p, const kl_value *v, int depth) {
  int last = -1;
  for (int r = p->reader_at[v->id]; r < p->reader_at[v->id + 1]; r++) {
    const kl_node *n = p->readers[r];
    int s = p->fusion.group_of[n->id];
    if (s > last) last = s;
    if (depth < 16 && (p->alias[n->id] || p->loc[n->outputs[0]->id].kind == KL_LOC_VIEW)) {
      int t = last_read_step(p, n->outputs[0], depth + 1);
      if (t > last) last = t;
    }
  }
  return last;
}

/* A training step updates params in place: no step after the update may
 * read the old value.  Updates depend on every gradient through the
 * global norm, so this holds unless a model output reads a param itself
 * after the update was scheduled. */
static int check_updates(const kl_plan *p, kl_error *err) {
  const kl_graph *g = p->g;
  for (int i = 0; i < g->outputs.len; i++) {
    const kl_value *v = g->outputs.items[i];
    if (!v->updates) continue;
    int at = p->fusion.group_of[v->producer->id];
    if (last_read_step(p, v->updates, 0) > at)
      return kl_fail(err, (kl_loc){0}, "'%s' is read after the step that updates it in place; "
                     "read it before the update (an output of the forward pass)", v->updates->name);
  }
  return 0;
}

int kl_plan_memory(kl_plan *p, size_t limit, kl_error *err) {
  int nsteps = p->fusion.ngroups;
  p->scratch_at = calloc((size_t)nsteps + 2, sizeof *p->scratch_at);
  if (!p->scratch_at) abort();
  place_values(p);
  if (check_updates(p, err)) return -1;
  declare_uses(p);
  choose_in_place(p);
  kl_memplan(p->bufs, p->nbufs, &p->mem);
  char why[700];
  if (kl_memplan_check(p->bufs, p->nbufs, p->mem.arena, why, sizeof why))
    return kl_fail(err, (kl_loc){0}, "internal error: the memory plan is unsafe: %s", why);
  if (limit && p->mem.arena > limit) {
    const char **names = calloc((size_t)nsteps + 1, sizeof *names);
    if (!names) abort();
    for (int s = 0; s < nsteps; s++) names[s] = kl_plan_step_node(p, s)->name;
    over_limit(p->bufs, p->nbufs, names, nsteps, limit, &p->mem, err);
    free(names);
    return -1;
  }
  return 0;
}

void kl_plan_print_memory(FILE *f, const kl_plan *p) {
  fprintf(f, "  arena %zu bytes (lower bound %zu, naive sum %zu), weights %zu bytes\n",
          p->mem.arena, p->mem.lower_bound, p->mem.naive, p->param_bytes);
  for (int b = 0; b < p->nbufs; b++) {
    const kl_membuf *m = &p->bufs[b];
    fprintf(f, "  %s_%d at %zu: %s, %zu bytes, steps %d-%d", b < p->nvalue_bufs ? "ARENA" : "SCRATCH",
            b, m->offset, m->name, m->bytes, m->first, m->last);
    if (m->inplace_of >= 0) fprintf(f, ", in place of %s", p->bufs[m->inplace_of].name);
    fprintf(f, "\n");
  }
  for (int i = 0; i < p->g->nodes.len; i++) {
    const kl_node *n = p->order[i];
    if (!p->alias[n->id]) continue;
    if (n->op == KL_OP_CONCAT)
      fprintf(f, "  %s: no kernel, its %d inputs written in place\n", n->outputs[0]->name, n->ninputs);
    else
      fprintf(f, "  %s: no kernel, its input %s's buffer\n", n->outputs[0]->name, n->inputs[0]->name);
  }
}
