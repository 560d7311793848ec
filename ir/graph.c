/* graph.c - building graphs: values, nodes, attributes, outputs. */
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

#define VEC_PUSH(v, x)                                                         \
  do {                                                                         \
    if ((v).len == (v).cap) {                                                  \
      (v).cap = (v).cap ? 2 * (v).cap : 16;                                    \
      void *grown = realloc((v).items, (size_t)(v).cap * sizeof *(v).items);   \
      if (!grown) abort(); /* out of memory is not user input */               \
      (v).items = grown;                                                       \
    }                                                                          \
    (v).items[(v).len++] = (x);                                                \
  } while (0)

kl_graph *kl_graph_new(const char *name) {
  kl_graph *g = calloc(1, sizeof *g);
  if (!g) abort();
  g->name = kl_arena_strdup(&g->arena, name ? name : "model");
  return g;
}

void kl_graph_free(kl_graph *g) {
  if (!g) return;
  free(g->values.items);
  free(g->nodes.items);
  free(g->inputs.items);
  free(g->params.items);
  free(g->outputs.items);
  free(g->value_names.slots);
  free(g->node_names.slots);
  kl_graph_unmap(g); /* params' data may point into these */
  kl_arena_free(&g->arena);
  free(g);
}

/* ---- name index ------------------------------------------------------ */
static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

typedef const char *(*name_of_fn)(const void *item);
static const char *value_name_of(const void *v) { return ((const kl_value *)v)->name; }
static const char *node_name_of(const void *n) { return ((const kl_node *)n)->name; }

static void index_put(kl_name_index *ix, void *item, name_of_fn name_of);

static void index_grow(kl_name_index *ix, name_of_fn name_of) {
  kl_name_index old = *ix;
  ix->cap = old.cap ? 2 * old.cap : 64;
  ix->used = 0;
  ix->slots = calloc((size_t)ix->cap, sizeof *ix->slots);
  if (!ix->slots) abort();
  for (int i = 0; i < old.cap; i++)
    if (old.slots[i]) index_put(ix, old.slots[i], name_of);
  free(old.slots);
}

static void index_put(kl_name_index *ix, void *item, name_of_fn name_of) {
  if (2 * (ix->used + 1) > ix->cap) index_grow(ix, name_of);
  size_t mask = (size_t)ix->cap - 1, i = (size_t)hash_name(name_of(item)) & mask;
  while (ix->slots[i]) i = (i + 1) & mask;
  ix->slots[i] = item;
  ix->used++;
}

static void *index_get(const kl_name_index *ix, const char *name, name_of_fn name_of) {
  if (!ix->cap) return NULL;
  size_t mask = (size_t)ix->cap - 1, i = (size_t)hash_name(name) & mask;
  for (; ix->slots[i]; i = (i + 1) & mask)
    if (strcmp(name_of(ix->slots[i]), name) == 0) return ix->slots[i];
  return NULL;
}

static kl_value *new_value(kl_graph *g, const char *name, kl_dtype t,
                           const kl_shape *s, kl_value_kind kind, kl_loc loc) {
  kl_value *v = kl_arena_alloc(&g->arena, sizeof *v);
  v->name = kl_arena_strdup(&g->arena, name);
  v->dtype = t;
  if (s) v->shape = *s;
  v->kind = kind;
  v->loc = loc;
  v->id = g->values.len;
  VEC_PUSH(g->values, v);
  index_put(&g->value_names, v, value_name_of);
  return v;
}

kl_value *kl_graph_add_input(kl_graph *g, const char *name, kl_dtype t,
                             const kl_shape *s, kl_loc loc) {
  kl_value *v = new_value(g, name, t, s, KL_VAL_INPUT, loc);
  VEC_PUSH(g->inputs, v);
  return v;
}

kl_value *kl_graph_add_param(kl_graph *g, const char *name, kl_dtype t,
                             const kl_shape *s, kl_value_kind kind,
                             kl_init init, kl_loc loc) {
  kl_value *v = new_value(g, name, t, s, kind, loc);
  if (init.path) init.path = kl_arena_strdup(&g->arena, init.path);
  if (init.key) init.key = kl_arena_strdup(&g->arena, init.key);
  v->init = init;
  VEC_PUSH(g->params, v);
  return v;
}

kl_value *kl_graph_add_const_data(kl_graph *g, const char *name, kl_dtype t,
                                  const kl_shape *s, const void *data,
                                  kl_loc loc) {
  kl_value *v = kl_graph_add_param(g, name, t, s, KL_VAL_CONST,
                                   (kl_init){.kind = KL_INIT_DATA}, loc);
  size_t bytes = (size_t)kl_shape_numel(s) * kl_dtype_size(t);
  v->data = kl_arena_alloc(&g->arena, bytes ? bytes : 1);
  if (bytes) memcpy(v->data, data, bytes);
  return v;
}

int kl_graph_mark_output(kl_graph *g, kl_value *v, kl_error *err) {
  if (v->is_output)
    return kl_fail(err, v->loc, "'%s' is already an output", v->name);
  v->is_output = true;
  VEC_PUSH(g->outputs, v);
  return 0;
}

kl_value *kl_graph_find_value(const kl_graph *g, const char *name) {
  return index_get(&g->value_names, name, value_name_of);
}

kl_node *kl_graph_find_node(const kl_graph *g, const char *name) {
  return index_get(&g->node_names, name, node_name_of);
}

void kl_graph_rename_value(kl_graph *g, kl_value *v, const char *name) {
  v->name = kl_arena_strdup(&g->arena, name);
  index_put(&g->value_names, v, value_name_of);
}

void kl_graph_rename_node(kl_graph *g, kl_node *n, const char *name) {
  n->name = kl_arena_strdup(&g->arena, name);
  index_put(&g->node_names, n, node_name_of);
}

int kl_graph_drop_unread_params(kl_graph *g) {
  bool *read = calloc((size_t)g->values.len + 1, 1);
  if (!read) abort();
  for (int i = 0; i < g->nodes.len; i++)
    for (int k = 0; k < g->nodes.items[i]->ninputs; k++) read[g->nodes.items[i]->inputs[k]->id] = true;
  int kept = 0, dropped = 0;
  for (int i = 0; i < g->params.len; i++) {
    kl_value *v = g->params.items[i];
    if (read[v->id] || v->is_output) g->params.items[kept++] = v;
    else v->id = -1, dropped++;
  }
  g->params.len = kept;
  if (dropped) {
    kept = 0;
    for (int i = 0; i < g->values.len; i++)
      if (g->values.items[i]->id >= 0) (g->values.items[kept] = g->values.items[i])->id = kept, kept++;
    g->values.len = kept;
    free(g->value_names.slots); /* the names of what is left, anew */
    g->value_names = (kl_name_index){0};
    for (int i = 0; i < g->values.len; i++) index_put(&g->value_names, g->values.items[i], value_name_of);
  }
  free(read);
  return dropped;
}

static bool name_taken(const kl_graph *g, const char *name) {
  return kl_graph_find_value(g, name) || kl_graph_find_node(g, name);
}

static bool value_taken(const kl_graph *g, const char *name) {
  return kl_graph_find_value(g, name) != NULL;
}

/* A name not taken (kind 0: by a value or a node; 1: by a value), from
 * base: base itself, else base_K for the first free K, probing from where
 * the previous call for the same base stopped. */
static const char *fresh(kl_graph *g, const char *base, int kind) {
  bool (*taken)(const kl_graph *, const char *) = kind ? value_taken : name_taken;
  if (!taken(g, base)) return kl_arena_strdup(&g->arena, base);
  char buf[256];
  bool same = g->fresh_base[kind] && !strcmp(g->fresh_base[kind], base);
  for (int i = same ? g->fresh_next[kind] : 1;; i++) {
    snprintf(buf, sizeof buf, "%.200s_%d", base, i);
    if (taken(g, buf)) continue;
    if (!same) g->fresh_base[kind] = kl_arena_strdup(&g->arena, base);
    g->fresh_next[kind] = i + 1;
    return kl_arena_strdup(&g->arena, buf);
  }
}

const char *kl_graph_fresh_value_name(kl_graph *g, const char *base) { return fresh(g, base, 1); }

const char *kl_graph_fresh_name(kl_graph *g, const char *base) { return fresh(g, base, 0); }

/* ---- attributes ------------------------------------------------------ */
static const char *const attr_kind_names[] = {"int",    "float",  "ints",
                                              "floats", "string", "dtype"};

/* Find `name` in an op's "a:kind b:kind" spec; returns the kind or -1. */
static int spec_kind(const char *spec, const char *name) {
  size_t nlen = strlen(name);
  for (const char *p = spec; *p;) {
    while (*p == ' ') p++;
    const char *colon = strchr(p, ':');
    if (!colon) break;
    const char *end = colon + 1;
    while (*end && *end != ' ') end++;
    if ((size_t)(colon - p) == nlen && strncmp(p, name, nlen) == 0) {
      for (int k = 0; k < 6; k++)
        if (strlen(attr_kind_names[k]) == (size_t)(end - colon - 1) &&
            strncmp(colon + 1, attr_kind_names[k], (size_t)(end - colon - 1)) == 0)
          return k;
    }
    p = end;
  }
  return -1;
}

/* Check an attribute against the op's spec, converting the kinds a user
 * can't tell apart in the text (an int written where a float goes, a single
 * number where a list goes). */
static int check_attr(kl_graph *g, kl_op op, kl_attr *a, kl_loc loc,
                      kl_error *err) {
  int want = spec_kind(kl_ops[op].attrs, a->name);
  if (want < 0)
    return kl_fail(err, loc, "%s: unknown attribute '%s' (accepted: %s)",
                   kl_ops[op].name, a->name,
                   kl_ops[op].attrs[0] ? kl_ops[op].attrs : "none");
  if ((int)a->kind == want) return 0;
  if (want == KL_ATTR_FLOAT && a->kind == KL_ATTR_INT) {
    a->kind = KL_ATTR_FLOAT;
    a->f = (double)a->i;
    return 0;
  }
  if (want == KL_ATTR_INTS && a->kind == KL_ATTR_INT) {
    a->kind = KL_ATTR_INTS;
    a->ints = kl_arena_alloc(&g->arena, sizeof(int64_t));
    a->ints[0] = a->i;
    a->n = 1;
    return 0;
  }
  if (want == KL_ATTR_FLOATS &&
      (a->kind == KL_ATTR_INT || a->kind == KL_ATTR_FLOAT ||
       a->kind == KL_ATTR_INTS)) {
    int n = a->kind == KL_ATTR_INTS ? a->n : 1;
    double *f = kl_arena_alloc(&g->arena, (size_t)(n ? n : 1) * sizeof *f);
    for (int i = 0; i < n; i++)
      f[i] = a->kind == KL_ATTR_INTS ? (double)a->ints[i]
             : a->kind == KL_ATTR_INT ? (double)a->i
                                      : a->f;
    a->kind = KL_ATTR_FLOATS;
    a->floats = f;
    a->n = n;
    return 0;
  }
  if (want == KL_ATTR_INTS && a->kind == KL_ATTR_FLOATS && a->n == 0) {
    a->kind = KL_ATTR_INTS; /* an empty list has no element type */
    return 0;
  }
  return kl_fail(err, loc, "%s: attribute '%s' must be %s, not %s",
                 kl_ops[op].name, a->name, attr_kind_names[want],
                 attr_kind_names[a->kind]);
}

static void copy_attr(kl_graph *g, kl_attr *dst, const kl_attr *src) {
  *dst = *src;
  dst->name = kl_arena_strdup(&g->arena, src->name);
  if (src->s) dst->s = kl_arena_strdup(&g->arena, src->s);
  if (src->kind == KL_ATTR_INTS) {
    dst->ints = kl_arena_alloc(&g->arena, (size_t)(src->n + 1) * sizeof(int64_t));
    if (src->n) memcpy(dst->ints, src->ints, (size_t)src->n * sizeof(int64_t));
  }
  if (src->kind == KL_ATTR_FLOATS) {
    dst->floats = kl_arena_alloc(&g->arena, (size_t)(src->n + 1) * sizeof(double));
    if (src->n) memcpy(dst->floats, src->floats, (size_t)src->n * sizeof(double));
  }
}

const kl_attr *kl_node_attr(const kl_node *n, const char *name) {
  for (int i = 0; i < n->nattrs; i++)
    if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
  return NULL;
}

int64_t kl_attr_int(const kl_node *n, const char *name, int64_t dflt) {
  const kl_attr *a = kl_node_attr(n, name);
  return a && (a->kind == KL_ATTR_INT || a->kind == KL_ATTR_DTYPE) ? a->i : dflt;
}

double kl_attr_float(const kl_node *n, const char *name, double dflt) {
  const kl_attr *a = kl_node_attr(n, name);
  if (!a) return dflt;
  return a->kind == KL_ATTR_FLOAT ? a->f : a->kind == KL_ATTR_INT ? (double)a->i : dflt;
}

const char *kl_attr_string(const kl_node *n, const char *name,
                           const char *dflt) {
  const kl_attr *a = kl_node_attr(n, name);
  return a && a->kind == KL_ATTR_STRING ? a->s : dflt;
}

int kl_attr_ints(const kl_node *n, const char *name, const int64_t **out) {
  const kl_attr *a = kl_node_attr(n, name);
  if (!a || a->kind != KL_ATTR_INTS) return -1;
  *out = a->ints;
  return a->n;
}

void kl_set_output(kl_node *n, int k, kl_dtype t, const kl_shape *s) {
  n->outputs[k]->dtype = t;
  n->outputs[k]->shape = *s;
}

/* ---- nodes ----------------------------------------------------------- */
kl_node *kl_graph_add_node(kl_graph *g, kl_op op, const char *name,
                           kl_value **inputs, int ninputs,
                           const kl_attr *attrs, int nattrs,
                           const char **out_names, int nouts_named,
                           kl_loc loc, kl_error *err) {
  const kl_op_info *info = &kl_ops[op];
  if (ninputs < info->min_inputs ||
      (info->max_inputs >= 0 && ninputs > info->max_inputs)) {
    if (info->min_inputs == info->max_inputs)
      kl_fail(err, loc, "%s takes %d input%s, got %d", info->name,
              info->min_inputs, info->min_inputs == 1 ? "" : "s", ninputs);
    else if (info->max_inputs < 0)
      kl_fail(err, loc, "%s takes at least %d inputs, got %d", info->name,
              info->min_inputs, ninputs);
    else
      kl_fail(err, loc, "%s takes %d to %d inputs, got %d", info->name,
              info->min_inputs, info->max_inputs, ninputs);
    return NULL;
  }
  for (int i = 0; i < ninputs; i++)
    if (!inputs[i]) {
      kl_fail(err, loc, "%s: input %d is missing", info->name, i);
      return NULL;
    }
  kl_node *n = kl_arena_alloc(&g->arena, sizeof *n);
  n->op = op;
  n->loc = loc;
  n->graph = g;
  n->attrs = kl_arena_alloc(&g->arena, (size_t)(nattrs + 1) * sizeof *n->attrs);
  for (int i = 0; i < nattrs; i++) {
    for (int j = 0; j < i; j++)
      if (strcmp(attrs[i].name, attrs[j].name) == 0) {
        kl_fail(err, loc, "%s: attribute '%s' given twice", info->name,
                attrs[i].name);
        return NULL;
      }
    copy_attr(g, &n->attrs[i], &attrs[i]);
    if (check_attr(g, op, &n->attrs[i], loc, err)) return NULL;
  }
  n->nattrs = nattrs;

  int nout = info->noutputs;
  if (op == KL_OP_OPTIM_STEP) { /* one per tensor and state */
    if ((nout = kl_optim_step_noutputs(n)) < 1) {
      kl_fail(err, loc, "%s: attributes algo (sgd, adam, adamw) and count (1..4096) are required",
              info->name);
      return NULL;
    }
  } else if (op == KL_OP_ALL_REDUCE) { /* one sum per input */
    nout = ninputs;
  } else if (nout < 0) { /* split: one output per size */
    const int64_t *sizes;
    nout = kl_attr_ints(n, "sizes", &sizes);
    if (nout < 1) {
      kl_fail(err, loc, "%s: attribute 'sizes' (a non-empty list) is required",
              info->name);
      return NULL;
    }
  }
  if (nouts_named && nouts_named != nout) {
    kl_fail(err, loc, "%s gives %d output%s, but %d name%s bound", info->name,
            nout, nout == 1 ? "" : "s", nouts_named,
            nouts_named == 1 ? " is" : "s are");
    return NULL;
  }
  if (name) {
    n->name = kl_graph_fresh_name(g, name);
  } else { /* "<op>_<k>": never an op name or a keyword, so it parses back */
    char buf[64];
    do
      snprintf(buf, sizeof buf, "%s_%d", info->name, ++g->auto_names[op]);
    while (name_taken(g, buf));
    n->name = kl_arena_strdup(&g->arena, buf);
  }
  n->inputs = kl_arena_alloc(&g->arena, (size_t)(ninputs + 1) * sizeof *n->inputs);
  if (ninputs) memcpy(n->inputs, inputs, (size_t)ninputs * sizeof *inputs);
  n->ninputs = ninputs;
  n->outputs = kl_arena_alloc(&g->arena, (size_t)nout * sizeof *n->outputs);
  n->noutputs = nout;

  /* Outputs exist before inference so infer can fill them; on failure they
   * are dropped again. */
  int nvalues_before = g->values.len;
  for (int k = 0; k < nout; k++) {
    char buf[300];
    const char *vname;
    if (out_names && k < nouts_named && out_names[k])
      vname = out_names[k];
    else if (nout == 1)
      vname = kl_graph_fresh_name(g, n->name);
    else {
      snprintf(buf, sizeof buf, "%.250s_%d", n->name, k);
      vname = kl_graph_fresh_name(g, buf);
    }
    kl_value *v = new_value(g, vname, KL_F32, NULL, KL_VAL_NODE, loc);
    v->producer = n;
    v->producer_output = k;
    n->outputs[k] = v;
  }
  if (info->infer(n, err)) {
    g->values.len = nvalues_before;
    return NULL;
  }
  for (int k = 0; k < nout; k++) {
    const kl_shape *s = &n->outputs[k]->shape;
    int64_t numel = 1;
    for (int d = 0; d < s->rank; d++) {
      if (s->dims[d] < 0 || s->dims[d] > KL_MAX_NUMEL ||
          (s->dims[d] && numel > KL_MAX_NUMEL / s->dims[d])) {
        g->values.len = nvalues_before;
        kl_node_fail(n, err, "output shape is negative or too large");
        return NULL;
      }
      numel *= s->dims[d];
    }
  }
  n->id = g->nodes.len;
  VEC_PUSH(g->nodes, n);
  index_put(&g->node_names, n, node_name_of);
  return n;
}
