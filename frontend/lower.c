/* lower.c - grammar actions of the .kl language: names, literals, calls and
 * declarations turned into IR as the parser reduces them. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"

#define GROW(arr, n, cap)                                                      \
  do {                                                                         \
    if ((n) == (cap)) {                                                        \
      (cap) = (cap) ? 2 * (cap) : 8;                                           \
      void *grown_ = realloc((arr), (size_t)(cap) * sizeof *(arr));            \
      if (!grown_) abort();                                                    \
      (arr) = grown_;                                                          \
    }                                                                          \
  } while (0)

kl_loc kl_p_loc(kl_parser *P, int line, int col) {
  return (kl_loc){P->file, line, col};
}

void kl_parser_fail(kl_parser *P, int line, int col, const char *fmt, ...) {
  if (P->failed) return; /* keep the first error */
  P->failed = true;
  P->err->loc = kl_p_loc(P, line, col);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(P->err->msg, sizeof P->err->msg, fmt, ap);
  va_end(ap);
}

static int fail(kl_parser *P, kl_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(kl_parser *P, kl_loc loc, const char *fmt, ...) {
  char buf[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  kl_parser_fail(P, loc.line, loc.col, "%s", buf);
  return -1;
}

/* Errors from the IR (shape inference) already carry a location. */
static int fail_ir(kl_parser *P, const kl_error *e) {
  if (!P->failed) {
    P->failed = true;
    *P->err = *e;
  }
  return -1;
}

char *kl_parser_strdup(kl_parser *P, const char *s) {
  return kl_arena_strdup(&P->tmp, s);
}

char *kl_parser_unescape(kl_parser *P, const char *s, int len) {
  char *out = kl_arena_alloc(&P->tmp, (size_t)len + 1), *o = out;
  for (int i = 0; i < len; i++) {
    if (s[i] != '\\') { *o++ = s[i]; continue; }
    switch (s[++i]) {
    case 'n': *o++ = '\n'; break;
    case 't': *o++ = '\t'; break;
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    default: return NULL;
    }
  }
  *o = 0;
  return out;
}

bool kl_is_keyword(const char *s) {
  static const char *const words[] = {"model", "dim", "input", "param", "const",
                                      "let", "output", "train", "true", "false",
                                      "inf", "nan"};
  kl_dtype t;
  for (size_t i = 0; i < sizeof words / sizeof *words; i++)
    if (strcmp(words[i], s) == 0) return true;
  return kl_dtype_from_name(s, &t) == 0;
}

/* ---- symbols ---------------------------------------------------------
 * Names are unique (define refuses a second one), and found through a hash
 * index, so that a model of many thousands of statements parses in linear
 * time. */
static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void index_symbol(kl_parser *P, int i) {
  size_t mask = (size_t)P->capslots - 1, k = (size_t)hash_name(P->syms[i].name) & mask;
  while (P->sym_slots[k]) k = (k + 1) & mask;
  P->sym_slots[k] = i + 1;
}

/* Room for one more symbol: the index at most half full. */
static void reserve_symbol(kl_parser *P) {
  if (2 * (P->nsyms + 1) <= P->capslots) return;
  free(P->sym_slots);
  P->capslots = P->capslots ? 2 * P->capslots : 64;
  if (!(P->sym_slots = calloc((size_t)P->capslots, sizeof *P->sym_slots))) abort();
  for (int i = 0; i < P->nsyms; i++) index_symbol(P, i);
}

static kl_symbol *lookup(kl_parser *P, const char *name) {
  if (!P->capslots) return NULL;
  size_t mask = (size_t)P->capslots - 1, k = (size_t)hash_name(name) & mask;
  for (; P->sym_slots[k]; k = (k + 1) & mask)
    if (strcmp(P->syms[P->sym_slots[k] - 1].name, name) == 0) return &P->syms[P->sym_slots[k] - 1];
  return NULL;
}

/* The last symbol defined names v (NULL: a number or a dim). */
static void set_symbol_value(kl_parser *P, kl_value *v) {
  P->syms[P->nsyms - 1].v = v;
  if (!v) return;
  while (v->id >= P->capbound) {
    int cap = P->capbound ? 2 * P->capbound : 64;
    bool *grown = realloc(P->bound, (size_t)cap * sizeof *grown);
    if (!grown) abort();
    memset(grown + P->capbound, 0, (size_t)(cap - P->capbound) * sizeof *grown);
    P->bound = grown, P->capbound = cap;
  }
  P->bound[v->id] = true;
}

static bool is_bound(const kl_parser *P, const kl_value *v) {
  return v->id < P->capbound && P->bound[v->id];
}

static int define(kl_parser *P, const char *name, kl_loc loc, kl_symbol s) {
  kl_symbol *old = lookup(P, name);
  if (old) {
    kl_loc at = old->v ? old->v->loc : (kl_loc){0};
    if (at.line)
      return fail(P, loc, "'%s' is already defined (at line %d)", name, at.line);
    return fail(P, loc, "'%s' is already defined", name);
  }
  kl_op op;
  if (kl_op_lookup(name, &op) == 0)
    return fail(P, loc, "'%s' is an op name and cannot name a value", name);
  GROW(P->syms, P->nsyms, P->capsyms);
  reserve_symbol(P);
  s.name = kl_parser_strdup(P, name);
  P->syms[P->nsyms++] = s;
  index_symbol(P, P->nsyms - 1);
  set_symbol_value(P, s.v);
  return 0;
}

/* Give the value a user's name.  A generated value that happens to hold the
 * name already is renamed out of the way (users' names win). */
static void claim_name(kl_parser *P, kl_value *v, const char *name) {
  kl_value *holder = kl_graph_find_value(P->g, name);
  if (holder == v) return;
  if (holder) kl_graph_rename_value(P->g, holder, kl_graph_fresh_name(P->g, name));
  kl_graph_rename_value(P->g, v, name);
}

/* ---- declarations ---------------------------------------------------- */
int kl_p_model(kl_parser *P, const char *name, kl_loc loc) {
  if (P->seen_model) return fail(P, loc, "the model is already named");
  P->seen_model = true;
  P->g->name = kl_arena_strdup(&P->g->arena, name);
  return 0;
}

int kl_p_dim(kl_parser *P, const char *name, int64_t value, kl_loc loc) {
  for (int i = 0; P->opt && i < P->opt->ndims; i++)
    if (strcmp(P->opt->dims[i].name, name) == 0) value = P->opt->dims[i].value;
  if (value < 0) return fail(P, loc, "dim '%s' must not be negative", name);
  return define(P, name, loc, (kl_symbol){.lit = (double)value, .is_dim = true});
}

int kl_p_dim_value(kl_parser *P, const char *name, kl_loc loc, int64_t *out) {
  kl_symbol *s = lookup(P, name);
  if (!s || !s->is_dim)
    return fail(P, loc, "'%s' is not a dim (declare it with `dim %s = N`)", name, name);
  *out = (int64_t)s->lit;
  return 0;
}

void kl_p_shape_begin(kl_parser *P, int64_t dtype) {
  P->shape.rank = 0;
  P->decl_dtype = (kl_dtype)dtype;
}

int kl_p_shape_push(kl_parser *P, int64_t dim, kl_loc loc) {
  if (P->shape.rank == KL_MAX_RANK)
    return fail(P, loc, "rank is limited to %d dimensions", KL_MAX_RANK);
  if (dim < 0) return fail(P, loc, "dimension %lld is negative", (long long)dim);
  int64_t numel = kl_shape_numel(&P->shape);
  if (dim && numel > KL_MAX_NUMEL / dim)
    return fail(P, loc, "tensor has more than %lld elements", (long long)KL_MAX_NUMEL);
  P->shape.dims[P->shape.rank++] = dim;
  return 0;
}

int kl_p_input(kl_parser *P, const char *name, kl_loc loc) {
  kl_dtype t = P->decl_dtype;
  if (define(P, name, loc, (kl_symbol){0})) return -1;
  set_symbol_value(P, kl_graph_add_input(P->g, name, t, &P->shape, loc));
  return 0;
}

static kl_frame *top(kl_parser *P) { return &P->frames[P->nframes - 1]; }

static void frame_pop(kl_parser *P) {
  kl_frame *f = top(P);
  free(f->pos); free(f->posattr); free(f->kw); free(f->kwloc);
  P->nframes--;
}

void kl_p_frame_begin(kl_parser *P) {
  GROW(P->frames, P->nframes, P->capframes);
  P->frames[P->nframes++] = (kl_frame){0};
}

void kl_p_arg_pos(kl_parser *P, const kl_expr *e) {
  kl_frame *f = top(P);
  GROW(f->pos, f->npos, f->cappos);
  f->pos[f->npos++] = *e;
}

void kl_p_arg_posattr(kl_parser *P, const kl_attr *a) {
  kl_frame *f = top(P);
  GROW(f->posattr, f->nposattr, f->capposattr);
  f->posattr[f->nposattr++] = *a;
}

int kl_p_arg_kw(kl_parser *P, const char *name, const kl_attr *a, kl_loc loc) {
  kl_frame *f = top(P);
  for (int i = 0; i < f->nkw; i++)
    if (strcmp(f->kw[i].name, name) == 0)
      return fail(P, loc, "keyword '%s' given twice", name);
  int cap = f->capkw;
  GROW(f->kw, f->nkw, f->capkw);
  if (cap != f->capkw) {
    kl_loc *grown = realloc(f->kwloc, (size_t)f->capkw * sizeof *grown);
    if (!grown) abort();
    f->kwloc = grown;
  }
  f->kw[f->nkw] = *a;
  f->kw[f->nkw].name = name;
  f->kwloc[f->nkw++] = loc;
  return 0;
}

static bool attr_number(const kl_attr *a, double *out) {
  if (a->kind == KL_ATTR_INT) { *out = (double)a->i; return true; }
  if (a->kind == KL_ATTR_FLOAT) { *out = a->f; return true; }
  return false;
}

int kl_p_init(kl_parser *P, const char *name, kl_loc loc) {
  kl_frame *f = top(P);
  kl_init in = {0};
  int rc = 0;
  double nums[2] = {0, 0};
  int nnum = 0;
  for (int i = 0; i < f->nposattr; i++) {
    if (nnum == 2 || (!attr_number(&f->posattr[i], &nums[nnum]) &&
                      strcmp(name, "load") && strcmp(name, "values"))) {
      rc = fail(P, loc, "too many or non-numeric arguments to initialiser '%s'", name);
      goto out;
    }
    nnum++;
  }
  struct { const char *name; kl_init_kind kind; int min, max; const char *kw; } table[] = {
      {"zeros", KL_INIT_ZEROS, 0, 0, ""},
      {"ones", KL_INIT_ONES, 0, 0, ""},
      {"full", KL_INIT_FULL, 1, 1, ""},
      {"randn", KL_INIT_RANDN, 1, 1, "mean seed"},
      {"uniform", KL_INIT_UNIFORM, 2, 2, "seed"},
      {"load", KL_INIT_LOAD, 1, 1, "key"},
      {"values", KL_INIT_DATA, 1, 1, ""},
  };
  int row = -1;
  for (int i = 0; i < (int)(sizeof table / sizeof *table); i++)
    if (strcmp(table[i].name, name) == 0) row = i;
  if (row < 0) {
    rc = fail(P, loc, "unknown initialiser '%s' (expected zeros, ones, full, randn, "
                      "uniform, load or values)", name);
    goto out;
  }
  if (f->nposattr < table[row].min || f->nposattr > table[row].max) {
    rc = fail(P, loc, "%s takes %d positional argument%s, got %d", name,
              table[row].min, table[row].min == 1 ? "" : "s", f->nposattr);
    goto out;
  }
  in.kind = table[row].kind;
  for (int i = 0; i < f->nkw; i++) {
    const kl_attr *a = &f->kw[i];
    double num;
    if (!strstr(table[row].kw, a->name) || !*a->name) {
      rc = fail(P, f->kwloc[i], "%s has no keyword '%s'", name, a->name);
      goto out;
    }
    if (strcmp(a->name, "key") == 0) {
      if (a->kind != KL_ATTR_STRING) { rc = fail(P, f->kwloc[i], "key must be a string"); goto out; }
      in.key = a->s;
    } else if (!attr_number(a, &num)) {
      rc = fail(P, f->kwloc[i], "%s must be a number", a->name);
      goto out;
    } else if (strcmp(a->name, "seed") == 0) {
      if (a->kind != KL_ATTR_INT || a->i < 0) { rc = fail(P, f->kwloc[i], "seed must be a non-negative integer"); goto out; }
      in.seed = (uint64_t)a->i;
    } else {
      in.b = num; /* mean */
    }
  }
  if (in.kind == KL_INIT_LOAD) {
    if (f->posattr[0].kind != KL_ATTR_STRING) { rc = fail(P, loc, "load takes a file name string"); goto out; }
    if (P->opt && P->opt->no_load) { rc = fail(P, loc, "load() is disabled here"); goto out; }
    in.path = f->posattr[0].s;
  } else if (in.kind == KL_INIT_DATA) {
    const kl_attr *a = &f->posattr[0];
    if (a->kind != KL_ATTR_INTS && a->kind != KL_ATTR_FLOATS) { rc = fail(P, loc, "values takes a list of numbers"); goto out; }
    P->pending_values = *a; /* checked against the shape by kl_p_param */
  } else {
    in.a = nums[0];
    if (in.kind == KL_INIT_UNIFORM) in.b = nums[1];
    if (in.kind == KL_INIT_RANDN && !(in.a >= 0))
      rc = fail(P, loc, "randn's standard deviation must be >= 0");
  }
out:
  P->pending_init = in;
  frame_pop(P);
  return rc;
}

int kl_p_param(kl_parser *P, kl_value_kind kind, const char *name, kl_loc loc) {
  kl_dtype t = P->decl_dtype;
  kl_init in = P->pending_init;
  if (define(P, name, loc, (kl_symbol){0})) return -1;
  if (in.kind == KL_INIT_DATA) {
    const kl_attr *list = &P->pending_values;
    int64_t numel = kl_shape_numel(&P->shape);
    if (list->n != numel && list->n != 1)
      return fail(P, loc, "values has %d numbers but '%s' has %lld elements", list->n,
                  name, (long long)numel);
    kl_tensor *tmp = kl_tensor_new(t, &P->shape);
    for (int64_t i = 0; i < numel; i++) {
      int64_t j = list->n == 1 ? 0 : i;
      tmp->data[i] = list->kind == KL_ATTR_INTS ? (double)list->ints[j] : list->floats[j];
    }
    size_t bytes = (size_t)numel * kl_dtype_size(t);
    void *raw = malloc(bytes ? bytes : 1);
    if (!raw) abort();
    kl_tensor_to_raw(tmp, raw);
    kl_value *v = kl_graph_add_const_data(P->g, name, t, &P->shape, raw, loc);
    v->kind = kind;
    free(raw);
    kl_tensor_free(tmp);
    set_symbol_value(P, v);
    return 0;
  }
  set_symbol_value(P, kl_graph_add_param(P->g, name, t, &P->shape, kind, in, loc));
  return 0;
}

/* ---- expressions ----------------------------------------------------- */
void kl_p_number(kl_parser *P, double v, kl_loc loc, kl_expr *out) {
  (void)P;
  *out = (kl_expr){.lit = v, .is_lit = true, .loc = loc};
}

int kl_p_ident(kl_parser *P, const char *name, kl_loc loc, kl_expr *out) {
  kl_symbol *s = lookup(P, name);
  if (!s) {
    kl_op op;
    if (kl_op_lookup(name, &op) == 0)
      return fail(P, loc, "'%s' is an op: call it as %s(...)", name, name);
    return fail(P, loc, "unknown name '%s'", name);
  }
  if (s->v) *out = (kl_expr){.v = s->v, .loc = loc};
  else *out = (kl_expr){.lit = s->lit, .is_lit = true, .loc = loc};
  return 0;
}

/* A literal becomes a scalar constant node of the dtype it meets. */
static int literal_value(kl_parser *P, const kl_expr *e, kl_dtype t, kl_value **out) {
  kl_error err;
  double v = e->lit;
  kl_attr attrs[3] = {
      {.name = "value", .kind = KL_ATTR_FLOATS, .floats = &v, .n = 1},
      {.name = "dtype", .kind = KL_ATTR_DTYPE, .i = t},
      {.name = "shape", .kind = KL_ATTR_INTS, .ints = NULL, .n = 0},
  };
  kl_node *n = kl_graph_add_node(P->g, KL_OP_CONSTANT, NULL, NULL, 0, attrs, 3,
                                 NULL, 0, e->loc, &err);
  if (!n) return fail_ir(P, &err);
  *out = n->outputs[0];
  return 0;
}

static int single_value(kl_parser *P, const kl_expr *e, kl_value **out) {
  if (e->multi)
    return fail(P, e->loc, "%s gives %d outputs: bind them with `let a, b, ... = %s(...)`",
                kl_ops[e->multi->op].name, e->multi->noutputs, kl_ops[e->multi->op].name);
  *out = e->v;
  return 0;
}

/* Inputs of a call: literals take the dtype of the first tensor argument
 * (f32 when there is none), except a bool condition's neighbours. */
static int resolve_inputs(kl_parser *P, kl_op op, const kl_expr *args, int n,
                          kl_value **vals) {
  kl_dtype t = KL_F32;
  bool found = false;
  int first = op == KL_OP_WHERE ? 1 : 0;
  for (int i = first; i < n && !found; i++)
    if (!args[i].is_lit) {
      if (single_value(P, &args[i], &vals[i])) return -1;
      t = vals[i]->dtype;
      found = true;
    }
  for (int i = 0; i < n; i++) {
    if (args[i].is_lit) {
      kl_dtype lt = (op == KL_OP_WHERE && i == 0) ? KL_BOOL : t;
      if (literal_value(P, &args[i], lt, &vals[i])) return -1;
    } else if (single_value(P, &args[i], &vals[i])) {
      return -1;
    }
  }
  return 0;
}

static int make_node(kl_parser *P, kl_op op, const kl_expr *args, int nargs,
                     const kl_attr *attrs, int nattrs, kl_loc loc, kl_expr *out) {
  kl_value *vals[64];
  if (nargs > 64) return fail(P, loc, "too many arguments (at most 64)");
  if (resolve_inputs(P, op, args, nargs, vals)) return -1;
  kl_error err;
  kl_node *n = kl_graph_add_node(P->g, op, NULL, vals, nargs, attrs, nattrs, NULL, 0,
                                 loc, &err);
  if (!n) return fail_ir(P, &err);
  *out = (kl_expr){.loc = loc};
  if (n->noutputs == 1) out->v = n->outputs[0];
  else out->multi = n;
  return 0;
}

static double fold(kl_op op, double a, double b) {
  switch (op) {
  case KL_OP_ADD: return a + b;
  case KL_OP_SUB: return a - b;
  case KL_OP_MUL: return a * b;
  case KL_OP_DIV: return a / b;
  case KL_OP_EQ: return a == b;
  case KL_OP_NE: return a != b;
  case KL_OP_LT: return a < b;
  case KL_OP_LE: return a <= b;
  case KL_OP_GT: return a > b;
  case KL_OP_GE: return a >= b;
  default: return NAN;
  }
}

int kl_p_binary(kl_parser *P, kl_op op, const kl_expr *a, const kl_expr *b,
                kl_loc loc, kl_expr *out) {
  if (a->is_lit && b->is_lit && op != KL_OP_MATMUL) {
    *out = (kl_expr){.lit = fold(op, a->lit, b->lit), .is_lit = true, .loc = loc};
    return 0;
  }
  kl_expr args[2] = {*a, *b};
  return make_node(P, op, args, 2, NULL, 0, loc, out);
}

int kl_p_neg(kl_parser *P, const kl_expr *a, kl_loc loc, kl_expr *out) {
  if (a->is_lit) {
    *out = (kl_expr){.lit = -a->lit, .is_lit = true, .loc = loc};
    return 0;
  }
  return make_node(P, KL_OP_NEG, a, 1, NULL, 0, loc, out);
}

void kl_p_ident_attr(kl_parser *P, const char *name, kl_attr *out) {
  kl_symbol *s = lookup(P, name);
  if (s && s->is_dim) *out = (kl_attr){.kind = KL_ATTR_INT, .i = (int64_t)s->lit};
  else *out = (kl_attr){.kind = KL_ATTR_STRING, .s = name};
}

int kl_p_call(kl_parser *P, const char *name, kl_loc loc, kl_expr *out) {
  kl_frame *f = top(P);
  kl_op op;
  int rc;
  if (kl_op_lookup(name, &op) != 0) {
    kl_symbol *s = lookup(P, name);
    rc = s ? fail(P, loc, "'%s' is a value, not an op", name)
           : fail(P, loc, "unknown op '%s'", name);
  } else {
    rc = make_node(P, op, f->pos, f->npos, f->kw, f->nkw, loc, out);
  }
  frame_pop(P);
  return rc;
}

void kl_p_list_begin(kl_parser *P) {
  P->nlist = 0;
  P->list_float = false;
}

void kl_p_list_push(kl_parser *P, double v, bool is_float) {
  GROW(P->list, P->nlist, P->caplist);
  P->list[P->nlist++] = v;
  P->list_float |= is_float;
}

void kl_p_list_end(kl_parser *P, kl_attr *out) {
  int n = P->nlist;
  *out = (kl_attr){.kind = P->list_float ? KL_ATTR_FLOATS : KL_ATTR_INTS, .n = n};
  if (P->list_float) {
    out->floats = kl_arena_alloc(&P->tmp, (size_t)(n + 1) * sizeof(double));
    for (int i = 0; i < n; i++) out->floats[i] = P->list[i];
  } else {
    out->ints = kl_arena_alloc(&P->tmp, (size_t)(n + 1) * sizeof(int64_t));
    for (int i = 0; i < n; i++) out->ints[i] = (int64_t)P->list[i];
  }
}

/* ---- statements ------------------------------------------------------ */
void kl_p_names_reset(kl_parser *P) { P->nnames = 0; }

void kl_p_names_push(kl_parser *P, const char *name, kl_loc loc) {
  int cap = P->capnames;
  GROW(P->names, P->nnames, P->capnames);
  if (cap != P->capnames) {
    kl_loc *grown = realloc(P->name_locs, (size_t)P->capnames * sizeof *grown);
    if (!grown) abort();
    P->name_locs = grown;
  }
  P->name_locs[P->nnames] = loc;
  P->names[P->nnames++] = name;
}

/* Bind one name to a value: a value made by this statement takes the name;
 * an existing one (let y = x) is only aliased. */
static int bind(kl_parser *P, const char *name, kl_loc loc, kl_value *v, bool fresh) {
  if (define(P, name, loc, (kl_symbol){.v = v})) return -1;
  if (fresh) {
    claim_name(P, v, name);
    if (v->producer && v->producer->noutputs == 1) {
      kl_node *holder = kl_graph_find_node(P->g, name);
      if (!holder) kl_graph_rename_node(P->g, v->producer, name);
    }
  }
  return 0;
}

static bool made_here(kl_parser *P, const kl_value *v) {
  return v->kind == KL_VAL_NODE && v->producer &&
         v->producer == P->g->nodes.items[P->g->nodes.len - 1] &&
         !lookup(P, v->name);
}

int kl_p_let(kl_parser *P, const kl_expr *e) {
  if (P->nnames == 1) {
    if (e->is_lit) return define(P, P->names[0], P->name_locs[0], (kl_symbol){.lit = e->lit});
    kl_value *v = NULL;
    if (single_value(P, e, &v)) return -1;
    bool fresh = made_here(P, v) && !is_bound(P, v);
    return bind(P, P->names[0], P->name_locs[0], v, fresh);
  }
  if (!e->multi)
    return fail(P, P->name_locs[0], "%d names are bound, but the value is a single tensor",
                P->nnames);
  if (e->multi->noutputs != P->nnames)
    return fail(P, P->name_locs[0], "%s gives %d outputs, but %d names are bound",
                kl_ops[e->multi->op].name, e->multi->noutputs, P->nnames);
  for (int i = 0; i < P->nnames; i++)
    if (bind(P, P->names[i], P->name_locs[i], e->multi->outputs[i], true)) return -1;
  return 0;
}

int kl_p_output_name(kl_parser *P, const char *name, kl_loc loc) {
  kl_symbol *s = lookup(P, name);
  if (!s) return fail(P, loc, "unknown name '%s'", name);
  if (!s->v) return fail(P, loc, "'%s' is a number, not a tensor", name);
  kl_error err;
  if (kl_graph_mark_output(P->g, s->v, &err)) return fail(P, loc, "%s", err.msg);
  return 0;
}

int kl_p_output_expr(kl_parser *P, const char *name, kl_loc loc, const kl_expr *e) {
  kl_p_names_reset(P);
  kl_p_names_push(P, name, loc);
  if (e->is_lit) return fail(P, loc, "an output must be a tensor, not a number");
  if (kl_p_let(P, e)) return -1;
  return kl_p_output_name(P, name, loc);
}

static kl_train *train_of(kl_parser *P) {
  if (!P->g->train) P->g->train = kl_arena_alloc(&P->g->arena, sizeof(kl_train));
  return P->g->train;
}

int kl_p_loss(kl_parser *P, const kl_expr *e, kl_loc loc) {
  kl_train *t = train_of(P);
  if (t->loss) return fail(P, loc, "the loss is already given");
  kl_value *v = NULL;
  if (e->is_lit) return fail(P, loc, "the loss must be a tensor, not a number");
  if (single_value(P, e, &v)) return -1;
  if (kl_shape_numel(&v->shape) != 1 || !kl_dtype_is_float(v->dtype)) {
    char buf[128];
    return fail(P, loc, "the loss must be a float scalar, got %s%s", kl_dtype_name(v->dtype),
                kl_shape_str(&v->shape, buf, sizeof buf));
  }
  if (made_here(P, v) && !lookup(P, "loss")) claim_name(P, v, "loss");
  t->loss = v->name;
  t->loc = loc;
  return 0;
}

/* ---- the train block's settings (docs/DSL.md, "Training") -------------
 * Each optimizer and schedule is a row: the keywords it accepts, the
 * values each takes, and the one it cannot do without.  Only the keywords
 * given are stored; the training compile supplies the documented
 * defaults. */
typedef enum {
  RANGE_POSITIVE, /* finite, > 0 */
  RANGE_NONNEG,   /* finite, >= 0 */
  RANGE_UNIT,     /* [0, 1) */
  RANGE_FRACTION, /* (0, 1] */
  RANGE_FLAG,     /* 0 or 1 */
  RANGE_COUNT,    /* an integer >= 1 */
  RANGE_COUNT0,   /* an integer >= 0 */
} setting_range;

typedef struct {
  const char *name;
  setting_range range;
} setting;

typedef struct {
  const char *name;
  const char *required; /* NULL: none */
  const char *example;  /* a call that names the required keyword */
  setting settings[6];  /* ends at a NULL name */
} train_rule;

static const train_rule optimizers[] = {
    {"sgd", "lr", "sgd(lr=0.01)",
     {{"lr", RANGE_POSITIVE}, {"momentum", RANGE_UNIT}, {"nesterov", RANGE_FLAG},
      {"weight_decay", RANGE_NONNEG}}},
    {"adam", "lr", "adam(lr=1e-3)",
     {{"lr", RANGE_POSITIVE}, {"beta1", RANGE_UNIT}, {"beta2", RANGE_UNIT},
      {"eps", RANGE_POSITIVE}, {"weight_decay", RANGE_NONNEG}}},
    {"adamw", "lr", "adamw(lr=1e-3)",
     {{"lr", RANGE_POSITIVE}, {"beta1", RANGE_UNIT}, {"beta2", RANGE_UNIT},
      {"eps", RANGE_POSITIVE}, {"weight_decay", RANGE_NONNEG}}},
};

static const train_rule schedules[] = {
    {"constant", NULL, "constant()", {{"warmup", RANGE_COUNT0}}},
    {"step", "step_size", "step(step_size=1000)",
     {{"warmup", RANGE_COUNT0}, {"step_size", RANGE_COUNT}, {"gamma", RANGE_FRACTION}}},
    {"cosine", NULL, "cosine(total=1000)",
     {{"warmup", RANGE_COUNT0}, {"total", RANGE_COUNT}, {"min_lr", RANGE_NONNEG}}},
};

static bool in_range(setting_range r, double x) {
  switch (r) {
  case RANGE_POSITIVE: return x > 0 && isfinite(x);
  case RANGE_NONNEG: return x >= 0 && isfinite(x);
  case RANGE_UNIT: return x >= 0 && x < 1;
  case RANGE_FRACTION: return x > 0 && x <= 1;
  case RANGE_FLAG: return x == 0 || x == 1;
  case RANGE_COUNT: return x >= 1 && x <= 0x1p53 && x == floor(x);
  case RANGE_COUNT0: return x >= 0 && x <= 0x1p53 && x == floor(x);
  }
  return false;
}

static const char *range_text(setting_range r) {
  switch (r) {
  case RANGE_POSITIVE: return "a finite number > 0";
  case RANGE_NONNEG: return "a finite number >= 0";
  case RANGE_UNIT: return "in [0, 1)";
  case RANGE_FRACTION: return "in (0, 1]";
  case RANGE_FLAG: return "0 or 1";
  case RANGE_COUNT: return "an integer >= 1";
  case RANGE_COUNT0: return "an integer >= 0";
  }
  return "";
}

static const train_rule *find_rule(const train_rule *rules, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(rules[i].name, name) == 0) return &rules[i];
  return NULL;
}

static const setting *find_setting(const train_rule *rule, const char *name) {
  for (const setting *s = rule->settings; s->name; s++)
    if (strcmp(s->name, name) == 0) return s;
  return NULL;
}

/* "lr, momentum, nesterov or weight_decay" */
static void list_settings(const train_rule *rule, char *buf, size_t size) {
  int n = 0;
  while (rule->settings[n].name) n++;
  buf[0] = 0;
  for (int i = 0; i < n; i++) {
    size_t len = strlen(buf);
    snprintf(buf + len, size - len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
             rule->settings[i].name);
  }
}

/* The keywords of the frame checked against the rule and copied into the
 * graph's arena as floats.  `what` is "optimizer" or "schedule". */
static int read_settings(kl_parser *P, const kl_frame *f, const train_rule *rule,
                         const char *what, kl_loc loc, kl_attr **out, int *nout) {
  if (f->nposattr)
    return fail(P, loc, "%s arguments are keywords, e.g. %s", what, rule->example);
  kl_attr *attrs = kl_arena_alloc(&P->g->arena, (size_t)(f->nkw + 1) * sizeof(kl_attr));
  bool has_required = !rule->required;
  for (int i = 0; i < f->nkw; i++) {
    const setting *s = find_setting(rule, f->kw[i].name);
    double num;
    if (!s) {
      char accepted[160];
      list_settings(rule, accepted, sizeof accepted);
      return fail(P, f->kwloc[i], "%s has no setting '%s' (it takes %s)", rule->name,
                  f->kw[i].name, accepted);
    }
    if (!attr_number(&f->kw[i], &num))
      return fail(P, f->kwloc[i], "%s setting '%s' must be a number", what, f->kw[i].name);
    if (!in_range(s->range, num))
      return fail(P, f->kwloc[i], "%s's %s must be %s, got %g", rule->name, s->name,
                  range_text(s->range), num);
    has_required |= rule->required && strcmp(s->name, rule->required) == 0;
    attrs[i] = (kl_attr){.name = kl_arena_strdup(&P->g->arena, s->name),
                         .kind = KL_ATTR_FLOAT, .f = num};
  }
  if (!has_required)
    return fail(P, loc, "%s needs %s, e.g. %s", rule->name, rule->required, rule->example);
  *out = attrs;
  *nout = f->nkw;
  return 0;
}

/* The index of keyword `name` in the frame, -1 when not given. */
static int keyword_index(const kl_frame *f, const char *name) {
  for (int i = 0; i < f->nkw; i++)
    if (strcmp(f->kw[i].name, name) == 0) return i;
  return -1;
}

static double setting_value(const kl_attr *attrs, int n, const char *name, double dflt) {
  for (int i = 0; i < n; i++)
    if (strcmp(attrs[i].name, name) == 0) return attrs[i].f;
  return dflt;
}

int kl_p_optimizer(kl_parser *P, const char *name, kl_loc loc) {
  kl_frame *f = top(P);
  kl_train *t = train_of(P);
  const train_rule *rule =
      find_rule(optimizers, (int)(sizeof optimizers / sizeof *optimizers), name);
  int rc = 0;
  if (t->optimizer) rc = fail(P, loc, "the optimizer is already given");
  else if (!rule) rc = fail(P, loc, "unknown optimizer '%s' (expected sgd, adam or adamw)", name);
  else rc = read_settings(P, f, rule, "optimizer", loc, &t->attrs, &t->nattrs);
  if (!rc && setting_value(t->attrs, t->nattrs, "nesterov", 0) == 1 &&
      !(setting_value(t->attrs, t->nattrs, "momentum", 0) > 0))
    rc = fail(P, f->kwloc[keyword_index(f, "nesterov")], "nesterov=1 needs momentum > 0");
  if (!rc) t->optimizer = kl_arena_strdup(&P->g->arena, name);
  frame_pop(P);
  return rc;
}

int kl_p_schedule(kl_parser *P, const char *name, kl_loc loc) {
  kl_frame *f = top(P);
  kl_train *t = train_of(P);
  const train_rule *rule =
      find_rule(schedules, (int)(sizeof schedules / sizeof *schedules), name);
  int rc = 0;
  if (t->schedule) rc = fail(P, loc, "the schedule is already given");
  else if (!rule)
    rc = fail(P, loc, "unknown schedule '%s' (expected constant, step or cosine)", name);
  else rc = read_settings(P, f, rule, "schedule", loc, &t->schedule_attrs, &t->nschedule_attrs);
  if (!rc) {
    double warmup = setting_value(t->schedule_attrs, t->nschedule_attrs, "warmup", 0);
    double total = setting_value(t->schedule_attrs, t->nschedule_attrs, "total", INFINITY);
    if (total <= warmup)
      rc = fail(P, f->kwloc[keyword_index(f, "total")],
                "cosine's total (%g steps) must exceed its warmup (%g steps)", total, warmup);
  }
  int min_lr = keyword_index(f, "min_lr");
  if (!rc && min_lr >= 0) P->min_lr_loc = f->kwloc[min_lr];
  if (!rc) t->schedule = kl_arena_strdup(&P->g->arena, name);
  frame_pop(P);
  return rc;
}

int kl_p_clip(kl_parser *P, const kl_expr *e, kl_loc loc) {
  kl_train *t = train_of(P);
  if (t->clip) return fail(P, loc, "clip is already given");
  if (!e->is_lit)
    return fail(P, e->loc, "clip must be a number (the largest global gradient norm), "
                           "e.g. clip = 1.0");
  if (!in_range(RANGE_POSITIVE, e->lit))
    return fail(P, e->loc, "clip must be %s, got %g", range_text(RANGE_POSITIVE), e->lit);
  t->clip = e->lit;
  return 0;
}

int kl_p_train_end(kl_parser *P, kl_loc loc) {
  if (P->seen_train) return fail(P, loc, "only one train block is allowed");
  P->seen_train = true;
  kl_train *t = train_of(P);
  if (!t->loss) return fail(P, loc, "the train block needs `loss = ...`");
  if (!t->optimizer) return fail(P, loc, "the train block needs `optimizer = ...`");
  /* cosine decays from lr to min_lr: the other way round is a mistake */
  double lr = setting_value(t->attrs, t->nattrs, "lr", 0);
  double min_lr = setting_value(t->schedule_attrs, t->nschedule_attrs, "min_lr", 0);
  if (min_lr > lr)
    return fail(P, P->min_lr_loc, "cosine's min_lr (%g) exceeds the optimizer's lr (%g)",
                min_lr, lr);
  return 0;
}
